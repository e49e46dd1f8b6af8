//! Fixtures shared by the LLM layer's unit tests.

use std::time::Duration;

use serde_json::json;

use crate::config::{
    BehaviorConfig, CacheTtl, CompactionConfig, ModelSpec, Pricing, ProviderKind, Thinking,
};
use crate::llm::{
    ChatRequest, Message, SystemBlock, SystemTier, ThinkingBlock, ToolCall, ToolChoice, ToolResult,
    ToolSpec, UserBlock,
};

/// A model definition with neutral defaults (no key, no cache, thinking off).
pub(crate) fn model_spec(name: &str, kind: ProviderKind, base_url: &str) -> ModelSpec {
    ModelSpec {
        name: name.into(),
        provider: kind.as_str().into(),
        kind,
        model: format!("{name}-model"),
        base_url: base_url.into(),
        api_key_env: None,
        api_key: None,
        max_tokens: 1000,
        context_window: 200_000,
        pricing: Pricing::default(),
        cache: false,
        cache_ttl: CacheTtl::FiveMinutes,
        thinking: Thinking::Off,
        thinking_budget: 0,
        thinking_effort: None,
        supports_vision: true,
        fallback: vec![],
        prompt_cache_key: false,
    }
}

/// Behaviour with fast retries (`retries` retries, 1 ms base) and the given inactivity timeout.
pub(crate) fn behavior(retries: u32, call_timeout: Duration) -> BehaviorConfig {
    BehaviorConfig {
        debounce: Duration::ZERO,
        max_concurrent_sessions: 1,
        silent_tokens: vec![],
        typing_indicators: false,
        error_message: "error".into(),
        max_turns_per_message: 10,
        call_timeout,
        api_retries: retries,
        api_retry_base_delay: Duration::from_millis(1),
        message_retries: 0,
        output_truncation: 10_000,
        compaction: CompactionConfig {
            threshold_tokens: 100_000,
            model: "primary".into(),
            prompt: String::new(),
        },
    }
}

/// A small conversation with every block kind: two stable and one semi-stable system block,
/// a user turn with an image, an assistant turn with thinking (signed and redacted), text and
/// two tool calls, their results with a notice, and a follow-up user turn. The previous call
/// sent the first three messages.
pub(crate) fn sample_request() -> ChatRequest {
    ChatRequest {
        session_id: "sess-1".into(),
        system: vec![
            SystemBlock {
                tier: SystemTier::Stable,
                text: "S1".into(),
            },
            SystemBlock {
                tier: SystemTier::Stable,
                text: "S2".into(),
            },
            SystemBlock {
                tier: SystemTier::SemiStable,
                text: "M1".into(),
            },
        ],
        messages: vec![
            Message::User {
                content: vec![
                    UserBlock::Text {
                        text: "look".into(),
                    },
                    UserBlock::Image {
                        media_type: "image/png".into(),
                        data: "iVBO".into(),
                        placeholder: "[image: inbox/1.png]".into(),
                    },
                ],
            },
            Message::Assistant {
                text: "checking".into(),
                tool_calls: vec![
                    ToolCall {
                        id: "tu1".into(),
                        name: "read".into(),
                        arguments: json!({ "path": "a" }),
                    },
                    ToolCall {
                        id: "tu2".into(),
                        name: "exec".into(),
                        arguments: json!({}),
                    },
                ],
                thinking: vec![
                    ThinkingBlock {
                        thinking: Some("hmm".into()),
                        signature: Some("sig1".into()),
                        redacted_data: None,
                    },
                    ThinkingBlock {
                        thinking: None,
                        signature: None,
                        redacted_data: Some("opaque".into()),
                    },
                ],
                usage: None,
            },
            Message::ToolResults {
                results: vec![
                    ToolResult {
                        tool_call_id: "tu1".into(),
                        content: "A".into(),
                        is_error: false,
                    },
                    ToolResult {
                        tool_call_id: "tu2".into(),
                        content: "boom".into(),
                        is_error: true,
                    },
                ],
                notice: Some("wrap up".into()),
            },
            Message::user_text("and also"),
        ],
        tools: vec![
            ToolSpec {
                name: "read".into(),
                description: "Read a file".into(),
                input_schema: json!({ "type": "object" }),
            },
            ToolSpec {
                name: "exec".into(),
                description: "Run".into(),
                input_schema: json!({ "type": "object", "properties": {} }),
            },
        ],
        tool_choice: ToolChoice::Auto,
        previous_messages: Some(3),
    }
}
