//! `routes[].transform` — a WebAssembly component that filters, masks or reshapes a route's
//! changes before they reach the lanes.
//!
//! ```yaml
//! transform:
//!   module: ./transforms/mask_email.wasm   # relative to the pipeline file
//!   config: { column: email }               # strings, handed to the component's `init`
//!   limits: { memory: 64MiB, timeout: 200ms, output: 16MiB }
//!   on_error: dead_letter                   # halt (default) | skip | dead_letter
//!   dead_letter: ./orders.deadletter.jsonl  # default: <pipeline file stem>.deadletter.jsonl
//!   batch_size: 1000                        # changes per call into the component
//! ```
//!
//! Parsing only reads the fields; [`super::load`] then has [`crate::transform::validate`]
//! compile, pre-instantiate and `init` the component, so a missing file, malformed wasm, the
//! wrong world, a missing export or a refused config is reported against `module` (or
//! `config`) like any other configuration error. Operator documentation: the README's
//! "Transforms" section and `docs/connectors/README.md` (routes).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_yaml::Value;

use super::fields::{Ctx, Fields, Result, duration, kind, non_empty, positive};
use super::interpolate::key_text;
use super::locate::child_key;

/// A route's transform, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransformSpec {
    /// The component file, resolved against the pipeline file's directory.
    pub module: PathBuf,
    /// `module` as written in the file, for messages.
    pub module_label: String,
    /// The `config:` map handed to the component's `init`, in file order.
    pub config: Vec<(String, String)>,
    /// Resource limits per instance and call.
    pub limits: TransformLimits,
    /// What a failed change does to the pipeline.
    pub on_error: OnError,
    /// Where `on_error: dead_letter` appends refused changes (JSON lines).
    pub dead_letter: PathBuf,
    /// Most changes handed to the component in one call. Default 1000.
    pub batch_size: usize,
}

/// Limits applied to every instance of a transform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransformLimits {
    /// Most linear memory one instance may grow to, in bytes. Default 64 MiB.
    pub memory: u64,
    /// Longest one call (a batch) may run. Default 1s.
    pub timeout: Duration,
    /// Most output one call may return, in bytes: both every byte copied out of the guest
    /// (each list and string of its output, checked before copying) and what its changes'
    /// values come to once resolved (plus a small per-value and per-change overhead). Default
    /// 16 MiB, at most [`MAX_OUTPUT`].
    pub output: u64,
}

/// The largest `limits.output`: a guest's memory is 32-bit, so no list it returns can be
/// longer, and output spans address data with 32-bit offsets.
pub(crate) const MAX_OUTPUT: u64 = 4 << 30;

impl Default for TransformLimits {
    fn default() -> Self {
        TransformLimits {
            memory: 64 << 20,
            timeout: Duration::from_secs(1),
            output: 16 << 20,
        }
    }
}

/// The route's `on_error` policy: what happens to a change the transform fails on (a trap,
/// a timeout, a limit breach, an `err`, an invalid output, or a per-change error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// Stop the pipeline, naming the route, module and change (default).
    #[default]
    Halt,
    /// Log the change and the reason, count it, and go on without it.
    Skip,
    /// Append the original change and the reason durably to the dead-letter file, then go on.
    DeadLetter,
}

impl OnError {
    /// The YAML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            OnError::Halt => "halt",
            OnError::Skip => "skip",
            OnError::DeadLetter => "dead_letter",
        }
    }
}

const FIELDS: &[&str] = &[
    "module",
    "config",
    "limits",
    "on_error",
    "dead_letter",
    "batch_size",
];

/// Reads `transform` at `path`; relative paths are resolved against `base_dir`, and the
/// dead-letter file defaults to `<file_stem>.deadletter.jsonl` there.
pub(crate) fn parse_transform(
    ctx: &Ctx<'_>,
    value: &Value,
    path: &str,
    base_dir: &Path,
    file_stem: &str,
) -> Result<TransformSpec> {
    let f = Fields::new(
        ctx,
        value,
        path,
        "a transform `{ module, config, limits, on_error }`",
    )?;
    f.deny_unknown(FIELDS)?;
    let module_label = f.required("module", &non_empty)?;
    let module = base_dir.join(&module_label);
    let config = match f.get("config") {
        Some(v) => config_map(ctx, v, &f.field_path("config"))?,
        None => Vec::new(),
    };
    let limits = match f.get("limits") {
        Some(v) => parse_limits(ctx, v, &f.field_path("limits"))?,
        None => TransformLimits::default(),
    };
    let on_error = match f.optional("on_error", &non_empty)?.as_deref() {
        None | Some("halt") => OnError::Halt,
        Some("skip") => OnError::Skip,
        Some("dead_letter") => OnError::DeadLetter,
        Some(other) => {
            return Err(ctx.err(
                &f.field_path("on_error"),
                format!("unknown policy `{other}`; expected halt, skip or dead_letter"),
            ));
        }
    };
    let dead_letter = match f.optional("dead_letter", &non_empty)? {
        Some(p) => base_dir.join(p),
        None => base_dir.join(format!("{file_stem}.deadletter.jsonl")),
    };
    let batch_size = f
        .optional("batch_size", &positive::<usize>(100_000))?
        .unwrap_or(1000);
    Ok(TransformSpec {
        module,
        module_label,
        config,
        limits,
        on_error,
        dead_letter,
        batch_size,
    })
}

