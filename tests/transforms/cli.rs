//! The transform commands through the binary: `pipeline validate` names the module and what is
//! wrong with it (missing file, malformed wasm, a core module, the wrong world, a missing
//! export, an unknown import, a config `init` refuses), and `zipline transform test` runs a
//! module over sample changes. No database is involved.
//!
//! The components are built by `tests/guests/build.sh` into `target/guests/`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_zipline"))
}

fn guest(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("target/guests/{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: build the test guests first with tests/guests/build.sh (or `.ci/run guests`)",
        path.display()
    );
    path
}

const PIPELINE: &str = "name: orders
connectors:
  - name: orders-db
    type: source/postgres
    host: localhost
    database: app
    user: repl
    publication: pub
    slot_name: s1
  - name: mysql-out
    type: sink/mysql
routes:
  - from: orders-db
    to: [mysql-out]
    transform:
";

/// `pipeline validate` on PIPELINE plus `transform` lines; (exit code, stdout + stderr).
fn validate(dir: &Path, transform: &str) -> (i32, String) {
    let file = dir.join("orders.yaml");
    std::fs::write(&file, format!("{PIPELINE}{transform}")).unwrap();
    let out = Command::new(bin())
        .args(["pipeline", "validate", "-f"])
        .arg(&file)
        .env("ZIPLINE_LOG", "warn")
        .env("ZIPLINE_LOG_FORMAT", "text")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn validate_names_the_module_and_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("garbage.wasm"), b"this is not wasm").unwrap();
    std::fs::write(d.join("truncated.wasm"), b"\0asm\x0d\0\x01\0\x01\xff").unwrap();
    std::fs::write(d.join("core.wasm"), b"\0asm\x01\0\0\0").unwrap();
    for name in [
        "rust-mask",
        "wrong-world",
        "missing-transform",
        "imports-unknown",
        "contract-0.2",
    ] {
        std::fs::copy(guest(name), d.join(format!("{name}.wasm"))).unwrap();
    }
    let file = d.join("orders.yaml").display().to_string();
    let cases: &[(&str, &str)] = &[
        (
            "      module: ./absent.wasm\n",
            "orders.yaml:16: routes[0].transform.module: ./absent.wasm: cannot read ",
        ),
        (
            "      module: garbage.wasm\n",
            "orders.yaml:16: routes[0].transform.module: garbage.wasm: not a WebAssembly file",
        ),
        (
            "      module: truncated.wasm\n",
            "orders.yaml:16: routes[0].transform.module: truncated.wasm: not a valid WebAssembly component: ",
        ),
        (
            "      module: core.wasm\n",
            "orders.yaml:16: routes[0].transform.module: core.wasm: is a core WebAssembly module, not a component",
        ),
        (
            "      module: wrong-world.wasm\n",
            "orders.yaml:16: routes[0].transform.module: wrong-world.wasm: does not implement the world \
             zipline:transform/transform of zipline:transform@0.3.0 (exports `init` and `transform`, see wit/transform.wit): ",
        ),
        (
            "      module: missing-transform.wasm\n",
            "orders.yaml:16: routes[0].transform.module: missing-transform.wasm: does not implement the world",
        ),
        (
            "      module: imports-unknown.wasm\n",
            "orders.yaml:16: routes[0].transform.module: imports-unknown.wasm: imports something Zipline \
             does not provide",
        ),
        (
            "      module: contract-0.2.wasm\n",
            "orders.yaml:16: routes[0].transform.module: contract-0.2.wasm: was built for \
             zipline:transform@0.2.0, but this Zipline implements zipline:transform@0.3.0: rebuild \
             it against wit/transform.wit",
        ),
        (
            "      module: rust-mask.wasm\n      limits: { output: 8GiB }\n",
            "orders.yaml:17: routes[0].transform.limits.output: must be at most 4GiB, found \
             8589934592 bytes",
        ),
        (
            "      module: rust-mask.wasm\n      config: { colour: red }\n",
            "orders.yaml:17: routes[0].transform.config: rust-mask.wasm: init refused the config: unknown \
             config key `colour`; expected columns, column, drop",
        ),
        (
            "      module: rust-mask.wasm\n      on_error: ignore\n",
            "orders.yaml:17: routes[0].transform.on_error: unknown policy `ignore`; expected halt, skip or dead_letter",
        ),
    ];
    for (transform, want) in cases {
        let (code, text) = validate(d, transform);
        assert_eq!(code, 2, "{transform}: {text}");
        let want = format!("error: {}{want}", file.trim_end_matches("orders.yaml"));
        assert!(
            text.starts_with(&want),
            "{transform}\nwant: {want}\ngot:  {text}"
        );
    }
    // The example module with a valid config passes.
    let (code, text) = validate(
        d,
        "      module: rust-mask.wasm\n      config: { columns: email }\n",
    );
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("pipeline orders is valid"), "{text}");
}

