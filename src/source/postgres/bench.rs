//! pgoutput decoding for the micro-benchmarks (see `crate::bench`): the same calls the
//! replication loop makes for each row message.

use std::sync::Arc;

use bytes::Bytes;

use super::pgoutput::{self, Known, PgOutput, Relations};
use crate::change::{Change, Position, Table};

/// Decodes the row messages of tables described by earlier Relation messages.
#[derive(Debug)]
pub struct PgoutputDecoder {
    relations: Relations,
}

impl Default for PgoutputDecoder {
    fn default() -> Self {
        PgoutputDecoder {
            relations: Relations::new(Arc::default(), Known::new()),
        }
    }
}

impl PgoutputDecoder {
    /// Takes a Relation message (outside a streamed transaction).
    pub fn relation(&mut self, message: Bytes) -> Result<Arc<Table>, String> {
        match pgoutput::decode(message, false).map_err(|e| e.to_string())? {
            PgOutput::Relation(body) => self
                .relations
                .apply_relation(body)
                .map_err(|e| e.to_string()),
            other => Err(format!("not a Relation message: {}", other.name())),
        }
    }

    /// Decodes an Insert, Update or Delete message into the change at `position`.
    pub fn change(&self, message: Bytes, position: Position) -> Result<Change, String> {
        let msg = pgoutput::decode(message, false).map_err(|e| e.to_string())?;
        self.relations
            .build_change(msg, position)
            .map_err(|e| e.to_string())
    }
}