/// `config:`: a flat map of strings (numbers and booleans are taken as written, since a
/// component only sees strings).
fn config_map(ctx: &Ctx<'_>, value: &Value, path: &str) -> Result<Vec<(String, String)>> {
    let Value::Mapping(map) = value else {
        return Err(ctx.err(
            path,
            format!("expected a mapping of strings, found {}", kind(value)),
        ));
    };
    let mut out = Vec::with_capacity(map.len());
    for (k, v) in map {
        let key = key_text(k);
        let text = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            other => {
                return Err(ctx.err(
                    &child_key(path, &key),
                    format!(
                        "expected a string, found {}; a transform's config values are strings",
                        kind(other)
                    ),
                ));
            }
        };
        out.push((key, text));
    }
    Ok(out)
}

fn parse_limits(ctx: &Ctx<'_>, value: &Value, path: &str) -> Result<TransformLimits> {
    let f = Fields::new(ctx, value, path, "limits `{ memory, timeout, output }`")?;
    f.deny_unknown(&["memory", "timeout", "output"])?;
    let d = TransformLimits::default();
    let limits = TransformLimits {
        memory: f.optional("memory", &size)?.unwrap_or(d.memory),
        timeout: f.optional("timeout", &duration)?.unwrap_or(d.timeout),
        output: f.optional("output", &size)?.unwrap_or(d.output),
    };
    if limits.memory < 1 << 20 {
        return Err(ctx.err(
            &f.field_path("memory"),
            "must be at least 1MiB (a component's stack and data need a few pages)",
        ));
    }
    if limits.memory > 4 << 30 {
        return Err(ctx.err(
            &f.field_path("memory"),
            "must be at most 4GiB (32-bit WebAssembly memories cannot grow further)",
        ));
    }
    if limits.output > MAX_OUTPUT {
        return Err(ctx.err(
            &f.field_path("output"),
            format!(
                "must be at most 4GiB, found {} bytes (a component's memory is 32-bit: it \
                 cannot hand over more in one list, and spans cannot address more)",
                limits.output
            ),
        ));
    }
    Ok(limits)
}

/// A byte size: `64MiB`, `512KiB`, `1GiB`, `1MB`, or a plain number of bytes.
pub(super) fn size(ctx: &Ctx<'_>, path: &str, value: &Value) -> Result<u64> {
    let parsed = match value {
        Value::Number(n) => n.as_u64().ok_or_else(|| format!("invalid size {n}")),
        Value::String(s) => parse_size(s),
        other => Err(format!(
            "expected a size such as \"64MiB\", found {}",
            kind(other)
        )),
    };
    match parsed {
        Ok(0) => Err(ctx.err(path, "must be greater than zero")),
        Ok(n) => Ok(n),
        Err(msg) => Err(ctx.err(path, msg)),
    }
}

pub(crate) fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let s = text.trim();
    let bad = || {
        format!(
            "invalid size `{s}`: expected a whole number and a unit (B, KiB, MiB, GiB, KB, MB, GB), e.g. \"64MiB\""
        )
    };
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return Err(bad()),
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("size `{s}` is too large"))
}

/// Where relative transform paths start: the pipeline file's directory (the current
/// directory for a bare file name).
pub(crate) fn base_dir(file_label: &str) -> PathBuf {
    match Path::new(file_label).parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The pipeline file's name without its extension, for the default dead-letter file.
pub(crate) fn file_stem(file_label: &str) -> String {
    Path::new(file_label)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "pipeline".to_owned())
}

#[cfg(test)]
mod tests {
    use super::super::locate::LineIndex;
    use super::*;

    fn parse(yaml: &str) -> std::result::Result<TransformSpec, String> {
        let index = LineIndex::build(yaml);
        let ctx = Ctx {
            file: "dir/p.yaml",
            index: &index,
        };
        let value: Value = serde_yaml::from_str(yaml).unwrap();
        parse_transform(&ctx, &value["t"], "t", Path::new("dir"), "p").map_err(|e| e.to_string())
    }

