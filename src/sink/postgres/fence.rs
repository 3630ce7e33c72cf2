//! The instance claim and write fence in PostgreSQL (see [`crate::checkpoint::fence`]).
//!
//! - The holder keeps a session-level advisory lock (the *live* key, released when its
//!   session ends) on a connection of its own, and renews `heartbeat_at` in its fence row.
//! - Every writing transaction takes the *fence* key's advisory lock in shared mode
//!   ([`lock_sql`], in a statement of its own so that the next statement's snapshot is taken
//!   after it), then checks its epoch; a claim takes that lock exclusively before raising the
//!   epoch, so it waits for writes in flight, and later writes see the new epoch. Advisory
//!   locks live in shared memory: unlike a row lock, the shared lock costs no tuple write.
//!   A lane's batch checks inside its checkpoint upsert (a NULL `lsn` unless the epoch is its
//!   own: 23502 aborts the transaction), which keeps the batch one pipelined round trip.
//! - Taking over a holder that stopped heartbeating ends its fence session with
//!   `pg_terminate_backend` (allowed on sessions of one's own role).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_postgres::Client;

use super::Shared;
use super::errors::sink_error;
use super::sql::qualified;
use crate::checkpoint::fence::{self, FENCE_TABLE, FenceRow, Holder, STARTING_RETRIES, Verdict};
use crate::sink::{BoxFuture, Lease, SinkError};

/// Fence tables made before `last_error` existed get it. Looked up first: the `ALTER` takes
/// an exclusive lock that would queue the running instance's batches behind a new claimant.
async fn add_last_error(client: &Client, schema: &str) -> Result<(), tokio_postgres::Error> {
    let table = qualified(schema, FENCE_TABLE);
    let present = client
        .query_opt(
            "SELECT 1 FROM pg_attribute WHERE attrelid = $1::text::regclass \
             AND attname = 'last_error' AND NOT attisdropped",
            &[&table],
        )
        .await?
        .is_some();
    if !present {
        client
            .batch_execute(&format!(
                "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS last_error text"
            ))
            .await?;
    }
    Ok(())
}

/// `CREATE TABLE IF NOT EXISTS` for the fence table in `schema`.
pub(crate) fn create_table_sql(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\
         pipeline varchar(128) COLLATE \"C\" NOT NULL, \
         connector varchar(128) COLLATE \"C\" NOT NULL, \
         epoch bigint NOT NULL, pid bigint NOT NULL, host text NOT NULL, \
         session integer NOT NULL, started_at timestamptz NOT NULL, \
         heartbeat_at timestamptz NOT NULL, stopped_at timestamptz, \
         last_error text, PRIMARY KEY (pipeline, connector))",
        qualified(schema, FENCE_TABLE)
    )
}

/// A scalar query for the fence row's epoch of (`pipeline`, `connector`), SQL expressions.
pub(crate) fn epoch_query(schema: &str, pipeline: &str, connector: &str) -> String {
    format!(
        "SELECT f.epoch FROM {} f WHERE f.pipeline = {pipeline} AND f.connector = {connector}",
        qualified(schema, FENCE_TABLE)
    )
}

/// The statement a writing transaction runs before its fence check: `$1` is the fence key.
pub(crate) const LOCK_SQL: &str = "SELECT pg_advisory_xact_lock_shared($1::int8)";

