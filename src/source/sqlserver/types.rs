//! SQL Server column types → the change model's [`Value`]s.
//!
//! Types are named by `TYPE_NAME(system_type_id)` of the change table's column (so an alias
//! type resolves to its base type) plus `max_length` (`-1` for the `(max)` types). Each
//! supported type has a select expression: most columns are read as they are, but `money` and
//! `smallmoney` are cast to `decimal(19,4)` / `decimal(10,4)` so no value goes through a
//! float, the deprecated `text`, `ntext` and `image` are cast to their `(max)` successors, and
//! `xml` is cast to `nvarchar(max)` and carried as text. Types outside the list below
//! (`sql_variant`, `hierarchyid`, `geometry`, `geography`, `timestamp`/`rowversion`, CLR types)
//! stop the source at startup, naming the table and column.
//! Type reference: <https://learn.microsoft.com/sql/t-sql/data-types/data-types-transact-sql>.
//!
//! Temporal values become the change model's integers (see [`Value`]): dates count days from
//! 1970-01-01, timestamps microseconds from 2000-01-01; SQL Server's
//! `time(7)`, `datetime2(7)` and `datetimeoffset(7)` carry 100 ns units, which are truncated
//! to the microsecond. `datetime` ticks are 1/300 s and are rounded to the nearest microsecond.
//! `datetimeoffset` arrives as UTC plus an offset (TDS sends it so), and becomes a
//! `TimestampTz` of that UTC instant.
//!
//! Large object columns (`(max)` types, `text`, `ntext`, `image`, `xml`) are NULL in an
//! update's before-image unless they changed, and `text`/`ntext`/`image` also in deletes; an
//! update after-image whose LOB column is NULL while `__$update_mask` says it did not change is
//! passed on as [`Value::Unchanged`], so the sink keeps what it has. See the remarks of
//! <https://learn.microsoft.com/sql/relational-databases/system-functions/cdc-fn-cdc-get-all-changes-capture-instance-transact-sql>.

use tiberius::ColumnData;

use super::sql::quote_ident;
use crate::change::{PG_EPOCH_DAYS, Value};

/// Days from 0001-01-01 (the `date`/`datetime2` epoch) to 1970-01-01, where dates count from.
const DAYS_0001_TO_1970: i64 = 719_162;
/// Days from 0001-01-01 to 2000-01-01, where timestamps count from.
const DAYS_0001_TO_2000: i64 = DAYS_0001_TO_1970 + PG_EPOCH_DAYS as i64;
/// Days from 1900-01-01 (the `datetime`/`smalldatetime` epoch) to 2000-01-01.
const DAYS_1900_TO_2000: i64 = 36_524;
const MICROS_PER_DAY: i64 = 86_400_000_000;

/// A supported SQL Server column type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SqlType {
    TinyInt,
    SmallInt,
    Int,
    BigInt,
    Bit,
    /// `decimal` / `numeric`.
    Decimal,
    Money,
    SmallMoney,
    /// `float` (8 bytes; `float(n)` with n ≤ 24 is stored as `real`).
    Float,
    Real,
    /// `char`, `varchar`, `nchar`, `nvarchar`; `max` for the `(max)` forms.
    String {
        max: bool,
    },
    /// `text` (cast to `varchar(max)`).
    Text,
    /// `ntext` (cast to `nvarchar(max)`).
    NText,
    Date,
    Time,
    DateTime,
    SmallDateTime,
    DateTime2,
    DateTimeOffset,
    UniqueIdentifier,
    /// `binary`, `varbinary`; `max` for `varbinary(max)`.
    Binary {
        max: bool,
    },
    /// `image` (cast to `varbinary(max)`).
    Image,
    /// `xml` (cast to `nvarchar(max)`).
    Xml,
}

