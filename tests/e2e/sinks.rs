//! The sink side of an end-to-end fixture, as the pipeline contract suite
//! (`tests/pipelines/contract.rs`) sees it: one trait, [`SinkFixture`], implemented by the
//! PostgreSQL → MariaDB [`Fixture`] and the PostgreSQL → PostgreSQL [`PgFixture`].

use std::future::Future;
use std::ops::DerefMut;
use std::time::Duration;

use mysql_async::prelude::Queryable;

use super::pg::{PgFixture, pg_pipeline_yaml, zipline_backends};
use super::{Fixture, MY_DB, PG_DB, PipelineOpts, Workdir, Zipline, assert_absent_in_sink};
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

    /// The sink server's own port, and pointing the pipeline at another (a proxy's).
    fn sink_server_port(&self) -> u16;
    fn set_pipeline_sink_port(&mut self, port: u16);
    fn admin(&self) -> impl Future<Output = Self::Admin>;
    /// Ends every session Zipline holds on the sink server; returns how many there were.
    fn kill_sink_sessions(admin: &mut Self::Admin) -> impl Future<Output = usize>;
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
