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
//! Batching across transactions is what makes small transactions cheap to transform; flushing
//! when the socket goes quiet keeps the added latency at one guest call.

use super::{
    Flow, ReplicationStream, SourceError, State, StopMode, barrier_send, dispatch, drain_acks,
    maybe_report, report,
};
use crate::change::{Change, Lsn};
use crate::lane::needs_barrier;

enum Item {
    Begin { commit_lsn: Lsn, commit_time: i64 },
    Commit { end_lsn: Lsn },
    Change,
}

/// What waits for the next transform call.
#[derive(Default)]
pub(super) struct Staged {
    items: Vec<Item>,
    changes: Vec<Change>,
}

impl Staged {
    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Forget everything (the stream broke: the server resends it all).
    pub(super) fn clear(&mut self) {
        self.items.clear();
        self.changes.clear();
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

/// Stage one change; transform and dispatch when the batch is full.
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
    if full {
        flush(st, stream).await
    } else {
        Ok(Flow::Continue)
    }
}

/// Transform what is staged and replay it: markers to the tracker, outputs to the lanes.
pub(super) async fn flush(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
) -> Result<Flow, SourceError> {
    if st.staged.is_empty() {
        return Ok(Flow::Continue);
    }
    let items = std::mem::take(&mut st.staged.items);
    let changes = std::mem::take(&mut st.staged.changes);
    let outputs = if changes.is_empty() {
        Vec::new()
    } else {
        match transform(st, stream, changes).await? {
            Some(o) => o,
            None => return Ok(Flow::Stopped),
        }
    };
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
                    let barrier = st
                        .outputs
                        .routers
                        .iter()
                        .any(|r| needs_barrier(&change, r.lanes()));
                    let flow = if barrier {
                        barrier_send(st, stream, change).await?
                    } else {
                        dispatch(st, stream, change).await?
                    };
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

/// One transform call, serving acks and status updates while the guest runs. `None` when
/// the pipeline aborts meanwhile.
async fn transform(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    changes: Vec<Change>,
) -> Result<Option<Vec<(usize, Change)>>, SourceError> {
    let Some(t) = st.outputs.transform.as_ref() else {
        return Ok(Some(changes.into_iter().enumerate().collect()));
    };
    let call = t.transform(changes);
    tokio::pin!(call);
    // A clone, so that a Drain seen here is still news to the main loop.
    let mut stop = st.stop.clone();
    loop {
        tokio::select! {
            biased;
            result = &mut call => {
                return result.map(Some).map_err(|e| SourceError::fatal(e.to_string()));
            }
            _ = stop.changed() => {
                if *stop.borrow() == StopMode::Abort {
                    return Ok(None);
                }
            }
            Some(ack) = st.outputs.acks.recv() => {
                st.tracker.ack(&ack);
                drain_acks(st);
                maybe_report(st, stream).await?;
            }
            _ = st.ticker.tick() => report(st, stream, false).await?,
        }
    }
}
