//! Bounded state (SPEC §16.3): one task that, at start and then on a fixed schedule, deletes
//! old files of `inbox/`, archives idle sessions through their queues (as `/reset` does),
//! deletes old archived sessions, and prunes finished `scheduled` rows and the query-embedding
//! cache. Runs until the daemon's stop token fires.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use super::queue::Job;
use super::services::{Services, Tasks};
use super::workers::Dispatcher;
use crate::config::RetentionConfig;
use crate::memory::Memory;
use crate::session::SessionStore;
use crate::store::Db;

/// The pass interval with the default ages (SPEC §16.3: "checked hourly").
pub const PASS_INTERVAL: Duration = Duration::from_secs(3600);

/// Done and cancelled scheduled messages are kept this long after they were due.
pub const SCHEDULED_KEEP: Duration = Duration::from_secs(86_400);

/// The interval between passes: hourly, or a quarter of the smallest configured age when that
/// is shorter (so an age of minutes or seconds, as tests use, is honoured closely), at least
/// one second.
pub fn pass_interval(cfg: &RetentionConfig) -> Duration {
    [
        cfg.inbox_max_age,
        cfg.idle_session_after,
        cfg.archive_max_age,
    ]
    .into_iter()
    .flatten()
    .map(|age| age / 4)
    .fold(PASS_INTERVAL, Duration::min)
    .max(Duration::from_secs(1))
}

/// What one pass works on.
struct Retention {
    cfg: RetentionConfig,
    inbox: PathBuf,
    store: Arc<SessionStore>,
    dispatcher: Arc<Dispatcher>,
    db: Db,
    memory: Option<Memory>,
}

/// Start the retention task on the run's tracker.
pub fn start(s: &Services, tasks: &Tasks) {
    let r = Retention {
        cfg: s.cfg.retention.clone(),
        inbox: s.paths.inbox(),
        store: s.store.clone(),
        dispatcher: s.dispatcher.clone(),
        db: s.db.clone(),
        memory: s.memory.clone(),
    };
    let stop = tasks.stop.clone();
    tasks.tracker.spawn(async move { r.run(stop).await });
}

impl Retention {
    async fn run(self, stop: CancellationToken) {
        let interval = pass_interval(&self.cfg);
        loop {
            self.pass().await;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }

    /// One pass. Each part logs its own failure and the others still run.
    async fn pass(&self) {
        let now = SystemTime::now();
        if let Some(age) = self.cfg.inbox_max_age {
            let inbox = self.inbox.clone();
            match tokio::task::spawn_blocking(move || prune_files(&inbox, age, now)).await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => tracing::info!(count = n, "old inbox files deleted"),
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot clean the inbox"),
                Err(e) => tracing::warn!(error = %e, "inbox clean-up task failed"),
            }
        }
        if let Some(idle) = self.cfg.idle_session_after {
            self.expire_idle(idle, now).await;
        }
        if let Some(age) = self.cfg.archive_max_age {
            let store = self.store.clone();
            match tokio::task::spawn_blocking(move || store.prune_archive(age, now)).await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => tracing::info!(count = n, "old archived sessions deleted"),
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot clean the session archive"),
                Err(e) => tracing::warn!(error = %e, "archive clean-up task failed"),
            }
        }
        let before = chrono::Utc::now().timestamp() - SCHEDULED_KEEP.as_secs() as i64;
        match self.db.schedule_prune(before).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(count = n, "finished scheduled messages pruned"),
            Err(e) => tracing::warn!(error = %e, "cannot prune scheduled messages"),
        }
        if let Some(memory) = &self.memory {
            match memory.prune_embedding_cache().await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(count = n, "old cached embeddings dropped"),
                Err(e) => tracing::warn!(error = %e, "cannot prune the embedding cache"),
            }
        }
    }

    /// Queue an `Expire` job for every idle session: it runs after whatever the session has
    /// queued or running and checks again, so no message is ever archived under it.
    async fn expire_idle(&self, idle: Duration, now: SystemTime) {
        let store = self.store.clone();
        let idle_sessions =
            match tokio::task::spawn_blocking(move || store.idle_sessions(idle, now)).await {
                Ok(Ok(v)) => v,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot list idle sessions");
                    return;
                }
                Err(_) => return,
            };
        if !idle_sessions.is_empty() {
            tracing::info!(count = idle_sessions.len(), "archiving idle sessions");
        }
        for (key, session_id) in idle_sessions {
            let job = Job::Expire {
                session_id,
                idle_for: idle,
            };
            self.dispatcher.submit(&key, job).await;
        }
    }
}

/// Delete regular files under `dir` (recursively) last modified more than `age` before `now`.
/// Directories are kept. A missing `dir` is empty. Returns how many files went.
pub fn prune_files(dir: &Path, age: Duration, now: SystemTime) -> std::io::Result<usize> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut count = 0;
    for e in entries {
        let e = e?;
        let meta = e.metadata()?;
        if meta.is_dir() {
            count += prune_files(&e.path(), age, now)?;
        } else if meta.is_file() && now.duration_since(meta.modified()?).is_ok_and(|d| d > age) {
            std::fs::remove_file(e.path())?;
            count += 1;
        }
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ages(inbox: u64, idle: u64, archive: u64) -> RetentionConfig {
        let d = |s: u64| (s > 0).then(|| Duration::from_secs(s));
        RetentionConfig {
            inbox_max_age: d(inbox),
            idle_session_after: d(idle),
            archive_max_age: d(archive),
        }
    }

    #[test]
    fn passes_are_hourly_unless_an_age_is_short() {
        assert_eq!(pass_interval(&ages(30 * 86_400, 0, 0)), PASS_INTERVAL);
        assert_eq!(pass_interval(&ages(0, 0, 0)), PASS_INTERVAL);
        assert_eq!(
            pass_interval(&ages(30 * 86_400, 600, 0)),
            Duration::from_secs(150)
        );
        assert_eq!(
            pass_interval(&ages(0, 2, 0)),
            Duration::from_secs(1),
            "at least one second"
        );
    }

    #[test]
    fn old_files_go_and_fresh_ones_and_directories_stay() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("voice");
        std::fs::create_dir(&sub).unwrap();
        let now = SystemTime::now();
        let old = now - Duration::from_secs(7200);
        for p in [dir.path().join("old.txt"), sub.join("old.ogg")] {
            let f = std::fs::File::create(&p).unwrap();
            f.set_modified(old).unwrap();
        }
        std::fs::write(dir.path().join("fresh.txt"), "x").unwrap();
        let n = prune_files(dir.path(), Duration::from_secs(3600), now).unwrap();
        assert_eq!(n, 2);
        assert!(dir.path().join("fresh.txt").exists());
        assert!(sub.is_dir());
        assert!(!dir.path().join("old.txt").exists());
        assert_eq!(
            prune_files(&dir.path().join("missing"), Duration::ZERO, now).unwrap(),
            0
        );
    }
}
