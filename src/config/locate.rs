//! Field path → line index, so semantic errors can say where a field is.
//!
//! serde_yaml's `Value` tree keeps no positions, and the checks that need them (interpolation,
//! secrets, cross-references) run on that tree after parsing. So the raw text is parsed a second
//! time with yaml-rust2's marked event parser, and each node's path (`connectors[0].slot_name`,
//! `routes[1].to[0]`) is recorded with its 1-based line. A mapping entry is located at its key, a
//! sequence item at its first token. Paths use the same spelling as [`super::fields`] builds,
//! so lookups match exactly; a path that is absent (a missing field) falls back to its nearest
//! recorded ancestor, i.e. the mapping that should have contained it.

use std::collections::{HashMap, HashSet};

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// Field path → 1-based line of the first document in a YAML text.
#[derive(Debug, Default)]
pub(crate) struct LineIndex {
    lines: HashMap<String, usize>,
    duplicate: Option<Duplicate>,
}

/// The first mapping key that appears twice in its mapping. serde_yaml rejects these too, but
/// locates the error at the start of the mapping rather than at the repeated key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Duplicate {
    /// Path of the repeated key, e.g. `connectors[0].name`.
    pub(crate) path: String,
    /// Line of the repetition.
    pub(crate) line: usize,
    /// Line of the first occurrence.
    pub(crate) first_line: usize,
}

impl LineIndex {
    /// Indexes `text`. Text that yaml-rust2 cannot parse yields a partial index; syntax errors
    /// are reported from serde_yaml's parse instead, which runs first.
    pub(crate) fn build(text: &str) -> Self {
        let mut builder = Builder::default();
        // A scan error only truncates the index: events already seen stay recorded.
        let _ = Parser::new_from_str(text).load(&mut builder, false);
        LineIndex {
            lines: builder.lines,
            duplicate: builder.duplicate,
        }
    }

    /// The first repeated mapping key, if any.
    pub(crate) fn duplicate(&self) -> Option<&Duplicate> {
        self.duplicate.as_ref()
    }

    /// The line of `path`, or of its nearest recorded ancestor.
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

enum Frame {
    Map {
        path: String,
        /// `Some(key)` while the value of `key` is pending; `None` while a key is expected.
        key: Option<String>,
        /// Scalar keys seen so far, to spot repetitions.
        seen: HashSet<String>,
    },
    Seq {
        path: String,
        next: usize,
    },
}

#[derive(Default)]
struct Builder {
    lines: HashMap<String, usize>,
    duplicate: Option<Duplicate>,
    stack: Vec<Frame>,
    /// Only the first document is indexed; serde_yaml rejects streams with more.
    done: bool,
}

/// Stands in for keys that are themselves mappings or sequences (legal YAML, never valid
/// Zipline configuration); their contents get paths nobody looks up.
const COMPLEX_KEY: &str = "<complex key>";

impl Builder {
    /// Path of a node starting now; records its line unless the node is a mapping key.
    /// Returns `None` when the node is a key (scalar keys are handled by the caller).
    fn start_node(&mut self, line: usize) -> Option<String> {
        let path = match self.stack.last_mut() {
            None => String::new(),
            Some(Frame::Map { key: None, .. }) => return None,
            // The entry was already located at its key's line.
            Some(Frame::Map {
                path,
                key: Some(key),
                ..
            }) => return Some(child_key(path, key)),
            Some(Frame::Seq { path, next }) => child_index(path, *next),
        };
        self.lines.entry(path.clone()).or_insert(line);
        Some(path)
    }

    /// A node (scalar or collection) has finished inside the current frame.
    fn end_node(&mut self) {
        match self.stack.last_mut() {
            Some(Frame::Map { key, .. }) => {
                *key = match key.take() {
                    // A complex key just finished: its value comes next.
                    None => Some(COMPLEX_KEY.to_owned()),
                    Some(_) => None,
                }
            }
            Some(Frame::Seq { next, .. }) => *next += 1,
            None => self.done = true,
        }
    }

    fn start_collection(&mut self, line: usize, map: bool) {
        let path = self.start_node(line).unwrap_or_else(|| {
            let parent = match self.stack.last() {
                Some(Frame::Map { path, .. } | Frame::Seq { path, .. }) => path.as_str(),
                None => "",
            };
            child_key(parent, COMPLEX_KEY)
        });
        self.stack.push(if map {
            Frame::Map {
                path,
                key: None,
                seen: HashSet::new(),
            }
        } else {
            Frame::Seq { path, next: 0 }
        });
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        if self.done {
            return;
        }
        let line = mark.line();
        match ev {
            Event::Scalar(text, ..) => {
                if let Some(Frame::Map {
                    path,
                    key: key @ None,
                    seen,
                }) = self.stack.last_mut()
                {
                    let entry = child_key(path, &text);
                    if !seen.insert(text.clone()) && self.duplicate.is_none() {
                        self.duplicate = Some(Duplicate {
                            first_line: self.lines.get(&entry).copied().unwrap_or(line),
                            path: entry.clone(),
                            line,
                        });
                    }
                    self.lines.entry(entry).or_insert(line);
                    *key = Some(text);
                } else {
                    self.start_node(line);
                    self.end_node();
                }
            }
            Event::Alias(_) => {
                if let Some(Frame::Map {
                    key: key @ None, ..
                }) = self.stack.last_mut()
                {
                    *key = Some(COMPLEX_KEY.to_owned());
                } else {
                    self.start_node(line);
                    self.end_node();
                }
            }
            Event::MappingStart(..) => self.start_collection(line, true),
            Event::SequenceStart(..) => self.start_collection(line, false),
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
                self.end_node();
            }
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => {}
        }
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

    #[test]
    fn records_keys_and_items() {
        let idx = LineIndex::build(TEXT);
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
        let idx = LineIndex::build(TEXT);
        assert_eq!(idx.line("connectors[1].host"), Some(8));
        assert_eq!(idx.line("connectors[0].secret_refs[0].nope"), Some(6));
        assert_eq!(idx.line("routes[3].from"), Some(10));
        assert_eq!(idx.line("nope"), Some(1));
    }

    #[test]
    fn complex_keys_and_aliases_keep_later_paths_right() {
        let text = "a: &x 1\n? [k1, k2]\n: v\nb: *x\nc:\n  d: 2\n";
        let idx = LineIndex::build(text);
        assert_eq!(idx.line("a"), Some(1));
        assert_eq!(idx.line("b"), Some(4));
        assert_eq!(idx.line("c.d"), Some(6));
    }

    #[test]
    fn only_the_first_document_is_indexed() {
        let idx = LineIndex::build("a: 1\n---\nb: 2\n");
        assert_eq!(idx.line("a"), Some(1));
        assert_eq!(idx.lines.get("b"), None);
    }

    #[test]
    fn first_duplicate_key_is_located() {
        let idx = LineIndex::build("a: 1\nb:\n  - x: 1\n    y: 2\n    x: 3\na: 4\n");
        assert_eq!(
            idx.duplicate(),
            Some(&Duplicate {
                path: "b[0].x".to_owned(),
                line: 5,
                first_line: 3,
            })
        );
        assert_eq!(LineIndex::build(TEXT).duplicate(), None);
    }

    #[test]
    fn parent_paths() {
        assert_eq!(parent("a.b[2]"), "a.b");
        assert_eq!(parent("a.b"), "a");
        assert_eq!(parent("a"), "");
        assert_eq!(parent("a[0].b"), "a[0]");
    }
}
