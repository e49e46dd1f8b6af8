//! The LLM layer: the neutral request and response types (`types`; the conversation types
//! they carry are `crate::message`), the `Provider` trait, hand-written wire
//! clients (`anthropic/`, `openai/`), SSE parsing (`sse`), the HTTP edge shared by both clients
//! (`http`), backoff (`retry`) and the model `fallback` list (`router`). Only `llm/<provider>/`
//! knows a provider's JSON.

pub mod anthropic;
pub mod audio;
pub mod audio_length;
pub mod body_pool;
pub mod compat;
#[cfg(test)]
mod compat_conformance_tests;
#[cfg(test)]
mod conformance_tests;
mod each;
pub mod error;
mod http;
pub mod openai;
#[cfg(test)]
mod render_cache_tests;
pub mod router;
pub mod schema;
mod sse;
#[cfg(test)]
pub(crate) mod testutil;
pub mod textcalls;
pub mod tool_memo;
pub mod transcript;
pub mod types;

pub use error::LlmError;
pub use router::{ChatOutcome, EmbedOutcome, FellBack, Llm, LlmEvent};

pub use types::*;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::config::{BehaviorConfig, ModelSpec, ProviderKind};

/// One provider client bound to one model definition. `chat` makes exactly one streamed call
/// (no retries: those live in `router`).
pub trait Provider: Send + Sync {
    fn chat<'a>(&'a self, req: &'a ChatRequest) -> BoxFuture<'a, Result<ChatResponse, LlmError>>;

    /// One embeddings request for `texts` (no retries). Only OpenAI-compatible servers have
    /// an embeddings endpoint; other providers answer `Unsupported`.
    fn embed<'a>(&'a self, texts: &'a [String]) -> BoxFuture<'a, Result<Embeddings, LlmError>> {
        let _ = texts;
        Box::pin(async {
            Err(LlmError::Unsupported(
                "this model's provider has no embeddings endpoint; define the `embeddings` \
                 model with type = \"openai\" (any OpenAI-compatible /embeddings server)"
                    .to_string(),
            ))
        })
    }
}

/// The bounds of one model call (SPEC §16.9), from `[behavior]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallLimits {
    /// Longest wait for the response head and for each stream chunk
    /// (`call_timeout_seconds`).
    pub inactivity: Duration,
    /// Longest the whole call may take, keep-alives or not (`call_deadline_seconds`).
    pub deadline: Duration,
    /// Most bytes of the reply: text, thinking and tool-call inputs (`max_reply_bytes`).
    pub max_reply_bytes: usize,
}

impl CallLimits {
    pub fn from_behavior(b: &BehaviorConfig) -> CallLimits {
        CallLimits {
            inactivity: b.call_timeout,
            deadline: b.call_deadline,
            max_reply_bytes: b.max_reply_bytes,
        }
    }
}

/// The client for `spec`'s provider type. `http` is shared by all clients (one connection
/// pool); `limits` bound every call.
pub fn provider_for(
    spec: Arc<ModelSpec>,
    http: reqwest::Client,
    limits: CallLimits,
) -> Arc<dyn Provider> {
    match spec.kind {
        ProviderKind::Anthropic => Arc::new(anthropic::AnthropicClient::new(spec, http, limits)),
        ProviderKind::OpenAi => Arc::new(openai::OpenAiClient::new(spec, http, limits)),
        ProviderKind::ElevenLabs => Arc::new(SpeechOnly(spec.name.clone())),
    }
}

/// The chat side of a speech-only provider (ElevenLabs, SPEC §19): every call is refused
/// naming the fix (config validation keeps it from being `primary`; routing or a fallback
/// to it ends here).
struct SpeechOnly(String);

impl Provider for SpeechOnly {
    fn chat<'a>(&'a self, _req: &'a ChatRequest) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        let name = self.0.clone();
        Box::pin(async move {
            Err(LlmError::Unsupported(format!(
                "model {name:?} has type = \"elevenlabs\" and can only speak ([voice] tts_model); route messages to an anthropic or openai model"
            )))
        })
    }
}

/// Parse streamed tool-call arguments. Invalid JSON becomes `{"__invalid_json": "<raw>"}` so the
/// agent can answer the call with an error result the model can read.
pub(crate) fn parse_tool_arguments(raw: &str) -> serde_json::Value {
    serde_json::from_str(raw).unwrap_or_else(|_| serde_json::json!({ "__invalid_json": raw }))
}

/// Debug builds (and so the whole test suite) check every cached render against a full one.
#[cfg(debug_assertions)]
pub(crate) fn check_cached_render(cached: &[u8], full: &[u8]) {
    if cached != full {
        let at = cached
            .iter()
            .zip(full)
            .position(|(a, b)| a != b)
            .unwrap_or(cached.len().min(full.len()));
        let from = at.saturating_sub(80);
        panic!(
            "a cached render differs from the full render at byte {at}: cached …{}… full …{}…",
            String::from_utf8_lossy(&cached[from..(at + 80).min(cached.len())]),
            String::from_utf8_lossy(&full[from..(at + 80).min(full.len())]),
        );
    }
}
