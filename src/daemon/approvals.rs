//! The daemon's side of approvals (SPEC §18.1): decisions from the FIFO (`agent-send
//! --approve/--deny`), the HTTP API and Telegram all go through [`decide`], which names who
//! decided and through which channel.

use serde_json::{Value, json};

use crate::control::ControlLine;
use crate::session::approval::Decision;
use crate::tools::approval::{Approvals, DecideError, Verdict};

/// Decide approval `id`; the answer is the API's `{id, decision}`.
pub fn decide(
    broker: &Approvals,
    id: &str,
    decision: Decision,
    by: &str,
    channel: &str,
) -> Result<Value, DecideError> {
    broker.decide(
        id,
        Verdict {
            decision,
            by: by.to_string(),
            channel: channel.to_string(),
        },
    )?;
    Ok(json!({ "id": id, "decision": decision.as_str() }))
}

/// A FIFO `approval` line. Its outcome is visible to `agent-send` in `approvals.json`
/// (the id leaves the pending list and shows in `decided`); problems are logged.
pub fn handle_line(broker: &Approvals, line: &ControlLine) {
    let ControlLine::Approval {
        approval, decision, ..
    } = line
    else {
        return;
    };
    let Some(d) = Decision::parse(decision) else {
        tracing::warn!(approval = %approval.escape_debug(), decision = %decision.escape_debug(), "FIFO approval line skipped: decision must be approve, always or deny");
        return;
    };
    if let Err(e) = decide(broker, approval, d, "agent-send", "fifo") {
        tracing::warn!(approval = %approval.escape_debug(), error = %e, "FIFO approval line not applied");
    }
}