#[test]
fn transform_test_prints_outputs_and_keeps_guest_stdout_out_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("changes.jsonl");
    std::fs::write(
        &input,
        concat!(
            r#"{"table":"public.users","op":"insert","columns":[{"name":"id","type":"int8","key":true},{"name":"email"}],"values":[1,"alice@example.com"]}"#,
            "\n",
            r#"{"table":"public.audit_log","op":"insert","columns":[{"name":"id","type":"int4","key":true}],"values":[7]}"#,
            "\n\n",
            r#"{"table":"public.users","op":"delete","columns":[{"name":"id","type":"int8","key":true},{"name":"email"}],"key":[1]}"#,
            "\n"
        ),
    )
    .unwrap();
    let run = |module: &str, extra: &[&str]| {
        let out = Command::new(bin())
            .args(["transform", "test", "--module"])
            .arg(guest(module))
            .arg("--input")
            .arg(&input)
            .args(extra)
            .env("ZIPLINE_LOG_FORMAT", "text")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = run(
        "rust-mask",
        &["--config", "columns=email", "--config", "drop=audit_log"],
    );
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(lines[0]["values"][1], "a***@example.com");
    assert_eq!(lines[0]["position"], "0/1#1");
    assert_eq!(lines[1]["op"], "delete");
    assert!(stderr.contains("3 changes in, 2 out, 0 failed"), "{stderr}");

    // The WASI guest prints to stdout and stderr: both end up in the log (stderr), tagged.
    let (code, stdout, stderr) = run("wasi-probe", &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !stdout.contains("wasi-probe"),
        "guest output leaked to stdout: {stdout}"
    );
    assert_eq!(stdout.lines().count(), 3);
    assert!(
        stderr.contains("guest: wasi-probe stdout: file:denied"),
        "{stderr}"
    );
    assert!(
        stderr.contains("guest: wasi-probe stderr: probing done"),
        "{stderr}"
    );

    // Failures are listed and make the exit status 1.
    let (code, stdout, stderr) = run("hostile", &["--config", "mode=reject", "--config", "key=7"]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stdout.lines().count(), 2);
    assert!(
        stderr.contains("failed: change 0/1#2 (insert on public.audit_log): the transform refused the change: rejected on purpose"),
        "{stderr}"
    );
    assert!(
        stderr.contains("error: the transform failed on 1 of 3 changes"),
        "{stderr}"
    );

    // Bad input is located.
    std::fs::write(
        &input,
        "{\"table\":\"t\",\"op\":\"insert\",\"columns\":[],\"values\":[1]}\n",
    )
    .unwrap();
    let (code, _, stderr) = run("rust-mask", &[]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("changes.jsonl:1: `values` has 1 items for 0 columns"),
        "{stderr}"
    );
}

/// Every command's `--help` has examples, the exit codes and the environment it reads, and
/// its examples run: those that need no database (`pipeline validate`, `transform test`) in a
/// directory holding the files they name, to exit status 0; those that need live databases
/// (`pipeline apply`, `dlq`) against a pipeline file with a deliberate mistake, which shows
/// the arguments were accepted (a usage error names no file line) and the file was read.
#[test]
fn every_help_has_examples_exit_codes_and_environment_and_its_examples_run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(guest("rust-mask"), dir.path().join("mask.wasm")).unwrap();
    std::fs::write(
        dir.path().join("changes.jsonl"),
        r#"{"table":"public.users","op":"insert","columns":[{"name":"id","type":"int8","key":true},{"name":"email","type":"text"}],"key":[7],"values":[7,"b@example.com"]}"#,
    )
    .unwrap();
    let good = PIPELINE
        .trim_end()
        .trim_end_matches("transform:")
        .trim_end();
    let bad = format!("{good}\n    lanes: many\n");
    let commands: [(&[&str], bool); 10] = [
        (&[], true),
        (&["pipeline", "validate"], true),
        (&["transform", "test"], true),
        (&["transform", "new"], true),
        (&["pipeline", "apply"], false),
        (&["pipeline", "status"], false),
        (&["pipeline", "drop"], false),
        (&["dlq", "list"], false),
        (&["dlq", "replay"], false),
        (&["completions"], true),
    ];
    let bin_dir = bin().parent().unwrap().to_owned();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut ran = 0;
    for (command, runs) in commands {
        let out = Command::new(bin())
            .args(command)
            .arg("--help")
            .output()
            .unwrap();
        assert!(out.status.success(), "{command:?} --help");
        let help = String::from_utf8(out.stdout).unwrap();
        for part in [
            "Examples:",
            "Exit codes:",
            "  2  a bad command line or pipeline file",
            "ZIPLINE_LOG",
            "ZIPLINE_SECRET_<REF>",
            "ZIPLINE_TRANSFORM_CACHE",
        ] {
            assert!(
                help.contains(part),
                "{command:?} --help lacks {part:?}:\n{help}"
            );
        }
        let examples: Vec<&str> = help
            .split("Examples:")
            .nth(1)
            .unwrap()
            .split("\n\n")
            .next()
            .unwrap()
            .lines()
            .map(str::trim)
            .filter(|l| l.contains("zipline "))
            .collect();
        assert!(!examples.is_empty(), "{command:?}");
        for example in examples {
            let word = |w: &str| example.contains(&format!("zipline {w}"));
            let needs_databases = word("pipeline apply")
                || word("pipeline status")
                || word("pipeline drop")
                || word("dlq");
            if command.is_empty() && needs_databases {
                continue; // run below, under their own command
            }
            let pipeline = if needs_databases { &bad } else { good };
            std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();
            let out = Command::new("sh")
                .arg("-c")
                .arg(example)
                .current_dir(dir.path())
                .env("PATH", &path)
                .env("ZIPLINE_LOG", "warn")
                .env("ZIPLINE_LOG_FORMAT", "text")
                .env("ZIPLINE_TRANSFORM_CACHE", "off")
                .output()
                .unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if needs_databases {
                assert!(!runs);
                assert_eq!(out.status.code(), Some(2), "{example}: {text}");
                assert!(text.contains("pipeline.yaml:"), "{example}: {text}");
                assert!(text.contains("lanes"), "{example}: {text}");
            } else {
                assert!(out.status.success(), "{example}: {text}");
                if word("transform test") {
                    assert!(text.contains("***@example.com"), "{example}: {text}");
                    assert!(
                        !text.contains("\"a@example.com\"") && !text.contains("\"b@example.com\""),
                        "masked: {example}: {text}"
                    );
                }
            }
            ran += 1;
        }
    }
    assert!(ran >= 10, "{ran} examples ran");
}

