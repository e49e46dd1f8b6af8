//! The neutral side of the OpenAI- and Anthropic-compatible endpoints (SPEC §17): what a
//! parsed request of either API says ([`CompatRequest`]), what the answer carries
//! ([`CompatReply`]), the error classes both envelopes share ([`ErrorKind`]) and the model ids
//! (`agentd`, `agentd:<name>`). The wire JSON of each API lives beside its client, in
//! `llm::openai::server` and `llm::anthropic::server`; nothing here knows it. The client's
//! function tools, their calls and results in a conversation are checked in `compat/tools.rs`.

mod tools;

pub use tools::{
    CompatToolResult, MAX_CLIENT_TOOLS, NewInput, Turn, check_clash, check_client_tools,
    check_history, check_results, check_tool_choice, client_tool, history_call, new_input,
    open_calls, push_result,
};

pub use crate::message::call::OutputFormat;
use crate::message::call::{CallOptions, ClientTool, ClientToolChoice};
use crate::message::{Message, ToolCall, Usage};

/// The model id of the routed default.
pub const DEFAULT_MODEL: &str = "agentd";

/// The ids `GET /v1/models` lists: the routed default, then `agentd:<name>` of each model.
pub fn model_ids(names: &[String]) -> impl Iterator<Item = String> + '_ {
    std::iter::once(DEFAULT_MODEL.to_string()).chain(names.iter().map(|n| format!("agentd:{n}")))
}

/// The most messages one request may carry (the body limit bounds their size).
pub const MAX_MESSAGES: usize = 1000;

/// The most images the last user message may carry.
pub const MAX_IMAGES: usize = 8;
/// Audio parts (OpenAI `input_audio`) accepted in one message.
pub const MAX_AUDIO: usize = 2;

/// Which API a request came in as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// Chat Completions.
    OpenAi,
    Anthropic,
    /// OpenAI's Responses API (its errors use the OpenAI envelope).
    Responses,
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
    /// The text of the last user message: the new input (empty when the new input is only
    /// tool results).
    pub text: String,
    /// The results of the client's tools that end the conversation: the answers to the calls
    /// the model made at the end of the previous turn (SPEC §17).
    pub tool_results: Vec<CompatToolResult>,
    /// The client's function tools, checked (at most [`MAX_CLIENT_TOOLS`], distinct names).
    pub tools: Vec<ClientTool>,
    /// The client's `tool_choice`, when it sent one.
    pub tool_choice: Option<ClientToolChoice>,
    /// The images and sounds of the last user message.
    pub attachments: Vec<CompatAttachment>,
    pub options: CallOptions,
    pub stream: bool,
    /// OpenAI `stream_options.include_usage`.
    pub include_usage: bool,
    /// What the Responses API adds: the response a request continues, and whether its
    /// answer may be continued.
    pub continuation: Continuation,
}

/// A Responses request's `previous_response_id` and `store`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continuation {
    /// The response this request continues: its session goes on.
    pub previous_response: Option<String>,
    /// `store` (default true): `false` answers cannot be continued.
    pub store: bool,
}

impl Default for Continuation {
    fn default() -> Continuation {
        Continuation {
            previous_response: None,
            store: true,
        }
    }
}

/// The id of the Responses answer to intake `intake_id` of session `session_id` (a UUID):
/// `resp_`, the session's UUID in hex, then 16 hex digits of the intake id's SHA-256. A later
/// `previous_response_id` finds the session from it (see [`response_session`]).
pub fn response_id(session_id: &str, intake_id: &str) -> String {
    let session = uuid::Uuid::parse_str(session_id)
        .map(|u| u.simple().to_string())
        .unwrap_or_else(|_| "0".repeat(32));
    format!("resp_{session}{}", &sha256_hex(intake_id.as_bytes())[..16])
}

/// The session UUID and intake digest prefix a response id names; `None` for an id agentd
/// did not make.
pub fn response_session(response_id: &str) -> Option<(String, String)> {
    let rest = response_id.strip_prefix("resp_")?;
    if rest.len() != 48 || !rest.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let session = uuid::Uuid::parse_str(&rest[..32]).ok()?;
    Some((
        session.hyphenated().to_string(),
        rest[32..].to_ascii_lowercase(),
    ))
}

/// The hex SHA-256 of `bytes` (intake ids, request bodies, session names).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
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

