//! Randomized workloads while Zipline streams: the sink must end equal to the source, row for
//! row and by checksum.
//!
//! - `random_workload_converges`: ≥ 20,000 changes over ≥ 2,000 keys from 4 concurrent
//!   writers in multi-statement transactions, including key-changing updates (a row moves to
//!   a key that may live in another lane).
//! - `random_backlog_converges_with_small_batches`: the same, committed while Zipline is
//!   stopped, then replayed as one backlog in small batches.
//! - `truncate_then_insert`: a TRUNCATE must land after every earlier change of every lane and
//!   before every later one.
//! - `toasted_values_survive_partial_updates_and_key_changes`: large values stored out of
//!   line, which pgoutput sends as "unchanged" when an update does not touch them.

use crate::e2e;

use std::time::Duration;

use e2e::workload::{self, Config};
use e2e::{
    CONVERGE_TIMEOUT, Fixture, PG_DB, PipelineOpts, assert_absent_in_sink, pipeline_yaml,
    wait_converged, wait_streaming,
};

/// Starts Zipline with the default pipeline and waits until it streams.
async fn streaming_fixture() -> (
    Fixture,
    e2e::Zipline,
    tokio_postgres::Client,
    mysql_async::Conn,
) {
    let mut fx = Fixture::start();
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    let pg = fx.pg_client().await;
    let my = fx.my_checker().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;
    (fx, z, pg, my)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_workload_converges() {
    let (fx, mut z, pg, mut my) = streaming_fixture().await;
    let w = workload::start(fx.pg.conn_str(PG_DB), Config::new(workload::seed(), 20_000));
    while !w.is_finished() {
        z.assert_running();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let report = w.join().await;
    assert!(report.changes >= 20_000, "only {} changes", report.changes);
    assert!(
        report.keys.len() >= 2_000,
        "only {} keys",
        report.keys.len()
    );
    assert!(report.rekeys > 100, "only {} key changes", report.rekeys);
    assert!(report.deletes > 1_000, "only {} deletes", report.deletes);

    let summary = wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert!(
        summary.count > 100,
        "suspiciously few rows: {}",
        summary.count
    );
    let deleted: Vec<i64> = {
        let live: std::collections::HashSet<i64> = pg
            .query("SELECT id FROM orders", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        report
            .keys
            .iter()
            .copied()
            .filter(|k| !live.contains(k))
            .collect()
    };
    assert_absent_in_sink(&mut my, &deleted).await;
    z.terminate_cleanly(Duration::from_secs(15));
}

/// The same kind of workload committed while Zipline is stopped, then read as one backlog
/// with small batches on 3 lanes: batches full of coalescable changes, and key changes whose
/// old and new keys sit in different lanes' batches at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_backlog_converges_with_small_batches() {
    let mut fx = Fixture::start();
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts {
        lanes: 3,
        sink_extra: vec!["batch_size: 50".to_owned(), "max_wait: 5ms".to_owned()],
        ..PipelineOpts::default()
    }));
    let pg = fx.pg_client().await;
    let mut my = fx.my_checker().await;
    let mut first = fx.apply();
    wait_streaming(&pg, &mut first, Duration::from_secs(30)).await;
    first.terminate_cleanly(Duration::from_secs(15));

    let mut cfg = Config::new(workload::seed(), 20_000);
    cfg.key_space = 2_000;
    cfg.rekey_pct = 15;
    let report = workload::start(fx.pg.conn_str(PG_DB), cfg).join().await;
    assert!(report.changes >= 20_000 && report.keys.len() >= 1_900);

    let mut second = fx.apply();
    let summary = wait_converged(&pg, &mut my, Some(&mut second), CONVERGE_TIMEOUT).await;
    assert!(
        summary.count > 100,
        "suspiciously few rows: {}",
        summary.count
    );
    second.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncate_then_insert() {
    let (_fx, mut z, pg, mut my) = streaming_fixture().await;
    pg.batch_execute(
        "INSERT INTO orders SELECT g, 'c' || g, g * 1.5, 'new', '2024-01-01'::timestamptz + g * interval '1 minute', g % 2 = 0, NULL
         FROM generate_series(1, 300) g",
    )
    .await
    .unwrap();
    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;

    // Changes spread over every lane, then TRUNCATE and re-inserts of some old keys in the
    // same transaction, then more changes right behind it. An update applied after the
    // truncate would resurrect its row; a truncate applied late would wipe the re-inserts.
    pg.batch_execute(
        "UPDATE orders SET status = 'before-truncate' WHERE id % 3 = 0;
         BEGIN;
         UPDATE orders SET amount = amount + 1 WHERE id % 5 = 0;
         TRUNCATE orders;
         INSERT INTO orders VALUES (5, 'again', 5.55, 'reborn', NULL, true, 'after truncate');
         INSERT INTO orders SELECT g, 'new' || g, g, 'fresh', NULL, NULL, NULL FROM generate_series(1000, 1010) g;
         COMMIT;
         INSERT INTO orders VALUES (17, 'late', 1.00, 'new', now(), false, NULL);
         UPDATE orders SET status = 'updated-after' WHERE id IN (5, 1003);",
    )
    .await
    .unwrap();
    let summary = wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_eq!(summary.count, 13, "5, 17 and 1000..=1010");

    // A TRUNCATE in a transaction of its own, immediately followed by inserts.
    pg.batch_execute(
        "TRUNCATE orders;
         INSERT INTO orders SELECT g, NULL, NULL, 'third', NULL, NULL, NULL FROM generate_series(1, 50) g;",
    )
    .await
    .unwrap();
    let summary = wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_eq!(summary.count, 50);
    z.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toasted_values_survive_partial_updates_and_key_changes() {
    let (_fx, mut z, pg, mut my) = streaming_fixture().await;
    // ~6 kB notes, stored out of line and uncompressed (STORAGE EXTERNAL): real TOAST.
    pg.batch_execute(
        "ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;
         INSERT INTO orders SELECT g, 'c' || g, g, 'new', NULL, NULL,
                (SELECT string_agg(md5(g::text || '-' || i), '') FROM generate_series(1, 190) i)
         FROM generate_series(1, 40) g;",
    )
    .await
    .unwrap();
    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;

    pg.batch_execute(
        // The note is not touched: pgoutput sends it as "unchanged TOAST".
        "UPDATE orders SET status = 'paid' WHERE id <= 20;
         UPDATE orders SET amount = amount * 2, flag = true WHERE id BETWEEN 5 AND 15;
         -- Key changes that leave the note untouched: the new row's note is not in the message.
         UPDATE orders SET id = id + 1000 WHERE id BETWEEN 21 AND 30;
         UPDATE orders SET id = id + 2000, status = 'moved' WHERE id BETWEEN 31 AND 35;
         BEGIN;
         UPDATE orders SET status = 'twice' WHERE id = 36;
         UPDATE orders SET id = 3036 WHERE id = 36;
         COMMIT;",
    )
    .await
    .unwrap();
    let summary = wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_eq!(summary.count, 40);
    z.terminate_cleanly(Duration::from_secs(15));
}
