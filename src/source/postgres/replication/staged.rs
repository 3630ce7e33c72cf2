//! The transform stage of the replication loop, used when the route has a transform.
//!
//! Changes are collected — with the Begin and Commit markers between them — until
//! `batch_size` changes are waiting, the socket has nothing more to read right now, a
//! keepalive arrives, or the source drains. Then one call transforms them all and the markers
//! and outputs are replayed in order: Begin and Commit go to the ack tracker when their turn
//! comes, so every output is counted against its own transaction (one dispatched copy each;
//! a dropped change counts nothing and cannot hold the frontier back), and lanes are chosen on
//! the transformed key. Truncates and TOAST moves pass through the transform too, and are made
//! barriers afterwards if what comes out still needs one.
//!
//! A full batch is handed to the transform's thread and left *in flight* while the next one
//! is read and decoded; it is replayed just before the next is handed over (so batches are
//! replayed strictly in order, and at most two are held).
//!
//! When the socket goes quiet, what is staged is handed over too ([`submit_quiet`]), and the
//! main loop waits for the call ([`done`]) *alongside* the socket: whichever comes first is
//! served, so a walsender that is momentarily slower than Zipline does not stall the stream
//! behind a guest call (in a backlog the socket goes quiet between almost every batch). A
//! keepalive or a drain completes everything ([`flush`]): the tracker must know every staged
//! transaction before it may call itself idle. Batching across transactions is what makes
//! small transactions cheap to transform; submitting when the socket goes quiet keeps the
//! added latency at one guest call.

use std::future::Future;
use std::pin::Pin;

use super::dispatch::send_change;
use super::feedback::{drain_acks, maybe_report, periodic_report};
use super::{Flow, ReplicationStream, SourceError, State, StopMode};
use crate::change::{Change, Lsn};
use crate::transform::TransformError;

enum Item {
    Begin { commit_lsn: Lsn, commit_time: i64 },
    Commit { end_lsn: Lsn },
    Change,
}

pub(super) type Outputs = Result<Vec<(usize, Change)>, TransformError>;

/// A batch handed to the transform whose outputs have not been replayed yet.
struct InFlight {
    items: Vec<Item>,
    call: Pin<Box<dyn Future<Output = Outputs> + Send>>,
}

/// What waits for (or is in) a transform call.
#[derive(Default)]
pub(super) struct Staged {
    items: Vec<Item>,
    changes: Vec<Change>,
    in_flight: Option<InFlight>,
}

impl Staged {
    /// Forget everything (the stream broke: the server resends it all). A call in flight
    /// still runs to its end on the transform's thread; its outputs are dropped.
    pub(super) fn clear(&mut self) {
        self.items.clear();
        self.changes.clear();
        self.in_flight = None;
    }

    pub(super) fn begin(&mut self, commit_lsn: Lsn, commit_time: i64) {
        self.items.push(Item::Begin {
            commit_lsn,
            commit_time,
        });
    }

    pub(super) fn commit(&mut self, end_lsn: Lsn) {
        self.items.push(Item::Commit { end_lsn });
    }
}

/// Whether the route transforms (then every change and marker goes through here).
pub(super) fn active(st: &State<'_>) -> bool {
    st.outputs.transform.is_some()
}

/// Stage one change. When the batch is full: replay the batch in flight, if any, and put this
/// one in flight.
pub(super) async fn push(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    change: Change,
) -> Result<Flow, SourceError> {
    st.staged.items.push(Item::Change);
    st.staged.changes.push(change);
    let full = st
        .outputs
        .transform
        .as_ref()
        .is_some_and(|t| st.staged.changes.len() >= t.batch_size());
    if !full {
        return Ok(Flow::Continue);
    }
    if let Flow::Stopped = complete_in_flight(st, stream).await? {
        return Ok(Flow::Stopped);
    }
    submit(st);
    Ok(Flow::Continue)
}

