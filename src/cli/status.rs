//! `--monitor` (SPEC §9) and `--status`: what the daemon is doing, read from its files only.
//!
//! The daemon holds an exclusive `flock` on `state_dir/agentd.pid` while it runs; a shared
//! non-blocking lock attempt that fails with `EWOULDBLOCK` therefore means it is running.

use std::fmt::Write;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::Serialize;
use serde_json::Value;

use super::CliError;
use super::context::Context;
use super::output::Output;
use crate::monitor::format_monitor;

/// The monitor file in the state directory.
pub const MONITOR_FILE: &str = "monitor.json";
/// The PID file in the state directory.
pub const PID_FILE: &str = "agentd.pid";

/// Read and parse `state_dir/monitor.json`; a missing file is [`CliError::NotFound`].
pub fn read_monitor(state_dir: &Path) -> Result<(String, Value), CliError> {
    let path = state_dir.join(MONITOR_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(CliError::NotFound(format!(
                "no monitor file (daemon never ran?): {} does not exist",
                path.display()
            )));
        }
        Err(e) => return Err(CliError::io(format!("read {}", path.display()), e)),
    };
    let value = serde_json::from_str(&text).map_err(|e| {
        CliError::io(
            format!("read {}", path.display()),
            io::Error::new(io::ErrorKind::InvalidData, format!("not valid JSON: {e}")),
        )
    })?;
    Ok((text, value))
}

/// Output of `--monitor`: the formatted view, or the file's JSON as is with `--json`.
pub fn monitor(state_dir: &Path, now: DateTime<Utc>, as_json: bool) -> Result<Output, CliError> {
    let (text, value) = read_monitor(state_dir)?;
    Ok(if as_json {
        Output::stdout(text.trim_end().to_string())
    } else {
        Output::stdout(format_monitor(&value, now))
    })
}

/// Whether the daemon holds its PID file lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DaemonState {
    pub running: bool,
    /// The PID from the file, when running and readable.
    pub pid: Option<i32>,
}

/// Check `state_dir/agentd.pid`: running when another process holds an exclusive lock on it.
pub fn daemon_state(state_dir: &Path) -> Result<DaemonState, CliError> {
    let path = state_dir.join(PID_FILE);
    let stopped = DaemonState {
        running: false,
        pid: None,
    };
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(stopped),
        Err(e) => return Err(CliError::io(format!("open {}", path.display()), e)),
    };
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        // We got the lock: nobody holds it, the file is stale. Dropping the guard unlocks.
        Ok(_guard) => Ok(stopped),
        Err((_, Errno::EWOULDBLOCK)) => {
            let pid = std::fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok());
            Ok(DaemonState { running: true, pid })
        }
        Err((_, errno)) => Err(CliError::io(
            format!("lock {}", path.display()),
            io::Error::from(errno),
        )),
    }
}

/// The control FIFO's presence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FifoState {
    pub path: PathBuf,
    /// A FIFO exists at `path`.
    pub present: bool,
}

/// The parts of `monitor.json` that `--status` shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MonitorSummary {
    pub state: Option<String>,
    pub updated_at: Option<Value>,
    pub active: usize,
    pub queue_depth: u64,
}

/// `--status`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusReport {
    pub running: bool,
    pub pid: Option<i32>,
    pub state_dir: PathBuf,
    pub fifo: FifoState,
    /// `None` when there is no readable monitor file.
    pub monitor: Option<MonitorSummary>,
    /// Spend since local midnight; `None` when the cost database cannot be read.
    pub today_cost: Option<f64>,
    /// Why `today_cost` is missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_error: Option<String>,
}

/// Gather the status from the files of `ctx`. Blocking.
pub fn status(ctx: &Context, now: DateTime<Utc>) -> Result<StatusReport, CliError> {
    let daemon = daemon_state(&ctx.state_dir)?;
    let present = std::fs::metadata(&ctx.fifo)
        .map(|m| m.file_type().is_fifo())
        .unwrap_or(false);
    let monitor = read_monitor(&ctx.state_dir)
        .ok()
        .map(|(_, v)| MonitorSummary {
            state: v.get("state").and_then(Value::as_str).map(str::to_owned),
            updated_at: v.get("updated_at").cloned(),
            active: v
                .get("active")
                .and_then(Value::as_array)
                .map_or(0, Vec::len),
            queue_depth: v.get("queue_depth").and_then(Value::as_u64).unwrap_or(0),
        });
    // A damaged database must not hide whether the daemon runs.
    let (today_cost, cost_error) =
        match crate::report::cost::today_cost(&ctx.state_dir, &ctx.timezone, now) {
            Ok(c) => (Some(c), None),
            Err(e) => (None, Some(e.to_string())),
        };
    Ok(StatusReport {
        running: daemon.running,
        pid: daemon.pid,
        state_dir: ctx.state_dir.clone(),
        fifo: FifoState {
            path: ctx.fifo.clone(),
            present,
        },
        monitor,
        today_cost,
        cost_error,
    })
}

