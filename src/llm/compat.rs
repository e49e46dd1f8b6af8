//! The neutral side of the OpenAI- and Anthropic-compatible endpoints (SPEC §17): what a
//! parsed request of either API says ([`CompatRequest`]), what the answer carries
//! ([`CompatReply`]), the error classes both envelopes share ([`ErrorKind`]) and the model ids
//! (`agentd`, `agentd:<name>`). The wire JSON of each API lives beside its client, in
//! `llm::openai::server` and `llm::anthropic::server`; nothing here knows it.

use crate::message::call::CallOptions;
use crate::message::{Message, Usage};

/// The model id of the routed default.
pub const DEFAULT_MODEL: &str = "agentd";

/// The most messages one request may carry (the body limit bounds their size).
pub const MAX_MESSAGES: usize = 1000;

/// The most images the last user message may carry.
pub const MAX_IMAGES: usize = 8;
/// Audio parts (OpenAI `input_audio`) accepted in one message.
pub const MAX_AUDIO: usize = 2;

/// Which API a request came in as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    OpenAi,
    Anthropic,
}

/// One image or sound of the new user message (becomes an attachment: an image the model sees,
/// audio the intake transcribes, SPEC §19).
#[derive(Debug, Clone, PartialEq)]
pub struct CompatAttachment {
    /// `image/png`, `image/jpeg`, `image/gif` or `image/webp`; `audio/wav` or `audio/mpeg`
    /// (OpenAI `input_audio`).
    pub media_type: String,
    /// Standard base64, checked.
    pub data: String,
}

/// A request of either API, parsed and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct CompatRequest {
    /// The `model` field as sent.
    pub model: String,
    /// The session the body names: OpenAI `safety_identifier` or `user`, Anthropic
    /// `metadata.user_id` (the `X-Agentd-Session` header wins over it).
    pub session: Option<String>,
    /// The client's system text (all system and developer messages, joined), if any.
    pub system: Option<String>,
    /// The messages before the last user message, in neutral form (client images there are
    /// replaced by a placeholder; the history of a one-off session).
    pub history: Vec<Message>,
    /// The text of the last user message: the new input.
    pub text: String,
    /// The images and sounds of the last user message.
    pub attachments: Vec<CompatAttachment>,
    pub options: CallOptions,
    pub stream: bool,
    /// OpenAI `stream_options.include_usage`.
    pub include_usage: bool,
}

/// A request refused with 400: which field and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The field, as a path like `messages[2].content`.
    pub param: Option<String>,
    pub message: String,
}

impl Invalid {
    pub fn new(param: impl Into<String>, message: impl Into<String>) -> Invalid {
        Invalid {
            param: Some(param.into()),
            message: message.into(),
        }
    }
}

/// The start both wire formats share: `body` as a JSON object, refused when it asks for
/// client-side tools (`tool_fields`, the format's own names for them: the agent runs its own),
/// and its `model` (required, at most 256 bytes).
pub fn request_object(
    body: &[u8],
    tool_fields: &[&str],
) -> Result<(serde_json::Map<String, serde_json::Value>, String), Invalid> {
    use serde_json::Value;
    let v: Value = serde_json::from_slice(body).map_err(|e| Invalid {
        param: None,
        message: format!("the body is not valid JSON: {e}"),
    })?;
    let Value::Object(o) = v else {
        return Err(Invalid {
            param: None,
            message: "the body must be a JSON object".into(),
        });
    };
    for f in tool_fields {
        if o.get(*f)
            .is_some_and(|v| !v.is_null() && v != &Value::Array(vec![]))
        {
            return Err(Invalid::new(
                *f,
                format!(
                    "client-side tools are not supported: agentd is an agent and runs its own tools; remove `{f}` from the request"
                ),
            ));
        }
    }
    let model = match o.get("model") {
        Some(Value::String(m)) if !m.is_empty() && m.len() <= 256 => m.clone(),
        _ => {
            return Err(Invalid::new(
                "model",
                "`model` is required: \"agentd\" or \"agentd:<model name>\" (GET /v1/models lists them)",
            ));
        }
    };
    Ok((o, model))
}

