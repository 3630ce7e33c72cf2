//! Schema changes mid-stream, replica identities, and large TOASTed values, end to end
//! through the real `zipline` binary into both sinks (MariaDB and PostgreSQL):
//!
//! - `*_columns_follow_the_source_and_toast_survives`: a 1 MB out-of-line value survives an
//!   update of another column (pgoutput sends it as "unchanged TOAST"); `ADD COLUMN`
//!   mid-stream adds the column on the sink before the first row carrying it, and later rows
//!   and updates of older rows carry its values; `DROP COLUMN` leaves the sink column, later
//!   inserts leave it NULL.
//! - `*_type_change_stops_before_the_change`: `ALTER COLUMN … TYPE` stops the pipeline with
//!   the column, both types and the fix named; no row written after the change is applied;
//!   after the operator alters the sink column, a restart applies them.
//! - `*_replica_identity_full_and_using_index`: `REPLICA IDENTITY FULL` (keyed by the primary
//!   key: inserts, updates incl. key changes and TOASTed values, deletes) and `USING INDEX`
//!   (keyed by the index's column) converge.
//! - `unusable_replica_identities_are_refused_at_startup`: FULL without any key, and NOTHING,
//!   stop at startup with the fix, leaving no slot and no publication behind.
//! - `mysql_refused_alter_names_the_statement_to_run`: a sink user without ALTER stops the
//!   pipeline at the new column with the statement to run; after it, a restart delivers.

use crate::e2e;

use std::time::{Duration, Instant};

use e2e::pg::{PgFixture, SINK_DB, pg_pipeline_yaml};
use e2e::{
    CONVERGE_TIMEOUT, Fixture, MY_DB, PG_DB, PipelineOpts, Rows, Zipline, pipeline_yaml,
    wait_streaming,
};
use mysql_async::prelude::Queryable;

/// The sink under test, with what it takes to talk to both ends.
enum Sink {
    My(Fixture),
    Pg(PgFixture),
}

impl Sink {
    fn mysql() -> Sink {
        Sink::My(Fixture::servers())
    }

    fn postgres() -> Sink {
        Sink::Pg(PgFixture::servers())
    }

    /// Runs `source_ddl` on the source and the DDL for the sink's dialect on the sink.
    fn tables(&self, source_ddl: &str, mysql_ddl: &str, pg_ddl: &str) {
        match self {
            Sink::My(fx) => {
                fx.pg.psql(PG_DB, source_ddl);
                fx.my.sql(MY_DB, mysql_ddl);
            }
            Sink::Pg(fx) => {
                fx.src.psql(PG_DB, source_ddl);
                fx.sink.psql(SINK_DB, pg_ddl);
            }
        }
    }

    /// Runs `sql` on the sink.
    fn sink_sql(&self, mysql: &str, pg: &str) -> String {
        match self {
            Sink::My(fx) => fx.my.sql(MY_DB, mysql),
            Sink::Pg(fx) => fx.sink.psql(SINK_DB, pg),
        }
    }

    /// Starts `zipline pipeline apply` with the standard pipeline into this sink.
    fn apply(&mut self) -> Zipline {
        let opts = PipelineOpts::default();
        match self {
            Sink::My(fx) => {
                fx.write_pipeline(&pipeline_yaml(&opts));
                fx.apply()
            }
            Sink::Pg(fx) => {
                fx.write_pipeline(&pg_pipeline_yaml(&opts));
                fx.apply()
            }
        }
    }

    async fn source(&self) -> tokio_postgres::Client {
        match self {
            Sink::My(fx) => fx.pg_client().await,
            Sink::Pg(fx) => fx.src_client().await,
        }
    }

    /// The rows `query` returns on the sink, every value as text; an SQL error (a column
    /// not added yet) as one row holding its text. `query` must be valid in both dialects (it
    /// is also run on the source for comparison).
    async fn sink_rows(&self, query: &str) -> Rows {
        let failed = |e: String| vec![vec![Some(format!("sink error: {e}"))]];
        match self {
            Sink::My(fx) => {
                let mut conn = fx.my.conn(MY_DB).await;
                match conn.query::<mysql_async::Row, _>(query).await {
                    Ok(rows) => rows
                        .into_iter()
                        .map(|r| {
                            (0..r.len())
                                .map(|i| r.get::<Option<String>, _>(i).flatten())
                                .collect()
                        })
                        .collect(),
                    Err(e) => failed(e.to_string()),
                }
            }
            Sink::Pg(fx) => match fx.sink_client().await.simple_query(query).await {
                Ok(messages) => e2e::rows_of(messages),
                Err(e) => failed(format!("{e:?}")),
            },
        }
    }

