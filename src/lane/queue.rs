//! A lane's queue: batches of changes, bounded by the number of changes it holds.
//!
//! The dispatcher hands a lane all its changes of one source batch at once, so a lane wakes
//! up once per batch rather than once per change. The bound is on changes, as the sink's
//! `queue_capacity` says: a semaphore holds one permit per free slot, the dispatcher takes a
//! batch's worth before sending it, and the lane gives them back as it takes batches out.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;

use crate::change::Change;
use crate::parcel::Spares;

/// Emptied parcels a queue keeps for the dispatcher to fill again (see [`crate::parcel`]).
const SPARE_PARCELS: usize = 4;

/// The changes of one hand-over.
pub type Parcel = Vec<Queued>;

/// A change in a lane's queue.
#[derive(Debug, Clone)]
pub struct Queued {
    /// The change.
    pub change: Change,
    /// Whether applying it counts as a change applied: false for the delete half of an update
    /// that moved its row to another lane's key (the other half counts the source change
    /// once; see [`super::plan`]).
    pub counts: bool,
}

impl Queued {
    /// A change that counts as one.
    pub fn new(change: Change) -> Self {
        Queued {
            change,
            counts: true,
        }
    }
}

/// How many changes wait in a lane's queue: handed over by the dispatcher, not yet taken by
/// the lane. Holds no sender, so it keeps no queue open.
#[derive(Debug, Clone)]
pub struct QueueDepth {
    room: Arc<Semaphore>,
    capacity: usize,
}

impl QueueDepth {
    /// Changes in the queue now.
    pub fn get(&self) -> usize {
        self.capacity.saturating_sub(self.room.available_permits())
    }
}

/// A new queue holding at most `capacity` changes (at least one).
pub fn queue(capacity: usize) -> (LaneSender, LaneReceiver) {
    let capacity = capacity.clamp(1, Semaphore::MAX_PERMITS);
    let (tx, rx) = mpsc::unbounded_channel();
    let room = Arc::new(Semaphore::new(capacity));
    let spares = Spares::new(SPARE_PARCELS);
    (
        LaneSender {
            tx,
            room: room.clone(),
            capacity,
            spares: spares.clone(),
        },
        LaneReceiver {
            rx,
            room,
            pending: VecDeque::new(),
            spares,
        },
    )
}

/// The lane has stopped (its receiver is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the lane has stopped")]
pub struct Closed;

/// The dispatcher's end of a lane queue.
#[derive(Debug, Clone)]
pub struct LaneSender {
    tx: mpsc::UnboundedSender<Parcel>,
    room: Arc<Semaphore>,
    capacity: usize,
    spares: Spares<Queued>,
}

impl LaneSender {
    /// The most changes one parcel may hold (the queue's capacity).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// An empty parcel with room for `n` changes: one the lane emptied, when there is one.
    pub fn parcel(&self, n: usize) -> Parcel {
        self.spares.take(n)
    }

    /// A gauge of the queue's depth.
    pub fn depth(&self) -> QueueDepth {
        QueueDepth {
            room: self.room.clone(),
            capacity: self.capacity,
        }
    }

    /// Sends `parcel` (at most [`capacity`](Self::capacity) changes) if the queue has room for
    /// it now; gives it back otherwise.
    pub fn try_send(&self, parcel: Parcel) -> Result<(), (Parcel, Option<Closed>)> {
        let Ok(n) = u32::try_from(parcel.len()) else {
            return Err((parcel, None));
        };
        match self.room.try_acquire_many(n) {
            Ok(permit) => {
                permit.forget();
                self.tx.send(parcel).map_err(|e| (e.0, Some(Closed)))
            }
            Err(_) => Err((parcel, None)),
        }
    }

    /// Waits until the queue has room for `n` changes and reserves it. Cancel-safe: a wait
    /// given up reserves nothing.
    pub async fn reserve(&self, n: usize) -> Result<Reserved, Closed> {
        let n32 = u32::try_from(n.min(self.capacity)).unwrap_or(u32::MAX);
        let permit = self.room.acquire_many(n32).await.map_err(|_| Closed)?;
        permit.forget();
        Ok(Reserved {
            tx: self.tx.clone(),
            room: self.room.clone(),
            n: n32 as usize,
        })
    }
}

/// Room for some changes in one queue, taken by [`LaneSender::reserve`].
#[derive(Debug)]
pub struct Reserved {
    tx: mpsc::UnboundedSender<Parcel>,
    room: Arc<Semaphore>,
    n: usize,
}

