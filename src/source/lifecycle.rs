//! What `zipline pipeline status` and `zipline pipeline drop` ask of a source: the state of
//! the cursor it owns upstream (a replication slot) and of what it created for it (a
//! publication), read whether or not the pipeline runs; and removing them.

use serde::Serialize;

/// A source's cursor upstream, as the server reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SourceStatus {
    /// The connector's name (in JSON, the report around it carries it).
    #[serde(skip)]
    pub name: String,
    /// `postgres` or `sqlserver`.
    pub kind: &'static str,
    /// The replication slot's name (`None`: the source keeps no cursor upstream).
    pub slot: Option<String>,
    /// Whether the slot exists.
    pub slot_exists: bool,
    /// Whether a walsender streams from it.
    pub active: bool,
    /// That walsender's process id.
    pub active_pid: Option<i32>,
    /// `reserved`, `extended`, `unreserved` or `lost`.
    pub wal_status: Option<String>,
    /// WAL the slot keeps the server from recycling, in bytes.
    pub retained_bytes: Option<i64>,
    /// The position the slot confirmed (everything before it is applied in every sink).
    pub confirmed_lsn: Option<String>,
    /// The server's current WAL position.
    pub server_lsn: Option<String>,
    /// Bytes of WAL between the confirmed position and the server's current one.
    pub lag_bytes: Option<i64>,
    /// The publication the source streams.
    pub publication: Option<String>,
    /// Whether it exists.
    pub publication_exists: bool,
    /// Whether Zipline created it (and `drop` removes it).
    pub publication_owned: bool,
    /// What else the operator should know (e.g. where a cursor-less source resumes).
    pub note: Option<String>,
}

/// What dropping a pipeline removed upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceDropped {
    /// The slot dropped, if there was one.
    pub slot: Option<String>,
    /// The publication dropped (Zipline created it).
    pub publication: Option<String>,
    /// A publication kept, with why.
    pub kept: Option<String>,
}
