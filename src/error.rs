//! Error classes shared by every component: what the runtime does next.

/// What the runtime does next with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Retry the same work with backoff (connection loss, deadlock, lock wait timeout,
    /// a replication slot still held by a dying walsender).
    Transient,
    /// The work itself is bad (a row, a table): dead-letter it or halt; retrying cannot help.
    Definite,
    /// Stop the pipeline and tell the operator what to change (bad credentials,
    /// `wal_level` not logical, a missing table).
    Fatal,
}

/// Implemented by every error type that can reach the run loop.
pub trait Classify {
    /// How the runtime must react to this error.
    fn class(&self) -> ErrorClass;
}
