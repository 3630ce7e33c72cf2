//! Bad configurations and unusable servers: each must make `zipline` exit non-zero with an
//! `error:` line naming the problem (file:line and field for configuration errors), and must
//! leave nothing behind on the source: no replication slot (it would hold WAL forever) and no
//! publication. Configuration errors exit 2, runtime errors 1.
//!
//! Also the positive counterpart of the password tests: a SCRAM-authenticated role streams
//! an insert, which exercises Zipline's own SCRAM exchange on the replication connection.

use crate::{common, e2e};

use std::time::Duration;

use e2e::{
    CONVERGE_TIMEOUT, Fixture, MY_DB, MY_ORDERS, PG_DB, PG_ORDERS, PipelineOpts, pipeline_yaml,
    wait_converged, wait_streaming,
};

/// Generous: a correct refusal takes well under a second, except the unreachable host.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// The `error: ...` line of zipline's output.
fn error_line(output: &str) -> String {
    output
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no `error:` line in zipline's output:\n{output}"))
        .to_owned()
}

/// Runs `zipline pipeline <verb>` with `env`; asserts the exit code and that every `needle` is
/// in the `error:` line; returns that line.
fn expect_failure(
    fx: &mut Fixture,
    verb: &str,
    env: &[(String, String)],
    code: i32,
    needles: &[&str],
) -> String {
    let args = fx.args(verb);
    let (got, output, took) = fx.run_to_exit(&args, env, EXIT_TIMEOUT);
    eprintln!("e2e: zipline {verb} exited {got} after {took:.1?}:\n{output}");
    assert_eq!(got, code, "exit code of zipline {verb}; output:\n{output}");
    let line = error_line(&output);
    assert_not_repeated(&line);
    for needle in needles {
        assert!(
            line.contains(needle),
            "the error should mention {needle:?}:\n{line}\nfull output:\n{output}"
        );
    }
    line
}

/// A message that says the same thing twice (an error chain printing a cause that its
/// wrapper already contains) is not a clear one.
fn assert_not_repeated(line: &str) {
    let parts: Vec<&str> = line.split(": ").filter(|p| p.len() >= 20).collect();
    for (i, p) in parts.iter().enumerate() {
        assert!(
            !parts[i + 1..].contains(p),
            "the error repeats itself ({p:?} twice):\n{line}"
        );
    }
}

fn assert_nothing_created(fx: &Fixture) {
    assert_eq!(
        fx.slots_and_publications(),
        (String::new(), String::new()),
        "a refused configuration must create no replication slot and no publication (slots, publications)"
    );
}

fn env_without(fx: &Fixture, var: &str) -> Vec<(String, String)> {
    fx.env().into_iter().filter(|(k, _)| k != var).collect()
}

fn env_with(fx: &Fixture, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = fx
        .env()
        .into_iter()
        .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
        .collect();
    env.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    env
}

#[test]
fn malformed_yaml_is_refused_with_its_line() {
    let mut fx = Fixture::start();
    // Line 6 is indented one space less than its siblings.
    fx.write_pipeline(
        "name: orders
connectors:
  - name: orders-db
    type: source/postgres
    host: 127.0.0.1
   port: 5432
routes:
  - from: orders-db
    to: [mysql-out]
",
    );
    let env = fx.env();
    for verb in ["validate", "apply"] {
        expect_failure(&mut fx, verb, &env, 2, &["orders.yaml:6:", "YAML"]);
    }
    assert_nothing_created(&fx);
}

#[test]
fn unknown_connector_type_is_refused() {
    let mut fx = Fixture::start();
    let yaml =
        pipeline_yaml(&PipelineOpts::default()).replace("type: sink/mysql", "type: sink/oracle");
    fx.write_pipeline(&yaml);
    let line_no = yaml
        .lines()
        .position(|l| l.contains("sink/oracle"))
        .unwrap()
        + 1;
    let env = fx.env();
    for verb in ["validate", "apply"] {
        expect_failure(
            &mut fx,
            verb,
            &env,
            2,
            &[
                &format!("orders.yaml:{line_no}: connectors[1].type"),
                "sink/oracle",
                "sink/mysql",
            ],
        );
    }
    assert_nothing_created(&fx);
}

#[test]
fn route_to_unknown_connector_is_refused() {
    let mut fx = Fixture::start();
    let yaml =
        pipeline_yaml(&PipelineOpts::default()).replace("to: [mysql-out]", "to: [mysql-outt]");
    fx.write_pipeline(&yaml);
    let line_no = yaml.lines().position(|l| l.contains("mysql-outt")).unwrap() + 1;
    let env = fx.env();
    expect_failure(
        &mut fx,
        "apply",
        &env,
        2,
        &[
            &format!("orders.yaml:{line_no}: routes[0].to"),
            "mysql-outt",
        ],
    );
    assert_nothing_created(&fx);
}