/// `zipline completions SHELL` prints a script that completes the subcommands; an unknown
/// shell is a usage error.
#[test]
fn completions_know_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(bin())
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{shell}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let script = String::from_utf8(out.stdout).unwrap();
        for word in ["pipeline", "apply", "dlq", "log-format"] {
            assert!(script.contains(word), "{shell} lacks {word}:\n{script}");
        }
    }
    let bash = Command::new(bin())
        .args(["completions", "bash"])
        .output()
        .unwrap();
    let script = String::from_utf8(bash.stdout).unwrap();
    assert!(script.contains("complete -F _zipline"), "{script}");
    let out = Command::new(bin())
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// `--log-format json` (or ZIPLINE_LOG_FORMAT=json) writes one JSON object per log line with
/// the structured fields at the top level; a bad ZIPLINE_LOG_FORMAT is a usage error.
#[test]
fn log_format_json_writes_one_object_per_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(guest("wasi-probe"), dir.path().join("probe.wasm")).unwrap();
    let input = dir.path().join("changes.jsonl");
    std::fs::write(
        &input,
        r#"{"table":"public.users","op":"insert","columns":[{"name":"id","type":"int8","key":true}],"key":[7],"values":[7]}"#,
    )
    .unwrap();
    let probe = |format: Option<&str>, env: Option<&str>| {
        let mut cmd = Command::new(bin());
        cmd.args(["transform", "test", "--module"])
            .arg(dir.path().join("probe.wasm"))
            .arg("--input")
            .arg(&input)
            .env("ZIPLINE_TRANSFORM_CACHE", "off")
            .env_remove("ZIPLINE_LOG_FORMAT");
        if let Some(format) = format {
            cmd.args(["--log-format", format]);
        }
        if let Some(env) = env {
            cmd.env("ZIPLINE_LOG_FORMAT", env);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Piped stderr and nothing said: JSON; the flag wins over the environment.
    for (format, env) in [
        (None, None),
        (Some("json"), Some("text")),
        (None, Some("JSON")),
    ] {
        let (code, stderr) = probe(format, env);
        assert_eq!(code, Some(0), "{stderr}");
        let logs: Vec<serde_json::Value> = stderr
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        // What the guest printed, logged with the route and module as fields.
        let guest = logs
            .iter()
            .find(|l| {
                l["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("guest: wasi-probe"))
            })
            .unwrap_or_else(|| panic!("no guest line as a JSON object in:\n{stderr}"));
        assert_eq!(guest["route"], "test", "fields at the top level: {guest}");
        assert!(guest["module"].is_string(), "{guest}");
        assert!(guest["level"].is_string(), "{guest}");
        assert!(guest["timestamp"].is_string(), "{guest}");
    }
    let (code, stderr) = probe(Some("text"), Some("json"));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("guest: wasi-probe"), "{stderr}");
    assert!(!stderr.lines().any(|l| l.starts_with('{')), "{stderr}");
    let (code, stderr) = probe(None, Some("xml"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("ZIPLINE_LOG_FORMAT=\"xml\""), "{stderr}");
}