/// The most items of any list in one message or top-level field: a message's content parts
/// above all (text, images, audio). Each parsed part costs far more memory than its JSON
/// text, so the cap is checked while parsing, not after.
pub const MAX_PARTS: usize = 400;

/// A request body's top level, parsed without building its messages: each message stays a
/// slice of the body until [`message_value`] parses it, so parsing holds one message at a
/// time besides the body (a ~10 MB body of 270,000 parts as one `Value` took 25 times its
/// size).
pub struct RequestObject<'a> {
    /// Every field but `messages`, parsed ([`MAX_PARTS`] items per list at most).
    pub fields: serde_json::Map<String, serde_json::Value>,
    /// `messages` as JSON text, when present.
    pub messages: Option<&'a serde_json::value::RawValue>,
    /// `model` (required, at most 256 bytes).
    pub model: String,
}

/// A field that asks for something agentd does not do (`"none"`, `"auto"`, an empty list or
/// null ask for nothing and pass): its name and what to send instead.
fn asks_for_something(v: &serde_json::Value) -> bool {
    let kind = v
        .as_str()
        .or_else(|| v.get("type").and_then(serde_json::Value::as_str));
    !v.is_null() && v != &serde_json::Value::Array(vec![]) && !matches!(kind, Some("none" | "auto"))
}

/// The start both wire formats share: `body` as a JSON object, refused when it uses one of
/// the `refused` fields (name, why and what to send instead), and its `model` (required, at
/// most 256 bytes).
pub fn request_object<'a>(
    body: &'a [u8],
    refused: &[(&str, &str)],
) -> Result<RequestObject<'a>, Invalid> {
    request_object_with(body, "messages", refused)
}

/// [`request_object`] whose list of messages is the field `list` (`input` in the Responses
/// API), kept as text in [`RequestObject::messages`].
pub fn request_object_with<'a>(
    body: &'a [u8],
    list: &str,
    refused: &[(&str, &str)],
) -> Result<RequestObject<'a>, Invalid> {
    use serde_json::Value;
    use serde_json::value::RawValue;
    let top: std::collections::BTreeMap<String, &RawValue> =
        serde_json::from_slice(body).map_err(|e| Invalid {
            param: None,
            message: if e.classify() == serde_json::error::Category::Data {
                "the body must be a JSON object".into()
            } else {
                format!("the body is not valid JSON: {e}")
            },
        })?;
    let mut fields = serde_json::Map::new();
    let mut messages = None;
    for (name, raw) in top {
        if name == list {
            messages = Some(raw);
            continue;
        }
        let v = bounded_value(raw).map_err(|m| Invalid::new(&name, m))?;
        fields.insert(name, v);
    }
    for (f, why) in refused {
        if fields.get(*f).is_some_and(asks_for_something) {
            return Err(Invalid::new(*f, *why));
        }
    }
    let model = match fields.get("model") {
        Some(Value::String(m)) if !m.is_empty() && m.len() <= 256 => m.clone(),
        _ => {
            return Err(Invalid::new(
                "model",
                "`model` is required: \"agentd\" or \"agentd:<model name>\" (GET /v1/models lists them)",
            ));
        }
    };
    Ok(RequestObject {
        fields,
        messages,
        model,
    })
}

/// `messages` as a list of 1 to [`MAX_MESSAGES`] unparsed messages (one pointer each).
pub fn message_list(
    raw: Option<&serde_json::value::RawValue>,
) -> Result<Vec<&serde_json::value::RawValue>, Invalid> {
    item_list(raw, "messages")
}

/// The list `field` (`messages`, or the Responses API's `input`) as 1 to [`MAX_MESSAGES`]
/// unparsed items.
pub fn item_list<'a>(
    raw: Option<&'a serde_json::value::RawValue>,
    field: &str,
) -> Result<Vec<&'a serde_json::value::RawValue>, Invalid> {
    let bad_count = || {
        Invalid::new(
            field,
            format!(
                "`{field}` must hold 1 to {MAX_MESSAGES} {}",
                if field == "messages" {
                    "messages"
                } else {
                    "items"
                }
            ),
        )
    };
    let raw = raw.ok_or_else(|| Invalid::new(field, format!("`{field}` must be an array")))?;
    let list: Capped<&serde_json::value::RawValue, MAX_MESSAGES> = serde_json::from_str(raw.get())
        .map_err(|e| {
            if e.to_string().starts_with(TOO_MANY) {
                bad_count()
            } else {
                Invalid::new(field, format!("`{field}` must be an array"))
            }
        })?;
    if list.0.is_empty() {
        return Err(bad_count());
    }
    Ok(list.0)
}

