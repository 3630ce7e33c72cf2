//! Transactions larger than `logical_decoding_work_mem`: with pgoutput protocol 2 the server
//! streams them while they run; Zipline spills them to disk and applies them only at commit,
//! drops aborted ones and rolled-back savepoints, and keeps other transactions flowing.

use crate::e2e;

use std::time::Duration;

use e2e::{CONVERGE_TIMEOUT, Fixture, PipelineOpts, pipeline_yaml, wait_converged, wait_streaming};

const ROW: &str = "'c' || g, (g % 1000)::numeric / 10, 'new', timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', g % 2 = 0, repeat('n', 50)";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streamed_transactions_commit_abort_and_savepoints() {
    let mut fx = Fixture::start();
    // The minimum: every transaction below of more than a few hundred rows is streamed.
    fx.pg.psql(
        "postgres",
        "ALTER SYSTEM SET logical_decoding_work_mem = '64kB'",
    );
    fx.pg.psql("postgres", "SELECT pg_reload_conf()");
    let spill = fx.dir.path().join("spill");
    let opts = PipelineOpts {
        source_extra: vec![format!("spill_dir: {}", spill.display())],
        ..PipelineOpts::default()
    };
    fx.write_pipeline(&pipeline_yaml(&opts));
    let pg = fx.pg_client().await;
    let writer = fx.pg_client().await;
    let mut my = fx.my_checker().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;

    // A large transaction, still open while smaller ones commit around it; one of its
    // savepoints is rolled back.
    writer
        .batch_execute(&format!(
            "BEGIN; INSERT INTO orders SELECT g, {ROW} FROM generate_series(1, 100000) g;
             SAVEPOINT s1; INSERT INTO orders SELECT g, {ROW} FROM generate_series(100001, 120000) g;
             ROLLBACK TO SAVEPOINT s1;
             SAVEPOINT s2; UPDATE orders SET status = 'kept' WHERE id % 7 = 0; RELEASE SAVEPOINT s2;"
        ))
        .await
        .expect("large transaction, first part");
    pg.batch_execute(&format!(
        "INSERT INTO orders SELECT g, {ROW} FROM generate_series(500001, 500100) g"
    ))
    .await
    .expect("small transaction");
    writer
        .batch_execute(&format!(
            "DELETE FROM orders WHERE id % 11 = 0; INSERT INTO orders SELECT g, {ROW} FROM generate_series(120001, 150000) g; COMMIT"
        ))
        .await
        .expect("large transaction, commit");

    // A large transaction that aborts leaves no trace.
    pg.batch_execute(&format!(
        "BEGIN; INSERT INTO orders SELECT g, {ROW} FROM generate_series(200001, 260000) g;
         DELETE FROM orders WHERE id < 5000; UPDATE orders SET status = 'gone' WHERE id % 3 = 0; ROLLBACK"
    ))
    .await
    .expect("aborted transaction");
    pg.batch_execute("INSERT INTO orders (id, customer, status) VALUES (999999, 'after', 'new')")
        .await
        .expect("last insert");

    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    let row = pg
        .query_one(
            "SELECT stream_txns, stream_count FROM pg_stat_replication_slots WHERE slot_name = $1",
            &[&e2e::SLOT],
        )
        .await
        .expect("pg_stat_replication_slots");
    let (txns, blocks): (i64, i64) = (row.get(0), row.get(1));
    eprintln!("e2e: server streamed {txns} transactions in {blocks} blocks");
    assert!(
        txns >= 2,
        "the large transactions should have been streamed in progress (stream_txns = {txns})"
    );
    let leftovers: Vec<_> = runs(&spill)
        .iter()
        .flat_map(|run| entries(run))
        .filter(|f| f.extension().is_some_and(|e| e == "spill"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "spill files left behind: {leftovers:?}"
    );
    z.terminate_cleanly(Duration::from_secs(15));
    assert!(
        runs(&spill).is_empty(),
        "a clean stop removes its run directory"
    );
}

fn entries(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .expect("reading the spill directory")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect()
}

/// The run directories under the spill directory (one per live or crashed process).
fn runs(spill: &std::path::Path) -> Vec<std::path::PathBuf> {
    entries(spill).into_iter().filter(|p| p.is_dir()).collect()
}

/// Zipline killed while a streamed transaction is half received: the server streams it again
/// after the restart, the stale spill file is discarded, and the result is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_during_a_streamed_transaction() {
    let mut fx = Fixture::start();
    fx.pg.psql(
        "postgres",
        "ALTER SYSTEM SET logical_decoding_work_mem = '64kB'",
    );
    fx.pg.psql("postgres", "SELECT pg_reload_conf()");
    let spill = fx.dir.path().join("spill");
    let opts = PipelineOpts {
        source_extra: vec![format!("spill_dir: {}", spill.display())],
        ..PipelineOpts::default()
    };
    fx.write_pipeline(&pipeline_yaml(&opts));
    let pg = fx.pg_client().await;
    let writer = fx.pg_client().await;
    let mut my = fx.my_checker().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;

    writer
        .batch_execute(&format!(
            "BEGIN; INSERT INTO orders SELECT g, {ROW} FROM generate_series(1, 50000) g"
        ))
        .await
        .expect("open large transaction");
    // Let some blocks reach Zipline's spill file, then kill it mid-transaction.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    z.kill();
    writer
        .batch_execute(&format!(
            "INSERT INTO orders SELECT g, {ROW} FROM generate_series(50001, 60000) g; COMMIT"
        ))
        .await
        .expect("commit large transaction");
    let mut z = fx.apply();
    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_eq!(
        runs(&spill).len(),
        1,
        "the killed run's spill directory is swept, the live one's kept"
    );
    z.terminate_cleanly(Duration::from_secs(15));
}
