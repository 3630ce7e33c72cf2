//! The snapshot's copying engine: workers, one per reader, take chunks off a shared queue,
//! read each (`COPY` of a key range), optionally pass it through the route's transform, and
//! load it into every sink that needs it, reading the next chunk while the last one loads.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::progress::{self, Progress};
use super::reader::Reader;
use super::{MAX_ATTEMPTS, Outcome, sink_err};
use crate::change::{Change, Op, Position, Table, Value};
use crate::error::ErrorClass;
use crate::sink::{SinkConnector, SnapshotChunk};
use crate::source::postgres::conn::ConnectParams;
use crate::source::{SourceError, StopMode};
use crate::transform::RouteTransform;

/// Waits for every worker, or for a stop request (then stops them).
async fn supervise(
    workers: &mut JoinSet<Result<(), SourceError>>,
    stop: &mut watch::Receiver<StopMode>,
) -> Result<Outcome, SourceError> {
    let outcome = loop {
        tokio::select! {
            done = workers.join_next() => match done {
                None => break Ok(Outcome::Continue),
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => break Err(e),
                Some(Err(join)) => break Err(SourceError::fatal(format!("a snapshot worker failed: {join}"))),
            },
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow_and_update() != StopMode::Run {
                    break Ok(Outcome::Stopped);
                }
            }
        }
    };
    // Cancelled loads roll back: their connections close with the transaction open.
    workers.abort_all();
    while workers.join_next().await.is_some() {}
    outcome
}

/// One chunk to copy into some sinks.
pub(super) struct Job {
    /// Index into the engine's tables.
    pub(super) table: usize,
    pub(super) chunk: SnapshotChunk,
    /// Indices of the sinks that need it.
    pub(super) sinks: Vec<usize>,
}

/// What copying chunks needs.
pub(super) struct Engine {
    pub(super) connector: String,
    pub(super) params: ConnectParams,
    pub(super) retries: u32,
    pub(super) tables: Vec<Arc<Table>>,
    pub(super) sinks: Vec<Arc<dyn SinkConnector>>,
    /// Stamped on snapshot changes (only a transform or a dead letter ever sees it).
    pub(super) position: Position,
    pub(super) progress_interval: Duration,
}

/// Copies `jobs` with one worker per reader until done or asked to stop; the route's
/// transform (lent for the run) is handed back in `transform`. Returns how it ended, and the
/// sinks.
pub(super) async fn copy(
    engine: Engine,
    readers: Vec<Reader>,
    jobs: Vec<Job>,
    progress: Arc<Progress>,
    transform: &mut Option<RouteTransform>,
    stop: &mut watch::Receiver<StopMode>,
) -> Result<(Result<Outcome, SourceError>, Vec<Arc<dyn SinkConnector>>), SourceError> {
    let connector = engine.connector.clone();
    let shared = Arc::new(Shared {
        connector: engine.connector,
        params: engine.params,
        retries: engine.retries,
        tables: engine.tables,
        sinks: engine.sinks,
        queue: Mutex::new(jobs.into_iter().collect()),
        progress: progress.clone(),
        position: engine.position,
        transform: transform.take().map(Arc::new),
    });
    let reporter = tokio::spawn(progress::report(progress.clone(), engine.progress_interval));
    let mut workers = JoinSet::new();
    for reader in readers {
        workers.spawn(worker(shared.clone(), reader));
    }
    let result = supervise(&mut workers, stop).await;
    reporter.abort();
    progress::clear_terminal_line();
    // Hand the transform back (the workers, holding the other references, have ended).
    let Shared {
        sinks,
        transform: t,
        ..
    } = Arc::into_inner(shared).ok_or_else(|| {
        SourceError::fatal(format!(
            "{connector}: a snapshot worker outlived the snapshot"
        ))
    })?;
    *transform = t.and_then(Arc::into_inner);
    Ok((result, sinks))
}

struct Shared {
    connector: String,
    params: ConnectParams,
    retries: u32,
    tables: Vec<Arc<Table>>,
    sinks: Vec<Arc<dyn SinkConnector>>,
    queue: Mutex<VecDeque<Job>>,
    progress: Arc<Progress>,
    position: Position,
    transform: Option<Arc<RouteTransform>>,
}

impl Shared {
    fn next_job(&self) -> Option<Job> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop_front()
    }
}

/// Copies chunks off the queue until it is empty: while one chunk is loaded into the sinks,
/// the next is read, so the source and the sinks work at the same time (at most two chunks
/// in memory per worker).
async fn worker(shared: Arc<Shared>, mut reader: Reader) -> Result<(), SourceError> {
    let mut read: Option<(Job, Prepared, u64)> = None;
    loop {
        let next = shared.next_job();
        if next.is_none() && read.is_none() {
            return Ok(());
        }
        let reading = async {
            let Some(job) = next else { return Ok(None) };
            shared.progress.chunk_started(job.table);
            let table = &shared.tables[job.table];
            // Rows every sink parses itself stay as the server printed them.
            let as_text = shared.transform.is_none()
                && job.sinks.iter().all(|&s| shared.sinks[s].takes_copy_text());
            let read = read_chunk(&shared, &mut reader, table, &job.chunk, as_text).await?;
            let (prepared, count) = match read {
                Read::Text(text, count) => (Prepared::Text(text), count),
                Read::Rows(rows) => {
                    let count = rows.len() as u64;
                    match &shared.transform {
                        None => (Prepared::Rows(rows), count),
                        Some(_) => {
                            let changes = to_changes(&shared, table, rows, &job.chunk).await?;
                            (Prepared::Changes(changes), count)
                        }
                    }
                }
            };
            Ok::<_, SourceError>(Some((job, prepared, count)))
        };
        let loading = async {
            let Some((job, prepared, count)) = read.take() else {
                return Ok(());
            };
            for &sink in &job.sinks {
                let table = &shared.tables[job.table];
                let sink = &*shared.sinks[sink];
                load(&shared, sink, &job.chunk, table, &prepared, count).await?;
            }
            tracing::debug!(chunk = %job.chunk, rows = count, "snapshot chunk loaded");
            if shared.progress.chunk_done(job.table, count) {
                let t = &shared.progress.tables[job.table];
                tracing::info!(connector = %shared.connector, table = %t.name, rows = t.rows(), seconds = shared.progress.table_seconds(job.table), "table copied");
            }
            Ok::<_, SourceError>(())
        };
        let (next_read, ()) = tokio::try_join!(reading, loading)?;
        read = next_read;
    }
}

