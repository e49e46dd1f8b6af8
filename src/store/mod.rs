//! SQLite storage for `agentd.db` (SPEC §2, §8): the cost ledger and small key-value state.
//!
//! This is the only module that owns a `rusqlite::Connection` (DESIGN §2.1). A [`Db`] is a
//! cheap, cloneable handle to an actor: one OS thread named `agentd-db` owns the connection and
//! runs the queries, so async code never blocks a tokio worker on SQLite. The thread ends when
//! the last handle is dropped.
//!
//! - [`Db::open`] is the daemon's writer: WAL, `synchronous=NORMAL` (a cost row lost to a power
//!   cut is acceptable; none is lost to a crash), foreign keys on, 5 s busy timeout, migrations.
//! - [`Db::open_read_only`] serves CLI queries (`agent-send --cost`) while the daemon may be
//!   running: no migrations, no writes.

pub(crate) mod actor;
pub mod backup;
mod costs;
mod kv;
pub mod memory;
mod scheduled;
pub use scheduled::{ScheduleInsert, Scheduled, parse_due_at};

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use rusqlite_migration::{M, MigrationDefinitionError, Migrations};

use actor::Actor;

pub use costs::{
    CacheRatios, CallType, CostRow, CostSummary, DayCost, GroupBy, GroupCost, ModelCost,
    RECENT_CALLS, hit_ratio,
};

/// How long a statement waits for another connection's lock before failing with `SQLITE_BUSY`.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Prepared statements kept per connection (`prepare_cached`). rusqlite's default is 16, but
/// the daemon has more distinct cached statements than that on `memory.db` (recall's
/// full-text searches, the consolidation writes, the index), so with the default they pushed
/// each other out and were prepared again on every message (SPEC §16.6). Counted by
/// `tests::statement_cache_holds_every_cached_statement`, which reads every `prepare_cached`
/// call under `src/store/` and counts the distinct SQL texts per database (2026-11: 8 on
/// `agentd.db`, 25 on `memory.db`); the capacity leaves room for as many again. A cached
/// statement costs a few KiB.
pub(crate) const STATEMENT_CACHE_CAPACITY: usize = 64;

/// Name of the DB actor thread (visible in `top -H`, `ps -L`, panics and core dumps).
const THREAD_NAME: &str = "agentd-db";

/// Schema migrations of `agentd.db`, applied in order; the version lives in `PRAGMA
/// user_version`. Never edit a shipped migration: append a new file.
pub(crate) static MIGRATIONS: LazyLock<Migrations<'static>> = LazyLock::new(|| {
    Migrations::new(vec![
        M::up(include_str!("migrations/0001_init.sql")),
        M::up(include_str!("migrations/0002_scheduled.sql")),
        M::up(include_str!("migrations/0003_fallback.sql")),
        M::up(include_str!("migrations/0004_cost_autopilot.sql")),
        M::up(include_str!("migrations/0005_cost_spool.sql")),
    ])
});

/// Errors of the store. Every variant names the database file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create or access database file {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("cannot open database {}: {source}", path.display())]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("cannot bring database {} to the current schema: {source}", path.display())]
    Migrate {
        path: PathBuf,
        source: rusqlite_migration::Error,
    },
    #[error(
        "database {} was written by a newer agentd (its schema is newer than this build knows); \
         run the newer agentd or move the file away",
        path.display()
    )]
    TooNew { path: PathBuf },
    #[error("database {}: {source}", path.display())]
    Query {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("cannot start the database thread for {}: {source}", path.display())]
    Thread { path: PathBuf, source: io::Error },
    #[error("database {}: the database thread has stopped", path.display())]
    Stopped { path: PathBuf },
    #[error("database {}: a query panicked (a bug; see the log)", path.display())]
    Panicked { path: PathBuf },
}

/// `PRAGMA cache_size` of `agentd.db`'s writer: 512 KiB (negative: KiB, not pages).
const WRITER_CACHE_KIB: i64 = -512;

/// Handle to `agentd.db`. Clone it freely; all clones share one connection and one thread.
#[derive(Clone)]
pub struct Db {
    actor: Actor,
    /// Running sums behind `spend_since` (budgets are checked before every call).
    spend: costs::SpendMarks,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").field("path", &self.path()).finish()
    }
}

