//! The sink contract: what every sink does with batches, written once against
//! [`SinkUnderTest`] and run against each sink (`contract::mysql::*`, `contract::postgres::*`).
//!
//! Rows and checkpoint land in one transaction, replays converge, a connection killed
//! mid-batch leaves nothing behind and the retry converges, a bad row is definite and named by
//! its key, a lane-count change restarts every lane from the lowest checkpoint, the durable
//! frontier needs every lane, dead letters commit with their batch, and one live instance
//! holds a pipeline's sink at a time.

use std::sync::Arc;
use std::time::Duration;

use zipline::change::{Change, Op, Value};
use zipline::checkpoint::Holder;
use zipline::error::ErrorClass;
use zipline::sink::{Batch, CheckpointStore, DeadLetter, SinkConnector};

use crate::common::changes::{apply, change, claimed, delete, open, pos, upsert};
use crate::common::sinks::mysql::MysqlUnderTest;
use crate::common::sinks::postgres::PostgresUnderTest;
use crate::common::sinks::{PIPELINE, SinkUnderTest, col, table};

/// Emits one `#[tokio::test]` per scenario for each `module: SinkUnderTest` pair.
macro_rules! contract {
    ($($sink:ident: $under_test:ty),+ $(,)?) => {$(
        mod $sink {
            use super::*;

            contract!(@tests $under_test;
                batches_land_with_their_checkpoint_and_replays_converge,
                a_connection_killed_mid_batch_leaves_nothing_and_the_retry_converges,
                bad_rows_are_definite_name_their_key_and_leave_the_lane_usable,
                a_lane_count_change_restarts_every_lane_from_the_lowest_checkpoint,
                durable_frontier_needs_every_lane_and_advances_only_upwards,
                dead_letters_commit_with_the_batch_park_their_key_and_replay,
                a_second_claim_is_refused_and_a_takeover_fences_the_old_writer,
            );
        }
    )+};
    (@tests $under_test:ty; $($scenario:ident),+ $(,)?) => {$(
        #[tokio::test]
        async fn $scenario() {
            super::$scenario::<$under_test>().await;
        }
    )+};
}

contract!(
    mysql: MysqlUnderTest<false>,
    mysql_bulk: MysqlUnderTest<true>,
    postgres: PostgresUnderTest,
);

/// `connector`'s tables checked, or a panic with its message.
async fn checked<S: SinkUnderTest>(
    connector: &S::Connector,
    tables: &[Arc<zipline::change::Table>],
) {
    connector
        .check_tables(tables)
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
}

/// A claimed connector whose `orders` is checked.
async fn orders_connector<S: SinkUnderTest>(sink: &S) -> S::Connector {
    let connector = claimed(sink.connector()).await;
    checked::<S>(&connector, &[S::orders()]).await;
    connector
}

