//! End to end: the real `zipline` binary between throwaway PostgreSQL sources and MariaDB or
//! PostgreSQL sinks (helpers in `tests/e2e`), and the test harness's own checks.

#[path = "../common/mod.rs"]
mod common;
#[path = "../e2e/mod.rs"]
mod e2e;

mod bad_inputs_mysql;
mod bad_inputs_postgres;
mod harness;
mod large_tx;
mod random_mysql;
mod random_postgres;
mod restart_mysql;
mod restart_postgres;
mod schema;
mod seed_mysql;
mod seed_postgres;
mod sink_faults_mysql;
mod sink_faults_postgres;
mod snapshot;
mod source_faults;
mod types;
