//! One message end to end (SPEC §5.5, §6): route to a model, append the user turn, run the
//! agentic loop (LLM call → tools → results → …), record every step in the session trail and
//! the cost ledger, and report the outcome. Works on neutral types only.

pub mod compaction;
pub mod prompt;
mod status;

use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::cost::{self, BudgetError};
use crate::llm::{
    ChatRequest, Llm, LlmError, LlmEvent, Message, StopReason, ToolChoice, ToolResult, Usage,
    UserBlock,
};
use crate::monitor::{LoopState, Monitor, TurnRecord};
use crate::session::{Event, Intake, MessageEvent, SessionHandle, SessionState, TrailLine};
use crate::store::{CallType, CostRow, Db};
use crate::tools::{ToolContext, ToolRegistry};

/// Shared services the loop needs. Cheap to clone.
#[derive(Clone)]
pub struct Agent {
    pub cfg: Arc<Config>,
    pub llm: Arc<Llm>,
    pub db: Db,
    pub tools: Arc<ToolRegistry>,
    pub monitor: Arc<Monitor>,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub skills: Arc<crate::skills::SkillSet>,
    /// Long-term memory (`[memory] enabled`): recall for each message.
    pub memory: Option<crate::memory::Memory>,
    /// Consolidation before compaction and on session close (when
    /// `consolidation.enabled`).
    pub consolidator: Option<crate::memory::consolidate::Consolidator>,
    pub started: Instant,
}

/// One unit of work for a session: the intakes merged into one user turn, or (after a
/// restart) a turn whose user message is already in the trail and only needs finishing.
#[derive(Debug, Clone)]
pub struct Work {
    pub intakes: Vec<Intake>,
    pub resume: bool,
}

impl Work {
    pub fn ids(&self) -> Vec<String> {
        self.intakes.iter().map(|i| i.id.clone()).collect()
    }
    fn source(&self) -> &str {
        self.intakes.first().map_or("user", |i| i.source.as_str())
    }
    fn from(&self) -> &str {
        self.intakes.first().map_or("", |i| i.from.as_str())
    }
    /// The texts of the intakes, joined with newlines.
    fn text(&self) -> String {
        self.intakes
            .iter()
            .map(|i| i.text.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Model name for a message from `source` (SPEC §3 `[routing]`; default `primary`).
pub fn route_source(cfg: &Config, source: &str) -> String {
    cfg.routing
        .get(source)
        .cloned()
        .unwrap_or_else(|| "primary".to_string())
}

/// How a message ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    Reply {
        text: String,
        silent: bool,
        usage: Usage,
        cost_usd: f64,
    },
    Failed {
        /// What the sender is told.
        reply: String,
        error: String,
    },
    /// Shutdown or /stop interrupted the loop; no completion was recorded, so the message is
    /// resumed after the next start.
    Cancelled,
}

/// The first wait before a failed trail write is tried again (`Agent::record_durably`).
const STORAGE_RETRY_MIN: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest wait between tries of a failed trail write.
const STORAGE_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// An error that ends the message: what the user is told and what is logged.
struct Fail {
    reply: String,
    error: String,
}

impl Agent {
    /// Model name for a message from `source` (SPEC §3 `[routing]`).
    pub fn route(&self, source: &str) -> String {
        route_source(&self.cfg, source)
    }

    /// Model for a unit of work: `vision` when the message carries an image and that model is
    /// loaded, else the source's route.
    pub fn route_work(&self, work: &Work) -> String {
        let has_image = work
            .intakes
            .iter()
            .flat_map(|i| &i.attachments)
            .any(|a| image_media_type(a).is_some());
        if has_image {
            let vision = self
                .cfg
                .routing
                .get("vision")
                .map_or("vision", String::as_str);
            if self.cfg.models.get(vision).is_some() {
                return vision.to_string();
            }
        }
        self.route(work.source())
    }

