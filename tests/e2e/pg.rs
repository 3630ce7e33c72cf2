//! Helpers for PostgreSQL → PostgreSQL tests (`tests/pipelines`): two throwaway clusters,
//! the source (database `app`, as in [`super::Fixture`]) and the sink (database `replica`),
//! the `orders` table on both, and row-for-row comparison of the whole
//! rows as PostgreSQL renders them (`t::text`), so a value that changed type, precision or
//! time zone on the way shows up.
//!
//! The MySQL fixtures' helpers that are not MySQL-specific are reused from [`super`]:
//! [`super::Zipline`], [`super::PipelineOpts`], [`super::diff_rows`], [`super::wait_streaming`],
//! the slot and publication names, and the workload.

use std::time::{Duration, Instant};

use super::{PG_DB, PG_ORDERS, PUBLICATION, PipelineOpts, Rows, SLOT, Workdir, Zipline, diff_rows};
use crate::common::Postgres;

/// Sink database (on the sink cluster).
pub const SINK_DB: &str = "replica";

/// Source and sink clusters, and a directory for pipeline files, logs and secrets.
pub struct PgFixture {
    pub src: Postgres,
    pub sink: Postgres,
    pub work: Workdir,
    /// The sink port the pipeline uses (`SINK_PORT`): the server's, or a proxy's.
    pub sink_port: u16,
}

super::deref_to_workdir!(PgFixture);

impl PgFixture {
    /// Both clusters, with `orders` (see [`PG_ORDERS`]) on each side.
    pub fn start() -> PgFixture {
        let fx = PgFixture::servers();
        fx.src.psql(PG_DB, PG_ORDERS);
        fx.sink.psql(SINK_DB, PG_ORDERS);
        fx
    }

    /// Both clusters with empty databases `app` / `replica`.
    pub fn servers() -> PgFixture {
        let src = Postgres::start();
        let sink = Postgres::start();
        src.create_database(PG_DB);
        sink.create_database(SINK_DB);
        let sink_port = sink.port;
        PgFixture {
            src,
            sink,
            work: Workdir::new(),
            sink_port,
        }
    }

    /// Values for the pipeline file's placeholders.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("POSTGRES_HOST", self.src.host().to_owned()),
            ("POSTGRES_PORT", self.src.port.to_string()),
            ("POSTGRES_DATABASE", PG_DB.to_owned()),
            ("POSTGRES_USER", "postgres".to_owned()),
            ("POSTGRES_PUBLICATION", PUBLICATION.to_owned()),
            ("POSTGRES_SLOT_NAME", SLOT.to_owned()),
            ("SINK_PORT", self.sink_port.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// `zipline pipeline apply -f orders.yaml` with [`PgFixture::env`].
    pub fn apply(&mut self) -> Zipline {
        let (args, env) = (self.args("apply"), self.env());
        self.work.spawn(&args, &env)
    }

    pub async fn src_client(&self) -> tokio_postgres::Client {
        self.src.client(PG_DB).await
    }

    pub async fn sink_client(&self) -> tokio_postgres::Client {
        self.sink.client(SINK_DB).await
    }
}

/// The standard `orders` pipeline into `sink/postgres` (database [`SINK_DB`] on
/// `127.0.0.1:${SINK_PORT}`); `opts.sink_extra` lines go into the sink entry.
pub fn pg_pipeline_yaml(opts: &PipelineOpts) -> String {
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
{source_extra}  - name: pg-out
    type: sink/postgres
    host: 127.0.0.1
    port: "${{SINK_PORT}}"
    database: {SINK_DB}
    user: postgres
    lanes: {lanes}
{sink_extra}routes:
  - from: orders-db
    to: [pg-out]
"#,
        lanes = opts.lanes,
        source_extra = indent(&opts.source_extra),
        sink_extra = indent(&opts.sink_extra),
    )
}

/// Every row of `table` as `[id, whole row as text]`, ordered by `id`. The session renders
/// timestamps in UTC on both sides.
pub async fn rows(client: &tokio_postgres::Client, table: &str) -> Rows {
    let sql =
        format!("SET TimeZone = 'UTC'; SELECT t.id::text, t::text FROM {table} t ORDER BY t.id");
    super::pg_text_rows(client, &sql).await
}

