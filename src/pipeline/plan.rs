//! The pipeline file resolved for running: its one source, its routes, and each sink once
//! (connector instance, lanes, tuning), with the route each sink belongs to; at start, each
//! route's `tables:` resolved against the tables the source really streams.

use std::sync::Arc;

use super::PipelineError;
use super::wiring::sink_plan;
use crate::change::Table;
use crate::config;
use crate::lane::LaneConfig;
use crate::runtime::{RouteStage, Tables, Transformer};
use crate::sink::SinkConnector;

/// One sink, as every run uses it.
pub(super) struct SinkPlan {
    pub(super) connector: Arc<dyn SinkConnector>,
    pub(super) lanes: u32,
    pub(super) queue_capacity: usize,
    pub(super) lane_cfg: LaneConfig,
}

/// The source, its routes, their sinks.
pub(super) struct Plan {
    pub(super) source: String,
    pub(super) routes: Vec<config::Route>,
    pub(super) sinks: Vec<SinkPlan>,
    /// Per sink: the route it belongs to.
    pub(super) route_of: Vec<usize>,
}

impl Plan {
    pub(super) fn new(pipeline: &config::Pipeline) -> Result<Plan, PipelineError> {
        let Some(first) = pipeline.routes.first() else {
            return Err(PipelineError::Invalid {
                pipeline: pipeline.name.clone(),
                message: "has no route".into(),
            });
        };
        let mut sinks = Vec::new();
        let mut route_of = Vec::new();
        for (r, route) in pipeline.routes.iter().enumerate() {
            for name in &route.to {
                sinks.push(sink_plan(pipeline, name)?);
                route_of.push(r);
            }
        }
        Ok(Plan {
            source: first.from.clone(),
            routes: pipeline.routes.clone(),
            sinks,
            route_of,
        })
    }

    /// The pipeline's counters, one set per sink lane and per route transform.
    pub(super) fn metrics(&self, pipeline: &str) -> crate::metrics::PipelineMetrics {
        let sinks: Vec<_> = self
            .sinks
            .iter()
            .map(|s| crate::metrics::SinkShape {
                name: s.connector.name().to_owned(),
                lanes: s.lanes,
            })
            .collect();
        let transformed: Vec<bool> = self.routes.iter().map(|r| r.transform.is_some()).collect();
        crate::metrics::PipelineMetrics::new(pipeline, &self.source, &sinks, &transformed)
    }

    /// Every sink connector, in plan order.
    pub(super) fn connectors(&self) -> Vec<Arc<dyn SinkConnector>> {
        self.sinks
            .iter()
            .map(|s| Arc::clone(&s.connector))
            .collect()
    }

    /// Whether sink `s`'s route has a transform (which then decides its sink tables).
    pub(super) fn transformed(&self, s: usize) -> bool {
        self.routes[self.route_of[s]].transform.is_some()
    }

    /// Each route's tables, resolved against `streamed` (the source's tables): a name without
    /// a schema must name exactly one of them; every name must exist; no table may resolve
    /// into two routes. Errors point at the name in the file.
    pub(super) fn tables(
        &self,
        pipeline: &str,
        streamed: &[Arc<Table>],
    ) -> Result<Vec<Tables>, PipelineError> {
        let invalid = |message: String| PipelineError::Invalid {
            pipeline: pipeline.to_owned(),
            message,
        };
        let all: Vec<String> = streamed.iter().map(|t| t.qualified_name()).collect();
        // (resolved name, where it was written)
        let mut taken: Vec<(String, &str)> = Vec::new();
        let mut listed: Vec<Option<Vec<String>>> = Vec::with_capacity(self.routes.len());
        for route in &self.routes {
            let Some(names) = &route.tables else {
                listed.push(None);
                continue;
            };
            let mut resolved = Vec::with_capacity(names.len());
            for name in names {
                let matches: Vec<&String> = if name.name.contains('.') {
                    all.iter().filter(|q| **q == name.name).collect()
                } else {
                    all.iter()
                        .filter(|q| q.split_once('.').is_some_and(|(_, n)| n == name.name))
                        .collect()
                };
                let table = match matches.as_slice() {
                    [one] => (*one).clone(),
                    [] => {
                        return Err(invalid(format!(
                            "{}: table `{}` is not among the tables source {} streams ({})",
                            name.at,
                            name.name,
                            self.source,
                            all.join(", ")
                        )));
                    }
                    many => {
                        return Err(invalid(format!(
                            "{}: table `{}` could be {}; write it as schema.table",
                            name.at,
                            name.name,
                            many.iter()
                                .map(|s| s.as_str())
                                .collect::<Vec<_>>()
                                .join(" or ")
                        )));
                    }
                };
                if let Some((_, other)) = taken.iter().find(|(t, _)| *t == table) {
                    return Err(invalid(format!(
                        "{}: table {table} is already taken by {other}; a table takes one route",
                        name.at
                    )));
                }
                taken.push((table.clone(), &name.at));
                resolved.push(table);
            }
            listed.push(Some(resolved));
        }
        let taken_names: Vec<&str> = taken.iter().map(|(t, _)| t.as_str()).collect();
        Ok(listed
            .into_iter()
            .map(|names| match names {
                Some(names) => Tables::Only(Tables::names(names.iter().map(String::as_str))),
                None if taken_names.is_empty() => Tables::All,
                None => Tables::Rest(Tables::names(taken_names.iter().copied())),
            })
            .collect())
    }

    /// The route that takes source table `table` (`schema.name`) by the names in the file: the
    /// one listing it (qualified, or by its bare name), else the one taking the rest.
    pub(super) fn route_for(&self, table: &str) -> Option<usize> {
        let bare = table.split_once('.').map_or(table, |(_, n)| n);
        self.routes
            .iter()
            .position(|r| {
                r.tables
                    .iter()
                    .flatten()
                    .any(|t| t.name == table || t.name == bare)
            })
            .or_else(|| self.routes.iter().position(|r| r.tables.is_none()))
    }

    /// The runtime's routes: tables, transforms and sink indices.
    pub(super) fn stages(
        &self,
        tables: &[Tables],
        transforms: &[Option<Arc<dyn Transformer>>],
    ) -> Vec<RouteStage> {
        self.routes
            .iter()
            .enumerate()
            .map(|(r, route)| RouteStage {
                name: format!("route {} ({} → {})", r + 1, route.from, route.to.join(", ")),
                tables: tables[r].clone(),
                transform: transforms[r].clone(),
                sinks: (0..self.sinks.len())
                    .filter(|&s| self.route_of[s] == r)
                    .collect(),
            })
            .collect()
    }

    /// The source tables sink `s` takes (its route's), for table checks and emptying.
    pub(super) fn sink_tables(
        &self,
        s: usize,
        tables: &[Tables],
        streamed: &[Arc<Table>],
    ) -> Vec<Arc<Table>> {
        let route = &tables[self.route_of[s]];
        streamed
            .iter()
            .filter(|t| route.takes_table(t))
            .cloned()
            .collect()
    }
}