/// Transform and replay everything staged or in flight.
pub(super) async fn flush(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
) -> Result<Flow, SourceError> {
    if let Flow::Stopped = complete_in_flight(st, stream).await? {
        return Ok(Flow::Stopped);
    }
    if st.staged.items.is_empty() {
        return Ok(Flow::Continue);
    }
    submit(st);
    complete_in_flight(st, stream).await
}

/// Hands what is staged to the transform (nothing may be in flight).
fn submit(st: &mut State<'_>) {
    let items = std::mem::take(&mut st.staged.items);
    let changes = std::mem::take(&mut st.staged.changes);
    let call: Pin<Box<dyn Future<Output = Outputs> + Send>> = match &st.outputs.transform {
        Some(t) if !changes.is_empty() => Box::pin(t.transform(changes)),
        // Only markers (or no transform): nothing to call.
        _ => Box::pin(std::future::ready(Ok(changes
            .into_iter()
            .enumerate()
            .collect()))),
    };
    st.staged.in_flight = Some(InFlight { items, call });
}

/// The socket is quiet: hands what is staged to the transform, unless a call is in flight
/// (its outputs must be replayed first; [`done`] waits for them).
pub(super) fn submit_quiet(st: &mut State<'_>) {
    if can_submit(&st.staged) {
        submit(st);
    }
}

/// Whether [`submit_quiet`] has something to do.
pub(super) fn can_submit(staged: &Staged) -> bool {
    staged.in_flight.is_none() && !staged.items.is_empty()
}

/// Resolves when the call in flight has returned (never, when none is); then
/// [`replay_done`] must be called with what it returned, before anything else is submitted.
pub(super) async fn done(staged: &mut Staged) -> Outputs {
    match &mut staged.in_flight {
        Some(f) => (&mut f.call).await,
        None => std::future::pending().await,
    }
}

/// Replays the batch whose call [`done`] saw return `outputs`.
pub(super) async fn replay_done(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    outputs: Outputs,
) -> Result<Flow, SourceError> {
    let Some(InFlight { items, .. }) = st.staged.in_flight.take() else {
        return Ok(Flow::Continue);
    };
    let outputs = outputs.map_err(|e| SourceError::fatal(e.to_string()))?;
    replay(st, stream, items, outputs).await
}

/// Waits for the batch in flight (serving acks and status updates meanwhile) and replays
/// it: markers to the tracker, outputs to the lanes.
async fn complete_in_flight(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
) -> Result<Flow, SourceError> {
    let Some(InFlight { items, mut call }) = st.staged.in_flight.take() else {
        return Ok(Flow::Continue);
    };
    // A clone, so that a Drain seen here is still news to the main loop.
    let mut stop = st.stop.clone();
    let outputs = loop {
        tokio::select! {
            biased;
            result = &mut call => {
                break result.map_err(|e| SourceError::fatal(e.to_string()))?;
            }
            _ = stop.changed() => {
                if *stop.borrow() == StopMode::Abort {
                    return Ok(Flow::Stopped);
                }
            }
            Some(ack) = st.outputs.acks.recv() => {
                st.tracker.ack(&ack);
                drain_acks(st);
                maybe_report(st, stream).await?;
            }
            _ = st.ticker.tick() => periodic_report(st, stream).await?,
        }
    };
    replay(st, stream, items, outputs).await
}

/// A batch's markers to the tracker and outputs to the lanes, in order.
async fn replay(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    items: Vec<Item>,
    outputs: Vec<(usize, Change)>,
) -> Result<Flow, SourceError> {
    let mut outputs = outputs.into_iter().peekable();
    let mut input = 0usize;
    for item in items {
        match item {
            Item::Begin {
                commit_lsn,
                commit_time,
            } => st.tracker.begin(commit_lsn, commit_time),
            Item::Commit { end_lsn } => st.tracker.commit(end_lsn),
            Item::Change => {
                while let Some((_, change)) = outputs.next_if(|(i, _)| *i == input) {
                    let flow = send_change(st, stream, change).await?;
                    if let Flow::Stopped = flow {
                        return Ok(Flow::Stopped);
                    }
                }
                input += 1;
            }
        }
    }
    Ok(Flow::Continue)
}
