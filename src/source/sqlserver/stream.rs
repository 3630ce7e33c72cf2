//! The streaming loop: poll the change tables, dispatch changes to the lanes, turn acks into
//! the durable frontier and record it in the sinks; drain or abort on request; reconnect with
//! backoff after a lost connection.
//!
//! Start: the durable frontier `P` is the lowest position every lane of every sink has
//! committed (`SinkConnector::durable_frontier`). No `P`: initial snapshot (or, with
//! `snapshot: never`, start at the current maximum LSN). `P` at a whole transaction (ordinal
//! `u32::MAX`, written by [`record`]): stream after `P.lsn`. `P` inside a transaction: if the
//! change tables hold at least `P.ordinal` changes at `P.lsn` it is a partly applied
//! transaction, re-read from `P.lsn` (lanes skip what they committed); otherwise it is an
//! interrupted snapshot, whose ordinals lie above that count, and the snapshot starts over.
//!
//! Each poll waits `poll_interval` (serving acks meanwhile) unless the previous one found a
//! full window. A window's reads all finish before its first change is dispatched, so a lost
//! connection never leaves a transaction half dispatched in stream mode; after one, the loop
//! waits until everything dispatched is acknowledged, then resumes from the end of the last
//! dispatched window. While a lane queue is full it stops reading (back-pressure) but keeps
//! taking acks.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::time::Instant;

use super::catalog::{self, Captured};
use super::conn::{self, Conn};
use super::lsn::{self, WHOLE_TRANSACTION};
use super::reader;
use super::snapshot;
use super::sql;
use super::{SinkLanes, SnapshotMode, SqlServerSourceOptions};
use crate::change::{Change, Lsn, Position};
use crate::error::ErrorClass;
use crate::lane::{AckTracker, lane_of, needs_barrier, plan};
use crate::source::{Outputs, SourceError, SourceStats, StopMode};

/// Reconnect attempts in a row before a lost connection becomes fatal (≈5 minutes).
const MAX_RECONNECTS: u32 = 60;
/// Record the durable frontier in the sinks at most this often while streaming.
const RECORD_EVERY: Duration = Duration::from_secs(2);

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
    /// A stop was requested; the caller hands over to [`on_stop`].
    Stop,
}

pub(super) struct State<'a> {
    pub(super) opts: &'a SqlServerSourceOptions,
    pub(super) tables: Vec<Captured>,
    sinks: &'a [SinkLanes],
    outputs: Outputs,
    stop: watch::Receiver<StopMode>,
    pub(super) stats: Arc<SourceStats>,
    pub(super) tracker: AckTracker,
    pub(super) phase: Phase,
    /// Every transaction committed at or below it has been dispatched (stream phase).
    pub(super) lo: Lsn,
    recorded: Lsn,
    last_record: Instant,
}

impl State<'_> {
    /// The route transform's batch size, when the route has a transform.
    pub(super) fn outputs_transform_batch(&self) -> Option<usize> {
        self.outputs
            .transform
            .as_ref()
            .map(|t| t.batch_size().max(1))
    }
}