impl Db {
    /// Create or open `agentd.db` at `path` for reading and writing, configure it (WAL,
    /// `synchronous=NORMAL`, `foreign_keys=ON`, 5 s busy timeout) and run the migrations. A new
    /// file is created with mode 0600. The parent directory must exist.
    ///
    /// Blocking (file I/O and migrations): call it at start-up or from `spawn_blocking`.
    pub fn open(path: &Path) -> Result<Db, StoreError> {
        let conn = open_writer(path, &MIGRATIONS)?;
        // The writer appends rows and reads the newest ones back: SQLite's default page cache
        // (2 MB) only filled up with old pages as the file grew, which the soak measured as
        // growth (docs/BENCHMARKS.md, soak). Reports read through their own connections.
        conn.pragma_update(None, "cache_size", WRITER_CACHE_KIB)
            .map_err(|source| open_err(path, source))?;
        let (actor, _detached) = Actor::spawn(conn, path, THREAD_NAME)?;
        Ok(Db {
            actor,
            spend: Default::default(),
        })
    }

    /// Open `agentd.db` read-only, for queries from the CLI while the daemon may be running. No
    /// migrations are run. `Ok(None)` when the file does not exist or holds no schema yet (the
    /// daemon never ran): the caller reports "no data" rather than an error.
    ///
    /// Blocking (file I/O): call it from a CLI or from `spawn_blocking`.
    pub fn open_read_only(path: &Path) -> Result<Option<Db>, StoreError> {
        let Some(conn) = open_reader(path)? else {
            return Ok(None);
        };
        let (actor, _detached) = Actor::spawn(conn, path, THREAD_NAME)?;
        Ok(Some(Db {
            actor,
            spend: Default::default(),
        }))
    }

