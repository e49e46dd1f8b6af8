//! The server side of OpenAI's Chat Completions wire format (SPEC §17): the request body of
//! `POST /v1/chat/completions` into a neutral [`CompatRequest`], and the answers back: the
//! `chat.completion` object, the `chat.completion.chunk` stream, the model list and the error
//! envelope. Only this module (with the client beside it) knows OpenAI's JSON.

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::llm::compat::{
    self, CompatAttachment, CompatReply, CompatRequest, ErrorKind, FinishReason, Invalid,
    OpenAiUsage, Turn, short,
};
use crate::message::call::{CallOptions, EFFORTS};
use crate::message::{Message, ToolCall, ToolResult, UserBlock};

/// The route of the endpoint.
pub const CHAT_COMPLETIONS_PATH: &str = "/v1/chat/completions";

/// The route of the model list.
pub const MODELS_PATH: &str = "/v1/models";
/// One model (`GET`).
pub const MODEL_PATH: &str = "/v1/models/{id}";

/// The legacy function fields: refused with what to send instead.
const REFUSED: &[(&str, &str)] = &[
    (
        "functions",
        "the legacy `functions` field is not supported: send the same definitions as `tools` (`{\"type\": \"function\", \"function\": …}`)",
    ),
    (
        "function_call",
        "the legacy `function_call` field is not supported: send `tool_choice`",
    ),
];

/// Parses a request body. Unknown fields that change nothing the agent does (`top_p`, `seed`,
/// `stop`, penalties, `store`, `metadata`, …) are ignored; fields it cannot honour are
/// refused with the reason.
pub fn parse_request(body: &[u8]) -> Result<CompatRequest, Invalid> {
    let compat::RequestObject {
        fields: o,
        messages,
        model,
    } = compat::request_object(body, REFUSED)?;
    refuse_other_outputs(&o)?;
    let stream = opt_bool(&o, "stream")?.unwrap_or(false);
    let include_usage = include_usage(&o)?;
    let session = match (opt_str(&o, "safety_identifier")?, opt_str(&o, "user")?) {
        (Some(s), _) | (None, Some(s)) if !s.trim().is_empty() => Some(s),
        _ => None,
    };
    let mut options = call_options(&o)?;
    options.parallel_tool_calls = opt_bool(&o, "parallel_tool_calls")?;
    let tools = super::chat_tools::client_tools(&o)?;
    let tool_choice = super::chat_tools::tool_choice(&o)?;
    compat::check_tool_choice(tool_choice.as_ref(), &tools, "tool_choice")?;
    let messages = compat::message_list(messages)?;
    let (system, mut turns) = conversation(&messages)?;
    let input = compat::new_input(
        &mut turns,
        messages.len(),
        "the last message must be a user message or tool results: it is the new input",
    )?;
    let history = compat::normalise_history(turns.into_iter().map(|t| t.message).collect());
    compat::check_history(&history)?;
    let system = system.join("\n\n");
    Ok(CompatRequest {
        model,
        session,
        system: (!system.trim().is_empty()).then_some(system),
        history,
        text: input.text,
        tool_results: input.tool_results,
        tools,
        tool_choice,
        attachments: input.attachments,
        options,
        stream,
        include_usage,
        continuation: compat::Continuation::default(),
    })
}

/// Refuses `n` other than 1 and output modalities other than text.
fn refuse_other_outputs(o: &Map<String, Value>) -> Result<(), Invalid> {
    if let Some(n) = o.get("n").filter(|n| !n.is_null())
        && n.as_u64() != Some(1)
    {
        return Err(Invalid::new("n", "only n = 1 is supported"));
    }
    if let Some(m) = o.get("modalities").and_then(Value::as_array)
        && m.iter().any(|x| x != "text")
    {
        return Err(Invalid::new("modalities", "only text output is supported"));
    }
    Ok(())
}

/// `stream_options.include_usage` (false when absent).
fn include_usage(o: &Map<String, Value>) -> Result<bool, Invalid> {
    match o.get("stream_options") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Object(so)) => Ok(opt_bool(so, "include_usage")
            .map_err(|e| Invalid::new("stream_options.include_usage", e.message))?
            .unwrap_or(false)),
        Some(_) => Err(Invalid::new("stream_options", "must be an object")),
    }
}

/// The token cap, temperature and reasoning effort; `reasoning` (the Responses API's field)
/// is refused with the field to use instead.
fn call_options(o: &Map<String, Value>) -> Result<CallOptions, Invalid> {
    let options = CallOptions {
        max_tokens: match opt_u32(o, "max_completion_tokens")? {
            Some(m) => Some(m),
            None => opt_u32(o, "max_tokens")?,
        },
        temperature: compat::temperature(o.get("temperature"), 2.0)?,
        parallel_tool_calls: None,
        effort: match opt_str(o, "reasoning_effort")? {
            None => None,
            Some(e) if EFFORTS.contains(&e.as_str()) => Some(e),
            Some(e) => {
                return Err(Invalid::new(
                    "reasoning_effort",
                    format!(
                        "unknown reasoning_effort {:?}: use one of {}",
                        short(&e),
                        EFFORTS.join(", ")
                    ),
                ));
            }
        },
        thinking: None,
        format: response_format(o.get("response_format"))?,
    };
    if o.get("reasoning").is_some_and(|r| !r.is_null()) {
        return Err(Invalid::new(
            "reasoning",
            "`reasoning` belongs to the Responses API; on chat completions use `reasoning_effort`",
        ));
    }
    Ok(options)
}

