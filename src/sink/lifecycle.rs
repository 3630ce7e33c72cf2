//! What `zipline pipeline status` and `zipline pipeline drop` ask of a sink: Zipline's own
//! records of the pipeline there (lane checkpoints, the instance's claim, the last fatal
//! error), read whether or not the pipeline runs, and removed when the pipeline is dropped.
//! Each sink keeps its SQL in its own folder (`sink/mysql/lifecycle.rs`, likewise for
//! PostgreSQL).

use serde::Serialize;

use super::{BoxFuture, SinkError};

/// One lane's checkpoint as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LaneCheckpoint {
    /// The lane.
    pub lane: u32,
    /// The lane count the row was written under.
    pub lanes: u32,
    /// The last position the lane committed (`LSN/ordinal[.sub]`, as [`crate::change::Position`]
    /// prints).
    pub position: String,
    /// When the lane committed it, by the sink server's clock, `YYYY-MM-DDTHH:MM:SS.ffffffZ`.
    pub updated_at: String,
}

/// The instance that holds (or last held) the pipeline in a sink.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClaimStatus {
    /// Its process id.
    pub pid: u32,
    /// Its host name.
    pub host: String,
    /// When it claimed the sink, UTC.
    pub started_at: String,
    /// Seconds since its last heartbeat, by the sink server's clock.
    pub heartbeat_age_seconds: f64,
    /// When it released the claim on a stop, UTC; `None` while it runs or after it vanished.
    pub stopped_at: Option<String>,
    /// The error it stopped with, when the stop was a failure.
    pub last_error: Option<String>,
}

/// What a sink holds of the pipeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SinkStatus {
    /// Each lane's checkpoint, by lane.
    pub lanes: Vec<LaneCheckpoint>,
    /// The claim, if the pipeline ever ran against this sink.
    pub claim: Option<ClaimStatus>,
    /// Dead letters the sink holds for the pipeline (`on_error: dead_letter`).
    pub dead_letters: u64,
}

/// What dropping the pipeline removed from a sink.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Forgotten {
    /// Rows of the pipeline deleted from Zipline's tables.
    pub rows: u64,
    /// Zipline's tables dropped because no other pipeline had rows left in them.
    pub dropped_tables: Vec<String>,
    /// Zipline's tables kept because other pipelines still use them.
    pub kept_tables: Vec<String>,
}

/// Zipline's records of the pipeline in one sink. Reads take no lock and work while the
/// pipeline runs; [`Lifecycle::forget_pipeline`] must only run while it does not (the
/// caller checks the claim first).
pub trait Lifecycle: Send + Sync {
    /// The lane checkpoints, the claim and the dead-letter count. A sink the pipeline never
    /// ran against reports nothing, not an error.
    fn status(&self) -> BoxFuture<'_, Result<SinkStatus, SinkError>>;

    /// Deletes the pipeline's rows (this connector's) from Zipline's checkpoint, table
    /// record, snapshot and claim tables, and drops each of those tables that is then empty.
    /// Sink tables and dead letters are kept: they hold the user's rows.
    fn forget_pipeline(&self) -> BoxFuture<'_, Result<Forgotten, SinkError>>;
}
