//! The streaming loop: START_REPLICATION → pgoutput messages → events into the emitter;
//! the durable frontier back out as standby status updates.
//!
//! Message flow per transaction (protocol version 1, no streaming of in-progress transactions):
//! Begin (commit LSN, commit time) → Relation (before first use of a table on this connection,
//! and again after its shape changes) → Insert/Update/Delete/Truncate … → Commit (end LSN).
//! Type, Origin and Message are passed over. See
//! <https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html>.
//!
//! The flush LSN we report is the runtime's durable frontier: the end LSN of the last
//! transaction every copy of which is committed in its sink. After a reconnect the server
//! resends from the slot's confirmed position; lanes skip what their checkpoints already cover.
//!
//! While the emitter has no room we stop reading the socket (that is the back-pressure), but
//! keep sending status updates with the frontier, or the walsender would time us out after
//! `wal_sender_timeout` (<https://www.postgresql.org/docs/15/runtime-config-replication.html>).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};

use super::conn::{ConnError, ConnectParams, ReplMessage, ReplicationConn, ReplicationStream};
use super::pgoutput::{self, KeyHints, Known, PgOutput, Relations};
use super::spill::Spill;
use super::types;
use super::{quote_ident, quote_literal};
use crate::change::{Change, Lsn, Position};
use crate::config;
use crate::error::ErrorClass;
use crate::retry::{Backoff, Budget};
use crate::source::emitter::{Emitter, Event, Frontier};
use crate::source::{SourceError, SourceIo, SourceState, SourceStats, StopMode};

mod errors;
mod feedback;
pub(crate) mod tables;
mod transactions;

use self::errors::{change_error, conn_error, spill_error, undecodable};
use self::feedback::{emit, flush, maybe_report, on_stop, push, report, watchdog};
use self::tables::stop_at;
use self::transactions::{begin_tx, commit_tx, replay_streamed};

/// Reconnect attempts in a row before a lost stream becomes fatal (≈5 minutes of backoff).
const MAX_RECONNECTS: u32 = 60;
/// Send a status update at most this often when only the frontier moved. The server frees
/// WAL and `pg_replication_slots.confirmed_flush_lsn` moves only this often, so anything
/// that waits on confirmation (an operator, a benchmark's clock) sees the frontier up to
/// this late; a status update is a few dozen bytes, and 10 a second cost nothing measurable.
const FRONTIER_REPORT_EVERY: Duration = Duration::from_millis(100);

struct State<'a> {
    opts: &'a config::PostgresSource,
    emitter: Emitter,
    /// The frontier as this loop last looked at it (a receiver of its own, so waiting on it
    /// does not borrow the emitter).
    frontier: watch::Receiver<Frontier>,
    stop: watch::Receiver<StopMode>,
    stats: Arc<SourceStats>,
    relations: Relations,
    tx: Option<OpenTx>,
    received: Lsn,
    /// End of the last transaction emitted: what the frontier reaches once everything
    /// emitted is durable.
    committed: Lsn,
    reported: Lsn,
    last_report: Instant,
    ticker: tokio::time::Interval,
    /// When the socket last gave us a message (or we last came back to reading it).
    last_heard: Instant,
    /// Transactions the server streams before they commit (protocol version 2).
    spill: Spill,
    /// The top-level xid of the stream block being received, between Stream Start and Stop.
    streaming: Option<u32>,
    /// For SQL connections made while streaming (see `tables::stop_at`).
    params: ConnectParams,
    /// New table shapes to record, and catalog events to stop at (see `tables`).
    ledger: tables::Ledger,
    /// Whether sessions ask for values in binary format: from `binary_values`, until a
    /// relation shows a column Zipline reads only in text (then text for the rest of the run).
    binary: bool,
}

struct OpenTx {
    lsn: Lsn,
    ordinal: u32,
}

enum Wake {
    Stop,
    Frontier,
    Tick,
    Msg(Result<ReplMessage, ConnError>),
    /// The socket has nothing to read right now, or the parcel is full: room to hand over.
    Room(Result<mpsc::OwnedPermit<Vec<Event>>, crate::source::emitter::Gone>),
}

enum Flow {
    Continue,
    Stopped,
}

/// What the streaming loop starts from.
pub(crate) struct Start {
    /// Key columns per table, for REPLICA IDENTITY FULL tables.
    pub(crate) keys: KeyHints,
    /// Catalog events to stop at.
    pub(crate) events: tables::Events,
    /// The slot's confirmed position: nothing of ours lies below it.
    pub(crate) slot_lsn: Lsn,
}

