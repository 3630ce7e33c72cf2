//! The PostgreSQL sink against a throwaway cluster: rows and checkpoint land in one
//! transaction with every value exactly as PostgreSQL itself would parse the source's text,
//! replays converge, a connection killed mid-batch leaves nothing behind and the retry
//! converges, bad tables and bad rows are classified (rows named by key), tables are created
//! with the source's exact types, and a lane-count change restarts every lane from the lowest
//! checkpoint.

mod common;
mod e2e;

use std::sync::Arc;
use std::time::Duration;

use common::Postgres;
use e2e::pg::scram_role;
use zipline::change::{Change, Column, Lsn, Op, Position, Table, Value};
use zipline::error::ErrorClass;
use zipline::sink::postgres::{PostgresConnector, PostgresSinkOptions};
use zipline::sink::{Batch, LaneSink, SinkConnector};

const DB: &str = "replica";

fn options(pg: &Postgres) -> PostgresSinkOptions {
    PostgresSinkOptions {
        connector: "pg-out".into(),
        pipeline: "orders-pipe".into(),
        host: pg.host().into(),
        port: pg.port,
        database: DB.into(),
        user: "postgres".into(),
        password: None,
        schema: None,
        create_tables: false,
        connect_timeout: Duration::from_secs(5),
    }
}

fn col(name: &str, type_oid: u32, type_modifier: i32, is_key: bool) -> Column {
    Column {
        name: name.into(),
        type_oid,
        type_modifier,
        is_key,
    }
}

fn table(name: &str, cols: Vec<Column>) -> Arc<Table> {
    Arc::new(Table::new("public".into(), name.into(), cols))
}

/// A source enum's OID: meaningless on the sink, which casts the text to its own enum.
const SOURCE_MOOD_OID: u32 = 91_234;

fn orders() -> Arc<Table> {
    table(
        "orders",
        vec![
            col("id", 23, -1, true),
            col("note", 25, -1, false),
            col("qty", 20, -1, false),
            col("price", 701, -1, false),
            col("weight", 700, -1, false),
            col("placed", 1114, -1, false),
            col("paid_at", 1184, -1, false),
            col("due", 1082, -1, false),
            col("ref", 2950, -1, false),
            col("blob", 17, -1, false),
            col("amount", 1700, 786_438, false),
            col("doc", 3802, -1, false),
            col("mood", SOURCE_MOOD_OID, -1, false),
            col("tags", 1007, -1, false),
            col("span", 1186, -1, false),
            col("at", 1083, -1, false),
            col("flag", 16, -1, false),
            col("small", 21, -1, false),
        ],
    )
}

const ORDERS_DDL: &str = "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
    CREATE TABLE orders (id int4 PRIMARY KEY, note text, qty int8 NOT NULL, price float8,
      weight float4, placed timestamp, paid_at timestamptz, due date, ref uuid, blob bytea,
      amount numeric(12,2), doc jsonb, mood mood, tags int4[], span interval, at time,
      flag bool, small int2);
    CREATE TABLE expected (LIKE orders);";

fn pos(lsn: u64, ordinal: u32) -> Position {
    Position {
        lsn: Lsn::from(lsn),
        ordinal,
        sub: 0,
    }
}

