//! Sessions (SPEC §7): the index `sessions.json`, daily JSONL trails, atomic state snapshots,
//! rebuild from the trail, archive on reset, and the completion bookkeeping used for durable
//! intake and recovery (SPEC §5.2).
//!
//! All functions here do blocking file IO; async callers run them on the blocking pool.

pub mod approval;
pub mod event;
pub mod index;
mod repair;
pub mod state;
pub mod trail;

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::zone::Zone;

pub use event::{DeliveryStatus, Event, Intake, MessageEvent, Route, TrailLine};
pub use index::{Index, IndexEntry, IndexWriter};
pub use repair::unindexed_session_of;
pub use state::SessionState;
pub use trail::TrailWriter;

/// The directory under the sessions directory that holds archived (reset) sessions.
pub const ARCHIVE_DIR: &str = ".archive";

use crate::fsutil;
use crate::latest_writer::LatestWriter;

/// Open session handles (each holds its trail file open) beyond which the ones nobody uses are
/// closed: a daemon that has seen many session keys keeps a bounded number of descriptors and
/// intake-id sets (docs/BENCHMARKS.md, soak). A closed handle is opened again on demand.
const MAX_OPEN_SESSIONS: usize = 64;

/// Intake ids each open session remembers for idempotent intake (SPEC §16.3: only what
/// deduplication needs): a retried or redelivered message is recognised while its id is among
/// the session's last this many intakes. More than a Telegram batch redelivered after a crash
/// (100 updates) and any client's retries of its recent requests.
pub const DEDUP_IDS: usize = 256;

/// The intake ids a session remembers, oldest first, at most [`DEDUP_IDS`], each as the first
/// 16 bytes of its SHA-256: 4 KiB per full session instead of two copies of every id string
/// (with a hash set's overhead: up to ~50 KiB, times [`MAX_OPEN_SESSIONS`]; the soak's live
/// heap grew by 0.6 MB over 15,000 messages from these alone, docs/BENCHMARKS.md). Ids come
/// from clients and Telegram: a digest no one can steer into another message's (a collision
/// would drop a message as a duplicate); a lookup compares at most 256 digests.
#[derive(Default)]
struct RecentIds {
    order: std::collections::VecDeque<IdDigest>,
}

type IdDigest = [u8; 16];

fn id_digest(id: &str) -> IdDigest {
    use sha2::Digest;
    let full = sha2::Sha256::digest(id.as_bytes());
    let mut d = [0; 16];
    d.copy_from_slice(&full[..16]);
    d
}

impl RecentIds {
    fn new(ids: Vec<String>) -> Self {
        let mut r = RecentIds::default();
        for id in ids {
            r.insert(id_digest(&id));
        }
        r
    }

    fn contains(&self, d: &IdDigest) -> bool {
        self.order.contains(d)
    }

    fn insert(&mut self, d: IdDigest) {
        if self.contains(&d) {
            return;
        }
        if self.order.len() >= DEDUP_IDS {
            self.order.pop_front();
        }
        self.order.push_back(d);
    }
}

/// The sessions directory and the open sessions.
pub struct SessionStore {
    dir: PathBuf,
    tz: Zone,
    inner: Mutex<Inner>,
    /// Writes the state snapshots off the session workers (thread `agentd-snapshot`).
    snapshots: Arc<LatestWriter<SessionState>>,
    /// Writes `sessions.json` off the intake path (thread `agentd-index`).
    index_writer: IndexWriter,
    /// Sessions with a failed trail append in this run (see [`SessionHandle::mark_settled`]).
    unsettled: Unsettled,
}

/// Ids of sessions whose trail refused a line in this run: an event (a `failure`, a reply)
/// may be missing, so the trail no longer proves that every intake was answered, and no
/// settled mark may be written for them until the next start reads the whole trail. Shared by
/// the store and its handles, so a handle closed and reopened keeps it. Grows only by sessions
/// that hit a write error.
type Unsettled = Arc<Mutex<std::collections::HashSet<String>>>;

struct Inner {
    index: Index,
    open: HashMap<String, Arc<SessionHandle>>,
}

/// One open session: its identity and trail writer.
pub struct SessionHandle {
    pub id: String,
    pub key: String,
    dir: PathBuf,
    trail: Mutex<TrailWriter>,
    /// The last intake ids of the trail (loaded on first intake), at most [`DEDUP_IDS`].
    intake_ids: Mutex<Option<RecentIds>>,
    snapshots: Arc<LatestWriter<SessionState>>,
    unsettled: Unsettled,
    /// The last `precheck` or `skipped` line appended through this handle. The scheduler
    /// appends them beside the session's worker, whose state folds only its own lines and
    /// jumps its `seq` over these: each snapshot folds it in ([`Self::with_foreign_lines`]),
    /// so the snapshot stays the fold of the trail.
    foreign: Mutex<Option<TrailLine>>,
}

/// `<id>.settled` in the sessions directory: the `seq` of the trail's last line at a moment
/// when the session had nothing pending (every intake up to it answered or failed, nothing
/// queued). Recovery skips a session whose mark still names its last line (`is_settled`), so
/// a start does not read the trails of every sender ever seen. Written without fsync: a lost
/// or torn mark only means the trail is read.
fn settled_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.settled"))
}

/// Whether session `id` has nothing pending for recovery: its settled mark names the last
/// line of its trail. Reads the mark and the newest trail file only; `false` when unsure.
pub fn is_settled(dir: &Path, id: &str) -> bool {
    let Some(mark) = std::fs::read_to_string(settled_path(dir, id))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
    else {
        return false;
    };
    trail::last_seq(dir, id).ok().flatten() == Some(mark)
}

/// `<id>.state.json` in the sessions directory.
fn state_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.state.json"))
}

