//! Reading pgoutput's wire fields, with errors that say which message, field and byte
//! offset went wrong. Every read is bounds-checked: a short or corrupt payload is an error,
//! never a panic.

use bytes::Bytes;

use super::{OldTuple, Tuple};
use crate::change::Lsn;
use crate::error::{Classify, ErrorClass};

/// A pgoutput payload that does not follow the message format.
#[derive(Debug, thiserror::Error)]
#[error("malformed pgoutput {message} message at byte {offset}: {problem}")]
pub(crate) struct DecodeError {
    /// Message type name, e.g. `Update`.
    pub(crate) message: &'static str,
    /// Offset in the payload where the problem starts.
    pub(crate) offset: usize,
    /// What is wrong.
    pub(crate) problem: DecodeProblem,
}

/// What is wrong with a pgoutput message.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DecodeProblem {
    /// The payload was empty.
    #[error("empty payload")]
    Empty,
    /// The first byte is no known message type.
    #[error("unknown message type {0:?}")]
    UnknownType(char),
    /// The payload ended inside a field.
    #[error("{field} needs {needed} bytes but only {left} remain")]
    Truncated {
        /// The field being read.
        field: &'static str,
        /// Bytes the field needs.
        needed: usize,
        /// Bytes left in the payload.
        left: usize,
    },
    /// A string field has no terminating NUL.
    #[error("{0} is not NUL-terminated")]
    Unterminated(&'static str),
    /// A string field is not UTF-8.
    #[error("{0} is not valid UTF-8")]
    NotUtf8(&'static str),
    /// A field holds a value outside its domain.
    #[error("{field} has invalid value {value}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// The value found.
        value: i64,
    },
    /// A one-byte field (a marker, a kind) holds an unknown code.
    #[error("{field} has unexpected code {found:?}")]
    UnexpectedByte {
        /// The field.
        field: &'static str,
        /// The code found, as a character.
        found: char,
    },
    /// Bytes were left after the last field.
    #[error("{0} unexpected bytes after the last field")]
    Trailing(usize),
}

impl Classify for DecodeError {
    /// The walsender and Zipline disagree about the protocol: retrying will not help.
    fn class(&self) -> ErrorClass {
        ErrorClass::Fatal
    }
}

/// Reads big-endian fields from a payload, remembering which message it is in so errors
/// can say where they happened.
pub(super) struct Reader {
    pub(super) buf: Bytes,
    pub(super) pos: usize,
    pub(super) message: &'static str,
}

impl Reader {
    pub(super) fn error(&self, offset: usize, problem: DecodeProblem) -> DecodeError {
        DecodeError {
            message: self.message,
            offset,
            problem,
        }
    }

    /// Moves past the next `n` bytes, returning where they start.
    fn advance(&mut self, n: usize, field: &'static str) -> Result<usize, DecodeError> {
        let left = self.buf.len() - self.pos;
        if n > left {
            return Err(self.error(
                self.pos,
                DecodeProblem::Truncated {
                    field,
                    needed: n,
                    left,
                },
            ));
        }
        let start = self.pos;
        self.pos += n;
        Ok(start)
    }

    /// The next `n` bytes, sharing the payload's buffer.
    pub(super) fn take(&mut self, n: usize, field: &'static str) -> Result<Bytes, DecodeError> {
        let start = self.advance(n, field)?;
        Ok(self.buf.slice(start..start + n))
    }

    /// The next `N` bytes, copied: fixed-width fields need no shared handle on the buffer
    /// (each `Bytes` slice is an atomic reference count taken and dropped).
    pub(super) fn array<const N: usize>(
        &mut self,
        field: &'static str,
    ) -> Result<[u8; N], DecodeError> {
        let start = self.advance(N, field)?;
        let mut out = [0; N];
        out.copy_from_slice(&self.buf[start..start + N]);
        Ok(out)
    }

    pub(super) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    pub(super) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    pub(super) fn i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array(field)?))
    }

    pub(super) fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array(field)?))
    }

    pub(super) fn lsn(&mut self, field: &'static str) -> Result<Lsn, DecodeError> {
        Ok(Lsn::from(u64::from_be_bytes(self.array(field)?)))
    }

    /// A non-negative Int16 or Int32 count or length.
    pub(super) fn count(
        &mut self,
        field: &'static str,
        width: usize,
    ) -> Result<usize, DecodeError> {
        let at = self.pos;
        let n = if width == 2 {
            i64::from(i16::from_be_bytes(self.array(field)?))
        } else {
            i64::from(self.i32(field)?)
        };
        usize::try_from(n).map_err(|_| self.error(at, DecodeProblem::Invalid { field, value: n }))
    }

    pub(super) fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let at = self.pos;
        let len = self.buf[at..]
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| self.error(at, DecodeProblem::Unterminated(field)))?;
        let start = self.advance(len, field)?;
        self.pos += 1;
        String::from_utf8(self.buf[start..start + len].to_vec())
            .map_err(|_| self.error(at, DecodeProblem::NotUtf8(field)))
    }

    /// The xid prefix that rows and relations carry inside a stream block.
    pub(super) fn stream_xid(&mut self, in_stream: bool) -> Result<Option<u32>, DecodeError> {
        in_stream.then(|| self.u32("xid")).transpose()
    }

    /// A TupleData, checked whole and left in place (see [`Tuple`]).
    pub(super) fn tuple(&mut self) -> Result<Tuple, DecodeError> {
        let columns = self.count("column count", 2)?;
        let start = self.pos;
        for _ in 0..columns {
            let at = self.pos;
            match self.u8("column kind")? {
                b'n' | b'u' => {}
                b't' => {
                    let len = self.count("text value length", 4)?;
                    self.advance(len, "text value")?;
                }
                b'b' => {
                    let len = self.count("binary value length", 4)?;
                    self.advance(len, "binary value")?;
                }
                kind => return Err(self.invalid(at, "column kind", kind)),
            }
        }
        Ok(Tuple {
            buf: self.buf.clone(),
            start,
            columns,
        })
    }

    /// A tuple introduced by its one-byte marker, which must be one of `allowed`.
    pub(super) fn marker(
        &mut self,
        field: &'static str,
        allowed: &[u8],
    ) -> Result<u8, DecodeError> {
        let at = self.pos;
        let m = self.u8(field)?;
        if allowed.contains(&m) {
            Ok(m)
        } else {
            Err(self.invalid(at, field, m))
        }
    }

    pub(super) fn old_tuple(&mut self, marker: u8) -> Result<OldTuple, DecodeError> {
        let tuple = self.tuple()?;
        Ok(if marker == b'K' {
            OldTuple::Key(tuple)
        } else {
            OldTuple::Full(tuple)
        })
    }

    pub(super) fn invalid(&self, at: usize, field: &'static str, found: u8) -> DecodeError {
        let found = char::from(found);
        self.error(at, DecodeProblem::UnexpectedByte { field, found })
    }

    pub(super) fn finish(self) -> Result<(), DecodeError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            n => Err(self.error(self.pos, DecodeProblem::Trailing(n))),
        }
    }
}
