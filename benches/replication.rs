//! Backlog replay benchmark: PostgreSQL → MariaDB.
//!
//! Writes a backlog of changes (default 1,000,000; 100 per transaction: 60 inserts, 30
//! updates, 10 deletes) on a throwaway PostgreSQL while no replicator runs, then measures in
//! the same run:
//! - **raw**: the same changes applied straight to MariaDB as batched multi-row upserts and
//!   deletes (same batch size, same lane partitioning, one connection per lane, coalesced per
//!   key within a batch, as Zipline's sink does): the rate a hand-written loader reaches;
//! - **raw, prepared**: the same batches through prepared statements (binary protocol, 100
//!   rows per statement), to compare with the text upserts the sink sends;
//! - **raw, bulk**: the same batches through MariaDB's bulk execution of single-row prepared
//!   statements (`COM_STMT_BULK_EXECUTE`, mysql_async's `exec_batch`). The three loaders run
//!   text, prepared, bulk; `ZIPLINE_BENCH_PREPARED_FIRST=1` runs prepared, bulk, text (a later
//!   run meets a warmer server);
//! - **zipline**: `zipline pipeline apply` catching up the backlog from the slot into another
//!   MariaDB database, until the slot's confirmed flush LSN passes the backlog's end.
//!
//! Prints changes/s for both, the ratio, Zipline's peak RSS and CPU seconds, and checks that
//! both databases ended identical.
//!
//! `cargo bench --bench replication` (env: `ZIPLINE_BENCH_CHANGES`, `ZIPLINE_BENCH_LANES`,
//! `ZIPLINE_BENCH_BATCH`, and `ZIPLINE_BENCH_BULK_MIN_ROWS` for the sink's `bulk_min_rows`,
//! `0` to compare with text statements only, and `ZIPLINE_BENCH_BINARY_VALUES` for the source's
//! `binary_values`).

#[path = "../tests/common/mod.rs"]
pub mod common;
pub mod common_backlog;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Instant;

use common_backlog::{
    Op, env_or, generate, prime, spawn_zipline, stop_zipline, tree_cpu, wait_confirmed,
};

use mysql_async::prelude::Queryable;

static RAW_RETRIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

const MYSQL_TABLE: &str = "CREATE TABLE items (id BIGINT PRIMARY KEY, name VARCHAR(64) NOT NULL, qty INT NOT NULL, price DECIMAL(12,2) NOT NULL, updated_at DATETIME(6) NOT NULL)";

/// A batch coalesced per key: the ids to delete and the rows to upsert.
fn coalesce(chunk: &[Op]) -> (Vec<i64>, Vec<&common_backlog::Row>) {
    let mut last: HashMap<i64, &Op> = HashMap::with_capacity(chunk.len());
    for op in chunk {
        last.insert(op.id(), op);
    }
    let (mut deletes, mut upserts) = (Vec::new(), Vec::new());
    for op in last.values() {
        match op {
            Op::Delete(id) => deletes.push(*id),
            Op::Upsert(r) => upserts.push(r),
        }
    }
    (deletes, upserts)
}

async fn raw_connect(url: String) -> mysql_async::Conn {
    let mut conn = mysql_async::Conn::from_url(url).await.expect("raw connect");
    conn.query_drop("SET SESSION time_zone='+00:00'")
        .await
        .expect("time zone");
    conn.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .await
        .expect("isolation level");
    conn
}

const UPSERT_TAIL: &str = " ON DUPLICATE KEY UPDATE name=VALUES(name), qty=VALUES(qty), \
    price=VALUES(price), updated_at=VALUES(updated_at)";

