//! The PostgreSQL sink's write path against a throwaway cluster: rows and checkpoint land in
//! one transaction with every value exactly as PostgreSQL itself would parse the source's
//! text, replays converge, a connection killed mid-batch leaves nothing behind and the retry
//! converges, bad rows are classified and named by key, inserts of keys the sink already has
//! are upserted, a lane-count change restarts every lane from the lowest checkpoint, and the
//! durable frontier (for sources without an upstream cursor) needs every lane.
//! Table checks and `create_tables`: `tests/pg_sink_tables.rs`.

mod common;
mod e2e;

use std::sync::Arc;
use std::time::Duration;

use common::changes::{change, claimed, delete, open, pos, upsert};
use e2e::pg::fixtures::{
    DB, ORDERS_DDL, apply, checkpoints, col, options, order_literal, order_row, orders, rows,
    server, table,
};
use zipline::change::{Change, Op, Value};
use zipline::error::ErrorClass;
use zipline::sink::postgres::PostgresConnector;
use zipline::sink::{Batch, CheckpointStore, SinkConnector};

#[tokio::test]
async fn batches_land_exactly_with_their_checkpoint_and_replays_converge() {
    let pg = server(ORDERS_DDL);
    let connector = claimed(PostgresConnector::new(options(&pg))).await;
    let t = orders();
    connector
        .check_tables(std::slice::from_ref(&t))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    let mut lane = open(&connector, 0, 2).await;
    assert_eq!(lane.checkpoint(), None);

    let tricky = "it's a \\ backslash, a quote \" and 🐢";
    let batch = Batch {
        lane: 0,
        changes: vec![
            upsert(&t, pos(100, 1), order_row(1, tricky, 5)),
            upsert(&t, pos(100, 2), order_row(2, "two", 6)),
            upsert(&t, pos(100, 3), order_row(3, "three", 7)),
            delete(&t, pos(101, 1), vec![Value::Int4(3)]),
            upsert(&t, pos(101, 2), order_row(2, "two again", 8)),
        ],
        ..Batch::default()
    };
    lane.apply(&batch)
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(lane.checkpoint(), Some(pos(101, 2)));
    pg.psql(
        DB,
        &format!(
            "INSERT INTO expected VALUES {}, {}",
            order_literal(1, tricky, 5),
            order_literal(2, "two again", 8)
        ),
    );
    let expected = rows(&pg, "expected");
    assert_eq!(rows(&pg, "orders"), expected);
    assert_eq!(checkpoints(&pg), "orders-pipe|pg-out|0|2|101|2|0");

    // The very same batch again (a retry after a lost COMMIT reply) converges.
    lane.apply(&batch)
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(rows(&pg, "orders"), expected);

    // A reopened lane resumes from the committed checkpoint.
    drop(lane);
    let mut lane = open(&connector, 0, 2).await;
    assert_eq!(lane.checkpoint(), Some(pos(101, 2)));

    // An update that leaves a TOASTed column unchanged keeps the stored value.
    let mut toast = order_row(1, "", 50);
    toast[1] = Value::Unchanged;
    apply(&mut lane, vec![upsert(&t, pos(102, 1), toast)]).await;
    assert_eq!(
        pg.psql(DB, "SELECT note, qty FROM orders WHERE id = 1"),
        format!("{tricky}|50")
    );

    // A key-changing update moves the row.
    let moved = change(
        &t,
        pos(103, 1),
        Op::Update,
        vec![Value::Int4(20)],
        Some(vec![Value::Int4(2)]),
        order_row(20, "moved", 9),
    );
    apply(&mut lane, vec![moved]).await;
    assert_eq!(pg.psql(DB, "SELECT id FROM orders ORDER BY id"), "1\n20");

    // A key change that leaves a TOASTed column unchanged (alone in its batch, as the lane
    // worker sends it) moves the stored row and keeps that column.
    let mut values = order_row(21, "", 10);
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
        pg.psql(DB, "SELECT id, note, qty FROM orders ORDER BY id"),
        format!("1|{tricky}|50\n21|moved|10")
    );

    // Truncate removes every row and moves the checkpoint, atomically.
    lane.truncate(&t, pos(105, 1))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(pg.psql(DB, "SELECT count(*) FROM orders"), "0");
    assert_eq!(lane.checkpoint(), Some(pos(105, 1)));
    assert_eq!(checkpoints(&pg), "orders-pipe|pg-out|0|2|105|1|0");
}

