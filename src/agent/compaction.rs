//! Compaction and the context-window guard (SPEC §15).
//!
//! * Token estimates of a request (pure): about one token per four bytes of text plus a small
//!   per-message and per-block overhead; when the last call's real usage is known
//!   (`SessionState::context_tokens`), that number plus the estimate of what was appended since.
//! * The cut (pure): how many of the oldest messages to replace by a summary, so that about two
//!   thirds of the conversation go, a tool call is never separated from its results and the
//!   remaining list is valid for both providers once the summary user message is put in front.
//! * The compaction itself: the removed prefix, as a plain-text transcript, is summarised by the
//!   `compaction` model (no tools); `Event::Compaction { summary, removed }` goes to the trail
//!   through the same path as every other event, so the state folds it; a `compaction` cost row
//!   is recorded. The system prompt (stable and semi_stable tiers) is never part of it.
//!
//! When: after each finished message (`Agent::after_message`, called by the session worker once
//! the reply is delivered) if the estimate exceeds `behavior.compaction.threshold_tokens`; and
//! before each LLM call (`Agent::fit_context`, called by the loop) if the request would not fit
//! the model's `context_window` minus its `max_tokens`. A failed summary is logged and retried at
//! the next of those opportunities (never in a loop).

use std::sync::Arc;

use super::{Agent, Fail, Work, default_tier, prompt};
use crate::gateway::{Bill, CallError, ChatCall};
use crate::llm::{ChatRequest, LlmError, LlmEvent, SystemBlock, SystemTier, ToolChoice, ToolSpec};
use crate::message::{Message, UserBlock};
use crate::session::{Event, SessionHandle, SessionState};
use crate::store::CallType;

/// Bytes of text per estimated token (conservative for non-ASCII text: bytes, not chars).
const BYTES_PER_TOKEN: u64 = 4;
/// Role markers and message framing.
const MESSAGE_OVERHEAD: u64 = 4;
/// Framing of one content block (type, ids).
const BLOCK_OVERHEAD: u64 = 3;
/// An image, whatever its size (Anthropic bills about 1,600 tokens for a 1.15 MP image).
const IMAGE_TOKENS: u64 = 1_600;
/// Share of the conversation's estimated tokens a compaction removes.
pub const CUT_FRACTION: f64 = 2.0 / 3.0;
/// The agent is warned once this share of `threshold_tokens` is reached.
pub const WARN_FRACTION: f64 = 0.8;
/// Longest text kept from one message in the transcript sent for summarising.
const TRANSCRIPT_ITEM_CHARS: usize = 4_000;
/// Shortest per-message cap tried when the transcript has to shrink to fit the summary model.
const TRANSCRIPT_MIN_ITEM_CHARS: usize = 200;
/// What the summary message starts with in the conversation.
pub const SUMMARY_HEADER: &str =
    "[agentd] Summary of the earlier conversation (older messages were replaced by this summary):";
/// The notice attached to the dynamic context once compaction is near.
pub const NEAR_NOTICE: &str = "Context: this conversation is close to its compaction threshold. Soon the oldest part will be replaced by a summary; write anything you must keep verbatim (facts, decisions, open tasks) to memory now.";

/// Why a compaction did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CompactionError {
    #[error(
        "no place to cut: the conversation has too few complete messages to summarise ({messages} message(s))"
    )]
    NothingToCut { messages: usize },
    #[error("summary call failed on model '{model}': {error}")]
    Model { model: String, error: LlmError },
    #[error("summary call not made: {0}")]
    Budget(String),
    #[error("model '{model}' returned an empty summary")]
    EmptySummary { model: String },
    #[error("cannot record the compaction in the session trail: {0}")]
    Trail(String),
}

/// Estimated tokens of a text.
pub fn text_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(BYTES_PER_TOKEN)
}

