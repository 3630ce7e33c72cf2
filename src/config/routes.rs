//! `routes:` — which of a source's tables go, through which transform, to which sinks — and
//! the cross-connector checks.
//!
//! A pipeline reads one source (its slot or cursor is one position), and may split it over
//! several routes: each lists the tables it takes (`tables:`), or takes every table no other
//! route lists. A table belongs to one route at most, and a sink to one route: otherwise which
//! transform a sink's rows went through would depend on the table, and two routes would race
//! on one sink table. Every connector must be used by some route; an unused one is almost
//! always a typo. Whether the listed tables exist is known only at start, when the source has
//! been reached: the messages then point back here (`Route::at`, `RouteTable::at`).

use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, Error as _, SeqAccess, Visitor};

use super::deserializer::from_node;
use super::model::{Connector, Location, Route, RouteTable};
use super::tree::{Ctx, Node, child_index, child_key};
use super::{ConfigError, values};

type Result<T> = std::result::Result<T, ConfigError>;

/// `to:` as written: a non-empty list of names (which must be sinks: checked with the
/// connectors, in [`parse_routes`]).
pub(crate) fn sink_names<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<String>, D::Error> {
    struct Names;
    impl<'de> Visitor<'de> for Names {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of sink names such as [mysql-out]")
        }
        fn visit_seq<A: SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            let mut names = Vec::new();
            while let Some(SinkName(name)) = seq.next_element()? {
                names.push(name);
            }
            Ok(names)
        }
    }
    let names = d.deserialize_any(Names)?;
    if names.is_empty() {
        return Err(D::Error::custom("must list at least one sink"));
    }
    Ok(names)
}

struct SinkName(String);

impl<'de> Deserialize<'de> for SinkName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        values::non_empty(d).map(SinkName)
    }
}

/// `tables:` of a route: at least one name.
pub(crate) fn route_tables<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Vec<RouteTable>>, D::Error> {
    let tables = Vec::<RouteTable>::deserialize(d)?;
    if tables.is_empty() {
        return Err(D::Error::custom(
            "must list at least one table (leave `tables` out to take every table no other \
             route lists)",
        ));
    }
    Ok(Some(tables))
}

/// Reads and checks `routes` (`node`) against the already-loaded connectors.
pub(crate) fn parse_routes(
    ctx: &Ctx<'_>,
    node: &Node,
    connectors: &[Connector],
) -> Result<Vec<Route>> {
    let path = node.path.as_str();
    let mut routes: Vec<Route> = Vec::with_capacity(node.items().len());
    for (i, item) in node.items().iter().enumerate() {
        let route_path = child_index(path, i);
        let mut route: Route = from_node(ctx.file, item)?;

        let from_path = child_key(&route_path, "from");
        let source = lookup(ctx, &from_path, &route.from, connectors)?;
        if !source.kind.is_source() {
            return Err(ctx.err(
                &from_path,
                format!(
                    "`{}` is a {} connector; `from` must name a source",
                    route.from,
                    source.kind.type_name()
                ),
            ));
        }
        if let Some(first) = routes.first()
            && first.from != route.from
        {
            return Err(ctx.err(
                &from_path,
                format!(
                    "a pipeline reads one source, and routes[0] reads `{}`; run a pipeline per \
                     source",
                    first.from
                ),
            ));
        }

        let to_path = child_key(&route_path, "to");
        for (j, name) in route.to.iter().enumerate() {
            let item_path = child_index(&to_path, j);
            let sink = lookup(ctx, &item_path, name, connectors)?;
            if !sink.kind.is_sink() {
                return Err(ctx.err(
                    &item_path,
                    format!(
                        "`{name}` is a {} connector; `to` must name sinks",
                        sink.kind.type_name()
                    ),
                ));
            }
            if route.to[..j].contains(name) {
                return Err(ctx.err(&item_path, format!("sink `{name}` is listed twice")));
            }
            if let Some(k) = routes.iter().position(|r| r.to.contains(name)) {
                let earlier = child_index(path, k);
                return Err(ctx.err(
                    &item_path,
                    format!(
                        "sink `{name}` is already fed by {earlier} (line {}); a sink takes one \
                         route",
                        ctx.line(&earlier)
                    ),
                ));
            }
        }
        if let Some(tables) = &mut route.tables {
            check_tables(
                ctx,
                tables,
                &child_key(&route_path, "tables"),
                &routes,
                path,
            )?;
        } else if let Some(k) = routes.iter().position(|r| r.tables.is_none()) {
            let earlier = child_index(path, k);
            return Err(ctx.err(
                &route_path,
                format!(
                    "{earlier} (line {}) already takes every table no route lists; list this \
                     route's `tables`",
                    ctx.line(&earlier)
                ),
            ));
        }
        if let Some(spec) = &mut route.transform {
            super::transform::resolve_paths(spec, ctx.file);
            let at = |field: &str| {
                let path = format!("{route_path}.transform.{field}");
                Location {
                    file: ctx.file.to_owned(),
                    line: Some(ctx.line(&path)).filter(|&l| l > 0),
                    path,
                }
            };
            route.transform_at = Some((at("module"), at("config")));
        }
        route.at = format!("{}:{}: {route_path}", ctx.file, ctx.line(&route_path));
        routes.push(route);
    }

    for (i, c) in connectors.iter().enumerate() {
        let used = routes
            .iter()
            .any(|r| r.from == c.name || r.to.contains(&c.name));
        if !used {
            return Err(ctx.err(
                &format!("connectors[{i}].name"),
                format!(
                    "connector `{}` is not used by any route; add it to a route or remove it",
                    c.name
                ),
            ));
        }
    }
    Ok(routes)
}