impl SqlType {
    /// Maps a system type name and `sys.columns.max_length`; `None` for unsupported types.
    pub(crate) fn parse(type_name: &str, max_length: i64) -> Option<SqlType> {
        let max = max_length == -1;
        Some(match type_name.to_ascii_lowercase().as_str() {
            "tinyint" => SqlType::TinyInt,
            "smallint" => SqlType::SmallInt,
            "int" => SqlType::Int,
            "bigint" => SqlType::BigInt,
            "bit" => SqlType::Bit,
            "decimal" | "numeric" => SqlType::Decimal,
            "money" => SqlType::Money,
            "smallmoney" => SqlType::SmallMoney,
            "float" => SqlType::Float,
            "real" => SqlType::Real,
            "char" | "varchar" | "nchar" | "nvarchar" => SqlType::String { max },
            "text" => SqlType::Text,
            "ntext" => SqlType::NText,
            "date" => SqlType::Date,
            "time" => SqlType::Time,
            "datetime" => SqlType::DateTime,
            "smalldatetime" => SqlType::SmallDateTime,
            "datetime2" => SqlType::DateTime2,
            "datetimeoffset" => SqlType::DateTimeOffset,
            "uniqueidentifier" => SqlType::UniqueIdentifier,
            "binary" | "varbinary" => SqlType::Binary { max },
            "image" => SqlType::Image,
            "xml" => SqlType::Xml,
            _ => return None,
        })
    }

    /// True for the large-object types whose unchanged values CDC leaves NULL.
    pub(crate) fn is_lob(self) -> bool {
        matches!(
            self,
            SqlType::String { max: true }
                | SqlType::Binary { max: true }
                | SqlType::Text
                | SqlType::NText
                | SqlType::Image
                | SqlType::Xml
        )
    }

    /// The PostgreSQL OID of the closest type, for [`crate::change::Column::type_oid`], which
    /// the change model defines in PostgreSQL's terms.
    pub(crate) fn pg_type_oid(self) -> u32 {
        match self {
            SqlType::TinyInt | SqlType::SmallInt => 21,
            SqlType::Int => 23,
            SqlType::BigInt => 20,
            SqlType::Bit => 16,
            SqlType::Decimal | SqlType::Money | SqlType::SmallMoney => 1700,
            SqlType::Float => 701,
            SqlType::Real => 700,
            SqlType::String { .. } | SqlType::Text | SqlType::NText | SqlType::Xml => 25,
            SqlType::Date => 1082,
            SqlType::Time => 1083,
            SqlType::DateTime | SqlType::SmallDateTime | SqlType::DateTime2 => 1114,
            SqlType::DateTimeOffset => 1184,
            SqlType::UniqueIdentifier => 2950,
            SqlType::Binary { .. } | SqlType::Image => 17,
        }
    }

    /// The select-list expression that reads column `name` of this type (see module docs).
    pub(crate) fn select_expr(self, name: &str) -> String {
        let col = quote_ident(name);
        let cast = |to: &str| format!("CAST({col} AS {to}) AS {col}");
        match self {
            SqlType::Money => cast("decimal(19,4)"),
            SqlType::SmallMoney => cast("decimal(10,4)"),
            SqlType::Text => cast("varchar(max)"),
            SqlType::NText | SqlType::Xml => cast("nvarchar(max)"),
            SqlType::Image => cast("varbinary(max)"),
            _ => col,
        }
    }
}

