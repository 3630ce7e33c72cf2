//! Initial snapshot benchmark: PostgreSQL → MariaDB and PostgreSQL → PostgreSQL, each next to
//! the hand-made way.
//!
//! Fills `items` (default 1,000,000 rows; bigint key, text, int, numeric, timestamptz,
//! boolean, nullable text, uuid) on a throwaway PostgreSQL, then measures in the same run, per
//! sink (`ZIPLINE_BENCH_SINKS`, default `mysql,postgres`):
//! - **MariaDB baseline**: `\copy (SELECT …) TO file CSV` with psql (the values already
//!   formatted the way MariaDB reads them), then `LOAD DATA LOCAL INFILE` of that file with the
//!   mariadb client into database `base`: the export and the load one after the other, as an
//!   operator would run them;
//! - **PostgreSQL baseline**: `pg_dump -t public.items | psql` into an empty database on a
//!   second cluster (see `snapshot/pg.rs`);
//! - **zipline**: `zipline pipeline apply` with `snapshot: initial` into database `zl`, from
//!   process start until the sink marks the snapshot complete (`_zipline_snapshot`).
//!
//! Both run `ZIPLINE_BENCH_REPEAT` times (default 3), alternating which goes first, on emptied
//! targets (and a new slot for Zipline): on a shared machine one run says little. Prints each
//! run, the medians' rows/s and ratio, CPU seconds per process, Zipline's peak RSS, and checks
//! that both databases hold the same rows.
//!
//! `cargo bench --bench snapshot` (env: `ZIPLINE_BENCH_ROWS`, `ZIPLINE_BENCH_PARALLELISM`,
//! `ZIPLINE_BENCH_CHUNK`, `ZIPLINE_BENCH_REPEAT`, `ZIPLINE_BENCH_SINKS`,
//! `ZIPLINE_BENCH_SHOW_LOG` (print Zipline's log), `ZIPLINE_BENCH_WRAP` as in
//! `common_backlog`).

#[path = "../tests/common/mod.rs"]
pub mod common;
pub mod common_backlog;
#[path = "snapshot/pg.rs"]
mod pg;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common_backlog::{env_or, proc_stat, server_cpu, spawn_zipline, stop_zipline, tree_cpu};
use mysql_async::prelude::Queryable;

const PG_TABLE: &str = "CREATE TABLE items (id bigint PRIMARY KEY, name text NOT NULL, \
    qty int NOT NULL, price numeric(12,2) NOT NULL, created_at timestamptz NOT NULL, \
    flag boolean, note text, ref uuid NOT NULL)";

const MY_TABLE: &str = "CREATE TABLE items (id BIGINT PRIMARY KEY, name VARCHAR(64) NOT NULL, \
    qty INT NOT NULL, price DECIMAL(12,2) NOT NULL, created_at DATETIME(6) NOT NULL, \
    flag TINYINT(1), note TEXT, ref CHAR(36) NOT NULL) ENGINE=InnoDB";

/// Count and an order-independent checksum of every row.
const CHECKSUM: &str = "SELECT CONCAT(COUNT(*), ':', BIT_XOR(CRC32(CONCAT_WS('|', id, name, \
    qty, price, created_at, IFNULL(flag, 'null'), IFNULL(note, 'null'), ref)))) FROM items";

fn my_cpu(my: &common::MariaDb) -> f64 {
    my.pid().map_or(0.0, tree_cpu)
}

/// One measured run: seconds, CPU seconds of (PostgreSQL, MariaDB, the loader), peak RSS KiB.
struct Run {
    secs: f64,
    cpu: (f64, f64, f64),
    rss_kb: u64,
    detail: String,
}

/// `\copy` out with psql, `LOAD DATA LOCAL INFILE` in with the mariadb client.
fn baseline(pg: &common::Postgres, my: &common::MariaDb, csv: &Path) -> Run {
    my.sql("base", "TRUNCATE TABLE items");
    let (pg0, my0) = (server_cpu(pg), my_cpu(my));
    let started = Instant::now();
    pg.psql(
        "bench",
        &format!(
            "\\copy (SELECT id, name, qty, price, to_char(created_at AT TIME ZONE 'UTC', \
             'YYYY-MM-DD HH24:MI:SS.US'), flag::int, note, ref FROM items) TO '{}' \
             WITH (FORMAT csv, NULL '\\N')",
            csv.display()
        ),
    );
    let export_secs = started.elapsed().as_secs_f64();
    let load = Command::new("mariadb")
        .args([
            "--no-defaults",
            "--protocol=TCP",
            "-h127.0.0.1",
            "-uroot",
            "--local-infile=1",
        ])
        .arg(format!("-P{}", my.port))
        .arg("base")
        .arg("-e")
        .arg(format!(
            "LOAD DATA LOCAL INFILE '{}' INTO TABLE items FIELDS TERMINATED BY ',' \
             OPTIONALLY ENCLOSED BY '\"' ESCAPED BY '\\\\' LINES TERMINATED BY '\\n'",
            csv.display()
        ))
        .status()
        .expect("running the mariadb client");
    assert!(load.success(), "LOAD DATA failed: {load}");
    let secs = started.elapsed().as_secs_f64();
    Run {
        secs,
        cpu: (server_cpu(pg) - pg0, my_cpu(my) - my0, 0.0),
        rss_kb: 0,
        detail: format!("export {export_secs:.2}s, load {:.2}s", secs - export_secs),
    }
}

