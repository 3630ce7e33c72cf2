//! `zipline pipeline status` and `zipline pipeline drop` against real servers, through a
//! pipeline's life: before its first run, while it runs, after a clean stop and after a
//! failed one; drop refused while it runs, removing only what Zipline made, and `apply`
//! starting from scratch after it.

use crate::e2e;

use std::time::Duration;

use e2e::{CONVERGE_TIMEOUT, Fixture, MY_DB, PG_DB, PUBLICATION, PipelineOpts, SLOT};
use e2e::{pipeline_yaml, wait_converged, wait_streaming};
use serde_json::Value;

const EXIT: Duration = Duration::from_secs(60);

/// `pipeline status --json`: its JSON object (the command must succeed).
fn status(fx: &mut Fixture) -> Value {
    let mut args = fx.args("status");
    args.push("--json".into());
    let env = fx.env();
    let (code, out, _) = fx.run_to_exit(&args, &env, EXIT);
    assert_eq!(code, 0, "status failed:\n{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON in:\n{out}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// `pipeline drop` with `extra` arguments: exit code and output.
fn drop_pipeline(fx: &mut Fixture, extra: &[&str]) -> (i32, String) {
    let mut args = fx.args("drop");
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let env = fx.env();
    let (code, out, _) = fx.run_to_exit(&args, &env, EXIT);
    (code, out)
}

/// A PostgreSQL LSN as a number.
fn lsn(text: &str) -> u64 {
    let (hi, lo) = text.split_once('/').expect("an LSN");
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

/// The slot as the server reports it: (active_pid, wal_status, confirmed_flush_lsn).
async fn slot_row(pg: &tokio_postgres::Client) -> Option<(Option<i32>, String, String)> {
    pg.query_opt(
        "SELECT active_pid, wal_status, confirmed_flush_lsn::text FROM pg_replication_slots \
         WHERE slot_name = $1",
        &[&SLOT],
    )
    .await
    .unwrap()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
}

fn zipline_tables(fx: &Fixture) -> String {
    fx.my.sql(
        "information_schema",
        &format!(
            "SELECT GROUP_CONCAT(TABLE_NAME ORDER BY TABLE_NAME) FROM TABLES \
             WHERE TABLE_SCHEMA = '{MY_DB}' AND TABLE_NAME LIKE '\\_zipline%'"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_and_drop_follow_a_pipeline_through_its_life() {
    let mut fx = Fixture::start();
    fx.pg.psql(
        PG_DB,
        "INSERT INTO orders (id, customer, amount) SELECT g, 'c' || g, g FROM generate_series(1, 200) g",
    );
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    let pg = fx.pg_client().await;
    let mut my = fx.my_checker().await;

    // Before the first run: nothing upstream, nothing in the sink, not running.
    let before = status(&mut fx);
    assert_eq!(before["pipeline"], "orders");
    assert_eq!(before["running"], false);
    assert_eq!(before["sources"][0]["name"], "orders-db");
    assert_eq!(before["sources"][0]["slot"], SLOT);
    assert_eq!(before["sources"][0]["slot_exists"], false);
    assert_eq!(before["sinks"][0]["name"], "mysql-out");
    assert_eq!(before["sinks"][0]["lanes"], Value::Array(vec![]));
    assert_eq!(before["sinks"][0]["claim"], Value::Null);

    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(60)).await;
    fx.pg.psql(
        PG_DB,
        "UPDATE orders SET status = 'paid' WHERE id % 3 = 0; DELETE FROM orders WHERE id % 7 = 0; \
         INSERT INTO orders (id, customer) SELECT g, 'n' || g FROM generate_series(201, 260) g",
    );
    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;

    // Running: the JSON agrees with the server's own pg_replication_slots, read around it.
    let (_, _, confirmed_before) = slot_row(&pg).await.expect("the slot exists");
    let running = status(&mut fx);
    let (pid_after, wal_status, confirmed_after) = slot_row(&pg).await.expect("the slot exists");
    let source = &running["sources"][0];
    assert_eq!(running["running"], true, "{running:#}");
    assert_eq!(source["slot_exists"], true);
    assert_eq!(source["active"], true);
    assert_eq!(source["active_pid"].as_i64(), pid_after.map(i64::from));
    assert_eq!(source["wal_status"], wal_status.as_str());
    assert_eq!(
        source["publication_owned"], true,
        "Zipline created the publication"
    );
    let confirmed = lsn(source["confirmed_lsn"].as_str().expect("confirmed_lsn"));
    assert!(
        (lsn(&confirmed_before)..=lsn(&confirmed_after)).contains(&confirmed),
        "status confirmed {confirmed:X}, server {confirmed_before}..{confirmed_after}"
    );
    let server = lsn(source["server_lsn"].as_str().expect("server_lsn"));
    assert_eq!(source["lag_bytes"].as_u64(), Some(server - confirmed));
    assert!(
        source["retained_bytes"].as_i64().is_some_and(|b| b > 0),
        "{source}"
    );
    let sink = &running["sinks"][0];
    assert_eq!(sink["running"], true);
    assert_eq!(sink["claim"]["pid"].as_u64(), z.pid().map(u64::from));
    let lanes = sink["lanes"].as_array().expect("lanes");
    assert_eq!(lanes.len(), 4, "{sink}");
    for (n, lane) in lanes.iter().enumerate() {
        assert_eq!(lane["lane"].as_u64(), Some(n as u64));
        assert!(
            lane["position"].as_str().is_some_and(|p| p.contains('#')),
            "{lane}"
        );
        assert!(
            lane["updated_at"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z')),
            "{lane}"
        );
    }
    // The text form says the same in words.
    let (code, text, _) = {
        let (args, env) = (fx.args("status"), fx.env());
        fx.run_to_exit(&args, &env, EXIT)
    };
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("pipeline orders: running"), "{text}");
    assert!(text.contains(&format!("slot {SLOT} active")), "{text}");

    // Drop is refused while the pipeline runs, and removes nothing.
    let (code, out) = drop_pipeline(&mut fx, &["--yes"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("is running"), "{out}");
    assert!(slot_row(&pg).await.is_some());

    z.terminate_cleanly(Duration::from_secs(30));
    let stopped = status(&mut fx);
    assert_eq!(stopped["running"], false, "{stopped:#}");
    assert_eq!(stopped["sources"][0]["active"], false);
    assert!(stopped["sinks"][0]["claim"]["stopped_at"].is_string());
    assert_eq!(stopped["last_error"], Value::Null);

    // Without a terminal and without --yes, drop asks nothing and does nothing.
    let (code, out) = drop_pipeline(&mut fx, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("--yes"), "{out}");
    assert!(slot_row(&pg).await.is_some());

    let (code, out) = drop_pipeline(&mut fx, &["--yes"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("dropped replication slot {SLOT}")),
        "{out}"
    );
    assert!(slot_row(&pg).await.is_none(), "the slot is gone");
    let (slots, publications) = fx.slots_and_publications();
    assert_eq!((slots.as_str(), publications.as_str()), ("", ""), "{out}");
    assert_eq!(zipline_tables(&fx), "NULL", "Zipline's own tables are gone");

    // apply starts from scratch: a new slot, the initial snapshot, then streaming.
    fx.pg
        .psql(PG_DB, "UPDATE orders SET note = 'after drop' WHERE id < 50");
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(60)).await;
    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert!(
        z.output().contains("created replication slot"),
        "{}",
        z.tail(40)
    );
    z.terminate_cleanly(Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_shows_the_last_fatal_error_and_drop_keeps_a_publication_the_user_made() {
    let mut fx = Fixture::servers();
    // The source table exists; the sink table does not, and create_tables is off: the start
    // fails after the claim, which records the error.
    fx.pg.psql(PG_DB, e2e::PG_ORDERS);
    fx.pg.psql(
        PG_DB,
        &format!("CREATE PUBLICATION {PUBLICATION} FOR TABLE orders"),
    );
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    let (args, env) = (fx.args("apply"), fx.env());
    let (code, out, _) = fx.run_to_exit(&args, &env, EXIT);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("create_tables"), "{out}");

    let failed = status(&mut fx);
    assert_eq!(failed["running"], false, "{failed:#}");
    let last = failed["last_error"].as_str().expect("a recorded error");
    assert!(last.contains("create_tables"), "{last}");
    assert_eq!(failed["sources"][0]["publication_exists"], true);
    assert_eq!(failed["sources"][0]["publication_owned"], false);

    let (code, out) = drop_pipeline(&mut fx, &["--yes"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("Zipline did not create it"), "{out}");
    let (_, publications) = fx.slots_and_publications();
    assert_eq!(publications, PUBLICATION, "the user's publication stays");
    assert_eq!(zipline_tables(&fx), "NULL");
}
