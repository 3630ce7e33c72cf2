//! The PostgreSQL sink's table checks against a throwaway cluster: what the operator must fix
//! is reported at once (missing tables, columns and keys, generated and required columns,
//! credentials, database, schema), `create_tables` creates tables with the source's exact
//! types, and a source column the sink lacks is added to it before the first row carrying it.

use crate::{common, e2e};

use std::sync::Arc;

use common::changes::apply;
use common::changes::{claimed, open, pos, upsert};
use common::sinks::PIPELINE;
use common::sinks::postgres::{DB, SOURCE_MOOD_OID, col, options, server, table};
use e2e::pg::scram_role;
use zipline::change::{PG_EPOCH_MICROS, Table, Value};
use zipline::error::ErrorClass;
use zipline::sink::postgres::PostgresConnector;
use zipline::sink::{Batch, SinkConnector};

#[tokio::test]
async fn check_tables_reports_what_the_operator_must_fix() {
    let pg = server(
        "CREATE TABLE nokey (id int, v int);
         CREATE TABLE partial (id int, v int); CREATE UNIQUE INDEX ON partial (id) WHERE id > 0;
         CREATE TABLE narrow (id int PRIMARY KEY, tenant int NOT NULL,
                              total int GENERATED ALWAYS AS (id * 2) STORED);
         CREATE VIEW aview AS SELECT 1 AS id;",
    );
    let connector = claimed(PostgresConnector::new(PIPELINE, options(&pg))).await;
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
        err.report(),
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
            err.report()
                .contains("no PRIMARY KEY or UNIQUE index on exactly (id)"),
            "{}",
            err.report()
        );
    }

    let err = connector
        .check_tables(&[simple("narrow", &["id", "extra", "total"])])
        .await
        .expect_err("columns");
    // A source column the table lacks is added (nullable), as when the source gains one
    // mid-stream; what Zipline cannot fix itself is reported.
    assert!(
        pg.psql(DB, "SELECT attnotnull FROM pg_attribute WHERE attrelid = 'narrow'::regclass AND attname = 'extra'") == "f",
        "column extra should have been added to narrow, nullable"
    );
    assert!(!err.report().contains("\"extra\""), "{}", err.report());
    for needle in [
        "\"narrow\".\"tenant\" is NOT NULL without a default",
        "\"narrow\".\"total\" is generated",
    ] {
        assert!(err.report().contains(needle), "{needle}: {}", err.report());
    }
    let err = connector
        .check_tables(&[simple("aview", &["id"])])
        .await
        .expect_err("a view");
    assert!(err.report().contains("is not a table"), "{}", err.report());

    // Wrong credentials are fatal and never echo the password.
    scram_role(&pg, DB, "zipline_pw", "R1ght-pw");
    let mut opts = options(&pg);
    opts.user = "zipline_pw".into();
    opts.password = Some(zipline::config::Secret::new("s3cret-wrong-pw"));
    assert!(!format!("{opts:?}").contains("s3cret"));
    let err = PostgresConnector::new(PIPELINE, opts.clone())
        .check_tables(&[])
        .await
        .expect_err("wrong password");
    assert_eq!(err.class, ErrorClass::Fatal, "{}", err.report());
    assert!(
        err.report().contains("28P01") && !err.report().contains("s3cret"),
        "{}",
        err.report()
    );
    assert!(
        err.report().contains("check the sink's user and password"),
        "{}",
        err.report()
    );
    opts.password = None;
    let err = PostgresConnector::new(PIPELINE, opts)
        .check_tables(&[])
        .await
        .expect_err("no password");
    assert_eq!(err.class, ErrorClass::Fatal, "{}", err.report());

    let mut opts = options(&pg);
    opts.database = "nope".into();
    let err = PostgresConnector::new(PIPELINE, opts)
        .check_tables(&[])
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Fatal, "{}", err.report());
    assert!(err.report().contains("3D000"), "{}", err.report());

    let mut opts = options(&pg);
    opts.schema = Some("nope".into());
    let err = PostgresConnector::new(PIPELINE, opts)
        .check_tables(&[])
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Fatal, "{}", err.report());
    assert!(err.report().contains("3F000"), "{}", err.report());

    // Nothing listening: transient (the server may be starting).
    let mut opts = options(&pg);
    opts.port = common::free_port();
    let err = PostgresConnector::new(PIPELINE, opts)
        .check_tables(&[])
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{}", err.report());
}

#[tokio::test]
async fn create_tables_uses_the_source_types_exactly() {
    let pg = server("CREATE SCHEMA mirror");
    let mut opts = options(&pg);
    opts.create_tables = true;
    opts.schema = Some("mirror".into());
    let connector = claimed(PostgresConnector::new(PIPELINE, opts)).await;
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
        .unwrap_or_else(|e| panic!("{}", e.report()));
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
        Value::TimestampTz(1_000 - PG_EPOCH_MICROS),
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
        err.report()
            .contains("\"m\" (type OID 91234) of source table public.custom"),
        "{}",
        err.report()
    );
}

#[tokio::test]
async fn a_new_source_column_is_added_to_the_sink_before_its_first_row() {
    let pg = server("CREATE TABLE t (id int PRIMARY KEY, a text)");
    let connector = claimed(PostgresConnector::new(PIPELINE, options(&pg))).await;
    let v1 = table("t", vec![col("id", 23, -1, true), col("a", 25, -1, false)]);
    connector
        .check_tables(std::slice::from_ref(&v1))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
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
        ..Batch::default()
    };
    // The lane adds the column (nullable, the source's type) before writing the row.
    apply(&mut lane, batch.changes.clone()).await;
    assert_eq!(
        pg.psql(
            DB,
            "SELECT format_type(atttypid, atttypmod), attnotnull FROM pg_attribute \
                     WHERE attrelid = 't'::regclass AND attname = 'b'"
        ),
        "integer|f"
    );
    assert_eq!(
        pg.psql(DB, "SELECT id, a, b FROM t ORDER BY id"),
        "1|x|\n2|y|7"
    );
}
