//! The change model: pure data, no I/O.
//!
//! A [`Change`] is one row-level effect committed on the source, stamped with a [`Position`]
//! that totally orders every change the source ever emits: the commit LSN of its transaction,
//! then its ordinal inside that transaction. Positions are deterministic, so a change replayed
//! after a restart carries the same position and a sink can tell it has applied it already.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

pub use compact_str::CompactString;
pub use smallvec::SmallVec;

/// A source log position: a PostgreSQL write-ahead-log position (`pg_lsn`, 64 bits, printed
/// `X/Y` in hex) or a SQL Server log sequence number (80 bits, printed as 20 hex digits).
/// Wide enough for both, so checkpoints and the ack tracker need not know the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u128);

impl Lsn {
    /// The position as PostgreSQL's 64-bit LSN (saturating: PostgreSQL positions always fit).
    pub fn as_pg(self) -> u64 {
        u64::try_from(self.0).unwrap_or(u64::MAX)
    }
}

impl From<u64> for Lsn {
    fn from(pg: u64) -> Self {
        Lsn(u128::from(pg))
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match u64::try_from(self.0) {
            Ok(pg) => write!(f, "{:X}/{:X}", pg >> 32, pg & 0xFFFF_FFFF),
            Err(_) => write!(f, "0x{:020X}", self.0),
        }
    }
}

/// Error parsing an `X/Y` LSN.
#[derive(Debug, thiserror::Error)]
#[error("invalid LSN {0:?}: expected two hex numbers separated by '/', like 16/B374D848")]
pub struct LsnParseError(String);

impl FromStr for Lsn {
    type Err = LsnParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || LsnParseError(s.to_owned());
        let (hi, lo) = s.split_once('/').ok_or_else(err)?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn::from((u64::from(hi) << 32) | u64::from(lo)))
    }
}

/// Where a change sits in the source's commit order.
///
/// Ordered by the commit LSN of the change's transaction, then by the change's ordinal inside
/// that transaction (starting at 1), then by `sub`, which tells apart several changes made
/// from one source change (a transform's fan-out; 0 otherwise). Ordinal 0 is never given to a
/// change, so `Position { lsn, ordinal: 0, sub: 0 }` sorts before every change of that
/// transaction. Every change a lane sees has a distinct position, which is what lets a lane
/// skip exactly what its checkpoint covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Position {
    /// Commit LSN of the transaction (pgoutput Begin's `final_lsn`).
    pub lsn: Lsn,
    /// 1-based index of the change inside its transaction.
    pub ordinal: u32,
    /// Index among the changes derived from one source change (0 for the first or only one).
    pub sub: u32,
}

impl Position {
    /// The position of source change `ordinal` of the transaction committed at `lsn`.
    pub fn new(lsn: Lsn, ordinal: u32) -> Self {
        Position {
            lsn,
            ordinal,
            sub: 0,
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.lsn, self.ordinal)?;
        if self.sub > 0 {
            write!(f, ".{}", self.sub)?;
        }
        Ok(())
    }
}

/// What a change does to its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// A new row; `values` holds all of it.
    Insert,
    /// A changed row; `values` holds the new row (columns may be [`Value::Unchanged`]).
    Update,
    /// A removed row; only `key` is meaningful.
    Delete,
    /// Every row of the table removed; `key` and `values` are empty.
    Truncate,
}

impl Op {
    /// Lower-case name, as used in logs and dead-letter records.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Insert => "insert",
            Op::Update => "update",
            Op::Delete => "delete",
            Op::Truncate => "truncate",
        }
    }
}

