//! Decoder for pgoutput logical replication messages, and the relation cache that turns
//! row messages into [`Change`]s.
//!
//! Each XLogData (`w`) payload from the walsender holds exactly one pgoutput message; its
//! layout is in PostgreSQL's "Logical Replication Message Formats"
//! (<https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html>).
//! A transaction arrives as `Begin`, then `Relation`/`Type` messages describing any table
//! or type whose shape the walsender has not yet sent on this connection, then
//! `Insert`/`Update`/`Delete`/`Truncate`, then `Commit`.
//!
//! With protocol version 2 and `streaming` on, a large in-progress transaction is sent in
//! blocks between `Stream Start` and `Stream Stop`, and finished by `Stream Commit` or
//! `Stream Abort`. Inside a block, Relation, Type, Insert, Update, Delete, Truncate and
//! Message carry the transaction's xid right after the type byte. Nothing in the message
//! says whether that prefix is there, so the caller tracks the blocks and tells [`decode`].
//!
//! Decoding is strict — a message must be consumed exactly — so a wrong `in_stream` flag
//! or a protocol mismatch shows up as a [`DecodeError`] rather than as garbled rows.
//! Values stay zero-copy slices of the payload until [`Relations::build_change`] parses
//! them with [`super::types::parse_text`].

use bytes::Bytes;

use crate::change::{Column, Lsn};

mod reader;
mod relations;

use reader::Reader;
pub(crate) use reader::{DecodeError, DecodeProblem};
pub(crate) use relations::{ChangeError, KeyHints, Known, Relations};

/// One decoded pgoutput message.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PgOutput {
    /// Start of a (non-streamed) transaction.
    Begin {
        /// LSN of the transaction's commit record.
        final_lsn: Lsn,
        /// Commit time, microseconds since 2000-01-01 UTC.
        commit_time: i64,
        /// Transaction id.
        xid: u32,
    },
    /// End of a (non-streamed) transaction.
    Commit {
        /// Currently unused by PostgreSQL (0).
        flags: u8,
        /// LSN of the commit record.
        commit_lsn: Lsn,
        /// LSN just past the commit record: where to resume after this transaction.
        end_lsn: Lsn,
        /// Commit time, microseconds since 2000-01-01 UTC.
        commit_time: i64,
    },
    /// The transaction came to this server from another through replication origin `name`.
    Origin {
        /// Commit LSN on the origin server.
        commit_lsn: Lsn,
        /// Origin name.
        name: String,
    },
    /// A table's shape.
    Relation(RelationBody),
    /// A non-built-in type used by a column.
    Type {
        /// Streamed transaction's xid, inside a stream block.
        xid: Option<u32>,
        /// Type OID.
        type_oid: u32,
        /// Schema, empty for `pg_catalog`.
        namespace: String,
        /// Type name.
        name: String,
    },
    /// A new row.
    Insert {
        /// Streamed transaction's xid, inside a stream block.
        xid: Option<u32>,
        /// Relation id, as in the preceding Relation message.
        rel_id: u32,
        /// The row.
        new: Tuple,
    },
    /// A changed row.
    Update {
        /// Streamed transaction's xid, inside a stream block.
        xid: Option<u32>,
        /// Relation id.
        rel_id: u32,
        /// The old key or old row, when the replica identity requires sending it.
        old: Option<OldTuple>,
        /// The new row; unchanged TOASTed columns are [`TupleValue::Unchanged`].
        new: Tuple,
    },
    /// A removed row.
    Delete {
        /// Streamed transaction's xid, inside a stream block.
        xid: Option<u32>,
        /// Relation id.
        rel_id: u32,
        /// The removed row's key or whole row.
        old: OldTuple,
    },
    /// One `TRUNCATE` statement, covering every published table it truncated.
    Truncate {
        /// Streamed transaction's xid, inside a stream block.
        xid: Option<u32>,
        /// Bit 1: `CASCADE`; bit 2: `RESTART IDENTITY`.
        options: u8,
        /// Relation ids of the truncated tables.
        rel_ids: Vec<u32>,
    },
    /// A `pg_logical_emit_message` message.
    Message {
        /// Streamed transaction's xid, inside a stream block.
        xid: Option<u32>,
        /// Emitted inside the transaction (rather than immediately).
        transactional: bool,
        /// LSN of the message.
        lsn: Lsn,
        /// Message prefix.
        prefix: String,
        /// Message content.
        content: Bytes,
    },
    /// Start of a block of a streamed in-progress transaction.
    StreamStart {
        /// The streamed transaction.
        xid: u32,
        /// This is the transaction's first block.
        first_segment: bool,
    },
    /// End of a block of a streamed transaction.
    StreamStop,
    /// A streamed transaction committed.
    StreamCommit {
        /// The streamed transaction.
        xid: u32,
        /// Currently unused by PostgreSQL (0).
        flags: u8,
        /// LSN of the commit record.
        commit_lsn: Lsn,
        /// LSN just past the commit record.
        end_lsn: Lsn,
        /// Commit time, microseconds since 2000-01-01 UTC.
        commit_time: i64,
    },
    /// A streamed transaction, or one of its subtransactions, aborted.
    StreamAbort {
        /// The streamed (top-level) transaction.
        xid: u32,
        /// The aborted subtransaction; equal to `xid` when the whole transaction aborted.
        subxid: u32,
    },
}

