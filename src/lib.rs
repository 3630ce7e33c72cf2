//! Zipline: change-data-capture from PostgreSQL logical replication and SQL Server CDC into
//! MySQL/MariaDB and PostgreSQL, with keyed lanes, idempotent sinks and an exact durable
//! frontier.
//!
//! One stage chain, owned by [`runtime`], carries every pipeline:
//! [`source`] (produces transaction-delimited events, confirms only the frontier it is
//! handed back) → per-route table filter and [`transform`] → [`runtime::Dispatcher`]
//! (routing by key hash, barriers, back-pressure, ack accounting; owns the frontier) →
//! [`lane`]s (batches committed into a [`sink`] with the lane's checkpoint in the same
//! transaction) → acks → the frontier, a `watch` value the source reads. [`pipeline`] reads
//! the [`config`] once, claims the sinks, decides where to start and wires the chain.
//!
//! A new source implements [`source::Source`] (emit events, honour the frontier, hand
//! snapshot chunks to a [`source::snapshot::SnapshotWriter`]); a new sink implements
//! [`sink::SinkConnector`] (open, check, claim, lanes), a [`sink::CheckpointStore`] and,
//! if it can take an initial snapshot, a [`sink::SnapshotTarget`].

#[cfg(feature = "bench")]
pub mod bench;
pub mod change;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod lane;
pub mod metrics;
pub mod parcel;
pub mod pipeline;
pub mod retry;
pub mod runtime;
pub mod sink;
pub mod source;
pub mod tls;
pub mod transform;