    /// The sink table's column names, in order.
    fn sink_columns(&self, table: &str) -> String {
        self.sink_sql(
            &format!(
                "SELECT GROUP_CONCAT(COLUMN_NAME ORDER BY ORDINAL_POSITION) FROM \
                 information_schema.COLUMNS WHERE TABLE_SCHEMA='{MY_DB}' AND TABLE_NAME='{table}'"
            ),
            &format!(
                "SELECT string_agg(attname::text, ',' ORDER BY attnum) FROM pg_attribute \
                 WHERE attrelid = 'public.{table}'::regclass AND attnum > 0 AND NOT attisdropped"
            ),
        )
    }
}

async fn text_rows(client: &tokio_postgres::Client, query: &str) -> Rows {
    e2e::pg_text_rows(client, query).await
}

/// Polls until `query` returns the same rows on the sink as on the source; fails with both
/// after [`CONVERGE_TIMEOUT`], or at once if zipline exits.
async fn wait_same(sink: &Sink, src: &tokio_postgres::Client, z: &mut Zipline, query: &str) {
    let started = Instant::now();
    loop {
        z.assert_running();
        let (a, b) = (text_rows(src, query).await, sink.sink_rows(query).await);
        if a == b {
            eprintln!(
                "e2e: converged in {:.1?}: {} rows of {query}",
                started.elapsed(),
                a.len()
            );
            return;
        }
        assert!(
            started.elapsed() < CONVERGE_TIMEOUT,
            "sink did not converge for {query}:\nsource {a:?}\nsink   {b:?}\nlog:\n{}",
            z.tail(60)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A 1 MB text value no compressor shrinks much: 32,768 md5 digests of distinct inputs.
const ONE_MB: &str = "(SELECT string_agg(md5('big' || i), '') FROM generate_series(1, 32768) i)";

const ITEMS_SRC: &str = "CREATE TABLE items (id bigint PRIMARY KEY, name text, big text);
     ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL";
const ITEMS_MY: &str =
    "CREATE TABLE items (id BIGINT PRIMARY KEY, name TEXT, big LONGTEXT) ENGINE=InnoDB";
const ITEMS_PG: &str = "CREATE TABLE items (id bigint PRIMARY KEY, name text, big text)";

/// Values compared after the columns were added (`big` by digest and length: 1 MB rows make
/// unreadable failure messages).
const ITEMS_WIDE: &str =
    "SELECT id, name, md5(big), length(big), email, score FROM items ORDER BY id";

async fn columns_follow_the_source_and_toast_survives(mut sink: Sink) {
    sink.tables(ITEMS_SRC, ITEMS_MY, ITEMS_PG);
    let mut z = sink.apply();
    let src = sink.source().await;
    wait_streaming(&src, &mut z, CONVERGE_TIMEOUT).await;

    // A 1 MB value, really stored out of line (in the TOAST table, not inline).
    src.batch_execute(&format!(
        "INSERT INTO items VALUES (1, 'first', {ONE_MB}), (2, 'second', 'small'), (3, 'third', NULL)"
    ))
    .await
    .unwrap();
    let toast_bytes: i64 = src
        .query_one(
            "SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE relname = 'items'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        toast_bytes >= 1 << 20,
        "the 1 MB value should be TOASTed out of line; TOAST table has {toast_bytes} bytes"
    );
    let narrow = "SELECT id, name, md5(big), length(big) FROM items ORDER BY id";
    wait_same(&sink, &src, &mut z, narrow).await;

    // An update of another column: `big` arrives as "unchanged TOAST"; the sink keeps it.
    src.batch_execute("UPDATE items SET name = 'renamed' WHERE id = 1")
        .await
        .unwrap();
    wait_same(&sink, &src, &mut z, narrow).await;
    let kept = sink
        .sink_rows("SELECT length(big) FROM items WHERE id = 1")
        .await;
    assert_eq!(kept, vec![vec![Some((1 << 20).to_string())]]);

    // Columns added mid-stream: rows after the change carry them, older rows get them by
    // update, and the 1 MB value survives an update under the new shape too.
    src.batch_execute(
        "ALTER TABLE items ADD COLUMN email text, ADD COLUMN score numeric(10,2);
         INSERT INTO items VALUES (4, 'fourth', 'b4', 'four@example.com', 4.25);
         UPDATE items SET email = 'two@example.com', score = 2.50 WHERE id = 2;
         UPDATE items SET score = 1.00 WHERE id = 1;
         INSERT INTO items (id, name) VALUES (5, 'fifth')",
    )
    .await
    .unwrap();
    wait_same(&sink, &src, &mut z, ITEMS_WIDE).await;
    assert_eq!(sink.sink_columns("items"), "id,name,big,email,score");
    let kept = sink
        .sink_rows("SELECT length(big) FROM items WHERE id = 1")
        .await;
    assert_eq!(kept, vec![vec![Some((1 << 20).to_string())]]);

    // A dropped column: the sink keeps it (and its values); later inserts leave it NULL.
    src.batch_execute(
        "ALTER TABLE items DROP COLUMN score;
         INSERT INTO items VALUES (6, 'sixth', 'b6', 'six@example.com');
         UPDATE items SET name = 'second!' WHERE id = 2",
    )
    .await
    .unwrap();
    let after_drop = "SELECT id, name, md5(big), length(big), email FROM items ORDER BY id";
    wait_same(&sink, &src, &mut z, after_drop).await;
    assert_eq!(sink.sink_columns("items"), "id,name,big,email,score");
    let scores = sink
        .sink_rows("SELECT id, score FROM items WHERE id IN (2, 6) ORDER BY id")
        .await;
    let text = |s: &str| Some(s.to_owned());
    assert_eq!(
        scores,
        vec![vec![text("2"), text("2.50")], vec![text("6"), None]]
    );
    z.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_columns_follow_the_source_and_toast_survives() {
    columns_follow_the_source_and_toast_survives(Sink::mysql()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_columns_follow_the_source_and_toast_survives() {
    columns_follow_the_source_and_toast_survives(Sink::postgres()).await;
}

async fn type_change_stops_before_the_change(mut sink: Sink) {
    sink.tables(
        "CREATE TABLE stock (id bigint PRIMARY KEY, qty integer)",
        "CREATE TABLE stock (id BIGINT PRIMARY KEY, qty INT) ENGINE=InnoDB",
        "CREATE TABLE stock (id bigint PRIMARY KEY, qty integer)",
    );
    let mut z = sink.apply();
    let src = sink.source().await;
    wait_streaming(&src, &mut z, CONVERGE_TIMEOUT).await;
    src.batch_execute("INSERT INTO stock VALUES (1, 10), (2, 20)")
        .await
        .unwrap();
    let all = "SELECT id, qty FROM stock ORDER BY id";
    wait_same(&sink, &src, &mut z, all).await;

    src.batch_execute(
        "ALTER TABLE stock ALTER COLUMN qty TYPE bigint;
         INSERT INTO stock VALUES (3, 30000000000);
         UPDATE stock SET qty = 11 WHERE id = 1",
    )
    .await
    .unwrap();
    let status = z
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("zipline kept running after a type change:\n{}", z.tail(40)));
    assert!(!status.success(), "exit status {status}");
    let out = z.output();
    for needle in [
        "column public.stock.qty changed type from integer to bigint",
        "then start Zipline again: it resumes right at the change",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
    // The statement to run, in the sink's own SQL.
    assert!(
        out.contains("in sink mysql-out: ALTER TABLE `shop`.`stock` MODIFY `qty` BIGINT")
            || out.contains(
                "in sink pg-out: ALTER TABLE \"public\".\"stock\" ALTER COLUMN \"qty\" TYPE bigint"
            ),
        "no statement in the sink's dialect in:\n{out}"
    );
    // Nothing written after the change reached the sink.
    let expected: Rows = vec![
        vec![Some("1".into()), Some("10".into())],
        vec![Some("2".into()), Some("20".into())],
    ];
    assert_eq!(sink.sink_rows(all).await, expected);

    // The operator's fix, then a restart: the rows after the change arrive.
    sink.sink_sql(
        "ALTER TABLE stock MODIFY qty BIGINT",
        "ALTER TABLE stock ALTER COLUMN qty TYPE bigint",
    );
    let mut z = sink.apply();
    wait_same(&sink, &src, &mut z, all).await;
    assert_eq!(sink.sink_rows(all).await.len(), 3);
    z.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_type_change_stops_before_the_change() {
    type_change_stops_before_the_change(Sink::mysql()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_type_change_stops_before_the_change() {
    type_change_stops_before_the_change(Sink::postgres()).await;
}

async fn replica_identity_full_and_using_index(mut sink: Sink) {
    sink.tables(
        "CREATE TABLE fullt (id bigint PRIMARY KEY, name text, big text);
         ALTER TABLE fullt ALTER COLUMN big SET STORAGE EXTERNAL;
         ALTER TABLE fullt REPLICA IDENTITY FULL;
         CREATE TABLE byidx (id bigint, code text NOT NULL, v text);
         CREATE UNIQUE INDEX byidx_code ON byidx (code);
         ALTER TABLE byidx REPLICA IDENTITY USING INDEX byidx_code",
        "CREATE TABLE fullt (id BIGINT PRIMARY KEY, name TEXT, big LONGTEXT) ENGINE=InnoDB;
         CREATE TABLE byidx (id BIGINT, code VARCHAR(100) NOT NULL UNIQUE, v TEXT) ENGINE=InnoDB",
        "CREATE TABLE fullt (id bigint PRIMARY KEY, name text, big text);
         CREATE TABLE byidx (id bigint, code text NOT NULL UNIQUE, v text)",
    );
    let mut z = sink.apply();
    let src = sink.source().await;
    wait_streaming(&src, &mut z, CONVERGE_TIMEOUT).await;

    src.batch_execute(&format!(
        "INSERT INTO fullt SELECT g, 'n' || g, NULL FROM generate_series(1, 20) g;
         UPDATE fullt SET big = {ONE_MB} WHERE id IN (1, 2);
         INSERT INTO byidx SELECT g, 'c' || g, 'v' || g FROM generate_series(1, 20) g"
    ))
    .await
    .unwrap();
    let full = "SELECT id, name, md5(big), length(big) FROM fullt ORDER BY id";
    let byidx = "SELECT id, code, v FROM byidx ORDER BY code";
    wait_same(&sink, &src, &mut z, full).await;
    wait_same(&sink, &src, &mut z, byidx).await;

    src.batch_execute(
        // FULL: updates of other columns (the TOASTed value comes from the full old row),
        // key changes with and without the TOASTed value, deletes.
        "UPDATE fullt SET name = 'renamed' WHERE id IN (1, 3);
         UPDATE fullt SET id = 101 WHERE id = 2;
         UPDATE fullt SET id = 103, name = 'moved' WHERE id = 3;
         DELETE FROM fullt WHERE id IN (4, 5, 101);
         UPDATE fullt SET big = 'short now' WHERE id = 6;
         -- USING INDEX: keyed by code, whatever happens to id.
         UPDATE byidx SET v = 'changed', id = id + 100 WHERE code IN ('c1', 'c2');
         UPDATE byidx SET code = 'moved3' WHERE code = 'c3';
         DELETE FROM byidx WHERE code IN ('c4', 'c5');
         INSERT INTO byidx VALUES (4, 'c4', 'again')",
    )
    .await
    .unwrap();
    wait_same(&sink, &src, &mut z, full).await;
    wait_same(&sink, &src, &mut z, byidx).await;
    let kept = sink
        .sink_rows("SELECT length(big) FROM fullt WHERE id = 1")
        .await;
    assert_eq!(kept, vec![vec![Some((1 << 20).to_string())]]);
    let count = |rows: Rows| rows.len();
    assert_eq!(count(sink.sink_rows(full).await), 17);
    assert_eq!(count(sink.sink_rows(byidx).await), 19);
    z.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_replica_identity_full_and_using_index() {
    replica_identity_full_and_using_index(Sink::mysql()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_replica_identity_full_and_using_index() {
    replica_identity_full_and_using_index(Sink::postgres()).await;
}

#[test]
fn unusable_replica_identities_are_refused_at_startup() {
    let mut fx = Fixture::servers();
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    let args = fx.args("apply");
    let cases = [
        (
            "CREATE TABLE fullnokey (a int, b text); ALTER TABLE fullnokey REPLICA IDENTITY FULL",
            "fullnokey",
            &[
                "table public.fullnokey has REPLICA IDENTITY FULL but no primary key",
                "ADD PRIMARY KEY",
            ][..],
        ),
        (
            "CREATE TABLE nothing (id int PRIMARY KEY, b text); \
             ALTER TABLE nothing REPLICA IDENTITY NOTHING",
            "nothing",
            &[
                "table public.nothing has REPLICA IDENTITY NOTHING",
                "REPLICA IDENTITY DEFAULT",
            ][..],
        ),
    ];
    for (ddl, table, needles) in cases {
        fx.pg.psql(PG_DB, ddl);
        fx.my.sql(
            MY_DB,
            &format!("CREATE TABLE {table} (a INT PRIMARY KEY, b TEXT)"),
        );
        let env = fx.env();
        let (code, output, _) = fx.run_to_exit(&args, &env, Duration::from_secs(60));
        assert_eq!(code, 1, "exit code; output:\n{output}");
        let line = output
            .lines()
            .find(|l| l.starts_with("error: "))
            .unwrap_or_else(|| panic!("no error line:\n{output}"));
        for needle in needles {
            assert!(line.contains(needle), "missing {needle:?} in:\n{line}");
        }
        assert_eq!(
            fx.slots_and_publications(),
            (String::new(), String::new()),
            "a refused table must leave no slot and no publication"
        );
        fx.pg.psql(PG_DB, &format!("DROP TABLE {table}"));
    }
}

/// A sink user that may not ALTER: the pipeline stops naming the table, the column and the
/// statement to run; once the operator ran it, a restart delivers the rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_refused_alter_names_the_statement_to_run() {
    let mut fx = Fixture::servers();
    fx.pg.psql(
        PG_DB,
        "CREATE TABLE notes (id bigint PRIMARY KEY, body text)",
    );
    fx.my.sql(
        MY_DB,
        "CREATE TABLE notes (id BIGINT PRIMARY KEY, body TEXT) ENGINE=InnoDB;
         CREATE USER 'limited'@'127.0.0.1'; CREATE USER 'limited'@'localhost';
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, INDEX ON shop.* TO 'limited'@'127.0.0.1';
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, INDEX ON shop.* TO 'limited'@'localhost'",
    );
    fx.write_pipeline(
        &pipeline_yaml(&PipelineOpts::default()).replace("user: root", "user: limited"),
    );
    let mut z = fx.apply();
    let src = fx.pg_client().await;
    wait_streaming(&src, &mut z, CONVERGE_TIMEOUT).await;
    let sink = Sink::My(fx);
    src.batch_execute("INSERT INTO notes VALUES (1, 'one')")
        .await
        .unwrap();
    wait_same(
        &sink,
        &src,
        &mut z,
        "SELECT id, body FROM notes ORDER BY id",
    )
    .await;

    src.batch_execute(
        "ALTER TABLE notes ADD COLUMN tag varchar(10);
         INSERT INTO notes VALUES (2, 'two', 'x')",
    )
    .await
    .unwrap();
    let status = z
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("zipline kept running without the column:\n{}", z.tail(40)));
    assert!(!status.success(), "exit status {status}");
    let out = z.output();
    let statement = "ALTER TABLE `shop`.`notes` ADD COLUMN `tag` VARCHAR(10) NULL";
    for needle in ["source column public.notes.tag", statement, "1142"] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
    let Sink::My(mut fx) = sink else {
        unreachable!()
    };
    fx.my.sql(MY_DB, statement);
    let mut z = fx.apply();
    let sink = Sink::My(fx);
    let all = "SELECT id, body, tag FROM notes ORDER BY id";
    wait_same(&sink, &src, &mut z, all).await;
    assert_eq!(sink.sink_rows(all).await.len(), 2);
    z.terminate_cleanly(Duration::from_secs(15));
}
