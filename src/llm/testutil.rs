//! Fixtures shared by the LLM layer's unit tests.

use std::time::Duration;

use serde_json::json;

use crate::config::{
    BehaviorConfig, CacheTtl, CompactionConfig, ModelSpec, Pricing, ProviderKind, Thinking,
};
use crate::llm::{ChatRequest, SystemBlock, SystemTier, ToolChoice, ToolSpec};
use crate::message::{Message, ThinkingBlock, ToolCall, ToolResult, UserBlock};

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
        tool_schema: Default::default(),
        tool_calls_in_text: false,
        structured_output: true,
    }
}

/// Behaviour with fast retries (`retries` retries, 1 ms base) and the given inactivity timeout.
pub(crate) fn behavior(retries: u32, call_timeout: Duration) -> BehaviorConfig {
    BehaviorConfig {
        debounce: Duration::ZERO,
        max_concurrent_sessions: 1,
        max_queued_per_session: 64,
        max_queued_total: 1024,
        idle_session_cache_bytes: crate::config::keys::behavior::DEFAULT_IDLE_SESSION_CACHE_BYTES,
        silent_tokens: vec![],
        typing_indicators: false,
        show_fallback: true,
        error_message: "error".into(),
        max_turns_per_message: 10,
        call_timeout,
        call_deadline: Duration::from_secs(60),
        max_reply_bytes: 1024 * 1024,
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
        options: Default::default(),
        deltas: None,
        stable_ttl: None,
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
                        images: Vec::new(),
                    },
                    ToolResult {
                        tool_call_id: "tu2".into(),
                        content: "boom".into(),
                        is_error: true,
                        images: Vec::new(),
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
        ]
        .into(),
        tool_choice: ToolChoice::Auto,
        previous_messages: Some(3),
        rendered: Default::default(),
    }
}

/// Arbitrary neutral requests and model definitions, for properties of the renderers (every
/// block kind, empty texts, merged roles, strings that need escaping, any breakpoint position).
pub(crate) mod arb {
    use proptest::collection::vec;
    use proptest::prelude::*;
    use serde_json::Value;

    use super::model_spec;
    use crate::config::{CacheTtl, ModelSpec, ProviderKind, Thinking};
    use crate::llm::{ChatRequest, SystemBlock, SystemTier, ToolChoice, ToolSpec};
    use crate::message::{Message, ThinkingBlock, ToolCall, ToolImage, ToolResult, UserBlock};

    /// Short strings, often empty, with quotes, backslashes, control characters and non-ASCII.
    pub(crate) fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            "[a-z ]{1,12}",
            "[\"\\\\\n\t\u{1}\u{7f}é€😀<>/a]{0,8}",
        ]
    }

    /// Small JSON values (tool arguments and schemas): nested objects and arrays, numbers.
    pub(crate) fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1.0e9f64..1.0e9).prop_map(Value::from),
            text().prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(text(), inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn user_block() -> impl Strategy<Value = UserBlock> {
        prop_oneof![
            4 => text().prop_map(|text| UserBlock::Text { text }),
            1 => (text(), text(), text()).prop_map(|(media_type, data, placeholder)| UserBlock::Image {
                media_type,
                data,
                placeholder,
            }),
        ]
    }

    fn tool_image() -> impl Strategy<Value = ToolImage> {
        (text(), text(), text()).prop_map(|(media_type, data, placeholder)| ToolImage {
            media_type,
            data,
            placeholder,
        })
    }

    fn thinking() -> impl Strategy<Value = ThinkingBlock> {
        (
            proptest::option::of(text()),
            proptest::option::of(text()),
            proptest::option::of(text()),
        )
            .prop_map(|(thinking, signature, redacted_data)| ThinkingBlock {
                thinking,
                signature,
                redacted_data,
            })
    }

    pub(crate) fn message() -> impl Strategy<Value = Message> {
        prop_oneof![
            vec(user_block(), 0..4).prop_map(|content| Message::User { content }),
            (
                text(),
                vec((text(), text(), json()), 0..3),
                vec(thinking(), 0..3)
            )
                .prop_map(|(text, calls, thinking)| Message::Assistant {
                    text,
                    tool_calls: calls
                        .into_iter()
                        .map(|(id, name, arguments)| ToolCall {
                            id,
                            name,
                            arguments
                        })
                        .collect(),
                    thinking,
                    usage: None,
                }),
            (
                vec(
                    (text(), text(), any::<bool>(), vec(tool_image(), 0..2)),
                    0..3
                ),
                proptest::option::of(text())
            )
                .prop_map(|(results, notice)| Message::ToolResults {
                    results: results
                        .into_iter()
                        .map(|(tool_call_id, content, is_error, images)| ToolResult {
                            tool_call_id,
                            content,
                            is_error,
                            images,
                        })
                        .collect(),
                    notice,
                }),
        ]
    }

    pub(crate) fn request() -> impl Strategy<Value = ChatRequest> {
        (
            vec((any::<bool>(), text()), 0..4),
            vec(message(), 0..8),
            vec((text(), text(), json()), 0..3),
            any::<bool>(),
            proptest::option::of(0usize..10),
            text(),
        )
            .prop_map(
                |(system, messages, tools, auto, previous, session)| ChatRequest {
                    options: Default::default(),
                    deltas: None,
                    stable_ttl: None,
                    session_id: session,
                    system: system
                        .into_iter()
                        .map(|(stable, text)| SystemBlock {
                            tier: if stable {
                                SystemTier::Stable
                            } else {
                                SystemTier::SemiStable
                            },
                            text,
                        })
                        .collect(),
                    messages,
                    tools: tools
                        .into_iter()
                        .map(|(name, description, input_schema)| ToolSpec {
                            name,
                            description,
                            input_schema,
                        })
                        .collect(),
                    tool_choice: if auto {
                        ToolChoice::Auto
                    } else {
                        ToolChoice::None
                    },
                    previous_messages: previous,
                    rendered: Default::default(),
                },
            )
    }

    /// Model definitions of `kind`: cache on or off, both TTLs, every thinking mode, with and
    /// without an effort, OpenAI's own host or another, with and without `prompt_cache_key`.
    pub(crate) fn spec(kind: ProviderKind) -> impl Strategy<Value = ModelSpec> {
        (
            any::<bool>(),
            any::<bool>(),
            0u8..3,
            proptest::option::of(text()),
            any::<u32>(),
            any::<u32>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(
                move |(cache, long_ttl, thinking, effort, max, budget, openai_host, key)| {
                    let url = if openai_host {
                        "https://api.openai.com/v1"
                    } else {
                        "http://localhost:8080/v1"
                    };
                    let mut s = model_spec("primary", kind, url);
                    s.cache = cache;
                    s.cache_ttl = if long_ttl {
                        CacheTtl::OneHour
                    } else {
                        CacheTtl::FiveMinutes
                    };
                    s.thinking = match thinking {
                        0 => Thinking::Off,
                        1 => Thinking::Adaptive,
                        _ => Thinking::Budgeted,
                    };
                    s.thinking_effort = effort;
                    s.max_tokens = max;
                    s.thinking_budget = budget;
                    s.prompt_cache_key = key;
                    s
                },
            )
    }
}
