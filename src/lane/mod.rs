//! Keyed lanes: the router that spreads changes over parallel lanes by hash of (table, key),
//! the lane workers that batch and commit them, and the tracker that turns lane commits into
//! the durable frontier the source may confirm upstream.
//!
//! Per-key order holds because one key always hashes to one lane and a lane is a FIFO that
//! commits its batches one after another. Queues are bounded, so a slow sink slows the source's
//! read instead of growing memory.

mod apply;
mod queue;
mod router;
mod settle;
mod tracker;
mod worker;

pub use queue::{
    Closed, Empty, LaneReceiver, LaneSender, Parcel, QueueDepth, Queued, Reserved, queue,
};
pub use router::{Router, Split, TableHash, is_toast_move, key_hash, lane_of, needs_barrier, plan};
pub use tracker::{Ack, AckTracker};
pub use worker::{LaneConfig, LaneError, LaneStats, run_lane};
