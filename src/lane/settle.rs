//! What a lane does when its sink rejects a batch for good (a *definite* error: a value too
//! long, a constraint, a type, a missing table): it finds the change to blame and treats it as
//! the sink's `on_error` says, and the rest of the batch applies.
//!
//! - The change is found by applying halves of the batch, each committed with the lane's
//!   checkpoint at its own last position (a smaller batch is still a batch), until a single
//!   change fails alone; so what applies, applies in position order, and the changes around a
//!   bad one are not held back by it.
//! - `halt`: the lane stops before that change, naming it; nothing from it on is confirmed.
//! - `skip`: it is logged (table, key, position, reason) and counted, and the checkpoint moves
//!   past it.
//! - `dead_letter`: it is recorded in the sink's dead-letter table in the same transaction as
//!   the checkpoint that moves past it, so it is recorded exactly once. Its key is *parked*:
//!   the key's later changes are dead-lettered behind it (not applied), so that
//!   `zipline dlq replay`, once the sink is fixed, applies the key's changes in order instead of
//!   putting an old state over a newer one or bringing back a row deleted since.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use super::apply::{Conflicts, Work, apply};
use super::worker::{LaneConfig, LaneStats};
use crate::change::{Change, Position};
use crate::config::OnError;
use crate::error::ErrorClass;
use crate::sink::{Batch, DeadLetter, LaneSink, ParkedKey, SinkError};
use crate::transform::json::key_to_json;

/// The keys with dead letters in this lane (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Parked {
    keys: HashSet<ParkedKey>,
}

fn key_of(change: &Change, key: &[crate::change::Value]) -> ParkedKey {
    ParkedKey {
        table: change.table.qualified_name(),
        key: key_to_json(key),
    }
}

impl Parked {
    pub(super) fn new(keys: Vec<ParkedKey>) -> Self {
        Parked {
            keys: keys.into_iter().collect(),
        }
    }

    fn holds(&self, change: &Change) -> bool {
        !self.keys.is_empty()
            && (self.keys.contains(&key_of(change, &change.key))
                || change
                    .old_key
                    .as_ref()
                    .is_some_and(|old| self.keys.contains(&key_of(change, old))))
    }

    fn park(&mut self, change: &Change) {
        self.keys.insert(key_of(change, &change.key));
        if let Some(old) = &change.old_key {
            self.keys.insert(key_of(change, old));
        }
    }

    /// A truncate of `table` superseded its dead letters (the sink removed them with it).
    pub(super) fn forget_table(&mut self, table: &str) {
        self.keys.retain(|k| k.table != table);
    }

    /// Moves the changes of parked keys out of `batch` into its dead letters.
    pub(super) fn divert(&self, batch: &mut Batch) {
        if self.keys.is_empty() || !batch.changes.iter().any(|c| self.holds(c)) {
            return;
        }
        let (parked, rest): (Vec<_>, Vec<_>) = batch.changes.drain(..).partition(|c| self.holds(c));
        batch.changes = rest;
        batch.dead_letters.extend(parked.into_iter().map(|change| {
            DeadLetter {
                reason: "parked: an earlier change of this key is a dead letter (replay applies \
                     the key's changes in order)"
                    .to_owned(),
                code: None,
                change,
            }
        }));
        batch.dead_letters.sort_by_key(|d| d.change.position);
    }
}

/// What settling a batch did, for the lane's counters.
#[derive(Debug, Default)]
pub(super) struct Settled {
    pub(super) applied: u64,
    pub(super) skipped: u64,
    pub(super) dead_lettered: u64,
}

