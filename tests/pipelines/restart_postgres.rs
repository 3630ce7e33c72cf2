//! PostgreSQL → PostgreSQL: stopping and crashing Zipline while the source keeps changing.
//!
//! - SIGTERM mid-workload: Zipline drains and exits 0; a new process resumes from the slot and
//!   the sink converges.
//! - SIGKILL four times at random moments with the workload running throughout: every restart
//!   re-reads from the slot's confirmed position, lanes skip what their checkpoints cover, and
//!   the end state has no duplicate and no lost delete.
//! - Both end with the slot's `confirmed_flush_lsn` at or past the last commit, while Zipline
//!   idles and after its clean stop.

use crate::e2e;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use e2e::pg::{PgFixture, assert_absent, pg_pipeline_yaml, wait_converged};
use e2e::workload::{self, Config, Report};
use e2e::{
    CONVERGE_TIMEOUT, PG_DB, PipelineOpts, Zipline, current_wal_lsn, wait_confirmed_at_least,
    wait_streaming,
};

/// One last write, convergence, no deleted key left in the sink, then the confirmed position
/// at or past the WAL position while idle, a clean SIGTERM, and again after it.
async fn finish(
    src: &tokio_postgres::Client,
    sink: &tokio_postgres::Client,
    z: &mut Zipline,
    report: &Report,
) {
    src.batch_execute(
        "INSERT INTO orders VALUES (999999, 'marker', 1.00, 'last', now(), true, 'last write')
         ON CONFLICT (id) DO UPDATE SET note = 'last write again'",
    )
    .await
    .expect("marker write");
    let last_commit = current_wal_lsn(src).await;
    wait_converged(src, sink, "orders", Some(&mut *z), CONVERGE_TIMEOUT).await;
    let live: HashSet<i64> = src
        .query("SELECT id FROM orders", &[])
        .await
        .expect("reading source ids")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let deleted: Vec<i64> = report
        .keys
        .iter()
        .copied()
        .filter(|k| !live.contains(k))
        .collect();
    assert!(!deleted.is_empty(), "the workload deleted nothing");
    assert_absent(sink, &deleted).await;

    // Reading the tables may write WAL (page pruning) past the last commit; an idle Zipline
    // confirms it from the walsender's keepalives.
    let idle_lsn = current_wal_lsn(src).await;
    let (confirmed, reached) =
        wait_confirmed_at_least(src, &idle_lsn, Duration::from_secs(10)).await;
    assert!(
        reached,
        "an idle Zipline left the slot at {confirmed}, behind {idle_lsn} (last commit \
         {last_commit})\n{}",
        z.tail(40)
    );
    let took = z.terminate_cleanly(Duration::from_secs(10));
    eprintln!("e2e: clean stop took {took:.1?}");
    let (confirmed, reached) =
        wait_confirmed_at_least(src, &last_commit, Duration::from_secs(5)).await;
    assert!(
        reached,
        "after a clean stop the slot is at {confirmed}, behind the last commit {last_commit}"
    );
}

fn paced(seed: u64) -> Config {
    let mut cfg = Config::new(seed, u64::MAX);
    cfg.pause = Duration::from_millis(15);
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_mid_workload_exits_cleanly_and_resumes() {
    let mut fx = PgFixture::start();
    fx.write_pipeline(&pg_pipeline_yaml(&PipelineOpts::default()));
    let (src, sink) = (fx.src_client().await, fx.sink_client().await);
    let mut first = fx.apply();
    wait_streaming(&src, &mut first, Duration::from_secs(30)).await;

    let mut cfg = paced(workload::seed());
    cfg.target_changes = 10_000;
    let w = workload::start(fx.src.conn_str(PG_DB), cfg);
    let deadline = Instant::now() + Duration::from_secs(60);
    while w.changes() < 3_000 {
        assert!(Instant::now() < deadline, "workload too slow");
        first.assert_running();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !w.is_finished(),
        "the workload should still run at the stop"
    );
    let took = first.terminate_cleanly(Duration::from_secs(10));
    eprintln!(
        "e2e: SIGTERM mid-workload: exit 0 after {took:.1?} at {} changes",
        w.changes()
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut second = fx.apply();
    let report = w.join().await;
    finish(&src, &sink, &mut second, &report).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_four_times_mid_workload_converges() {
    let mut fx = PgFixture::start();
    fx.write_pipeline(&pg_pipeline_yaml(&PipelineOpts::default()));
    let (src, sink) = (fx.src_client().await, fx.sink_client().await);
    let mut z = fx.apply();
    wait_streaming(&src, &mut z, Duration::from_secs(30)).await;

    let seed = workload::seed();
    let w = workload::start(fx.src.conn_str(PG_DB), paced(seed));
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5151);
    // Killed processes are kept so a failing test prints their logs too.
    let mut killed: Vec<Zipline> = Vec::new();
    for round in 1..=4 {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1_500..3_500))).await;
        z.assert_running();
        let at = w.changes();
        z.kill();
        eprintln!("e2e: SIGKILL {round} at {at} changes");
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..800))).await;
        killed.push(std::mem::replace(&mut z, fx.apply()));
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    z.assert_running();
    w.stop();
    let report = w.join().await;
    assert!(report.changes >= 5_000, "only {} changes", report.changes);
    finish(&src, &sink, &mut z, &report).await;
    drop(killed);
}
