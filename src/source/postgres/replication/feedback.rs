//! What goes back upstream: acks in, the durable frontier out as standby status updates, the
//! receive watchdog, and stopping (draining the lanes, or aborting).

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::{FRONTIER_REPORT_EVERY, Flow, State, conn_error, staged};
use crate::source::postgres::conn::{ReplicationStream, now_pg_micros};
use crate::source::{SourceError, StopMode};

pub(super) fn drain_acks(st: &mut State<'_>) {
    while let Ok(ack) = st.outputs.acks.try_recv() {
        st.tracker.ack(&ack);
    }
    let lag = st
        .tracker
        .oldest_pending_commit_time()
        .map_or(0, |t| (now_pg_micros() - t).max(0));
    st.stats.lag_micros.store(lag, Ordering::Relaxed);
}

pub(super) async fn on_stop(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
) -> Result<Flow, SourceError> {
    let mode = *st.stop.borrow_and_update();
    match mode {
        StopMode::Run => Ok(Flow::Continue),
        StopMode::Abort => {
            drain_acks(st);
            report(st, stream, false).await?;
            Ok(Flow::Stopped)
        }
        StopMode::Drain => {
            // What waits for the transform is received: deliver it before closing the lanes.
            // (Boxed: flushing dispatches, and dispatching may stop, which lands here again.)
            if let Flow::Stopped = Box::pin(staged::flush(st, stream)).await? {
                return Ok(Flow::Stopped);
            }
            tracing::info!(connector = %st.opts.connector, in_flight = st.tracker.in_flight(), "draining lanes");
            // Closing the queues lets each lane commit what it holds and exit.
            st.outputs.routers.clear();
            loop {
                tokio::select! {
                    ack = st.outputs.acks.recv() => match ack {
                        Some(ack) => st.tracker.ack(&ack),
                        None => break,
                    },
                    _ = st.ticker.tick() => periodic_report(st, stream).await?,
                }
            }
            drain_acks(st);
            report(st, stream, false).await?;
            tracing::info!(connector = %st.opts.connector, confirmed = %st.reported, "drained; confirmed the durable frontier");
            Ok(Flow::Stopped)
        }
    }
}

/// On each tick while reading the socket: give up on a silent connection (a partition sends
/// no reset), ask for a reply when it has been quiet for half the timeout, and send the
/// periodic status update.
pub(super) async fn watchdog(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
) -> Result<(), SourceError> {
    let quiet = st.last_heard.elapsed();
    if quiet >= st.opts.receive_timeout {
        return Err(SourceError::transient(format!(
            "{}: no message from the server for {:.1}s (receive_timeout); the connection is presumed lost",
            st.opts.connector,
            quiet.as_secs_f64()
        )));
    }
    if quiet >= st.opts.receive_timeout / 2 {
        return report(st, stream, true).await;
    }
    periodic_report(st, stream).await
}

/// A status update when `status_interval` has passed since the last one, or sooner when the
/// frontier moved (so the slot releases WAL and reports progress promptly once caught up).
pub(super) async fn periodic_report(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
) -> Result<(), SourceError> {
    let since = st.last_report.elapsed();
    if since >= st.opts.status_interval
        || (st.tracker.frontier() > st.reported && since >= FRONTIER_REPORT_EVERY)
    {
        report(st, stream, false).await?;
    }
    Ok(())
}

pub(super) async fn maybe_report(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
) -> Result<(), SourceError> {
    if st.tracker.frontier() > st.reported && st.last_report.elapsed() >= FRONTIER_REPORT_EVERY {
        report(st, stream, false).await?;
    }
    Ok(())
}

/// Send a standby status update whose flush position is the durable frontier.
pub(super) async fn report(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    reply: bool,
) -> Result<(), SourceError> {
    let frontier = st.tracker.frontier();
    stream
        .send_status(st.received.max(frontier), frontier, reply)
        .await
        .map_err(|e| conn_error(st.opts, e))?;
    if frontier > st.reported {
        tracing::debug!(connector = %st.opts.connector, flush = %frontier, "confirmed durable frontier");
    }
    st.reported = frontier;
    st.last_report = Instant::now();
    st.stats
        .confirmed
        .store(frontier.as_pg(), Ordering::Relaxed);
    Box::pin(super::tables::on_frontier(st, frontier)).await
}