/// A row with every kind of value; `id`, `note` and `qty` vary.
fn order_row(id: i32, note: &str, qty: i64) -> Vec<Value> {
    vec![
        Value::Int4(id),
        Value::Text(note.into()),
        Value::Int8(qty),
        Value::Float8(0.1),
        Value::Float4(f32::MAX),
        Value::Timestamp(1_706_704_496_123_456),
        Value::TimestampTz(-62_135_596_800_000_001),
        Value::Date(i32::MAX),
        Value::Uuid([0xab; 16]),
        Value::Bytes(vec![0, 0xff, b'\'', b'\\']),
        Value::Numeric("-1234567890.12".into()),
        Value::Json(r#"{"a": [1, "x\"y"], "b": null}"#.into()),
        Value::Other {
            type_oid: SOURCE_MOOD_OID,
            text: "happy".into(),
        },
        Value::Other {
            type_oid: 1007,
            text: "{1,NULL,-3}".into(),
        },
        Value::Other {
            type_oid: 1186,
            text: "1 year 2 mons -3 days +04:05:06.789".into(),
        },
        Value::Time(86_400_000_000),
        Value::Bool(false),
        Value::Int2(i16::MIN),
    ]
}

/// The same row as SQL literals, for the `expected` table PostgreSQL parses itself.
fn order_literal(id: i32, note: &str, qty: i64) -> String {
    format!(
        "({id}, '{}', {qty}, 0.1, '3.4028235e38', '2024-01-31 12:34:56.123456', \
         '0001-12-31 23:59:59.999999+00 BC', 'infinity', 'abababab-abab-abab-abab-abababababab', \
         '\\x00ff275c', -1234567890.12, '{{\"a\": [1, \"x\\\"y\"], \"b\": null}}', 'happy', \
         '{{1,NULL,-3}}', '1 year 2 mons -3 days +04:05:06.789', '24:00:00', false, -32768)",
        note.replace('\'', "''")
    )
}

fn change(
    t: &Arc<Table>,
    at: Position,
    op: Op,
    key: Vec<Value>,
    old_key: Option<Vec<Value>>,
    values: Vec<Value>,
) -> Arc<Change> {
    Arc::new(Change {
        position: at,
        op,
        table: Arc::clone(t),
        key,
        old_key,
        values,
    })
}

fn upsert(t: &Arc<Table>, at: Position, values: Vec<Value>) -> Arc<Change> {
    let key = t.key.iter().map(|&i| values[i].clone()).collect();
    change(t, at, Op::Update, key, None, values)
}

fn delete(t: &Arc<Table>, at: Position, key: Vec<Value>) -> Arc<Change> {
    change(t, at, Op::Delete, key, None, Vec::new())
}

/// A cluster with database `replica` and whatever `ddl` creates there.
fn server(ddl: &str) -> Postgres {
    let pg = Postgres::start();
    pg.create_database(DB);
    if !ddl.is_empty() {
        pg.psql(DB, ddl);
    }
    pg
}

fn checkpoints(pg: &Postgres) -> String {
    pg.psql(
        DB,
        "SELECT pipeline, connector, lane, lanes, lsn, ordinal, sub FROM _zipline_checkpoints \
         ORDER BY pipeline, connector, lane",
    )
}

/// Whole rows of `table` as text, in UTC.
fn rows(pg: &Postgres, table: &str) -> String {
    pg.psql(
        DB,
        &format!("SET TimeZone = 'UTC'; SELECT t::text FROM {table} t ORDER BY id"),
    )
}

async fn open(connector: &PostgresConnector, lane: u32, lanes: u32) -> Box<dyn LaneSink> {
    connector
        .open_lane(lane, lanes)
        .await
        .unwrap_or_else(|e| panic!("opening lane {lane}/{lanes}: {}", e.message))
}

async fn apply(lane: &mut Box<dyn LaneSink>, changes: Vec<Arc<Change>>) {
    lane.apply(&Batch { lane: 0, changes })
        .await
        .unwrap_or_else(|e| panic!("{}", e.message));
}

#[tokio::test]
async fn batches_land_exactly_with_their_checkpoint_and_replays_converge() {
    let pg = server(ORDERS_DDL);
    let connector = PostgresConnector::new(options(&pg));
    let t = orders();
    connector
        .check_tables(std::slice::from_ref(&t))
        .await
        .unwrap_or_else(|e| panic!("{}", e.message));
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
    };
    lane.apply(&batch)
        .await
        .unwrap_or_else(|e| panic!("{}", e.message));
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
        .unwrap_or_else(|e| panic!("{}", e.message));
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
        .unwrap_or_else(|e| panic!("{}", e.message));
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
    let connector = PostgresConnector::new(options(&pg));
    let t = orders();
    let audit = table(
        "audit",
        vec![col("id", 23, -1, true), col("what", 1043, 24, false)],
    );
    connector
        .check_tables(&[Arc::clone(&t), Arc::clone(&audit)])
        .await
        .unwrap_or_else(|e| panic!("{}", e.message));
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
    assert_eq!(err.class, ErrorClass::Transient, "{}", err.message);
    assert!(
        err.message
            .starts_with("sink pg-out: upserting 1 row into \"public\".\"orders\""),
        "{}",
        err.message
    );
    assert!(err.message.contains("57P01"), "{}", err.message);
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
        .unwrap_or_else(|e| panic!("{}", e.message));
    lane.apply(&batch)
        .await
        .unwrap_or_else(|e| panic!("{}", e.message));
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
    let connector = PostgresConnector::new(options(&pg));
    let tags = table(
        "tags",
        vec![col("id", 23, -1, true), col("name", 1043, 9, false)],
    );
    connector
        .check_tables(std::slice::from_ref(&tags))
        .await
        .unwrap_or_else(|e| panic!("{}", e.message));
    let mut lane = open(&connector, 0, 1).await;
    let row = |id, name: &str| vec![Value::Int4(id), Value::Text(name.into())];
    let mut changes: Vec<Arc<Change>> = (1..=40)
        .map(|id| upsert(&tags, pos(300, id as u32), row(id, "ok")))
        .collect();
    changes[26] = upsert(&tags, pos(300, 27), row(27, "far too long"));
    let bad = Batch { lane: 0, changes };
    let err = lane.apply(&bad).await.expect_err("too long for varchar(5)");
    assert_eq!(err.class, ErrorClass::Definite, "{}", err.message);
    assert!(
        err.message
            .starts_with("sink pg-out: upserting 40 rows into \"public\".\"tags\"")
            && err.message.contains("22001")
            && err.message.ends_with("(row key (id)=(27))"),
        "{}",
        err.message
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
    };
    let err = lane.apply(&null).await.expect_err("NULL name");
    assert_eq!(err.class, ErrorClass::Definite, "{}", err.message);
    assert!(
        err.message.contains("23502")
            && err.message.contains("(column \"name\")")
            && err.message.ends_with("(row key (id)=(9))"),
        "{}",
        err.message
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
    };
    let err = lane.apply(&out_of_range).await.expect_err("out of range");
    assert_eq!(err.class, ErrorClass::Definite, "{}", err.message);
    assert!(
        err.message
            .starts_with("sink pg-out: upserting 1 row into \"public\".\"stamps\"")
            && err.message.contains("out of PostgreSQL's range")
            && err.message.ends_with("(row key (id)=(61))"),
        "{}",
        err.message
    );
    assert_eq!(pg.psql(DB, "SELECT count(*) FROM tags"), "0");

    // The lane still works without a reconnect.
    apply(&mut lane, vec![upsert(&tags, pos(300, 70), row(1, "ok"))]).await;
    assert_eq!(pg.psql(DB, "SELECT name FROM tags WHERE id = 1"), "ok");
}

