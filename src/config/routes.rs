//! `routes:` — which sources feed which sinks — and the cross-connector checks.
//!
//! One route per source for now: a source's changes fan out to every sink in its `to`, so two
//! routes from one source would only be a second spelling of one route with a longer `to`.
//! Every connector must be used by some route; an unused one is almost always a typo.

use serde_yaml::Value;

use super::fields::{Ctx, Fields, Result, kind, list, non_empty};
use super::locate::child_index;
use super::model::{Connector, Route};

/// Reads and checks `routes` (at `path`) against the already-loaded connectors.
pub(crate) fn parse_routes(
    ctx: &Ctx<'_>,
    value: &Value,
    path: &str,
    connectors: &[Connector],
) -> Result<Vec<Route>> {
    let items = list(ctx, path, value)?;
    if items.is_empty() {
        return Err(ctx.err(path, "at least one route is required"));
    }
    let mut routes: Vec<Route> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let route_path = child_index(path, i);
        let f = Fields::new(ctx, item, &route_path, "a route `{ from, to }`")?;
        f.deny_unknown(&["from", "to", "transform"])?;

        let from = f.required("from", &non_empty)?;
        let from_path = f.field_path("from");
        let source = lookup(ctx, &from_path, &from, connectors)?;
        if !source.kind.is_source() {
            return Err(ctx.err(
                &from_path,
                format!(
                    "`{from}` is a {} connector; `from` must name a source",
                    source.kind.type_name()
                ),
            ));
        }
        if let Some(j) = routes.iter().position(|r| r.from == from) {
            let earlier = child_index(path, j);
            return Err(ctx.err(
                &from_path,
                format!(
                    "source `{from}` already has a route ({earlier}, line {}); list all its \
                     sinks in that route's `to`",
                    ctx.line(&earlier)
                ),
            ));
        }

        let to_path = f.field_path("to");
        let to = match f.get("to") {
            None => return Err(ctx.err(&to_path, "required field is missing")),
            Some(v @ Value::Sequence(_)) => sinks(ctx, v, &to_path, connectors)?,
            Some(other) => {
                return Err(ctx.err(
                    &to_path,
                    format!(
                        "expected a list of sink names such as [mysql-out], found {}",
                        kind(other)
                    ),
                ));
            }
        };
        let transform = match f.get("transform") {
            Some(v) => Some(super::transform::parse_transform(
                ctx,
                v,
                &f.field_path("transform"),
                &super::transform::base_dir(ctx.file),
                &super::transform::file_stem(ctx.file),
            )?),
            None => None,
        };
        routes.push(Route {
            from,
            to,
            transform,
        });
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
    // Last, because it compiles and starts each module: every cheaper check has passed.
    for (i, route) in routes.iter().enumerate() {
        if let Some(spec) = &route.transform {
            crate::transform::validate(&route.from, spec).map_err(|(field, message)| {
                let field = match field {
                    crate::transform::SpecField::Module => "module",
                    crate::transform::SpecField::Config if spec.config.is_empty() => "module",
                    crate::transform::SpecField::Config => "config",
                };
                ctx.err(
                    &format!("{}.transform.{field}", child_index(path, i)),
                    message,
                )
            })?;
        }
    }
    Ok(routes)
}

/// The `to` list: existing sinks, at least one, none twice.
fn sinks(
    ctx: &Ctx<'_>,
    value: &Value,
    path: &str,
    connectors: &[Connector],
) -> Result<Vec<String>> {
    let items = list(ctx, path, value)?;
    if items.is_empty() {
        return Err(ctx.err(path, "must list at least one sink"));
    }
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let item_path = child_index(path, i);
        let name = non_empty(ctx, &item_path, item)?;
        let sink = lookup(ctx, &item_path, &name, connectors)?;
        if !sink.kind.is_sink() {
            return Err(ctx.err(
                &item_path,
                format!(
                    "`{name}` is a {} connector; `to` must name sinks",
                    sink.kind.type_name()
                ),
            ));
        }
        if out.contains(&name) {
            return Err(ctx.err(&item_path, format!("sink `{name}` is listed twice")));
        }
        out.push(name);
    }
    Ok(out)
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
        let ok_tail = "  - from: src2\n    to: [out2]\n";
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
                "routes:\n  - from: src\n    to: [out]\n  - from: src\n    to: [out2]\n",
                "r.yaml:24: routes[1].from: source `src` already has a route (routes[0], line 22); \
                 list all its sinks in that route's `to`",
            ),
            (
                "routes:\n  - from: src\n    to: [out]\n    via: x\n",
                "r.yaml:24: routes[0].via: unknown field `via`; expected one of: from, to, transform",
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
        // Fan-in (two sources into one sink) is allowed.
        let opts = LoadOptions {
            secrets_dir: None,
            env: Box::new(|_| None),
        };
        let text = format!("{CONNECTORS}routes:\n  - from: src\n    to: [out, out2]\n{ok_tail}");
        let p = load_str("r.yaml", &text, &opts).unwrap();
        assert_eq!(p.routes.len(), 2);
        assert_eq!(p.routes[0].to, ["out", "out2"]);
    }
}