/// Estimated tokens of one message as the providers render it.
pub fn message_tokens(m: &Message) -> u64 {
    let body: u64 = match m {
        Message::User { content } => content
            .iter()
            .map(|b| {
                BLOCK_OVERHEAD
                    + match b {
                        UserBlock::Text { text } => text_tokens(text),
                        UserBlock::Image { .. } => IMAGE_TOKENS,
                    }
            })
            .sum(),
        Message::Assistant {
            text,
            tool_calls,
            thinking,
            ..
        } => {
            let thinking: u64 = thinking
                .iter()
                .map(|t| {
                    BLOCK_OVERHEAD
                        + t.thinking.as_deref().map_or(0, text_tokens)
                        + t.signature.as_deref().map_or(0, text_tokens)
                        + t.redacted_data.as_deref().map_or(0, text_tokens)
                })
                .sum();
            let calls: u64 = tool_calls
                .iter()
                .map(|c| {
                    BLOCK_OVERHEAD
                        + text_tokens(&c.id)
                        + text_tokens(&c.name)
                        + text_tokens(&c.arguments.to_string())
                })
                .sum();
            BLOCK_OVERHEAD + text_tokens(text) + thinking + calls
        }
        Message::ToolResults { results, notice } => {
            let results: u64 = results
                .iter()
                .map(|r| {
                    BLOCK_OVERHEAD
                        + text_tokens(&r.tool_call_id)
                        + text_tokens(&r.content)
                        + r.images.len() as u64 * (BLOCK_OVERHEAD + IMAGE_TOKENS)
                })
                .sum();
            results
                + notice
                    .as_deref()
                    .map_or(0, |n| BLOCK_OVERHEAD + text_tokens(n))
        }
    };
    MESSAGE_OVERHEAD + body
}

/// Estimated tokens of a list of messages.
pub fn messages_tokens(messages: &[Message]) -> u64 {
    messages.iter().map(message_tokens).sum()
}

/// Estimated tokens of the part of a request that is not the conversation: the system blocks
/// and the tool definitions.
pub fn fixed_tokens(system: &[SystemBlock], tools: &[ToolSpec]) -> u64 {
    system_tokens(system) + tools_tokens(tools)
}

/// Estimated tokens of the system blocks.
pub fn system_tokens(system: &[SystemBlock]) -> u64 {
    system
        .iter()
        .map(|b| BLOCK_OVERHEAD + text_tokens(&b.text))
        .sum()
}

/// Estimated tokens of the tool definitions ([`ToolTokens`] keeps it per set of tools).
pub fn tools_tokens(tools: &[ToolSpec]) -> u64 {
    tools
        .iter()
        .map(|t| {
            BLOCK_OVERHEAD
                + text_tokens(&t.name)
                + text_tokens(&t.description)
                + text_tokens(&t.input_schema.to_string())
        })
        .sum()
}

/// [`tools_tokens`] of the registry's current list, made again only when the list changes
/// (`ToolRegistry::specs` hands out the same `Arc` until then): serialising every schema for
/// each estimate was 9% of the daemon's instructions (measured with `perf`, in git history).
#[derive(Default)]
pub struct ToolTokens(crate::llm::tool_memo::ToolListMemo<u64>);

impl ToolTokens {
    /// The estimate for `specs`.
    pub fn of(&self, specs: &Arc<[ToolSpec]>) -> u64 {
        self.0.get(specs, tools_tokens)
    }
}

/// Estimated tokens a compatible request adds to a call: its history, new text and images,
/// and its system text (`POST /v1/messages/count_tokens`).
pub fn request_estimate(r: &crate::llm::compat::CompatRequest) -> u64 {
    let images = r
        .attachments
        .iter()
        .filter(|a| a.media_type.starts_with("image/"))
        .count() as u64;
    messages_tokens(&r.history)
        + text_tokens(&r.text)
        + r.system.as_deref().map_or(0, text_tokens)
        + images * IMAGE_TOKENS
        + BLOCK_OVERHEAD
}

/// Estimated tokens of a whole request.
pub fn request_tokens(system: &[SystemBlock], messages: &[Message], tools: &[ToolSpec]) -> u64 {
    fixed_tokens(system, tools) + messages_tokens(messages)
}

/// The context size of the session's next request. When the last call's real usage is known
/// (`context_tokens` of the call that sent `previous_messages` messages and produced the next
/// one), that number plus the estimate of the messages appended after it; otherwise (first
/// call, after a compaction, after a rebuild without usage) `fixed` (system + tools) plus the
/// estimate of every message.
pub fn context_estimate(state: &SessionState, fixed: u64) -> u64 {
    measured_estimate(state).unwrap_or_else(|| fixed + messages_tokens(&state.messages))
}

