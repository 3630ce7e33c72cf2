//! The MySQL/MariaDB sink against a throwaway MariaDB: rows and checkpoint land in one
//! transaction, replays converge, a connection killed mid-batch leaves nothing behind and the
//! retry converges, bad tables and bad rows are classified, and a lane-count change restarts
//! every lane from the lowest checkpoint.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::MariaDb;
use common::changes::{change, claimed, delete, open, pos, upsert};
use mysql_async::prelude::Queryable;
use zipline::change::{Column, Op, PG_EPOCH_MICROS, Table, Value};
use zipline::error::ErrorClass;
use zipline::sink::mysql::{MysqlConnector, MysqlSinkOptions};
use zipline::sink::{Batch, SinkConnector, SnapshotTarget};

const DB: &str = "shop";

fn options(db: &MariaDb) -> MysqlSinkOptions {
    MysqlSinkOptions {
        connector: "mysql-out".into(),
        pipeline: "orders-pipe".into(),
        host: db.host().into(),
        port: db.port,
        database: DB.into(),
        user: "root".into(),
        password: None,
        connect_timeout: Duration::from_secs(5),
        dead_letter_table: "_zipline_dead_letters".into(),
        create_dead_letter_table: false,
    }
}

fn table(name: &str, cols: &[(&str, bool)]) -> Arc<Table> {
    Arc::new(Table::new(
        "public".into(),
        name.into(),
        cols.iter()
            .map(|&(name, is_key)| Column {
                name: name.into(),
                type_oid: 25,
                type_modifier: -1,
                is_key,
            })
            .collect(),
    ))
}

fn orders() -> Arc<Table> {
    table(
        "orders",
        &[
            ("id", true),
            ("note", false),
            ("qty", false),
            ("price", false),
            ("weight", false),
            ("placed", false),
            ("paid_at", false),
            ("due", false),
            ("ref", false),
            ("blob", false),
        ],
    )
}

const ORDERS_DDL: &str = "CREATE TABLE orders (id INT PRIMARY KEY, note TEXT NULL, \
    qty BIGINT NOT NULL, price DOUBLE NULL, weight FLOAT NULL, placed DATETIME(6) NULL, \
    paid_at TIMESTAMP(6) NULL, due DATE NULL, ref CHAR(36) NULL, `blob` BLOB NULL)";

fn order_row(id: i32, note: &str, qty: i64) -> Vec<Value> {
    vec![
        Value::Int4(id),
        Value::Text(note.into()),
        Value::Int8(qty),
        Value::Float8(0.1),
        Value::Float4(f32::MAX),
        // 2024-01-31 12:34:56.123456 and 1970-01-01 00:00:01.000001 UTC.
        Value::Timestamp(1_706_704_496_123_456 - PG_EPOCH_MICROS),
        Value::TimestampTz(1_000_001 - PG_EPOCH_MICROS),
        Value::Date(19_753),
        Value::Uuid([0xab; 16]),
        Value::Bytes(vec![0, 0xff, b'\'']),
    ]
}

/// A server with database `shop` holding `orders` (and whatever `extra_ddl` creates).
fn server(extra_ddl: &str) -> MariaDb {
    let db = MariaDb::start();
    db.create_database(DB);
    db.sql(DB, &format!("{ORDERS_DDL}; {extra_ddl}"));
    db
}

fn checkpoints(db: &MariaDb) -> String {
    db.sql(
        DB,
        "SELECT pipeline, connector, lane, lanes, lsn, ordinal FROM _zipline_checkpoints \
         ORDER BY pipeline, connector, lane",
    )
}

