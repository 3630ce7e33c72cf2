//! PostgreSQL → PostgreSQL: the seed's trace (key swaps and chains are in `contract`).
//!
//! A trigger on the sink's `orders` records every row change the sink makes, in order. For
//! each key, the states the sink went through must be an in-order subsequence of the states
//! the source went through: a batch may skip intermediate states (coalescing), but the sink
//! must never go back to an older state, never invent one, and never touch a key the source
//! did not change.

use crate::e2e;

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::pg::{PgFixture, SINK_DB, pg_pipeline_yaml, wait_converged, wait_snapshot_complete};
use e2e::{CONVERGE_TIMEOUT, PG_DB, PipelineOpts, wait_streaming};

/// Rows on both sides before Zipline starts. The initial snapshot copies them again (rows
/// already there are upserted: the audit sees updates to the same values); the audit below
/// starts once Zipline streams.
const SEED: &str = "INSERT INTO orders VALUES
    (1, 'Ada', 10.00, 'new', '2024-01-02 03:04:05.123456+00', true, 'first'),
    (2, 'O''Brien', 0.01, 'paid', '1999-12-31 23:59:59.999999+00', false, NULL),
    (3, NULL, NULL, NULL, NULL, NULL, NULL),
    (2210, 'Zoë', 99.99, 'seed', '2023-06-15 12:00:00+00', true, 'to be deleted')";

/// Every row change on the sink's `orders`, numbered in the order the sink made them.
const AUDIT: &str = "
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

/// The trace: (key, SQL, state of the key afterwards as `status/amount`, `None` = absent).
const TRACE: &[(i64, &str, Option<&str>)] = &[
    (
        4471,
        "INSERT INTO orders VALUES (4471, 'Grace', 10.00, 'new', '2024-02-29 23:59:59.000001+00', false, 'leap')",
        Some("new/10.00"),
    ),
    (
        4471,
        "UPDATE orders SET status = 'paid', amount = 12.50 WHERE id = 4471",
        Some("paid/12.50"),
    ),
    (2210, "DELETE FROM orders WHERE id = 2210", None),
    (
        4472,
        "INSERT INTO orders VALUES (4472, 'Linus', 5.00, 'new', now(), true, NULL)",
        Some("new/5.00"),
    ),
    (
        4472,
        "UPDATE orders SET status = 'paid', amount = 7.25, note = 'paid late' WHERE id = 4472",
        Some("paid/7.25"),
    ),
    (
        4471,
        "UPDATE orders SET status = 'shipped', note = NULL WHERE id = 4471",
        Some("shipped/12.50"),
    ),
    (4472, "DELETE FROM orders WHERE id = 4472", None),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_trace_is_replayed_in_order_per_key() {
    let mut fx = PgFixture::start();
    fx.src.psql(PG_DB, SEED);
    fx.sink.psql(SINK_DB, SEED);
    fx.sink.psql(SINK_DB, AUDIT);
    fx.write_pipeline(&pg_pipeline_yaml(&PipelineOpts::default()));
    let (src, sink) = (fx.src_client().await, fx.sink_client().await);
    let mut z = fx.apply();
    wait_streaming(&src, &mut z, Duration::from_secs(30)).await;
    wait_snapshot_complete(&sink, &mut z, Duration::from_secs(30)).await;
    // What the snapshot did is not part of the trace.
    sink.batch_execute("DELETE FROM orders_audit")
        .await
        .expect("clearing the audit of the snapshot");

    let mut history: BTreeMap<i64, Vec<Option<String>>> = BTreeMap::new();
    history.insert(2210, vec![Some("seed/99.99".into())]);
    history.insert(4471, vec![None]);
    history.insert(4472, vec![None]);
    for &(key, sql, after) in TRACE {
        src.batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        history
            .get_mut(&key)
            .unwrap()
            .push(after.map(str::to_owned));
        // Spaced out so most steps reach the sink in batches of their own.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let rows = wait_converged(&src, &sink, "orders", Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_eq!(rows, 4, "rows 1, 2, 3 and 4471 remain");

    let audit = sink
        .query("SELECT id, op, state FROM orders_audit ORDER BY seq", &[])
        .await
        .expect("reading the audit table");
    let mut seen: BTreeMap<i64, Vec<(String, Option<String>)>> = BTreeMap::new();
    for r in &audit {
        let (id, op, state): (i64, String, Option<String>) = (r.get(0), r.get(1), r.get(2));
        eprintln!("  audit: {id} {op} {state:?}");
        seen.entry(id).or_default().push((op, state));
    }
    let strangers: Vec<&i64> = seen.keys().filter(|k| !history.contains_key(k)).collect();
    assert!(
        strangers.is_empty(),
        "the sink wrote keys the source never changed: {strangers:?}"
    );
    for (key, states) in &history {
        let events = seen.get(key).cloned().unwrap_or_default();
        let mut sink_states: Vec<Option<String>> = events.iter().map(|(_, s)| s.clone()).collect();
        // Re-applying the same state (an idempotent replay) is not a step back.
        sink_states.dedup();
        let mut rest = states.iter();
        assert!(
            sink_states.iter().all(|s| rest.any(|t| t == s)),
            "key {key}: the sink's states {sink_states:?} are not an in-order subsequence of \
             the source's {states:?}"
        );
        if let Some(last) = sink_states.last() {
            assert_eq!(last, states.last().unwrap(), "key {key}: final state");
        }
    }
    for key in [2210, 4472] {
        let last = seen
            .get(&key)
            .and_then(|e| e.last())
            .map(|(op, _)| op.as_str());
        assert_eq!(last, Some("delete"), "key {key}: last sink change");
    }
    assert!(seen.contains_key(&4471), "key 4471 never reached the sink");
    z.terminate_cleanly(Duration::from_secs(15));
}