/// Converts one cell read through [`SqlType::select_expr`] into a [`Value`]. The error names
/// what arrived, for the caller to prefix with table and column.
pub(crate) fn to_value(ty: SqlType, data: &ColumnData<'_>) -> Result<Value, String> {
    let unexpected = || {
        format!(
            "a {ty:?} column arrived as {}",
            match data {
                ColumnData::U8(_) => "tinyint",
                ColumnData::I16(_) => "smallint",
                ColumnData::I32(_) => "int",
                ColumnData::I64(_) => "bigint",
                ColumnData::F32(_) => "real",
                ColumnData::F64(_) => "float",
                ColumnData::Bit(_) => "bit",
                ColumnData::String(_) => "a string",
                ColumnData::Guid(_) => "uniqueidentifier",
                ColumnData::Binary(_) => "binary",
                ColumnData::Numeric(_) => "numeric",
                ColumnData::Xml(_) => "xml",
                ColumnData::DateTime(_) => "datetime",
                ColumnData::SmallDateTime(_) => "smalldatetime",
                ColumnData::Time(_) => "time",
                ColumnData::Date(_) => "date",
                ColumnData::DateTime2(_) => "datetime2",
                ColumnData::DateTimeOffset(_) => "datetimeoffset",
            }
        )
    };
    let int = |v: i64| match ty {
        SqlType::TinyInt | SqlType::SmallInt => i16::try_from(v)
            .map(Value::Int2)
            .map_err(|_| format!("{v} does not fit smallint")),
        SqlType::Int => i32::try_from(v)
            .map(Value::Int4)
            .map_err(|_| format!("{v} does not fit int")),
        SqlType::BigInt => Ok(Value::Int8(v)),
        _ => Err(unexpected()),
    };
    match data {
        ColumnData::U8(None)
        | ColumnData::I16(None)
        | ColumnData::I32(None)
        | ColumnData::I64(None)
        | ColumnData::F32(None)
        | ColumnData::F64(None)
        | ColumnData::Bit(None)
        | ColumnData::String(None)
        | ColumnData::Guid(None)
        | ColumnData::Binary(None)
        | ColumnData::Numeric(None)
        | ColumnData::Xml(None)
        | ColumnData::DateTime(None)
        | ColumnData::SmallDateTime(None)
        | ColumnData::Time(None)
        | ColumnData::Date(None)
        | ColumnData::DateTime2(None)
        | ColumnData::DateTimeOffset(None) => Ok(Value::Null),
        ColumnData::U8(Some(v)) => int(i64::from(*v)),
        ColumnData::I16(Some(v)) => int(i64::from(*v)),
        ColumnData::I32(Some(v)) => int(i64::from(*v)),
        ColumnData::I64(Some(v)) => int(*v),
        ColumnData::Bit(Some(b)) if ty == SqlType::Bit => Ok(Value::Bool(*b)),
        ColumnData::F32(Some(f)) if ty == SqlType::Real => Ok(Value::Float4(*f)),
        ColumnData::F64(Some(f)) if ty == SqlType::Float => Ok(Value::Float8(*f)),
        ColumnData::Numeric(Some(n))
            if matches!(ty, SqlType::Decimal | SqlType::Money | SqlType::SmallMoney) =>
        {
            Ok(Value::Numeric(decimal_text(n.value(), n.scale()).into()))
        }
        ColumnData::String(Some(s))
            if matches!(
                ty,
                SqlType::String { .. } | SqlType::Text | SqlType::NText | SqlType::Xml
            ) =>
        {
            Ok(Value::Text((&**s).into()))
        }
        ColumnData::Xml(Some(x)) if ty == SqlType::Xml => Ok(Value::Text(x.to_string().into())),
        ColumnData::Binary(Some(b)) if matches!(ty, SqlType::Binary { .. } | SqlType::Image) => {
            Ok(Value::Bytes(b.to_vec()))
        }
        ColumnData::Guid(Some(u)) if ty == SqlType::UniqueIdentifier => {
            Ok(Value::Uuid(*u.as_bytes()))
        }
        ColumnData::Date(Some(d)) if ty == SqlType::Date => {
            i32::try_from(i64::from(d.days()) - DAYS_0001_TO_1970)
                .map(Value::Date)
                .map_err(|_| "date out of range".to_owned())
        }
        ColumnData::Time(Some(t)) if ty == SqlType::Time => Ok(Value::Time(increments_to_micros(
            t.increments(),
            t.scale(),
        )?)),
        ColumnData::DateTime(Some(dt)) if ty == SqlType::DateTime => {
            // 1/300 s ticks, rounded half up to the microsecond.
            let micros = (i64::from(dt.seconds_fragments()) * 20_000 + 3) / 6;
            Ok(Value::Timestamp(
                (i64::from(dt.days()) - DAYS_1900_TO_2000) * MICROS_PER_DAY + micros,
            ))
        }
        ColumnData::SmallDateTime(Some(dt)) if ty == SqlType::SmallDateTime => {
            let minutes = i64::from(dt.seconds_fragments());
            Ok(Value::Timestamp(
                (i64::from(dt.days()) - DAYS_1900_TO_2000) * MICROS_PER_DAY + minutes * 60_000_000,
            ))
        }
        ColumnData::DateTime2(Some(dt)) if ty == SqlType::DateTime2 => Ok(Value::Timestamp(
            datetime2_micros(dt.date().days(), dt.time().increments(), dt.time().scale())?,
        )),
        ColumnData::DateTimeOffset(Some(dto)) if ty == SqlType::DateTimeOffset => {
            let dt = dto.datetime2();
            Ok(Value::TimestampTz(datetime2_micros(
                dt.date().days(),
                dt.time().increments(),
                dt.time().scale(),
            )?))
        }
        _ => Err(unexpected()),
    }
}