/// A raw loader: per-lane batches, coalesced per key, deletes then upserts in one transaction,
/// sent as `loader` says.
async fn raw_apply(url: String, ops: Vec<Op>, batch: usize, loader: Loader) -> u64 {
    let mut conn = raw_connect(url).await;
    let mut applied = 0;
    for chunk in ops.chunks(batch) {
        let (deletes, upserts) = coalesce(chunk);
        // Lanes upserting neighbouring keys can deadlock on InnoDB's duplicate-check locks;
        // a hand-written loader retries too.
        let mut tries = 0;
        loop {
            let done = match loader {
                Loader::Text => text_batch(&mut conn, &deletes, &upserts).await,
                Loader::Prepared => prepared_batch(&mut conn, &deletes, &upserts).await,
                Loader::Bulk => bulk_batch(&mut conn, &deletes, &upserts).await,
            };
            let Err(e) = done else { break };
            tries += 1;
            assert!(tries < 20, "raw batch keeps failing: {e}");
            let _ = conn.query_drop("ROLLBACK").await;
            RAW_RETRIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        applied += chunk.len() as u64;
    }
    applied
}

/// One batch as SQL text, DELETE … IN then a multi-row upsert, in one round trip.
async fn text_batch(
    conn: &mut mysql_async::Conn,
    deletes: &[i64],
    upserts: &[&common_backlog::Row],
) -> Result<(), mysql_async::Error> {
    let mut sql = String::from("START TRANSACTION;");
    if !deletes.is_empty() {
        let ids: Vec<String> = deletes.iter().map(i64::to_string).collect();
        write!(sql, "DELETE FROM items WHERE id IN ({});", ids.join(",")).unwrap();
    }
    if !upserts.is_empty() {
        sql.push_str("INSERT INTO items (id, name, qty, price, updated_at) VALUES ");
        for (n, r) in upserts.iter().enumerate() {
            if n > 0 {
                sql.push(',');
            }
            write!(
                sql,
                "({}, '{}', {}, {}, TIMESTAMPADD(SECOND, {}, '2024-01-01 00:00:00'))",
                r.id, r.name, r.qty, r.price, r.updated_at
            )
            .unwrap();
        }
        write!(sql, "{UPSERT_TAIL};").unwrap();
    }
    sql.push_str("COMMIT;");
    conn.query_drop(&sql).await
}

/// Rows per prepared upsert: a few statement shapes (full groups and the remainders), so
/// mysql_async's statement cache prepares each once per connection.
const PREPARED_ROWS: usize = 100;

/// An upserted row's parameters, in column order.
fn row_params(r: &common_backlog::Row) -> [mysql_async::Value; 5] {
    use mysql_async::Value as My;
    [
        My::Int(r.id),
        My::Bytes(r.name.clone().into_bytes()),
        My::Int(i64::from(r.qty)),
        My::Bytes(r.price.clone().into_bytes()),
        My::Int(r.updated_at),
    ]
}

/// One batch by MariaDB's bulk execution (`COM_STMT_BULK_EXECUTE`, which mysql_async's
/// `exec_batch` uses when the server offers it): one single-row statement, every row's
/// parameters in one request.
async fn bulk_batch(
    conn: &mut mysql_async::Conn,
    deletes: &[i64],
    upserts: &[&common_backlog::Row],
) -> Result<(), mysql_async::Error> {
    use mysql_async::Value as My;
    conn.query_drop("START TRANSACTION").await?;
    if !deletes.is_empty() {
        let params = deletes.iter().map(|&id| vec![My::Int(id)]);
        conn.exec_batch("DELETE FROM items WHERE id = ?", params)
            .await?;
    }
    if !upserts.is_empty() {
        let params = upserts.iter().map(|r| row_params(r).to_vec());
        let sql = format!(
            "INSERT INTO items (id, name, qty, price, updated_at) VALUES (?, ?, ?, ?, \
             TIMESTAMPADD(SECOND, ?, '2024-01-01 00:00:00')){UPSERT_TAIL}"
        );
        conn.exec_batch(sql, params).await?;
    }
    conn.query_drop("COMMIT").await
}

/// One batch by multi-row prepared statements, [`PREPARED_ROWS`] rows per statement.
async fn prepared_batch(
    conn: &mut mysql_async::Conn,
    deletes: &[i64],
    upserts: &[&common_backlog::Row],
) -> Result<(), mysql_async::Error> {
    use mysql_async::Value as My;
    conn.query_drop("START TRANSACTION").await?;
    for ids in deletes.chunks(PREPARED_ROWS) {
        let marks = vec!["?"; ids.len()].join(",");
        let params: Vec<My> = ids.iter().map(|&id| My::Int(id)).collect();
        conn.exec_drop(format!("DELETE FROM items WHERE id IN ({marks})"), params)
            .await?;
    }
    for rows in upserts.chunks(PREPARED_ROWS) {
        let row = "(?, ?, ?, ?, TIMESTAMPADD(SECOND, ?, '2024-01-01 00:00:00'))";
        let marks = vec![row; rows.len()].join(",");
        let params: Vec<My> = rows.iter().flat_map(|r| row_params(r)).collect();
        let sql = format!(
            "INSERT INTO items (id, name, qty, price, updated_at) VALUES {marks}{UPSERT_TAIL}"
        );
        conn.exec_drop(sql, params).await?;
    }
    conn.query_drop("COMMIT").await
}

/// How a raw loader sends its batches.
#[derive(Clone, Copy, PartialEq)]
enum Loader {
    /// SQL text, one round trip per batch ([`text_batch`]), into `raw`.
    Text,
    /// Multi-row prepared statements ([`prepared_batch`]), into `rawp`.
    Prepared,
    /// Bulk execution of single-row statements ([`bulk_batch`]), into `rawb`.
    Bulk,
}

impl Loader {
    fn database(self) -> &'static str {
        match self {
            Loader::Text => "raw",
            Loader::Prepared => "rawp",
            Loader::Bulk => "rawb",
        }
    }
}

