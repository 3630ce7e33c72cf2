//! The stage chain every source and sink plugs into:
//!
//! ```text
//! source ──events──▶ transform stage ──▶ dispatcher ──parcels──▶ sink lanes
//!    ▲                                                               │ commits + checkpoints
//!    └──────────────────────── frontier (watch) ◀─────────────────────┘
//! ```
//!
//! - A source ([`crate::source::Source`]) only produces: transaction-delimited [`Event`]s
//!   through its [`Emitter`], and its snapshot's chunks through a
//!   [`SnapshotWriter`](crate::source::snapshot::SnapshotWriter) ([`SinkSnapshots`] here). It
//!   is handed back the durable [`Frontier`], the position it may confirm upstream.
//! - The [`Dispatcher`] owns everything between: each route's table filter and transform,
//!   routing by key hash, barriers, back-pressure, and the ack tracker that turns lane
//!   commits into the frontier. It owns the frontier.
//! - Lanes ([`crate::lane`]) batch and commit into their sink with the lane's checkpoint in
//!   the same transaction, and ack what became durable.
//!
//! Events, parcels, acks and frontiers are plain data crossing channels, so a later transport
//! can carry any of these boundaries between processes.
//!
//! [`Event`]: crate::source::emitter::Event
//! [`Emitter`]: crate::source::emitter::Emitter
//! [`Frontier`]: crate::source::emitter::Frontier

mod dispatcher;
mod route;
mod snapshot;

pub use dispatcher::{DispatchError, Dispatcher};
pub use route::{RouteStage, Tables, TransformCall, Transformer};
pub use snapshot::{SinkSnapshots, Target};