/// What the model choice in `model` means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelChoice {
    /// `agentd`, or an id that is not ours (clients with a fixed model name): the model the
    /// source routes to.
    Routed,
    /// `agentd:<name>`: that configured model.
    Named(String),
}

impl ModelChoice {
    pub fn of(model: &str) -> ModelChoice {
        match model.strip_prefix("agentd:") {
            Some(name) => ModelChoice::Named(name.to_string()),
            None => ModelChoice::Routed,
        }
    }
}

/// Why the answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A complete answer (OpenAI `stop`, Anthropic `end_turn`).
    Stop,
    /// Cut at the output limit (`length`, `max_tokens`).
    Length,
}

/// A finished answer.
#[derive(Debug, Clone, PartialEq)]
pub struct CompatReply {
    /// Stable for the message: a retry with the same `Idempotency-Key` gets the same id.
    pub id: String,
    /// The `model` the request named.
    pub model: String,
    /// Unix seconds.
    pub created: i64,
    pub text: String,
    pub finish: FinishReason,
    /// Totals over the message's whole loop.
    pub usage: Usage,
}

/// The error classes both envelopes know, with their status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400
    InvalidRequest,
    /// 401
    Authentication,
    /// 404
    NotFound,
    /// 408: the answer did not come within `call_timeout_seconds`; the work goes on.
    Timeout,
    /// 409: an `Idempotency-Key` reused for another request (another body or session).
    Conflict,
    /// 413
    TooLarge,
    /// 429: the queue is full; nothing was recorded, a retry may succeed.
    Busy,
    /// 429: a budget is spent.
    Budget,
    /// 500
    Internal,
    /// 502: the model failed after retries and fallback.
    Upstream,
    /// 503: not accepted now (shutting down); nothing was recorded.
    Unavailable,
    /// 503: a shutdown interrupted the message after it was recorded; it resumes after the
    /// restart.
    Interrupted,
}

impl ErrorKind {
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::InvalidRequest => 400,
            ErrorKind::Authentication => 401,
            ErrorKind::NotFound => 404,
            ErrorKind::Timeout => 408,
            ErrorKind::Conflict => 409,
            ErrorKind::TooLarge => 413,
            ErrorKind::Busy | ErrorKind::Budget => 429,
            ErrorKind::Internal => 500,
            ErrorKind::Upstream => 502,
            ErrorKind::Unavailable | ErrorKind::Interrupted => 503,
        }
    }

    /// The class of an error answer made elsewhere (auth, rate limits, the body limit).
    pub fn of_status(status: u16) -> ErrorKind {
        match status {
            400 | 405 | 415 | 422 => ErrorKind::InvalidRequest,
            401 | 403 => ErrorKind::Authentication,
            404 => ErrorKind::NotFound,
            408 => ErrorKind::Timeout,
            409 => ErrorKind::Conflict,
            413 => ErrorKind::TooLarge,
            429 => ErrorKind::Busy,
            502 => ErrorKind::Upstream,
            503 => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        }
    }

    /// Whether a client may send the same request again. `false` answers carry
    /// `x-should-retry: false`, which the official SDKs obey: the message was recorded (a
    /// retry would be a second message) or a retry cannot succeed.
    pub fn retry(self) -> bool {
        matches!(self, ErrorKind::Busy | ErrorKind::Unavailable)
    }
}

/// The usage figures of SPEC §17 for OpenAI: prompt tokens count input, cache reads and cache
/// writes; the cached part is the cache reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenAiUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    pub cached_tokens: u64,
}

impl From<&Usage> for OpenAiUsage {
    fn from(u: &Usage) -> OpenAiUsage {
        let prompt = u
            .input_tokens
            .saturating_add(u.cache_read_tokens)
            .saturating_add(u.cache_write_tokens);
        OpenAiUsage {
            prompt_tokens: prompt,
            completion_tokens: u.output_tokens,
            total_tokens: prompt.saturating_add(u.output_tokens),
            cached_tokens: u.cache_read_tokens,
        }
    }
}

