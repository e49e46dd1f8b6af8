//! The snapshot writer: `<id>.state.json` files are written (temp + fsync + rename + directory
//! fsync) by one thread, `agentd-snapshot`, so that no session worker waits for the disk after
//! its reply (docs/BENCHMARKS.md, overhead).
//!
//! A snapshot is a cache of the trail: the caller hands over a state only once every trail line
//! it folds in is durable, so whichever snapshot is on disk — the newest, an older one, none —
//! plus the trail lines after its `last_seq` is the session's state (`SessionHandle::
//! load_state`). If a session's next state arrives before the thread took the previous one,
//! only the newer is written (it contains everything the older one did). The queue holds at
//! most one state per session; the thread also serialises them, so a worker pays one clone.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::state::{SessionState, write_snapshot};

/// Hands snapshots to the writer thread (started on first use).
#[derive(Default)]
pub struct SnapshotWriter {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<Queue>,
    changed: Condvar,
}

#[derive(Default)]
struct Queue {
    /// States not yet taken by the thread, oldest first. At most one per path.
    waiting: Vec<(PathBuf, SessionState)>,
    /// The file being written right now.
    writing: Option<PathBuf>,
    stop: bool,
    /// The thread could not be started: callers write themselves.
    inline: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SnapshotWriter {
    /// Queue `state` as the snapshot at `path`. A queued, not yet written snapshot of the same
    /// path is replaced when this one is not older.
    pub fn submit(&self, path: PathBuf, state: SessionState) {
        self.start();
        let mut q = self.shared.lock();
        if q.inline {
            drop(q);
            write(&path, &state);
            return;
        }
        match q.waiting.iter_mut().find(|(p, _)| *p == path) {
            Some(entry) if entry.1.last_seq <= state.last_seq => entry.1 = state,
            Some(_) => {}
            None => q.waiting.push((path, state)),
        }
        drop(q);
        self.shared.changed.notify_all();
    }

    /// Blocks until no snapshot of `path` is queued or being written (before the session's
    /// files move to the archive).
    pub fn wait_for(&self, path: &Path) {
        let mut q = self.shared.lock();
        while q.writing.as_deref() == Some(path) || q.waiting.iter().any(|(p, _)| p == path) {
            q = self
                .shared
                .changed
                .wait(q)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Blocks until every snapshot queued so far is written (shutdown, tests).
    pub fn flush(&self) {
        let mut q = self.shared.lock();
        while q.writing.is_some() || !q.waiting.is_empty() {
            q = self
                .shared
                .changed
                .wait(q)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Snapshots waiting for the thread.
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.shared.lock().waiting.len()
    }

    fn start(&self) {
        let mut thread = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        if thread.is_some() || self.shared.lock().inline {
            return;
        }
        let shared = self.shared.clone();
        match std::thread::Builder::new()
            .name("agentd-snapshot".into())
            .spawn(move || write_loop(&shared))
        {
            Ok(t) => *thread = Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the snapshot writer; writing snapshots inline");
                self.shared.lock().inline = true;
            }
        }
    }
}

impl Drop for SnapshotWriter {
    /// Writes what is queued and stops the thread.
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// Writes the oldest queued snapshot until told to stop with an empty queue.
fn write_loop(shared: &Shared) {
    loop {
        let (path, state) = {
            let mut q = shared.lock();
            while q.waiting.is_empty() && !q.stop {
                q = shared.changed.wait(q).unwrap_or_else(|e| e.into_inner());
            }
            if q.waiting.is_empty() {
                return;
            }
            let (path, state) = q.waiting.remove(0);
            q.writing = Some(path.clone());
            (path, state)
        };
        write(&path, &state);
        shared.lock().writing = None;
        shared.changed.notify_all();
    }
}

/// The trail is the source of truth: a snapshot that cannot be written (full disk) is rebuilt
/// from it later, so this is a warning, not a failure.
fn write(path: &Path, state: &SessionState) {
    if let Err(e) = write_snapshot(path, state) {
        tracing::warn!(path = %path.display(), error = %e, "cannot save the state snapshot");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(id: &str, seq: u64) -> SessionState {
        let mut s = SessionState::new(id, id, "m", 0);
        s.last_seq = seq;
        s
    }

    fn seq_on_disk(path: &Path) -> u64 {
        super::super::state::read_snapshot(path)
            .unwrap()
            .unwrap()
            .last_seq
    }

    #[test]
    fn newest_snapshot_of_a_path_wins_and_flush_waits_for_it() {
        let d = tempfile::tempdir().unwrap();
        let w = SnapshotWriter::default();
        let (a, b) = (d.path().join("a.state.json"), d.path().join("b.state.json"));
        for seq in 1..=50u64 {
            w.submit(a.clone(), state("a", seq));
            w.submit(b.clone(), state("b", seq));
            assert!(w.queued() <= 2, "one queued snapshot per path at most");
        }
        w.flush();
        assert_eq!(seq_on_disk(&a), 50);
        assert_eq!(seq_on_disk(&b), 50);
        w.submit(a.clone(), state("a", 51));
        w.wait_for(&a);
        assert_eq!(seq_on_disk(&a), 51);
        // Dropping the writer writes what is queued.
        w.submit(b.clone(), state("b", 53));
        drop(w);
        assert_eq!(seq_on_disk(&b), 53);
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 2, "no temp file left behind");
    }
}