/// Microseconds since 2000-01-01 of a `datetime2` (days since 0001-01-01 and a time).
fn datetime2_micros(days: u32, increments: u64, scale: u8) -> Result<i64, String> {
    Ok((i64::from(days) - DAYS_0001_TO_2000) * MICROS_PER_DAY
        + increments_to_micros(increments, scale)?)
}

/// A time of day in 10^-`scale` s increments → microseconds (truncating below 1 µs).
fn increments_to_micros(increments: u64, scale: u8) -> Result<i64, String> {
    let micros = match scale {
        0..=6 => increments.checked_mul(10u64.pow(6 - u32::from(scale))),
        7..=9 => Some(increments / 10u64.pow(u32::from(scale) - 6)),
        _ => None,
    };
    micros
        .and_then(|m| i64::try_from(m).ok())
        .ok_or_else(|| format!("time value {increments} at scale {scale} is out of range"))
}

/// `value × 10^-scale` as decimal text with exactly `scale` fractional digits, like
/// PostgreSQL prints `numeric`.
pub(crate) fn decimal_text(value: i128, scale: u8) -> String {
    let digits = value.unsigned_abs().to_string();
    let scale = usize::from(scale);
    let mut out = String::with_capacity(digits.len() + 3);
    if value < 0 {
        out.push('-');
    }
    if scale == 0 {
        out.push_str(&digits);
        return out;
    }
    if digits.len() <= scale {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', scale - digits.len()));
        out.push_str(&digits);
    } else {
        let (int, frac) = digits.split_at(digits.len() - scale);
        out.push_str(int);
        out.push('.');
        out.push_str(frac);
    }
    out
}