async fn batches_land_with_their_checkpoint_and_replays_converge<S: SinkUnderTest>() {
    let sink = S::start("");
    let connector = orders_connector(&sink).await;
    let t = S::orders();
    let mut lane = open(&connector, 0, 2).await;
    assert_eq!(lane.checkpoint(), None);

    let tricky = S::TRICKY;
    let batch = Batch::new(
        0,
        vec![
            upsert(&t, pos(100, 1), S::order_row(1, tricky, 5)),
            upsert(&t, pos(100, 2), S::order_row(2, "two", 6)),
            upsert(&t, pos(100, 3), S::order_row(3, "three", 7)),
            delete(&t, pos(101, 1), vec![Value::Int4(3)]),
            upsert(&t, pos(101, 2), S::order_row(2, "two again", 8)),
        ],
    );
    lane.apply(&batch)
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(lane.checkpoint(), Some(pos(101, 2)));
    // Every value exactly as the sink would store the same values written in SQL.
    let expected = sink.expected_orders_rows(&[(1, tricky, 5), (2, "two again", 8)]);
    assert_eq!(sink.orders_rows(), expected);
    assert_eq!(
        sink.checkpoints(),
        S::checkpoint_row(PIPELINE, 0, 2, 101, 2)
    );

    // The very same batch again (a retry after a lost COMMIT reply) converges.
    lane.apply(&batch)
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(sink.orders_rows(), expected);

    // A reopened lane resumes from the committed checkpoint.
    drop(lane);
    let mut lane = open(&connector, 0, 2).await;
    assert_eq!(lane.checkpoint(), Some(pos(101, 2)));

    // An update that leaves a TOASTed column unchanged keeps the stored value.
    let mut toast = S::order_row(1, "", 50);
    toast[1] = Value::Unchanged;
    apply(&mut lane, vec![upsert(&t, pos(102, 1), toast)]).await;
    assert_eq!(
        sink.order_notes(),
        format!("1\t{tricky}\t50\n2\ttwo again\t8")
    );

    // A key-changing update moves the row.
    let moved = change(
        &t,
        pos(103, 1),
        Op::Update,
        vec![Value::Int4(20)],
        Some(vec![Value::Int4(2)]),
        S::order_row(20, "moved", 9),
    );
    apply(&mut lane, vec![moved]).await;
    assert_eq!(sink.order_notes(), format!("1\t{tricky}\t50\n20\tmoved\t9"));

    // A key change that leaves a TOASTed column unchanged (alone in its batch, as the lane
    // worker sends it) moves the stored row and keeps that column.
    let mut values = S::order_row(21, "", 10);
    values[1] = Value::Unchanged;
    let toast_move = change(
        &t,
        pos(104, 1),
        Op::Update,
        vec![Value::Int4(21)],
        Some(vec![Value::Int4(20)]),
        values,
    );
    apply(&mut lane, vec![toast_move]).await;
    assert_eq!(
        sink.order_notes(),
        format!("1\t{tricky}\t50\n21\tmoved\t10")
    );

    // Truncate removes every row and moves the checkpoint, atomically.
    lane.truncate(&t, pos(105, 1))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(sink.query("SELECT COUNT(*) FROM orders"), "0");
    assert_eq!(lane.checkpoint(), Some(pos(105, 1)));
    assert_eq!(
        sink.checkpoints(),
        S::checkpoint_row(PIPELINE, 0, 2, 105, 1)
    );
}

async fn a_connection_killed_mid_batch_leaves_nothing_and_the_retry_converges<S: SinkUnderTest>() {
    let sink = S::start("CREATE TABLE audit (id INT PRIMARY KEY, what VARCHAR(20))");
    let connector = claimed(sink.connector()).await;
    let t = S::orders();
    let audit = table(
        "audit",
        vec![col("id", 23, -1, true), col("what", 1043, 24, false)],
    );
    checked::<S>(&connector, &[Arc::clone(&t), Arc::clone(&audit)]).await;
    sink.query("INSERT INTO orders (id, qty) VALUES (1, 0)");
    let mut lane = open(&connector, 0, 1).await;

    // Another session locks row 1, so the batch stops at its upsert of orders, after its
    // upsert of audit succeeded.
    let batch = Batch::new(
        0,
        vec![
            upsert(
                &audit,
                pos(200, 1),
                vec![Value::Int4(1), Value::Text("first".into())],
            ),
            upsert(&t, pos(200, 2), S::order_row(1, "locked", 1)),
        ],
    );
    let err = sink
        .kill_while_waiting(lane.apply(&batch))
        .await
        .expect_err("the killed connection must fail the batch");
    assert_eq!(err.class, ErrorClass::Transient, "{}", err.report());
    assert!(
        err.report().starts_with(&format!(
            "sink {}: upserting 1 row into {}",
            S::CONNECTOR,
            S::quoted("orders")
        )),
        "{}",
        err.report()
    );
    if let Some(code) = S::KILLED_CODE {
        assert!(err.report().contains(code), "{}", err.report());
    }
    assert_eq!(lane.checkpoint(), None);

    // Nothing of the batch is visible: not even the statement that had succeeded.
    assert_eq!(sink.query("SELECT COUNT(*) FROM audit"), "0");
    assert_eq!(sink.query("SELECT COUNT(*) FROM _zipline_checkpoints"), "0");

    lane.reconnect()
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    lane.apply(&batch)
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(sink.query("SELECT id, what FROM audit"), "1\tfirst");
    assert_eq!(sink.query("SELECT note FROM orders WHERE id = 1"), "locked");
    assert_eq!(
        sink.checkpoints(),
        S::checkpoint_row(PIPELINE, 0, 1, 200, 2)
    );
}

