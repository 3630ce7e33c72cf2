//! The streaming loop: poll the change tables, emit each window's transactions; drain or
//! abort on request; reconnect with backoff after a lost connection.
//!
//! Start: the runtime hands the source `P`, the lowest position every lane of every sink has
//! committed (the sinks' checkpoints are the only durable record: SQL Server keeps no reader
//! cursor). No `P`: initial snapshot (or, with `snapshot: never`, start at the current
//! maximum LSN). `P` at a whole transaction (ordinal `u32::MAX`, as the runtime records the
//! frontier): stream after `P.lsn`. `P` inside a transaction: if the change tables hold at
//! least `P.ordinal` changes at `P.lsn` it is a partly applied transaction, re-read from
//! `P.lsn` (lanes skip what they committed); otherwise it is an interrupted snapshot, whose
//! ordinals lie above that count, and the snapshot starts over.
//!
//! Each poll waits `poll_interval` unless the previous one found a full window. A window's
//! reads all finish before its first change is emitted, so a lost connection never leaves a
//! transaction half emitted in stream mode; after one, the loop rewinds (everything emitted
//! becomes durable first), then resumes from the end of the last emitted window. While the
//! emitter has no room it stops reading (back-pressure).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;

use super::catalog::{self, Captured};
use super::conn::{self, Conn};
use super::lsn::{self, WHOLE_TRANSACTION};
use super::reader;
use super::snapshot;
use super::sql;
use crate::change::{Lsn, Position, now_micros_since_2000};
use crate::config::{self, SqlServerSnapshot};
use crate::error::ErrorClass;
use crate::retry::{Backoff, Budget};
use crate::source::emitter::{Emitter, Event};
use crate::source::{SourceError, SourceIo, SourceState, SourceStats, StopMode};

/// Reconnect attempts in a row before a lost connection becomes fatal (≈5 minutes).
const MAX_RECONNECTS: u32 = 60;

/// Where the loop is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Not decided yet: the durable frontier from the sinks.
    Resume(Option<Position>),
    /// Take a snapshot whose LSN must be above `after` (that of an interrupted one).
    Snapshot { after: Option<Lsn> },
    /// Stream changes committed after `State::lo`.
    Stream,
}

/// Whether the loop goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flow {
    Continue,
    /// A stop was requested (or the runtime is gone); the caller hands over to [`on_stop`].
    Stop,
}

pub(super) struct State<'a> {
    pub(super) opts: &'a config::SqlServerSource,
    pub(super) tables: Vec<Captured>,
    emitter: Emitter,
    stop: watch::Receiver<StopMode>,
    pub(super) stats: Arc<SourceStats>,
    pub(super) phase: Phase,
    /// Every transaction committed at or below it has been emitted (stream phase).
    pub(super) lo: Lsn,
}

pub(super) async fn run(
    opts: &config::SqlServerSource,
    tables: Vec<Captured>,
    io: SourceIo,
    stop: watch::Receiver<StopMode>,
    stats: Arc<SourceStats>,
) -> Result<(), SourceError> {
    let start = io.resume;
    tracing::info!(connector = %opts.name, frontier = %start.map_or_else(|| "none".to_owned(), describe), "durable frontier from the sinks");
    let mut st = State {
        opts,
        tables,
        emitter: io.emitter,
        stop,
        stats,
        phase: Phase::Resume(start),
        lo: Lsn(0),
    };
    let mut backoff = Backoff::new(
        format!("{}: SQL Server connection lost; reconnecting", opts.name),
        Budget::Retries(MAX_RECONNECTS),
    );
    loop {
        let before = (st.stats.received.load(Ordering::Relaxed), st.lo);
        let err = match session(&mut st).await {
            Ok(Flow::Stop) => {
                st.stats.set_state(SourceState::Stopped);
                return on_stop(&mut st).await;
            }
            Ok(Flow::Continue) => continue,
            Err(e) if e.class == ErrorClass::Transient => e,
            Err(e) => {
                st.stats.errors.count(e.class);
                st.stats.set_state(SourceState::Stopped);
                return Err(e);
            }
        };
        st.stats.errors.count(ErrorClass::Transient);
        st.stats.set_state(SourceState::Reconnecting);
        // A session that got anywhere (changes, or an idle window) resets the count.
        if (st.stats.received.load(Ordering::Relaxed), st.lo) != before {
            backoff.reset();
        }
        if backoff.attempts() >= MAX_RECONNECTS {
            let message = format!(
                "{}: giving up after {MAX_RECONNECTS} reconnect attempts; the last one: {}",
                opts.name, err.message
            );
            return Err(err.reworded(ErrorClass::Fatal, message));
        }
        // Everything emitted must be durable (or failed) before resuming, so re-read changes
        // never mix with copies still in flight; a snapshot cut short starts over.
        let rewound = tokio::select! {
            rewound = st.emitter.rewind() => rewound.is_ok(),
            () = stopped(&mut st.stop) => false,
        };
        if !rewound {
            return on_stop(&mut st).await;
        }
        tokio::select! {
            _ = backoff.wait(&err) => {}
            () = stopped(&mut st.stop) => return on_stop(&mut st).await,
        }
    }
}

