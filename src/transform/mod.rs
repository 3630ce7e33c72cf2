//! WebAssembly transforms: a route's changes pass through a user's component (any language
//! that builds one for `wit/transform.wit`) before they are routed to lanes.
//!
//! Flow: the source collects up to `batch_size` changes (or what arrived before the socket went
//! quiet), hands them to the route's [`RouteTransform`] (a thread owning one instance), and
//! dispatches what comes back — so lanes are chosen on the *transformed* key and per-key order
//! holds for what the sinks see. Dropped changes count for nothing in the ack tracker; each
//! output counts as one dispatched copy; several outputs of one change get `Position::sub`
//! 0, 1, 2….
//!
//! Pieces:
//! - [`engine`]: the process-wide wasmtime engine, epoch ticker (time limits), linker, and
//!   [`Module`] (a compiled, linked, world-checked component), with [`cache`] keeping compiled
//!   components on disk;
//! - [`host`]: a store's state — memory limiter, an empty WASI context (the sandbox), guest
//!   logs and stdout/stderr into tracing;
//! - [`bindings`]: `bindgen!` types and the `Change` ↔ WIT conversions, with output checks;
//!   [`abi`]: the output lifted lazily through wasmtime's public `WasmList`/`WasmStr`, so its
//!   size is checked against `limits.output` before anything is copied;
//! - [`runner`]: one instance: `init`, then `transform` calls under the limits;
//! - [`policy`]: [`Transformer`], restarts after traps, blame isolation, `on_error`;
//! - [`dead_letter`] and [`json`]: the dead-letter file and the change JSON format;
//! - [`project`]: new transform projects on the SDKs (`zipline transform new`).
//!
//! Containment: a trap, timeout or limit breach is an error value from wasmtime, never a host
//! crash; the instance is dropped and a fresh one started for the next call. Guests get no
//! filesystem, network, environment or clock (see [`host`]).

use crate::error::{Classify, ErrorClass};

mod abi;
mod bindings;
mod cache;
mod dead_letter;
mod engine;
mod host;
pub mod json;
mod output;
mod policy;
pub mod project;
mod runner;
mod worker;

pub use engine::Module;
pub use policy::{TransformStats, Transformer};
pub use worker::RouteTransform;

use crate::config::TransformSpec;

/// Why a route's transform cannot go on. Every variant halts the pipeline.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransformError {
    /// The component cannot be used: unreadable, malformed, wrong world, unknown imports.
    #[error("transform module {module}: {message}")]
    Module {
        /// The module as the pipeline names it.
        module: String,
        /// What is wrong.
        message: String,
    },
    /// A new instance could not be started (`init` failed or refused the config).
    #[error("route {route}: transform {module}: {message}")]
    Init {
        /// The route's source connector.
        route: String,
        /// The module as the pipeline names it.
        module: String,
        /// What happened.
        message: String,
    },
    /// A change failed and the route's policy is `halt`.
    #[error(
        "route {route}: transform {module} failed on change {change}: {reason}; halting (on_error: halt)"
    )]
    Halted {
        /// The route's source connector.
        route: String,
        /// The module as the pipeline names it.
        module: String,
        /// The change's position, operation and table.
        change: String,
        /// What happened.
        reason: String,
    },
    /// A change could not be written to the dead-letter file.
    #[error("route {route}: cannot write the dead-letter file {path}: {message}")]
    DeadLetter {
        /// The route's source connector.
        route: String,
        /// The dead-letter file.
        path: String,
        /// The I/O error.
        message: String,
    },
    /// The transform's thread is gone.
    #[error("route {route}: the transform stopped")]
    Stopped {
        /// The route's source connector.
        route: String,
    },
}

impl Classify for TransformError {
    fn class(&self) -> ErrorClass {
        ErrorClass::Fatal
    }
}

/// Which part of a `transform:` block a validation problem belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecField {
    /// The module file itself.
    Module,
    /// The `config:` map (`init` refused it).
    Config,
}

/// Loads, pre-instantiates and starts (runs `init` on) the module of `spec` for `route`, as
/// `pipeline validate` and loading a pipeline do. `Err` names the field and what is wrong.
pub fn validate(route: &str, spec: &TransformSpec) -> Result<(), (SpecField, String)> {
    let module = Module::load(&spec.module, &spec.module_label)
        .map_err(|m| (SpecField::Module, format!("{}: {m}", spec.module_label)))?;
    runner::Instance::start(&module, route, spec.limits, &spec.config)
        .map(drop)
        .map_err(|m| (SpecField::Config, format!("{}: {m}", spec.module_label)))
}
