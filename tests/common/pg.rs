//! Throwaway PostgreSQL 15 clusters.
//!
//! `initdb` and `postgres` refuse to run as root, so both run as the `postgres` OS user
//! (`Command::uid/gid`) on a directory chowned to it; the postmaster is a direct child of the
//! test process. Readiness is line 8 of `postmaster.pid` reading `ready` for *our* child's pid
//! (after `kill` the old file still says `ready`), see
//! <https://www.postgresql.org/docs/15/storage-file-layout.html>.
//!
//! Drop uses an immediate shutdown (SIGQUIT) rather than SIGKILL: a SIGKILLed postmaster leaves
//! its SysV shared-memory segment behind. [`Postgres::kill`] still uses SIGKILL (a real crash,
//! backends included); the next start on the same directory, or drop, removes the segment.

use super::{
    StartError, copy_dir, file_len, kill_child, kill_tree, log_since, os_user, run, stop_child,
    tcp_accepts, try_run_with_stdin,
};
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const BIN: &str = "/usr/lib/postgresql/15/bin";
/// Bump when the initdb options below change, so cached templates are rebuilt.
const TEMPLATE_REV: &str = "r1";
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Settings every cluster gets; `start_with` can override any of them (last `-c` wins).
const BASE_SETTINGS: &[(&str, &str)] = &[
    ("listen_addresses", "127.0.0.1"),
    ("wal_level", "logical"),
    ("max_replication_slots", "20"),
    ("max_wal_senders", "20"),
    ("fsync", "off"),
    ("full_page_writes", "off"),
    // A cut replication connection keeps its slot "active" until this expires.
    ("wal_sender_timeout", "2s"),
    ("max_connections", "200"),
    // Keep dynamic shared memory in PGDATA/pg_dynshmem: the default (posix) puts it in
    // /dev/shm/PostgreSQL.*, where a SIGKILLed cluster leaks it for good.
    ("dynamic_shared_memory_type", "mmap"),
];