/// The estimate based on the last call's real usage, when it applies.
fn measured_estimate(state: &SessionState) -> Option<u64> {
    match state.previous_messages {
        Some(n) if state.context_tokens > 0 && n < state.messages.len() => {
            Some(state.context_tokens + messages_tokens(&state.messages[n + 1..]))
        }
        _ => None,
    }
}

/// Whether the conversation may be cut before `messages[i]`: the retained part starts with a
/// user turn or an assistant message (never with tool results, which would be orphaned), and the
/// removed part does not end with an assistant message whose tool calls have their results in
/// the retained part.
fn is_cut_point(messages: &[Message], i: usize) -> bool {
    if i == 0 || i >= messages.len() {
        return false;
    }
    let starts_ok = !matches!(messages[i], Message::ToolResults { .. });
    let prev_closed = messages[i - 1].tool_calls().is_empty();
    starts_ok && prev_closed
}

/// How many of the oldest messages to replace by a summary: the cut point whose removed prefix
/// is closest to `fraction` of the estimated tokens. A cut before a user turn (a whole exchange
/// goes) is preferred as long as it removes at least half of that target; otherwise the closest
/// cut before an assistant message is taken (one long tool loop). `None` when no message can be
/// removed.
///
/// After `[summary user message] + messages[cut..]` every tool call is still followed by its
/// results and no result is orphaned (see the property test), which both renderers need:
/// Anthropic merges consecutive user messages into one turn and requires each `tool_result` to
/// answer a `tool_use` of the turn right before it; OpenAI requires each `tool` message to
/// follow the assistant message with its call.
pub fn plan_cut(messages: &[Message], fraction: f64) -> Option<usize> {
    let total = messages_tokens(messages) as f64;
    let target = total * fraction.clamp(0.0, 1.0);
    let mut prefix = 0u64;
    // (index, removed tokens, distance to the target)
    let mut best_user: Option<(usize, f64, f64)> = None;
    let mut best_any: Option<(usize, f64, f64)> = None;
    for (i, m) in messages.iter().enumerate() {
        if is_cut_point(messages, i) {
            let removed = prefix as f64;
            let candidate = (i, removed, (removed - target).abs());
            if best_any.is_none_or(|b| candidate.2 < b.2) {
                best_any = Some(candidate);
            }
            if m.is_user() && best_user.is_none_or(|b| candidate.2 < b.2) {
                best_user = Some(candidate);
            }
        }
        prefix += message_tokens(m);
    }
    match best_user {
        Some((i, removed, _)) if removed >= target / 2.0 => Some(i),
        _ => best_any.map(|(i, _, _)| i),
    }
}

/// The transcript, shrunk (per-item cap halved step by step) until its estimate fits
/// `max_tokens`; at the smallest cap it is returned as is.
pub fn transcript_within(messages: &[Message], max_tokens: u64) -> String {
    let mut cap = TRANSCRIPT_ITEM_CHARS;
    loop {
        let t = crate::llm::transcript::transcript(messages, cap);
        if text_tokens(&t) <= max_tokens || cap <= TRANSCRIPT_MIN_ITEM_CHARS {
            return t;
        }
        cap /= 2;
    }
}

/// The summary request: the configured instructions as the only system block, the transcript
/// as the only user message, no tools.
pub fn summary_request(session_id: &str, instructions: &str, transcript: &str) -> ChatRequest {
    ChatRequest {
        options: Default::default(),
        deltas: None,
        stable_ttl: None,
        session_id: session_id.to_string(),
        system: vec![SystemBlock {
            tier: SystemTier::Stable,
            text: instructions.to_string(),
        }],
        messages: vec![Message::user_text(format!(
            "<conversation>\n{}</conversation>\n\nSummarise the conversation above as instructed. Reply with the summary only.",
            transcript
        ))],
        tools: Arc::from([]),
        tool_choice: ToolChoice::None,
        previous_messages: None,
        rendered: Default::default(),
    }
}

/// The text of the summary message that replaces the removed prefix.
pub fn summary_message(summary: &str) -> String {
    format!("{SUMMARY_HEADER}\n\n{}", summary.trim())
}

