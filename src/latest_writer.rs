//! One background thread that writes files, newest value per file: `monitor.json` (the live
//! view) and the session snapshots (`<id>.state.json`) are rewritten after events on the
//! async workers, which hand the value over and go on instead of waiting for the disk
//! (docs/BENCHMARKS.md, overhead). A value handed over for a file whose previous value the
//! thread has not taken yet replaces it: a burst of updates costs one write, and each file is
//! only ever written by the thread, in hand-over order.
//!
//! The thread starts with the first value. If it cannot start, values are written inline.
//! Dropping the writer writes what is queued and stops the thread.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Writes one value to its file; reports failures itself (the callers never fail on them).
type WriteFn<T> = dyn Fn(&Path, &T) + Send + Sync;

pub struct LatestWriter<T> {
    name: &'static str,
    /// Rest after each write, so the values handed over meanwhile cost one write.
    pause: Duration,
    write: Arc<WriteFn<T>>,
    shared: Arc<Shared<T>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

struct Shared<T> {
    state: Mutex<Queue<T>>,
    changed: Condvar,
}

struct Queue<T> {
    /// Values not yet taken by the thread, oldest first; at most one per path.
    waiting: Vec<(PathBuf, T)>,
    /// The file being written right now.
    writing: Option<PathBuf>,
    stop: bool,
    /// The thread could not be started: callers write themselves.
    inline: bool,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, Queue<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, q: MutexGuard<'a, Queue<T>>, left: Duration) -> MutexGuard<'a, Queue<T>> {
        self.changed
            .wait_timeout(q, left)
            .unwrap_or_else(|e| e.into_inner())
            .0
    }
}

impl<T> std::fmt::Debug for LatestWriter<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatestWriter")
            .field("thread", &self.name)
            .finish()
    }
}

impl<T: Send + 'static> LatestWriter<T> {
    /// A writer whose thread is called `name` and writes each value with `write`.
    pub fn new(name: &'static str, write: impl Fn(&Path, &T) + Send + Sync + 'static) -> Self {
        LatestWriter {
            name,
            pause: Duration::ZERO,
            write: Arc::new(write),
            shared: Arc::new(Shared {
                state: Mutex::new(Queue {
                    waiting: Vec::new(),
                    writing: None,
                    stop: false,
                    inline: false,
                }),
                changed: Condvar::new(),
            }),
            thread: Mutex::new(None),
        }
    }

    /// The same writer, resting `pause` after each write: everything handed over meanwhile is
    /// written once, after it (a stop or a `flush` still gets every value written).
    pub fn with_pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    /// Hand `value` over as the next content of `path`, replacing a value for `path` the
    /// thread has not taken yet.
    pub fn submit(&self, path: PathBuf, value: T) {
        self.start();
        let mut q = self.shared.lock();
        if q.inline {
            drop(q);
            (self.write)(&path, &value);
            return;
        }
        match q.waiting.iter_mut().find(|(p, _)| *p == path) {
            Some(entry) => entry.1 = value,
            None => q.waiting.push((path, value)),
        }
        drop(q);
        self.shared.changed.notify_all();
    }

    /// Blocks until nothing for `path` is queued or being written (before the file moves).
    pub fn wait_for(&self, path: &Path) {
        let mut q = self.shared.lock();
        while q.writing.as_deref() == Some(path) || q.waiting.iter().any(|(p, _)| p == path) {
            q = self.shared.wait(q, Duration::from_secs(1));
        }
    }

    /// Blocks until everything handed over so far is written, or `timeout` passed.
    pub fn flush(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut q = self.shared.lock();
        while q.writing.is_some() || !q.waiting.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            q = self.shared.wait(q, left);
        }
    }

    /// Values waiting for the thread.
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.shared.lock().waiting.len()
    }

    fn start(&self) {
        let mut thread = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        if thread.is_some() || self.shared.lock().inline {
            return;
        }
        let (shared, write, pause) = (self.shared.clone(), self.write.clone(), self.pause);
        match std::thread::Builder::new()
            .name(self.name.into())
            .spawn(move || write_loop(&shared, &*write, pause))
        {
            Ok(t) => *thread = Some(t),
            Err(e) => {
                tracing::warn!(thread = self.name, error = %e, "cannot start the writer thread; writing inline");
                self.shared.lock().inline = true;
            }
        }
    }
}

impl<T> Drop for LatestWriter<T> {
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

/// Writes the oldest queued value until told to stop with an empty queue, resting `pause`
/// after each write (cut short by a stop).
fn write_loop<T>(shared: &Shared<T>, write: &WriteFn<T>, pause: Duration) {
    loop {
        let (path, value) = {
            let mut q = shared.lock();
            while q.waiting.is_empty() && !q.stop {
                q = shared.changed.wait(q).unwrap_or_else(|e| e.into_inner());
            }
            if q.waiting.is_empty() {
                return;
            }
            let (path, value) = q.waiting.remove(0);
            q.writing = Some(path.clone());
            (path, value)
        };
        write(&path, &value);
        let mut q = shared.lock();
        q.writing = None;
        shared.changed.notify_all();
        let until = Instant::now() + pause;
        while !q.stop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            q = shared.wait(q, left);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer() -> LatestWriter<u64> {
        LatestWriter::new("test-writer", |path, n: &u64| {
            crate::fsutil::atomic_write(path, n.to_string().as_bytes()).unwrap()
        })
    }

    #[test]
    fn a_pause_after_a_write_gathers_what_comes_meanwhile_into_one_write() {
        let d = tempfile::tempdir().unwrap();
        let writes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = writes.clone();
        let w = LatestWriter::new("test-writer", move |path, n: &u64| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            crate::fsutil::atomic_write(path, n.to_string().as_bytes()).unwrap()
        })
        .with_pause(Duration::from_secs(2));
        let a = d.path().join("a");
        w.submit(a.clone(), 1);
        w.flush(Duration::from_secs(10));
        assert_eq!(on_disk(&a), 1);
        for n in 2..=50u64 {
            w.submit(a.clone(), n);
        }
        // Gathered into one value while the writer rests.
        assert_eq!(w.queued(), 1);
        assert_eq!(writes.load(std::sync::atomic::Ordering::SeqCst), 1);
        // A stop cuts the pause short (or this test would not end) and writes what is queued,
        // once.
        drop(w);
        assert_eq!(on_disk(&a), 50);
        assert_eq!(writes.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    fn on_disk(path: &Path) -> u64 {
        std::fs::read_to_string(path).unwrap().parse().unwrap()
    }

    #[test]
    fn newest_value_of_a_path_wins_and_flush_waits_for_it() {
        let d = tempfile::tempdir().unwrap();
        let w = writer();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        for n in 1..=50u64 {
            w.submit(a.clone(), n);
            w.submit(b.clone(), n + 100);
            assert!(w.queued() <= 2, "one queued value per path at most");
        }
        w.flush(Duration::from_secs(10));
        assert_eq!(on_disk(&a), 50);
        assert_eq!(on_disk(&b), 150);
        w.submit(a.clone(), 51);
        w.wait_for(&a);
        assert_eq!(on_disk(&a), 51);
        // Dropping the writer writes what is queued.
        w.submit(b.clone(), 151);
        drop(w);
        assert_eq!(on_disk(&b), 151);
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 2, "no temp file left behind");
    }
}
