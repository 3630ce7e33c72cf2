//! A source's initial snapshot as a sink records it, so an interrupted snapshot resumes: the
//! plan (chunks: ranges of the first key column) and which chunks the sink has loaded, each
//! chunk's rows and its mark written in one transaction. See `sink/snapshot.rs` for the
//! sinks' side and `docs/connectors/postgres-source.md` (Initial snapshot) for how resuming
//! stays consistent with the change stream.

/// One range of one table's rows: those whose `column` is `>= lower` and `< upper` (`None`:
/// unbounded), the bounds written as the source prints the values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SnapshotChunk {
    /// The source table, `schema.name`.
    pub table: String,
    /// Position of the chunk in its table's plan, from 0 in key order.
    pub index: u32,
    /// The key column the table's chunks range over.
    pub column: String,
    /// Inclusive lower bound; `None` for the first chunk of a table.
    pub lower: Option<String>,
    /// Exclusive upper bound; `None` for the last chunk of a table.
    pub upper: Option<String>,
}

impl std::fmt::Display for SnapshotChunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} chunk {} ({} in [{}, {}))",
            self.table,
            self.index,
            self.column,
            self.lower.as_deref().unwrap_or("-∞"),
            self.upper.as_deref().unwrap_or("+∞")
        )
    }
}

/// What a sink has recorded of the initial snapshot of its pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SnapshotState {
    /// Nothing: no snapshot was ever started into this sink.
    #[default]
    None,
    /// Started and not finished: the planned chunks (empty until the plan is saved), each
    /// with whether this sink has loaded it.
    Pending(Vec<(SnapshotChunk, bool)>),
    /// Every chunk was loaded into every sink.
    Complete,
}