pub(crate) async fn run(
    opts: &config::PostgresSource,
    params: ConnectParams,
    start: Start,
    io: SourceIo,
    stop: watch::Receiver<StopMode>,
    stats: Arc<SourceStats>,
) -> Result<(), SourceError> {
    let Start {
        keys,
        events,
        slot_lsn,
    } = start;
    let SourceIo {
        mut emitter,
        ledger,
        ..
    } = io;
    let known: Known = ledger
        .known
        .into_iter()
        .map(|r| {
            (
                (r.table.schema.clone(), r.table.name.clone()),
                (r.relation, r.table),
            )
        })
        .collect();
    let ledger = tables::Ledger::new(ledger.record, events);
    // Nothing of ours lies below the slot's position: the frontier starts there.
    emitter.push(Event::Idle { at: slot_lsn });
    // Ticks serve both the status interval and the receive watchdog.
    let mut ticker = tokio::time::interval(
        opts.status_interval
            .min(opts.receive_timeout / 4)
            .min(FRONTIER_REPORT_EVERY),
    );
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let frontier = emitter.watch();
    let mut st = State {
        opts,
        emitter,
        frontier,
        stop,
        stats,
        relations: Relations::new(keys, known),
        ledger,
        tx: None,
        received: Lsn(0),
        committed: slot_lsn,
        reported: Lsn(0),
        last_report: Instant::now(),
        ticker,
        last_heard: Instant::now(),
        spill: Spill::new(&opts.spill_dir).map_err(|e| {
            SourceError::fatal(format!(
                "{}: cannot use spill directory {}: {e}",
                opts.name,
                opts.spill_dir.display()
            ))
        })?,
        streaming: None,
        params: params.clone(),
        binary: opts.binary_values,
    };
    let mut backoff = Backoff::new(
        format!("{}: replication stream lost; reconnecting", opts.name),
        Budget::Retries(MAX_RECONNECTS),
    );
    let mut start = slot_lsn;
    loop {
        let before = st.received;
        let binary = st.binary;
        let err = match session(&mut st, &params, start).await {
            Ok(()) => return Ok(()),
            Err(e) if e.class == ErrorClass::Transient => e,
            Err(e) => return Err(e),
        };
        // A column Zipline reads only in text turned up: read again in text, at once.
        let to_text = binary && !st.binary;
        if !to_text {
            st.stats.errors.count(ErrorClass::Transient);
            st.stats.set_state(SourceState::Reconnecting);
        }
        if st.received > before {
            backoff.reset();
        }
        if !to_text && backoff.attempts() >= MAX_RECONNECTS {
            let message = format!(
                "{}: giving up after {MAX_RECONNECTS} reconnect attempts; the last one: {}",
                opts.name, err.message
            );
            return Err(err.reworded(ErrorClass::Fatal, message));
        }
        // Everything emitted so far becomes durable (or fails) before resuming, so the resent
        // transactions never mix with copies still in flight.
        let rewound = tokio::select! {
            rewound = st.emitter.rewind() => rewound,
            _ = wait_stop(&mut st.stop) => return Ok(()),
        };
        let Ok(frontier) = rewound else {
            return Ok(());
        };
        if *st.stop.borrow() != StopMode::Run {
            return Ok(());
        }
        start = frontier.max(slot_lsn);
        st.committed = start;
        st.tx = None;
        st.relations.reset();
        st.streaming = None;
        st.spill.reset().map_err(|e| spill_error(st.opts, &e))?;
        if to_text {
            continue;
        }
        tokio::select! {
            _ = backoff.wait(&err) => {}
            _ = wait_stop(&mut st.stop) => return Ok(()),
        }
    }
}

