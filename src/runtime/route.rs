//! A route as the runtime runs it: which of the source's tables it takes, the transform its
//! changes pass through, and the sinks they go to.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::change::{Change, Table};
use crate::transform::{RouteTransform, TransformError};

/// A transform call's answer: the outputs in input order, each with its input's index.
pub type TransformCall = BoxFuture<'static, Result<Vec<(usize, Change)>, TransformError>>;

/// What a route's changes pass through before the lanes: a change in, any number out, each
/// output tagged with the index of its input in the batch. Implemented by the WebAssembly
/// [`RouteTransform`]; the runtime's unit tests use doubles.
pub trait Transformer: Send + Sync {
    /// Changes per call the transform prefers.
    fn batch_size(&self) -> usize;
    /// Transforms `changes`; outputs in input order, each with its input's index. The job should be handed over before this returns, the future
    /// only awaiting the answer: the dispatcher calls for the next batch before it awaits the
    /// last one's answer, and the transform works meanwhile. Calls are transformed in the
    /// order they are made.
    fn transform(&self, changes: Vec<Change>) -> TransformCall;
}

impl Transformer for RouteTransform {
    fn batch_size(&self) -> usize {
        RouteTransform::batch_size(self)
    }

    fn transform(&self, changes: Vec<Change>) -> TransformCall {
        Box::pin(RouteTransform::transform(self, changes))
    }
}

/// The source tables a route takes.
#[derive(Debug, Clone, Default)]
pub enum Tables {
    /// Every table (the source's only route).
    #[default]
    All,
    /// These (`schema` → names).
    Only(HashMap<String, HashSet<String>>),
    /// Every table but these, which other routes take.
    Rest(HashMap<String, HashSet<String>>),
}

impl Tables {
    /// From `schema.name` strings.
    pub fn names<'a>(names: impl IntoIterator<Item = &'a str>) -> HashMap<String, HashSet<String>> {
        let mut map: HashMap<String, HashSet<String>> = HashMap::new();
        for name in names {
            let (schema, table) = name.split_once('.').unwrap_or(("public", name));
            map.entry(schema.to_owned())
                .or_default()
                .insert(table.to_owned());
        }
        map
    }

    /// Whether the route takes table `schema.name`.
    pub fn takes(&self, schema: &str, name: &str) -> bool {
        let listed = |map: &HashMap<String, HashSet<String>>| {
            map.get(schema).is_some_and(|names| names.contains(name))
        };
        match self {
            Tables::All => true,
            Tables::Only(map) => listed(map),
            Tables::Rest(map) => !listed(map),
        }
    }

    /// Whether the route takes `table`.
    pub fn takes_table(&self, table: &Table) -> bool {
        self.takes(&table.schema, &table.name)
    }
}

/// One route of the source being run.
#[derive(Clone)]
pub struct RouteStage {
    /// For logs and errors: `route N (from → to, …)`.
    pub name: String,
    /// The tables it takes.
    pub tables: Tables,
    /// Its transform, if it has one.
    pub transform: Option<Arc<dyn Transformer>>,
    /// Its sinks: indices into the runtime's sinks.
    pub sinks: Vec<usize>,
}

impl std::fmt::Debug for RouteStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteStage")
            .field("name", &self.name)
            .field("tables", &self.tables)
            .field("transform", &self.transform.is_some())
            .field("sinks", &self.sinks)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_and_rest_split_the_tables() {
        let listed = Tables::names(["public.orders", "sales.items", "customers"]);
        let only = Tables::Only(listed.clone());
        let rest = Tables::Rest(listed);
        for (schema, name, taken) in [
            ("public", "orders", true),
            ("sales", "items", true),
            ("public", "customers", true),
            ("public", "items", false),
            ("sales", "orders", false),
        ] {
            assert_eq!(only.takes(schema, name), taken, "{schema}.{name}");
            assert_eq!(rest.takes(schema, name), !taken, "{schema}.{name}");
        }
        assert!(Tables::All.takes("any", "thing"));
    }
}
