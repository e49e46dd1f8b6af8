//! The neutral conversation types every layer shares: messages, their content blocks, tool
//! calls and results, token usage, and the [`Address`] of a chat on any channel. A leaf module (layer 0): `session` and `store` persist
//! these and `llm` translates them at the provider edge, and neither of the first two needs
//! `llm` for it.
//! These are also the persisted format of session state files (SPEC §7 "internal neutral
//! message format"), so changing a serde shape here is a format change: keep it backward
//! compatible. `toolcalls` makes a provider's tool calls safe to store and replay;
//! `rendered` keeps a session's messages as a wire format rendered them (SPEC §16.6).

pub mod address;
pub mod call;
pub mod rendered;
pub mod toolcalls;

pub use address::Address;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One conversation message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    User {
        content: Vec<UserBlock>,
    },
    Assistant {
        #[serde(default)]
        text: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
        /// Anthropic thinking blocks, kept verbatim (with signatures) so they can be sent back.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        thinking: Vec<ThinkingBlock>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<Usage>,
    },
    ToolResults {
        results: Vec<ToolResult>,
        /// A note from the daemon to the model appended after the results (e.g. the wrap-up
        /// warning). Rendered as a text block after the results.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        notice: Option<String>,
    },
}

impl Message {
    pub fn user_text(text: impl Into<String>) -> Self {
        Message::User {
            content: vec![UserBlock::Text { text: text.into() }],
        }
    }

    pub fn is_user(&self) -> bool {
        matches!(self, Message::User { .. })
    }

    /// This message with every image replaced by its text placeholder (what is persisted). A
    /// tool result's images are dropped: its text already holds their placeholders.
    pub fn without_images(&self) -> Message {
        match self {
            Message::ToolResults { results, notice } => Message::ToolResults {
                results: results.iter().map(ToolResult::without_images).collect(),
                notice: notice.clone(),
            },
            Message::User { content } => Message::User {
                content: content
                    .iter()
                    .map(|b| match b {
                        UserBlock::Image { placeholder, .. } => UserBlock::Text {
                            text: placeholder.clone(),
                        },
                        other => other.clone(),
                    })
                    .collect(),
            },
            other => other.clone(),
        }
    }

    /// Tool calls of an assistant message (empty for other roles).
    pub fn tool_calls(&self) -> &[ToolCall] {
        match self {
            Message::Assistant { tool_calls, .. } => tool_calls,
            _ => &[],
        }
    }

    /// An estimate of the heap memory this message holds: the capacity of its strings and
    /// block lists, and its tool calls' argument trees. For memory bounds (the idle session
    /// cache, SPEC §16.3), not an exact account: allocator overhead is left out.
    pub fn heap_bytes(&self) -> usize {
        match self {
            Message::User { content } => {
                list_bytes(content)
                    + (content.iter())
                        .map(|b| match b {
                            UserBlock::Text { text } => text.capacity(),
                            UserBlock::Image {
                                media_type,
                                data,
                                placeholder,
                            } => media_type.capacity() + data.capacity() + placeholder.capacity(),
                        })
                        .sum::<usize>()
            }
            Message::Assistant {
                text,
                tool_calls,
                thinking,
                ..
            } => {
                let calls = tool_calls
                    .iter()
                    .map(|c| c.id.capacity() + c.name.capacity() + json_heap_bytes(&c.arguments));
                let thoughts = thinking.iter().map(|t| {
                    [&t.thinking, &t.signature, &t.redacted_data]
                        .into_iter()
                        .flatten()
                        .map(String::capacity)
                        .sum::<usize>()
                });
                text.capacity()
                    + list_bytes(tool_calls)
                    + calls.sum::<usize>()
                    + list_bytes(thinking)
                    + thoughts.sum::<usize>()
            }
            Message::ToolResults { results, notice } => {
                list_bytes(results)
                    + (results.iter())
                        .map(|r| {
                            r.tool_call_id.capacity()
                                + r.content.capacity()
                                + list_bytes(&r.images)
                                + (r.images.iter())
                                    .map(|i| {
                                        i.media_type.capacity()
                                            + i.data.capacity()
                                            + i.placeholder.capacity()
                                    })
                                    .sum::<usize>()
                        })
                        .sum::<usize>()
                    + notice.as_ref().map_or(0, String::capacity)
            }
        }
    }
}

/// The calls at the end of a conversation still waiting for a result: those of the last
/// assistant message with calls that no result after it answers (none once a user message
/// follows it). One rule for the loop's dangling calls and a client's open ones (SPEC §17).
pub fn open_tool_calls(messages: &[Message]) -> Vec<&ToolCall> {
    let mut answered: Vec<&str> = Vec::new();
    for m in messages.iter().rev() {
        match m {
            Message::ToolResults { results, .. } => {
                answered.extend(results.iter().map(|r| r.tool_call_id.as_str()));
            }
            Message::Assistant { tool_calls, .. } => {
                return tool_calls
                    .iter()
                    .filter(|c| !answered.contains(&c.id.as_str()))
                    .collect();
            }
            Message::User { .. } => return Vec::new(),
        }
    }
    Vec::new()
}

