//! `zipline transform new` in every language: the project it writes builds with its one
//! command (`build.sh`) and its `test.sh` passes out of the box (`zipline transform test` on
//! the sample gives exactly the expected output). The guest toolchains are the ones
//! `.ci/run guests` installs; a missing one fails the test with the build script's message.
//!
//! To keep CI's time and disk down, a Rust project builds into the guests' shared target
//! directory (whose standard library for wasm32 is already built) and a JavaScript project
//! uses js-mask's node_modules instead of installing its own 390 MB.

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_zipline"))
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `cmd`; panics with its output unless it succeeds. Returns stdout + stderr.
fn run(what: &str, cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{text}",
        out.status
    );
    text
}

/// `transform new --lang LANG`, then the project's `test.sh` (which builds first).
fn new_project_builds_and_passes_its_test(lang: &str) {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("drop-test-orders");
    let made = run(
        "transform new",
        Command::new(bin())
            .args([
                "transform",
                "new",
                "--lang",
                lang,
                "drop-test-orders",
                "--dir",
            ])
            .arg(&project),
    );
    assert!(made.contains("build.sh"), "{made}");
    for file in [
        "build.sh",
        "test.sh",
        "README.md",
        "sample.jsonl",
        "expected.jsonl",
    ] {
        assert!(
            project.join(file).is_file(),
            "{lang}: no {file} in the project"
        );
    }
    let mut test = Command::new(project.join("test.sh"));
    test.current_dir(&project).env("ZIPLINE", bin());
    match lang {
        "rust" => {
            test.env("CARGO_TARGET_DIR", repo().join("target/guests/cargo"));
        }
        "js" => {
            let modules = repo().join("guest-examples/js-mask/node_modules");
            assert!(
                modules.is_dir(),
                "{} is missing: run `.ci/run guests` (or guest-examples/js-mask/build.sh) first",
                modules.display()
            );
            std::os::unix::fs::symlink(&modules, project.join("node_modules")).unwrap();
        }
        _ => {}
    }
    let tested = run(&format!("{lang} project's test.sh"), &mut test);
    let wasm = project.join("target/drop-test-orders.wasm");
    assert!(wasm.is_file(), "{lang}: no {}:\n{tested}", wasm.display());
    // The same check test.sh makes, made here too so a test.sh that forgot it cannot pass.
    let out = run(
        "transform test",
        Command::new(bin())
            .args(["transform", "test", "--module"])
            .arg(&wasm)
            .args([
                "--config",
                "column=status",
                "--config",
                "value=test",
                "--input",
            ])
            .arg(project.join("sample.jsonl")),
    );
    let expected = std::fs::read_to_string(project.join("expected.jsonl")).unwrap();
    let outputs: Vec<&str> = out.lines().filter(|l| l.starts_with('{')).collect();
    let want: Vec<&str> = expected.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(outputs, want, "{lang}: the sample's output");
    // Every language filters the same sample to the same rows: rust-filter's expected output.
    let reference =
        std::fs::read_to_string(repo().join("guest-examples/rust-filter/expected.jsonl"));
    assert_eq!(expected, reference.unwrap(), "{lang}: expected.jsonl");
}

#[test]
fn a_new_rust_project_builds_and_passes_its_test() {
    new_project_builds_and_passes_its_test("rust");
}

#[test]
fn a_new_c_project_builds_and_passes_its_test() {
    new_project_builds_and_passes_its_test("c");
}

#[test]
fn a_new_go_project_builds_and_passes_its_test() {
    new_project_builds_and_passes_its_test("go");
}

/// Python and JavaScript share one test: each build takes 10–20 s of one core.
#[test]
fn new_python_and_js_projects_build_and_pass_their_tests() {
    new_project_builds_and_passes_its_test("python");
    new_project_builds_and_passes_its_test("js");
}

/// `zipline transform new ARGS` in `dir`: its exit code and stderr.
fn new_in(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(bin())
        .args(["transform", "new"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_bad_name_or_an_existing_directory_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = new_in(dir.path(), &["--lang", "go", "Bad_Name"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("`Bad_Name`"), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

    std::fs::create_dir(dir.path().join("taken")).unwrap();
    std::fs::write(dir.path().join("taken/mine.txt"), "keep me").unwrap();
    let (code, err) = new_in(dir.path(), &["--lang", "c", "taken"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("taken exists already"), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path().join("taken"))
        .unwrap()
        .collect();
    assert_eq!(left.len(), 1, "the existing directory was written into");
}
