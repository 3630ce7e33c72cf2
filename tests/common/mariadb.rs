//! Throwaway MariaDB servers.
//!
//! `mariadbd --no-defaults` runs as a direct child (as root, `--user=root`), so nothing from
//! `/etc/mysql` applies; the settings Debian's packaged config would give (utf8mb4) are passed
//! explicitly. Readiness is "ready for connections" appearing in *this* start's part of the
//! error log while the child is alive (a port clash makes mariadbd exit instead), see
//! <https://mariadb.com/kb/en/mariadbd-options/>.
//!
//! Durability: `innodb_flush_log_at_trx_commit=2` keeps every committed row across a SIGKILL of
//! the server (the OS still has the log writes); 0 could lose the last second of commits.

use super::{
    StartError, copy_dir, file_len, kill_child, log_since, run, tcp_accepts, try_run_with_stdin,
};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Bump when the install options below change, so cached templates are rebuilt.
const TEMPLATE_REV: &str = "r1";
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Shared by install and every start: a smaller redo log than the 96M default keeps the
/// per-test copy of the template small, and the two must agree or startup resizes it.
const LOG_FILE_SIZE: &str = "--innodb-log-file-size=32M";

/// A private MariaDB server; killed and deleted on drop.
pub struct MariaDb {
    pub port: u16,
    /// The test directory: `data/`, `err.log`, `my.sock`, `my.pid`.
    pub dir: PathBuf,
    child: Option<Child>,
    /// Extra server options (`start_with`).
    extra: Vec<String>,
    // Declared last: removed after the server has stopped.
    _tmp: tempfile::TempDir,
}