    /// Process one unit of work on `state` (which the caller loaded and saves afterwards).
    pub async fn process(
        &self,
        session: &Arc<SessionHandle>,
        state: &mut SessionState,
        work: &Work,
        model: &str,
        cancel: &CancellationToken,
    ) -> Finish {
        if work.source() == "scheduler" && !work.resume {
            return self.deliver_scheduled(session, state, work, cancel).await;
        }
        let handle = self.monitor.begin(&session.id, &session.key, model);
        let result = self
            .run_loop(session, state, work, model, handle, cancel)
            .await;
        self.monitor.end(handle);
        state.strip_images();
        match result {
            Ok(finish) => finish,
            Err(None) => Finish::Cancelled,
            Err(Some(fail)) => {
                let ev = Event::Failure {
                    reply_to: work.ids(),
                    error: fail.error.clone(),
                    reply: fail.reply.clone(),
                };
                if let Err(e) = append(session, ev).await {
                    tracing::error!(session = %session.id, error = %e, "cannot record failure in the trail");
                }
                Finish::Failed {
                    reply: fail.reply,
                    error: fail.error,
                }
            }
        }
    }

    /// A scheduled message (SPEC §14) is delivered as written, not sent to the model: the
    /// trail gets a user turn saying so and the text as the final assistant message, so the
    /// model sees later that it was sent.
    async fn deliver_scheduled(
        &self,
        session: &Arc<SessionHandle>,
        state: &mut SessionState,
        work: &Work,
        cancel: &CancellationToken,
    ) -> Finish {
        let text = work
            .intakes
            .iter()
            .map(|i| i.text.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let note = format!(
            "{} [scheduler] A message scheduled earlier is being sent now; it follows as your reply.",
            prompt::time_prefix(Utc::now(), self.cfg.agent.timezone)
        );
        let mut user = MessageEvent::new(Message::user_text(note));
        user.reply_to = work.ids();
        user.source = Some("scheduler".into());
        let mut reply = MessageEvent::new(Message::Assistant {
            text: text.clone(),
            tool_calls: vec![],
            thinking: vec![],
            usage: None,
        });
        reply.is_final = true;
        reply.reply_to = work.ids();
        for ev in [Event::Message(user), Event::Message(reply)] {
            let recorded = self.record_durably(session, state, ev, cancel).await;
            if let Err(None) = recorded {
                return Finish::Cancelled;
            }
            if let Err(Some(fail)) = recorded {
                let _ = append(
                    session,
                    Event::Failure {
                        reply_to: work.ids(),
                        error: fail.error.clone(),
                        reply: fail.reply.clone(),
                    },
                )
                .await;
                return Finish::Failed {
                    reply: fail.reply,
                    error: fail.error,
                };
            }
        }
        Finish::Reply {
            text,
            silent: false,
            usage: Usage::default(),
            cost_usd: 0.0,
        }
    }

    /// `Err(None)` = cancelled; `Err(Some)` = failed.
    async fn run_loop(
        &self,
        session: &Arc<SessionHandle>,
        state: &mut SessionState,
        work: &Work,
        model: &str,
        handle: u64,
        cancel: &CancellationToken,
    ) -> Result<Finish, Option<Fail>> {
        let cfg = &self.cfg;
        let ids = work.ids();
        // Calls left without results (a crash, /stop during tools) are answered before
        // anything is appended: providers reject a tool call without its result.
        self.repair_dangling(session, state, cancel).await?;
        let tier = compaction::work_tier(work);
        if !work.resume {
            let compaction_near = self.take_compaction_warning(state, &tier).await;
            let images = if self
                .cfg
                .models
                .get(model)
                .is_some_and(|m| m.supports_vision)
            {
                load_images(work).await
            } else {
                Vec::new()
            };
            let recall = match &self.memory {
                Some(memory) => memory.recall(&work.text(), &session.id).await,
                None => None,
            };
            let msg = self.user_turn(work, images, compaction_near, recall.as_deref());
            // Images are never persisted: the trail gets the placeholders.
            let mut ev = MessageEvent::new(msg.without_images());
            ev.reply_to = ids.clone();
            ev.source = Some(work.source().to_string());
            ev.from = Some(work.from().to_string());
            self.record_durably(session, state, Event::Message(ev), cancel)
                .await?;
            // The in-memory copy keeps images for this message's calls.
            if let Some(last) = state.messages.last_mut() {
                *last = msg;
            }
        }

        let max_turns = cfg.behavior.max_turns_per_message.max(1);
        let mut spent = 0.0;
        let mut total = Usage::default();

        for turn in 1..=max_turns {
            self.repair_dangling(session, state, cancel).await?;
            self.check_budget(spent).await?;

            let last_turn = turn == max_turns;
            // Workspace files are re-read for every call (SPEC §6), off the async workers.
            let workspace = cfg.agent.workspace.clone();
            let files = cfg.agent.context.files_for(&tier);
            let skills_text = self.skills.semi_stable_text();
            let system = tokio::task::spawn_blocking(move || {
                prompt::system_blocks(&workspace, &files, &skills_text)
            })
            .await
            .map_err(|e| {
                Some(Fail {
                    reply: cfg.behavior.error_message.clone(),
                    error: format!("cannot read workspace files: {e}"),
                })
            })?;
            let tools = self.tools.specs();
            // The context-window guard: compact first, or fail instead of sending (SPEC §15).
            self.fit_context(session, state, model, &system, &tools)
                .await?;
            let req = ChatRequest {
                session_id: session.id.clone(),
                system,
                // Lent to the request for the call instead of copied (the history is the
                // largest part of a request): given back right after the call, before anything
                // else reads the state.
                messages: std::mem::take(&mut state.messages),
                tools,
                tool_choice: if last_turn {
                    ToolChoice::None
                } else {
                    ToolChoice::Auto
                },
                previous_messages: state.previous_messages,
            };
            let sent = req.messages.len();
            self.monitor.set_state(handle, LoopState::Thinking, turn);
            let started = Instant::now();
            let monitor = self.monitor.clone();
            let on_event = move |e: LlmEvent| match e {
                LlmEvent::RetryWait {
                    model,
                    attempt,
                    delay,
                    error,
                } => {
                    tracing::warn!(%model, attempt, delay_ms = delay.as_millis() as u64, %error, "LLM call failed; retrying");
                    monitor.set_state(handle, LoopState::RetryWait, turn);
                }
                LlmEvent::Fallback { from, to, error } => {
                    tracing::warn!(%from, %to, %error, "model failed; trying fallback");
                    monitor.set_model(handle, &to);
                    monitor.set_state(handle, LoopState::Thinking, turn);
                }
            };
            let outcome = tokio::select! {
                _ = cancel.cancelled() => None,
                r = self.chat_with_message_retries(model, &req, &on_event) => Some(r),
            };
            state.messages = req.messages;
            let Some(outcome) = outcome else {
                return Err(None);
            };
            let outcome = outcome.map_err(|e| {
                self.metrics.error("llm");
                Some(self.fail_from_llm(e))
            })?;
            let spec = outcome.model;
            let mut resp = outcome.response;
            let usage = resp.usage;
            let call_cost = cost::cost_usd(&spec.pricing, &usage);
            self.metrics
                .llm_call(&spec.model, &usage, call_cost, started.elapsed());
            spent += call_cost;
            total.add(&usage);
            self.record_cost(
                &session.id,
                &spec.model,
                &spec.provider,
                CallType::Chat,
                usage,
                call_cost,
            )
            .await;

            let has_tools = !resp.tool_calls.is_empty();
            if last_turn && has_tools {
                tracing::warn!(session = %session.id, "model called tools on the last turn; calls dropped");
                resp.tool_calls.clear();
            }
            // Stored as both providers accept it, so no answer can poison later requests.
            let refused = normalise_tool_calls(&session.id, &mut resp.tool_calls, &state.messages);
            let is_final = resp.tool_calls.is_empty();
            let silent = is_final && prompt::is_silent(&resp.text, &cfg.behavior.silent_tokens);
            let mut ev = MessageEvent::new(resp.to_message());
            ev.model = Some(spec.name.clone());
            ev.stop_reason = Some(resp.stop_reason.as_str().to_string());
            ev.turn = Some(turn);
            ev.sent_messages = Some(sent);
            ev.cost_usd = Some(call_cost);
            if is_final {
                ev.is_final = true;
                ev.silent = silent;
                ev.reply_to = ids.clone();
            }
            self.record_durably(session, state, Event::Message(ev), cancel)
                .await?;
            let tool_names: Vec<String> = resp.tool_calls.iter().map(|c| c.name.clone()).collect();
            self.monitor.turn_done(
                handle,
                TurnRecord {
                    duration_ms: started.elapsed().as_millis() as u64,
                    usage,
                    stop_reason: resp.stop_reason.as_str().to_string(),
                    tools: tool_names.clone(),
                },
            );

            if is_final {
                return Ok(Finish::Reply {
                    text: resp.text,
                    silent,
                    usage: total,
                    cost_usd: spent,
                });
            }

            self.monitor.set_state(handle, LoopState::Tools, turn);
            self.monitor.set_tools(handle, tool_names);
            let ctx = self.tool_context(session, state, &spec.name, spec.context_window);
            let results = tokio::select! {
                _ = cancel.cancelled() => return Err(None),
                r = self.tools.execute_answer(&resp.tool_calls, &refused, &ctx) => r,
            };
            for r in &results {
                let name = resp
                    .tool_calls
                    .iter()
                    .find(|c| c.id == r.tool_call_id)
                    .map_or("unknown", |c| c.name.as_str());
                self.metrics.tool_call(name, !r.is_error);
            }
            let notice = wrap_up_notice(&resp.stop_reason, max_turns - turn);
            self.record_durably(
                session,
                state,
                // The registry already truncated each output to `output_truncation`.
                Event::ToolResult { results, notice },
                cancel,
            )
            .await?;
        }
        unreachable!("the last turn is always final")
    }

    /// The user turn for `work`: the dynamic context block, then each intake's text with its
    /// time prefix (debounced messages are joined with newlines).
    /// `compaction_near` adds the "compaction is near" notice (SPEC §15).
    fn user_turn(
        &self,
        work: &Work,
        images: Vec<UserBlock>,
        compaction_near: bool,
        recall: Option<&str>,
    ) -> Message {
        let cfg = &self.cfg;
        let now = Utc::now();
        let tz = cfg.agent.timezone;
        let triggered = self.skills.triggered(&work.text());
        let context = prompt::DynamicContext {
            now,
            tz,
            source: work.source(),
            from: work.from(),
            max_turns: cfg.behavior.max_turns_per_message,
            silent_tokens: &cfg.behavior.silent_tokens,
            skills: &triggered,
            compaction_near,
            recall,
        }
        .render();
        let mut text = prompt::time_prefix(now, tz);
        text.push(' ');
        let joined: Vec<String> = work
            .intakes
            .iter()
            .map(|i| {
                let mut t = i.text.clone();
                for a in &i.attachments {
                    t.push_str(&format!("\n[attachment: {a}]"));
                }
                t
            })
            .collect();
        text.push_str(&joined.join("\n"));
        let mut content = vec![UserBlock::Text { text: context }, UserBlock::Text { text }];
        content.extend(images);
        Message::User { content }
    }

    /// A crash between a tool call and its results leaves calls without results: answer them
    /// with error results before the next call (SPEC §6).
    async fn repair_dangling(
        &self,
        session: &Arc<SessionHandle>,
        state: &mut SessionState,
        cancel: &CancellationToken,
    ) -> Result<(), Option<Fail>> {
        let Some(Message::Assistant { tool_calls, .. }) = state.messages.last() else {
            return Ok(());
        };
        if tool_calls.is_empty() {
            return Ok(());
        }
        let results = tool_calls
            .iter()
            .map(|c| ToolResult {
                tool_call_id: c.id.clone(),
                content: format!(
                    "error: tool '{}' did not finish: the daemon stopped before its result was recorded",
                    c.name
                ),
                is_error: true,
            })
            .collect();
        tracing::warn!(session = %session.id, "repairing dangling tool calls");
        self.record_durably(
            session,
            state,
            Event::ToolResult {
                results,
                notice: None,
            },
            cancel,
        )
        .await
    }

    async fn check_budget(&self, spent_message: f64) -> Result<(), Option<Fail>> {
        let cfg = &self.cfg;
        match cost::budget_gate(
            &self.db,
            &cfg.budget,
            cfg.agent.timezone,
            Utc::now(),
            spent_message,
        )
        .await
        {
            Ok(()) => Ok(()),
            Err(BudgetError::Exceeded(msg)) => Err(Some(Fail {
                reply: msg.clone(),
                error: msg,
            })),
            Err(e) => {
                // The ledger is unreadable: fail closed, since a budget exists.
                Err(Some(Fail {
                    reply: cfg.behavior.error_message.clone(),
                    error: e.to_string(),
                }))
            }
        }
    }

    /// `behavior.message_retries`: after the provider layer gave up (retries and fallbacks),
    /// try the whole call again this many times if the error is transient.
    async fn chat_with_message_retries(
        &self,
        model: &str,
        req: &ChatRequest,
        on_event: &(dyn Fn(LlmEvent) + Send + Sync),
    ) -> Result<crate::llm::ChatOutcome, LlmError> {
        let mut attempt = 0;
        loop {
            match self.llm.chat(model, req, on_event).await {
                Err(e) if e.is_retryable() && attempt < self.cfg.behavior.message_retries => {
                    attempt += 1;
                    let delay = self.cfg.behavior.api_retry_base_delay * 2;
                    tracing::warn!(error = %e, attempt, "message-level retry");
                    tokio::time::sleep(delay).await;
                }
                r => return r,
            }
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
        }
    }

    /// Like [`Agent::record`], but a write that fails (a full disk, an I/O error) does not end
    /// the message: it is retried with backoff (1 s doubling to 30 s) until it succeeds, so the
    /// message pauses and carries on once the disk has room again — an acknowledged message is
    /// neither dropped nor answered with an error because the disk was full for a while. A failed
    /// append leaves nothing in the file (`fsutil::append_line_fsync`), so the retry writes the
    /// same line again. `cancel` ends the wait like any interruption: nothing is recorded and
    /// the message resumes after the next start.
    async fn record_durably(
        &self,
        session: &Arc<SessionHandle>,
        state: &mut SessionState,
        event: Event,
        cancel: &CancellationToken,
    ) -> Result<(), Option<Fail>> {
        let mut delay = STORAGE_RETRY_MIN;
        let mut failures = 0u32;
        loop {
            match append(session, event.clone()).await {
                Ok(line) => {
                    if failures > 0 {
                        tracing::info!(session = %session.id, failures, "the session trail is writable again; the message continues");
                    }
                    return self.fold(state, line);
                }
                Err(e) => {
                    failures += 1;
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
                    delay = (delay * 2).min(STORAGE_RETRY_MAX);
                }
            }
        }
    }

    /// Append an event to the trail (durably) and fold it into the state.
    async fn record(
        &self,
        session: &Arc<SessionHandle>,
        state: &mut SessionState,
        event: Event,
    ) -> Result<(), Option<Fail>> {
        match append(session, event).await {
            Ok(line) => self.fold(state, line),
            Err(e) => Err(Some(Fail {
                reply: self.cfg.behavior.error_message.clone(),
                error: format!("cannot write the session trail: {e}"),
            })),
        }
    }

    /// Fold a line just written into the state.
    fn fold(&self, state: &mut SessionState, line: TrailLine) -> Result<(), Option<Fail>> {
        if line.seq > state.last_seq {
            state.apply(&line);
            return Ok(());
        }
        Err(Some(Fail {
            reply: self.cfg.behavior.error_message.clone(),
            error: format!(
                "trail sequence went backwards (line {} after state {}); the state is rebuilt from the trail on the next message",
                line.seq, state.last_seq
            ),
        }))
    }

    async fn record_cost(
        &self,
        session_id: &str,
        model: &str,
        provider: &str,
        call_type: CallType,
        usage: Usage,
        cost_usd: f64,
    ) {
        let row = CostRow {
            timestamp: Utc::now().timestamp(),
            session_id: session_id.to_string(),
            model: model.to_string(),
            provider: provider.to_string(),
            call_type,
            usage,
            cost_usd,
        };
        if let Err(e) = self.db.insert_cost(row).await {
            tracing::error!(error = %e, "cannot record cost row");
        }
    }

    fn tool_context(
        &self,
        session: &Arc<SessionHandle>,
        state: &SessionState,
        model: &str,
        context_window: u32,
    ) -> ToolContext {
        ToolContext {
            session_id: session.id.clone(),
            session_key: session.key.clone(),
            workspace: self.cfg.agent.workspace.clone(),
            allowed_paths: self.cfg.tools.allowed_paths.clone(),
            protected: crate::tools::paths::Protected::new(
                self.cfg.paths.state_dir.clone(),
                self.cfg.config_dir.clone(),
            ),
            status: Arc::new(status::LoopStatus {
                db: self.db.clone(),
                tz: self.cfg.agent.timezone,
                started: self.started,
                session_id: session.id.clone(),
                session_key: session.key.clone(),
                model: model.to_string(),
                context_tokens: state.context_tokens,
                context_window: context_window as u64,
                messages: state.messages.len(),
                compactions: state.compaction_count,
            }),
        }
    }
}

/// Largest image passed to a model (Anthropic's per-image limit).
const MAX_IMAGE_BYTES: u64 = 5 * 1024 * 1024;

/// The media type of an image attachment, by extension.
fn image_media_type(path: &str) -> Option<&'static str> {
    let ext = std::path::Path::new(path)
        .extension()?
        .to_str()?
        .to_ascii_lowercase();
    Some(match ext.as_str() {
        "jpg" | "jpeg" => "image/jpeg",
        "png" => "image/png",
        "gif" => "image/gif",
        "webp" => "image/webp",
        _ => return None,
    })
}

/// Image blocks for the message's image attachments (read off the async workers). They are
/// sent for this message's calls only; the trail and later calls keep the text placeholder.
async fn load_images(work: &Work) -> Vec<UserBlock> {
    use base64::Engine;
    let paths: Vec<String> = work
        .intakes
        .iter()
        .flat_map(|i| i.attachments.clone())
        .collect();
    tokio::task::spawn_blocking(move || {
        paths
            .iter()
            .filter_map(|p| {
                let media_type = image_media_type(p)?;
                let len = std::fs::metadata(p).ok()?.len();
                if len > MAX_IMAGE_BYTES {
                    tracing::warn!(path = %p, bytes = len, "image too large to pass to the model");
                    return None;
                }
                let bytes = std::fs::read(p).ok()?;
                Some(UserBlock::Image {
                    media_type: media_type.to_string(),
                    data: base64::engine::general_purpose::STANDARD.encode(bytes),
                    placeholder: format!("[image: {p}]"),
                })
            })
            .collect()
    })
    .await
    .unwrap_or_default()
}

/// Default prompt tier per source (SPEC §5.6).
pub fn default_tier(source: &str) -> &'static str {
    match source {
        "system" => "operational",
        _ => "full",
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

/// `llm::toolcalls::normalise` on one answer's calls, with a log line per changed call.
/// Returns, per call, the error result that answers it instead of running it.
fn normalise_tool_calls(
    session_id: &str,
    calls: &mut [crate::llm::ToolCall],
    history: &[Message],
) -> Vec<Option<String>> {
    let rewrites = crate::llm::toolcalls::normalise(calls, history);
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

/// Append on the blocking pool (the append fsyncs).
pub async fn append(session: &Arc<SessionHandle>, event: Event) -> std::io::Result<TrailLine> {
    let s = session.clone();
    tokio::task::spawn_blocking(move || s.append(event))
        .await
        .map_err(std::io::Error::other)?
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

    #[test]
    fn system_source_defaults_to_operational() {
        assert_eq!(default_tier("system"), "operational");
        assert_eq!(default_tier("user"), "full");
    }
}
