//! `agentd restore FILE --state-dir DIR` (SPEC §24): the archive is unpacked and checked beside
//! the target first, and only a backup without problems is moved into place. A non-empty
//! target is refused unless `force`, which moves it aside (never deletes it). Closing the
//! deliveries that were open at backup time is the daemon's rule (`daemon::delivery`), run by
//! the CLI after this.

use std::fs;
use std::path::{Path, PathBuf};

use super::manifest::Manifest;
use super::{BackupError, Progress, io_err};
use crate::fsutil;

#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// The state directory to restore into.
    pub state_dir: PathBuf,
    /// Move a non-empty target aside instead of refusing.
    pub force: bool,
    /// Where the workspace goes; default `<state_dir>/from-backup/workspace`.
    pub workspace: Option<PathBuf>,
    /// Where the config files go; default `<state_dir>/from-backup/config`.
    pub config_dir: Option<PathBuf>,
}

/// What a restore did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Restored {
    pub state_dir: PathBuf,
    pub workspace: Option<PathBuf>,
    pub config_dir: Option<PathBuf>,
    /// Directories that were in the way, moved aside by `--force`.
    pub moved_aside: Vec<PathBuf>,
    pub manifest: Manifest,
}

pub fn restore(
    file: &Path,
    opts: &RestoreOptions,
    progress: &mut dyn Progress,
) -> Result<Restored, BackupError> {
    let now = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
    let targets = [
        (opts.state_dir.clone(), "state"),
        (
            opts.workspace
                .clone()
                .unwrap_or_else(|| opts.state_dir.join("from-backup/workspace")),
            "workspace",
        ),
        (
            opts.config_dir
                .clone()
                .unwrap_or_else(|| opts.state_dir.join("from-backup/config")),
            "config",
        ),
    ];
    for (dir, _) in &targets {
        if !is_empty(dir)? && !opts.force {
            return Err(BackupError::Refused(format!(
                "{} is not empty: restore into an empty or new directory, or pass --force to move it aside to {}",
                dir.display(),
                aside(dir, &now).display()
            )));
        }
    }
    let parent = opts.state_dir.parent().unwrap_or(Path::new("."));
    fsutil::create_private_dir(parent).map_err(io_err("create", parent))?;
    let scratch = parent.join(fsutil::temp_name("agentd-restore"));
    fsutil::create_private_dir(&scratch).map_err(io_err("create", &scratch))?;
    let result = place(file, opts, &targets, &scratch, &now, progress);
    let _ = fs::remove_dir_all(&scratch);
    result
}

/// Unpack into `scratch`, check, then move each part into place.
fn place(
    file: &Path,
    opts: &RestoreOptions,
    targets: &[(PathBuf, &str); 3],
    scratch: &Path,
    now: &str,
    progress: &mut dyn Progress,
) -> Result<Restored, BackupError> {
    let verified = super::read::unpack_and_check(file, scratch, progress)?;
    let manifest = match verified.manifest {
        Some(m) if verified.problems.is_empty() => m,
        _ => {
            let list: Vec<String> = verified.problems.iter().map(ToString::to_string).collect();
            return Err(BackupError::Refused(format!(
                "{} has problems, nothing was restored:\n  {}",
                file.display(),
                list.join("\n  ")
            )));
        }
    };
    let mut moved_aside = Vec::new();
    let mut placed = [None, None, None];
    for (i, (dir, part)) in targets.iter().enumerate() {
        let from = scratch.join(part);
        if !from.exists() && *part != "state" {
            continue;
        }
        if !is_empty(dir)? {
            let to = aside(dir, now);
            fs::rename(dir, &to).map_err(io_err("move aside", dir))?;
            moved_aside.push(to);
        } else if dir.exists() {
            fs::remove_dir(dir).map_err(io_err("replace", dir))?;
        }
        if let Some(p) = dir.parent() {
            fsutil::create_private_dir(p).map_err(io_err("create", p))?;
        }
        if from.exists() {
            fs::rename(&from, dir).map_err(io_err("move into place", dir))?;
        } else {
            fsutil::create_private_dir(dir).map_err(io_err("create", dir))?;
        }
        placed[i] = Some(dir.clone());
    }
    let _ = fsutil::fsync_dir(opts.state_dir.parent().unwrap_or(Path::new(".")));
    let [_, workspace, config_dir] = placed;
    Ok(Restored {
        state_dir: opts.state_dir.clone(),
        workspace,
        config_dir,
        moved_aside,
        manifest,
    })
}

/// Where `--force` moves `dir`: `<dir>.before-restore-<time>`.
fn aside(dir: &Path, now: &str) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".before-restore-{now}"));
    dir.with_file_name(name)
}

fn is_empty(dir: &Path) -> Result<bool, BackupError> {
    match fs::read_dir(dir) {
        Ok(mut rd) => Ok(rd.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(io_err("read", dir)(e)),
    }
}
