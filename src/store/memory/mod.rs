//! `memory.db` (SPEC §13): the workspace index (files, chunks, FTS5, embeddings), structured
//! memory (facts, episodes, commitments, aliases) and the consolidation watermarks.
//!
//! Like `agentd.db`, one dedicated thread (`agentd-memdb`) owns the connection; [`MemoryDb`] is
//! a cheap handle to it. Every query of memory.db is in this module and its files, typed: the
//! logic in `crate::memory` (chunking, ranking, embeddings, consolidation) never sees SQL.
//!
//! | File | Tables |
//! |---|---|
//! | `index.rs` | `files`, `chunks` (+ `chunks_fts` by triggers), `meta.index_generation` |
//! | `vectors.rs` | `embedding_cache`, chunk vectors for search |
//! | `search.rs` | full-text queries over chunks, facts and episodes |
//! | `facts.rs` | `facts`, `entity_aliases`, `episodes`, `commitments` |
//! | `consolidation.rs` | `consolidation_state`, `consolidation_file_hashes` |

mod consolidation;
mod facts;
mod index;
mod search;
mod vectors;

pub use consolidation::{Applied, Extraction};
pub use facts::{
    AliasWrite, Commitment, CommitmentStatus, Episode, Fact, FactWrite, MAX_ALIAS_WORDS,
    MAX_ALIASES, NewCommitment, NewEpisode, NewFact, alias_key,
};
pub use index::{ChunkRow, FileChange, FileMeta, IndexStatus, NewChunk, UnembeddedChunk};
pub use vectors::VectorSet;

use std::path::Path;
use std::sync::LazyLock;

use rusqlite_migration::{M, Migrations};

use super::StoreError;
use super::actor::Actor;

/// Name of the memory DB thread.
const THREAD_NAME: &str = "agentd-memdb";

/// Schema migrations of `memory.db` (version in `PRAGMA user_version`). Append, never edit a
/// shipped one.
pub(crate) static MIGRATIONS: LazyLock<Migrations<'static>> = LazyLock::new(|| {
    Migrations::new(vec![
        M::up(include_str!("migrations/0001_memory.sql")),
        M::up(include_str!("migrations/0002_embedding_windows.sql")),
        M::up_with_hook(
            include_str!("migrations/0003_alias_keys.sql"),
            facts::fill_alias_keys,
        ),
    ])
});

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
        let conn = super::open_writer(path, &MIGRATIONS)?;
        let (actor, _detached) = Actor::spawn(conn, path, THREAD_NAME)?;
        Ok(MemoryDb { actor })
    }

    /// Open read-only (CLI views such as `agentd index --status`). `Ok(None)` when the file does
    /// not exist or has no schema yet.
    pub fn open_read_only(path: &Path) -> Result<Option<MemoryDb>, StoreError> {
        let Some(conn) = super::open_reader(path)? else {
            return Ok(None);
        };
        let (actor, _detached) = Actor::spawn(conn, path, THREAD_NAME)?;
        Ok(Some(MemoryDb { actor }))
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.actor.path()
    }

    /// `PRAGMA quick_check` answered "ok" (for `agentd doctor`).
    pub async fn integrity_ok(&self) -> Result<bool, StoreError> {
        self.actor.call(super::quick_check).await
    }
}

/// Unix seconds now.
fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fresh memory.db in a temporary directory (kept alive by the returned guard).
    pub(crate) fn temp_db() -> (tempfile::TempDir, MemoryDb) {
        let dir = tempfile::tempdir().unwrap();
        let db = MemoryDb::open(&dir.path().join("memory.db")).unwrap();
        (dir, db)
    }

    #[test]
    fn migrations_are_valid() {
        MIGRATIONS.validate().expect("memory migrations validate");
    }

    /// Version 2 drops the vectors of chunks longer than one embedding window (made from their
    /// beginning only) and keeps every other cached embedding.
    #[test]
    fn migration_2_drops_only_vectors_of_long_chunks() {
        let mut c = rusqlite::Connection::open_in_memory().unwrap();
        MIGRATIONS.to_version(&mut c, 1).unwrap();
        let short = "s".repeat(700);
        let line = "l".repeat(99);
        let long = [line.as_str(); 9].join("\n");
        c.execute_batch(
            "INSERT INTO files (path, hash, size, mtime, indexed_at) VALUES ('notes/a.md', 'f', 1, 0, 0);",
        )
        .unwrap();
        for (id, hash, text) in [(1, "hs", &short), (2, "hl", &long)] {
            c.execute(
                "INSERT INTO chunks (id, path, start_line, end_line, hash, text) \
                 VALUES (?1, 'notes/a.md', 1, 1, ?2, ?3)",
                rusqlite::params![id, hash, text],
            )
            .unwrap();
        }
        for hash in ["hs", "hl", "query"] {
            c.execute(
                "INSERT INTO embedding_cache (model, hash, dims, embedding, created_at) \
                 VALUES ('m', ?1, 1, x'00000000', 0)",
                [hash],
            )
            .unwrap();
        }
        let generation = |c: &rusqlite::Connection| -> i64 {
            c.query_row(
                "SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'index_generation'",
                [],
                |r| r.get(0),
            )
            .unwrap()
        };
        let before = generation(&c);
        MIGRATIONS.to_latest(&mut c).unwrap();
        let mut st = c
            .prepare("SELECT hash FROM embedding_cache ORDER BY hash")
            .unwrap();
        let left: Vec<String> = st
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(left, vec!["hs", "query"]);
        assert!(generation(&c) > before);
        // The long chunk is one window no more: the code agrees with the migration.
        assert!(crate::memory::chunk::embed_windows("notes/a.md", &long).len() > 1);
        assert_eq!(
            crate::memory::chunk::embed_windows("notes/a.md", &short).len(),
            1
        );
    }

    /// Version 3 gives every existing alias its lookup key.
    #[test]
    fn migration_3_fills_the_alias_keys() {
        let mut c = rusqlite::Connection::open_in_memory().unwrap();
        MIGRATIONS.to_version(&mut c, 2).unwrap();
        c.execute_batch(
            "INSERT INTO entity_aliases (alias, entity, created_at) VALUES ('Mum', 'Anna', 0), \
             ('ÄRZTIN', 'Dr. Weber', 0);",
        )
        .unwrap();
        MIGRATIONS.to_latest(&mut c).unwrap();
        let mut st = c
            .prepare("SELECT name_key, entity FROM entity_aliases ORDER BY entity")
            .unwrap();
        let rows: Vec<(String, String)> = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            rows,
            [
                ("mum".to_string(), "Anna".to_string()),
                ("ärztin".to_string(), "Dr. Weber".to_string())
            ]
        );
    }

    #[tokio::test]
    async fn open_creates_every_spec_table() {
        let (_dir, db) = temp_db();
        let names: Vec<String> = db
            .actor
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
        assert!(db.integrity_ok().await.unwrap());
    }

    #[test]
    fn read_only_open_of_a_missing_file_is_none_and_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.db");
        assert!(MemoryDb::open_read_only(&path).unwrap().is_none());
        assert!(!path.exists());
    }
}
