//! The streaming loop: START_REPLICATION → pgoutput messages → changes dispatched to lanes,
//! acks in, standby status updates out.
//!
//! Message flow per transaction (protocol version 1, no streaming of in-progress transactions):
//! Begin (commit LSN, commit time) → Relation (before first use of a table on this connection,
//! and again after its shape changes) → Insert/Update/Delete/Truncate … → Commit (end LSN).
//! Type, Origin and Message are passed over. See
//! <https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html>.
//!
//! The flush LSN we report is the ack tracker's frontier: the end LSN of the last transaction
//! every copy of which is committed in its sink. After a reconnect the server resends from the
//! slot's confirmed position; lanes skip what their checkpoints already cover.
//!
//! While a lane queue is full we stop reading the socket (that is the back-pressure), but keep
//! processing acks and sending status updates, or the walsender would time us out after
//! `wal_sender_timeout` (<https://www.postgresql.org/docs/15/runtime-config-replication.html>).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

use super::conn::{ConnError, ConnectParams, ReplMessage, ReplicationConn, ReplicationStream};
use super::pgoutput::{self, KeyHints, Known, PgOutput, Relations};
use super::spill::Spill;
use super::{PostgresSourceOptions, quote_ident, quote_literal};
use crate::change::{Lsn, Position};
use crate::error::{Classify, ErrorClass};
use crate::lane::AckTracker;
use crate::source::{Outputs, SourceError, SourceStats, StopMode};

mod dispatch;
mod feedback;
mod staged;
pub(crate) mod tables;

use self::dispatch::{barrier_send, send_change, wait_idle};
use self::feedback::{drain_acks, maybe_report, on_stop, report, watchdog};
use self::tables::stop_at;

/// Reconnect attempts in a row before a lost stream becomes fatal (≈5 minutes of backoff).
const MAX_RECONNECTS: u32 = 60;
/// Send a status update at most this often when only the frontier moved. The server frees
/// WAL and `pg_replication_slots.confirmed_flush_lsn` moves only this often, so anything
/// that waits on confirmation (an operator, a benchmark's clock) sees the frontier up to
/// this late; a status update is a few dozen bytes, and 10 a second cost nothing measurable.
const FRONTIER_REPORT_EVERY: Duration = Duration::from_millis(100);

struct State<'a> {
    opts: &'a PostgresSourceOptions,
    outputs: Outputs,
    stop: watch::Receiver<StopMode>,
    stats: Arc<SourceStats>,
    tracker: AckTracker,
    relations: Relations,
    tx: Option<OpenTx>,
    received: Lsn,
    reported: Lsn,
    last_report: Instant,
    ticker: tokio::time::Interval,
    /// When the socket last gave us a message (or we last came back to reading it).
    last_heard: Instant,
    /// Changes and markers waiting for the route's transform (see `staged`).
    staged: staged::Staged,
    /// Transactions the server streams before they commit (protocol version 2).
    spill: Spill,
    /// The top-level xid of the stream block being received, between Stream Start and Stop.
    streaming: Option<u32>,
    /// For SQL connections made while streaming (see `tables::stop_at`).
    params: ConnectParams,
    /// New table shapes to record, and catalog events to stop at (see `tables`).
    ledger: tables::Ledger,
}

struct OpenTx {
    lsn: Lsn,
    ordinal: u32,
}

enum Event {
    Stop,
    Acks,
    Tick,
    Msg(Result<ReplMessage, ConnError>),
    /// The socket has nothing to read right now: hand what is staged to the transform.
    Quiet,
    /// The transform returned the batch in flight.
    Transformed(staged::Outputs),
}

enum Flow {
    Continue,
    Stopped,
}

