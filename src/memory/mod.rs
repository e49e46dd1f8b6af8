//! Long-term memory (SPEC §13): `memory.db` with the workspace index (files, line-based chunks,
//! FTS5, embeddings), hybrid search, structured memory (facts, episodes, commitments, aliases),
//! consolidation and recall.
//!
//! [`MemoryDb`] is the only owner of the `memory.db` connection: like `agentd.db` it is served
//! by one dedicated thread (the store's actor), so async code never blocks on SQLite.
//! [`Memory`] bundles the database with the config, the workspace and the optional embeddings
//! model: it is what tools, the indexer and the agent loop hold.

pub mod embed;
pub mod fts;
pub mod search;

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use rusqlite::{Connection, OpenFlags};
use rusqlite_migration::{M, MigrationDefinitionError, Migrations};

use crate::config::MemoryConfig;
use crate::store::actor::Actor;
use crate::store::{Db, StoreError};

/// Name of the memory DB thread.
const THREAD_NAME: &str = "agentd-memdb";

/// Schema migrations of `memory.db` (version in `PRAGMA user_version`). Append, never edit.
pub(crate) static MIGRATIONS: LazyLock<Migrations<'static>> =
    LazyLock::new(|| Migrations::new(vec![M::up(include_str!("migrations/0001_memory.sql"))]));

/// Errors of the memory subsystem.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The embeddings endpoint failed (the message names the model and the cause).
    #[error("embeddings: {0}")]
    Embed(String),
    /// Workspace I/O (the message names the path).
    #[error("{0}")]
    Io(String),
    /// Another `agentd index` run holds the lock.
    #[error("{0}")]
    Busy(String),
    /// Bad input from a tool call or the CLI (the message says what to fix).
    #[error("{0}")]
    Invalid(String),
}

/// Handle to `memory.db`. Clone freely; all clones share one connection and one thread.
#[derive(Clone)]
pub struct MemoryDb {
    actor: Actor,
}

impl std::fmt::Debug for MemoryDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryDb")
            .field("path", &self.path())
            .finish()
    }
}

impl MemoryDb {
    /// Create or open `memory.db` (mode 0600, WAL, `synchronous=NORMAL`) and migrate it.
    /// Blocking: call at start-up or from `spawn_blocking`.
    pub fn open(path: &Path) -> Result<MemoryDb, StoreError> {
        crate::store::create_private_file(path)?;
        let mut conn =
            Connection::open(path).map_err(|source| crate::store::open_err(path, source))?;
        crate::store::configure_writer(&conn)
            .map_err(|source| crate::store::open_err(path, source))?;
        MIGRATIONS
            .to_latest(&mut conn)
            .map_err(|source| match source {
                rusqlite_migration::Error::MigrationDefinition(
                    MigrationDefinitionError::DatabaseTooFarAhead,
                ) => StoreError::TooNew {
                    path: path.to_path_buf(),
                },
                source => StoreError::Migrate {
                    path: path.to_path_buf(),
                    source,
                },
            })?;
        let (actor, _detached) = Actor::spawn(conn, path, THREAD_NAME)?;
        Ok(MemoryDb { actor })
    }

    /// Open read-only (CLI views such as `agentd index --status` while the daemon runs).
    /// `Ok(None)` when the file does not exist or has no schema yet.
    pub fn open_read_only(path: &Path) -> Result<Option<MemoryDb>, StoreError> {
        if !path.exists() {
            return Ok(None);
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags)
            .map_err(|source| crate::store::open_err(path, source))?;
        conn.busy_timeout(crate::store::BUSY_TIMEOUT)
            .map_err(|source| crate::store::open_err(path, source))?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(|source| crate::store::open_err(path, source))?;
        if version == 0 {
            return Ok(None);
        }
        let (actor, _detached) = Actor::spawn(conn, path, THREAD_NAME)?;
        Ok(Some(MemoryDb { actor }))
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.actor.path()
    }

    /// Run `f` on the DB thread (for the memory submodules; keep each job short).
    pub(crate) async fn call<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&mut Connection) -> rusqlite::Result<R> + Send + 'static,
        R: Send + 'static,
    {
        self.actor.call(f).await
    }
}

/// The memory service: database, config, workspace and (when configured) the embeddings model.
/// Cheap to clone.
#[derive(Clone, Debug)]
pub struct Memory {
    pub db: MemoryDb,
    pub cfg: MemoryConfig,
    /// Absolute workspace directory (index globs resolve against it).
    pub workspace: PathBuf,
    /// `None` = FTS-only search.
    pub embedder: Option<Arc<embed::Embedder>>,
    /// The cost ledger (`embedding` and `consolidation` rows); `None` in CLI/test use without one.
    pub costs: Option<Db>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_valid() {
        MIGRATIONS.validate().expect("memory migrations validate");
    }

    #[tokio::test]
    async fn open_creates_every_spec_table() {
        let dir = tempfile::tempdir().unwrap();
        let db = MemoryDb::open(&dir.path().join("memory.db")).unwrap();
        let names: Vec<String> = db
            .call(|c| {
                let mut st = c.prepare("SELECT name FROM sqlite_master WHERE type = 'table'")?;
                st.query_map([], |r| r.get(0))?.collect()
            })
            .await
            .unwrap();
        for t in [
            "files",
            "chunks",
            "chunks_fts",
            "embedding_cache",
            "facts",
            "episodes",
            "commitments",
            "entity_aliases",
            "consolidation_state",
            "consolidation_file_hashes",
        ] {
            assert!(names.iter().any(|n| n == t), "missing table {t}: {names:?}");
        }
    }
}
