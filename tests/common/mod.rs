//! Integration-test harness: throwaway database servers and a fault-injecting TCP proxy.
//!
//! Every integration test binary (`tests/NAME/main.rs`, `tests/edges.rs`) includes this as
//! `mod common` (and the end-to-end helpers, `tests/e2e`, as `mod e2e`); there are few
//! binaries on purpose, since each compiles all of it again. Each test gets its own
//! servers, so tests can run in parallel processes (nextest runs every test as a process):
//!
//! - [`Postgres`]: a private PostgreSQL 15 cluster (`wal_level=logical`) in
//!   `<base>/zipline-test-XXXXXX`, listening on 127.0.0.1 and on a Unix socket in that
//!   directory.
//! - [`MariaDb`]: a private `mariadbd` with the same layout.
//! - [`Proxy`]: a TCP proxy in front of either, to cut, refuse or stall connections.
//! - [`sinks::SinkUnderTest`]: a sink server with its connector, for the sink contract suite.
//!
//! Quirks worth knowing (see also `/work/shared/TESTING.md`):
//!
//! - Servers are direct children of the test process and are waited on; a server killed while
//!   orphaned can keep its lock file for seconds.
//! - `<base>` is `/dev/shm` (tmpfs) when usable, else `/tmp`; `ZIPLINE_TEST_TMPDIR` overrides
//!   it. On this machine's ext4 `/tmp` every file creation costs ~0.7 ms of kernel time, so
//!   copying a PostgreSQL data directory (~1000 files) took 0.8 s there and 0.05 s on tmpfs.
//!   Data on tmpfs survives a server SIGKILL, which is all the crash tests need.
//! - `initdb` / `mariadb-install-db` run once per *machine* (per server version), not once per
//!   test: the result is cached in `<base>/zipline-template-*` (published with an atomic rename,
//!   so concurrent test processes never see a half-built template) and copied per instance.
//! - Ports are chosen below the kernel's ephemeral range (32768+), so the many outgoing
//!   connections tests make can never occupy a server's port between `kill` and `restart`.
//! - `create_database`, `psql` and `sql` are blocking (they run the CLI clients). They are fine
//!   inside `#[tokio::test]`, but do not call them while a client on the same current-thread
//!   runtime holds a lock they need: the runtime cannot make progress while they block.
//! - mysql_async reconnects over the Unix socket by default when the host is 127.0.0.1
//!   (`prefer_socket`), which silently bypasses a [`Proxy`]; [`MariaDb::conn`] turns that off.

pub mod certs;
pub mod changes;
mod mariadb;
mod pg;
mod proxy;
pub mod sinks;

pub use mariadb::MariaDb;
pub use pg::Postgres;
pub use proxy::Proxy;

use std::fs;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

/// Candidate directories for harness files, best first. Not `$TMPDIR`: Unix socket paths must
/// stay under ~107 bytes. `.ci/run` sweeps the same places.
const BASE_DIRS: &[&str] = &["/dev/shm", "/tmp"];
/// Prefix of per-test directories; `.ci/run` sweeps the same prefix.
pub(crate) const TEST_DIR_PREFIX: &str = "zipline-test-";
/// Per-test directories older than this belong to crashed runs.
const STALE_AFTER: Duration = Duration::from_secs(2 * 60 * 60);
/// Ports handed out by [`free_port`]: below Linux's default ephemeral range (32768–60999).
const PORT_RANGE: std::ops::Range<u16> = 20_000..32_000;

/// A TCP port on 127.0.0.1 that was free a moment ago. Another process can take it before the
/// caller binds it, so callers retry on a clash (the server types here do).
pub fn free_port() -> u16 {
    for _ in 0..1000 {
        let port = rand::random_range(PORT_RANGE);
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return port;
        }
    }
    panic!("no free TCP port on 127.0.0.1 in {PORT_RANGE:?} after 1000 tries");
}

/// The `zipline` binary built for this test run.
pub fn zipline_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_zipline"))
}

/// Where test directories and templates go (see the module docs).
pub(crate) fn base_dir() -> &'static Path {
    static BASE: OnceLock<PathBuf> = OnceLock::new();
    BASE.get_or_init(|| {
        if let Some(dir) = std::env::var_os("ZIPLINE_TEST_TMPDIR") {
            return PathBuf::from(dir);
        }
        BASE_DIRS
            .iter()
            .map(PathBuf::from)
            .find(|d| tempfile::tempdir_in(d).is_ok())
            .unwrap_or_else(|| panic!("none of {BASE_DIRS:?} is a writable directory"))
    })
}

/// Creates a fresh `<base>/zipline-test-XXXXXX` directory, sweeping stale ones first (once per
/// process).
pub(crate) fn test_dir() -> tempfile::TempDir {
    sweep_once();
    let base = base_dir();
    let dir = tempfile::Builder::new()
        .prefix(TEST_DIR_PREFIX)
        .tempdir_in(base)
        .unwrap_or_else(|e| panic!("creating a test directory in {}: {e}", base.display()));
    if let Some(me) = process_identity(std::process::id()) {
        let _ = fs::write(dir.path().join(OWNER_FILE), me);
    }
    dir
}

