//! Stopping and crashing Zipline while the source keeps changing.
//!
//! - SIGTERM mid-workload: Zipline drains and exits 0 within seconds; a new process resumes
//!   from the slot and the sink converges.
//! - SIGKILL four times at random moments, workload running throughout: every restart
//!   re-reads from the slot's confirmed position, the sink skips what its checkpoints cover,
//!   and the end state has no duplicate and no lost delete.
//! - After a clean SIGTERM the slot's `confirmed_flush_lsn` covers the last applied write,
//!   so a restart does not re-read (and the server can recycle) WAL already applied.

use crate::e2e;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use e2e::workload::{self, Config, Report};
use e2e::{
    CONVERGE_TIMEOUT, Fixture, PG_DB, PipelineOpts, Zipline, assert_absent_in_sink,
    current_wal_lsn, pipeline_yaml, wait_confirmed_at_least, wait_converged, wait_streaming,
};

/// Keys the workload touched that are gone from the source: they must be gone from the sink.
async fn deleted_keys(pg: &tokio_postgres::Client, report: &Report) -> Vec<i64> {
    let live: HashSet<i64> = pg
        .query("SELECT id FROM orders", &[])
        .await
        .expect("reading source ids")
        .iter()
        .map(|r| r.get(0))
        .collect();
    report
        .keys
        .iter()
        .copied()
        .filter(|k| !live.contains(k))
        .collect()
}

/// Ends a test: one last write, convergence, SIGTERM (exit 0), and the slot's confirmed
/// position at or past the last commit Zipline applied.
///
/// Also checks the WAL position read after convergence (`pg_current_wal_lsn()`). That one
/// can be past the last commit: reading the tables prunes heap pages, which writes WAL.
/// Such WAL holds no changes, and Zipline confirms it when the walsender's next keepalive
/// says so (within about `wal_sender_timeout / 2`); an idle pipeline that never did would
/// pin WAL forever. So it is required first while Zipline runs, then again after the stop.
async fn finish(
    pg: &tokio_postgres::Client,
    my: &mut mysql_async::Conn,
    z: &mut Zipline,
    report: &Report,
) {
    pg.batch_execute(
        "INSERT INTO orders VALUES (999999, 'marker', 1.00, 'last', now(), true, 'last write')
         ON CONFLICT (id) DO UPDATE SET note = 'last write again'",
    )
    .await
    .expect("marker write");
    let last_commit = current_wal_lsn(pg).await;
    wait_converged(pg, my, Some(&mut *z), CONVERGE_TIMEOUT).await;
    let deleted = deleted_keys(pg, report).await;
    assert!(!deleted.is_empty(), "the workload deleted nothing");
    assert_absent_in_sink(my, &deleted).await;

    let after_converged = current_wal_lsn(pg).await;
    let (confirmed, reached) =
        wait_confirmed_at_least(pg, &after_converged, Duration::from_secs(10)).await;
    assert!(
        reached,
        "a running, idle Zipline left the slot at {confirmed}, behind the WAL position \
         {after_converged} read after convergence (last commit {last_commit}) for 10 s\nzipline log:\n{}",
        z.tail(40)
    );

    let took = z.terminate_cleanly(Duration::from_secs(10));
    eprintln!("e2e: clean stop took {took:.1?}");
    for (what, lsn) in [
        ("the last commit", &last_commit),
        ("pg_current_wal_lsn() after convergence", &after_converged),
    ] {
        // The walsender applies the final status update a moment after Zipline sends it.
        let (confirmed, reached) = wait_confirmed_at_least(pg, lsn, Duration::from_secs(5)).await;
        assert!(
            reached,
            "after a clean stop the slot's confirmed_flush_lsn is {confirmed}, behind {what} \
             ({lsn})\nzipline log:\n{}",
            z.tail(40)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_mid_workload_exits_cleanly_and_resumes() {
    let mut fx = Fixture::start();
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    let pg = fx.pg_client().await;
    let mut my = fx.my_checker().await;
    let mut first = fx.apply();
    wait_streaming(&pg, &mut first, Duration::from_secs(30)).await;

    let mut cfg = Config::new(workload::seed(), 10_000);
    cfg.pause = Duration::from_millis(15);
    let w = workload::start(fx.pg.conn_str(PG_DB), cfg);
    let deadline = Instant::now() + Duration::from_secs(60);
    while w.changes() < 3_000 {
        assert!(Instant::now() < deadline, "workload too slow");
        first.assert_running();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !w.is_finished(),
        "the workload should still be running at the stop"
    );
    let took = first.terminate_cleanly(Duration::from_secs(10));
    eprintln!(
        "e2e: SIGTERM mid-workload: exit 0 after {took:.1?}, at {} changes",
        w.changes()
    );
    // The source keeps changing while nothing replicates.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut second = fx.apply();
    let report = w.join().await;
    finish(&pg, &mut my, &mut second, &report).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_four_times_mid_workload_converges() {
    let mut fx = Fixture::start();
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    let pg = fx.pg_client().await;
    let mut my = fx.my_checker().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;

    let seed = workload::seed();
    let mut cfg = Config::new(seed, u64::MAX);
    cfg.pause = Duration::from_millis(15);
    let w = workload::start(fx.pg.conn_str(PG_DB), cfg);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5151);
    // Killed processes are kept so a failing test prints their logs too.
    let mut killed: Vec<Zipline> = Vec::new();
    for round in 1..=4 {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1_500..3_500))).await;
        z.assert_running();
        let at = w.changes();
        z.kill();
        eprintln!("e2e: SIGKILL {round} at {at} changes");
        killed.push(std::mem::replace(&mut z, {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..800))).await;
            fx.apply()
        }));
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    z.assert_running();
    w.stop();
    let report = w.join().await;
    assert!(report.changes >= 5_000, "only {} changes", report.changes);
    finish(&pg, &mut my, &mut z, &report).await;
    drop(killed);
}