/// The body of a Relation message.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RelationBody {
    /// Streamed transaction's xid, inside a stream block.
    pub(crate) xid: Option<u32>,
    /// Relation id (the table's OID).
    pub(crate) rel_id: u32,
    /// Schema, empty for `pg_catalog`.
    pub(crate) namespace: String,
    /// Table name.
    pub(crate) name: String,
    /// `REPLICA IDENTITY` setting.
    pub(crate) replica_identity: ReplicaIdentity,
    /// Published columns in table order; `is_key` marks replica identity columns.
    pub(crate) columns: Vec<Column>,
}

/// A table's `REPLICA IDENTITY`: which old values an update or delete carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplicaIdentity {
    /// `d`: the primary key, if any.
    Default,
    /// `n`: nothing.
    Nothing,
    /// `f`: every column.
    Full,
    /// `i`: the columns of a chosen unique index.
    Index,
}

/// One column value in a TupleData, borrowed from the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TupleValue<'a> {
    /// SQL NULL.
    Null,
    /// A TOASTed value the change did not touch; its value is not sent.
    Unchanged,
    /// Text output format.
    Text(&'a [u8]),
    /// Binary format (only with the `binary` option, which Zipline does not use).
    Binary(&'a [u8]),
}

/// A TupleData, left in place in its message: checked whole when the message is decoded, its
/// values read when the change is built. One handle on the message per tuple, where a handle
/// per value would take and drop an atomic reference count for every column.
#[derive(Clone)]
pub(crate) struct Tuple {
    /// The message; the tuple's values start at `start`.
    buf: Bytes,
    start: usize,
    columns: usize,
}

impl Tuple {
    /// Number of columns.
    pub(crate) fn len(&self) -> usize {
        self.columns
    }

    /// The values in column order.
    pub(crate) fn values(&self) -> TupleValues<'_> {
        TupleValues {
            rest: &self.buf[self.start..],
            left: self.columns,
        }
    }
}

impl PartialEq for Tuple {
    fn eq(&self, other: &Self) -> bool {
        self.columns == other.columns && self.values().eq(other.values())
    }
}

impl std::fmt::Debug for Tuple {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.values()).finish()
    }
}

/// The values of a [`Tuple`], in column order.
#[derive(Debug, Clone)]
pub(crate) struct TupleValues<'a> {
    rest: &'a [u8],
    left: usize,
}

impl<'a> Iterator for TupleValues<'a> {
    type Item = TupleValue<'a>;

