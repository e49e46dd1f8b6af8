//! Upgrades (SPEC §24): before a migration of `agentd.db` or `memory.db`, a backup of the whole
//! state is written (`state_dir/backups/pre-migration-<time>.tar.zst`) and named in the log. A
//! migration runs in one transaction, so a failed one leaves the files as they were; the
//! daemon then exits with a message naming the backup.

use std::path::PathBuf;

use super::DaemonError;
use crate::backup::{Options, Quiet, Sources};
use crate::config::Config;
use crate::store::backup::{DbKind, pending_migration};

/// The directory of the automatic backups under the state directory (left out of backups).
pub const BACKUPS_DIR: &str = "backups";

/// Write a backup when opening a database will migrate it; `Ok(None)` when none will. A
/// backup that cannot be written stops the start: nothing is migrated without one. Blocking.
pub fn backup_before_migration(cfg: &Config) -> Result<Option<PathBuf>, DaemonError> {
    let mut pending = Vec::new();
    for kind in DbKind::ALL {
        let path = cfg.paths.state_dir.join(kind.file_name());
        match pending_migration(kind, &path) {
            Ok(Some((from, to))) => pending.push(format!("{} {from} → {to}", kind.file_name())),
            Ok(None) => {}
            // Opening it will say what is wrong.
            Err(_) => {}
        }
    }
    if pending.is_empty() {
        return Ok(None);
    }
    let dir = cfg.paths.state_dir.join(BACKUPS_DIR);
    let name = format!(
        "pre-migration-{}.tar.zst",
        chrono::Utc::now().format("%Y%m%dT%H%M%SZ")
    );
    let to = dir.join(name);
    let written = crate::fsutil::create_private_dir(&dir)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            let opts = Options {
                to: to.clone(),
                with_secrets: false,
            };
            crate::backup::create(&Sources::of(cfg), &opts, &mut Quiet).map_err(|e| e.to_string())
        });
    match written {
        Ok(report) => {
            tracing::info!(backup = %report.path.display(), migrations = %pending.join(", "),
                "wrote a backup before migrating the databases");
            Ok(Some(report.path))
        }
        Err(e) => Err(DaemonError::Startup(format!(
            "the databases need a migration ({}), and the backup before it failed: {e}; nothing was changed",
            pending.join(", ")
        ))),
    }
}

/// The start-up error of a database that failed to open after a backup before its migration.
pub fn failed_after_backup(
    what: &str,
    e: &dyn std::fmt::Display,
    backup: &std::path::Path,
) -> DaemonError {
    DaemonError::Startup(format!(
        "{what}: {e}; the database files are as they were before (the migration runs in one \
         transaction), and the backup written before it is {} (agentd restore)",
        backup.display()
    ))
}
