//! The cost spool (SPEC §16.4): `agentd.db.spool`, next to the database, keeps the cost rows
//! whose insert failed, so that a stop or a crash before the database can be written again
//! loses none of them (rows kept in memory only would be lost, and the daily and monthly
//! budgets would undercount).
//!
//! - **Format**: JSON lines, one row per line with a unique `id`, file mode 0600. An append is
//!   one write plus fdatasync (`fsutil::append_line_fsync`), made before `Ledger::record_call`
//!   returns, so before the provider's answer is used.
//! - **Replay** ([`Spool::replay`]): at start and at the budget check after an append. The rows
//!   go into `costs` in one transaction that also records their ids in `cost_spool_applied`
//!   (`Db::insert_spooled_costs`); then the file is emptied and fsynced; then the ids are
//!   forgotten. A crash between the commit and the emptying leaves rows whose ids are known,
//!   and the next replay skips them: every row is written exactly once.
//! - **Damage**: a torn last line (a crash mid-append) is cut with a warning. A complete line
//!   that is not a row is an error naming the file and the line: the other rows are written
//!   and the file is left as it is for the operator.
//! - **Processes**: the daemon, `agentd consolidate` and `agentd doctor` may spool into the same
//!   file. Each append and each replay holds an exclusive `flock` on it, so a replay never
//!   empties a row another process appended after it read the file. Rows another process
//!   spooled are replayed by this one at its next start or after its own next failed insert.
//! - **Bounded**: rows are spooled only while the database fails, and no provider call is made
//!   while a spooled row is unwritten (`Ledger::check`), so the file holds about one row per
//!   call that was in flight when the failure began. It still never grows past [`MAX_BYTES`]:
//!   beyond, rows stay in memory only.

use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use crate::fsutil;
use crate::message::Usage;
use crate::store::{CallType, CostRow, Db, StoreError};

/// The most bytes the spool holds (a row is about 300). See the module doc: it only fills
/// when something else is wrong.
pub const MAX_BYTES: u64 = 1 << 20;

/// Why rows could not be spooled or replayed.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("cost spool {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "cost spool {} is full ({len} bytes; it holds at most {MAX_BYTES}): the database has been failing for a long time",
        path.display()
    )]
    Full { path: PathBuf, len: u64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A replay that could not write the spooled rows: they stay in the spool.
#[derive(Debug)]
pub struct ReplayError {
    /// The rows left unwritten (1 when the spool could not even be read).
    pub left: usize,
    pub error: SpoolError,
}

/// The spool of one database file. Share it (`Arc`): one per process and database.
#[derive(Debug)]
pub struct Spool {
    path: PathBuf,
    /// One append or replay of this process at a time (other processes: the `flock`).
    turn: tokio::sync::Mutex<()>,
    /// The file may hold rows that are not in the database: true at start (not known before
    /// the first replay), set by each append, cleared by a replay that wrote every row.
    unreplayed: AtomicBool,
    /// An append failed and said so in the log; none has worked since (one error per burst).
    failing: AtomicBool,
}

/// One line of the spool.
#[derive(Debug, Serialize, Deserialize)]
struct Line {
    /// Unique per row (a UUID v4): what `cost_spool_applied` remembers.
    id: String,
    timestamp: i64,
    session_id: String,
    model: String,
    provider: String,
    call_type: CallType,
    usage: Usage,
    /// `null` for a cost that is not finite (JSON has no NaN); written as NULL, like the
    /// database stores a NaN.
    cost_usd: Option<f64>,
    #[serde(default)]
    fallback_from: Option<String>,
    #[serde(default)]
    source: Option<String>,
}

impl Line {
    fn new(row: &CostRow) -> Line {
        Line {
            id: uuid::Uuid::new_v4().to_string(),
            timestamp: row.timestamp,
            session_id: row.session_id.clone(),
            model: row.model.clone(),
            provider: row.provider.clone(),
            call_type: row.call_type,
            usage: row.usage,
            cost_usd: row.cost_usd.is_finite().then_some(row.cost_usd),
            fallback_from: row.fallback_from.clone(),
            source: row.source.clone(),
        }
    }

    fn into_row(self) -> (String, CostRow) {
        let row = CostRow {
            timestamp: self.timestamp,
            session_id: self.session_id,
            model: self.model,
            provider: self.provider,
            call_type: self.call_type,
            usage: self.usage,
            cost_usd: self.cost_usd.unwrap_or(f64::NAN),
            fallback_from: self.fallback_from,
            source: self.source,
        };
        (self.id, row)
    }
}

/// What a read of the spool found: its rows with their ids, and the lines that are not rows
/// (1-based number, the parse error).
#[derive(Debug, Default)]
struct Contents {
    rows: Vec<(String, CostRow)>,
    bad: Vec<(usize, String)>,
}

/// Parse whole lines (the torn tail already cut). Blank lines are skipped.
fn parse(bytes: &[u8]) -> Contents {
    let mut out = Contents::default();
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Line>(line) {
            Ok(l) => out.rows.push(l.into_row()),
            Err(e) => out.bad.push((i + 1, e.to_string())),
        }
    }
    out
}

