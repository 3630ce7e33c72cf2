//! The instance claim and write fence in MySQL/MariaDB (see [`crate::checkpoint::fence`]).
//!
//! - The holder keeps a user lock (`GET_LOCK`, session-scoped, released when the session ends)
//!   on a connection of its own, and renews `heartbeat_at` in its fence row.
//! - A writer reads the fence row `LOCK IN SHARE MODE` inside its transaction; a claim reads it
//!   `FOR UPDATE` before raising the epoch, so it waits for writes in flight and later writes
//!   see the new epoch. A lane's batch does this inside its checkpoint upsert (no extra round
//!   trip): the new `lsn` is `IF(f.epoch <=> mine, lsn, NULL)`, and NULL into the NOT NULL
//!   column is error 1048 in the lane's strict session, which rolls the batch back.
//! - Taking over a holder that stopped heartbeating ends its fence session with
//!   `KILL CONNECTION` (allowed on one's own connections; other users' need the CONNECTION
//!   ADMIN or SUPER privilege).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use super::errors::{connection_lost, sink_error};
use super::literal::{push_ident, push_str};
use super::{Shared, close};
use crate::checkpoint::fence::{self, FENCE_TABLE, FenceRow, Holder, STARTING_RETRIES, Verdict};
use crate::sink::{BoxFuture, Lease, SinkError};

/// MySQL's error for NULL into a NOT NULL column: what a failed guard raises.
const GUARD_FAILED: u16 = 1048;

