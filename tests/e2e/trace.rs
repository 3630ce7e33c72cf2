//! The seed's trace: a short, hand-written history on a few keys on top of rows both sides
//! already have, audited by triggers on the sink: per key, the states the sink went through
//! are an in-order subsequence of the source's (a batch may skip states, but the sink never
//! goes back, never invents one, and never touches a key the source did not change). Run by
//! the pipeline contract on every sink, and over TLS by `tests/e2e_tls.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::sinks::SinkFixture;
use super::{CONVERGE_TIMEOUT, PG_DB, PipelineOpts, wait_streaming};

/// The seed rows on the source; the sink has the same ([`SinkFixture::SEED`]). The initial
/// snapshot copies them again; the audit starts once Zipline streams.
const SEED: &str = "INSERT INTO orders VALUES
    (1, 'Ada', 10.00, 'new', '2024-01-02 03:04:05.123456+00', true, 'first'),
    (2, 'O''Brien', 0.01, 'paid', '1999-12-31 23:59:59.999999+00', false, NULL),
    (3, NULL, NULL, NULL, NULL, NULL, NULL),
    (2210, 'Zoë', 99.99, 'seed', '2023-06-15 12:00:00+00', true, 'to be deleted')";

/// The trace: (key, SQL, state of the key afterwards as `status/amount`, `None` = absent).
/// One transaction each.
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

/// Runs the seed's trace on `fx` (both servers started, `orders` on each side, nothing
/// else) with the pipeline written from `opts`, and audits the sink's row changes.
pub async fn seed_trace<F: SinkFixture>(mut fx: F, opts: &PipelineOpts) {
    fx.source().psql(PG_DB, SEED);
    fx.sink_sql(F::SEED);
    fx.sink_sql(F::AUDIT);
    fx.write(opts);
    let src = fx.source_client().await;
    let mut sink = fx.checker().await;
    // The seed rows render identically on both sides before anything runs.
    F::assert_equal_now(&src, &mut sink).await;

    let mut z = fx.apply();
    wait_streaming(&src, &mut z, Duration::from_secs(30)).await;
    F::wait_snapshot_complete(&mut sink, &mut z, Duration::from_secs(30)).await;
    // What the snapshot did is not part of the trace.
    F::clear_audit(&mut sink).await;
    F::assert_equal_now(&src, &mut sink).await;

    // Source history per key, starting with the state before the trace.
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
        // Spaced out so that most steps reach the sink in batches of their own (the sink may
        // still coalesce; the subsequence check allows that).
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let rows = F::wait_converged(&src, &mut sink, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_eq!(rows, 4, "rows 1, 2, 3 and 4471 remain");

    let mut seen: BTreeMap<i64, Vec<(String, Option<String>)>> = BTreeMap::new();
    eprintln!("e2e: sink audit trail:");
    for (id, op, state) in F::audit(&mut sink).await {
        eprintln!("  {id} {op} {state:?}");
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
        assert_eq!(
            last,
            Some("delete"),
            "key {key}: the last change the sink made should be a delete; audit: {:?}",
            seen.get(&key)
        );
    }
    assert!(
        seen.get(&4471).is_some_and(|e| !e.is_empty()),
        "key 4471 was never written to the sink"
    );
    z.terminate_cleanly(Duration::from_secs(15));
}
