//! The contract's types as the host passes them to and from a guest, through wasmtime's public
//! component API only: the `bindgen!` types of `wit/transform.wit`, lowered and lifted by
//! wasmtime's derived code (`call_transform`).
//!
//! `limits.output` is enforced in two steps. wasmtime charges the store's hostcall fuel for
//! every list and string it copies out of the guest, so [`hostcall_fuel`] bounds what one call
//! can make the host allocate (a copy past it fails the call). Then [`OutputSize::of`] counts
//! the copied output at its guest size (as the contract's limit is stated) and the runner
//! refuses one over the limit before any of it is checked or used. A lazy lift that measured
//! first (wasmtime's `WasmList`) is not possible: wasmtime runs the guest's post-return, which
//! frees the output, before the call returns.

use wasmtime::component::ComponentType;

use super::bindings::generated::zipline::transform::types as generated;
pub(crate) use generated::{
    Batch, Change, ChangeError, Column, Op, OtherValue, Output, Position, Span, Table, Value,
};

/// Guest sizes of the records an `output` holds (canonical ABI, 32-bit memory).
const TABLE_SIZE: u64 = 24;
const COLUMN_SIZE: u64 = 20;
const ERROR_SIZE: u64 = 12;
const VALUE_SIZE: u64 = 24;
const CHANGE_SIZE: u64 = 64;

const _: () = {
    assert!(<Table as ComponentType>::SIZE32 == TABLE_SIZE as usize);
    assert!(<Column as ComponentType>::SIZE32 == COLUMN_SIZE as usize);
    assert!(<ChangeError as ComponentType>::SIZE32 == ERROR_SIZE as usize);
    assert!(<Value as ComponentType>::SIZE32 == VALUE_SIZE as usize);
    assert!(<Change as ComponentType>::SIZE32 == CHANGE_SIZE as usize);
};

/// The most hostcall fuel wasmtime charges per guest byte of an output: it charges lists by
/// their elements' host sizes, at most three times the guest's.
pub(crate) const FUEL_PER_BYTE: u64 = 3;

/// wasmtime's own default, kept as a floor: it also bounds what one `log` call may hand over.
const DEFAULT_HOSTCALL_FUEL: u64 = 128 << 20;

/// The store's hostcall fuel for an output limit of `limit` bytes: enough for wasmtime to copy
/// any output within the limit, and what bounds the copy of one that is not (it fails the
/// call, and the instance is replaced).
pub(crate) fn hostcall_fuel(limit: u64) -> usize {
    let fuel = limit
        .saturating_mul(FUEL_PER_BYTE)
        .max(DEFAULT_HOSTCALL_FUEL);
    usize::try_from(fuel).unwrap_or(usize::MAX)
}

/// What an `output` copied out of a guest, in guest bytes, and what it is made of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OutputSize {
    /// Everything: the lists at their guest sizes plus their strings and column lists.
    pub(crate) total: u64,
    pub(crate) tables: u32,
    pub(crate) data: u32,
    pub(crate) values: u32,
    pub(crate) changes: u32,
    pub(crate) errors: u32,
}

impl OutputSize {
    /// The size of `out` as the guest held it.
    pub(crate) fn of(out: &Output) -> OutputSize {
        let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let strings: u64 = out
            .tables
            .iter()
            .map(|t| {
                (t.schema.len() + t.name.len()) as u64
                    + t.columns
                        .iter()
                        .map(|c| COLUMN_SIZE + c.name.len() as u64)
                        .sum::<u64>()
            })
            .sum::<u64>()
            + out
                .errors
                .iter()
                .map(|e| e.message.len() as u64)
                .sum::<u64>();
        OutputSize {
            total: out.data.len() as u64
                + out.values.len() as u64 * VALUE_SIZE
                + out.changes.len() as u64 * CHANGE_SIZE
                + out.tables.len() as u64 * TABLE_SIZE
                + out.errors.len() as u64 * ERROR_SIZE
                + strings,
            tables: len(out.tables.len()),
            data: len(out.data.len()),
            values: len(out.values.len()),
            changes: len(out.changes.len()),
            errors: len(out.errors.len()),
        }
    }

    /// The reason an output this size is refused, for `limit`.
    pub(crate) fn refusal(&self, limit: u64) -> String {
        format!(
            "output exceeds the limit of {limit} bytes (limits.output): the guest returned \
             {} bytes ({} data bytes, {} values, {} changes, {} tables, {} errors, and their \
             strings); none of it was used",
            self.total, self.data, self.values, self.changes, self.tables, self.errors
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuel_covers_any_output_under_the_limit_and_keeps_the_default_as_a_floor() {
        assert_eq!(hostcall_fuel(1 << 20), 128 << 20);
        assert_eq!(hostcall_fuel(256 << 20), 768 << 20);
        assert_eq!(hostcall_fuel(u64::MAX), usize::MAX);
    }

    #[test]
    fn refusals_name_every_part() {
        let size = OutputSize {
            total: 10,
            tables: 1,
            data: 2,
            values: 3,
            changes: 4,
            errors: 5,
        };
        assert_eq!(
            size.refusal(9),
            "output exceeds the limit of 9 bytes (limits.output): the guest returned 10 bytes \
             (2 data bytes, 3 values, 4 changes, 1 tables, 5 errors, and their strings); none of \
             it was used"
        );
    }
}
