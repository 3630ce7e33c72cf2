//! Type fidelity: a table with a column of every common PostgreSQL type (`tests/e2e/zoo.rs`),
//! rows of edge values (extreme numbers, NaN, infinities, year 1, BC dates, infinite
//! timestamps, the first and last dates and timestamps PostgreSQL holds, several time zones,
//! unicode, empty and nested arrays, NULL everywhere), through
//! a pipeline with `create_tables: true`:
//!
//! - `mysql_sink_round_trips_the_type_zoo` (and `…_in_bulk`, through MariaDB's bulk
//!   execution): the initial snapshot (LOAD DATA) and then streamed
//!   inserts and updates (lane upserts) of the same values; the sink equals the source value
//!   for value through the mapping documented in `docs/types.md` (NULL where MySQL has no
//!   equivalent, and a warning saying so).
//! - `postgres_sink_round_trips_the_type_zoo`: the same through the PostgreSQL sink (COPY,
//!   then unnest upserts), where every value must come back exactly.
//! - `binary_values_round_trip_then_fall_back_to_text`: the columns of types Zipline reads in
//!   pgoutput's binary format, streamed in binary into the PostgreSQL sink, exact; then a
//!   column of a type read only in text is added, and the stream goes on in text.
//! - `composite_columns_are_refused_at_startup`: a table with a composite-typed column stops
//!   the pipeline before a slot or publication exists, naming table.column and the type.

use crate::e2e;
#[path = "../e2e/zoo.rs"]
mod zoo;

use std::time::{Duration, Instant};

use e2e::pg::{PgFixture, SINK_DB, pg_pipeline_yaml, wait_converged as pg_wait_converged};
use e2e::{
    CONVERGE_TIMEOUT, Fixture, MY_DB, PG_DB, PipelineOpts, Rows, Zipline, diff_rows, pipeline_yaml,
    wait_streaming,
};
use mysql_async::prelude::Queryable;
use zoo::Expect;

fn opts(sink_extra: &[&str]) -> PipelineOpts {
    let mut o = PipelineOpts {
        source_extra: vec!["tables: [zoo, zoo_enum]".to_owned()],
        ..PipelineOpts::default()
    };
    o.sink_extra
        .extend(sink_extra.iter().map(|s| (*s).to_owned()));
    o
}

/// The source's rows of `zoo` in the canonical form [`my_zoo`] produces.
async fn pg_zoo(pg: &tokio_postgres::Client) -> Rows {
    let exprs: Vec<String> = zoo::COLUMNS
        .iter()
        .map(|c| match zoo::expect(c) {
            Expect::Array => format!("to_json({c})::text"),
            // The type's output function, as pgoutput and COPY use it (`inet::text` would add
            // a /32 that the output function leaves out).
            _ => format!("CASE WHEN {c} IS NULL THEN NULL ELSE format('%s', {c}) END"),
        })
        .collect();
    let sql = format!(
        "SET TimeZone = 'UTC'; SELECT id::text, {} FROM zoo ORDER BY id",
        exprs.join(", ")
    );
    simple_rows(pg, &sql)
        .await
        .into_iter()
        .map(|row| {
            let mut out = vec![row[0].clone()];
            for (c, v) in zoo::COLUMNS.iter().zip(&row[1..]) {
                out.push(v.as_deref().and_then(|v| pg_canonical(c, v)));
            }
            out
        })
        .collect()
}

async fn simple_rows(pg: &tokio_postgres::Client, sql: &str) -> Rows {
    e2e::pg_text_rows(pg, sql).await
}

/// What the MySQL sink should hold for PostgreSQL text `v` of column `c`, canonically.
fn pg_canonical(c: &str, v: &str) -> Option<String> {
    // MySQL's dates end at 9999: PostgreSQL prints later years with more digits.
    let beyond_9999 = v.split_once('-').is_some_and(|(year, _)| year.len() > 4);
    let non_finite = matches!(
        v,
        "NaN" | "Infinity" | "-Infinity" | "infinity" | "-infinity"
    ) || v.ends_with(" BC")
        || (zoo::expect(c) == Expect::Temporal && beyond_9999);
    Some(match zoo::expect(c) {
        Expect::Same => v.to_owned(),
        Expect::Number | Expect::Temporal if non_finite => return None,
        Expect::Number => match c {
            "f4" => format!("{:e}", v.parse::<f32>().expect("real text")),
            "f8" => format!("{:e}", v.parse::<f64>().expect("double text")),
            _ => v.to_owned(),
        },
        Expect::TrimEnd => v.trim_end_matches(' ').to_owned(),
        Expect::Bool => if v == "true" || v == "t" { "1" } else { "0" }.to_owned(),
        Expect::Bytes => v.to_owned(),
        Expect::Json | Expect::Array => json(v),
        Expect::Temporal => v.strip_suffix("+00").unwrap_or(v).to_owned(),
    })
}

