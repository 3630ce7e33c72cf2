//! The contract's types as the host passes them to and from a guest, with the two lists that
//! carry a batch — `values` and `changes` — written and read by hand in the canonical ABI's
//! layout.
//!
//! Why by hand: a batch of 1,000 eight-column changes is 9,000 `value`s and 1,000 `change`s.
//! wasmtime's derived lowering writes a variant or record field by field, and each field looks
//! the guest's memory up again through the store and the variant's case types up through the
//! component's type tables; profiled, that was about a third of a call to a trivial guest. Here
//! a list is written in one pass over one slice of memory (`linear_store_list_to_memory`) and
//! an element is read from the bytes wasmtime hands over (`linear_lift_from_memory`).
//!
//! What keeps this honest:
//! - Type checking is the generated types': [`Packed`] (a value kept in its ABI form) and
//!   [`Change`] check as the WIT's `value` and `change` (so a component whose types differ is
//!   refused at load, as before), and their size, alignment and flat form are the generated
//!   types' too.
//! - The layout is the canonical ABI's
//!   (<https://github.com/WebAssembly/component-model/blob/main/design/mvp/CanonicalABI.md>,
//!   "Alignment" and "Element Size"); compile-time assertions below tie each offset used here
//!   to the size wasmtime computes for the generated type, and the round trip through real
//!   guests (`tests/transforms/guests.rs`: every case, every op, all five example languages)
//!   checks the rest.
//! - Reading validates what wasmtime validates: a discriminant out of range is an error, not a
//!   guess; booleans read any non-zero byte as true, as wasmtime does.
//!
//! Anything that is not one of these two lists (tables, data, errors, the host's `log`) goes
//! through wasmtime's generated code unchanged; the `output` record around them is lifted by
//! [`super::lift`], which first checks its size against `limits.output`.

// The component-model traits are `unsafe` to implement: the implementor vouches that `Lower`
// and `ABI` describe the type. Both are taken from the generated types, which wasmtime derives.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;

use wasmtime::component::__internal::{
    CanonicalAbiInfo, InstanceType, InterfaceType, LiftContext, LowerContext,
};
use wasmtime::component::{ComponentType, Lift, Lower};
use wasmtime::{Result, bail};

use super::bindings::generated::zipline::transform::types as generated;
pub(crate) use generated::{ChangeError, Column, Op, OtherValue, Position, Span, Table};

/// The WIT's `batch`, lowered into a guest.
#[derive(ComponentType, Lower, Clone, Debug, PartialEq)]
#[component(record)]
pub(crate) struct Batch {
    pub(crate) tables: Vec<Table>,
    pub(crate) data: Vec<u8>,
    pub(crate) values: Vec<Packed>,
    pub(crate) changes: Vec<Change>,
}

/// The WIT's `output`, lifted from a guest (by [`super::lift::Returned`]).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Output {
    pub(crate) tables: Vec<Table>,
    pub(crate) data: Vec<u8>,
    pub(crate) values: Vec<Packed>,
    pub(crate) changes: Vec<Change>,
    pub(crate) errors: Vec<ChangeError>,
}

/// The WIT's `value` (see `wit/transform.wit` for each case).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Value {
    Null,
    Boolean(bool),
    Int2(i16),
    Int4(i32),
    Int8(i64),
    Float4(f32),
    Float8(f64),
    Numeric(Span),
    Text(Span),
    Bytes(Span),
    Date(i32),
    Time(i64),
    Timestamp(i64),
    Timestamptz(i64),
    Uuid((u64, u64)),
    Json(Span),
    Other(OtherValue),
    Unchanged,
}

/// The WIT's `change`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Change {
    pub(crate) table: u32,
    pub(crate) op: Op,
    pub(crate) position: Position,
    pub(crate) key: Span,
    pub(crate) old_key: Option<Span>,
    pub(crate) values: Span,
}

