//! The dead-letter file: one JSON line per change a transform failed on, with the reason,
//! written durably before the pipeline moves past the change.
//!
//! ```json
//! {"at_ms":1718000000000,"route":"orders-db","module":"./mask.wasm",
//!  "reason":"timed out after 200ms (limits.timeout)","change":{...}}
//! ```
//!
//! `change` is in the format of [`super::json`], so `zipline transform test --input` can replay
//! dead letters (take the `change` member of each line, e.g. with `jq -c .change`). The file is
//! opened for appending on first use, and [`DeadLetter::sync`] (called once per batch, before
//! the batch's outputs are dispatched) makes the lines durable with `fdatasync`: the changes
//! are dropped from the stream, so the frontier may move past them only once they are on disk.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::json::change_to_json;
use crate::change::Change;

#[derive(Debug)]
pub(crate) struct DeadLetter {
    path: PathBuf,
    file: Option<File>,
    dirty: bool,
}

impl DeadLetter {
    pub(crate) fn new(path: &Path) -> Self {
        DeadLetter {
            path: path.to_path_buf(),
            file: None,
            dirty: false,
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record (not yet durable: see [`DeadLetter::sync`]).
    pub(crate) fn append(
        &mut self,
        route: &str,
        module: &str,
        change: &Change,
        reason: &str,
    ) -> std::io::Result<()> {
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let record = json!({
            "at_ms": at_ms,
            "route": route,
            "module": module,
            "reason": reason,
            "change": change_to_json(change),
        });
        let mut line = record.to_string();
        line.push('\n');
        let file = match &mut self.file {
            Some(f) => f,
            None => {
                let created = !self.path.exists();
                let f = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&self.path)?;
                if created {
                    // The new directory entry must survive a crash too.
                    if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                        File::open(dir)?.sync_all()?;
                    }
                }
                self.file.insert(f)
            }
        };
        // One write per record: with O_APPEND, lines of concurrent writers do not interleave.
        file.write_all(line.as_bytes())?;
        self.dirty = true;
        Ok(())
    }

    /// Makes every appended record durable.
    pub(crate) fn sync(&mut self) -> std::io::Result<()> {
        if let (true, Some(f)) = (self.dirty, &self.file) {
            f.sync_data()?;
            self.dirty = false;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::bindings::tests::{insert, users};

    #[test]
    fn records_are_appended_as_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.deadletter.jsonl");
        let mut dl = DeadLetter::new(&path);
        dl.sync().unwrap();
        assert!(!path.exists(), "nothing written, nothing created");
        let t = users();
        dl.append("r", "m.wasm", &insert(&t, 1, 5, "a@b"), "boom")
            .unwrap();
        dl.append("r", "m.wasm", &insert(&t, 2, 6, "c@d"), "bang")
            .unwrap();
        dl.sync().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["reason"], "boom");
        assert_eq!(lines[1]["route"], "r");
        assert_eq!(lines[1]["change"]["values"][1], "c@d");
        let mut tables = Vec::new();
        let c = crate::transform::json::change_from_json(
            &lines[0]["change"].to_string(),
            1,
            &mut tables,
        )
        .unwrap();
        assert_eq!(c, insert(&t, 1, 5, "a@b"));
    }
}
