//! The approval gate (SPEC §18.1): between a model's answer and the run of its tool calls.
//! A call that needs a person's yes (`[approvals] require`, or a message past `over_usd`)
//! is recorded as an `approval` trail event, offered through [`Approvals`] (the HTTP API,
//! `agent-send`, the message's chat) and waits; the whole batch runs only once every approval of it is
//! decided, so a crash while one waits leaves a batch none of whose calls ran, and the resumed
//! message asks again ([`Agent::resume_waiting_batch`]). A `system` message cannot wait: its
//! gated calls are denied at once unless `system_allow` names the tool. A sub-agent cannot ask
//! either: its gated calls are refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use chrono::Utc;

use super::run::{Caller, Run};
use super::{Agent, Fail};
use crate::config::ApprovalsConfig;
use crate::control::Source;
use crate::llm::{ChatResponse, StopReason};
use crate::message::{Address, Message, ToolCall};
use crate::monitor::LoopState;
use crate::session::approval::{ApprovalDecided, ApprovalRequest, Decision};
use crate::session::{Event, SessionHandle, SessionState};
use crate::tools::approval::{self, ApprovalInfo, Approvals, Ticket, Verdict};

/// What the gate (and the tools) need to know about the message they work for.
pub(super) struct ApprovalRoute {
    pub source: Source,
    /// The chat the message came from (`Work::chat`): its approvals are offered there; those
    /// of a message from elsewhere go to the chat `[approvals]` names (SPEC §18.1).
    pub chat: Option<Address>,
    /// Where its reply goes (`Work::reply_to`): the `tts` tool sends there.
    pub reply_to: Option<Address>,
    /// A person approved going on past `over_usd` in this message.
    pub over_usd_ok: AtomicBool,
}

impl ApprovalRoute {
    pub fn of(work: &super::Work) -> ApprovalRoute {
        let source = work.intakes.first().map_or(Source::User, |i| i.source);
        ApprovalRoute {
            source,
            chat: work.chat().cloned(),
            reply_to: work.reply_to.clone(),
            over_usd_ok: AtomicBool::new(false),
        }
    }
}

/// Why a call needs a yes, if it does (pure: the rule, tested alone).
pub(super) fn needs_approval(
    cfg: &ApprovalsConfig,
    tool: &str,
    always: &std::collections::BTreeSet<String>,
    spent: f64,
    over_usd_ok: bool,
) -> Option<&'static str> {
    if cfg.requires(tool) && !always.contains(tool) {
        return Some("require");
    }
    if cfg.over_usd > 0.0 && spent >= cfg.over_usd && !over_usd_ok {
        return Some("over_usd");
    }
    None
}

/// A sub-agent cannot ask a person: its calls that would need a yes are refused.
fn refuse_for_sub_agent(
    cfg: &ApprovalsConfig,
    calls: &[ToolCall],
    refused: &mut [Option<String>],
    spent: f64,
) {
    for (call, r) in calls.iter().zip(refused.iter_mut()) {
        if r.is_none()
            && needs_approval(cfg, &call.name, &Default::default(), spent, false).is_some()
        {
            *r = Some(format!(
                "error: tool '{}' needs a person's approval, which a sub-agent cannot ask for; the main agent can call it",
                call.name
            ));
        }
    }
}

/// The approval requests of the calls not already refused that need a yes, each with the
/// index of its call.
fn requests(
    cfg: &ApprovalsConfig,
    calls: &[ToolCall],
    refused: &[Option<String>],
    always: &std::collections::BTreeSet<String>,
    spent: f64,
    over_ok: bool,
) -> Vec<(usize, ApprovalRequest)> {
    let mut asked = Vec::new();
    for (i, call) in calls.iter().enumerate() {
        if refused[i].is_some() {
            continue;
        }
        let Some(reason) = needs_approval(cfg, &call.name, always, spent, over_ok) else {
            continue;
        };
        let expires =
            Utc::now() + chrono::Duration::from_std(cfg.timeout).unwrap_or(chrono::Duration::MAX);
        asked.push((
            i,
            ApprovalRequest {
                id: approval::new_id(),
                tool: call.name.clone(),
                tool_call_id: call.id.clone(),
                summary: approval::summary(&call.name, &call.arguments),
                input: call.arguments.clone(),
                expires_at: expires.to_rfc3339(),
                reason: reason.to_string(),
            },
        ));
    }
    asked
}

