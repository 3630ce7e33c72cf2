//! Shared helpers for the end-to-end tests (`tests/pipelines`, `tests/edges`, `tests/transforms`, `tests/sqlserver`): they run
//! the real `zipline` binary between throwaway PostgreSQL and MariaDB servers (`tests/common`)
//! and compare source and sink.
//!
//! - [`Fixture`]: both servers, the `orders` table on each side (PostgreSQL database `app`,
//!   MariaDB database `shop`), a temp directory for pipeline files, logs and secrets, and the
//!   environment the pipeline file's `${...}` placeholders read.
//! - [`Zipline`]: one `zipline` process, stderr captured to a file; on a failing test its log
//!   is printed, because that is usually where the reason is.
//! - [`wait_converged`]: polls until the sink equals the source row for row (every column
//!   rendered to text in SQL on each side, so both render the same way), or fails with the
//!   first differing rows.
//! - [`workload`]: the randomized concurrent writer.
//!
//! Most tests start with empty (or identical) tables on both sides and the workload once the
//! slot is streaming ([`wait_streaming`]: after the initial snapshot); [`snapshot`] has the
//! helpers of the snapshot tests.

pub mod pg;
pub mod sinks;
pub mod snapshot;
pub mod trace;
pub mod workload;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;

use crate::common::{MariaDb, Postgres};

/// Source database (PostgreSQL).
pub const PG_DB: &str = "app";
/// Sink database (MariaDB).
pub const MY_DB: &str = "shop";
pub const SLOT: &str = "zipline_e2e";
pub const PUBLICATION: &str = "zipline_e2e_pub";
/// How long a sink may take to catch up before a test fails.
pub const CONVERGE_TIMEOUT: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(200);

pub const PG_ORDERS: &str = "CREATE TABLE orders (
    id bigint PRIMARY KEY,
    customer text,
    amount numeric(12,2),
    status varchar(20),
    created_at timestamptz,
    flag boolean,
    note text
)";

pub const MY_ORDERS: &str = "CREATE TABLE orders (
    id BIGINT PRIMARY KEY,
    customer TEXT,
    amount DECIMAL(12,2),
    status VARCHAR(20),
    created_at DATETIME(6),
    flag TINYINT(1),
    note TEXT
) ENGINE=InnoDB";

/// Both servers with `orders` created on each side, and a directory for pipeline files.
pub struct Fixture {
    pub pg: Postgres,
    pub my: MariaDb,
    pub work: Workdir,
    /// The MySQL port the pipeline uses (`MYSQL_PORT`): the server's, or a proxy's.
    pub mysql_port: u16,
}

/// A directory for a test's pipeline file, secrets and spill, and the zipline runs in it, each
/// with its own log file. Fixtures deref to it.
pub struct Workdir {
    pub dir: tempfile::TempDir,
    spawned: u32,
}

impl Default for Workdir {
    fn default() -> Self {
        Workdir::new()
    }
}

impl Workdir {
    /// A fresh directory; the harness's directories are swept when a crashed run leaves them.
    pub fn new() -> Workdir {
        Workdir {
            dir: crate::common::test_dir(),
            spawned: 0,
        }
    }

    /// Writes `orders.yaml` (overwriting) and returns its path.
    pub fn write_pipeline(&self, yaml: &str) -> PathBuf {
        let path = self.dir.path().join("orders.yaml");
        std::fs::write(&path, yaml).expect("writing orders.yaml");
        path
    }

    /// `["pipeline", verb, "-f", <orders.yaml>]`.
    pub fn args(&self, verb: &str) -> Vec<String> {
        let file = self.dir.path().join("orders.yaml");
        vec![
            "pipeline".to_owned(),
            verb.to_owned(),
            "-f".to_owned(),
            file.display().to_string(),
        ]
    }

