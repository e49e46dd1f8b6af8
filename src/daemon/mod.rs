//! The daemon (SPEC §5, §10.4): builds the services (`services`), recovers unfinished work,
//! starts the sources (`sources`) and per-session workers (`workers`), and owns the lifecycle
//! (`lifecycle`: signals, READY, the two-stage stop). [`run`] reads as that list.

pub mod a2a;
pub mod after;
pub mod approvals;
pub mod backups;
pub mod chat;
pub mod compat;
mod console_backend;
pub mod delivery;
pub mod http_backend;
pub mod idle;
pub mod intake;
pub mod lifecycle;
pub mod matrix;
pub mod mcp_backend;
pub mod notify;
pub mod pidlock;
pub mod queue;
pub mod reload;
pub mod retention;
pub mod services;
pub mod session_control;
pub mod signals;
pub mod sources;
pub mod telegram;
pub mod upgrade;
pub mod voice;
pub mod workers;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::fsutil;

pub use lifecycle::SHUTDOWN_DEADLINE;
use services::{Services, Tasks};

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Configuration or start-up problem (exit code 1).
    #[error("{0}")]
    Startup(String),
    /// Failure while running (exit code 3).
    #[error("{0}")]
    Runtime(String),
}

impl DaemonError {
    pub fn exit_code(&self) -> i32 {
        match self {
            DaemonError::Startup(_) => 1,
            DaemonError::Runtime(_) => 3,
        }
    }
}

/// Well-known paths under the state directory (SPEC §2).
pub struct StatePaths {
    pub root: PathBuf,
}

impl StatePaths {
    pub fn pid(&self) -> PathBuf {
        self.root.join("agentd.pid")
    }
    pub fn db(&self) -> PathBuf {
        self.root.join("agentd.db")
    }
    pub fn sessions(&self) -> PathBuf {
        self.root.join("sessions")
    }
    pub fn monitor(&self) -> PathBuf {
        self.root.join("monitor.json")
    }
    pub fn inbox(&self) -> PathBuf {
        self.root.join("inbox")
    }
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }
}

/// A state directory that existed wider than 0700 (made by hand, 0755) is tightened, with a
/// warning; one owned by another uid is only warned about (issue #12, finding 16).
fn tighten_state_dir(dir: &std::path::Path) {
    match fsutil::tighten_private_dir(dir) {
        Ok(fsutil::Tightened::AlreadyPrivate) => {}
        Ok(fsutil::Tightened::From(mode)) => tracing::warn!(
            dir = %dir.display(),
            "state directory had mode {mode:o}, which let other users in; changed to 700"
        ),
        Ok(fsutil::Tightened::NotOurs { uid, mode }) => tracing::warn!(
            dir = %dir.display(),
            "state directory has mode {mode:o} and belongs to uid {uid}, not to us; left as \
             it is: run chmod 700 on it as its owner"
        ),
        Err(e) => tracing::warn!(
            dir = %dir.display(),
            error = %e,
            "cannot check the state directory's mode"
        ),
    }
}

/// Said at start and by `doctor` when the daemon runs as root (issue #12, finding 16). Kept
/// here, not in `doctor`, so that `doctor` may use the daemon (its tool probe lists the chat
/// channels of `chat`) without a cycle.
pub const ROOT_WARNING: &str = "running as root is not a supported deployment: exec and MCP \
     servers would run as root too (reading /etc/shadow, every user's files); run agentd as \
     its own unprivileged user, as systemd/agentd.service does (User=agentd)";

/// Root is not a supported deployment: `exec` could read `/etc/shadow` and every user's
/// files (the sandbox confines paths, not privilege).
fn warn_if_root() {
    if nix::unistd::geteuid().is_root() {
        tracing::warn!("{}", ROOT_WARNING);
    }
}

/// How the daemon runs.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// `agentd chat`: stdin/stdout is one more channel (source `terminal`); EOF stops the daemon.
    pub terminal: bool,
    /// Sources besides the configured ones, watched like them (SPEC §16.7).
    pub extra_sources: Vec<sources::ExtraSource>,
}

/// Run the daemon until SIGTERM/SIGINT, `shutdown` (the caller's stop: a test runs the daemon
/// in-process and cancels it) or, in terminal mode, end of input. A source that ends on its own
/// stops it the same graceful way and makes it return [`DaemonError::Runtime`] (exit code 3).
pub async fn run(
    cfg: Config,
    opts: RunOptions,
    shutdown: CancellationToken,
) -> Result<(), DaemonError> {
    let started = Instant::now();
    // Handlers first, so a SIGTERM during start-up is a graceful stop too.
    let mut signals = signals::Signals::install()
        .map_err(|e| DaemonError::Startup(format!("cannot install signal handlers: {e}")))?;
    let notifier = notify::Notifier::from_env();
    let tasks = Tasks::default();
    let s = Services::build(Arc::new(cfg), &tasks, started).await?;
    // What `agentd check-config --diff` compares a changed file against.
    reload::write_running_config(&s.paths.root, &s.cfg);
    // Deliveries a crash left open are found first (before any new reply exists), resumed in
    // the background once READY is out (SPEC §16.2: READY never waits on Telegram); then
    // unfinished work, then new input.
    let open_deliveries = s.intake.open_deliveries().await;
    s.intake.recover().await;
    let watch = sources::start(&s, &tasks, &opts.extra_sources).await?;
    tracing::info!(
        pid = std::process::id(),
        state_dir = %s.paths.root.display(),
        startup_ms = started.elapsed().as_millis() as u64,
        "agentd ready"
    );
    let input_closed = match opts.terminal {
        true => sources::start_terminal(&s, &tasks),
        false => CancellationToken::new(),
    };
    notifier.ready(&format!(
        "ready: {} model(s) loaded, {} skipped",
        s.cfg.models.loaded.len(),
        s.cfg.models.skipped.len()
    ));
    s.intake.resume_deliveries(open_deliveries);
    let died = lifecycle::serve(
        &s,
        &mut signals,
        &notifier,
        &input_closed,
        &shutdown,
        &watch,
    )
    .await;
    lifecycle::shutdown(s, tasks, &notifier).await;
    match died {
        Some(why) => Err(DaemonError::Runtime(why)),
        None => Ok(()),
    }
}