/// Both directions between [`Value`] and the generated type, whose cases have the same names.
macro_rules! same_cases {
    ($($unit:ident),* ; $($case:ident),*) => {
        impl From<Value> for generated::Value {
            fn from(v: Value) -> Self {
                match v {
                    $(Value::$unit => Self::$unit,)*
                    $(Value::$case(x) => Self::$case(x),)*
                }
            }
        }
        impl From<generated::Value> for Value {
            fn from(v: generated::Value) -> Self {
                match v {
                    $(generated::Value::$unit => Self::$unit,)*
                    $(generated::Value::$case(x) => Self::$case(x),)*
                }
            }
        }
    };
}

same_cases!(Null, Unchanged; Boolean, Int2, Int4, Int8, Float4, Float8, Numeric, Text, Bytes,
    Date, Time, Timestamp, Timestamptz, Uuid, Json, Other);

/// Both directions between [`Change`] and the generated type, whose fields are the same.
macro_rules! same_fields {
    ($($field:ident),*) => {
        impl From<Change> for generated::Change {
            fn from(c: Change) -> Self {
                let Change { $($field),* } = c;
                Self { $($field),* }
            }
        }
        impl From<generated::Change> for Change {
            fn from(c: generated::Change) -> Self {
                let generated::Change { $($field),* } = c;
                Self { $($field),* }
            }
        }
    };
}

same_fields!(table, op, position, key, old_key, values);

// The layout this file writes, checked against what wasmtime computes for the generated types.
// `value`: a u8 discriminant (18 cases), then the payload at 8 (the widest case, `uuid`, is
// two u64s): 24 bytes, aligned to 8.
const VALUE_SIZE: usize = 24;
// `change`: table u32 @0, op u8 @4, position {u64 @8, u64 @16, u32 @24} (24 bytes, align 8),
// key span @32, old-key option<span> {u8 @40, span @44}, values span @52: 60 bytes, rounded
// up to the alignment of 8.
const CHANGE_SIZE: usize = 64;
const _: () = {
    assert!(<generated::Value as ComponentType>::SIZE32 == VALUE_SIZE);
    assert!(<generated::Value as ComponentType>::ALIGN32 == 8);
    assert!(<generated::Change as ComponentType>::SIZE32 == CHANGE_SIZE);
    assert!(<generated::Change as ComponentType>::ALIGN32 == 8);
    assert!(<Position as ComponentType>::SIZE32 == 24);
    assert!(<Span as ComponentType>::SIZE32 == 8);
    assert!(<Option<Span> as ComponentType>::SIZE32 == 12);
    assert!(<OtherValue as ComponentType>::SIZE32 == 12);
};

/// Little-endian writes and reads at fixed offsets of one element's bytes.
struct Writer<'a>(&'a mut [u8]);

impl Writer<'_> {
    fn put(&mut self, at: usize, b: &[u8]) {
        self.0[at..at + b.len()].copy_from_slice(b);
    }
    fn span(&mut self, at: usize, s: Span) {
        self.put(at, &s.start.to_le_bytes());
        self.put(at + 4, &s.len.to_le_bytes());
    }
}

fn get<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(&b[at..at + N]);
    out
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(get(b, at))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(get(b, at))
}
fn span_at(b: &[u8], at: usize) -> Span {
    Span {
        start: u32_at(b, at),
        len: u32_at(b, at + 4),
    }
}

/// A `value` as the host keeps it for a call: its canonical-ABI form, the 24 bytes a guest
/// reads and writes, as three little-endian words (the discriminant in the low byte of the
/// first, the payload from the second on). Lowering a list of them is a copy, and lifting
/// one is three loads and a range check: a decoded enum returned through wasmtime's
/// per-element loop was stored bytewise and reloaded wordwise, a store-forwarding stall per
/// value. [`Packed::get`] decodes; bytes a case does not use are ignored, as the ABI says.
#[derive(Clone, Copy)]
pub(crate) struct Packed([u64; 3]);

/// The discriminant of `unchanged`, the last of the WIT's 18 cases.
const UNCHANGED: u8 = 17;

