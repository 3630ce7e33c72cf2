//! Handing changes to the lanes: one change to each sink's lane for its key, or alone behind
//! a barrier when it touches more than one lane's keys; waiting for queue space or for the
//! lanes to go idle while still serving acks and status updates.

use std::sync::Arc;

use super::feedback::{drain_acks, maybe_report, on_stop, periodic_report};
use super::{Flow, State};
use crate::change::Change;
use crate::lane::{lane_of, needs_barrier, plan};
use crate::source::postgres::conn::ReplicationStream;
use crate::source::{SourceError, StopMode};

/// Hand one change to every sink's lane for its key, waiting for queue space while still
/// serving acks and status updates.
pub(super) async fn dispatch(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    change: Change,
) -> Result<Flow, SourceError> {
    let sinks = st.outputs.routers.len();
    let mut change = Some(change);
    for i in 0..sinks {
        // Clone for every sink but the last, which takes the original.
        let copy = if i + 1 == sinks {
            change.take()
        } else {
            change.clone()
        };
        let Some(copy) = copy else { break };
        let lanes = st.outputs.routers[i].lanes();
        for (lane, part) in plan(copy, lanes) {
            if let Flow::Stopped = send(st, stream, i, lane, part).await? {
                return Ok(Flow::Stopped);
            }
        }
    }
    Ok(Flow::Continue)
}

pub(super) async fn send(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    sink: usize,
    lane: u32,
    change: Change,
) -> Result<Flow, SourceError> {
    // The common case, a queue with room, needs none of the waiting below: building that
    // select (and cloning the sender and stop receiver for it) cost more than the send.
    if let Ok(permit) = st.outputs.routers[sink].sender(lane).try_reserve() {
        permit.send(Arc::new(change));
        st.tracker.dispatched(1);
        return Ok(Flow::Continue);
    }
    let sender = st.outputs.routers[sink].sender(lane).clone();
    // A clone: a Drain noticed while waiting here must still reach the main loop.
    let mut stop = st.stop.clone();
    let permit = loop {
        tokio::select! {
            biased;
            permit = sender.reserve() => break permit.map_err(|_| SourceError::fatal(format!("{}: lane {lane} of sink #{sink} stopped", st.opts.connector)))?,
            _ = stop.changed() => {
                if *stop.borrow() == StopMode::Abort {
                    return on_stop(st, stream).await;
                }
            }
            Some(ack) = st.outputs.acks.recv() => { st.tracker.ack(&ack); drain_acks(st); maybe_report(st, stream).await?; }
            _ = st.ticker.tick() => periodic_report(st, stream).await?,
        }
    };
    permit.send(Arc::new(change));
    st.tracker.dispatched(1);
    Ok(Flow::Continue)
}

/// Sends one change the way its keys need: alone behind a barrier, or to its lane.
pub(super) async fn send_change(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    change: Change,
) -> Result<Flow, SourceError> {
    let barrier = st
        .outputs
        .routers
        .iter()
        .any(|r| needs_barrier(&change, r.lanes()));
    if barrier {
        barrier_send(st, stream, change).await
    } else {
        dispatch(st, stream, change).await
    }
}

/// A change that touches more than one lane's keys (a truncate; a TOAST move across lanes)
/// must land after every earlier change of every lane and before every later one: wait until
/// nothing is in flight, send it to one lane of each sink (lane 0 for a truncate, the new
/// key's lane for a move), and wait again.
pub(super) async fn barrier_send(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    change: Change,
) -> Result<Flow, SourceError> {
    if !wait_idle_streaming(st, stream).await? {
        return Ok(Flow::Stopped);
    }
    for i in 0..st.outputs.routers.len() {
        let lanes = st.outputs.routers[i].lanes();
        let lane = if change.op == crate::change::Op::Truncate {
            0
        } else {
            lane_of(&change.table.schema, &change.table.name, &change.key, lanes)
        };
        if let Flow::Stopped = send(st, stream, i, lane, change.clone()).await? {
            return Ok(Flow::Stopped);
        }
    }
    if !wait_idle_streaming(st, stream).await? {
        return Ok(Flow::Stopped);
    }
    Ok(Flow::Continue)
}

/// Wait until every dispatched copy is acked, keeping the stream alive. False on Abort.
pub(super) async fn wait_idle_streaming(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
) -> Result<bool, SourceError> {
    // A clone: a Drain noticed while waiting here must still reach the main loop.
    let mut stop = st.stop.clone();
    while st.tracker.in_flight() > 0 {
        tokio::select! {
            ack = st.outputs.acks.recv() => match ack {
                Some(ack) => { st.tracker.ack(&ack); drain_acks(st); }
                None => return Err(SourceError::fatal(format!("{}: every lane stopped", st.opts.connector))),
            },
            _ = stop.changed() => if *stop.borrow() == StopMode::Abort { return Ok(false) },
            _ = st.ticker.tick() => periodic_report(st, stream).await?,
        }
    }
    Ok(true)
}

/// Wait until every dispatched copy is acked, with no stream (it was lost). False when asked
/// to stop: at once on Abort, once idle on Drain (the lanes close when `Outputs` drops).
pub(super) async fn wait_idle(st: &mut State<'_>) -> Result<bool, SourceError> {
    while st.tracker.in_flight() > 0 {
        tokio::select! {
            ack = st.outputs.acks.recv() => match ack {
                Some(ack) => st.tracker.ack(&ack),
                None => return Err(SourceError::fatal(format!("{}: every lane stopped", st.opts.connector))),
            },
            _ = st.stop.changed() => if *st.stop.borrow() == StopMode::Abort { return Ok(false) },
        }
    }
    Ok(*st.stop.borrow() == StopMode::Run)
}