/// Open one request with the broker and offer it in the message's chat; `None` when too
/// many approvals wait already.
fn offer(
    broker: &Arc<Approvals>,
    cfg: &ApprovalsConfig,
    session: &SessionHandle,
    route: &ApprovalRoute,
    req: &ApprovalRequest,
) -> Option<Ticket> {
    let info = ApprovalInfo {
        id: req.id.clone(),
        session_id: session.id.clone(),
        key: session.key.clone(),
        tool: req.tool.clone(),
        summary: req.summary.clone(),
        input: req.input.clone(),
        created_at: Utc::now().to_rfc3339(),
        expires_at: req.expires_at.clone(),
    };
    let ticket = broker.open(info)?;
    let until = std::time::Instant::now() + cfg.timeout;
    broker.offer(&req.id, route.chat.as_ref(), until);
    Some(ticket)
}

/// Wait for every ticket's verdict until `timeout` from now (`None`: timed out); a request
/// without a ticket is denied at once.
async fn wait_all(
    tickets: Vec<(usize, ApprovalRequest, Option<Ticket>)>,
    timeout: std::time::Duration,
) -> Vec<(usize, ApprovalRequest, Option<Verdict>)> {
    let until = tokio::time::Instant::now() + timeout;
    futures::future::join_all(tickets.into_iter().map(|(i, req, t)| async move {
        // No ticket: too many approvals wait already, a deny at once.
        let v = match t {
            Some(t) => t.wait(until).await,
            None => Some(Verdict {
                decision: Decision::Deny,
                by: format!("agentd (over {} approvals waiting)", approval::MAX_PENDING),
                channel: "daemon".into(),
            }),
        };
        (i, req, v)
    }))
    .await
}

impl Agent {
    /// `[approvals]` now: the broker's live view, else the config the agent started with.
    fn approvals_cfg(&self) -> ApprovalsConfig {
        match &self.approvals {
            Some(a) => a.config(),
            None => self.cfg.approvals.clone(),
        }
    }

    /// Gate the calls of one answer: `refused` gets the error result of every call that may
    /// not run. Waits (cancellably) for the decisions.
    pub(super) async fn gate(
        &self,
        run: &Run<'_>,
        state: &mut SessionState,
        calls: &[ToolCall],
        refused: &mut [Option<String>],
        turn: u32,
    ) -> Result<(), Option<Fail>> {
        let cfg = self.approvals_cfg();
        if cfg.require.is_empty() && cfg.over_usd <= 0.0 {
            return Ok(());
        }
        let (billed, _) = run.billing();
        let spent = self.ledger.message_spent(billed);
        let (session, handle, route) = match &run.caller {
            Caller::Message {
                session,
                handle,
                approval,
                ..
            } => (*session, *handle, *approval),
            Caller::SubAgent { .. } => {
                refuse_for_sub_agent(&cfg, calls, refused, spent);
                return Ok(());
            }
        };
        let over_ok = route.over_usd_ok.load(Ordering::Relaxed);
        let asked = requests(
            &cfg,
            calls,
            refused,
            &state.approvals.always,
            spent,
            over_ok,
        );
        if asked.is_empty() {
            return Ok(());
        }
        // A `system` message has nobody to ask: denied at once unless `system_allow` says.
        if route.source == Source::System {
            return self.deny_system(run, state, &cfg, asked, refused).await;
        }
        let Some(broker) = self.approvals.clone() else {
            for (i, req) in asked {
                refused[i] = Some(approval::denied_result(
                    &req.tool,
                    Decision::Deny,
                    "approvals are not available",
                ));
            }
            return Ok(());
        };
        self.monitor
            .set_state(handle, LoopState::WaitingApproval, turn);
        let mut tickets = Vec::new();
        for (i, req) in &asked {
            self.record_step(run, state, Event::Approval(req.clone()))
                .await?;
            let ticket = offer(&broker, &cfg, session, route, req);
            tickets.push((*i, req.clone(), ticket));
        }
        tracing::info!(session = %session.id, waiting = tickets.len(), "tool calls wait for approval");
        let verdicts = tokio::select! {
            _ = run.cancel.cancelled() => return Err(None),
            v = wait_all(tickets, cfg.timeout) => v,
        };
        for (i, req, v) in verdicts {
            self.apply_verdict(run, state, route, &req, v, &mut refused[i])
                .await?;
        }
        Ok(())
    }

    /// Deny at once the gated calls of a `system` message (nobody to ask), except the tools
    /// `system_allow` names, which run.
    async fn deny_system(
        &self,
        run: &Run<'_>,
        state: &mut SessionState,
        cfg: &ApprovalsConfig,
        asked: Vec<(usize, ApprovalRequest)>,
        refused: &mut [Option<String>],
    ) -> Result<(), Option<Fail>> {
        for (i, req) in asked {
            if cfg.system_allows(&req.tool) {
                continue;
            }
            self.record_step(run, state, Event::Approval(req.clone()))
                .await?;
            self.decided(run, state, &req, Decision::Deny, "agentd", "daemon")
                .await?;
            refused[i] = Some(format!(
                "error: denied: this is a system message, which cannot wait for a person's approval, so this call of '{}' was not run (add the tool to [approvals] system_allow to let system messages run it)",
                req.tool
            ));
        }
        Ok(())
    }