impl Agent {
    /// Memory consolidation before a compaction (SPEC §13, §15: "with consolidation first
    /// when enabled"): what is about to be summarised is first extracted into structured
    /// memory. A failure is logged; the compaction goes on (the watermark did not move, so the
    /// next consolidation picks the messages up from the trail).
    pub async fn before_compaction(&self, session: &Arc<SessionHandle>, state: &SessionState) {
        let Some(consolidator) = self.consolidator.as_ref() else {
            return;
        };
        if !self.cfg.memory.consolidation_enabled {
            return;
        }
        match consolidator.session(session.dir(), &session.id).await {
            Ok(outcome) => {
                tracing::info!(session = %session.id, messages = state.messages.len(), ?outcome, "consolidated before compaction")
            }
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e, "consolidation before compaction failed; compacting anyway")
            }
        }
    }

    /// Name of the model that writes summaries: `behavior.compaction.model` when loaded, else
    /// `primary`.
    pub fn compaction_model(&self) -> String {
        let name = &self.cfg.behavior.compaction.model;
        if self.gateway.models().get(name).is_some() {
            name.clone()
        } else {
            "primary".to_string()
        }
    }

    /// Replace about two thirds of the conversation by a summary. Returns how many messages
    /// were removed. On error nothing changed.
    pub async fn compact(
        &self,
        session: &Arc<SessionHandle>,
        state: &mut SessionState,
    ) -> Result<usize, CompactionError> {
        let cut = plan_cut(&state.messages, CUT_FRACTION).ok_or(CompactionError::NothingToCut {
            messages: state.messages.len(),
        })?;
        self.before_compaction(session, state).await;

        let model = self.compaction_model();
        let room = self.gateway.models().get(&model).map_or(u64::MAX, |s| {
            u64::from(s.context_window.saturating_sub(s.max_tokens)).saturating_sub(
                text_tokens(&self.cfg.behavior.compaction.prompt) + 2 * MESSAGE_OVERHEAD + 50,
            )
        });
        let text = transcript_within(&state.messages[..cut], room);
        let req = summary_request(&session.id, &self.cfg.behavior.compaction.prompt, &text);

        let on_event = |e: LlmEvent| {
            if let LlmEvent::RetryWait { attempt, error, .. } = e {
                tracing::debug!(attempt, %error, "summary call retrying");
            }
        };
        // Under the message's call gate while it runs (held until the cost is recorded).
        let call = ChatCall::new(&model, CallType::Compaction, Bill::message(&session.id));
        let outcome = match self.gateway.chat(call, &req, &on_event).await {
            Ok(paid) => paid.out,
            Err(CallError::Failed(error)) => {
                return Err(CompactionError::Model {
                    model: model.clone(),
                    error,
                });
            }
            Err(e) => return Err(CompactionError::Budget(e.to_string())),
        };
        let summary = outcome.response.text.trim();
        if summary.is_empty() {
            return Err(CompactionError::EmptySummary { model });
        }
        let event = Event::Compaction {
            summary: summary_message(summary),
            removed: cut,
        };
        self.record(session, state, event)
            .await
            .map_err(|f| CompactionError::Trail(f.map_or_else(String::new, |f| f.error)))?;
        Ok(cut)
    }

    /// [`context_estimate`] for the session's next request in `tier`; the workspace files are
    /// read only when no measured usage applies.
    async fn estimate(&self, state: &SessionState, tier: &str) -> u64 {
        match measured_estimate(state) {
            Some(n) => n,
            None => {
                self.fixed_estimate(tier, &state.skills_off).await
                    + messages_tokens(&state.messages)
            }
        }
    }

    /// System blocks and tool definitions of `tier` (the fixed part of a request), estimated.
    async fn fixed_estimate(
        &self,
        tier: &str,
        skills_off: &std::collections::BTreeSet<String>,
    ) -> u64 {
        let workspace = self.cfg.agent.workspace.clone();
        let files = self.cfg.agent.context.files_for(tier);
        let skills_text = self.skills.semi_stable_text(skills_off);
        let system = tokio::task::spawn_blocking(move || {
            prompt::system_blocks(&workspace, &files, "", &skills_text)
        })
        .await
        .unwrap_or_default();
        system_tokens(&system) + self.tool_tokens.of(&self.tools.specs())
    }

    /// Whether the next user turn should carry the "compaction is near" notice (once per
    /// compaction cycle: sets `flags.compaction_warned`).
    pub(super) async fn take_compaction_warning(
        &self,
        state: &mut SessionState,
        tier: &str,
    ) -> bool {
        if state.flags.compaction_warned {
            return false;
        }
        let threshold = self.cfg.behavior.compaction.threshold_tokens;
        let estimate = self.estimate(state, tier).await;
        if (estimate as f64) < threshold as f64 * WARN_FRACTION {
            return false;
        }
        state.flags.compaction_warned = true;
        true
    }

    /// After a finished message (reply delivered): compact when the context estimate exceeds
    /// `behavior.compaction.threshold_tokens`. A failure is logged and leaves the session as it
    /// was; the next message tries again.
    pub async fn after_message(
        &self,
        session: &Arc<SessionHandle>,
        state: &mut SessionState,
        work: &Work,
    ) {
        let threshold = self.cfg.behavior.compaction.threshold_tokens;
        let tier = work_tier(work);
        let estimate = self.estimate(state, &tier).await;
        if estimate <= threshold {
            return;
        }
        tracing::info!(session = %session.id, estimate, threshold, "context above the compaction threshold; compacting");
        match self.compact(session, state).await {
            Ok(removed) => {
                tracing::info!(session = %session.id, removed, left = state.messages.len(), "conversation compacted");
            }
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e, "compaction failed; the session continues and compaction is retried after the next message");
            }
        }
    }

    /// Before an LLM call: if the request (`system`, `tools` and the state's messages) would
    /// not fit `model`'s context window minus its `max_tokens`, compact first; if it still
    /// does not fit, fail the message instead of sending it.
    pub(super) async fn fit_context(
        &self,
        session: &Arc<SessionHandle>,
        state: &mut SessionState,
        model: &str,
        system: &[SystemBlock],
        tool_tokens: u64,
    ) -> Result<(), Option<Fail>> {
        let Some(spec) = self.cfg.models.get(model) else {
            return Ok(());
        };
        let limit = u64::from(spec.context_window.saturating_sub(spec.max_tokens));
        if limit == 0 {
            return Ok(());
        }
        let fixed = system_tokens(system) + tool_tokens;
        let estimate = context_estimate(state, fixed);
        if estimate <= limit {
            return Ok(());
        }
        tracing::warn!(session = %session.id, model, estimate, limit, "request would not fit the context window; compacting first");
        if let Err(e) = self.compact(session, state).await {
            tracing::warn!(session = %session.id, error = %e, "compaction before the call failed");
        }
        let estimate = context_estimate(state, fixed);
        if estimate <= limit {
            return Ok(());
        }
        let msg = format!(
            "This conversation (about {estimate} tokens) does not fit the context window of model '{model}' ({} tokens, {} of them reserved for the answer), even after compaction. Reset the session (Telegram /reset or agent-send --reset) or send a shorter message.",
            spec.context_window, spec.max_tokens
        );
        Err(Some(Fail::other(msg.clone(), msg)))
    }
}

