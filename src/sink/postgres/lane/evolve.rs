//! Following the source's schema changes on the sink tables, before a batch is written.
//!
//! A batch may carry a table shape the lane has not matched against the sink yet (the source
//! table gained or lost columns mid-stream, or the lane just started). For such a shape the
//! lane reads the sink table from the catalog and:
//! - adds every source column the sink table lacks in one `ALTER TABLE … ADD COLUMN IF NOT
//!   EXISTS …` (so lanes racing on one table are harmless), nullable (rows written before it
//!   stay valid), typed `format_type(type OID, typmod)` as `create_tables` does; types the
//!   source database defined itself (OID ≥ 16384) mean nothing on the sink and are refused
//!   with the statement to run by hand;
//! - refuses a sink column that is NOT NULL without a default when the source no longer has
//!   it (dropped on the source): every later insert would fail.
//!
//! This runs before the batch's `BEGIN`: the ALTER takes an ACCESS EXCLUSIVE lock and waits
//! for other lanes' transactions on the table, so this lane must hold none of its own. A cycle
//! through several lanes' locks is broken by PostgreSQL's deadlock detector and retried.

use tokio_postgres::Client;

use super::super::errors::sink_error;
use super::super::schema::{FIRST_NORMAL_OID, SinkTable};
use super::super::sql::push_ident;
use super::PostgresLane;
use crate::change::{Change, Table};
use crate::error::ErrorClass;
use crate::sink::SinkError;

impl PostgresLane {
    /// Fits the sink tables to every shape of `changes` this lane has not matched yet; a
    /// no-op lookup for known shapes.
    pub(super) async fn fit_shapes(&mut self, changes: &[Change]) -> Result<(), SinkError> {
        let unknown = self.shapes.unknown(changes);
        if unknown.is_empty() {
            return Ok(());
        }
        if self.dirty {
            // A cancelled call may have left a transaction open; a new session is clean.
            self.forget_connection();
        }
        if self.client.is_none() {
            self.client = Some(self.shared.connect().await?);
        }
        for table in unknown {
            // Fresh from the catalog: another lane may have added columns meanwhile.
            let result = match self.sink_table(&table, true).await {
                Ok(sink_table) => {
                    let client = self.client.as_ref().expect("connected above");
                    fit(client, self.shared.sink(), &table, &sink_table, true).await
                }
                Err(failure) => Err(failure.error),
            };
            match result {
                Ok(false) => {}
                // The next batch's statements must see the new columns.
                Ok(true) => {
                    if let Err(failure) = self.sink_table(&table, true).await {
                        return Err(self.failed(failure.error));
                    }
                }
                Err(e) => return Err(self.failed(e)),
            }
            self.shapes.insert(table);
        }
        Ok(())
    }

    fn failed(&mut self, error: SinkError) -> SinkError {
        if error.class == ErrorClass::Transient {
            self.forget_connection();
        }
        error
    }
}

/// Makes `sink_table` able to take rows of shape `table` (see the module docs); `Ok(true)`
/// when columns were added. `refuse_required: false` leaves required columns the source lacks
/// to the caller (the startup check, which reports every problem at once).
pub(in crate::sink::postgres) async fn fit(
    client: &Client,
    sink: &str,
    table: &Table,
    sink_table: &SinkTable,
    refuse_required: bool,
) -> Result<bool, SinkError> {
    let target = &sink_table.target;
    if let Some(kept) = sink_table
        .required_columns()
        .find(|c| refuse_required && !table.columns.iter().any(|s| s.name == *c))
    {
        return Err(SinkError::fatal(format!(
            "sink {sink}: column {target}.\"{kept}\" is NOT NULL without a default, and source \
             table {} has no column {kept} (dropped or renamed on the source?), so inserts would \
             fail; make it nullable or give it a default (ALTER TABLE {target} ALTER COLUMN \
             \"{kept}\" DROP NOT NULL), then restart Zipline",
            table.qualified_name(),
        )));
    }
    let missing: Vec<_> = table
        .columns
        .iter()
        .filter(|c| sink_table.cast(&c.name).is_none())
        .collect();
    if missing.is_empty() {
        return Ok(false);
    }
    let mut ddl = format!("ALTER TABLE {target} ");
    for (n, column) in missing.iter().enumerate() {
        let source = format!("{}.{}", table.qualified_name(), column.name);
        let ty: Option<String> = if column.type_oid >= FIRST_NORMAL_OID {
            None
        } else {
            client
                .query_one(
                    "SELECT format_type($1, $2)",
                    &[&column.type_oid, &column.type_modifier],
                )
                .await
                .map_err(|e| {
                    let doing = format!("naming the type of source column {source}");
                    sink_error(sink, &doing, &e)
                })?
                .get(0)
        };
        let Some(ty) = ty.filter(|t| !t.contains("???")) else {
            return Err(SinkError::fatal(format!(
                "sink {sink}: table {target} has no column \"{}\" for source column {source}, \
                 whose type (OID {}) was defined in the source database and may not exist on \
                 the sink; add the column to {target} yourself, then restart Zipline",
                column.name, column.type_oid
            )));
        };
        if n > 0 {
            ddl.push_str(", ");
        }
        ddl.push_str("ADD COLUMN IF NOT EXISTS ");
        push_ident(&mut ddl, &column.name);
        ddl.push(' ');
        ddl.push_str(&ty);
    }
    if let Err(e) = client.batch_execute(&ddl).await {
        let names: Vec<&str> = missing.iter().map(|c| c.name.as_str()).collect();
        let doing = format!("adding columns {} to table {target}", names.join(", "));
        let error = sink_error(sink, &doing, &e);
        if error.class == ErrorClass::Transient {
            return Err(error);
        }
        let message = format!(
            "{}; source table {} has these columns and {target} lacks them: run `{ddl}` on the \
             sink (or let Zipline's user alter the table), then restart Zipline",
            error.message,
            table.qualified_name()
        );
        return Err(SinkError {
            class: ErrorClass::Fatal,
            ..error.reworded(message)
        });
    }
    let names: Vec<&str> = missing.iter().map(|c| c.name.as_str()).collect();
    tracing::info!(sink, table = %target, columns = ?names, "added columns the source table has");
    Ok(true)
}