#[tokio::test]
async fn check_tables_reports_what_the_operator_must_fix() {
    let pg = server(
        "CREATE TABLE nokey (id int, v int);
         CREATE TABLE partial (id int, v int); CREATE UNIQUE INDEX ON partial (id) WHERE id > 0;
         CREATE TABLE narrow (id int PRIMARY KEY, tenant int NOT NULL,
                              total int GENERATED ALWAYS AS (id * 2) STORED);
         CREATE VIEW aview AS SELECT 1 AS id;",
    );
    let connector = PostgresConnector::new(options(&pg));
    let simple = |name: &str, cols: &[&str]| {
        table(
            name,
            cols.iter()
                .enumerate()
                .map(|(i, c)| col(c, 23, -1, i == 0))
                .collect(),
        )
    };

    let err = connector
        .check_tables(&[simple("missing", &["id", "v"])])
        .await
        .expect_err("missing table");
    assert_eq!(err.class, ErrorClass::Fatal);
    assert_eq!(
        err.message,
        "sink pg-out: table \"public\".\"missing\" does not exist (source table \
         public.missing); create it with a primary key on (id), or set create_tables: true"
    );
    // The checkpoint table was created on the way.
    assert_eq!(
        pg.psql(DB, "SELECT to_regclass('_zipline_checkpoints') IS NOT NULL"),
        "t"
    );

    for name in ["nokey", "partial"] {
        let err = connector
            .check_tables(&[simple(name, &["id", "v"])])
            .await
            .expect_err("no usable key");
        assert!(
            err.message
                .contains("no PRIMARY KEY or UNIQUE index on exactly (id)"),
            "{}",
            err.message
        );
    }

    let err = connector
        .check_tables(&[simple("narrow", &["id", "extra", "total"])])
        .await
        .expect_err("columns");
    for needle in [
        "has no column \"extra\" (source column public.narrow.extra)",
        "\"narrow\".\"tenant\" is NOT NULL without a default",
        "\"narrow\".\"total\" is generated",
    ] {
        assert!(err.message.contains(needle), "{needle}: {}", err.message);
    }
    let err = connector
        .check_tables(&[simple("aview", &["id"])])
        .await
        .expect_err("a view");
    assert!(err.message.contains("is not a table"), "{}", err.message);

    // Wrong credentials are fatal and never echo the password.
    scram_role(&pg, DB, "zipline_pw", "R1ght-pw");
    let mut opts = options(&pg);
    opts.user = "zipline_pw".into();
    opts.password = Some("s3cret-wrong-pw".into());
    assert!(!format!("{opts:?}").contains("s3cret"));
    let err = PostgresConnector::new(opts.clone())
        .check_tables(&[])
        .await
        .expect_err("wrong password");
    assert_eq!(err.class, ErrorClass::Fatal, "{}", err.message);
    assert!(
        err.message.contains("28P01") && !err.message.contains("s3cret"),
        "{}",
        err.message
    );
    assert!(
        err.message.contains("check the sink's user and password"),
        "{}",
        err.message
    );
    opts.password = None;
    let err = PostgresConnector::new(opts)
        .check_tables(&[])
        .await
        .expect_err("no password");
    assert_eq!(err.class, ErrorClass::Fatal, "{}", err.message);

    let mut opts = options(&pg);
    opts.database = "nope".into();
    let err = PostgresConnector::new(opts)
        .check_tables(&[])
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Fatal, "{}", err.message);
    assert!(err.message.contains("3D000"), "{}", err.message);

    let mut opts = options(&pg);
    opts.schema = Some("nope".into());
    let err = PostgresConnector::new(opts)
        .check_tables(&[])
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Fatal, "{}", err.message);
    assert!(err.message.contains("3F000"), "{}", err.message);

    // Nothing listening: transient (the server may be starting).
    let mut opts = options(&pg);
    opts.port = common::free_port();
    let err = PostgresConnector::new(opts)
        .check_tables(&[])
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{}", err.message);
}

