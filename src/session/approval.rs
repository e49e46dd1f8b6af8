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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, ToolCall, ToolResult};
    use crate::session::event::{Event, MessageEvent, TRAIL_VERSION, TrailLine};
    use crate::session::state::SessionState;

    fn line(seq: u64, event: Event) -> TrailLine {
        TrailLine {
            v: TRAIL_VERSION,
            seq,
            ts: "2026-11-03T14:05:00+01:00".into(),
            event,
        }
    }

    fn req(id: &str, call: &str) -> ApprovalRequest {
        ApprovalRequest {
            id: id.into(),
            tool: "exec".into(),
            tool_call_id: call.into(),
            summary: "exec: ls".into(),
            input: serde_json::json!({"command": "ls"}),
            expires_at: "2026-11-03T14:10:00+01:00".into(),
            reason: "require".into(),
        }
    }

    fn decided(id: &str, d: Decision) -> ApprovalDecided {
        ApprovalDecided {
            id: id.into(),
            tool: "exec".into(),
            decision: d,
            by: "42".into(),
            channel: "telegram".into(),
        }
    }

    #[test]
    fn the_fold_keeps_always_and_what_waits_and_survives_a_snapshot() {
        let mut s = SessionState::new("s", "k", "primary", 0);
        let call = ToolCall {
            id: "c1".into(),
            name: "exec".into(),
            arguments: serde_json::json!({"command": "ls"}),
        };
        let lines = vec![
            line(
                1,
                Event::Message(MessageEvent::new(Message::Assistant {
                    text: String::new(),
                    tool_calls: vec![
                        call.clone(),
                        ToolCall {
                            id: "c2".into(),
                            ..call
                        },
                    ],
                    thinking: vec![],
                    usage: None,
                })),
            ),
            line(2, Event::Approval(req("ap-1", "c1"))),
            line(3, Event::Approval(req("ap-2", "c2"))),
            line(
                4,
                Event::ApprovalDecision(decided("ap-1", Decision::Always)),
            ),
        ];
        for l in &lines {
            s.apply(l);
        }
        assert!(s.approvals.always.contains("exec"));
        assert_eq!(s.approvals.waiting.len(), 1, "ap-2 still waits");
        assert_eq!(s.approvals.waiting[0].id, "ap-2");
        // The snapshot keeps it (a restart sees the batch never ran).
        let json = serde_json::to_string(&s).unwrap();
        let back: SessionState = serde_json::from_str(&json).unwrap();
        assert_eq!(back.approvals, s.approvals);
        // Results end the batch; `always` stays for the session.
        s.apply(&line(
            5,
            Event::ToolResult {
                results: vec![ToolResult {
                    tool_call_id: "c1".into(),
                    content: "ok".into(),
                    is_error: false,
                    images: Vec::new(),
                }],
                notice: None,
            },
        ));
        assert!(s.approvals.waiting.is_empty());
        assert!(s.approvals.always.contains("exec"));
        // A snapshot written before approvals existed still loads.
        let mut old: serde_json::Value = serde_json::from_str(&json).unwrap();
        old.as_object_mut().unwrap().remove("approvals");
        let back: SessionState = serde_json::from_value(old).unwrap();
        assert_eq!(back.approvals, ApprovalState::default());
    }

    #[test]
    fn events_roundtrip_with_their_wire_names() {
        for e in [
            Event::Approval(req("ap-1", "c1")),
            Event::ApprovalDecision(decided("ap-1", Decision::Timeout)),
        ] {
            let l = line(1, e);
            let v = serde_json::to_value(&l).unwrap();
            assert!(
                v["type"] == "approval" || v["type"] == "approval_decision",
                "{v}"
            );
            let back: TrailLine = serde_json::from_value(v).unwrap();
            assert_eq!(back, l);
        }
    }
}
