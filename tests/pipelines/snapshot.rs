//! The initial snapshot (`snapshot: initial`, the default): existing rows are copied,
//! consistently with the change stream.
//!
//! - `snapshot_with_concurrent_writes_converges`: 50,000 rows, writers busy before, during and
//!   after the copy; the sink ends equal to the source. A restart afterwards takes no second
//!   snapshot.
//! - `sigkill_mid_snapshot_resumes`: killed halfway through, Zipline resumes: the chunks the
//!   sink had loaded are not copied again (their `done_at` is unchanged) and the sink ends
//!   equal to the source, writers running throughout.
//! - `sigterm_mid_snapshot_stops_cleanly_and_resumes`: SIGTERM stops a snapshot at once
//!   (exit 0); the next start resumes it.
//! - `a_lost_slot_means_a_whole_new_snapshot`: killed mid-snapshot, slot dropped, rows updated
//!   and deleted meanwhile: the next start stops (the sink holds rows of a slot that is gone);
//!   with `snapshot: when_needed` the sink's tables are emptied and the new slot gets a whole
//!   new snapshot (chunks of the old one are copied again), so nothing that happened while no
//!   slot existed is lost — deletes included.
//! - `snapshot_rows_pass_through_the_transform`: the route's transform masks a column and
//!   drops a table, for copied rows as for streamed changes.
//! - `snapshot_never_copies_nothing`: with `snapshot: never`, existing rows stay behind.

use crate::e2e;

use std::time::{Duration, Instant};

use e2e::snapshot::{field, loaded, log_line, seed_orders, snapshot_rows, wait_log};
use e2e::workload::{self, Config};
use e2e::{
    CONVERGE_TIMEOUT, Fixture, MY_DB, PG_DB, PipelineOpts, pipeline_yaml, wait_converged,
    wait_streaming,
};
use mysql_async::prelude::Queryable;

const SNAPSHOT_DONE: &str = "snapshot complete";

/// A sink connection for checks. The sink-side checksum is one `GROUP_CONCAT` of the whole
/// table, which the server cuts at `max_allowed_packet` (16 MiB by default): raised first.
async fn checker(fx: &Fixture) -> mysql_async::Conn {
    fx.my.sql("", "SET GLOBAL max_allowed_packet = 1073741824");
    fx.my_checker().await
}

fn opts(source_extra: &[&str]) -> PipelineOpts {
    PipelineOpts {
        source_extra: source_extra.iter().map(|s| (*s).to_owned()).collect(),
        ..PipelineOpts::default()
    }
}

/// Writers over keys 1..=`key_space`, TOASTed notes included, until stopped.
fn writers(fx: &Fixture, key_space: i64) -> workload::Handle {
    let mut cfg = Config::new(workload::seed(), u64::MAX);
    cfg.key_space = key_space;
    cfg.toast_pct = 3;
    cfg.pause = Duration::from_millis(5);
    workload::start(fx.pg.conn_str(PG_DB), cfg)
}