/// The trail is the source of truth: a snapshot that cannot be written (full disk) is rebuilt
/// from it later, so this is a warning, not a failure.
fn write_snapshot_logged(path: &Path, state: &SessionState) {
    if let Err(e) = state::write_snapshot(path, state) {
        tracing::warn!(path = %path.display(), error = %e, "cannot save the state snapshot");
    }
}

/// The current state of session `id` (key `key`) in `dir`: its snapshot plus the trail lines
/// after the snapshot's `last_seq` (SPEC §7: the snapshot is a cache and may lag the trail);
/// rebuilt from the whole trail when the snapshot is missing, corrupt or another session's.
/// Only reads: the daemon loads states with it (`SessionHandle::load_state`), and readers
/// outside it (the sessions report) see what the daemon would.
pub fn current_state(dir: &Path, id: &str, key: &str) -> io::Result<SessionState> {
    let mut st = match state::read_snapshot(&state_path(dir, id)) {
        Ok(Some(s)) if s.id == id => s,
        Ok(_) => state::SessionState::new(id, key, "", 0),
        Err(e) => {
            tracing::warn!(session = %id, error = %e, "state snapshot unreadable; rebuilding from the trail");
            state::SessionState::new(id, key, "", 0)
        }
    };
    for l in trail::read_trail_after(dir, id, st.last_seq)? {
        st.apply(&l);
    }
    Ok(st)
}

/// Drops the handles only the map holds. Safe under the store lock: a handle is only handed out
/// by `open_handle` under that lock, so a count of one means nobody else has it or can get it,
/// and no second writer of the same trail can ever exist.
fn close_unused(open: &mut HashMap<String, Arc<SessionHandle>>) {
    open.retain(|_, h| Arc::strong_count(h) > 1);
}

