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

use super::conn::{
    ConnError, ConnectParams, ReplMessage, ReplicationConn, ReplicationStream, now_pg_micros,
};
use super::pgoutput::{self, KeyHints, PgOutput, Relations};
use super::spill::Spill;
use super::{PostgresSourceOptions, quote_ident, quote_literal};
use crate::change::{Change, Lsn, Position};
use crate::error::{Classify, ErrorClass};
use crate::lane::{AckTracker, lane_of, needs_barrier, plan};
use crate::source::{Outputs, SourceError, SourceStats, StopMode};

mod staged;

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
    /// For SQL connections made while streaming (see `stop_at_schema_change`).
    params: ConnectParams,
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
    outputs: Outputs,
    stop: watch::Receiver<StopMode>,
    stats: Arc<SourceStats>,
) -> Result<(), SourceError> {
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
        relations: Relations::new(keys),
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

fn drain_acks(st: &mut State<'_>) {
    while let Ok(ack) = st.outputs.acks.try_recv() {
        st.tracker.ack(&ack);
    }
    let lag = st
        .tracker
        .oldest_pending_commit_time()
        .map_or(0, |t| (now_pg_micros() - t).max(0));
    st.stats.lag_micros.store(lag, Ordering::Relaxed);
}

async fn on_stop(st: &mut State<'_>, stream: &mut ReplicationStream) -> Result<Flow, SourceError> {
    let mode = *st.stop.borrow_and_update();
    match mode {
        StopMode::Run => Ok(Flow::Continue),
        StopMode::Abort => {
            drain_acks(st);
            report(st, stream, false).await?;
            Ok(Flow::Stopped)
        }
        StopMode::Drain => {
            // What waits for the transform is received: deliver it before closing the lanes.
            // (Boxed: flushing dispatches, and dispatching may stop, which lands here again.)
            if let Flow::Stopped = Box::pin(staged::flush(st, stream)).await? {
                return Ok(Flow::Stopped);
            }
            tracing::info!(connector = %st.opts.connector, in_flight = st.tracker.in_flight(), "draining lanes");
            // Closing the queues lets each lane commit what it holds and exit.
            st.outputs.routers.clear();
            loop {
                tokio::select! {
                    ack = st.outputs.acks.recv() => match ack {
                        Some(ack) => st.tracker.ack(&ack),
                        None => break,
                    },
                    _ = st.ticker.tick() => periodic_report(st, stream).await?,
                }
            }
            drain_acks(st);
            report(st, stream, false).await?;
            tracing::info!(connector = %st.opts.connector, confirmed = %st.reported, "drained; confirmed the durable frontier");
            Ok(Flow::Stopped)
        }
    }
}

/// On each tick while reading the socket: give up on a silent connection (a partition sends
/// no reset), ask for a reply when it has been quiet for half the timeout, and send the
/// periodic status update.
async fn watchdog(st: &mut State<'_>, stream: &mut ReplicationStream) -> Result<(), SourceError> {
    let quiet = st.last_heard.elapsed();
    if quiet >= st.opts.receive_timeout {
        return Err(SourceError::transient(format!(
            "{}: no message from the server for {:.1}s (receive_timeout); the connection is presumed lost",
            st.opts.connector,
            quiet.as_secs_f64()
        )));
    }
    if quiet >= st.opts.receive_timeout / 2 {
        return report(st, stream, true).await;
    }
    periodic_report(st, stream).await
}

/// A status update when `status_interval` has passed since the last one, or sooner when the
/// frontier moved (so the slot releases WAL and reports progress promptly once caught up).
async fn periodic_report(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
) -> Result<(), SourceError> {
    let since = st.last_report.elapsed();
    if since >= st.opts.status_interval
        || (st.tracker.frontier() > st.reported && since >= FRONTIER_REPORT_EVERY)
    {
        report(st, stream, false).await?;
    }
    Ok(())
}

async fn maybe_report(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
) -> Result<(), SourceError> {
    if st.tracker.frontier() > st.reported && st.last_report.elapsed() >= FRONTIER_REPORT_EVERY {
        report(st, stream, false).await?;
    }
    Ok(())
}

/// Send a standby status update whose flush position is the durable frontier.
async fn report(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    reply: bool,
) -> Result<(), SourceError> {
    let frontier = st.tracker.frontier();
    stream
        .send_status(st.received.max(frontier), frontier, reply)
        .await
        .map_err(|e| conn_error(st.opts, e))?;
    if frontier > st.reported {
        tracing::debug!(connector = %st.opts.connector, flush = %frontier, "confirmed durable frontier");
    }
    st.reported = frontier;
    st.last_report = Instant::now();
    st.stats
        .confirmed
        .store(frontier.as_pg(), Ordering::Relaxed);
    Ok(())
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
        PgOutput::Relation(body) => match st.relations.apply_relation(body) {
            Ok(table) => {
                tracing::debug!(table = %table.qualified_name(), columns = table.columns.len(), "relation");
            }
            Err(e) => return Err(stop_at_schema_change(st, stream, &e).await),
        },
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

/// A Relation message the sinks cannot follow (a column changed type): let everything before
/// it become durable and confirm it, so that after the operator's fix the restart resumes
/// right at the change instead of replaying older rows (and this message) again; then stop.
/// Nothing after the message was dispatched, so none of it is applied or confirmed.
async fn stop_at_schema_change(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    e: &pgoutput::ChangeError,
) -> SourceError {
    let err = change_error(st, e);
    let settled = async {
        if let Flow::Stopped = Box::pin(staged::flush(st, stream)).await? {
            return Ok(());
        }
        if wait_idle_streaming(st, stream).await? {
            drain_acks(st);
            report(st, stream, false).await?;
            wait_confirmed(&st.params, &st.opts.slot_name, st.reported).await?;
        }
        Ok::<_, SourceError>(())
    };
    if let Err(other) = settled.await {
        tracing::warn!(connector = %st.opts.connector, error = %other, "could not confirm the changes before the schema change");
    }
    err
}

/// Waits (up to 5 s) until the slot's confirmed position shows the last report: the caller
/// exits next, and a connection closed with unread data in it is reset, which can lose a
/// status update the walsender has not read yet.
async fn wait_confirmed(params: &ConnectParams, slot: &str, lsn: Lsn) -> Result<(), SourceError> {
    let client = super::setup::connect_sql(params, 0).await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    let wanted = lsn.to_string();
    loop {
        let done: bool = client
            .query_one(
                "SELECT coalesce(confirmed_flush_lsn >= $2::text::pg_lsn, true) \
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot, &wanted],
            )
            .await
            .map_err(|e| super::setup::sql_error("reading the slot's confirmed position", &e))?
            .get(0);
        if done || Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

/// Hand one change to every sink's lane for its key, waiting for queue space while still
/// serving acks and status updates.
async fn dispatch(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    change: Change,
) -> Result<Flow, SourceError> {
    let sinks = st.outputs.routers.len();
    let mut change = Some(change);
    for i in 0..sinks {
        // Clone for every sink but the last, which takes the original.
        let copy = if i + 1 == sinks {
            change.take()
        } else {
            change.clone()
        };
        let Some(copy) = copy else { break };
        let lanes = st.outputs.routers[i].lanes();
        for (lane, part) in plan(copy, lanes) {
            if let Flow::Stopped = send(st, stream, i, lane, part).await? {
                return Ok(Flow::Stopped);
            }
        }
    }
    Ok(Flow::Continue)
}

async fn send(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    sink: usize,
    lane: u32,
    change: Change,
) -> Result<Flow, SourceError> {
    // The common case, a queue with room, needs none of the waiting below: building that
    // select (and cloning the sender and stop receiver for it) cost more than the send.
    if let Ok(permit) = st.outputs.routers[sink].sender(lane).try_reserve() {
        permit.send(Arc::new(change));
        st.tracker.dispatched(1);
        return Ok(Flow::Continue);
    }
    let sender = st.outputs.routers[sink].sender(lane).clone();
    // A clone: a Drain noticed while waiting here must still reach the main loop.
    let mut stop = st.stop.clone();
    let permit = loop {
        tokio::select! {
            biased;
            permit = sender.reserve() => break permit.map_err(|_| SourceError::fatal(format!("{}: lane {lane} of sink #{sink} stopped", st.opts.connector)))?,
            _ = stop.changed() => {
                if *stop.borrow() == StopMode::Abort {
                    return on_stop(st, stream).await;
                }
            }
            Some(ack) = st.outputs.acks.recv() => { st.tracker.ack(&ack); drain_acks(st); maybe_report(st, stream).await?; }
            _ = st.ticker.tick() => periodic_report(st, stream).await?,
        }
    };
    permit.send(Arc::new(change));
    st.tracker.dispatched(1);
    Ok(Flow::Continue)
}

/// Sends one change the way its keys need: alone behind a barrier, or to its lane.
async fn send_change(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    change: Change,
) -> Result<Flow, SourceError> {
    let barrier = st
        .outputs
        .routers
        .iter()
        .any(|r| needs_barrier(&change, r.lanes()));
    if barrier {
        barrier_send(st, stream, change).await
    } else {
        dispatch(st, stream, change).await
    }
}

/// A change that touches more than one lane's keys (a truncate; a TOAST move across lanes)
/// must land after every earlier change of every lane and before every later one: wait until
/// nothing is in flight, send it to one lane of each sink (lane 0 for a truncate, the new
/// key's lane for a move), and wait again.
async fn barrier_send(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    change: Change,
) -> Result<Flow, SourceError> {
    if !wait_idle_streaming(st, stream).await? {
        return Ok(Flow::Stopped);
    }
    for i in 0..st.outputs.routers.len() {
        let lanes = st.outputs.routers[i].lanes();
        let lane = if change.op == crate::change::Op::Truncate {
            0
        } else {
            lane_of(&change.table.schema, &change.table.name, &change.key, lanes)
        };
        if let Flow::Stopped = send(st, stream, i, lane, change.clone()).await? {
            return Ok(Flow::Stopped);
        }
    }
    if !wait_idle_streaming(st, stream).await? {
        return Ok(Flow::Stopped);
    }
    Ok(Flow::Continue)
}

/// Wait until every dispatched copy is acked, keeping the stream alive. False on Abort.
async fn wait_idle_streaming(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
) -> Result<bool, SourceError> {
    // A clone: a Drain noticed while waiting here must still reach the main loop.
    let mut stop = st.stop.clone();
    while st.tracker.in_flight() > 0 {
        tokio::select! {
            ack = st.outputs.acks.recv() => match ack {
                Some(ack) => { st.tracker.ack(&ack); drain_acks(st); }
                None => return Err(SourceError::fatal(format!("{}: every lane stopped", st.opts.connector))),
            },
            _ = stop.changed() => if *stop.borrow() == StopMode::Abort { return Ok(false) },
            _ = st.ticker.tick() => periodic_report(st, stream).await?,
        }
    }
    Ok(true)
}

/// Wait until every dispatched copy is acked, with no stream (it was lost). False when asked
/// to stop: at once on Abort, once idle on Drain (the lanes close when `Outputs` drops).
async fn wait_idle(st: &mut State<'_>) -> Result<bool, SourceError> {
    while st.tracker.in_flight() > 0 {
        tokio::select! {
            ack = st.outputs.acks.recv() => match ack {
                Some(ack) => st.tracker.ack(&ack),
                None => return Err(SourceError::fatal(format!("{}: every lane stopped", st.opts.connector))),
            },
            _ = st.stop.changed() => if *st.stop.borrow() == StopMode::Abort { return Ok(false) },
        }
    }
    Ok(*st.stop.borrow() == StopMode::Run)
}
