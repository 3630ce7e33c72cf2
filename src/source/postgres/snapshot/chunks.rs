//! The snapshot's copying engine: workers, one per reader, take chunks off a shared queue,
//! read each (`COPY` of a key range) and hand it to the writer for every target that needs
//! it, reading the next chunk while the last one loads.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::progress::{self, Progress};
use super::reader::Reader;
use super::{MAX_ATTEMPTS, Outcome};
use crate::change::{Position, Table, Value};
use crate::checkpoint::SnapshotChunk;
use crate::error::ErrorClass;
use crate::source::postgres::conn::ConnectParams;
use crate::source::snapshot::{Rows, SnapshotWriter};
use crate::source::{SourceError, StopMode};

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
    /// Indices of the targets that need it.
    pub(super) sinks: Vec<usize>,
}

/// What copying chunks needs.
pub(super) struct Engine {
    pub(super) connector: String,
    pub(super) params: ConnectParams,
    pub(super) retries: u32,
    pub(super) tables: Vec<Arc<Table>>,
    pub(super) writer: Arc<dyn SnapshotWriter>,
    /// Stamped on snapshot changes (only a transform or a dead letter ever sees it).
    pub(super) position: Position,
    pub(super) progress_interval: Duration,
}

/// Copies `jobs` with one worker per reader until done or asked to stop; returns how it
/// ended.
pub(super) async fn copy(
    engine: Engine,
    readers: Vec<Reader>,
    jobs: Vec<Job>,
    progress: Arc<Progress>,
    stop: &mut watch::Receiver<StopMode>,
) -> Result<Outcome, SourceError> {
    let shared = Arc::new(Shared {
        connector: engine.connector,
        params: engine.params,
        retries: engine.retries,
        tables: engine.tables,
        writer: engine.writer,
        queue: Mutex::new(jobs.into_iter().collect()),
        progress: progress.clone(),
        position: engine.position,
    });
    let reporter = tokio::spawn(progress::report(progress.clone(), engine.progress_interval));
    let mut workers = JoinSet::new();
    for reader in readers {
        workers.spawn(worker(shared.clone(), reader));
    }
    let result = supervise(&mut workers, stop).await;
    reporter.abort();
    progress::clear_terminal_line();
    result
}

struct Shared {
    connector: String,
    params: ConnectParams,
    retries: u32,
    tables: Vec<Arc<Table>>,
    writer: Arc<dyn SnapshotWriter>,
    queue: Mutex<VecDeque<Job>>,
    progress: Arc<Progress>,
    position: Position,
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
    let mut read: Option<(Job, Read, u64)> = None;
    loop {
        let next = shared.next_job();
        if next.is_none() && read.is_none() {
            return Ok(());
        }
        let reading = async {
            let Some(job) = next else { return Ok(None) };
            shared.progress.chunk_started(job.table);
            let table = &shared.tables[job.table];
            // Rows every target parses itself stay as the server printed them.
            let as_text = job.sinks.iter().all(|&t| shared.writer.takes_text(t));
            let read = read_chunk(&shared, &mut reader, table, &job.chunk, as_text).await?;
            let count = match &read {
                Read::Text(_, count) => *count,
                Read::Rows(rows) => rows.len() as u64,
            };
            Ok::<_, SourceError>(Some((job, read, count)))
        };
        let loading = async {
            let Some((job, chunk_rows, count)) = read.take() else {
                return Ok(());
            };
            let table = &shared.tables[job.table];
            let rows = match &chunk_rows {
                Read::Rows(rows) => Rows::Decoded(rows),
                Read::Text(text, n) => Rows::Text(text, *n),
            };
            for &target in &job.sinks {
                shared
                    .writer
                    .load(target, &job.chunk, table, rows, shared.position)
                    .await?;
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
    let mut backoff = crate::retry::Backoff::new(
        format!(
            "{}: reading {chunk} failed; reconnecting with a new snapshot",
            shared.connector
        ),
        crate::retry::Budget::Retries(MAX_ATTEMPTS),
    );
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
            Err(e) if e.class == ErrorClass::Transient && backoff.wait(&e).await => {
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
