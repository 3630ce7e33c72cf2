//! PostgreSQL → PostgreSQL while Zipline streams: the sink must end equal to the source,
//! whole row for whole row as PostgreSQL renders it (`t::text`).
//!
//! - `random_workload_converges`: ≥ 20,000 changes over ≥ 2,000 keys from 4 concurrent
//!   writers in multi-statement transactions, with key changes across lanes.
//! - `random_backlog_converges_with_small_batches`: the same committed while Zipline is
//!   stopped, replayed as one backlog in small batches on 3 lanes.
//! - `truncate_then_insert`: a TRUNCATE lands after every earlier change of every lane and
//!   before every later one.
//! - `toasted_values_survive_partial_updates_and_key_changes`: out-of-line values pgoutput
//!   sends as "unchanged".
//! - `type_zoo_round_trips_exactly`: numeric specials, infinities, BC dates, time zones,
//!   intervals, arrays, enums, json and jsonb, bytea, network and bit types, ranges.
//! - `initial_snapshot_copies_then_streams`: rows that exist before the first start are
//!   copied by the snapshot (by `COPY`, or by upserts where the sink already has the key),
//!   then the stream carries on.

use crate::e2e;

use std::collections::HashSet;
use std::time::Duration;

use e2e::pg::{
    PgFixture, SINK_DB, assert_absent, pg_pipeline_yaml, wait_converged, wait_snapshot_complete,
};
use e2e::workload::{self, Config};
use e2e::{CONVERGE_TIMEOUT, PG_DB, PipelineOpts, Zipline, wait_streaming};

/// Starts Zipline with the default pipeline and waits until it streams.
async fn streaming() -> (
    PgFixture,
    Zipline,
    tokio_postgres::Client,
    tokio_postgres::Client,
) {
    let mut fx = PgFixture::start();
    fx.write_pipeline(&pg_pipeline_yaml(&PipelineOpts::default()));
    let (src, sink) = (fx.src_client().await, fx.sink_client().await);
    let mut z = fx.apply();
    wait_streaming(&src, &mut z, Duration::from_secs(30)).await;
    (fx, z, src, sink)
}