    /// Record one call's verdict (`None`: it timed out); a deny or a timeout puts the call's
    /// error result in `refused`, an allowed `over_usd` lets the message go on past the limit.
    async fn apply_verdict(
        &self,
        run: &Run<'_>,
        state: &mut SessionState,
        route: &ApprovalRoute,
        req: &ApprovalRequest,
        verdict: Option<Verdict>,
        refused: &mut Option<String>,
    ) -> Result<(), Option<Fail>> {
        let Some(Verdict {
            decision,
            by,
            channel,
        }) = verdict
        else {
            self.decided(run, state, req, Decision::Timeout, "agentd", "daemon")
                .await?;
            *refused = Some(approval::denied_result(&req.tool, Decision::Timeout, ""));
            return Ok(());
        };
        self.decided(run, state, req, decision, &by, &channel)
            .await?;
        if decision.allows() {
            if req.reason == "over_usd" {
                route.over_usd_ok.store(true, Ordering::Relaxed);
            }
        } else {
            *refused = Some(approval::denied_result(
                &req.tool,
                decision,
                &format!("by {by} through {channel}"),
            ));
        }
        Ok(())
    }

    async fn decided(
        &self,
        run: &Run<'_>,
        state: &mut SessionState,
        req: &ApprovalRequest,
        decision: Decision,
        by: &str,
        channel: &str,
    ) -> Result<(), Option<Fail>> {
        let ev = Event::ApprovalDecision(ApprovalDecided {
            id: req.id.clone(),
            tool: req.tool.clone(),
            decision,
            by: by.to_string(),
            channel: channel.to_string(),
        });
        self.record_step(run, state, ev).await
    }

    /// A batch of calls that was waiting for approval when the daemon stopped: none of it ran
    /// (the batch runs only once every approval is decided). Returned as an answer to gate
    /// and run again, so the person is asked again.
    pub(super) fn waiting_batch(state: &SessionState) -> Option<ChatResponse> {
        if state.approvals.waiting.is_empty() {
            return None;
        }
        let Some(Message::Assistant {
            text, tool_calls, ..
        }) = state.messages.last()
        else {
            return None;
        };
        let all_in_batch = state
            .approvals
            .waiting
            .iter()
            .all(|w| tool_calls.iter().any(|c| c.id == w.tool_call_id));
        (!tool_calls.is_empty() && all_in_batch).then(|| ChatResponse {
            text: text.clone(),
            tool_calls: tool_calls.clone(),
            thinking: Vec::new(),
            stop_reason: StopReason::ToolUse,
            usage: Default::default(),
            model: String::new(),
        })
    }

    /// Gate and run the batch a crash left waiting for approval (see [`Agent::waiting_batch`]).
    pub(super) async fn resume_waiting_batch(
        &self,
        run: &Run<'_>,
        state: &mut SessionState,
    ) -> Result<(), Option<Fail>> {
        let Some(resp) = Self::waiting_batch(state) else {
            return Ok(());
        };
        let Some(spec) = self.cfg.models.get(run.model).cloned() else {
            return Ok(());
        };
        tracing::info!(session = %run.session_id(), calls = resp.tool_calls.len(), "a batch of tool calls was waiting for approval at the last stop; asking again");
        let refused = vec![None; resp.tool_calls.len()];
        self.run_tools(run, state, (&resp, &refused, &spec), 1)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule() {
        let cfg = ApprovalsConfig {
            require: vec!["exec".into(), "github__*".into()],
            over_usd: 1.0,
            ..Default::default()
        };
        let none = Default::default();
        assert_eq!(
            needs_approval(&cfg, "exec", &none, 0.0, false),
            Some("require")
        );
        assert_eq!(
            needs_approval(&cfg, "github__merge", &none, 0.0, false),
            Some("require")
        );
        assert_eq!(needs_approval(&cfg, "read", &none, 0.5, false), None);
        assert_eq!(
            needs_approval(&cfg, "read", &none, 1.0, false),
            Some("over_usd")
        );
        assert_eq!(needs_approval(&cfg, "read", &none, 1.0, true), None);
        let always = ["exec".to_string()].into_iter().collect();
        assert_eq!(needs_approval(&cfg, "exec", &always, 0.0, false), None);
    }
}