/// The heap bytes of a list's own buffer (not what its elements point to).
fn list_bytes<T>(v: &Vec<T>) -> usize {
    v.capacity() * std::mem::size_of::<T>()
}

/// An estimate of the heap bytes of a JSON tree: its strings and keys, a `Value` per array
/// element and object entry. Trees come from a parser with a depth limit, so the recursion is
/// bounded.
fn json_heap_bytes(v: &Value) -> usize {
    let node = std::mem::size_of::<Value>();
    match v {
        Value::String(s) => s.capacity(),
        Value::Array(a) => list_bytes(a) + a.iter().map(json_heap_bytes).sum::<usize>(),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| k.capacity() + node + json_heap_bytes(v))
            .sum(),
        Value::Null | Value::Bool(_) | Value::Number(_) => 0,
    }
}

/// A content block of a user turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum UserBlock {
    Text {
        text: String,
    },
    /// Passed to the provider for the call(s) of the message that carried it, never persisted:
    /// state files hold `Text` placeholders instead (see `placeholder`).
    Image {
        media_type: String,
        /// Base64 data.
        data: String,
        /// What replaces the image from the next message on, e.g. "[image: inbox/123.jpg]".
        placeholder: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// Parsed JSON arguments. If the model produced invalid JSON this is
    /// `{"__invalid_json": "<raw text>"}` and the call is answered with an error result.
    pub arguments: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub tool_call_id: String,
    pub content: String,
    #[serde(default)]
    pub is_error: bool,
    /// Images for a model that sees them (an MCP tool's), passed to the provider for the calls
    /// of the message that ran the tool only, like [`UserBlock::Image`]: never persisted
    /// ([`Message::without_images`]); `content` holds their placeholders.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ToolImage>,
}

impl ToolResult {
    /// This result without its images (what is persisted: its text holds their placeholders).
    pub fn without_images(&self) -> ToolResult {
        ToolResult {
            tool_call_id: self.tool_call_id.clone(),
            content: self.content.clone(),
            is_error: self.is_error,
            images: Vec::new(),
        }
    }
}

/// An image a tool returned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolImage {
    /// One of [`IMAGE_MEDIA_TYPES`].
    pub media_type: String,
    /// Base64 data, checked.
    pub data: String,
    /// The line of the result's text that stands for it, e.g. "[image from MCP tool
    /// s__shot: image/png, 1.2 KB]".
    pub placeholder: String,
}

/// The largest image passed to a model, decoded (Anthropic's per-image limit); a larger one
/// stays a placeholder.
pub const MAX_IMAGE_BYTES: u64 = 5 * 1024 * 1024;

/// The image types every provider takes.
pub const IMAGE_MEDIA_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

/// A thinking block as returned by Anthropic. `redacted` blocks carry `data` instead of text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThinkingBlock {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// `redacted_thinking` payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redacted_data: Option<String>,
}

/// Token usage of one call, in agentd's normalised meaning: `input_tokens` excludes cache reads
/// and writes (Anthropic's meaning; OpenAI's prompt_tokens are split as prompt − cached).
/// No token is counted twice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_read_tokens: u64,
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// The part of `cache_write_tokens` written with the 1-hour TTL (SPEC §20), priced at
    /// `cache_write_1h`; never more than `cache_write_tokens`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_1h_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The most tokens one provider call may report in any one usage field (input, output, cache
/// read, cache write): 10 million, several times the largest context window offered today
/// (about 2 million tokens). A provider answer reporting more, or a negative count, is
/// malformed (SPEC §16.9): it is refused, and nothing of it is stored or billed. The cost
/// ledger reads a row beyond this cap, written by an older build, as no spend at all
/// (`store::costs`).
pub const MAX_TOKENS_PER_CALL: u64 = 10_000_000;

impl Usage {
    /// Adds `other` field by field; a sum beyond `u64::MAX` stays at `u64::MAX` (a trail
    /// written before usage was validated may hold such figures, and a sum must never panic
    /// or wrap).
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(other.cache_read_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
        self.cache_write_1h_tokens = self
            .cache_write_1h_tokens
            .saturating_add(other.cache_write_1h_tokens);
    }

