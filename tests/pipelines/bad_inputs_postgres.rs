//! Bad `sink/postgres` configurations and unusable sinks: each must make `zipline` exit
//! non-zero with an `error:` line naming the problem (file:line and field for configuration
//! errors, exit 2; the sink, table, column or server for runtime errors, exit 1), must never
//! print a password, and must leave nothing behind on the source (no replication slot, no
//! publication). Also the positive cases next to them: `create_tables` creating the sink table
//! and a SCRAM password from `secret_refs`.

use crate::e2e;

use std::time::Duration;

use e2e::pg::{PgFixture, SINK_DB, pg_pipeline_yaml, scram_role, wait_converged};
use e2e::{CONVERGE_TIMEOUT, PG_DB, PG_ORDERS, PipelineOpts, wait_streaming};

const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
const RIGHT_PASSWORD: &str = "R1ght-Sink-Pa55";
const WRONG_PASSWORD: &str = "Wr0ng-Sink-Pa55";

/// Runs `zipline pipeline <verb>` with `env`; asserts the exit code, that every needle is in
/// the `error:` line and that nothing was created on the source; returns that line.
fn expect_failure(
    fx: &mut PgFixture,
    verb: &str,
    env: &[(String, String)],
    code: i32,
    needles: &[&str],
) -> String {
    let args = fx.args(verb);
    let (got, output, _) = fx.run_to_exit(&args, env, EXIT_TIMEOUT);
    eprintln!("e2e: zipline {verb} exited {got}:\n{output}");
    assert_eq!(got, code, "exit code of zipline {verb}; output:\n{output}");
    let line = output
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no `error:` line in zipline's output:\n{output}"))
        .to_owned();
    for needle in needles {
        assert!(
            line.contains(needle),
            "the error should mention {needle:?}:\n{line}"
        );
    }
    let created = fx.src.psql(
        PG_DB,
        "SELECT (SELECT count(*) FROM pg_replication_slots) + \
                (SELECT count(*) FROM pg_publication)",
    );
    assert_eq!(
        created, "0",
        "a refused configuration must create no slot and no publication"
    );
    line
}

fn yaml_with(sink_extra: &[&str]) -> String {
    pg_pipeline_yaml(&PipelineOpts {
        sink_extra: sink_extra.iter().map(|s| (*s).to_owned()).collect(),
        ..PipelineOpts::default()
    })
}

fn env_with(fx: &PgFixture, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = fx.env();
    env.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    env
}

#[test]
fn configuration_errors_name_file_line_and_field() {
    let mut fx = PgFixture::start();
    let env = fx.env();
    let cases: &[(&[&str], &str, &str)] = &[
        (
            &["create_tables: maybe"],
            "create_tables",
            "expected true or false",
        ),
        (&["schema: \"\""], "schema", "must not be empty"),
        (&["batch_size: 0"], "batch_size", "between 1 and"),
        (&["slot_name: nope"], "slot_name", "unknown field"),
    ];
    for &(extra, field, message) in cases {
        let yaml = yaml_with(extra);
        fx.write_pipeline(&yaml);
        let line_no = yaml.lines().position(|l| l.contains(extra[0])).unwrap() + 1;
        for verb in ["validate", "apply"] {
            expect_failure(
                &mut fx,
                verb,
                &env,
                2,
                &[
                    &format!("orders.yaml:{line_no}: connectors[1].{field}"),
                    message,
                ],
            );
        }
    }
}

#[test]
fn missing_sink_table_and_column_are_named() {
    let mut fx = PgFixture::start();
    fx.src.psql(
        PG_DB,
        "CREATE TABLE invoices (id bigint PRIMARY KEY, total numeric(12,2))",
    );
    fx.write_pipeline(&yaml_with(&[]));
    let env = fx.env();
    expect_failure(
        &mut fx,
        "apply",
        &env,
        1,
        &[
            "pg-out",
            "\"public\".\"invoices\" does not exist",
            "create_tables",
        ],
    );
    // A missing column is added; a required column the source lacks cannot be fixed so.
    fx.sink.psql(
        SINK_DB,
        "CREATE TABLE invoices (id bigint PRIMARY KEY, legacy int NOT NULL)",
    );
    expect_failure(
        &mut fx,
        "apply",
        &env,
        1,
        &["\"invoices\".\"legacy\" is NOT NULL without a default"],
    );
    assert_eq!(
        fx.sink.psql(
            SINK_DB,
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute \
             WHERE attrelid = 'invoices'::regclass AND attname = 'total'"
        ),
        "numeric(12,2)"
    );
}