pub(crate) async fn run(
    opts: &PostgresSourceOptions,
    keys: KeyHints,
    params: ConnectParams,
    mut outputs: Outputs,
    stop: watch::Receiver<StopMode>,
    stats: Arc<SourceStats>,
    events: tables::Events,
) -> Result<(), SourceError> {
    let known: Known = std::mem::take(&mut outputs.ledger.known)
        .into_iter()
        .map(|r| {
            (
                (r.table.schema.clone(), r.table.name.clone()),
                (r.relation, r.table),
            )
        })
        .collect();
    let ledger = tables::Ledger::new(outputs.ledger.record.clone(), events);
    // Ticks serve both the status interval and the receive watchdog.
    let mut ticker = tokio::time::interval(
        opts.status_interval
            .min(opts.receive_timeout / 4)
            .min(FRONTIER_REPORT_EVERY),
    );
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut st = State {
        opts,
        outputs,
        stop,
        stats,
        tracker: AckTracker::new(Lsn(0)),
        relations: Relations::new(keys, known),
        ledger,
        tx: None,
        received: Lsn(0),
        reported: Lsn(0),
        last_report: Instant::now(),
        ticker,
        last_heard: Instant::now(),
        staged: staged::Staged::default(),
        spill: Spill::new(&opts.spill_dir).map_err(|e| {
            SourceError::fatal(format!(
                "{}: cannot use spill directory {}: {e}",
                opts.connector,
                opts.spill_dir.display()
            ))
        })?,
        streaming: None,
        params: params.clone(),
    };
    let mut failures = 0u32;
    loop {
        let before = st.received;
        let err = match session(&mut st, &params).await {
            Ok(()) => return Ok(()),
            Err(e) if e.class == ErrorClass::Transient => e,
            Err(e) => return Err(e),
        };
        if st.received > before {
            failures = 0;
        }
        failures += 1;
        if failures > MAX_RECONNECTS {
            return Err(SourceError::fatal(format!(
                "{}: giving up after {MAX_RECONNECTS} reconnect attempts: {}",
                opts.connector, err.message
            )));
        }
        // Let everything dispatched so far become durable (or fail) before resuming, so the
        // resent transactions never mix with copies still in flight.
        if !wait_idle(&mut st).await? {
            return Ok(());
        }
        st.tracker.abandon_open();
        st.tx = None;
        st.staged.clear();
        st.relations.reset();
        st.streaming = None;
        st.spill.reset().map_err(|e| spill_error(st.opts, &e))?;
        let delay = crate::lane::backoff_for(failures);
        tracing::warn!(connector = %opts.connector, attempt = failures, delay_ms = delay.as_millis() as u64, error = %err, "replication stream lost; reconnecting");
        tokio::time::sleep(delay).await;
    }
}

fn conn_error(opts: &PostgresSourceOptions, e: ConnError) -> SourceError {
    let what = format!("{} ({}:{})", opts.connector, opts.host, opts.port);
    let start_over = "To copy every table again from a new slot, run `zipline pipeline apply` \
                      with `--resnapshot`, or set `snapshot: when_needed` on the source";
    match e.code() {
        Some("55006") => SourceError::transient(format!(
            "{what}: replication slot {} is active for another connection (a walsender whose \
             client vanished without closing it, or another pipeline with the same slot_name); \
             waiting for the server to end it (wal_sender_timeout): {e}",
            opts.slot_name
        )),
        Some("28P01" | "28000") => SourceError::fatal(format!("{what}: cannot log in: {e}")),
        Some("57P01" | "57P02" | "57P03" | "53300") => {
            SourceError::transient(format!("{what}: {e}"))
        }
        Some("42704") if e.to_string().contains("publication") => SourceError::fatal(format!(
            "{what}: {e}: publication {} was dropped while its slot {} kept its position, and \
             PostgreSQL reads the slot's changes with the catalog as of that position, so \
             re-creating the publication alone does not help. {start_over}",
            opts.publication, opts.slot_name
        )),
        Some("55000") if e.to_string().contains("can no longer get changes") => {
            SourceError::fatal(format!(
                "{what}: {e}: PostgreSQL invalidated replication slot {} (the WAL it still \
                 needed was removed); the changes since its confirmed position are gone from \
                 the source. {start_over}",
                opts.slot_name
            ))
        }
        Some(_) => SourceError::fatal(format!("{what}: {e}")),
        None => match e {
            ConnError::Io(_) => SourceError::transient(format!("{what}: {e}")),
            _ => SourceError::fatal(format!("{what}: {e}")),
        },
    }
}