/// File in each test directory naming the owning test process as "<pid> <start time>", so a
/// sweep can tell a dead owner's directory from a live one (pids are reused; start times
/// make the pair unique).
const OWNER_FILE: &str = "owner";

/// "<pid> <start time in clock ticks since boot>" from /proc/<pid>/stat (field 22), or None if
/// the process does not exist or is a zombie (dead, but its entry lingers until reaped).
fn process_identity(pid: u32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name start at field 3 (the state).
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    Some(format!("{pid} {}", fields.get(19)?))
}

/// True if the test process that created `dir` is gone; None if `dir` records no owner.
fn owner_is_dead(dir: &Path) -> Option<bool> {
    let owner = fs::read_to_string(dir.join(OWNER_FILE)).ok()?;
    let pid: u32 = owner.split_whitespace().next()?.parse().ok()?;
    Some(process_identity(pid).as_deref() != Some(owner.trim()))
}

/// SIGKILLs servers still running in a dead test's directory: the pids in their pid files,
/// if their command line names this directory (so a reused pid is never hit).
fn kill_orphan_servers(dir: &Path) {
    let dir_str = dir.display().to_string();
    for pidfile in [dir.join("data/postmaster.pid"), dir.join("my.pid")] {
        let Some(pid) = fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.lines().next()?.trim().parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&dir_str) {
            signal_pids("KILL", &[pid]);
        }
    }
    pg::release_shared_memory(&dir.join("data"));
}

/// Removes leftovers of test processes that died without running their destructors (a
/// nextest timeout, a SIGKILL): directories of dead test processes (killing servers still
/// running there; the directories may be on tmpfs, i.e. RAM), directories without an owner
/// file older than 2 hours, and PostgreSQL shared-memory segments no process is attached to. A SIGKILLed postmaster leaves its SysV segment behind and
/// the kernel's default `shmmni` is 4096, so these would eventually stop PostgreSQL starting.
fn sweep_once() {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(|| {
        sweep_stale_dirs();
        sweep_orphan_pg_shm();
    });
}

fn sweep_stale_dirs() {
    let now = SystemTime::now();
    let dirs = BASE_DIRS
        .iter()
        .map(PathBuf::from)
        .chain(Some(base_dir().to_owned()));
    for entry in dirs
        .filter_map(|d| fs::read_dir(d).ok())
        .flatten()
        .flatten()
    {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with(TEST_DIR_PREFIX) && !name.starts_with(TEMPLATE_BUILD_PREFIX) {
            continue;
        }
        let path = entry.path();
        let stale = match owner_is_dead(&path) {
            Some(dead) => dead,
            None => entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age > STALE_AFTER),
        };
        if stale {
            kill_orphan_servers(&path);
            // Best effort: another process may be sweeping the same directory.
            let _ = fs::remove_dir_all(&path);
        }
    }
}

fn sweep_orphan_pg_shm() {
    let Ok(out) = Command::new("ipcs").arg("-m").output() else {
        return;
    };
    // Columns: key shmid owner perms bytes nattch [status]
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() >= 6 && cols[2] == "postgres" && cols[5] == "0" {
            // A restarting postmaster looks its old segment up and copes with it being gone.
            let _ = Command::new("ipcrm").args(["-m", cols[1]]).output();
        }
    }
}

/// Prefix of half-built templates (swept like test directories).
const TEMPLATE_BUILD_PREFIX: &str = "zipline-template-build-";

/// Returns the cached template directory `<base>/zipline-template-<name>`, building it with
/// `build(staging_dir)` if it does not exist yet. `build` must create `staging_dir/data`; it is
/// renamed into place atomically, so concurrent processes either see a complete template or
/// none (a process that loses the race throws its own copy away). `name` must change whenever
/// the template's contents would (server version, harness revision).
pub(crate) fn cached_template(name: &str, build: impl FnOnce(&Path)) -> PathBuf {
    let base = base_dir();
    let target = base.join(format!("zipline-template-{name}"));
    if target.is_dir() {
        return target;
    }
    sweep_once();
    let staging = tempfile::Builder::new()
        .prefix(TEMPLATE_BUILD_PREFIX)
        .tempdir_in(base)
        .unwrap_or_else(|e| {
            panic!(
                "creating a template staging directory in {}: {e}",
                base.display()
            )
        });
    let started = Instant::now();
    build(staging.path());
    eprintln!(
        "harness: built template {} in {:.2?}",
        target.display(),
        started.elapsed()
    );
    match fs::rename(staging.path().join("data"), &target) {
        Ok(()) => {}
        Err(_) if target.is_dir() => {} // another process published first
        Err(e) => panic!("publishing template {}: {e}", target.display()),
    }
    target
}

/// The version in a `--version` banner (its first word with a digit and a dot, e.g. `15.20`
/// or `10.11.19-MariaDB-0+deb12u1`), made file-name-safe.
pub(crate) fn version_key(program: &str) -> String {
    let out = run(Command::new(program).arg("--version"), program);
    let word = out
        .split_whitespace()
        .find(|w| w.contains('.') && w.starts_with(|c: char| c.is_ascii_digit()))
        .unwrap_or_else(|| panic!("no version number in `{program} --version`: {out}"));
    word.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '-')
        .collect()
}

