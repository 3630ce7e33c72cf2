//! Steps the edge tests share: a burst of random changes, a run that converges and stops
//! cleanly, and an `apply` with extra arguments.

use std::time::Duration;

use crate::e2e::workload::{self, Config};
use crate::e2e::{CONVERGE_TIMEOUT, Fixture, PG_DB, Zipline, wait_converged, wait_streaming};

/// Writes `changes` random changes over a small key space and waits for them to finish.
pub async fn burst(fx: &Fixture, changes: u64) {
    let mut cfg = Config::new(workload::seed(), changes);
    cfg.key_space = 500;
    workload::start(fx.pg.conn_str(PG_DB), cfg).join().await;
}

/// `zipline pipeline apply -f orders.yaml` plus `extra` arguments.
pub fn apply_with(fx: &mut Fixture, extra: &[&str]) -> Zipline {
    let mut args = fx.args("apply");
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let env = fx.env();
    fx.spawn(&args, &env)
}

/// Runs with `extra` arguments until the sink equals the source, then stops cleanly.
pub async fn converge_with(fx: &mut Fixture, extra: &[&str]) {
    let pg = fx.pg_client().await;
    let mut z = apply_with(fx, extra);
    wait_streaming(&pg, &mut z, Duration::from_secs(120)).await;
    let mut my = fx.my_checker().await;
    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    z.terminate_cleanly(Duration::from_secs(20));
}

/// Runs, writes a burst, converges and stops cleanly: the sink then holds the pipeline's rows
/// and checkpoints.
pub async fn run_once(fx: &mut Fixture) {
    let pg = fx.pg_client().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(60)).await;
    burst(fx, 1_000).await;
    let mut my = fx.my_checker().await;
    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    z.terminate_cleanly(Duration::from_secs(20));
}