/// `temperature`: absent, or a number in `0..=max`.
pub fn temperature(v: Option<&serde_json::Value>, max: f64) -> Result<Option<f32>, Invalid> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(t) if (0.0..=max).contains(&t) => Ok(Some(t as f32)),
            _ => Err(Invalid::new(
                "temperature",
                format!(
                    "`temperature` must be a number from 0 to {max}, got {}",
                    short(&v.to_string())
                ),
            )),
        },
    }
}

/// At most 80 characters of outside text, for error messages.
pub fn short(s: &str) -> String {
    s.chars().take(80).collect()
}

/// Whether `s` is standard base64 (what both APIs require of image data).
pub fn is_base64(s: &str) -> bool {
    use base64::Engine as _;
    !s.is_empty()
        && base64::engine::general_purpose::STANDARD
            .decode(s.as_bytes())
            .is_ok()
}

/// The image media types both APIs accept.
pub fn is_image_type(t: &str) -> bool {
    matches!(t, "image/png" | "image/jpeg" | "image/gif" | "image/webp")
}

/// Consecutive messages of the same role merged (texts joined by a blank line), and a leading
/// assistant message preceded by a user note, so the history alternates as both providers
/// require.
pub fn normalise_history(messages: Vec<Message>) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    for m in messages {
        match (out.last_mut(), m) {
            (Some(Message::User { content }), Message::User { content: more }) => {
                content.extend(more);
            }
            (
                Some(Message::Assistant { text, .. }),
                Message::Assistant {
                    text: more_text, ..
                },
            ) => {
                if !text.is_empty() && !more_text.is_empty() {
                    text.push_str("\n\n");
                }
                text.push_str(&more_text);
            }
            (None, m @ Message::Assistant { .. }) => {
                out.push(Message::user_text(
                    "[the conversation was opened by the assistant]",
                ));
                out.push(m);
            }
            (_, m) => out.push(m),
        }
    }
    out
}

/// An assistant message of the client's history.
pub fn assistant_text(text: String) -> Message {
    Message::Assistant {
        text,
        tool_calls: Vec::new(),
        thinking: Vec::new(),
        usage: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_mapped_as_the_spec_says() {
        let u = Usage {
            input_tokens: 10,
            output_tokens: 5,
            cache_read_tokens: 100,
            cache_write_tokens: 20,
            cache_write_1h_tokens: 0,
        };
        assert_eq!(
            OpenAiUsage::from(&u),
            OpenAiUsage {
                prompt_tokens: 130,
                completion_tokens: 5,
                total_tokens: 135,
                cached_tokens: 100
            }
        );
    }

    #[test]
    fn model_ids() {
        assert_eq!(ModelChoice::of("agentd"), ModelChoice::Routed);
        assert_eq!(ModelChoice::of("gpt-4o"), ModelChoice::Routed);
        assert_eq!(
            ModelChoice::of("agentd:primary"),
            ModelChoice::Named("primary".into())
        );
    }

    #[test]
    fn only_busy_and_unavailable_may_be_retried() {
        for k in [
            ErrorKind::InvalidRequest,
            ErrorKind::Authentication,
            ErrorKind::Budget,
            ErrorKind::Upstream,
            ErrorKind::Timeout,
            ErrorKind::Internal,
        ] {
            assert!(!k.retry(), "{k:?}");
        }
        assert!(ErrorKind::Busy.retry() && ErrorKind::Unavailable.retry());
        assert_eq!(ErrorKind::of_status(413), ErrorKind::TooLarge);
        assert_eq!(ErrorKind::Budget.status(), 429);
    }

    #[test]
    fn history_alternates() {
        let h = normalise_history(vec![
            assistant_text("hello".into()),
            Message::user_text("a"),
            Message::user_text("b"),
            assistant_text("x".into()),
            assistant_text("y".into()),
        ]);
        assert_eq!(h.len(), 4);
        assert!(h[0].is_user());
        let Message::User { content } = &h[2] else {
            panic!("{h:?}")
        };
        assert_eq!(content.len(), 2);
        let Message::Assistant { text, .. } = &h[3] else {
            panic!("{h:?}")
        };
        assert_eq!(text, "x\n\ny");
    }
}
