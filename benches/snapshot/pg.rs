//! The PostgreSQL half of the snapshot benchmark (see `benches/snapshot.rs`): Zipline's
//! snapshot into PostgreSQL next to `pg_dump -t public.items bench | psql base`.
//!
//! The baseline loads into an empty database: `pg_dump` creates the table, loads its rows
//! with `COPY`, then builds the primary key. Zipline (`create_tables: true`, into the empty
//! database `zl`) creates the table with its primary key first — it must: the stream's upserts
//! need it the moment the snapshot ends — so every row also pays for the index.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use super::common::Postgres;
use super::common_backlog::{server_cpu, spawn_zipline, stop_zipline};
use super::{Run, wait_complete};

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// The sink connector for Zipline's run.
pub fn sink_yaml(dst: &Postgres) -> String {
    format!(
        "  - name: out\n    type: sink/postgres\n    host: {}\n    port: {}\n    database: zl\n    \
         user: postgres\n    create_tables: true\n",
        dst.host(),
        dst.port
    )
}

pub const CHECKSUM: &str = "SELECT count(*) || ':' || coalesce(sum(hashtext(i::text)::bigint), 0) \
    FROM items i";

pub fn recreate(dst: &Postgres, db: &str) {
    dst.psql(
        "postgres",
        &format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"),
    );
    dst.create_database(db);
}

/// `pg_dump -t public.items bench | psql base`, into an empty database.
pub fn baseline(src: &Postgres, dst: &Postgres) -> Run {
    recreate(dst, "base");
    let (src0, dst0) = (server_cpu(src), server_cpu(dst));
    let started = Instant::now();
    let mut dump = Command::new(format!("{PG_BIN}/pg_dump"))
        .args([
            "-h",
            src.host(),
            "-U",
            "postgres",
            "-t",
            "public.items",
            "bench",
        ])
        .arg(format!("--port={}", src.port))
        .stdout(Stdio::piped())
        .spawn()
        .expect("running pg_dump");
    let restore = Command::new(format!("{PG_BIN}/psql"))
        .args([
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            dst.host(),
            "-U",
            "postgres",
        ])
        .arg(format!("--port={}", dst.port))
        .args(["-d", "base"])
        .stdin(dump.stdout.take().expect("pg_dump stdout"))
        .stdout(Stdio::null())
        .status()
        .expect("running psql");
    let dumped = dump.wait().expect("waiting for pg_dump");
    assert!(
        dumped.success() && restore.success(),
        "pg_dump {dumped}, psql {restore}"
    );
    Run {
        secs: started.elapsed().as_secs_f64(),
        cpu: (server_cpu(src) - src0, server_cpu(dst) - dst0, 0.0),
        rss_kb: 0,
        detail: String::new(),
    }
}

/// `zipline pipeline apply` until the sink marks the snapshot complete, on a new slot.
pub async fn zipline(src: &Postgres, dst: &Postgres, yaml: &Path, log: &Path) -> Run {
    src.psql(
        "bench",
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
         WHERE slot_name = 'zbench'",
    );
    recreate(dst, "zl");
    let mut check = dst.client("zl").await;
    let (src0, dst0) = (server_cpu(src), server_cpu(dst));
    let started = Instant::now();
    let mut child = spawn_zipline(yaml, log);
    let (rss_kb, zl_cpu) = wait_complete(&mut child, log, started, &mut check, |check| {
        Box::pin(async move {
            let exists: bool = check
                .query_one(
                    "SELECT to_regclass('public._zipline_snapshot') IS NOT NULL",
                    &[],
                )
                .await
                .expect("looking for the snapshot table")
                .get(0);
            exists
                && check
                    .query_one(
                        "SELECT count(*) FROM public._zipline_snapshot WHERE chunk = -1 \
                     AND done_at IS NOT NULL",
                        &[],
                    )
                    .await
                    .expect("reading the snapshot marker")
                    .get::<_, i64>(0)
                    == 1
        })
    })
    .await;
    let secs = started.elapsed().as_secs_f64();
    let cpu = (server_cpu(src) - src0, server_cpu(dst) - dst0, zl_cpu);
    let status = stop_zipline(child);
    assert!(status.success(), "zipline exited with {status}");
    Run {
        secs,
        cpu,
        rss_kb,
        detail: String::new(),
    }
}
