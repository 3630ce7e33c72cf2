//! Transforms end to end, through the binary, between real PostgreSQL and MariaDB servers:
//!
//! - the Rust example guest (`guest-examples/rust-mask`) masks `orders.customer` and drops
//!   table `audit_log`: the sink ends up with exactly the source's rows, customer masked, and
//!   no `audit_log` row, through inserts, updates of masked and unmasked columns, key changes
//!   and deletes, over 4 lanes;
//! - the same under a randomized concurrent workload (key changes and TOASTed values
//!   included) with Zipline SIGKILLed twice mid-stream: the sink converges to the masked
//!   source, nothing lost or doubled;
//! - the SDK's row filter (`guest-examples/rust-filter`) under the same random workload and
//!   kills, rows moving into and out of the predicate: the sink equals the source's rows
//!   where the predicate holds;
//! - a guest that refuses one change, under `on_error: dead_letter`: that change is in the
//!   dead-letter file and nowhere else, everything else arrives, the pipeline keeps running;
//! - a guest that traps on one change, under the default `on_error: halt`: the pipeline stops
//!   with an error naming route, module and change, and the sink has nothing from the
//!   transaction that failed;
//! - one source split over two routes, `orders` through the masking guest into MariaDB and
//!   `customers` into PostgreSQL, under concurrent workloads and three SIGKILLs: both sinks
//!   equal the source (masked column aside), and nothing of `customers` reaches MariaDB.
//!
//! The components are built by `tests/guests/build.sh` into `target/guests/`.

use crate::{common, e2e};

use std::path::PathBuf;
use std::time::{Duration, Instant};