async fn session(st: &mut State<'_>, params: &ConnectParams) -> Result<(), SourceError> {
    let opts = st.opts;
    let repl = ReplicationConn::connect(params)
        .await
        .map_err(|e| conn_error(opts, e))?;
    let start = st.tracker.frontier();
    // Version 2 with streaming (PostgreSQL 14+) sends a transaction larger than
    // logical_decoding_work_mem while it runs, instead of spilling it on the server first.
    let protocol = if opts.stream_in_progress {
        "proto_version '2', streaming 'on'"
    } else {
        "proto_version '1'"
    };
    let command = format!(
        "START_REPLICATION SLOT {} LOGICAL {start} ({protocol}, publication_names {})",
        quote_ident(&opts.slot_name),
        quote_literal(&quote_ident(&opts.publication)),
    );
    let mut stream = repl
        .start_replication(&command)
        .await
        .map_err(|e| conn_error(opts, e))?;
    tracing::info!(connector = %opts.connector, slot = %opts.slot_name, from = %start, "streaming");
    st.last_heard = Instant::now();
    loop {
        let event = tokio::select! {
            biased;
            _ = st.stop.changed() => Event::Stop,
            Some(ack) = st.outputs.acks.recv() => { st.tracker.ack(&ack); Event::Acks }
            _ = st.ticker.tick() => Event::Tick,
            msg = stream.recv() => Event::Msg(msg),
            outputs = staged::done(&mut st.staged) => Event::Transformed(outputs),
            () = std::future::ready(()), if staged::can_submit(&st.staged) => Event::Quiet,
        };
        let flow = match event {
            Event::Stop => on_stop(st, &mut stream).await?,
            Event::Acks => {
                drain_acks(st);
                maybe_report(st, &mut stream).await?;
                Flow::Continue
            }
            Event::Tick => {
                watchdog(st, &mut stream).await?;
                Flow::Continue
            }
            Event::Msg(msg) => {
                let flow =
                    on_message(st, &mut stream, msg.map_err(|e| conn_error(opts, e))?).await?;
                // Time spent waiting for lane capacity is not the server's silence.
                st.last_heard = Instant::now();
                flow
            }
            Event::Quiet => {
                staged::submit_quiet(st);
                Flow::Continue
            }
            Event::Transformed(outputs) => {
                let flow = staged::replay_done(st, &mut stream, outputs).await?;
                // Time spent waiting for lane capacity is not the server's silence.
                st.last_heard = Instant::now();
                flow
            }
        };
        if let Flow::Stopped = flow {
            stream.close().await;
            return Ok(());
        }
    }
}

async fn on_message(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    msg: ReplMessage,
) -> Result<Flow, SourceError> {
    match msg {
        ReplMessage::Keepalive { wal_end, reply } => {
            st.received = st.received.max(wal_end);
            // Staged transactions must reach the tracker before it may call itself idle.
            if let Flow::Stopped = staged::flush(st, stream).await? {
                return Ok(Flow::Stopped);
            }
            if st.tx.is_none() {
                st.tracker.idle_advance(wal_end);
            }
            if reply {
                report(st, stream, false).await?;
            } else {
                maybe_report(st, stream).await?;
            }
            Ok(Flow::Continue)
        }
        ReplMessage::XLogData { wal_end, data } => {
            let msg = pgoutput::decode(data.clone(), st.streaming.is_some())
                .map_err(|e| undecodable(st.opts, &e))?;
            if let (Some(top), Some(sub)) = (st.streaming, msg.stream_xid()) {
                // Part of a transaction still running on the server: kept aside until it
                // commits (or dropped when it aborts).
                st.spill
                    .append(top, sub, &data)
                    .map_err(|e| spill_error(st.opts, &e))?;
                st.received = st.received.max(wal_end);
                return Ok(Flow::Continue);
            }
            let flow = on_pgoutput(st, stream, msg).await?;
            st.received = st.received.max(wal_end);
            Ok(flow)
        }
    }
}

async fn on_pgoutput(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    msg: PgOutput,
) -> Result<Flow, SourceError> {
    match msg {
        PgOutput::Begin {
            final_lsn,
            commit_time,
            ..
        } => begin_tx(st, final_lsn, commit_time),
        PgOutput::Commit { end_lsn, .. } => commit_tx(st, end_lsn),
        PgOutput::StreamStart { xid, .. } => st.streaming = Some(xid),
        PgOutput::StreamStop => st.streaming = None,
        PgOutput::StreamAbort { xid, subxid } => {
            st.spill
                .abort(xid, subxid)
                .map_err(|e| spill_error(st.opts, &e))?;
            tracing::debug!(
                xid,
                subxid,
                "streamed transaction aborted; its changes are dropped"
            );
        }
        PgOutput::StreamCommit {
            xid,
            commit_lsn,
            end_lsn,
            commit_time,
            ..
        } => return replay_streamed(st, stream, xid, commit_lsn, end_lsn, commit_time).await,
        other => return on_data(st, stream, other).await,
    }
    Ok(Flow::Continue)
}

fn begin_tx(st: &mut State<'_>, commit_lsn: Lsn, commit_time: i64) {
    if staged::active(st) {
        st.staged.begin(commit_lsn, commit_time);
    } else {
        st.tracker.begin(commit_lsn, commit_time);
    }
    st.tx = Some(OpenTx {
        lsn: commit_lsn,
        ordinal: 0,
    });
}

fn commit_tx(st: &mut State<'_>, end_lsn: Lsn) {
    if staged::active(st) {
        st.staged.commit(end_lsn);
    } else {
        st.tracker.commit(end_lsn);
    }
    st.tx = None;
}