/// Message `at` parsed, refused when a list in it (its content parts) has more than
/// [`MAX_PARTS`] items.
pub fn message_value(
    raw: &serde_json::value::RawValue,
    at: &str,
) -> Result<serde_json::Value, Invalid> {
    bounded_value(raw).map_err(|m| Invalid::new(at, m))
}

/// The start of the error of a list over its cap.
const TOO_MANY: &str = "more than ";

/// `raw` as a `Value` whose lists have at most [`MAX_PARTS`] items (the parse stops at the
/// first one over it).
fn bounded_value(raw: &serde_json::value::RawValue) -> Result<serde_json::Value, String> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_str(raw.get());
    Bounded.deserialize(&mut de).map_err(|e| {
        let text = e.to_string();
        if text.starts_with(TOO_MANY) {
            format!(
                "a message may have at most {MAX_PARTS} content parts (and any list in a request at most {MAX_PARTS} items); send fewer, larger parts"
            )
        } else {
            format!("not valid JSON: {text}")
        }
    })
}

/// Builds a `serde_json::Value`, refusing any list of more than [`MAX_PARTS`] items.
struct Bounded;

impl<'de> serde::de::DeserializeSeed<'de> for Bounded {
    type Value = serde_json::Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Bounded {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(Bounded)? {
            if items.len() == MAX_PARTS {
                return Err(serde::de::Error::custom(format!(
                    "{TOO_MANY}{MAX_PARTS} items in a list"
                )));
            }
            items.push(v);
        }
        Ok(serde_json::Value::Array(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let v = map.next_value_seed(Bounded)?;
            out.insert(k, v);
        }
        Ok(serde_json::Value::Object(out))
    }
}

/// A list of at most `N` items, refused at item `N + 1` while parsing.
struct Capped<T, const N: usize>(Vec<T>);

impl<'de, T: serde::Deserialize<'de>, const N: usize> serde::Deserialize<'de> for Capped<T, N> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T, const N: usize>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>, const N: usize> serde::de::Visitor<'de> for V<T, N> {
            type Value = Capped<T, N>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "a list of at most {N} items")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(v) = seq.next_element()? {
                    if items.len() == N {
                        return Err(serde::de::Error::custom(format!(
                            "{TOO_MANY}{N} items in a list"
                        )));
                    }
                    items.push(v);
                }
                Ok(Capped(items))
            }
        }
        d.deserialize_seq(V(std::marker::PhantomData))
    }
}

/// The largest structured-output schema accepted, in bytes of its JSON: the bound of an MCP
/// tool's input schema (`tools::mcp::limits`). Its depth and size in subschemas are bounded
/// where it is compiled before intake (`tools::arg_schema`).
pub const MAX_FORMAT_SCHEMA_BYTES: usize = 32 * 1024;

/// The name a format gets when its API has none (Anthropic).
pub const DEFAULT_FORMAT_NAME: &str = "output";

/// A `json_schema` format from the fields of `o`: `schema` (required), `name` (required when
/// `name_required`, else [`DEFAULT_FORMAT_NAME`] when absent), `strict`, `description`. `at`
/// is where `o` is in the request (`response_format.json_schema`, `output_config.format`,
/// `text.format`); errors name the field under it. Shared by every endpoint that takes a
/// format.
pub fn json_schema_format(
    o: &serde_json::Map<String, serde_json::Value>,
    at: &str,
    name_required: bool,
) -> Result<OutputFormat, Invalid> {
    use serde_json::Value;
    let here = |f: &str| format!("{at}.{f}");
    let name = match o.get("name") {
        Some(Value::String(n)) if crate::message::toolcalls::is_valid_token(n) => n.clone(),
        None | Some(Value::Null) if !name_required => DEFAULT_FORMAT_NAME.to_string(),
        _ => {
            return Err(Invalid::new(
                here("name"),
                "the format needs a `name` of 1 to 64 characters of a-z, A-Z, 0-9, '_' or '-'",
            ));
        }
    };
    let schema = o.get("schema").cloned().unwrap_or(Value::Null);
    check_format_schema(&schema).map_err(|m| Invalid::new(here("schema"), m))?;
    let strict = match o.get("strict") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(Invalid::new(
                here("strict"),
                "`strict` must be true or false",
            ));
        }
    };
    let description = match o.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => Some(d.clone()),
        Some(_) => {
            return Err(Invalid::new(
                here("description"),
                "`description` must be a string",
            ));
        }
    };
    Ok(OutputFormat::JsonSchema {
        name,
        schema,
        strict,
        description,
    })
}