async fn deleted(src: &tokio_postgres::Client, keys: &HashSet<i64>) -> Vec<i64> {
    let live: HashSet<i64> = src
        .query("SELECT id FROM orders", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    keys.iter().copied().filter(|k| !live.contains(k)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_workload_converges() {
    let (fx, mut z, src, sink) = streaming().await;
    let w = workload::start(
        fx.src.conn_str(PG_DB),
        Config::new(workload::seed(), 20_000),
    );
    while !w.is_finished() {
        z.assert_running();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let report = w.join().await;
    assert!(report.changes >= 20_000 && report.keys.len() >= 2_000);
    assert!(report.rekeys > 100 && report.deletes > 1_000);
    let rows = wait_converged(&src, &sink, "orders", Some(&mut z), CONVERGE_TIMEOUT).await;
    assert!(rows > 100, "suspiciously few rows: {rows}");
    assert_absent(&sink, &deleted(&src, &report.keys).await).await;
    z.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_backlog_converges_with_small_batches() {
    let mut fx = PgFixture::start();
    fx.write_pipeline(&pg_pipeline_yaml(&PipelineOpts {
        lanes: 3,
        sink_extra: vec!["batch_size: 50".to_owned(), "max_wait: 5ms".to_owned()],
        ..PipelineOpts::default()
    }));
    let (src, sink) = (fx.src_client().await, fx.sink_client().await);
    let mut first = fx.apply();
    wait_streaming(&src, &mut first, Duration::from_secs(30)).await;
    first.terminate_cleanly(Duration::from_secs(15));

    let mut cfg = Config::new(workload::seed(), 20_000);
    cfg.key_space = 2_000;
    cfg.rekey_pct = 15;
    let report = workload::start(fx.src.conn_str(PG_DB), cfg).join().await;
    assert!(report.changes >= 20_000 && report.keys.len() >= 1_900);

    let mut second = fx.apply();
    let rows = wait_converged(&src, &sink, "orders", Some(&mut second), CONVERGE_TIMEOUT).await;
    assert!(rows > 100, "suspiciously few rows: {rows}");
    second.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncate_then_insert() {
    let (_fx, mut z, src, sink) = streaming().await;
    src.batch_execute(
        "INSERT INTO orders SELECT g, 'c' || g, g * 1.5, 'new', '2024-01-01'::timestamptz
           + g * interval '1 minute', g % 2 = 0, NULL FROM generate_series(1, 300) g",
    )
    .await
    .unwrap();
    wait_converged(&src, &sink, "orders", Some(&mut z), CONVERGE_TIMEOUT).await;

    // Changes on every lane, then TRUNCATE and re-inserts in one transaction, then more.
    // An update applied after the truncate would resurrect its row; a truncate applied late
    // would wipe the re-inserts.
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
    let rows = wait_converged(&src, &sink, "orders", Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_eq!(rows, 13, "5, 17 and 1000..=1010");

    src.batch_execute(
        "TRUNCATE orders;
         INSERT INTO orders SELECT g, NULL, NULL, 'third', NULL, NULL, NULL
           FROM generate_series(1, 50) g;",
    )
    .await
    .unwrap();
    let rows = wait_converged(&src, &sink, "orders", Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_eq!(rows, 50);
    z.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toasted_values_survive_partial_updates_and_key_changes() {
    let (_fx, mut z, src, sink) = streaming().await;
    // ~6 kB notes stored out of line and uncompressed (STORAGE EXTERNAL): real TOAST.
    src.batch_execute(
        "ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;
         INSERT INTO orders SELECT g, 'c' || g, g, 'new', NULL, NULL,
                (SELECT string_agg(md5(g::text || '-' || i), '') FROM generate_series(1, 190) i)
         FROM generate_series(1, 40) g;",
    )
    .await
    .unwrap();
    wait_converged(&src, &sink, "orders", Some(&mut z), CONVERGE_TIMEOUT).await;
    src.batch_execute(
        // The note is not touched: pgoutput sends it as "unchanged TOAST".
        "UPDATE orders SET status = 'paid' WHERE id <= 20;
         UPDATE orders SET amount = amount * 2, flag = true WHERE id BETWEEN 5 AND 15;
         UPDATE orders SET id = id + 1000 WHERE id BETWEEN 21 AND 30;
         UPDATE orders SET id = id + 2000, status = 'moved' WHERE id BETWEEN 31 AND 35;
         BEGIN;
         UPDATE orders SET status = 'twice' WHERE id = 36;
         UPDATE orders SET id = 3036 WHERE id = 36;
         COMMIT;",
    )
    .await
    .unwrap();
    let rows = wait_converged(&src, &sink, "orders", Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_eq!(rows, 40);
    z.terminate_cleanly(Duration::from_secs(15));
}

/// The zoo: one table with a column of every kind of type, the same DDL on both sides.
const ZOO_DDL: &str = "
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE TABLE zoo (
    id int PRIMARY KEY,
    n numeric, n2 numeric(10,3), f4 real, f8 double precision, i2 smallint, i8 bigint,
    d date, t time(3), tz timetz, ts timestamp, tstz timestamptz(2), iv interval,
    b bytea, u uuid, j json, jb jsonb, m mood, p posint, ai int[], at text[], c char(4),
    vc varchar(8), bits bit(4), vb varbit, ip inet, cidr cidr, mac macaddr, r int4range,
    pt point, x xml, mo money, o oid, bo boolean, ch \"char\", nm name
)";

const ZOO_ROWS: &str = "INSERT INTO zoo VALUES
 (1, 'NaN', 1234567.891, 'Infinity', '-Infinity', -32768, 9223372036854775807,
  '4713-01-01 BC', '24:00:00', '12:34:56.789+05:30', '294000-12-31 23:59:59.999999',
  '-infinity', '-178000000 years -1 mons +3 days -04:05:06.000001',
  '\\x00ff5c27', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"b\": 1,  \"a\": [true, null]}',
  '{\"b\": 1, \"a\": \"\\u00e9\"}', 'happy', 7, '{{1,2},{3,NULL}}', '{\"a,b\",\"\",NULL,\"q\\\"\"}',
  'ab', 'àéîõü', B'1010', B'101', '192.168.0.1/24', '10.0.0.0/8', '08:00:2b:01:02:03',
  '[1,10)', '(1.5,-2.25)', '<a x=\"1\">t&amp;</a>', '-12.34', 4294967295, true, 'z', 'nm'),
 (2, '-0.000000000000000000001', NULL, 'NaN', 2.2250738585072014e-308, 0, -1,
  'infinity', '00:00:00', '00:00:00-14', '0001-01-01 00:00:00 BC', 'infinity', '0',
  '', '00000000-0000-0000-0000-000000000000', '[]', 'null', 'sad', 1, '{}', '{}',
  '', '', B'0000', B'', '::1', '::/0', 'ff:ff:ff:ff:ff:ff', 'empty', '(0,0)', '<r/>', '0', 0,
  false, ' ', ''),
 (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn type_zoo_round_trips_exactly() {
    let mut fx = PgFixture::servers();
    // Different session time zones on the two servers must not shift anything.
    fx.src.psql(
        PG_DB,
        "ALTER DATABASE app SET TimeZone = 'America/St_Johns'",
    );
    fx.sink.psql(
        SINK_DB,
        "ALTER DATABASE replica SET TimeZone = 'Asia/Kathmandu'",
    );
    fx.src.psql(PG_DB, ZOO_DDL);
    fx.sink.psql(SINK_DB, ZOO_DDL);
    fx.write_pipeline(&pg_pipeline_yaml(&PipelineOpts::default()));
    let (src, sink) = (fx.src_client().await, fx.sink_client().await);
    let mut z = fx.apply();
    wait_streaming(&src, &mut z, Duration::from_secs(30)).await;
    src.batch_execute(ZOO_ROWS).await.unwrap();
    wait_converged(&src, &sink, "zoo", Some(&mut z), CONVERGE_TIMEOUT).await;
    // Updates that change a value to another edge, and a key change.
    src.batch_execute(
        "UPDATE zoo SET n = '-Infinity', tstz = '2000-01-01 00:00:00.005+00', ai = '{}'
           WHERE id = 1;
         UPDATE zoo SET id = 4, m = 'ok' WHERE id = 2;",
    )
    .await
    .unwrap();
    let rows = wait_converged(&src, &sink, "zoo", Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_eq!(rows, 3);
    z.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn initial_snapshot_copies_then_streams() {
    let mut fx = PgFixture::start();
    let (src, sink) = (fx.src_client().await, fx.sink_client().await);
    e2e::snapshot::seed_orders(&src, 1, 12_000).await;
    // Some keys are in the sink already, with other values: their chunk's COPY meets them
    // and that chunk is upserted instead.
    sink.batch_execute(
        "INSERT INTO orders (id, customer) SELECT g, 'stale' FROM generate_series(11990, 12010) g",
    )
    .await
    .unwrap();
    fx.write_pipeline(&pg_pipeline_yaml(&PipelineOpts {
        source_extra: vec!["snapshot_chunk_rows: 5000".to_owned()],
        ..PipelineOpts::default()
    }));
    let mut z = fx.apply();
    wait_snapshot_complete(&sink, &mut z, Duration::from_secs(60)).await;
    let chunks = fx.sink.psql(
        SINK_DB,
        "SELECT count(*), sum(loaded_rows) FROM _zipline_snapshot WHERE chunk >= 0",
    );
    assert_eq!(chunks, "3|12000", "three chunks of the 12,000 rows");
    // The sink's extra rows (12001..12010) are no business of the snapshot, which replaces by
    // key only; the source gets the same rows so the tables can converge.
    src.batch_execute(
        "INSERT INTO orders (id, customer) SELECT g, 'stale' FROM generate_series(12001, 12010) g",
    )
    .await
    .unwrap();
    let w = workload::start(fx.src.conn_str(PG_DB), Config::new(workload::seed(), 3_000));
    w.join().await;
    let rows = wait_converged(&src, &sink, "orders", Some(&mut z), CONVERGE_TIMEOUT).await;
    assert!(rows > 10_000, "{rows} rows");
    z.terminate_cleanly(Duration::from_secs(15));
}
