//! The sink side of an end-to-end fixture, as the pipeline contract suite
//! (`tests/pipelines/contract.rs`) sees it: one trait, [`SinkFixture`], implemented by the
//! PostgreSQL → MariaDB [`Fixture`] and the PostgreSQL → PostgreSQL [`PgFixture`].

use std::future::Future;
use std::ops::DerefMut;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;

use super::pg::{PgFixture, SINK_DB, pg_pipeline_yaml, zipline_backends};
use super::{
    Fixture, MY_DB, PG_DB, PipelineOpts, Workdir, Zipline, assert_absent_in_sink, diff_rows,
};
use crate::common::Postgres;

/// A source PostgreSQL (database `app`) and a sink, both holding `orders`, and the pipeline
/// between them.
///
/// Contract: [`SinkFixture::start`] creates `orders` on both sides, empty;
/// [`SinkFixture::wait_converged`] returns once the sink's `orders` equals the source's row
/// for row (and by checksum where the sink has one), with the row count, and fails after
/// `timeout` with the differences or at once when `z` exits; the fault methods act at once and
/// return when done.
pub trait SinkFixture: DerefMut<Target = Workdir> + Sized {
    /// A connection reading the sink back.
    type Checker;
    /// A session on the sink server that may end Zipline's sessions (and survives that).
    type Admin;

    fn start() -> Self;
    /// The pipeline file: the source `orders-db`, this sink, one route.
    fn pipeline_yaml(opts: &PipelineOpts) -> String;
    fn write(&self, opts: &PipelineOpts) {
        self.write_pipeline(&Self::pipeline_yaml(opts));
    }
    /// `zipline pipeline apply` with the fixture's environment.
    fn apply(&mut self) -> Zipline;
    fn source(&self) -> &Postgres;
    fn source_client(&self) -> impl Future<Output = tokio_postgres::Client> {
        self.source().client(PG_DB)
    }
    fn checker(&self) -> impl Future<Output = Self::Checker>;
    fn wait_converged(
        src: &tokio_postgres::Client,
        sink: &mut Self::Checker,
        z: Option<&mut Zipline>,
        timeout: Duration,
    ) -> impl Future<Output = usize>;
    /// Asserts no row of `ids` is in the sink's `orders`.
    fn assert_absent(sink: &mut Self::Checker, ids: &[i64]) -> impl Future<Output = ()>;

    /// Runs `sql` on the sink database (blocking, through the server's CLI client).
    fn sink_sql(&self, sql: &str);
    /// Asserts the sink's `orders` equals the source's now, without waiting.
    fn assert_equal_now(
        src: &tokio_postgres::Client,
        sink: &mut Self::Checker,
    ) -> impl Future<Output = ()>;
    /// Waits until the sink records the initial snapshot as complete; fails after `timeout`
    /// or at once if `z` exits.
    fn wait_snapshot_complete(
        sink: &mut Self::Checker,
        z: &mut Zipline,
        timeout: Duration,
    ) -> impl Future<Output = ()>;
    /// The sink's `orders_audit`, kept by triggers on its `orders` ([`SinkFixture::AUDIT`]):
    /// its rows as `(id, op, state)` in the order the sink made them, state `status/amount`
    /// (None for a delete); and clearing it.
    fn audit(sink: &mut Self::Checker) -> impl Future<Output = Vec<(i64, String, Option<String>)>>;
    fn clear_audit(sink: &mut Self::Checker) -> impl Future<Output = ()>;

    /// The sink server's own port, and pointing the pipeline at another (a proxy's).
    fn sink_server_port(&self) -> u16;
    fn set_pipeline_sink_port(&mut self, port: u16);
    fn admin(&self) -> impl Future<Output = Self::Admin>;
    /// Ends every session Zipline holds on the sink server; returns how many there were.
    fn kill_sink_sessions(admin: &mut Self::Admin) -> impl Future<Output = usize>;
    /// The DDL of `orders_audit` and its triggers on this sink.
    const AUDIT: &'static str;
    /// The seed trace's rows (`SEED` of `tests/pipelines/contract.rs`) as this sink stores them.
    const SEED: &'static str;
    /// SIGKILLs the sink server; [`SinkFixture::restart_sink`] brings it back on its port.
    fn crash_sink(&mut self);
    fn restart_sink(&mut self);
}

impl SinkFixture for Fixture {
    type Checker = mysql_async::Conn;
    type Admin = mysql_async::Conn;

    fn start() -> Self {
        Fixture::start()
    }

    fn pipeline_yaml(opts: &PipelineOpts) -> String {
        super::pipeline_yaml(opts)
    }