/// One raw loader over every lane's ops: changes applied, seconds, and the servers' CPU.
async fn raw_run(
    pg: &common::Postgres,
    my: &common::MariaDb,
    per_lane: Vec<Vec<Op>>,
    batch: usize,
    loader: Loader,
) -> (u64, f64, Cpu) {
    let cpu = cpu_now(pg, my);
    let started = Instant::now();
    let tasks: Vec<_> = per_lane
        .into_iter()
        .map(|ops| tokio::spawn(raw_apply(my.url(loader.database()), ops, batch, loader)))
        .collect();
    let mut applied = 0;
    for t in tasks {
        applied += t.await.expect("raw lane");
    }
    (
        applied,
        started.elapsed().as_secs_f64(),
        cpu_since(&cpu, pg, my),
    )
}

#[derive(Clone, Copy)]
struct Cpu {
    pg: f64,
    my: f64,
}

fn cpu_now(pg: &common::Postgres, my: &common::MariaDb) -> Cpu {
    Cpu {
        pg: pg.pid().map_or(0.0, tree_cpu),
        my: my.pid().map_or(0.0, tree_cpu),
    }
}

/// CPU seconds each server spent since `before`.
fn cpu_since(before: &Cpu, pg: &common::Postgres, my: &common::MariaDb) -> Cpu {
    let now = cpu_now(pg, my);
    Cpu {
        pg: now.pg - before.pg,
        my: now.my - before.my,
    }
}

impl std::fmt::Display for Cpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PostgreSQL {:.2}s, MariaDB {:.2}s", self.pg, self.my)
    }
}

