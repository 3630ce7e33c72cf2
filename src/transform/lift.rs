//! Lifting a `transform` call's result out of the guest under `limits.output`.
//!
//! The limit counts every byte the host copies out of the guest's memory: each list of
//! `output` (tables, data, values, changes, errors) at its size in the canonical ABI, plus every
//! string and column list those hold, plus the message of an `err`. All of that is known from
//! lengths before anything is copied: [`measure`] reads the five lists' lengths and, inside
//! tables and errors, only the lengths of their strings and column lists, so an output over
//! the limit is refused as [`Returned::TooLarge`] without being copied. Lists share no budget
//! trick: a guest may point many lists or strings at the same bytes, and each is counted, as
//! each would be copied.
//!
//! A `Lift` implementation sees no store data, so the call's limit reaches it through
//! [`with_output_limit`], a thread-local set around the call (lifting runs on the calling
//! thread, inside `TypedFunc::call`).
//!
//! Under the limit the lists are lifted by wasmtime's own code (and [`super::abi`]'s for
//! values and changes), which charges the store's hostcall fuel by *host* sizes: up to
//! [`FUEL_PER_BYTE`] times the guest size for tables, columns and errors. [`hostcall_fuel`]
//! sizes that fuel from the limit, so wasmtime's own check (default 128 MiB, "fuel allocated
//! for hostcalls has been exhausted") never fires before Zipline's does.

// `ComponentType` and `Lift` are `unsafe` to implement: the implementor vouches that `Lower`
// and `ABI` describe the type. Both are the generated types', which wasmtime derives.
#![allow(unsafe_code)]

use std::cell::Cell;

use wasmtime::component::__internal::wasmtime_environ::component::StringEncoding;
use wasmtime::component::__internal::{
    CanonicalAbiInfo, InstanceType, InterfaceType, LiftContext, bad_type_info,
};
use wasmtime::component::{ComponentType, Lift};
use wasmtime::{Result, bail};

use super::abi::{self, ChangeError, Column, Output, Packed, Table};
use super::bindings::generated::zipline::transform::types as generated;

/// Guest sizes of the records a `transform` result holds (canonical ABI, 32-bit memory).
const TABLE_SIZE: u64 = 24;
const COLUMN_SIZE: u64 = 20;
const ERROR_SIZE: u64 = 12;
const VALUE_SIZE: u64 = 24;
const CHANGE_SIZE: u64 = 64;
const OUTPUT_SIZE: usize = 40;

/// The most hostcall fuel wasmtime charges per guest byte this module counts: a table is 24
/// bytes in the guest and 72 on the host, a column 20 and 40, an error 12 and 32.
pub(crate) const FUEL_PER_BYTE: u64 = 3;

const _: () = {
    assert!(<generated::Table as ComponentType>::SIZE32 == TABLE_SIZE as usize);
    assert!(<generated::Column as ComponentType>::SIZE32 == COLUMN_SIZE as usize);
    assert!(<generated::ChangeError as ComponentType>::SIZE32 == ERROR_SIZE as usize);
    assert!(<generated::Value as ComponentType>::SIZE32 == VALUE_SIZE as usize);
    assert!(<generated::Change as ComponentType>::SIZE32 == CHANGE_SIZE as usize);
    assert!(<generated::Output as ComponentType>::SIZE32 == OUTPUT_SIZE);
    let fuel = FUEL_PER_BYTE as usize;
    assert!(size_of::<Table>() <= fuel * TABLE_SIZE as usize);
    assert!(size_of::<Column>() <= fuel * COLUMN_SIZE as usize);
    assert!(size_of::<ChangeError>() <= fuel * ERROR_SIZE as usize);
    assert!(size_of::<Packed>() <= fuel * VALUE_SIZE as usize);
    assert!(size_of::<abi::Change>() <= fuel * CHANGE_SIZE as usize);
};

/// wasmtime's own default, kept as a floor: it also bounds what one `log` call may hand over.
const DEFAULT_HOSTCALL_FUEL: u64 = 128 << 20;

