//! PostgreSQL sink connection faults while the workload runs: the lanes must retry
//! (reconnecting) and the sink must still converge, with nothing lost or applied twice.
//!
//! - Through a TCP proxy: every sink connection reset five times a second apart, then new
//!   connections refused for two seconds.
//! - From inside the sink: `pg_terminate_backend` on every Zipline session, several rounds
//!   (a connection killed mid-batch: whatever transaction it had open is rolled back).
//! - The sink cluster itself crashes (SIGKILL) and restarts.

use crate::{common, e2e};

use std::time::{Duration, Instant};

use common::Proxy;
use e2e::pg::{PgFixture, pg_pipeline_yaml, wait_converged, zipline_backends};
use e2e::workload::{self, Config};
use e2e::{CONVERGE_TIMEOUT, PG_DB, PipelineOpts, Zipline, wait_streaming};

const RETRY_LOG: &str = "transient sink error";

async fn wait_changes(w: &workload::Handle, z: &mut Zipline, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while w.changes() < n {
        assert!(
            Instant::now() < deadline,
            "workload too slow: {}",
            w.changes()
        );
        z.assert_running();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn paced() -> Config {
    let mut cfg = Config::new(workload::seed(), u64::MAX);
    cfg.pause = Duration::from_millis(15);
    cfg
}

fn assert_retried(z: &Zipline) {
    assert!(
        z.output().contains(RETRY_LOG),
        "the log should show a retried sink error (`{RETRY_LOG}`):\n{}",
        z.tail(40)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sink_cuts_and_refusals_converge() {
    let mut fx = PgFixture::start();
    let proxy = Proxy::start(fx.sink.port).await;
    fx.sink_port = proxy.port;
    fx.write_pipeline(&pg_pipeline_yaml(&PipelineOpts::default()));
    let (src, sink) = (fx.src_client().await, fx.sink_client().await);
    let mut z = fx.apply();
    wait_streaming(&src, &mut z, Duration::from_secs(30)).await;
    assert!(
        proxy.wait_for_connections(1, Duration::from_secs(10)).await,
        "zipline streams but holds no sink connection through the proxy"
    );
    let w = workload::start(fx.src.conn_str(PG_DB), paced());
    wait_changes(&w, &mut z, 1_000).await;
    for round in 1..=5 {
        let live = proxy.connections();
        proxy.cut_all();
        eprintln!(
            "e2e: cut {round}: {live} sink connections at {} changes",
            w.changes()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        z.assert_running();
    }
    proxy.cut_all();
    proxy.set_refuse(true);
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.set_refuse(false);
    tokio::time::sleep(Duration::from_secs(1)).await;
    w.stop();
    let report = w.join().await;
    assert!(report.changes >= 3_000, "only {} changes", report.changes);
    wait_converged(&src, &sink, "orders", Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_retried(&z);
    z.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terminated_sink_backends_converge() {
    let mut fx = PgFixture::start();
    fx.write_pipeline(&pg_pipeline_yaml(&PipelineOpts::default()));
    let (src, sink) = (fx.src_client().await, fx.sink_client().await);
    let admin = fx.sink.client("postgres").await;
    let mut z = fx.apply();
    wait_streaming(&src, &mut z, Duration::from_secs(30)).await;
    let w = workload::start(fx.src.conn_str(PG_DB), paced());
    wait_changes(&w, &mut z, 1_000).await;
    let mut total = 0;
    for round in 1..=4 {
        let pids = zipline_backends(&admin).await;
        for pid in &pids {
            // The lane may be reconnecting already: terminating a gone pid returns false.
            admin
                .execute("SELECT pg_terminate_backend($1)", &[pid])
                .await
                .expect("pg_terminate_backend");
        }
        total += pids.len();
        eprintln!(
            "e2e: terminate round {round}: {} sink sessions at {} changes",
            pids.len(),
            w.changes()
        );
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        z.assert_running();
    }
    assert!(total >= 4, "found only {total} sink sessions to terminate");
    w.stop();
    let report = w.join().await;
    assert!(report.changes >= 3_000, "only {} changes", report.changes);
    wait_converged(&src, &sink, "orders", Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_retried(&z);
    z.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sink_server_crash_converges() {
    let mut fx = PgFixture::start();
    fx.write_pipeline(&pg_pipeline_yaml(&PipelineOpts::default()));
    let src = fx.src_client().await;
    let mut z = fx.apply();
    wait_streaming(&src, &mut z, Duration::from_secs(30)).await;
    let w = workload::start(fx.src.conn_str(PG_DB), paced());
    wait_changes(&w, &mut z, 2_000).await;
    fx.sink.kill();
    eprintln!("e2e: sink cluster killed at {} changes", w.changes());
    tokio::time::sleep(Duration::from_secs(1)).await;
    fx.sink.restart();
    eprintln!("e2e: sink cluster back at {} changes", w.changes());
    wait_changes(&w, &mut z, w.changes() + 2_000).await;
    w.stop();
    let report = w.join().await;
    assert!(report.changes >= 4_000, "only {} changes", report.changes);
    let sink = fx.sink_client().await;
    wait_converged(&src, &sink, "orders", Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_retried(&z);
    z.terminate_cleanly(Duration::from_secs(15));
}