    #[test]
    fn full_and_default_forms() {
        let t = parse(
            "t:\n  module: ./m.wasm\n  config: { column: email, n: 3, on: true }\n  \
             limits: { memory: 32MiB, timeout: 200ms, output: 1MB }\n  on_error: dead_letter\n  \
             dead_letter: dl/x.jsonl\n  batch_size: 50\n",
        )
        .unwrap();
        assert_eq!(t.module, Path::new("dir/./m.wasm"));
        assert_eq!(t.module_label, "./m.wasm");
        assert_eq!(
            t.config,
            [
                ("column".to_owned(), "email".to_owned()),
                ("n".to_owned(), "3".to_owned()),
                ("on".to_owned(), "true".to_owned())
            ]
        );
        assert_eq!(
            t.limits,
            TransformLimits {
                memory: 32 << 20,
                timeout: Duration::from_millis(200),
                output: 1_000_000
            }
        );
        assert_eq!(t.on_error, OnError::DeadLetter);
        assert_eq!(t.dead_letter, Path::new("dir/dl/x.jsonl"));
        assert_eq!(t.batch_size, 50);

        let t = parse("t:\n  module: /abs/m.wasm\n").unwrap();
        assert_eq!(t.module, Path::new("/abs/m.wasm"));
        assert_eq!(t.limits, TransformLimits::default());
        assert_eq!(t.on_error, OnError::Halt);
        assert_eq!(t.dead_letter, Path::new("dir/p.deadletter.jsonl"));
        assert_eq!(t.batch_size, 1000);
        assert!(t.config.is_empty());
    }

    #[test]
    fn errors_are_located() {
        let cases = [
            (
                "t:\n  config: {}\n",
                "dir/p.yaml:1: t.module: required field is missing",
            ),
            (
                "t:\n  module: m.wasm\n  on_error: retry\n",
                "dir/p.yaml:3: t.on_error: unknown policy `retry`; expected halt, skip or dead_letter",
            ),
            (
                "t:\n  module: m.wasm\n  limits:\n    memory: 64 MB\n    cpu: 1\n",
                "dir/p.yaml:5: t.limits.cpu: unknown field `cpu`; expected one of: memory, timeout, output",
            ),
            (
                "t:\n  module: m.wasm\n  limits: { memory: 64mb }\n",
                "dir/p.yaml:3: t.limits.memory: invalid size `64mb`: expected a whole number and a \
                 unit (B, KiB, MiB, GiB, KB, MB, GB), e.g. \"64MiB\"",
            ),
            (
                "t:\n  module: m.wasm\n  limits: { memory: 1KiB }\n",
                "dir/p.yaml:3: t.limits.memory: must be at least 1MiB (a component's stack and data \
                 need a few pages)",
            ),
            (
                "t:\n  module: m.wasm\n  limits: { output: 5GiB }\n",
                "dir/p.yaml:3: t.limits.output: must be at most 4GiB, found 5368709120 bytes (a \
                 component's memory is 32-bit: it cannot hand over more in one list, and spans \
                 cannot address more)",
            ),
            (
                "t:\n  module: m.wasm\n  limits: { timeout: 200 }\n",
                "dir/p.yaml:3: t.limits.timeout: a duration needs a unit: write \"200s\" or \"200ms\" \
                 (units: ms, s, m, h)",
            ),
            (
                "t:\n  module: m.wasm\n  config:\n    cols: [a, b]\n",
                "dir/p.yaml:4: t.config.cols: expected a string, found a list; a transform's config \
                 values are strings",
            ),
            (
                "t:\n  module: m.wasm\n  config: x\n",
                "dir/p.yaml:3: t.config: expected a mapping of strings, found a string",
            ),
            (
                "t:\n  module: m.wasm\n  batch_size: 0\n",
                "dir/p.yaml:3: t.batch_size: must be between 1 and 100000, found 0",
            ),
            (
                "t: m.wasm\n",
                "dir/p.yaml:1: t: expected a transform `{ module, config, limits, on_error }` (a \
                 mapping), found a string",
            ),
        ];
        for (yaml, want) in cases {
            assert_eq!(parse(yaml).unwrap_err(), want, "{yaml}");
        }
    }

    #[test]
    fn output_limit_reaches_what_a_guest_can_hand_over() {
        let t = parse("t:\n  module: m.wasm\n  limits: { output: 4GiB }\n").unwrap();
        assert_eq!(t.limits.output, MAX_OUTPUT);
        assert!(
            parse("t:\n  module: m.wasm\n  limits: { output: 4294967297 }\n")
                .unwrap_err()
                .contains("must be at most 4GiB, found 4294967297 bytes")
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("512 KiB"), Ok(512 << 10));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("1.5MiB").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(
            parse_size("99999999999999GiB")
                .unwrap_err()
                .contains("too large")
        );
    }

    #[test]
    fn base_dir_and_stem() {
        assert_eq!(base_dir("conf/orders.yaml"), Path::new("conf"));
        assert_eq!(base_dir("orders.yaml"), Path::new("."));
        assert_eq!(file_stem("conf/orders.yaml"), "orders");
        assert_eq!(file_stem(""), "pipeline");
    }
}
