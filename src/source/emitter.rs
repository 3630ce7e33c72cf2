//! A source's two ends of the stage chain: [`Event`]s out, in order and in parcels, and the
//! durable [`Frontier`] back.
//!
//! The source pushes events into its [`Emitter`], which hands them over a parcel at a time
//! (one channel operation and one wake-up per parcel, not per change). The channel is
//! bounded: when it is full the source stops reading upstream (that is the back-pressure) but
//! keeps serving its own protocol (status updates, keepalives) with the frontier it is handed.
//! Events and frontiers are plain data, so a later transport can carry them between
//! processes.

use tokio::sync::{mpsc, watch};

use crate::change::{Change, Lsn};
use crate::parcel::Spares;

/// What a source produces, in commit order.
#[derive(Debug, Clone)]
pub enum Event {
    /// A transaction committed at `commit_lsn` (at `commit_time`, microseconds since
    /// 2000-01-01 in the source's clock) starts.
    Begin {
        /// Where it committed (every change of it carries this LSN).
        commit_lsn: Lsn,
        /// When, for the lag figure.
        commit_time: i64,
    },
    /// A change of the open transaction; positions grow.
    Change(Change),
    /// The open transaction is complete: confirming `end_lsn` upstream covers it.
    Commit {
        /// The position after the transaction.
        end_lsn: Lsn,
    },
    /// Nothing of the source's lies below `at` beyond what was emitted (a keepalive while no
    /// transaction is open, an empty poll): once everything emitted is durable, the frontier
    /// may move to `at`.
    Idle {
        /// The position reached upstream.
        at: Lsn,
    },
    /// The stream broke: what is in flight must become durable (or fail), and the open
    /// transaction is forgotten; the source reads again from the frontier. Sent by
    /// [`Emitter::rewind`], which waits for the answer.
    Rewind,
}

/// The durable frontier: every change at or below `lsn` is committed in every sink, so the
/// source may confirm it upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Frontier {
    /// Confirmable position.
    pub lsn: Lsn,
    /// Rewinds answered so far (see [`Event::Rewind`]).
    pub rewinds: u64,
}

/// The runtime has stopped taking events (it failed, or the pipeline is aborting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the pipeline stopped taking changes")]
pub struct Gone;

/// Events a parcel holds at most.
pub const PARCEL: usize = 512;

/// The source's handle on the stage chain.
#[derive(Debug)]
pub struct Emitter {
    tx: Option<mpsc::Sender<Vec<Event>>>,
    parcel: Vec<Event>,
    frontier: watch::Receiver<Frontier>,
    rewinds: u64,
    spares: Spares<Event>,
}

/// The runtime's end of the events: parcels in, in order, and their emptied buffers back to
/// the emitter to fill again (see [`crate::parcel`]).
#[derive(Debug)]
pub struct Events {
    rx: mpsc::Receiver<Vec<Event>>,
    spares: Spares<Event>,
}

impl Events {
    /// The next parcel; `None` once the source has closed its stream and all are taken.
    pub async fn recv(&mut self) -> Option<Vec<Event>> {
        self.rx.recv().await
    }

    /// The next parcel if one is waiting now.
    pub fn try_recv(&mut self) -> Option<Vec<Event>> {
        self.rx.try_recv().ok()
    }

    /// Whether no parcel is waiting.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }

    /// Hands an emptied parcel back to the emitter.
    pub fn give(&self, parcel: Vec<Event>) {
        self.spares.give(parcel);
    }
}

/// An emitter and the runtime's ends of it: a channel holding `parcels` parcels, and the
/// frontier starting at `start`.
pub fn channel(parcels: usize, start: Lsn) -> (Emitter, Events, watch::Sender<Frontier>) {
    let (tx, rx) = mpsc::channel(parcels.max(1));
    // Every parcel that can be in flight at once: in the channel, being filled, being taken
    // apart.
    let spares = Spares::new(parcels.max(1) + 2);
    let (frontier_tx, frontier) = watch::channel(Frontier {
        lsn: start,
        rewinds: 0,
    });
    (
        Emitter {
            tx: Some(tx),
            parcel: spares.take(PARCEL),
            frontier,
            rewinds: 0,
            spares: spares.clone(),
        },
        Events { rx, spares },
        frontier_tx,
    )
}

impl Emitter {
    /// Adds an event to the parcel being filled.
    pub fn push(&mut self, event: Event) {
        self.parcel.push(event);
    }

    /// The parcel is full: hand it over before pushing more.
    pub fn is_full(&self) -> bool {
        self.parcel.len() >= PARCEL
    }

    /// Events wait to be handed over.
    pub fn has_pending(&self) -> bool {
        !self.parcel.is_empty()
    }

    fn sender(&self) -> Result<&mpsc::Sender<Vec<Event>>, Gone> {
        self.tx.as_ref().ok_or(Gone)
    }

    fn take(&mut self) -> Vec<Event> {
        std::mem::replace(&mut self.parcel, self.spares.take(PARCEL))
    }

