//! The ack tracker: from lane commits to the durable frontier.
//!
//! Every change copy dispatched to a lane is counted against its transaction; a lane reports,
//! after each durable commit, how many changes of which transactions it covered. A transaction
//! is durable when its Commit has been seen and its count is back to zero; the frontier is the
//! end LSN of the last transaction in an unbroken durable prefix. Counting, rather than
//! "minimum lane position", keeps an idle lane from holding the frontier back and needs no
//! shared clock between lanes, so acks could as well arrive over a network.

use std::collections::VecDeque;

use crate::change::Lsn;

/// A lane's report after a durable commit: `(commit LSN, number of change copies)` pairs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ack {
    /// Transactions covered, in position order.
    pub entries: Vec<(Lsn, u32)>,
}

impl Ack {
    /// Count one more change of the transaction committed at `lsn`.
    pub fn add(&mut self, lsn: Lsn, n: u32) {
        match self.entries.last_mut() {
            Some((last, count)) if *last == lsn => *count += n,
            _ => self.entries.push((lsn, n)),
        }
    }

    /// True when it covers nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[derive(Debug)]
struct Tx {
    commit_lsn: Lsn,
    commit_time: i64,
    end_lsn: Option<Lsn>,
    pending: i64,
}

/// Tracks in-flight transactions and computes the durable frontier.
#[derive(Debug, Default)]
pub struct AckTracker {
    txs: VecDeque<Tx>,
    durable: Lsn,
    in_flight: u64,
}

impl AckTracker {
    /// A tracker whose frontier starts at `start` (the slot's confirmed position).
    pub fn new(start: Lsn) -> Self {
        AckTracker {
            txs: VecDeque::new(),
            durable: start,
            in_flight: 0,
        }
    }

    /// A transaction committed at `commit_lsn` (at `commit_time`, in the source's clock,
    /// microseconds) starts arriving.
    pub fn begin(&mut self, commit_lsn: Lsn, commit_time: i64) {
        self.txs.push_back(Tx {
            commit_lsn,
            commit_time,
            end_lsn: None,
            pending: 0,
        });
    }

    /// `n` change copies of the current transaction were handed to lanes.
    pub fn dispatched(&mut self, n: u32) {
        if let Some(tx) = self.txs.back_mut() {
            tx.pending += i64::from(n);
            self.in_flight += u64::from(n);
        }
    }

    /// The current transaction is complete; confirming `end_lsn` covers it.
    pub fn commit(&mut self, end_lsn: Lsn) {
        if let Some(tx) = self.txs.back_mut() {
            tx.end_lsn = Some(end_lsn);
        }
        self.advance();
    }

    /// Forget the open (uncommitted) transaction after the stream broke. Call only once
    /// nothing is in flight: the server resends the whole transaction under the same
    /// positions, and lanes skip what they committed of it.
    pub fn abandon_open(&mut self) {
        debug_assert_eq!(self.in_flight, 0);
        if self.txs.back().is_some_and(|tx| tx.end_lsn.is_none()) {
            self.txs.pop_back();
        }
        self.advance();
    }

    /// A lane committed these changes durably.
    pub fn ack(&mut self, ack: &Ack) {
        for &(lsn, n) in &ack.entries {
            // Acks arrive for old transactions mostly: search from the front.
            if let Some(tx) = self
                .txs
                .iter_mut()
                .find(|t| t.commit_lsn == lsn && t.pending > 0)
            {
                tx.pending -= i64::from(n);
                self.in_flight = self.in_flight.saturating_sub(u64::from(n));
            }
        }
        self.advance();
    }

    fn advance(&mut self) {
        while let Some(front) = self.txs.front() {
            match front.end_lsn {
                Some(end) if front.pending <= 0 => {
                    self.durable = self.durable.max(end);
                    self.txs.pop_front();
                }
                _ => break,
            }
        }
    }

