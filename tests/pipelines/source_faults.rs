//! Source faults while the workload runs: the replication stream must be re-established from
//! the durable frontier and the sink must converge, nothing lost or applied twice.
//!
//! - The replication connection reset through a TCP proxy, several times (the server's
//!   walsender then holds the slot until `wal_sender_timeout` expires: Zipline must wait it out).
//! - A silent partition (the proxy stops forwarding): only Zipline's receive watchdog notices.
//! - The source server crashes (SIGKILL) and restarts.

use crate::{common, e2e};

use std::time::{Duration, Instant};

use common::Proxy;
use e2e::workload::{self, Config};
use e2e::{
    CONVERGE_TIMEOUT, Fixture, PG_DB, PipelineOpts, pipeline_yaml, wait_converged, wait_streaming,
};

const RECONNECT_LOG: &str = "replication stream lost; reconnecting";

/// Runs `zipline pipeline apply` with the source's port replaced by `source_port`.
fn apply_via(fx: &mut Fixture, source_port: u16) -> e2e::Zipline {
    let args = fx.args("apply");
    let mut env = fx.env();
    for (k, v) in &mut env {
        if k == "POSTGRES_PORT" {
            *v = source_port.to_string();
        }
    }
    fx.spawn(&args, &env)
}

async fn wait_changes(w: &workload::Handle, z: &mut e2e::Zipline, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while w.changes() < n {
        assert!(
            Instant::now() < deadline,
            "workload too slow: {} changes",
            w.changes()
        );
        z.assert_running();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn paced(seed: u64) -> Config {
    let mut cfg = Config::new(seed, u64::MAX);
    cfg.pause = Duration::from_millis(15);
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replication_connection_cuts_converge() {
    let mut fx = Fixture::start();
    let proxy = Proxy::start(fx.pg.port).await;
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    let pg = fx.pg_client().await;
    let mut my = fx.my_checker().await;
    let mut z = apply_via(&mut fx, proxy.port);
    wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;

    let w = workload::start(fx.pg.conn_str(PG_DB), paced(workload::seed()));
    wait_changes(&w, &mut z, 1_000).await;
    for round in 1..=3 {
        let live = proxy.connections();
        proxy.cut_all();
        eprintln!(
            "e2e: cut {round}: reset {live} source connections at {} changes",
            w.changes()
        );
        // Long enough for the server to time out the old walsender (2 s in tests) and for
        // Zipline to get the slot back and stream again.
        tokio::time::sleep(Duration::from_secs(4)).await;
        z.assert_running();
    }
    w.stop();
    let report = w.join().await;
    assert!(report.changes >= 3_000, "only {} changes", report.changes);

    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert!(
        z.output().contains(RECONNECT_LOG),
        "the log should show the stream re-established (`{RECONNECT_LOG}`):\n{}",
        z.tail(40)
    );
    z.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_partition_is_detected_and_healed() {
    let mut fx = Fixture::start();
    let proxy = Proxy::start(fx.pg.port).await;
    let opts = PipelineOpts {
        source_extra: vec![
            "receive_timeout: 3s".to_owned(),
            "status_interval: 1s".to_owned(),
        ],
        ..PipelineOpts::default()
    };
    fx.write_pipeline(&pipeline_yaml(&opts));
    let pg = fx.pg_client().await;
    let mut my = fx.my_checker().await;
    let mut z = apply_via(&mut fx, proxy.port);
    wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;

    let w = workload::start(fx.pg.conn_str(PG_DB), paced(workload::seed()));
    wait_changes(&w, &mut z, 1_000).await;
    proxy.set_stall(true);
    eprintln!("e2e: partition at {} changes", w.changes());
    tokio::time::sleep(Duration::from_secs(5)).await;
    proxy.set_stall(false);
    // Connections that were stalled are dead for both ends; drop them so the new one is clean.
    proxy.cut_all();
    wait_changes(&w, &mut z, w.changes() + 1_000).await;
    w.stop();
    w.join().await;

    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert!(
        z.output().contains("receive_timeout"),
        "the watchdog should have named the silent connection:\n{}",
        z.tail(40)
    );
    z.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn source_server_crash_converges() {
    let mut fx = Fixture::start();
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    let mut z = fx.apply();
    {
        let pg = fx.pg_client().await;
        wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;
    }
    let seed = workload::seed();
    let w = workload::start(fx.pg.conn_str(PG_DB), paced(seed));
    wait_changes(&w, &mut z, 2_000).await;
    w.stop();
    w.join().await;
    fx.pg.kill();
    eprintln!("e2e: source server killed");
    tokio::time::sleep(Duration::from_secs(1)).await;
    fx.pg.restart();
    eprintln!("e2e: source server back");

    let w = workload::start(fx.pg.conn_str(PG_DB), paced(seed.wrapping_add(1)));
    wait_changes(&w, &mut z, 2_000).await;
    w.stop();
    w.join().await;

    let pg = fx.pg_client().await;
    let mut my = fx.my_checker().await;
    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert!(
        z.output().contains(RECONNECT_LOG),
        "the log should show the stream re-established (`{RECONNECT_LOG}`):\n{}",
        z.tail(40)
    );
    z.terminate_cleanly(Duration::from_secs(15));
}
