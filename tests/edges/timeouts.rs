//! Timeouts everywhere: a source that accepts TCP and never answers the handshake, a sink
//! connection that stalls silently (replaced after `statement_timeout`, while the walsender's
//! keepalives keep being answered), a SIGTERM while the sink stalls (bounded by
//! `drain_timeout`), and a sink outage (ridden out; given up after `sink_outage_timeout`).

use std::time::{Duration, Instant};

use crate::common::Proxy;
use crate::e2e::workload::{self, Config};
use crate::e2e::{
    CONVERGE_TIMEOUT, Fixture, PG_DB, PipelineOpts, Zipline, pipeline_yaml, wait_converged,
    wait_streaming,
};

fn writers(fx: &Fixture) -> workload::Handle {
    let mut cfg = Config::new(workload::seed(), u64::MAX);
    cfg.key_space = 2_000;
    cfg.pause = Duration::from_millis(10);
    workload::start(fx.pg.conn_str(PG_DB), cfg)
}

/// The sink through `proxy`, with `sink_extra` settings.
async fn through_proxy(sink_extra: &[&str], settings: &str) -> (Fixture, Proxy) {
    let mut fx = Fixture::start();
    let proxy = Proxy::start(fx.my.port).await;
    fx.mysql_port = proxy.port;
    let mut yaml = pipeline_yaml(&PipelineOpts {
        sink_extra: sink_extra.iter().map(|s| (*s).to_owned()).collect(),
        ..PipelineOpts::default()
    });
    yaml = yaml.replace(
        "settings:\n  progress_interval: 5s\n",
        &format!("settings:\n  progress_interval: 5s\n{settings}"),
    );
    fx.write_pipeline(&yaml);
    (fx, proxy)
}

#[tokio::test]
async fn a_source_that_never_answers_the_handshake_times_out() {
    let mut fx = Fixture::start();
    let proxy = Proxy::start(fx.pg.port).await;
    proxy.set_stall(true);
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts {
        source_extra: vec!["connect_timeout: 1s".into(), "connect_retries: 1".into()],
        ..PipelineOpts::default()
    }));
    let args = fx.args("apply");
    let mut env = fx.env();
    for (k, v) in &mut env {
        if k == "POSTGRES_PORT" {
            *v = proxy.port.to_string();
        }
    }
    let started = Instant::now();
    let (code, out, took) = fx.run_to_exit(&args, &env, Duration::from_secs(60));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("did not complete the startup handshake within 1s (connect_timeout)"),
        "{out}"
    );
    assert!(took < Duration::from_secs(20), "took {took:?}");
    eprintln!("edges: silent source refused in {:.1?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_sink_connection_is_replaced_and_keepalives_still_answered() {
    let (mut fx, proxy) =
        through_proxy(&["statement_timeout: 2s", "connect_timeout: 2s"], "").await;
    let pg = fx.pg_client().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(60)).await;
    let w = writers(&fx);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Longer than the test server's wal_sender_timeout (2s): the lanes block, yet the
    // replication connection must live on.
    proxy.set_stall(true);
    tokio::time::sleep(Duration::from_secs(6)).await;
    proxy.set_stall(false);
    proxy.cut_all();
    w.stop();
    w.join().await;
    let mut my = fx.my_checker().await;
    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    let out = z.output();
    assert!(out.contains("(statement_timeout)"), "{}", z.tail(30));
    assert!(
        !out.contains("replication stream lost"),
        "the walsender gave up on Zipline while the sink stalled:\n{}",
        z.tail(30)
    );
    z.terminate_cleanly(Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_while_the_sink_stalls_stops_within_drain_timeout() {
    let (mut fx, proxy) = through_proxy(&["statement_timeout: 30s"], "  drain_timeout: 2s\n").await;
    let pg = fx.pg_client().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(60)).await;
    let w = writers(&fx);
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.set_stall(true);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = Instant::now();
    let status = z
        .terminate(Duration::from_secs(15))
        .unwrap_or_else(|| panic!("SIGTERM was not bounded by drain_timeout:\n{}", z.tail(30)));
    assert_eq!(status.code(), Some(1), "{}", z.tail(30));
    assert!(
        asked.elapsed() < Duration::from_secs(8),
        "{:?}",
        asked.elapsed()
    );
    assert!(
        z.output().contains("within drain_timeout"),
        "{}",
        z.tail(20)
    );
    w.stop();
    w.join().await;
    proxy.set_stall(false);
    proxy.cut_all();
    // Only what was durable was confirmed: the next start converges.
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(60)).await;
    let mut my = fx.my_checker().await;
    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    z.terminate_cleanly(Duration::from_secs(20));
}

async fn outage(fx: &mut Fixture, z: &mut Zipline, down: Duration) {
    fx.my.kill();
    tokio::time::sleep(down).await;
    z.assert_running();
    fx.my.restart();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sink_outage_is_ridden_out_until_sink_outage_timeout() {
    let (mut fx, _proxy) = through_proxy(&["sink_outage_timeout: 60s"], "").await;
    let pg = fx.pg_client().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(60)).await;
    let w = writers(&fx);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Longer than the ten retries (about 20 s) that used to stop the pipeline.
    outage(&mut fx, &mut z, Duration::from_secs(25)).await;
    w.stop();
    w.join().await;
    let mut my = fx.my_checker().await;
    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    z.terminate_cleanly(Duration::from_secs(20));

    // An outage longer than sink_outage_timeout stops it, saying so.
    fx.write_pipeline(
        &std::fs::read_to_string(fx.dir.path().join("orders.yaml"))
            .expect("pipeline file")
            .replace("sink_outage_timeout: 60s", "sink_outage_timeout: 3s"),
    );
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(60)).await;
    fx.my.kill();
    pg.batch_execute(
        "INSERT INTO orders VALUES (424242, 'x', 1, 'new', now(), true, NULL) \
         ON CONFLICT (id) DO NOTHING",
    )
    .await
    .expect("a write to apply");
    z.expect_failure(
        Duration::from_secs(60),
        "longer than sink_outage_timeout 3s",
    );
    fx.my.restart();
}
