//! A column value as a transform reads and writes it.

/// A column value. Texts and bytes borrow from the batch; integers of every width read as
/// `Int`, and are written back at the column's own width.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    /// SQL NULL.
    Null,
    /// boolean
    Bool(bool),
    /// smallint, integer, bigint
    Int(i64),
    /// real, double precision
    Float(f64),
    /// numeric, as decimal text
    Numeric(&'a str),
    /// text, varchar, char
    Text(&'a str),
    /// bytea
    Bytes(&'a [u8]),
    /// days since 1970-01-01
    Date(i32),
    /// microseconds since midnight
    Time(i64),
    /// microseconds since 2000-01-01 00:00:00
    Timestamp(i64),
    /// microseconds since 2000-01-01 00:00:00 UTC
    TimestampTz(i64),
    /// a UUID, big-endian
    Uuid(u128),
    /// json or jsonb, as text
    Json(&'a str),
    /// any other type: its PostgreSQL type OID and text form
    Other(u32, &'a str),
    /// a large (TOASTed) value the update did not touch: the sink keeps what it has
    Unchanged,
}

impl<'a> Value<'a> {
    /// The text of a text, numeric, json or other value.
    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            Value::Text(s) | Value::Numeric(s) | Value::Json(s) | Value::Other(_, s) => Some(s),
            _ => None,
        }
    }

    /// An integer of any width.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::Int(i) => Some(i),
            _ => None,
        }
    }

    /// A float, or an integer as a float.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Float(f) => Some(f),
            Value::Int(i) => Some(i as f64),
            _ => None,
        }
    }

    /// A boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The bytes of a bytea value.
    pub fn as_bytes(&self) -> Option<&'a [u8]> {
        match *self {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// SQL NULL.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }
}

impl<'a> From<&'a str> for Value<'a> {
    fn from(s: &'a str) -> Self {
        Value::Text(s)
    }
}

impl From<i64> for Value<'_> {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}

impl From<bool> for Value<'_> {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<f64> for Value<'_> {
    fn from(f: f64) -> Self {
        Value::Float(f)
    }
}
