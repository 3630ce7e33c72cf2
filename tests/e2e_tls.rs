//! TLS against real servers, with a CA and certificates made by the test (rcgen):
//!
//! - PostgreSQL → PostgreSQL where both clusters accept TLS only (`hostssl` lines in
//!   `pg_hba.conf`, plaintext refused): the source with `verify-full`, the sink with
//!   `verify-ca` against a certificate for another name and client-certificate authentication
//!   (`cert`); the seed rows and a random workload converge, and the servers' `pg_stat_ssl`
//!   shows every Zipline connection encrypted (the sink's with the client certificate).
//! - PostgreSQL → MariaDB with `require_secure_transport=ON`, the source on a server without
//!   TLS under `sslmode: prefer` (it still connects): `VERIFY_IDENTITY` against a certificate
//!   for another name fails naming the sink, the host and the mismatch; `VERIFY_CA` converges.
//! - The seed's trace (`e2e::trace`, audited by triggers on the sink) over both of those
//!   TLS set-ups, into PostgreSQL and into MariaDB.
//! - Failures name connector, host and reason: `verify-full` against a certificate for another
//!   name, a CA that did not sign the server's certificate, `require` against a server without
//!   TLS.

pub mod common;
pub mod e2e;

use std::path::Path;
use std::time::Duration;

use common::certs::{CertFiles, TestCa};
use common::{MariaDb, Postgres};
use e2e::pg::{PgFixture, SINK_DB, pg_pipeline_yaml};
use e2e::{
    CONVERGE_TIMEOUT, Fixture, MY_DB, MY_ORDERS, PG_DB, PG_ORDERS, PipelineOpts, Workdir,
    pipeline_yaml, wait_streaming, workload,
};
use mysql_async::prelude::Queryable;

const FAIL_TIMEOUT: Duration = Duration::from_secs(60);

/// A directory the `postgres` OS user can read, for certificates and `pg_hba.conf`.
fn cert_dir() -> tempfile::TempDir {
    common::test_dir()
}

/// A cluster that accepts TCP connections over TLS only, authenticating them by `method`
/// (`trust` or `cert`); the Unix socket stays open (`trust`) for the test's own checks.
fn tls_postgres(ca: &TestCa, server: &CertFiles, method: &str, stem: &str) -> Postgres {
    let hba = ca.dir.join(format!("{stem}-hba.conf"));
    std::fs::write(
        &hba,
        format!(
            "local all all trust\nlocal replication all trust\n\
             hostssl all all 127.0.0.1/32 {method}\nhostssl replication all 127.0.0.1/32 {method}\n"
        ),
    )
    .expect("writing pg_hba.conf");
    let path = |p: &Path| p.display().to_string();
    let (cert, key, ca_file, hba) = (
        path(&server.cert),
        path(&server.key),
        path(&ca.ca_file()),
        path(&hba),
    );
    Postgres::start_with(&[
        ("ssl", "on"),
        ("ssl_cert_file", &cert),
        ("ssl_key_file", &key),
        ("ssl_ca_file", &ca_file),
        ("hba_file", &hba),
    ])
}

/// Asserts a plaintext TCP connection to `pg` is refused by `pg_hba.conf`.
async fn assert_plaintext_refused(pg: &Postgres) {
    let conn = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=10 sslmode=disable",
        pg.port
    );
    let err = tokio_postgres::connect(&conn, tokio_postgres::NoTls)
        .await
        .err()
        .unwrap_or_else(|| panic!("plaintext connection to :{} was accepted", pg.port));
    let text = err
        .as_db_error()
        .map(|d| d.message().to_owned())
        .unwrap_or_default();
    assert!(
        text.contains("no pg_hba.conf entry") && text.contains("no encryption"),
        "unexpected refusal: {err:?}"
    );
}

fn yaml_lines(lines: &[(&str, &Path)]) -> Vec<String> {
    lines
        .iter()
        .map(|(k, v)| format!("{k}: \"{}\"", v.display()))
        .collect()
}