/// A streamed transaction committed: replay its spilled messages as one ordinary transaction,
/// with the table shapes its own Relation messages announced.
async fn replay_streamed(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    xid: u32,
    commit_lsn: Lsn,
    end_lsn: Lsn,
    commit_time: i64,
) -> Result<Flow, SourceError> {
    let mut reader = st.spill.finish(xid).map_err(|e| spill_error(st.opts, &e))?;
    begin_tx(st, commit_lsn, commit_time);
    let mut relations = std::mem::take(&mut st.relations);
    let mut flow = Flow::Continue;
    loop {
        let next = match reader.next_message() {
            Ok(Some(data)) => data,
            Ok(None) => break,
            Err(e) => {
                st.relations = relations;
                return Err(spill_error(st.opts, &e));
            }
        };
        std::mem::swap(&mut st.relations, &mut relations);
        let result = match pgoutput::decode(next, true) {
            Ok(msg) => on_data(st, stream, msg).await,
            Err(e) => Err(undecodable(st.opts, &e)),
        };
        std::mem::swap(&mut st.relations, &mut relations);
        flow = result.inspect_err(|_| st.relations = std::mem::take(&mut relations))?;
        if let Flow::Stopped = flow {
            break;
        }
    }
    st.relations = relations;
    if let Flow::Continue = flow {
        commit_tx(st, end_lsn);
    }
    Ok(flow)
}

fn undecodable(opts: &PostgresSourceOptions, e: &pgoutput::DecodeError) -> SourceError {
    SourceError::fatal(format!(
        "{}: undecodable pgoutput message: {e}",
        opts.connector
    ))
}

fn spill_error(opts: &PostgresSourceOptions, e: &std::io::Error) -> SourceError {
    SourceError::fatal(format!(
        "{}: spill directory {}: {e} (streamed transactions are kept there until they commit; \
         check free space and permissions, or set spill_dir)",
        opts.connector,
        opts.spill_dir.display()
    ))
}

/// Relation, row and truncate messages, whether received live or replayed from a spill file.
async fn on_data(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    msg: PgOutput,
) -> Result<Flow, SourceError> {
    match msg {
        PgOutput::Relation(body) => {
            let rel_id = body.rel_id;
            match st.relations.apply_relation(body) {
                Ok(table) => {
                    tracing::debug!(table = %table.qualified_name(), columns = table.columns.len(), "relation");
                    tables::on_shape(st, rel_id, &table);
                }
                Err(e) => return Err(stop_at(st, stream, &e).await),
            }
        }
        msg @ (PgOutput::Insert { .. } | PgOutput::Update { .. } | PgOutput::Delete { .. }) => {
            let position = next_position(st)?;
            let change = st
                .relations
                .build_change(msg, position)
                .map_err(|e| change_error(st, &e))?;
            st.stats.received.fetch_add(1, Ordering::Relaxed);
            if staged::active(st) {
                // Barriers are decided on what the transform makes of the change.
                return staged::push(st, stream, change).await;
            }
            return send_change(st, stream, change).await;
        }
        PgOutput::Truncate { rel_ids, .. } => {
            for rel_id in rel_ids {
                let position = next_position(st)?;
                let change = st
                    .relations
                    .build_truncate(rel_id, position)
                    .map_err(|e| change_error(st, &e))?;
                st.stats.received.fetch_add(1, Ordering::Relaxed);
                let flow = if staged::active(st) {
                    staged::push(st, stream, change).await?
                } else {
                    barrier_send(st, stream, change).await?
                };
                if let Flow::Stopped = flow {
                    return Ok(Flow::Stopped);
                }
            }
        }
        PgOutput::Origin { .. } | PgOutput::Type { .. } | PgOutput::Message { .. } => {}
        other => {
            return Err(SourceError::fatal(format!(
                "{}: unexpected pgoutput message {} here",
                st.opts.connector,
                other.name()
            )));
        }
    }
    Ok(Flow::Continue)
}

fn change_error(st: &State<'_>, e: &pgoutput::ChangeError) -> SourceError {
    let message = format!("{}: {e}", st.opts.connector);
    match e.class() {
        ErrorClass::Definite => SourceError::definite(message),
        _ => SourceError::fatal(message),
    }
}

fn next_position(st: &mut State<'_>) -> Result<Position, SourceError> {
    let tx = st.tx.as_mut().ok_or_else(|| {
        SourceError::fatal(format!(
            "{}: row message outside a transaction",
            st.opts.connector
        ))
    })?;
    tx.ordinal += 1;
    Ok(Position::new(tx.lsn, tx.ordinal))
}