async fn bad_rows_are_definite_name_their_key_and_leave_the_lane_usable<S: SinkUnderTest>() {
    let sink = S::start("CREATE TABLE tags (id INT PRIMARY KEY, name VARCHAR(5) NOT NULL)");
    let connector = claimed(sink.connector()).await;
    let tags = table(
        "tags",
        vec![col("id", 23, -1, true), col("name", 1043, 9, false)],
    );
    checked::<S>(&connector, std::slice::from_ref(&tags)).await;
    let mut lane = open(&connector, 0, 1).await;
    let row = |id, name: &str| vec![Value::Int4(id), Value::Text(name.into())];
    let mut changes: Vec<Change> = (1..=40)
        .map(|id| upsert(&tags, pos(300, id as u32), row(id, "ok")))
        .collect();
    changes[26] = upsert(&tags, pos(300, 27), row(27, "far too long"));
    let err = lane
        .apply(&Batch::new(0, changes))
        .await
        .expect_err("too long for VARCHAR(5)");
    assert_eq!(err.class, ErrorClass::Definite, "{}", err.report());
    assert!(
        err.report().starts_with(&format!(
            "sink {}: upserting 40 rows into {}",
            S::CONNECTOR,
            S::quoted("tags")
        )) && S::TOO_LONG_EVIDENCE
            .iter()
            .all(|evidence| err.report().contains(evidence))
            && err.report().contains("(row key (id)=(27))"),
        "{}",
        err.report()
    );
    assert_eq!(sink.query("SELECT COUNT(*) FROM tags"), "0");
    assert_eq!(lane.checkpoint(), None);

    // The lane still works without a reconnect.
    apply(&mut lane, vec![upsert(&tags, pos(300, 70), row(1, "ok"))]).await;
    assert_eq!(sink.query("SELECT id, name FROM tags"), "1\tok");
}

async fn a_lane_count_change_restarts_every_lane_from_the_lowest_checkpoint<S: SinkUnderTest>() {
    let sink = S::start("");
    let connector = orders_connector(&sink).await;
    let t = S::orders();
    for (lane, at) in [(0, pos(500, 1)), (1, pos(400, 7))] {
        let mut open_lane = open(&connector, lane, 2).await;
        open_lane
            .apply(&Batch::new(
                lane,
                vec![upsert(&t, at, S::order_row(lane as i32, "x", 1))],
            ))
            .await
            .unwrap_or_else(|e| panic!("{}", e.report()));
    }
    // Another pipeline's rows are left alone.
    sink.query(&format!(
        "INSERT INTO _zipline_checkpoints (pipeline, connector, lane, lanes, lsn, ordinal) \
         VALUES ('other', '{}', 0, 1, 1, 1)",
        S::CONNECTOR
    ));
    let other = S::checkpoint_row("other", 0, 1, 1, 1);

    // Three lanes now: all start at the lowest position, 400#7.
    let (a, b, c) = tokio::join!(
        open(&connector, 0, 3),
        open(&connector, 1, 3),
        open(&connector, 2, 3)
    );
    for lane in [&a, &b, &c] {
        assert_eq!(lane.checkpoint(), Some(pos(400, 7)));
    }
    assert_eq!(
        sink.checkpoints(),
        [
            S::checkpoint_row(PIPELINE, 0, 3, 400, 7),
            S::checkpoint_row(PIPELINE, 1, 3, 400, 7),
            S::checkpoint_row(PIPELINE, 2, 3, 400, 7),
            other.clone(),
        ]
        .join("\n")
    );
    drop((a, b, c));

    // Back to one lane after lane 1 of 3 lost its row (never committed): replay everything.
    sink.query(&format!(
        "DELETE FROM _zipline_checkpoints WHERE pipeline = '{PIPELINE}' AND lane = 1"
    ));
    let lane = open(&connector, 0, 1).await;
    assert_eq!(lane.checkpoint(), None);
    assert_eq!(sink.checkpoints(), other);
}