    /// Hands the parcel over if the channel has room now; `Ok(false)` when it has not.
    pub fn try_flush(&mut self) -> Result<bool, Gone> {
        if self.parcel.is_empty() {
            return Ok(true);
        }
        let Some(tx) = self.tx.as_ref() else {
            return Err(Gone);
        };
        match tx.try_reserve() {
            Ok(permit) => {
                permit.send(std::mem::replace(
                    &mut self.parcel,
                    self.spares.take(PARCEL),
                ));
                Ok(true)
            }
            Err(mpsc::error::TrySendError::Full(())) => Ok(false),
            Err(mpsc::error::TrySendError::Closed(())) => Err(Gone),
        }
    }

    /// Waits for room in the channel. Cancel-safe; then [`Emitter::send`] the permit.
    pub async fn ready(&self) -> Result<mpsc::OwnedPermit<Vec<Event>>, Gone> {
        self.sender()?
            .clone()
            .reserve_owned()
            .await
            .map_err(|_| Gone)
    }

    /// Hands the parcel over with room [`Emitter::ready`] found.
    pub fn send(&mut self, permit: mpsc::OwnedPermit<Vec<Event>>) {
        let parcel = self.take();
        permit.send(parcel);
    }

    /// Hands the parcel over, waiting for room.
    pub async fn flush(&mut self) -> Result<(), Gone> {
        if self.parcel.is_empty() {
            return Ok(());
        }
        let permit = self.ready().await?;
        self.send(permit);
        Ok(())
    }

    /// A receiver of the frontier of its own (for waiting on it beside the emitter).
    pub fn watch(&self) -> watch::Receiver<Frontier> {
        self.frontier.clone()
    }

    /// The durable frontier now.
    pub fn frontier(&self) -> Frontier {
        *self.frontier.borrow()
    }

    /// Resolves when the frontier changes; `Err` once the runtime has ended (then
    /// [`Emitter::frontier`] holds its last word).
    pub async fn frontier_changed(&mut self) -> Result<Frontier, Gone> {
        self.frontier.changed().await.map_err(|_| Gone)?;
        Ok(*self.frontier.borrow_and_update())
    }

    /// The stream broke: drops what was not handed over (the source reads it again), and
    /// waits until the runtime has settled everything in flight and forgotten the open
    /// transaction. Returns the frontier to read again from.
    pub async fn rewind(&mut self) -> Result<Lsn, Gone> {
        self.parcel.clear();
        self.push(Event::Rewind);
        self.flush().await?;
        self.rewinds += 1;
        loop {
            let now = self.frontier();
            if now.rewinds >= self.rewinds {
                return Ok(now.lsn);
            }
            self.frontier_changed().await?;
        }
    }

    /// Waits until the frontier reaches `lsn` (everything emitted up to it is durable), having
    /// handed over what is pending. `Err` when the runtime ended first.
    pub async fn durable(&mut self, lsn: Lsn) -> Result<Lsn, Gone> {
        self.flush().await?;
        loop {
            let now = self.frontier();
            if now.lsn >= lsn {
                return Ok(now.lsn);
            }
            self.frontier_changed().await?;
        }
    }

    /// Ends the stream (a graceful stop): hands over what is pending and closes the channel,
    /// so the runtime lets every lane commit what it holds. The frontier keeps moving until
    /// the runtime has ended ([`Emitter::frontier_changed`] then fails).
    pub async fn close(&mut self) -> Result<(), Gone> {
        let flushed = self.flush().await;
        self.tx = None;
        flushed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn parcels_arrive_whole_and_in_order() {
        let (mut emitter, mut rx, frontier) = channel(1, Lsn(5));
        for i in 0..PARCEL + 1 {
            emitter.push(Event::Idle { at: Lsn(i as u128) });
            if emitter.is_full() {
                emitter.flush().await.expect("room");
            }
        }
        assert!(emitter.has_pending());
        // The channel holds one parcel: the next waits for room.
        assert_eq!(emitter.try_flush(), Ok(false));
        let first = rx.recv().await.expect("a parcel");
        assert_eq!(first.len(), PARCEL);
        assert_eq!(emitter.try_flush(), Ok(true));
        let second = rx.recv().await.expect("a parcel");
        assert!(matches!(second[..], [Event::Idle { at }] if at == Lsn(PARCEL as u128)));
        assert_eq!(emitter.frontier().lsn, Lsn(5));
        frontier.send_modify(|f| f.lsn = Lsn(9));
        assert_eq!(emitter.durable(Lsn(9)).await, Ok(Lsn(9)));
    }

    #[tokio::test]
    async fn rewind_waits_for_its_answer() {
        let (mut emitter, mut rx, frontier) = channel(4, Lsn(1));
        emitter.push(Event::Begin {
            commit_lsn: Lsn(10),
            commit_time: 0,
        });
        let runtime = tokio::spawn(async move {
            let parcel = rx.recv().await.expect("the rewind");
            assert!(
                matches!(parcel[..], [Event::Rewind]),
                "unsent events are dropped"
            );
            frontier.send_modify(|f| {
                f.lsn = Lsn(3);
                f.rewinds += 1;
            });
            rx
        });
        assert_eq!(emitter.rewind().await, Ok(Lsn(3)));
        let mut rx = runtime.await.expect("the runtime");
        emitter.close().await.expect("closed");
        assert!(rx.recv().await.is_none(), "closing ends the stream");
    }
}