/// Text (or JSON) for `--status`. Always exit 0: a stopped daemon is an answer, not an error.
pub fn render(r: &StatusReport, as_json: bool) -> Output {
    if as_json {
        return Output::json(&serde_json::to_value(r).unwrap_or_default());
    }
    let mut out = String::new();
    match (r.running, r.pid) {
        (true, Some(pid)) => {
            let _ = writeln!(out, "agentd:     running (pid {pid})");
        }
        (true, None) => {
            let _ = writeln!(out, "agentd:     running");
        }
        (false, _) => {
            let _ = writeln!(out, "agentd:     not running");
        }
    }
    let _ = writeln!(out, "state dir:  {}", r.state_dir.display());
    let fifo = if r.fifo.present { "present" } else { "missing" };
    let _ = writeln!(out, "fifo:       {} ({fifo})", r.fifo.path.display());
    match &r.monitor {
        Some(m) => {
            let label = if r.running { "state" } else { "last state" };
            let updated = match &m.updated_at {
                Some(Value::String(s)) => format!(", updated {s}"),
                Some(Value::Number(n)) => format!(", updated {n}"),
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "monitor:    {label} {}{updated}, {} active, queue {}",
                m.state.as_deref().unwrap_or("unknown"),
                m.active,
                m.queue_depth
            );
        }
        None => {
            let _ = writeln!(out, "monitor:    no monitor file");
        }
    }
    match (r.today_cost, &r.cost_error) {
        (Some(c), _) => {
            let _ = writeln!(out, "today:      {}", super::cost::usd(c));
        }
        (None, e) => {
            let _ = writeln!(
                out,
                "today:      unknown ({})",
                e.as_deref().unwrap_or("no cost data")
            );
        }
    }
    Output::stdout(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::stat::Mode;

    #[test]
    fn monitor_missing_is_an_error_with_the_spec_message() {
        let d = tempfile::tempdir().unwrap();
        let err = monitor(d.path(), Utc::now(), false).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("no monitor file (daemon never ran?)")
        );
        assert_eq!(err.exit_code(), 1);
    }

    #[test]
    fn monitor_formats_or_passes_json_through() {
        let d = tempfile::tempdir().unwrap();
        let raw = r#"{"version":1,"state":"idle","queue_depth":2,"active":[]}"#;
        std::fs::write(d.path().join(MONITOR_FILE), raw).unwrap();
        let o = monitor(d.path(), Utc::now(), true).unwrap();
        assert_eq!(o.stdout, format!("{raw}\n"));
        let o = monitor(d.path(), Utc::now(), false).unwrap();
        assert!(o.stdout.contains("idle"), "{}", o.stdout);
        assert!(o.stdout.contains("queue:      2"), "{}", o.stdout);
        std::fs::write(d.path().join(MONITOR_FILE), "{torn").unwrap();
        assert!(monitor(d.path(), Utc::now(), false).is_err());
    }

    #[test]
    fn pid_lock_decides_running() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            daemon_state(d.path()).unwrap(),
            DaemonState {
                running: false,
                pid: None
            }
        );
        let pid_path = d.path().join(PID_FILE);
        std::fs::write(&pid_path, "4242\n").unwrap();
        // A stale file (no lock) means stopped.
        assert!(!daemon_state(d.path()).unwrap().running);
        // The daemon's exclusive lock (flock locks belong to the open file description, so a
        // second open in this process conflicts like another process would).
        let held = Flock::lock(
            File::open(&pid_path).unwrap(),
            FlockArg::LockExclusiveNonblock,
        )
        .unwrap();
        assert_eq!(
            daemon_state(d.path()).unwrap(),
            DaemonState {
                running: true,
                pid: Some(4242)
            }
        );
        drop(held);
        assert!(!daemon_state(d.path()).unwrap().running);
    }

    #[test]
    fn status_of_a_stopped_daemon() {
        let d = tempfile::tempdir().unwrap();
        let ctx = Context::for_state_dir(d.path());
        let r = status(&ctx, Utc::now()).unwrap();
        assert!(!r.running);
        assert!(!r.fifo.present);
        assert_eq!(r.monitor, None);
        assert_eq!(r.today_cost, Some(0.0));
        let o = render(&r, false);
        assert!(o.is_ok());
        assert!(o.stdout.contains("not running"), "{}", o.stdout);
        let v: serde_json::Value = serde_json::from_str(&render(&r, true).stdout).unwrap();
        assert_eq!(v["running"], false);
        assert_eq!(v["fifo"]["present"], false);
        assert!(v["monitor"].is_null());

        nix::unistd::mkfifo(&ctx.fifo, Mode::from_bits_truncate(0o600)).unwrap();
        std::fs::write(
            d.path().join(MONITOR_FILE),
            r#"{"state":"thinking","active":[{},{}],"queue_depth":3,"updated_at":"2026-11-03T14:05:00Z"}"#,
        )
        .unwrap();
        let r = status(&ctx, Utc::now()).unwrap();
        assert!(r.fifo.present);
        let m = r.monitor.clone().unwrap();
        assert_eq!(m.state.as_deref(), Some("thinking"));
        assert_eq!((m.active, m.queue_depth), (2, 3));
        assert!(render(&r, false).stdout.contains("last state thinking"));

        // A damaged cost database does not fail the status.
        std::fs::write(d.path().join("agentd.db"), "this is not sqlite, but long enough to be read as a header......................................................").unwrap();
        let r = status(&ctx, Utc::now()).unwrap();
        assert_eq!(r.today_cost, None);
        assert!(r.cost_error.is_some());
        assert!(render(&r, false).stdout.contains("today:      unknown ("));
    }
}
