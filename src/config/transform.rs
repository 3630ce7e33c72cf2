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
//! Loading only reads the fields; [`super::check_transforms`] (a step of its own, run by
//! `pipeline validate` and `apply`) has [`crate::transform::validate`] compile,
//! pre-instantiate and `init` the component, so a missing file, malformed wasm, the wrong
//! world, a missing export or a refused config is reported against `module` (or `config`)
//! like any other configuration error. Operator documentation: the README's
//! "Transforms" section and `docs/connectors/README.md` (routes).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::{Deserializer, Error as _, MapAccess, Visitor};

use super::values::{self, Scalar};

/// A route's transform, as configured.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(
    deny_unknown_fields,
    rename = "a transform `{ module, config, limits, on_error }`"
)]
pub struct TransformSpec {
    /// `module` as written in the file, for messages.
    #[serde(rename = "module", deserialize_with = "values::non_empty")]
    pub module_label: String,
    /// The component file, resolved against the pipeline file's directory.
    #[serde(skip)]
    pub module: PathBuf,
    /// The `config:` map handed to the component's `init`, in file order.
    #[serde(default, deserialize_with = "config_map")]
    pub config: Vec<(String, String)>,
    /// Resource limits per instance and call.
    #[serde(default)]
    pub limits: TransformLimits,
    /// What a failed change does to the pipeline.
    #[serde(default)]
    pub on_error: OnError,
    /// Where `on_error: dead_letter` appends refused changes (JSON lines); default
    /// `<pipeline file stem>.deadletter.jsonl` beside the pipeline file.
    #[serde(default, deserialize_with = "dead_letter")]
    pub dead_letter: PathBuf,
    /// Most changes handed to the component in one call. Default 1000.
    #[serde(default = "batch_size_default", deserialize_with = "batch_size")]
    pub batch_size: usize,
    /// The transform keeps rows by a predicate on their values (the SDKs' `filter`): the
    /// pipeline then refuses to start unless the source sends whole rows in updates of every
    /// table of the route (PostgreSQL: `REPLICA IDENTITY FULL`). Default false.
    #[serde(default)]
    pub row_filter: bool,
}

/// Limits applied to every instance of a transform.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(
    deny_unknown_fields,
    default,
    rename = "limits `{ memory, timeout, output }`"
)]
pub struct TransformLimits {
    /// Most linear memory one instance may grow to, in bytes. Default 64 MiB.
    #[serde(deserialize_with = "memory")]
    pub memory: u64,
    /// Longest one call (a batch) may run. Default 1s.
    #[serde(deserialize_with = "values::duration")]
    pub timeout: Duration,
    /// Most output one call may return, in bytes: both every byte copied out of the guest
    /// (each list and string of its output, checked before copying) and what its changes'
    /// values come to once resolved (plus a small per-value and per-change overhead). Default
    /// 16 MiB, at most [`MAX_OUTPUT`].
    #[serde(deserialize_with = "output")]
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

/// `on_error` of a route's transform or of a sink.
impl<'de> Deserialize<'de> for OnError {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        values::keyword(
            d,
            &[
                ("halt", OnError::Halt),
                ("skip", OnError::Skip),
                ("dead_letter", OnError::DeadLetter),
            ],
            "policy",
            "halt, skip or dead_letter",
        )
    }
}

/// Resolves `module` and `dead_letter` against the pipeline file's directory (`file_label`
/// as given to the loader); the dead-letter file defaults to `<file stem>.deadletter.jsonl`.
pub(crate) fn resolve_paths(spec: &mut TransformSpec, file_label: &str) {
    let base = base_dir(file_label);
    spec.module = base.join(&spec.module_label);
    spec.dead_letter = if spec.dead_letter.as_os_str().is_empty() {
        base.join(format!("{}.deadletter.jsonl", file_stem(file_label)))
    } else {
        base.join(&spec.dead_letter)
    };
}

fn batch_size_default() -> usize {
    1000
}

fn batch_size<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    values::ranged(d, 1, 100_000).map(|n| n as usize)
}

fn dead_letter<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
    values::non_empty(d).map(PathBuf::from)
}

/// `config:`: a flat map of strings (numbers and booleans are taken as written, since a
/// component only sees strings).
fn config_map<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, String)>, D::Error> {
    struct Map;
    impl<'de> Visitor<'de> for Map {
        type Value = Vec<(String, String)>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a mapping of strings")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some((key, ConfigText(text))) = map.next_entry::<String, ConfigText>()? {
                out.push((key, text));
            }
            Ok(out)
        }
    }
    d.deserialize_map(Map)
}

struct ConfigText(String);

impl<'de> Deserialize<'de> for ConfigText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Scalar::deserialize(d)? {
            Scalar::Str(s) => Ok(ConfigText(s)),
            Scalar::Int(n) => Ok(ConfigText(n.to_string())),
            Scalar::UInt(n) => Ok(ConfigText(n.to_string())),
            Scalar::Float(f) => Ok(ConfigText(f.to_string())),
            Scalar::Bool(b) => Ok(ConfigText(b.to_string())),
            other => Err(D::Error::custom(format_args!(
                "expected a string, found {}; a transform's config values are strings",
                other.kind()
            ))),
        }
    }
}

fn memory<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let memory = values::size(d)?;
    if memory < 1 << 20 {
        return Err(D::Error::custom(
            "must be at least 1MiB (a component's stack and data need a few pages)",
        ));
    }
    if memory > 4 << 30 {
        return Err(D::Error::custom(
            "must be at most 4GiB (32-bit WebAssembly memories cannot grow further)",
        ));
    }
    Ok(memory)
}

fn output<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let output = values::size(d)?;
    if output > MAX_OUTPUT {
        return Err(D::Error::custom(format_args!(
            "must be at most 4GiB, found {output} bytes (a component's memory is 32-bit: it \
             cannot hand over more in one list, and spans cannot address more)"
        )));
    }
    Ok(output)
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
    use super::super::deserializer::from_node;
    use super::super::tree::parse as parse_tree;
    use super::*;

    /// The transform at `t` of `yaml`, as in a pipeline file `dir/p.yaml`.
    fn parse(yaml: &str) -> std::result::Result<TransformSpec, String> {
        let root = parse_tree("dir/p.yaml", yaml).unwrap();
        let mut spec: TransformSpec =
            from_node("dir/p.yaml", root.get("t").unwrap()).map_err(|e| e.to_string())?;
        resolve_paths(&mut spec, "dir/p.yaml");
        Ok(spec)
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
    fn base_dir_and_stem() {
        assert_eq!(base_dir("conf/orders.yaml"), Path::new("conf"));
        assert_eq!(base_dir("orders.yaml"), Path::new("."));
        assert_eq!(file_stem("conf/orders.yaml"), "orders");
        assert_eq!(file_stem(""), "pipeline");
    }
}
