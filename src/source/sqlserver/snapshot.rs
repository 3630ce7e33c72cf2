//! The initial snapshot: every current row, consistent with the change stream that follows.
//!
//! Message flow, on one connection:
//! 1. Wait until `sys.fn_cdc_get_max_lsn()` has reached every capture instance's start (a
//!    just-enabled table's instance starts above what the capture job has processed) and has
//!    passed the LSN of an interrupted earlier snapshot.
//! 2. `SET TRANSACTION ISOLATION LEVEL SNAPSHOT; BEGIN TRANSACTION`, then
//!    `SELECT sys.fn_cdc_get_max_lsn()`: that first read fixes the snapshot and gives `L0`.
//!    Snapshot isolation reads `cdc.lsn_time_mapping` and the tables as of one instant
//!    (<https://learn.microsoft.com/sql/t-sql/statements/set-transaction-isolation-level-transact-sql>).
//! 3. Count the changes the change tables hold at exactly `L0` (`m`), then read every table
//!    and emit each row as an insert at `Position { lsn: L0, ordinal: m + 1, … }`.
//! 4. `COMMIT`, and stream changes committed after `L0`.
//!
//! Why that is consistent: every transaction committed at or below `L0` was visible when
//! the snapshot was fixed, so it is in the rows read. Transactions above `L0` are streamed;
//! the capture job lags the log, so some of them may also be in the snapshot already, and
//! are replayed onto rows that already have their effect — each change carries the whole row
//! and per-key order holds, so the sink converges to the source.
//!
//! Ordinals above `m` keep snapshot positions apart from the changes of the transaction
//! committed at `L0` (which the stream never sends: it starts above `L0`), and let a restart
//! tell an interrupted snapshot from a partly applied transaction (see `stream.rs`). A new
//! snapshot always has a higher `L0` than an interrupted one, so its positions are all above
//! whatever lanes committed of the old one and nothing is skipped.

use futures_util::TryStreamExt;
use tiberius::QueryItem;
use tokio::time::Instant;

use super::conn::{self, Conn};
use super::lsn;
use super::reader::{self, row_values};
use super::sql;
use super::stream::{self, Flow, Phase, State};
use crate::change::{Change, Lsn, Op, Position};
use crate::source::SourceError;
use crate::source::emitter::Event;

/// How often to repeat the "waiting for the capture job" warning.
const WAIT_WARNING_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

pub(super) async fn run(
    st: &mut State<'_>,
    conn: &mut Conn,
    after: Option<Lsn>,
) -> Result<Flow, SourceError> {
    let opts = st.opts;
    let l0 = loop {
        if wait_for_capture(st, conn, after).await? == Flow::Stop {
            return Ok(Flow::Stop);
        }
        conn::execute(
            conn,
            opts,
            "starting the snapshot transaction",
            sql::SNAPSHOT_BEGIN,
        )
        .await?;
        let l0 = reader::max_lsn(conn, opts).await?;
        if ready(st, l0, after) {
            break l0;
        }
        // The capture job moved between the two reads in a way that cannot happen unless an
        // instance was just added; start over.
        conn::execute(
            conn,
            opts,
            "ending the snapshot transaction",
            sql::SNAPSHOT_END,
        )
        .await?;
    };
    let held = stream::changes_at(st, conn, l0).await?;
    let mut ordinal = u32::try_from(held).map_err(|_| {
        SourceError::fatal(format!(
            "{}: transaction {} is too large",
            opts.name,
            lsn::literal(l0)
        ))
    })?;
    tracing::info!(connector = %opts.name, lsn = %lsn::literal(l0), "initial snapshot started");
    st.phase = Phase::Snapshot { after: Some(l0) };
    let begin = Event::Begin {
        commit_lsn: l0,
        commit_time: crate::change::now_micros_since_2000(),
    };
    if stream::emit(st, begin).await? == Flow::Stop {
        return Ok(Flow::Stop);
    }
    let started = Instant::now();
    let mut total = 0u64;
    for t in 0..st.tables.len() {
        let (qualified, inst) = {
            let table = &st.tables[t];
            (table.qualified(), table.current().clone())
        };
        let doing = format!("reading {qualified} for the snapshot");
        let sql = sql::snapshot_rows(&st.tables[t].schema, &st.tables[t].name, &inst.select);
        let mut rows = conn
            .simple_query(sql)
            .await
            .map_err(|e| conn::classify(opts, &doing, &e))?;
        let mut count = 0u64;
        while let Some(item) = rows
            .try_next()
            .await
            .map_err(|e| conn::classify(opts, &doing, &e))?
        {
            let QueryItem::Row(row) = item else { continue };
            let values = row_values(&inst, &row, 0).map_err(|e| {
                SourceError::fatal(format!("{}: snapshot of {qualified}: {e}", opts.name))
            })?;
            ordinal = ordinal
                .checked_add(1)
                .filter(|o| *o < lsn::WHOLE_TRANSACTION)
                .ok_or_else(|| {
                    SourceError::fatal(format!(
                        "{}: the snapshot has more rows than positions can number ({})",
                        opts.name,
                        lsn::WHOLE_TRANSACTION - 1
                    ))
                })?;
            let change = Change {
                position: Position::new(l0, ordinal),
                op: Op::Insert,
                key: inst.shape.key.iter().map(|&i| values[i].clone()).collect(),
                table: inst.shape.clone(),
                old_key: None,
                values,
            };
            st.stats
                .received
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            count += 1;
            if stream::emit(st, Event::Change(change)).await? == Flow::Stop {
                return Ok(Flow::Stop);
            }
        }
        tracing::info!(connector = %opts.name, table = %qualified, rows = count, "table copied");
        total += count;
    }
    conn::execute(
        conn,
        opts,
        "ending the snapshot transaction",
        sql::SNAPSHOT_END,
    )
    .await?;
    if stream::emit(st, Event::Commit { end_lsn: l0 }).await? == Flow::Stop {
        return Ok(Flow::Stop);
    }
    st.lo = l0;
    tracing::info!(connector = %opts.name, lsn = %lsn::literal(l0), rows = total, seconds = started.elapsed().as_secs_f64(), "initial snapshot read; streaming changes after it");
    Ok(Flow::Continue)
}

/// Whether a snapshot at `l0` can be taken (see step 1 of the module docs).
/// The newest instance must cover `l0`: the rows are read with its columns, and the stream
/// after `l0` must then come from it alone.
fn ready(st: &State<'_>, l0: Lsn, after: Option<Lsn>) -> bool {
    after.is_none_or(|a| l0 > a) && st.tables.iter().all(|t| t.current().start_lsn <= l0)
}

async fn wait_for_capture(
    st: &mut State<'_>,
    conn: &mut Conn,
    after: Option<Lsn>,
) -> Result<Flow, SourceError> {
    let mut last_warning: Option<Instant> = None;
    let since = Instant::now();
    loop {
        let max = reader::max_lsn(conn, st.opts).await?;
        if ready(st, max, after) {
            return Ok(Flow::Continue);
        }
        if last_warning.is_none_or(|w| w.elapsed() >= WAIT_WARNING_EVERY) {
            last_warning = Some(Instant::now());
            tracing::warn!(
                connector = %st.opts.name,
                max_lsn = %lsn::literal(max),
                waited_s = since.elapsed().as_secs(),
                "waiting for the CDC capture job to process the log past the capture instances' start \
                 before taking the snapshot; is SQL Server Agent running the capture job?"
            );
        }
        if stream::pause(st, st.opts.poll_interval).await? == Flow::Stop {
            return Ok(Flow::Stop);
        }
    }
}
