//! The reports that `agent-send` and the HTTP API both give, built from the daemon's files
//! (SPEC §10.1, §10.2): spend per model (`cost`), the open sessions (`sessions`) and one
//! session's conversation (`history`). Read-only, so they work while the daemon is stopped;
//! the JSON of each report is the body of its `GET /api/v1/…` endpoint.
//!
//! Everything here is blocking: the cli calls it directly, the daemon's HTTP backend on a
//! blocking thread. Printing stays in `cli/`.

pub mod cost;
pub mod history;
pub mod sessions;

use std::io;
use std::path::Path;

use crate::session::index;
use crate::store::StoreError;

/// Why a report could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The session key or id asked for cannot name a session (a path or glob).
    #[error("{0}")]
    InvalidTarget(String),
    /// The session asked for does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A file could not be read; `what` names the file and the operation.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// The cost database could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ReportError {
    /// An I/O error with a description of what was being done, e.g. `read /x/sessions.json`.
    pub fn io(what: impl Into<String>, source: io::Error) -> ReportError {
        ReportError::Io {
            what: what.into(),
            source,
        }
    }
}

/// Read `sessions.json` of `sessions_dir` (missing = empty). A corrupt index is an error: its
/// message already names the file.
pub fn read_index(sessions_dir: &Path) -> Result<index::Index, ReportError> {
    index::read_index(sessions_dir).map_err(|e| {
        let what = if e.kind() == io::ErrorKind::InvalidData {
            "read the session index".to_string()
        } else {
            format!("read {}", sessions_dir.join(index::INDEX_FILE).display())
        };
        ReportError::io(what, e)
    })
}
