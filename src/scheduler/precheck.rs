//! Zero-token prechecks (SPEC §20): a `[[schedule]]` entry's `precheck` command runs in the
//! exec sandbox under the `exec` tool's rules (the allowed paths, the protected directories, an
//! environment without secrets) before the job. Its outcome is a trail event (`skipped` or
//! `precheck`), a row of skipped runs for `--cost`, and the monitor's `prechecks`.

use std::sync::Arc;

use crate::config::{Config, Precheck};
use crate::monitor::Monitor;
use crate::sandbox::ExecOutput;
use crate::session::SessionStore;
use crate::session::event::{Event, PrecheckEvent, PrecheckOutcome};
use crate::store::Db;
use crate::tools::ToolError;
use crate::tools::exec::ExecTool;

/// Run `p` in the exec sandbox of `cfg`, keeping at most `Precheck::MAX_STDOUT` bytes of its
/// output.
pub async fn run(cfg: &Config, p: &Precheck) -> Result<ExecOutput, ToolError> {
    ExecTool::from_config(cfg)
        .run_command(
            &p.command,
            p.timeout,
            &cfg.tools.allowed_paths,
            &cfg.agent.workspace,
            Precheck::MAX_STDOUT,
        )
        .await
}

/// The job's text with the precheck's stdout appended, marked as data from outside (it may
/// carry a fetched page or a mail subject). Empty output leaves the text as it is.
pub fn with_output(text: &str, stdout: &str) -> String {
    let stdout = cut(stdout.trim_end(), Precheck::MAX_STDOUT);
    if stdout.trim().is_empty() {
        return text.to_string();
    }
    format!(
        "{text}\n\nThe precheck's output:\n{}",
        crate::tools::untrusted::wrap("precheck", stdout)
    )
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Where a precheck's outcome is recorded: the target session's trail and the monitor.
#[derive(Clone)]
pub struct PrecheckRecorder {
    pub store: Arc<SessionStore>,
    pub monitor: Arc<Monitor>,
}

impl PrecheckRecorder {
    /// Record `event` (its time `now`, Unix seconds) in session `key`: a skip becomes a
    /// `skipped` event with the estimated saving (the job's last cost) and a skipped-run row;
    /// anything else a `precheck` event. Failures are logged: a precheck's record never stops
    /// the job.
    pub async fn record(
        &self,
        cfg: &Config,
        key: &str,
        mut event: PrecheckEvent,
        now: i64,
        db: &Db,
    ) {
        let model = crate::agent::route_source(cfg, "system");
        let store = self.store.clone();
        let k = key.to_string();
        let skip = event.outcome == PrecheckOutcome::Skip;
        let name = event.schedule.clone();
        let written = tokio::task::spawn_blocking(move || {
            let session = store.get_or_create(&k, &model)?;
            if skip {
                let state = session.load_state(&model)?;
                event.saved_usd = state.job_costs.get(&event.schedule).copied();
            }
            let e = if skip {
                Event::Skipped(event.clone())
            } else {
                Event::Precheck(event.clone())
            };
            session.append(e)?;
            Ok::<_, std::io::Error>((session.id.clone(), event))
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
        let event = match written {
            Ok((session_id, event)) => {
                if skip
                    && let Err(e) = db
                        .insert_skipped_run(now, &name, &session_id, event.saved_usd)
                        .await
                {
                    tracing::warn!(schedule = %name, error = %e, "cannot record the skipped run in the costs database");
                }
                event
            }
            Err(e) => {
                tracing::warn!(schedule = %name, error = %e, "cannot record the precheck in the session trail");
                return;
            }
        };
        self.monitor.set_precheck(
            &name,
            serde_json::json!({
                "at": chrono::DateTime::from_timestamp(now, 0).map(|t| t.to_rfc3339()),
                "outcome": event.outcome.as_str(),
                "exit_code": event.exit_code,
                "ms": event.ms,
                "saved_usd": event.saved_usd,
            }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_appended_marked_and_bounded() {
        assert_eq!(
            with_output("Execute HEARTBEAT.md", " \n"),
            "Execute HEARTBEAT.md"
        );
        let text = with_output("Execute HEARTBEAT.md", "3 new mails\n");
        assert!(text.starts_with("Execute HEARTBEAT.md\n\nThe precheck's output:\n"));
        assert!(text.contains("<untrusted-content source=\"precheck\">\n3 new mails\n"));
        let long = "é".repeat(5000);
        let text = with_output("x", &long);
        let body = text.split("\">\n").nth(1).unwrap();
        let body = body.split("\n</").next().unwrap();
        assert!(body.len() <= Precheck::MAX_STDOUT && body.len() >= Precheck::MAX_STDOUT - 1);
    }

    #[test]
    fn exit_codes_map_to_outcomes() {
        assert_eq!(PrecheckOutcome::of_exit(Some(0)), PrecheckOutcome::Run);
        assert_eq!(PrecheckOutcome::of_exit(Some(1)), PrecheckOutcome::Skip);
        assert_eq!(PrecheckOutcome::of_exit(Some(2)), PrecheckOutcome::Warn);
        assert_eq!(PrecheckOutcome::of_exit(None), PrecheckOutcome::Warn);
    }
}
