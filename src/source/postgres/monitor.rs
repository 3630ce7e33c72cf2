//! Watching the slot from the side while the source streams, on an SQL connection of its own
//! (never on the replication connection, whose loop must keep answering keepalives):
//!
//! - The WAL the slot retains: a WARN with the figure when it passes `slot_warn_bytes`, and
//!   when PostgreSQL reports `wal_status = 'unreserved'` (past `max_wal_size`: the next
//!   checkpoint may invalidate the slot). Once per crossing, not every tick.
//! - The publication: a table the pipeline streams that leaves it or is dropped and created
//!   again (another relation id) becomes a table event at the current WAL position, which
//!   the stream acts on once it has passed that position (see `replication::tables`).
//! - `heartbeat_interval`: a transactional logical message (`pg_logical_emit_message`), so a
//!   slot on a database with no writes at all gets something to decode and its confirmed
//!   position (and with it the retained WAL) moves on.
//!
//! Everything here is advisory: a failed check is logged at DEBUG and tried again next tick.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_postgres::Client;

use super::conn::ConnectParams;
use super::replication::tables::{Events, TableEvent};
use super::setup;
use crate::source::{SourceStats, TableChange};

/// How often the slot is looked at when no heartbeat asks for more.
const CHECK_EVERY: Duration = Duration::from_secs(10);

/// What the monitor watches and does.
#[derive(Debug, Clone)]
pub(crate) struct Watch {
    pub(crate) connector: String,
    pub(crate) slot: String,
    pub(crate) publication: String,
    pub(crate) warn_bytes: u64,
    pub(crate) heartbeat: Option<Duration>,
    /// The published tables the source streams, with their relation ids.
    pub(crate) tables: Vec<(String, u32)>,
    /// Where table events go.
    pub(crate) events: Events,
}

/// Starts the monitor; it records the slot's retained WAL in `stats` and runs until the
/// handle is aborted.
pub(crate) fn spawn(
    params: ConnectParams,
    watch: Watch,
    stats: Arc<SourceStats>,
) -> JoinHandle<()> {
    tokio::spawn(run(params, watch, stats))
}

async fn run(params: ConnectParams, watch: Watch, stats: Arc<SourceStats>) {
    let every = watch.heartbeat.map_or(CHECK_EVERY, |h| h.min(CHECK_EVERY));
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client: Option<Client> = None;
    let mut state = State::default();
    let mut last_beat = tokio::time::Instant::now();
    loop {
        ticker.tick().await;
        if client.as_ref().is_none_or(Client::is_closed) {
            client = setup::connect_sql(&params, 0).await.ok();
        }
        let Some(c) = client.as_ref() else { continue };
        match slot_status(c, &watch.slot).await {
            Ok(Some((status, bytes))) => {
                stats
                    .retained_bytes
                    .store(bytes.unwrap_or(-1), Ordering::Relaxed);
                state.observe(&watch, status.as_deref(), bytes);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(connector = %watch.connector, error = %e, "reading the slot's state")
            }
        }
        if let Err(e) = check_publication(c, &watch).await {
            tracing::debug!(connector = %watch.connector, error = %e, "reading the publication's tables");
        }
        if let Some(interval) = watch.heartbeat
            && last_beat.elapsed() >= interval
            && !state.heartbeat_refused
        {
            last_beat = tokio::time::Instant::now();
            if let Err(e) = c
                .execute(
                    "SELECT pg_logical_emit_message(true, 'zipline', 'heartbeat')",
                    &[],
                )
                .await
            {
                if e.as_db_error().is_some() {
                    state.heartbeat_refused = true;
                    tracing::warn!(connector = %watch.connector, error = %e, "cannot write heartbeat messages (pg_logical_emit_message); heartbeat_interval is off from now on");
                } else {
                    tracing::debug!(connector = %watch.connector, error = %e, "heartbeat message");
                }
            }
        }
    }
}

/// Records a table event for each streamed table that left the publication or came back
/// under another relation id (once per table).
async fn check_publication(client: &Client, watch: &Watch) -> Result<(), tokio_postgres::Error> {
    let now = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get::<_, String>(0)
        .parse()
        .unwrap_or_default();
    let published = setup::published(client, &watch.publication).await?;
    let mut events = watch
        .events
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for (name, oid) in &watch.tables {
        if events.iter().any(|e| &e.table == name) {
            continue;
        }
        let change = match published.iter().find(|(n, _)| n == name) {
            None => TableChange::Unpublished,
            Some((_, now_oid)) if now_oid != oid => TableChange::Recreated {
                old: *oid,
                new: *now_oid,
            },
            Some(_) => continue,
        };
        tracing::info!(connector = %watch.connector, table = %name, ?change, "a streamed table changed in the catalog; the stream stops once it has passed this point");
        events.push(TableEvent {
            table: name.clone(),
            change,
            at: now,
        });
    }
    Ok(())
}

async fn slot_status(
    client: &Client,
    slot: &str,
) -> Result<Option<(Option<String>, Option<i64>)>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT wal_status, (pg_current_wal_lsn() - restart_lsn)::int8 \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row.map(|r| (r.get(0), r.get(1))))
}

/// Which warnings are in force, so each is logged once per crossing.
#[derive(Debug, Default)]
struct State {
    over_threshold: bool,
    unreserved: bool,
    heartbeat_refused: bool,
}

impl State {
    fn observe(&mut self, watch: &Watch, status: Option<&str>, bytes: Option<i64>) {
        let bytes = bytes.and_then(|b| u64::try_from(b).ok()).unwrap_or(0);
        let over = bytes > watch.warn_bytes;
        if over && !self.over_threshold {
            tracing::warn!(connector = %watch.connector, slot = %watch.slot, retained_bytes = bytes, slot_warn_bytes = watch.warn_bytes, "the replication slot retains more WAL than slot_warn_bytes: Zipline is behind (or a sink is slow or down), and the source's disk fills until it catches up");
        } else if !over && self.over_threshold {
            tracing::info!(connector = %watch.connector, slot = %watch.slot, retained_bytes = bytes, "the slot's retained WAL is back under slot_warn_bytes");
        }
        self.over_threshold = over;
        let unreserved = status == Some("unreserved");
        if unreserved && !self.unreserved {
            tracing::warn!(connector = %watch.connector, slot = %watch.slot, retained_bytes = bytes, "the replication slot's WAL is past max_wal_size (wal_status = 'unreserved'): PostgreSQL may invalidate the slot at its next checkpoint, after which every table must be copied again");
        }
        self.unreserved = unreserved;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_fire_once_per_crossing() {
        let watch = Watch {
            connector: "pg".into(),
            slot: "s".into(),
            publication: "p".into(),
            warn_bytes: 100,
            heartbeat: None,
            tables: Vec::new(),
            events: Events::default(),
        };
        let mut state = State::default();
        state.observe(&watch, Some("reserved"), Some(50));
        assert!(!state.over_threshold && !state.unreserved);
        state.observe(&watch, Some("unreserved"), Some(150));
        assert!(state.over_threshold && state.unreserved);
        state.observe(&watch, Some("reserved"), Some(20));
        assert!(!state.over_threshold && !state.unreserved);
    }
}
