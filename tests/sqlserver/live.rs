//! Live tests of the SQL Server source, through the `zipline` binary into MariaDB: the same
//! scenarios as the PostgreSQL source's end-to-end suite (a seed trace after an initial
//! snapshot, a randomized workload across restarts — SIGKILL and SIGTERM — and a retention
//! gap that must stop the pipeline).
//!
//! They need a real SQL Server with SQL Server Agent running (the CDC capture job is an Agent
//! job) and a login that may create databases and enable CDC (sysadmin), given as
//!
//! ```text
//! ZIPLINE_MSSQL_URL='sqlserver://sa:Secret-Passw0rd@127.0.0.1:1433?trust_server_certificate=true'
//! ```
//!
//! (optional `encrypt=false`; the password may contain anything but `@`). Each test creates
//! its own database `zipline_live_<pid>_<n>` and drops it at the end. No SQL Server can be
//! installed on the CI machines of this project, so there these tests print why they were
//! skipped and return: they pass without running. See README.md, "SQL Server".

use crate::{common, e2e};

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use tiberius::{AuthMethod, Client, Config, EncryptionLevel};
use tokio::net::TcpStream;
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

use common::MariaDb;
use e2e::Zipline;

const URL_VAR: &str = "ZIPLINE_MSSQL_URL";
const MY_DB: &str = "shop";
const CONVERGE: Duration = Duration::from_secs(180);

type Mssql = Client<Compat<TcpStream>>;

/// Connection settings from `ZIPLINE_MSSQL_URL`.
#[derive(Clone)]
struct Server {
    host: String,
    port: u16,
    user: String,
    password: String,
    encrypt: bool,
    trust: bool,
}

/// The server to test against, or `None` (after saying so) when the variable is unset.
fn server(test: &str) -> Option<Server> {
    let Ok(url) = std::env::var(URL_VAR) else {
        eprintln!(
            "{test}: skipped: {URL_VAR} is not set, so there is no SQL Server to test against \
             (none can be installed on this project's machines); see README.md, \"SQL Server\""
        );
        return None;
    };
    let rest = url
        .strip_prefix("sqlserver://")
        .unwrap_or_else(|| panic!("{URL_VAR} must start with sqlserver://"));
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (creds, addr) = rest
        .rsplit_once('@')
        .unwrap_or_else(|| panic!("{URL_VAR}: expected user:password@host:port"));
    let (user, password) = creds.split_once(':').unwrap_or((creds, ""));
    let addr = addr.trim_end_matches('/');
    let (host, port) = addr.rsplit_once(':').unwrap_or((addr, "1433"));
    let flag = |name: &str, default: bool| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .map_or(default, |v| v == "true")
    };
    Some(Server {
        host: host.to_owned(),
        port: port.parse().expect("port in ZIPLINE_MSSQL_URL"),
        user: user.to_owned(),
        password: password.to_owned(),
        encrypt: flag("encrypt", true),
        trust: flag("trust_server_certificate", false),
    })
}

impl Server {
    async fn connect(&self, database: &str) -> Mssql {
        let mut config = Config::new();
        config.host(&self.host);
        config.port(self.port);
        config.database(database);
        config.authentication(AuthMethod::sql_server(&self.user, &self.password));
        if self.encrypt {
            config.encryption(EncryptionLevel::Required);
            if self.trust {
                config.trust_cert();
            }
        } else {
            config.encryption(EncryptionLevel::NotSupported);
        }
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .expect("connecting to SQL Server");
        tcp.set_nodelay(true).unwrap();
        Client::connect(config, tcp.compat_write())
            .await
            .expect("logging in to SQL Server")
    }
}