    fn next(&mut self) -> Option<TupleValue<'a>> {
        // The layout was checked by `Reader::tuple`, so only a bug could end this early.
        self.left = self.left.checked_sub(1)?;
        let (&kind, rest) = self.rest.split_first()?;
        let value = match kind {
            b'n' => TupleValue::Null,
            b'u' => TupleValue::Unchanged,
            _ => {
                let (len, rest) = rest.split_first_chunk::<4>()?;
                let (value, rest) = rest.split_at_checked(u32::from_be_bytes(*len) as usize)?;
                self.rest = rest;
                return Some(if kind == b't' {
                    TupleValue::Text(value)
                } else {
                    TupleValue::Binary(value)
                });
            }
        };
        self.rest = rest;
        Some(value)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left))
    }
}

/// The old values carried by an update or delete.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum OldTuple {
    /// `K`: the old replica identity key; every other column is null.
    Key(Tuple),
    /// `O`: the whole old row (`REPLICA IDENTITY FULL`).
    Full(Tuple),
}

impl OldTuple {
    fn tuple(&self) -> &Tuple {
        match self {
            OldTuple::Key(t) | OldTuple::Full(t) => t,
        }
    }
}

fn message_name(tag: u8) -> &'static str {
    match tag {
        b'B' => "Begin",
        b'C' => "Commit",
        b'O' => "Origin",
        b'R' => "Relation",
        b'Y' => "Type",
        b'I' => "Insert",
        b'U' => "Update",
        b'D' => "Delete",
        b'T' => "Truncate",
        b'M' => "Message",
        b'S' => "Stream Start",
        b'E' => "Stream Stop",
        b'c' => "Stream Commit",
        b'A' => "Stream Abort",
        _ => "unknown",
    }
}

