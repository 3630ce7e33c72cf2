//! The contract's types as the host passes them to and from a guest, through wasmtime's public
//! component API only.
//!
//! In: the `bindgen!` types of `wit/transform.wit` ([`Batch`], [`Value`], [`Change`]), lowered
//! by wasmtime's derived code.
//!
//! Out: [`Returned`], a view of the guest's `output` record whose lists and strings are
//! wasmtime's lazy [`WasmList`] and [`WasmStr`]: lifting it copies nothing but pointers and
//! lengths, so [`Returned::measure`] can count what the output would copy, in guest bytes,
//! and refuse one over `limits.output` before a byte of it is copied. [`Returned::copy`] then
//! copies it: `data` as one slice of guest memory, the rest element by element through the
//! generated types.

use wasmtime::component::{ComponentType, Lift, WasmList, WasmStr};
use wasmtime::{AsContextMut, Result};

use super::bindings::generated::zipline::transform::types as generated;
pub(crate) use generated::{
    Batch, Change, ChangeError, Column, Op, OtherValue, Position, Span, Table, Value,
};

/// The WIT's `output`, copied out of a guest.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Output {
    pub(crate) tables: Vec<Table>,
    pub(crate) data: Vec<u8>,
    pub(crate) values: Vec<Value>,
    pub(crate) changes: Vec<Change>,
    pub(crate) errors: Vec<ChangeError>,
}

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

/// The most hostcall fuel wasmtime charges per guest byte of an output: lazily lifted lists
/// charge their elements' host sizes, at most three times the guest's.
pub(crate) const FUEL_PER_BYTE: u64 = 3;

/// wasmtime's own default, kept as a floor: it also bounds what one `log` call may hand over.
const DEFAULT_HOSTCALL_FUEL: u64 = 128 << 20;

/// The store's hostcall fuel for an output limit of `limit` bytes: enough for wasmtime to lift
/// any output [`Returned::measure`] lets through.
pub(crate) fn hostcall_fuel(limit: u64) -> usize {
    let fuel = limit
        .saturating_mul(FUEL_PER_BYTE)
        .max(DEFAULT_HOSTCALL_FUEL);
    usize::try_from(fuel).unwrap_or(usize::MAX)
}

/// The guest's `output` record, lifted lazily (see the module doc).
#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct Returned {
    tables: WasmList<LazyTable>,
    data: WasmList<u8>,
    values: WasmList<Value>,
    changes: WasmList<Change>,
    errors: WasmList<LazyError>,
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct LazyTable {
    schema: WasmStr,
    name: WasmStr,
    columns: WasmList<LazyColumn>,
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct LazyColumn {
    name: WasmStr,
    #[component(name = "type-oid")]
    type_oid: u32,
    #[component(name = "type-modifier")]
    type_modifier: i32,
    #[component(name = "is-key")]
    is_key: bool,
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct LazyError {
    index: u32,
    message: WasmStr,
}

/// What copying an `output` would copy, in guest bytes, and what it is made of.
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

/// The length of a guest string in bytes. UTF-8 (every guest toolchain here) is read in place.
fn str_len<S: AsContextMut>(s: &WasmStr, store: &mut S) -> Result<u64> {
    Ok(s.to_str(store.as_context_mut())?.len() as u64)
}

impl Returned {
    /// What copying this output would copy. Stops counting once past `limit`: every step adds
    /// at least an element's own size, so a guest pointing every table at one huge string or
    /// column list costs the scan no more than the limit.
    pub(crate) fn measure<S: AsContextMut>(&self, store: &mut S, limit: u64) -> Result<OutputSize> {
        let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let mut size = OutputSize {
            total: 0,
            tables: len(self.tables.len()),
            data: len(self.data.len()),
            values: len(self.values.len()),
            changes: len(self.changes.len()),
            errors: len(self.errors.len()),
        };
        size.total = u64::from(size.data)
            + u64::from(size.values) * VALUE_SIZE
            + u64::from(size.changes) * CHANGE_SIZE
            + u64::from(size.tables) * TABLE_SIZE
            + u64::from(size.errors) * ERROR_SIZE;
        if size.total > limit {
            return Ok(size);
        }
        let tables: Vec<LazyTable> = self.tables.iter(store.as_context_mut())?.collect::<Result<_>>()?;
        for t in &tables {
            if size.total > limit {
                return Ok(size);
            }
            size.total += str_len(&t.schema, store)?
                + str_len(&t.name, store)?
                + t.columns.len() as u64 * COLUMN_SIZE;
            if size.total > limit {
                return Ok(size);
            }
            let columns: Vec<LazyColumn> =
                t.columns.iter(store.as_context_mut())?.collect::<Result<_>>()?;
            for c in columns {
                if size.total > limit {
                    return Ok(size);
                }
                size.total += str_len(&c.name, store)?;
            }
        }
        let errors: Vec<LazyError> =
            self.errors.iter(store.as_context_mut())?.collect::<Result<_>>()?;
        for e in errors {
            if size.total > limit {
                return Ok(size);
            }
            size.total += str_len(&e.message, store)?;
        }
        Ok(size)
    }

    /// Copies the output out of the guest. Call after [`Returned::measure`] accepted it.
    pub(crate) fn copy<S: AsContextMut>(&self, store: &mut S) -> Result<Output> {
        let text = |s: &WasmStr, store: &mut S| -> Result<String> {
            Ok(s.to_str(store.as_context_mut())?.into_owned())
        };
        let lazy_tables: Vec<LazyTable> =
            self.tables.iter(store.as_context_mut())?.collect::<Result<_>>()?;
        let mut tables = Vec::with_capacity(lazy_tables.len());
        for t in lazy_tables {
            let lazy_columns: Vec<LazyColumn> =
                t.columns.iter(store.as_context_mut())?.collect::<Result<_>>()?;
            let mut columns = Vec::with_capacity(lazy_columns.len());
            for c in lazy_columns {
                columns.push(Column {
                    name: text(&c.name, store)?,
                    type_oid: c.type_oid,
                    type_modifier: c.type_modifier,
                    is_key: c.is_key,
                });
            }
            tables.push(Table {
                schema: text(&t.schema, store)?,
                name: text(&t.name, store)?,
                columns,
            });
        }
        let data = self.data.as_le_slice(store.as_context_mut()).to_vec();
        let values = self.values.iter(store.as_context_mut())?.collect::<Result<_>>()?;
        let changes = self.changes.iter(store.as_context_mut())?.collect::<Result<_>>()?;
        let lazy_errors: Vec<LazyError> =
            self.errors.iter(store.as_context_mut())?.collect::<Result<_>>()?;
        let mut errors = Vec::with_capacity(lazy_errors.len());
        for e in lazy_errors {
            errors.push(ChangeError {
                index: e.index,
                message: text(&e.message, store)?,
            });
        }
        Ok(Output {
            tables,
            data,
            values,
            changes,
            errors,
        })
    }
}

/// A `transform` call's `err` message, copied when within `limit` bytes: `Err(len)` otherwise.
pub(crate) fn refusal<S: AsContextMut>(
    message: &WasmStr,
    store: &mut S,
    limit: u64,
) -> Result<Result<String, u64>> {
    let text = message.to_str(store.as_context_mut())?;
    let len = text.len() as u64;
    Ok(if len > limit {
        Err(len)
    } else {
        Ok(text.into_owned())
    })
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
            "output exceeds the limit of 9 bytes (limits.output): the guest returned at least \
             10 bytes to copy (2 data bytes, 3 values, 4 changes, 1 tables, 5 errors, and their \
             strings); nothing was copied"
        );
    }
}