async fn durable_frontier_needs_every_lane_and_advances_only_upwards<S: SinkUnderTest>() {
    let sink = S::start("");
    let connector = orders_connector(&sink).await;
    let t = S::orders();
    let frontier = |lanes| connector.durable_frontier(lanes);
    assert_eq!(frontier(2).await.unwrap(), None, "nothing committed yet");
    let mut lane0 = open(&connector, 0, 2).await;
    apply(
        &mut lane0,
        vec![upsert(&t, pos(500, 1), S::order_row(1, "a", 1))],
    )
    .await;
    assert_eq!(frontier(2).await.unwrap(), None, "lane 1 never committed");
    let mut lane1 = open(&connector, 1, 2).await;
    apply(
        &mut lane1,
        vec![upsert(&t, pos(400, 7), S::order_row(2, "b", 1))],
    )
    .await;
    assert_eq!(frontier(2).await.unwrap(), Some(pos(400, 7)));

    // Everything up to 450#1 is durable everywhere: idle lanes are raised, never lowered.
    connector
        .advance_frontier(2, pos(450, 1))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(
        sink.checkpoints(),
        [
            S::checkpoint_row(PIPELINE, 0, 2, 500, 1),
            S::checkpoint_row(PIPELINE, 1, 2, 450, 1),
        ]
        .join("\n")
    );
    assert_eq!(frontier(2).await.unwrap(), Some(pos(450, 1)));
    connector
        .advance_frontier(2, pos(300, 1))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(frontier(2).await.unwrap(), Some(pos(450, 1)));
    // Rows of a third lane are created when the count grows.
    connector
        .advance_frontier(3, pos(600, 2))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(
        sink.query("SELECT lane, lsn, ordinal FROM _zipline_checkpoints ORDER BY lane"),
        "0\t600\t2\n1\t600\t2\n2\t600\t2"
    );
}

/// Dead letters commit with the batch and its checkpoint (once, however often the batch is
/// retried), park their key for the lane that owns it, are superseded by a truncate of their
/// table, and `replay` applies them and removes them in one transaction.
async fn dead_letters_commit_with_the_batch_park_their_key_and_replay<S: SinkUnderTest>() {
    let sink = S::start("");
    let connector = claimed(sink.connector_with_dead_letters()).await;
    let t = S::orders();
    checked::<S>(&connector, std::slice::from_ref(&t)).await;
    let dead = |id: i32, at| DeadLetter {
        change: upsert(&t, at, S::order_row(id, "bad", 1)),
        reason: format!("row {id} was refused"),
        code: Some("22001".into()),
    };
    let batch = Batch {
        lane: 0,
        changes: vec![upsert(&t, pos(100, 1), S::order_row(1, "one", 1))],
        dead_letters: vec![dead(2, pos(100, 2)), dead(3, pos(101, 1))],
        ..Batch::default()
    };
    let mut lane = open(&connector, 0, 1).await;
    lane.apply(&batch)
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    // A retry of the same batch (its COMMIT reply lost) records nothing twice.
    lane.apply(&batch)
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(lane.checkpoint(), Some(pos(101, 1)));
    assert_eq!(sink.query("SELECT id FROM orders ORDER BY id"), "1");
    let listed = connector
        .dead_letters()
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    let summary: Vec<(String, String, Option<String>, String)> = listed
        .iter()
        .map(|r| {
            (
                r.position.clone(),
                r.key.clone(),
                r.code.clone(),
                r.reason.clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "0/64#2".into(),
                "[2]".into(),
                Some("22001".into()),
                "row 2 was refused".into()
            ),
            (
                "0/65#1".into(),
                "[3]".into(),
                Some("22001".into()),
                "row 3 was refused".into()
            ),
        ]
    );
    let parked = open(&connector, 0, 1).await.parked();
    assert_eq!(parked.len(), 2, "{parked:?}");
    assert!(
        parked
            .iter()
            .all(|k| k.table == "public.orders" && (k.key == "[2]" || k.key == "[3]"))
    );

    // Replay row 2: applied and removed together.
    let two = &listed[0];
    let mut tables = Vec::new();
    let change = zipline::transform::json::change_from_json(&two.change, 0, &mut tables)
        .unwrap_or_else(|e| panic!("{e}"));
    lane.replay(&[change], &[two.id])
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(sink.query("SELECT id FROM orders ORDER BY id"), "1\n2");
    assert_eq!(
        lane.checkpoint(),
        Some(pos(101, 1)),
        "replay moves no checkpoint"
    );
    // A truncate of the table supersedes the rest.
    lane.truncate(&t, pos(200, 1))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert!(connector.dead_letters().await.unwrap().is_empty());
}