#[tokio::main]
async fn main() {
    let changes = env_or("ZIPLINE_BENCH_CHANGES", 1_000_000);
    let lanes = env_or("ZIPLINE_BENCH_LANES", 4);
    let batch = env_or("ZIPLINE_BENCH_BATCH", 1000);
    let pg = common::Postgres::start();
    let my = common::MariaDb::start();
    pg.create_database("bench");
    pg.psql("bench", "CREATE TABLE items (id bigint PRIMARY KEY, name text NOT NULL, qty int NOT NULL, price numeric(12,2) NOT NULL, updated_at timestamptz NOT NULL)");
    pg.psql("bench", "CREATE PUBLICATION zbench FOR TABLE items");
    for db in ["raw", "rawp", "rawb", "zl"] {
        my.create_database(db);
        my.sql(db, MYSQL_TABLE);
    }

    // Zipline creates its slot and records in the sink that the pipeline starts there
    // (`snapshot: never`), then stops; the backlog is written while no replicator runs, as
    // after an outage.
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = dir.path().join("bench.yaml");
    // The sink's bulk execution threshold (0: text statements only); unset, its default.
    let bulk = std::env::var("ZIPLINE_BENCH_BULK_MIN_ROWS")
        .map(|n| format!("    bulk_min_rows: {n}\n"))
        .unwrap_or_default();
    let source = common_backlog::source_settings();
    std::fs::write(
        &yaml,
        format!(
            "name: bench\nsettings: {{ progress_interval: 5s }}\nconnectors:\n  - name: pg\n    type: source/postgres\n    host: 127.0.0.1\n    port: {}\n    database: bench\n    user: postgres\n    publication: zbench\n    slot_name: zbench\n    tables: [public.items]\n    snapshot: never\n{source}  - name: my\n    type: sink/mysql\n    host: 127.0.0.1\n    port: {}\n    database: zl\n    user: root\n    lanes: {lanes}\n    batch_size: {batch}\n{bulk}routes:\n  - from: pg\n    to: [my]\n",
            pg.port, my.port
        ),
    )
    .expect("write yaml");
    prime(&pg, "bench", "zbench", &yaml, &dir.path().join("prime.log"));

    let (txs, ops) = generate(changes);
    let total = ops.len() as u64;
    let client = pg.client("bench").await;
    let started = Instant::now();
    for sql in &txs {
        client
            .batch_execute(sql)
            .await
            .expect("backlog transaction");
    }
    let end_lsn = pg.psql("bench", "SELECT pg_current_wal_lsn()");
    println!(
        "backlog: {total} changes in {} transactions written in {:.1}s",
        txs.len(),
        started.elapsed().as_secs_f64()
    );

    // PostgreSQL's own decoding speed for this backlog: the ceiling for any pgoutput reader.
    let started = Instant::now();
    let decoded = pg.psql(
        "bench",
        "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('zbench', NULL, NULL, 'proto_version', '1', 'publication_names', 'zbench')",
    );
    let decode_secs = started.elapsed().as_secs_f64();
    println!(
        "pgoutput decode only: {decoded} messages in {decode_secs:.2}s = {:.0} changes/s",
        total as f64 / decode_secs
    );

    // Raw baselines: text upserts, and the same batches through prepared statements (whether
    // the binary protocol spares MariaDB the parsing of literals enough to beat the text the
    // sink sends). The second to run meets a warmer server, so the order can be swapped.
    let mut per_lane: Vec<Vec<Op>> = vec![Vec::new(); lanes];
    for op in ops {
        per_lane[(op.id() as u64 % lanes as u64) as usize].push(op);
    }
    let prepared_first = std::env::var("ZIPLINE_BENCH_PREPARED_FIRST").is_ok_and(|v| v == "1");
    let mut runs = [Loader::Text, Loader::Prepared, Loader::Bulk];
    if prepared_first {
        runs.rotate_left(1);
    }
    let mut results = Vec::new();
    for loader in runs {
        results.push((
            loader,
            raw_run(&pg, &my, per_lane.clone(), batch, loader).await,
        ));
    }
    let result = |which: Loader| {
        results
            .iter()
            .find(|(loader, _)| *loader == which)
            .map(|(_, r)| {
                (
                    r.0,
                    r.1,
                    Cpu {
                        pg: r.2.pg,
                        my: r.2.my,
                    },
                )
            })
            .expect("every loader ran")
    };
    let (raw_applied, raw_secs, raw_cpu) = result(Loader::Text);
    let (prepared_applied, prepared_secs, prepared_cpu) = result(Loader::Prepared);
    let (bulk_applied, bulk_secs, bulk_cpu) = result(Loader::Bulk);
    let raw_rate = raw_applied as f64 / raw_secs;

    // Zipline.
    let log = dir.path().join("zipline.log");
    let cpu = cpu_now(&pg, &my);
    let started = Instant::now();
    let mut child = spawn_zipline(&yaml, &log);
    let peak = wait_confirmed(&pg, "bench", "zbench", &end_lsn, &mut child, &log);
    let zl_secs = started.elapsed().as_secs_f64();
    let zl_rate = total as f64 / zl_secs;
    let zl_cpu = cpu_since(&cpu, &pg, &my);
    let status = stop_zipline(child);

    let checksum = "SELECT CONCAT(COUNT(*), ':', MD5(GROUP_CONCAT(CONCAT_WS(',', id, name, qty, price, updated_at) ORDER BY id SEPARATOR ';'))) FROM items";
    let raw_sum = my.sql(
        "raw",
        &format!("SET SESSION group_concat_max_len = 1 << 30; {checksum}"),
    );
    let zl_sum = my.sql(
        "zl",
        &format!("SET SESSION group_concat_max_len = 1 << 30; {checksum}"),
    );
    let prepared_sum = my.sql(
        "rawp",
        &format!("SET SESSION group_concat_max_len = 1 << 30; {checksum}"),
    );
    assert_eq!(
        raw_sum, prepared_sum,
        "the prepared-statement loader wrote other rows than the text one"
    );
    let bulk_sum = my.sql(
        "rawb",
        &format!("SET SESSION group_concat_max_len = 1 << 30; {checksum}"),
    );
    assert_eq!(
        raw_sum, bulk_sum,
        "the bulk loader wrote other rows than the text one"
    );

    println!(
        "raw MariaDB upserts : {raw_applied} changes in {raw_secs:.2}s = {raw_rate:.0} changes/s ({lanes} connections, batch {batch}; CPU: {raw_cpu})"
    );
    println!(
        "zipline PG → MariaDB: {total} changes in {zl_secs:.2}s = {zl_rate:.0} changes/s ({lanes} lanes, batch {batch}; CPU: {zl_cpu})"
    );
    println!(
        "raw, prepared       : {prepared_applied} changes in {prepared_secs:.2}s = {:.0} changes/s, {:.2}× the text upserts; MariaDB CPU {:.2} µs per change (text {:.2})",
        prepared_applied as f64 / prepared_secs,
        raw_secs / prepared_secs,
        prepared_cpu.my * 1e6 / prepared_applied as f64,
        raw_cpu.my * 1e6 / raw_applied as f64
    );
    println!(
        "raw, bulk           : {bulk_applied} changes in {bulk_secs:.2}s = {:.0} changes/s, {:.2}× the text upserts; MariaDB CPU {:.2} µs per change",
        bulk_applied as f64 / bulk_secs,
        raw_secs / bulk_secs,
        bulk_cpu.my * 1e6 / bulk_applied as f64,
    );
    println!(
        "ratio zipline/raw   : {:.2} (to the bulk loader {:.2})",
        zl_rate / raw_rate,
        zl_rate * bulk_secs / bulk_applied as f64
    );
    println!(
        "zipline peak RSS    : {:.1} MiB, CPU {:.2}s = {:.2} CPU-µs per change, exit {status}",
        peak.0 as f64 / 1024.0,
        peak.1,
        peak.1 * 1e6 / total as f64
    );
    // PostgreSQL's CPU during Zipline's run is its walsender decoding the backlog (the
    // backends are idle); MariaDB's is the target applying Zipline's batches.
    let per = |secs: f64| secs * 1e6 / total as f64;
    println!(
        "CPU µs per change   : zipline {:.2}, walsender (PostgreSQL) {:.2}, target (MariaDB) {:.2}; raw baseline's target {:.2}",
        per(peak.1),
        per(zl_cpu.pg),
        per(zl_cpu.my),
        raw_cpu.my * 1e6 / raw_applied as f64
    );
    println!("sink equal to raw   : {}", raw_sum == zl_sum);
    assert_eq!(
        raw_sum, zl_sum,
        "Zipline's sink differs from the raw-applied database"
    );
}