#[tokio::test]
async fn batches_land_with_their_checkpoint_and_replays_converge() {
    let db = server("");
    let connector = claimed(MysqlConnector::new(options(&db))).await;
    let t = orders();
    connector
        .check_tables(std::slice::from_ref(&t))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    let mut lane = open(&connector, 0, 2).await;
    assert_eq!(lane.checkpoint(), None);

    let tricky = "it's a \\ backslash, a NUL \0 and 🐢";
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

    let rows_sql = "SELECT id, HEX(note), qty, price, weight, placed, paid_at, due, ref, \
                    HEX(`blob`) FROM orders ORDER BY id";
    let expected = format!(
        "1\t{}\t5\t0.1\t3.40282e38\t2024-01-31 12:34:56.123456\t1970-01-01 00:00:01.000001\t\
         2024-01-31\tabababab-abab-abab-abab-abababababab\t00FF27\n\
         2\t{}\t8\t0.1\t3.40282e38\t2024-01-31 12:34:56.123456\t1970-01-01 00:00:01.000001\t\
         2024-01-31\tabababab-abab-abab-abab-abababababab\t00FF27",
        hex(tricky),
        hex("two again")
    );
    // paid_at is a TIMESTAMP: shown in the session zone, so read it in UTC.
    let rows = || db.sql(DB, &format!("SET time_zone='+00:00'; {rows_sql}"));
    assert_eq!(rows(), expected);
    assert_eq!(checkpoints(&db), "orders-pipe\tmysql-out\t0\t2\t101\t2");

    // The very same batch again (a retry after a lost COMMIT reply) converges.
    lane.apply(&batch)
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(rows(), expected);

    // A reopened lane resumes from the committed checkpoint.
    drop(lane);
    let mut lane = open(&connector, 0, 2).await;
    assert_eq!(lane.checkpoint(), Some(pos(101, 2)));

    // An update that leaves a TOASTed column unchanged keeps the stored value.
    let mut toast = order_row(1, "", 50);
    toast[1] = Value::Unchanged;
    lane.apply(&Batch {
        lane: 0,
        changes: vec![upsert(&t, pos(102, 1), toast)],
        ..Batch::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(
        db.sql(DB, "SELECT id, HEX(note), qty FROM orders WHERE id = 1"),
        format!("1\t{}\t50", hex(tricky))
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
    lane.apply(&Batch {
        lane: 0,
        changes: vec![moved],
        ..Batch::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(db.sql(DB, "SELECT id FROM orders ORDER BY id"), "1\n20");
    assert_eq!(db.sql(DB, "SELECT note FROM orders WHERE id = 20"), "moved");

    // Truncate removes every row and moves the checkpoint, atomically.
    lane.truncate(&t, pos(104, 1))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(db.sql(DB, "SELECT COUNT(*) FROM orders"), "0");
    assert_eq!(lane.checkpoint(), Some(pos(104, 1)));
    assert_eq!(checkpoints(&db), "orders-pipe\tmysql-out\t0\t2\t104\t1");
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02X}")).collect()
}

#[tokio::test]
async fn a_connection_killed_mid_batch_leaves_nothing_and_the_retry_converges() {
    let db = server("CREATE TABLE audit (id INT PRIMARY KEY, what VARCHAR(20))");
    let connector = claimed(MysqlConnector::new(options(&db))).await;
    let t = orders();
    let audit = table("audit", &[("id", true), ("what", false)]);
    connector
        .check_tables(&[Arc::clone(&t), Arc::clone(&audit)])
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    db.sql(DB, "INSERT INTO orders (id, qty) VALUES (1, 0)");
    let mut lane = open(&connector, 0, 1).await;

    // Another session locks row 1, so the batch stops at its second statement.
    let mut locker = db.conn(DB).await;
    locker
        .query_drop("START TRANSACTION; SELECT id FROM orders WHERE id = 1 FOR UPDATE")
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
    let mut admin = db.conn("").await;
    let killer = async {
        // Wait until the lane's upsert is waiting for the lock, then kill its connection.
        for _ in 0..500 {
            let ids: Vec<u64> = admin
                .query(
                    "SELECT ID FROM information_schema.PROCESSLIST \
                     WHERE INFO LIKE 'INSERT INTO `shop`.`orders`%'",
                )
                .await
                .unwrap();
            if let Some(id) = ids.first() {
                admin
                    .query_drop(format!("KILL CONNECTION {id}"))
                    .await
                    .unwrap();
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
            .starts_with("sink mysql-out: upserting 1 row into `shop`.`orders`"),
        "{}",
        err.report()
    );
    assert_eq!(lane.checkpoint(), None);
    locker.query_drop("ROLLBACK").await.unwrap();

    // Nothing of the batch is visible: not even the statement that had succeeded.
    assert_eq!(db.sql(DB, "SELECT COUNT(*) FROM audit"), "0");
    assert_eq!(db.sql(DB, "SELECT COUNT(*) FROM _zipline_checkpoints"), "0");

    lane.reconnect()
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    lane.apply(&batch)
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(db.sql(DB, "SELECT id, what FROM audit"), "1\tfirst");
    assert_eq!(db.sql(DB, "SELECT note FROM orders WHERE id = 1"), "locked");
    assert_eq!(checkpoints(&db), "orders-pipe\tmysql-out\t0\t1\t200\t2");
}

#[tokio::test]
async fn bad_rows_are_definite_and_leave_the_lane_usable() {
    let db = server("CREATE TABLE tags (id INT PRIMARY KEY, name VARCHAR(5) NOT NULL)");
    let connector = claimed(MysqlConnector::new(options(&db))).await;
    let tags = table("tags", &[("id", true), ("name", false)]);
    connector
        .check_tables(std::slice::from_ref(&tags))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    let mut lane = open(&connector, 0, 1).await;
    let row = |id, name: &str| vec![Value::Int4(id), Value::Text(name.into())];
    let bad = Batch {
        lane: 0,
        changes: vec![
            upsert(&tags, pos(300, 1), row(1, "ok")),
            upsert(&tags, pos(300, 2), row(2, "far too long")),
        ],
        ..Batch::default()
    };
    let err = lane.apply(&bad).await.expect_err("too long for VARCHAR(5)");
    assert_eq!(err.class, ErrorClass::Definite, "{}", err.report());
    assert!(
        err.report()
            .starts_with("sink mysql-out: upserting 2 rows into `shop`.`tags`")
            && err.report().contains("1406")
            && err.report().contains("'name'")
            && err.report().contains("(row key (id)=(2))"),
        "{}",
        err.report()
    );
    assert_eq!(db.sql(DB, "SELECT COUNT(*) FROM tags"), "0");

    // A value that is not what its variant promises (a transform's doing): definite, before
    // anything is sent.
    let malformed = Batch {
        lane: 0,
        changes: vec![upsert(&orders(), pos(300, 3), {
            let mut r = order_row(9, "bad", 1);
            r[3] = Value::Numeric("1;DROP TABLE orders".into());
            r
        })],
        ..Batch::default()
    };
    let err = lane.apply(&malformed).await.expect_err("malformed numeric");
    assert_eq!(err.class, ErrorClass::Definite);
    assert!(
        err.report().contains("public.orders.price") && err.report().contains("not a decimal"),
        "{}",
        err.report()
    );

    // A NaN has no MySQL value: a DOUBLE column gets NULL (docs/types.md).
    let nan = Batch {
        lane: 0,
        changes: vec![upsert(&orders(), pos(300, 4), {
            let mut r = order_row(9, "nan", 1);
            r[3] = Value::Float8(f64::NAN);
            r
        })],
        ..Batch::default()
    };
    lane.apply(&nan)
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(
        db.sql(DB, "SELECT id, price IS NULL, note FROM orders"),
        "9\t1\tnan"
    );

    // The lane still works without a reconnect.
    lane.apply(&Batch {
        lane: 0,
        changes: vec![upsert(&tags, pos(300, 5), row(1, "ok"))],
        ..Batch::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(db.sql(DB, "SELECT id, name FROM tags"), "1\tok");
}

#[tokio::test]
async fn check_tables_reports_what_the_operator_must_fix() {
    let db = server(
        "CREATE TABLE nokey (id INT, v INT); \
         CREATE TABLE narrow (id INT PRIMARY KEY, tenant INT NOT NULL)",
    );
    let connector = claimed(MysqlConnector::new(options(&db))).await;

    let missing = table("missing", &[("id", true), ("v", false)]);
    let err = connector
        .check_tables(&[missing])
        .await
        .expect_err("missing table");
    assert_eq!(err.class, ErrorClass::Fatal);
    assert_eq!(
        err.report(),
        "sink mysql-out: table `shop`.`missing` does not exist (source table public.missing); \
         create it with a primary key on (id)"
    );
    // The checkpoint table was created on the way.
    assert_eq!(
        db.sql(DB, "SHOW TABLES LIKE '\\_zipline\\_checkpoints'"),
        "_zipline_checkpoints"
    );

    let nokey = table("nokey", &[("id", true), ("v", false)]);
    let err = connector.check_tables(&[nokey]).await.expect_err("no key");
    assert_eq!(err.class, ErrorClass::Fatal);
    assert!(
        err.report()
            .contains("no PRIMARY KEY or UNIQUE index on exactly (id)"),
        "{}",
        err.report()
    );

    let narrow = table("narrow", &[("id", true), ("extra", false)]);
    let err = connector
        .check_tables(&[narrow])
        .await
        .expect_err("columns");
    // A source column the table lacks is added (nullable), as when the source gains one
    // mid-stream; what Zipline cannot fix itself is reported.
    assert!(
        !err.report().contains("`extra`")
            && err
                .message
                .contains("`narrow`.`tenant` is NOT NULL without a default"),
        "{}",
        err.report()
    );
    assert_eq!(
        db.sql(DB, "SELECT IS_NULLABLE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = 'shop' AND TABLE_NAME = 'narrow' AND COLUMN_NAME = 'extra'"),
        "YES"
    );

    // Wrong credentials are fatal and never echo the password.
    let mut opts = options(&db);
    opts.password = Some("s3cret-pw".into());
    assert!(!format!("{opts:?}").contains("s3cret-pw"));
    let err = MysqlConnector::new(opts)
        .check_tables(&[])
        .await
        .expect_err("root has no password");
    assert_eq!(err.class, ErrorClass::Fatal, "{}", err.report());
    assert!(err.report().contains("1045") && !err.report().contains("s3cret-pw"));

    let mut opts = options(&db);
    opts.database = "nope".into();
    let err = MysqlConnector::new(opts)
        .check_tables(&[])
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Fatal, "{}", err.report());
    assert!(err.report().contains("1049"), "{}", err.report());

    // Nothing listening: transient (the server may be starting).
    let mut opts = options(&db);
    opts.port = common::free_port();
    let err = MysqlConnector::new(opts)
        .check_tables(&[])
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{}", err.report());
}

#[tokio::test]
async fn a_lane_count_change_restarts_every_lane_from_the_lowest_checkpoint() {
    let db = server("");
    let connector = claimed(MysqlConnector::new(options(&db))).await;
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
    db.sql(
        DB,
        "INSERT INTO _zipline_checkpoints (pipeline, connector, lane, lanes, lsn, ordinal) \
         VALUES ('other', 'mysql-out', 0, 1, 1, 1)",
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
        checkpoints(&db),
        "orders-pipe\tmysql-out\t0\t3\t400\t7\n\
         orders-pipe\tmysql-out\t1\t3\t400\t7\n\
         orders-pipe\tmysql-out\t2\t3\t400\t7\n\
         other\tmysql-out\t0\t1\t1\t1"
    );
    drop((a, b, c));

    // Back to one lane after lane 1 of 3 lost its row (never committed): replay everything.
    db.sql(
        DB,
        "DELETE FROM _zipline_checkpoints WHERE pipeline = 'orders-pipe' AND lane = 1",
    );
    let lane = open(&connector, 0, 1).await;
    assert_eq!(lane.checkpoint(), None);
    assert_eq!(checkpoints(&db), "other\tmysql-out\t0\t1\t1\t1");
}

/// One live instance per pipeline: a second claim is refused naming the holder; once the
/// holder stops heartbeating another instance takes the sink over, and from then on every
/// write of the old one fails without leaving anything behind.
#[tokio::test]
async fn a_second_claim_is_refused_and_a_takeover_fences_the_old_writer() {
    use zipline::checkpoint::Holder;
    let db = server("");
    let t = orders();
    let first = MysqlConnector::new(options(&db));
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
    let second = MysqlConnector::new(options(&db));
    let Err(refused) = second.claim(&other, Duration::from_secs(30)).await else {
        panic!("a second live claim is refused");
    };
    assert_eq!(refused.class, ErrorClass::Fatal);
    let me = Holder::this_process();
    assert!(
        refused.message.starts_with(&format!(
            "sink mysql-out: pipeline orders-pipe is already running: process {} on host {} \
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
    assert_eq!(db.sql(DB, "SELECT GROUP_CONCAT(id) FROM orders"), "1");
    assert_eq!(checkpoints(&db), "orders-pipe\tmysql-out\t0\t1\t100\t1");
    let renewed = lease.renew().await.expect_err("the old claim is gone");
    assert_eq!(renewed.class, ErrorClass::Fatal, "{}", renewed.message);

    let mut lane = open(&second, 0, 1).await;
    lane.apply(&batch(2, pos(200, 1)))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    assert_eq!(
        db.sql(DB, "SELECT GROUP_CONCAT(id ORDER BY id) FROM orders"),
        "1,2"
    );
}

/// A sink table with a unique key besides its key: a change whose row conflicts on it with
/// another row fails naming both keys, and never overwrites (or, in the snapshot, deletes)
/// the other row. The PostgreSQL sink has always refused such rows (23505).
#[tokio::test]
async fn a_conflict_on_another_unique_key_fails_naming_both_rows_and_touches_neither() {
    use zipline::sink::{SinkErrorKind, SnapshotChunk};
    let db = server(
        "CREATE TABLE members (id INT PRIMARY KEY, email VARCHAR(64) NOT NULL, \
                     note TEXT NULL, UNIQUE KEY uq_email (email))",
    );
    let connector = claimed(MysqlConnector::new(options(&db))).await;
    let t = table(
        "members",
        &[("id", true), ("email", false), ("note", false)],
    );
    connector
        .check_tables(std::slice::from_ref(&t))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    let row = |id: i32, email: &str, note: &str| {
        vec![
            Value::Int4(id),
            Value::Text(email.into()),
            Value::Text(note.into()),
        ]
    };
    let mut lane = open(&connector, 0, 1).await;
    lane.apply(&Batch::new(
        0,
        vec![
            upsert(&t, pos(10, 1), row(1, "a@x", "first")),
            upsert(&t, pos(10, 2), row(2, "b@x", "second")),
        ],
    ))
    .await
    .unwrap_or_else(|e| panic!("{}", e.report()));

    // Row 12 arrives with row 1's email: before the guard, ON DUPLICATE KEY UPDATE rewrote
    // row 1 with row 12's values and row 12 never arrived.
    let err = lane
        .apply(&Batch::new(
            0,
            vec![upsert(&t, pos(11, 1), row(12, "a@x", "twelve"))],
        ))
        .await
        .expect_err("a conflict on another unique key is an error");
    assert_eq!(err.class, ErrorClass::Definite);
    assert_eq!(err.kind, SinkErrorKind::UniqueConflict);
    assert!(
        err.report().contains(
            "row (id)=(12) has unique key `uq_email` (email)=('a@x') of the sink's row (id)=(1)"
        ),
        "{}",
        err.report()
    );
    // An existing row taking another's email: the server names the key, the guard the rows.
    let err = lane
        .apply(&Batch::new(
            0,
            vec![upsert(&t, pos(11, 2), row(2, "a@x", "moved"))],
        ))
        .await
        .expect_err("a conflict on another unique key is an error");
    assert_eq!(err.kind, SinkErrorKind::UniqueConflict, "{}", err.report());
    assert!(err.report().contains("(id)=(2)"), "{}", err.report());
    assert_eq!(
        db.sql(DB, "SELECT id, email, note FROM members ORDER BY id"),
        "1\ta@x\tfirst\n2\tb@x\tsecond"
    );
    assert_eq!(lane.checkpoint(), Some(pos(10, 2)));

    // The snapshot path: LOAD DATA … REPLACE would have deleted row 1 to make room.
    let chunk = SnapshotChunk {
        table: "public.members".into(),
        index: 0,
        column: "id".into(),
        lower: None,
        upper: None,
    };
    connector
        .begin(std::slice::from_ref(&chunk))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    let err = connector
        .load_rows(&chunk, &t, &[row(3, "c@x", "ok"), row(13, "b@x", "clash")])
        .await
        .expect_err("a snapshot row conflicting on another unique key is an error");
    assert_eq!(err.kind, SinkErrorKind::UniqueConflict, "{}", err.report());
    assert!(
        err.report()
            .contains("row (id)=(13) has unique key `uq_email` (email)=('b@x')"),
        "{}",
        err.report()
    );
    assert_eq!(
        db.sql(DB, "SELECT id, email, note FROM members ORDER BY id"),
        "1\ta@x\tfirst\n2\tb@x\tsecond"
    );
}