/// One live instance per pipeline: a second claim is refused naming the holder; once the
/// holder stops heartbeating another instance takes the sink over, and from then on every
/// write of the old one fails without leaving anything behind.
async fn a_second_claim_is_refused_and_a_takeover_fences_the_old_writer<S: SinkUnderTest>() {
    let sink = S::start("");
    let t = S::orders();
    let first = sink.connector();
    let mut lease = first
        .claim(&Holder::this_process(), Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    checked::<S>(&first, std::slice::from_ref(&t)).await;
    let mut lane = open(&first, 0, 1).await;
    let batch = |id: i32, at| Batch::new(0, vec![upsert(&t, at, S::order_row(id, "x", 1))]);
    lane.apply(&batch(1, pos(100, 1)))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));

    let other = Holder {
        pid: 4242,
        host: "elsewhere".into(),
    };
    let second = sink.connector();
    let Err(refused) = second.claim(&other, Duration::from_secs(30)).await else {
        panic!("a second live claim is refused");
    };
    assert_eq!(refused.class, ErrorClass::Fatal);
    let me = Holder::this_process();
    assert!(
        refused.report().starts_with(&format!(
            "sink {}: pipeline {PIPELINE} is already running: process {} on host {} \
             has held it since ",
            S::CONNECTOR,
            me.pid,
            me.host
        )),
        "{}",
        refused.report()
    );

    // A zero lease: the first holder counts as gone, its fence session is ended.
    let taken = second
        .claim(&other, Duration::ZERO)
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(taken.epoch(), lease.epoch() + 1);
    let fenced = lane
        .apply(&batch(2, pos(200, 1)))
        .await
        .expect_err("the old instance's batch is fenced");
    assert_eq!(fenced.class, ErrorClass::Fatal);
    assert!(
        fenced.report().contains(&format!(
            "another instance of pipeline {PIPELINE} took over this sink (process 4242 on \
             host elsewhere since "
        )),
        "{}",
        fenced.report()
    );
    assert_eq!(sink.query("SELECT id FROM orders ORDER BY id"), "1");
    assert_eq!(
        sink.checkpoints(),
        S::checkpoint_row(PIPELINE, 0, 1, 100, 1)
    );
    let renewed = lease.renew().await.expect_err("the old claim is gone");
    assert_eq!(renewed.class, ErrorClass::Fatal, "{}", renewed.report());

    let mut lane = open(&second, 0, 1).await;
    lane.apply(&batch(2, pos(200, 1)))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(sink.query("SELECT id FROM orders ORDER BY id"), "1\n2");
}