/// Whether `__$update_mask` marks the captured column at 1-based `ordinal` as changed. The
/// mask's last byte holds columns 1–8 (bit 0 = column 1), the byte before it 9–16, and so on.
pub(crate) fn mask_has(mask: &[u8], ordinal: usize) -> bool {
    let Some(bit) = ordinal.checked_sub(1) else {
        return false;
    };
    let byte = bit / 8;
    if byte >= mask.len() {
        return false;
    }
    mask[mask.len() - 1 - byte] & (1 << (bit % 8)) != 0
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use tiberius::numeric::Numeric;
    use tiberius::time::{Date, DateTime, DateTime2, DateTimeOffset, SmallDateTime, Time};

    use super::*;

    fn ok(ty: SqlType, data: ColumnData<'_>) -> Value {
        to_value(ty, &data).unwrap_or_else(|e| panic!("{ty:?}: {e}"))
    }

    #[test]
    fn type_names_map_and_unsupported_ones_do_not() {
        assert_eq!(SqlType::parse("INT", 4), Some(SqlType::Int));
        assert_eq!(
            SqlType::parse("nvarchar", -1),
            Some(SqlType::String { max: true })
        );
        assert_eq!(
            SqlType::parse("varchar", 50),
            Some(SqlType::String { max: false })
        );
        assert_eq!(SqlType::parse("numeric", 9), Some(SqlType::Decimal));
        assert_eq!(
            SqlType::parse("varbinary", -1),
            Some(SqlType::Binary { max: true })
        );
        for bad in [
            "sql_variant",
            "hierarchyid",
            "geometry",
            "geography",
            "timestamp",
        ] {
            assert_eq!(SqlType::parse(bad, 8), None, "{bad}");
        }
        assert!(SqlType::parse("xml", -1).unwrap().is_lob());
        assert!(SqlType::parse("text", 16).unwrap().is_lob());
        assert!(!SqlType::parse("nvarchar", 100).unwrap().is_lob());
    }

    #[test]
    fn select_expressions_cast_where_the_wire_type_would_lose_or_misname() {
        assert_eq!(SqlType::Int.select_expr("id"), "[id]");
        assert_eq!(
            SqlType::Money.select_expr("price"),
            "CAST([price] AS decimal(19,4)) AS [price]"
        );
        assert_eq!(
            SqlType::SmallMoney.select_expr("p"),
            "CAST([p] AS decimal(10,4)) AS [p]"
        );
        assert_eq!(
            SqlType::Xml.select_expr("doc]x"),
            "CAST([doc]]x] AS nvarchar(max)) AS [doc]]x]"
        );
        assert_eq!(
            SqlType::Text.select_expr("t"),
            "CAST([t] AS varchar(max)) AS [t]"
        );
        assert_eq!(
            SqlType::Image.select_expr("i"),
            "CAST([i] AS varbinary(max)) AS [i]"
        );
    }

    #[test]
    fn integers_bits_floats_and_decimals() {
        assert_eq!(
            ok(SqlType::TinyInt, ColumnData::U8(Some(255))),
            Value::Int2(255)
        );
        assert_eq!(
            ok(SqlType::SmallInt, ColumnData::I16(Some(-3))),
            Value::Int2(-3)
        );
        assert_eq!(ok(SqlType::Int, ColumnData::I32(Some(7))), Value::Int4(7));
        assert_eq!(
            ok(SqlType::BigInt, ColumnData::I64(Some(i64::MIN))),
            Value::Int8(i64::MIN)
        );
        // A narrower wire integer widens; a wider one that does not fit is an error.
        assert_eq!(
            ok(SqlType::BigInt, ColumnData::I32(Some(5))),
            Value::Int8(5)
        );
        assert!(to_value(SqlType::Int, &ColumnData::I64(Some(1 << 40))).is_err());
        assert_eq!(
            ok(SqlType::Bit, ColumnData::Bit(Some(true))),
            Value::Bool(true)
        );
        assert_eq!(
            ok(SqlType::Real, ColumnData::F32(Some(1.5))),
            Value::Float4(1.5)
        );
        assert_eq!(
            ok(SqlType::Float, ColumnData::F64(Some(-2.25))),
            Value::Float8(-2.25)
        );
        assert_eq!(
            ok(
                SqlType::Money,
                ColumnData::Numeric(Some(Numeric::new_with_scale(-12345, 4)))
            ),
            Value::Numeric("-1.2345".into())
        );
        assert_eq!(ok(SqlType::Int, ColumnData::I32(None)), Value::Null);
        assert!(
            to_value(SqlType::Int, &ColumnData::String(Some(Cow::Borrowed("1"))))
                .unwrap_err()
                .contains("arrived as a string")
        );
    }

    #[test]
    fn decimal_text_keeps_scale_and_sign() {
        assert_eq!(decimal_text(1250, 2), "12.50");
        assert_eq!(decimal_text(-5, 2), "-0.05");
        assert_eq!(decimal_text(5, 0), "5");
        assert_eq!(decimal_text(0, 3), "0.000");
        assert_eq!(decimal_text(-123, 3), "-0.123");
        assert_eq!(
            decimal_text(i128::from(u64::MAX) * 1000, 38).len(),
            "0.".len() + 38
        );
    }

    #[test]
    fn strings_binaries_guids_and_xml() {
        assert_eq!(
            ok(
                SqlType::String { max: false },
                ColumnData::String(Some(Cow::Borrowed("grüß")))
            ),
            Value::Text("grüß".into())
        );
        assert_eq!(
            ok(
                SqlType::Xml,
                ColumnData::String(Some(Cow::Borrowed("<a/>")))
            ),
            Value::Text("<a/>".into())
        );
        assert_eq!(
            ok(
                SqlType::Binary { max: true },
                ColumnData::Binary(Some(Cow::Borrowed(&[0, 255][..])))
            ),
            Value::Bytes(vec![0, 255])
        );
        let u = tiberius::Uuid::parse_str("6f9619ff-8b86-d011-b42d-00c04fc964ff").unwrap();
        assert_eq!(
            ok(SqlType::UniqueIdentifier, ColumnData::Guid(Some(u))),
            Value::Uuid(*u.as_bytes())
        );
    }

    #[test]
    fn dates_count_from_1970_and_timestamps_from_2000() {
        // 1970-01-02 is day 719163 after 0001-01-01.
        assert_eq!(
            ok(SqlType::Date, ColumnData::Date(Some(Date::new(719_163)))),
            Value::Date(1)
        );
        assert_eq!(
            ok(SqlType::Date, ColumnData::Date(Some(Date::new(0)))),
            Value::Date(-719_162)
        );
        // 01:00:00.1234567 at scale 7 truncates to the microsecond.
        assert_eq!(
            ok(
                SqlType::Time,
                ColumnData::Time(Some(Time::new(36_001_234_567, 7)))
            ),
            Value::Time(3_600_123_456)
        );
        assert_eq!(
            ok(SqlType::Time, ColumnData::Time(Some(Time::new(5, 0)))),
            Value::Time(5_000_000)
        );
        // datetime: 2000-01-01 is day 36524 after 1900-01-01; one tick is 3333.33 µs.
        assert_eq!(
            ok(
                SqlType::DateTime,
                ColumnData::DateTime(Some(DateTime::new(36_524, 1)))
            ),
            Value::Timestamp(3_333)
        );
        assert_eq!(
            ok(
                SqlType::DateTime,
                ColumnData::DateTime(Some(DateTime::new(36_523, 2)))
            ),
            Value::Timestamp(-MICROS_PER_DAY + 6_667)
        );
        // 1970-01-01 is day 25567: PG_EPOCH_MICROS before 2000.
        assert_eq!(
            ok(
                SqlType::DateTime,
                ColumnData::DateTime(Some(DateTime::new(25_567, 0)))
            ),
            Value::Timestamp(-crate::change::PG_EPOCH_MICROS)
        );
        assert_eq!(
            ok(
                SqlType::SmallDateTime,
                ColumnData::SmallDateTime(Some(SmallDateTime::new(36_525, 90)))
            ),
            Value::Timestamp(MICROS_PER_DAY + 90 * 60_000_000)
        );
        // datetime2: 2000-01-01 is day 730119 after 0001-01-01.
        let dt2 = DateTime2::new(Date::new(730_119), Time::new(15, 1));
        assert_eq!(
            ok(SqlType::DateTime2, ColumnData::DateTime2(Some(dt2))),
            Value::Timestamp(1_500_000)
        );
        // Its range's ends: 0001-01-01 and 9999-12-31 23:59:59.9999999.
        let first = DateTime2::new(Date::new(0), Time::new(0, 7));
        assert_eq!(
            ok(SqlType::DateTime2, ColumnData::DateTime2(Some(first))),
            Value::Timestamp(-730_119 * MICROS_PER_DAY)
        );
        let last = DateTime2::new(Date::new(3_652_058), Time::new(863_999_999_999, 7));
        assert_eq!(
            ok(SqlType::DateTime2, ColumnData::DateTime2(Some(last))),
            Value::Timestamp(2_921_940 * MICROS_PER_DAY - 1)
        );
        // The datetime2 inside a datetimeoffset is UTC; the offset does not shift it.
        let dto = DateTimeOffset::new(dt2, 120);
        assert_eq!(
            ok(
                SqlType::DateTimeOffset,
                ColumnData::DateTimeOffset(Some(dto))
            ),
            Value::TimestampTz(1_500_000)
        );
        assert!(increments_to_micros(1, 10).is_err());
    }

    #[test]
    fn update_mask_bits_count_from_the_last_byte() {
        // Ten columns, all set: 0x03FF.
        let all = [0x03, 0xFF];
        assert!((1..=10).all(|o| mask_has(&all, o)));
        assert!(!mask_has(&all, 11));
        // Only column 2 and column 9 changed.
        let some = [0x01, 0x02];
        assert!(mask_has(&some, 2) && mask_has(&some, 9));
        assert!(!mask_has(&some, 1) && !mask_has(&some, 10));
        assert!(!mask_has(&[], 1));
        assert!(!mask_has(&all, 0));
    }
}