/// Decodes one pgoutput message. `in_stream` must be true exactly between a Stream Start
/// and the following Stream Stop.
pub(crate) fn decode(buf: Bytes, in_stream: bool) -> Result<PgOutput, DecodeError> {
    let Some(&tag) = buf.first() else {
        return Err(DecodeError {
            message: "unknown",
            offset: 0,
            problem: DecodeProblem::Empty,
        });
    };
    let mut r = Reader {
        buf,
        pos: 1,
        message: message_name(tag),
    };
    let msg = match tag {
        b'B' => PgOutput::Begin {
            final_lsn: r.lsn("final_lsn")?,
            commit_time: r.i64("commit timestamp")?,
            xid: r.u32("xid")?,
        },
        b'C' => PgOutput::Commit {
            flags: r.u8("flags")?,
            commit_lsn: r.lsn("commit_lsn")?,
            end_lsn: r.lsn("end_lsn")?,
            commit_time: r.i64("commit timestamp")?,
        },
        b'O' => PgOutput::Origin {
            commit_lsn: r.lsn("origin commit_lsn")?,
            name: r.string("origin name")?,
        },
        b'R' => PgOutput::Relation(decode_relation(&mut r, in_stream)?),
        b'Y' => PgOutput::Type {
            xid: r.stream_xid(in_stream)?,
            type_oid: r.u32("type OID")?,
            namespace: r.string("namespace")?,
            name: r.string("type name")?,
        },
        b'I' => {
            let xid = r.stream_xid(in_stream)?;
            let rel_id = r.u32("relation id")?;
            r.marker("new tuple marker", b"N")?;
            PgOutput::Insert {
                xid,
                rel_id,
                new: r.tuple()?,
            }
        }
        b'U' => {
            let xid = r.stream_xid(in_stream)?;
            let rel_id = r.u32("relation id")?;
            let marker = r.marker("tuple marker", b"KON")?;
            let old = if marker == b'N' {
                None
            } else {
                let old = r.old_tuple(marker)?;
                r.marker("new tuple marker", b"N")?;
                Some(old)
            };
            PgOutput::Update {
                xid,
                rel_id,
                old,
                new: r.tuple()?,
            }
        }
        b'D' => {
            let xid = r.stream_xid(in_stream)?;
            let rel_id = r.u32("relation id")?;
            let marker = r.marker("old tuple marker", b"KO")?;
            PgOutput::Delete {
                xid,
                rel_id,
                old: r.old_tuple(marker)?,
            }
        }
        b'T' => {
            let xid = r.stream_xid(in_stream)?;
            let n = r.count("relation count", 4)?;
            let options = r.u8("options")?;
            // Cap the reservation by what the payload can hold, whatever the count claims.
            let mut rel_ids = Vec::with_capacity(n.min(r.buf.len() / 4));
            for _ in 0..n {
                rel_ids.push(r.u32("relation id")?);
            }
            PgOutput::Truncate {
                xid,
                options,
                rel_ids,
            }
        }
        b'M' => {
            let xid = r.stream_xid(in_stream)?;
            let flags = r.u8("flags")?;
            let lsn = r.lsn("message lsn")?;
            let prefix = r.string("prefix")?;
            let len = r.count("content length", 4)?;
            PgOutput::Message {
                xid,
                transactional: flags & 1 != 0,
                lsn,
                prefix,
                content: r.take(len, "content")?,
            }
        }
        b'S' => PgOutput::StreamStart {
            xid: r.u32("xid")?,
            first_segment: r.u8("first segment flag")? == 1,
        },
        b'E' => PgOutput::StreamStop,
        b'c' => PgOutput::StreamCommit {
            xid: r.u32("xid")?,
            flags: r.u8("flags")?,
            commit_lsn: r.lsn("commit_lsn")?,
            end_lsn: r.lsn("end_lsn")?,
            commit_time: r.i64("commit timestamp")?,
        },
        b'A' => {
            let msg = PgOutput::StreamAbort {
                xid: r.u32("xid")?,
                subxid: r.u32("subtransaction xid")?,
            };
            // Protocol 4 with parallel streaming appends the abort LSN and time; skip them.
            if r.buf.len() - r.pos == 16 {
                r.take(16, "abort lsn and timestamp")?;
            }
            msg
        }
        other => {
            return Err(r.error(0, DecodeProblem::UnknownType(char::from(other))));
        }
    };
    r.finish()?;
    Ok(msg)
}