/// A route's `tables`: none twice, none another route lists; each learns where it is.
fn check_tables(
    ctx: &Ctx<'_>,
    tables: &mut [RouteTable],
    path: &str,
    earlier: &[Route],
    routes_path: &str,
) -> Result<()> {
    for j in 0..tables.len() {
        let item_path = child_index(path, j);
        let name = &tables[j].name;
        if tables[..j].iter().any(|t| t.name == *name) {
            return Err(ctx.err(&item_path, format!("table `{name}` is listed twice")));
        }
        for (k, route) in earlier.iter().enumerate() {
            if route.tables.iter().flatten().any(|t| t.name == *name) {
                let other = child_index(routes_path, k);
                return Err(ctx.err(
                    &item_path,
                    format!(
                        "table `{name}` is already taken by {other} (line {}); a table takes \
                         one route",
                        ctx.line(&other)
                    ),
                ));
            }
        }
        tables[j].at = format!("{}:{}: {item_path}", ctx.file, ctx.line(&item_path));
    }
    Ok(())
}

fn lookup<'c>(
    ctx: &Ctx<'_>,
    path: &str,
    name: &str,
    connectors: &'c [Connector],
) -> Result<&'c Connector> {
    connectors.iter().find(|c| c.name == name).ok_or_else(|| {
        let names: Vec<&str> = connectors.iter().map(|c| c.name.as_str()).collect();
        ctx.err(
            path,
            format!(
                "unknown connector `{name}`; defined connectors: {}",
                names.join(", ")
            ),
        )
    })
}

