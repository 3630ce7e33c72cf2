//! The contract's restarts and faults: SIGTERM and SIGKILL of Zipline mid-workload, and sink
//! connections cut, refused and killed, and the sink server crashed.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{assert_retried, deleted_keys, paced, streaming, wait_changes};
use crate::common::Proxy;
use crate::e2e::sinks::SinkFixture;
use crate::e2e::workload::{self, Report};
use crate::e2e::{
    CONVERGE_TIMEOUT, PG_DB, PipelineOpts, Zipline, current_wal_lsn, wait_confirmed_at_least,
    wait_streaming,
};

/// Ends a restart test: one last write, convergence, no deleted key left in the sink, SIGTERM
/// (exit 0), and the slot's confirmed position at or past the last commit Zipline applied.
///
/// Also checks the WAL position read after convergence (`pg_current_wal_lsn()`). That one
/// can be past the last commit: reading the tables prunes heap pages, which writes WAL.
/// Such WAL holds no changes, and Zipline confirms it when the walsender's next keepalive
/// says so (within about `wal_sender_timeout / 2`); an idle pipeline that never did would
/// pin WAL forever. So it is required first while Zipline runs, then again after the stop.
async fn finish<F: SinkFixture>(
    src: &tokio_postgres::Client,
    sink: &mut F::Checker,
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
    F::wait_converged(src, sink, Some(&mut *z), CONVERGE_TIMEOUT).await;
    let deleted = deleted_keys(src, report).await;
    assert!(!deleted.is_empty(), "the workload deleted nothing");
    F::assert_absent(sink, &deleted).await;

    let after_converged = current_wal_lsn(src).await;
    let (confirmed, reached) =
        wait_confirmed_at_least(src, &after_converged, Duration::from_secs(10)).await;
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
        let (confirmed, reached) = wait_confirmed_at_least(src, lsn, Duration::from_secs(5)).await;
        assert!(
            reached,
            "after a clean stop the slot's confirmed_flush_lsn is {confirmed}, behind {what} \
             ({lsn})\nzipline log:\n{}",
            z.tail(40)
        );
    }
}

pub(super) async fn sigterm_mid_workload_exits_cleanly_and_resumes<F: SinkFixture>() {
    let (mut fx, mut first, src, mut sink) = streaming::<F>(&PipelineOpts::default()).await;
    let mut cfg = paced(workload::seed());
    cfg.target_changes = 10_000;
    let w = workload::start(fx.source().conn_str(PG_DB), cfg);
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
    finish::<F>(&src, &mut sink, &mut second, &report).await;
}

pub(super) async fn sigkill_four_times_mid_workload_converges<F: SinkFixture>() {
    let (mut fx, mut z, src, mut sink) = streaming::<F>(&PipelineOpts::default()).await;
    let seed = workload::seed();
    let w = workload::start(fx.source().conn_str(PG_DB), paced(seed));
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
    finish::<F>(&src, &mut sink, &mut z, &report).await;
    drop(killed);
}

pub(super) async fn sink_cuts_and_refusals_converge<F: SinkFixture>() {
    let mut fx = F::start();
    let proxy = Proxy::start(fx.sink_server_port()).await;
    fx.set_pipeline_sink_port(proxy.port);
    fx.write(&PipelineOpts::default());
    let src = fx.source_client().await;
    let mut sink = fx.checker().await;
    let mut z = fx.apply();
    wait_streaming(&src, &mut z, Duration::from_secs(30)).await;
    assert!(
        proxy.wait_for_connections(1, Duration::from_secs(10)).await,
        "zipline streams but holds no sink connection through the proxy on port {} \
         (did it switch to the Unix socket?)",
        proxy.port
    );

    let w = workload::start(fx.source().conn_str(PG_DB), paced(workload::seed()));
    wait_changes(&w, &mut z, 1_000).await;
    for round in 1..=5 {
        let live = proxy.connections();
        proxy.cut_all();
        eprintln!(
            "e2e: cut {round}: reset {live} sink connections at {} changes",
            w.changes()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        z.assert_running();
    }
    proxy.cut_all();
    proxy.set_refuse(true);
    eprintln!(
        "e2e: refusing sink connections for 2 s at {} changes",
        w.changes()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.set_refuse(false);
    tokio::time::sleep(Duration::from_secs(1)).await;
    w.stop();
    let report = w.join().await;
    assert!(report.changes >= 3_000, "only {} changes", report.changes);

    F::wait_converged(&src, &mut sink, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_retried(&z);
    z.terminate_cleanly(Duration::from_secs(15));
}

/// Every session Zipline holds on the sink server ended from inside it (MariaDB `KILL`,
/// PostgreSQL `pg_terminate_backend`), four times a little over a second apart.
pub(super) async fn killed_sink_sessions_converge<F: SinkFixture>() {
    let mut fx = F::start();
    fx.write(&PipelineOpts::default());
    let src = fx.source_client().await;
    let mut sink = fx.checker().await;
    let mut admin = fx.admin().await;
    let mut z = fx.apply();
    wait_streaming(&src, &mut z, Duration::from_secs(30)).await;

    let w = workload::start(fx.source().conn_str(PG_DB), paced(workload::seed()));
    wait_changes(&w, &mut z, 1_000).await;
    let mut total_killed = 0;
    for round in 1..=4 {
        let killed = F::kill_sink_sessions(&mut admin).await;
        total_killed += killed;
        eprintln!(
            "e2e: kill round {round}: {killed} sink sessions at {} changes",
            w.changes()
        );
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        z.assert_running();
    }
    assert!(
        total_killed >= 4,
        "found only {total_killed} sink sessions to kill"
    );
    w.stop();
    let report = w.join().await;
    assert!(report.changes >= 3_000, "only {} changes", report.changes);

    F::wait_converged(&src, &mut sink, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_retried(&z);
    z.terminate_cleanly(Duration::from_secs(15));
}

/// The sink server crashes (SIGKILL) mid-workload and comes back a second later: the lanes
/// retry until it is back, and whatever batch was in flight is applied exactly once.
pub(super) async fn sink_server_crash_converges<F: SinkFixture>() {
    let mut fx = F::start();
    fx.write(&PipelineOpts::default());
    let src = fx.source_client().await;
    let mut z = fx.apply();
    wait_streaming(&src, &mut z, Duration::from_secs(30)).await;

    let w = workload::start(fx.source().conn_str(PG_DB), paced(workload::seed()));
    wait_changes(&w, &mut z, 2_000).await;
    fx.crash_sink();
    eprintln!("e2e: sink server killed at {} changes", w.changes());
    tokio::time::sleep(Duration::from_secs(1)).await;
    fx.restart_sink();
    eprintln!("e2e: sink server back at {} changes", w.changes());
    wait_changes(&w, &mut z, w.changes() + 2_000).await;
    w.stop();
    let report = w.join().await;
    assert!(report.changes >= 4_000, "only {} changes", report.changes);

    let mut sink = fx.checker().await;
    F::wait_converged(&src, &mut sink, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_retried(&z);
    z.terminate_cleanly(Duration::from_secs(15));
}
