//! The provider interface's neutral request and response types: what a call sends
//! (`ChatRequest`, tool specs, system blocks) and what comes back (`ChatResponse`,
//! `StopReason`, `Embeddings`). The conversation types they carry live in `crate::message`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;

pub use crate::message::call::{CallOptions, ClientThinking};
use crate::message::rendered::RenderCache;
use crate::message::{Message, ThinkingBlock, ToolCall, Usage};

/// A tool definition as offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments (an object schema).
    pub input_schema: Value,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    Auto,
    /// Tools stay defined (cache stays warm) but the model may not call them.
    None,
    /// The model must call a tool (a compatible endpoint's client asked, SPEC §17).
    Required,
    /// The model must call this tool (a compatible endpoint's client asked, SPEC §17).
    Tool(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SystemTier {
    Stable,
    SemiStable,
}

/// One system prompt block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SystemBlock {
    pub tier: SystemTier,
    pub text: String,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    ToolUse,
    MaxTokens,
    StopSequence,
    Refusal,
    /// Anything else the provider said, verbatim.
    Other(String),
}

impl StopReason {
    pub fn as_str(&self) -> &str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::ToolUse => "tool_use",
            StopReason::MaxTokens => "max_tokens",
            StopReason::StopSequence => "stop_sequence",
            StopReason::Refusal => "refusal",
            StopReason::Other(s) => s,
        }
    }
}

/// One LLM request in neutral form. Providers translate it at the edge.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// Session id (used as OpenAI `prompt_cache_key` when enabled, and for logs).
    pub session_id: String,
    /// System blocks in order: all stable blocks, then all semi_stable blocks.
    pub system: Vec<SystemBlock>,
    pub messages: Vec<Message>,
    /// The tools offered, shared with the registry's current set (`ToolRegistry::offered`)
    /// rather than copied for each call.
    pub tools: Arc<[ToolSpec]>,
    pub tool_choice: ToolChoice,
    /// Number of messages the previous call of this session sent (`None` for the first call or
    /// after compaction). Anthropic puts a cache breakpoint on the last block of message
    /// `previous_messages - 1` so this call reads everything the previous one wrote.
    pub previous_messages: Option<usize>,
    /// The session's renderings of `messages`, lent from its state like them, so a call
    /// serialises only the messages that are new (SPEC §16.6). `RenderCache::default()`
    /// (disabled) renders everything: for one-off requests.
    pub rendered: RenderCache,
    /// What the client of a compatible endpoint chose for this message's calls (SPEC §17);
    /// the renderers apply them within the model's configuration. Default: nothing.
    pub options: CallOptions,
    /// Where the text of the answer goes as it arrives, for a streamed answer of a compatible
    /// endpoint (SPEC §17). Unbounded: a call's text is bounded by `max_reply_bytes`.
    pub deltas: Option<DeltaSink>,
    /// `Some(OneHour)`: the stable and semi_stable system breakpoints get the 1-hour cache TTL
    /// (SPEC §20, `[caching] ttl`); the message breakpoints keep the model's `cache_ttl`, so
    /// 1-hour breakpoints always come before 5-minute ones, as Anthropic requires. `None`:
    /// the model's `cache_ttl` everywhere. Providers without 1-hour caching ignore it.
    pub stable_ttl: Option<crate::config::CacheTtl>,
}

/// What a streamed answer of a compatible endpoint (SPEC §17) hears while the agent works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamDelta {
    /// A piece of the text the model is writing in the current turn.
    Text(String),
    /// A batch of tool calls starts: the text so far was not the final answer, and the client
    /// gets a keep-alive.
    Tools,
}

/// The sending side of a streamed answer's deltas.
pub type DeltaSink = tokio::sync::mpsc::UnboundedSender<StreamDelta>;

/// The answer to one embeddings request: one vector per input text, in input order.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    pub vectors: Vec<Vec<f32>>,
    /// Input tokens billed (the server's `usage.prompt_tokens`; 0 when it does not say).
    pub prompt_tokens: u64,
}

/// A complete (non-streamed view of a streamed) response.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatResponse {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub thinking: Vec<ThinkingBlock>,
    pub stop_reason: StopReason,
    pub usage: Usage,
    /// API model id that answered.
    pub model: String,
}

impl ChatResponse {
    /// The assistant message to append to the history.
    pub fn to_message(&self) -> Message {
        Message::Assistant {
            text: self.text.clone(),
            tool_calls: self.tool_calls.clone(),
            thinking: self.thinking.clone(),
            usage: Some(self.usage),
        }
    }
}
