//! Tests of the integration-test harness itself (tests/common): the throwaway servers start
//! with the settings Zipline needs, survive crashes like real servers, clean up after
//! themselves, and the proxy injects the faults it promises.

use crate::common;

use common::{MariaDb, Postgres, Proxy};
use std::time::Duration;

#[tokio::test]
async fn postgres_has_logical_wal_and_pgoutput_slots() {
    let pg = Postgres::start();
    assert_eq!(pg.psql("postgres", "SHOW wal_level"), "logical");
    assert_eq!(pg.psql("postgres", "SHOW wal_sender_timeout"), "2s");
    assert_eq!(pg.psql("postgres", "SHOW fsync"), "off");
    assert!(
        pg.dir.join(format!(".s.PGSQL.{}", pg.port)).exists(),
        "Unix socket in the test directory"
    );

    pg.create_database("selftest");
    let client = pg.client("selftest").await;
    let row = client
        .query_one(
            "SELECT slot_name::text \
             FROM pg_create_logical_replication_slot('zipline_test_self', 'pgoutput')",
            &[],
        )
        .await
        .expect("creating a pgoutput slot");
    assert_eq!(row.get::<_, String>(0), "zipline_test_self");
    assert_eq!(
        pg.psql(
            "selftest",
            "SELECT slot_name, plugin, slot_type, database FROM pg_replication_slots"
        ),
        "zipline_test_self|pgoutput|logical|selftest"
    );
    client
        .execute("SELECT pg_drop_replication_slot('zipline_test_self')", &[])
        .await
        .expect("dropping the slot");
    assert_eq!(
        pg.psql("selftest", "SELECT count(*) FROM pg_replication_slots"),
        "0"
    );
}

#[test]
fn postgres_start_with_overrides_defaults() {
    let pg = Postgres::start_with(&[("wal_level", "replica")]);
    assert_eq!(pg.psql("postgres", "SHOW wal_level"), "replica");
    let err = pg
        .try_psql(
            "postgres",
            "SELECT pg_create_logical_replication_slot('zipline_test_x', 'pgoutput')",
        )
        .expect_err("a logical slot needs wal_level=logical");
    assert!(
        err.contains("wal_level"),
        "psql error names wal_level: {err}"
    );
}

#[tokio::test]
async fn postgres_kill_and_restart_keeps_committed_data_and_slots() {
    let mut pg = Postgres::start();
    let port = pg.port;
    pg.psql(
        "postgres",
        "CREATE TABLE t (id int PRIMARY KEY, v text);
         SELECT pg_create_logical_replication_slot('zipline_test_crash', 'pgoutput');",
    );
    let client = pg.client("postgres").await;
    client
        .execute("INSERT INTO t VALUES (1, 'committed')", &[])
        .await
        .expect("insert");

    pg.kill();
    assert!(
        client.simple_query("SELECT 1").await.is_err(),
        "the killed server no longer answers"
    );
    pg.restart();
    assert_eq!(pg.port, port, "restart keeps the port");
    assert_eq!(
        pg.psql("postgres", "SELECT v FROM t WHERE id = 1"),
        "committed"
    );
    assert_eq!(
        pg.psql(
            "postgres",
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name = 'zipline_test_crash'"
        ),
        "zipline_test_crash"
    );
    // A second crash/restart cycle, and a clean stop/restart.
    pg.kill();
    pg.restart();
    pg.stop();
    pg.restart();
    let client = pg.client("postgres").await;
    let n: i64 = client
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(n, 1);
}

#[test]
fn dropping_servers_stops_them_and_removes_their_directories() {
    let pg = Postgres::start();
    let db = MariaDb::start();
    let (pg_dir, pg_port) = (pg.dir.clone(), pg.port);
    let (db_dir, db_port) = (db.dir.clone(), db.port);
    assert_ne!(pg_port, db_port);
    drop(pg);
    drop(db);
    assert!(!pg_dir.exists(), "{} removed", pg_dir.display());
    assert!(!db_dir.exists(), "{} removed", db_dir.display());
    for port in [pg_port, db_port] {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "nothing listens on {port} after drop"
        );
    }
}