/// Resolves once a stop (of any mode) is asked for.
async fn wait_stop(stop: &mut watch::Receiver<StopMode>) {
    while *stop.borrow_and_update() == StopMode::Run {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// Most messages handled in one go from what the socket already delivered.
const BURST: usize = 1024;

async fn session(
    st: &mut State<'_>,
    params: &ConnectParams,
    start: Lsn,
) -> Result<(), SourceError> {
    let opts = st.opts;
    let repl = ReplicationConn::connect(params)
        .await
        .map_err(|e| conn_error(opts, e))?;
    // Version 2 with streaming (PostgreSQL 14+) sends a transaction larger than
    // logical_decoding_work_mem while it runs, instead of spilling it on the server first.
    let protocol = if opts.stream_in_progress {
        "proto_version '2', streaming 'on'"
    } else {
        "proto_version '1'"
    };
    let values = if st.binary { ", binary 'true'" } else { "" };
    let command = format!(
        "START_REPLICATION SLOT {} LOGICAL {start} ({protocol}{values}, publication_names {})",
        quote_ident(&opts.slot_name),
        quote_literal(&quote_ident(&opts.publication)),
    );
    let mut stream = repl
        .start_replication(&command)
        .await
        .map_err(|e| conn_error(opts, e))?;
    tracing::info!(connector = %opts.name, slot = %opts.slot_name, from = %start, binary_values = st.binary, "streaming");
    st.stats.set_state(SourceState::Streaming);
    st.last_heard = Instant::now();
    loop {
        let full = st.emitter.is_full();
        let pending = st.emitter.has_pending();
        let wake = tokio::select! {
            biased;
            _ = st.stop.changed() => Wake::Stop,
            _ = st.frontier.changed() => Wake::Frontier,
            _ = st.ticker.tick() => Wake::Tick,
            msg = stream.recv(), if !full => Wake::Msg(msg),
            room = st.emitter.ready(), if pending => Wake::Room(room),
        };
        let flow = match wake {
            Wake::Stop => on_stop(st, &mut stream).await?,
            Wake::Frontier => {
                maybe_report(st, &mut stream).await?;
                Flow::Continue
            }
            Wake::Tick => {
                watchdog(st, &mut stream).await?;
                Flow::Continue
            }
            Wake::Msg(msg) => {
                let mut flow =
                    on_message(st, &mut stream, msg.map_err(|e| conn_error(opts, e))?).await?;
                // The frames already received are handled before going back to the select,
                // whose watch and timer registrations cost more than decoding a row; the burst
                // is bounded so a stop or the frontier waits at most that many messages.
                let mut burst = 1;
                while let Flow::Continue = flow
                    && burst < BURST
                    && !st.emitter.is_full()
                    && let Some(msg) = stream.buffered().map_err(|e| conn_error(opts, e))?
                {
                    flow = on_message(st, &mut stream, msg).await?;
                    burst += 1;
                }
                // Time spent waiting for room is not the server's silence.
                st.last_heard = Instant::now();
                flow
            }
            Wake::Room(Ok(permit)) => {
                st.emitter.send(permit);
                if full {
                    st.last_heard = Instant::now();
                }
                Flow::Continue
            }
            // The runtime stopped: it knows why; confirm what is durable and end.
            Wake::Room(Err(_)) => {
                report(st, &mut stream, false).await?;
                Flow::Stopped
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
            if st.tx.is_none() {
                // Nothing of ours below the server's end: once the rest is durable, the
                // frontier may move there (a quiet publication must not pin WAL).
                if let Flow::Stopped = emit(st, stream, Event::Idle { at: wal_end }).await? {
                    return Ok(Flow::Stopped);
                }
            }
            if reply {
                report(st, stream, false).await?;
            } else {
                maybe_report(st, stream).await?;
            }
            Ok(Flow::Continue)
        }
        ReplMessage::XLogData { wal_end, data } => {
            // Only a message inside a stream block may have to be spilled whole; elsewhere
            // the decoder takes the buffer itself (a clone is an atomic count each way).
            let kept = st.streaming.map(|_| data.clone());
            let msg = pgoutput::decode(data, st.streaming.is_some())
                .map_err(|e| undecodable(st.opts, &e))?;
            if let (Some(top), Some(sub), Some(data)) = (st.streaming, msg.stream_xid(), kept) {
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
        } => return begin_tx(st, stream, final_lsn, commit_time).await,
        PgOutput::Commit { end_lsn, .. } => return commit_tx(st, stream, end_lsn).await,
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
                    if st.binary
                        && let Some(column) = types::text_only_column(&table)
                    {
                        st.binary = false;
                        tracing::info!(connector = %st.opts.name, table = %table.qualified_name(), column = %column.name, type_oid = column.type_oid, "Zipline reads this column's type only in text: reading the stream again from the durable frontier, in text from here on");
                        return Err(SourceError::transient(format!(
                            "{}: the stream switches to text values",
                            st.opts.name
                        )));
                    }
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
            // Pushed here, not through `emit`: no future's state to move the change into
            // first, as nothing is awaited while it is held.
            if push(st, Event::Change(change)) {
                return flush(st, stream).await;
            }
        }
        PgOutput::Truncate { rel_ids, .. } => {
            for rel_id in rel_ids {
                let position = next_position(st)?;
                let change = st
                    .relations
                    .build_truncate(rel_id, position)
                    .map_err(|e| change_error(st, &e))?;
                st.stats.received.fetch_add(1, Ordering::Relaxed);
                if let Flow::Stopped = emit_change(st, stream, change).await? {
                    return Ok(Flow::Stopped);
                }
            }
        }
        PgOutput::Origin { .. } | PgOutput::Type { .. } | PgOutput::Message { .. } => {}
        other => {
            return Err(SourceError::fatal(format!(
                "{}: unexpected pgoutput message {} here",
                st.opts.name,
                other.name()
            )));
        }
    }
    Ok(Flow::Continue)
}

async fn emit_change(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    change: Change,
) -> Result<Flow, SourceError> {
    emit(st, stream, Event::Change(change)).await
}

fn next_position(st: &mut State<'_>) -> Result<Position, SourceError> {
    let tx = st.tx.as_mut().ok_or_else(|| {
        SourceError::fatal(format!(
            "{}: row message outside a transaction",
            st.opts.name
        ))
    })?;
    tx.ordinal += 1;
    Ok(Position::new(tx.lsn, tx.ordinal))
}