#[test]
fn missing_sink_database_is_named() {
    let mut fx = PgFixture::start();
    fx.write_pipeline(&yaml_with(&[]).replace("database: replica", "database: nowhere"));
    let env = fx.env();
    expect_failure(&mut fx, "apply", &env, 1, &["pg-out", "3D000", "nowhere"]);
}

#[test]
fn wrong_sink_password_is_refused_and_never_printed() {
    let mut fx = PgFixture::start();
    scram_role(&fx.sink, SINK_DB, "zipline_sink", RIGHT_PASSWORD);
    let yaml = yaml_with(&["secret_refs: [{ field: password, ref: sink-password }]"])
        .replace("user: postgres\n    lanes", "user: zipline_sink\n    lanes");
    fx.write_pipeline(&yaml);
    let env = env_with(&fx, &[("ZIPLINE_SECRET_SINK_PASSWORD", WRONG_PASSWORD)]);
    let line = expect_failure(
        &mut fx,
        "apply",
        &env,
        1,
        &[
            "pg-out",
            "28P01",
            "zipline_sink",
            "check the sink's user and password",
        ],
    );
    assert!(!line.contains(WRONG_PASSWORD));
    let args = fx.args("apply");
    let (_, output, _) = fx.run_to_exit(&args, &env, EXIT_TIMEOUT);
    assert!(
        !output.contains(WRONG_PASSWORD) && !output.contains(RIGHT_PASSWORD),
        "a password appears in zipline's output:\n{output}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_sink_password_and_created_tables_stream() {
    let mut fx = PgFixture::servers();
    fx.src.psql(PG_DB, PG_ORDERS);
    fx.sink.psql(SINK_DB, "CREATE SCHEMA mirror");
    scram_role(&fx.sink, SINK_DB, "zipline_sink", RIGHT_PASSWORD);
    fx.sink
        .psql(SINK_DB, "GRANT ALL ON SCHEMA mirror TO zipline_sink");
    let yaml = yaml_with(&[
        "schema: mirror",
        "create_tables: true",
        "secret_refs: [{ field: password, ref: sink-password }]",
    ])
    .replace("user: postgres\n    lanes", "user: zipline_sink\n    lanes");
    fx.write_pipeline(&yaml);
    let env = env_with(&fx, &[("ZIPLINE_SECRET_SINK_PASSWORD", RIGHT_PASSWORD)]);
    let src = fx.src_client().await;
    let args = fx.args("apply");
    let mut z = fx.spawn(&args, &env);
    wait_streaming(&src, &mut z, Duration::from_secs(30)).await;
    src.batch_execute(
        "INSERT INTO orders VALUES (1, 'created', 42.50, 'new', '2024-05-06 07:08:09.123456+00', true, NULL)",
    )
    .await
    .expect("insert");
    let sink = fx.sink_client().await;
    sink.batch_execute("SET search_path = mirror")
        .await
        .expect("search_path");
    let rows = wait_converged(&src, &sink, "orders", Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_eq!(rows, 1);
    assert_eq!(
        fx.sink.psql(
            SINK_DB,
            "SELECT string_agg(format_type(atttypid, atttypmod), ', ' ORDER BY attnum) \
             FROM pg_attribute WHERE attrelid = 'mirror.orders'::regclass AND attnum > 0"
        ),
        "bigint, text, numeric(12,2), character varying(20), timestamp with time zone, \
         boolean, text"
    );
    z.terminate_cleanly(Duration::from_secs(15));
    assert!(!z.output().contains(RIGHT_PASSWORD));
}