#[tokio::test]
async fn a_connection_killed_mid_batch_leaves_nothing_and_the_retry_converges() {
    let pg = server(&format!(
        "{ORDERS_DDL}; CREATE TABLE audit (id int PRIMARY KEY, what varchar(20));
         INSERT INTO orders (id, qty) VALUES (1, 0);"
    ));
    let connector = claimed(PostgresConnector::new(options(&pg))).await;
    let t = orders();
    let audit = table(
        "audit",
        vec![col("id", 23, -1, true), col("what", 1043, 24, false)],
    );
    connector
        .check_tables(&[Arc::clone(&t), Arc::clone(&audit)])
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    let mut lane = open(&connector, 0, 1).await;

    // Another session locks row 1, so the batch stops at its upsert of orders.
    let locker = pg.client(DB).await;
    locker
        .batch_execute("BEGIN; SELECT id FROM orders WHERE id = 1 FOR UPDATE")
        .await
        .unwrap();
    let batch = Batch {
        lane: 0,
        changes: vec![
            upsert(
                &audit,
                pos(200, 1),
                vec![Value::Int4(1), Value::Text("first".into())],
            ),
            upsert(&t, pos(200, 2), order_row(1, "locked", 1)),
        ],
        ..Batch::default()
    };
    let admin = pg.client(DB).await;
    let killer = async {
        // Wait until the lane's upsert waits for the lock, then end its backend.
        for _ in 0..500 {
            let killed: Vec<bool> = admin
                .query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE application_name = 'zipline' AND wait_event_type = 'Lock' \
                     AND query LIKE 'INSERT INTO \"public\".\"orders\"%'",
                    &[],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            if killed == [true] {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the lane's upsert never showed up waiting for the lock");
    };
    let (result, ()) = tokio::join!(lane.apply(&batch), killer);
    let err = result.expect_err("the killed connection must fail the batch");
    assert_eq!(err.class, ErrorClass::Transient, "{}", err.report());
    assert!(
        err.report()
            .starts_with("sink pg-out: upserting 1 row into \"public\".\"orders\""),
        "{}",
        err.report()
    );
    assert!(err.report().contains("57P01"), "{}", err.report());
    assert_eq!(lane.checkpoint(), None);
    locker.batch_execute("ROLLBACK").await.unwrap();

    // Nothing of the batch is visible: not even the statement that had succeeded.
    assert_eq!(pg.psql(DB, "SELECT count(*) FROM audit"), "0");
    assert_eq!(
        pg.psql(DB, "SELECT count(*) FROM _zipline_checkpoints"),
        "0"
    );

    lane.reconnect()
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    lane.apply(&batch)
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(pg.psql(DB, "SELECT id, what FROM audit"), "1|first");
    assert_eq!(
        pg.psql(DB, "SELECT note FROM orders WHERE id = 1"),
        "locked"
    );
    assert_eq!(checkpoints(&pg), "orders-pipe|pg-out|0|1|200|2|0");
}

#[tokio::test]
async fn bad_rows_are_definite_name_their_key_and_leave_the_lane_usable() {
    let pg = server(
        "CREATE TABLE tags (id int PRIMARY KEY, name varchar(5) NOT NULL);\n         CREATE TABLE stamps (id int PRIMARY KEY, at timestamp)",
    );
    let connector = claimed(PostgresConnector::new(options(&pg))).await;
    let tags = table(
        "tags",
        vec![col("id", 23, -1, true), col("name", 1043, 9, false)],
    );
    connector
        .check_tables(std::slice::from_ref(&tags))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    let mut lane = open(&connector, 0, 1).await;
    let row = |id, name: &str| vec![Value::Int4(id), Value::Text(name.into())];
    let mut changes: Vec<Arc<Change>> = (1..=40)
        .map(|id| upsert(&tags, pos(300, id as u32), row(id, "ok")))
        .collect();
    changes[26] = upsert(&tags, pos(300, 27), row(27, "far too long"));
    let bad = Batch {
        lane: 0,
        changes,
        ..Batch::default()
    };
    let err = lane.apply(&bad).await.expect_err("too long for varchar(5)");
    assert_eq!(err.class, ErrorClass::Definite, "{}", err.report());
    assert!(
        err.report()
            .starts_with("sink pg-out: upserting 40 rows into \"public\".\"tags\"")
            && err.report().contains("22001")
            && err.report().contains("(row key (id)=(27))"),
        "{}",
        err.report()
    );
    assert_eq!(pg.psql(DB, "SELECT count(*) FROM tags"), "0");

    // A NULL into a NOT NULL column: PostgreSQL names the column.
    let null = Batch {
        lane: 0,
        changes: vec![upsert(
            &tags,
            pos(300, 50),
            vec![Value::Int4(9), Value::Null],
        )],
        ..Batch::default()
    };
    let err = lane.apply(&null).await.expect_err("NULL name");
    assert_eq!(err.class, ErrorClass::Definite, "{}", err.report());
    assert!(
        err.report().contains("23502")
            && err.report().contains("(column \"name\")")
            && err.report().contains("(row key (id)=(9))"),
        "{}",
        err.report()
    );

    // A value with no binary form (a timestamp beyond PostgreSQL's range) is refused before
    // it is sent; the statement before it in the same transaction is not committed either.
    let stamps = table(
        "stamps",
        vec![col("id", 23, -1, true), col("at", 1114, -1, false)],
    );
    let out_of_range = Batch {
        lane: 0,
        changes: vec![
            upsert(&tags, pos(300, 60), row(60, "fine")),
            upsert(
                &stamps,
                pos(300, 61),
                vec![Value::Int4(61), Value::Timestamp(i64::MIN + 1)],
            ),
        ],
        ..Batch::default()
    };
    let err = lane.apply(&out_of_range).await.expect_err("out of range");
    assert_eq!(err.class, ErrorClass::Definite, "{}", err.report());
    assert!(
        err.report()
            .starts_with("sink pg-out: upserting 1 row into \"public\".\"stamps\"")
            && err.report().contains("out of PostgreSQL's range")
            && err.report().contains("(row key (id)=(61))"),
        "{}",
        err.report()
    );
    assert_eq!(pg.psql(DB, "SELECT count(*) FROM tags"), "0");

    // The lane still works without a reconnect.
    apply(&mut lane, vec![upsert(&tags, pos(300, 70), row(1, "ok"))]).await;
    assert_eq!(pg.psql(DB, "SELECT name FROM tags WHERE id = 1"), "ok");
}

#[tokio::test]
async fn a_lane_count_change_restarts_every_lane_from_the_lowest_checkpoint() {
    let pg = server(ORDERS_DDL);
    let connector = claimed(PostgresConnector::new(options(&pg))).await;
    let t = orders();
    connector
        .check_tables(std::slice::from_ref(&t))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    for (lane, at) in [(0, pos(500, 1)), (1, pos(400, 7))] {
        let mut sink = open(&connector, lane, 2).await;
        sink.apply(&Batch {
            lane,
            changes: vec![upsert(&t, at, order_row(lane as i32, "x", 1))],
            ..Batch::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    }
    // Another pipeline's rows are left alone.
    pg.psql(
        DB,
        "INSERT INTO _zipline_checkpoints (pipeline, connector, lane, lanes, lsn, ordinal) \
         VALUES ('other', 'pg-out', 0, 1, 1, 1)",
    );

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
        checkpoints(&pg),
        "orders-pipe|pg-out|0|3|400|7|0\n\
         orders-pipe|pg-out|1|3|400|7|0\n\
         orders-pipe|pg-out|2|3|400|7|0\n\
         other|pg-out|0|1|1|1|0"
    );
    drop((a, b, c));

    // Back to one lane after lane 1 of 3 lost its row (never committed): replay everything.
    pg.psql(
        DB,
        "DELETE FROM _zipline_checkpoints WHERE pipeline = 'orders-pipe' AND lane = 1",
    );
    let lane = open(&connector, 0, 1).await;
    assert_eq!(lane.checkpoint(), None);
    assert_eq!(checkpoints(&pg), "other|pg-out|0|1|1|1|0");
}

#[tokio::test]
async fn inserts_of_keys_the_sink_has_are_upserted_and_other_conflicts_are_definite() {
    let pg = server(
        "CREATE TABLE people (id int PRIMARY KEY, email text UNIQUE, name text);
         INSERT INTO people VALUES (1, 'a@x', 'stale'), (9, 'taken@x', 'other');",
    );
    let connector = claimed(PostgresConnector::new(options(&pg))).await;
    let people = table(
        "people",
        vec![
            col("id", 23, -1, true),
            col("email", 25, -1, false),
            col("name", 25, -1, false),
        ],
    );
    connector
        .check_tables(std::slice::from_ref(&people))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    let mut lane = open(&connector, 0, 1).await;
    let insert = |at, id: i32, email: &str, name: &str| {
        let values = vec![
            Value::Int4(id),
            Value::Text(email.into()),
            Value::Text(name.into()),
        ];
        change(&people, at, Op::Insert, vec![Value::Int4(id)], None, values)
    };
    // Key 1 is already in the sink (a replay, or a sink that was not empty): the plain insert
    // meets it and the batch is written again with upserts.
    apply(
        &mut lane,
        vec![
            insert(pos(1, 1), 1, "a@x", "fresh"),
            insert(pos(1, 2), 2, "b@x", "new"),
        ],
    )
    .await;
    assert_eq!(
        pg.psql(DB, "SELECT id, email, name FROM people ORDER BY id"),
        "1|a@x|fresh\n2|b@x|new\n9|taken@x|other"
    );
    // A conflict on another unique index is the data's fault, upsert or not.
    let err = lane
        .apply(&Batch {
            lane: 0,
            changes: vec![
                insert(pos(2, 1), 3, "c@x", "ok"),
                insert(pos(2, 2), 4, "taken@x", "dup"),
            ],
            ..Batch::default()
        })
        .await
        .expect_err("email taken");
    assert_eq!(err.class, ErrorClass::Definite, "{}", err.report());
    assert!(
        err.report().contains("23505")
            && err.report().contains("people_email_key")
            && err.report().contains("(row key (id)=(4))"),
        "{}",
        err.report()
    );
    assert_eq!(pg.psql(DB, "SELECT count(*) FROM people"), "3");
    assert_eq!(lane.checkpoint(), Some(pos(1, 2)));
}

#[tokio::test]
async fn durable_frontier_needs_every_lane_and_advances_only_upwards() {
    let pg = server(ORDERS_DDL);
    let connector = claimed(PostgresConnector::new(options(&pg))).await;
    let t = orders();
    connector
        .check_tables(std::slice::from_ref(&t))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    let frontier = |lanes| connector.durable_frontier(lanes);
    assert_eq!(frontier(2).await.unwrap(), None, "nothing committed yet");
    let mut lane0 = open(&connector, 0, 2).await;
    apply(
        &mut lane0,
        vec![upsert(&t, pos(500, 1), order_row(1, "a", 1))],
    )
    .await;
    assert_eq!(frontier(2).await.unwrap(), None, "lane 1 never committed");
    let mut lane1 = open(&connector, 1, 2).await;
    apply(
        &mut lane1,
        vec![upsert(&t, pos(400, 7), order_row(2, "b", 1))],
    )
    .await;
    assert_eq!(frontier(2).await.unwrap(), Some(pos(400, 7)));

    // Everything up to 450#1 is durable everywhere: idle lanes are raised, never lowered.
    connector
        .advance_frontier(2, pos(450, 1))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(
        checkpoints(&pg),
        "orders-pipe|pg-out|0|2|500|1|0\norders-pipe|pg-out|1|2|450|1|0"
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
        pg.psql(
            DB,
            "SELECT string_agg(lane || ':' || lsn || '#' || ordinal, ' ' ORDER BY lane) \
             FROM _zipline_checkpoints"
        ),
        "0:600#2 1:600#2 2:600#2"
    );
}

/// One live instance per pipeline: a second claim is refused naming the holder; once the
/// holder stops heartbeating another instance takes the sink over, and from then on every
/// write of the old one fails without leaving anything behind.
#[tokio::test]
async fn a_second_claim_is_refused_and_a_takeover_fences_the_old_writer() {
    use zipline::checkpoint::Holder;
    let pg = server(ORDERS_DDL);
    let t = orders();
    let first = PostgresConnector::new(options(&pg));
    let mut lease = first
        .claim(&Holder::this_process(), Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    first
        .check_tables(std::slice::from_ref(&t))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    let mut lane = open(&first, 0, 1).await;
    let batch = |id: i32, at| Batch {
        lane: 0,
        changes: vec![upsert(&t, at, order_row(id, "x", 1))],
        ..Batch::default()
    };
    lane.apply(&batch(1, pos(100, 1)))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));

    let other = Holder {
        pid: 4242,
        host: "elsewhere".into(),
    };
    let second = PostgresConnector::new(options(&pg));
    let Err(refused) = second.claim(&other, Duration::from_secs(30)).await else {
        panic!("a second live claim is refused");
    };
    assert_eq!(refused.class, ErrorClass::Fatal);
    let me = Holder::this_process();
    assert!(
        refused.message.starts_with(&format!(
            "sink pg-out: pipeline orders-pipe is already running: process {} on host {} \
             has held it since ",
            me.pid, me.host
        )),
        "{}",
        refused.message
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
        fenced.message.contains(
            "another instance of pipeline orders-pipe took over this sink (process 4242 on \
             host elsewhere since "
        ),
        "{}",
        fenced.message
    );
    assert_eq!(
        pg.psql(DB, "SELECT string_agg(id::text, ',') FROM orders"),
        "1"
    );
    assert_eq!(checkpoints(&pg), "orders-pipe|pg-out|0|1|100|1|0");
    let renewed = lease.renew().await.expect_err("the old claim is gone");
    assert_eq!(renewed.class, ErrorClass::Fatal, "{}", renewed.message);

    let mut lane = open(&second, 0, 1).await;
    lane.apply(&batch(2, pos(200, 1)))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(
        pg.psql(
            DB,
            "SELECT string_agg(id::text, ',' ORDER BY id) FROM orders"
        ),
        "1,2"
    );
}

/// Dead letters commit with the batch and its checkpoint (once, however often the batch is
/// retried), park their key for the lane that owns it, are superseded by a truncate of their
/// table, and `replay` applies them and removes them in one transaction.
#[tokio::test]
async fn dead_letters_commit_with_the_batch_park_their_key_and_replay() {
    use zipline::sink::DeadLetter;
    let pg = server(ORDERS_DDL);
    let mut opts = options(&pg);
    opts.create_dead_letter_table = true;
    let connector = claimed(PostgresConnector::new(opts)).await;
    let t = orders();
    connector
        .check_tables(std::slice::from_ref(&t))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    let dead = |id: i32, at| DeadLetter {
        change: upsert(&t, at, order_row(id, "bad", 1)),
        reason: format!("row {id} was refused"),
        code: Some("22001".into()),
    };
    let batch = Batch {
        lane: 0,
        changes: vec![upsert(&t, pos(100, 1), order_row(1, "one", 1))],
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
    assert_eq!(
        pg.psql(DB, "SELECT string_agg(id::text, ',') FROM orders"),
        "1"
    );
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
    lane.replay(&[Arc::new(change)], &[two.id])
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(
        pg.psql(
            DB,
            "SELECT string_agg(id::text, ',' ORDER BY id) FROM orders"
        ),
        "1,2"
    );
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

#[tokio::test]
async fn a_sink_table_created_again_empty_is_named_and_one_holding_rows_is_not() {
    use zipline::checkpoint::TableRecord;
    let pg = server(ORDERS_DDL);
    let t = orders();
    let sink = claimed(PostgresConnector::new(options(&pg))).await;
    sink.check_tables(std::slice::from_ref(&t))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    let mut lane = open(&sink, 0, 1).await;
    lane.apply(&Batch {
        lane: 0,
        changes: vec![upsert(&t, pos(100, 1), order_row(1, "x", 1))],
        ..Batch::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{}", e.report()));
    let record = TableRecord {
        table: (*t).clone(),
        relation: 16400,
        since: pos(100, 1).lsn,
    };
    sink.record_table(&record)
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    let recreated = || async {
        sink.recreated_tables()
            .await
            .unwrap_or_else(|e| panic!("{}", e.report()))
    };
    assert!(recreated().await.is_empty(), "the table is as recorded");

    // Created again, holding rows (restored by hand): nothing is missing, and its new
    // identity is recorded.
    pg.psql(
        DB,
        "CREATE TABLE keep AS SELECT * FROM orders; DROP TABLE orders; \
         CREATE TABLE orders (LIKE keep INCLUDING ALL); ALTER TABLE orders ADD PRIMARY KEY (id); \
         INSERT INTO orders SELECT * FROM keep;",
    );
    assert!(
        recreated().await.is_empty(),
        "a table holding rows is not lost"
    );

    // Created again empty: the rows applied to it are gone.
    pg.psql(
        DB,
        "DROP TABLE orders; CREATE TABLE orders (LIKE keep INCLUDING ALL);",
    );
    assert_eq!(recreated().await, vec!["public.orders".to_owned()]);
}