/// `response_format`: `text` (or absent) asks for nothing; `json_object`; `json_schema` with
/// `json_schema.{name, schema, strict, description}`.
fn response_format(v: Option<&Value>) -> Result<Option<Box<compat::OutputFormat>>, Invalid> {
    const AT: &str = "response_format";
    let o = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(Invalid::new(AT, "`response_format` must be an object")),
    };
    match o.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Box::new(compat::OutputFormat::JsonObject))),
        Some("json_schema") => match o.get("json_schema") {
            Some(Value::Object(js)) => {
                compat::json_schema_format(js, "response_format.json_schema", true)
                    .map(|f| Some(Box::new(f)))
            }
            _ => Err(Invalid::new(
                "response_format.json_schema",
                "a json_schema response_format needs `json_schema`: {\"name\": …, \"schema\": {…}}",
            )),
        },
        other => Err(Invalid::new(
            "response_format.type",
            format!(
                "unknown response_format type {}: use \"text\", \"json_object\" or \"json_schema\"",
                short(&other.map_or("(none)".to_string(), |t| format!("{t:?}")))
            ),
        )),
    }
}

/// The system (and developer) texts and the turns of `messages`, in order.
fn conversation(messages: &[&RawValue]) -> Result<(Vec<String>, Vec<Turn>), Invalid> {
    let mut system = Vec::new();
    let mut turns: Vec<Turn> = Vec::new();
    for (i, raw) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let Value::Object(m) = compat::message_value(raw, &at)? else {
            return Err(Invalid::new(at, "each message must be an object"));
        };
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        match role {
            "system" | "developer" => system.push(text_of(m.get("content"), &at)?),
            "user" => {
                let (text, files) = user_content(m.get("content"), &at)?;
                turns.push(Turn {
                    message: user_message(text, &files),
                    files,
                    at: Vec::new(),
                });
            }
            "assistant" => turns.push(Turn::of(assistant_message(&m, &at)?)),
            "tool" => {
                let result = tool_message(&m, &at)?;
                compat::push_result(&mut turns, result, at);
            }
            "function" => {
                return Err(Invalid::new(
                    format!("{at}.role"),
                    "legacy `function` messages are not supported: send the result as a `tool` message with its `tool_call_id`",
                ));
            }
            other => {
                return Err(Invalid::new(
                    format!("{at}.role"),
                    format!(
                        "unknown role {:?}: use system, developer, user, assistant or tool",
                        short(other)
                    ),
                ));
            }
        }
    }
    Ok((system, turns))
}

/// A `tool` message: the result of the call `tool_call_id`.
fn tool_message(m: &Map<String, Value>, at: &str) -> Result<ToolResult, Invalid> {
    let id = match m.get("tool_call_id") {
        Some(Value::String(id)) if !id.is_empty() => id.clone(),
        _ => {
            return Err(Invalid::new(
                format!("{at}.tool_call_id"),
                "a tool message needs the `tool_call_id` of the call it answers",
            ));
        }
    };
    Ok(ToolResult {
        tool_call_id: id,
        content: text_of(m.get("content"), at)?,
        is_error: false,
        images: Vec::new(),
    })
}

/// An assistant turn of the history: its text and its tool calls.
fn assistant_message(m: &Map<String, Value>, at: &str) -> Result<Message, Invalid> {
    if m.get("function_call").is_some_and(|v| !v.is_null()) {
        return Err(Invalid::new(
            format!("{at}.function_call"),
            "the legacy `function_call` is not supported: send `tool_calls`",
        ));
    }
    let text = match m.get("content") {
        None | Some(Value::Null) => String::new(),
        c => text_of(c, at)?,
    };
    let mut message = compat::assistant_text(text);
    let calls = match m.get("tool_calls") {
        None | Some(Value::Null) => return Ok(message),
        Some(Value::Array(calls)) => calls,
        Some(_) => {
            return Err(Invalid::new(
                format!("{at}.tool_calls"),
                "`tool_calls` must be an array",
            ));
        }
    };
    if let Message::Assistant { tool_calls, .. } = &mut message {
        for (j, c) in calls.iter().enumerate() {
            tool_calls.push(history_call(c, &format!("{at}.tool_calls[{j}]"))?);
        }
    }
    Ok(message)
}

