//! Local spill files for transactions the server streams before they commit.
//!
//! With pgoutput protocol version 2 and `streaming 'on'`, a transaction larger than the
//! server's `logical_decoding_work_mem` arrives in blocks (Stream Start … Stream Stop) while it
//! is still running, interleaved with other transactions, and ends with Stream Commit or
//! Stream Abort. Zipline must apply it only once it commits and leave no trace if it aborts,
//! with memory bounded however large it is: so each block's raw messages are appended to a
//! per-transaction file and replayed, in order, at Stream Commit.
//! <https://www.postgresql.org/docs/15/protocol-logical-replication.html#PROTOCOL-LOGICAL-REPLICATION-STREAMING>
//!
//! Quirks:
//! - Messages inside a block carry the xid of the *subtransaction* that made them; Stream
//!   Abort names the top-level xid and the aborted subtransaction. Aborting a subtransaction
//!   (ROLLBACK TO SAVEPOINT) discards everything it and its children wrote, which in the file
//!   is everything from its first message on: the file is truncated there, as PostgreSQL's own
//!   apply worker does with its spill files (`subxact_info_add`/`stream_abort` in
//!   `src/backend/replication/logical/worker.c`).
//! - After a reconnect the server streams unconfirmed transactions again from their start, so
//!   every open file is dropped.
//! - Several processes may share one spill directory (two pipelines of one name against other
//!   servers, or an instance being replaced): each keeps its files in a run directory of its
//!   own, holding an exclusive lock on its `lock` file while it lives. A run directory whose
//!   lock nobody holds was left by a crash and is removed at startup; the base directory's
//!   `.lock` serialises that sweep with the creation of run directories.
//!
//! File format: a sequence of records, each a big-endian u32 length then that many bytes (one
//! pgoutput message, exactly as received).

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;

const SUFFIX: &str = "spill";
const RUN_PREFIX: &str = "run-";

/// Whether a live process holds the run directory `dir` (a directory without a lock file is
/// one a crash interrupted while creating it: the sweep lock rules out a live creator).
fn in_use(dir: &Path) -> io::Result<bool> {
    let file = match File::open(dir.join("lock")) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    match file.try_lock() {
        Ok(()) => Ok(false),
        Err(fs::TryLockError::WouldBlock) => Ok(true),
        Err(fs::TryLockError::Error(e)) => Err(e),
    }
}

struct OpenFile {
    path: PathBuf,
    writer: BufWriter<File>,
    /// Bytes written so far (the offset of the next record).
    len: u64,
    /// Each subtransaction's first record offset, in file order.
    subxacts: Vec<(u32, u64)>,
    records: u64,
}

/// The spill files of the transactions currently being streamed.
pub(crate) struct Spill {
    /// This run's own directory (removed on drop).
    dir: PathBuf,
    /// Held locked while the run lives: the mark that `dir` is in use.
    _lock: File,
    open: HashMap<u32, OpenFile>,
}

impl std::fmt::Debug for Spill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spill")
            .field("dir", &self.dir)
            .field("open", &self.open.len())
            .finish()
    }
}

