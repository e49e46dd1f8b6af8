//! The agentic loop (SPEC §6), one loop for a message and for a sub-agent: check the budget,
//! build the request, call the model, record the answer and its cost, run the tools, and go
//! round again until a final answer or the turn limit. On the last turn tools are withheld
//! and calls the model makes anyway are dropped, so the last answer is always final.
//!
//! A message records every step in its session's trail (durably, folded into the state);
//! a sub-agent keeps its conversation in memory, sees only its scoped tools, and bills its
//! calls as `subagent` to the session of the tool call that started it.

use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::answer::{is_empty, nudge};
use super::client::ClientTools;
use super::{Agent, Fail, FailCause, Finish, answer, append, prompt};
use crate::backoff::Backoff;
use crate::config::ModelSpec;
use crate::cost::BudgetError;
use crate::gateway::{Bill, CallError, ChatCall, Paid};
use crate::llm::{
    CallOptions, ChatRequest, ChatResponse, DeltaSink, FellBack, LlmError, LlmEvent, StopReason,
    StreamDelta, SystemBlock, ToolChoice, ToolSpec,
};
use crate::message::{Message, ToolCall, ToolResult, Usage};
use crate::monitor::{LoopState, TurnRecord};
use crate::session::{Event, MessageEvent, SessionHandle, SessionState, TrailLine};
use crate::store::CallType;
use crate::tools::ToolContext;
use crate::tools::spawn::ToolScope;

/// The first wait before a failed trail write is tried again (`Agent::record_durably`).
const STORAGE_RETRY_MIN: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest wait between tries of a failed trail write.
const STORAGE_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// Who a run of the loop works for.
pub(super) enum Caller<'a> {
    /// A message of `session`: recorded in its trail, shown in the monitor (`handle`),
    /// compacted when the context is full; the final answer replies to `reply_to`.
    Message {
        session: &'a Arc<SessionHandle>,
        handle: u64,
        reply_to: Vec<String>,
        tier: String,
        approval: &'a super::approve::ApprovalRoute,
        /// Silence is an answer here (a system event): the stable prompt says how.
        silence: bool,
    },
    /// A sub-agent started by a tool call in `parent`: memory only, tools within `scope`,
    /// a fixed system prompt.
    SubAgent {
        parent: &'a ToolContext,
        scope: &'a ToolScope,
        system: Vec<SystemBlock>,
    },
}

/// One run of the loop.
pub(super) struct Run<'a> {
    pub caller: Caller<'a>,
    pub model: &'a str,
    pub max_turns: u32,
    pub cancel: &'a CancellationToken,
    /// What the client of a compatible endpoint chose for the calls (SPEC §17).
    pub options: &'a CallOptions,
    /// A streamed answer of a compatible endpoint: the text of each call as it arrives, and
    /// a mark as each batch of tool calls starts.
    pub deltas: Option<&'a DeltaSink>,
    /// A compatible endpoint's client tools (SPEC §17): offered beside the agent's own; a
    /// call of one ends the turn.
    pub client: &'a ClientTools,
}

impl Run<'_> {
    /// The session id the provider sees and the logs name.
    pub(super) fn session_id(&self) -> String {
        match &self.caller {
            Caller::Message { session, .. } => session.id.clone(),
            Caller::SubAgent { parent, .. } => format!("{}-sub", parent.session_id),
        }
    }

    /// The session the cost rows are billed to, and their kind.
    pub(super) fn billing(&self) -> (&str, CallType) {
        match &self.caller {
            Caller::Message { session, .. } => (&session.id, CallType::Chat),
            Caller::SubAgent { parent, .. } => (&parent.session_id, CallType::Subagent),
        }
    }

    fn monitor_handle(&self) -> Option<u64> {
        match &self.caller {
            Caller::Message { handle, .. } => Some(*handle),
            Caller::SubAgent { .. } => None,
        }
    }

    fn scope(&self) -> Option<&ToolScope> {
        match &self.caller {
            Caller::Message { .. } => None,
            Caller::SubAgent { scope, .. } => Some(scope),
        }
    }
}

/// What the run has cost so far.
#[derive(Default)]
struct Tally {
    spent: f64,
    usage: Usage,
}

