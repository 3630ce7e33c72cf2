//! The lane's caches: the sink tables' shapes (loaded once, reloaded after a schema change)
//! and the statements prepared on its connection; and finding the row to blame for a data
//! error.

use std::sync::Arc;

use super::*;

impl PostgresLane {
    /// The row key behind a data error in `stmt`, found by re-running parts of it in a
    /// transaction that is rolled back (see `diagnose.rs`).
    pub(super) async fn blame(&self, stmt: &Stmt<'_>, tables: &[TablePlan<'_>]) -> Option<String> {
        let client = self.client.as_ref()?;
        let prepared = self.statements.get(&stmt.sql)?;
        // The failed transaction must be over before the diagnosis starts its own.
        client.batch_execute("ROLLBACK").await.ok()?;
        let plan = tables.get(stmt.table)?;
        match stmt.kind {
            Kind::Upsert | Kind::Insert => {
                let group = plan.upserts.get(stmt.group)?;
                let rows = &group.rows[stmt.rows.clone()];
                let n = if rows.len() == 1 {
                    0
                } else {
                    diagnose::find_row(client, prepared, &stmt.params, rows.len()).await?
                };
                let row: &Row<'_> = rows.get(n)?;
                let key = group.shape.key.iter().map(|&i| &row.values()[i]);
                Some(sql::key_text(group.shape, key))
            }
            Kind::Delete => {
                let group = plan.deletes.get(stmt.group)?;
                let keys = &group.keys[stmt.rows.clone()];
                let n = if keys.len() == 1 {
                    0
                } else {
                    diagnose::find_row(client, prepared, &stmt.params, keys.len()).await?
                };
                Some(sql::key_text(group.shape, keys.get(n)?.iter()))
            }
            Kind::Truncate | Kind::Move | Kind::Copy => None,
        }
    }

    /// The sink table of each plan table (and of the prelude's table), read from the catalog
    /// on first use per connection. A table that does not exist is created when
    /// `create_tables` is set, else it is a Fatal error.
    pub(super) async fn sink_tables(
        &mut self,
        tables: &[TablePlan<'_>],
    ) -> Result<Vec<Arc<SinkTable>>, Failure> {
        // A move's plan holds exactly the moved row's table, so it needs no entry of its own.
        let mut out = Vec::with_capacity(tables.len());
        for plan in tables {
            out.push(self.sink_table(plan.source, false).await?);
        }
        Ok(out)
    }

    pub(super) async fn sink_table(
        &mut self,
        table: &Table,
        reload: bool,
    ) -> Result<Arc<SinkTable>, Failure> {
        let schema = self.shared.target_schema(table).to_owned();
        let key = (schema, table.name.clone());
        if !reload && let Some(t) = self.tables.get(&key) {
            return Ok(Arc::clone(t));
        }
        let shared = Arc::clone(&self.shared);
        let client = self.client.as_ref().expect("connected in write()");
        let target = qualified(&key.0, &key.1);
        let read = |e: tokio_postgres::Error| {
            Failure::pg(
                shared.sink(),
                &format!("reading the definition of table {target}"),
                &e,
            )
        };
        let mut found = schema::load(client, &key.0, &key.1).await.map_err(read)?;
        if found.is_none() && shared.options.create_tables {
            let source = Arc::new(table.clone());
            schema::check(
                client,
                shared.sink(),
                shared.options.schema.as_deref(),
                true,
                std::slice::from_ref(&source),
            )
            .await?;
            found = schema::load(client, &key.0, &key.1).await.map_err(read)?;
        }
        let Some(found) = found else {
            return Err(SinkError::fatal(format!(
                "sink {}: table {target} does not exist (source table {}); create it with a \
                 primary key on ({}), or set create_tables: true",
                shared.sink(),
                table.qualified_name(),
                table
                    .key
                    .iter()
                    .map(|&i| table.columns[i].name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .into());
        };
        let found = Arc::new(found);
        self.tables.insert(key, Arc::clone(&found));
        Ok(found)
    }

    /// The error for a source column the sink table lacks. The cached definition may be
    /// stale (the column was just added on both sides): it is dropped, so the retry after a
    /// restart reads it again.
    pub(super) fn missing_column(
        &mut self,
        table: &Table,
        sink: &SinkTable,
        column: &str,
    ) -> SinkError {
        let schema = self.shared.target_schema(table).to_owned();
        self.tables.remove(&(schema, table.name.clone()));
        SinkError::fatal(format!(
            "sink {}: table {} has no column \"{column}\" (source column {}.{column}); add it \
             (the source table's columns changed?)",
            self.shared.sink(),
            sink.target,
            table.qualified_name()
        ))
    }

    /// Prepares every statement not yet prepared on this connection, and the tail's.
    pub(super) async fn prepare(
        &mut self,
        stmts: &[Stmt<'_>],
        tables: &[TablePlan<'_>],
        sinks: &[&SinkTable],
        steps: &[Step],
    ) -> Result<(), Failure> {
        if self.statements.len() > STATEMENT_CACHE_LIMIT {
            self.statements.clear();
        }
        let sink = self.shared.sink();
        for step in steps {
            let sql = self.step_sql(*step);
            if self.statements.contains_key(&sql) {
                continue;
            }
            let client = self.client.as_ref().expect("connected in write()");
            let prepared = client.prepare(&sql).await.map_err(|e| {
                Failure::pg(sink, "preparing the transaction's closing statements", &e)
            })?;
            self.statements.insert(sql, prepared);
        }
        let client = self.client.as_ref().expect("connected in write()");
        for stmt in stmts {
            if self.statements.contains_key(&stmt.sql) {
                continue;
            }
            let prepared = client.prepare(&stmt.sql).await.map_err(|e| {
                let source = match tables.get(stmt.table) {
                    Some(plan) => plan.source.qualified_name(),
                    None => "?".to_owned(),
                };
                let target = sinks.get(stmt.table).map_or("?", |s| s.target.as_str());
                let doing = format!("preparing a statement for {target} (source table {source})");
                Failure::pg(sink, &doing, &e)
            })?;
            self.statements.insert(stmt.sql.clone(), prepared);
        }
        Ok(())
    }
}
