//! The PostgreSQL sink's own scenarios (its contract is `contract::postgres`): a NULL or an
//! out-of-range value is definite and named, inserts of keys the sink already has are
//! upserted while other unique conflicts are definite, and a sink table created again empty
//! is named. The `COPY` path: `postgres_copy`; table checks and `create_tables`:
//! `postgres_tables`.

use crate::common;
use common::changes::{apply, change, claimed, open, pos, upsert};
use common::sinks::PIPELINE;
use common::sinks::postgres::{DB, ORDERS_DDL, col, options, order_row, orders, server, table};
use zipline::change::{Op, Value};
use zipline::error::ErrorClass;
use zipline::sink::postgres::PostgresConnector;
use zipline::sink::{Batch, CheckpointStore, SinkConnector};

/// Besides the contract's too-long value: a NULL into a NOT NULL column names the column, and
/// a value with no binary form is refused before it is sent, with nothing of its transaction
/// committed.
#[tokio::test]
async fn null_and_out_of_range_values_are_definite_and_name_their_key() {
    let pg = server(
        "CREATE TABLE tags (id int PRIMARY KEY, name varchar(5) NOT NULL);\n         CREATE TABLE stamps (id int PRIMARY KEY, at timestamp)",
    );
    let connector = claimed(PostgresConnector::new(PIPELINE, options(&pg))).await;
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
async fn inserts_of_keys_the_sink_has_are_upserted_and_other_conflicts_are_definite() {
    let pg = server(
        "CREATE TABLE people (id int PRIMARY KEY, email text UNIQUE, name text);
         INSERT INTO people VALUES (1, 'a@x', 'stale'), (9, 'taken@x', 'other');",
    );
    let connector = claimed(PostgresConnector::new(PIPELINE, options(&pg))).await;
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
async fn a_sink_table_created_again_empty_is_named_and_one_holding_rows_is_not() {
    use zipline::checkpoint::TableRecord;
    let pg = server(ORDERS_DDL);
    let t = orders();
    let sink = claimed(PostgresConnector::new(PIPELINE, options(&pg))).await;
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