/// One model answer with what it cost.
struct Answer {
    resp: ChatResponse,
    spec: Arc<ModelSpec>,
    /// Messages the request carried.
    sent: usize,
    cost: f64,
    started: Instant,
    /// A fallback model answered for the model asked for (SPEC §18.3).
    fell_back: Option<FellBack>,
    /// Why the answer does not fit the client's format: then it is not final.
    misfit: Option<String>,
}

impl Agent {
    /// Run the loop on `state` until a final answer. `Err(None)` = cancelled; `Err(Some)` =
    /// failed.
    pub(super) async fn run_loop(
        &self,
        run: &Run<'_>,
        state: &mut SessionState,
    ) -> Result<Finish, Option<Fail>> {
        let mut tally = Tally::default();
        let (mut nudged, mut reformatted) = (false, false);
        if let Caller::Message { .. } = &run.caller {
            self.resume_waiting_batch(run, state).await?;
        }
        for turn in 1..=run.max_turns {
            let last_turn = turn == run.max_turns;
            if let Caller::Message { session, .. } = &run.caller {
                self.repair_dangling(session, state, run.cancel).await?;
            }
            // Everything the message spent so far: its sub-agents and compactions too.
            let (billed, _) = run.billing();
            self.check_budget(self.ledger.message_spent(billed)).await?;
            let req = self.request(run, state, (turn == 1, last_turn)).await?;
            let mut answer = self.call(run, state, req, turn).await?;
            let fallback = answer.fell_back.clone();
            tally.spent += answer.cost;
            tally.usage.add(&answer.resp.usage);
            if is_empty(&answer.resp, last_turn) {
                // An empty final answer is not a reply (small models give one): asked again
                // once with a nudge, then the message fails (SPEC §16).
                self.metrics.error("empty_answer");
                tracing::warn!(session = %run.session_id(), turn, nudged, "the model's answer was empty");
                if nudged || last_turn {
                    return Err(Some(Fail {
                        reply: self.cfg.behavior.error_message.clone(),
                        error: format!(
                            "the model ({}) answered with empty text{}",
                            answer.spec.name,
                            if nudged {
                                " twice"
                            } else {
                                " on the last turn"
                            }
                        ),
                        cause: FailCause::Model,
                    }));
                }
                nudged = true;
                self.record_step(run, state, Event::Message(nudge()))
                    .await?;
                continue;
            }
            answer.misfit =
                answer::misfit(run.options.format.as_deref(), &mut answer.resp, last_turn);
            let misfit = answer.misfit.clone();
            let (resp, refused, spec) = self
                .record_answer(run, state, answer, turn, last_turn)
                .await?;
            if let Some(why) = misfit {
                tracing::warn!(session = %run.session_id(), turn, %why, "the final answer does not fit the client's format");
                if reformatted || last_turn {
                    let reply = self.cfg.behavior.error_message.clone();
                    return Err(Some(answer::format_fail(
                        reply,
                        &spec.name,
                        &why,
                        reformatted,
                    )));
                }
                reformatted = true;
                let note = answer::format_note(&why);
                self.record_step(run, state, Event::Message(note)).await?;
                continue;
            }
            let client_calls = run.client.calls_of(&resp.tool_calls, &refused);
            if resp.tool_calls.is_empty() || !client_calls.is_empty() {
                let (resp, client_calls) = self
                    .run_own_calls(run, state, (resp, &refused, &spec), &client_calls, turn)
                    .await?;
                let (cost_usd, usage) = self.reported(run, &tally);
                return Ok(Finish::Reply {
                    truncated: resp.stop_reason == StopReason::MaxTokens,
                    silent: self.is_silent(run, &resp.text),
                    text: resp.text,
                    usage,
                    cost_usd,
                    fallback,
                    client_calls,
                });
            }
            if let Some(d) = run.deltas {
                // The text streamed so far was not the final answer; the client gets a
                // keep-alive while the tools run.
                let _ = d.send(StreamDelta::Tools);
            }
            self.run_tools(run, state, (&resp, &refused, &spec), turn)
                .await?;
        }
        unreachable!("the last turn is always final")
    }