    /// Tokens of the prompt as the provider saw it (input + cache reads + cache writes),
    /// saturating.
    pub fn prompt_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.cache_read_tokens)
            .saturating_add(self.cache_write_tokens)
    }

    /// Whether every field is a plausible figure for one call (at most
    /// [`MAX_TOKENS_PER_CALL`]). `Err` names the field and the value, for a malformed-response
    /// error.
    pub fn check_per_call(&self) -> Result<(), String> {
        let fields = [
            ("input_tokens", self.input_tokens),
            ("output_tokens", self.output_tokens),
            ("cache_read_tokens", self.cache_read_tokens),
            ("cache_write_tokens", self.cache_write_tokens),
            ("cache_write_1h_tokens", self.cache_write_1h_tokens),
        ];
        match fields.iter().find(|(_, v)| *v > MAX_TOKENS_PER_CALL) {
            Some((name, v)) => Err(format!(
                "usage {name} = {v} is not plausible for one call (more than \
                 {MAX_TOKENS_PER_CALL}); the answer is refused and not billed"
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod usage_tests {
    use super::*;

    fn u(i: u64, o: u64, cr: u64, cw: u64) -> Usage {
        Usage {
            input_tokens: i,
            output_tokens: o,
            cache_read_tokens: cr,
            cache_write_tokens: cw,
            cache_write_1h_tokens: 0,
        }
    }

    #[test]
    fn add_saturates_instead_of_overflowing() {
        let mut total = u(u64::MAX, 1, u64::MAX - 1, 0);
        total.add(&u(1, 2, 5, u64::MAX));
        assert_eq!(total, u(u64::MAX, 3, u64::MAX, u64::MAX));
        let mut small = u(1, 2, 3, 4);
        small.add(&u(10, 20, 30, 40));
        assert_eq!(small, u(11, 22, 33, 44));
    }

    #[test]
    fn prompt_tokens_saturates() {
        assert_eq!(u(u64::MAX, 0, u64::MAX, 7).prompt_tokens(), u64::MAX);
        assert_eq!(u(1, 100, 2, 3).prompt_tokens(), 6);
    }

    #[test]
    fn per_call_cap_names_the_field() {
        assert!(
            u(MAX_TOKENS_PER_CALL, MAX_TOKENS_PER_CALL, 0, 0)
                .check_per_call()
                .is_ok()
        );
        let e = u(0, 0, 0, MAX_TOKENS_PER_CALL + 1)
            .check_per_call()
            .unwrap_err();
        assert!(e.contains("cache_write_tokens = 10000001"), "{e}");
        assert!(u(u64::MAX, 0, 0, 0).check_per_call().is_err());
    }
}

#[cfg(test)]
mod heap_tests {
    use super::*;

    /// Every string a message holds counts: texts, images, tool calls and their arguments,
    /// thinking, tool results and the notice.
    #[test]
    fn heap_bytes_counts_every_string_of_a_message() {
        let small = Message::user_text("hi").heap_bytes();
        assert!(small < 256, "{small}");
        let long = Message::user_text("x".repeat(10_000)).heap_bytes();
        assert!((10_000..10_256).contains(&long), "{long}");
        let image = Message::User {
            content: vec![UserBlock::Image {
                media_type: "image/png".into(),
                data: "A".repeat(50_000),
                placeholder: "[image: inbox/1.png]".into(),
            }],
        };
        assert!(image.heap_bytes() >= 50_000);
        let call = Message::Assistant {
            text: "t".repeat(100),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "write".into(),
                arguments: serde_json::json!({"content": "y".repeat(20_000), "more": ["z".repeat(5_000)]}),
            }],
            thinking: vec![ThinkingBlock {
                thinking: Some("h".repeat(3_000)),
                signature: Some("s".repeat(1_000)),
                redacted_data: None,
            }],
            usage: None,
        };
        assert!(call.heap_bytes() >= 29_100, "{}", call.heap_bytes());
        let results = Message::ToolResults {
            results: vec![ToolResult {
                tool_call_id: "c1".into(),
                content: "r".repeat(7_000),
                is_error: false,
                images: Vec::new(),
            }],
            notice: Some("n".repeat(500)),
        };
        assert!(results.heap_bytes() >= 7_500, "{}", results.heap_bytes());
    }
}

#[cfg(test)]
mod image_tests {
    use super::*;

    /// A tool result's images are never serialised when there are none (the trail format of
    /// every other result is unchanged), and `without_images` drops them, keeping the text.
    #[test]
    fn tool_result_images_are_dropped_before_persisting() {
        let plain = ToolResult {
            tool_call_id: "c1".into(),
            content: "[image from MCP tool s__t: image/png, 3 bytes]".into(),
            is_error: false,
            images: Vec::new(),
        };
        let json = serde_json::to_value(&plain).unwrap();
        assert_eq!(json.get("images"), None, "{json}");
        let back: ToolResult = serde_json::from_value(
            serde_json::json!({"tool_call_id": "c1", "content": plain.content, "is_error": false}),
        )
        .unwrap();
        assert_eq!(back, plain);
        let with = Message::ToolResults {
            results: vec![ToolResult {
                images: vec![ToolImage {
                    media_type: "image/png".into(),
                    data: "AAAA".into(),
                    placeholder: plain.content.clone(),
                }],
                ..plain.clone()
            }],
            notice: None,
        };
        assert!(with.heap_bytes() > plain.content.len() + 4);
        assert_eq!(
            with.without_images(),
            Message::ToolResults {
                results: vec![plain],
                notice: None,
            }
        );
    }
}