/// Polls (every 200 ms) until the sink's `table` equals the source's, row for row; fails
/// after `timeout` with the differences, or at once if `z` exits. Returns the row count.
pub async fn wait_converged(
    src: &tokio_postgres::Client,
    sink: &tokio_postgres::Client,
    table: &str,
    mut z: Option<&mut Zipline>,
    timeout: Duration,
) -> usize {
    let started = Instant::now();
    loop {
        if let Some(z) = z.as_deref_mut() {
            z.assert_running();
        }
        let (a, b) = (rows(src, table).await, rows(sink, table).await);
        let Some(diff) = diff_rows(&a, &b) else {
            eprintln!(
                "e2e: {table} converged in {:.1?}: {} rows",
                started.elapsed(),
                a.len()
            );
            return a.len();
        };
        if started.elapsed() >= timeout {
            let log = z.as_deref().map(|z| z.tail(60)).unwrap_or_default();
            panic!(
                "sink {table} did not converge to the source within {timeout:?}:\n{diff}\nzipline log tail:\n{log}"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Asserts no row of `ids` exists in the sink's `orders`.
pub async fn assert_absent(sink: &tokio_postgres::Client, ids: &[i64]) {
    let present: Vec<i64> = sink
        .query("SELECT id FROM orders WHERE id = ANY($1)", &[&ids])
        .await
        .expect("checking deleted ids")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        present.is_empty(),
        "ids deleted on the source are still in the sink: {present:?}"
    );
}

/// Creates login role `role` with `password` and makes TCP logins of that role on `pg` use
/// SCRAM (the harness clusters trust everyone), waiting until the reload is in effect.
pub fn scram_role(pg: &Postgres, db: &str, role: &str, password: &str) {
    pg.psql(
        db,
        &format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{password}'; \
             GRANT ALL ON SCHEMA public TO {role}; \
             GRANT ALL ON ALL TABLES IN SCHEMA public TO {role};"
        ),
    );
    let hba = pg.data_dir().join("pg_hba.conf");
    let old = std::fs::read_to_string(&hba).expect("reading pg_hba.conf");
    std::fs::write(
        &hba,
        format!("host all {role} 127.0.0.1/32 scram-sha-256\n{old}"),
    )
    .expect("writing pg_hba.conf");
    assert_eq!(pg.psql(db, "SELECT pg_reload_conf()"), "t");
    // The reload is asynchronous: wait until a password-less TCP login of the role fails.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = std::process::Command::new("/usr/lib/postgresql/15/bin/psql")
            .args([
                "-X",
                "-w",
                "-h",
                "127.0.0.1",
                "-U",
                role,
                "-d",
                db,
                "-c",
                "SELECT 1",
            ])
            .arg("-p")
            .arg(pg.port.to_string())
            .env_remove("PGPASSWORD")
            .output()
            .expect("running psql");
        if !out.status.success() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "pg_hba.conf reload not in effect for role {role}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Backend pids of Zipline's sink sessions (`application_name = 'zipline'`) on `client`'s
/// server.
pub async fn zipline_backends(client: &tokio_postgres::Client) -> Vec<i32> {
    client
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'zipline' \
             AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .expect("listing sink sessions")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Waits until the sink records the initial snapshot as complete (Zipline streams from then
/// on); fails after `timeout` or at once if `z` exits.
pub async fn wait_snapshot_complete(
    sink: &tokio_postgres::Client,
    z: &mut Zipline,
    timeout: Duration,
) {
    let started = Instant::now();
    loop {
        z.assert_running();
        let done = sink
            .query_opt(
                "SELECT done_at IS NOT NULL FROM _zipline_snapshot \
                 WHERE source_table = '' AND chunk = -1",
                &[],
            )
            .await
            .ok()
            .flatten()
            .is_some_and(|r| r.get::<_, bool>(0));
        if done {
            return;
        }
        assert!(
            started.elapsed() < timeout,
            "the snapshot did not complete within {timeout:?}; zipline log:\n{}",
            z.tail(60)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