    /// What the run reports as its cost and tokens: for a message, every cost row billed to
    /// it so far (the ledger's spend of the message: its sub-agents, compactions and
    /// embeddings too); for a sub-agent, its own calls.
    fn reported(&self, run: &Run<'_>, tally: &Tally) -> (f64, Usage) {
        match &run.caller {
            Caller::Message { session, .. } => self.ledger.message_totals(&session.id),
            Caller::SubAgent { .. } => (tally.spent, tally.usage),
        }
    }

    /// The request of one turn: the system prompt (a message re-reads the workspace files for
    /// every call, SPEC §6), the tools the caller may use, and the conversation, lent from the
    /// state until the call returns. A message's context is compacted first if it would not
    /// fit (SPEC §15).
    async fn request(
        &self,
        run: &Run<'_>,
        state: &mut SessionState,
        (first_call, last_turn): (bool, bool),
    ) -> Result<ChatRequest, Option<Fail>> {
        let (system, tools) = match &run.caller {
            Caller::Message {
                session,
                tier,
                silence,
                ..
            } => {
                let system = self
                    .system_blocks(tier, &state.skills_off, *silence)
                    .await?;
                let tools = run.client.tools(self.tools.specs());
                let tool_tokens = self.tool_tokens.of(&tools);
                self.fit_context(session, state, run.model, &system, tool_tokens)
                    .await?;
                (system, tools)
            }
            Caller::SubAgent { scope, system, .. } => {
                // Hidden from the sub-agent, and refused again at execution.
                let tools: Arc<[ToolSpec]> = self
                    .tools
                    .specs()
                    .iter()
                    .filter(|s| scope.permits(&s.name))
                    .cloned()
                    .collect();
                (system.clone(), tools)
            }
        };
        let stable_ttl = match &run.caller {
            Caller::Message { .. } => Some(prompt::stable_ttl(
                self.cfg.caching.ttl,
                &state.recent_turns,
            )),
            Caller::SubAgent { .. } => None,
        };
        Ok(ChatRequest {
            stable_ttl,
            options: run.options.clone(),
            // A structured answer is sent whole once checked, not as it is written.
            deltas: run.deltas.filter(|_| run.options.format.is_none()).cloned(),
            session_id: run.session_id(),
            system,
            // Lent to the request for the call instead of copied (the history is the largest
            // part of a request): given back right after the call, before anything else reads
            // the state.
            messages: std::mem::take(&mut state.messages),
            tools,
            tool_choice: if last_turn {
                ToolChoice::None
            } else {
                run.client.choice(first_call)
            },
            previous_messages: state.previous_messages,
            // Lent the same way: the renderer reuses the bytes of every message it rendered
            // before and adds the new ones.
            rendered: std::mem::take(&mut state.rendered),
        })
    }

    /// The stable and semi-stable system blocks of `tier`, without the skills the session
    /// turned off, read off the async workers.
    async fn system_blocks(
        &self,
        tier: &str,
        skills_off: &std::collections::BTreeSet<String>,
        silence: bool,
    ) -> Result<Vec<SystemBlock>, Option<Fail>> {
        let workspace = self.cfg.agent.workspace.clone();
        let files = self.cfg.agent.context.files_for(tier);
        let skills_text = self.skills.semi_stable_text(skills_off);
        let rule = match silence {
            true => prompt::silence_rule(&self.cfg.behavior.silent_tokens),
            false => String::new(),
        };
        tokio::task::spawn_blocking(move || {
            prompt::system_blocks(&workspace, &files, &rule, &skills_text)
        })
        .await
        .map_err(|e| {
            Some(Fail::other(
                self.cfg.behavior.error_message.clone(),
                format!("cannot read workspace files: {e}"),
            ))
        })
    }