/// The store's hostcall fuel for an output limit of `limit` bytes: enough for wasmtime to copy
/// any output this module lets through.
pub(crate) fn hostcall_fuel(limit: u64) -> usize {
    let fuel = limit
        .saturating_mul(FUEL_PER_BYTE)
        .max(DEFAULT_HOSTCALL_FUEL);
    usize::try_from(fuel).unwrap_or(usize::MAX)
}

thread_local! {
    /// The output limit of the call running on this thread; 0 (refuse everything) outside one.
    static LIMIT: Cell<u64> = const { Cell::new(0) };
}

/// Runs `call` with `limit` as the output limit its result is lifted under.
pub(crate) fn with_output_limit<R>(limit: u64, call: impl FnOnce() -> R) -> R {
    struct Restore(u64);
    impl Drop for Restore {
        fn drop(&mut self) {
            LIMIT.set(self.0);
        }
    }
    let _restore = Restore(LIMIT.replace(limit));
    call()
}

/// What lifting an `output` would copy, in guest bytes, and what it is made of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OutputSize {
    /// Everything: the lists at their guest sizes plus their strings and column lists. When
    /// over the limit, counting may have stopped early: then it is a lower bound.
    pub(crate) total: u64,
    pub(crate) tables: u32,
    pub(crate) data: u32,
    pub(crate) values: u32,
    pub(crate) changes: u32,
    pub(crate) errors: u32,
}

impl OutputSize {
    /// The reason an output this size is refused, for `limit`.
    pub(crate) fn refusal(&self, limit: u64) -> String {
        format!(
            "output exceeds the limit of {limit} bytes (limits.output): the guest returned at \
             least {} bytes to copy ({} data bytes, {} values, {} changes, {} tables, {} errors, \
             and their strings); nothing was copied",
            self.total, self.data, self.values, self.changes, self.tables, self.errors
        )
    }
}

/// A `transform` call's `ok` value: the output, or its size when that is over the limit.
#[derive(Debug)]
pub(crate) enum Returned {
    Output(Output),
    TooLarge(OutputSize),
}

/// A `transform` call's `err` value: the message, or its size when that is over the limit.
#[derive(Debug)]
pub(crate) enum Refusal {
    Message(String),
    TooLarge(u64),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

/// Bytes a string of canonical-ABI length `len` occupies in memory.
fn string_bytes(encoding: StringEncoding, len: u32) -> u64 {
    // Compact UTF-16 tags UTF-16 strings with the length's top bit.
    const UTF16_TAG: u32 = 1 << 31;
    match encoding {
        StringEncoding::Utf8 => u64::from(len),
        StringEncoding::Utf16 => 2 * u64::from(len),
        StringEncoding::CompactUtf16 if len & UTF16_TAG != 0 => 2 * u64::from(len ^ UTF16_TAG),
        StringEncoding::CompactUtf16 => u64::from(len),
    }
}

/// Element `i` of `size` bytes of the list at `ptr`, if it lies in `memory`.
fn element(memory: &[u8], ptr: u32, i: u32, size: u64) -> Option<&[u8]> {
    let start = usize::try_from(u64::from(ptr) + u64::from(i) * size).ok()?;
    memory.get(start..start.checked_add(size as usize)?)
}

/// What lifting the `output` whose record is `record` would copy out of `memory`. Stops
/// counting once past `limit`. A list that lies outside memory counts what it claims; lifting
/// it then fails with wasmtime's own message.
pub(crate) fn measure(
    memory: &[u8],
    record: &[u8],
    encoding: StringEncoding,
    limit: u64,
) -> OutputSize {
    let (tables_at, errors_at) = (u32_at(record, 0), u32_at(record, 32));
    let mut size = OutputSize {
        total: 0,
        tables: u32_at(record, 4),
        data: u32_at(record, 12),
        values: u32_at(record, 20),
        changes: u32_at(record, 28),
        errors: u32_at(record, 36),
    };
    size.total = u64::from(size.data)
        + u64::from(size.values) * VALUE_SIZE
        + u64::from(size.changes) * CHANGE_SIZE
        + u64::from(size.tables) * TABLE_SIZE
        + u64::from(size.errors) * ERROR_SIZE;
    let text = |b: &[u8], at| string_bytes(encoding, u32_at(b, at));
    // Each step below adds at least the element's own size, so a scan is bounded by the limit
    // even when a guest points every table at one huge column list.
    'tables: for i in 0..size.tables {
        if size.total > limit {
            return size;
        }
        let Some(t) = element(memory, tables_at, i, TABLE_SIZE) else {
            break;
        };
        let (columns_at, columns) = (u32_at(t, 16), u32_at(t, 20));
        size.total += text(t, 4) + text(t, 12) + u64::from(columns) * COLUMN_SIZE;
        for j in 0..columns {
            if size.total > limit {
                return size;
            }
            let Some(c) = element(memory, columns_at, j, COLUMN_SIZE) else {
                break 'tables;
            };
            size.total += text(c, 4);
        }
    }
    for i in 0..size.errors {
        if size.total > limit {
            return size;
        }
        let Some(e) = element(memory, errors_at, i, ERROR_SIZE) else {
            break;
        };
        size.total += text(e, 8);
    }
    size
}

