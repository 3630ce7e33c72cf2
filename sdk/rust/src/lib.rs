//! Write Zipline transforms in Rust without touching the batch layout.
//!
//! A transform is a type implementing [`Transform`], exported with [`export!`]. Zipline calls
//! [`Transform::init`] once with the route's `config:` map and [`Transform::change`] for every
//! change of every batch, in commit order. Through [`Change`] a transform reads values by
//! column name or index, sets new ones (the change's key follows a key column by itself),
//! drops the change or a column, renames its table or columns, emits extra changes, or keeps a
//! row filter correct across updates ([`Change::filter`]). See README.md for examples.
//!
//! Under the hood a batch is the flat lists of `wit/transform.wit`: a change's values are a
//! span of the batch's `values`, and a text is a span of its `data`. Reading is slicing;
//! passing a change through copies nothing; a new text is appended once to the output's data.

use std::fmt::Display;
use std::str::FromStr;

mod change;
mod value;

pub use change::{Change, Column};
pub use value::Value;

/// What `wit-bindgen` makes of `wit/transform.wit`; [`export!`] implements its `Guest`.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "transform",
        pub_export_macro: true,
        export_macro_name: "export_world",
        default_bindings_module: "zipline_transform::bindings",
        additional_derives: [PartialEq],
    });
}

use bindings::zipline::transform::types as wit;
pub use wit::Op;

/// Log levels: `Error` is for conditions an operator must look at.
pub use bindings::zipline::transform::host::Level;

/// Writes a line to Zipline's log, tagged with the route and module.
pub fn log(level: Level, message: &str) {
    bindings::zipline::transform::host::log(level, message);
}

/// A transform: state built once from the route's config, then called per change.
///
/// Contract: `change` sees the changes of a batch in commit order and may keep state between
/// calls, but an instance can be thrown away and recreated at any time (after a trap, or a
/// restart), so the output must depend only on the config and the change. Returning `Err`
/// refuses this change alone (the route's `on_error` policy decides what happens to it);
/// panicking fails the whole batch.
pub trait Transform: Sized + 'static {
    /// Builds the transform from the route's `config:` map. `Err` stops the pipeline at
    /// startup with this message.
    fn init(config: &Config) -> Result<Self, String>;

    /// Transforms one change in place (see [`Change`]).
    fn change(&mut self, change: &mut Change<'_>) -> Result<(), String>;
}

/// The route's `config:` map (values are strings), with typed parsing.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pairs: Vec<(String, String)>,
}

impl Config {
    /// A config of these `key: value` pairs.
    pub fn new(pairs: Vec<(String, String)>) -> Config {
        Config { pairs }
    }

    /// Every pair, in the order the pipeline lists them.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The comma-separated items of `key`, trimmed, empty ones left out; none when unset.
    pub fn list(&self, key: &str) -> Vec<String> {
        self.get(key)
            .into_iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// `key` parsed as a `T`, if set. `Err` names the key and the value.
    pub fn parse<T: FromStr>(&self, key: &str) -> Result<Option<T>, String>
    where
        T::Err: Display,
    {
        self.get(key)
            .map(|v| {
                v.trim()
                    .parse()
                    .map_err(|e| format!("config `{key}`: cannot read `{v}`: {e}"))
            })
            .transpose()
    }

    /// `key` parsed as a `T`; `Err` when it is unset or does not parse.
    pub fn require<T: FromStr>(&self, key: &str) -> Result<T, String>
    where
        T::Err: Display,
    {
        self.parse(key)?
            .ok_or_else(|| format!("config `{key}` is required"))
    }

    /// `Err` naming the first key that is not one of `known`: a typo in a pipeline's config
    /// should stop it at startup, not be ignored.
    pub fn allow_only(&self, known: &[&str]) -> Result<(), String> {
        match self
            .pairs
            .iter()
            .find(|(k, _)| !known.contains(&k.as_str()))
        {
            Some((k, _)) => Err(format!(
                "unknown config key `{k}`; expected {}",
                known.join(", ")
            )),
            None => Ok(()),
        }
    }
}

/// Runs `state` over `batch`. Called by the code [`export!`] generates.
#[doc(hidden)]
pub fn run<T: Transform>(
    state: &mut T,
    batch: bindings::Batch,
) -> Result<bindings::Output, String> {
    let wit::Batch {
        tables,
        data,
        values,
        changes,
    } = batch;
    let mut out = change::Out {
        base: data.len(),
        input: data,
        data: Vec::new(),
        values,
        tables,
        changes: Vec::with_capacity(changes.len()),
        errors: Vec::new(),
    };
    for (index, raw) in changes.into_iter().enumerate() {
        let mark = out.changes.len();
        let mut c = Change::new(&mut out, raw);
        match state.change(&mut c) {
            Ok(()) => {
                if let Some(raw) = c.finish() {
                    out.changes.insert(mark, raw);
                }
            }
            Err(message) => {
                out.changes.truncate(mark);
                out.errors.push(wit::ChangeError {
                    index: index as u32,
                    message,
                });
            }
        }
    }
    Ok(wit::Output {
        tables: out.tables,
        data: out.data,
        values: out.values,
        changes: out.changes,
        errors: out.errors,
    })
}

/// Exports a [`Transform`] as the component's `init` and `transform`:
/// `zipline_transform::export!(MyTransform);` once, at the crate's root.
#[macro_export]
macro_rules! export {
    ($t:ty) => {
        const _: () = {
            struct ZiplineTransformExport;
            ::std::thread_local! {
                static STATE: ::std::cell::RefCell<::std::option::Option<$t>> =
                    const { ::std::cell::RefCell::new(::std::option::Option::None) };
            }
            impl $crate::bindings::Guest for ZiplineTransformExport {
                fn init(
                    config: ::std::vec::Vec<(::std::string::String, ::std::string::String)>,
                ) -> ::std::result::Result<(), ::std::string::String> {
                    let t = <$t as $crate::Transform>::init(&$crate::Config::new(config))?;
                    STATE.with(|s| *s.borrow_mut() = ::std::option::Option::Some(t));
                    ::std::result::Result::Ok(())
                }
                fn transform(
                    batch: $crate::bindings::Batch,
                ) -> ::std::result::Result<$crate::bindings::Output, ::std::string::String>
                {
                    STATE.with(|s| match s.borrow_mut().as_mut() {
                        ::std::option::Option::Some(t) => $crate::run(t, batch),
                        ::std::option::Option::None => {
                            ::std::result::Result::Err("transform called before init".into())
                        }
                    })
                }
            }
    $crate::bindings::export_world!(ZiplineTransformExport with_types_in $crate::bindings);
        };
    };
}

#[cfg(test)]
mod tests;