    fn apply(&mut self) -> Zipline {
        Fixture::apply(self)
    }

    fn source(&self) -> &Postgres {
        &self.pg
    }

    async fn checker(&self) -> mysql_async::Conn {
        self.my_checker().await
    }

    async fn wait_converged(
        src: &tokio_postgres::Client,
        sink: &mut mysql_async::Conn,
        z: Option<&mut Zipline>,
        timeout: Duration,
    ) -> usize {
        let summary = super::wait_converged(src, sink, z, timeout).await;
        usize::try_from(summary.count).expect("a row count")
    }

    async fn assert_absent(sink: &mut mysql_async::Conn, ids: &[i64]) {
        assert_absent_in_sink(sink, ids).await;
    }

    const AUDIT: &'static str = "
CREATE TABLE orders_audit (
    seq BIGINT AUTO_INCREMENT PRIMARY KEY,
    id BIGINT NOT NULL,
    op VARCHAR(6) NOT NULL,
    status VARCHAR(20),
    amount DECIMAL(12,2)
) ENGINE=InnoDB;
CREATE TRIGGER orders_audit_ins AFTER INSERT ON orders FOR EACH ROW
    INSERT INTO orders_audit (id, op, status, amount) VALUES (NEW.id, 'insert', NEW.status, NEW.amount);
CREATE TRIGGER orders_audit_upd AFTER UPDATE ON orders FOR EACH ROW
    INSERT INTO orders_audit (id, op, status, amount) VALUES (NEW.id, 'update', NEW.status, NEW.amount);
CREATE TRIGGER orders_audit_del AFTER DELETE ON orders FOR EACH ROW
    INSERT INTO orders_audit (id, op, status, amount) VALUES (OLD.id, 'delete', NULL, NULL);
";

    const SEED: &'static str = "INSERT INTO orders VALUES
    (1, 'Ada', 10.00, 'new', '2024-01-02 03:04:05.123456', 1, 'first'),
    (2, 'O''Brien', 0.01, 'paid', '1999-12-31 23:59:59.999999', 0, NULL),
    (3, NULL, NULL, NULL, NULL, NULL, NULL),
    (2210, 'Zoë', 99.99, 'seed', '2023-06-15 12:00:00', 1, 'to be deleted')";

    fn sink_sql(&self, sql: &str) {
        self.my.sql(MY_DB, sql);
    }

    async fn assert_equal_now(src: &tokio_postgres::Client, sink: &mut mysql_async::Conn) {
        super::assert_equal_now(src, sink).await;
    }

