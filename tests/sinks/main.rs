//! The sinks against throwaway servers, below the pipeline: one contract suite
//! ([`contract`]) that every sink passes, written once and run against MariaDB and
//! PostgreSQL, and each sink's own scenarios beside it.
//!
//! - `contract::mysql::*`, `contract::postgres::*`: rows and checkpoint in one transaction,
//!   replays converge, a connection killed mid-batch leaves nothing behind, bad rows are
//!   definite and named, a lane-count change restarts every lane from the lowest checkpoint,
//!   one live instance per pipeline.
//! - `mysql`: table checks, a conflict on another unique key (live and snapshot paths).
//! - `postgres`: value fidelity, inserts of keys the sink has, the durable frontier, dead
//!   letters, recreated tables; `postgres_copy`: the COPY path; `postgres_tables`: table
//!   checks and `create_tables`.

#[path = "../common/mod.rs"]
pub mod common;
#[path = "../e2e/mod.rs"]
pub mod e2e;

mod contract;
mod mysql;
mod postgres;
mod postgres_copy;
mod postgres_tables;