    /// Runs `zipline <args>` with `env`, its output in a fresh log file.
    pub fn spawn(&mut self, args: &[String], env: &[(String, String)]) -> Zipline {
        self.spawned += 1;
        let log = self
            .dir
            .path()
            .join(format!("zipline-{}.log", self.spawned));
        Zipline::spawn(args, env, log)
    }

    /// Runs zipline to completion (it must exit within `timeout`): exit code, combined output
    /// and how long it took.
    pub fn run_to_exit(
        &mut self,
        args: &[String],
        env: &[(String, String)],
        timeout: Duration,
    ) -> (i32, String, Duration) {
        let started = Instant::now();
        let mut z = self.spawn(args, env);
        let Some(status) = z.wait_exit(timeout) else {
            panic!(
                "zipline {args:?} did not exit within {timeout:?}; log:\n{}",
                z.tail(80)
            );
        };
        let code = status
            .code()
            .unwrap_or_else(|| panic!("zipline {args:?} died by a signal: {status}"));
        (code, z.output(), started.elapsed())
    }
}

/// `impl Deref<Target = Workdir>` (and `DerefMut`) for a fixture with a `work` field.
macro_rules! deref_to_workdir {
    ($fixture:ty) => {
        impl std::ops::Deref for $fixture {
            type Target = $crate::e2e::Workdir;
            fn deref(&self) -> &$crate::e2e::Workdir {
                &self.work
            }
        }

        impl std::ops::DerefMut for $fixture {
            fn deref_mut(&mut self) -> &mut $crate::e2e::Workdir {
                &mut self.work
            }
        }
    };
}
pub(crate) use deref_to_workdir;

deref_to_workdir!(Fixture);

impl Fixture {
    /// Starts both servers and creates `orders` on both sides.
    pub fn start() -> Fixture {
        let fx = Fixture::servers();
        fx.pg.psql(PG_DB, PG_ORDERS);
        fx.my.sql(MY_DB, MY_ORDERS);
        fx
    }

    /// Starts both servers with empty databases `app` / `shop`.
    pub fn servers() -> Fixture {
        Fixture::with_postgres(Postgres::start())
    }

    /// Like [`Fixture::servers`] with a given PostgreSQL (e.g. `start_with` settings).
    pub fn with_postgres(pg: Postgres) -> Fixture {
        let my = MariaDb::start();
        pg.create_database(PG_DB);
        my.create_database(MY_DB);
        let mysql_port = my.port;
        Fixture {
            pg,
            my,
            work: Workdir::new(),
            mysql_port,
        }
    }