    async fn wait_snapshot_complete(
        sink: &mut mysql_async::Conn,
        z: &mut Zipline,
        timeout: Duration,
    ) {
        let started = Instant::now();
        loop {
            z.assert_running();
            let done: Option<bool> = sink
                .query_first(format!(
                    "SELECT done_at IS NOT NULL FROM {MY_DB}._zipline_snapshot \
                     WHERE source_table = '' AND chunk = -1"
                ))
                .await
                .ok()
                .flatten();
            if done == Some(true) {
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

    async fn audit(sink: &mut mysql_async::Conn) -> Vec<(i64, String, Option<String>)> {
        let rows: Vec<(i64, String, Option<String>, Option<String>)> = sink
            .query(format!(
                "SELECT id, op, CAST(status AS CHAR), CAST(amount AS CHAR) \
                 FROM {MY_DB}.orders_audit ORDER BY seq"
            ))
            .await
            .expect("reading the audit table");
        rows.into_iter()
            .map(|(id, op, status, amount)| {
                let state = (op != "delete").then(|| {
                    format!(
                        "{}/{}",
                        status.expect("audited status"),
                        amount.expect("audited amount")
                    )
                });
                (id, op, state)
            })
            .collect()
    }

    async fn clear_audit(sink: &mut mysql_async::Conn) {
        sink.query_drop(format!("DELETE FROM {MY_DB}.orders_audit"))
            .await
            .expect("clearing the audit");
    }

    fn sink_server_port(&self) -> u16 {
        self.my.port
    }

    fn set_pipeline_sink_port(&mut self, port: u16) {
        self.mysql_port = port;
    }

    async fn admin(&self) -> mysql_async::Conn {
        // No default database: killing every connection of `shop` (the sink's) spares it.
        self.my.conn("").await
    }

    async fn kill_sink_sessions(admin: &mut mysql_async::Conn) -> usize {
        let ids: Vec<u64> = admin
            .query(format!(
                "SELECT id FROM information_schema.PROCESSLIST WHERE db = '{MY_DB}' \
                 AND id <> CONNECTION_ID()"
            ))
            .await
            .expect("listing sink connections");
        for id in &ids {
            // The connection may be gone already (a lane reconnecting): "Unknown thread id".
            if let Err(e) = admin.query_drop(format!("KILL {id}")).await {
                eprintln!("e2e: KILL {id}: {e}");
            }
        }
        ids.len()
    }

    fn crash_sink(&mut self) {
        self.my.kill();
    }

    fn restart_sink(&mut self) {
        self.my.restart();
    }
}

impl SinkFixture for PgFixture {
    type Checker = tokio_postgres::Client;
    type Admin = tokio_postgres::Client;

    fn start() -> Self {
        PgFixture::start()
    }

    fn pipeline_yaml(opts: &PipelineOpts) -> String {
        pg_pipeline_yaml(opts)
    }

    fn apply(&mut self) -> Zipline {
        PgFixture::apply(self)
    }

    fn source(&self) -> &Postgres {
        &self.src
    }

    async fn checker(&self) -> tokio_postgres::Client {
        self.sink_client().await
    }

    async fn wait_converged(
        src: &tokio_postgres::Client,
        sink: &mut tokio_postgres::Client,
        z: Option<&mut Zipline>,
        timeout: Duration,
    ) -> usize {
        super::pg::wait_converged(src, sink, "orders", z, timeout).await
    }

    async fn assert_absent(sink: &mut tokio_postgres::Client, ids: &[i64]) {
        super::pg::assert_absent(sink, ids).await;
    }

    const AUDIT: &'static str = "
CREATE TABLE orders_audit (
    seq bigserial PRIMARY KEY, id bigint NOT NULL, op text NOT NULL, state text);
CREATE FUNCTION audit_orders() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO orders_audit (id, op) VALUES (OLD.id, 'delete');
    ELSE
        INSERT INTO orders_audit (id, op, state)
        VALUES (NEW.id, lower(TG_OP), NEW.status || '/' || NEW.amount);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER orders_audit AFTER INSERT OR UPDATE OR DELETE ON orders
    FOR EACH ROW EXECUTE FUNCTION audit_orders();";

    const SEED: &'static str = "INSERT INTO orders VALUES
    (1, 'Ada', 10.00, 'new', '2024-01-02 03:04:05.123456+00', true, 'first'),
    (2, 'O''Brien', 0.01, 'paid', '1999-12-31 23:59:59.999999+00', false, NULL),
    (3, NULL, NULL, NULL, NULL, NULL, NULL),
    (2210, 'Zoë', 99.99, 'seed', '2023-06-15 12:00:00+00', true, 'to be deleted')";

    fn sink_sql(&self, sql: &str) {
        self.sink.psql(SINK_DB, sql);
    }

    async fn assert_equal_now(src: &tokio_postgres::Client, sink: &mut tokio_postgres::Client) {
        let (a, b) = (
            super::pg::rows(src, "orders").await,
            super::pg::rows(sink, "orders").await,
        );
        if let Some(diff) = diff_rows(&a, &b) {
            panic!("sink differs from source:\n{diff}");
        }
    }

    async fn wait_snapshot_complete(
        sink: &mut tokio_postgres::Client,
        z: &mut Zipline,
        timeout: Duration,
    ) {
        super::pg::wait_snapshot_complete(sink, z, timeout).await;
    }

    async fn audit(sink: &mut tokio_postgres::Client) -> Vec<(i64, String, Option<String>)> {
        sink.query("SELECT id, op, state FROM orders_audit ORDER BY seq", &[])
            .await
            .expect("reading the audit table")
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }

    async fn clear_audit(sink: &mut tokio_postgres::Client) {
        sink.batch_execute("DELETE FROM orders_audit")
            .await
            .expect("clearing the audit");
    }

    fn sink_server_port(&self) -> u16 {
        self.sink.port
    }

    fn set_pipeline_sink_port(&mut self, port: u16) {
        self.sink_port = port;
    }

    async fn admin(&self) -> tokio_postgres::Client {
        self.sink.client("postgres").await
    }

    async fn kill_sink_sessions(admin: &mut tokio_postgres::Client) -> usize {
        let pids = zipline_backends(admin).await;
        for pid in &pids {
            // The lane may be reconnecting already: terminating a gone pid returns false.
            admin
                .execute("SELECT pg_terminate_backend($1)", &[pid])
                .await
                .expect("pg_terminate_backend");
        }
        pids.len()
    }

    fn crash_sink(&mut self) {
        self.sink.kill();
    }

    fn restart_sink(&mut self) {
        self.sink.restart();
    }
}
