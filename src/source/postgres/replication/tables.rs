//! Tables in the stream, against what the pipeline applied before (`crate::checkpoint::tables`):
//!
//! - A shape (or relation id) the records do not have yet is recorded once the first change
//!   with it is durable: it waits in [`Ledger::pending`] until the frontier passes its
//!   transaction, then goes to the runtime, which writes it into the sinks.
//! - A column's type changed, or a table arrives under another relation id (dropped and
//!   created again): the source stops right before the change, with everything before it
//!   applied and confirmed ([`stop_at`]), and the error says what happened; the runtime
//!   decides what comes next.
//! - Changes the stream cannot show (a table dropped and created again but not published, or
//!   removed from the publication) are seen in the catalog, at start and by the monitor, as
//!   [`TableEvent`]s at a WAL position: once the frontier has passed it, every change of the
//!   old table is applied, and the source stops the same way.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::feedback::{flush, periodic_report, report};
use super::{Flow, State, change_error, pgoutput};
use crate::change::{Lsn, Table};
use crate::checkpoint::TableRecord;
use crate::source::postgres::conn::{ConnectParams, ReplicationStream};
use crate::source::{SourceError, SourceErrorKind, TableChange};

/// A table change seen in the catalog rather than in the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableEvent {
    /// `schema.name`.
    pub(crate) table: String,
    pub(crate) change: TableChange,
    /// The WAL position when it was seen: every change of the old table is before it.
    pub(crate) at: Lsn,
}

/// Catalog events, shared with the monitor that finds them while streaming.
pub(crate) type Events = Arc<Mutex<Vec<TableEvent>>>;

/// Where new shapes go, and which wait for their first change to be durable.
#[derive(Debug)]
pub(super) struct Ledger {
    record: mpsc::UnboundedSender<TableRecord>,
    /// (commit position of the first change with it, record), in stream order.
    pending: Vec<(Lsn, TableRecord)>,
    events: Events,
}

impl Ledger {
    pub(super) fn new(record: mpsc::UnboundedSender<TableRecord>, events: Events) -> Self {
        Ledger {
            record,
            pending: Vec::new(),
            events,
        }
    }
}

/// A Relation message the relations accepted: records the shape when it is new.
pub(super) fn on_shape(st: &mut State<'_>, rel_id: u32, table: &Table) {
    if st.relations.is_known(rel_id, table) {
        return;
    }
    st.relations.remember(rel_id, table);
    let since = st.tx.as_ref().map_or(st.received, |tx| tx.lsn);
    st.ledger.pending.push((
        since,
        TableRecord {
            table: table.clone(),
            relation: rel_id,
            since,
        },
    ));
}

/// Sends the records whose first change is now durable, and stops when a catalog event's
/// position has been passed (`frontier` is the durable frontier just reported).
pub(super) async fn on_frontier(st: &mut State<'_>, frontier: Lsn) -> Result<(), SourceError> {
    let durable = st
        .ledger
        .pending
        .iter()
        .take_while(|(since, _)| *since < frontier)
        .count();
    for (_, record) in st.ledger.pending.drain(..durable) {
        // The runtime ends before the source does only when it is stopping anyway.
        let _ = st.ledger.record.send(record);
    }
    let due = {
        let events = st
            .ledger
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        events.iter().find(|e| e.at <= frontier).cloned()
    };
    let Some(event) = due else {
        return Ok(());
    };
    // Everything of the old table is applied and confirmed (the report just went out).
    wait_confirmed(&st.params, &st.opts.slot_name, frontier).await?;
    Err(event_error(st, event))
}

fn event_error(st: &State<'_>, event: TableEvent) -> SourceError {
    let what = match event.change {
        TableChange::Recreated { old, new } => format!(
            "table {} was dropped and created again on the source (relation id {old}, now \
             {new}), and the new table is not in publication {}: the sinks still hold the old \
             table's rows, and none of the new table's",
            event.table, st.opts.publication
        ),
        TableChange::Unpublished => format!(
            "table {} is no longer in publication {} (dropped, or removed from it): its \
             changes no longer reach Zipline, and the sinks hold its rows as of then",
            event.table, st.opts.publication
        ),
    };
    SourceError {
        kind: SourceErrorKind::TableChanged {
            table: event.table,
            change: event.change,
            at: event.at,
        },
        ..SourceError::fatal(format!("{}: {what}", st.opts.name))
    }
}

/// A Relation message the sinks cannot follow (a column changed type, a table dropped and
/// created again): let everything before it become durable and confirm it, so that the
/// restart resumes right at the change instead of replaying older rows (and this message)
/// again; then stop. Nothing after the message was dispatched, so none of it is applied or
/// confirmed.
pub(super) async fn stop_at(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    e: &pgoutput::ChangeError,
) -> SourceError {
    let mut err = change_error(st, e);
    let at = st.tx.as_ref().map_or(st.received, |tx| tx.lsn);
    err.kind = match e {
        pgoutput::ChangeError::TypeChanged { column, shape, .. } => {
            let (table, relation) = (**shape).clone();
            SourceErrorKind::TypeChanged {
                record: Box::new(TableRecord {
                    table,
                    relation,
                    since: at,
                }),
                column: column.clone(),
            }
        }
        pgoutput::ChangeError::Recreated { table, old, new } => SourceErrorKind::TableChanged {
            table: table.clone(),
            change: TableChange::Recreated {
                old: *old,
                new: *new,
            },
            at,
        },
        _ => SourceErrorKind::Other,
    };
    let settled = async {
        if let Flow::Stopped = flush(st, stream).await? {
            return Ok(());
        }
        if wait_durable(st, stream, st.committed).await? {
            report(st, stream, false).await?;
            wait_confirmed(&st.params, &st.opts.slot_name, st.reported).await?;
        }
        Ok::<_, SourceError>(())
    };
    if let Err(other) = settled.await
        && !matches!(other.kind, SourceErrorKind::TableChanged { .. })
    {
        tracing::warn!(connector = %st.opts.name, error = %crate::error::Report(&other), "could not confirm the changes before the table's change");
    }
    err
}

/// Waits (up to 5 s) until the slot's confirmed position shows the last report: the caller
/// exits next, and a connection closed with unread data in it is reset, which can lose a
/// status update the walsender has not read yet.
pub(super) async fn wait_confirmed(
    params: &ConnectParams,
    slot: &str,
    lsn: Lsn,
) -> Result<(), SourceError> {
    use crate::source::postgres::setup::{connect_sql, sql_error};
    let client = connect_sql(params, 0).await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    let wanted = lsn.to_string();
    loop {
        let done: bool = client
            .query_one(
                "SELECT coalesce(confirmed_flush_lsn >= $2::text::pg_lsn, true) \
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot, &wanted.as_str()],
            )
            .await
            .map_err(|e| sql_error("reading the slot's confirmed position", &e))?
            .get(0);
        if done || Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the frontier reaches `lsn`, serving status updates. `false` when the pipeline
/// aborts or the runtime ends first.
async fn wait_durable(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    lsn: Lsn,
) -> Result<bool, SourceError> {
    let mut stop = st.stop.clone();
    while st.frontier.borrow().lsn < lsn {
        tokio::select! {
            changed = st.frontier.changed() => if changed.is_err() { return Ok(false) },
            _ = stop.changed() => if *stop.borrow() == crate::source::StopMode::Abort { return Ok(false) },
            _ = st.ticker.tick() => periodic_report(st, stream).await?,
        }
    }
    Ok(true)
}