async fn wait_changes(w: &workload::Handle, at_least: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while w.changes() < at_least {
        assert!(Instant::now() < deadline, "the workload is too slow");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshot_with_concurrent_writes_converges() {
    let mut fx = Fixture::start();
    let pg = fx.pg_client().await;
    let mut my = checker(&fx).await;
    seed_orders(&pg, 1, 50_000).await;
    let yaml = pipeline_yaml(&opts(&["snapshot_chunk_rows: 2000"]))
        .replace("progress_interval: 5s", "progress_interval: 1s");
    fx.write_pipeline(&yaml);

    let w = writers(&fx, 60_000);
    wait_changes(&w, 300).await;
    let mut z = fx.apply();
    wait_log(&mut z, "created replication slot", Duration::from_secs(30)).await;
    let at_slot = w.changes();
    wait_log(&mut z, SNAPSHOT_DONE, Duration::from_secs(120)).await;
    let at_done = w.changes();
    assert!(
        at_done > at_slot,
        "no write committed during the snapshot ({at_slot} changes at slot creation, {at_done} \
         at its end)"
    );
    wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;
    wait_changes(&w, at_done + 500).await;
    w.stop();
    let report = w.join().await;
    eprintln!(
        "e2e: {} changes before the slot, {} during the snapshot, {} after",
        at_slot,
        at_done - at_slot,
        report.changes - at_done
    );

    let summary = wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert!(summary.count > 40_000, "only {} rows", summary.count);
    let done = log_line(&z, SNAPSHOT_DONE).unwrap();
    let copied = field(&done, "rows").expect("rows= in the completion line");
    assert!(
        copied >= 49_000,
        "the snapshot copied {copied} rows: {done}"
    );
    let state = snapshot_rows(&mut my).await;
    assert_eq!(
        state.first().map(|r| (r.chunk, r.done_at.is_some())),
        Some((-1, true)),
        "the marker row says complete: {state:?}"
    );
    assert!(
        loaded(&state).len() >= 20,
        "about 25 chunks of 2,000 rows: {state:?}"
    );
    z.terminate_cleanly(Duration::from_secs(15));

    // A restart streams on: no second snapshot.
    let mut again = fx.apply();
    wait_streaming(&pg, &mut again, Duration::from_secs(30)).await;
    pg.batch_execute(
        "UPDATE orders SET note = 'after restart' WHERE id = (SELECT min(id) FROM orders)",
    )
    .await
    .unwrap();
    wait_converged(&pg, &mut my, Some(&mut again), CONVERGE_TIMEOUT).await;
    assert!(
        !again.output().contains("initial snapshot"),
        "a restart took a snapshot again:\n{}",
        again.tail(30)
    );
    again.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_mid_snapshot_resumes() {
    let mut fx = Fixture::start();
    let pg = fx.pg_client().await;
    let mut my = checker(&fx).await;
    seed_orders(&pg, 1, 150_000).await;
    let yaml = pipeline_yaml(&opts(&[
        "snapshot_chunk_rows: 1000",
        "snapshot_parallelism: 2",
    ]))
    .replace("progress_interval: 5s", "progress_interval: 200ms");
    fx.write_pipeline(&yaml);

    let w = writers(&fx, 160_000);
    let mut first = fx.apply();
    wait_log(&mut first, "initial snapshot", Duration::from_secs(30)).await;
    // Kill once a good share of the chunks (about 150) is in, well before the end.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        first.assert_running();
        let done = loaded(&snapshot_rows(&mut my).await).len();
        // A progress line with a rate (and so an ETA): under load the first ones may
        // precede the first loaded rows.
        let timed = first
            .output()
            .lines()
            .any(|l| l.contains("snapshot progress") && l.contains(" eta_s="));
        if done >= 20 && timed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {done} chunks loaded after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.signal("KILL");
    first.wait_exit(Duration::from_secs(10));
    assert!(
        !first.output().contains(SNAPSHOT_DONE),
        "the snapshot finished before the kill"
    );
    let output = first.output();
    let progress = output
        .lines()
        .rfind(|l| l.contains("snapshot progress"))
        .expect("progress lines while copying");
    for key in ["rows", "estimate", "rows_per_sec", "eta_s", "chunks"] {
        assert!(field(progress, key).is_some(), "no {key}= in {progress}");
    }
    let before = loaded(&snapshot_rows(&mut my).await);
    eprintln!("e2e: killed with {} chunks loaded", before.len());
    assert!(before.len() < 140, "nearly everything was loaded already");
    wait_changes(&w, w.changes() + 300).await;

    let mut second = fx.apply();
    wait_log(&mut second, "snapshot resumes", Duration::from_secs(30)).await;
    let resumed = log_line(&second, "snapshot resumes").unwrap();
    assert_eq!(
        field(&resumed, "loaded"),
        Some(before.len() as u64),
        "the resumed run counts exactly the chunks loaded before the kill: {resumed}"
    );
    wait_log(&mut second, SNAPSHOT_DONE, Duration::from_secs(180)).await;
    let done = log_line(&second, SNAPSHOT_DONE).unwrap();
    assert_eq!(
        field(&done, "chunks").map(|c| c + before.len() as u64),
        field(&resumed, "chunks"),
        "the resumed run copied only the chunks missing: {done}"
    );
    let after = loaded(&snapshot_rows(&mut my).await);
    for chunk in &before {
        let now = after
            .iter()
            .find(|c| c.table == chunk.table && c.chunk == chunk.chunk);
        assert_eq!(
            now,
            Some(chunk),
            "chunk {} was loaded again after the restart",
            chunk.chunk
        );
    }
    wait_streaming(&pg, &mut second, Duration::from_secs(30)).await;
    wait_changes(&w, w.changes() + 500).await;
    w.stop();
    w.join().await;
    wait_converged(&pg, &mut my, Some(&mut second), CONVERGE_TIMEOUT).await;
    second.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_snapshot_stops_cleanly_and_resumes() {
    let mut fx = Fixture::start();
    let pg = fx.pg_client().await;
    let mut my = checker(&fx).await;
    seed_orders(&pg, 1, 150_000).await;
    fx.write_pipeline(&pipeline_yaml(&opts(&["snapshot_chunk_rows: 1000"])));
    let mut first = fx.apply();
    let deadline = Instant::now() + Duration::from_secs(120);
    while loaded(&snapshot_rows(&mut my).await).len() < 5 {
        first.assert_running();
        assert!(Instant::now() < deadline, "no chunk loaded after 120 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = first.terminate_cleanly(Duration::from_secs(10));
    eprintln!("e2e: SIGTERM mid-snapshot: exit 0 after {took:.1?}");
    assert!(
        first.output().contains("snapshot interrupted"),
        "the snapshot was not interrupted:\n{}",
        first.tail(20)
    );
    let mut second = fx.apply();
    wait_log(&mut second, "snapshot resumes", Duration::from_secs(30)).await;
    wait_log(&mut second, SNAPSHOT_DONE, Duration::from_secs(180)).await;
    wait_converged(&pg, &mut my, Some(&mut second), CONVERGE_TIMEOUT).await;
    second.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_slot_means_a_whole_new_snapshot() {
    let mut fx = Fixture::start();
    let pg = fx.pg_client().await;
    let mut my = checker(&fx).await;
    seed_orders(&pg, 1, 60_000).await;
    fx.write_pipeline(&pipeline_yaml(&opts(&["snapshot_chunk_rows: 1000"])));

    let mut first = fx.apply();
    let deadline = Instant::now() + Duration::from_secs(120);
    while loaded(&snapshot_rows(&mut my).await).len() < 10 {
        first.assert_running();
        assert!(Instant::now() < deadline, "no chunk loaded after 120 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.signal("KILL");
    first.wait_exit(Duration::from_secs(10));
    let before = loaded(&snapshot_rows(&mut my).await);
    // The slot goes (once the killed process's connections are gone), and rows change while
    // none exists: no stream will ever carry that.
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = pg
        .batch_execute(&format!("SELECT pg_drop_replication_slot('{}')", e2e::SLOT))
        .await
    {
        assert!(Instant::now() < deadline, "cannot drop the slot: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pg.batch_execute(
        "UPDATE orders SET status = 'no slot' WHERE id % 10 = 0;
         DELETE FROM orders WHERE id % 10 = 5;",
    )
    .await
    .unwrap();

    // Not silently: the sink holds rows of a slot that is gone.
    let mut refused = fx.apply();
    let status = refused
        .wait_exit(Duration::from_secs(60))
        .expect("a start without the slot stops");
    assert_eq!(status.code(), Some(1), "{}", refused.tail(20));
    assert!(
        refused
            .output()
            .contains("replication slot zipline_e2e does not exist, but the sinks hold rows"),
        "{}",
        refused.tail(20)
    );
    // snapshot: when_needed starts over by itself.
    fx.write_pipeline(&pipeline_yaml(&opts(&[
        "snapshot_chunk_rows: 1000",
        "snapshot: when_needed",
    ])));
    let mut second = fx.apply();
    wait_log(
        &mut second,
        "emptied for a new snapshot",
        Duration::from_secs(30),
    )
    .await;
    wait_log(&mut second, "initial snapshot", Duration::from_secs(30)).await;
    wait_log(&mut second, SNAPSHOT_DONE, Duration::from_secs(180)).await;
    assert!(
        !second.output().contains("snapshot resumes"),
        "a new slot must not resume the old snapshot"
    );
    let after = loaded(&snapshot_rows(&mut my).await);
    for chunk in &before {
        let now = after
            .iter()
            .find(|c| c.table == chunk.table && c.chunk == chunk.chunk);
        assert_ne!(
            now.and_then(|c| c.done_at.clone()),
            chunk.done_at,
            "chunk {} of the old snapshot was kept",
            chunk.chunk
        );
    }
    wait_converged(&pg, &mut my, Some(&mut second), CONVERGE_TIMEOUT).await;
    second.terminate_cleanly(Duration::from_secs(15));
}

/// The rust-mask example guest (built by `tests/guests/build.sh`, as for `transform_e2e`).
fn rust_mask() -> std::path::PathBuf {
    let path =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/guests/rust-mask.wasm");
    assert!(
        path.exists(),
        "{} is missing: build the test guests first with tests/guests/build.sh (or `.ci/run guests`)",
        path.display()
    );
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_rows_pass_through_the_transform() {
    let mut fx = Fixture::start();
    let pg = fx.pg_client().await;
    let mut my = checker(&fx).await;
    pg.batch_execute(
        "CREATE TABLE audit_log (id bigserial PRIMARY KEY, what text);
         INSERT INTO audit_log (what) SELECT 'old ' || g FROM generate_series(1, 3000) g;
         INSERT INTO orders (id, customer, amount, status)
           SELECT g, 'c' || g || '@shop.test', g, 'old' FROM generate_series(1, 5000) g;",
    )
    .await
    .unwrap();
    fx.my.sql(
        MY_DB,
        "CREATE TABLE audit_log (id BIGINT PRIMARY KEY, what TEXT) ENGINE=InnoDB",
    );
    let yaml = format!(
        "{}    transform:\n      module: {}\n      config: {{ columns: customer, drop: audit_log }}\n",
        pipeline_yaml(&opts(&["snapshot_chunk_rows: 700"])),
        rust_mask().display()
    );
    fx.write_pipeline(&yaml);
    let mut z = fx.apply();
    wait_log(&mut z, SNAPSHOT_DONE, Duration::from_secs(60)).await;
    wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;
    pg.batch_execute("UPDATE orders SET customer = 'new@later.test' WHERE id = 1")
        .await
        .unwrap();
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let first: Option<String> = my
            .query_first(format!("SELECT customer FROM {MY_DB}.orders WHERE id = 1"))
            .await
            .unwrap();
        if first.as_deref() == Some("n***@later.test") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the update never arrived: {first:?}"
        );
        z.assert_running();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (count, unmasked): (i64, i64) = my
        .query_first(format!(
            "SELECT COUNT(*), SUM(customer NOT LIKE '_***@%') FROM {MY_DB}.orders"
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (count, unmasked),
        (5000, 0),
        "every row copied, every customer masked"
    );
    let audit: Option<i64> = my
        .query_first(format!("SELECT COUNT(*) FROM {MY_DB}.audit_log"))
        .await
        .unwrap();
    assert_eq!(
        audit,
        Some(0),
        "the transform drops audit_log, snapshot included"
    );
    z.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_never_copies_nothing() {
    let mut fx = Fixture::start();
    let pg = fx.pg_client().await;
    let mut my = checker(&fx).await;
    seed_orders(&pg, 1, 500).await;
    fx.write_pipeline(&pipeline_yaml(&opts(&["snapshot: never"])));
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;
    pg.batch_execute("INSERT INTO orders VALUES (1000000, 'new', 1.00, 'new', now(), true, NULL)")
        .await
        .unwrap();
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let ids: Vec<i64> = my
            .query(format!("SELECT id FROM {MY_DB}.orders ORDER BY id"))
            .await
            .unwrap();
        if !ids.is_empty() {
            assert_eq!(ids, [1_000_000], "only the new row reaches the sink");
            break;
        }
        assert!(Instant::now() < deadline, "the new row never arrived");
        z.assert_running();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Only the marker that the pipeline starts here (a later start tells lost sink state
    // from a first one by it), complete, with no chunk.
    let state = snapshot_rows(&mut my).await;
    assert!(
        state.len() == 1 && state[0].chunk == -1 && state[0].done_at.is_some(),
        "no snapshot without a snapshot: {state:?}"
    );
    assert!(!z.output().contains("initial snapshot"));
    z.terminate_cleanly(Duration::from_secs(15));
}