pub(super) async fn run(
    opts: &SqlServerSourceOptions,
    tables: Vec<Captured>,
    sinks: &[SinkLanes],
    outputs: Outputs,
    stop: watch::Receiver<StopMode>,
    stats: Arc<SourceStats>,
) -> Result<(), SourceError> {
    let start = durable_frontier(opts, sinks).await?;
    tracing::info!(connector = %opts.connector, frontier = %start.map_or_else(|| "none".to_owned(), describe), "durable frontier from the sinks");
    let mut st = State {
        opts,
        tables,
        sinks,
        outputs,
        stop,
        stats,
        tracker: AckTracker::new(Lsn(0)),
        phase: Phase::Resume(start),
        lo: Lsn(0),
        recorded: Lsn(0),
        last_record: Instant::now(),
    };
    let mut failures = 0u32;
    loop {
        let before = (st.stats.received.load(Ordering::Relaxed), st.lo);
        let err = match session(&mut st).await {
            Ok(Flow::Stop) => return on_stop(&mut st).await,
            Ok(Flow::Continue) => continue,
            Err(e) if e.class == ErrorClass::Transient => e,
            Err(e) => return Err(e),
        };
        // A session that got anywhere (changes, or an idle window) resets the count.
        if (st.stats.received.load(Ordering::Relaxed), st.lo) != before {
            failures = 0;
        }
        failures += 1;
        if failures > MAX_RECONNECTS {
            return Err(SourceError::fatal(format!(
                "{}: giving up after {MAX_RECONNECTS} reconnect attempts: {}",
                opts.connector, err.message
            )));
        }
        // Everything dispatched must be durable (or failed) before resuming, so re-read
        // changes never mix with copies still in flight.
        if wait_idle(&mut st).await? == Flow::Stop {
            return on_stop(&mut st).await;
        }
        st.tracker.abandon_open();
        let delay = crate::lane::backoff_for(failures);
        tracing::warn!(connector = %opts.connector, attempt = failures, delay_ms = delay.as_millis() as u64, error = %err, "SQL Server connection lost; reconnecting");
        if pause(&mut st, delay).await? == Flow::Stop {
            return on_stop(&mut st).await;
        }
    }
}

/// The lowest durable position over the sinks; `None` if any sink knows none.
async fn durable_frontier(
    opts: &SqlServerSourceOptions,
    sinks: &[SinkLanes],
) -> Result<Option<Position>, SourceError> {
    let mut lowest: Option<Position> = None;
    for sink in sinks {
        let mut attempt = 0;
        let frontier = loop {
            match sink.connector.durable_frontier(sink.lanes).await {
                Ok(f) => break f,
                Err(e) if e.class == ErrorClass::Transient && attempt < opts.connect_retries => {
                    attempt += 1;
                    tracing::warn!(connector = %opts.connector, sink = %sink.connector.name(), error = %e, "cannot read the sink's checkpoints yet; retrying");
                    tokio::time::sleep(crate::lane::backoff_for(attempt)).await;
                }
                Err(e) => {
                    return Err(SourceError {
                        class: if e.class == ErrorClass::Transient {
                            ErrorClass::Fatal
                        } else {
                            e.class
                        },
                        message: format!(
                            "{}: reading the durable frontier from sink {}: {e}",
                            opts.connector,
                            sink.connector.name()
                        ),
                        kind: crate::source::SourceErrorKind::Other,
                    });
                }
            }
        };
        match frontier {
            None => return Ok(None),
            Some(f) => lowest = Some(lowest.map_or(f, |l| l.min(f))),
        }
    }
    Ok(lowest)
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
        if snapshot::run(st, &mut conn, after).await? == Flow::Stop {
            return Ok(Flow::Stop);
        }
        st.phase = Phase::Stream;
    }
    tracing::info!(connector = %st.opts.connector, after = %lsn::literal(st.lo), "streaming changes");
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
        None if opts.snapshot == SnapshotMode::Initial => Phase::Snapshot { after: None },
        None => {
            st.lo = reader::max_lsn(conn, opts).await?;
            tracing::info!(connector = %opts.connector, lsn = %lsn::literal(st.lo), "no durable frontier and `snapshot: never`: streaming changes committed from now on");
            Phase::Stream
        }
        Some(p) if p.ordinal == WHOLE_TRANSACTION => {
            st.lo = p.lsn;
            Phase::Stream
        }
        Some(p) => {
            let held = changes_at(st, conn, p.lsn).await?;
            if u64::from(p.ordinal) <= held {
                tracing::info!(connector = %opts.connector, position = %describe(p), "resuming inside a transaction; lanes skip what they committed");
                st.lo = lsn::prev(p.lsn);
                Phase::Stream
            } else if opts.snapshot == SnapshotMode::Initial {
                tracing::info!(connector = %opts.connector, position = %describe(p), "the initial snapshot was interrupted; taking a new one");
                Phase::Snapshot { after: Some(p.lsn) }
            } else {
                return Err(SourceError::fatal(format!(
                    "{}: the initial snapshot at LSN {} was interrupted and `snapshot: never` \
                     forbids finishing it; set `snapshot: initial` so that the rows it did \
                     not copy are not missing",
                    opts.connector,
                    lsn::literal(p.lsn)
                )));
            }
        }
    };
    st.tracker = AckTracker::new(st.lo);
    st.recorded = st.lo;
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
            .map_err(|e| SourceError::fatal(format!("{}: {e}", st.opts.connector)))?;
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
        after_acks(st).await;
        return Ok((Flow::Continue, false));
    }
    catalog::refresh(conn, opts, &mut st.tables).await?;
    let (hi, ages) = reader::window(conn, opts, st.lo, max).await?;
    let rows = reader::read(conn, opts, &st.tables, st.lo, hi).await?;
    let txs = reader::assemble(&st.tables, rows, &ages)
        .map_err(|e| SourceError::fatal(format!("{}: {e}", opts.connector)))?;
    let now = now_micros();
    let received: usize = txs.iter().map(|tx| tx.changes.len()).sum();
    st.stats
        .received
        .fetch_add(received as u64, Ordering::Relaxed);
    let heads: Vec<(Lsn, i64)> = txs.iter().map(|tx| (tx.lsn, tx.age_us)).collect();
    let Some(outputs) = transform_window(st, txs).await? else {
        return Ok((Flow::Stop, false));
    };
    for ((lsn, age_us), changes) in heads.into_iter().zip(outputs) {
        st.tracker.begin(lsn, now - age_us);
        for change in changes {
            if dispatch_one(st, change).await? == Flow::Stop {
                return Ok((Flow::Stop, false));
            }
        }
        st.tracker.commit(lsn);
    }
    st.lo = hi;
    after_acks(st).await;
    Ok((Flow::Continue, hi < max))
}