/// One chunk's rows; a lost connection is replaced by one with a snapshot of its own (what a
/// resumed snapshot does, see the module docs) and the chunk read again.
async fn read_chunk(
    shared: &Shared,
    reader: &mut Reader,
    table: &Table,
    chunk: &SnapshotChunk,
    as_text: bool,
) -> Result<Read, SourceError> {
    let mut attempt = 0;
    loop {
        let read = if as_text {
            reader
                .copy_chunk_text(table, chunk)
                .await
                .map(|(text, rows)| Read::Text(text, rows))
        } else {
            reader.copy_chunk(table, chunk).await.map(Read::Rows)
        };
        match read {
            Ok(read) => return Ok(read),
            Err(e) if e.class == ErrorClass::Transient && attempt < MAX_ATTEMPTS => {
                attempt += 1;
                let delay = crate::lane::backoff_for(attempt);
                tracing::warn!(connector = %shared.connector, chunk = %chunk, attempt, error = %e, "snapshot read failed; reconnecting with a new snapshot");
                tokio::time::sleep(delay).await;
                match Reader::open(&shared.params, shared.retries, None).await {
                    Ok(fresh) => *reader = fresh,
                    Err(e) if e.class == ErrorClass::Transient => {}
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// A chunk as read.
enum Read {
    Rows(Vec<Vec<Value>>),
    /// COPY text and its number of rows.
    Text(Bytes, u64),
}

/// A chunk ready for the sinks.
enum Prepared {
    /// As read (no transform).
    Rows(Vec<Vec<Value>>),
    /// As the server printed it, for sinks that take COPY text.
    Text(Bytes),
    /// What the route's transform made of the rows.
    Changes(Vec<Arc<Change>>),
}

/// Rows as insert changes through the route's transform.
async fn to_changes(
    shared: &Shared,
    table: &Arc<Table>,
    rows: Vec<Vec<Value>>,
    chunk: &SnapshotChunk,
) -> Result<Vec<Arc<Change>>, SourceError> {
    let changes = rows.into_iter().map(|values| Change {
        position: shared.position,
        op: Op::Insert,
        table: table.clone(),
        key: table.key.iter().map(|&i| values[i].clone()).collect(),
        old_key: None,
        values,
    });
    let Some(transform) = &shared.transform else {
        return Ok(changes.map(Arc::new).collect());
    };
    let mut out = Vec::new();
    let mut rest = changes.peekable();
    while rest.peek().is_some() {
        let batch: Vec<Change> = rest.by_ref().take(transform.batch_size().max(1)).collect();
        let transformed = transform
            .transform(batch)
            .await
            .map_err(|e| SourceError::fatal(format!("{}: {e}", shared.connector)))?;
        for (_, change) in transformed {
            let whole = matches!(change.op, Op::Insert | Op::Update)
                && !change.values.contains(&Value::Unchanged);
            if !whole {
                return Err(SourceError::fatal(format!(
                    "{}: the transform made a {} of {} out of a snapshot row of {chunk}; the \
                     snapshot writes whole rows only",
                    shared.connector,
                    change.op.as_str(),
                    change.table.qualified_name()
                )));
            }
            out.push(Arc::new(Change {
                op: Op::Insert,
                ..change
            }));
        }
    }
    Ok(out)
}

/// Loads a chunk into one sink, retrying transient failures with backoff.
async fn load(
    shared: &Shared,
    sink: &dyn SinkConnector,
    chunk: &SnapshotChunk,
    table: &Arc<Table>,
    prepared: &Prepared,
    rows: u64,
) -> Result<(), SourceError> {
    let mut attempt = 0;
    loop {
        let result = match prepared {
            Prepared::Rows(rows) => sink.snapshot_load_rows(chunk, table, rows).await,
            Prepared::Text(text) => sink.snapshot_load_text(chunk, table, text, rows).await,
            Prepared::Changes(changes) => sink.snapshot_load(chunk, changes).await,
        };
        match result {
            Ok(()) => return Ok(()),
            Err(e) if e.class == ErrorClass::Transient && attempt < MAX_ATTEMPTS => {
                attempt += 1;
                let delay = crate::lane::backoff_for(attempt);
                tracing::warn!(connector = %shared.connector, sink = sink.name(), chunk = %chunk, attempt, delay_ms = delay.as_millis() as u64, error = %e.message, "loading a snapshot chunk failed; retrying");
                tokio::time::sleep(delay).await;
            }
            Err(e) => return Err(sink_err(e)),
        }
    }
}
