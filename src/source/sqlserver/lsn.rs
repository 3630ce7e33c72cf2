//! SQL Server log sequence numbers, the order of change rows, and how they map to [`Position`]s.
//!
//! An LSN is `binary(10)`: VLF sequence number (4 bytes), log block offset (4 bytes), slot
//! (2 bytes), compared byte-wise, so the big-endian integer of the ten bytes orders exactly as
//! the server orders them. Zipline keeps it in [`Lsn`] (a `u128`) as that integer. Literals in
//! generated SQL are written `0x` + 20 hex digits, which SQL Server reads as `binary(10)`.
//! See <https://learn.microsoft.com/sql/relational-databases/track-changes/about-change-data-capture-sql-server>.
//!
//! Change rows are ordered by `(__$start_lsn, __$seqval, __$operation)`: the commit LSN of the
//! transaction, the log position of the row change inside it, and the operation (so an
//! update's before-image, 3, precedes its after-image, 4, which share one `__$seqval`). Rows of
//! different tables in one transaction interleave by `__$seqval`, which is a log position and
//! therefore unique across tables; the table index only breaks ties that cannot occur.
//!
//! **Position mapping.** `Position { lsn: __$start_lsn, ordinal }`, where ordinals `1..` are
//! given within one commit LSN, in the order above, to every change Zipline emits (operations
//! 1, 2 and 4; a before-image, 3, is folded into its after-image and gets none). A poll reads
//! whole transactions (its window ends at an LSN taken from `cdc.lsn_time_mapping`, a
//! transaction boundary), so a replay of the same transaction yields the same ordinals. The
//! initial snapshot's rows share one position LSN, the snapshot LSN `L0`, with ordinals after
//! the `m` changes the change tables hold at exactly `L0` (see `snapshot.rs`). A durable
//! frontier `F` is recorded as `Position { lsn: F, ordinal: u32::MAX }`: every transaction
//! committed at or below `F` is durable.

use std::cmp::Ordering;

use crate::change::Lsn;

/// Bytes in a SQL Server LSN (`binary(10)`) and in a `__$seqval`.
pub(crate) const LSN_BYTES: usize = 10;

/// Largest value a 10-byte LSN can hold.
const LSN_MAX: u128 = (1u128 << (8 * LSN_BYTES)) - 1;

/// The ordinal that marks a whole transaction as durable (see the module docs).
pub(crate) const WHOLE_TRANSACTION: u32 = u32::MAX;

/// Reads a `binary(10)` LSN or `__$seqval`. Anything but ten bytes is not one.
pub(crate) fn from_bytes(bytes: &[u8]) -> Result<Lsn, String> {
    if bytes.len() != LSN_BYTES {
        return Err(format!(
            "expected a {LSN_BYTES}-byte LSN, found {} bytes",
            bytes.len()
        ));
    }
    Ok(Lsn(bytes
        .iter()
        .fold(0u128, |acc, b| (acc << 8) | u128::from(*b))))
}

/// The SQL literal of an LSN: `0x` and 20 upper-case hex digits (a `binary(10)` constant).
/// Also how LSNs are shown in logs and errors, because that is how SQL Server prints them.
pub(crate) fn literal(lsn: Lsn) -> String {
    format!("0x{:020X}", lsn.0 & LSN_MAX)
}

/// The smallest LSN above `lsn` (an integer, not necessarily an LSN the log holds). Because
/// LSNs compare as integers, `>= next(lsn)` is `> lsn`.
pub(crate) fn next(lsn: Lsn) -> Lsn {
    Lsn((lsn.0 + 1).min(LSN_MAX))
}

/// The largest LSN below `lsn` (`0` stays `0`).
pub(crate) fn prev(lsn: Lsn) -> Lsn {
    Lsn(lsn.0.saturating_sub(1))
}

/// `__$operation`: what a change row does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Operation {
    /// 1: a deleted row (the values it had).
    Delete,
    /// 2: an inserted row.
    Insert,
    /// 3: an update's before-image (only with the `all update old` row filter).
    UpdateBefore,
    /// 4: an update's after-image.
    UpdateAfter,
}

impl Operation {
    /// Maps `__$operation`. Other values are not defined by SQL Server.
    pub(crate) fn from_code(code: i64) -> Result<Self, String> {
        match code {
            1 => Ok(Operation::Delete),
            2 => Ok(Operation::Insert),
            3 => Ok(Operation::UpdateBefore),
            4 => Ok(Operation::UpdateAfter),
            other => Err(format!(
                "__$operation {other} is not one of 1 (delete), 2 (insert), 3 (update before-image), 4 (update after-image)"
            )),
        }
    }

    /// The `__$operation` value.
    pub(crate) fn code(self) -> u8 {
        match self {
            Operation::Delete => 1,
            Operation::Insert => 2,
            Operation::UpdateBefore => 3,
            Operation::UpdateAfter => 4,
        }
    }
}

/// Where a change row sits in commit order; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowOrder {
    /// `__$start_lsn`: commit LSN of the transaction.
    pub(crate) start_lsn: Lsn,
    /// `__$seqval`: log position of the row change.
    pub(crate) seqval: Lsn,
    /// `__$operation`.
    pub(crate) operation: Operation,
    /// Index of the table in the configured list.
    pub(crate) table: usize,
}