/// A private PostgreSQL cluster; killed and deleted on drop.
pub struct Postgres {
    pub port: u16,
    /// The test directory: `data/` (PGDATA), `postgres.log`, and the Unix socket.
    pub dir: PathBuf,
    child: Option<Child>,
    settings: Vec<(String, String)>,
    // Declared last: removed after the server has stopped.
    _tmp: tempfile::TempDir,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres")
            .field("port", &self.port)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Postgres {
    /// Starts a cluster with the harness defaults (`wal_level=logical`, ...).
    pub fn start() -> Postgres {
        Self::start_with(&[])
    }

    /// Starts a cluster with extra `-c name=value` settings (applied after the defaults).
    pub fn start_with(extra_args: &[(&str, &str)]) -> Postgres {
        let started = Instant::now();
        let template = template();
        let tmp = super::test_dir();
        let dir = tmp.path().to_path_buf();
        let (uid, gid) = os_user("postgres");
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
            .unwrap_or_else(|e| panic!("chown {} to postgres: {e}", dir.display()));
        copy_dir(template, &dir.join("data"));
        let settings = BASE_SETTINGS
            .iter()
            .chain(extra_args)
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut pg = Postgres {
            port: 0,
            dir,
            child: None,
            settings,
            _tmp: tmp,
        };
        let mut last = String::new();
        for _ in 0..20 {
            pg.port = super::free_port();
            match pg.spawn_and_wait() {
                Ok(()) => {
                    eprintln!(
                        "harness: postgres on port {} ({}) ready in {:.2?}",
                        pg.port,
                        pg.dir.display(),
                        started.elapsed()
                    );
                    return pg;
                }
                Err(StartError::PortInUse) => last = "port in use".into(),
                Err(StartError::Busy(log) | StartError::Fatal(log)) => {
                    panic!("postgres in {} did not start:\n{log}", pg.dir.display())
                }
            }
        }
        panic!("postgres could not get a free port after 20 tries ({last})");
    }

    pub fn host(&self) -> &str {
        "127.0.0.1"
    }

    /// libpq-style connection string for `db` over TCP, user `postgres`.
    pub fn conn_str(&self, db: &str) -> String {
        if self.tls_only() {
            return self.local_conn_str(db);
        }
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db} connect_timeout=10",
            self.port
        )
    }

    /// `postgres://` URL for `db` (e.g. for a Zipline config).
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Whether TCP takes TLS only (started with its own `hba_file`): the test's own clients
    /// then use the Unix socket.
    fn tls_only(&self) -> bool {
        self.settings.iter().any(|(k, _)| k == "hba_file")
    }

    /// A connected client (over the Unix socket when TCP takes TLS only); its connection task
    /// runs on the caller's runtime.
    pub async fn client(&self, db: &str) -> tokio_postgres::Client {
        if self.tls_only() {
            return self.local_client(db).await;
        }
        let (client, conn) = tokio_postgres::connect(&self.conn_str(db), tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connecting to postgres :{} db {db}: {e}", self.port));
        tokio::spawn(async move {
            // Errors here are expected in fault tests (killed server, cut proxy).
            let _ = conn.await;
        });
        client
    }

    /// A connected client over the Unix socket (which `hostssl`-only `pg_hba.conf` files used
    /// by the TLS tests still allow).
    pub async fn local_client(&self, db: &str) -> tokio_postgres::Client {
        let (client, conn) =
            tokio_postgres::connect(&self.local_conn_str(db), tokio_postgres::NoTls)
                .await
                .unwrap_or_else(|e| {
                    panic!("connecting to postgres socket :{} db {db}: {e}", self.port)
                });
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client
    }

    /// libpq-style connection string for `db` over the Unix socket, user `postgres`.
    pub fn local_conn_str(&self, db: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={db} connect_timeout=10",
            self.dir.display(),
            self.port
        )
    }

    /// `CREATE DATABASE name` (blocking, via psql).
    pub fn create_database(&self, name: &str) {
        self.psql(
            "postgres",
            &format!("CREATE DATABASE {}", quote_ident(name)),
        );
    }

    /// Runs `sql` (one or more statements) with psql over the Unix socket; panics with psql's
    /// stderr on any error. Returns unaligned, tuples-only output, trimmed; rows are separated
    /// by newlines and columns by `|`.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        self.try_psql(db, sql).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`Postgres::psql`], but an SQL error is an `Err` carrying psql's stderr (for tests
    /// that expect one).
    pub fn try_psql(&self, db: &str, sql: &str) -> Result<String, String> {
        try_run_with_stdin(
            Command::new(format!("{BIN}/psql"))
                .args([
                    "-X",
                    "-A",
                    "-t",
                    "-q",
                    "-v",
                    "ON_ERROR_STOP=1",
                    "-U",
                    "postgres",
                ])
                .arg("-h")
                .arg(&self.dir)
                .arg("-p")
                .arg(self.port.to_string())
                .args(["-d", db, "-f", "-"])
                .env("PGCONNECT_TIMEOUT", "10"),
            sql,
            &format!("psql on port {} db {db}", self.port),
        )
    }

    /// Crashes the server: SIGKILLs the postmaster and its backends together and reaps it, so
    /// every open connection fails at once. No-op if it is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_tree(&mut child);
        }
    }

    /// Fast shutdown (SIGINT: disconnect clients, checkpoint) and wait.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, "INT");
        }
    }

    /// Starts the server again on the same directory and port after `kill` or `stop`. Retries
    /// for a while if the port or the old shared memory is still held.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart() while postgres is running");
        let (port, dir) = (self.port, self.dir.clone());
        super::restart_server("postgres", port, &dir, || self.spawn_and_wait());
    }

    /// PID of the server process while it runs (for CPU accounting in benchmarks).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(std::process::Child::id)
    }

    /// The server log so far (stderr of every start).
    pub fn log(&self) -> String {
        log_since(&self.log_path(), 0)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    fn spawn_and_wait(&mut self) -> Result<(), StartError> {
        let log_path = self.log_path();
        let log_from = file_len(&log_path);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap_or_else(|e| panic!("opening {}: {e}", log_path.display()));
        let (uid, gid) = os_user("postgres");
        let mut cmd = Command::new(format!("{BIN}/postgres"));
        cmd.arg("-D")
            .arg(self.data_dir())
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(&self.dir);
        for (k, v) in &self.settings {
            cmd.arg("-c").arg(format!("{k}={v}"));
        }
        let child = cmd
            .uid(uid)
            .gid(gid)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log fd"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {BIN}/postgres: {e}"));
        let pid = child.id().to_string();
        self.child = Some(child);

        let deadline = Instant::now() + START_TIMEOUT;
        let pidfile = self.data_dir().join("postmaster.pid");
        loop {
            let child = self.child.as_mut().expect("child just spawned");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                let text = log_since(&log_path, log_from);
                return Err(classify_failure(&format!("exited with {status}\n{text}")));
            }
            if let Ok(contents) = fs::read_to_string(&pidfile) {
                let lines: Vec<&str> = contents.lines().collect();
                let ours = lines.first().is_some_and(|l| l.trim() == pid);
                let ready = lines.get(7).is_some_and(|l| l.trim() == "ready");
                if ours && ready && tcp_accepts(self.port) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                let mut child = self.child.take().expect("child");
                kill_child(&mut child);
                let text = log_since(&log_path, log_from);
                return Err(StartError::Fatal(format!(
                    "not ready after {START_TIMEOUT:?}\n{text}"
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Immediate shutdown: fast, and unlike SIGKILL it frees the shared memory.
            stop_child(&mut child, "QUIT");
        }
        // After `kill()` without `restart()`, the segment is still there.
        release_shared_memory(&self.data_dir());
    }
}

/// Removes the SysV segment named in a dead postmaster's `postmaster.pid` (line 7: key and
/// id), if it still exists with that key. A clean shutdown removes the file, so this is a no-op
/// then. Segments still attached by exiting backends go away when they detach.
pub(crate) fn release_shared_memory(data_dir: &Path) {
    let Ok(pidfile) = fs::read_to_string(data_dir.join("postmaster.pid")) else {
        return;
    };
    let Some((key, id)) = pidfile.lines().nth(6).and_then(|l| {
        let mut f = l.split_whitespace().map(str::parse::<u64>);
        Some((f.next()?.ok()?, f.next()?.ok()?))
    }) else {
        return;
    };
    let Ok(out) = Command::new("ipcs").arg("-m").output() else {
        return;
    };
    let key_hex = format!("{key:#010x}");
    let listed = String::from_utf8_lossy(&out.stdout).lines().any(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        cols.len() >= 2 && cols[0] == key_hex && cols[1] == id.to_string()
    });
    if listed {
        let _ = Command::new("ipcrm").args(["-m", &id.to_string()]).output();
    }
}

fn classify_failure(log: &str) -> StartError {
    if log.contains("Address already in use") || log.contains("could not bind") {
        StartError::PortInUse
    } else if log.contains("is still in use") || log.contains("already exists") {
        // Shared memory or lock file of a just-killed postmaster whose backends linger.
        StartError::Busy(log.to_owned())
    } else {
        StartError::Fatal(log.to_owned())
    }
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The initdb'd template, built once per machine and PostgreSQL version.
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let version = super::version_key(&format!("{BIN}/initdb"));
        let name = format!("pg-{version}-{TEMPLATE_REV}");
        super::cached_template(&name, |staging| {
            let (uid, gid) = os_user("postgres");
            std::os::unix::fs::chown(staging, Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("chown {} to postgres: {e}", staging.display()));
            let mut cmd = Command::new(format!("{BIN}/initdb"));
            cmd.arg("-D").arg(staging.join("data")).args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
                "--no-instructions",
            ]);
            let cmd = cmd.uid(uid).gid(gid).current_dir(staging);
            run(cmd, "initdb");
        })
    })
}
