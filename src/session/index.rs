//! `sessions.json`: session key → `{session_id, created_at}` (SPEC §7), written atomically.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

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
    let bytes = serde_json::to_vec_pretty(index).map_err(io::Error::other)?;
    crate::fsutil::atomic_write(&dir.join(INDEX_FILE), &bytes)
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