    /// Everything at or below this LSN is durable in every sink.
    pub fn frontier(&self) -> Lsn {
        self.durable
    }

    /// Commit time of the oldest transaction not yet durable: how far behind the sinks are.
    pub fn oldest_pending_commit_time(&self) -> Option<i64> {
        self.txs.front().map(|t| t.commit_time)
    }

    /// Change copies dispatched and not yet acknowledged.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// True when no transaction is open or waiting for acks.
    pub fn is_idle(&self) -> bool {
        self.txs.is_empty()
    }

    /// The server says everything before `wal_end` has been sent; when nothing is in flight
    /// or open, that is durable too (nothing of ours lies below it).
    pub fn idle_advance(&mut self, wal_end: Lsn) {
        if self.txs.is_empty() {
            self.durable = self.durable.max(wal_end);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(entries: &[(u64, u32)]) -> Ack {
        Ack {
            entries: entries.iter().map(|&(l, n)| (Lsn::from(l), n)).collect(),
        }
    }

    #[test]
    fn frontier_waits_for_every_copy_of_a_transaction() {
        let mut t = AckTracker::new(Lsn(5));
        t.begin(Lsn(10), 0);
        t.dispatched(3);
        t.commit(Lsn(11));
        t.begin(Lsn(20), 0);
        t.dispatched(1);
        t.commit(Lsn(21));
        assert_eq!(t.frontier(), Lsn(5));
        // The later transaction finishing first must not move the frontier past the earlier.
        t.ack(&ack(&[(20, 1)]));
        assert_eq!(t.frontier(), Lsn(5));
        t.ack(&ack(&[(10, 2)]));
        assert_eq!(t.frontier(), Lsn(5));
        t.ack(&ack(&[(10, 1)]));
        assert_eq!(t.frontier(), Lsn(21));
        assert!(t.is_idle());
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn open_transaction_blocks_until_commit() {
        let mut t = AckTracker::new(Lsn(0));
        t.begin(Lsn(10), 0);
        t.dispatched(1);
        t.ack(&ack(&[(10, 1)]));
        assert_eq!(t.frontier(), Lsn(0), "no commit seen yet");
        t.commit(Lsn(12));
        assert_eq!(t.frontier(), Lsn(12));
    }

    #[test]
    fn empty_transaction_and_keepalive_advance() {
        let mut t = AckTracker::new(Lsn(0));
        t.begin(Lsn(10), 0);
        t.commit(Lsn(11));
        assert_eq!(t.frontier(), Lsn(11));
        t.idle_advance(Lsn(50));
        assert_eq!(t.frontier(), Lsn(50));
        t.begin(Lsn(60), 0);
        t.dispatched(1);
        t.idle_advance(Lsn(70));
        assert_eq!(
            t.frontier(),
            Lsn(50),
            "busy: a keepalive must not move the frontier"
        );
        t.idle_advance(Lsn(40));
        assert_eq!(t.frontier(), Lsn(50));
    }

    #[test]
    fn abandoned_transaction_is_forgotten_then_resent() {
        let mut t = AckTracker::new(Lsn(1));
        t.begin(Lsn(10), 0);
        t.dispatched(2);
        t.ack(&ack(&[(10, 2)]));
        t.abandon_open();
        assert!(t.is_idle());
        assert_eq!(
            t.frontier(),
            Lsn(1),
            "a partial transaction is never durable"
        );
        t.begin(Lsn(10), 0);
        t.dispatched(2);
        t.commit(Lsn(11));
        t.ack(&ack(&[(10, 2)]));
        assert_eq!(t.frontier(), Lsn(11));
    }

    #[test]
    fn ack_merges_runs() {
        let mut a = Ack::default();
        a.add(Lsn(1), 1);
        a.add(Lsn(1), 2);
        a.add(Lsn(2), 1);
        assert_eq!(a, ack(&[(1, 3), (2, 1)]));
    }
}
