//! What goes back upstream: the durable frontier as standby status updates, the receive
//! watchdog, waiting for room in the emitter while still serving the walsender, and stopping
//! (draining, or aborting).

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::{FRONTIER_REPORT_EVERY, Flow, State, conn_error};
use crate::change::Lsn;
use crate::source::emitter::Event;
use crate::source::postgres::conn::ReplicationStream;
use crate::source::{SourceError, StopMode};

/// The durable frontier as last handed back.
fn frontier(st: &State<'_>) -> Lsn {
    st.frontier.borrow().lsn
}

/// Pushes one event; a full parcel is handed over at once, waiting for room while serving
/// status updates. `Stopped` when the pipeline aborts or the runtime is gone meanwhile.
pub(super) async fn emit(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    event: Event,
) -> Result<Flow, SourceError> {
    if push(st, event) {
        return flush(st, stream).await;
    }
    Ok(Flow::Continue)
}

/// Adds `event` to the pending parcel; true when the parcel is full and must be flushed. Not
/// async, so an event is moved once, into the parcel, rather than into a future's state first.
pub(super) fn push(st: &mut State<'_>, event: Event) -> bool {
    st.emitter.push(event);
    st.emitter.is_full()
}

/// Hands what is pending over, waiting for room while serving status updates (a Drain noticed
/// meanwhile stays news for the main loop; an Abort stops).
pub(super) async fn flush(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
) -> Result<Flow, SourceError> {
    match st.emitter.try_flush() {
        Ok(true) => return Ok(Flow::Continue),
        Ok(false) => {}
        Err(_) => return gone(st, stream).await,
    }
    // A clone, so that a Drain seen here is still news to the main loop.
    let mut stop = st.stop.clone();
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => {
                if *stop.borrow() == StopMode::Abort {
                    report(st, stream, false).await?;
                    return Ok(Flow::Stopped);
                }
            }
            _ = st.frontier.changed() => maybe_report(st, stream).await?,
            _ = st.ticker.tick() => periodic_report(st, stream).await?,
            room = st.emitter.ready() => match room {
                Ok(permit) => {
                    st.emitter.send(permit);
                    return Ok(Flow::Continue);
                }
                Err(_) => return gone(st, stream).await,
            },
        }
    }
}

/// The runtime stopped taking events (it failed or aborts, and knows why): confirm what is
/// durable and stop.
async fn gone(st: &mut State<'_>, stream: &mut ReplicationStream) -> Result<Flow, SourceError> {
    report(st, stream, false).await?;
    Ok(Flow::Stopped)
}

pub(super) async fn on_stop(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
) -> Result<Flow, SourceError> {
    let mode = *st.stop.borrow_and_update();
    match mode {
        StopMode::Run => Ok(Flow::Continue),
        StopMode::Abort => {
            report(st, stream, false).await?;
            Ok(Flow::Stopped)
        }
        StopMode::Drain => {
            if let Flow::Stopped = flush(st, stream).await? {
                return Ok(Flow::Stopped);
            }
            tracing::info!(connector = %st.opts.name, "draining lanes");
            // Closing the stream lets each lane commit what it holds and end; the frontier
            // moves until the runtime has ended.
            let _ = st.emitter.close().await;
            loop {
                tokio::select! {
                    changed = st.frontier.changed() => match changed {
                        Ok(()) => maybe_report(st, stream).await?,
                        Err(_) => break,
                    },
                    _ = st.ticker.tick() => periodic_report(st, stream).await?,
                }
            }
            report(st, stream, false).await?;
            tracing::info!(connector = %st.opts.name, confirmed = %st.reported, "drained; confirmed the durable frontier");
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
            st.opts.name,
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
        || (frontier(st) > st.reported && since >= FRONTIER_REPORT_EVERY)
    {
        report(st, stream, false).await?;
    }
    Ok(())
}

pub(super) async fn maybe_report(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
) -> Result<(), SourceError> {
    if frontier(st) > st.reported && st.last_report.elapsed() >= FRONTIER_REPORT_EVERY {
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
    let frontier = frontier(st);
    stream
        .send_status(st.received.max(frontier), frontier, reply)
        .await
        .map_err(|e| conn_error(st.opts, e))?;
    if frontier > st.reported {
        tracing::debug!(connector = %st.opts.name, flush = %frontier, "confirmed durable frontier");
    }
    st.reported = frontier;
    st.last_report = Instant::now();
    st.stats
        .confirmed
        .store(frontier.as_pg(), Ordering::Relaxed);
    st.stats
        .wal_end
        .store(st.received.max(frontier).as_pg(), Ordering::Relaxed);
    Box::pin(super::tables::on_frontier(st, frontier)).await
}