    /// The model call through the gateway (budget check under the message's call gate, retries,
    /// fallbacks, message-level retries; cancellable; its cost row and metrics), the messages
    /// given back to the state.
    async fn call(
        &self,
        run: &Run<'_>,
        state: &mut SessionState,
        req: ChatRequest,
        turn: u32,
    ) -> Result<Answer, Option<Fail>> {
        let sent = req.messages.len();
        let (billed, call_type) = run.billing();
        let handle = run.monitor_handle();
        if let Some(h) = handle {
            self.monitor.set_state(h, LoopState::Thinking, turn);
        }
        let monitor = self.monitor.clone();
        let on_event = move |e: LlmEvent| match e {
            LlmEvent::RetryWait {
                model,
                attempt,
                delay,
                error,
            } => {
                tracing::warn!(%model, attempt, delay_ms = delay.as_millis() as u64, %error, "LLM call failed; retrying");
                if let Some(h) = handle {
                    monitor.set_state(h, LoopState::RetryWait, turn);
                }
            }
            LlmEvent::Fallback { from, to, error } => {
                tracing::warn!(%from, %to, %error, "model failed; trying fallback");
                if let Some(h) = handle {
                    monitor.set_model(h, &to);
                    monitor.set_state(h, LoopState::Thinking, turn);
                }
            }
        };
        let call = ChatCall {
            message_retries: self.cfg.behavior.message_retries,
            cancel: Some(run.cancel),
            ..ChatCall::new(run.model, call_type, Bill::message(billed))
        };
        let paid = self.gateway.chat(call, &req, &on_event).await;
        state.messages = req.messages;
        state.rendered = req.rendered;
        let Paid {
            out: outcome,
            cost_usd: cost,
            sent: started,
        } = paid.map_err(|e| self.call_fail(e))?;
        let fell_back = outcome.fell_back;
        if let Some(h) = handle {
            let from = fell_back.as_ref().map(|f| f.from.as_str());
            let why = fell_back.as_ref().map(|f| f.reason.as_str());
            self.monitor
                .set_fallback(h, &outcome.model.name, from.zip(why));
        }
        Ok(Answer {
            resp: outcome.response,
            spec: outcome.model,
            sent,
            cost,
            started,
            fell_back,
            misfit: None,
        })
    }

    /// A call the gateway did not answer, as the run's failure (`None`: cancelled).
    fn call_fail(&self, e: CallError) -> Option<Fail> {
        match e {
            CallError::Cancelled => None,
            CallError::Budget(e) => Some(self.budget_fail(e)),
            CallError::Failed(e) => {
                self.metrics.error("llm");
                Some(self.fail_from_llm(e))
            }
        }
    }

    /// Settle the answer's tool calls (dropped on the last turn; normalised, so no answer can
    /// poison later requests; refused when the caller may not use the tool) and record the
    /// answer. Returns it with, per call, the error result that answers it instead of running.
    async fn record_answer(
        &self,
        run: &Run<'_>,
        state: &mut SessionState,
        answer: Answer,
        turn: u32,
        last_turn: bool,
    ) -> Result<(ChatResponse, Vec<Option<String>>, Arc<ModelSpec>), Option<Fail>> {
        let Answer {
            mut resp,
            spec,
            sent,
            cost,
            started,
            fell_back,
            misfit,
        } = answer;
        if last_turn && !resp.tool_calls.is_empty() {
            tracing::warn!(session = %run.session_id(), "model called tools on the last turn; calls dropped");
            resp.tool_calls.clear();
        }
        let mut refused =
            normalise_tool_calls(&run.session_id(), &mut resp.tool_calls, &state.messages);
        limit_spawns(&resp.tool_calls, &mut refused);
        if let Some(scope) = run.scope() {
            for (call, refusal) in resp.tool_calls.iter().zip(refused.iter_mut()) {
                if refusal.is_none() && !scope.permits(&call.name) {
                    tracing::warn!(tool = %call.name, "sub-agent called a denied tool; refused");
                    *refusal = scope.refusal(&call.name);
                }
            }
        }
        // A call of a client tool ends the turn: this is the answer the client gets.
        let client_calls = run.client.calls_of(&resp.tool_calls, &refused);
        let is_final = (resp.tool_calls.is_empty() || !client_calls.is_empty()) && misfit.is_none();
        let mut ev = MessageEvent::new(resp.to_message());
        ev.client_calls = client_calls;
        ev.model = Some(spec.name.clone());
        ev.stop_reason = Some(resp.stop_reason.as_str().to_string());
        ev.turn = Some(turn);
        ev.sent_messages = Some(sent);
        ev.cost_usd = Some(cost);
        if let Some(f) = fell_back {
            ev.fallback_from = Some(f.from);
            ev.fallback_reason = Some(f.reason);
        }
        if let (
            true,
            Caller::Message {
                reply_to, session, ..
            },
        ) = (is_final, &run.caller)
        {
            ev.is_final = true;
            ev.silent = self.is_silent(run, &resp.text);
            ev.reply_to = reply_to.clone();
            let (cost, usage) = self.ledger.message_totals(&session.id);
            ev.message_cost_usd = Some(cost);
            ev.message_usage = Some(usage);
        }
        self.record_step(run, state, Event::Message(ev)).await?;
        if let Some(h) = run.monitor_handle() {
            self.monitor.turn_done(
                h,
                TurnRecord {
                    duration_ms: started.elapsed().as_millis() as u64,
                    usage: resp.usage,
                    stop_reason: resp.stop_reason.as_str().to_string(),
                    tools: resp.tool_calls.iter().map(|c| c.name.clone()).collect(),
                },
            );
        }
        Ok((resp, refused, spec))
    }