unsafe impl ComponentType for Returned {
    type Lower = <generated::Output as ComponentType>::Lower;
    const ABI: CanonicalAbiInfo = <generated::Output as ComponentType>::ABI;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> Result<()> {
        <generated::Output as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: reads the record's own bytes and, through `LiftContext::memory`, only inside the
// guest's memory; each field is lifted by its own type's `Lift`.
unsafe impl Lift for Returned {
    fn linear_lift_from_flat(
        _cx: &mut LiftContext<'_>,
        _ty: InterfaceType,
        _src: &Self::Lower,
    ) -> Result<Self> {
        // `result<output, string>` flattens to more values than a result may use, so the
        // canonical ABI always returns it through memory.
        bail!("zipline:transform's output must be returned through memory")
    }

    fn linear_lift_from_memory(
        cx: &mut LiftContext<'_>,
        ty: InterfaceType,
        bytes: &[u8],
    ) -> Result<Self> {
        let limit = LIMIT.get();
        let size = measure(cx.memory(), bytes, cx.options().string_encoding, limit);
        if size.total > limit {
            return Ok(Returned::TooLarge(size));
        }
        let types = cx.types;
        let fields = match ty {
            InterfaceType::Record(r) => &types[r].fields,
            _ => bad_type_info(),
        };
        let field = |i: usize| (fields[i].ty, &bytes[i * 8..i * 8 + 8]);
        let (ty, b) = field(0);
        let tables = Vec::<Table>::linear_lift_from_memory(cx, ty, b)?;
        let (ty, b) = field(1);
        let data = Vec::<u8>::linear_lift_from_memory(cx, ty, b)?;
        let (ty, b) = field(2);
        let values = Vec::<Packed>::linear_lift_from_memory(cx, ty, b)?;
        let (ty, b) = field(3);
        let changes = Vec::<abi::Change>::linear_lift_from_memory(cx, ty, b)?;
        let (ty, b) = field(4);
        let errors = Vec::<ChangeError>::linear_lift_from_memory(cx, ty, b)?;
        Ok(Returned::Output(Output {
            tables,
            data,
            values,
            changes,
            errors,
        }))
    }
}

unsafe impl ComponentType for Refusal {
    type Lower = <String as ComponentType>::Lower;
    const ABI: CanonicalAbiInfo = <String as ComponentType>::ABI;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> Result<()> {
        <String as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: reads the string's length from its own bytes; the string is lifted by `String`'s
// `Lift`.
unsafe impl Lift for Refusal {
    fn linear_lift_from_flat(
        cx: &mut LiftContext<'_>,
        ty: InterfaceType,
        src: &Self::Lower,
    ) -> Result<Self> {
        // Not reached for `result<output, string>` (see `Returned`); wasmtime's fuel bounds it.
        String::linear_lift_from_flat(cx, ty, src).map(Refusal::Message)
    }

    fn linear_lift_from_memory(
        cx: &mut LiftContext<'_>,
        ty: InterfaceType,
        bytes: &[u8],
    ) -> Result<Self> {
        let len = string_bytes(cx.options().string_encoding, u32_at(bytes, 4));
        if len > LIMIT.get() {
            return Ok(Refusal::TooLarge(len));
        }
        String::linear_lift_from_memory(cx, ty, bytes).map(Refusal::Message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Little-endian u32s at byte offsets of a zeroed buffer of `len` bytes.
    fn memory(len: usize, words: &[(usize, u32)]) -> Vec<u8> {
        let mut m = vec![0; len];
        for &(at, w) in words {
            m[at..at + 4].copy_from_slice(&w.to_le_bytes());
        }
        m
    }

    #[test]
    fn every_list_and_string_counts_at_its_guest_size() {
        // Two tables at 100 (schema "ab", name "c", one column at 200 named "wxyz"), one error
        // at 300 with a 5-byte message.
        let m = memory(
            400,
            &[
                (104, 2),
                (112, 1),
                (116, 200),
                (120, 1),
                (128, 0),
                (136, 0),
                (140, 200),
                (144, 1),
                (204, 4),
                (308, 5),
            ],
        );
        let record = memory(
            OUTPUT_SIZE,
            &[
                (0, 100),
                (4, 2),
                (12, 7),
                (20, 3),
                (28, 1),
                (32, 300),
                (36, 1),
            ],
        );
        let size = measure(&m, &record, StringEncoding::Utf8, u64::MAX);
        let lists = 2 * TABLE_SIZE + 7 + 3 * VALUE_SIZE + CHANGE_SIZE + ERROR_SIZE;
        let nested = (2 + 1 + COLUMN_SIZE + 4) + (COLUMN_SIZE + 4) + 5;
        assert_eq!(size.total, lists + nested);
        assert_eq!(
            (
                size.tables,
                size.data,
                size.values,
                size.changes,
                size.errors
            ),
            (2, 7, 3, 1, 1)
        );
        let utf16 = measure(&m, &record, StringEncoding::Utf16, u64::MAX);
        assert_eq!(
            utf16.total,
            lists + 2 * (2 + 1 + 4 + 4 + 5) + 2 * COLUMN_SIZE
        );
    }

    #[test]
    fn aliased_strings_count_once_per_reference_and_the_scan_stops_past_the_limit() {
        // 1,000 tables whose names all point at the same 1 MiB: copying them copies 1 GiB.
        let mut words = Vec::new();
        for i in 0..1000 {
            words.push((16 + 24 * i + 8, 0));
            words.push((16 + 24 * i + 12, 1 << 20));
        }
        let m = memory(16 + 24 * 1000, &words);
        let record = memory(OUTPUT_SIZE, &[(0, 16), (4, 1000)]);
        let all = measure(&m, &record, StringEncoding::Utf8, u64::MAX);
        assert_eq!(all.total, 1000 * (TABLE_SIZE + (1 << 20)));
        let capped = measure(&m, &record, StringEncoding::Utf8, 3 << 20);
        assert!(
            capped.total > 3 << 20 && capped.total < 5 << 20,
            "{capped:?}"
        );
    }

    #[test]
    fn lists_outside_memory_count_what_they_claim() {
        let record = memory(OUTPUT_SIZE, &[(0, 1 << 30), (4, 10), (12, 5)]);
        assert_eq!(
            measure(&[], &record, StringEncoding::Utf8, u64::MAX).total,
            10 * TABLE_SIZE + 5
        );
    }

    #[test]
    fn strings_count_in_their_encoding() {
        assert_eq!(string_bytes(StringEncoding::Utf8, 7), 7);
        assert_eq!(string_bytes(StringEncoding::Utf16, 7), 14);
        assert_eq!(string_bytes(StringEncoding::CompactUtf16, 7), 7);
        assert_eq!(string_bytes(StringEncoding::CompactUtf16, 7 | 1 << 31), 14);
    }

    #[test]
    fn fuel_covers_any_output_under_the_limit_and_keeps_the_default_as_a_floor() {
        assert_eq!(hostcall_fuel(1 << 20), 128 << 20);
        assert_eq!(hostcall_fuel(256 << 20), 768 << 20);
        assert_eq!(hostcall_fuel(u64::MAX), usize::MAX);
    }

    #[test]
    fn the_limit_is_set_for_the_call_only() {
        assert_eq!(LIMIT.get(), 0);
        let inside = with_output_limit(42, || LIMIT.get());
        assert_eq!((inside, LIMIT.get()), (42, 0));
    }
}