impl Spool {
    /// The spool of the database file `db`: `<db>.spool` in the same directory. Touches no
    /// file.
    pub fn beside(db: &Path) -> Spool {
        let mut path = db.as_os_str().to_owned();
        path.push(".spool");
        Spool {
            path: PathBuf::from(path),
            turn: tokio::sync::Mutex::new(()),
            unreplayed: AtomicBool::new(true),
            failing: AtomicBool::new(false),
        }
    }

    /// The spool file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file may hold rows that are not in the database yet (then a budget check
    /// replays it first).
    pub fn unreplayed(&self) -> bool {
        self.unreplayed.load(Ordering::Acquire)
    }

    /// Append `row` durably (written and fdatasynced when this returns `Ok`). The first
    /// failure of a burst is logged as an error here.
    pub async fn append(&self, row: &CostRow) -> Result<(), SpoolError> {
        let _turn = self.turn.lock().await;
        let path = self.path.clone();
        let line = serde_json::to_vec(&Line::new(row)).map_err(|e| SpoolError::Io {
            path: path.clone(),
            source: io::Error::other(e),
        });
        let result = match line {
            Ok(line) => blocking(&self.path, move || append_locked(&path, &line)).await,
            Err(e) => Err(e),
        };
        match &result {
            Ok(()) => {
                self.unreplayed.store(true, Ordering::Release);
                if self.failing.swap(false, Ordering::AcqRel) {
                    tracing::info!(spool = %self.path.display(), "the cost spool is writable again");
                }
            }
            Err(e) => {
                if !self.failing.swap(true, Ordering::AcqRel) {
                    tracing::error!(error = %e, "cannot write the cost spool: cost rows that cannot be written to the database stay in memory only, and a stop loses them (check the disk of the state directory)");
                }
            }
        }
        result
    }

    /// Write every spooled row to `db` (see the module doc), then empty the file. `Ok`: how
    /// many rows were written (rows an earlier replay wrote are skipped, not counted).
    /// `Err`: the rows stay in the spool, nothing of them is in the database.
    pub async fn replay(&self, db: &Db) -> Result<usize, ReplayError> {
        let _turn = self.turn.lock().await;
        if !self.unreplayed() {
            return Ok(0);
        }
        let path = self.path.clone();
        let read = blocking(&self.path, move || read_locked(&path)).await;
        let (file, contents) = match read {
            Ok(Some(found)) => found,
            Ok(None) => {
                self.unreplayed.store(false, Ordering::Release);
                return Ok(0);
            }
            Err(error) => return Err(ReplayError { left: 1, error }),
        };
        let rows = contents.rows.len();
        let written = if rows == 0 {
            0
        } else {
            db.insert_spooled_costs(contents.rows)
                .await
                .map_err(|e| ReplayError {
                    left: rows,
                    error: e.into(),
                })?
        };
        if contents.bad.is_empty() {
            self.empty(file, db, rows > 0).await;
        } else {
            for (line, error) in &contents.bad {
                tracing::error!(spool = %self.path.display(), line, %error, "a line of the cost spool is not a cost row: the file is left as it is (its other rows are in agentd.db); look at that line, then remove the file");
            }
        }
        self.unreplayed.store(false, Ordering::Release);
        if rows > 0 {
            tracing::info!(spool = %self.path.display(), written, skipped = rows - written, "cost rows from the spool are in the database");
        }
        Ok(written)
    }

    /// Empty the spool whose rows are all in the database (`file` holds its lock), then
    /// forget their ids (`forget`: there were rows), still under the lock.
    async fn empty(&self, file: File, db: &Db, forget: bool) {
        let path = self.path.clone();
        let emptied = blocking(&self.path, move || {
            file.set_len(0)
                .and_then(|()| file.sync_all())
                .map_err(io_err(&path))?;
            Ok(file)
        })
        .await;
        match emptied {
            Ok(file) => {
                if forget && let Err(e) = db.clear_spool_applied().await {
                    // Harmless: ids are unique, a stale one matches no future row.
                    tracing::warn!(error = %e, "cannot forget the ids of the replayed cost rows");
                }
                drop(file);
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot empty the cost spool; its rows are in the database and the next replay skips them");
            }
        }
    }
}