/// The prompt tier of a unit of work (its first intake's, else the source's default).
pub(super) fn work_tier(work: &Work) -> String {
    work.intakes
        .first()
        .and_then(|i| i.tier.clone())
        .unwrap_or_else(|| default_tier(work.source()).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{ThinkingBlock, ToolCall, ToolResult};
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn user(text: &str) -> Message {
        Message::user_text(text)
    }

    fn reply(text: &str) -> Message {
        Message::Assistant {
            text: text.into(),
            tool_calls: vec![],
            thinking: vec![],
            usage: None,
        }
    }

    fn calls(ids: &[&str]) -> Message {
        Message::Assistant {
            text: String::new(),
            tool_calls: ids
                .iter()
                .map(|id| ToolCall {
                    id: id.to_string(),
                    name: "read".into(),
                    arguments: json!({"path": "x"}),
                })
                .collect(),
            thinking: vec![ThinkingBlock {
                thinking: Some("hmm".into()),
                signature: Some("sig".into()),
                redacted_data: None,
            }],
            usage: None,
        }
    }

    fn results(ids: &[&str]) -> Message {
        Message::ToolResults {
            results: ids
                .iter()
                .map(|id| ToolResult {
                    tool_call_id: id.to_string(),
                    content: format!("result {id}"),
                    is_error: false,
                    images: Vec::new(),
                })
                .collect(),
            notice: None,
        }
    }

    #[test]
    fn tool_tokens_are_counted_again_only_for_a_new_list() {
        let spec = |name: &str, description: &str| ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema: serde_json::json!({"type": "object"}),
        };
        let memo = ToolTokens::default();
        let a: Arc<[ToolSpec]> = vec![spec("read", "Read a file")].into();
        assert_eq!(memo.of(&a), tools_tokens(&a));
        assert_eq!(memo.of(&a.clone()), tools_tokens(&a));
        // A new list (the set changed) is counted anew, even at the same length.
        let b: Arc<[ToolSpec]> =
            vec![spec("read", &"a much longer description ".repeat(20))].into();
        assert!(tools_tokens(&b) > tools_tokens(&a));
        assert_eq!(memo.of(&b), tools_tokens(&b));
        // A list that is gone is never mistaken for a new one at its address.
        drop(b);
        let c: Arc<[ToolSpec]> = vec![spec("x", "")].into();
        assert_eq!(memo.of(&c), tools_tokens(&c));
    }

    #[test]
    fn text_tokens_round_up_bytes_over_four() {
        assert_eq!(text_tokens(""), 0);
        assert_eq!(text_tokens("abcd"), 1);
        assert_eq!(text_tokens("abcde"), 2);
        // Non-ASCII counts bytes (conservative).
        assert_eq!(text_tokens("ää"), 1);
    }

    #[test]
    fn images_count_a_fixed_amount_not_their_base64_size() {
        let m = Message::User {
            content: vec![UserBlock::Image {
                media_type: "image/png".into(),
                data: "A".repeat(4_000_000),
                placeholder: "[image: a.png]".into(),
            }],
        };
        assert_eq!(
            message_tokens(&m),
            MESSAGE_OVERHEAD + BLOCK_OVERHEAD + IMAGE_TOKENS
        );
        // A tool result's images count the same.
        let image = crate::message::ToolImage {
            media_type: "image/png".into(),
            data: "A".repeat(4_000_000),
            placeholder: String::new(),
        };
        let r = Message::ToolResults {
            results: vec![ToolResult {
                tool_call_id: String::new(),
                content: String::new(),
                is_error: false,
                images: vec![image.clone(), image],
            }],
            notice: None,
        };
        assert_eq!(
            message_tokens(&r),
            MESSAGE_OVERHEAD + 3 * BLOCK_OVERHEAD + 2 * IMAGE_TOKENS
        );
    }

    #[test]
    fn message_tokens_grow_with_every_part() {
        let base = message_tokens(&reply("hello world"));
        assert!(message_tokens(&reply(&"x".repeat(400))) >= 100);
        assert!(message_tokens(&calls(&["a"])) > message_tokens(&reply("")));
        assert!(message_tokens(&results(&["a", "b"])) > message_tokens(&results(&["a"])));
        assert!(base > MESSAGE_OVERHEAD);
        let spec = ToolSpec {
            name: "read".into(),
            description: "d".repeat(40),
            input_schema: json!({"type": "object"}),
        };
        let system = [SystemBlock {
            tier: SystemTier::Stable,
            text: "s".repeat(80),
        }];
        assert_eq!(
            request_tokens(
                &system,
                &[reply("hello world")],
                std::slice::from_ref(&spec)
            ),
            fixed_tokens(&system, &[spec]) + base
        );
    }

    #[test]
    fn context_estimate_uses_measured_usage_plus_what_came_after() {
        let mut state = SessionState::new("s", "k", "primary", 0);
        state.messages = vec![user("q1"), reply("a1"), user(&"n".repeat(400))];
        // No measured usage yet: everything is estimated.
        assert_eq!(
            context_estimate(&state, 1000),
            1000 + messages_tokens(&state.messages)
        );
        // The last call sent 1 message and produced message 1; message 2 came after.
        state.previous_messages = Some(1);
        state.context_tokens = 5000;
        assert_eq!(
            context_estimate(&state, 1000),
            5000 + message_tokens(&state.messages[2])
        );
        // After a compaction the position is unknown again.
        state.previous_messages = None;
        assert_eq!(
            context_estimate(&state, 7),
            7 + messages_tokens(&state.messages)
        );
    }

    #[test]
    fn plan_cut_takes_about_two_thirds_at_a_user_turn() {
        let mut messages = Vec::new();
        for i in 0..9 {
            messages.push(user(&format!("question {i} {}", "q".repeat(200))));
            messages.push(reply(&format!("answer {i} {}", "a".repeat(200))));
        }
        let cut = plan_cut(&messages, CUT_FRACTION).unwrap();
        assert_eq!(cut, 12);
        assert!(messages[cut].is_user());
    }

    #[test]
    fn plan_cut_never_splits_a_call_from_its_results() {
        let messages = vec![
            user("start"),
            calls(&["a", "b"]),
            results(&["a", "b"]),
            calls(&["c"]),
            results(&["c"]),
            reply("done"),
            user("next"),
        ];
        for f in [0.1, 0.3, 0.5, 0.7, 0.9] {
            let cut = plan_cut(&messages, f).unwrap();
            assert!(is_cut_point(&messages, cut), "fraction {f}: cut {cut}");
            assert!(!matches!(messages[cut], Message::ToolResults { .. }));
        }
    }

    #[test]
    fn plan_cut_inside_one_long_tool_loop() {
        // One message with many tool rounds: the only user turns are the summary and the
        // question, so the cut goes before an assistant message.
        let mut messages = vec![user("old summary"), user("question")];
        for i in 0..10 {
            let id = format!("t{i}");
            messages.push(calls(&[&id]));
            messages.push(Message::ToolResults {
                results: vec![ToolResult {
                    tool_call_id: id,
                    content: "r".repeat(400),
                    is_error: false,
                    images: Vec::new(),
                }],
                notice: None,
            });
        }
        messages.push(reply("final"));
        let cut = plan_cut(&messages, CUT_FRACTION).unwrap();
        assert!(cut > 2, "cut {cut}");
        assert!(matches!(messages[cut], Message::Assistant { .. }));
    }

    #[test]
    fn plan_cut_needs_something_to_keep() {
        assert_eq!(plan_cut(&[], CUT_FRACTION), None);
        assert_eq!(plan_cut(&[user("only")], CUT_FRACTION), None);
        // Results are never the first retained message.
        assert_eq!(plan_cut(&[user("q"), results(&["a"])], CUT_FRACTION), None);
        // A tool round may be kept on its own behind the summary.
        assert_eq!(
            plan_cut(&[user("q"), calls(&["a"]), results(&["a"])], CUT_FRACTION),
            Some(1)
        );
    }

    #[test]
    fn transcript_names_tools_and_cuts_long_items() {
        let messages = vec![
            user("please read x"),
            calls(&["a"]),
            Message::ToolResults {
                results: vec![ToolResult {
                    tool_call_id: "a".into(),
                    content: "z".repeat(50),
                    is_error: true,
                    images: Vec::new(),
                }],
                notice: Some("wrap up".into()),
            },
            reply("it failed"),
        ];
        let t = crate::llm::transcript::transcript(&messages, 10);
        assert!(t.contains("[user]\nplease rea […cut]"), "{t}");
        assert!(t.contains("[assistant called tool read]"), "{t}");
        assert!(t.contains("[tool read failed]\nzzzzzzzzzz […cut]"), "{t}");
        assert!(t.contains("[agentd]\nwrap up"), "{t}");
        assert!(t.contains("[assistant]\nit failed"), "{t}");
        // Shrinks to fit.
        let long = vec![user(&"w".repeat(40_000))];
        assert!(text_tokens(&transcript_within(&long, 600)) <= 600);
    }

    #[test]
    fn summary_request_has_no_tools_and_renders_without_tool_fields() {
        let req = summary_request("s1", "Summarise.", "[user]\nhi\n\n");
        assert!(req.tools.is_empty());
        assert_eq!(req.tool_choice, ToolChoice::None);
        assert_eq!(req.system[0].text, "Summarise.");
        let spec = crate::llm::testutil::model_spec(
            "compaction",
            crate::config::ProviderKind::Anthropic,
            "http://x",
        );
        let body = crate::llm::anthropic::render_request(&spec, &req);
        assert!(body.get("tools").is_none() && body.get("tool_choice").is_none());
        assert_eq!(body["messages"].as_array().unwrap().len(), 1);
        assert!(summary_message("  the gist \n").ends_with("\n\nthe gist"));
    }

    /// A conversation of `turns`: (tool rounds of (calls per round), text size).
    fn conversation(summary: bool, turns: &[(Vec<usize>, usize)]) -> Vec<Message> {
        let mut out = Vec::new();
        if summary {
            out.push(user(&summary_message("earlier")));
        }
        let mut next = 0;
        for (t, (rounds, size)) in turns.iter().enumerate() {
            out.push(user(&format!("msg {t} {}", "u".repeat(*size))));
            for n in rounds {
                let ids: Vec<String> = (0..*n)
                    .map(|_| {
                        next += 1;
                        format!("call{next}")
                    })
                    .collect();
                let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
                out.push(calls(&refs));
                out.push(results(&refs));
            }
            out.push(reply(&"r".repeat(*size)));
        }
        out
    }

    /// Every tool call is answered right after it, and every result answers the call before it.
    fn check_pairs(messages: &[Message]) -> Result<(), String> {
        for (j, m) in messages.iter().enumerate() {
            let calls: Vec<&str> = m.tool_calls().iter().map(|c| c.id.as_str()).collect();
            if !calls.is_empty() {
                match messages.get(j + 1) {
                    Some(Message::ToolResults { results, .. }) => {
                        let got: Vec<&str> =
                            results.iter().map(|r| r.tool_call_id.as_str()).collect();
                        if got != calls {
                            return Err(format!("results at {} do not match calls at {j}", j + 1));
                        }
                    }
                    _ => return Err(format!("calls at {j} have no results after them")),
                }
            }
            if let Message::ToolResults { .. } = m
                && (j == 0 || messages[j - 1].tool_calls().is_empty())
            {
                return Err(format!("orphaned results at {j}"));
            }
        }
        Ok(())
    }

    /// The Anthropic wire form: roles alternate starting with user, each `tool_result` answers a
    /// `tool_use` of the assistant message right before it and comes before any text block.
    fn check_anthropic_wire(body: &Value) -> Result<(), String> {
        let wire = body["messages"].as_array().ok_or("no messages")?;
        for (k, m) in wire.iter().enumerate() {
            let want = if k % 2 == 0 { "user" } else { "assistant" };
            if m["role"] != want {
                return Err(format!("wire message {k} has role {}", m["role"]));
            }
            let blocks = m["content"].as_array().ok_or("no content")?;
            let mut seen_text = false;
            for b in blocks {
                match b["type"].as_str() {
                    Some("tool_result") => {
                        if seen_text {
                            return Err(format!("tool_result after text in wire message {k}"));
                        }
                        let id = &b["tool_use_id"];
                        let answered = k > 0
                            && wire[k - 1]["content"]
                                .as_array()
                                .is_some_and(|p| p.iter().any(|x| x["id"] == *id));
                        if !answered {
                            return Err(format!("orphaned tool_result {id} in wire message {k}"));
                        }
                    }
                    Some("text") => seen_text = true,
                    _ => {}
                }
            }
        }
        Ok(())
    }

    fn turn_strategy() -> impl Strategy<Value = (Vec<usize>, usize)> {
        (prop::collection::vec(1usize..4, 0..4), 0usize..600)
    }

    proptest! {
        #[test]
        fn cut_plus_summary_keeps_every_call_with_its_results(
            summary in any::<bool>(),
            turns in prop::collection::vec(turn_strategy(), 1..12),
            fraction in 0.05f64..0.95,
        ) {
            let messages = conversation(summary, &turns);
            prop_assert!(check_pairs(&messages).is_ok());
            let cut = plan_cut(&messages, fraction);
            if turns.len() >= 2 || summary {
                prop_assert!(cut.is_some(), "a user turn after the first is always a cut point");
            }
            let Some(cut) = cut else { return Ok(()) };
            prop_assert!(cut >= 1 && cut < messages.len());
            let mut after = vec![user(&summary_message("the gist"))];
            after.extend_from_slice(&messages[cut..]);
            // Nothing but the removed prefix is lost.
            prop_assert_eq!(&after[1..], &messages[cut..]);
            if let Err(e) = check_pairs(&after) {
                return Err(TestCaseError::fail(format!("cut {cut}: {e}")));
            }
            let req = ChatRequest {
                options: Default::default(),
                deltas: None,
            stable_ttl: None,
                session_id: "s".into(),
                system: vec![],
                messages: after,
                tools: Default::default(),
                tool_choice: ToolChoice::Auto,
                previous_messages: None,
                rendered: Default::default(),
            };
            let spec = crate::llm::testutil::model_spec(
                "primary",
                crate::config::ProviderKind::Anthropic,
                "http://x",
            );
            let body = crate::llm::anthropic::render_request(&spec, &req);
            if let Err(e) = check_anthropic_wire(&body) {
                return Err(TestCaseError::fail(format!("cut {cut}: {e}")));
            }
        }
    }
}
