//! Live reload on SIGHUP (SPEC §16.5): the config file is read and validated again. An invalid
//! one is refused, logged and shown in the monitor, and the running one stays. A valid one
//! applies the keys the key table (`config::keys`) declares live — `[[schedule]]`, Telegram
//! `allow_from` and `contacts`, `[budget]`, `[approvals]`, MCP servers — and reports every other
//! changed key (every key of the table is rendered, so none is missed) as needing a restart. Skills are
//! rescanned either way (workspace files are read per message anyway). The effective config
//! in force is written to `state_dir/running-config.toml` for `agentd check-config --diff`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;

use super::services::Services;
use crate::config::diff::{Change, diff_rendered};
use crate::config::{Config, render_effective};
use crate::tools::mcp::{McpSandbox, Reconciled};

/// The running daemon's effective config, secrets redacted (0600, in the 0700 state directory).
pub const RUNNING_CONFIG: &str = "running-config.toml";

/// Where [`RUNNING_CONFIG`] lives for a state directory.
pub fn running_config_path(state_dir: &Path) -> PathBuf {
    state_dir.join(RUNNING_CONFIG)
}

/// What a reload did.
#[derive(Debug)]
pub struct Reloaded {
    /// Changes in force now.
    pub applied: Vec<Change>,
    /// Changes read but not in force until a restart.
    pub needs_restart: Vec<Change>,
    /// The number of skills after the rescan.
    pub skills: usize,
    /// MCP servers started, stopped and restarted.
    pub mcp: Reconciled,
}

/// Write the effective config in force for `check-config --diff`; a failure is logged only
/// (the diff then says it has nothing to compare against).
pub fn write_running_config(state_dir: &Path, cfg: &Config) {
    let path = running_config_path(state_dir);
    // Not fsynced: it is rewritten at every start and reload.
    if let Err(e) = crate::fsutil::atomic_write_nosync(&path, render_effective(cfg).as_bytes()) {
        tracing::warn!(path = %path.display(), error = %e, "cannot write the running config (agentd check-config --diff needs it)");
    }
}

/// Read the config again and apply its live parts; `Err` (the config's problems) leaves
/// everything as it was.
pub async fn reload(s: &Services) -> Result<Reloaded, String> {
    let path = s.cfg.config_path.clone();
    let loaded = tokio::task::spawn_blocking(move || crate::config::load(&path))
        .await
        .map_err(|e| format!("the config reader failed: {e}"))?;
    let skills = {
        let skills = s.skills.clone();
        tokio::task::spawn_blocking(move || skills.rescan())
            .await
            .unwrap_or(0)
    };
    let new = loaded.map_err(|e| e.to_string())?;
    // The new file's secrets (an MCP server's new URL) are scrubbed from the log from now on.
    crate::redact::register(new.secrets_to_scrub());
    let running = s.live.get();
    let (applied, needs_restart): (Vec<Change>, Vec<Change>) =
        diff_rendered(&render_effective(&running), &render_effective(&new))
            .into_iter()
            .partition(Change::applies_live);
    let merged = Arc::new(running.with_live_parts_of(&new));
    s.ledger.set_budget(merged.budget);
    s.live.set(merged.clone());
    // Added servers start, removed ones stop, changed ones restart; the registry follows the
    // manager's change signal. The sandbox is the running one (its inputs need a restart).
    let mcp = s
        .mcp
        .reconcile(&merged.mcp_servers, McpSandbox::from_config(&merged))
        .await;
    write_running_config(&s.cfg.paths.state_dir, &merged);
    Ok(Reloaded {
        applied,
        needs_restart,
        skills,
        mcp,
    })
}

/// [`reload`], logged, and its outcome put in the monitor (`reload`).
pub async fn reload_and_report(s: &Services) {
    let at = chrono::Utc::now().to_rfc3339();
    match reload(s).await {
        Ok(r) => {
            for c in &r.applied {
                tracing::info!(key = %c.key, "SIGHUP: applied");
            }
            for c in &r.needs_restart {
                tracing::warn!(key = %c.key, "SIGHUP: changed in the file, but needs a restart to apply (systemctl restart agentd)");
            }
            tracing::info!(
                applied = r.applied.len(),
                needs_restart = r.needs_restart.len(),
                skills = r.skills,
                mcp_added = ?r.mcp.added,
                mcp_removed = ?r.mcp.removed,
                mcp_restarted = ?r.mcp.restarted,
                "SIGHUP: config reloaded"
            );
            s.monitor.set_reload(json!({
                "at": at,
                "ok": true,
                "applied": r.applied.iter().map(|c| &c.key).collect::<Vec<_>>(),
                "needs_restart": r.needs_restart.iter().map(|c| &c.key).collect::<Vec<_>>(),
            }));
        }
        Err(e) => {
            tracing::error!(error = %e, "SIGHUP: the config is invalid; reload refused, the running config stays in force");
            s.monitor.set_reload(json!({
                "at": at,
                "ok": false,
                "error": e,
            }));
        }
    }
}