/// Copies a template data directory to `dest` preserving owner and mode (`cp -a`).
pub(crate) fn copy_dir(from: &Path, dest: &Path) {
    run(Command::new("cp").arg("-a").arg(from).arg(dest), "cp -a");
}

/// Runs a command to completion; panics with its output unless it succeeds. Returns stdout.
pub(crate) fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    if !out.status.success() {
        panic!(
            "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a CLI client with `input` on stdin. Returns stdout trimmed, or an `Err` with the exit
/// status and stderr if the client fails (failing to start it at all panics). stdin is fed from a thread so large inputs and
/// outputs cannot deadlock.
pub(crate) fn try_run_with_stdin(
    cmd: &mut Command,
    input: &str,
    what: &str,
) -> Result<String, String> {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = input.to_owned();
    let feeder = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("waiting for {what}: {e}"));
    // A client that exits early closes the pipe; its exit status explains why.
    let _ = feeder.join();
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// uid and gid of an OS user, from /etc/passwd (avoids unsafe `getpwnam`).
pub(crate) fn os_user(name: &str) -> (u32, u32) {
    let passwd = fs::read_to_string("/etc/passwd").expect("reading /etc/passwd");
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() > 3 && f[0] == name)
        .map(|f| {
            let uid = f[2].parse().expect("uid in /etc/passwd");
            let gid = f[3].parse().expect("gid in /etc/passwd");
            (uid, gid)
        })
        .unwrap_or_else(|| panic!("OS user {name:?} not found in /etc/passwd"))
}

/// Sends a signal by name (`QUIT`, `INT`, ...) with kill(1); keeps the harness free of unsafe.
pub(crate) fn signal(child: &Child, sig: &str) {
    signal_pids(sig, &[child.id()]);
}

fn signal_pids(sig: &str, pids: &[u32]) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status();
}

/// SIGKILLs a server and all its direct children at once, like a machine crash, and reaps it.
/// Killing only a postmaster leaves its backends running for a moment (they poll for
/// postmaster death), and they can still answer a query. The parent is stopped first so it
/// cannot fork while its children are listed.
pub(crate) fn kill_tree(child: &mut Child) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    let pid = child.id();
    signal_pids("STOP", &[pid]);
    let mut pids = children_of(pid);
    pids.push(pid);
    signal_pids("KILL", &pids);
    let _ = child.wait();
}

/// Pids whose parent is `parent`, from /proc/<pid>/stat (field 4, after the parenthesised
/// command name, which may itself contain spaces or parentheses).
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(e.path().join("stat")).ok()?;
            let after_comm = &stat[stat.rfind(')')? + 1..];
            let ppid: u32 = after_comm.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

/// Waits up to `timeout` for `child` to exit.
pub(crate) fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => return None,
        }
    }
}

/// Stops a server child: `sig` first (its clean fast exit), SIGKILL if it takes over 10 s.
pub(crate) fn stop_child(child: &mut Child, sig: &str) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    signal(child, sig);
    if wait_timeout(child, Duration::from_secs(10)).is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// SIGKILLs a server child and reaps it.
pub(crate) fn kill_child(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// True if something accepts TCP connections on 127.0.0.1:`port`.
pub(crate) fn tcp_accepts(port: u16) -> bool {
    TcpStream::connect_timeout(
        &(Ipv4Addr::LOCALHOST, port).into(),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// The part of a log file written after byte `from` (lossy), for start-up diagnostics.
pub(crate) fn log_since(path: &Path, from: u64) -> String {
    let bytes = fs::read(path).unwrap_or_default();
    let from = usize::try_from(from).unwrap_or(0).min(bytes.len());
    String::from_utf8_lossy(&bytes[from..]).into_owned()
}

/// Current length of a (log) file, 0 if absent.
pub(crate) fn file_len(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Restarts a stopped server on its old directory and port (`server` names it in messages),
/// retrying for up to 30 s while the port or the old instance's resources are still held.
pub(crate) fn restart_server(
    server: &str,
    port: u16,
    dir: &Path,
    mut spawn_and_wait: impl FnMut() -> Result<(), StartError>,
) {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(30);
    loop {
        match spawn_and_wait() {
            Ok(()) => {
                eprintln!(
                    "harness: {server} on port {port} restarted in {:.2?}",
                    started.elapsed()
                );
                return;
            }
            Err(StartError::PortInUse | StartError::Busy(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(StartError::PortInUse) => panic!("{server} restart: port {port} stayed in use"),
            Err(StartError::Busy(log) | StartError::Fatal(log)) => {
                panic!("{server} in {} did not restart:\n{log}", dir.display())
            }
        }
    }
}

/// Why a server start attempt failed.
#[derive(Debug)]
pub(crate) enum StartError {
    /// The port was taken: pick another (or wait, on restart).
    PortInUse,
    /// A transient condition (the previous instance has not fully released its resources).
    Busy(String),
    /// Anything else: give up with this diagnostic.
    Fatal(String),
}