/// A typed column value.
///
/// Temporal values are kept as integers so sinks and transforms need no date library, and
/// cover PostgreSQL's whole range: dates count days from 1970-01-01, timestamps count
/// microseconds from PostgreSQL's epoch, 2000-01-01 (see [`PG_EPOCH_MICROS`] for why, and
/// [`timestamp_to_unix_micros`] to convert).
///
/// Values kept as text are [`CompactString`]s: up to 24 bytes sit in the value itself, so the
/// common short value costs no allocation where it is decoded and no free on the lane's
/// thread that drops it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// `boolean`.
    Bool(bool),
    /// `smallint`.
    Int2(i16),
    /// `integer`.
    Int4(i32),
    /// `bigint`.
    Int8(i64),
    /// `real`.
    Float4(f32),
    /// `double precision`.
    Float8(f64),
    /// `numeric`, as PostgreSQL prints it (full precision; may be `NaN`, `Infinity`, `-Infinity`).
    Numeric(CompactString),
    /// `text`, `varchar`, `char`, `name`.
    Text(CompactString),
    /// `bytea`.
    Bytes(Vec<u8>),
    /// `date`: days since 1970-01-01, from [`DATE_MIN`] to [`DATE_MAX`] (PostgreSQL's whole
    /// range, 4714-11-24 BC to 5874897-12-31), `i32::MIN`/`i32::MAX` for
    /// `-infinity`/`infinity`.
    Date(i32),
    /// `time`: microseconds since midnight.
    Time(i64),
    /// `timestamp` (no time zone): microseconds since 2000-01-01 00:00:00, PostgreSQL's own
    /// representation: from [`TIMESTAMP_MIN`] (4714-11-24 00:00:00 BC) up to
    /// [`TIMESTAMP_END`] (294277-01-01, excluded), `i64::MIN`/`i64::MAX` for
    /// `-infinity`/`infinity` (PostgreSQL's own sentinels).
    Timestamp(i64),
    /// `timestamptz`: microseconds since 2000-01-01 00:00:00 UTC, with the range and
    /// sentinels of [`Value::Timestamp`].
    TimestampTz(i64),
    /// `uuid`.
    Uuid([u8; 16]),
    /// `json` or `jsonb`, as text.
    Json(CompactString),
    /// Any other type, as PostgreSQL's text output, with the type's OID.
    Other {
        /// The PostgreSQL type OID.
        type_oid: u32,
        /// The value's text representation.
        text: CompactString,
    },
    /// A TOASTed value the update did not touch: the sink must keep its current value.
    Unchanged,
}

/// Days from the Unix epoch (1970-01-01) to PostgreSQL's (2000-01-01).
pub const PG_EPOCH_DAYS: i32 = 10_957;
/// Microseconds from the Unix epoch (1970-01-01 00:00:00 UTC) to PostgreSQL's (2000-01-01),
/// which [`Value::Timestamp`] and [`Value::TimestampTz`] count from: PostgreSQL's timestamps
/// run to 294276 AD, and microseconds since 1970 overflow 64 bits in its last thirty years,
/// while its own count from 2000 fits, with its `infinity` sentinels, and is what its binary
/// format sends.
pub const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// Now, in microseconds since 2000-01-01 (the clock of commit times and timestamps).
pub fn now_micros_since_2000() -> i64 {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    unix - PG_EPOCH_MICROS
}

/// PostgreSQL's first date, 4714-11-24 BC, as a [`Value::Date`].
pub const DATE_MIN: i32 = -2_440_588;
/// PostgreSQL's last date, 5874897-12-31, as a [`Value::Date`].
pub const DATE_MAX: i32 = 2_145_042_905;
/// PostgreSQL's first timestamp, 4714-11-24 00:00:00 BC, as a [`Value::Timestamp`].
pub const TIMESTAMP_MIN: i64 = -211_813_488_000_000_000;
/// The first instant after PostgreSQL's last timestamp (294277-01-01 00:00:00), as a
/// [`Value::Timestamp`]: the last one is `TIMESTAMP_END - 1`, 294276-12-31 23:59:59.999999.
pub const TIMESTAMP_END: i64 = 9_223_371_331_200_000_000;

/// Microseconds since 1970-01-01 of a [`Value::Timestamp`] or [`Value::TimestampTz`], `None`
/// for `-infinity` and `infinity`. 128 bits: the latest timestamps do not fit 64 counted
/// from 1970.
pub fn timestamp_to_unix_micros(t: i64) -> Option<i128> {
    match t {
        i64::MIN | i64::MAX => None,
        _ => Some(i128::from(t) + i128::from(PG_EPOCH_MICROS)),
    }
}

/// The [`Value::Timestamp`] of `unix` microseconds since 1970-01-01; `None` when that is no
/// finite 64-bit count from 2000 (including the two counts taken by the infinities).
pub fn timestamp_from_unix_micros(unix: i128) -> Option<i64> {
    i64::try_from(unix - i128::from(PG_EPOCH_MICROS))
        .ok()
        .filter(|t| *t != i64::MIN && *t != i64::MAX)
}

/// Whether PostgreSQL can hold `t` (a [`Value::Timestamp`] or [`Value::TimestampTz`]):
/// one of the infinities, or between [`TIMESTAMP_MIN`] and [`TIMESTAMP_END`].
pub fn timestamp_in_pg_range(t: i64) -> bool {
    matches!(t, i64::MIN | i64::MAX) || (TIMESTAMP_MIN..TIMESTAMP_END).contains(&t)
}

impl Value {
    /// True for [`Value::Null`].
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }
}

/// One column of a table, as the source describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Column name.
    pub name: String,
    /// PostgreSQL type OID.
    pub type_oid: u32,
    /// Type modifier (`atttypmod`), -1 when none.
    pub type_modifier: i32,
    /// Part of the replica identity (the key Zipline routes and deletes by).
    pub is_key: bool,
}

/// A table's shape at the time of a change. Shared by every change of that table until the
/// source reports a new shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// Source schema (namespace), e.g. `public`.
    pub schema: String,
    /// Table name.
    pub name: String,
    /// Columns in source order.
    pub columns: Vec<Column>,
    /// Indices into `columns` of the key columns, in source order.
    pub key: Vec<usize>,
}