#[test]
fn missing_env_var_names_file_line_and_field() {
    let mut fx = Fixture::start();
    let yaml = pipeline_yaml(&PipelineOpts::default());
    fx.write_pipeline(&yaml);
    let line_no = yaml.lines().position(|l| l.contains("slot_name:")).unwrap() + 1;
    let env = env_without(&fx, "POSTGRES_SLOT_NAME");
    for verb in ["validate", "apply"] {
        expect_failure(
            &mut fx,
            verb,
            &env,
            2,
            &[
                &format!("orders.yaml:{line_no}: connectors[0].slot_name"),
                "POSTGRES_SLOT_NAME",
                "not set",
            ],
        );
    }
    assert_nothing_created(&fx);
}

fn secret_pipeline(extra_source: &[&str]) -> String {
    let mut source_extra = vec![
        "secret_refs:".to_owned(),
        "  - { field: password, ref: postgres-password }".to_owned(),
    ];
    source_extra.extend(extra_source.iter().map(|s| (*s).to_owned()));
    pipeline_yaml(&PipelineOpts {
        source_extra,
        ..PipelineOpts::default()
    })
}

#[test]
fn missing_secret_names_ref_env_var_and_secrets_dir() {
    let mut fx = Fixture::start();
    fx.write_pipeline(&secret_pipeline(&[]));
    let secrets = fx.dir.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    let mut args = fx.args("apply");
    args.extend(["--secrets-dir".to_owned(), secrets.display().to_string()]);
    let env = fx.env();
    let (code, output, _) = fx.run_to_exit(&args, &env, EXIT_TIMEOUT);
    eprintln!("e2e: zipline exited {code}:\n{output}");
    assert_eq!(code, 2, "exit code; output:\n{output}");
    let line = error_line(&output);
    assert_not_repeated(&line);
    for needle in [
        "orders.yaml:",
        "postgres-password",
        "ZIPLINE_SECRET_POSTGRES_PASSWORD",
        &secrets.display().to_string(),
    ] {
        assert!(
            line.contains(needle),
            "the error should mention {needle:?}:\n{line}"
        );
    }
    assert_nothing_created(&fx);
}

const RIGHT_PASSWORD: &str = "R1ght-Pa55-e2e";
const WRONG_PASSWORD: &str = "Wr0ng-Pa55-e2e";

