//! What only the PostgreSQL sink does end to end (the rest is `contract::postgres`):
//!
//! - `type_zoo_round_trips_exactly`: numeric specials, infinities, BC dates, time zones,
//!   intervals, arrays, enums, json and jsonb, bytea, network and bit types, ranges.
//! - `initial_snapshot_copies_then_streams`: rows that exist before the first start are
//!   copied by the snapshot (by `COPY`, or by upserts where the sink already has the key),
//!   then the stream carries on.

use crate::e2e;

use std::time::Duration;

use e2e::pg::{PgFixture, SINK_DB, pg_pipeline_yaml, wait_converged, wait_snapshot_complete};
use e2e::workload::{self, Config};
use e2e::{CONVERGE_TIMEOUT, PG_DB, PipelineOpts, wait_streaming};

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
