//! `agentd check-config --diff` (SPEC §16.5): the config file as it is now against the running
//! daemon's effective config (`state_dir/running-config.toml`, written at start and by each
//! reload), split into what a reload (SIGHUP) would apply and what needs a restart.

use crate::config::diff::{Change, describe, diff_rendered};
use crate::config::{Config, render_effective};
use crate::daemon::pidlock::running_pid;
use crate::daemon::reload::running_config_path;

/// The report, or why there is nothing to compare against (no daemon runs for this state
/// directory, or it left no running config).
pub fn against_running(cfg: &Config) -> Result<String, String> {
    let (pid, changes) = changes_against_running(cfg)?;
    Ok(format!(
        "{} against the running agentd (pid {pid}):\n{}",
        cfg.config_path.display(),
        describe(&changes)
    ))
}

/// `check-config --diff --json`: `{"ok": true, "config": path, "pid": n, "changes": [{"key",
/// "old", "new", "applies": "live"|"restart"}]}` (`old` null: added; `new` null: removed), or
/// why there is nothing to compare against.
pub fn against_running_json(cfg: &Config) -> Result<serde_json::Value, String> {
    let (pid, changes) = changes_against_running(cfg)?;
    let changes: Vec<serde_json::Value> = changes
        .iter()
        .map(|c| {
            let applies = if c.applies_live() { "live" } else { "restart" };
            serde_json::json!({"key": c.key, "old": c.old, "new": c.new, "applies": applies})
        })
        .collect();
    Ok(serde_json::json!({
        "ok": true,
        "config": cfg.config_path.display().to_string(),
        "pid": pid,
        "changes": changes,
    }))
}

/// The running daemon's pid and the changes from its effective config to `cfg`.
fn changes_against_running(cfg: &Config) -> Result<(u32, Vec<Change>), String> {
    let state = &cfg.paths.state_dir;
    let Some(pid) = running_pid(&state.join("agentd.pid")) else {
        return Err(format!(
            "no agentd is running for state_dir {} (nothing to compare against); the whole \
             config applies at the next start: `agentd check-config` prints it",
            state.display()
        ));
    };
    let path = running_config_path(state);
    let running = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "agentd runs as pid {pid}, but its effective config {} cannot be read ({e}); \
             restart it once with this version of agentd, which writes that file",
            path.display()
        )
    })?;
    Ok((pid, diff_rendered(&running, &render_effective(cfg))))
}