    /// Run the answer's tool calls (cancellable) and record their results, with the wrap-up
    /// notice when it is due.
    pub(super) async fn run_tools(
        &self,
        run: &Run<'_>,
        state: &mut SessionState,
        (resp, refused, spec): (&ChatResponse, &[Option<String>], &ModelSpec),
        turn: u32,
    ) -> Result<(), Option<Fail>> {
        let ctx = match &run.caller {
            Caller::Message {
                session,
                handle,
                approval,
                ..
            } => {
                self.monitor.set_state(*handle, LoopState::Tools, turn);
                self.monitor.set_tools(
                    *handle,
                    resp.tool_calls.iter().map(|c| c.name.clone()).collect(),
                );
                let window = spec.context_window;
                let mut ctx = self.tool_context(session, state, &spec.name, window);
                ctx.reply_to = approval.reply_to.clone();
                ctx
            }
            Caller::SubAgent { parent, .. } => ToolContext {
                sees_images: spec.supports_vision,
                ..(*parent).clone()
            },
        };
        let mut refused = refused.to_vec();
        refused.resize(resp.tool_calls.len(), None);
        self.gate(run, state, &resp.tool_calls, &mut refused, turn)
            .await?;
        if let Some(h) = run.monitor_handle() {
            self.monitor.set_state(h, LoopState::Tools, turn);
        }
        let results = tokio::select! {
            _ = run.cancel.cancelled() => return Err(None),
            r = self.execute(run, &resp.tool_calls, &refused, &ctx) => r,
        };
        for r in &results {
            let name = resp
                .tool_calls
                .iter()
                .find(|c| c.id == r.tool_call_id)
                .map_or("unknown", |c| c.name.as_str());
            self.metrics.tool_call(name, !r.is_error);
        }
        let notice = wrap_up_notice(&resp.stop_reason, run.max_turns - turn);
        // The registry already truncated each output to `output_truncation`. Images are never
        // recorded: the trail gets the results without them (their text holds the
        // placeholders), the in-memory copy keeps them for this message's calls.
        let images = results.iter().any(|r| !r.images.is_empty());
        let stored = results.iter().map(ToolResult::without_images).collect();
        let event = Event::ToolResult {
            results: stored,
            notice: notice.clone(),
        };
        self.record_step(run, state, event).await?;
        if let Some(last) = state.messages.len().checked_sub(1).filter(|_| images) {
            state.replace_message(last, Message::ToolResults { results, notice });
        }
        Ok(())
    }

    /// Whether a final answer is a silent token (SPEC §5.5): a message's only, a sub-agent's
    /// answer always goes back to the main agent.
    fn is_silent(&self, run: &Run<'_>, text: &str) -> bool {
        matches!(run.caller, Caller::Message { .. })
            && prompt::is_silent(text, &self.cfg.behavior.silent_tokens)
    }

