//! The pipeline contract: what every sink does end to end, through the real `zipline` binary
//! from a PostgreSQL source, written once against [`SinkFixture`] and run against each sink
//! (`contract::mysql::*`: MariaDB, `contract::postgres::*`: PostgreSQL). The sink must end
//! equal to the source, row for row:
//!
//! - randomized workloads: ≥ 20,000 changes over ≥ 2,000 keys from 4 concurrent writers in
//!   multi-statement transactions with key changes across lanes, streamed, or committed while
//!   Zipline is stopped and replayed as one backlog in small batches on 3 lanes;
//! - a TRUNCATE lands after every earlier change of every lane and before every later one;
//! - the seed's trace (`e2e::trace`): a short, hand-written history on a few keys on top of rows both sides
//!   already have, audited by triggers on the sink: per key, the states the sink went through
//!   are an in-order subsequence of the source's (a batch may skip states, but the sink never
//!   goes back, never invents one, and never touches a key the source did not change);
//! - out-of-line (TOASTed) values pgoutput sends as "unchanged" survive partial updates and
//!   key changes; key swaps, chains and reuse come out right in source order;
//! - SIGTERM mid-workload drains and exits 0, a new process resumes; four SIGKILLs at random
//!   moments converge with no duplicate and no lost delete; the slot's confirmed position
//!   covers the last applied write while idle and after a clean stop;
//! - sink faults: connections cut through a proxy and refused, the sink's sessions killed from
//!   inside the server, the sink server crashed and restarted: the lanes retry (the log says
//!   so) and nothing is lost or applied twice.

mod faults;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::e2e::pg::PgFixture;
use crate::e2e::sinks::SinkFixture;
use crate::e2e::workload::{self, Config, Report};
use crate::e2e::{CONVERGE_TIMEOUT, Fixture, PG_DB, PipelineOpts, Zipline, wait_streaming};
use faults::{
    killed_sink_sessions_converge, sigkill_four_times_mid_workload_converges,
    sigterm_mid_workload_exits_cleanly_and_resumes, sink_cuts_and_refusals_converge,
    sink_server_crash_converges,
};

/// Emits one `#[tokio::test]` per scenario (with its worker threads) for each
/// `module: SinkFixture` pair.
macro_rules! contract {
    ($($sink:ident: $fixture:ty),+ $(,)?) => {$(
        mod $sink {
            use super::*;

            contract!(@tests $fixture;
                random_workload_converges: 4,
                random_backlog_converges_with_small_batches: 4,
                truncate_then_insert: 2,
                toasted_values_survive_partial_updates_and_key_changes: 2,
                seed_trace_is_replayed_in_order_per_key: 2,
                key_swaps_chains_and_reuse: 2,
                sigterm_mid_workload_exits_cleanly_and_resumes: 4,
                sigkill_four_times_mid_workload_converges: 4,
                sink_cuts_and_refusals_converge: 4,
                killed_sink_sessions_converge: 4,
                sink_server_crash_converges: 4,
            );
        }
    )+};
    (@tests $fixture:ty; $($scenario:ident: $threads:literal),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
        async fn $scenario() {
            super::$scenario::<$fixture>().await;
        }
    )+};
}

contract!(mysql: Fixture, postgres: PgFixture);

/// The log line of a retried sink error.
const RETRY_LOG: &str = "transient sink error";

/// Starts Zipline with `opts` and waits until it streams.
async fn streaming<F: SinkFixture>(
    opts: &PipelineOpts,
) -> (F, Zipline, tokio_postgres::Client, F::Checker) {
    let mut fx = F::start();
    fx.write(opts);
    let src = fx.source_client().await;
    let sink = fx.checker().await;
    let mut z = fx.apply();
    wait_streaming(&src, &mut z, Duration::from_secs(30)).await;
    (fx, z, src, sink)
}