impl Ord for RowOrder {
    fn cmp(&self, other: &Self) -> Ordering {
        (
            self.start_lsn,
            self.seqval,
            self.operation.code(),
            self.table,
        )
            .cmp(&(
                other.start_lsn,
                other.seqval,
                other.operation.code(),
                other.table,
            ))
    }
}

impl PartialOrd for RowOrder {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Hands out ordinals `1..` within each commit LSN, in the order rows are fed.
#[derive(Debug, Default)]
pub(crate) struct Ordinals {
    lsn: Option<Lsn>,
    last: u32,
}

impl Ordinals {
    /// The next ordinal for a change of the transaction committed at `lsn`. Rows must be fed
    /// in [`RowOrder`] order; a new LSN restarts at 1.
    pub(crate) fn next(&mut self, lsn: Lsn) -> Result<u32, String> {
        if self.lsn != Some(lsn) {
            self.lsn = Some(lsn);
            self.last = 0;
        }
        if self.last >= WHOLE_TRANSACTION - 1 {
            return Err(format!(
                "transaction {} has more than {} changes",
                literal(lsn),
                WHOLE_TRANSACTION - 1
            ));
        }
        self.last += 1;
        Ok(self.last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsn_bytes_round_trip_as_big_endian() {
        let bytes = [0x00, 0x00, 0x00, 0x2A, 0x00, 0x00, 0x01, 0xF8, 0x00, 0x03];
        let lsn = from_bytes(&bytes).unwrap();
        assert_eq!(lsn.0, 0x2A_0000_01F8_0003);
        assert_eq!(literal(lsn), "0x0000002A000001F80003");
        assert_eq!(literal(Lsn(0)), "0x00000000000000000000");
        assert_eq!(literal(Lsn(LSN_MAX)), "0xFFFFFFFFFFFFFFFFFFFF");
        assert!(from_bytes(&bytes[..9]).unwrap_err().contains("9 bytes"));
        assert!(from_bytes(&[0; 11]).is_err());
    }

    #[test]
    fn byte_order_is_numeric_order() {
        // The VLF sequence number dominates the block offset, which dominates the slot.
        let a = from_bytes(&[0, 0, 0, 1, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]).unwrap();
        let b = from_bytes(&[0, 0, 0, 2, 0, 0, 0, 0, 0, 0]).unwrap();
        let c = from_bytes(&[0, 0, 0, 2, 0, 0, 0, 0, 0, 1]).unwrap();
        assert!(a < b && b < c);
        assert_eq!(next(a), b, "incrementing carries across components");
        assert_eq!(prev(b), a);
        assert_eq!(prev(Lsn(0)), Lsn(0));
        assert_eq!(next(Lsn(LSN_MAX)), Lsn(LSN_MAX));
    }

    #[test]
    fn operation_codes_map_to_change_kinds() {
        assert_eq!(Operation::from_code(1).unwrap(), Operation::Delete);
        assert_eq!(Operation::from_code(2).unwrap(), Operation::Insert);
        assert_eq!(Operation::from_code(3).unwrap(), Operation::UpdateBefore);
        assert_eq!(Operation::from_code(4).unwrap(), Operation::UpdateAfter);
        for bad in [0, 5, -1] {
            assert!(
                Operation::from_code(bad)
                    .unwrap_err()
                    .contains(&bad.to_string())
            );
        }
        for code in 1..=4 {
            assert_eq!(i64::from(Operation::from_code(code).unwrap().code()), code);
        }
    }

    #[test]
    fn rows_order_by_commit_then_seqval_then_operation() {
        let row = |start: u128, seq: u128, op: i64, table: usize| RowOrder {
            start_lsn: Lsn(start),
            seqval: Lsn(seq),
            operation: Operation::from_code(op).unwrap(),
            table,
        };
        let mut rows = vec![
            row(20, 1, 2, 0),
            row(10, 7, 4, 1),
            row(10, 7, 3, 1),
            row(10, 3, 1, 0),
            row(10, 5, 2, 1),
        ];
        rows.sort();
        assert_eq!(
            rows,
            vec![
                row(10, 3, 1, 0),
                row(10, 5, 2, 1),
                // The before-image precedes the after-image of the same update.
                row(10, 7, 3, 1),
                row(10, 7, 4, 1),
                // A later commit sorts after, whatever its seqval.
                row(20, 1, 2, 0),
            ]
        );
        // The commit LSN dominates the seqval: a transaction that began earlier (lower
        // seqval) but committed later comes later.
        assert!(row(11, 1, 2, 0) > row(10, 99, 2, 0));
    }

    #[test]
    fn ordinals_restart_per_commit_lsn() {
        let mut o = Ordinals::default();
        assert_eq!(o.next(Lsn(10)).unwrap(), 1);
        assert_eq!(o.next(Lsn(10)).unwrap(), 2);
        assert_eq!(o.next(Lsn(12)).unwrap(), 1);
        assert_eq!(o.next(Lsn(12)).unwrap(), 2);
        assert_eq!(o.next(Lsn(13)).unwrap(), 1);
        let mut full = Ordinals {
            lsn: Some(Lsn(1)),
            last: WHOLE_TRANSACTION - 1,
        };
        assert!(full.next(Lsn(1)).unwrap_err().contains("more than"));
    }
}