/// `{"id", "type": "function", "function": {"name", "arguments": "<JSON>"}}`.
fn history_call(c: &Value, at: &str) -> Result<ToolCall, Invalid> {
    let f = c.get("function");
    let (Some(id), Some(name), Some(arguments)) = (
        c.get("id").and_then(Value::as_str),
        f.and_then(|f| f.get("name")).and_then(Value::as_str),
        f.and_then(|f| f.get("arguments")).and_then(Value::as_str),
    ) else {
        return Err(Invalid::new(
            at,
            "a tool call needs `id`, `function.name` and `function.arguments` (a JSON string)",
        ));
    };
    let arguments = match arguments.trim() {
        "" => Value::Object(Map::new()),
        a => serde_json::from_str(a).map_err(|_| {
            Invalid::new(
                format!("{at}.function.arguments"),
                "`arguments` must be a JSON object encoded as a string",
            )
        })?,
    };
    compat::history_call(id, name, arguments, at)
}

/// A user turn of the history: its text, and a placeholder for each image or sound it had.
pub(super) fn user_message(text: String, files: &[CompatAttachment]) -> Message {
    let mut content = vec![UserBlock::Text { text }];
    for f in files {
        let what = if f.media_type.starts_with("audio/") {
            "audio"
        } else {
            "image"
        };
        content.push(UserBlock::Text {
            text: format!("[{what} sent by the client]"),
        });
    }
    Message::User { content }
}

/// A message's text: a string, or an array of text parts (joined by newlines).
fn text_of(content: Option<&Value>, at: &str) -> Result<String, Invalid> {
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => out.push(t.clone()),
                    (Some("refusal"), _) => {}
                    _ => {
                        return Err(Invalid::new(
                            format!("{at}.content[{j}]"),
                            "only text parts are supported here",
                        ));
                    }
                }
            }
            Ok(out.join("\n"))
        }
        _ => Err(Invalid::new(
            format!("{at}.content"),
            "must be a string or an array of content parts",
        )),
    }
}

/// A user message's text parts (joined by newlines), images (`data:` URLs only: agentd
/// fetches nothing a client names) and sounds (`input_audio`, base64 WAV or MP3: transcribed
/// by the intake when `[voice] stt_model` is set, SPEC §19).
fn user_content(
    content: Option<&Value>,
    at: &str,
) -> Result<(String, Vec<CompatAttachment>), Invalid> {
    let parts = match content {
        Some(Value::String(s)) => return Ok((s.clone(), Vec::new())),
        Some(Value::Array(parts)) => parts,
        _ => {
            return Err(Invalid::new(
                format!("{at}.content"),
                "must be a string or an array of content parts",
            ));
        }
    };
    let mut text = Vec::new();
    let mut images = Vec::new();
    for (j, p) in parts.iter().enumerate() {
        let here = format!("{at}.content[{j}]");
        match p.get("type").and_then(Value::as_str) {
            Some("text") => match p.get("text") {
                Some(Value::String(t)) => text.push(t.clone()),
                _ => return Err(Invalid::new(here, "a text part needs a string `text`")),
            },
            Some("image_url") => {
                let url = p
                    .get("image_url")
                    .and_then(|u| u.get("url"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        Invalid::new(&here, "an image_url part needs `image_url.url`")
                    })?;
                images.push(data_url(url).map_err(|m| Invalid::new(&here, m))?);
                at_most(&images, "image/", compat::MAX_IMAGES, "images", &here)?;
            }
            Some("input_audio") => {
                images.push(input_audio(p.get("input_audio")).map_err(|m| Invalid::new(&here, m))?);
                at_most(&images, "audio/", compat::MAX_AUDIO, "audio parts", &here)?;
            }
            Some(other) => {
                return Err(Invalid::new(
                    here,
                    format!(
                        "content parts of type {:?} are not supported: send text, images and input_audio",
                        short(other)
                    ),
                ));
            }
            None => return Err(Invalid::new(here, "a content part needs a `type`")),
        }
    }
    Ok((text.join("\n"), images))
}

/// Refuses a message with more than `max` attachments whose type starts with `kind`.
pub(super) fn at_most(
    files: &[CompatAttachment],
    kind: &str,
    max: usize,
    what: &str,
    here: &str,
) -> Result<(), Invalid> {
    let n = files
        .iter()
        .filter(|f| f.media_type.starts_with(kind))
        .count();
    if n > max {
        return Err(Invalid::new(
            here,
            format!("at most {max} {what} per message"),
        ));
    }
    Ok(())
}

/// `{"data": "<base64>", "format": "wav" | "mp3"}` → the sound.
fn input_audio(part: Option<&Value>) -> Result<CompatAttachment, String> {
    let media_type = match part.and_then(|a| a.get("format")).and_then(Value::as_str) {
        Some("wav") => "audio/wav",
        Some("mp3") => "audio/mpeg",
        Some(other) => {
            return Err(format!(
                "input_audio.format {:?} is not supported: use \"wav\" or \"mp3\"",
                short(other)
            ));
        }
        None => {
            return Err(
                "an input_audio part needs `input_audio.format` (\"wav\" or \"mp3\")".into(),
            );
        }
    };
    let data = part
        .and_then(|a| a.get("data"))
        .and_then(Value::as_str)
        .ok_or("an input_audio part needs `input_audio.data` (base64)")?;
    if !compat::is_base64(data) {
        return Err("the input_audio data is not valid base64".into());
    }
    Ok(CompatAttachment {
        media_type: media_type.to_string(),
        data: data.to_string(),
    })
}