/// Role `zipline_pw` (LOGIN REPLICATION, SCRAM password), owning `orders`, allowed to create
/// publications, and required to authenticate with SCRAM over TCP.
fn scram_role(fx: &Fixture) {
    fx.pg.psql(
        PG_DB,
        &format!(
            "CREATE ROLE zipline_pw LOGIN REPLICATION PASSWORD '{RIGHT_PASSWORD}';
             GRANT CREATE ON DATABASE {PG_DB} TO zipline_pw;
             ALTER TABLE orders OWNER TO zipline_pw;"
        ),
    );
    let hba = fx.pg.data_dir().join("pg_hba.conf");
    let old = std::fs::read_to_string(&hba).expect("reading pg_hba.conf");
    std::fs::write(
        &hba,
        format!("host all zipline_pw 127.0.0.1/32 scram-sha-256\n{old}"),
    )
    .expect("writing pg_hba.conf");
    assert_eq!(fx.pg.psql(PG_DB, "SELECT pg_reload_conf()"), "t");
    // The reload is asynchronous: wait until a TCP login as zipline_pw asks for a password.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let out = std::process::Command::new("/usr/lib/postgresql/15/bin/psql")
            .args([
                "-X",
                "-w",
                "-h",
                "127.0.0.1",
                "-U",
                "zipline_pw",
                "-d",
                PG_DB,
                "-c",
                "SELECT 1",
            ])
            .arg("-p")
            .arg(fx.pg.port.to_string())
            .env_remove("PGPASSWORD")
            .output()
            .expect("running psql");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && stderr.contains("password") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pg_hba.conf reload not in effect: psql as zipline_pw without a password: {stderr}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn wrong_password_is_refused_and_never_printed() {
    let mut fx = Fixture::start();
    scram_role(&fx);
    fx.write_pipeline(&secret_pipeline(&["tables: [public.orders]"]));
    let env = env_with(
        &fx,
        &[
            ("POSTGRES_USER", "zipline_pw"),
            ("ZIPLINE_SECRET_POSTGRES_PASSWORD", WRONG_PASSWORD),
        ],
    );
    let args = fx.args("apply");
    let (code, output, _) = fx.run_to_exit(&args, &env, EXIT_TIMEOUT);
    eprintln!("e2e: zipline exited {code}:\n{output}");
    assert_eq!(code, 1, "exit code; output:\n{output}");
    let line = error_line(&output);
    assert_not_repeated(&line);
    assert!(
        line.contains("password authentication failed") && line.contains("zipline_pw"),
        "the error should say the password of zipline_pw was refused:\n{line}"
    );
    assert!(
        !output.contains(WRONG_PASSWORD) && !output.contains(RIGHT_PASSWORD),
        "a password appears in zipline's output:\n{output}"
    );
    assert_nothing_created(&fx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_password_from_secrets_dir_streams_an_insert() {
    let mut fx = Fixture::start();
    scram_role(&fx);
    fx.write_pipeline(&secret_pipeline(&["tables: [public.orders]"]));
    let secrets = fx.dir.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    std::fs::write(
        secrets.join("postgres-password"),
        format!("{RIGHT_PASSWORD}\n"),
    )
    .unwrap();
    let env = env_with(&fx, &[("POSTGRES_USER", "zipline_pw")]);
    let mut args = fx.args("apply");
    args.extend(["--secrets-dir".to_owned(), secrets.display().to_string()]);
    let mut z = fx.spawn(&args, &env);

    let pg = fx.pg_client().await;
    let mut my = fx.my_checker().await;
    wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;
    // The walsender runs as the SCRAM role: the replication connection authenticated.
    let user: String = pg
        .query_one("SELECT usename::text FROM pg_stat_replication", &[])
        .await
        .expect("reading pg_stat_replication")
        .get(0);
    assert_eq!(user, "zipline_pw");
    pg.batch_execute(
        "INSERT INTO orders VALUES (1, 'scram', 42.50, 'new', '2024-05-06 07:08:09.123456+00', true, 'via SCRAM')",
    )
    .await
    .expect("insert");
    let summary = wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    assert_eq!(summary.count, 1);
    z.terminate_cleanly(Duration::from_secs(15));
    assert!(
        !z.output().contains(RIGHT_PASSWORD),
        "the password appears in zipline's output"
    );
}

#[test]
fn unreachable_host_fails_after_bounded_retries() {
    let mut fx = Fixture::start();
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts {
        source_extra: vec![
            "connect_retries: 1".to_owned(),
            "connect_timeout: 2s".to_owned(),
        ],
        ..PipelineOpts::default()
    }));
    let port = common::free_port();
    let env = env_with(&fx, &[("POSTGRES_PORT", &port.to_string())]);
    let args = fx.args("apply");
    let (code, output, took) = fx.run_to_exit(&args, &env, Duration::from_secs(30));
    eprintln!("e2e: zipline exited {code} after {took:.1?}:\n{output}");
    assert_eq!(code, 1, "exit code; output:\n{output}");
    assert!(
        took < Duration::from_secs(15),
        "one retry with a 2s connect timeout took {took:?}"
    );
    let line = error_line(&output);
    assert_not_repeated(&line);
    assert!(
        line.contains(&format!("127.0.0.1:{port}")),
        "the error should name the unreachable host:port 127.0.0.1:{port}:\n{line}"
    );
    assert_nothing_created(&fx);
}

#[test]
fn wal_level_replica_is_refused_with_the_fix() {
    let mut fx = Fixture::with_postgres(common::Postgres::start_with(&[("wal_level", "replica")]));
    fx.pg.psql(PG_DB, PG_ORDERS);
    fx.my.sql(MY_DB, MY_ORDERS);
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    let env = fx.env();
    expect_failure(
        &mut fx,
        "apply",
        &env,
        1,
        &["wal_level", "wal_level = logical"],
    );
    assert_nothing_created(&fx);
}

#[test]
fn published_table_without_primary_key_is_named() {
    let mut fx = Fixture::start();
    fx.pg.psql(PG_DB, "CREATE TABLE nokey (a int, b text)");
    fx.my.sql(MY_DB, "CREATE TABLE nokey (a INT, b TEXT)");
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    let env = fx.env();
    expect_failure(&mut fx, "apply", &env, 1, &["nokey", "primary key"]);
    assert_nothing_created(&fx);
}

#[test]
fn missing_sink_table_is_named() {
    let mut fx = Fixture::start();
    fx.pg.psql(
        PG_DB,
        "CREATE TABLE invoices (id bigint PRIMARY KEY, total numeric(12,2))",
    );
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    let env = fx.env();
    expect_failure(&mut fx, "apply", &env, 1, &["invoices"]);
    assert_nothing_created(&fx);
}
