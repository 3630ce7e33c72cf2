//! Sink connection faults while the workload runs: the lanes must retry (reconnecting) and
//! the sink must still converge, with nothing lost or applied twice.
//!
//! - Through a TCP proxy: every sink connection reset five times a second apart, then new
//!   connections refused for two seconds.
//! - From inside MariaDB: `KILL` every connection of the sink database, a few times.
//! - The sink server itself crashes (SIGKILL) and restarts.

use crate::{common, e2e};

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;

use common::Proxy;
use e2e::workload::{self, Config};
use e2e::{
    CONVERGE_TIMEOUT, Fixture, MY_DB, PG_DB, PipelineOpts, pipeline_yaml, wait_converged,
    wait_streaming,
};

const RETRY_LOG: &str = "transient sink error";

/// Waits until the workload has committed `n` changes.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sink_cuts_and_refusals_converge() {
    let mut fx = Fixture::start();
    let proxy = Proxy::start(fx.my.port).await;
    fx.mysql_port = proxy.port;
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    let pg = fx.pg_client().await;
    let mut my = fx.my_checker().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;
    assert!(
        proxy.wait_for_connections(1, Duration::from_secs(10)).await,
        "zipline streams but holds no sink connection through the proxy on port {} \
         (did it switch to the Unix socket?)",
        proxy.port
    );

    let mut cfg = Config::new(workload::seed(), u64::MAX);
    cfg.pause = Duration::from_millis(15);
    let w = workload::start(fx.pg.conn_str(PG_DB), cfg);
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

    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert!(
        z.output().contains(RETRY_LOG),
        "the log should show a retried sink error (`{RETRY_LOG}`):\n{}",
        z.tail(40)
    );
    z.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_sink_connections_converge() {
    let mut fx = Fixture::start();
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    let pg = fx.pg_client().await;
    // Neither connection uses `shop` as its default database, so the KILLs spare them.
    let mut my = fx.my_checker().await;
    let mut killer = fx.my.conn("").await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;

    let mut cfg = Config::new(workload::seed(), u64::MAX);
    cfg.pause = Duration::from_millis(15);
    let w = workload::start(fx.pg.conn_str(PG_DB), cfg);
    wait_changes(&w, &mut z, 1_000).await;
    let mut total_killed = 0;
    for round in 1..=4 {
        let ids: Vec<u64> = killer
            .query(format!(
                "SELECT id FROM information_schema.PROCESSLIST WHERE db = '{MY_DB}' AND id <> CONNECTION_ID()"
            ))
            .await
            .expect("listing sink connections");
        for id in &ids {
            // The connection may be gone already (a lane reconnecting): "Unknown thread id".
            if let Err(e) = killer.query_drop(format!("KILL {id}")).await {
                eprintln!("e2e: KILL {id}: {e}");
            }
        }
        total_killed += ids.len();
        eprintln!(
            "e2e: kill round {round}: {} sink connections at {} changes",
            ids.len(),
            w.changes()
        );
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        z.assert_running();
    }
    assert!(
        total_killed >= 4,
        "found only {total_killed} sink connections to kill"
    );
    w.stop();
    let report = w.join().await;
    assert!(report.changes >= 3_000, "only {} changes", report.changes);

    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert!(
        z.output().contains(RETRY_LOG),
        "the log should show a retried sink error (`{RETRY_LOG}`):\n{}",
        z.tail(40)
    );
    z.terminate_cleanly(Duration::from_secs(15));
}

/// The sink server crashes (SIGKILL) mid-workload and comes back a second later: the lanes
/// retry until it is back, and whatever batch was in flight is applied exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sink_server_crash_converges() {
    let mut fx = Fixture::start();
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    let pg = fx.pg_client().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;

    let mut cfg = Config::new(workload::seed(), u64::MAX);
    cfg.pause = Duration::from_millis(15);
    let w = workload::start(fx.pg.conn_str(PG_DB), cfg);
    wait_changes(&w, &mut z, 2_000).await;
    fx.my.kill();
    eprintln!("e2e: sink server killed at {} changes", w.changes());
    tokio::time::sleep(Duration::from_secs(1)).await;
    fx.my.restart();
    eprintln!("e2e: sink server back at {} changes", w.changes());
    wait_changes(&w, &mut z, w.changes() + 2_000).await;
    w.stop();
    let report = w.join().await;
    assert!(report.changes >= 4_000, "only {} changes", report.changes);

    let mut my = fx.my_checker().await;
    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert!(
        z.output().contains(RETRY_LOG),
        "the log should show a retried sink error (`{RETRY_LOG}`):\n{}",
        z.tail(40)
    );
    z.terminate_cleanly(Duration::from_secs(15));
}