fn json(text: &str) -> String {
    let parsed: serde_json::Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
    parsed.to_string()
}

/// The sink's rows of `zoo`, each value rendered canonically (see [`pg_canonical`]).
async fn my_zoo(my: &mut mysql_async::Conn) -> Rows {
    let sql = format!(
        "SELECT id, {} FROM {MY_DB}.zoo ORDER BY id",
        zoo::COLUMNS
            .iter()
            .map(|c| format!("`{c}`"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let rows: Vec<mysql_async::Row> = my.exec(sql, ()).await.expect("reading the sink's zoo");
    rows.into_iter()
        .map(|row| {
            let values = row.unwrap();
            let mut out = vec![my_text(&values[0], false)];
            for (c, v) in zoo::COLUMNS.iter().zip(&values[1..]) {
                out.push(my_text(v, *c == "d").map(|t| match zoo::expect(c) {
                    Expect::Json | Expect::Array => json(&t),
                    _ => t,
                }));
                if zoo::expect(c) == Expect::Bytes
                    && let (Some(slot), mysql_async::Value::Bytes(b)) = (out.last_mut(), v)
                {
                    *slot = Some(format!("\\x{}", hex(b)));
                }
            }
            out
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A binary-protocol MySQL value as text: floats in Rust's exponent form, dates and times as
/// PostgreSQL prints them (no trailing fractional zeros). DATE and DATETIME both arrive as
/// `Value::Date`: `date_only` tells them apart.
fn my_text(v: &mysql_async::Value, date_only: bool) -> Option<String> {
    use mysql_async::Value as V;
    let frac = |us: u32| {
        if us == 0 {
            String::new()
        } else {
            format!(".{us:06}").trim_end_matches('0').to_owned()
        }
    };
    Some(match v {
        V::NULL => return None,
        V::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        V::Int(i) => i.to_string(),
        V::UInt(u) => u.to_string(),
        V::Float(f) => format!("{f:e}"),
        V::Double(f) => format!("{f:e}"),
        V::Date(y, mo, d, ..) if date_only => format!("{y:04}-{mo:02}-{d:02}"),
        V::Date(y, mo, d, h, mi, s, us) => {
            format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}{}", frac(*us))
        }
        V::Time(neg, days, h, mi, s, us) => format!(
            "{}{:02}:{mi:02}:{s:02}{}",
            if *neg { "-" } else { "" },
            days * 24 + u32::from(*h),
            frac(*us)
        ),
    })
}

/// Polls until `my_zoo` equals the source's `zoo` (and `zoo_enum` as text), or fails.
async fn wait_my_zoo(
    pg: &tokio_postgres::Client,
    my: &mut mysql_async::Conn,
    z: &mut Zipline,
    rows: usize,
) {
    let started = Instant::now();
    loop {
        z.assert_running();
        let (want, got) = (pg_zoo(pg).await, my_zoo(my).await);
        let want_enum = simple_rows(
            pg,
            "SELECT id::text, m::text, ma::text FROM zoo_enum ORDER BY id",
        )
        .await;
        let got_enum = my_enum(my).await;
        let diff = diff_rows(&want, &got).or_else(|| diff_rows(&want_enum, &got_enum));
        if diff.is_none() && want.len() == rows {
            return;
        }
        assert!(
            started.elapsed() < CONVERGE_TIMEOUT,
            "the MySQL sink's zoo does not match the source (expected {rows} rows):\n{}\nzipline log:\n{}",
            diff.unwrap_or_default(),
            z.tail(60)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn my_enum(my: &mut mysql_async::Conn) -> Rows {
    let rows: Vec<(i32, Option<String>, Option<String>)> = my
        .query(format!(
            "SELECT id, m, ma FROM {MY_DB}.zoo_enum ORDER BY id"
        ))
        .await
        .expect("reading the sink's zoo_enum");
    rows.into_iter()
        .map(|(id, m, ma)| vec![Some(id.to_string()), m, ma])
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_sink_round_trips_the_type_zoo() {
    mysql_zoo("bulk_min_rows: 0").await;
}

/// The same with every streamed group written by MariaDB's bulk execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_sink_round_trips_the_type_zoo_in_bulk() {
    mysql_zoo("bulk_min_rows: 1").await;
}

async fn mysql_zoo(bulk: &str) {
    let mut fx = Fixture::servers();
    fx.pg.psql(PG_DB, zoo::SOURCE_DDL);
    fx.pg.psql(PG_DB, zoo::ROWS);
    fx.write_pipeline(&pipeline_yaml(&opts(&["create_tables: true", bulk])));
    let pg = fx.pg_client().await;
    let mut my = fx.my_checker().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(60)).await;

    // The created table's types follow the documented mapping.
    let types: Vec<(String, String)> = my
        .query(format!(
            "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = '{MY_DB}' AND TABLE_NAME = 'zoo' ORDER BY ORDINAL_POSITION"
        ))
        .await
        .expect("reading the created table");
    let types: std::collections::HashMap<_, _> = types.into_iter().collect();
    for (column, ty) in [
        ("id", "int(11)"),
        ("n", "longtext"),
        ("n124", "decimal(12,4)"),
        ("f4", "float"),
        ("c", "char(5)"),
        ("tstz", "datetime(6)"),
        ("ttz", "varchar(32)"),
        ("ip", "varchar(43)"),
    ] {
        assert_eq!(
            types.get(column).map(String::as_str),
            Some(ty),
            "column {column}: {types:?}"
        );
    }

    wait_my_zoo(&pg, &mut my, &mut z, 10).await;
    let out = z.output();
    assert!(
        out.contains("wrote NULL instead") && out.contains("zoo.n124"),
        "a NaN written as NULL must be logged with its column:\n{out}"
    );

    fx.pg.psql(PG_DB, zoo::CHANGES);
    wait_my_zoo(&pg, &mut my, &mut z, 20).await;
    z.terminate_cleanly(Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sink_round_trips_the_type_zoo() {
    let mut fx = PgFixture::servers();
    fx.src.psql(PG_DB, zoo::SOURCE_DDL);
    fx.src.psql(PG_DB, zoo::ROWS);
    // create_tables cannot create types the source defined: the enum table is made here.
    fx.sink.psql(
        SINK_DB,
        "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy 😀', 'it''s'); \
         CREATE TABLE zoo_enum (id int PRIMARY KEY, m mood, ma mood[]);",
    );
    fx.write_pipeline(&pg_pipeline_yaml(&opts(&["create_tables: true"])));
    let src = fx.src_client().await;
    let sink = fx.sink_client().await;
    let mut z = fx.apply();
    wait_streaming(&src, &mut z, Duration::from_secs(60)).await;
    for (table, rows) in [("zoo", 10), ("zoo_enum", 3)] {
        let n = pg_wait_converged(&src, &sink, table, Some(&mut z), CONVERGE_TIMEOUT).await;
        assert_eq!(n, rows, "{table} after the snapshot");
    }
    let created = fx.sink.psql(
        SINK_DB,
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute \
         WHERE attrelid = 'zoo'::regclass AND attname IN ('n124', 'c', 'tstz') ORDER BY attnum",
    );
    assert_eq!(
        created.split_whitespace().collect::<Vec<_>>().join(" "),
        "numeric(12,4) character(5) timestamp with time zone"
    );

    fx.src.psql(PG_DB, zoo::CHANGES);
    for (table, rows) in [("zoo", 20), ("zoo_enum", 6)] {
        pg_wait_rows(&src, &sink, table, rows, &mut z).await;
    }
    z.terminate_cleanly(Duration::from_secs(30));
}

/// Waits until `table` holds the same `rows` rows in the source and the sink.
async fn pg_wait_rows(
    src: &tokio_postgres::Client,
    sink: &tokio_postgres::Client,
    table: &str,
    rows: usize,
    z: &mut Zipline,
) {
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let n = pg_wait_converged(src, sink, table, Some(&mut *z), CONVERGE_TIMEOUT).await;
        if n == rows {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{table}: {n} rows, expected {rows}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The zoo's columns whose types Zipline reads in binary format.
const BINARY_COLUMNS: &str =
    "i2, i4, i8, n, n124, f4, f8, b, t, vc, c, by, u, j, jb, d, tm, ts, tstz";

/// Values in binary format (pgoutput's `binary` option): the zoo's edge values in every
/// column of a type Zipline reads in binary, streamed as inserts, updates and deletes, come
/// out in the PostgreSQL sink exactly as the source holds them. Then a column of a type read
/// only in text is added mid-stream: the stream goes on in text and loses no value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_values_round_trip_then_fall_back_to_text() {
    let mut fx = PgFixture::servers();
    fx.src.psql(PG_DB, zoo::SOURCE_DDL);
    fx.src.psql(PG_DB, zoo::ROWS);
    fx.src.psql(
        PG_DB,
        &format!(
            "CREATE TABLE zb AS SELECT id, {BINARY_COLUMNS} FROM zoo WITH NO DATA; \
             ALTER TABLE zb ADD PRIMARY KEY (id);"
        ),
    );
    let mut o = opts(&["create_tables: true"]);
    o.source_extra = vec!["tables: [zb]".to_owned()];
    fx.write_pipeline(&pg_pipeline_yaml(&o));
    let src = fx.src_client().await;
    let sink = fx.sink_client().await;
    let mut z = fx.apply();
    wait_streaming(&src, &mut z, Duration::from_secs(60)).await;
    assert!(
        z.output().contains("binary_values=true"),
        "the stream must start in binary:\n{}",
        z.output()
    );

    // Every edge value inserted, then written again by an update, and a delete.
    fx.src.psql(
        PG_DB,
        &format!(
            "INSERT INTO zb SELECT id, {BINARY_COLUMNS} FROM zoo; \
             INSERT INTO zb SELECT id + 100, {BINARY_COLUMNS} FROM zoo; \
             UPDATE zb z SET ({BINARY_COLUMNS}) = (SELECT {BINARY_COLUMNS} FROM zoo s \
                 WHERE s.id = z.id % 10 + 1) WHERE z.id < 100; \
             DELETE FROM zb WHERE id = 105;"
        ),
    );
    pg_wait_rows(&src, &sink, "zb", 19, &mut z).await;

    fx.src.psql(
        PG_DB,
        "ALTER TABLE zb ADD COLUMN iv interval; \
         INSERT INTO zb (id, i4, iv) VALUES (200, 1, '1 day 02:00'); \
         UPDATE zb SET iv = '-3 mons', n = 0.5 WHERE id = 2;",
    );
    pg_wait_rows(&src, &sink, "zb", 20, &mut z).await;
    let out = z.output();
    assert!(
        out.contains("in text from here on") && out.contains("column=iv"),
        "the switch to text must be logged with its column:\n{out}"
    );
    assert!(
        out.matches("binary_values=false").count() >= 1,
        "the stream must restart in text:\n{out}"
    );
    z.terminate_cleanly(Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn composite_columns_are_refused_at_startup() {
    let mut fx = Fixture::servers();
    fx.pg.psql(
        PG_DB,
        "CREATE TYPE pair AS (a int, b text); \
         CREATE DOMAIN pairs AS pair[]; \
         CREATE TABLE zoo (id int PRIMARY KEY, p pair, ok text, ps pairs); \
         CREATE TABLE zoo_enum (id int PRIMARY KEY);",
    );
    fx.write_pipeline(&pipeline_yaml(&opts(&["create_tables: true"])));
    let args = fx.args("apply");
    let env = fx.env();
    let (code, output, _) = fx.run_to_exit(&args, &env, Duration::from_secs(60));
    assert_eq!(code, 1, "{output}");
    let line = output
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line:\n{output}"));
    for needle in [
        "public.zoo.p has composite type pair",
        "public.zoo.ps has type pairs, built on composite type pair",
        "remove the table from the publication",
    ] {
        assert!(line.contains(needle), "{needle:?} missing from:\n{line}");
    }
    assert!(!line.contains("zoo.ok"), "{line}");
    let (slots, publications) = fx.slots_and_publications();
    assert_eq!(
        (slots.trim(), publications.trim()),
        ("", ""),
        "left behind on the source"
    );
}
