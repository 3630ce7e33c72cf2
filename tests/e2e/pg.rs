//! Helpers for PostgreSQL → PostgreSQL tests (`tests/e2e_pg_*.rs`, `tests/pg_sink.rs`): two
//! throwaway clusters, the source (database `app`, as in [`super::Fixture`]) and the sink
//! (database `replica`), the `orders` table on both, and row-for-row comparison of the whole
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

/// Fixtures of the sink-level tests (`tests/pg_sink*.rs`): options, tables and changes built
/// by hand, a cluster with the sink database, and lane helpers.
pub mod fixtures {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::common::Postgres;
    use zipline::change::{Change, Column, PG_EPOCH_MICROS, Table, Value};
    use zipline::sink::postgres::PostgresSinkOptions;
    use zipline::sink::{Batch, LaneSink};

    pub const DB: &str = super::SINK_DB;

    pub fn options(pg: &Postgres) -> PostgresSinkOptions {
        PostgresSinkOptions {
            connector: "pg-out".into(),
            pipeline: "orders-pipe".into(),
            host: pg.host().into(),
            port: pg.port,
            database: DB.into(),
            user: "postgres".into(),
            password: None,
            schema: None,
            create_tables: false,
            connect_timeout: Duration::from_secs(5),
            dead_letter_table: "_zipline_dead_letters".into(),
            create_dead_letter_table: false,
        }
    }

    pub fn col(name: &str, type_oid: u32, type_modifier: i32, is_key: bool) -> Column {
        Column {
            name: name.into(),
            type_oid,
            type_modifier,
            is_key,
        }
    }

    pub fn table(name: &str, cols: Vec<Column>) -> Arc<Table> {
        Arc::new(Table::new("public".into(), name.into(), cols))
    }

    /// A source enum's OID: meaningless on the sink, which casts the text to its own enum.
    pub const SOURCE_MOOD_OID: u32 = 91_234;

    pub fn orders() -> Arc<Table> {
        table(
            "orders",
            vec![
                col("id", 23, -1, true),
                col("note", 25, -1, false),
                col("qty", 20, -1, false),
                col("price", 701, -1, false),
                col("weight", 700, -1, false),
                col("placed", 1114, -1, false),
                col("paid_at", 1184, -1, false),
                col("due", 1082, -1, false),
                col("ref", 2950, -1, false),
                col("blob", 17, -1, false),
                col("amount", 1700, 786_438, false),
                col("doc", 3802, -1, false),
                col("mood", SOURCE_MOOD_OID, -1, false),
                col("tags", 1007, -1, false),
                col("span", 1186, -1, false),
                col("at", 1083, -1, false),
                col("flag", 16, -1, false),
                col("small", 21, -1, false),
            ],
        )
    }

    pub const ORDERS_DDL: &str = "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
        CREATE TABLE orders (id int4 PRIMARY KEY, note text, qty int8 NOT NULL, price float8,
          weight float4, placed timestamp, paid_at timestamptz, due date, ref uuid, blob bytea,
          amount numeric(12,2), doc jsonb, mood mood, tags int4[], span interval, at time,
          flag bool, small int2);
        CREATE TABLE expected (LIKE orders);";

    /// A row with every kind of value; `id`, `note` and `qty` vary.
    pub fn order_row(id: i32, note: &str, qty: i64) -> Vec<Value> {
        vec![
            Value::Int4(id),
            Value::Text(note.into()),
            Value::Int8(qty),
            Value::Float8(0.1),
            Value::Float4(f32::MAX),
            Value::Timestamp(1_706_704_496_123_456 - PG_EPOCH_MICROS),
            Value::TimestampTz(-62_135_596_800_000_001 - PG_EPOCH_MICROS),
            Value::Date(i32::MAX),
            Value::Uuid([0xab; 16]),
            Value::Bytes(vec![0, 0xff, b'\'', b'\\']),
            Value::Numeric("-1234567890.12".into()),
            Value::Json(r#"{"a": [1, "x\"y"], "b": null}"#.into()),
            Value::Other {
                type_oid: SOURCE_MOOD_OID,
                text: "happy".into(),
            },
            Value::Other {
                type_oid: 1007,
                text: "{1,NULL,-3}".into(),
            },
            Value::Other {
                type_oid: 1186,
                text: "1 year 2 mons -3 days +04:05:06.789".into(),
            },
            Value::Time(86_400_000_000),
            Value::Bool(false),
            Value::Int2(i16::MIN),
        ]
    }

    /// The same row as SQL literals, for the `expected` table PostgreSQL parses itself.
    pub fn order_literal(id: i32, note: &str, qty: i64) -> String {
        format!(
            "({id}, '{}', {qty}, 0.1, '3.4028235e38', '2024-01-31 12:34:56.123456', \
             '0001-12-31 23:59:59.999999+00 BC', 'infinity', 'abababab-abab-abab-abab-abababababab', \
             '\\x00ff275c', -1234567890.12, '{{\"a\": [1, \"x\\\"y\"], \"b\": null}}', 'happy', \
             '{{1,NULL,-3}}', '1 year 2 mons -3 days +04:05:06.789', '24:00:00', false, -32768)",
            note.replace('\'', "''")
        )
    }

    /// A cluster with database `replica` and whatever `ddl` creates there.
    pub fn server(ddl: &str) -> Postgres {
        let pg = Postgres::start();
        pg.create_database(DB);
        if !ddl.is_empty() {
            pg.psql(DB, ddl);
        }
        pg
    }

    pub fn checkpoints(pg: &Postgres) -> String {
        pg.psql(
            DB,
            "SELECT pipeline, connector, lane, lanes, lsn, ordinal, sub FROM _zipline_checkpoints \
             ORDER BY pipeline, connector, lane",
        )
    }

    /// Whole rows of `table` as text, in UTC.
    pub fn rows(pg: &Postgres, table: &str) -> String {
        pg.psql(
            DB,
            &format!("SET TimeZone = 'UTC'; SELECT t::text FROM {table} t ORDER BY id"),
        )
    }

    pub async fn apply(lane: &mut Box<dyn LaneSink>, changes: Vec<Arc<Change>>) {
        lane.apply(&Batch {
            lane: 0,
            changes,
            ..Batch::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    }
}