/// Settles `batch`, which failed with the definite error `err` (see the module docs). `Ok`
/// when every change of it is applied, skipped or dead-lettered, durably. The changes at
/// `uncounted` do not count as applied (see [`counted`]).
pub(super) async fn settle(
    sink: &mut dyn LaneSink,
    cfg: &LaneConfig,
    stats: &LaneStats,
    parked: &mut Parked,
    batch: Batch,
    err: SinkError,
    uncounted: &[Position],
) -> Result<Settled, SinkError> {
    let mut done = Settled::default();
    // Pieces still to apply, last first; `Some(err)` when the piece is known to fail.
    let mut stack: Vec<(Batch, Option<SinkError>)> = vec![(batch, Some(err))];
    while let Some((mut piece, known)) = stack.pop() {
        if known.is_none() {
            parked.divert(&mut piece);
        }
        let err = match known {
            Some(e) => e,
            None => match apply(sink, cfg, stats, Work::Batch(&piece), Conflicts::Definite).await {
                Ok(()) => {
                    done.applied += counted(&piece.changes, uncounted);
                    done.dead_lettered += piece.dead_letters.len() as u64;
                    continue;
                }
                Err(e) if e.class == ErrorClass::Definite => e,
                Err(e) => return Err(e),
            },
        };
        match piece.changes.len() {
            // Nothing left to blame: the dead letters themselves cannot be written.
            0 => return Err(err),
            1 => reject(sink, cfg, stats, parked, piece, err, &mut done).await?,
            n => {
                let right = piece.changes.split_off(n / 2);
                let cut = piece.changes.last().map(|c| c.position).unwrap_or_default();
                let (early, late): (Vec<_>, Vec<_>) = piece
                    .dead_letters
                    .into_iter()
                    .partition(|d| d.change.position <= cut);
                let lane = piece.lane;
                stack.push((
                    Batch {
                        lane,
                        changes: right,
                        dead_letters: late,
                        skipped_to: piece.skipped_to,
                    },
                    None,
                ));
                stack.push((
                    Batch {
                        lane,
                        changes: piece.changes,
                        dead_letters: early,
                        skipped_to: None,
                    },
                    None,
                ));
            }
        }
    }
    Ok(done)
}

/// A single change the sink rejects for good, with whatever dead letters and skipped position
/// ride along in its piece: applies `on_error`.
async fn reject(
    sink: &mut dyn LaneSink,
    cfg: &LaneConfig,
    stats: &LaneStats,
    parked: &mut Parked,
    mut piece: Batch,
    err: SinkError,
    done: &mut Settled,
) -> Result<(), SinkError> {
    let change: Change = piece.changes.remove(0);
    let what = describe(&change);
    match cfg.on_error {
        OnError::Halt => {
            let message = format!(
                "{}; halting (on_error: halt) at {what}, which is not confirmed: fix what the \
                 sink refuses and start Zipline again, or set `on_error: dead_letter` (or \
                 `skip`) on sink {} to set such changes aside",
                err.message, cfg.sink
            );
            return Err(err.reworded(message));
        }
        OnError::Skip => {
            tracing::warn!(sink = %cfg.sink, table = %change.table.qualified_name(), key = %key_to_json(&change.key), position = %change.position, op = change.op.as_str(), reason = %err.report(), "skipping a change the sink rejects (on_error: skip)");
            piece.skipped_to = piece.skipped_to.max(Some(change.position));
            done.skipped += 1;
        }
        OnError::DeadLetter => {
            tracing::warn!(sink = %cfg.sink, table = %change.table.qualified_name(), key = %key_to_json(&change.key), position = %change.position, op = change.op.as_str(), reason = %err.report(), "dead-lettering a change the sink rejects (on_error: dead_letter); later changes of its key follow it there");
            parked.park(&change);
            piece.dead_letters.push(DeadLetter {
                change,
                reason: err.report(),
                code: err.code().map(str::to_owned),
            });
            piece.dead_letters.sort_by_key(|d| d.change.position);
        }
    }
    match apply(sink, cfg, stats, Work::Batch(&piece), Conflicts::Definite).await {
        Ok(()) => {
            done.dead_lettered += piece.dead_letters.len() as u64;
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// `update 0/16B3A28#3 of public.orders, key [12]`, for messages.
fn describe(change: &Change) -> String {
    format!(
        "{} {} of {}, key {}",
        change.op.as_str(),
        change.position,
        change.table.qualified_name(),
        key_to_json(&change.key)
    )
}

/// How many of `changes` count as applied: all but those at `uncounted` (the delete halves
/// of key moves to another lane, which their other half counts; usually none).
pub(super) fn counted(changes: &[Change], uncounted: &[Position]) -> u64 {
    let all = changes.len() as u64;
    if uncounted.is_empty() {
        return all;
    }
    all - changes
        .iter()
        .filter(|c| uncounted.contains(&c.position))
        .count() as u64
}

/// Counts what a settled batch did into the lane's counters.
pub(super) fn count(stats: &LaneStats, done: &Settled) {
    stats.applied.fetch_add(done.applied, Ordering::Relaxed);
    stats
        .dead_lettered
        .fetch_add(done.dead_lettered, Ordering::Relaxed);
    stats.skipped_bad.fetch_add(done.skipped, Ordering::Relaxed);
}