impl Packed {
    pub(crate) fn new(v: Value) -> Packed {
        let span = |s: Span| u64::from(s.start) | (u64::from(s.len) << 32);
        let (case, a, b) = match v {
            Value::Null => (0, 0, 0),
            Value::Boolean(x) => (1, u64::from(x), 0),
            Value::Int2(i) => (2, u64::from(i as u16), 0),
            Value::Int4(i) => (3, u64::from(i as u32), 0),
            Value::Int8(i) => (4, i as u64, 0),
            Value::Float4(f) => (5, u64::from(f.to_bits()), 0),
            Value::Float8(f) => (6, f.to_bits(), 0),
            Value::Numeric(s) => (7, span(s), 0),
            Value::Text(s) => (8, span(s), 0),
            Value::Bytes(s) => (9, span(s), 0),
            Value::Date(d) => (10, u64::from(d as u32), 0),
            Value::Time(t) => (11, t as u64, 0),
            Value::Timestamp(t) => (12, t as u64, 0),
            Value::Timestamptz(t) => (13, t as u64, 0),
            Value::Uuid((hi, lo)) => (14, hi, lo),
            Value::Json(s) => (15, span(s), 0),
            Value::Other(o) => (
                16,
                u64::from(o.type_oid) | (u64::from(o.text.start) << 32),
                u64::from(o.text.len),
            ),
            Value::Unchanged => (UNCHANGED.into(), 0, 0),
        };
        Packed([case, a, b])
    }

    pub(crate) fn get(self) -> Value {
        let [case, a, b] = self.0;
        let span = Span {
            start: a as u32,
            len: (a >> 32) as u32,
        };
        match case as u8 {
            0 => Value::Null,
            1 => Value::Boolean(a as u8 != 0),
            2 => Value::Int2(a as u16 as i16),
            3 => Value::Int4(a as u32 as i32),
            4 => Value::Int8(a as i64),
            5 => Value::Float4(f32::from_bits(a as u32)),
            6 => Value::Float8(f64::from_bits(a)),
            7 => Value::Numeric(span),
            8 => Value::Text(span),
            9 => Value::Bytes(span),
            10 => Value::Date(a as u32 as i32),
            11 => Value::Time(a as i64),
            12 => Value::Timestamp(a as i64),
            13 => Value::Timestamptz(a as i64),
            14 => Value::Uuid((a, b)),
            15 => Value::Json(span),
            16 => Value::Other(OtherValue {
                type_oid: a as u32,
                text: Span {
                    start: (a >> 32) as u32,
                    len: b as u32,
                },
            }),
            // `UNCHANGED`, and nothing else: `read` refused the rest.
            _ => Value::Unchanged,
        }
    }

    pub(crate) fn is_unchanged(self) -> bool {
        self.0[0] as u8 == UNCHANGED
    }

    fn write(&self, dst: &mut [u8]) {
        for (d, w) in dst.chunks_exact_mut(8).zip(self.0) {
            d.copy_from_slice(&w.to_le_bytes());
        }
    }

    fn read(b: &[u8]) -> Result<Packed> {
        let p = Packed([u64_at(b, 0), u64_at(b, 8), u64_at(b, 16)]);
        let case = p.0[0] as u8;
        if case > UNCHANGED {
            bail!("invalid `value` discriminant {case}");
        }
        Ok(p)
    }
}

impl From<Value> for Packed {
    fn from(v: Value) -> Packed {
        Packed::new(v)
    }
}

impl From<Packed> for generated::Value {
    fn from(p: Packed) -> Self {
        p.get().into()
    }
}

impl From<generated::Value> for Packed {
    fn from(v: generated::Value) -> Self {
        Packed::new(v.into())
    }
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

/// Equal when they decode equal: the bytes a case leaves unused may differ.
impl PartialEq for Packed {
    fn eq(&self, other: &Packed) -> bool {
        self.get() == other.get()
    }
}

impl Change {
    fn write(&self, dst: &mut [u8]) {
        let mut d = Writer(dst);
        d.put(0, &self.table.to_le_bytes());
        d.0[4] = match self.op {
            Op::Insert => 0,
            Op::Update => 1,
            Op::Delete => 2,
            Op::Truncate => 3,
        };
        d.put(8, &self.position.lsn_high.to_le_bytes());
        d.put(16, &self.position.lsn_low.to_le_bytes());
        d.put(24, &self.position.ordinal.to_le_bytes());
        d.span(32, self.key);
        match self.old_key {
            None => d.0[40] = 0,
            Some(s) => {
                d.0[40] = 1;
                d.span(44, s);
            }
        }
        d.span(52, self.values);
    }

