//! Backups (SPEC §24): `agentd backup` writes one tar + zstd file ([`create`]) while the daemon
//! runs; `agentd backup verify` checks one ([`verify()`]); `agentd restore` unpacks one into an
//! empty state directory ([`restore()`]). The daemon uses [`create`] for scheduled backups and
//! for the backup before a migration. Blocking throughout: async callers use `spawn_blocking`.
//!
//! Layout of the archive: `state/…` (the state directory: the sessions' trails, snapshots and
//! index, `agentd.db` and `memory.db` as online-backup copies, the cost spool), `workspace/…`,
//! `config/…` (`agentd.toml`, the provider files, `.env` only with secrets), and last
//! `manifest.json`.

mod create;
pub mod manifest;
mod read;
pub mod restore;

use std::io;
use std::path::{Path, PathBuf};

pub use create::{Report, create};
pub use manifest::{InFlight, Manifest, Problem};
pub use read::{Verified, verify};
pub use restore::{RestoreOptions, Restored, restore};

use crate::config::Config;
use crate::store::StoreError;

/// What a backup reads.
#[derive(Debug, Clone)]
pub struct Sources {
    pub state_dir: PathBuf,
    pub workspace: PathBuf,
    /// `agentd.toml`.
    pub config_path: PathBuf,
    /// The provider files' directory (`[providers] dir`).
    pub providers_dir: PathBuf,
}

impl Sources {
    pub fn of(cfg: &Config) -> Sources {
        Sources {
            state_dir: cfg.paths.state_dir.clone(),
            workspace: cfg.agent.workspace.clone(),
            config_path: cfg.config_path.clone(),
            providers_dir: cfg.providers.dir.clone(),
        }
    }

    /// The secrets file beside the config.
    pub fn env_file(&self) -> PathBuf {
        self.config_path
            .parent()
            .unwrap_or(Path::new("."))
            .join(".env")
    }
}

/// Where a backup goes and what it holds.
#[derive(Debug, Clone)]
pub struct Options {
    /// The archive to write (replaced only when the new one is complete).
    pub to: PathBuf,
    /// Include `config/.env`.
    pub with_secrets: bool,
}

/// How far a backup or a verify is, for a progress bar.
pub trait Progress {
    /// `total` files to go.
    fn begin(&mut self, total: u64);
    /// One file (its path in the archive) done.
    fn file(&mut self, path: &str);
    fn end(&mut self);
}

/// No progress shown (the daemon, `--json`).
pub struct Quiet;

impl Progress for Quiet {
    fn begin(&mut self, _: u64) {}
    fn file(&mut self, _: &str) {}
    fn end(&mut self) {}
}

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{}", io_message(what, path, source))]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error(transparent)]
    Db(#[from] StoreError),
    #[error("{0}")]
    Refused(String),
}

/// A full disk says so and what to do; other errors name the path.
fn io_message(what: &str, path: &Path, source: &io::Error) -> String {
    if source.kind() == io::ErrorKind::StorageFull
        || source.raw_os_error() == Some(nix::libc::ENOSPC)
    {
        format!(
            "cannot {what} {}: no space left on the device; free space there or write the backup elsewhere (--to, [backup] dir)",
            path.display()
        )
    } else {
        format!("cannot {what} {}: {source}", path.display())
    }
}

pub(crate) fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> BackupError {
    let path = path.to_path_buf();
    move |source| BackupError::Io { what, path, source }
}

/// The default name of a backup written at `now`: `agentd-backup-20261207T153000Z.tar.zst`.
pub fn default_name(now: chrono::DateTime<chrono::Utc>) -> String {
    format!("agentd-backup-{}.tar.zst", now.format("%Y%m%dT%H%M%SZ"))
}
