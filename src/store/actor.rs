//! The SQLite actor: one dedicated OS thread owns a `Connection` and runs jobs sent to it over
//! a bounded channel, answering each through a oneshot. Async callers never touch SQLite on a
//! tokio worker (DESIGN §2.4), and no `Mutex<Connection>` is ever held across an `.await`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::StoreError;

/// Jobs waiting for the DB thread. Small: the daemon's write rate is a few rows per LLM call,
/// and a full queue makes callers wait (`send().await`) instead of growing memory.
const QUEUE_CAPACITY: usize = 64;

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// Cheap, cloneable handle to the DB thread. The thread ends (and closes the connection) when
/// the last handle is dropped: its receiver then sees the channel closed.
#[derive(Clone)]
pub(crate) struct Actor {
    tx: mpsc::Sender<Job>,
    path: Arc<PathBuf>,
}

impl Actor {
    /// Move `conn` onto a new thread named `thread_name`. The join handle is only needed by
    /// tests; dropping it detaches the thread, which still ends with the last `Actor`.
    pub(crate) fn spawn(
        conn: Connection,
        path: &Path,
        thread_name: &str,
    ) -> Result<(Actor, JoinHandle<()>), StoreError> {
        let (tx, rx) = mpsc::channel::<Job>(QUEUE_CAPACITY);
        let path = Arc::new(path.to_path_buf());
        let thread_path = Arc::clone(&path);
        let handle = std::thread::Builder::new()
            .name(thread_name.to_string())
            .spawn(move || run(conn, rx, &thread_path))
            .map_err(|source| StoreError::Thread {
                path: path.to_path_buf(),
                source,
            })?;
        Ok((Actor { tx, path }, handle))
    }

    /// The database file this actor serves.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Run `f` on the DB thread and return its result. If the caller's future is dropped after
    /// the job was queued, the job still runs (an insert is not lost by a cancelled caller).
    pub(crate) async fn call<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&mut Connection) -> rusqlite::Result<R> + Send + 'static,
        R: Send + 'static,
    {
        let (reply_tx, reply_rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            // The caller may have gone away; nothing to do then.
            let _ = reply_tx.send(f(conn));
        });
        self.tx.send(job).await.map_err(|_| self.stopped())?;
        reply_rx
            .await
            // The reply sender was dropped unanswered: the job panicked (logged by the thread).
            .map_err(|_| StoreError::Panicked {
                path: self.path.to_path_buf(),
            })?
            .map_err(|source| StoreError::Query {
                path: self.path.to_path_buf(),
                source,
            })
    }

    fn stopped(&self) -> StoreError {
        StoreError::Stopped {
            path: self.path.to_path_buf(),
        }
    }
}

/// The thread body: run jobs until every handle is gone. A panicking job is logged and does not
/// take the thread down with it; its caller gets `StoreError::Panicked`.
fn run(mut conn: Connection, mut rx: mpsc::Receiver<Job>, path: &Path) {
    while let Some(job) = rx.blocking_recv() {
        if catch_unwind(AssertUnwindSafe(|| job(&mut conn))).is_err() {
            tracing::error!(db = %path.display(), "database job panicked");
        }
    }
    tracing::debug!(db = %path.display(), "database thread stopping: all handles dropped");
    if let Err((_, e)) = conn.close() {
        tracing::warn!(db = %path.display(), error = %e, "closing the database failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory_actor() -> (Actor, JoinHandle<()>) {
        let conn = Connection::open_in_memory().unwrap();
        Actor::spawn(conn, Path::new(":memory:"), "agentd-db-test").unwrap()
    }

    #[tokio::test]
    async fn runs_jobs_on_its_own_named_thread() {
        let (actor, _h) = memory_actor();
        let name = actor
            .call(|_| Ok(std::thread::current().name().map(str::to_owned)))
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("agentd-db-test"));
        let two: i64 = actor
            .call(|c| c.query_row("SELECT 1 + 1", [], |r| r.get(0)))
            .await
            .unwrap();
        assert_eq!(two, 2);
    }

    #[tokio::test]
    async fn sql_errors_name_the_database() {
        let (actor, _h) = memory_actor();
        let err = actor
            .call(|c| c.execute("SELECT * FROM missing_table", []))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Query { .. }));
        assert!(err.to_string().contains(":memory:"), "{err}");
        assert!(err.to_string().contains("missing_table"), "{err}");
    }

    #[tokio::test]
    async fn a_panicking_job_does_not_kill_the_thread() {
        let (actor, _h) = memory_actor();
        let err = actor
            .call::<(), _>(|_| panic!("boom (expected by this test)"))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Panicked { .. }), "{err}");
        let one: i64 = actor
            .call(|c| c.query_row("SELECT 1", [], |r| r.get(0)))
            .await
            .unwrap();
        assert_eq!(one, 1);
    }

    #[tokio::test]
    async fn thread_ends_when_the_last_handle_drops() {
        let (actor, handle) = memory_actor();
        let clone = actor.clone();
        drop(actor);
        // The clone keeps the thread alive.
        clone.call(|_| Ok(())).await.unwrap();
        assert!(!handle.is_finished());
        drop(clone);
        // join() returns only if the thread's loop saw the channel close.
        tokio::task::spawn_blocking(move || handle.join())
            .await
            .unwrap()
            .expect("thread exited cleanly");
    }
}