#[tokio::test]
async fn create_tables_uses_the_source_types_exactly() {
    let pg = server("CREATE SCHEMA mirror");
    let mut opts = options(&pg);
    opts.create_tables = true;
    opts.schema = Some("mirror".into());
    let connector = PostgresConnector::new(opts);
    // (column, type OID, typmod, key, what format_type says on the source)
    let spec: &[(&str, u32, i32, bool, &str)] = &[
        ("id", 20, -1, true, "bigint"),
        ("region", 1043, 24, true, "character varying(20)"),
        ("amount", 1700, 786_438, false, "numeric(12,2)"),
        ("code", 1042, 7, false, "character(3)"),
        ("at", 1184, 3, false, "timestamp(3) with time zone"),
        ("bits", 1560, 5, false, "bit(5)"),
        ("names", 1015, 14, false, "character varying(10)[]"),
        ("doc", 3802, -1, false, "jsonb"),
        ("at_time", 1083, 3, false, "time(3) without time zone"),
        ("addr", 869, -1, false, "inet"),
    ];
    let t = Arc::new(Table::new(
        "sales".into(),
        "items".into(),
        spec.iter()
            .map(|&(n, oid, m, k, _)| col(n, oid, m, k))
            .collect(),
    ));
    connector
        .check_tables(std::slice::from_ref(&t))
        .await
        .unwrap_or_else(|e| panic!("{}", e.message));
    let got = pg.psql(
        DB,
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute \
         WHERE attrelid = 'mirror.items'::regclass AND attnum > 0 ORDER BY attnum",
    );
    let want: Vec<String> = spec.iter().map(|s| format!("{}|{}", s.0, s.4)).collect();
    assert_eq!(got, want.join("\n"));
    assert_eq!(
        pg.psql(
            DB,
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint \
             WHERE conrelid = 'mirror.items'::regclass AND contype = 'p'"
        ),
        "PRIMARY KEY (id, region)"
    );
    assert_eq!(
        pg.psql(
            DB,
            "SELECT to_regclass('mirror._zipline_checkpoints') IS NOT NULL"
        ),
        "t"
    );

    // The lane writes the created table.
    let mut lane = open(&connector, 0, 1).await;
    let values = vec![
        Value::Int8(1),
        Value::Text("eu".into()),
        Value::Numeric("12.35".into()),
        Value::Text("ab ".into()),
        Value::TimestampTz(1_000),
        Value::Other {
            type_oid: 1560,
            text: "10101".into(),
        },
        Value::Other {
            type_oid: 1015,
            text: "{a,\"b c\"}".into(),
        },
        Value::Json("{\"k\": 1}".into()),
        Value::Time(1_500_000),
        Value::Other {
            type_oid: 869,
            text: "10.0.0.1/8".into(),
        },
    ];
    apply(&mut lane, vec![upsert(&t, pos(1, 1), values)]).await;
    assert_eq!(
        pg.psql(
            DB,
            "SET TimeZone = 'UTC'; SELECT t::text FROM mirror.items t"
        ),
        "(1,eu,12.35,\"ab \",\"1970-01-01 00:00:00.001+00\",10101,\"{a,\"\"b c\"\"}\",\
         \"{\"\"k\"\": 1}\",00:00:01.5,10.0.0.1/8)"
    );

    // A table first seen while streaming (added to the publication later) is created too.
    let later = table(
        "later",
        vec![col("id", 23, -1, true), col("v", 25, -1, false)],
    );
    apply(
        &mut lane,
        vec![upsert(
            &later,
            pos(2, 1),
            vec![Value::Int4(5), Value::Text("v".into())],
        )],
    )
    .await;
    assert_eq!(pg.psql(DB, "SELECT id, v FROM mirror.later"), "5|v");

    // Types defined in the source database cannot be created from their OIDs.
    let custom = table(
        "custom",
        vec![
            col("id", 23, -1, true),
            col("m", SOURCE_MOOD_OID, -1, false),
        ],
    );
    let err = connector.check_tables(&[custom]).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Fatal);
    assert!(
        err.message
            .contains("\"m\" (type OID 91234) of source table public.custom"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn a_new_source_column_the_sink_lacks_stops_with_its_name() {
    let pg = server("CREATE TABLE t (id int PRIMARY KEY, a text)");
    let connector = PostgresConnector::new(options(&pg));
    let v1 = table("t", vec![col("id", 23, -1, true), col("a", 25, -1, false)]);
    connector
        .check_tables(std::slice::from_ref(&v1))
        .await
        .unwrap_or_else(|e| panic!("{}", e.message));
    let mut lane = open(&connector, 0, 1).await;
    apply(
        &mut lane,
        vec![upsert(
            &v1,
            pos(1, 1),
            vec![Value::Int4(1), Value::Text("x".into())],
        )],
    )
    .await;
    // ALTER TABLE … ADD COLUMN b on the source: the relation arrives with a new shape.
    let v2 = table(
        "t",
        vec![
            col("id", 23, -1, true),
            col("a", 25, -1, false),
            col("b", 23, -1, false),
        ],
    );
    let batch = Batch {
        lane: 0,
        changes: vec![upsert(
            &v2,
            pos(2, 1),
            vec![Value::Int4(2), Value::Text("y".into()), Value::Int4(7)],
        )],
    };
    let err = lane.apply(&batch).await.expect_err("no column b");
    assert_eq!(err.class, ErrorClass::Fatal);
    assert!(
        err.message
            .contains("table \"public\".\"t\" has no column \"b\" (source column public.t.b)"),
        "{}",
        err.message
    );
    // Once the operator adds it, the same batch goes through.
    pg.psql(DB, "ALTER TABLE t ADD COLUMN b int");
    apply(&mut lane, batch.changes.clone()).await;
    assert_eq!(
        pg.psql(DB, "SELECT id, a, b FROM t ORDER BY id"),
        "1|x|\n2|y|7"
    );
}

#[tokio::test]
async fn a_lane_count_change_restarts_every_lane_from_the_lowest_checkpoint() {
    let pg = server(ORDERS_DDL);
    let connector = PostgresConnector::new(options(&pg));
    let t = orders();
    connector
        .check_tables(std::slice::from_ref(&t))
        .await
        .unwrap_or_else(|e| panic!("{}", e.message));
    for (lane, at) in [(0, pos(500, 1)), (1, pos(400, 7))] {
        let mut sink = open(&connector, lane, 2).await;
        sink.apply(&Batch {
            lane,
            changes: vec![upsert(&t, at, order_row(lane as i32, "x", 1))],
        })
        .await
        .unwrap_or_else(|e| panic!("{}", e.message));
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
    let connector = PostgresConnector::new(options(&pg));
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
        .unwrap_or_else(|e| panic!("{}", e.message));
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
        })
        .await
        .expect_err("email taken");
    assert_eq!(err.class, ErrorClass::Definite, "{}", err.message);
    assert!(
        err.message.contains("23505")
            && err.message.contains("people_email_key")
            && err.message.ends_with("(row key (id)=(4))"),
        "{}",
        err.message
    );
    assert_eq!(pg.psql(DB, "SELECT count(*) FROM people"), "3");
    assert_eq!(lane.checkpoint(), Some(pos(1, 2)));
}