/// `data:image/png;base64,<data>` → the image.
pub(super) fn data_url(url: &str) -> Result<CompatAttachment, String> {
    let Some(rest) = url.strip_prefix("data:") else {
        return Err(
            "only data: URLs are accepted for images (agentd does not fetch URLs for a client); send data:image/png;base64,…"
                .into(),
        );
    };
    let Some((media_type, data)) = rest.split_once(";base64,") else {
        return Err("an image data: URL must be base64 (data:<type>;base64,<data>)".into());
    };
    if !compat::is_image_type(media_type) {
        return Err(format!(
            "image type {:?} is not supported: use image/png, image/jpeg, image/gif or image/webp",
            short(media_type)
        ));
    }
    if !compat::is_base64(data) {
        return Err("the image data is not valid base64".into());
    }
    Ok(CompatAttachment {
        media_type: media_type.to_string(),
        data: data.to_string(),
    })
}

pub(super) fn opt_bool(o: &Map<String, Value>, key: &str) -> Result<Option<bool>, Invalid> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(Invalid::new(key, format!("`{key}` must be true or false"))),
    }
}

pub(super) fn opt_str(o: &Map<String, Value>, key: &str) -> Result<Option<String>, Invalid> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(Invalid::new(key, format!("`{key}` must be a string"))),
    }
}

pub(super) fn opt_u32(o: &Map<String, Value>, key: &str) -> Result<Option<u32>, Invalid> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) if n >= 1 => Ok(Some(n)),
            _ => Err(Invalid::new(
                key,
                format!(
                    "`{key}` must be a positive integer, got {}",
                    short(&v.to_string())
                ),
            )),
        },
    }
}

fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
    }
}

/// A call's arguments as OpenAI sends them: a JSON string.
fn arguments(c: &ToolCall) -> String {
    serde_json::to_string(&c.arguments).unwrap_or_else(|_| "{}".into())
}

/// `message.tool_calls`: `{"id", "type": "function", "function": {"name", "arguments"}}`.
fn tool_calls(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .map(|c| {
            json!({"id": c.id, "type": "function",
                   "function": {"name": c.name, "arguments": arguments(c)}})
        })
        .collect()
}

#[derive(Serialize)]
struct UsageWire {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    prompt_tokens_details: PromptDetails,
    completion_tokens_details: CompletionDetails,
}

#[derive(Serialize)]
struct PromptDetails {
    cached_tokens: u64,
    audio_tokens: u64,
}

#[derive(Serialize)]
struct CompletionDetails {
    reasoning_tokens: u64,
    audio_tokens: u64,
    accepted_prediction_tokens: u64,
    rejected_prediction_tokens: u64,
}

fn usage(r: &CompatReply) -> UsageWire {
    let u = OpenAiUsage::from(&r.usage);
    UsageWire {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        total_tokens: u.total_tokens,
        prompt_tokens_details: PromptDetails {
            cached_tokens: u.cached_tokens,
            audio_tokens: 0,
        },
        completion_tokens_details: CompletionDetails {
            reasoning_tokens: 0,
            audio_tokens: 0,
            accepted_prediction_tokens: 0,
            rejected_prediction_tokens: 0,
        },
    }
}

/// The answer's message: its text (null when the model only called tools) and the calls
/// of the client's tools.
fn message(r: &CompatReply) -> Value {
    let mut m = json!({"role": "assistant", "content": r.text, "refusal": null, "annotations": []});
    if !r.calls.is_empty() {
        if r.text.is_empty() {
            m["content"] = Value::Null;
        }
        m["tool_calls"] = tool_calls(&r.calls);
    }
    m
}

/// The `chat.completion` object.
pub fn completion_body(r: &CompatReply) -> Vec<u8> {
    let v = json!({
        "id": format!("chatcmpl-{}", r.id),
        "object": "chat.completion",
        "created": r.created,
        "model": r.model,
        "choices": [{
            "index": 0,
            "message": message(r),
            "logprobs": null,
            "finish_reason": finish_reason(r.finish),
        }],
        "usage": usage(r),
    });
    serde_json::to_vec(&v).unwrap_or_default()
}

/// The `list` of models: `agentd` and `agentd:<name>` per loaded model.
pub fn models_body(names: &[String], created: i64, owner: &str) -> Vec<u8> {
    let data: Vec<Value> = compat::model_ids(names)
        .map(|id| model_object(&id, created, owner))
        .collect();
    serde_json::to_vec(&json!({"object": "list", "data": data})).unwrap_or_default()
}