    /// A handle on an empty in-memory database without the schema: every ledger query fails.
    /// For tests elsewhere in the crate that must prove the database is not touched.
    #[cfg(test)]
    pub(crate) fn without_schema_for_test() -> Db {
        let conn = Connection::open_in_memory().expect("in-memory SQLite opens");
        let (actor, _detached) =
            Actor::spawn(conn, Path::new(":memory:"), THREAD_NAME).expect("thread spawns");
        Db {
            actor,
            spend: Default::default(),
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.actor.path()
    }

    /// Run `PRAGMA quick_check` (for `agentd doctor`): `true` when SQLite answers "ok".
    pub async fn integrity_ok(&self) -> Result<bool, StoreError> {
        self.actor.call(quick_check).await
    }
}

/// `PRAGMA quick_check` answered "ok".
pub(crate) fn quick_check(conn: &mut Connection) -> rusqlite::Result<bool> {
    let mut stmt = conn.prepare("PRAGMA quick_check")?;
    let rows = stmt
        .query_map([], |row| row.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    Ok(rows.len() == 1 && rows[0] == "ok")
}

/// Create (mode 0600) or open the database at `path` for writing, configure it
/// ([`configure_writer`]) and bring it to the latest schema of `migrations`. Blocking.
pub(crate) fn open_writer(
    path: &Path,
    migrations: &Migrations<'static>,
) -> Result<Connection, StoreError> {
    create_private_file(path)?;
    let mut conn = Connection::open(path).map_err(|source| open_err(path, source))?;
    configure_statements(&conn).map_err(|source| open_err(path, source))?;
    configure_writer(&conn).map_err(|source| open_err(path, source))?;
    migrations
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
    Ok(conn)
}

/// Open the database at `path` read-only (no migrations, no writes). `Ok(None)` when the file
/// does not exist or holds no schema yet. Blocking.
pub(crate) fn open_reader(path: &Path) -> Result<Option<Connection>, StoreError> {
    match path.try_exists() {
        Ok(true) => {}
        Ok(false) => return Ok(None),
        Err(source) => {
            return Err(StoreError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|source| open_err(path, source))?;
    configure_statements(&conn).map_err(|source| open_err(path, source))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|source| open_err(path, source))?;
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(|source| open_err(path, source))?;
    Ok((version != 0).then_some(conn))
}

pub(crate) fn open_err(path: &Path, source: rusqlite::Error) -> StoreError {
    StoreError::Open {
        path: path.to_path_buf(),
        source,
    }
}

/// Create the file with mode 0600 if it does not exist yet, so SQLite (which gives its `-wal`
/// and `-shm` files the database file's mode) never creates a world-readable database.
pub(crate) fn create_private_file(path: &Path) -> Result<(), StoreError> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(StoreError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Keep prepared statements prepared: a cache larger than the statements in use, and SQLite's
/// query planner stability guarantee (QPSG). Without QPSG, SQLite (3.47 and later) plans a
/// `LIMIT ?n` with the value bound at the time and marks the statement to be prepared again
/// whenever `?n` is bound anew, that is at every execution: recall's full-text searches were
/// parsed and planned from scratch for every message (docs/BENCHMARKS.md, overhead). With
/// QPSG the plan never depends on a bound value, so a cached statement is reused as it is.
pub(crate) fn configure_statements(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(())
}

/// Connection settings of the writer (notes/crates.md §4). Foreign keys are on in the bundled
/// build already; set explicitly so behaviour does not depend on the build.
pub(crate) fn configure_writer(conn: &Connection) -> rusqlite::Result<()> {
    let mode: String =
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        // E.g. a file system without shared memory support: still usable, only less concurrent.
        tracing::warn!(journal_mode = %mode, "SQLite refused WAL mode; continuing with this mode");
    }
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SQLite is built as `.cargo/config.toml` says: FTS5 and JSON (which the stores use) in,
    /// the extensions compiled out for size (issue 14) out. Fails if that file stops applying.
    #[test]
    fn sqlite_is_built_with_what_the_stores_use_and_without_the_rest() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let mut stmt = conn.prepare("PRAGMA compile_options").unwrap();
        let options: Vec<String> = stmt
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(options.iter().any(|o| o == "ENABLE_FTS5"), "{options:?}");
        for gone in [
            "ENABLE_FTS3",
            "ENABLE_RTREE",
            "ENABLE_DBSTAT_VTAB",
            "SOUNDEX",
        ] {
            assert!(!options.iter().any(|o| o == gone), "{gone} in {options:?}");
        }
        for omitted in [
            "OMIT_LOAD_EXTENSION",
            "OMIT_DEPRECATED",
            "OMIT_SHARED_CACHE",
        ] {
            assert!(
                options.iter().any(|o| o == omitted),
                "{omitted} not in {options:?}"
            );
        }
        conn.execute_batch("CREATE VIRTUAL TABLE t USING fts5(x); SELECT json('{}');")
            .unwrap();
        let fts3 = conn.execute_batch("CREATE VIRTUAL TABLE u USING fts4(x)");
        assert!(fts3.is_err());
    }

    /// The SQL argument of every `prepare_cached(` call in `text`, whitespace and line
    /// continuations removed, so the same statement written at two places counts once.
    fn cached_sql(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find("prepare_cached(") {
            rest = &rest[at + "prepare_cached(".len()..];
            let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
            let mut end = rest.len();
            for (i, ch) in rest.char_indices() {
                match (in_str, escaped, ch) {
                    (true, true, _) => escaped = false,
                    (true, false, '\\') => escaped = true,
                    (true, false, '"') => in_str = false,
                    (true, false, _) => {}
                    (false, _, '"') => in_str = true,
                    (false, _, '(') => depth += 1,
                    (false, _, ')') if depth == 0 => {
                        end = i;
                        break;
                    }
                    (false, _, ')') => depth -= 1,
                    _ => {}
                }
            }
            let arg: String = rest[..end].replace("\\\n", "").split_whitespace().collect();
            out.push(arg);
            rest = &rest[end..];
        }
        out
    }

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn cached_sql_reads_one_argument() {
        let src = "c.prepare_cached(\"SELECT (a) FROM t \\\n   WHERE x = ')'\")?; \
                   c.prepare_cached(&format!(\"SELECT {COLS} FROM t\"))?";
        assert_eq!(
            cached_sql(src),
            vec![
                "\"SELECT(a)FROMtWHEREx=')'\"".to_string(),
                "&format!(\"SELECT{COLS}FROMt\")".to_string()
            ]
        );
    }

    /// Every distinct statement a connection caches fits in its cache, with room to spare:
    /// otherwise they evict each other and are prepared again on every use (SPEC §16.6).
    /// `store/memory/` runs on `memory.db`, the rest of `store/` on `agentd.db`.
    #[test]
    fn statement_cache_holds_every_cached_statement() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store");
        let mut files = Vec::new();
        rust_files(&root, &mut files);
        let (mut agentd_db, mut memory_db) = (
            std::collections::BTreeSet::new(),
            std::collections::BTreeSet::new(),
        );
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let set = if f.starts_with(root.join("memory")) {
                &mut memory_db
            } else {
                &mut agentd_db
            };
            set.extend(cached_sql(&text));
        }
        assert!(memory_db.len() >= 20, "the scan found {memory_db:?}");
        for (db, set) in [("agentd.db", &agentd_db), ("memory.db", &memory_db)] {
            assert!(
                set.len() + set.len() / 4 <= STATEMENT_CACHE_CAPACITY,
                "{db} caches {} distinct statements: raise STATEMENT_CACHE_CAPACITY ({}) to \
                 leave a quarter free",
                set.len(),
                STATEMENT_CACHE_CAPACITY
            );
        }
    }