/// `CREATE TABLE IF NOT EXISTS` for the fence table in `database`.
pub(crate) fn create_table_sql(database: &str) -> String {
    let mut sql = String::from("CREATE TABLE IF NOT EXISTS ");
    push_table(&mut sql, database);
    sql.push_str(
        " (pipeline VARCHAR(128) NOT NULL, connector VARCHAR(128) NOT NULL, \
         epoch BIGINT UNSIGNED NOT NULL, pid INT UNSIGNED NOT NULL, host VARCHAR(255) NOT NULL, \
         session BIGINT UNSIGNED NOT NULL, started_at TIMESTAMP(6) NOT NULL, \
         heartbeat_at TIMESTAMP(6) NOT NULL, stopped_at TIMESTAMP(6) NULL, \
         last_error LONGTEXT NULL, PRIMARY KEY (pipeline, connector)) \
         ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    );
    sql
}

/// Fence tables made before `last_error` existed get it (MySQL 8 has no `ADD COLUMN IF NOT
/// EXISTS`; two instances adding it at once are told 1060, which means it is there).
async fn add_last_error(conn: &mut Conn, database: &str) -> Result<(), mysql_async::Error> {
    let mut probe = String::from(
        "SELECT 1 FROM information_schema.COLUMNS WHERE COLUMN_NAME='last_error' AND TABLE_SCHEMA=",
    );
    push_str(&mut probe, database);
    probe.push_str(" AND TABLE_NAME=");
    push_str(&mut probe, FENCE_TABLE);
    if conn.query_first::<u8, _>(probe).await?.is_some() {
        return Ok(());
    }
    let mut sql = String::from("ALTER TABLE ");
    push_table(&mut sql, database);
    sql.push_str(" ADD COLUMN last_error LONGTEXT NULL");
    match conn.query_drop(sql).await {
        Err(mysql_async::Error::Server(e)) if e.code == 1060 => Ok(()),
        other => other,
    }
}

pub(super) fn push_table(buf: &mut String, database: &str) {
    push_ident(buf, database);
    buf.push('.');
    push_ident(buf, FENCE_TABLE);
}

fn push_owner(buf: &mut String, shared: &Shared) {
    buf.push_str(" WHERE pipeline=");
    push_str(buf, &shared.pipeline);
    buf.push_str(" AND connector=");
    push_str(buf, &shared.options.name);
}

/// `IF(f.epoch<=>{epoch},{value},NULL)`: the value a guarded statement writes into a NOT NULL
/// column; `f` is the fence row joined by [`push_guard_source`].
pub(crate) fn push_guarded_value(buf: &mut String, epoch: u64, value: &str) {
    use std::fmt::Write as _;
    let _ = write!(buf, "IF(f.epoch<=>{epoch},{value},NULL)");
}

/// The `FROM` clause of a guarded `INSERT … SELECT`: exactly one row, with the fence row of
/// (`pipeline`, `connector`) as `f` (NULLs when it is missing), read under a shared lock.
pub(crate) fn push_guard_source(buf: &mut String, database: &str, pipeline: &str, connector: &str) {
    buf.push_str(" FROM (SELECT 1) AS z LEFT JOIN ");
    push_table(buf, database);
    buf.push_str(" AS f ON f.pipeline=");
    push_str(buf, pipeline);
    buf.push_str(" AND f.connector=");
    push_str(buf, connector);
    buf.push_str(" LOCK IN SHARE MODE");
}

/// True when `err` is a guarded statement finding another epoch.
pub(crate) fn is_guard_failure(err: &mysql_async::Error) -> bool {
    matches!(err, mysql_async::Error::Server(e) if e.code == GUARD_FAILED)
}

/// This instance's epoch, or an error when the connector was never claimed (a bug: every
/// writer runs after the pipeline's claim).
pub(crate) fn epoch(shared: &Shared) -> Result<u64, SinkError> {
    match shared.epoch.load(Ordering::Acquire) {
        0 => Err(SinkError::fatal(format!(
            "sink {}: writing before the pipeline claimed the sink (an internal error)",
            shared.sink()
        ))),
        epoch => Ok(epoch),
    }
}

/// Inside a transaction: fails unless the fence row still holds this instance's epoch, and
/// keeps it so (shared lock) until the transaction ends.
pub(crate) async fn check_locked(conn: &mut Conn, shared: &Shared) -> Result<(), SinkError> {
    let mine = epoch(shared)?;
    let mut sql = String::from("SELECT epoch FROM ");
    push_table(&mut sql, &shared.options.database);
    push_owner(&mut sql, shared);
    sql.push_str(" LOCK IN SHARE MODE");
    let found: Option<u64> = conn
        .query_first(sql)
        .await
        .map_err(|e| sink_error(shared.sink(), "checking the pipeline's claim", &e))?;
    if found == Some(mine) {
        return Ok(());
    }
    Err(fenced_error(
        shared,
        mine,
        read_row(conn, shared).await.ok().flatten(),
    ))
}

/// The error of a write that found another epoch, naming the new holder when it can.
pub(crate) async fn fenced(shared: &Shared) -> SinkError {
    let mine = shared.epoch.load(Ordering::Acquire);
    let row = match shared.connect().await {
        Ok(mut conn) => {
            let row = read_row(&mut conn, shared).await.ok().flatten();
            close(conn).await;
            row
        }
        Err(_) => None,
    };
    fenced_error(shared, mine, row)
}

fn fenced_error(shared: &Shared, mine: u64, row: Option<FenceRow>) -> SinkError {
    let o = &shared.options;
    SinkError::fatal(fence::fenced(&shared.pipeline, &o.name, mine, row.as_ref()))
}

async fn read_row(
    conn: &mut Conn,
    shared: &Shared,
) -> Result<Option<FenceRow>, mysql_async::Error> {
    let mut sql = String::from(
        "SELECT epoch, pid, host, DATE_FORMAT(started_at, '%Y-%m-%d %H:%i:%s'), \
         GREATEST(TIMESTAMPDIFF(MICROSECOND, heartbeat_at, NOW(6)), 0), stopped_at IS NOT NULL FROM ",
    );
    push_table(&mut sql, &shared.options.database);
    push_owner(&mut sql, shared);
    let row: Option<(u64, u32, String, String, u64, bool)> = conn.query_first(sql).await?;
    Ok(
        row.map(|(epoch, pid, host, started_at, age, stopped)| FenceRow {
            epoch,
            pid,
            host,
            started_at,
            heartbeat_age: Duration::from_micros(age),
            stopped,
        }),
    )
}

/// The claim of one MySQL sink (see the module docs).
pub(crate) struct MysqlLease {
    shared: Arc<Shared>,
    /// The fence session, holding the user lock; `None` after it broke.
    conn: Option<Conn>,
    epoch: u64,
    lock: String,
    /// The server's id of the session that holds (or held) the lock.
    session: u64,
}

/// Takes the pipeline's claim of this sink for `holder` (see the module docs).
pub(crate) async fn claim(
    shared: Arc<Shared>,
    holder: &Holder,
    lease: Duration,
) -> Result<MysqlLease, SinkError> {
    let o = &shared.options;
    let sink = shared.sink();
    let err = |doing: &'static str| move |e: mysql_async::Error| sink_error(sink, doing, &e);
    let mut conn = shared.connect().await?;
    conn.query_drop(create_table_sql(&o.database))
        .await
        .map_err(err("creating the fence table"))?;
    add_last_error(&mut conn, &o.database)
        .await
        .map_err(err("adding column last_error to the fence table"))?;
    // A claim waits for writes in flight of an older instance, not for ever.
    conn.query_drop("SET SESSION innodb_lock_wait_timeout=10")
        .await
        .map_err(err("setting up the fence session"))?;
    let lock = fence::lock_name(&o.database, &shared.pipeline, &o.name);
    let mut lock_literal = String::new();
    push_str(&mut lock_literal, &lock);
    let mut waited = 0;
    loop {
        let got: Option<Option<i64>> = conn
            .query_first(format!("SELECT GET_LOCK({lock_literal}, 0)"))
            .await
            .map_err(err("taking the pipeline's lock"))?;
        if got == Some(Some(1)) {
            break;
        }
        let row = read_row(&mut conn, &shared)
            .await
            .map_err(err("reading the fence row"))?;
        match fence::judge(row, lease) {
            Verdict::Refuse(row) => {
                close(conn).await;
                return Err(SinkError::fatal(fence::refusal(
                    &shared.pipeline,
                    sink,
                    &row,
                    lease,
                )));
            }
            Verdict::Wait if waited < STARTING_RETRIES => {
                waited += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Verdict::Wait => {
                close(conn).await;
                return Err(SinkError::fatal(fence::refusal_unknown(
                    &shared.pipeline,
                    sink,
                )));
            }
            Verdict::TakeOver(row) => {
                fence::log_takeover(&shared.pipeline, sink, &row);
                let session: Option<Option<u64>> = conn
                    .query_first(format!("SELECT IS_USED_LOCK({lock_literal})"))
                    .await
                    .map_err(err("finding the session that holds the pipeline's lock"))?;
                if let Some(Some(session)) = session {
                    kill(&mut conn, sink, session).await?;
                }
                // The killed session releases the lock as it ends.
                let got: Option<Option<i64>> = conn
                    .query_first(format!("SELECT GET_LOCK({lock_literal}, 5)"))
                    .await
                    .map_err(err("taking the pipeline's lock"))?;
                if got == Some(Some(1)) {
                    break;
                }
            }
        }
    }
    let epoch = raise_epoch(&mut conn, &shared, holder).await?;
    let session: Option<u64> = conn
        .query_first("SELECT CONNECTION_ID()")
        .await
        .map_err(err("reading the fence session's id"))?;
    shared.epoch.store(epoch, Ordering::Release);
    tracing::info!(sink, epoch, "claimed the sink for this instance");
    Ok(MysqlLease {
        shared: Arc::clone(&shared),
        conn: Some(conn),
        epoch,
        lock: lock_literal,
        session: session.unwrap_or_default(),
    })
}

async fn kill(conn: &mut Conn, sink: &str, session: u64) -> Result<(), SinkError> {
    match conn.query_drop(format!("KILL CONNECTION {session}")).await {
        Ok(()) => Ok(()),
        // Unknown thread: it ended meanwhile.
        Err(mysql_async::Error::Server(e)) if e.code == 1094 => Ok(()),
        Err(e) => {
            let mut err = sink_error(
                sink,
                &format!("ending session {session} of the previous instance"),
                &e,
            );
            err.message.push_str(
                "; stop the previous instance, or let the sink's user end other users' sessions \
                 (CONNECTION ADMIN)",
            );
            Err(err)
        }
    }
}

/// Raises the epoch by one and records `holder`, waiting for writes in flight of the previous
/// holder (their shared locks).
async fn raise_epoch(conn: &mut Conn, shared: &Shared, holder: &Holder) -> Result<u64, SinkError> {
    let o = &shared.options;
    let mut select = String::from("SELECT epoch FROM ");
    push_table(&mut select, &o.database);
    push_owner(&mut select, shared);
    select.push_str(" FOR UPDATE");
    let result = async {
        conn.query_drop("START TRANSACTION").await?;
        let old: Option<u64> = conn.query_first(select).await?;
        let epoch = old.unwrap_or(0) + 1;
        let mut sql = String::from("INSERT INTO ");
        push_table(&mut sql, &o.database);
        sql.push_str(
            " (pipeline,connector,epoch,pid,host,session,started_at,heartbeat_at,stopped_at) \
             VALUES (",
        );
        push_str(&mut sql, &shared.pipeline);
        sql.push(',');
        push_str(&mut sql, &o.name);
        sql.push_str(&format!(",{epoch},{},", holder.pid));
        push_str(&mut sql, &holder.host);
        sql.push_str(
            ",CONNECTION_ID(),NOW(6),NOW(6),NULL) ON DUPLICATE KEY UPDATE epoch=VALUES(epoch),\
             pid=VALUES(pid),host=VALUES(host),session=VALUES(session),\
             started_at=VALUES(started_at),heartbeat_at=VALUES(heartbeat_at),stopped_at=NULL;\
             COMMIT",
        );
        conn.query_drop(sql).await?;
        Ok::<_, mysql_async::Error>(epoch)
    }
    .await;
    result.map_err(|e| {
        sink_error(
            shared.sink(),
            "raising the claim's epoch (waiting for the previous instance's writes)",
            &e,
        )
    })
}

impl MysqlLease {
    /// One renewal on the current (or a new) fence session.
    async fn beat(&mut self) -> Result<(), SinkError> {
        let shared = Arc::clone(&self.shared);
        let sink = shared.sink();
        if self.conn.is_none() {
            let mut conn = shared.connect().await?;
            self.retake_lock(&mut conn).await?;
            self.conn = Some(conn);
        }
        let conn = self.conn.as_mut().expect("connected above");
        let mut sql = String::from("UPDATE ");
        push_table(&mut sql, &shared.options.database);
        sql.push_str(&format!(
            " SET heartbeat_at=NOW(6),session={} ",
            self.session
        ));
        push_owner(&mut sql, &shared);
        sql.push_str(&format!(" AND epoch={}", self.epoch));
        match conn.query_drop(sql).await {
            Ok(()) if conn.affected_rows() == 1 => Ok(()),
            Ok(()) => {
                let row = read_row(conn, &shared).await.ok().flatten();
                Err(fenced_error(&shared, self.epoch, row))
            }
            Err(e) => {
                if connection_lost(&e) {
                    self.conn = None;
                }
                Err(sink_error(sink, "renewing the pipeline's claim", &e))
            }
        }
    }

    /// Takes the user lock again on a new fence session. The old session may linger in the
    /// server holding it: it is ours, so it is ended.
    async fn retake_lock(&mut self, conn: &mut Conn) -> Result<(), SinkError> {
        let sink = self.shared.sink();
        let err = |e: mysql_async::Error| sink_error(sink, "taking the pipeline's lock again", &e);
        let lock = &self.lock;
        let got: Option<Option<i64>> = conn
            .query_first(format!("SELECT GET_LOCK({lock}, 0)"))
            .await
            .map_err(err)?;
        if got != Some(Some(1)) {
            let holder: Option<Option<u64>> = conn
                .query_first(format!("SELECT IS_USED_LOCK({lock})"))
                .await
                .map_err(err)?;
            if holder == Some(Some(self.session)) {
                kill(conn, sink, self.session).await?;
                let _: Option<Option<i64>> = conn
                    .query_first(format!("SELECT GET_LOCK({lock}, 5)"))
                    .await
                    .map_err(err)?;
            }
            // Otherwise another process holds it: the epoch in the fence row decides.
        }
        let id: Option<u64> = conn
            .query_first("SELECT CONNECTION_ID()")
            .await
            .map_err(err)?;
        self.session = id.unwrap_or_default();
        Ok(())
    }
}

impl Lease for MysqlLease {
    fn epoch(&self) -> u64 {
        self.epoch
    }

    fn renew(&mut self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            match self.beat().await {
                // The fence session broke (it may have been ended by a takeover): once more
                // on a new one, which finds out.
                Err(e) if self.conn.is_none() => {
                    tracing::debug!(sink = self.shared.sink(), error = %crate::error::Report(&e), "fence session lost; renewing on a new one");
                    self.beat().await
                }
                other => other,
            }
        })
    }

    fn release(self: Box<Self>, failure: Option<String>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let MysqlLease {
                shared,
                conn,
                epoch,
                lock,
                ..
            } = *self;
            let Some(mut conn) = conn else { return };
            let mut sql = String::from("UPDATE ");
            push_table(&mut sql, &shared.options.database);
            sql.push_str(" SET stopped_at=NOW(6), last_error=");
            match &failure {
                Some(text) => push_str(&mut sql, text),
                None => sql.push_str("NULL"),
            }
            push_owner(&mut sql, &shared);
            sql.push_str(&format!(" AND epoch={epoch}; DO RELEASE_LOCK({lock})"));
            if let Err(e) = conn.query_drop(sql).await {
                tracing::debug!(sink = shared.sink(), error = %e, "releasing the claim");
            }
            close(conn).await;
        })
    }
}