    fn read(b: &[u8]) -> Result<Change> {
        Ok(Change {
            table: u32_at(b, 0),
            op: match b[4] {
                0 => Op::Insert,
                1 => Op::Update,
                2 => Op::Delete,
                3 => Op::Truncate,
                n => bail!("invalid `op` discriminant {n}"),
            },
            position: Position {
                lsn_high: u64_at(b, 8),
                lsn_low: u64_at(b, 16),
                ordinal: u32_at(b, 24),
            },
            key: span_at(b, 32),
            old_key: match b[40] {
                0 => None,
                1 => Some(span_at(b, 44)),
                n => bail!("invalid `option` discriminant {n} in a change's old-key"),
            },
            values: span_at(b, 52),
        })
    }
}

/// `ComponentType`, `Lower` and `Lift` for a hand-laid-out type `$t` standing for the
/// generated `$g`: checking, size and flat form are `$g`'s; memory goes through `$t::write`
/// and `$t::read`, a whole list at a time on the way in.
macro_rules! by_hand {
    ($t:ty, $g:ty, $size:expr) => {
        // SAFETY: `Lower` and `ABI` are those of the generated type, which has the same WIT type
        // (`typecheck` is its own), and flat values go through it.
        unsafe impl ComponentType for $t {
            type Lower = <$g as ComponentType>::Lower;
            const ABI: CanonicalAbiInfo = <$g as ComponentType>::ABI;
            const MAY_REQUIRE_REALLOC: bool = false;

            fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> Result<()> {
                <$g as ComponentType>::typecheck(ty, types)
            }
        }

        // SAFETY: writes stay inside the `SIZE32` bytes per element that wasmtime reserved.
        unsafe impl Lower for $t {
            fn linear_lower_to_flat<T>(
                &self,
                cx: &mut LowerContext<'_, T>,
                ty: InterfaceType,
                dst: &mut MaybeUninit<Self::Lower>,
            ) -> Result<()> {
                <$g>::from(*self).linear_lower_to_flat(cx, ty, dst)
            }

            fn linear_lower_to_memory<T>(
                &self,
                cx: &mut LowerContext<'_, T>,
                _ty: InterfaceType,
                offset: usize,
            ) -> Result<()> {
                self.write(cx.get::<{ $size }>(offset));
                Ok(())
            }

            fn linear_store_list_to_memory<T>(
                cx: &mut LowerContext<'_, T>,
                _ty: InterfaceType,
                offset: usize,
                items: &[Self],
            ) -> Result<()> {
                // wasmtime checked `offset` and the list's length against memory already.
                let dst = &mut cx.as_slice_mut()[offset..][..items.len() * $size];
                for (d, item) in dst.chunks_exact_mut($size).zip(items) {
                    item.write(d);
                }
                Ok(())
            }
        }

        // SAFETY: reads only the element's own bytes, as given.
        unsafe impl Lift for $t {
            fn linear_lift_from_flat(
                cx: &mut LiftContext<'_>,
                ty: InterfaceType,
                src: &Self::Lower,
            ) -> Result<Self> {
                <$g as Lift>::linear_lift_from_flat(cx, ty, src).map(Self::from)
            }

            fn linear_lift_from_memory(
                _cx: &mut LiftContext<'_>,
                _ty: InterfaceType,
                bytes: &[u8],
            ) -> Result<Self> {
                Self::read(bytes)
            }
        }
    };
}

by_hand!(Packed, generated::Value, VALUE_SIZE);
by_hand!(Change, generated::Change, CHANGE_SIZE);

#[cfg(test)]
mod tests {
    use super::*;

