//! `sessions.json`: session key → `{session_id, created_at}` (SPEC §7), written atomically,
//! and [`IndexWriter`], which writes it off the intake path.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::latest_writer::LatestWriter;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexEntry {
    pub session_id: String,
    /// Unix seconds.
    pub created_at: i64,
}

pub type Index = BTreeMap<String, IndexEntry>;

pub const INDEX_FILE: &str = "sessions.json";

/// Read the index; a missing file is an empty index. A corrupt index is an error naming the
/// file (the daemon refuses to guess which sessions exist).
pub fn read_index(dir: &Path) -> io::Result<Index> {
    let p = dir.join(INDEX_FILE);
    match std::fs::read(&p) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: not a valid session index: {e}", p.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Index::new()),
        Err(e) => Err(e),
    }
}

pub fn write_index(dir: &Path, index: &Index) -> io::Result<()> {
    write_index_file(&dir.join(INDEX_FILE), index)
}

fn write_index_file(path: &Path, index: &Index) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(index).map_err(io::Error::other)?;
    crate::fsutil::atomic_write(path, &bytes)
}

/// One index handed to the writer; `version` orders the hand-overs.
struct Versioned {
    version: u64,
    index: Index,
}

/// The version last written (or tried) and how it went: an `io::Error` is not `Clone`, so the
/// kind and the text are kept.
type Outcome = Option<(u64, Result<(), (io::ErrorKind, String)>)>;

/// Writes `sessions.json` on one background thread (`agentd-index`, a [`LatestWriter`]): a new
/// session's first intake only updates the index in memory and hands it over, so it pays no
/// fsync for the index and no other session's intake waits behind one under the store lock.
/// The latest index wins: a burst of new sessions costs one write. The record of a session is
/// its trail's `session` event, fsynced before the intake is acknowledged; an index that a
/// crash kept from the disk is repaired from the trails at the next start
/// (`SessionStore::open`).
///
/// Hand-overs are numbered under one lock and the thread writes them in that order, so an
/// older index never replaces a newer one on disk, including one written for an archive
/// ([`IndexWriter::write_through`]).
pub struct IndexWriter {
    path: PathBuf,
    writer: LatestWriter<Versioned>,
    /// The last version handed over; held while handing over, so versions reach the queue in
    /// order.
    version: Mutex<u64>,
    outcome: Arc<Mutex<Outcome>>,
}

impl std::fmt::Debug for IndexWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexWriter")
            .field("path", &self.path)
            .finish()
    }
}

impl IndexWriter {
    /// A writer of `dir/sessions.json`. The thread starts with the first hand-over.
    pub fn new(dir: &Path) -> IndexWriter {
        let outcome: Arc<Mutex<Outcome>> = Arc::default();
        let recorded = outcome.clone();
        let writer = LatestWriter::new("agentd-index", move |path: &Path, v: &Versioned| {
            let result = write_index_file(path, &v.index);
            if let Err(e) = &result {
                tracing::warn!(
                    path = %path.display(),
                    error = %e,
                    "cannot write the session index; the session trails keep every session and the next start repairs the index"
                );
            }
            *recorded.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((v.version, result.map_err(|e| (e.kind(), e.to_string()))));
        });
        IndexWriter {
            path: dir.join(INDEX_FILE),
            writer,
            version: Mutex::new(0),
            outcome,
        }
    }

    /// Hand `index` over to be written and return at once; returns its version.
    pub fn submit(&self, index: Index) -> u64 {
        let mut last = self.version.lock().unwrap_or_else(|p| p.into_inner());
        *last += 1;
        let version = *last;
        self.writer
            .submit(self.path.clone(), Versioned { version, index });
        version
    }

    /// Hand `index` over and wait until it, or a newer index, is on disk (an archive removes an
    /// entry and must be durable before the session's files move). An index still queued is
    /// older and is replaced, never written after this one. The error of the write that
    /// covered this version, if it failed.
    pub fn write_through(&self, index: Index) -> io::Result<()> {
        let version = self.submit(index);
        self.writer.wait_for(&self.path);
        match &*self.outcome.lock().unwrap_or_else(|p| p.into_inner()) {
            Some((written, Ok(()))) if *written >= version => Ok(()),
            Some((written, Err((kind, text)))) if *written >= version => {
                Err(io::Error::new(*kind, text.clone()))
            }
            // Only reachable if the write was skipped: report it rather than move files.
            _ => Err(io::Error::other(format!(
                "{}: the session index was not written",
                self.path.display()
            ))),
        }
    }

    /// Blocks until every index handed over is written, or `timeout` passed (shutdown).
    pub fn flush(&self, timeout: Duration) {
        self.writer.flush(timeout);
    }
}

/// Find a session by key, or by id. Returns `(key, entry)`.
pub fn lookup<'a>(index: &'a Index, key_or_id: &str) -> Option<(&'a String, &'a IndexEntry)> {
    index
        .get_key_value(key_or_id)
        .or_else(|| index.iter().find(|(_, e)| e.session_id == key_or_id))
}

/// A session id is safe to use in a file name: uuid-like characters only.
pub fn is_valid_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}
