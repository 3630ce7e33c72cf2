//! The MySQL/MariaDB sink's own scenarios (its contract is `contract::mysql`): what the
//! operator must fix in its tables, values with no MySQL form, and a conflict on a unique key
//! other than the key.

use crate::common;
use common::changes::{claimed, open, pos, upsert};
use common::sinks::PIPELINE;
use common::sinks::mysql::{DB, options, order_row, orders, server, table};
use zipline::change::Value;
use zipline::error::ErrorClass;
use zipline::sink::mysql::MysqlConnector;
use zipline::sink::{Batch, SinkConnector, SnapshotTarget};

/// Besides the contract's too-long value: a value that is not what its variant promises is
/// definite before anything is sent, and a NaN is NULL in a DOUBLE column.
#[tokio::test]
async fn values_with_no_mysql_form_are_definite_or_null_and_leave_the_lane_usable() {
    let db = server("CREATE TABLE tags (id INT PRIMARY KEY, name VARCHAR(5) NOT NULL)");
    let connector = claimed(MysqlConnector::new(PIPELINE, options(&db))).await;
    let tags = table("tags", &[("id", true), ("name", false)]);
    connector
        .check_tables(std::slice::from_ref(&tags))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
    let mut lane = open(&connector, 0, 1).await;
    let row = |id, name: &str| vec![Value::Int4(id), Value::Text(name.into())];
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
    let connector = claimed(MysqlConnector::new(PIPELINE, options(&db))).await;

    let missing = table("missing", &[("id", true), ("v", false)]);
    let err = connector
        .check_tables(&[missing])
        .await
        .expect_err("missing table");
    assert_eq!(err.class, ErrorClass::Fatal);
    assert_eq!(
        err.report(),
        "sink mysql-out: table `shop`.`missing` does not exist (source table public.missing); \
         create it with a primary key on (id), or set create_tables: true"
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
    opts.password = Some(zipline::config::Secret::new("s3cret-pw"));
    assert!(!format!("{opts:?}").contains("s3cret-pw"));
    let err = MysqlConnector::new(PIPELINE, opts)
        .check_tables(&[])
        .await
        .expect_err("root has no password");
    assert_eq!(err.class, ErrorClass::Fatal, "{}", err.report());
    assert!(err.report().contains("1045") && !err.report().contains("s3cret-pw"));

    let mut opts = options(&db);
    opts.database = "nope".into();
    let err = MysqlConnector::new(PIPELINE, opts)
        .check_tables(&[])
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Fatal, "{}", err.report());
    assert!(err.report().contains("1049"), "{}", err.report());

    // Nothing listening: transient (the server may be starting).
    let mut opts = options(&db);
    opts.port = common::free_port();
    let err = MysqlConnector::new(PIPELINE, opts)
        .check_tables(&[])
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{}", err.report());
}

/// A sink table with a unique key besides its key: a change whose row conflicts on it with
/// another row fails naming both keys, and never overwrites (or, in the snapshot, deletes)
/// the other row. The PostgreSQL sink has always refused such rows (23505).
#[tokio::test]
async fn a_conflict_on_another_unique_key_fails_naming_both_rows_and_touches_neither() {
    unique_conflict(0).await;
}

/// The same through MariaDB's bulk execution, where the statement holds no rows to name.
#[tokio::test]
async fn a_conflict_on_another_unique_key_in_bulk_fails_naming_both_rows_and_touches_neither() {
    unique_conflict(1).await;
}

async fn unique_conflict(bulk_min_rows: usize) {
    use zipline::sink::{SinkErrorKind, SnapshotChunk};
    let db = server(
        "CREATE TABLE members (id INT PRIMARY KEY, email VARCHAR(64) NOT NULL, \
                     note TEXT NULL, UNIQUE KEY uq_email (email))",
    );
    let mut opts = options(&db);
    opts.bulk_min_rows = bulk_min_rows;
    let connector = claimed(MysqlConnector::new(PIPELINE, opts)).await;
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
    // Bulk execution prepares the upsert once and sends one request per batch (three), not
    // one per row (four); text statements prepare nothing. The server is the test's own.
    let executed = db.sql(
        "",
        "SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_stmt_prepare', 'Com_stmt_execute')",
    );
    let expected = if bulk_min_rows > 0 { (3, 1) } else { (0, 0) };
    assert_eq!(
        executed,
        format!(
            "Com_stmt_execute\t{}\nCom_stmt_prepare\t{}",
            expected.0, expected.1
        )
    );

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