/// `GET /v1/models/{id}`: the model object of `id` if it is one of the listed ids.
pub fn model_body(names: &[String], id: &str, created: i64, owner: &str) -> Option<Vec<u8>> {
    compat::model_ids(names)
        .any(|m| m == id)
        .then(|| serde_json::to_vec(&model_object(id, created, owner)).unwrap_or_default())
}

fn model_object(id: &str, created: i64, owner: &str) -> Value {
    json!({"id": id, "object": "model", "created": created, "owned_by": owner})
}

/// The error envelope: `{"error": {"message", "type", "param", "code"}}`.
pub fn error_body(kind: ErrorKind, message: &str, param: Option<&str>) -> Vec<u8> {
    let (kind_name, code) = match kind {
        ErrorKind::InvalidRequest | ErrorKind::TooLarge => ("invalid_request_error", None),
        ErrorKind::Authentication => ("authentication_error", Some("invalid_api_key")),
        ErrorKind::NotFound => ("invalid_request_error", Some("not_found")),
        ErrorKind::Timeout => ("timeout_error", Some("timeout")),
        ErrorKind::Conflict => ("invalid_request_error", Some("idempotency_key_reused")),
        ErrorKind::Busy => ("rate_limit_error", Some("rate_limit_exceeded")),
        ErrorKind::Budget => ("insufficient_quota", Some("insufficient_quota")),
        ErrorKind::Upstream => ("server_error", Some("upstream_error")),
        ErrorKind::Unavailable => ("server_error", Some("unavailable")),
        ErrorKind::Interrupted => ("server_error", Some("interrupted")),
        ErrorKind::Internal => ("server_error", None),
    };
    serde_json::to_vec(&json!({
        "error": {"message": message, "type": kind_name, "param": param, "code": code}
    }))
    .unwrap_or_default()
}

/// The frames of one streamed answer (`text/event-stream`): a first chunk with the role,
/// content deltas, the last chunk with `finish_reason`, the usage chunk when asked for, then
/// `data: [DONE]`. Keep-alives are SSE comments.
pub struct ChunkStream {
    id: String,
    model: String,
    created: i64,
    include_usage: bool,
}

impl ChunkStream {
    pub fn new(id: &str, model: &str, created: i64, include_usage: bool) -> ChunkStream {
        ChunkStream {
            id: format!("chatcmpl-{id}"),
            model: model.to_string(),
            created,
            include_usage,
        }
    }

    fn chunk(&self, delta: Value, finish: Option<&str>) -> Vec<u8> {
        let v = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        // No `"usage": null` or `"logprobs": null` on these chunks: both are optional, and
        // the strictest readers want an optional field left out rather than null.
        frame(&v)
    }

    /// The first chunk: the assistant role.
    pub fn start(&self) -> Vec<u8> {
        self.chunk(json!({"role": "assistant", "content": ""}), None)
    }

    pub fn text(&self, text: &str) -> Vec<u8> {
        self.chunk(json!({"content": text}), None)
    }

    /// An SSE comment: keeps the connection and any proxy in front awake.
    pub fn keep_alive(&self) -> Vec<u8> {
        b": keep-alive\n\n".to_vec()
    }

    /// The calls of the client's tools (one chunk each, whole), the last chunk, the usage
    /// chunk when `include_usage`, and `[DONE]`.
    pub fn finish(&self, r: &CompatReply) -> Vec<u8> {
        let mut out = Vec::new();
        for (index, c) in r.calls.iter().enumerate() {
            out.extend(self.chunk(
                json!({"tool_calls": [{"index": index, "id": c.id, "type": "function",
                       "function": {"name": c.name, "arguments": arguments(c)}}]}),
                None,
            ));
        }
        out.extend(self.chunk(json!({}), Some(finish_reason(r.finish))));
        if self.include_usage {
            out.extend(frame(&json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage(r),
            })));
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        out
    }

    /// An error after the stream started: an error object (the SDKs raise it), then `[DONE]`.
    pub fn error(&self, kind: ErrorKind, message: &str) -> Vec<u8> {
        let mut out = b"data: ".to_vec();
        out.extend(error_body(kind, message, None));
        out.extend_from_slice(b"\n\ndata: [DONE]\n\n");
        out
    }
}