    /// Values for the pipeline file's placeholders.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("POSTGRES_HOST", self.pg.host().to_owned()),
            ("POSTGRES_PORT", self.pg.port.to_string()),
            ("POSTGRES_DATABASE", PG_DB.to_owned()),
            ("POSTGRES_USER", "postgres".to_owned()),
            ("POSTGRES_PUBLICATION", PUBLICATION.to_owned()),
            ("POSTGRES_SLOT_NAME", SLOT.to_owned()),
            ("MYSQL_PORT", self.mysql_port.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// `zipline pipeline apply -f orders.yaml` with [`Fixture::env`].
    pub fn apply(&mut self) -> Zipline {
        let (args, env) = (self.args("apply"), self.env());
        self.work.spawn(&args, &env)
    }

    /// A PostgreSQL client on the source database.
    pub async fn pg_client(&self) -> tokio_postgres::Client {
        self.pg.client(PG_DB).await
    }

    /// A MariaDB connection with no default database, so that killing every connection of
    /// `shop` (the sink's) spares it; queries name `shop.` explicitly.
    pub async fn my_checker(&self) -> mysql_async::Conn {
        let mut conn = self.my.conn("").await;
        conn.query_drop("SET SESSION group_concat_max_len = 1073741824")
            .await
            .expect("raising group_concat_max_len");
        conn
    }

    /// Replication slots and publications on the source database, as `name` lists; both must
    /// be empty after a refused configuration.
    pub fn slots_and_publications(&self) -> (String, String) {
        (
            self.pg.psql(
                PG_DB,
                "SELECT string_agg(slot_name, ',') FROM pg_replication_slots",
            ),
            self.pg
                .psql(PG_DB, "SELECT string_agg(pubname, ',') FROM pg_publication"),
        )
    }
}

/// Tuning for [`pipeline_yaml`].
#[derive(Debug, Clone)]
pub struct PipelineOpts {
    pub lanes: u32,
    /// Extra lines for the sink entry, e.g. `"batch_size: 50"` (indentation added).
    pub sink_extra: Vec<String>,
    /// Extra lines for the source entry.
    pub source_extra: Vec<String>,
}

impl Default for PipelineOpts {
    fn default() -> Self {
        PipelineOpts {
            lanes: 4,
            sink_extra: vec!["max_wait: 20ms".to_owned()],
            source_extra: Vec::new(),
        }
    }
}

/// The standard `orders` pipeline: every connection setting comes from the environment.
pub fn pipeline_yaml(opts: &PipelineOpts) -> String {
    let indent = |lines: &[String]| {
        lines
            .iter()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    };
    format!(
        r#"name: orders
settings:
  progress_interval: 5s
connectors:
  - name: orders-db
    type: source/postgres
    host: "${{POSTGRES_HOST}}"
    port: "${{POSTGRES_PORT}}"
    database: "${{POSTGRES_DATABASE}}"
    user: "${{POSTGRES_USER}}"
    publication: "${{POSTGRES_PUBLICATION}}"
    slot_name: "${{POSTGRES_SLOT_NAME}}"
{source_extra}  - name: mysql-out
    type: sink/mysql
    host: 127.0.0.1
    port: "${{MYSQL_PORT}}"
    database: {MY_DB}
    user: root
    lanes: {lanes}
{sink_extra}routes:
  - from: orders-db
    to: [mysql-out]
"#,
        lanes = opts.lanes,
        source_extra = indent(&opts.source_extra),
        sink_extra = indent(&opts.sink_extra),
    )
}

/// One `zipline` process. Killed on drop; a panicking test prints its log.
pub struct Zipline {
    child: Option<Child>,
    status: Option<ExitStatus>,
    pub log: PathBuf,
}

impl Zipline {
    pub fn spawn(args: &[String], env: &[(String, String)], log: PathBuf) -> Zipline {
        let stderr = std::fs::File::create(&log)
            .unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        let stdout = stderr.try_clone().expect("cloning the log file handle");
        let mut cmd = Command::new(crate::common::zipline_bin());
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        // Hermetic: nothing from the caller's environment may satisfy a placeholder or secret.
        for (key, _) in std::env::vars() {
            if key.starts_with("ZIPLINE_")
                || key.starts_with("POSTGRES_")
                || key.starts_with("MYSQL_")
            {
                cmd.env_remove(key);
            }
        }
        let level = std::env::var("ZIPLINE_E2E_LOG").unwrap_or_else(|_| "info".to_owned());
        cmd.env("ZIPLINE_LOG", level);
        // The tests read the log as text (a piped stderr would get JSON lines).
        cmd.env("ZIPLINE_LOG_FORMAT", "text");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {:?}: {e}", crate::common::zipline_bin()));
        eprintln!(
            "e2e: zipline pid {} {args:?}, log {}",
            child.id(),
            log.display()
        );
        Zipline {
            child: Some(child),
            status: None,
            log,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Everything the process wrote so far (stderr and stdout).
    pub fn output(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    /// The last `n` lines of [`Zipline::output`].
    pub fn tail(&self, n: usize) -> String {
        let out = self.output();
        let lines: Vec<&str> = out.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The exit status if the process has exited.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none()
            && let Some(child) = self.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            self.status = Some(status);
            self.child = None;
        }
        self.status
    }

    /// Panics with the log if the process has exited (it should be streaming).
    pub fn assert_running(&mut self) {
        if let Some(status) = self.try_status() {
            panic!(
                "zipline exited unexpectedly ({status}); log {}:\n{}",
                self.log.display(),
                self.tail(80)
            );
        }
    }

    /// Waits up to `timeout` for the process to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_status() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to `timeout` for the process to fail (exit 1) by itself, with `needle` in its
    /// output; returns the output.
    pub fn expect_failure(&mut self, timeout: Duration, needle: &str) -> String {
        let status = self
            .wait_exit(timeout)
            .unwrap_or_else(|| panic!("zipline kept running:\n{}", self.tail(40)));
        assert_eq!(status.code(), Some(1), "{}", self.tail(40));
        let out = self.output();
        assert!(out.contains(needle), "expected `{needle}` in:\n{out}");
        out
    }

    /// Sends `sig` (`TERM`, `INT`, `KILL`, ...).
    pub fn signal(&self, sig: &str) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .arg(format!("-{sig}"))
                .arg(pid.to_string())
                .stderr(Stdio::null())
                .status();
        }
    }