impl Table {
    /// Build a table, deriving `key` from the columns' `is_key` flags.
    pub fn new(schema: String, name: String, columns: Vec<Column>) -> Self {
        let key = columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_key)
            .map(|(i, _)| i)
            .collect();
        Table {
            schema,
            name,
            columns,
            key,
        }
    }

    /// `schema.name`, for logs and errors.
    pub fn qualified_name(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }
}

/// The values of a row's key columns. A key of one column (the usual primary key) sits in the
/// change itself: no allocation where the change is made and no free on the lane's thread that
/// drops it. Longer keys go to the heap. Reads as a slice of [`Value`]s.
pub type Key = SmallVec<[Value; 1]>;

/// One row-level change committed on the source.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// Where the change sits in commit order.
    pub position: Position,
    /// What it does.
    pub op: Op,
    /// The table's shape when the change was made.
    pub table: Arc<Table>,
    /// Values of the key columns (in `table.key` order) identifying the row after the change
    /// (for a delete: the row removed). Empty for a truncate.
    pub key: Key,
    /// For an update that changed the key: the key the row had before. The sink removes that
    /// row and writes the new one. Boxed: a key move is rare, and inline it would make every
    /// change, moved several times between the stages, a quarter larger.
    pub old_key: Option<Box<Key>>,
    /// The whole row after the change, in `table.columns` order; empty for delete and truncate.
    pub values: Vec<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_stays_small() {
        // Every stage moves changes by value; a larger field belongs behind a pointer, as
        // `old_key` is.
        assert_eq!(std::mem::size_of::<Change>(), 128);
    }

    #[test]
    fn lsn_round_trips_through_text() {
        let lsn: Lsn = "16/B374D848".parse().unwrap();
        assert_eq!(lsn.0, 0x16_B374_D848);
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert!("16B374D848".parse::<Lsn>().is_err());
        assert!("x/1".parse::<Lsn>().is_err());
        // SQL Server's 80-bit LSNs print whole.
        assert_eq!(
            Lsn(0x0001_0000_0000_0000_0003).to_string(),
            "0x00010000000000000003"
        );
        assert_eq!(Lsn::from(u64::MAX).as_pg(), u64::MAX);
        assert_eq!(Lsn(u128::MAX).as_pg(), u64::MAX);
    }

    #[test]
    fn timestamps_convert_to_and_from_unix_microseconds_over_the_whole_range() {
        assert_eq!(timestamp_to_unix_micros(0), Some(946_684_800_000_000));
        assert_eq!(timestamp_from_unix_micros(0), Some(-PG_EPOCH_MICROS));
        // 294276-12-31 23:59:59.999999 is past i64 counted from 1970, not from 2000.
        let last = timestamp_to_unix_micros(TIMESTAMP_END - 1).unwrap();
        assert_eq!(last, 9_224_318_015_999_999_999);
        assert!(i64::try_from(last).is_err());
        assert_eq!(timestamp_from_unix_micros(last), Some(TIMESTAMP_END - 1));
        let first = timestamp_to_unix_micros(TIMESTAMP_MIN).unwrap();
        assert_eq!(timestamp_from_unix_micros(first), Some(TIMESTAMP_MIN));
        assert_eq!(timestamp_to_unix_micros(i64::MAX), None);
        assert_eq!(timestamp_to_unix_micros(i64::MIN), None);
        // The counts of the infinities, and beyond 64 bits, are no finite timestamp.
        let max = i128::from(i64::MAX) + i128::from(PG_EPOCH_MICROS);
        assert_eq!(timestamp_from_unix_micros(max), None);
        assert_eq!(timestamp_from_unix_micros(max - 1), Some(i64::MAX - 1));
        assert_eq!(timestamp_from_unix_micros(i128::MAX), None);
        assert!(timestamp_in_pg_range(i64::MIN) && timestamp_in_pg_range(TIMESTAMP_MIN));
        assert!(timestamp_in_pg_range(TIMESTAMP_END - 1) && !timestamp_in_pg_range(TIMESTAMP_END));
        assert!(!timestamp_in_pg_range(TIMESTAMP_MIN - 1));
    }

    #[test]
    fn positions_order_by_commit_then_ordinal() {
        let p = |lsn, ordinal| Position::new(Lsn(lsn), ordinal);
        assert!(p(1, 9) < p(2, 1));
        assert!(p(2, 1) < p(2, 2));
        assert!(p(2, 0) < p(2, 1));
        let fanned = Position { sub: 1, ..p(2, 1) };
        assert!(p(2, 1) < fanned && fanned < p(2, 2));
        assert_eq!(fanned.to_string(), "0/2#1.1");
    }
}