fn frame(v: &Value) -> Vec<u8> {
    let mut out = b"data: ".to_vec();
    out.extend(serde_json::to_vec(v).unwrap_or_default());
    out.extend_from_slice(b"\n\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Usage;
    use crate::message::call::ClientToolChoice;

    fn parse(v: Value) -> Result<CompatRequest, Invalid> {
        parse_request(&serde_json::to_vec(&v).unwrap())
    }

    /// SPEC §17 structured output: `response_format` into the neutral format; bad shapes are
    /// 400 naming the field.
    #[test]
    fn response_format_is_parsed_and_bad_shapes_name_the_field() {
        use crate::message::call::OutputFormat;
        let with = |f: Value| {
            parse(json!({"model": "agentd", "response_format": f,
                         "messages": [{"role": "user", "content": "hi"}]}))
        };
        assert_eq!(with(json!({"type": "text"})).unwrap().options.format, None);
        assert_eq!(
            with(json!({"type": "json_object"})).unwrap().options.format,
            Some(Box::new(OutputFormat::JsonObject))
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let r = with(json!({"type": "json_schema", "json_schema": {
            "name": "thing", "schema": schema, "strict": true, "description": "a thing"}}))
        .unwrap();
        assert_eq!(
            r.options.format.as_deref(),
            Some(&OutputFormat::JsonSchema {
                name: "thing".into(),
                schema: schema.clone(),
                strict: Some(true),
                description: Some("a thing".into()),
            })
        );
        let big =
            json!({"type": "object", "description": "x".repeat(compat::MAX_FORMAT_SCHEMA_BYTES)});
        for (f, param) in [
            (json!("json"), "response_format"),
            (json!({"type": "yaml"}), "response_format.type"),
            (
                json!({"type": "json_schema"}),
                "response_format.json_schema",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"schema": schema}}),
                "response_format.json_schema.name",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "a b", "schema": schema}}),
                "response_format.json_schema.name",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "t", "schema": "{}"}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "t"}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "t", "schema": big}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": "yes"}}),
                "response_format.json_schema.strict",
            ),
        ] {
            let e = with(f.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{f}: {e:?}");
        }
    }

    #[test]
    fn a_conversation_is_split_into_system_history_and_new_input() {
        let r = parse(json!({
            "model": "agentd",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": [{"type": "text", "text": "No emojis."}]},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}
                ]}
            ],
            "user": "alice",
            "max_completion_tokens": 300,
            "temperature": 0.2,
            "reasoning_effort": "low",
            "stream": true,
            "stream_options": {"include_usage": true},
            "top_p": 0.9
        }))
        .unwrap();
        assert_eq!(r.system.as_deref(), Some("Be brief.\n\nNo emojis."));
        assert_eq!(r.history.len(), 2);
        assert_eq!(r.text, "what is this?");
        assert_eq!(r.attachments.len(), 1);
        assert_eq!(r.attachments[0].media_type, "image/png");
        assert_eq!(r.session.as_deref(), Some("alice"));
        assert_eq!(r.options.max_tokens, Some(300));
        assert_eq!(r.options.temperature, Some(0.2));
        assert_eq!(r.options.effort.as_deref(), Some("low"));
        assert!(r.stream && r.include_usage);
    }

    #[test]
    fn input_audio_becomes_an_attachment_and_a_placeholder_in_the_history() {
        let r = parse(json!({
            "model": "agentd",
            "messages": [
                {"role": "user", "content": [
                    {"type": "input_audio", "input_audio": {"data": "aGVsbG8=", "format": "mp3"}}
                ]},
                {"role": "assistant", "content": "heard"},
                {"role": "user", "content": [
                    {"type": "text", "text": "and this?"},
                    {"type": "input_audio", "input_audio": {"data": "d29ybGQ=", "format": "wav"}}
                ]}
            ]
        }))
        .unwrap();
        assert_eq!(r.text, "and this?");
        assert_eq!(
            r.attachments,
            vec![CompatAttachment {
                media_type: "audio/wav".into(),
                data: "d29ybGQ=".into()
            }]
        );
        assert_eq!(
            r.history[0],
            Message::User {
                content: vec![
                    UserBlock::Text {
                        text: String::new()
                    },
                    UserBlock::Text {
                        text: "[audio sent by the client]".into()
                    }
                ]
            }
        );
        // A sound alone is a message (the intake turns it into text).
        let alone = parse(
            json!({"model": "agentd", "messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "aGVsbG8=", "format": "wav"}}]}]}),
        );
        assert_eq!(alone.unwrap().attachments.len(), 1);
    }

    #[test]
    fn client_tools_their_calls_and_results_are_parsed() {
        let r = parse(json!({
            "model": "agentd",
            "tools": [
                {"type": "function", "function": {"name": "lookup", "description": "Find a thing",
                 "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}, "strict": true}},
                {"type": "function", "function": {"name": "ping"}}
            ],
            "tool_choice": {"type": "function", "function": {"name": "lookup"}},
            "parallel_tool_calls": false,
            "messages": [
                {"role": "user", "content": "find x"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\":\"x\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "ping", "arguments": ""}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "found"},
                {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "pong"}]}
            ]
        }))
        .unwrap();
        assert_eq!(r.tools.len(), 2);
        assert_eq!(r.tools[0].description, "Find a thing");
        assert_eq!(r.tools[1].parameters, json!({"type": "object"}));
        assert_eq!(
            r.tool_choice,
            Some(ClientToolChoice::Tool {
                name: "lookup".into()
            })
        );
        assert_eq!(r.options.parallel_tool_calls, Some(false));
        assert_eq!(r.text, "");
        let results: Vec<(&str, &str, &str)> = r
            .tool_results
            .iter()
            .map(|t| {
                (
                    t.at.as_str(),
                    t.result.tool_call_id.as_str(),
                    t.result.content.as_str(),
                )
            })
            .collect();
        assert_eq!(
            results,
            [
                ("messages[2]", "call_1", "found"),
                ("messages[3]", "call_2", "pong")
            ]
        );
        assert_eq!(r.history.len(), 2);
        let calls = r.history[1].tool_calls();
        assert_eq!(calls[0].arguments, json!({"q": "x"}));
        assert_eq!(calls[1].arguments, json!({}));
        assert_eq!(compat::open_calls(&r.history), ["call_1", "call_2"]);

        // Results then a new user message: both are the new input.
        let r = parse(json!({"model": "agentd", "messages": [
            {"role": "user", "content": "find x"},
            {"role": "assistant", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "found"},
            {"role": "user", "content": "thanks, and now?"}
        ]}))
        .unwrap();
        assert_eq!(r.text, "thanks, and now?");
        assert_eq!(r.tool_results.len(), 1);

        // A history whose results do not follow their calls is refused.
        let e = parse(json!({"model": "agentd", "messages": [
            {"role": "user", "content": "a"},
            {"role": "tool", "tool_call_id": "nope", "content": "x"},
            {"role": "user", "content": "b"},
            {"role": "assistant", "content": "c"},
            {"role": "user", "content": "d"}
        ]}))
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"), "{e:?}");
        assert!(e.message.contains("`nope`"), "{e:?}");
        let e = parse(json!({"model": "agentd", "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "not json"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "x"}
        ]}))
        .unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some("messages[1].tool_calls[0].function.arguments")
        );
    }

    #[test]
    fn safety_identifier_wins_over_user() {
        let r = parse(
            json!({"model": "agentd", "user": "u", "safety_identifier": "s",
            "messages": [{"role": "user", "content": "x"}]}),
        )
        .unwrap();
        assert_eq!(r.session.as_deref(), Some("s"));
    }

    #[test]
    fn no_tools_with_a_tool_choice_of_none_or_auto_is_accepted() {
        let msgs = json!([{"role": "user", "content": "x"}]);
        for choice in ["none", "auto"] {
            let body = json!({"model": "agentd", "messages": msgs, "tools": [],
                              "tool_choice": choice, "function_call": choice});
            assert!(parse(body).is_ok(), "{choice}");
        }
    }

    #[test]
    fn client_tools_and_bad_fields_are_refused_with_the_field() {
        let msgs = json!([{"role": "user", "content": "x"}]);
        let cases = [
            (
                json!({"model": "agentd", "messages": msgs, "tools": [{"type": "function"}]}),
                "tools[0].function",
            ),
            (
                json!({"model": "agentd", "messages": msgs, "tools": [{"type": "custom", "custom": {"name": "x"}}]}),
                "tools[0].type",
            ),
            (
                json!({"model": "agentd", "messages": msgs, "tools": [
                    {"type": "function", "function": {"name": "bad name"}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"model": "agentd", "messages": msgs, "tools": [
                    {"type": "function", "function": {"name": "a", "parameters": {"type": "string"}}}]}),
                "tools[0].function.parameters",
            ),
            (
                json!({"model": "agentd", "messages": msgs, "tools": [
                    {"type": "function", "function": {"name": "a"}},
                    {"type": "function", "function": {"name": "a"}}]}),
                "tools[1]",
            ),
            (
                json!({"model": "agentd", "messages": msgs, "tools": [
                    {"type": "function", "function": {"name": "a"}}],
                    "tool_choice": {"type": "function", "function": {"name": "b"}}}),
                "tool_choice",
            ),
            (
                json!({"model": "agentd", "messages": msgs, "tool_choice": "required"}),
                "tool_choice",
            ),
            (
                json!({"model": "agentd", "messages": msgs, "functions": [{}]}),
                "functions",
            ),
            (json!({"messages": msgs}), "model"),
            (json!({"model": "agentd", "messages": msgs, "n": 2}), "n"),
            (
                json!({"model": "agentd", "messages": msgs, "temperature": 3}),
                "temperature",
            ),
            (
                json!({"model": "agentd", "messages": msgs, "max_tokens": 0}),
                "max_tokens",
            ),
            (
                json!({"model": "agentd", "messages": msgs, "reasoning_effort": "huge"}),
                "reasoning_effort",
            ),
            (
                json!({"model": "agentd", "messages": msgs, "reasoning": {"effort": "low"}}),
                "reasoning",
            ),
            (json!({"model": "agentd", "messages": []}), "messages"),
            (
                json!({"model": "agentd", "messages": [{"role": "assistant", "content": "x"}]}),
                "messages",
            ),
            (
                json!({"model": "agentd", "messages": [{"role": "function", "content": "x", "name": "f"}]}),
                "messages[0].role",
            ),
            (
                json!({"model": "agentd", "messages": [{"role": "tool", "content": "x"}]}),
                "messages[0].tool_call_id",
            ),
            (
                json!({"model": "agentd", "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"model": "agentd", "messages": [{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {}}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"model": "agentd", "messages": [{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": "aGVsbG8=", "format": "flac"}}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"model": "agentd", "messages": [{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": "not base64!", "format": "wav"}}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"model": "agentd", "messages": [{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": "aGVsbG8=", "format": "wav"}},
                {"type": "input_audio", "input_audio": {"data": "aGVsbG8=", "format": "wav"}},
                {"type": "input_audio", "input_audio": {"data": "aGVsbG8=", "format": "mp3"}}]}]}),
                "messages[0].content[2]",
            ),
        ];
        for (body, param) in cases {
            let e = parse(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        }
        let e = parse(json!({"model": "agentd", "messages": msgs, "functions": [{}]})).unwrap_err();
        assert!(
            e.message.contains("send the same definitions as `tools`"),
            "{e:?}"
        );
        // An empty tools list asks for nothing.
        assert!(parse(json!({"model": "agentd", "messages": msgs, "tools": []})).is_ok());
        assert!(parse_request(b"{").is_err());
    }

    #[test]
    fn a_message_may_have_at_most_400_content_parts() {
        let parts = |n: usize| {
            json!({"model": "agentd", "messages": [
                {"role": "user", "content": vec![json!({"type": "text", "text": "a"}); n]}
            ]})
        };
        assert!(parse(parts(compat::MAX_PARTS)).is_ok());
        let e = parse(parts(compat::MAX_PARTS + 1)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0]"), "{e:?}");
        assert!(e.message.contains("at most 400 content parts"), "{e:?}");
        let many = vec![json!({"role": "user", "content": "hi"}); compat::MAX_MESSAGES + 1];
        let e = parse(json!({"model": "agentd", "messages": many})).unwrap_err();
        assert!(e.message.contains("1 to 1000 messages"), "{e:?}");
        let e = parse(json!({"model": "agentd", "messages": []})).unwrap_err();
        assert!(e.message.contains("1 to 1000 messages"), "{e:?}");
        let e = parse(json!({"model": "agentd", "messages": "hi"})).unwrap_err();
        assert!(e.message.contains("must be an array"), "{e:?}");
        let e = parse_request(b"[1]").unwrap_err();
        assert!(e.message.contains("must be a JSON object"), "{e:?}");
    }

    fn reply() -> CompatReply {
        CompatReply {
            id: "abc".into(),
            session_id: String::new(),
            model: "agentd".into(),
            created: 1_700_000_000,
            text: "Hi".into(),
            calls: vec![],
            finish: FinishReason::Stop,
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                cache_read_tokens: 100,
                cache_write_tokens: 20,
                cache_write_1h_tokens: 0,
            },
        }
    }

    #[test]
    fn the_completion_carries_usage_as_the_spec_maps_it() {
        let v: Value = serde_json::from_slice(&completion_body(&reply())).unwrap();
        assert_eq!(v["id"], "chatcmpl-abc");
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"]["content"], "Hi");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(v["usage"]["prompt_tokens"], 130);
        assert_eq!(v["usage"]["completion_tokens"], 5);
        assert_eq!(v["usage"]["total_tokens"], 135);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 100);
    }

    #[test]
    fn the_stream_ends_with_usage_and_done() {
        let s = ChunkStream::new("abc", "agentd", 1, true);
        let mut all = s.start();
        all.extend(s.keep_alive());
        all.extend(s.text("Hi"));
        all.extend(s.finish(&reply()));
        let text = String::from_utf8(all).unwrap();
        let datas: Vec<&str> = text
            .split("\n\n")
            .filter_map(|f| f.strip_prefix("data: "))
            .collect();
        assert_eq!(*datas.last().unwrap(), "[DONE]");
        let usage: Value = serde_json::from_str(datas[datas.len() - 2]).unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["prompt_tokens"], 130);
        let last: Value = serde_json::from_str(datas[datas.len() - 3]).unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        assert!(text.contains(": keep-alive\n\n"));
    }

    #[test]
    fn errors_use_openai_envelope() {
        let v: Value =
            serde_json::from_slice(&error_body(ErrorKind::Budget, "daily budget reached", None))
                .unwrap();
        assert_eq!(v["error"]["type"], "insufficient_quota");
        assert_eq!(v["error"]["message"], "daily budget reached");
        let v: Value =
            serde_json::from_slice(&error_body(ErrorKind::InvalidRequest, "x", Some("tools")))
                .unwrap();
        assert_eq!(v["error"]["param"], "tools");
    }

    #[test]
    fn models_lists_the_default_and_each_model() {
        let v: Value =
            serde_json::from_slice(&models_body(&["primary".into(), "cheap".into()], 5, "kira"))
                .unwrap();
        let ids: Vec<&str> = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["agentd", "agentd:primary", "agentd:cheap"]);
        assert_eq!(v["object"], "list");
    }
}