use e2e::workload::{self, Config};
use e2e::{
    Fixture, MY_DB, PG_DB, PipelineOpts, Rows, diff_rows, my_rows, pg_rows, pipeline_yaml,
    wait_streaming,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn guest(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("target/guests/{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: build the test guests first with tests/guests/build.sh (or `.ci/run guests`)",
        path.display()
    );
    path
}

/// The pipeline with `transform` lines appended to its route.
fn pipeline(transform: &str) -> String {
    format!(
        "{}    transform:\n{transform}",
        pipeline_yaml(&PipelineOpts::default())
    )
}

/// Writes the pipeline with a transform of `module` (`rest`: the spec's other lines), starts
/// it and waits until it streams; returns a source client and the running instance.
async fn streaming_through(
    fx: &mut Fixture,
    module: &std::path::Path,
    rest: &str,
) -> (tokio_postgres::Client, e2e::Zipline) {
    fx.write_pipeline(&pipeline(&format!(
        "      module: {}\n{rest}",
        module.display()
    )));
    let pg = fx.pg_client().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;
    (pg, z)
}

/// rust-mask's masking, for the expected rows.
fn mask(s: &str) -> String {
    let Some(first) = s.chars().next() else {
        return String::new();
    };
    let domain = s.rfind('@').map_or("", |at| &s[at..]);
    format!("{first}***{domain}")
}

/// Polls until the sink's orders equal `expected(source rows)`; panics with the difference.
async fn wait_sink_equals(
    fx: &Fixture,
    z: &mut e2e::Zipline,
    expected: impl Fn(Rows) -> Rows,
    timeout: Duration,
) -> Rows {
    let pg = fx.pg_client().await;
    let mut my = fx.my_checker().await;
    let deadline = Instant::now() + timeout;
    loop {
        z.assert_running();
        let want = expected(pg_rows(&pg).await);
        let got = my_rows(&mut my).await;
        match diff_rows(&want, &got) {
            None => return got,
            Some(diff) if Instant::now() >= deadline => {
                panic!(
                    "sink did not converge within {timeout:?}:\n{diff}\nlog:\n{}",
                    z.tail(60)
                )
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

const AUDIT_PG: &str = "CREATE TABLE audit_log (id bigserial PRIMARY KEY, what text)";
const AUDIT_MY: &str = "CREATE TABLE audit_log (id BIGINT PRIMARY KEY, what TEXT) ENGINE=InnoDB";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_guest_masks_a_column_and_drops_a_table() {
    let mut fx = Fixture::start();
    fx.pg.psql(PG_DB, AUDIT_PG);
    fx.my.sql(MY_DB, AUDIT_MY);
    let (pg, mut z) = streaming_through(
        &mut fx,
        &guest("rust-mask"),
        "      config: { columns: customer, drop: audit_log }\n      limits: { memory: 64MiB, timeout: 200ms }\n      on_error: dead_letter\n",
    )
    .await;

    // Small transactions (one statement each) and large ones, with the dropped table mixed in.
    for i in 1..=60i64 {
        let customer = match i % 5 {
            0 => "NULL".to_owned(),
            1 => "''".to_owned(),
            _ => format!("'customer{i}@example.com'"),
        };
        pg.batch_execute(&format!(
            "BEGIN;
             INSERT INTO orders (id, customer, amount, status, note) VALUES ({i}, {customer}, {i}.50, 'new', 'n{i}');
             INSERT INTO audit_log (what) VALUES ('insert {i}');
             COMMIT;"
        ))
        .await
        .unwrap();
    }
    pg.batch_execute(
        "BEGIN;
         INSERT INTO orders (id, customer, amount, status)
           SELECT g, 'bulk' || g || '@shop.test', g, 'bulk' FROM generate_series(1000, 2999) g;
         INSERT INTO audit_log (what) SELECT 'bulk ' || g FROM generate_series(1, 500) g;
         COMMIT;
         UPDATE orders SET customer = 'renamed' || id || '@new.test' WHERE id % 3 = 0;
         UPDATE orders SET status = 'paid', amount = amount + 1 WHERE id % 3 = 1;
         UPDATE orders SET id = id + 10000 WHERE id BETWEEN 2000 AND 2099;
         DELETE FROM orders WHERE id % 7 = 0;
         UPDATE audit_log SET what = 'changed';
         DELETE FROM audit_log WHERE id % 2 = 0;",
    )
    .await
    .unwrap();

    let masked = |rows: Rows| -> Rows {
        rows.into_iter()
            .map(|mut r| {
                r[1] = r[1].as_deref().map(mask);
                r
            })
            .collect()
    };
    let rows = wait_sink_equals(&fx, &mut z, masked, Duration::from_secs(90)).await;
    assert!(rows.len() > 1500, "{} rows", rows.len());
    assert!(
        rows.iter()
            .any(|r| r[1].as_deref() == Some("r***@new.test"))
    );
    assert!(
        rows.iter().any(|r| r[1].as_deref() == Some("")),
        "empty text stays empty"
    );
    let mut my = fx.my_checker().await;
    let audit: Vec<i64> = mysql_async::prelude::Queryable::query(
        &mut my,
        format!("SELECT id FROM {MY_DB}.audit_log"),
    )
    .await
    .unwrap();
    assert!(
        audit.is_empty(),
        "the dropped table reached the sink: {} rows",
        audit.len()
    );
    let unmasked: Vec<String> = mysql_async::prelude::Queryable::query(
        &mut my,
        format!("SELECT customer FROM {MY_DB}.orders WHERE customer LIKE '%customer%' OR customer LIKE 'bulk%'"),
    )
    .await
    .unwrap();
    assert!(
        unmasked.is_empty(),
        "unmasked values in the sink: {unmasked:?}"
    );
    assert!(
        !fx.dir.path().join("orders.deadletter.jsonl").exists(),
        "nothing failed"
    );
    z.terminate_cleanly(Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_change_is_dead_lettered_and_the_rest_arrives() {
    let mut fx = Fixture::start();
    let (pg, mut z) = streaming_through(
        &mut fx,
        &guest("hostile"),
        "      config: { mode: reject, key: \"13\" }\n      on_error: dead_letter\n",
    )
    .await;
    pg.batch_execute(
        "INSERT INTO orders (id, customer, status) SELECT g, 'c' || g, 'new' FROM generate_series(1, 20) g;
         UPDATE orders SET status = 'paid' WHERE id > 10;",
    )
    .await
    .unwrap();
    // Row 13's insert and update were both refused: the sink never has it.
    let without_13 = |rows: Rows| -> Rows {
        rows.into_iter()
            .filter(|r| r[0].as_deref() != Some("13"))
            .collect()
    };
    wait_sink_equals(&fx, &mut z, without_13, Duration::from_secs(60)).await;
    let dl = std::fs::read_to_string(fx.dir.path().join("orders.deadletter.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = dl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 2, "{dl}");
    for (r, op) in records.iter().zip(["insert", "update"]) {
        assert_eq!(r["change"]["op"], op);
        assert_eq!(r["change"]["key"][0], 13);
        assert_eq!(r["change"]["table"], "public.orders");
        assert_eq!(r["route"], "orders-db");
        assert_eq!(
            r["reason"],
            "the transform refused the change: rejected on purpose"
        );
    }
    assert!(z.output().contains("dead-lettered"), "{}", z.tail(40));
    z.terminate_cleanly(Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_filter_needs_whole_rows_and_says_so_before_creating_anything() {
    let mut fx = Fixture::start();
    fx.write_pipeline(&pipeline(&format!(
        "      module: {}\n      config: {{ columns: customer }}\n      row_filter: true\n",
        guest("rust-mask").display()
    )));
    let (args, env) = (fx.args("apply"), fx.env());
    let (code, out, _) = fx.run_to_exit(&args, &env, Duration::from_secs(60));
    assert_eq!(code, 1, "{out}");
    for part in [
        "orders.yaml:",
        "transform.row_filter: table public.orders: a row filter needs whole rows",
        r#"ALTER TABLE "public"."orders" REPLICA IDENTITY FULL"#,
    ] {
        assert!(out.contains(part), "missing {part:?} in:\n{out}");
    }
    let (slots, publications) = fx.slots_and_publications();
    assert_eq!(
        (slots.as_str(), publications.as_str()),
        ("", ""),
        "nothing created"
    );

    fx.pg
        .psql(PG_DB, "ALTER TABLE orders REPLICA IDENTITY FULL");
    let pg = fx.pg_client().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;
    pg.batch_execute("INSERT INTO orders (id, customer) VALUES (1, 'ada@example.com')")
        .await
        .unwrap();
    let masked = |rows: Rows| {
        rows.into_iter()
            .map(|mut r| {
                r[1] = r[1].as_deref().map(mask);
                r
            })
            .collect()
    };
    wait_sink_equals(&fx, &mut z, masked, Duration::from_secs(60)).await;
    z.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trapping_guest_halts_the_pipeline_naming_route_module_and_change() {
    let mut fx = Fixture::start();
    let module = guest("hostile");
    let (pg, mut z) = streaming_through(
        &mut fx,
        &module,
        "      config: { mode: trap, key: \"7\" }\n",
    )
    .await;
    pg.batch_execute("INSERT INTO orders (id, customer) VALUES (1, 'a'), (2, 'b')")
        .await
        .unwrap();
    let only_1_2 = |rows: Rows| rows;
    wait_sink_equals(&fx, &mut z, only_1_2, Duration::from_secs(60)).await;
    pg.batch_execute("INSERT INTO orders (id, customer) VALUES (6, 'f'), (7, 'g'), (8, 'h')")
        .await
        .unwrap();
    let status = z
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("zipline kept running; log:\n{}", z.tail(40)));
    assert!(!status.success());
    let log = z.output();
    let want = format!(
        "route orders-db: transform {} failed on change ",
        module.display()
    );
    assert!(log.contains(&want), "{log}");
    assert!(
        log.contains("(insert on public.orders): trapped: unreachable code reached (a panic or abort in the guest); halting (on_error: halt)"),
        "{log}"
    );
    // Nothing of 7 reached the sink. (6 may have, if it was transformed in an earlier batch
    // than 7: lanes apply changes before their transaction is complete, and the frontier,
    // which did not move past this transaction, makes a restart deliver it again.)
    let mut my = fx.my_checker().await;
    let ids: Vec<i64> = mysql_async::prelude::Queryable::query(
        &mut my,
        format!("SELECT id FROM {MY_DB}.orders ORDER BY id"),
    )
    .await
    .unwrap();
    assert!(ids.starts_with(&[1, 2]) && !ids.contains(&7), "{ids:?}");
}

/// A random concurrent workload (key changes, status changes and TOASTed notes included)
/// with Zipline SIGKILLed twice mid-stream and started again; returns the live instance and
/// how many changes the workload made once it has stopped, and the killed instances (whose
/// logs a failing test prints when they drop).
async fn random_workload_with_two_kills(
    fx: &mut Fixture,
    z: e2e::Zipline,
) -> (e2e::Zipline, u64, Vec<e2e::Zipline>) {
    let seed = workload::seed();
    let mut cfg = Config::new(seed, u64::MAX);
    cfg.pause = Duration::from_millis(15);
    cfg.toast_pct = 10;
    let w = workload::start(fx.pg.conn_str(PG_DB), cfg);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x7a7a);
    let (mut z, mut killed) = (z, Vec::new());
    for round in 1..=2 {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1_500..3_000))).await;
        z.assert_running();
        eprintln!("e2e: SIGKILL {round} at {} changes", w.changes());
        z.kill();
        killed.push(std::mem::replace(&mut z, fx.apply()));
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    w.stop();
    let report = w.join().await;
    assert!(report.changes >= 2_000, "only {} changes", report.changes);
    (z, report.changes, killed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masked_random_workload_survives_kills_and_converges() {
    let mut fx = Fixture::start();
    let (_pg, z) = streaming_through(
        &mut fx,
        &guest("rust-mask"),
        "      config: { columns: customer }\n",
    )
    .await;
    let (mut z, changes, _killed) = random_workload_with_two_kills(&mut fx, z).await;
    let masked = |rows: Rows| -> Rows {
        rows.into_iter()
            .map(|mut r| {
                r[1] = r[1].as_deref().map(mask);
                r
            })
            .collect()
    };
    let rows = wait_sink_equals(&fx, &mut z, masked, Duration::from_secs(120)).await;
    eprintln!("e2e: {} rows converged after {changes} changes", rows.len());
    z.terminate_cleanly(Duration::from_secs(20));
}

/// The SDK's `filter` (guest-examples/rust-filter) drops orders whose status is `cancelled`,
/// while the random workload moves rows into and out of that status (also with key changes,
/// and with TOASTed notes the status updates leave untouched) and Zipline is SIGKILLed twice:
/// the sink must equal `SELECT … WHERE status IS DISTINCT FROM 'cancelled'` on the source.
/// Rows that left the predicate were deleted; rows that entered it arrived whole, their
/// unchanged TOASTed note filled from the old row (REPLICA IDENTITY FULL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filtered_replica_equals_the_source_where_the_predicate_holds_through_kills() {
    let mut fx = Fixture::start();
    fx.pg
        .psql(PG_DB, "ALTER TABLE orders REPLICA IDENTITY FULL");
    let (pg, z) = streaming_through(
        &mut fx,
        &guest("rust-filter"),
        "      config: { column: status, value: cancelled }\n      row_filter: true\n",
    )
    .await;
    // One row for sure enters the predicate by an update that leaves its TOASTed note
    // untouched: the sink never had it, so the note must come from the old row.
    pg.batch_execute(
        "INSERT INTO orders (id, customer, status, note) VALUES (-1, 'toast', 'cancelled', \
         (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 300) g));
         UPDATE orders SET status = 'paid' WHERE id = -1;",
    )
    .await
    .unwrap();
    let (mut z, changes, _killed) = random_workload_with_two_kills(&mut fx, z).await;
    let (all, cancelled) = {
        let rows = pg_rows(&pg).await;
        let n = rows
            .iter()
            .filter(|r| r[3].as_deref() == Some("cancelled"))
            .count();
        (rows.len(), n)
    };
    assert!(
        cancelled > 0 && cancelled < all,
        "{cancelled} of {all} rows cancelled"
    );
    let kept = |rows: Rows| -> Rows {
        rows.into_iter()
            .filter(|r| r[3].as_deref() != Some("cancelled"))
            .collect()
    };
    let rows = wait_sink_equals(&fx, &mut z, kept, Duration::from_secs(120)).await;
    eprintln!(
        "e2e: {} of {all} rows ({cancelled} cancelled filtered out) converged after {changes} changes",
        rows.len()
    );
    z.terminate_cleanly(Duration::from_secs(20));
}

const CUSTOMERS: &str = "CREATE TABLE customers (id bigint PRIMARY KEY, name text, city text)";

/// Random inserts, updates and deletes of `customers` until `stop`; returns how many.
fn customers_writer(
    conn: String,
    seed: u64,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let (client, connection) = tokio_postgres::connect(&conn, tokio_postgres::NoTls)
            .await
            .expect("connecting the customers writer");
        tokio::spawn(connection);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut n = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let id = rng.random_range(1..=300);
            let city = rng.random_range(0..1000);
            let sql = match rng.random_range(0..10) {
                0..6 => format!(
                    "INSERT INTO customers VALUES ({id}, 'name {id}', 'city {city}') \
                     ON CONFLICT (id) DO UPDATE SET city = EXCLUDED.city"
                ),
                6..8 => format!("UPDATE customers SET name = 'renamed {city}' WHERE id = {id}"),
                _ => format!("DELETE FROM customers WHERE id = {id}"),
            };
            client
                .batch_execute(&sql)
                .await
                .expect("a customers change");
            n += 1;
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        n
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_routes_split_one_source_through_their_own_transform_and_sinks() {
    let mut fx = Fixture::start();
    fx.pg.psql(PG_DB, CUSTOMERS);
    // A customers table in MariaDB too: nothing of the customers route may reach it.
    fx.my.sql(
        MY_DB,
        "CREATE TABLE customers (id BIGINT PRIMARY KEY, name TEXT, city TEXT) ENGINE=InnoDB",
    );
    let replica = common::Postgres::start();
    replica.create_database("replica");
    replica.psql("replica", CUSTOMERS);
    let base = pipeline_yaml(&PipelineOpts::default());
    let (connectors, _) = base.split_once("routes:").expect("a routes section");
    fx.write_pipeline(&format!(
        "{connectors}  - name: pg-out\n    type: sink/postgres\n    host: 127.0.0.1\n    \
         port: {}\n    database: replica\n    user: postgres\n    lanes: 2\nroutes:\n  \
         - from: orders-db\n    tables: [orders]\n    to: [mysql-out]\n    transform:\n      \
         module: {}\n      config: {{ columns: customer }}\n  - from: orders-db\n    \
         tables: [public.customers]\n    to: [pg-out]\n",
        replica.port,
        guest("rust-mask").display()
    ));
    let pg = fx.pg_client().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;

    let seed = workload::seed();
    let mut cfg = Config::new(seed, u64::MAX);
    cfg.pause = Duration::from_millis(15);
    let w = workload::start(fx.pg.conn_str(PG_DB), cfg);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let customers = customers_writer(fx.pg.conn_str(PG_DB), seed ^ 0xC0FFEE, stop.clone());
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5157);
    let mut killed = Vec::new();
    for round in 1..=3 {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..2_500))).await;
        z.assert_running();
        eprintln!("e2e: SIGKILL {round} at {} changes", w.changes());
        z.kill();
        killed.push(std::mem::replace(&mut z, fx.apply()));
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    w.stop();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let report = w.join().await;
    let customer_changes = customers.await.expect("the customers writer");
    assert!(report.changes >= 1_000, "only {} changes", report.changes);
    assert!(
        customer_changes >= 200,
        "only {customer_changes} customers changes"
    );

    let masked = |rows: Rows| -> Rows {
        rows.into_iter()
            .map(|mut r| {
                r[1] = r[1].as_deref().map(mask);
                r
            })
            .collect()
    };
    let orders = wait_sink_equals(&fx, &mut z, masked, Duration::from_secs(120)).await;
    let sink = replica.client("replica").await;
    let query = "SELECT id::text, name, city FROM customers ORDER BY id";
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let want = e2e::pg_text_rows(&pg, query).await;
        let got = e2e::pg_text_rows(&sink, query).await;
        match diff_rows(&want, &got) {
            None => break,
            Some(diff) => assert!(
                Instant::now() < deadline,
                "customers did not converge:\n{diff}\nlog:\n{}",
                z.tail(40)
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut my = fx.my_checker().await;
    let leaked: Vec<u64> = mysql_async::prelude::Queryable::query(
        &mut my,
        format!("SELECT COUNT(*) FROM {MY_DB}.customers"),
    )
    .await
    .expect("counting MariaDB's customers");
    assert_eq!(leaked, vec![0], "customers reached the orders route's sink");
    eprintln!(
        "e2e: two routes converged: {} orders (masked) after {} changes, customers after \
         {customer_changes} changes, 3 SIGKILLs",
        orders.len(),
        report.changes
    );
    z.terminate_cleanly(Duration::from_secs(20));
    drop(killed);
}