    /// Run one answer's calls: a message's side by side (at most `max_parallel_calls` at
    /// once), a sub-agent's one at a time, inside the slot of its `sessions_spawn` call (so a
    /// message never has more than `max_parallel_calls` tools running, docs/security.md).
    async fn execute(
        &self,
        run: &Run<'_>,
        calls: &[ToolCall],
        refused: &[Option<String>],
        ctx: &ToolContext,
    ) -> Vec<ToolResult> {
        if let Caller::Message { .. } = run.caller {
            return self.tools.execute_answer(calls, refused, ctx).await;
        }
        let mut results = Vec::with_capacity(calls.len());
        for (i, call) in calls.iter().enumerate() {
            let refusal = refused.get(i).cloned().unwrap_or_default();
            results.extend(
                self.tools
                    .execute_answer(std::slice::from_ref(call), &[refusal], ctx)
                    .await,
            );
        }
        results
    }

    /// Record one step of the run: in the session's trail (durably) and its state for a
    /// message; in the state alone for a sub-agent.
    pub(super) async fn record_step(
        &self,
        run: &Run<'_>,
        state: &mut SessionState,
        event: Event,
    ) -> Result<(), Option<Fail>> {
        match &run.caller {
            Caller::Message { session, .. } => {
                self.record_durably(session, state, event, run.cancel).await
            }
            Caller::SubAgent { .. } => {
                let line = TrailLine {
                    v: crate::session::event::TRAIL_VERSION,
                    seq: state.last_seq + 1,
                    ts: Utc::now().to_rfc3339(),
                    event,
                };
                self.fold(state, line)
            }
        }
    }

    /// The budget before a call ([`crate::cost::Ledger::check`]) as the run's failure.
    pub(super) async fn check_budget(&self, spent_message: f64) -> Result<(), Option<Fail>> {
        let checked = self.ledger.check(spent_message).await;
        checked.map_err(|e| Some(self.budget_fail(e)))
    }

    /// A refused budget check as the run's failure.
    fn budget_fail(&self, e: BudgetError) -> Fail {
        match e {
            // Meant for the user: the limit, or the disk that keeps cost rows from being written.
            e @ (BudgetError::Exceeded(_) | BudgetError::Unrecorded { .. }) => {
                let msg = e.to_string();
                Fail {
                    reply: msg.clone(),
                    error: msg,
                    cause: FailCause::Budget,
                }
            }
            // The ledger is unreadable: fail closed, since a budget exists.
            e => Fail {
                reply: self.cfg.behavior.error_message.clone(),
                error: e.to_string(),
                cause: FailCause::Budget,
            },
        }
    }

    fn fail_from_llm(&self, e: LlmError) -> Fail {
        let reply = match &e {
            // Configuration problems: tell the user exactly what to fix.
            LlmError::NotLoaded { .. } | LlmError::UnknownModel(_) | LlmError::Budget(_) => {
                e.to_string()
            }
            _ => self.cfg.behavior.error_message.clone(),
        };
        Fail {
            reply,
            error: e.to_string(),
            cause: FailCause::Model,
        }
    }