/// A format's schema: a JSON object of at most [`MAX_FORMAT_SCHEMA_BYTES`].
pub fn check_format_schema(schema: &serde_json::Value) -> Result<(), String> {
    if !schema.is_object() {
        return Err("`schema` must be a JSON Schema object, e.g. {\"type\": \"object\", \"properties\": {…}}".into());
    }
    let bytes = schema.to_string().len();
    if bytes > MAX_FORMAT_SCHEMA_BYTES {
        return Err(format!(
            "the schema is {bytes} bytes of JSON; at most {MAX_FORMAT_SCHEMA_BYTES} are accepted"
        ));
    }
    Ok(())
}

/// The JSON of a structured answer: `text` trimmed, without the ```` ```json ```` fence small
/// models put around it.
pub fn unfenced(text: &str) -> &str {
    let t = text.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    let Some(body) = rest.strip_suffix("```") else {
        return t;
    };
    // The info string (`json`) runs to the end of the first line.
    match body.split_once('\n') {
        Some((info, inner)) if !info.contains('{') && !info.contains('[') => inner.trim(),
        _ => t,
    }
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
    /// The model called client tools (`tool_calls`, `tool_use`): the calls are in the answer.
    ToolCalls,
}

/// A finished answer.
#[derive(Debug, Clone, PartialEq)]
pub struct CompatReply {
    /// Stable for the message: a retry with the same `Idempotency-Key` gets the same id.
    pub id: String,
    /// The session that answered (a UUID; empty when unknown).
    pub session_id: String,
    /// The `model` the request named.
    pub model: String,
    /// Unix seconds.
    pub created: i64,
    pub text: String,
    /// The calls of the client's tools the turn ended on (SPEC §17); `finish` is then
    /// [`FinishReason::ToolCalls`].
    pub calls: Vec<ToolCall>,
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

/// Consecutive messages of the same role merged (texts joined by a blank line, tool results
/// into one list; an assistant message takes the calls of the one after it), and a leading
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
                Some(Message::ToolResults { results, .. }),
                Message::ToolResults { results: more, .. },
            ) => results.extend(more),
            (
                Some(Message::Assistant {
                    text, tool_calls, ..
                }),
                Message::Assistant {
                    text: more_text,
                    tool_calls: more_calls,
                    ..
                },
            ) if tool_calls.is_empty() => {
                if !text.is_empty() && !more_text.is_empty() {
                    text.push_str("\n\n");
                }
                text.push_str(&more_text);
                *tool_calls = more_calls;
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
    fn response_ids_name_their_session() {
        let session = "0196f3a2-7c1e-7b40-9a51-3d2f0e8c4b11";
        let id = response_id(session, "intake-1");
        assert!(
            id.starts_with("resp_0196f3a27c1e7b409a513d2f0e8c4b11"),
            "{id}"
        );
        assert_eq!(id.len(), 53);
        let (s, digest) = response_session(&id).unwrap();
        assert_eq!(s, session);
        assert!(sha256_hex(b"intake-1").starts_with(&digest));
        assert_ne!(id, response_id(session, "intake-2"));
        for bad in ["", "resp_", "resp_xyz", "chatcmpl-1", &format!("{id}0")] {
            assert!(response_session(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn fences_are_taken_off_a_structured_answer() {
        assert_eq!(unfenced(" {\"a\": 1} \n"), "{\"a\": 1}");
        assert_eq!(unfenced("```json\n{\"a\": 1}\n```"), "{\"a\": 1}");
        assert_eq!(unfenced("```\n[1]\n```\n"), "[1]");
        // Not a fence around the whole answer: left as it is.
        assert_eq!(unfenced("```json\n{}"), "```json\n{}");
        assert_eq!(unfenced("text ```{}```"), "text ```{}```");
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