/// PostgreSQL → PostgreSQL between two TLS-only servers: the source verified in full, the
/// sink by its CA only (its certificate names another host) with a client certificate
/// (`pg_hba.conf` method `cert`); `orders` on both sides, empty. The pipeline options carry
/// the TLS settings; the directory holds the certificates.
async fn pg_to_pg_over_tls() -> (PgFixture, PipelineOpts, tempfile::TempDir) {
    let dir = cert_dir();
    let ca = TestCa::new(dir.path(), "zipline-test");
    let src_cert = ca.server("source", &["localhost", "127.0.0.1"]);
    let sink_cert = ca.server("sink", &["sink.example"]);
    let client = ca.client("client", "postgres");
    let src = tls_postgres(&ca, &src_cert, "trust", "source");
    let sink = tls_postgres(&ca, &sink_cert, "cert", "sink");
    assert_plaintext_refused(&src).await;
    assert_plaintext_refused(&sink).await;
    src.create_database(PG_DB);
    sink.create_database(SINK_DB);
    src.psql(PG_DB, PG_ORDERS);
    sink.psql(SINK_DB, PG_ORDERS);
    let sink_port = sink.port;
    let fx = PgFixture {
        src,
        sink,
        work: Workdir::new(),
        sink_port,
    };
    let mut source_extra = vec!["sslmode: verify-full".to_owned()];
    source_extra.extend(yaml_lines(&[("sslrootcert", &ca.ca_file())]));
    let mut sink_extra = vec!["sslmode: verify-ca".to_owned(), "max_wait: 20ms".to_owned()];
    sink_extra.extend(yaml_lines(&[
        ("sslrootcert", &ca.ca_file()),
        ("sslcert", &client.cert),
        ("sslkey", &client.key),
    ]));
    let opts = PipelineOpts {
        source_extra,
        sink_extra,
        ..PipelineOpts::default()
    };
    (fx, opts, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_to_pg_over_tls_only_servers_with_client_certificates() {
    let (mut fx, opts, _certs) = pg_to_pg_over_tls().await;
    fx.src.psql(
        PG_DB,
        "INSERT INTO orders SELECT g, 'seed ' || g, g, 'new', now(), true, NULL \
         FROM generate_series(1, 500) g",
    );
    fx.write_pipeline(&pg_pipeline_yaml(&opts));
    let src_client = fx.src.local_client(PG_DB).await;
    let sink_client = fx.sink.local_client(SINK_DB).await;
    let mut z = fx.apply();
    wait_streaming(&src_client, &mut z, Duration::from_secs(60)).await;
    let load = workload::start(
        fx.src.local_conn_str(PG_DB),
        workload::Config::new(workload::seed(), 3_000),
    );
    let report = load.join().await;
    assert!(report.changes >= 3_000, "the workload wrote {report:?}");
    let rows = e2e::pg::wait_converged(
        &src_client,
        &sink_client,
        "orders",
        Some(&mut z),
        CONVERGE_TIMEOUT,
    )
    .await;
    assert!(rows > 0);

    // Every connection Zipline holds is encrypted; the sink's carry the client certificate.
    let ssl = "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl), \
               count(*) FILTER (WHERE s.client_dn = '/CN=postgres') \
               FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
               WHERE a.application_name = 'zipline'";
    let src_ssl = src_client.query_one(ssl, &[]).await.expect("pg_stat_ssl");
    let (on, off): (i64, i64) = (src_ssl.get(0), src_ssl.get(1));
    assert!(on >= 1 && off == 0, "source: {on} TLS and {off} plaintext");
    let sink_ssl = sink_client.query_one(ssl, &[]).await.expect("pg_stat_ssl");
    let (on, off, with_cert): (i64, i64, i64) = (sink_ssl.get(0), sink_ssl.get(1), sink_ssl.get(2));
    assert!(
        on >= 1 && off == 0 && with_cert == on,
        "sink: {on} TLS ({with_cert} with the client certificate) and {off} plaintext"
    );
    let walsender: i64 = src_client
        .query_one(
            "SELECT count(*) FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid) \
             WHERE s.ssl",
            &[],
        )
        .await
        .expect("pg_stat_replication")
        .get(0);
    assert_eq!(walsender, 1, "the replication connection is encrypted");
    z.terminate_cleanly(Duration::from_secs(30));
}

/// PostgreSQL (no TLS: `prefer` falls back to plaintext) → MariaDB with
/// `require_secure_transport=ON` and a certificate for `mariadb.example`; `orders` on both
/// sides, empty. `opts(ssl_mode)` gives the pipeline options.
async fn pg_to_mariadb_over_tls() -> (Fixture, impl Fn(&str) -> PipelineOpts, tempfile::TempDir) {
    let dir = cert_dir();
    let ca = TestCa::new(dir.path(), "zipline-test");
    let server = ca.server("mariadb", &["mariadb.example"]);
    let path = |p: &Path| p.display().to_string();
    let my = MariaDb::start_with(&[
        format!("--ssl-cert={}", path(&server.cert)),
        format!("--ssl-key={}", path(&server.key)),
        format!("--ssl-ca={}", path(&ca.ca_file())),
        "--require-secure-transport=ON".to_owned(),
    ]);
    let plain = mysql_async::OptsBuilder::default()
        .ip_or_hostname("127.0.0.1")
        .tcp_port(my.port)
        .user(Some("root"))
        .prefer_socket(false);
    let refused = mysql_async::Conn::new(plain).await;
    assert!(refused.is_err(), "MariaDB accepted a plaintext connection");
    let pg = Postgres::start();
    pg.create_database(PG_DB);
    my.create_database(MY_DB);
    pg.psql(PG_DB, PG_ORDERS);
    my.sql(MY_DB, MY_ORDERS);
    let mysql_port = my.port;
    let fx = Fixture {
        pg,
        my,
        work: Workdir::new(),
        mysql_port,
    };
    let ca_file = ca.ca_file();
    let opts = move |mode: &str| {
        let mut sink_extra = vec![format!("ssl_mode: {mode}"), "max_wait: 20ms".to_owned()];
        sink_extra.extend(yaml_lines(&[("ssl_ca", &ca_file)]));
        PipelineOpts {
            source_extra: vec![
                "sslmode: prefer".to_owned(),
                "connect_retries: 0".to_owned(),
            ],
            sink_extra,
            ..PipelineOpts::default()
        }
    };
    (fx, opts, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_to_mariadb_with_require_secure_transport() {
    let (mut fx, opts, _certs) = pg_to_mariadb_over_tls().await;

    // The certificate names mariadb.example, not 127.0.0.1.
    fx.write_pipeline(&pipeline_yaml(&opts("VERIFY_IDENTITY")));
    let mut z = fx.apply();
    let out = z.expect_failure(FAIL_TIMEOUT, "host name mismatch");
    assert!(
        out.contains("mysql-out") && out.contains("127.0.0.1") && out.contains("VERIFY_IDENTITY"),
        "the error names the sink, the host and the mode:\n{out}"
    );

    fx.write_pipeline(&pipeline_yaml(&opts("VERIFY_CA")));
    let pg_client = fx.pg_client().await;
    let mut my_client = fx.my.socket_conn("").await;
    my_client
        .query_drop("SET SESSION group_concat_max_len = 1073741824")
        .await
        .expect("raising group_concat_max_len");
    let mut z = fx.apply();
    wait_streaming(&pg_client, &mut z, Duration::from_secs(60)).await;
    let load = workload::start(
        fx.pg.conn_str(PG_DB),
        workload::Config::new(workload::seed(), 3_000),
    );
    load.join().await;
    e2e::wait_converged(&pg_client, &mut my_client, Some(&mut z), CONVERGE_TIMEOUT).await;
    let encrypted: Vec<(String, String)> = my_client
        .query(
            "SELECT variable_name, variable_value FROM information_schema.global_status \
             WHERE variable_name = 'Ssl_accepts'",
        )
        .await
        .expect("reading Ssl_accepts");
    let accepts: u64 = encrypted
        .first()
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_default();
    assert!(
        accepts >= 1,
        "MariaDB accepted no TLS connection: {encrypted:?}"
    );
    z.terminate_cleanly(Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_failures_name_the_connector_the_host_and_the_reason() {
    let dir = cert_dir();
    let ca = TestCa::new(dir.path(), "zipline-test");
    let other_ca = TestCa::new(&dir.path().join("other"), "other");
    let server = ca.server("server", &["db.other.example"]);
    let pg = tls_postgres(&ca, &server, "trust", "server");
    pg.create_database(PG_DB);
    pg.psql(PG_DB, PG_ORDERS);
    // Without TLS; also the sink of every run (Zipline claims its sinks before the source).
    let plain = Postgres::start();
    plain.create_database(PG_DB);
    plain.psql(PG_DB, PG_ORDERS);
    plain.create_database(SINK_DB);
    plain.psql(SINK_DB, PG_ORDERS);
    let sink_port = plain.port;
    let mut work = Workdir::new();
    let run = |work: &mut Workdir, port: u16, source_extra: Vec<String>, needle: &str| {
        work.write_pipeline(&pg_pipeline_yaml(&PipelineOpts {
            source_extra,
            ..PipelineOpts::default()
        }));
        let env: Vec<(String, String)> = [
            ("POSTGRES_HOST", "127.0.0.1".to_owned()),
            ("POSTGRES_PORT", port.to_string()),
            ("POSTGRES_DATABASE", PG_DB.to_owned()),
            ("POSTGRES_USER", "postgres".to_owned()),
            ("POSTGRES_PUBLICATION", e2e::PUBLICATION.to_owned()),
            ("POSTGRES_SLOT_NAME", e2e::SLOT.to_owned()),
            ("SINK_PORT", sink_port.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let args = work.args("apply");
        let mut z = work.spawn(&args, &env);
        let out = z.expect_failure(FAIL_TIMEOUT, needle);
        assert!(
            out.contains("orders-db") && out.contains(&format!("127.0.0.1:{port}")),
            "the error names the connector and the host:\n{out}"
        );
        out
    };
    let ca_file = |ca: &TestCa| yaml_lines(&[("sslrootcert", &ca.ca_file())]);

    let mut full = vec!["sslmode: verify-full".to_owned()];
    full.extend(ca_file(&ca));
    let out = run(&mut work, pg.port, full, "host name mismatch");
    assert!(out.contains("db.other.example"), "{out}");

    let mut wrong_ca = vec!["sslmode: verify-ca".to_owned()];
    wrong_ca.extend(ca_file(&other_ca));
    run(&mut work, pg.port, wrong_ca, "unknown CA");

    let require = vec![
        "sslmode: require".to_owned(),
        "connect_retries: 0".to_owned(),
    ];
    run(
        &mut work,
        plain.port,
        require,
        "the server does not support TLS, and sslmode require requires it",
    );
    let slots = pg.psql(PG_DB, "SELECT count(*) FROM pg_replication_slots");
    assert_eq!(slots, "0", "a refused TLS setup leaves no slot behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_trace_over_tls_into_postgres() {
    let (fx, opts, _certs) = pg_to_pg_over_tls().await;
    e2e::trace::seed_trace(fx, &opts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_trace_over_tls_into_mariadb() {
    let (fx, opts, _certs) = pg_to_mariadb_over_tls().await;
    e2e::trace::seed_trace(fx, &opts("VERIFY_CA")).await;
}