    /// SIGTERM, then the exit status if it exits within `timeout` (else `None`, still running).
    pub fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.signal("TERM");
        self.wait_exit(timeout)
    }

    /// SIGTERM and require a clean exit (status 0) within `timeout`; returns how long it took.
    pub fn terminate_cleanly(&mut self, timeout: Duration) -> Duration {
        let started = Instant::now();
        match self.terminate(timeout) {
            Some(status) if status.success() => started.elapsed(),
            Some(status) => panic!(
                "zipline exited with {status} after SIGTERM (expected 0); log {}:\n{}",
                self.log.display(),
                self.tail(80)
            ),
            None => panic!(
                "zipline did not exit within {timeout:?} of SIGTERM; log {}:\n{}",
                self.log.display(),
                self.tail(80)
            ),
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            self.status = child.wait().ok();
        }
    }
}

impl Drop for Zipline {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "----- zipline log {} (last 150 lines) -----\n{}\n----- end of zipline log -----",
                self.log.display(),
                self.tail(150)
            );
        }
    }
}

/// Waits until the slot exists and a walsender streams from it (Zipline created the slot and
/// started replication): from then on every commit reaches the sink.
pub async fn wait_streaming(pg: &tokio_postgres::Client, z: &mut Zipline, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        z.assert_running();
        let row = pg
            .query_opt(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                &[&SLOT],
            )
            .await
            .expect("reading pg_replication_slots");
        if row.is_some_and(|r| r.get::<_, bool>(0)) {
            return;
        }
        if Instant::now() >= deadline {
            panic!(
                "slot {SLOT} not streaming after {timeout:?}; zipline log:\n{}",
                z.tail(80)
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A table's rows, every column rendered to text by the database itself.
pub type Rows = Vec<Vec<Option<String>>>;

/// Row count and md5 of the canonical rendering (both computed in SQL on each side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub count: i64,
    pub md5: String,
}

const PG_COLUMNS: &[&str] = &[
    "id::text",
    "customer",
    "amount::text",
    "status::text",
    "to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')",
    "flag::int::text",
    "note",
];

const MY_COLUMNS: &[&str] = &[
    "CAST(id AS CHAR)",
    "customer",
    "CAST(amount AS CHAR)",
    "status",
    "DATE_FORMAT(created_at, '%Y-%m-%d %H:%i:%s.%f')",
    "CAST(flag AS CHAR)",
    "note",
];

/// NULL in the checksum's rendering (no backslashes: the two dialects escape differently).
const NULL_MARK: &str = "<null>";

fn pg_line() -> String {
    let cols: Vec<String> = PG_COLUMNS
        .iter()
        .map(|c| format!("coalesce({c}, '{NULL_MARK}')"))
        .collect();
    format!("concat_ws('|', {})", cols.join(", "))
}

fn my_line() -> String {
    let cols: Vec<String> = MY_COLUMNS
        .iter()
        .map(|c| format!("IFNULL({c}, '{NULL_MARK}')"))
        .collect();
    format!("CONCAT_WS('|', {})", cols.join(", "))
}

pub async fn pg_rows(pg: &tokio_postgres::Client) -> Rows {
    let sql = format!("SELECT {} FROM orders ORDER BY id", PG_COLUMNS.join(", "));
    pg_text_rows(pg, &sql).await
}

/// The rows `sql` (one or more statements, simple protocol) returns, every value as text.
pub async fn pg_text_rows(client: &tokio_postgres::Client, sql: &str) -> Rows {
    let messages = client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows_of(messages)
}

/// The data rows of a simple-protocol result, every value as text (`None` for NULL).
pub fn rows_of(messages: Vec<tokio_postgres::SimpleQueryMessage>) -> Rows {
    messages
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_owned)).collect())
            }
            _ => None,
        })
        .collect()
}