async fn exec(conn: &mut Mssql, sql: &str) {
    conn.simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_results()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn rows_text(conn: &mut Mssql, sql: &str) -> Vec<Vec<Option<String>>> {
    let rows = conn
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_first_result()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.iter()
        .map(|r| {
            (0..r.len())
                .map(|i| r.get::<&str, _>(i).map(str::to_owned))
                .collect()
        })
        .collect()
}

const SOURCE_TABLES: &str = "
CREATE TABLE dbo.orders (
    id bigint NOT NULL PRIMARY KEY,
    customer nvarchar(100) NULL,
    amount decimal(12,2) NULL,
    status varchar(20) NULL,
    created_at datetime2(6) NULL,
    flag bit NULL,
    note nvarchar(max) NULL
);
CREATE TABLE dbo.items (
    sku nvarchar(40) NOT NULL PRIMARY KEY,
    qty int NULL,
    price money NULL,
    updated datetimeoffset(3) NULL,
    guid uniqueidentifier NULL
);";

const SINK_TABLES: &str = "
CREATE TABLE orders (id BIGINT PRIMARY KEY, customer VARCHAR(100), amount DECIMAL(12,2),
    status VARCHAR(20), created_at DATETIME(6), flag TINYINT(1), note LONGTEXT) ENGINE=InnoDB;
CREATE TABLE items (sku VARCHAR(40) PRIMARY KEY, qty INT, price DECIMAL(19,4),
    updated DATETIME(6), guid CHAR(36)) ENGINE=InnoDB";

/// Every column rendered to text the same way on both sides, keyed by primary key.
const MSSQL_ORDERS: &str = "SELECT CAST(id AS varchar(30)), customer, CAST(amount AS varchar(30)), \
     status, CONVERT(varchar(26), created_at, 121), CAST(CAST(flag AS int) AS varchar(1)), note \
     FROM dbo.orders";
const MY_ORDERS: &str = "SELECT CAST(id AS CHAR), customer, CAST(amount AS CHAR), status, \
     DATE_FORMAT(created_at, '%Y-%m-%d %H:%i:%s.%f'), CAST(flag AS CHAR), note FROM shop.orders";
const MSSQL_ITEMS: &str = "SELECT sku, CAST(qty AS varchar(30)), CAST(CAST(price AS decimal(19,4)) AS varchar(30)), \
     CONVERT(varchar(26), CAST(SWITCHOFFSET(updated, '+00:00') AS datetime2(6)), 121), \
     LOWER(CAST(guid AS varchar(36))) FROM dbo.items";
const MY_ITEMS: &str = "SELECT sku, CAST(qty AS CHAR), CAST(price AS CHAR), \
     DATE_FORMAT(updated, '%Y-%m-%d %H:%i:%s.%f'), LOWER(guid) FROM shop.items";

type Rows = BTreeMap<String, Vec<Option<String>>>;

fn keyed(rows: Vec<Vec<Option<String>>>) -> Rows {
    rows.into_iter()
        .map(|r| (r[0].clone().unwrap_or_default(), r))
        .collect()
}

/// One test's world: a fresh CDC-enabled database, a MariaDB sink, a pipeline file.
struct Live {
    server: Server,
    database: String,
    src: Mssql,
    my: MariaDb,
    dir: tempfile::TempDir,
    spawned: u32,
}

impl Live {
    async fn start(server: Server, name: &str) -> Live {
        let database = format!("zipline_live_{}_{name}", std::process::id());
        let mut master = server.connect("master").await;
        exec(
            &mut master,
            &format!(
                "IF DB_ID(N'{database}') IS NOT NULL BEGIN ALTER DATABASE [{database}] SET SINGLE_USER \
                 WITH ROLLBACK IMMEDIATE; DROP DATABASE [{database}]; END; CREATE DATABASE [{database}]; \
                 ALTER DATABASE [{database}] SET ALLOW_SNAPSHOT_ISOLATION ON"
            ),
        )
        .await;
        let mut src = server.connect(&database).await;
        exec(&mut src, "EXEC sys.sp_cdc_enable_db").await;
        exec(&mut src, SOURCE_TABLES).await;
        for table in ["orders", "items"] {
            exec(
                &mut src,
                &format!(
                    "EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'{table}', \
                     @role_name = NULL"
                ),
            )
            .await;
        }
        let my = MariaDb::start();
        my.create_database(MY_DB);
        my.sql(MY_DB, SINK_TABLES);
        Live {
            server,
            database,
            src,
            my,
            dir: tempfile::tempdir().unwrap(),
            spawned: 0,
        }
    }

    fn pipeline(&self, snapshot: &str) -> std::path::PathBuf {
        let path = self.dir.path().join("live.yaml");
        let yaml = format!(
            r#"name: live
connectors:
  - name: mssql
    type: source/sqlserver
    host: "${{MSSQL_HOST}}"
    port: "${{MSSQL_PORT}}"
    database: "${{MSSQL_DATABASE}}"
    user: "${{MSSQL_USER}}"
    secret_refs: [{{ field: password, ref: mssql-pw }}]
    tables: [dbo.orders, dbo.items]
    poll_interval: 200ms
    encrypt: {encrypt}
    trust_server_certificate: {trust}
    snapshot: {snapshot}
  - name: mysql-out
    type: sink/mysql
    host: 127.0.0.1
    port: "${{MYSQL_PORT}}"
    database: {MY_DB}
    user: root
    lanes: 4
    max_wait: 20ms
routes:
  - from: mssql
    to: [mysql-out]
"#,
            encrypt = self.server.encrypt,
            trust = self.server.trust,
        );
        std::fs::write(&path, yaml).unwrap();
        path
    }

    fn run(&mut self, snapshot: &str) -> Zipline {
        let file = self.pipeline(snapshot);
        self.spawned += 1;
        let env: Vec<(String, String)> = [
            ("MSSQL_HOST", self.server.host.clone()),
            ("MSSQL_PORT", self.server.port.to_string()),
            ("MSSQL_DATABASE", self.database.clone()),
            ("MSSQL_USER", self.server.user.clone()),
            ("ZIPLINE_SECRET_MSSQL_PW", self.server.password.clone()),
            ("MYSQL_PORT", self.my.port.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let args = ["pipeline", "apply", "-f"]
            .iter()
            .map(|s| (*s).to_owned())
            .chain([file.display().to_string()])
            .collect::<Vec<_>>();
        let log = self
            .dir
            .path()
            .join(format!("zipline-{}.log", self.spawned));
        Zipline::spawn(&args, &env, log)
    }

    async fn source_rows(&mut self) -> (Rows, Rows) {
        (
            keyed(rows_text(&mut self.src, MSSQL_ORDERS).await),
            keyed(rows_text(&mut self.src, MSSQL_ITEMS).await),
        )
    }

    async fn sink_rows(&self) -> (Rows, Rows) {
        let mut my = self.my.conn("").await;
        let mut read = async |sql: &str| -> Rows {
            let rows: Vec<mysql_async::Row> = my.query(sql).await.unwrap();
            keyed(
                rows.into_iter()
                    .map(|r| {
                        (0..r.len())
                            .map(|i| {
                                r.get_opt::<Option<String>, _>(i)
                                    .and_then(Result::ok)
                                    .flatten()
                            })
                            .collect()
                    })
                    .collect(),
            )
        };
        (read(MY_ORDERS).await, read(MY_ITEMS).await)
    }

    /// Polls until the sink equals the source, or fails with the first difference.
    async fn wait_converged(&mut self, z: Option<&mut Zipline>) {
        let started = Instant::now();
        let mut z = z;
        loop {
            if let Some(z) = z.as_deref_mut() {
                z.assert_running();
            }
            let source = self.source_rows().await;
            let sink = self.sink_rows().await;
            if source == sink {
                eprintln!(
                    "live: converged in {:.1?}: {} orders, {} items",
                    started.elapsed(),
                    source.0.len(),
                    source.1.len()
                );
                return;
            }
            if started.elapsed() > CONVERGE {
                let first = |a: &Rows, b: &Rows| {
                    a.iter()
                        .find(|(k, v)| b.get(*k) != Some(v))
                        .map(|(k, v)| format!("source {k}: {v:?} / sink: {:?}", b.get(k)))
                        .or_else(|| {
                            b.keys()
                                .find(|k| !a.contains_key(*k))
                                .map(|k| format!("only in sink: {k}"))
                        })
                };
                panic!(
                    "no convergence within {CONVERGE:?}: orders {:?}, items {:?}",
                    first(&source.0, &sink.0),
                    first(&source.1, &sink.1)
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    async fn finish(self) {
        let Live {
            server,
            database,
            src,
            ..
        } = self;
        drop(src);
        let mut master = server.connect("master").await;
        exec(
            &mut master,
            &format!(
                "ALTER DATABASE [{database}] SET SINGLE_USER WITH ROLLBACK IMMEDIATE; \
                 DROP DATABASE [{database}]"
            ),
        )
        .await;
    }
}

fn insert_order(id: i64, note: &str) -> String {
    format!(
        "INSERT INTO dbo.orders VALUES ({id}, N'customer {id}', {id}.25, 'new', \
         '2024-02-29 12:34:56.123456', {}, N'{note}')",
        id % 2
    )
}

#[tokio::test]
async fn live_snapshot_then_seed_trace() {
    let Some(server) = server("live_snapshot_then_seed_trace") else {
        return;
    };
    let mut live = Live::start(server, "seed").await;
    for id in 1..=50 {
        exec(&mut live.src, &insert_order(id, "before the snapshot")).await;
    }
    exec(
        &mut live.src,
        "INSERT INTO dbo.items VALUES (N'sku-1', 3, 9.99, '2024-01-01 10:00:00.123 +02:00', NEWID())",
    )
    .await;
    let mut z = live.run("initial");
    live.wait_converged(Some(&mut z)).await;

    // The seed trace: every operation kind, both tables in one transaction, a key change, a
    // key change that leaves the nvarchar(max) column untouched, NULLs, and a row inserted,
    // updated and deleted inside one transaction.
    let trace = [
        insert_order(100, "fresh"),
        "BEGIN TRANSACTION; UPDATE dbo.orders SET status = 'paid', amount = 1.5 WHERE id = 1; \
         UPDATE dbo.items SET qty = qty - 1, price = 10.0001 WHERE sku = N'sku-1'; \
         INSERT INTO dbo.items VALUES (N'sku-2', NULL, NULL, NULL, NULL); COMMIT"
            .to_owned(),
        "UPDATE dbo.orders SET id = 1002 WHERE id = 2".to_owned(),
        "UPDATE dbo.orders SET id = 1003, status = 'moved' WHERE id = 3".to_owned(),
        "UPDATE dbo.orders SET note = NULL, customer = NULL, flag = NULL WHERE id = 4".to_owned(),
        "DELETE FROM dbo.orders WHERE id BETWEEN 10 AND 19".to_owned(),
        format!(
            "BEGIN TRANSACTION; {}; UPDATE dbo.orders SET note = N'changed' WHERE id = 200; \
             DELETE FROM dbo.orders WHERE id = 200; COMMIT",
            insert_order(200, "short-lived")
        ),
        "UPDATE dbo.orders SET id = id + 10000 WHERE id BETWEEN 20 AND 25".to_owned(),
    ];
    for sql in &trace {
        exec(&mut live.src, sql).await;
    }
    live.wait_converged(Some(&mut z)).await;
    z.terminate_cleanly(Duration::from_secs(60));
    live.finish().await;
}

#[tokio::test]
async fn live_random_workload_across_restarts() {
    let Some(server) = server("live_random_workload_across_restarts") else {
        return;
    };
    let mut live = Live::start(server.clone(), "random").await;
    let mut z = live.run("initial");
    let database = live.database.clone();
    let writer = tokio::spawn(async move {
        let mut conn = server.connect(&database).await;
        let mut next_id = 1i64;
        for round in 0..300 {
            let mut sql = String::from("BEGIN TRANSACTION;");
            for _ in 0..rand::random_range(1..6) {
                let id = rand::random_range(1..next_id.max(2));
                match rand::random_range(0..10) {
                    0..=4 => {
                        sql.push_str(&insert_order(next_id, &"x".repeat(rand::random_range(0..300))));
                        next_id += 1;
                    }
                    5..=6 => sql.push_str(&format!(
                        "UPDATE dbo.orders SET amount = amount + 1, status = 'r{round}' WHERE id = {id}"
                    )),
                    7 => sql.push_str(&format!("DELETE FROM dbo.orders WHERE id = {id}")),
                    8 => sql.push_str(&format!(
                        "IF NOT EXISTS (SELECT 1 FROM dbo.orders WHERE id = {id} + 500000) \
                         UPDATE dbo.orders SET id = id + 500000 WHERE id = {id}"
                    )),
                    _ => sql.push_str(&format!(
                        "MERGE dbo.items AS t USING (SELECT N'sku-{}' AS sku) AS s ON t.sku = s.sku \
                         WHEN MATCHED THEN UPDATE SET qty = ISNULL(qty, 0) + 1 \
                         WHEN NOT MATCHED THEN INSERT (sku, qty, price, updated, guid) \
                         VALUES (s.sku, 1, 1.5, SYSDATETIMEOFFSET(), NEWID());",
                        id % 20
                    )),
                }
                sql.push(';');
            }
            sql.push_str("COMMIT");
            exec(&mut conn, &sql).await;
            if round % 25 == 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    // Restarts while the workload runs: two crashes and one clean stop.
    for (i, kill) in [true, false, true].into_iter().enumerate() {
        tokio::time::sleep(Duration::from_secs(3 + i as u64)).await;
        if kill {
            z.kill();
        } else {
            z.terminate_cleanly(Duration::from_secs(60));
        }
        z = live.run("initial");
    }
    writer.await.unwrap();
    live.wait_converged(Some(&mut z)).await;
    z.terminate_cleanly(Duration::from_secs(60));
    // A clean stop recorded the frontier: a restart takes no new snapshot.
    let mut z = live.run("initial");
    live.wait_converged(Some(&mut z)).await;
    let log = z.output();
    assert!(
        !log.contains("initial snapshot started"),
        "a restart with a durable frontier must not snapshot again:\n{log}"
    );
    z.terminate_cleanly(Duration::from_secs(60));
    live.finish().await;
}

#[tokio::test]
async fn live_retention_gap_stops_the_pipeline() {
    let Some(server) = server("live_retention_gap_stops_the_pipeline") else {
        return;
    };
    let mut live = Live::start(server, "retention").await;
    let mut z = live.run("never");
    exec(&mut live.src, &insert_order(1, "seen")).await;
    live.wait_converged(Some(&mut z)).await;
    z.terminate_cleanly(Duration::from_secs(60));

    // While Zipline is down: changes, then a cleanup past them (as the retention job would).
    for id in 2..=5 {
        exec(&mut live.src, &insert_order(id, "lost")).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let captured = rows_text(
            &mut live.src,
            "SELECT CAST(COUNT(*) AS varchar(10)) FROM cdc.dbo_orders_CT WHERE id = 5",
        )
        .await;
        if captured[0][0].as_deref() != Some("0") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the capture job did not capture id 5"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    exec(
        &mut live.src,
        "DECLARE @lw binary(10) = sys.fn_cdc_get_max_lsn(); \
         EXEC sys.sp_cdc_cleanup_change_table @capture_instance = N'dbo_orders', \
         @low_water_mark = @lw, @threshold = 5000",
    )
    .await;
    let mut z = live.run("never");
    let status = z
        .wait_exit(Duration::from_secs(120))
        .expect("zipline stops on its own");
    assert!(!status.success(), "a gap must fail the pipeline");
    let log = z.output();
    assert!(
        log.contains("no longer reaches back to LSN") && log.contains("may be lost"),
        "{log}"
    );
    live.finish().await;
}
