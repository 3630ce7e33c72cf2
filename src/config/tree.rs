//! The pipeline file as a located tree: every node knows its field path and line.
//!
//! serde-saphyr parses the text once into [`Spanned`] nodes (line and column of each node);
//! this module turns them into [`Node`]s named by the paths errors print
//! (`connectors[0].slot_name`, `routes[1].to[0]`). A mapping entry is located at its key, a
//! sequence item at its first token. `${VAR}` interpolation then runs on the tree, and the typed
//! model is deserialized from it (`deserializer`), so every error knows where it is.

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use super::error::ConfigError;

/// One YAML node, where it is and what it holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    /// The field path, e.g. `connectors[0].tables[1]`; empty for the document.
    pub(crate) path: String,
    /// 1-based line (of the key, for a mapping entry); 0 when unknown (an empty file).
    pub(crate) line: usize,
    pub(crate) value: Value,
}

/// A node's content. Mapping keys are kept as text, in file order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(String, Node)>),
}

impl Value {
    /// How a value's type is named in messages (never its content).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Value::Null => "nothing",
            Value::Bool(_) => "a boolean",
            Value::Int(_) | Value::UInt(_) | Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }
}

impl Node {
    /// The value of `key` in a mapping; an explicit null (`key:` or `key: ~`) counts as absent.
    pub(crate) fn get(&self, key: &str) -> Option<&Node> {
        match &self.value {
            Value::Map(entries) => entries
                .iter()
                .find(|(k, v)| k == key && v.value != Value::Null)
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The items of a sequence (empty for anything else).
    pub(crate) fn items(&self) -> &[Node] {
        match &self.value {
            Value::Seq(items) => items,
            _ => &[],
        }
    }
}

/// Joins a mapping key onto a path (`""` + `name` → `name`).
pub(crate) fn child_key(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Joins a sequence index onto a path.
pub(crate) fn child_index(path: &str, index: usize) -> String {
    format!("{path}[{index}]")
}

/// Parses `text` into a located tree. Syntax errors carry line and column; a key repeated in
/// its mapping is refused at the repetition.
pub(crate) fn parse(file: &str, text: &str) -> Result<Node, ConfigError> {
    let mut options = serde_saphyr::Options::default();
    // YAML 1.2 scalars: `on`, `no` and `y` are strings (they are transform config keys and
    // values), and `0755` or `1_000` stay as written.
    options.strict_booleans = true;
    options.leading_zero_numbers_as_strings = true;
    options.underscored_numbers_as_strings = true;
    // Repeated keys reach the tree, which reports them at the repetition with the first line.
    options.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::PassThrough;
    let raw: Spanned<Raw> =
        serde_saphyr::from_str_with_options(text, options).map_err(|e| syntax_error(file, &e))?;
    let mut builder = Builder { duplicate: None };
    let node = builder.node(raw, String::new(), None);
    match builder.duplicate {
        Some(d) => Err(ConfigError::new(
            file,
            Some(d.line),
            d.path,
            format!("duplicate key (first at line {})", d.first_line),
        )),
        None => Ok(node),
    }
}

/// A parser error, with its position moved out of the message into the prefix.
fn syntax_error(file: &str, e: &serde_saphyr::Error) -> ConfigError {
    let location = e.location().filter(|l| l.line() > 0);
    let (line, column) = match location {
        Some(l) => (
            usize::try_from(l.line()).ok(),
            usize::try_from(l.column()).ok(),
        ),
        None => (None, None),
    };
    let message = match e.without_snippet() {
        serde_saphyr::Error::MultipleDocuments { .. } => {
            "more than one document (`---`); a pipeline file holds one pipeline".to_owned()
        }
        other => {
            let mut options = serde_saphyr::RenderOptions::default();
            options.snippets = serde_saphyr::SnippetMode::Off;
            let mut text = other.render_with_options(options);
            if let Some(l) = location {
                let suffix = format!(" at line {}, column {}", l.line(), l.column());
                if let Some(at) = text.rfind(&suffix) {
                    text.replace_range(at..at + suffix.len(), "");
                }
            }
            text
        }
    };
    ConfigError::syntax(file, line, column, format!("invalid YAML: {message}"))
}

struct Duplicate {
    path: String,
    line: usize,
    first_line: usize,
}

struct Builder {
    /// The first key repeated in its mapping, in file order.
    duplicate: Option<Duplicate>,
}

impl Builder {
    /// `line` is the key's line for a mapping entry, `None` elsewhere (the node's own line).
    fn node(&mut self, raw: Spanned<Raw>, path: String, line: Option<usize>) -> Node {
        let own = usize::try_from(raw.referenced.line()).unwrap_or(0);
        let line = line.unwrap_or(own);
        let value = match raw.value {
            Raw::Null => Value::Null,
            Raw::Bool(b) => Value::Bool(b),
            Raw::Int(n) => Value::Int(n),
            Raw::UInt(n) => Value::UInt(n),
            Raw::Float(f) => Value::Float(f),
            Raw::Str(s) => Value::Str(s),
            Raw::Seq(items) => Value::Seq(
                items
                    .into_iter()
                    .enumerate()
                    .map(|(i, item)| self.node(item, child_index(&path, i), None))
                    .collect(),
            ),
            Raw::Map(entries) => {
                let mut out: Vec<(String, Node)> = Vec::with_capacity(entries.len());
                for (key, value) in entries {
                    let key_line = usize::try_from(key.referenced.line()).unwrap_or(0);
                    let text = key_text(&key.value);
                    let entry_path = child_key(&path, &text);
                    if self.duplicate.is_none()
                        && let Some((_, first)) = out.iter().find(|(k, _)| *k == text)
                    {
                        self.duplicate = Some(Duplicate {
                            path: entry_path.clone(),
                            line: key_line,
                            first_line: first.line,
                        });
                    }
                    let child = self.node(value, entry_path, Some(key_line));
                    out.push((text, child));
                }
                Value::Map(out)
            }
        };
        Node { path, line, value }
    }
}

/// How a mapping key is spelled in a field path.
fn key_text(key: &Raw) -> String {
    match key {
        Raw::Str(s) => s.clone(),
        Raw::Bool(b) => b.to_string(),
        Raw::Int(n) => n.to_string(),
        Raw::UInt(n) => n.to_string(),
        Raw::Float(f) => f.to_string(),
        Raw::Null => "~".to_owned(),
        // Legal YAML, never valid Zipline configuration.
        Raw::Seq(_) | Raw::Map(_) => "<complex key>".to_owned(),
    }
}

/// What serde-saphyr hands over: any YAML node, with the location of each child.
enum Raw {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Spanned<Raw>>),
    Map(Vec<(Spanned<Raw>, Spanned<Raw>)>),
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RawVisitor)
    }
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = Raw;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Raw, D::Error> {
        Raw::deserialize(d)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Raw, E> {
        Ok(Raw::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Raw, E> {
        Ok(Raw::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Raw, E> {
        Ok(Raw::UInt(v))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Raw, E> {
        Ok(Raw::Float(v as f64))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Raw, E> {
        Ok(Raw::Float(v as f64))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Raw, E> {
        Ok(Raw::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Raw, E> {
        Ok(Raw::Str(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Raw, E> {
        Ok(Raw::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Raw, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Raw::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Raw::Map(entries))
    }
}

/// What the checks after deserializing need to locate an error.
pub(crate) struct Ctx<'a> {
    pub(crate) file: &'a str,
    pub(crate) index: &'a LineIndex,
}

impl Ctx<'_> {
    /// An error at `path`, on the line of `path` or of its nearest existing ancestor.
    pub(crate) fn err(&self, path: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::new(self.file, self.index.line(path), path, message)
    }

    /// The line of `path`, for messages that point at a second place.
    pub(crate) fn line(&self, path: &str) -> usize {
        self.index.line(path).unwrap_or(0)
    }
}

/// Field path → 1-based line, for checks that run on the typed model after deserializing
/// (cross-references, secrets) and must still say where.
#[derive(Debug, Default)]
pub(crate) struct LineIndex {
    lines: HashMap<String, usize>,
}

impl LineIndex {
    pub(crate) fn build(root: &Node) -> Self {
        fn walk(node: &Node, lines: &mut HashMap<String, usize>) {
            if node.line > 0 {
                lines.insert(node.path.clone(), node.line);
            }
            match &node.value {
                Value::Seq(items) => items.iter().for_each(|n| walk(n, lines)),
                Value::Map(entries) => entries.iter().for_each(|(_, n)| walk(n, lines)),
                _ => {}
            }
        }
        let mut lines = HashMap::new();
        walk(root, &mut lines);
        LineIndex { lines }
    }

    /// The line of `path`, or of its nearest recorded ancestor (the mapping that should have
    /// held a missing field).
    pub(crate) fn line(&self, path: &str) -> Option<usize> {
        let mut path = path;
        loop {
            if let Some(&line) = self.lines.get(path) {
                return Some(line);
            }
            if path.is_empty() {
                return None;
            }
            path = parent(path);
        }
    }
}

/// `a.b[2]` → `a.b`, `a.b` → `a`, `a` → ``.
fn parent(path: &str) -> &str {
    if path.ends_with(']')
        && let Some(open) = path.rfind('[')
    {
        return &path[..open];
    }
    match path.rfind('.') {
        Some(dot) => &path[..dot],
        None => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
name: orders
connectors:
  - name: orders-db
    type: source/postgres
    secret_refs:
      - { field: password, ref: postgres-password }
  -
    name: mysql-out
    type: sink/mysql
routes:
  - from: orders-db
    to: [mysql-out,
      other]
settings:
  progress_interval: 5s
";

    fn index(text: &str) -> LineIndex {
        LineIndex::build(&parse("t.yaml", text).unwrap())
    }

    #[test]
    fn records_keys_and_items() {
        let idx = index(TEXT);
        assert_eq!(idx.line("name"), Some(1));
        assert_eq!(idx.line("connectors"), Some(2));
        assert_eq!(idx.line("connectors[0]"), Some(3));
        assert_eq!(idx.line("connectors[0].name"), Some(3));
        assert_eq!(idx.line("connectors[0].type"), Some(4));
        assert_eq!(idx.line("connectors[0].secret_refs[0].ref"), Some(6));
        assert_eq!(idx.line("connectors[1].name"), Some(8));
        assert_eq!(idx.line("connectors[1].type"), Some(9));
        assert_eq!(idx.line("routes[0].from"), Some(11));
        assert_eq!(idx.line("routes[0].to[0]"), Some(12));
        assert_eq!(idx.line("routes[0].to[1]"), Some(13));
        assert_eq!(idx.line("settings.progress_interval"), Some(15));
    }

    #[test]
    fn missing_paths_fall_back_to_the_enclosing_node() {
        let idx = index(TEXT);
        assert_eq!(idx.line("connectors[1].host"), Some(8));
        assert_eq!(idx.line("connectors[0].secret_refs[0].nope"), Some(6));
        assert_eq!(idx.line("routes[3].from"), Some(10));
        assert_eq!(idx.line("nope"), Some(1));
    }

    #[test]
    fn aliases_and_scalars_keep_their_yaml_1_2_meaning() {
        let root = parse(
            "t.yaml",
            "a: &x 1\nb: *x\non: yes\nn: 0755\nm: 1_000\nc:\n  d: 2\n",
        )
        .unwrap();
        let idx = LineIndex::build(&root);
        assert_eq!(idx.line("b"), Some(2));
        assert_eq!(idx.line("c.d"), Some(7));
        assert!(matches!(
            root.get("b").unwrap().value,
            Value::Int(1) | Value::UInt(1)
        ));
        assert_eq!(root.get("on").unwrap().value, Value::Str("yes".into()));
        assert_eq!(root.get("n").unwrap().value, Value::Str("0755".into()));
        assert_eq!(root.get("m").unwrap().value, Value::Str("1_000".into()));
    }

    #[test]
    fn first_duplicate_key_is_located() {
        let e = parse("t.yaml", "a: 1\nb:\n  - x: 1\n    y: 2\n    x: 3\na: 4\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.yaml:5: b[0].x: duplicate key (first at line 3)"
        );
    }

    #[test]
    fn syntax_errors_have_line_and_column() {
        let e = parse("t.yaml", "name: a\n  bad: [\n").unwrap_err();
        assert_eq!((e.line(), e.column()), (Some(2), Some(6)));
        assert!(e.message().starts_with("invalid YAML: "), "{e}");
        assert!(!e.message().contains("at line"), "{e}");
        let e = parse("t.yaml", "a: 1\n---\nb: 2\n").unwrap_err();
        assert!(e.message().contains("more than one document"), "{e}");
    }

    #[test]
    fn parent_paths() {
        assert_eq!(parent("a.b[2]"), "a.b");
        assert_eq!(parent("a.b"), "a");
        assert_eq!(parent("a"), "");
        assert_eq!(parent("a[0].b"), "a[0]");
    }
}
