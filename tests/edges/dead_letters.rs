//! A row the sink rejects for good follows the sink's `on_error`: `dead_letter` (recorded with
//! its key parked, replayed in order by `zipline dlq replay`), `skip`, or `halt` (naming the
//! row, bisected out of its batch when the server does not say which row it was).

use std::time::Duration;

use crate::e2e::{
    CONVERGE_TIMEOUT, Fixture, MY_DB, PipelineOpts, pg_rows, pipeline_yaml, wait_converged,
    wait_streaming,
};

/// Rows are `(id, customer, note)`; the rest of the columns take fixed values.
async fn write(pg: &tokio_postgres::Client, sql: &str) {
    pg.batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

fn insert(id: i64, customer: &str, note: &str) -> String {
    format!(
        "INSERT INTO orders VALUES ({id}, '{customer}', 1.50, 'new', \
         '2026-01-02 03:04:05+00', true, '{note}');"
    )
}

fn fixture(on_error: &str) -> Fixture {
    let fx = Fixture::start();
    // A sink narrower than the source: notes over 10 characters do not fit.
    fx.my
        .sql(MY_DB, "ALTER TABLE orders MODIFY note VARCHAR(10)");
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts {
        sink_extra: vec!["max_wait: 20ms".into(), format!("on_error: {on_error}")],
        ..PipelineOpts::default()
    }));
    fx
}

/// Sink rows as `id|customer|note`, by id.
fn sink_rows(fx: &Fixture) -> String {
    fx.my.sql(
        MY_DB,
        "SELECT CONCAT_WS('|', id, customer, IFNULL(note, 'NULL')) FROM orders ORDER BY id",
    )
}

