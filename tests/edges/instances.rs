//! One live instance per pipeline (see `src/checkpoint/fence.rs`).

use std::time::{Duration, Instant};

use crate::e2e::snapshot::{seed_orders, wait_log};
use crate::e2e::workload::{self, Config};
use crate::e2e::{
    CONVERGE_TIMEOUT, Fixture, PG_DB, PipelineOpts, Zipline, pipeline_yaml, wait_converged,
    wait_streaming,
};

fn writers(fx: &Fixture, key_space: i64) -> workload::Handle {
    let mut cfg = Config::new(workload::seed(), u64::MAX);
    cfg.key_space = key_space;
    cfg.pause = Duration::from_millis(3);
    workload::start(fx.pg.conn_str(PG_DB), cfg)
}

/// Runs a second `apply` that must be refused: exit 1 within seconds, naming the first
/// instance's process.
fn assert_refused(fx: &mut Fixture, first: &Zipline) {
    let started = Instant::now();
    let mut second = fx.apply();
    let status = second
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("a second instance kept running:\n{}", second.tail(40)));
    assert_eq!(status.code(), Some(1), "{}", second.tail(40));
    let out = second.output();
    let holder = format!(
        "pipeline orders is already running: process {} on host ",
        first.pid().expect("first instance running")
    );
    assert!(out.contains(&holder), "expected `{holder}` in:\n{out}");
    assert!(
        !out.contains("snapshot") && !out.contains("streaming") && !out.contains("lane open"),
        "the refused instance did work before stopping:\n{out}"
    );
    eprintln!(
        "edges: second instance refused in {:.1?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_second_instance_is_refused_from_its_first_step() {
    let mut fx = Fixture::start();
    let pg = fx.pg_client().await;
    seed_orders(&pg, 1, 60_000).await;
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts {
        source_extra: vec!["snapshot_chunk_rows: 2000".into()],
        ..PipelineOpts::default()
    }));
    let w = writers(&fx, 80_000);
    let mut first = fx.apply();
    // Mid-snapshot, as an orchestrator's rolling restart would start it.
    wait_log(
        &mut first,
        "initial snapshot: copying",
        Duration::from_secs(60),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_refused(&mut fx, &first);
    wait_streaming(&pg, &mut first, Duration::from_secs(120)).await;
    // And while streaming.
    assert_refused(&mut fx, &first);
    w.stop();
    w.join().await;
    let mut my = fx.my_checker().await;
    wait_converged(&pg, &mut my, Some(&mut first), CONVERGE_TIMEOUT).await;
    first.terminate_cleanly(Duration::from_secs(20));
    // A clean stop releases the claim: the next start goes ahead at once.
    let mut third = fx.apply();
    wait_streaming(&pg, &mut third, Duration::from_secs(60)).await;
    third.terminate_cleanly(Duration::from_secs(20));
}

#[tokio::test]
async fn a_frozen_instance_is_taken_over_and_stops_without_writing_when_it_wakes() {
    let mut fx = Fixture::start();
    let pg = fx.pg_client().await;
    let mut yaml = pipeline_yaml(&PipelineOpts::default());
    yaml = yaml.replace(
        "settings:\n  progress_interval: 5s\n",
        "settings:\n  progress_interval: 5s\n  instance_lease: 3s\n",
    );
    fx.write_pipeline(&yaml);
    let mut first = fx.apply();
    wait_streaming(&pg, &mut first, Duration::from_secs(60)).await;
    let w = writers(&fx, 2_000);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Frozen (an unresponsive VM, a stopped container): its sessions stay open, so while its
    // last heartbeat is younger than the lease it still counts as live.
    first.signal("STOP");
    assert_refused(&mut fx, &first);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut second = fx.apply();
    wait_log(
        &mut second,
        "taking over from an instance that stopped heartbeating",
        Duration::from_secs(30),
    )
    .await;
    wait_streaming(&pg, &mut second, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The old one wakes up with batches of its own in memory: it must not write them.
    first.signal("CONT");
    let status = first
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the fenced instance kept running:\n{}", first.tail(40)));
    assert_eq!(status.code(), Some(1), "{}", first.tail(40));
    let out = first.output();
    assert!(
        out.contains("another instance of pipeline orders took over this sink"),
        "{}",
        first.tail(40)
    );

    w.stop();
    w.join().await;
    let mut my = fx.my_checker().await;
    wait_converged(&pg, &mut my, Some(&mut second), CONVERGE_TIMEOUT).await;
    second.terminate_cleanly(Duration::from_secs(20));
}