impl SessionStore {
    /// Open (creating with mode 0700) `dir`, read its index and repair it from the trails
    /// (`repair::repair_index`): the index is written in the background, so a crash may have
    /// kept a new session's entry from the disk, or stopped a reset between its index write
    /// and the file moves. A repaired index is written before anything reads it.
    pub fn open(dir: &Path, tz: Zone) -> io::Result<SessionStore> {
        fsutil::create_private_dir(dir)?;
        fsutil::create_private_dir(&dir.join(ARCHIVE_DIR))?;
        // Snapshot and index writes that a kill interrupted.
        match fsutil::remove_stale_temps(dir) {
            Ok(0) => {}
            Ok(n) => tracing::info!(count = n, "removed temp files left by an interrupted write"),
            Err(e) => tracing::warn!(error = %e, "cannot remove stale temp files"),
        }
        let mut index = index::read_index(dir)?;
        if repair::repair_index(dir, &mut index)? {
            index::write_index(dir, &index)?;
        }
        Ok(SessionStore {
            dir: dir.to_path_buf(),
            tz,
            inner: Mutex::new(Inner {
                index,
                open: HashMap::new(),
            }),
            snapshots: Arc::new(LatestWriter::new("agentd-snapshot", write_snapshot_logged)),
            index_writer: IndexWriter::new(dir),
            unsettled: Unsettled::default(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Queue a snapshot of `state` if it lacks trail lines (a graceful stop, a state evicted
    /// from the daemon's idle cache), and only while the index still names its session: the
    /// state of a session reset meanwhile must not land beside its archive. Returns whether
    /// one was queued.
    pub fn snapshot_if_dirty(&self, mut state: SessionState) -> bool {
        if !state.is_dirty() {
            return false;
        }
        let (current, handle) = {
            let inner = self.lock();
            let current = inner
                .index
                .get(&state.key)
                .is_some_and(|e| e.session_id == state.id);
            (current, inner.open.get(&state.id).cloned())
        };
        if !current {
            return false;
        }
        if let Some(h) = handle {
            state = h.with_foreign_lines(state);
        }
        state.mark_saved();
        self.snapshots
            .submit(state_path(&self.dir, &state.id), state);
        true
    }

    /// Blocks until every queued snapshot is written (shutdown), at most 30 s.
    pub fn flush_snapshots(&self) {
        self.snapshots.flush(std::time::Duration::from_secs(30));
    }

    /// Blocks until the index handed to the background writer is on disk (shutdown), at most
    /// 30 s. A stop without it loses nothing: the next start repairs the index from the trails.
    pub fn flush_index(&self) {
        self.index_writer.flush(std::time::Duration::from_secs(30));
    }

    /// A copy of the index.
    pub fn index(&self) -> Index {
        self.lock().index.clone()
    }

    /// The session for `key`, created if it does not exist: its `session` event is fsynced
    /// (the record of the session), the index entry is made in memory and handed to the
    /// background writer (see [`IndexWriter`]).
    pub fn get_or_create(&self, key: &str, model: &str) -> io::Result<Arc<SessionHandle>> {
        let mut inner = self.lock();
        self.get_or_create_locked(&mut inner, key, model)
    }

    fn get_or_create_locked(
        &self,
        inner: &mut Inner,
        key: &str,
        model: &str,
    ) -> io::Result<Arc<SessionHandle>> {
        if let Some(entry) = inner.index.get(key) {
            let id = entry.session_id.clone();
            return self.open_handle(inner, key, &id);
        }
        let id = uuid::Uuid::now_v7().to_string();
        let now = chrono::Utc::now().timestamp();
        let h = self.open_handle(inner, key, &id)?;
        if let Err(e) = h.append(Event::Session {
            session_id: id.clone(),
            key: key.to_string(),
            model: model.to_string(),
        }) {
            // Nothing of this session was written (a failed append is cut back, and the trail
            // writer removes the file it left empty): forget it, so that refused intakes on a
            // full disk leave no open handles behind (each retry would otherwise add one).
            inner.open.remove(&id);
            return Err(e);
        }
        inner.index.insert(
            key.to_string(),
            IndexEntry {
                session_id: id,
                created_at: now,
            },
        );
        // Not waited for: the trail's `session` event is the durable fact, and a start repairs
        // an index that a crash kept from the disk (`repair::repair_index`).
        self.index_writer.submit(inner.index.clone());
        Ok(h)
    }

    /// Durable intake: get or create the session of `key` and append `intake`, under the store
    /// lock so a concurrent reset cannot archive the trail in between. An id the session has
    /// already taken in — among its last [`DEDUP_IDS`] — is not written again
    /// (`Ok((id, false))`): redelivered Telegram updates and retried client lines are
    /// accepted once.
    pub fn append_intake(
        &self,
        key: &str,
        model: &str,
        intake: Intake,
    ) -> io::Result<(Arc<SessionHandle>, bool)> {
        let mut inner = self.lock();
        let h = self.get_or_create_locked(&mut inner, key, model)?;
        let mut ids = h.intake_ids.lock().unwrap_or_else(|p| p.into_inner());
        if ids.is_none() {
            *ids = Some(RecentIds::new(trail::recent_intake_ids(
                &self.dir, &h.id, DEDUP_IDS,
            )?));
        }
        let set = ids.as_mut().expect("filled above");
        let digest = id_digest(&intake.id);
        if set.contains(&digest) {
            drop(ids);
            return Ok((h, false));
        }
        h.append(Event::Intake(intake))?;
        set.insert(digest);
        drop(ids);
        drop(inner);
        Ok((h, true))
    }

    /// Whether the intake `id` is already in `key`'s trail (among the recent ids the
    /// duplicate check keeps): work done before recording it (a transcription) need not be
    /// done again for a message taken before a crash and offered again.
    pub fn has_intake(&self, key: &str, id: &str) -> io::Result<bool> {
        let Some(h) = self.get(key)? else {
            return Ok(false);
        };
        let mut ids = h.intake_ids.lock().unwrap_or_else(|p| p.into_inner());
        if ids.is_none() {
            *ids = Some(RecentIds::new(trail::recent_intake_ids(
                &self.dir, &h.id, DEDUP_IDS,
            )?));
        }
        Ok(ids.as_ref().is_some_and(|set| set.contains(&id_digest(id))))
    }

    /// The session for `key` if it exists.
    pub fn get(&self, key: &str) -> io::Result<Option<Arc<SessionHandle>>> {
        let mut inner = self.lock();
        let Some(id) = inner.index.get(key).map(|e| e.session_id.clone()) else {
            return Ok(None);
        };
        self.open_handle(&mut inner, key, &id).map(Some)
    }

    fn open_handle(
        &self,
        inner: &mut Inner,
        key: &str,
        id: &str,
    ) -> io::Result<Arc<SessionHandle>> {
        if let Some(h) = inner.open.get(id) {
            return Ok(h.clone());
        }
        if inner.open.len() >= MAX_OPEN_SESSIONS {
            close_unused(&mut inner.open);
        }
        let h = Arc::new(SessionHandle {
            id: id.to_string(),
            key: key.to_string(),
            dir: self.dir.clone(),
            trail: Mutex::new(TrailWriter::open(&self.dir, id, self.tz.clone())?),
            intake_ids: Mutex::new(None),
            snapshots: self.snapshots.clone(),
            unsettled: self.unsettled.clone(),
            foreign: Mutex::new(None),
        });
        inner.open.insert(id.to_string(), h.clone());
        Ok(h)
    }

    /// Handles held open right now.
    pub fn open_handles(&self) -> usize {
        self.lock().open.len()
    }

    /// Archive the session of `key`: append a `reset` event, move `<id>*` files to `.archive/`,
    /// remove the index entry. Nothing is deleted. Returns false when there is no such session.
    pub fn archive(&self, key: &str, reason: &str) -> io::Result<bool> {
        self.archive_if(key, reason, |_| Ok(true))
    }

    /// `archive`, only if `key` still names session `id` and that session has written nothing
    /// for `idle` (`[retention] idle_session_after`). Checked under the store lock, so an
    /// intake appended at the same moment is never archived with the session.
    pub fn archive_if_idle(
        &self,
        key: &str,
        id: &str,
        idle: Duration,
        reason: &str,
    ) -> io::Result<bool> {
        self.archive_if(key, reason, |entry| {
            if entry.session_id != id {
                return Ok(false);
            }
            let activity = last_activity_of(&self.dir, id)?;
            Ok(activity.is_some_and(|t| is_older(t, idle, SystemTime::now())))
        })
    }

    fn archive_if(
        &self,
        key: &str,
        reason: &str,
        cond: impl FnOnce(&IndexEntry) -> io::Result<bool>,
    ) -> io::Result<bool> {
        // A snapshot still queued would otherwise land after the move, beside the archive.
        // Waited for outside the store lock (other sessions' intakes need it); only this
        // session's worker, which is the one resetting it, queues its snapshots.
        let queued = (self.lock().index.get(key)).map(|e| state_path(&self.dir, &e.session_id));
        if let Some(path) = queued {
            self.snapshots.wait_for(&path);
        }
        let mut inner = self.lock();
        let Some(entry) = inner.index.get(key).cloned() else {
            return Ok(false);
        };
        if !cond(&entry)? {
            return Ok(false);
        }
        let h = self.open_handle(&mut inner, key, &entry.session_id)?;
        h.append(Event::Reset {
            reason: reason.to_string(),
        })?;
        inner.open.remove(&entry.session_id);
        // Index first, durable (written through the background writer, so that no older index
        // still queued lands after it): a crash while moving files then leaves files of a
        // session the index no longer names, never an index entry pointing at half-moved
        // files; the next start finishes the move (`repair::repair_index`).
        inner.index.remove(key);
        self.index_writer.write_through(inner.index.clone())?;
        move_to_archive(&self.dir, &entry.session_id)?;
        Ok(true)
    }

    /// Sessions of the index (key, id) with no activity — no file of theirs written — for
    /// `idle` before `now` (SPEC §16.3, `idle_session_after`). One directory scan.
    pub fn idle_sessions(
        &self,
        idle: Duration,
        now: SystemTime,
    ) -> io::Result<Vec<(String, String)>> {
        let activity = last_activity(&self.dir)?;
        let index = self.index();
        Ok(index
            .into_iter()
            .filter(|(_, e)| {
                activity
                    .get(&e.session_id)
                    .is_some_and(|t| is_older(*t, idle, now))
            })
            .map(|(k, e)| (k, e.session_id))
            .collect())
    }

    /// Delete archived sessions (every file of one) whose newest file is older than `max_age`
    /// (SPEC §16.3, `archive_max_age`). Returns how many sessions were deleted.
    pub fn prune_archive(&self, max_age: Duration, now: SystemTime) -> io::Result<usize> {
        let archive = self.dir.join(ARCHIVE_DIR);
        let old: Vec<String> = last_activity(&archive)?
            .into_iter()
            .filter(|(_, t)| is_older(*t, max_age, now))
            .map(|(id, _)| id)
            .collect();
        if old.is_empty() {
            return Ok(0);
        }
        for e in std::fs::read_dir(&archive)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if session_of(&name).is_some_and(|id| old.iter().any(|o| o == id)) {
                std::fs::remove_file(e.path())?;
            }
        }
        fsutil::fsync_dir(&archive)?;
        Ok(old.len())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Move every file of session `id` (`<id>.*`) from `dir` to its `.archive/`, durably.
fn move_to_archive(dir: &Path, id: &str) -> io::Result<()> {
    let archive = dir.join(ARCHIVE_DIR);
    let prefix = format!("{id}.");
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            std::fs::rename(e.path(), archive.join(e.file_name()))?;
        }
    }
    fsutil::fsync_dir(&archive)?;
    fsutil::fsync_dir(dir)
}

/// `t` lies more than `age` before `now`.
fn is_older(t: SystemTime, age: Duration, now: SystemTime) -> bool {
    now.duration_since(t).is_ok_and(|d| d > age)
}

/// The session id a file of the sessions directory belongs to: the part before the first
/// dot of `<id>.<day>.jsonl` or `<id>.state.json`; `None` for the index, temp and hidden files.
fn session_of(name: &str) -> Option<&str> {
    let (id, _) = name.split_once('.')?;
    (!id.is_empty() && uuid::Uuid::parse_str(id).is_ok()).then_some(id)
}

/// Whether writing file `name` of a session counts as its activity: every file but the
/// snapshot, a cache written on a cadence and at a graceful stop (a stop must not make every
/// session it saved look fresh to `idle_session_after`).
fn is_activity(name: &str) -> bool {
    !name.ends_with(".state.json")
}

/// The newest modification time of each session's files in `dir`, by session id: when the
/// session last wrote anything (a trail line, a settled mark; not a snapshot: `is_activity`).
fn last_activity(dir: &Path) -> io::Result<HashMap<String, SystemTime>> {
    let mut out: HashMap<String, SystemTime> = HashMap::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(id) = session_of(&name) else {
            continue;
        };
        if !is_activity(&name) {
            continue;
        }
        let Ok(meta) = e.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        let t = meta.modified()?;
        let newest = out.entry(id.to_string()).or_insert(t);
        *newest = (*newest).max(t);
    }
    Ok(out)
}

/// `last_activity` of one session.
fn last_activity_of(dir: &Path, id: &str) -> io::Result<Option<SystemTime>> {
    let prefix = format!("{id}.");
    let mut newest = None;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with(&prefix) || !is_activity(&name) {
            continue;
        }
        let t = e.metadata()?.modified()?;
        newest = Some(newest.map_or(t, |n: SystemTime| n.max(t)));
    }
    Ok(newest)
}

impl SessionHandle {
    /// The directory of this session's trail files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Append an event durably (fsync) and return the written line.
    pub fn append(&self, event: Event) -> io::Result<TrailLine> {
        let line = self
            .trail
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .append(event);
        match &line {
            Ok(l) if matches!(l.event, Event::Precheck(_) | Event::Skipped(_)) => {
                *self.foreign.lock().unwrap_or_else(|p| p.into_inner()) = Some(l.clone());
            }
            Ok(_) => {}
            Err(_) => self.unsettle(),
        }
        line
    }

    /// `state` with the foreign line this handle remembers folded in, when `state` has passed
    /// it (a later line of its own); a line beyond `state` is folded by whoever reads the
    /// snapshot and the trail after it.
    fn with_foreign_lines(&self, mut state: SessionState) -> SessionState {
        let line = self
            .foreign
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(l) = line
            && l.seq <= state.last_seq
        {
            state.fold_precheck(&l);
        }
        state
    }

    /// A line of this trail was refused: the trail may lack a completion, so recovery must read
    /// it. Removes the settled mark (an unlink works on a full disk) and writes none again in
    /// this run.
    fn unsettle(&self) {
        self.unsettled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(self.id.clone());
        let _ = std::fs::remove_file(settled_path(&self.dir, &self.id));
    }

    pub fn state_path(&self) -> PathBuf {
        state_path(&self.dir, &self.id)
    }

    /// The current state ([`current_state`]), its stored tool calls repaired, with
    /// `default_model` when the trail names none. Marked saved at its snapshot's `last_seq`.
    pub fn load_state(&self, default_model: &str) -> io::Result<SessionState> {
        let mut st = current_state(&self.dir, &self.id, &self.key)?;
        // Calls stored before answers were normalised (SPEC §16.9) would make every request
        // of this session fail: repaired in memory (the next snapshot keeps the repair).
        let repaired = st.repair_tool_calls();
        if repaired > 0 {
            tracing::warn!(session = %self.id, calls = repaired, "stored tool calls the providers would reject were repaired");
        }
        if st.model.is_empty() {
            st.model = default_model.to_string();
        }
        Ok(st)
    }

    /// Hand the snapshot to the writer thread and return at once. Call only once every trail
    /// line folded into `state` is durable; a failed write is logged (the trail rebuilds it).
    pub fn queue_snapshot(&self, state: SessionState) {
        let state = self.with_foreign_lines(state);
        self.snapshots.submit(self.state_path(), state);
    }

    /// The `seq` of the last line written to the trail (0 before the first).
    pub fn last_seq(&self) -> u64 {
        let trail = self.trail.lock().unwrap_or_else(|p| p.into_inner());
        trail.next_seq().saturating_sub(1)
    }

    /// Record that nothing up to trail line `seq` is pending (see `is_settled`). Read `seq`
    /// before checking that nothing is queued, so an intake written in between lies after it.
    pub fn mark_settled(&self, seq: u64) -> io::Result<()> {
        let refused = (self.unsettled.lock().unwrap_or_else(|p| p.into_inner())).contains(&self.id);
        if refused {
            // A failed append earlier in this run: the trail may miss a completion.
            let _ = std::fs::remove_file(settled_path(&self.dir, &self.id));
            return Ok(());
        }
        std::fs::write(settled_path(&self.dir, &self.id), seq.to_string())
    }

    /// All trail lines of this session.
    pub fn read_trail(&self) -> io::Result<Vec<TrailLine>> {
        trail::read_trail(&self.dir, &self.id)
    }
}

/// An intake that has no completion record yet.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    pub intake: Intake,
    /// A user turn carrying this id was already written (the loop started): resume it rather
    /// than append the message again.
    pub started: bool,
}

/// Intakes of a trail without a final reply or failure, in intake order (SPEC §5.2).
pub fn pending_intakes(lines: &[TrailLine]) -> Vec<Pending> {
    let mut done: HashSet<&str> = HashSet::new();
    let mut started: HashSet<&str> = HashSet::new();
    for l in lines {
        match &l.event {
            Event::Message(m) if m.starts_work() => {
                started.extend(m.reply_to.iter().map(String::as_str))
            }
            Event::Message(m) if m.is_final => done.extend(m.reply_to.iter().map(String::as_str)),
            Event::Failure { reply_to, .. } => done.extend(reply_to.iter().map(String::as_str)),
            _ => {}
        }
    }
    lines
        .iter()
        .filter_map(|l| match &l.event {
            Event::Intake(i) if !done.contains(i.id.as_str()) => Some(Pending {
                intake: i.clone(),
                started: started.contains(i.id.as_str()),
            }),
            _ => None,
        })
        .collect()
}

/// What became of one intake id, for `agent-send --wait`.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Reply { text: String, silent: bool },
    Failed { reply: String, error: String },
}