/// Compiles and starts each route's transform once, as a step of its own (loading a file
/// never compiles WebAssembly); an error points at the route's `transform.module` or
/// `transform.config`.
pub fn check_transforms(routes: &[Route]) -> std::result::Result<(), super::ConfigError> {
    for route in routes {
        let (Some(spec), Some((module, config))) = (&route.transform, &route.transform_at) else {
            continue;
        };
        crate::transform::validate(&route.from, spec).map_err(|(field, message)| {
            let at = match field {
                crate::transform::SpecField::Module => module,
                crate::transform::SpecField::Config if spec.config.is_empty() => module,
                crate::transform::SpecField::Config => config,
            };
            at.error(message)
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{LoadOptions, load_str};

    const CONNECTORS: &str = "\
name: p
connectors:
  - name: src
    type: source/postgres
    host: db
    database: app
    user: repl
    publication: pub
    slot_name: s1
  - name: src2
    type: source/postgres
    host: db
    database: app
    user: repl
    publication: pub
    slot_name: s2
  - name: out
    type: sink/mysql
  - name: out2
    type: sink/mysql
";

    fn err(routes: &str) -> String {
        let opts = LoadOptions {
            secrets_dir: None,
            env: Box::new(|_| None),
        };
        load_str("r.yaml", &format!("{CONNECTORS}{routes}"), &opts)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn route_errors_are_located() {
        // Routes start at line 21.
        let cases: &[(&str, &str)] = &[
            (
                "routes: []\n",
                "r.yaml:21: routes: at least one route is required",
            ),
            (
                "routes:\n  - from: nope\n    to: [out]\n",
                "r.yaml:22: routes[0].from: unknown connector `nope`; defined connectors: src, src2, out, out2",
            ),
            (
                "routes:\n  - from: out\n    to: [out2]\n",
                "r.yaml:22: routes[0].from: `out` is a sink/mysql connector; `from` must name a source",
            ),
            (
                "routes:\n  - from: src\n    to: [out, src2]\n",
                "r.yaml:23: routes[0].to[1]: `src2` is a source/postgres connector; `to` must name sinks",
            ),
            (
                "routes:\n  - from: src\n    to: []\n",
                "r.yaml:23: routes[0].to: must list at least one sink",
            ),
            (
                "routes:\n  - from: src\n",
                "r.yaml:22: routes[0].to: required field is missing",
            ),
            (
                "routes:\n  - from: src\n    to: out\n",
                "r.yaml:23: routes[0].to: expected a list of sink names such as [mysql-out], found a string",
            ),
            (
                "routes:\n  - from: src\n    to:\n      - out\n      - out\n",
                "r.yaml:25: routes[0].to[1]: sink `out` is listed twice",
            ),
            (
                "routes:\n  - from: src\n    to: [out]\n  - from: src2\n    to: [out2]\n",
                "r.yaml:24: routes[1].from: a pipeline reads one source, and routes[0] reads \
                 `src`; run a pipeline per source",
            ),
            (
                "routes:\n  - from: src\n    to: [out]\n  - from: src\n    to: [out2, out]\n",
                "r.yaml:25: routes[1].to[1]: sink `out` is already fed by routes[0] (line 22); a \
                 sink takes one route",
            ),
            (
                "routes:\n  - from: src\n    to: [out]\n  - from: src\n    to: [out2]\n",
                "r.yaml:24: routes[1]: routes[0] (line 22) already takes every table no route \
                 lists; list this route's `tables`",
            ),
            (
                "routes:\n  - from: src\n    tables: [a, b, a]\n    to: [out]\n",
                "r.yaml:23: routes[0].tables[2]: table `a` is listed twice",
            ),
            (
                "routes:\n  - from: src\n    tables: [a]\n    to: [out]\n  - from: src\n    \
                 tables: [b, a]\n    to: [out2]\n",
                "r.yaml:26: routes[1].tables[1]: table `a` is already taken by routes[0] (line \
                 22); a table takes one route",
            ),
            (
                "routes:\n  - from: src\n    tables: []\n    to: [out]\n",
                "r.yaml:23: routes[0].tables: must list at least one table (leave `tables` out \
                 to take every table no other route lists)",
            ),
            (
                "routes:\n  - from: src\n    to: [out]\n    via: x\n",
                "r.yaml:24: routes[0].via: unknown field `via`; expected one of: from, to, \
                 tables, transform",
            ),
            (
                "routes:\n  - from: src\n    to: [out]\n",
                "r.yaml:10: connectors[1].name: connector `src2` is not used by any route; add it \
                 to a route or remove it",
            ),
        ];
        for (routes, want) in cases {
            let got = err(routes);
            assert_eq!(got, *want, "routes: {routes}");
        }
    }

    #[test]
    fn one_source_splits_over_routes() {
        let opts = LoadOptions {
            secrets_dir: None,
            env: Box::new(|_| None),
        };
        let text = format!(
            "{}routes:\n  - from: src\n    tables: [public.orders]\n    to: [out]\n  - from: src\n    to: [out2]\n",
            CONNECTORS.replace(
                "  - name: src2\n    type: source/postgres\n    host: db\n    database: app\n    user: repl\n    publication: pub\n    slot_name: s2\n",
                ""
            )
        );
        let p = load_str("r.yaml", &text, &opts).unwrap();
        assert_eq!(p.routes.len(), 2);
        let tables = p.routes[0].tables.as_ref().expect("listed");
        assert_eq!(tables[0].name, "public.orders");
        assert_eq!(tables[0].at, "r.yaml:16: routes[0].tables[0]");
        assert_eq!(p.routes[1].tables, None);
        assert_eq!(p.routes[1].at, "r.yaml:18: routes[1]");
    }
}