/// `zipline pipeline apply` until the sink marks the snapshot complete, on a new slot.
async fn zipline(pg: &common::Postgres, my: &common::MariaDb, yaml: &Path, log: &Path) -> Run {
    pg.psql(
        "bench",
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
         WHERE slot_name = 'zbench'",
    );
    my.sql(
        "zl",
        "DROP TABLE IF EXISTS _zipline_snapshot, _zipline_checkpoints; TRUNCATE TABLE items",
    );
    let mut check = my.conn("zl").await;
    let (pg0, my0) = (server_cpu(pg), my_cpu(my));
    let started = Instant::now();
    let mut child = spawn_zipline(yaml, log);
    let (rss_kb, zl_cpu) = wait_complete(&mut child, log, started, &mut check, |check| {
        Box::pin(async move {
            let exists: Option<i64> = check
                .query_first(
                    "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'zl' \
                 AND table_name = '_zipline_snapshot'",
                )
                .await
                .expect("looking for the snapshot table");
            exists == Some(1)
                && check
                    .query_first::<i64, _>(
                        "SELECT COUNT(*) FROM _zipline_snapshot WHERE chunk = -1 \
                     AND done_at IS NOT NULL",
                    )
                    .await
                    .expect("reading the snapshot marker")
                    == Some(1)
        })
    })
    .await;
    let secs = started.elapsed().as_secs_f64();
    let cpu = (server_cpu(pg) - pg0, my_cpu(my) - my0, zl_cpu);
    let status = stop_zipline(child);
    assert!(status.success(), "zipline exited with {status}");
    if std::env::var_os("ZIPLINE_BENCH_SHOW_LOG").is_some() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for line in text.lines().filter(|l| !l.contains(" progress ")) {
            println!("  | {line}");
        }
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let inner = text
        .lines()
        .find(|l| l.contains("snapshot complete"))
        .and_then(|l| l.split(" seconds=").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    Run {
        secs,
        cpu,
        rss_kb,
        detail: format!("{inner:.2}s of it copying"),
    }
}

/// Polls `complete` until it says the snapshot is done; returns Zipline's peak RSS (KiB) and
/// CPU seconds at that moment. Panics if Zipline exits or takes more than 30 minutes.
async fn wait_complete<C>(
    child: &mut Child,
    log: &Path,
    started: Instant,
    conn: &mut C,
    complete: for<'c> fn(&'c mut C) -> Pin<Box<dyn Future<Output = bool> + 'c>>,
) -> (u64, f64) {
    loop {
        let done = complete(conn).await;
        let stat = proc_stat(child.id());
        if done {
            return stat;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "zipline exited early with {status}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "the snapshot did not finish in 30 minutes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn median(runs: &[Run]) -> &Run {
    let mut order: Vec<&Run> = runs.iter().collect();
    order.sort_by(|a, b| a.secs.total_cmp(&b.secs));
    order[order.len() / 2]
}

/// Which sink a round of runs measures.
enum Target {
    MySql(common::MariaDb),
    Postgres(common::Postgres),
}

impl Target {
    fn name(&self) -> &'static str {
        match self {
            Target::MySql(_) => "MariaDB: COPY CSV + LOAD DATA",
            Target::Postgres(_) => "PostgreSQL: pg_dump | psql",
        }
    }

    fn sink_yaml(&self) -> String {
        match self {
            Target::MySql(my) => format!(
                "  - name: out\n    type: sink/mysql\n    host: 127.0.0.1\n    port: {}\n    \
                 database: zl\n    user: root\n",
                my.port
            ),
            Target::Postgres(dst) => pg::sink_yaml(dst),
        }
    }

    async fn baseline(&self, src: &common::Postgres, csv: &Path) -> Run {
        match self {
            Target::MySql(my) => baseline(src, my, csv),
            Target::Postgres(dst) => pg::baseline(src, dst),
        }
    }

    async fn zipline(&self, src: &common::Postgres, yaml: &Path, log: &Path) -> Run {
        match self {
            Target::MySql(my) => zipline(src, my, yaml, log).await,
            Target::Postgres(dst) => pg::zipline(src, dst, yaml, log).await,
        }
    }

    /// The checksums of the baseline's and Zipline's copies.
    fn checksums(&self) -> (String, String) {
        match self {
            Target::MySql(my) => (my.sql("base", CHECKSUM), my.sql("zl", CHECKSUM)),
            Target::Postgres(dst) => (dst.psql("base", pg::CHECKSUM), dst.psql("zl", pg::CHECKSUM)),
        }
    }
}

#[tokio::main]
async fn main() {
    let rows = env_or("ZIPLINE_BENCH_ROWS", 1_000_000);
    let parallelism = env_or("ZIPLINE_BENCH_PARALLELISM", 2);
    let chunk = env_or("ZIPLINE_BENCH_CHUNK", 50_000);
    let repeat = env_or("ZIPLINE_BENCH_REPEAT", 3).max(1);
    let sinks = std::env::var("ZIPLINE_BENCH_SINKS").unwrap_or_else(|_| "mysql,postgres".into());
    let pg = common::Postgres::start();
    pg.create_database("bench");
    pg.psql("bench", PG_TABLE);
    let started = Instant::now();
    pg.psql(
        "bench",
        &format!(
            "INSERT INTO items SELECT g, 'item-' || g, (g * 7919) % 10000, \
             ((g * 31) % 10000000) / 100.0, \
             timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second 1 microsecond', \
             CASE WHEN g % 7 = 0 THEN NULL ELSE g % 3 = 0 END, \
             CASE WHEN g % 5 = 0 THEN NULL ELSE md5(g::text) END, md5('u' || g)::uuid \
             FROM generate_series(1, {rows}::bigint) g; VACUUM ANALYZE items"
        ),
    );
    println!(
        "source: {rows} rows written and analyzed in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    for sink in sinks.split(',').map(str::trim) {
        let target = match sink {
            "mysql" => {
                let my = common::MariaDb::start();
                my.sql("", "SET GLOBAL max_allowed_packet = 1073741824");
                for db in ["base", "zl"] {
                    my.create_database(db);
                    my.sql(db, MY_TABLE);
                }
                Target::MySql(my)
            }
            "postgres" => Target::Postgres(common::Postgres::start()),
            other => panic!("ZIPLINE_BENCH_SINKS: unknown sink {other:?} (mysql, postgres)"),
        };
        measure(&pg, &target, rows, parallelism, chunk, repeat).await;
    }
}

/// `repeat` alternating runs of the baseline and Zipline into `target`; prints the medians.
async fn measure(
    pg: &common::Postgres,
    target: &Target,
    rows: usize,
    parallelism: usize,
    chunk: usize,
    repeat: usize,
) {
    println!("== {}", target.name());
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("items.csv");
    let yaml = dir.path().join("bench.yaml");
    std::fs::write(
        &yaml,
        format!(
            "name: bench\nsettings: {{ progress_interval: 5s }}\nconnectors:\n  - name: pg\n    \
             type: source/postgres\n    host: 127.0.0.1\n    port: {}\n    database: bench\n    \
             user: postgres\n    publication: zbench\n    slot_name: zbench\n    \
             tables: [public.items]\n    snapshot_parallelism: {parallelism}\n    \
             snapshot_chunk_rows: {chunk}\n{}routes:\n  - from: pg\n    to: [out]\n",
            pg.port,
            target.sink_yaml()
        ),
    )
    .expect("write yaml");
    let log = dir.path().join("zipline.log");

    let (mut base_runs, mut zl_runs) = (Vec::new(), Vec::new());
    for rep in 0..repeat {
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let order = if rep % 2 == 0 {
            ["baseline", "zipline"]
        } else {
            ["zipline", "baseline"]
        };
        for which in order {
            let run = if which == "baseline" {
                target.baseline(pg, &csv).await
            } else {
                target.zipline(pg, &yaml, &log).await
            };
            println!(
                "run {rep} {which:<8}: {:.2}s = {:.0} rows/s ({}CPU: PostgreSQL {:.2}s, \
                 target {:.2}s, zipline {:.2}s){}",
                run.secs,
                rows as f64 / run.secs,
                if run.detail.is_empty() {
                    String::new()
                } else {
                    format!("{}; ", run.detail)
                },
                run.cpu.0,
                run.cpu.1,
                run.cpu.2,
                if which == "zipline" {
                    format!(", peak RSS {:.1} MiB", run.rss_kb as f64 / 1024.0)
                } else {
                    String::new()
                }
            );
            if which == "baseline" {
                base_runs.push(run);
            } else {
                zl_runs.push(run);
            }
        }
        println!("  load average before run {rep}: {}", load.trim());
    }
    let (base, zl) = (median(&base_runs), median(&zl_runs));
    let (base_rate, zl_rate) = (rows as f64 / base.secs, rows as f64 / zl.secs);
    println!(
        "baseline (median of {repeat}): {:.2}s = {base_rate:.0} rows/s (client programs' CPU \
         not counted)",
        base.secs
    );
    println!(
        "zipline snapshot (median of {repeat}): {:.2}s = {zl_rate:.0} rows/s (parallelism \
         {parallelism}, chunks of {chunk}); peak RSS {:.1} MiB",
        zl.secs,
        zl_runs.iter().map(|r| r.rss_kb).max().unwrap_or(0) as f64 / 1024.0
    );
    println!("ratio zipline/baseline: {:.2}", zl_rate / base_rate);
    let (base_sum, zl_sum) = target.checksums();
    println!("sink equal to baseline: {}", base_sum == zl_sum);
    assert_eq!(
        base_sum, zl_sum,
        "Zipline's snapshot differs from the baseline's copy"
    );
}
