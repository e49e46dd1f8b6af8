//! The databases' part of a backup (SPEC §24): a consistent copy of a live database through
//! SQLite's online backup API, the checks `agentd backup verify` runs on a copy, and the schema
//! versions this build reads and writes. Every connection here is opened and closed inside the
//! call (invariant 3: only `store/` owns a connection); all of it is blocking.

use std::path::Path;
use std::sync::LazyLock;

use rusqlite::{Connection, OpenFlags};
use rusqlite_migration::Migrations;

use super::{StoreError, open_err};

/// Which database of the state directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    /// `agentd.db`: costs, scheduled messages, small state.
    Agentd,
    /// `memory.db`: long-term memory and the workspace index.
    Memory,
}

impl DbKind {
    /// Both, in the order a backup copies them.
    pub const ALL: [DbKind; 2] = [DbKind::Agentd, DbKind::Memory];

    /// The file name under the state directory.
    pub fn file_name(self) -> &'static str {
        match self {
            DbKind::Agentd => "agentd.db",
            DbKind::Memory => "memory.db",
        }
    }

    fn migrations(self) -> &'static Migrations<'static> {
        match self {
            DbKind::Agentd => &super::MIGRATIONS,
            DbKind::Memory => &super::memory::MIGRATIONS,
        }
    }

    /// The schema version this build migrates the database to (`PRAGMA user_version`).
    pub fn latest_version(self) -> i64 {
        static LATEST: LazyLock<[i64; 2]> = LazyLock::new(|| {
            DbKind::ALL.map(|kind| migrated_version(kind.migrations()).unwrap_or(0))
        });
        match self {
            DbKind::Agentd => LATEST[0],
            DbKind::Memory => LATEST[1],
        }
    }
}

/// The version the migrations leave an empty database at (run once, in memory).
fn migrated_version(migrations: &Migrations<'static>) -> Option<i64> {
    let mut conn = Connection::open_in_memory().ok()?;
    migrations.to_latest(&mut conn).ok()?;
    conn.pragma_query_value(None, "user_version", |r| r.get(0))
        .ok()
}

/// Copy the live database at `src` to a new file `dst` in one step of the online backup API:
/// one read transaction, so the copy is the database as one commit left it, while the daemon
/// goes on writing (WAL readers do not block the writer). `Ok(None)` when `src` does not exist
/// or holds no schema yet (nothing is written then); else the copy's schema version.
pub fn copy_online(src: &Path, dst: &Path) -> Result<Option<i64>, StoreError> {
    let Some(source) = super::open_reader(src)? else {
        return Ok(None);
    };
    super::create_private_file(dst)?;
    let mut target = Connection::open(dst).map_err(|e| open_err(dst, e))?;
    {
        let backup = rusqlite::backup::Backup::new(&source, &mut target)
            .map_err(|source| query_err(dst, source))?;
        // -1: every page in one step, under one read lock of the source. Busy or locked
        // (another connection holds a lock SQLite's backup cannot wait through): again.
        loop {
            match backup.step(-1).map_err(|source| query_err(dst, source))? {
                rusqlite::backup::StepResult::Done => break,
                rusqlite::backup::StepResult::More => {}
                _ => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
        }
    }
    // The copy is a file of its own: no WAL beside it, so the archive holds one file.
    let _: String = target
        .pragma_update_and_check(None, "journal_mode", "DELETE", |r| r.get(0))
        .map_err(|source| query_err(dst, source))?;
    let version: i64 = target
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(|source| query_err(dst, source))?;
    target.close().map_err(|(_, e)| query_err(dst, e))?;
    Ok(Some(version))
}

/// What `PRAGMA integrity_check` and the schema version say about a database file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbCheck {
    /// The schema version (`PRAGMA user_version`).
    pub version: i64,
    /// SQLite's problems, empty when it answered "ok".
    pub problems: Vec<String>,
}

/// Run `PRAGMA integrity_check` on the database at `path` (a copy: a backup's, extracted) and
/// read its schema version. An unreadable file (truncated, not a database) is an error.
pub fn check_copy(path: &Path) -> Result<DbCheck, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| open_err(path, e))?;
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(|source| query_err(path, source))?;
    let mut stmt = conn
        .prepare("PRAGMA integrity_check")
        .map_err(|source| query_err(path, source))?;
    let rows = stmt
        .query_map([], |row| row.get::<_, String>(0))
        .and_then(|rows| rows.collect::<rusqlite::Result<Vec<String>>>())
        .map_err(|source| query_err(path, source))?;
    let problems = rows.into_iter().filter(|r| r != "ok").collect();
    Ok(DbCheck { version, problems })
}

/// The schema version of the database at `path` when it is older than this build's, that is
/// when opening it will migrate it: `Some((found, latest))`. `None` for a missing or new file
/// and for one already current (or too new, which `Db::open` refuses).
pub fn pending_migration(kind: DbKind, path: &Path) -> Result<Option<(i64, i64)>, StoreError> {
    let Some(conn) = super::open_reader(path)? else {
        return Ok(None);
    };
    let found: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(|source| query_err(path, source))?;
    let latest = kind.latest_version();
    Ok((found < latest).then_some((found, latest)))
}

fn query_err(path: &Path, source: rusqlite::Error) -> StoreError {
    StoreError::Query {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_live_database_is_copied_whole_and_checks_clean() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("agentd.db");
        let db = super::super::Db::open(&src).unwrap();
        db.kv_set("k", "v").await.unwrap();
        let dst = dir.path().join("copy.db");
        let version = copy_online(&src, &dst).unwrap();
        assert_eq!(version, Some(DbKind::Agentd.latest_version()));
        let check = check_copy(&dst).unwrap();
        assert!(check.problems.is_empty(), "{check:?}");
        let copy = super::super::Db::open_read_only(&dst).unwrap().unwrap();
        assert_eq!(copy.kv_get("k").await.unwrap().as_deref(), Some("v"));
        assert!(!dir.path().join("copy.db-wal").exists());
    }

    #[test]
    fn a_missing_database_copies_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let dst = dir.path().join("copy.db");
        assert_eq!(
            copy_online(&dir.path().join("none.db"), &dst).unwrap(),
            None
        );
        assert!(!dst.exists());
    }

    #[test]
    fn latest_versions_count_the_migrations() {
        assert_eq!(DbKind::Agentd.latest_version(), 5);
        assert_eq!(DbKind::Memory.latest_version(), 3);
    }

    #[test]
    fn an_older_schema_is_a_pending_migration() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agentd.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.pragma_update(None, "user_version", 2).unwrap();
        }
        assert_eq!(
            pending_migration(DbKind::Agentd, &path).unwrap(),
            Some((2, 5))
        );
        assert_eq!(
            pending_migration(DbKind::Agentd, &dir.path().join("x.db")).unwrap(),
            None
        );
    }

    #[test]
    fn a_truncated_copy_is_an_error_or_a_problem() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("agentd.db");
        drop(super::super::Db::open(&src).unwrap());
        let dst = dir.path().join("copy.db");
        copy_online(&src, &dst).unwrap();
        let bytes = std::fs::read(&dst).unwrap();
        std::fs::write(&dst, &bytes[..bytes.len() / 2]).unwrap();
        // Either SQLite cannot read it at all, or its integrity check names a problem.
        if let Ok(check) = check_copy(&dst) {
            assert!(!check.problems.is_empty(), "{check:?}");
        }
    }
}