    /// Like [`Agent::record`], but a write that fails (a full disk, an I/O error) does not end
    /// the message: it is retried with backoff (1 s doubling to 30 s) until it succeeds, so the
    /// message pauses and carries on once the disk has room again — an acknowledged message is
    /// neither dropped nor answered with an error because the disk was full for a while. A failed
    /// append leaves nothing in the file (`fsutil::append_line_fsync`), so the retry writes the
    /// same line again. `cancel` ends the wait like any interruption: nothing is recorded and
    /// the message resumes after the next start.
    pub(super) async fn record_durably(
        &self,
        session: &Arc<SessionHandle>,
        state: &mut SessionState,
        event: Event,
        cancel: &CancellationToken,
    ) -> Result<(), Option<Fail>> {
        let mut backoff = Backoff::exponential(STORAGE_RETRY_MIN, STORAGE_RETRY_MAX).exact();
        loop {
            match append(session, event.clone()).await {
                Ok(line) => {
                    if backoff.failures() > 0 {
                        tracing::info!(session = %session.id, failures = backoff.failures(), "the session trail is writable again; the message continues");
                    }
                    return self.fold(state, line);
                }
                Err(e) => {
                    let delay = backoff.next_delay();
                    let failures = backoff.failures();
                    if failures == 1 {
                        self.metrics.error("trail");
                        tracing::error!(session = %session.id, error = %e, "cannot write the session trail; the message waits and retries");
                    } else {
                        tracing::warn!(session = %session.id, error = %e, failures, retry_in_ms = delay.as_millis() as u64, "the session trail is still not writable");
                    }
                    tokio::select! {
                        _ = cancel.cancelled() => return Err(None),
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// Append an event to the trail (durably) and fold it into the state.
    pub(super) async fn record(
        &self,
        session: &Arc<SessionHandle>,
        state: &mut SessionState,
        event: Event,
    ) -> Result<(), Option<Fail>> {
        match append(session, event).await {
            Ok(line) => self.fold(state, line),
            Err(e) => Err(Some(Fail::other(
                self.cfg.behavior.error_message.clone(),
                format!("cannot write the session trail: {e}"),
            ))),
        }
    }

    /// Fold a line just written into the state.
    fn fold(&self, state: &mut SessionState, line: TrailLine) -> Result<(), Option<Fail>> {
        if line.seq > state.last_seq {
            state.apply(&line);
            return Ok(());
        }
        Err(Some(Fail::other(
            self.cfg.behavior.error_message.clone(),
            format!(
                "trail sequence went backwards (line {} after state {}); the state is rebuilt from the trail on the next message",
                line.seq, state.last_seq
            ),
        )))
    }
}

/// The note appended after tool results: max_tokens hit, or two calls left (SPEC §6).
fn wrap_up_notice(stop: &StopReason, remaining: u32) -> Option<String> {
    let mut parts = Vec::new();
    if *stop == StopReason::MaxTokens {
        parts.push("Your last response hit the output token limit (max_tokens) after complete tool calls; their results are above. Wrap up: keep the next response short.");
    }
    if remaining == 2 {
        parts.push("Only 2 model calls remain for this message: wrap up now and give your final answer; on the last call tools are disabled.");
    }
    (!parts.is_empty()).then(|| format!("[agentd] {}", parts.join(" ")))
}

/// Refuse the `sessions_spawn` calls of one answer beyond
/// [`crate::tools::spawn::MAX_SPAWNS_PER_ANSWER`]: each gets an error result the model reads
/// instead of a sub-agent. (A sub-agent never sees the tool, so this bounds a message's
/// sub-agents per answer.)
fn limit_spawns(calls: &[ToolCall], refused: &mut [Option<String>]) {
    use crate::tools::spawn::MAX_SPAWNS_PER_ANSWER as MAX;
    let mut spawns = 0;
    for (call, refusal) in calls.iter().zip(refused.iter_mut()) {
        if call.name != "sessions_spawn" || refusal.is_some() {
            continue;
        }
        spawns += 1;
        if spawns > MAX {
            *refusal = Some(format!(
                "error: at most {MAX} sub-agents (sessions_spawn calls) run per answer; this call was not run. Wait for the results of the first {MAX}, then spawn the rest in a later answer or do the task yourself."
            ));
        }
    }
}

/// `llm::toolcalls::normalise` on one answer's calls, with a log line per changed call.
/// Returns, per call, the error result that answers it instead of running it.
fn normalise_tool_calls(
    session_id: &str,
    calls: &mut [crate::message::ToolCall],
    history: &[Message],
) -> Vec<Option<String>> {
    let rewrites = crate::message::toolcalls::normalise(calls, history);
    let mut refused = vec![None; calls.len()];
    for r in rewrites {
        // Debug formatting escapes control characters: the originals come from outside.
        tracing::warn!(
            session = %session_id,
            index = r.index,
            original_id = ?r.original_id,
            original_name = ?r.original_name,
            stored_id = %calls[r.index].id,
            refused = r.refusal.is_some(),
            "malformed tool call from the provider normalised before it is stored"
        );
        refused[r.index] = r.refusal;
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_up_notice_on_two_remaining_and_max_tokens() {
        assert_eq!(wrap_up_notice(&StopReason::ToolUse, 5), None);
        assert!(
            wrap_up_notice(&StopReason::ToolUse, 2)
                .unwrap()
                .contains("Only 2 model calls remain")
        );
        let both = wrap_up_notice(&StopReason::MaxTokens, 2).unwrap();
        assert!(both.contains("max_tokens") && both.contains("Only 2"));
    }
}