async fn source_rows(pg: &tokio_postgres::Client) -> String {
    let mut rows = pg_rows(pg).await;
    rows.sort_by_key(|r| r[0].as_deref().and_then(|id| id.parse::<i64>().ok()));
    rows.iter()
        .map(|r| {
            format!(
                "{}|{}|{}",
                r[0].as_deref().unwrap_or("NULL"),
                r[1].as_deref().unwrap_or("NULL"),
                r[6].as_deref().unwrap_or("NULL")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn wait_sink(fx: &Fixture, expected: &str, z: &mut crate::e2e::Zipline) {
    let deadline = std::time::Instant::now() + CONVERGE_TIMEOUT;
    loop {
        z.assert_running();
        let got = sink_rows(fx);
        if got == expected {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "sink rows\n{got}\nexpected\n{expected}\nlog:\n{}",
            z.tail(40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn dead_letters_park_their_key_and_replay_in_order_once_the_sink_is_fixed() {
    let mut fx = fixture("dead_letter");
    fx.my.sql(
        MY_DB,
        "ALTER TABLE orders ADD UNIQUE KEY uq_customer (customer)",
    );
    let pg = fx.pg_client().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(60)).await;

    let mut sql = String::new();
    for id in 1..=8 {
        sql.push_str(&insert(id, &format!("c{id}"), "ok"));
    }
    // Row 5 does not fit; so do its later update and row 9 (then deleted). Row 12 takes row
    // 1's customer, which the sink's extra unique key refuses.
    sql.push_str(&insert(5_000, "c5000", "far too long for the sink"));
    write(&pg, &sql).await;
    write(
        &pg,
        &format!(
            "UPDATE orders SET status = 'paid' WHERE id = 5000; \
             UPDATE orders SET note = 'fine' WHERE id = 7; DELETE FROM orders WHERE id = 8; \
             {}{}",
            insert(9, "c9", "also much too long"),
            insert(12, "c1", "twelve")
        ),
    )
    .await;
    // In a batch of its own (an insert and delete of one key in one batch cancel out).
    tokio::time::sleep(Duration::from_millis(500)).await;
    write(&pg, "DELETE FROM orders WHERE id = 9").await;
    write(&pg, &insert(13, "c13", "last")).await;
    wait_sink(
        &fx,
        "1|c1|ok\n2|c2|ok\n3|c3|ok\n4|c4|ok\n5|c5|ok\n6|c6|ok\n7|c7|fine\n13|c13|last",
        &mut z,
    )
    .await;

    // Listed while running: the rejected changes and those parked behind them.
    let env = fx.env();
    let list = dlq(&mut fx, "list", &env);
    assert_eq!(list.0, 0, "{}", list.1);
    let lines: Vec<&str> = list
        .1
        .lines()
        .filter(|l| l.starts_with("mysql-out\t"))
        .collect();
    assert_eq!(lines.len(), 5, "{}", list.1);
    let has = |needle: &str| lines.iter().any(|l| l.contains(needle));
    assert!(
        has("insert public.orders key [5000]\t[1406] "),
        "{}",
        list.1
    );
    assert!(has("Data too long for column 'note'"), "{}", list.1);
    assert!(
        has("update public.orders key [5000]\tparked:"),
        "{}",
        list.1
    );
    assert!(has("insert public.orders key [9]\t[1406] "), "{}", list.1);
    assert!(has("delete public.orders key [9]\tparked:"), "{}", list.1);
    assert!(
        has(
            "row (id)=(12) has unique key `uq_customer` (customer)=('c1') of the sink's row (id)=(1)"
        ),
        "{}",
        list.1
    );

    // Replay is refused while the pipeline runs.
    let (code, out, _) = dlq(&mut fx, "replay --all", &env);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("is already running"), "{out}");

    z.terminate_cleanly(Duration::from_secs(20));
    // Still broken: row 9's insert and delete replay (to nothing), the others stay.
    let (code, out, _) = dlq(&mut fx, "replay --all", &env);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("sink mysql-out: 2 dead letters replayed"),
        "{out}"
    );
    assert!(out.contains("3 dead letters are still rejected"), "{out}");

    fx.my.sql(
        MY_DB,
        "ALTER TABLE orders MODIFY note TEXT, DROP INDEX uq_customer",
    );
    let (code, out, _) = dlq(&mut fx, "replay --all", &env);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("sink mysql-out: 3 dead letters replayed"),
        "{out}"
    );
    // Row 5000 carries its update, row 9 is gone again, row 12 is in and row 1 untouched.
    assert_eq!(sink_rows(&fx), source_rows(&pg).await);
    let (code, out, _) = dlq(&mut fx, "replay --all", &env);
    assert_eq!(
        (code, out.contains("0 dead letters replayed")),
        (0, true),
        "{out}"
    );

    // Unparked: the key's next change applies.
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(60)).await;
    write(
        &pg,
        "UPDATE orders SET note = 'again, long enough now' WHERE id = 5000",
    )
    .await;
    let mut my = fx.my_checker().await;
    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    z.terminate_cleanly(Duration::from_secs(20));
}

/// `zipline dlq <verb> -f orders.yaml …` to completion: exit code and output.
fn dlq(fx: &mut Fixture, verb: &str, env: &[(String, String)]) -> (i32, String, Duration) {
    let args = dlq_args(fx, verb);
    fx.run_to_exit(&args, env, Duration::from_secs(30))
}

fn dlq_args(fx: &Fixture, verb: &str) -> Vec<String> {
    let mut args = vec!["dlq".to_owned()];
    let mut words = verb.split_whitespace();
    args.push(words.next().expect("a verb").to_owned());
    args.push("-f".to_owned());
    args.push(fx.dir.path().join("orders.yaml").display().to_string());
    args.extend(words.map(str::to_owned));
    args
}

#[tokio::test]
async fn skip_logs_and_moves_on() {
    let mut fx = fixture("skip");
    let pg = fx.pg_client().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(60)).await;
    write(
        &pg,
        &format!(
            "{}{}{}",
            insert(1, "c1", "ok"),
            insert(2, "c2", "does not fit in ten"),
            insert(3, "c3", "ok")
        ),
    )
    .await;
    wait_sink(&fx, "1|c1|ok\n3|c3|ok", &mut z).await;
    write(&pg, "UPDATE orders SET note = 'fits' WHERE id = 2").await;
    // Skipped means skipped: the later update applies as a row of its own.
    wait_sink(&fx, "1|c1|ok\n2|c2|fits\n3|c3|ok", &mut z).await;
    let log = z.output();
    assert!(
        log.contains("skipping a change the sink rejects (on_error: skip)")
            && log.contains("key=[2]"),
        "{}",
        z.tail(40)
    );
    z.terminate_cleanly(Duration::from_secs(20));
}

#[tokio::test]
async fn halt_names_the_row_a_check_constraint_refuses() {
    let mut fx = fixture("halt");
    fx.my.sql(
        MY_DB,
        "ALTER TABLE orders ADD CONSTRAINT amount_positive CHECK (amount > 0)",
    );
    let pg = fx.pg_client().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(60)).await;
    let mut sql = String::from("BEGIN;");
    for id in 1..=6 {
        sql.push_str(&insert(id, &format!("c{id}"), "ok"));
    }
    sql.push_str("UPDATE orders SET amount = -1 WHERE id = 4; COMMIT;");
    write(&pg, &sql).await;
    // MariaDB names the constraint but not the row: the lane bisected its batch to find it.
    let out = z.expect_failure(
        Duration::from_secs(60),
        "CONSTRAINT `amount_positive` failed",
    );
    assert!(out.contains("halting (on_error: halt) at update "), "{out}");
    assert!(
        out.contains("of public.orders, key [4], which is not confirmed"),
        "{out}"
    );
}
