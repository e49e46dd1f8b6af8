//! Scheduled backups (SPEC §24, `[backup] every`): one task writes a backup every `every` on the
//! blocking pool, off the message path, into `[backup] dir` (default `<state_dir>/backups`),
//! keeps the newest `keep`, and reports each run in the log, `/metrics`
//! (`agentd_backups_total`) and `monitor.json` (`backup`). A failure is an alert like the cache
//! alarm's: a warning, an entry in the monitor's `alerts`, one notice to the `[alerts]` chat;
//! the next good backup ends it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::services::{Services, Tasks};
use crate::backup::{Options, Quiet, Sources};

/// Scheduled backups' names start with this (what `keep` counts and deletes).
const PREFIX: &str = "agentd-backup-";

/// Start the task when `[backup] every` is set.
pub fn start(s: &Services, tasks: &Tasks) {
    let Some(every) = s.cfg.backup.every else {
        return;
    };
    let dir = s
        .cfg
        .backup
        .dir
        .clone()
        .unwrap_or_else(|| s.paths.root.join(super::upgrade::BACKUPS_DIR));
    let run = Run {
        sources: Sources::of(&s.cfg),
        dir,
        keep: s.cfg.backup.keep,
        monitor: s.monitor.clone(),
        metrics: s.metrics.clone(),
        alert: s.alert.clone(),
    };
    let stop = tasks.stop.clone();
    tasks
        .tracker
        .spawn(async move { run.every(every, stop).await });
}

struct Run {
    sources: Sources,
    dir: PathBuf,
    keep: usize,
    monitor: std::sync::Arc<crate::monitor::Monitor>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    alert: Option<crate::cost::alarm::Notify>,
}

impl Run {
    async fn every(self, every: Duration, stop: CancellationToken) {
        let mut failing = false;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            failing = self.once(failing).await;
        }
    }

    /// One backup; returns whether it failed.
    async fn once(&self, was_failing: bool) -> bool {
        let (sources, dir, keep) = (self.sources.clone(), self.dir.clone(), self.keep);
        let result = tokio::task::spawn_blocking(move || write(&sources, &dir, keep))
            .await
            .unwrap_or_else(|e| Err(format!("the backup task failed: {e}")));
        let at = chrono::Utc::now().to_rfc3339();
        self.metrics.backup(result.is_ok());
        match result {
            Ok(report) => {
                tracing::info!(backup = %report.path.display(), bytes = report.bytes,
                    in_flight = report.in_flight.len(), "scheduled backup written");
                self.monitor.set_backup(json!({
                    "at": at, "ok": true, "path": report.path, "bytes": report.bytes,
                }));
                if was_failing {
                    self.monitor.set_alert("backup", None);
                }
                false
            }
            Err(e) => {
                let message = format!(
                    "the scheduled backup into {} failed: {e}",
                    self.dir.display()
                );
                tracing::warn!("{message}");
                self.monitor
                    .set_backup(json!({"at": at, "ok": false, "error": e}));
                self.monitor.set_alert(
                    "backup",
                    Some(json!({"kind": "backup", "since": at, "message": message})),
                );
                if let (false, Some(notify)) = (was_failing, &self.alert) {
                    notify(format!("agentd: {message}"));
                }
                true
            }
        }
    }
}

/// Write one backup into `dir` and delete the oldest beyond `keep`. Blocking.
fn write(sources: &Sources, dir: &Path, keep: usize) -> Result<crate::backup::Report, String> {
    crate::fsutil::create_private_dir(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // Temp files a killed backup left behind.
    let _ = crate::fsutil::remove_stale_temps(dir);
    let name = crate::backup::default_name(chrono::Utc::now());
    let opts = Options {
        to: dir.join(name),
        with_secrets: false,
    };
    let report = crate::backup::create(sources, &opts, &mut Quiet).map_err(|e| e.to_string())?;
    prune(dir, keep);
    Ok(report)
}

/// Delete the oldest scheduled backups of `dir` beyond the newest `keep` (their names sort by
/// time).
fn prune(dir: &Path, keep: usize) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut names: Vec<PathBuf> = rd
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(PREFIX) && n.ends_with(".tar.zst"))
        })
        .collect();
    names.sort();
    let excess = names.len().saturating_sub(keep);
    for old in &names[..excess] {
        match std::fs::remove_file(old) {
            Ok(()) => tracing::info!(backup = %old.display(), "old scheduled backup deleted"),
            Err(e) => {
                tracing::warn!(backup = %old.display(), error = %e, "cannot delete an old backup")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_keeps_the_newest_backups_and_nothing_else_is_touched() {
        let dir = tempfile::tempdir().unwrap();
        for n in [
            "agentd-backup-20260101T000000Z.tar.zst",
            "agentd-backup-20260102T000000Z.tar.zst",
            "agentd-backup-20260103T000000Z.tar.zst",
            "pre-migration-20250101T000000Z.tar.zst",
        ] {
            std::fs::write(dir.path().join(n), b"x").unwrap();
        }
        prune(dir.path(), 2);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "agentd-backup-20260102T000000Z.tar.zst",
                "agentd-backup-20260103T000000Z.tar.zst",
                "pre-migration-20250101T000000Z.tar.zst"
            ]
        );
    }
}
