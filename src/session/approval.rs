//! Approval records in the trail (SPEC §18.1): an `approval` event when a tool call starts to
//! wait for a person's yes, an `approval_decision` event when it was answered (or denied by
//! the daemon: a timeout, a `system` message), and what the fold keeps of them
//! ([`ApprovalState`]): the tools approved "always in this session", and the approvals still
//! waiting, which tell a restart that the batch of calls they belong to never ran.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// A tool call waits for a yes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// Short and unique (`ap-…`): what a person types or taps.
    pub id: String,
    pub tool: String,
    /// The id of the call it gates.
    pub tool_call_id: String,
    /// One line saying what the call does.
    pub summary: String,
    /// The call's arguments.
    pub input: serde_json::Value,
    /// RFC 3339: after this the call is denied.
    pub expires_at: String,
    /// Why it needs a yes: `require` (the tool matches `[approvals] require`) or `over_usd`.
    pub reason: String,
}

/// What was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Run this call.
    Approve,
    /// Run this call, and later calls of the same tool in this session without asking.
    Always,
    /// Do not run it.
    Deny,
    /// Nobody answered in time: a deny.
    Timeout,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Approve => "approve",
            Decision::Always => "always",
            Decision::Deny => "deny",
            Decision::Timeout => "timeout",
        }
    }

    /// Whether the call runs.
    pub fn allows(self) -> bool {
        matches!(self, Decision::Approve | Decision::Always)
    }

    /// A decision a person can send (`approve`, `always`, `deny`).
    pub fn parse(s: &str) -> Option<Decision> {
        match s {
            "approve" => Some(Decision::Approve),
            "always" => Some(Decision::Always),
            "deny" => Some(Decision::Deny),
            _ => None,
        }
    }
}

/// The answer to an [`ApprovalRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalDecided {
    pub id: String,
    pub tool: String,
    pub decision: Decision,
    /// Who decided: a Telegram user id, `http`, `agent-send`, or `agentd` (timeout, system).
    pub by: String,
    /// Through which channel: `telegram`, `http`, `fifo`, or `daemon`.
    pub channel: String,
}

/// What the fold keeps of approvals.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApprovalState {
    /// Tools a person approved "always in this session".
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub always: BTreeSet<String>,
    /// Approvals of the newest batch of tool calls still waiting for a decision. The batch
    /// runs only once every one is decided, so while one waits none of its calls ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<ApprovalRequest>,
}

impl ApprovalState {
    pub fn asked(&mut self, r: &ApprovalRequest) {
        self.waiting.retain(|w| w.id != r.id);
        self.waiting.push(r.clone());
    }

    pub fn decided(&mut self, d: &ApprovalDecided) {
        self.waiting.retain(|w| w.id != d.id);
        if d.decision == Decision::Always {
            self.always.insert(d.tool.clone());
        }
    }

    /// The batch got its results (or was repaired): nothing of it waits any more.
    pub fn batch_done(&mut self) {
        self.waiting.clear();
    }
}