fn decode_relation(r: &mut Reader, in_stream: bool) -> Result<RelationBody, DecodeError> {
    let xid = r.stream_xid(in_stream)?;
    let rel_id = r.u32("relation id")?;
    let namespace = r.string("namespace")?;
    let name = r.string("relation name")?;
    let at = r.pos;
    let replica_identity = match r.u8("replica identity")? {
        b'd' => ReplicaIdentity::Default,
        b'n' => ReplicaIdentity::Nothing,
        b'f' => ReplicaIdentity::Full,
        b'i' => ReplicaIdentity::Index,
        other => return Err(r.invalid(at, "replica identity", other)),
    };
    let n = r.count("column count", 2)?;
    let mut columns = Vec::with_capacity(n);
    for _ in 0..n {
        let flags = r.u8("column flags")?;
        columns.push(Column {
            name: r.string("column name")?,
            type_oid: r.u32("column type OID")?,
            type_modifier: r.i32("column type modifier")?,
            is_key: flags & 1 != 0,
        });
    }
    Ok(RelationBody {
        xid,
        rel_id,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

impl PgOutput {
    /// For a message that belongs to a transaction streamed before commit (it carries an xid
    /// because it was sent inside a Stream Start/Stop block): that (sub)transaction's xid.
    pub(crate) fn stream_xid(&self) -> Option<u32> {
        match self {
            PgOutput::Relation(body) => body.xid,
            PgOutput::Type { xid, .. }
            | PgOutput::Insert { xid, .. }
            | PgOutput::Update { xid, .. }
            | PgOutput::Delete { xid, .. }
            | PgOutput::Truncate { xid, .. }
            | PgOutput::Message { xid, .. } => *xid,
            _ => None,
        }
    }

    /// The message type's name, for logs and errors.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            PgOutput::Begin { .. } => "Begin",
            PgOutput::Commit { .. } => "Commit",
            PgOutput::Origin { .. } => "Origin",
            PgOutput::Relation(_) => "Relation",
            PgOutput::Type { .. } => "Type",
            PgOutput::Insert { .. } => "Insert",
            PgOutput::Update { .. } => "Update",
            PgOutput::Delete { .. } => "Delete",
            PgOutput::Truncate { .. } => "Truncate",
            PgOutput::Message { .. } => "Message",
            PgOutput::StreamStart { .. } => "Stream Start",
            PgOutput::StreamStop => "Stream Stop",
            PgOutput::StreamCommit { .. } => "Stream Commit",
            PgOutput::StreamAbort { .. } => "Stream Abort",
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::error::{Classify, ErrorClass};

    /// A piece of a hand-built payload, encoded as the walsender would.
    #[derive(Clone, Copy)]
    pub(in crate::source::postgres) enum P<'a> {
        /// Int8 / Byte1.
        B(u8),
        /// Int16.
        H(i16),
        /// Int32 (signed).
        I(i32),
        /// Int32 (unsigned: OIDs, xids).
        W(u32),
        /// Int64.
        L(u64),
        /// NUL-terminated string.
        S(&'a str),
        /// TupleData: `None` is null, [`U`] unchanged TOAST, other strings text values.
        T(&'a [Option<&'a str>]),
    }
    use P::*;

    /// Marks an unchanged TOAST value in [`P::T`].
    pub(in crate::source::postgres) const U: Option<&str> = Some("\u{0}u");

    pub(in crate::source::postgres) fn wire(parts: &[P]) -> Bytes {
        let mut out = Vec::new();
        for part in parts {
            match *part {
                B(v) => out.push(v),
                H(v) => out.extend(v.to_be_bytes()),
                I(v) => out.extend(v.to_be_bytes()),
                W(v) => out.extend(v.to_be_bytes()),
                L(v) => out.extend(v.to_be_bytes()),
                S(s) => out.extend(s.bytes().chain([0])),
                T(values) => {
                    out.extend((values.len() as i16).to_be_bytes());
                    for v in values {
                        match *v {
                            None => out.push(b'n'),
                            U => out.push(b'u'),
                            Some(s) => {
                                out.push(b't');
                                out.extend((s.len() as i32).to_be_bytes());
                                out.extend(s.bytes());
                            }
                        }
                    }
                }
            }
        }
        Bytes::from(out)
    }

    /// Relation 16384 `public.users (id int4 key, name varchar(64), bio text)`.
    pub(in crate::source::postgres) fn users_relation(xid: Option<u32>, identity: u8) -> Bytes {
        let mut parts = vec![B(b'R')];
        parts.extend(xid.map(W));
        parts.extend([W(16_384), S("public"), S("users"), B(identity), H(3)]);
        parts.extend([B(1), S("id"), W(23), I(-1)]);
        parts.extend([B(0), S("name"), W(1043), I(68)]);
        parts.extend([B(0), S("bio"), W(25), I(-1)]);
        wire(&parts)
    }

    fn ok(parts: &[P], in_stream: bool) -> PgOutput {
        decode(wire(parts), in_stream).unwrap_or_else(|e| panic!("{e}"))
    }

    fn err(parts: &[P], in_stream: bool) -> DecodeError {
        decode(wire(parts), in_stream).expect_err("decoded")
    }

    fn text(s: &str) -> TupleValue<'_> {
        TupleValue::Text(s.as_bytes())
    }

    /// A tuple of these values, as a message would carry it.
    fn tuple(values: &[TupleValue<'_>]) -> Tuple {
        let mut buf = Vec::new();
        for v in values {
            match v {
                TupleValue::Null => buf.push(b'n'),
                TupleValue::Unchanged => buf.push(b'u'),
                TupleValue::Text(b) | TupleValue::Binary(b) => {
                    buf.push(if matches!(v, TupleValue::Text(_)) {
                        b't'
                    } else {
                        b'b'
                    });
                    buf.extend_from_slice(&(b.len() as u32).to_be_bytes());
                    buf.extend_from_slice(b);
                }
            }
        }
        Tuple {
            buf: buf.into(),
            start: 0,
            columns: values.len(),
        }
    }

    fn col(name: &str, type_oid: u32, type_modifier: i32, is_key: bool) -> Column {
        let name = name.into();
        Column {
            name,
            type_oid,
            type_modifier,
            is_key,
        }
    }

    #[test]
    fn transaction_framing_messages() {
        let begin = ok(&[B(b'B'), L(0x16_B374_D848), L(7), W(42)], false);
        let final_lsn = Lsn(0x16_B374_D848);
        assert_eq!(
            begin,
            PgOutput::Begin {
                final_lsn,
                commit_time: 7,
                xid: 42
            }
        );
        let commit = ok(&[B(b'C'), B(0), L(10), L(20), L(30)], false);
        let (commit_lsn, end_lsn) = (Lsn(10), Lsn(20));
        let expected = PgOutput::Commit {
            flags: 0,
            commit_lsn,
            end_lsn,
            commit_time: 30,
        };
        assert_eq!(commit, expected);
        let origin = ok(&[B(b'O'), L(5), S("node_a")], false);
        let name = "node_a".into();
        assert_eq!(
            origin,
            PgOutput::Origin {
                commit_lsn: Lsn(5),
                name
            }
        );
    }

    #[test]
    fn relation_and_type_with_and_without_stream_xid() {
        let expected = |xid| {
            PgOutput::Relation(RelationBody {
                xid,
                rel_id: 16_384,
                namespace: "public".into(),
                name: "users".into(),
                replica_identity: ReplicaIdentity::Index,
                columns: vec![
                    col("id", 23, -1, true),
                    col("name", 1043, 68, false),
                    col("bio", 25, -1, false),
                ],
            })
        };
        let plain = users_relation(None, b'i');
        let streamed = users_relation(Some(9), b'i');
        assert_eq!(decode(plain, false).unwrap(), expected(None));
        assert_eq!(decode(streamed.clone(), true).unwrap(), expected(Some(9)));
        // A wrong in_stream flag misreads the message; strict decoding usually notices.
        assert!(decode(streamed, false).is_err());
        let insert = [B(b'I'), W(16_384), B(b'N'), T(&[Some("1")])];
        assert!(decode(wire(&insert), true).is_err());

        let ty = ok(&[B(b'Y'), W(9), W(70_000), S(""), S("mood")], true);
        let (namespace, name) = (String::new(), "mood".into());
        let expected = PgOutput::Type {
            xid: Some(9),
            type_oid: 70_000,
            namespace,
            name,
        };
        assert_eq!(ty, expected);
    }

    #[test]
    fn row_messages() {
        let insert = ok(
            &[B(b'I'), W(16_384), B(b'N'), T(&[Some("1"), None, U])],
            false,
        );
        let new = tuple(&[text("1"), TupleValue::Null, TupleValue::Unchanged]);
        assert_eq!(
            insert,
            PgOutput::Insert {
                xid: None,
                rel_id: 16_384,
                new
            }
        );

        let binary = ok(
            &[
                B(b'I'),
                W(1),
                B(b'N'),
                H(1),
                B(b'b'),
                I(2),
                B(0xde),
                B(0xad),
            ],
            false,
        );
        let new = tuple(&[TupleValue::Binary(&[0xde, 0xad])]);
        assert_eq!(
            binary,
            PgOutput::Insert {
                xid: None,
                rel_id: 1,
                new
            }
        );

        let update = ok(&[B(b'U'), W(7), W(1), B(b'N'), T(&[Some("a")])], true);
        let new = tuple(&[text("a")]);
        assert_eq!(
            update,
            PgOutput::Update {
                xid: Some(7),
                rel_id: 1,
                old: None,
                new
            }
        );

        type Wrap = fn(Tuple) -> OldTuple;
        for (marker, wrap) in [
            (b'K', OldTuple::Key as Wrap),
            (b'O', OldTuple::Full as Wrap),
        ] {
            let old_new = [T(&[Some("old")]), B(b'N'), T(&[Some("new")])];
            let update = ok(&[&[B(b'U'), W(1), B(marker)][..], &old_new].concat(), false);
            let (old, new) = (Some(wrap(tuple(&[text("old")]))), tuple(&[text("new")]));
            assert_eq!(
                update,
                PgOutput::Update {
                    xid: None,
                    rel_id: 1,
                    old,
                    new
                }
            );

            let delete = ok(&[B(b'D'), W(1), B(marker), T(&[Some("x"), None])], false);
            let old = wrap(tuple(&[text("x"), TupleValue::Null]));
            assert_eq!(
                delete,
                PgOutput::Delete {
                    xid: None,
                    rel_id: 1,
                    old
                }
            );
        }

        let truncate = ok(&[B(b'T'), W(3), I(2), B(3), W(10), W(11)], true);
        let rel_ids = vec![10, 11];
        assert_eq!(
            truncate,
            PgOutput::Truncate {
                xid: Some(3),
                options: 3,
                rel_ids
            }
        );
    }

    #[test]
    fn logical_messages() {
        let msg = ok(
            &[B(b'M'), W(5), B(1), L(99), S("zl"), I(2), B(b'h'), B(b'i')],
            true,
        );
        let expected = PgOutput::Message {
            xid: Some(5),
            transactional: true,
            lsn: Lsn(99),
            prefix: "zl".into(),
            content: Bytes::from_static(b"hi"),
        };
        assert_eq!(msg, expected);
        let msg = ok(&[B(b'M'), B(0), L(99), S("p"), I(0)], false);
        assert!(matches!(
            msg,
            PgOutput::Message { xid: None, transactional: false, content, .. } if content.is_empty()
        ));
    }

    #[test]
    fn streaming_messages() {
        let start = ok(&[B(b'S'), W(77), B(1)], false);
        assert_eq!(
            start,
            PgOutput::StreamStart {
                xid: 77,
                first_segment: true
            }
        );
        let start = ok(&[B(b'S'), W(77), B(0)], false);
        assert_eq!(
            start,
            PgOutput::StreamStart {
                xid: 77,
                first_segment: false
            }
        );
        assert_eq!(ok(&[B(b'E')], true), PgOutput::StreamStop);
        let commit = ok(&[B(b'c'), W(77), B(0), L(1), L(2), L(3)], false);
        let (commit_lsn, end_lsn) = (Lsn(1), Lsn(2));
        let expected = PgOutput::StreamCommit {
            xid: 77,
            flags: 0,
            commit_lsn,
            end_lsn,
            commit_time: 3,
        };
        assert_eq!(commit, expected);
        let abort = PgOutput::StreamAbort {
            xid: 77,
            subxid: 78,
        };
        assert_eq!(ok(&[B(b'A'), W(77), W(78)], false), abort);
        // Protocol 4 parallel streaming appends abort LSN and timestamp.
        assert_eq!(ok(&[B(b'A'), W(77), W(78), L(1), L(2)], false), abort);
    }

    #[test]
    fn every_truncation_fails_cleanly() {
        let update = [
            B(b'U'),
            W(1),
            B(b'O'),
            T(&[Some("a"), None, U]),
            B(b'N'),
            T(&[Some("b")]),
        ];
        let valid: [(&[P], bool); 10] = [
            (&[B(b'B'), L(1), L(2), W(3)], false),
            (&[B(b'C'), B(0), L(1), L(2), L(3)], false),
            (&[B(b'O'), L(1), S("o")], false),
            (&[B(b'Y'), W(1), S("s"), S("t")], false),
            (&update, false),
            (&[B(b'D'), W(1), B(b'K'), T(&[Some("a")])], false),
            (&[B(b'T'), I(1), B(0), W(5)], false),
            (&[B(b'M'), B(1), L(1), S("p"), I(1), B(b'x')], false),
            (&[B(b'S'), W(1), B(1)], false),
            (&[B(b'c'), W(1), B(0), L(1), L(2), L(3)], false),
        ];
        let mut payloads: Vec<_> = valid.iter().map(|(p, s)| (wire(p), *s)).collect();
        payloads.push((users_relation(Some(1), b'd'), true));
        for (full, in_stream) in payloads {
            decode(full.clone(), in_stream).expect("valid message");
            for len in 0..full.len() {
                let e = decode(full.slice(..len), in_stream).expect_err("prefix decoded");
                assert!(e.offset <= len, "{e}");
            }
        }
    }

    #[test]
    fn malformed_messages_name_type_offset_and_problem() {
        let e = decode(Bytes::new(), false).unwrap_err();
        assert_eq!(e.problem, DecodeProblem::Empty);
        let e = err(&[B(b'Z'), B(0)], false);
        assert_eq!((e.offset, e.problem), (0, DecodeProblem::UnknownType('Z')));

        let e = err(&[B(b'C'), B(0), L(1), L(2)], false);
        assert_eq!((e.message, e.offset), ("Commit", 18));
        let problem = DecodeProblem::Truncated {
            field: "commit timestamp",
            needed: 8,
            left: 0,
        };
        assert_eq!(e.problem, problem);
        assert!(e.to_string().contains("Commit message at byte 18"), "{e}");
        assert_eq!(e.class(), ErrorClass::Fatal);

        let e = err(&[B(b'E'), B(0)], false);
        assert_eq!((e.offset, e.problem), (1, DecodeProblem::Trailing(1)));

        let unexpected = |field, found| DecodeProblem::UnexpectedByte { field, found };
        let invalid = |field, value| DecodeProblem::Invalid { field, value };
        let truncated = |field, needed, left| DecodeProblem::Truncated {
            field,
            needed,
            left,
        };
        for (parts, offset, problem) in [
            (
                &[B(b'I'), W(1), B(b'K')][..],
                5,
                unexpected("new tuple marker", 'K'),
            ),
            (
                &[B(b'U'), W(1), B(b'K'), T(&[]), B(b'O')],
                8,
                unexpected("new tuple marker", 'O'),
            ),
            (
                &[B(b'D'), W(1), B(b'N'), T(&[])],
                5,
                unexpected("old tuple marker", 'N'),
            ),
            (
                &[B(b'I'), W(1), B(b'N'), H(1), B(b'x')],
                8,
                unexpected("column kind", 'x'),
            ),
            (
                &[B(b'I'), W(1), B(b'N'), H(1), B(b't'), I(-1)],
                9,
                invalid("text value length", -1),
            ),
            (
                &[B(b'I'), W(1), B(b'N'), H(-2)],
                6,
                invalid("column count", -2),
            ),
            (
                &[B(b'T'), I(i32::MAX), B(0), W(1)],
                10,
                truncated("relation id", 4, 0),
            ),
            (
                &[B(b'O'), L(1), B(0xff), B(0)],
                9,
                DecodeProblem::NotUtf8("origin name"),
            ),
            (
                &[B(b'O'), L(1), B(b'a')],
                9,
                DecodeProblem::Unterminated("origin name"),
            ),
        ] {
            let e = err(parts, false);
            assert_eq!((e.offset, e.problem), (offset, problem));
        }
        let e = decode(users_relation(None, b'x'), false).unwrap_err();
        assert_eq!(e.problem, unexpected("replica identity", 'x'));
    }
}