/// The changes of each transaction after the route's transform (as they are without one).
/// Transforms the whole window in batches of the transform's `batch_size`, so small
/// transactions do not cost a guest call each. `None` when the pipeline aborts meanwhile.
async fn transform_window(
    st: &mut State<'_>,
    txs: Vec<reader::Tx>,
) -> Result<Option<Vec<Vec<Change>>>, SourceError> {
    let Some(batch_size) = st.outputs.transform.as_ref().map(|t| t.batch_size().max(1)) else {
        return Ok(Some(txs.into_iter().map(|tx| tx.changes).collect()));
    };
    let mut out: Vec<Vec<Change>> = vec![Vec::new(); txs.len()];
    let mut owner = Vec::new();
    let mut flat = Vec::new();
    for (i, tx) in txs.into_iter().enumerate() {
        owner.extend(std::iter::repeat_n(i, tx.changes.len()));
        flat.extend(tx.changes);
    }
    let mut offset = 0;
    let mut rest = flat.into_iter();
    loop {
        let chunk: Vec<Change> = rest.by_ref().take(batch_size).collect();
        if chunk.is_empty() {
            break;
        }
        let len = chunk.len();
        let Some(outputs) = transform(st, chunk).await? else {
            return Ok(None);
        };
        for (i, change) in outputs {
            out[owner[offset + i]].push(change);
        }
        offset += len;
    }
    Ok(Some(out))
}

