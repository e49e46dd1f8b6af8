//! `agent-send --approvals`, `--approve ID [--always]`, `--deny ID` (SPEC §18.1). The list is
//! read from `state_dir/approvals.json`, the daemon's live view of the pending approvals (the
//! shape of `GET /api/v1/approvals`); a decision is one FIFO `approval` line, confirmed when the
//! view shows the id decided.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{CliError, Context, Output, fifo};
use crate::control::ControlLine;
use crate::session::approval::Decision;
use crate::tools::approval::{APPROVALS_FILE, ApprovalsView, is_valid_id};

/// How often the view is read while waiting for a decision to show.
const POLL: Duration = Duration::from_millis(50);

fn read_view(state_dir: &Path) -> Result<ApprovalsView, CliError> {
    let path = state_dir.join(APPROVALS_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            CliError::io(
                format!("parse {}", path.display()),
                std::io::Error::other(e),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ApprovalsView::default()),
        Err(e) => Err(CliError::io(format!("read {}", path.display()), e)),
    }
}

/// `--approvals`.
pub fn list(ctx: &Context, as_json: bool) -> Result<Output, CliError> {
    let view = read_view(&ctx.state_dir)?;
    if as_json {
        return Ok(Output::json(&json!({ "approvals": view.approvals })));
    }
    if view.approvals.is_empty() {
        return Ok(Output::stdout("no approvals waiting"));
    }
    let mut out = String::new();
    for a in &view.approvals {
        out.push_str(&format!(
            "{}  {}  {}\n    {}\n    expires {}\n",
            a.id, a.key, a.tool, a.summary, a.expires_at
        ));
    }
    Ok(Output::stdout(out))
}

fn decided(view: &ApprovalsView, id: &str) -> Option<String> {
    view.decided
        .iter()
        .rev()
        .find(|(i, _)| i == id)
        .map(|(_, d)| d.clone())
}

/// `--approve ID [--always]` or `--deny ID`: 404- and 409-like refusals exit 1.
pub fn decide(
    ctx: &Context,
    id: &str,
    decision: Decision,
    timeout: Duration,
    as_json: bool,
) -> Result<Output, CliError> {
    if !is_valid_id(id) {
        return Err(CliError::NotFound(format!(
            "no approval with id {id:?}: approval ids look like ap-xxxxxxxxxx (see agent-send --approvals)"
        )));
    }
    let view = read_view(&ctx.state_dir)?;
    if !view.approvals.iter().any(|a| a.id == id) {
        return Err(match decided(&view, id) {
            Some(d) => CliError::NotFound(format!("approval {id} was already decided: {d}")),
            None => CliError::NotFound(format!(
                "no approval with id {id} is waiting (see agent-send --approvals)"
            )),
        });
    }
    let line = ControlLine::Approval {
        id: Some(uuid::Uuid::new_v4().to_string()),
        approval: id.to_string(),
        decision: decision.as_str().to_string(),
    };
    fifo::send_line(&ctx.fifo, &line.encode(), timeout)?;
    let deadline = Instant::now() + timeout;
    loop {
        let view = read_view(&ctx.state_dir)?;
        if !view.approvals.iter().any(|a| a.id == id) {
            return match decided(&view, id) {
                Some(d) if d == decision.as_str() => {
                    let v = json!({ "id": id, "decision": d });
                    Ok(if as_json {
                        Output::json(&v)
                    } else {
                        Output::stdout(format!("{id}: {d}"))
                    })
                }
                Some(d) => Err(CliError::NotFound(format!(
                    "approval {id} was already decided: {d}"
                ))),
                None => Err(CliError::NotFound(format!(
                    "approval {id} is no longer waiting (its message stopped; it is asked again when it resumes)"
                ))),
            };
        }
        if Instant::now() >= deadline {
            return Err(CliError::IntakeTimeout {
                id: id.to_string(),
                seconds: timeout.as_secs(),
            });
        }
        std::thread::sleep(POLL);
    }
}