/// NOT NULL violation: what a failed guard raises.
pub(crate) fn is_guard_failure(err: &tokio_postgres::Error) -> bool {
    err.code()
        .is_some_and(|c| *c == tokio_postgres::error::SqlState::NOT_NULL_VIOLATION)
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
pub(crate) async fn check_in_tx(client: &Client, shared: &Shared) -> Result<(), SinkError> {
    let mine = epoch(shared)?;
    let err =
        |e: tokio_postgres::Error| sink_error(shared.sink(), "checking the pipeline's claim", &e);
    client
        .execute(LOCK_SQL, &[&shared.fence_keys.1])
        .await
        .map_err(err)?;
    let o = &shared.options;
    let found = client
        .query_opt(
            &epoch_query(shared.checkpoint_schema(), "$1::text", "$2::text"),
            &[&shared.pipeline, &o.name],
        )
        .await
        .map_err(err)?
        .map(|r| r.get::<_, i64>(0));
    if found.and_then(|e| u64::try_from(e).ok()) == Some(mine) {
        return Ok(());
    }
    Err(fenced_error(
        shared,
        mine,
        read_row(client, shared).await.ok().flatten(),
    ))
}

/// The error of a write that found another epoch, naming the new holder when it can.
pub(crate) async fn fenced(shared: &Shared) -> SinkError {
    let mine = shared.epoch.load(Ordering::Acquire);
    let row = match shared.connect().await {
        Ok(client) => read_row(&client, shared).await.ok().flatten(),
        Err(_) => None,
    };
    fenced_error(shared, mine, row)
}

fn fenced_error(shared: &Shared, mine: u64, row: Option<FenceRow>) -> SinkError {
    let o = &shared.options;
    SinkError::fatal(fence::fenced(&shared.pipeline, &o.name, mine, row.as_ref()))
}

async fn read_row(
    client: &Client,
    shared: &Shared,
) -> Result<Option<FenceRow>, tokio_postgres::Error> {
    let o = &shared.options;
    let sql = format!(
        "SELECT epoch, pid, host, to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'), \
         greatest(extract(epoch FROM clock_timestamp() - heartbeat_at), 0)::float8, \
         stopped_at IS NOT NULL FROM {} WHERE pipeline = $1::text AND connector = $2::text",
        qualified(shared.checkpoint_schema(), FENCE_TABLE)
    );
    let row = client.query_opt(&sql, &[&shared.pipeline, &o.name]).await?;
    Ok(row.map(|r| FenceRow {
        epoch: u64::try_from(r.get::<_, i64>(0)).unwrap_or_default(),
        pid: u32::try_from(r.get::<_, i64>(1)).unwrap_or_default(),
        host: r.get(2),
        started_at: r.get(3),
        heartbeat_age: Duration::from_secs_f64(r.get::<_, f64>(4)),
        stopped: r.get(5),
    }))
}

/// The session (backend pid) holding advisory lock `key` in this database, if any.
async fn lock_holder(client: &Client, key: i64) -> Result<Option<i32>, tokio_postgres::Error> {
    // A bigint advisory lock shows its high half as classid and its low half as objid.
    let row = client
        .query_opt(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND classid = ((($1::int8 >> 32) & 4294967295))::oid \
             AND objid = (($1::int8 & 4294967295))::oid AND objsubid = 1 LIMIT 1",
            &[&key],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}

async fn terminate(client: &Client, sink: &str, pid: i32) -> Result<(), SinkError> {
    match client
        .execute("SELECT pg_terminate_backend($1::int4)", &[&pid])
        .await
    {
        Ok(_) => Ok(()),
        Err(e) => {
            let mut err = sink_error(
                sink,
                &format!("ending session {pid} of the previous instance"),
                &e,
            );
            err.message.push_str(
                "; stop the previous instance, or grant the sink's user pg_signal_backend",
            );
            Err(err)
        }
    }
}

async fn try_lock(client: &Client, key: i64) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_one("SELECT pg_try_advisory_lock($1::int8)", &[&key])
        .await?
        .get(0))
}

/// The claim of one PostgreSQL sink (see the module docs).
pub(crate) struct PostgresLease {
    shared: Arc<Shared>,
    /// The fence session, holding the live lock; `None` after it broke.
    client: Option<Client>,
    epoch: u64,
    /// The backend pid of the session that holds (or held) the live lock.
    session: i32,
}