/// Run blocking file work for the spool at `path` on the blocking pool.
async fn blocking<T: Send + 'static>(
    path: &Path,
    f: impl FnOnce() -> Result<T, SpoolError> + Send + 'static,
) -> Result<T, SpoolError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(SpoolError::Io {
            path: path.to_path_buf(),
            source: io::Error::other(e),
        })
    })
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> SpoolError + '_ {
    move |source| SpoolError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Open the spool (read and append, not following a symlink) and take its exclusive lock.
/// `create`: create it with mode 0600 when missing, and fsync the directory so that the new
/// name is durable; otherwise a missing spool is `None`.
fn open_locked(path: &Path, create: bool) -> io::Result<Option<File>> {
    let mut opts = OpenOptions::new();
    opts.read(true)
        .append(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .mode(0o600);
    let file = if create {
        match opts.clone().create_new(true).open(path) {
            Ok(f) => {
                fsutil::fsync_dir(path.parent().unwrap_or(Path::new(".")))?;
                f
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => opts.open(path)?,
            Err(e) => return Err(e),
        }
    } else {
        match opts.open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        }
    };
    file.lock()?;
    Ok(Some(file))
}

/// Cut a torn tail (a crash mid-append), with a warning.
fn cut_torn_tail(path: &Path, file: &mut File) -> io::Result<()> {
    let cut = fsutil::cut_torn_tail(file)?;
    if cut > 0 {
        tracing::warn!(spool = %path.display(), dropped_bytes = cut, "the last line of the cost spool was torn (a crash while it was written): skipped");
    }
    Ok(())
}

/// Append `line` under the lock, within [`MAX_BYTES`].
fn append_locked(path: &Path, line: &[u8]) -> Result<(), SpoolError> {
    let Some(mut file) = open_locked(path, true).map_err(io_err(path))? else {
        return Err(io_err(path)(ErrorKind::NotFound.into()));
    };
    cut_torn_tail(path, &mut file).map_err(io_err(path))?;
    let len = file.metadata().map_err(io_err(path))?.len();
    if len + line.len() as u64 + 1 > MAX_BYTES {
        return Err(SpoolError::Full {
            path: path.to_path_buf(),
            len,
        });
    }
    fsutil::append_line_fsync(&mut file, line).map_err(io_err(path))
}

/// Read the spool under its lock (kept in the returned file): `None` when there is none.
fn read_locked(path: &Path) -> Result<Option<(File, Contents)>, SpoolError> {
    let Some(mut file) = open_locked(path, false).map_err(io_err(path))? else {
        return Ok(None);
    };
    cut_torn_tail(path, &mut file).map_err(io_err(path))?;
    let len = file.metadata().map_err(io_err(path))?.len();
    if len > MAX_BYTES {
        // Not written by an agentd (appends stop below the limit): not read.
        return Err(io_err(path)(io::Error::other(format!(
            "{len} bytes, more than an agentd writes ({MAX_BYTES}): move the file away"
        ))));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.seek(SeekFrom::Start(0))
        .and_then(|_| file.read_to_end(&mut bytes))
        .map_err(io_err(path))?;
    Ok(Some((file, parse(&bytes))))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    fn row(usd: f64) -> CostRow {
        CostRow {
            timestamp: 1_700_000_000,
            session_id: "s".into(),
            model: "m".into(),
            provider: "p".into(),
            call_type: CallType::Chat,
            usage: Usage {
                input_tokens: 1000,
                output_tokens: 10,
                ..Usage::default()
            },
            cost_usd: usd,
            fallback_from: Some("big".into()),
            source: Some("telegram".into()),
        }
    }

    /// A database in a temporary directory and its spool.
    fn setup() -> (tempfile::TempDir, Db, Spool) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("agentd.db")).unwrap();
        let spool = Spool::beside(db.path());
        (dir, db, spool)
    }

    /// Make every insert into `costs` fail (as a full disk does), or work again.
    pub(crate) fn fail_inserts(db: &Path, fail: bool) {
        let conn = rusqlite::Connection::open(db).unwrap();
        conn.execute_batch(if fail {
            "CREATE TRIGGER disk_full BEFORE INSERT ON costs BEGIN \
             SELECT RAISE(FAIL, 'database or disk is full'); END;"
        } else {
            "DROP TRIGGER disk_full;"
        })
        .unwrap();
    }

    /// Rows in `costs` and their total cost.
    fn rows(db: &Path) -> (i64, f64) {
        let conn = rusqlite::Connection::open(db).unwrap();
        conn.query_row("SELECT COUNT(*), TOTAL(cost_usd) FROM costs", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap()
    }

    fn applied_ids(db: &Path) -> i64 {
        let conn = rusqlite::Connection::open(db).unwrap();
        conn.query_row("SELECT COUNT(*) FROM cost_spool_applied", [], |r| r.get(0))
            .unwrap()
    }

    fn spool_lines(spool: &Spool) -> usize {
        std::fs::read_to_string(spool.path())
            .unwrap()
            .lines()
            .count()
    }

    #[tokio::test]
    async fn appended_rows_are_durable_private_lines_replayed_once() {
        let (dir, db, spool) = setup();
        assert_eq!(
            spool.path(),
            dir.path().join("agentd.db.spool"),
            "next to the database"
        );
        assert!(!spool.path().exists(), "created on the first append only");
        spool.append(&row(0.25)).await.unwrap();
        spool.append(&row(0.5)).await.unwrap();
        let mode = std::fs::metadata(spool.path())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(spool_lines(&spool), 2);
        assert!(spool.unreplayed());

        assert_eq!(spool.replay(&db).await.unwrap(), 2);
        assert_eq!(rows(db.path()), (2, 0.75));
        assert_eq!(std::fs::metadata(spool.path()).unwrap().len(), 0, "emptied");
        assert_eq!(
            applied_ids(db.path()),
            0,
            "ids forgotten once the spool is empty"
        );
        assert!(!spool.unreplayed());
        // The row as recorded, every column.
        let summary = db.cost_groups(None, crate::store::GroupBy::Source).await;
        let group = &summary.unwrap()[0];
        assert_eq!((group.key.as_str(), group.calls), ("telegram", 2));
        assert_eq!((group.input_tokens, group.output_tokens), (2000, 20));

        // Nothing twice: not again in this process, nor after a restart.
        assert_eq!(spool.replay(&db).await.unwrap(), 0);
        assert_eq!(Spool::beside(db.path()).replay(&db).await.unwrap(), 0);
        assert_eq!(rows(db.path()), (2, 0.75));
    }

    #[tokio::test]
    async fn a_replay_the_database_refuses_keeps_every_row_in_the_spool() {
        let (_dir, db, spool) = setup();
        spool.append(&row(1.0)).await.unwrap();
        spool.append(&row(2.0)).await.unwrap();
        fail_inserts(db.path(), true);
        let err = spool.replay(&db).await.unwrap_err();
        assert_eq!(err.left, 2);
        assert!(matches!(err.error, SpoolError::Store(_)), "{:?}", err.error);
        assert!(
            err.error.to_string().contains("disk is full"),
            "{}",
            err.error
        );
        assert_eq!(spool_lines(&spool), 2, "nothing cut");
        assert_eq!(applied_ids(db.path()), 0, "the transaction rolled back");
        assert!(spool.unreplayed(), "the next check tries again");
        fail_inserts(db.path(), false);
        assert_eq!(spool.replay(&db).await.unwrap(), 2);
        assert_eq!(rows(db.path()), (2, 3.0));
    }

    /// A kill -9 after the replay's commit and before the spool is emptied: the next replay
    /// finds every row again, and writes none of them a second time.
    #[tokio::test]
    async fn a_crash_between_the_commit_and_the_emptying_counts_each_row_once() {
        let (_dir, db, spool) = setup();
        for usd in [0.1, 0.2, 0.4] {
            spool.append(&row(usd)).await.unwrap();
        }
        // The replay up to its commit, as `Spool::replay` does it; then the process dies.
        let (file, contents) = read_locked(spool.path()).unwrap().unwrap();
        assert_eq!(db.insert_spooled_costs(contents.rows).await.unwrap(), 3);
        drop(file);
        drop(spool);
        assert_eq!(spool_lines(&Spool::beside(db.path())), 3, "still spooled");
        assert_eq!(applied_ids(db.path()), 3);

        // The restart.
        let spool = Spool::beside(db.path());
        assert_eq!(spool.replay(&db).await.unwrap(), 0, "all skipped");
        let (n, total) = rows(db.path());
        assert_eq!(n, 3);
        assert!((total - 0.7).abs() < 1e-12, "{total}");
        assert_eq!(std::fs::metadata(spool.path()).unwrap().len(), 0);
        assert_eq!(applied_ids(db.path()), 0);
        // The spool works as before afterwards.
        spool.append(&row(1.0)).await.unwrap();
        assert_eq!(spool.replay(&db).await.unwrap(), 1);
        assert_eq!(rows(db.path()).0, 4);
    }

    #[tokio::test]
    async fn a_torn_last_line_is_skipped_and_never_glued_to_the_next() {
        let (_dir, db, spool) = setup();
        spool.append(&row(1.0)).await.unwrap();
        // A crash in the middle of the second append.
        let whole = std::fs::read(spool.path()).unwrap();
        let mut f = OpenOptions::new().append(true).open(spool.path()).unwrap();
        f.write_all(&whole[..whole.len() / 2]).unwrap();
        drop(f);
        // Restart: the whole row is written, the torn one skipped.
        let spool = Spool::beside(db.path());
        assert_eq!(spool.replay(&db).await.unwrap(), 1);
        assert_eq!(rows(db.path()), (1, 1.0));

        // A torn tail followed by an append (the replay could not run): two whole rows.
        spool.append(&row(2.0)).await.unwrap();
        let mut f = OpenOptions::new().append(true).open(spool.path()).unwrap();
        f.write_all(b"{\"id\":\"x\",\"timest\0\0\0").unwrap();
        drop(f);
        spool.append(&row(4.0)).await.unwrap();
        assert_eq!(spool_lines(&spool), 2);
        assert_eq!(spool.replay(&db).await.unwrap(), 2);
        assert_eq!(rows(db.path()), (3, 7.0));
    }

    #[tokio::test]
    async fn a_bad_middle_line_is_reported_by_number_and_the_file_left_alone() {
        let (_dir, db, spool) = setup();
        spool.append(&row(1.0)).await.unwrap();
        let mut f = OpenOptions::new().append(true).open(spool.path()).unwrap();
        f.write_all(b"not a cost row\n").unwrap();
        drop(f);
        spool.append(&row(2.0)).await.unwrap();
        let before = std::fs::read(spool.path()).unwrap();

        let bytes = before.clone();
        let contents = parse(&bytes);
        assert_eq!(contents.rows.len(), 2);
        assert_eq!(contents.bad.len(), 1);
        assert_eq!(contents.bad[0].0, 2, "the line number, 1-based");

        // The good rows are written; the file stays for the operator; no panic, no error.
        assert_eq!(spool.replay(&db).await.unwrap(), 2);
        assert_eq!(rows(db.path()), (2, 3.0));
        assert_eq!(
            std::fs::read(spool.path()).unwrap(),
            before,
            "left as it was"
        );
        // Replayed again (a restart): its rows are not written twice.
        assert_eq!(Spool::beside(db.path()).replay(&db).await.unwrap(), 0);
        assert_eq!(rows(db.path()), (2, 3.0));
        // New rows still go through.
        spool.append(&row(4.0)).await.unwrap();
        assert_eq!(spool.replay(&db).await.unwrap(), 1);
        assert_eq!(rows(db.path()), (3, 7.0));
    }

    #[tokio::test]
    async fn the_spool_does_not_grow_past_its_limit() {
        let (_dir, _db, spool) = setup();
        let almost = "\n".repeat((MAX_BYTES - 100) as usize);
        std::fs::write(spool.path(), &almost).unwrap();
        let err = spool.append(&row(1.0)).await.unwrap_err();
        assert!(matches!(err, SpoolError::Full { .. }), "{err}");
        assert!(err.to_string().contains("agentd.db.spool"), "{err}");
        assert_eq!(std::fs::read_to_string(spool.path()).unwrap(), almost);
    }

    #[tokio::test]
    async fn a_spool_that_is_a_symlink_is_not_followed() {
        let (dir, _db, spool) = setup();
        let elsewhere = dir.path().join("elsewhere");
        std::os::unix::fs::symlink(&elsewhere, spool.path()).unwrap();
        let err = spool.append(&row(1.0)).await.unwrap_err();
        assert!(matches!(err, SpoolError::Io { .. }), "{err}");
        assert!(!elsewhere.exists());
    }

    #[test]
    fn a_cost_json_cannot_hold_is_written_as_null() {
        let mut r = row(f64::NAN);
        r.fallback_from = None;
        let line = serde_json::to_vec(&Line::new(&r)).unwrap();
        let contents = parse(&line);
        assert!(contents.bad.is_empty(), "{:?}", contents.bad);
        let (id, back) = &contents.rows[0];
        assert_eq!(id.len(), 36, "a UUID");
        assert!(back.cost_usd.is_nan());
        assert_eq!(back.fallback_from, None);
        assert_eq!(back.usage, r.usage);
    }
}
