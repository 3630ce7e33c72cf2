//! End to end: the real `zipline` binary between throwaway PostgreSQL sources and MariaDB or
//! PostgreSQL sinks (helpers in `tests/e2e`), and the test harness's own checks.
//!
//! - `contract::mysql::*`, `contract::postgres::*`: the scenarios every sink passes, written
//!   once (the seed trace audited on the sink, randomized workloads, truncates, TOAST, key
//!   swaps, SIGTERM and SIGKILL restarts, sink connection faults and crashes).
//! - Each sink's own: `bad_inputs_*` (what a bad configuration or server says),
//!   `postgres_sink` (the type zoo, the initial snapshot's COPY).
//! - Source-side and cross-cutting: `large_tx`, `metrics` (`settings.metrics`: /metrics,
//!   /readyz, /healthz), `schema`, `snapshot`, `source_faults`, `types`; `harness`: the test
//!   servers and proxy themselves.

#[path = "../common/mod.rs"]
pub mod common;
#[path = "../e2e/mod.rs"]
pub mod e2e;

mod bad_inputs_mysql;
mod bad_inputs_postgres;
mod contract;
mod harness;
mod large_tx;
mod lifecycle;
mod metrics;
mod postgres_sink;
mod schema;
mod snapshot;
mod source_faults;
mod types;