impl Reserved {
    /// Sends `parcel`, which must hold no more changes than were reserved.
    pub fn send(mut self, parcel: Parcel) -> Result<(), Closed> {
        debug_assert!(parcel.len() <= self.n);
        // Room reserved and not used goes back.
        self.room.add_permits(self.n - parcel.len().min(self.n));
        self.n = 0;
        self.tx.send(parcel).map_err(|_| Closed)
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if self.n > 0 {
            self.room.add_permits(self.n);
        }
    }
}

/// The lane's end: changes one at a time, in order.
#[derive(Debug)]
pub struct LaneReceiver {
    rx: mpsc::UnboundedReceiver<Parcel>,
    room: Arc<Semaphore>,
    /// The parcel being taken apart: each change is moved out of it once, to the caller, and
    /// the emptied buffer goes back to the sender's spares.
    pending: VecDeque<Queued>,
    spares: Spares<Queued>,
}

/// Why [`LaneReceiver::try_recv`] has no change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Empty {
    /// None now.
    Now,
    /// None ever again: the dispatcher closed the queue.
    Closed,
}

impl LaneReceiver {
    /// Makes `parcel` the next to take apart (the last one is empty by then), handing the
    /// last one's buffer back. Neither conversion copies: a `Vec` becomes a `VecDeque` in
    /// place, and an empty `VecDeque` a `Vec`.
    fn take(&mut self, parcel: Parcel) {
        self.room.add_permits(parcel.len());
        let done = std::mem::replace(&mut self.pending, VecDeque::from(parcel));
        self.spares.give(Vec::from(done));
    }

    /// The next change; `None` once the queue is closed and empty.
    pub async fn recv(&mut self) -> Option<Queued> {
        loop {
            if let Some(change) = self.pending.pop_front() {
                return Some(change);
            }
            // The emptied parcel goes back before the wait, not after it.
            self.spares
                .give(Vec::from(std::mem::take(&mut self.pending)));
            let parcel = self.rx.recv().await?;
            self.take(parcel);
        }
    }

    /// The next change if one is there now.
    pub fn try_recv(&mut self) -> Result<Queued, Empty> {
        loop {
            if let Some(change) = self.pending.pop_front() {
                return Ok(change);
            }
            match self.rx.try_recv() {
                Ok(parcel) => self.take(parcel),
                Err(mpsc::error::TryRecvError::Empty) => return Err(Empty::Now),
                Err(mpsc::error::TryRecvError::Disconnected) => return Err(Empty::Closed),
            }
        }
    }

    /// The next change, waiting until `deadline` at the latest (`Err(Empty::Now)` then).
    pub async fn recv_until(&mut self, deadline: Instant) -> Result<Queued, Empty> {
        match tokio::time::timeout_at(deadline, self.recv()).await {
            Ok(Some(change)) => Ok(change),
            Ok(None) => Err(Empty::Closed),
            Err(_) => Err(Empty::Now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::{Key, Lsn, Op, Position, Table};

    fn change(n: u32) -> Queued {
        Queued::new(Change {
            position: Position::new(Lsn(1), n),
            op: Op::Delete,
            table: Arc::new(Table::new("s".into(), "t".into(), Vec::new())),
            key: Key::new(),
            old_key: None,
            values: Vec::new(),
        })
    }

    #[tokio::test]
    async fn bounds_changes_not_parcels_and_keeps_order() {
        let (tx, mut rx) = queue(3);
        tx.try_send(vec![change(1), change(2)])
            .expect("room for two");
        let (back, closed) = tx
            .try_send(vec![change(3), change(4)])
            .expect_err("no room for two more");
        assert_eq!((back.len(), closed), (2, None));
        tx.try_send(vec![change(3)]).expect("room for one");
        assert_eq!(tx.depth().get(), 3);
        // Taking a parcel out frees its room.
        assert_eq!(rx.try_recv().map(|c| c.change.position.ordinal), Ok(1));
        let reserved = tx.reserve(2).await.expect("room again");
        reserved.send(vec![change(4)]).expect("sent");
        let mut seen = Vec::new();
        while let Ok(c) = rx.try_recv() {
            seen.push(c.change.position.ordinal);
        }
        assert_eq!(seen, vec![2, 3, 4]);
        assert_eq!(tx.depth().get(), 0, "everything taken out");
        drop(tx);
        assert!(matches!(rx.try_recv(), Err(Empty::Closed)));
    }

    #[tokio::test]
    async fn a_reservation_given_up_frees_its_room() {
        let (tx, _rx) = queue(2);
        drop(tx.reserve(2).await.expect("room"));
        tx.try_send(vec![change(1), change(2)])
            .expect("the dropped reservation gave its room back");
    }
}