impl Spill {
    /// Use a run directory of this process's own under `base` (created if needed), removing
    /// the run directories crashed processes left behind.
    pub(crate) fn new(base: &Path) -> io::Result<Self> {
        fs::create_dir_all(base)?;
        let sweep = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(base.join(".lock"))?;
        sweep.lock()?;
        for entry in fs::read_dir(base)? {
            let path = entry?.path();
            let is_run = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(RUN_PREFIX));
            if is_run && path.is_dir() && !in_use(&path)? {
                fs::remove_dir_all(&path)?;
            }
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = base.join(format!("{RUN_PREFIX}{}-{nanos}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let lock = File::create(dir.join("lock"))?;
        lock.lock()?;
        sweep.unlock()?;
        Ok(Spill {
            dir,
            _lock: lock,
            open: HashMap::new(),
        })
    }

    /// Append one message of subtransaction `sub` of the streamed transaction `top`.
    pub(crate) fn append(&mut self, top: u32, sub: u32, message: &[u8]) -> io::Result<()> {
        let file = match self.open.get_mut(&top) {
            Some(f) => f,
            None => {
                let path = self.dir.join(format!("{top}.{SUFFIX}"));
                let handle = OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .read(true)
                    .write(true)
                    .open(&path)?;
                self.open.entry(top).or_insert(OpenFile {
                    path,
                    writer: BufWriter::with_capacity(256 * 1024, handle),
                    len: 0,
                    subxacts: Vec::new(),
                    records: 0,
                })
            }
        };
        if sub != top && !file.subxacts.iter().any(|&(x, _)| x == sub) {
            file.subxacts.push((sub, file.len));
        }
        let len = u32::try_from(message.len()).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidData, "a pgoutput message over 4 GiB")
        })?;
        file.writer.write_all(&len.to_be_bytes())?;
        file.writer.write_all(message)?;
        file.len += 4 + u64::from(len);
        file.records += 1;
        Ok(())
    }

    /// Stream Abort: drop the whole transaction, or cut a subtransaction and what followed it.
    pub(crate) fn abort(&mut self, top: u32, sub: u32) -> io::Result<()> {
        if sub == top {
            if let Some(file) = self.open.remove(&top) {
                drop(file.writer);
                fs::remove_file(&file.path)?;
            }
            return Ok(());
        }
        let Some(file) = self.open.get_mut(&top) else {
            return Ok(());
        };
        let Some(i) = file.subxacts.iter().position(|&(x, _)| x == sub) else {
            // The subtransaction wrote nothing we kept.
            return Ok(());
        };
        let offset = file.subxacts[i].1;
        file.subxacts.truncate(i);
        file.writer.flush()?;
        let handle = file.writer.get_mut();
        handle.set_len(offset)?;
        handle.seek(SeekFrom::Start(offset))?;
        file.len = offset;
        Ok(())
    }

    /// Stream Commit: the transaction's messages, in order, to replay. The file is removed
    /// when the reader is dropped.
    pub(crate) fn finish(&mut self, top: u32) -> io::Result<SpillReader> {
        let Some(file) = self.open.remove(&top) else {
            return Ok(SpillReader { inner: None });
        };
        let records = file.records;
        let mut handle = file
            .writer
            .into_inner()
            .map_err(io::IntoInnerError::into_error)?;
        handle.seek(SeekFrom::Start(0))?;
        tracing::debug!(
            xid = top,
            records,
            bytes = file.len,
            "replaying a streamed transaction"
        );
        Ok(SpillReader {
            inner: Some((
                BufReader::with_capacity(256 * 1024, handle.take(file.len)),
                file.path,
            )),
        })
    }

    /// Forget every open transaction (the stream broke; the server will send them again).
    pub(crate) fn reset(&mut self) -> io::Result<()> {
        for (_, file) in self.open.drain() {
            drop(file.writer);
            fs::remove_file(&file.path)?;
        }
        Ok(())
    }

    /// Streamed transactions currently open.
    #[cfg(test)]
    pub(crate) fn open_count(&self) -> usize {
        self.open.len()
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The messages of one committed streamed transaction.
pub(crate) struct SpillReader {
    inner: Option<(BufReader<io::Take<File>>, PathBuf)>,
}

impl SpillReader {
    /// The next message, or `None` at the end.
    pub(crate) fn next_message(&mut self) -> io::Result<Option<Bytes>> {
        let Some((reader, _)) = self.inner.as_mut() else {
            return Ok(None);
        };
        let mut len = [0u8; 4];
        match reader.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let mut buf = vec![0u8; u32::from_be_bytes(len) as usize];
        reader.read_exact(&mut buf)?;
        Ok(Some(Bytes::from(buf)))
    }
}

impl Drop for SpillReader {
    fn drop(&mut self) {
        if let Some((_, path)) = self.inner.take() {
            let _ = fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(mut r: SpillReader) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(m) = r.next_message().unwrap() {
            out.push(m.to_vec());
        }
        out
    }

    #[test]
    fn replays_in_order_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spill::new(dir.path()).unwrap();
        s.append(7, 7, b"a").unwrap();
        s.append(9, 9, b"other").unwrap();
        s.append(7, 7, b"bb").unwrap();
        let r = s.finish(7).unwrap();
        assert_eq!(read_all(r), vec![b"a".to_vec(), b"bb".to_vec()]);
        assert!(!s.dir.join("7.spill").exists());
        assert_eq!(s.open_count(), 1);
        s.reset().unwrap();
        assert!(!s.dir.join("9.spill").exists());
    }

    #[test]
    fn subtransaction_abort_cuts_it_and_what_followed() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spill::new(dir.path()).unwrap();
        s.append(10, 10, b"top-1").unwrap();
        s.append(10, 11, b"sub11-1").unwrap();
        s.append(10, 12, b"sub12-1").unwrap();
        s.append(10, 11, b"sub11-2").unwrap();
        // ROLLBACK TO SAVEPOINT for 12 (a nested savepoint after 11 began): 12 and later go.
        s.abort(10, 12).unwrap();
        s.append(10, 10, b"top-2").unwrap();
        s.abort(10, 99).unwrap();
        assert_eq!(
            read_all(s.finish(10).unwrap()),
            vec![b"top-1".to_vec(), b"sub11-1".to_vec(), b"top-2".to_vec()]
        );
    }

    #[test]
    fn whole_abort_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spill::new(dir.path()).unwrap();
        s.append(5, 5, b"x").unwrap();
        s.abort(5, 5).unwrap();
        assert!(!s.dir.join("5.spill").exists());
        assert!(read_all(s.finish(5).unwrap()).is_empty());
    }

    #[test]
    fn runs_sharing_a_directory_keep_apart_and_crashed_runs_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        // A crashed run: its directory is there, nobody holds its lock.
        let crashed = dir.path().join("run-1-2");
        std::fs::create_dir(&crashed).unwrap();
        std::fs::write(crashed.join("lock"), b"").unwrap();
        std::fs::write(crashed.join("3.spill"), b"stale").unwrap();
        let mut a = Spill::new(dir.path()).unwrap();
        assert!(!crashed.exists(), "a crashed run's files are swept");
        a.append(7, 7, b"from a").unwrap();
        // A second live run leaves the first one's files alone, the same xid included.
        let mut b = Spill::new(dir.path()).unwrap();
        assert_ne!(a.dir, b.dir);
        b.append(7, 7, b"from b").unwrap();
        assert_eq!(read_all(a.finish(7).unwrap()), vec![b"from a".to_vec()]);
        assert_eq!(read_all(b.finish(7).unwrap()), vec![b"from b".to_vec()]);
        let a_dir = a.dir.clone();
        drop(a);
        assert!(!a_dir.exists(), "a run removes its directory when it ends");
        assert!(b.dir.exists());
    }
}
