//! Zipline: change-data-capture from PostgreSQL logical replication into MySQL/MariaDB
//! (and, later, PostgreSQL), with keyed lanes, idempotent sinks and an exact durable frontier.
//!
//! Flow: [`source`] → [`lane`] router → [`sink`] batch commit (with its checkpoint) →
//! [`lane::AckTracker`] → the source confirms the durable frontier upstream.

pub mod change;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod lane;
pub mod pipeline;
pub mod retry;
pub mod tls;
pub mod runtime;
pub mod sink;
pub mod source;
pub mod transform;