pub async fn my_rows(my: &mut mysql_async::Conn) -> Rows {
    let sql = format!(
        "SELECT {} FROM {MY_DB}.orders ORDER BY id",
        MY_COLUMNS.join(", ")
    );
    let rows: Vec<mysql_async::Row> = my.query(sql).await.expect("reading sink rows");
    rows.into_iter()
        .map(|r| {
            (0..r.len())
                .map(|i| r.get::<Option<String>, _>(i).flatten())
                .collect()
        })
        .collect()
}

pub async fn pg_summary(pg: &tokio_postgres::Client) -> Summary {
    let sql = format!(
        "SELECT count(*), md5(coalesce(string_agg({}, E'\\n' ORDER BY id), '')) FROM orders",
        pg_line()
    );
    let row = pg.query_one(&sql, &[]).await.expect("source checksum");
    Summary {
        count: row.get(0),
        md5: row.get(1),
    }
}

pub async fn my_summary(my: &mut mysql_async::Conn) -> Summary {
    let sql = format!(
        "SELECT COUNT(*), MD5(IFNULL(GROUP_CONCAT({} ORDER BY id SEPARATOR '\\n'), '')) FROM {MY_DB}.orders",
        my_line()
    );
    let (count, md5): (i64, String) = my
        .query_first(sql)
        .await
        .expect("sink checksum")
        .expect("one row");
    Summary { count, md5 }
}