/// Runs the route's transform on `changes` (all of them when there is none), taking acks
/// while the guest runs. Outputs carry the index of their input. `None` on abort.
pub(super) async fn transform(
    st: &mut State<'_>,
    changes: Vec<Change>,
) -> Result<Option<Vec<(usize, Change)>>, SourceError> {
    let Some(t) = st.outputs.transform.as_ref() else {
        return Ok(Some(changes.into_iter().enumerate().collect()));
    };
    let call = t.transform(changes);
    tokio::pin!(call);
    loop {
        if *st.stop.borrow_and_update() == StopMode::Abort {
            return Ok(None);
        }
        tokio::select! {
            biased;
            result = &mut call => {
                return result
                    .map(Some)
                    .map_err(|e| SourceError::fatal(format!("{}: {e}", st.opts.connector)));
            }
            changed = st.stop.changed() => {
                if changed.is_err() {
                    return Ok(None);
                }
            }
            Some(ack) = st.outputs.acks.recv() => {
                st.tracker.ack(&ack);
                after_acks(st).await;
            }
        }
    }
}

/// Dispatches one change, as a barrier across lanes when it must be one: a key change that
/// leaves large values untouched moves the sink's row whole, so everything before it on
/// every lane must land first, and nothing after it may overtake it.
pub(super) async fn dispatch_one(st: &mut State<'_>, change: Change) -> Result<Flow, SourceError> {
    let barrier = st
        .outputs
        .routers
        .iter()
        .any(|r| needs_barrier(&change, r.lanes()));
    if !barrier {
        return dispatch(st, change).await;
    }
    if wait_idle(st).await? == Flow::Stop {
        return Ok(Flow::Stop);
    }
    for i in 0..st.outputs.routers.len() {
        let lanes = st.outputs.routers[i].lanes();
        let lane = lane_of(&change.table.schema, &change.table.name, &change.key, lanes);
        if send(st, i, lane, change.clone()).await? == Flow::Stop {
            return Ok(Flow::Stop);
        }
    }
    wait_idle(st).await
}

/// Microseconds since the Unix epoch, the clock of `oldest_pending_commit_time`.
pub(super) fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// Takes every ack waiting, moves an idle frontier to `lo`, updates lag, records the
/// frontier when due.
async fn after_acks(st: &mut State<'_>) {
    while let Ok(ack) = st.outputs.acks.try_recv() {
        st.tracker.ack(&ack);
    }
    if st.phase == Phase::Stream && st.tracker.is_idle() {
        st.tracker.idle_advance(st.lo);
    }
    let lag = st
        .tracker
        .oldest_pending_commit_time()
        .map_or(0, |t| (now_micros() - t).max(0));
    st.stats.lag_micros.store(lag, Ordering::Relaxed);
    record(st, false).await;
}