/// Resolves once a stop (of any mode) is asked for.
async fn stopped(stop: &mut watch::Receiver<StopMode>) {
    while *stop.borrow_and_update() == StopMode::Run {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// How a position reads in logs.
pub(super) fn describe(p: Position) -> String {
    if p.ordinal == WHOLE_TRANSACTION {
        format!("{} (whole transaction)", lsn::literal(p.lsn))
    } else {
        format!("{}#{}", lsn::literal(p.lsn), p.ordinal)
    }
}

/// One connection's life: decide where to start, snapshot if needed, poll.
async fn session(st: &mut State<'_>) -> Result<Flow, SourceError> {
    let mut conn = conn::connect(st.opts).await?;
    catalog::refresh(&mut conn, st.opts, &mut st.tables).await?;
    if let Phase::Resume(start) = st.phase {
        decide(st, &mut conn, start).await?;
    }
    if let Phase::Snapshot { after } = st.phase {
        st.stats.set_state(SourceState::Snapshot);
        if snapshot::run(st, &mut conn, after).await? == Flow::Stop {
            return Ok(Flow::Stop);
        }
        st.phase = Phase::Stream;
    }
    tracing::info!(connector = %st.opts.name, after = %lsn::literal(st.lo), "streaming changes");
    st.stats.set_state(SourceState::Streaming);
    let mut full = true;
    loop {
        let flow = if full {
            stop_requested(st)
        } else {
            pause(st, st.opts.poll_interval).await?
        };
        if flow == Flow::Stop {
            return Ok(Flow::Stop);
        }
        match poll(st, &mut conn).await? {
            (Flow::Stop, _) => return Ok(Flow::Stop),
            (Flow::Continue, f) => full = f,
        }
    }
}

/// Turns the sinks' durable frontier into a phase (see the module docs).
async fn decide(
    st: &mut State<'_>,
    conn: &mut Conn,
    start: Option<Position>,
) -> Result<(), SourceError> {
    let opts = st.opts;
    st.phase = match start {
        None if opts.snapshot == SqlServerSnapshot::Initial => Phase::Snapshot { after: None },
        None => {
            st.lo = reader::max_lsn(conn, opts).await?;
            tracing::info!(connector = %opts.name, lsn = %lsn::literal(st.lo), "no durable frontier and `snapshot: never`: streaming changes committed from now on");
            Phase::Stream
        }
        Some(p) if p.ordinal == WHOLE_TRANSACTION => {
            st.lo = p.lsn;
            Phase::Stream
        }
        Some(p) => {
            let held = changes_at(st, conn, p.lsn).await?;
            if u64::from(p.ordinal) <= held {
                tracing::info!(connector = %opts.name, position = %describe(p), "resuming inside a transaction; lanes skip what they committed");
                st.lo = lsn::prev(p.lsn);
                Phase::Stream
            } else if opts.snapshot == SqlServerSnapshot::Initial {
                tracing::info!(connector = %opts.name, position = %describe(p), "the initial snapshot was interrupted; taking a new one");
                Phase::Snapshot { after: Some(p.lsn) }
            } else {
                return Err(SourceError::fatal(format!(
                    "{}: the initial snapshot at LSN {} was interrupted and `snapshot: never` \
                     forbids finishing it; set `snapshot: initial` so that the rows it did \
                     not copy are not missing",
                    opts.name,
                    lsn::literal(p.lsn)
                )));
            }
        }
    };
    if st.phase == Phase::Stream {
        // Everything at or below `lo` is durable: the frontier starts there.
        st.emitter.push(Event::Idle { at: st.lo });
    }
    Ok(())
}

/// How many changes (operations 1, 2, 4) the change tables hold for the transaction
/// committed at `at`, over every table.
pub(super) async fn changes_at(
    st: &State<'_>,
    conn: &mut Conn,
    at: Lsn,
) -> Result<u64, SourceError> {
    let mut total = 0u64;
    for table in &st.tables {
        let reads = catalog::plan_reads(table, lsn::prev(at), at)
            .map_err(|e| SourceError::fatal(format!("{}: {e}", st.opts.name)))?;
        for r in reads {
            let inst = &table.instances[r.instance];
            let doing = format!(
                "counting the changes of {} at {}",
                table.qualified(),
                lsn::literal(at)
            );
            let rows = conn::query(conn, st.opts, &doing, &sql::changes_at(&inst.name, at)).await?;
            let n = rows
                .first()
                .map(|r| conn::int(r, 0, "changes"))
                .transpose()
                .map_err(|e| conn::bad_result(st.opts, &doing, e))?
                .flatten()
                .unwrap_or(0);
            total += u64::try_from(n).unwrap_or(0);
        }
    }
    Ok(total)
}

/// One poll. Also says whether the window was full (more is waiting: poll again at once).
async fn poll(st: &mut State<'_>, conn: &mut Conn) -> Result<(Flow, bool), SourceError> {
    let opts = st.opts;
    let max = reader::max_lsn(conn, opts).await?;
    if max <= st.lo {
        return Ok((Flow::Continue, false));
    }
    catalog::refresh(conn, opts, &mut st.tables).await?;
    let (hi, ages) = reader::window(conn, opts, st.lo, max).await?;
    let rows = reader::read(conn, opts, &st.tables, st.lo, hi).await?;
    let txs = reader::assemble(&st.tables, rows, &ages)
        .map_err(|e| SourceError::fatal(format!("{}: {e}", opts.name)))?;
    let now = now_micros_since_2000();
    for tx in txs {
        st.stats
            .received
            .fetch_add(tx.changes.len() as u64, Ordering::Relaxed);
        let begin = Event::Begin {
            commit_lsn: tx.lsn,
            commit_time: now - tx.age_us,
        };
        if emit(st, begin).await? == Flow::Stop {
            return Ok((Flow::Stop, false));
        }
        for change in tx.changes {
            if emit(st, Event::Change(change)).await? == Flow::Stop {
                return Ok((Flow::Stop, false));
            }
        }
        if emit(st, Event::Commit { end_lsn: tx.lsn }).await? == Flow::Stop {
            return Ok((Flow::Stop, false));
        }
    }
    st.lo = hi;
    if emit(st, Event::Idle { at: hi }).await? == Flow::Stop {
        return Ok((Flow::Stop, false));
    }
    Ok((Flow::Continue, hi < max))
}

/// Pushes one event, handing a full parcel over (waiting for room, or a stop).
pub(super) async fn emit(st: &mut State<'_>, event: Event) -> Result<Flow, SourceError> {
    st.emitter.push(event);
    if st.emitter.is_full() {
        return flush(st).await;
    }
    Ok(Flow::Continue)
}

/// Hands what is pending over, waiting for room. `Stop` when a stop was requested meanwhile
/// or the runtime is gone.
pub(super) async fn flush(st: &mut State<'_>) -> Result<Flow, SourceError> {
    match st.emitter.try_flush() {
        Ok(true) => return Ok(Flow::Continue),
        Ok(false) => {}
        Err(_) => return Ok(Flow::Stop),
    }
    tokio::select! {
        room = st.emitter.ready() => match room {
            Ok(permit) => {
                st.emitter.send(permit);
                Ok(Flow::Continue)
            }
            Err(_) => Ok(Flow::Stop),
        },
        () = stopped(&mut st.stop) => Ok(Flow::Stop),
    }
}

/// `Stop` when a stop was requested.
pub(super) fn stop_requested(st: &mut State<'_>) -> Flow {
    if *st.stop.borrow_and_update() == StopMode::Run {
        Flow::Continue
    } else {
        Flow::Stop
    }
}

/// Hands over what is pending, then waits `delay`. `Stop` when a stop was requested.
pub(super) async fn pause(st: &mut State<'_>, delay: Duration) -> Result<Flow, SourceError> {
    if flush(st).await? == Flow::Stop {
        return Ok(Flow::Stop);
    }
    tokio::select! {
        () = tokio::time::sleep(delay) => Ok(stop_requested(st)),
        () = stopped(&mut st.stop) => Ok(Flow::Stop),
    }
}

/// Drain: hand everything over and close the stream, so the runtime lets every lane commit
/// what it holds (and records the frontier). Abort: end at once.
async fn on_stop(st: &mut State<'_>) -> Result<(), SourceError> {
    if *st.stop.borrow() != StopMode::Abort {
        tracing::info!(connector = %st.opts.name, "draining lanes");
        let mut stop = st.stop.clone();
        tokio::select! {
            _ = st.emitter.close() => {}
            () = aborted(&mut stop) => {}
        }
    }
    tracing::info!(connector = %st.opts.name, emitted_up_to = %lsn::literal(st.lo), "stopped");
    Ok(())
}

/// Resolves once an abort is asked for.
async fn aborted(stop: &mut watch::Receiver<StopMode>) {
    while *stop.borrow_and_update() != StopMode::Abort {
        if stop.changed().await.is_err() {
            return;
        }
    }
}