/// How a message ended, as one trail line records it: its final answer or its failure.
#[derive(Debug, Clone, Copy)]
pub enum Ending<'a> {
    /// The final answer (`is_final`), with the event for its usage, model and routing.
    Reply {
        text: &'a str,
        event: &'a MessageEvent,
    },
    Failed {
        reply: &'a str,
        error: &'a str,
    },
}

/// The intake ids `event` ends and how, if it ends any: the one reader of "the outcome of this
/// message" (`agent-send --wait`, pending deliveries, a compatible endpoint's duplicate).
pub fn ending(event: &Event) -> Option<(&[String], Ending<'_>)> {
    match event {
        Event::Message(m) if m.is_final => match &m.message {
            crate::message::Message::Assistant { text, .. } => {
                Some((&m.reply_to, Ending::Reply { text, event: m }))
            }
            _ => None,
        },
        Event::Failure {
            reply_to,
            error,
            reply,
        } => Some((reply_to, Ending::Failed { reply, error })),
        _ => None,
    }
}

/// The outcome of intake `id` if the trail has one.
pub fn outcome_of(lines: &[TrailLine], id: &str) -> Option<Outcome> {
    lines.iter().find_map(|l| {
        let (ids, end) = ending(&l.event)?;
        if !ids.iter().any(|r| r == id) {
            return None;
        }
        Some(match end {
            Ending::Reply { text, event } => Outcome::Reply {
                text: text.to_string(),
                silent: event.silent,
            },
            Ending::Failed { reply, error } => Outcome::Failed {
                reply: reply.to_string(),
                error: error.to_string(),
            },
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;

    fn intake(id: &str) -> Event {
        Event::Intake(Intake {
            id: id.into(),
            source: crate::control::Source::User,
            from: "alice".into(),
            text: format!("text {id}"),
            tier: None,
            attachments: vec![],
            route: None,
            notify_meta: None,
            relayed_from: None,
        })
    }

    proptest::proptest! {
        /// The digest ring answers as the last `DEDUP_IDS` distinct id strings would: ids
        /// from a small alphabet repeat, so hits, misses and evictions all happen.
        #[test]
        fn recent_ids_match_a_window_of_the_last_distinct_ids(
            ids in proptest::collection::vec(0u16..400, 0..1500)
        ) {
            let mut ring = RecentIds::default();
            let mut model: std::collections::VecDeque<String> = Default::default();
            for n in ids {
                let id = format!("tg:{n}");
                let seen = model.contains(&id);
                proptest::prop_assert_eq!(ring.contains(&id_digest(&id)), seen);
                if !seen {
                    model.push_back(id.clone());
                    if model.len() > DEDUP_IDS {
                        model.pop_front();
                    }
                }
                ring.insert(id_digest(&id));
                proptest::prop_assert_eq!(ring.order.len(), model.len());
            }
        }
    }

    #[test]
    fn unused_handles_are_closed_beyond_the_bound_and_reopen_where_they_left_off() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        // One handle stays in use the whole time: it must survive every sweep.
        let kept = store.get_or_create("kept", "primary").unwrap();
        let first = store.get_or_create("s0", "primary").unwrap();
        let first_id = first.id.clone();
        first.append(intake("a")).unwrap();
        drop(first);
        for n in 1..(3 * MAX_OPEN_SESSIONS) {
            let h = store.get_or_create(&format!("s{n}"), "primary").unwrap();
            h.append(intake(&format!("i{n}"))).unwrap();
            assert!(store.open_handles() <= MAX_OPEN_SESSIONS, "bounded at {n}");
        }
        let again = store.get_or_create("kept", "primary").unwrap();
        assert!(
            Arc::ptr_eq(&kept, &again),
            "a handle in use is never closed"
        );
        // A closed session reopens with its sequence numbers intact.
        let s0 = store.get_or_create("s0", "primary").unwrap();
        assert_eq!(s0.id, first_id);
        let line = s0.append(intake("b")).unwrap();
        let seqs: Vec<u64> = trail::read_trail(d.path(), &first_id)
            .unwrap()
            .iter()
            .map(|l| l.seq)
            .collect();
        assert_eq!(seqs, [1, 2, 3], "session, a, b");
        assert_eq!(line.seq, 3);
        // Its intake ids are known again: a redelivered id is not taken twice.
        let (_, fresh) = store
            .append_intake(
                "s0",
                "primary",
                Intake {
                    id: "a".into(),
                    source: crate::control::Source::User,
                    from: "alice".into(),
                    text: "again".into(),
                    tier: None,
                    attachments: vec![],
                    route: None,
                    notify_meta: None,
                    relayed_from: None,
                },
            )
            .unwrap();
        assert!(!fresh);
    }

    /// Set every file of session `id` in `dir` to `age` ago.
    fn age_files(dir: &Path, id: &str, age: Duration) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            if e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{id}."))
            {
                let f = std::fs::File::options()
                    .append(true)
                    .open(e.path())
                    .unwrap();
                f.set_modified(SystemTime::now() - age).unwrap();
            }
        }
    }

    #[test]
    fn idle_sessions_are_archived_only_while_idle_and_old_archives_deleted() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        let idle = store.get_or_create("idle", "primary").unwrap().id.clone();
        let busy = store.get_or_create("busy", "primary").unwrap().id.clone();
        let hour = Duration::from_secs(3600);
        age_files(d.path(), &idle, 2 * hour);
        age_files(d.path(), &busy, 2 * hour);
        let found = store.idle_sessions(hour, SystemTime::now()).unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        // "busy" takes a message in before its expiry's turn: it is no longer idle.
        let (_, fresh) = store
            .append_intake(
                "busy",
                "primary",
                match intake("x") {
                    Event::Intake(i) => i,
                    _ => unreachable!(),
                },
            )
            .unwrap();
        assert!(fresh);
        assert!(!store.archive_if_idle("busy", &busy, hour, "idle").unwrap());
        // A key that now names another session is left alone.
        assert!(!store.archive_if_idle("idle", &busy, hour, "idle").unwrap());
        assert!(store.archive_if_idle("idle", &idle, hour, "idle").unwrap());
        assert!(!store.index().contains_key("idle") && store.index().contains_key("busy"));
        let archive = d.path().join(ARCHIVE_DIR);
        assert!(trail::read_trail(&archive, &idle).unwrap().len() >= 2);

        // Archived just now: kept; once its files are old: deleted, every file of it.
        assert_eq!(store.prune_archive(hour, SystemTime::now()).unwrap(), 0);
        age_files(&archive, &idle, 2 * hour);
        assert_eq!(store.prune_archive(hour, SystemTime::now()).unwrap(), 1);
        assert_eq!(std::fs::read_dir(&archive).unwrap().count(), 0);
    }

    #[test]
    fn dedup_remembers_the_last_ids_only_and_reloads_them_from_the_trail() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        let take = |id: &str| {
            let Event::Intake(i) = intake(id) else {
                unreachable!()
            };
            store.append_intake("k", "primary", i).unwrap().1
        };
        let n = DEDUP_IDS + 10;
        for i in 0..n {
            assert!(take(&format!("i{i}")));
        }
        let h = store.get("k").unwrap().unwrap();
        let remembered = || h.intake_ids.lock().unwrap().as_ref().unwrap().order.len();
        assert_eq!(remembered(), DEDUP_IDS);
        // A retry of a recent message is recognised, the newest one included.
        assert!(!take(&format!("i{}", n - 1)));
        assert!(!take(&format!("i{}", n - DEDUP_IDS)));
        // Loaded again from the trail (a new store, as after a restart): the same window.
        drop(h);
        drop(store);
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        let again = |id: &str| {
            let Event::Intake(i) = intake(id) else {
                unreachable!()
            };
            store.append_intake("k", "primary", i).unwrap().1
        };
        assert!(!again(&format!("i{}", n - 1)));
        assert!(!again(&format!("i{}", n - DEDUP_IDS)));
        let ids =
            trail::recent_intake_ids(d.path(), &store.get("k").unwrap().unwrap().id, 3).unwrap();
        assert_eq!(
            ids,
            [
                format!("i{}", n - 3),
                format!("i{}", n - 2),
                format!("i{}", n - 1)
            ]
        );
    }

    #[test]
    fn a_settled_mark_holds_only_while_it_names_the_last_line() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        let h = store.get_or_create("k", "primary").unwrap();
        assert!(!is_settled(d.path(), &h.id), "no mark: unsure");
        h.append(intake("a")).unwrap();
        h.mark_settled(h.last_seq()).unwrap();
        assert!(is_settled(d.path(), &h.id));
        // A line written after the mark (an intake that arrived since): read the trail.
        h.append(intake("b")).unwrap();
        assert!(!is_settled(d.path(), &h.id));
        // A torn mark is never trusted.
        std::fs::write(settled_path(d.path(), &h.id), "").unwrap();
        assert!(!is_settled(d.path(), &h.id));
    }

    /// A refused trail line (a `failure` that a full disk kept out) may leave an intake without
    /// its completion: the mark goes, and no later message of this run writes one again, even
    /// through a new handle, so the next start reads the trail and answers the intake.
    #[test]
    fn a_refused_line_keeps_the_session_unsettled_for_the_run() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        let h = store.get_or_create("k", "primary").unwrap();
        h.append(intake("a")).unwrap();
        h.mark_settled(h.last_seq()).unwrap();
        assert!(is_settled(d.path(), &h.id));
        h.unsettle(); // what `append` does when the trail refuses a line
        assert!(!is_settled(d.path(), &h.id), "the mark is removed");
        h.append(intake("b")).unwrap();
        h.mark_settled(h.last_seq()).unwrap();
        assert!(!is_settled(d.path(), &h.id), "no mark after a refused line");
        let id = h.id.clone();
        drop(h);
        store.lock().open.clear();
        let again = store.get_or_create("k", "primary").unwrap();
        assert_eq!(again.id, id);
        again.mark_settled(again.last_seq()).unwrap();
        assert!(!is_settled(d.path(), &id), "a reopened handle remembers it");
    }

    /// A new session's index entry is handed to the background writer: in memory at once, on
    /// disk after a flush (shutdown) or when the store is dropped.
    #[test]
    fn a_new_session_is_on_disk_in_the_index_after_a_flush() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        let h = store.get_or_create("alice", "primary").unwrap();
        assert_eq!(store.index()["alice"].session_id, h.id);
        store.flush_index();
        assert_eq!(
            index::read_index(d.path()).unwrap()["alice"].session_id,
            h.id
        );
        // Its `session` event, the record the start-up repair reads, is the first line.
        let first = trail::first_line(&trail::trail_files(d.path(), &h.id).unwrap()[0])
            .unwrap()
            .unwrap();
        assert!(
            matches!(&first.event, Event::Session { session_id, key, .. } if *session_id == h.id && key == "alice")
        );
        let bob = store.get_or_create("bob", "primary").unwrap().id.clone();
        drop(h);
        drop(store);
        assert_eq!(index::read_index(d.path()).unwrap()["bob"].session_id, bob);
    }

    /// An archive writes the index through the background writer before it moves files: the
    /// entry is gone on disk when `archive` returns, and no index handed over earlier (a new
    /// session's, still queued) lands after it.
    #[test]
    fn an_archive_is_durable_in_the_index_and_never_overwritten_by_an_older_one() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        for round in 0..20 {
            let key = format!("k{round}");
            let id = store.get_or_create(&key, "primary").unwrap().id.clone();
            assert!(store.archive(&key, "test").unwrap());
            let on_disk = index::read_index(d.path()).unwrap();
            assert!(!on_disk.contains_key(&key), "round {round}");
            assert!(trail::trail_files(d.path(), &id).unwrap().is_empty());
        }
        store.get_or_create("last", "primary").unwrap();
        store.flush_index();
        assert_eq!(index::read_index(d.path()).unwrap(), store.index());
        assert_eq!(store.index().len(), 1);
    }

    /// The scheduler appends a precheck beside the worker, whose state then folds a later
    /// line of its own and jumps over it: the snapshot still carries the precheck, so a reader
    /// of the snapshot and the trail after it sees what a fold of the whole trail gives.
    #[test]
    fn a_precheck_appended_beside_the_worker_reaches_its_snapshot() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        let h = store.get_or_create("cron", "primary").unwrap();
        let mut worker = h.load_state("primary").unwrap();
        let precheck = event::PrecheckEvent {
            schedule: "heartbeat".into(),
            outcome: event::PrecheckOutcome::Run,
            exit_code: Some(0),
            ms: 12,
            saved_usd: None,
        };
        h.append(Event::Precheck(precheck.clone())).unwrap();
        let own = h.append(intake("i1")).unwrap();
        worker.apply(&own);
        assert!(
            worker.last_precheck.is_none(),
            "the worker's fold jumped over it"
        );
        h.queue_snapshot(worker.clone());
        store.flush_snapshots();
        let read = current_state(d.path(), &h.id, "cron").unwrap();
        assert_eq!(read.last_precheck.map(|(_, p)| p), Some(precheck.clone()));
        let full = {
            let mut st = SessionState::new(&h.id, "cron", "", 0);
            for l in h.read_trail().unwrap() {
                st.apply(&l);
            }
            st
        };
        assert_eq!(full.last_precheck.map(|(_, p)| p), Some(precheck));
        // The same at a graceful stop, through the store.
        let mut later = worker;
        later.apply(&h.append(intake("i2")).unwrap());
        assert!(store.snapshot_if_dirty(later));
        store.flush_snapshots();
        let read = current_state(d.path(), &h.id, "cron").unwrap();
        assert!(read.last_precheck.is_some());
    }

    #[test]
    fn create_append_reload_archive() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        let h = store.get_or_create("alice", "primary").unwrap();
        h.append(intake("i1")).unwrap();
        let again = store.get_or_create("alice", "primary").unwrap();
        assert_eq!(again.id, h.id);
        let st = h.load_state("primary").unwrap();
        assert_eq!(st.last_seq, 2);
        h.queue_snapshot(st.clone());
        store.flush_snapshots();

        // A second store (a restart) sees the same session.
        drop(store);
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        let h2 = store.get("alice").unwrap().unwrap();
        assert_eq!(h2.id, h.id);
        h2.append(intake("i2")).unwrap();
        assert_eq!(h2.load_state("primary").unwrap().last_seq, 3);

        assert!(store.archive("alice", "test").unwrap());
        assert!(store.get("alice").unwrap().is_none());
        assert!(!store.archive("alice", "test").unwrap());
        let archived: Vec<_> = std::fs::read_dir(d.path().join(".archive"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(archived.len(), 2, "{archived:?}");
        let lines = trail::read_trail(&d.path().join(".archive"), &h.id).unwrap();
        assert!(matches!(lines.last().unwrap().event, Event::Reset { .. }));
        // A new session for the same key gets a new id.
        let h3 = store.get_or_create("alice", "primary").unwrap();
        assert_ne!(h3.id, h.id);
    }

    /// The snapshot is a cache written on a cadence: a load folds the lines it lacks, and the
    /// state knows how far its snapshot goes.
    #[test]
    fn a_lagging_snapshot_plus_the_newer_lines_is_the_current_state() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        let h = store.get_or_create("alice", "primary").unwrap();
        h.append(Event::Message(MessageEvent::new(Message::user_text("one"))))
            .unwrap();
        let mut st = h.load_state("primary").unwrap();
        assert_eq!((st.last_seq, st.snapshot.0), (2, 0), "no snapshot yet");
        st.mark_saved();
        h.queue_snapshot(st);
        store.flush_snapshots();
        h.append(intake("i2")).unwrap();
        h.append(Event::Message(MessageEvent::new(Message::user_text("two"))))
            .unwrap();
        let st = h.load_state("primary").unwrap();
        assert_eq!((st.last_seq, st.snapshot.0), (4, 2));
        assert_eq!(st.unsaved_lines(), 2);
        let mut full = state::rebuild(&h.id, "alice", &h.read_trail().unwrap());
        full.model = "primary".into();
        assert_eq!(st, full);
        assert_eq!(current_state(d.path(), &h.id, "alice").unwrap(), full);
    }

    /// `snapshot_if_dirty` writes only what lags, and never for a session the index no
    /// longer names (it would land beside the archive); a snapshot is no activity.
    #[test]
    fn only_dirty_states_of_current_sessions_are_snapshotted() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        let h = store.get_or_create("alice", "primary").unwrap();
        h.append(intake("i1")).unwrap();
        let st = h.load_state("primary").unwrap();
        let mut clean = st.clone();
        clean.mark_saved();
        assert!(!store.snapshot_if_dirty(clean));
        assert!(store.snapshot_if_dirty(st.clone()));
        store.flush_snapshots();
        assert_eq!(
            state::read_snapshot(&h.state_path())
                .unwrap()
                .unwrap()
                .last_seq,
            2
        );
        // A snapshot written long after the last line does not make the session active.
        let hour = Duration::from_secs(3600);
        age_files(d.path(), &h.id, 2 * hour);
        std::fs::write(h.state_path(), b"{}").unwrap(); // written now
        let idle = store.idle_sessions(hour, SystemTime::now()).unwrap();
        assert_eq!(idle, [("alice".to_string(), h.id.clone())]);
        // Archived: its state is not written again.
        assert!(store.archive("alice", "test").unwrap());
        assert!(!store.snapshot_if_dirty(st));
        store.flush_snapshots();
        assert!(!h.state_path().exists());
    }

    #[test]
    fn corrupt_snapshot_is_rebuilt_from_trail() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        let h = store.get_or_create("bob", "primary").unwrap();
        let mut m = MessageEvent::new(Message::user_text("hi"));
        m.reply_to = vec!["i1".into()];
        h.append(Event::Message(m)).unwrap();
        std::fs::write(h.state_path(), b"{not json").unwrap();
        let st = h.load_state("primary").unwrap();
        assert_eq!(st.messages, vec![Message::user_text("hi")]);
        assert_eq!(st.model, "primary");
    }

    #[test]
    fn pending_and_outcomes() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        let h = store.get_or_create("alice", "primary").unwrap();
        for id in ["a", "b", "c"] {
            h.append(intake(id)).unwrap();
        }
        let mut u = MessageEvent::new(Message::user_text("a"));
        u.reply_to = vec!["a".into()];
        h.append(Event::Message(u)).unwrap();
        let mut fin = MessageEvent::new(Message::Assistant {
            text: "reply a".into(),
            tool_calls: vec![],
            thinking: vec![],
            usage: None,
        });
        fin.is_final = true;
        fin.reply_to = vec!["a".into()];
        h.append(Event::Message(fin)).unwrap();
        let mut u = MessageEvent::new(Message::user_text("b"));
        u.reply_to = vec!["b".into()];
        h.append(Event::Message(u)).unwrap();

        let lines = h.read_trail().unwrap();
        let p = pending_intakes(&lines);
        assert_eq!(
            p.iter()
                .map(|p| (p.intake.id.as_str(), p.started))
                .collect::<Vec<_>>(),
            [("b", true), ("c", false)]
        );
        assert_eq!(
            outcome_of(&lines, "a"),
            Some(Outcome::Reply {
                text: "reply a".into(),
                silent: false
            })
        );
        assert_eq!(outcome_of(&lines, "b"), None);
        h.append(Event::Failure {
            reply_to: vec!["b".into(), "c".into()],
            error: "boom".into(),
            reply: "sorry".into(),
        })
        .unwrap();
        let lines = h.read_trail().unwrap();
        assert!(pending_intakes(&lines).is_empty());
        assert!(matches!(
            outcome_of(&lines, "c"),
            Some(Outcome::Failed { .. })
        ));
    }
}
