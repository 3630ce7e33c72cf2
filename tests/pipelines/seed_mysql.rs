//! The seed's trace: a short, hand-written history of inserts, updates and deletes on a few
//! keys, each in its own transaction, on top of rows that already exist on both sides.
//!
//! Besides the final equality, triggers on the MySQL table record every row change the sink
//! makes, in order. For each key, the states the sink went through must be an in-order
//! subsequence of the states the source went through: a batch may skip intermediate states,
//! but the sink must never go back to an older state, never invent one, and never touch a key
//! the source did not change.

use crate::e2e;

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::{
    CONVERGE_TIMEOUT, Fixture, MY_DB, PG_DB, PipelineOpts, pipeline_yaml, wait_converged,
    wait_streaming,
};
use mysql_async::prelude::Queryable;

/// A row's state as the audit sees it: absent, or present with (status, amount).
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Absent,
    Present(String, String),
}

fn present(status: &str, amount: &str) -> State {
    State::Present(status.to_owned(), amount.to_owned())
}

/// Rows on both sides before Zipline starts. The initial snapshot copies them again (it
/// replaces rows by key: the audit sees a delete and an insert of the same values); the audit
/// below starts once Zipline streams.
const SEED_PG: &str = "INSERT INTO orders VALUES
    (1, 'Ada', 10.00, 'new', '2024-01-02 03:04:05.123456+00', true, 'first'),
    (2, 'O''Brien', 0.01, 'paid', '1999-12-31 23:59:59.999999+00', false, NULL),
    (3, NULL, NULL, NULL, NULL, NULL, NULL),
    (2210, 'Zoë', 99.99, 'seed', '2023-06-15 12:00:00+00', true, 'to be deleted')";

const SEED_MY: &str = "INSERT INTO orders VALUES
    (1, 'Ada', 10.00, 'new', '2024-01-02 03:04:05.123456', 1, 'first'),
    (2, 'O''Brien', 0.01, 'paid', '1999-12-31 23:59:59.999999', 0, NULL),
    (3, NULL, NULL, NULL, NULL, NULL, NULL),
    (2210, 'Zoë', 99.99, 'seed', '2023-06-15 12:00:00', 1, 'to be deleted')";

const AUDIT: &str = "
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

/// The trace: (key, SQL, state of the key afterwards). One transaction each.
fn trace() -> Vec<(i64, &'static str, State)> {
    vec![
        (
            4471,
            "INSERT INTO orders VALUES (4471, 'Grace', 10.00, 'new', '2024-02-29 23:59:59.000001+00', false, 'leap')",
            present("new", "10.00"),
        ),
        (
            4471,
            "UPDATE orders SET status = 'paid', amount = 12.50 WHERE id = 4471",
            present("paid", "12.50"),
        ),
        (2210, "DELETE FROM orders WHERE id = 2210", State::Absent),
        (
            4472,
            "INSERT INTO orders VALUES (4472, 'Linus', 5.00, 'new', now(), true, NULL)",
            present("new", "5.00"),
        ),
        (
            4472,
            "UPDATE orders SET status = 'paid', amount = 7.25, note = 'paid late' WHERE id = 4472",
            present("paid", "7.25"),
        ),
        (
            4471,
            "UPDATE orders SET status = 'shipped', note = NULL WHERE id = 4471",
            present("shipped", "12.50"),
        ),
        (4472, "DELETE FROM orders WHERE id = 4472", State::Absent),
    ]
}

/// (seq, id, op, status, amount) from `orders_audit`.
type AuditRow = (i64, i64, String, Option<String>, Option<String>);

/// True if `sub` is an in-order subsequence of `seq`.
fn is_subsequence(sub: &[State], seq: &[State]) -> bool {
    let mut it = seq.iter();
    sub.iter().all(|s| it.any(|t| t == s))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_trace_is_replayed_in_order_per_key() {
    let mut fx = Fixture::start();
    fx.pg.psql(PG_DB, SEED_PG);
    fx.my.sql(MY_DB, SEED_MY);
    fx.my.sql(MY_DB, AUDIT);
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));

    let pg = fx.pg_client().await;
    let mut my = fx.my_checker().await;
    // The seed rows render identically on both sides before anything runs.
    e2e::assert_equal_now(&pg, &mut my).await;

    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;
    // What the snapshot did is not part of the trace.
    my.query_drop(format!("DELETE FROM {MY_DB}.orders_audit"))
        .await
        .expect("clearing the audit of the snapshot");
    e2e::assert_equal_now(&pg, &mut my).await;

    // Source history per key, starting with the state before the trace.
    let mut source: BTreeMap<i64, Vec<State>> = BTreeMap::new();
    source.insert(2210, vec![present("seed", "99.99")]);
    source.insert(4471, vec![State::Absent]);
    source.insert(4472, vec![State::Absent]);
    for (key, sql, after) in trace() {
        pg.batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        source.get_mut(&key).unwrap().push(after);
        // Spaced out so that most steps reach the sink in batches of their own (the sink may
        // still coalesce; the subsequence check allows that).
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let summary = wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_eq!(summary.count, 4, "rows 1, 2, 3 and 4471 remain");

    let audit: Vec<AuditRow> = my
        .query(format!(
            "SELECT seq, id, op, CAST(status AS CHAR), CAST(amount AS CHAR) FROM {MY_DB}.orders_audit ORDER BY seq"
        ))
        .await
        .expect("reading the audit table");
    eprintln!("e2e: sink audit trail:");
    for row in &audit {
        eprintln!("  {row:?}");
    }

    let mut sink: BTreeMap<i64, Vec<(String, State)>> = BTreeMap::new();
    for (_, id, op, status, amount) in &audit {
        let state = match op.as_str() {
            "delete" => State::Absent,
            _ => present(
                status.as_deref().expect("audited status"),
                amount.as_deref().expect("audited amount"),
            ),
        };
        sink.entry(*id).or_default().push((op.clone(), state));
    }

    let untouched: Vec<&i64> = sink.keys().filter(|k| !source.contains_key(k)).collect();
    assert!(
        untouched.is_empty(),
        "the sink wrote keys the source never changed: {untouched:?}"
    );
    for (key, history) in &source {
        let events = sink.get(key).cloned().unwrap_or_default();
        let mut states: Vec<State> = events.iter().map(|(_, s)| s.clone()).collect();
        // Re-applying the same state (an idempotent replay) is not a step back.
        states.dedup();
        assert!(
            is_subsequence(&states, history),
            "key {key}: the sink's states {states:?} are not an in-order subsequence of the \
             source's {history:?}"
        );
        let last_source = history.last().unwrap();
        if let Some(last_sink) = states.last() {
            assert_eq!(last_sink, last_source, "key {key}: final state");
        }
    }
    for key in [2210, 4472] {
        let last_op = sink
            .get(&key)
            .and_then(|events| events.last())
            .map(|(op, _)| op.as_str());
        assert_eq!(
            last_op,
            Some("delete"),
            "key {key}: the last change the sink made should be a delete; audit: {:?}",
            sink.get(&key)
        );
    }
    assert!(
        sink.get(&4471).is_some_and(|e| !e.is_empty()),
        "key 4471 was never written to the sink"
    );

    z.terminate_cleanly(Duration::from_secs(15));
}