/// Takes the pipeline's claim of this sink for `holder` (see the module docs).
pub(crate) async fn claim(
    shared: Arc<Shared>,
    holder: &Holder,
    lease: Duration,
) -> Result<PostgresLease, SinkError> {
    let sink = shared.sink();
    let err = |doing: &'static str| move |e: tokio_postgres::Error| sink_error(sink, doing, &e);
    let client = shared.connect().await?;
    client
        .batch_execute(&create_table_sql(shared.checkpoint_schema()))
        .await
        .map_err(err("creating the fence table"))?;
    add_last_error(&client, shared.checkpoint_schema())
        .await
        .map_err(err("adding column last_error to the fence table"))?;
    let (live, _) = shared.fence_keys;
    let mut waited = 0;
    while !try_lock(&client, live)
        .await
        .map_err(err("taking the pipeline's lock"))?
    {
        let row = read_row(&client, &shared)
            .await
            .map_err(err("reading the fence row"))?;
        match fence::judge(row, lease) {
            Verdict::Refuse(row) => {
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
                return Err(SinkError::fatal(fence::refusal_unknown(
                    &shared.pipeline,
                    sink,
                )));
            }
            Verdict::TakeOver(row) => {
                fence::log_takeover(&shared.pipeline, sink, &row);
                if let Some(pid) = lock_holder(&client, live)
                    .await
                    .map_err(err("finding the session that holds the pipeline's lock"))?
                {
                    terminate(&client, sink, pid).await?;
                }
                // The terminated session releases the lock as it ends.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let epoch = raise_epoch(&client, &shared, holder).await?;
    let session: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .map_err(err("reading the fence session's id"))?
        .get(0);
    shared.epoch.store(epoch, Ordering::Release);
    tracing::info!(sink, epoch, "claimed the sink for this instance");
    Ok(PostgresLease {
        shared: Arc::clone(&shared),
        client: Some(client),
        epoch,
        session,
    })
}

/// Raises the epoch by one and records `holder`, waiting (at most 10 s, then a transient
/// error) for writes in flight of the previous holder.
async fn raise_epoch(client: &Client, shared: &Shared, holder: &Holder) -> Result<u64, SinkError> {
    let o = &shared.options;
    let sql = format!(
        "INSERT INTO {table} AS f (pipeline, connector, epoch, pid, host, session, started_at, \
         heartbeat_at, stopped_at) VALUES ($1::text, $2::text, 1, $3::int8, $4::text, \
         pg_backend_pid(), clock_timestamp(), clock_timestamp(), NULL) \
         ON CONFLICT (pipeline, connector) DO UPDATE SET epoch = f.epoch + 1, pid = EXCLUDED.pid, \
         host = EXCLUDED.host, session = EXCLUDED.session, started_at = EXCLUDED.started_at, \
         heartbeat_at = EXCLUDED.heartbeat_at, stopped_at = NULL RETURNING epoch",
        table = qualified(shared.checkpoint_schema(), FENCE_TABLE)
    );
    let result = async {
        client
            .batch_execute(&format!(
                "BEGIN; SET LOCAL lock_timeout = '10s'; SELECT pg_advisory_xact_lock({})",
                shared.fence_keys.1
            ))
            .await?;
        let epoch: i64 = client
            .query_one(
                &sql,
                &[
                    &shared.pipeline,
                    &o.name,
                    &i64::from(holder.pid),
                    &holder.host,
                ],
            )
            .await?
            .get(0);
        client.batch_execute("COMMIT").await?;
        Ok::<_, tokio_postgres::Error>(epoch)
    }
    .await;
    match result {
        Ok(epoch) => Ok(u64::try_from(epoch).unwrap_or_default()),
        Err(e) => {
            let _ = client.batch_execute("ROLLBACK").await;
            Err(sink_error(
                shared.sink(),
                "raising the claim's epoch (waiting for the previous instance's writes)",
                &e,
            ))
        }
    }
}

impl PostgresLease {
    async fn beat(&mut self) -> Result<(), SinkError> {
        let shared = Arc::clone(&self.shared);
        let sink = shared.sink();
        if self.client.is_none() {
            let client = shared.connect().await?;
            self.retake_lock(&client).await?;
            self.client = Some(client);
        }
        let client = self.client.as_ref().expect("connected above");
        let o = &shared.options;
        let sql = format!(
            "UPDATE {} SET heartbeat_at = clock_timestamp(), session = pg_backend_pid() \
             WHERE pipeline = $1::text AND connector = $2::text AND epoch = $3::int8",
            qualified(shared.checkpoint_schema(), FENCE_TABLE)
        );
        let epoch = i64::try_from(self.epoch).unwrap_or(i64::MAX);
        match client
            .execute(&sql, &[&shared.pipeline, &o.name, &epoch])
            .await
        {
            Ok(1) => Ok(()),
            Ok(_) => {
                let row = read_row(client, &shared).await.ok().flatten();
                Err(fenced_error(&shared, self.epoch, row))
            }
            Err(e) => {
                if e.is_closed() || e.as_db_error().is_none() {
                    self.client = None;
                }
                Err(sink_error(sink, "renewing the pipeline's claim", &e))
            }
        }
    }

    /// Takes the live lock again on a new fence session. The old session may linger in the
    /// server holding it: it is ours, so it is ended.
    async fn retake_lock(&mut self, client: &Client) -> Result<(), SinkError> {
        let sink = self.shared.sink();
        let err =
            |e: tokio_postgres::Error| sink_error(sink, "taking the pipeline's lock again", &e);
        let (live, _) = self.shared.fence_keys;
        // When another process holds it, the epoch in the fence row decides.
        if !try_lock(client, live).await.map_err(err)?
            && lock_holder(client, live).await.map_err(err)? == Some(self.session)
        {
            terminate(client, sink, self.session).await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
            try_lock(client, live).await.map_err(err)?;
        }
        self.session = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .map_err(err)?
            .get(0);
        Ok(())
    }
}

impl Lease for PostgresLease {
    fn epoch(&self) -> u64 {
        self.epoch
    }

    fn renew(&mut self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            match self.beat().await {
                // The fence session broke (it may have been ended by a takeover): once more
                // on a new one, which finds out.
                Err(e) if self.client.is_none() => {
                    tracing::debug!(sink = self.shared.sink(), error = %crate::error::Report(&e), "fence session lost; renewing on a new one");
                    self.beat().await
                }
                other => other,
            }
        })
    }

    fn release(self: Box<Self>, failure: Option<String>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let PostgresLease {
                shared,
                client,
                epoch,
                ..
            } = *self;
            let Some(client) = client else { return };
            let o = &shared.options;
            let sql = format!(
                "UPDATE {} SET stopped_at = clock_timestamp(), last_error = $4::text \
                 WHERE pipeline = $1::text AND connector = $2::text AND epoch = $3::int8",
                qualified(shared.checkpoint_schema(), FENCE_TABLE),
            );
            let epoch = i64::try_from(epoch).unwrap_or(i64::MAX);
            let released = async {
                client
                    .execute(&sql, &[&shared.pipeline, &o.name, &epoch, &failure])
                    .await?;
                client
                    .batch_execute("SELECT pg_advisory_unlock_all()")
                    .await
            };
            if let Err(e) = released.await {
                tracing::debug!(sink = shared.sink(), error = %e, "releasing the claim");
            }
        })
    }
}