/// A readable account of how `sink` differs from `source` (both sorted by id): counts of
/// missing, extra and different rows, and the first few of each.
pub fn diff_rows(source: &Rows, sink: &Rows) -> Option<String> {
    let by_id = |rows: &Rows| -> BTreeMap<i64, Vec<Option<String>>> {
        rows.iter()
            .map(|r| {
                let id = r[0]
                    .as_deref()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(i64::MIN);
                (id, r.clone())
            })
            .collect()
    };
    let (src, snk) = (by_id(source), by_id(sink));
    let missing: Vec<_> = src.keys().filter(|k| !snk.contains_key(k)).collect();
    let extra: Vec<_> = snk.keys().filter(|k| !src.contains_key(k)).collect();
    let differ: Vec<_> = src
        .iter()
        .filter(|(k, v)| snk.get(k).is_some_and(|s| s != *v))
        .map(|(k, _)| k)
        .collect();
    if missing.is_empty() && extra.is_empty() && differ.is_empty() {
        return None;
    }
    let show = |r: &Vec<Option<String>>| {
        r.iter()
            .map(|c| match c.as_deref() {
                None => "NULL".to_owned(),
                Some(v) => {
                    let cut: String = v.chars().take(60).collect();
                    let more = if cut.len() < v.len() { "…" } else { "" };
                    format!("{:?}{more}", cut)
                }
            })
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let mut out = format!(
        "source {} rows, sink {} rows: {} missing in sink, {} extra in sink, {} different\n",
        source.len(),
        sink.len(),
        missing.len(),
        extra.len(),
        differ.len()
    );
    for k in missing.iter().take(5) {
        let _ = writeln!(out, "  missing id {k}: source {}", show(&src[k]));
    }
    for k in extra.iter().take(5) {
        let _ = writeln!(out, "  extra   id {k}: sink   {}", show(&snk[k]));
    }
    for k in differ.iter().take(5) {
        let _ = writeln!(
            out,
            "  differ  id {k}:\n    source {}\n    sink   {}",
            show(&src[k]),
            show(&snk[k])
        );
    }
    Some(out)
}

/// Polls (every 200 ms) until the sink's `orders` equals the source's row for row and the
/// checksums agree; fails after `timeout` with the differences, or at once if `z` exits.
pub async fn wait_converged(
    pg: &tokio_postgres::Client,
    my: &mut mysql_async::Conn,
    mut z: Option<&mut Zipline>,
    timeout: Duration,
) -> Summary {
    let started = Instant::now();
    let deadline = started + timeout;
    loop {
        if let Some(z) = z.as_deref_mut() {
            z.assert_running();
        }
        let source = pg_rows(pg).await;
        let sink = my_rows(my).await;
        let diff = diff_rows(&source, &sink);
        if diff.is_none() {
            let (a, b) = (pg_summary(pg).await, my_summary(my).await);
            assert_eq!(
                a, b,
                "rows are equal but the checksums differ (source vs sink)"
            );
            eprintln!(
                "e2e: converged in {:.1?}: {} rows, md5 {}",
                started.elapsed(),
                a.count,
                a.md5
            );
            return a;
        }
        if Instant::now() >= deadline {
            let log = z.as_deref().map(|z| z.tail(60)).unwrap_or_default();
            panic!(
                "sink did not converge to the source within {timeout:?}:\n{}\nzipline log tail:\n{log}",
                diff.unwrap_or_default()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Asserts the sink equals the source now (no waiting).
pub async fn assert_equal_now(pg: &tokio_postgres::Client, my: &mut mysql_async::Conn) {
    if let Some(diff) = diff_rows(&pg_rows(pg).await, &my_rows(my).await) {
        panic!("sink differs from source:\n{diff}");
    }
}

/// The current WAL write position, as text (`0/16B3748`).
pub async fn current_wal_lsn(pg: &tokio_postgres::Client) -> String {
    pg.query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("pg_current_wal_lsn")
        .get(0)
}

/// Waits up to `timeout` for the slot's `confirmed_flush_lsn` to reach `lsn`; returns the last
/// value seen and whether it got there. The walsender processes the final status update a
/// moment after Zipline sends it, so this polls briefly.
pub async fn wait_confirmed_at_least(
    pg: &tokio_postgres::Client,
    lsn: &str,
    timeout: Duration,
) -> (String, bool) {
    let deadline = Instant::now() + timeout;
    loop {
        let row = pg
            .query_one(
                "SELECT coalesce(confirmed_flush_lsn::text, 'none'), \
                        coalesce(confirmed_flush_lsn >= $2::text::pg_lsn, false) \
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&SLOT, &lsn],
            )
            .await
            .expect("reading the slot's confirmed_flush_lsn");
        let (confirmed, reached): (String, bool) = (row.get(0), row.get(1));
        if reached || Instant::now() >= deadline {
            return (confirmed, reached);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asserts no row of `ids` exists in the sink.
pub async fn assert_absent_in_sink(my: &mut mysql_async::Conn, ids: &[i64]) {
    for chunk in ids.chunks(500) {
        let list = chunk
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let present: Vec<i64> = my
            .query(format!(
                "SELECT id FROM {MY_DB}.orders WHERE id IN ({list})"
            ))
            .await
            .expect("checking deleted ids");
        assert!(
            present.is_empty(),
            "ids deleted on the source are still in the sink: {present:?}"
        );
    }
}