/// Keys the workload touched that are gone from the source: they must be gone from the sink.
async fn deleted_keys(src: &tokio_postgres::Client, report: &Report) -> Vec<i64> {
    let live: HashSet<i64> = src
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

/// A workload that runs until stopped, 15 ms between transactions per writer.
fn paced(seed: u64) -> Config {
    let mut cfg = Config::new(seed, u64::MAX);
    cfg.pause = Duration::from_millis(15);
    cfg
}

/// Waits until the workload has committed `n` changes.
async fn wait_changes(w: &workload::Handle, z: &mut Zipline, n: u64) {
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

fn assert_retried(z: &Zipline) {
    assert!(
        z.output().contains(RETRY_LOG),
        "the log should show a retried sink error (`{RETRY_LOG}`):\n{}",
        z.tail(40)
    );
}

async fn random_workload_converges<F: SinkFixture>() {
    let (fx, mut z, src, mut sink) = streaming::<F>(&PipelineOpts::default()).await;
    let w = workload::start(
        fx.source().conn_str(PG_DB),
        Config::new(workload::seed(), 20_000),
    );
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

    let rows = F::wait_converged(&src, &mut sink, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert!(rows > 100, "suspiciously few rows: {rows}");
    F::assert_absent(&mut sink, &deleted_keys(&src, &report).await).await;
    z.terminate_cleanly(Duration::from_secs(15));
}

/// The same kind of workload committed while Zipline is stopped, then read as one backlog
/// with small batches on 3 lanes: batches full of coalescable changes, and key changes whose
/// old and new keys sit in different lanes' batches at the same time.
async fn random_backlog_converges_with_small_batches<F: SinkFixture>() {
    let (mut fx, mut first, src, mut sink) = streaming::<F>(&PipelineOpts {
        lanes: 3,
        sink_extra: vec!["batch_size: 50".to_owned(), "max_wait: 5ms".to_owned()],
        ..PipelineOpts::default()
    })
    .await;
    first.terminate_cleanly(Duration::from_secs(15));

    let mut cfg = Config::new(workload::seed(), 20_000);
    cfg.key_space = 2_000;
    cfg.rekey_pct = 15;
    let report = workload::start(fx.source().conn_str(PG_DB), cfg)
        .join()
        .await;
    assert!(report.changes >= 20_000 && report.keys.len() >= 1_900);

    let mut second = fx.apply();
    let rows = F::wait_converged(&src, &mut sink, Some(&mut second), CONVERGE_TIMEOUT).await;
    assert!(rows > 100, "suspiciously few rows: {rows}");
    second.terminate_cleanly(Duration::from_secs(15));
}

async fn truncate_then_insert<F: SinkFixture>() {
    let (_fx, mut z, src, mut sink) = streaming::<F>(&PipelineOpts::default()).await;
    src.batch_execute(
        "INSERT INTO orders SELECT g, 'c' || g, g * 1.5, 'new', '2024-01-01'::timestamptz
           + g * interval '1 minute', g % 2 = 0, NULL FROM generate_series(1, 300) g",
    )
    .await
    .unwrap();
    F::wait_converged(&src, &mut sink, Some(&mut z), CONVERGE_TIMEOUT).await;

    // Changes spread over every lane, then TRUNCATE and re-inserts of some old keys in the
    // same transaction, then more changes right behind it. An update applied after the
    // truncate would resurrect its row; a truncate applied late would wipe the re-inserts.
    src.batch_execute(
        "UPDATE orders SET status = 'before-truncate' WHERE id % 3 = 0;
         BEGIN;
         UPDATE orders SET amount = amount + 1 WHERE id % 5 = 0;
         TRUNCATE orders;
         INSERT INTO orders VALUES (5, 'again', 5.55, 'reborn', NULL, true, 'after truncate');
         INSERT INTO orders SELECT g, 'new' || g, g, 'fresh', NULL, NULL, NULL
           FROM generate_series(1000, 1010) g;
         COMMIT;
         INSERT INTO orders VALUES (17, 'late', 1.00, 'new', now(), false, NULL);
         UPDATE orders SET status = 'updated-after' WHERE id IN (5, 1003);",
    )
    .await
    .unwrap();
    let rows = F::wait_converged(&src, &mut sink, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_eq!(rows, 13, "5, 17 and 1000..=1010");

    // A TRUNCATE in a transaction of its own, immediately followed by inserts.
    src.batch_execute(
        "TRUNCATE orders;
         INSERT INTO orders SELECT g, NULL, NULL, 'third', NULL, NULL, NULL
           FROM generate_series(1, 50) g;",
    )
    .await
    .unwrap();
    let rows = F::wait_converged(&src, &mut sink, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_eq!(rows, 50);
    z.terminate_cleanly(Duration::from_secs(15));
}

async fn toasted_values_survive_partial_updates_and_key_changes<F: SinkFixture>() {
    let (_fx, mut z, src, mut sink) = streaming::<F>(&PipelineOpts::default()).await;
    // ~6 kB notes, stored out of line and uncompressed (STORAGE EXTERNAL): real TOAST.
    src.batch_execute(
        "ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;
         INSERT INTO orders SELECT g, 'c' || g, g, 'new', NULL, NULL,
                (SELECT string_agg(md5(g::text || '-' || i), '') FROM generate_series(1, 190) i)
         FROM generate_series(1, 40) g;",
    )
    .await
    .unwrap();
    F::wait_converged(&src, &mut sink, Some(&mut z), CONVERGE_TIMEOUT).await;

    src.batch_execute(
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
    let rows = F::wait_converged(&src, &mut sink, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_eq!(rows, 40);
    z.terminate_cleanly(Duration::from_secs(15));
}

async fn seed_trace_is_replayed_in_order_per_key<F: SinkFixture>() {
    crate::e2e::trace::seed_trace(F::start(), &PipelineOpts::default()).await;
}

/// Key changes that only come out right if every lane applies them in source order: swaps
/// through a temporary key, chains, a key moved and moved back, and keys reused within one
/// transaction.
async fn key_swaps_chains_and_reuse<F: SinkFixture>() {
    let (_fx, mut z, src, mut sink) = streaming::<F>(&PipelineOpts::default()).await;
    src.batch_execute(
        "INSERT INTO orders SELECT g, 'row ' || g, g, 'new', NULL, g % 2 = 0, 'note ' || g
         FROM generate_series(1, 40) g",
    )
    .await
    .unwrap();
    let steps = [
        // Swap 1 and 2 through a temporary key.
        "BEGIN; UPDATE orders SET id = -1 WHERE id = 1; UPDATE orders SET id = 1 WHERE id = 2;
         UPDATE orders SET id = 2 WHERE id = -1; COMMIT;",
        // A chain: 10 → 100, 11 → 10, 12 → 11.
        "BEGIN; UPDATE orders SET id = 100 WHERE id = 10; UPDATE orders SET id = 10 WHERE id = 11;
         UPDATE orders SET id = 11 WHERE id = 12; COMMIT;",
        // Moved away and back, changing a column on the way.
        "UPDATE orders SET id = 500 WHERE id = 20;
         UPDATE orders SET status = 'away' WHERE id = 500;
         UPDATE orders SET id = 20 WHERE id = 500;",
        // Delete and re-insert the same key in one transaction; insert then move.
        "BEGIN; DELETE FROM orders WHERE id = 30;
         INSERT INTO orders VALUES (30, 'reborn', 3.30, 'new', NULL, NULL, NULL);
         INSERT INTO orders VALUES (600, 'fresh', 6.00, 'new', NULL, NULL, NULL);
         UPDATE orders SET id = 601 WHERE id = 600; COMMIT;",
        // Move onto a key just freed by a delete, in one statement each.
        "BEGIN; DELETE FROM orders WHERE id = 35; UPDATE orders SET id = 35 WHERE id = 36; COMMIT;",
        // Shift a range up by one key (each row onto its neighbour's old key), through a
        // temporary range because PostgreSQL checks the key row by row.
        "BEGIN; DELETE FROM orders WHERE id = 19;
         UPDATE orders SET id = id + 1000 WHERE id BETWEEN 13 AND 18;
         UPDATE orders SET id = id - 999 WHERE id BETWEEN 1013 AND 1018; COMMIT;",
    ];
    for sql in steps {
        src.batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let rows = F::wait_converged(&src, &mut sink, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_eq!(rows, 39, "40 rows, two deleted, one inserted");
    z.terminate_cleanly(Duration::from_secs(15));
}