impl std::fmt::Debug for MariaDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MariaDb")
            .field("port", &self.port)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl MariaDb {
    pub fn start() -> MariaDb {
        Self::start_with(&[])
    }

    /// Starts a server with extra `mariadbd` options (after the harness's own).
    pub fn start_with(extra: &[String]) -> MariaDb {
        let started = Instant::now();
        let template = template();
        let tmp = super::test_dir();
        let dir = tmp.path().to_path_buf();
        copy_dir(template, &dir.join("data"));
        let mut db = MariaDb {
            port: 0,
            dir,
            child: None,
            extra: extra.to_vec(),
            _tmp: tmp,
        };
        let mut last = String::new();
        for _ in 0..20 {
            db.port = super::free_port();
            match db.spawn_and_wait() {
                Ok(()) => {
                    eprintln!(
                        "harness: mariadb on port {} ({}) ready in {:.2?}",
                        db.port,
                        db.dir.display(),
                        started.elapsed()
                    );
                    return db;
                }
                Err(StartError::PortInUse) => last = "port in use".into(),
                Err(StartError::Busy(log) | StartError::Fatal(log)) => {
                    panic!("mariadbd in {} did not start:\n{log}", db.dir.display())
                }
            }
        }
        panic!("mariadbd could not get a free port after 20 tries ({last})");
    }

    pub fn host(&self) -> &str {
        "127.0.0.1"
    }

    /// `mysql://` URL for `db` over TCP as root. `prefer_socket=false` keeps mysql_async on
    /// TCP (it would otherwise switch to the Unix socket and bypass a [`super::Proxy`]).
    pub fn url(&self, db: &str) -> String {
        format!(
            "mysql://root@127.0.0.1:{}/{db}?prefer_socket=false",
            self.port
        )
    }

    /// A connection as root over TCP; `db` may be "" for no default database.
    pub async fn conn(&self, db: &str) -> mysql_async::Conn {
        if self
            .extra
            .iter()
            .any(|o| o == "--require-secure-transport=ON")
        {
            // The socket counts as secure transport; TCP would need TLS.
            return self.socket_conn(db).await;
        }
        let opts = mysql_async::OptsBuilder::default()
            .ip_or_hostname("127.0.0.1")
            .tcp_port(self.port)
            .user(Some("root"))
            .db_name((!db.is_empty()).then_some(db))
            .prefer_socket(false);
        mysql_async::Conn::new(opts)
            .await
            .unwrap_or_else(|e| panic!("connecting to mariadb :{} db {db:?}: {e}", self.port))
    }

    /// A connection as root over the Unix socket (allowed even with
    /// `require_secure_transport=ON`).
    pub async fn socket_conn(&self, db: &str) -> mysql_async::Conn {
        let opts = mysql_async::OptsBuilder::default()
            .socket(Some(self.dir.join("my.sock").display().to_string()))
            .user(Some("root"))
            .db_name((!db.is_empty()).then_some(db));
        mysql_async::Conn::new(opts)
            .await
            .unwrap_or_else(|e| panic!("connecting to mariadb socket db {db:?}: {e}"))
    }

    /// ``CREATE DATABASE `name` `` (blocking, via the mariadb CLI).
    pub fn create_database(&self, name: &str) {
        self.sql(
            "",
            &format!("CREATE DATABASE `{}`", name.replace('`', "``")),
        );
    }

    /// Runs `sql` (one or more statements) with the mariadb CLI in batch mode; panics with its
    /// stderr on any error. Returns tab-separated rows without headers, trimmed.
    pub fn sql(&self, db: &str, sql: &str) -> String {
        self.try_sql(db, sql).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`MariaDb::sql`], but an SQL error is an `Err` carrying the client's stderr.
    pub fn try_sql(&self, db: &str, sql: &str) -> Result<String, String> {
        let mut cmd = Command::new("mariadb");
        cmd.args(["--no-defaults", "-uroot", "-N", "-B"]);
        if self
            .extra
            .iter()
            .any(|a| a.contains("require-secure-transport"))
        {
            // Plaintext TCP is refused then; the socket counts as secure.
            cmd.arg("--protocol=SOCKET")
                .arg(format!("--socket={}", self.dir.join("my.sock").display()));
        } else {
            cmd.args(["--protocol=TCP", "-h127.0.0.1"])
                .arg(format!("-P{}", self.port));
        }
        if !db.is_empty() {
            cmd.arg(db);
        }
        try_run_with_stdin(
            &mut cmd,
            sql,
            &format!("mariadb on port {} db {db:?}", self.port),
        )
    }

    /// SIGKILLs the server (a crash) and reaps it. No-op if it is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_child(&mut child);
        }
    }

    /// Clean shutdown (SIGTERM) and wait.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            super::stop_child(&mut child, "TERM");
        }
    }

    /// Starts the server again on the same directory and port after `kill` or `stop`.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart() while mariadbd is running");
        let (port, dir) = (self.port, self.dir.clone());
        super::restart_server("mariadbd", port, &dir, || self.spawn_and_wait());
    }

    /// PID of the server process while it runs (for CPU accounting in benchmarks).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(std::process::Child::id)
    }

    /// The error log so far (every start).
    pub fn log(&self) -> String {
        log_since(&self.log_path(), 0)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("err.log")
    }

    fn spawn_and_wait(&mut self) -> Result<(), StartError> {
        let log_path = self.log_path();
        let log_from = file_len(&log_path);
        let d = |name: &str| self.dir.join(name).display().to_string();
        let child = Command::new(mariadbd())
            .args(["--no-defaults", "--user=root"])
            .arg(format!("--datadir={}", d("data")))
            .arg(format!("--socket={}", d("my.sock")))
            .arg(format!("--pid-file={}", d("my.pid")))
            .arg(format!("--log-error={}", d("err.log")))
            // Its own temporary directory: a shared /tmp gets swept by other tools mid-query.
            .arg(format!("--tmpdir={}", self.dir.display()))
            .arg(format!("--port={}", self.port))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-log-bin",
                "--innodb-flush-log-at-trx-commit=2",
                "--innodb-doublewrite=0",
                "--innodb-buffer-pool-size=256M",
                LOG_FILE_SIZE,
                "--max-connections=500",
                "--character-set-server=utf8mb4",
                "--collation-server=utf8mb4_general_ci",
            ])
            .args(&self.extra)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning mariadbd: {e}"));
        self.child = Some(child);

        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let child = self.child.as_mut().expect("child just spawned");
            let text = log_since(&log_path, log_from);
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Err(classify_failure(&format!("exited with {status}\n{text}")));
            }
            if text.contains("ready for connections") && tcp_accepts(self.port) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let mut child = self.child.take().expect("child");
                kill_child(&mut child);
                return Err(StartError::Fatal(format!(
                    "not ready after {START_TIMEOUT:?}\n{text}"
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        // No shared resources outlive the process, so a crash stop is fine and fastest.
        self.kill();
    }
}

fn classify_failure(log: &str) -> StartError {
    if log.contains("Address already in use") || log.contains("Bind on TCP/IP port") {
        StartError::PortInUse
    } else if log.contains("Unable to lock") {
        // InnoDB files still locked by a previous instance that is exiting.
        StartError::Busy(log.to_owned())
    } else {
        StartError::Fatal(log.to_owned())
    }
}

/// `mariadbd` lives in /usr/sbin, which is not on every PATH.
fn mariadbd() -> &'static str {
    if Path::new("/usr/sbin/mariadbd").exists() {
        "/usr/sbin/mariadbd"
    } else {
        "mariadbd"
    }
}

/// The installed system tables, built once per machine and MariaDB version.
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let version = super::version_key(mariadbd());
        let name = format!("mariadb-{version}-{TEMPLATE_REV}");
        super::cached_template(&name, |staging| {
            let datadir = staging.join("data");
            run(
                Command::new("mariadb-install-db")
                    .args([
                        "--no-defaults",
                        "--user=root",
                        "--auth-root-authentication-method=normal",
                        "--skip-test-db",
                        LOG_FILE_SIZE,
                    ])
                    .arg(format!("--datadir={}", datadir.display()))
                    .current_dir(staging),
                "mariadb-install-db",
            );
            // Leftovers of the bootstrap server that a fresh start must not inherit.
            let _ = fs::remove_file(datadir.join("ib_buffer_pool"));
        })
    })
}