/// Records the durable frontier in every sink when it moved (at most every
/// [`RECORD_EVERY`] unless `force`). A failure only delays the record.
async fn record(st: &mut State<'_>, force: bool) {
    let frontier = st.tracker.frontier();
    st.stats
        .confirmed
        .store(frontier.as_pg(), Ordering::Relaxed);
    if frontier <= st.recorded || (!force && st.last_record.elapsed() < RECORD_EVERY) {
        return;
    }
    st.last_record = Instant::now();
    let position = Position::new(frontier, WHOLE_TRANSACTION);
    let mut all = true;
    for sink in st.sinks {
        if let Err(e) = sink.connector.advance_frontier(sink.lanes, position).await {
            all = false;
            tracing::warn!(connector = %st.opts.connector, sink = %sink.connector.name(), frontier = %lsn::literal(frontier), error = %e, "cannot record the durable frontier in the sink yet");
        }
    }
    if all {
        tracing::debug!(connector = %st.opts.connector, frontier = %lsn::literal(frontier), "recorded the durable frontier");
        st.recorded = frontier;
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

/// Waits `delay`, serving acks. `Stop` when a stop was requested.
pub(super) async fn pause(st: &mut State<'_>, delay: Duration) -> Result<Flow, SourceError> {
    let deadline = tokio::time::sleep(delay);
    tokio::pin!(deadline);
    loop {
        if *st.stop.borrow_and_update() != StopMode::Run {
            return Ok(Flow::Stop);
        }
        tokio::select! {
            biased;
            changed = st.stop.changed() => {
                if changed.is_err() {
                    return Ok(Flow::Stop);
                }
            }
            Some(ack) = st.outputs.acks.recv() => {
                st.tracker.ack(&ack);
                after_acks(st).await;
            }
            () = &mut deadline => return Ok(Flow::Continue),
        }
    }
}

/// Hands one change to every sink's lane for its key, waiting for queue space while taking
/// acks. `Stop` when a stop was requested meanwhile.
pub(super) async fn dispatch(st: &mut State<'_>, change: Change) -> Result<Flow, SourceError> {
    let sinks = st.outputs.routers.len();
    let mut change = Some(change);
    for i in 0..sinks {
        let copy = if i + 1 == sinks {
            change.take()
        } else {
            change.clone()
        };
        let Some(copy) = copy else { break };
        let lanes = st.outputs.routers[i].lanes();
        for (lane, part) in plan(copy, lanes) {
            if send(st, i, lane, part).await? == Flow::Stop {
                return Ok(Flow::Stop);
            }
        }
    }
    Ok(Flow::Continue)
}

async fn send(
    st: &mut State<'_>,
    sink: usize,
    lane: u32,
    change: Change,
) -> Result<Flow, SourceError> {
    let sender = st.outputs.routers[sink].sender(lane).clone();
    loop {
        if *st.stop.borrow_and_update() != StopMode::Run {
            return Ok(Flow::Stop);
        }
        tokio::select! {
            biased;
            permit = sender.reserve() => {
                let permit = permit.map_err(|_| SourceError::fatal(format!(
                    "{}: lane {lane} of sink #{sink} stopped", st.opts.connector
                )))?;
                permit.send(Arc::new(change));
                st.tracker.dispatched(1);
                return Ok(Flow::Continue);
            }
            changed = st.stop.changed() => {
                if changed.is_err() {
                    return Ok(Flow::Stop);
                }
            }
            Some(ack) = st.outputs.acks.recv() => {
                st.tracker.ack(&ack);
                after_acks(st).await;
            }
        }
    }
}

/// Waits until every dispatched copy is acknowledged (no connection needed).
async fn wait_idle(st: &mut State<'_>) -> Result<Flow, SourceError> {
    while st.tracker.in_flight() > 0 {
        if *st.stop.borrow_and_update() == StopMode::Abort {
            return Ok(Flow::Stop);
        }
        tokio::select! {
            ack = st.outputs.acks.recv() => match ack {
                Some(ack) => st.tracker.ack(&ack),
                None => return Err(SourceError::fatal(format!("{}: every lane stopped", st.opts.connector))),
            },
            changed = st.stop.changed() => {
                if changed.is_err() {
                    return Ok(Flow::Stop);
                }
            }
        }
    }
    after_acks(st).await;
    Ok(Flow::Continue)
}

/// Drain: close the lane queues, wait for the lanes' last acks, record the frontier.
/// Abort: record only what is already durable.
async fn on_stop(st: &mut State<'_>) -> Result<(), SourceError> {
    let mode = *st.stop.borrow();
    if mode != StopMode::Abort {
        tracing::info!(connector = %st.opts.connector, in_flight = st.tracker.in_flight(), "draining lanes");
        // Closing the queues lets each lane commit what it holds and exit.
        st.outputs.routers.clear();
        while let Some(ack) = st.outputs.acks.recv().await {
            st.tracker.ack(&ack);
        }
    }
    while let Ok(ack) = st.outputs.acks.try_recv() {
        st.tracker.ack(&ack);
    }
    if st.phase == Phase::Stream && st.tracker.is_idle() {
        st.tracker.idle_advance(st.lo);
    }
    record(st, true).await;
    tracing::info!(connector = %st.opts.connector, frontier = %lsn::literal(st.tracker.frontier()), "stopped; recorded the durable frontier");
    Ok(())
}