#[tokio::test]
async fn mariadb_kill_and_restart_keeps_committed_row() {
    use mysql_async::prelude::Queryable;

    let mut db = MariaDb::start();
    assert_eq!(db.sql("", "SELECT @@character_set_server"), "utf8mb4");
    let err = db
        .try_sql("", "SELECT * FROM no_such_db.t")
        .expect_err("an unknown database is an error");
    assert!(
        err.contains("no_such_db"),
        "error names the database: {err}"
    );
    db.create_database("selftest");
    db.sql(
        "selftest",
        "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB",
    );
    let mut conn = db.conn("selftest").await;
    conn.query_drop("INSERT INTO t VALUES (1, 'committed')")
        .await
        .expect("insert");

    db.kill();
    assert!(
        conn.query_drop("SELECT 1").await.is_err(),
        "the killed server no longer answers"
    );
    drop(conn);
    db.restart();
    assert_eq!(
        db.sql("selftest", "SELECT v FROM t WHERE id = 1"),
        "committed"
    );

    let mut conn = db.conn("").await;
    let v: Option<String> = conn
        .query_first("SELECT v FROM selftest.t WHERE id = 1")
        .await
        .expect("select after restart");
    assert_eq!(v.as_deref(), Some("committed"));
}

#[tokio::test]
async fn proxy_cut_breaks_postgres_connection_and_new_ones_work() {
    let pg = Postgres::start();
    let proxy = Proxy::start(pg.port).await;
    let via_proxy = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=5",
        proxy.port
    );
    let connect = || async {
        let (client, conn) = tokio_postgres::connect(&via_proxy, tokio_postgres::NoTls)
            .await
            .expect("connect through the proxy");
        tokio::spawn(conn);
        client
    };

    let client = connect().await;
    client.simple_query("SELECT 1").await.expect("query");
    assert_eq!(proxy.connections(), 1);

    proxy.cut_all();
    assert_eq!(proxy.connections(), 0);
    assert!(
        client.simple_query("SELECT 1").await.is_err(),
        "a cut connection fails"
    );

    // A cut applies to connections live at the time only.
    let client = connect().await;
    client
        .simple_query("SELECT 1")
        .await
        .expect("new connection after the cut");
    assert_eq!(proxy.connections(), 1);
    let again = connect().await;
    again.simple_query("SELECT 1").await.expect("a third one");
    assert!(proxy.wait_for_connections(2, Duration::from_secs(5)).await);
}

#[tokio::test]
async fn proxy_refuses_and_stalls_on_demand() {
    let pg = Postgres::start();
    let proxy = Proxy::start(pg.port).await;
    let via_proxy = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=5",
        proxy.port
    );

    proxy.set_refuse(true);
    assert!(
        tokio_postgres::connect(&via_proxy, tokio_postgres::NoTls)
            .await
            .is_err(),
        "refused while refusing"
    );
    proxy.set_refuse(false);
    let (client, conn) = tokio_postgres::connect(&via_proxy, tokio_postgres::NoTls)
        .await
        .expect("accepted again");
    tokio::spawn(conn);

    proxy.set_stall(true);
    let stalled =
        tokio::time::timeout(Duration::from_millis(500), client.simple_query("SELECT 1")).await;
    assert!(stalled.is_err(), "no answer while stalled");
    assert_eq!(proxy.connections(), 1, "a stall keeps the connection open");
    proxy.set_stall(false);
    let rows = tokio::time::timeout(Duration::from_secs(5), client.simple_query("SELECT 42"))
        .await
        .expect("answers after the stall")
        .expect("query");
    assert!(rows.iter().any(
        |m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("42"))
    ));
}

#[tokio::test]
async fn mariadb_through_proxy_stays_on_tcp() {
    use mysql_async::prelude::Queryable;

    let db = MariaDb::start();
    let proxy = Proxy::start(db.port).await;
    let url = format!("mysql://root@127.0.0.1:{}/?prefer_socket=false", proxy.port);
    let mut conn = mysql_async::Conn::from_url(url).await.expect("connect");
    let one: Option<i64> = conn.query_first("SELECT 1").await.expect("query");
    assert_eq!(one, Some(1));
    // With mysql_async's default prefer_socket the connection would have moved to the Unix
    // socket, and a cut would not touch it.
    proxy.cut_all();
    assert!(
        conn.query_drop("SELECT 1").await.is_err(),
        "cut through the proxy"
    );
}

#[test]
fn killed_postgres_leaves_no_shared_memory_after_drop() {
    let mut pg = Postgres::start();
    let pidfile = std::fs::read_to_string(pg.data_dir().join("postmaster.pid")).expect("pidfile");
    let shmid = pidfile
        .lines()
        .nth(6)
        .and_then(|l| l.split_whitespace().nth(1))
        .expect("shmem id on line 7")
        .to_owned();
    let listed = |id: &str| {
        let out = std::process::Command::new("ipcs")
            .arg("-m")
            .output()
            .expect("ipcs");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some(id))
    };
    assert!(listed(&shmid), "segment {shmid} exists while running");
    pg.kill();
    assert!(listed(&shmid), "SIGKILL leaves segment {shmid} behind");
    drop(pg);
    assert!(!listed(&shmid), "drop removed segment {shmid}");
}