    #[test]
    fn migrations_are_valid() {
        MIGRATIONS.validate().expect("migrations validate");
    }

    #[tokio::test]
    async fn open_configures_wal_and_private_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agentd.db");
        let db = Db::open(&path).unwrap();
        let (mode, sync, fk): (String, i64, i64) = db
            .actor
            .call(|c| {
                Ok((
                    c.pragma_query_value(None, "journal_mode", |r| r.get(0))?,
                    c.pragma_query_value(None, "synchronous", |r| r.get(0))?,
                    c.pragma_query_value(None, "foreign_keys", |r| r.get(0))?,
                ))
            })
            .await
            .unwrap();
        assert_eq!(mode, "wal");
        assert_eq!(sync, 1, "synchronous=NORMAL");
        assert_eq!(fk, 1);
        let perm = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(perm, 0o600);
        assert!(db.integrity_ok().await.unwrap());
    }

    #[test]
    fn open_in_missing_directory_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope").join("agentd.db");
        let err = Db::open(&path).unwrap_err().to_string();
        assert!(err.contains("nope/agentd.db"), "{err}");
    }

    #[test]
    fn read_only_open_of_missing_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agentd.db");
        assert!(Db::open_read_only(&path).unwrap().is_none());
        assert!(!path.exists(), "read-only open must not create the file");
    }

    #[test]
    fn read_only_open_of_empty_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agentd.db");
        std::fs::write(&path, b"").unwrap();
        assert!(Db::open_read_only(&path).unwrap().is_none());
    }

    #[test]
    fn newer_schema_is_refused_with_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agentd.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.pragma_update(None, "user_version", 99).unwrap();
        }
        let err = Db::open(&path).unwrap_err();
        assert!(matches!(err, StoreError::TooNew { .. }), "{err}");
        assert!(err.to_string().contains("newer agentd"));
    }

    #[tokio::test]
    async fn read_only_handle_cannot_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agentd.db");
        let writer = Db::open(&path).unwrap();
        let reader = Db::open_read_only(&path).unwrap().unwrap();
        assert!(reader.kv_set("k", "v").await.is_err());
        writer.kv_set("k", "v").await.unwrap();
        assert_eq!(reader.kv_get("k").await.unwrap().as_deref(), Some("v"));
    }

    /// How often the cached full-text search `LIMIT ?2` was prepared again over three runs,
    /// each binding its parameters anew, as recall does for every message.
    fn reprepares(qpsg: bool) -> i32 {
        let conn = Connection::open_in_memory().unwrap();
        configure_statements(&conn).unwrap();
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            qpsg,
        )
        .unwrap();
        conn.execute_batch(
            "CREATE VIRTUAL TABLE t USING fts5(text);
             INSERT INTO t (text) VALUES ('alpha beta'), ('beta gamma'), ('gamma delta');",
        )
        .unwrap();
        const SQL: &str = "SELECT rowid FROM t WHERE t MATCH ?1 ORDER BY rank LIMIT ?2";
        for (query, limit) in [("beta", 5), ("gamma", 5), ("beta", 1)] {
            let mut st = conn.prepare_cached(SQL).unwrap();
            let n = st
                .query_map(rusqlite::params![query, limit], |r| r.get::<_, i64>(0))
                .unwrap()
                .count();
            assert_eq!(n, if limit == 1 { 1 } else { 2 });
        }
        let st = conn.prepare_cached(SQL).unwrap();
        st.get_status(rusqlite::StatementStatus::RePrepare)
    }

    #[test]
    fn cached_statements_with_a_bound_limit_are_not_prepared_again() {
        assert_eq!(
            reprepares(true),
            0,
            "with QPSG, as every connection is configured"
        );
        // The reason for QPSG: without it the bundled SQLite prepares the statement again at
        // every rebinding of its LIMIT parameter. If this starts to fail after a SQLite
        // upgrade, the comment on `configure_statements` is out of date, not the code.
        assert!(
            reprepares(false) > 0,
            "SQLite no longer re-prepares a bound LIMIT"
        );
    }
}
