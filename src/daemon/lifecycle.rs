//! The lifecycle of a run (SPEC §10.4): serve until a stop signal, the end of terminal input,
//! the caller's shutdown token or the death of a source (SPEC §16.7) — answering SIGHUP (a live
//! reload, `reload`) and SIGUSR1 and pinging the systemd watchdog
//! meanwhile — then stop in two stages (no new work; interrupt what still runs at the deadline).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::notify::Notifier;
use super::services::{Services, Tasks};
use super::signals::{Signal, Signals};
use super::sources::SourceWatch;
use crate::channels::fifo;

/// How long in-flight messages may run after SIGTERM before they are interrupted (they resume
/// after the next start).
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(15);

/// Why the run ends.
enum Stop {
    Signal(&'static str),
    InputClosed,
    Requested,
    SourceDied(String),
}

/// Serve until it is time to stop. Returns the reason when a source died: the run then ends
/// with a runtime failure (exit code 3) after the same graceful stop.
pub async fn serve(
    s: &Services,
    signals: &mut Signals,
    notifier: &Notifier,
    input_closed: &CancellationToken,
    shutdown: &CancellationToken,
    sources: &SourceWatch,
) -> Option<String> {
    let mut watchdog = notifier.watchdog_interval().map(tokio::time::interval);
    let why = loop {
        let tick = async {
            match watchdog.as_mut() {
                Some(i) => {
                    i.tick().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            sig = signals.next() => match sig {
                Some(sig) if sig.is_shutdown() => break Stop::Signal(sig.name()),
                Some(sig) => on_signal(s, notifier, sig).await,
                None => break Stop::Signal("none (signal stream ended)"),
            },
            _ = input_closed.cancelled() => break Stop::InputClosed,
            _ = shutdown.cancelled() => break Stop::Requested,
            why = sources.died() => break Stop::SourceDied(why),
            _ = tick => ping_watchdog(s, notifier).await,
        }
    };
    match why {
        Stop::Signal(name) => tracing::info!(signal = name, "shutdown signal received"),
        Stop::InputClosed => tracing::info!("end of terminal input"),
        Stop::Requested => tracing::info!("shutdown requested"),
        Stop::SourceDied(why) => {
            tracing::error!(reason = %why, "stopping because a source died");
            return Some(why);
        }
    }
    None
}

async fn on_signal(s: &Services, notifier: &Notifier, sig: Signal) {
    match sig {
        Signal::Hangup => {
            // The config is read again and its live parts applied; skills are rescanned;
            // workspace files need nothing (they are read for every message).
            notifier.reloading("reloading the config and skills");
            super::reload::reload_and_report(s).await;
            notifier.ready_again("ready");
        }
        Signal::User1 => {
            let n = s.skills.rescan();
            tracing::info!(skills = n, "SIGUSR1: skills rescanned");
        }
        Signal::Terminate | Signal::Interrupt => {}
    }
}

/// Ping only while the main loop runs and the database thread answers.
async fn ping_watchdog(s: &Services, notifier: &Notifier) {
    match s.healthy().await {
        Ok(()) => notifier.watchdog(),
        Err(e) => {
            tracing::error!(error = %e, "health check failed; not pinging the watchdog")
        }
    }
    let monitored = match s.chats.channels.is_empty() {
        true => serde_json::Value::Null,
        false => s.monitor.snapshot()["channels"].take(),
    };
    let health: Vec<(&str, &serde_json::Value)> = (s.chats.channels.iter())
        .filter_map(|(name, _)| Some((*name, monitored.get(*name)?)))
        .collect();
    notifier.status(&status_line(
        s.dispatcher.active_sessions(),
        s.dispatcher.queue_depth(),
        &health,
    ));
}

/// The `STATUS=` line: work in flight, and each running chat channel's health, e.g.
/// `2 active, 0 queued; telegram: unauthorized (token rejected, see the log)`.
fn status_line(active: usize, queued: usize, channels: &[(&str, &serde_json::Value)]) -> String {
    let mut line = format!("{active} active, {queued} queued");
    for (name, h) in channels {
        let state = h["state"].as_str().unwrap_or("starting");
        line.push_str(&format!("; {name}: {state}"));
        match state {
            "unauthorized" => line.push_str(" (token rejected, see the log)"),
            "retrying" => {
                let n = h["consecutive_errors"].as_u64().unwrap_or(0);
                line.push_str(&format!(" ({n} failed poll(s))"));
            }
            _ => {}
        }
    }
    line
}

/// Stop: no new work, wait for messages in flight up to the deadline, interrupt the rest
/// (they resume after restart), snapshot every session state that lags its trail and flush
/// the snapshots and the session index, remove the FIFO, stop MCP, release the lock.
pub async fn shutdown(s: Services, tasks: Tasks, notifier: &Notifier) {
    notifier.stopping("stopping: finishing messages in flight");
    tracing::info!("shutting down: no new work; waiting for messages in flight");
    tasks.stop.cancel();
    tasks.tracker.close();
    if tokio::time::timeout(SHUTDOWN_DEADLINE, tasks.tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            deadline_s = SHUTDOWN_DEADLINE.as_secs(),
            "messages still running at the deadline; interrupting (they resume after restart)"
        );
        tasks.abort.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), tasks.tracker.wait()).await;
    }
    // Snapshots are written on a cadence (SPEC §7): the workers saved their states as they
    // exited; the idle ones are saved here, then all are flushed.
    let idle = s.dispatcher.snapshot_idle_states();
    tracing::debug!(states = idle, "snapshots of idle sessions queued");
    // The index is written in the background too (`session::IndexWriter`); a stop leaves it
    // on disk, so the next start has nothing to repair.
    // So is `monitor.json`: flushed here, not left to the last handle's drop, which a task
    // still holding one (a connection, a live view) would put off past the exit.
    let store = s.store.clone();
    let monitor = s.monitor.clone();
    let _ = tokio::task::spawn_blocking(move || {
        store.flush_index();
        store.flush_snapshots();
        monitor.flush();
    })
    .await;
    if s.cfg.fifo.enabled {
        fifo::remove(&s.cfg.fifo.path);
    }
    s.mcp_cancel.cancel();
    s.pid.release();
    tracing::info!("agentd stopped");
}

#[cfg(test)]
mod tests {
    use super::status_line;
    use serde_json::json;

    #[test]
    fn status_line_carries_each_channels_health() {
        assert_eq!(status_line(1, 2, &[]), "1 active, 2 queued");
        let ok = json!({"state": "ok", "healthy": true, "consecutive_errors": 0});
        assert_eq!(
            status_line(0, 0, &[("telegram", &ok)]),
            "0 active, 0 queued; telegram: ok"
        );
        let red = json!({"state": "unauthorized", "healthy": false, "consecutive_errors": 4});
        assert_eq!(
            status_line(0, 0, &[("telegram", &red)]),
            "0 active, 0 queued; telegram: unauthorized (token rejected, see the log)"
        );
        let retrying = json!({"state": "retrying", "consecutive_errors": 3});
        assert!(
            status_line(0, 0, &[("telegram", &retrying)])
                .ends_with("telegram: retrying (3 failed poll(s))")
        );
    }
}