    fn every_value() -> Vec<Value> {
        let s = Span { start: 7, len: 3 };
        vec![
            Value::Null,
            Value::Boolean(true),
            Value::Boolean(false),
            Value::Int2(-2),
            Value::Int4(-4_000_000),
            Value::Int8(i64::MIN),
            Value::Float4(-1.5),
            Value::Float8(f64::NAN),
            Value::Numeric(s),
            Value::Text(Span {
                start: u32::MAX,
                len: 1,
            }),
            Value::Bytes(s),
            Value::Date(-1),
            Value::Time(86_399_999_999),
            Value::Timestamp(-5),
            Value::Timestamptz(i64::MAX),
            Value::Uuid((u64::MAX - 1, 2)),
            Value::Json(s),
            Value::Other(OtherValue {
                type_oid: 3802,
                text: s,
            }),
            Value::Unchanged,
        ]
    }

    #[test]
    fn values_read_back_as_written() {
        for v in every_value() {
            let mut b = [0xAA; VALUE_SIZE];
            Packed::new(v).write(&mut b);
            let back = Packed::read(&b).expect("a written value reads").get();
            // NaN != NaN: compare bits.
            assert_eq!(format!("{back:?}"), format!("{v:?}"));
        }
    }

    #[test]
    fn bytes_a_case_does_not_use_are_ignored() {
        // As a guest may leave them: whatever its allocator's memory held.
        let mut b = [0xAA; VALUE_SIZE];
        b[0] = 2;
        b[8..10].copy_from_slice(&(-3i16).to_le_bytes());
        assert_eq!(Packed::read(&b).unwrap().get(), Value::Int2(-3));
        b[0] = 1;
        b[8] = 2;
        assert_eq!(Packed::read(&b).unwrap().get(), Value::Boolean(true));
        b[0] = 17;
        assert!(Packed::read(&b).unwrap().is_unchanged());
        b[0] = 10;
        b[8..12].copy_from_slice(&(-719_162i32).to_le_bytes());
        assert_eq!(Packed::read(&b).unwrap().get(), Value::Date(-719_162));
        b[0] = 16;
        b[8..20].copy_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0]);
        let text = Span { start: 2, len: 3 };
        let other = Value::Other(OtherValue { type_oid: 1, text });
        assert_eq!(Packed::read(&b).unwrap().get(), other);
    }

    #[test]
    fn changes_read_back_as_written() {
        for (op, old_key) in [
            (Op::Insert, None),
            (Op::Update, Some(Span { start: 9, len: 2 })),
            (Op::Delete, None),
            (Op::Truncate, None),
        ] {
            let c = Change {
                table: 3,
                op,
                position: Position {
                    lsn_high: 1,
                    lsn_low: u64::MAX,
                    ordinal: 77,
                },
                key: Span { start: 1, len: 1 },
                old_key,
                values: Span { start: 4, len: 8 },
            };
            let mut b = [0x55; CHANGE_SIZE];
            c.write(&mut b);
            assert_eq!(Change::read(&b).expect("a written change reads"), c);
        }
    }

    #[test]
    fn bad_discriminants_are_errors() {
        let mut b = [0; VALUE_SIZE];
        b[0] = 18;
        // Only the low byte is the discriminant; the rest of the word is padding.
        b[1] = 0xff;
        let e = Packed::read(&b).expect_err("18 is past the last case");
        assert!(
            e.to_string().contains("invalid `value` discriminant 18"),
            "{e}"
        );
        let mut c = [0; CHANGE_SIZE];
        c[4] = 4;
        assert!(Change::read(&c).is_err());
        c[4] = 0;
        c[40] = 2;
        let e = Change::read(&c).expect_err("2 is no option");
        assert!(e.to_string().contains("old-key"), "{e}");
    }

    #[test]
    fn generated_conversions_keep_every_case() {
        for v in every_value() {
            let back = Packed::from(generated::Value::from(Packed::new(v))).get();
            assert_eq!(format!("{back:?}"), format!("{v:?}"));
        }
    }
}
