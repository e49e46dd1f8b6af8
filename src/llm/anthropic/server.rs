//! The server side of Anthropic's Messages wire format (SPEC §17): the request body of
//! `POST /v1/messages` into a neutral [`CompatRequest`], and the answers back: the `message`
//! object, the event stream (`message_start`, `content_block_start`/`delta`/`stop`,
//! `message_delta` with usage, `message_stop`, `ping` keep-alives) and the error envelope.
//! Only this module (with the client beside it) knows Anthropic's JSON.

use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::llm::compat::{
    self, CompatAttachment, CompatReply, CompatRequest, ErrorKind, FinishReason, Invalid, Turn,
    short,
};
use crate::message::call::{CallOptions, ClientThinking, ClientTool, ClientToolChoice, EFFORTS};
use crate::message::{Message, ToolCall, ToolResult, Usage, UserBlock};

/// The route of the endpoint.
pub const MESSAGES_PATH: &str = "/v1/messages";

/// The header Anthropic clients send the key in.
pub const API_KEY_HEADER: &str = "x-api-key";

/// Fields agentd does not honour: refused with the reason.
const REFUSED: &[(&str, &str)] = &[(
    "mcp_servers",
    "`mcp_servers` is not supported: agentd connects to its own MCP servers ([mcp.servers]); define the client's tools in `tools`",
)];

/// Parses a request body. Fields that change nothing the agent does (`top_p`, `top_k`,
/// `stop_sequences`, `service_tier`, …) are ignored; fields it cannot honour are refused with
/// the reason.
pub fn parse_request(body: &[u8]) -> Result<CompatRequest, Invalid> {
    let compat::RequestObject {
        fields: o,
        messages,
        model,
    } = compat::request_object(body, REFUSED)?;
    let stream = match o.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(Invalid::new("stream", "`stream` must be true or false")),
    };
    let max_tokens = max_tokens(&o)?;
    let thinking = match o.get("thinking") {
        None | Some(Value::Null) => None,
        Some(t) => Some(thinking(t, max_tokens)?),
    };
    let effort = effort(&o)?;
    let session = session(&o)?;
    let system = match o.get("system") {
        None | Some(Value::Null) => None,
        Some(s) => Some(text_blocks(s, "system")?),
    };
    let tools = client_tools(&o)?;
    let (tool_choice, parallel_tool_calls) = tool_choice(&o)?;
    compat::check_tool_choice(tool_choice.as_ref(), &tools, "tool_choice")?;
    let messages = compat::message_list(messages)?;
    let mut turns = conversation(&messages)?;
    let input = compat::new_input(
        &mut turns,
        messages.len(),
        "the last message must be a user message (text, images or tool results): it is the new input (prefilling the assistant's answer is not supported)",
    )?;
    let history = compat::normalise_history(turns.into_iter().map(|t| t.message).collect());
    compat::check_history(&history)?;
    Ok(CompatRequest {
        model,
        session,
        system: system.filter(|s| !s.trim().is_empty()),
        history,
        text: input.text,
        tool_results: input.tool_results,
        tools,
        tool_choice,
        attachments: input.attachments,
        options: CallOptions {
            max_tokens,
            temperature: compat::temperature(o.get("temperature"), 1.0)?,
            effort,
            thinking,
            format: output_format(&o)?,
            parallel_tool_calls,
        },
        stream,
        include_usage: true,
        continuation: compat::Continuation::default(),
    })
}

/// `tools`: custom tools (`name`, `description`, `input_schema`); a server tool (a `type`
/// like `web_search_20250305`) is refused naming it.
fn client_tools(o: &Map<String, Value>) -> Result<Vec<ClientTool>, Invalid> {
    let list = match o.get("tools") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(Invalid::new("tools", "`tools` must be an array")),
    };
    let mut tools = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        match t.get("type") {
            None | Some(Value::Null) => {}
            Some(Value::String(k)) if k == "custom" => {}
            Some(other) => {
                return Err(Invalid::new(
                    format!("{at}.type"),
                    format!(
                        "the server tool {} is not supported: agentd runs its own tools; define the client's tools as custom tools (name, description, input_schema)",
                        short(&other.to_string())
                    ),
                ));
            }
        }
        if t.get("input_schema").is_none() {
            return Err(Invalid::new(
                format!("{at}.input_schema"),
                "a custom tool needs an `input_schema`",
            ));
        }
        tools.push(compat::client_tool(
            &at,
            t.get("name"),
            t.get("description"),
            t.get("input_schema"),
            "input_schema",
        )?);
    }
    compat::check_client_tools(&tools, "tools")?;
    Ok(tools)
}

/// `tool_choice`: `{"type": "auto" | "any" | "none"}` or `{"type": "tool", "name"}`, each
/// with an optional `disable_parallel_tool_use`.
fn tool_choice(
    o: &Map<String, Value>,
) -> Result<(Option<ClientToolChoice>, Option<bool>), Invalid> {
    let Some(v) = o.get("tool_choice").filter(|v| !v.is_null()) else {
        return Ok((None, None));
    };
    let parallel = match v.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(off)) => Some(!off),
        Some(_) => {
            return Err(Invalid::new(
                "tool_choice.disable_parallel_tool_use",
                "`disable_parallel_tool_use` must be true or false",
            ));
        }
    };
    let choice = match v.get("type").and_then(Value::as_str) {
        Some("auto") => ClientToolChoice::Auto,
        Some("any") => ClientToolChoice::Required,
        Some("none") => ClientToolChoice::None,
        Some("tool") => match v.get("name").and_then(Value::as_str) {
            Some(name) => ClientToolChoice::Tool {
                name: name.to_string(),
            },
            None => {
                return Err(Invalid::new(
                    "tool_choice.name",
                    "a `tool_choice` of type \"tool\" needs the tool's `name`",
                ));
            }
        },
        _ => {
            return Err(Invalid::new(
                "tool_choice.type",
                "`tool_choice.type` must be \"auto\", \"any\", \"tool\" or \"none\"",
            ));
        }
    };
    Ok((Some(choice), parallel))
}

/// `max_tokens`: a positive integer, or absent.
fn max_tokens(o: &Map<String, Value>) -> Result<Option<u32>, Invalid> {
    match o.get("max_tokens") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) if n >= 1 => Ok(Some(n)),
            _ => Err(Invalid::new(
                "max_tokens",
                format!(
                    "`max_tokens` must be a positive integer, got {}",
                    short(&v.to_string())
                ),
            )),
        },
    }
}

/// `output_config.effort`: one of [`EFFORTS`], or absent.
fn effort(o: &Map<String, Value>) -> Result<Option<String>, Invalid> {
    match o.get("output_config").and_then(|c| c.get("effort")) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(e)) if EFFORTS.contains(&e.as_str()) => Ok(Some(e.clone())),
        Some(e) => Err(Invalid::new(
            "output_config.effort",
            format!(
                "unknown effort {}: use one of {}",
                short(&e.to_string()),
                EFFORTS.join(", ")
            ),
        )),
    }
}

/// `output_config.format` (`{"type": "json_schema", "schema": {…}}`), or the deprecated
/// top-level `output_format` of the same shape; not both.
fn output_format(o: &Map<String, Value>) -> Result<Option<Box<compat::OutputFormat>>, Invalid> {
    let current = o.get("output_config").and_then(|c| c.get("format"));
    let old = o.get("output_format");
    let (at, v) = match (current, old) {
        (None | Some(Value::Null), None | Some(Value::Null)) => return Ok(None),
        (Some(v), None | Some(Value::Null)) if !v.is_null() => ("output_config.format", v),
        (None | Some(Value::Null), Some(v)) => ("output_format", v),
        _ => {
            return Err(Invalid::new(
                "output_format",
                "send the format once: `output_config.format` (`output_format` is its deprecated name)",
            ));
        }
    };
    let Value::Object(f) = v else {
        return Err(Invalid::new(at, format!("`{at}` must be an object")));
    };
    if f.get("type").and_then(Value::as_str) != Some("json_schema") {
        return Err(Invalid::new(
            format!("{at}.type"),
            "the only format type is \"json_schema\": {\"type\": \"json_schema\", \"schema\": {…}}",
        ));
    }
    compat::json_schema_format(f, at, false).map(|f| Some(Box::new(f)))
}

/// `metadata.user_id`, the session (none when blank).
fn session(o: &Map<String, Value>) -> Result<Option<String>, Invalid> {
    match o.get("metadata").and_then(|m| m.get("user_id")) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.clone())),
        Some(Value::String(_)) => Ok(None),
        Some(_) => Err(Invalid::new(
            "metadata.user_id",
            "`metadata.user_id` must be a string",
        )),
    }
}

/// The turns of `messages`, in order: user messages (with a placeholder for each image),
/// the tool results a user message carries (before its text, as Anthropic orders them), and
/// assistant messages with their tool calls.
fn conversation(messages: &[&RawValue]) -> Result<Vec<Turn>, Invalid> {
    let mut turns: Vec<Turn> = Vec::new();
    for (i, raw) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let Value::Object(m) = compat::message_value(raw, &at)? else {
            return Err(Invalid::new(at, "each message must be an object"));
        };
        match m.get("role").and_then(Value::as_str) {
            Some("user") => {
                let b = content(&m, &at, true)?;
                let only_results =
                    !b.results.is_empty() && b.text.is_empty() && b.images.is_empty();
                for (result, at) in b.results {
                    compat::push_result(&mut turns, result, at);
                }
                if only_results {
                    continue;
                }
                let mut blocks = vec![UserBlock::Text { text: b.text }];
                for _ in &b.images {
                    blocks.push(UserBlock::Text {
                        text: "[image sent by the client]".into(),
                    });
                }
                turns.push(Turn {
                    message: Message::User { content: blocks },
                    files: b.images,
                    at: Vec::new(),
                });
            }
            Some("assistant") => {
                let b = content(&m, &at, false)?;
                let mut message = compat::assistant_text(b.text);
                if let Message::Assistant { tool_calls, .. } = &mut message {
                    *tool_calls = b.calls;
                }
                turns.push(Turn::of(message));
            }
            _ => {
                return Err(Invalid::new(
                    format!("{at}.role"),
                    "`role` must be \"user\" or \"assistant\"",
                ));
            }
        }
    }
    Ok(turns)
}

/// `thinking`: `{"type": "enabled", "budget_tokens": n}` (n ≥ 1024, below `max_tokens`),
/// `{"type": "disabled"}` or `{"type": "adaptive"}`.
fn thinking(t: &Value, max_tokens: Option<u32>) -> Result<ClientThinking, Invalid> {
    match t.get("type").and_then(Value::as_str) {
        Some("disabled") => Ok(ClientThinking::Disabled),
        Some("adaptive") => Ok(ClientThinking::Adaptive),
        Some("enabled") => {
            let budget = t
                .get("budget_tokens")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n >= 1024)
                .ok_or_else(|| {
                    Invalid::new(
                        "thinking.budget_tokens",
                        "`budget_tokens` must be an integer of at least 1024",
                    )
                })?;
            if max_tokens.is_some_and(|m| budget >= m) {
                return Err(Invalid::new(
                    "thinking.budget_tokens",
                    "`budget_tokens` must be below `max_tokens`",
                ));
            }
            Ok(ClientThinking::Enabled {
                budget_tokens: budget,
            })
        }
        _ => Err(Invalid::new(
            "thinking.type",
            "`thinking.type` must be \"enabled\", \"disabled\" or \"adaptive\"",
        )),
    }
}

/// A string, or text blocks (joined by newlines).
fn text_blocks(v: &Value, at: &str) -> Result<String, Invalid> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = Vec::new();
            for (j, b) in blocks.iter().enumerate() {
                match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(t))) => out.push(t.clone()),
                    _ => {
                        return Err(Invalid::new(
                            format!("{at}[{j}]"),
                            "only text blocks are supported here",
                        ));
                    }
                }
            }
            Ok(out.join("\n"))
        }
        _ => Err(Invalid::new(
            at,
            "must be a string or an array of text blocks",
        )),
    }
}

/// What one message's content blocks hold.
#[derive(Default)]
struct Blocks {
    /// The text blocks, joined by newlines.
    text: String,
    /// A user message's images.
    images: Vec<CompatAttachment>,
    /// An assistant message's `tool_use` blocks.
    calls: Vec<ToolCall>,
    /// A user message's `tool_result` blocks, with where each was.
    results: Vec<(ToolResult, String)>,
}

/// A message's content blocks: text (and for a user message images and tool results, for an
/// assistant message tool calls); thinking blocks of assistant messages are skipped; server
/// tool blocks are refused.
fn content(m: &Map<String, Value>, at: &str, user: bool) -> Result<Blocks, Invalid> {
    let list = match m.get("content") {
        Some(Value::String(s)) => {
            return Ok(Blocks {
                text: s.clone(),
                ..Blocks::default()
            });
        }
        Some(Value::Array(list)) => list,
        _ => {
            return Err(Invalid::new(
                format!("{at}.content"),
                "must be a string or an array of content blocks",
            ));
        }
    };
    let mut text = Vec::new();
    let mut b = Blocks::default();
    for (j, block) in list.iter().enumerate() {
        let here = format!("{at}.content[{j}]");
        match block.get("type").and_then(Value::as_str) {
            Some("text") => match block.get("text") {
                Some(Value::String(t)) => text.push(t.clone()),
                _ => return Err(Invalid::new(here, "a text block needs a string `text`")),
            },
            Some("image") if user => {
                b.images
                    .push(image(block).map_err(|m| Invalid::new(&here, m))?);
                if b.images.len() > compat::MAX_IMAGES {
                    return Err(Invalid::new(
                        here,
                        format!("at most {} images per message", compat::MAX_IMAGES),
                    ));
                }
            }
            Some("tool_result") if user => {
                let result = tool_result(block, &here)?;
                b.results.push((result, here));
            }
            Some("tool_use") if !user => b.calls.push(tool_use(block, &here)?),
            Some("thinking" | "redacted_thinking") if !user => {}
            Some(kind @ ("tool_use" | "tool_result")) => {
                return Err(Invalid::new(
                    here,
                    format!(
                        "`{kind}` blocks belong in {} messages",
                        if user { "assistant" } else { "user" }
                    ),
                ));
            }
            Some(other) => {
                return Err(Invalid::new(
                    here,
                    format!(
                        "content blocks of type {:?} are not supported here: send text{}",
                        short(other),
                        if user {
                            ", images and tool results"
                        } else {
                            " and tool calls"
                        }
                    ),
                ));
            }
            None => return Err(Invalid::new(here, "a content block needs a `type`")),
        }
    }
    b.text = text.join("\n");
    Ok(b)
}

/// A `tool_use` block of the history: `{"id", "name", "input"}`.
fn tool_use(block: &Value, at: &str) -> Result<ToolCall, Invalid> {
    let (Some(id), Some(name)) = (
        block.get("id").and_then(Value::as_str),
        block.get("name").and_then(Value::as_str),
    ) else {
        return Err(Invalid::new(
            at,
            "a tool_use block needs `id`, `name` and `input`",
        ));
    };
    let input = block
        .get("input")
        .cloned()
        .unwrap_or(Value::Object(Map::new()));
    compat::history_call(id, name, input, at)
}

/// A `tool_result` block: `{"tool_use_id", "content"?: text or blocks, "is_error"?}`; an
/// image in it becomes a placeholder.
fn tool_result(block: &Value, at: &str) -> Result<ToolResult, Invalid> {
    let Some(id) = block.get("tool_use_id").and_then(Value::as_str) else {
        return Err(Invalid::new(
            format!("{at}.tool_use_id"),
            "a tool_result block needs the `tool_use_id` of the call it answers",
        ));
    };
    let content = match block.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut out = Vec::new();
            for (k, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => out.push(t.clone()),
                    (Some("image"), _) => out.push("[image returned by the tool]".into()),
                    _ => {
                        return Err(Invalid::new(
                            format!("{at}.content[{k}]"),
                            "a tool result may hold text and image blocks",
                        ));
                    }
                }
            }
            out.join("\n")
        }
        Some(_) => {
            return Err(Invalid::new(
                format!("{at}.content"),
                "must be a string or an array of content blocks",
            ));
        }
    };
    let is_error = match block.get("is_error") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(Invalid::new(
                format!("{at}.is_error"),
                "`is_error` must be true or false",
            ));
        }
    };
    Ok(ToolResult {
        tool_call_id: id.to_string(),
        content,
        is_error,
        images: Vec::new(),
    })
}

/// An image block with a base64 source (agentd fetches nothing a client names).
fn image(b: &Value) -> Result<CompatAttachment, String> {
    let source = b.get("source").ok_or("an image block needs a `source`")?;
    if source.get("type").and_then(Value::as_str) != Some("base64") {
        return Err(
            "only base64 image sources are accepted (agentd does not fetch URLs for a client)"
                .into(),
        );
    }
    let media_type = source
        .get("media_type")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !compat::is_image_type(media_type) {
        return Err(format!(
            "image media_type {:?} is not supported: use image/png, image/jpeg, image/gif or image/webp",
            short(media_type)
        ));
    }
    let data = source.get("data").and_then(Value::as_str).unwrap_or("");
    if !compat::is_base64(data) {
        return Err("the image data is not valid base64".into());
    }
    Ok(CompatAttachment {
        media_type: media_type.to_string(),
        data: data.to_string(),
    })
}

fn stop_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "end_turn",
        FinishReason::Length => "max_tokens",
        FinishReason::ToolCalls => "tool_use",
    }
}

/// A call of a client tool as a `tool_use` block.
fn tool_use_block(c: &ToolCall) -> Value {
    json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments,
           "caller": {"type": "direct"}})
}

/// Usage as Anthropic reports it: uncached input, cache reads and cache writes apart (the
/// fields Anthropic's `Usage` requires and agentd does not know are null).
fn usage(u: &Usage) -> Value {
    json!({
        "input_tokens": u.input_tokens,
        "output_tokens": u.output_tokens,
        "cache_creation_input_tokens": u.cache_write_tokens,
        "cache_read_input_tokens": u.cache_read_tokens,
        "cache_creation": null,
        "inference_geo": null,
        "server_tool_use": null,
        "service_tier": null,
    })
}

/// The `message` object with `content`, `stop_reason` and `usage`.
fn message(id: &str, model: &str, content: Value, stop: Option<&str>, u: &Usage) -> Value {
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "stop_details": null,
        "container": null,
        "usage": usage(u),
    })
}

/// The answer's content blocks: its text (left out when the model only called tools), then
/// a `tool_use` block per call of a client tool.
fn answer_content(r: &CompatReply) -> Value {
    let mut blocks = Vec::new();
    if !r.text.is_empty() || r.calls.is_empty() {
        // `citations` is required by the published schema, and strict clients (the AI SDK)
        // refuse `null` there: an empty list satisfies both.
        blocks.push(json!({"type": "text", "text": r.text, "citations": []}));
    }
    blocks.extend(r.calls.iter().map(tool_use_block));
    Value::Array(blocks)
}

/// The `message` object.
pub fn message_body(r: &CompatReply) -> Vec<u8> {
    serde_json::to_vec(&message(
        &format!("msg_{}", r.id),
        &r.model,
        answer_content(r),
        Some(stop_reason(r.finish)),
        &r.usage,
    ))
    .unwrap_or_default()
}

/// The header Anthropic clients name their API version in (every request of theirs).
pub const VERSION_HEADER: &str = "anthropic-version";

/// The route of the token count.
pub const COUNT_TOKENS_PATH: &str = "/v1/messages/count_tokens";

/// The answer of `POST /v1/messages/count_tokens`.
pub fn count_tokens_body(input_tokens: u64) -> Vec<u8> {
    serde_json::to_vec(&json!({"input_tokens": input_tokens})).unwrap_or_default()
}

/// Anthropic's model object for `id` (`created_at` RFC 3339). The limits are left null: a
/// routed id may change model with the config.
fn model_object(id: &str, created_at: &str) -> Value {
    json!({"type": "model", "id": id, "display_name": id, "created_at": created_at,
           "capabilities": null, "max_input_tokens": null, "max_tokens": null})
}

/// `GET /v1/models` for Anthropic clients (they send `anthropic-version`): one page of all.
pub fn models_body(names: &[String], created_at: &str) -> Vec<u8> {
    let data: Vec<Value> = compat::model_ids(names)
        .map(|id| model_object(&id, created_at))
        .collect();
    let first = data.first().map(|m| m["id"].clone());
    let last = data.last().map(|m| m["id"].clone());
    serde_json::to_vec(
        &json!({"data": data, "first_id": first, "last_id": last, "has_more": false}),
    )
    .unwrap_or_default()
}

/// `GET /v1/models/{id}` for Anthropic clients: the model object of a listed id.
pub fn model_body(names: &[String], id: &str, created_at: &str) -> Option<Vec<u8>> {
    compat::model_ids(names)
        .any(|m| m == id)
        .then(|| serde_json::to_vec(&model_object(id, created_at)).unwrap_or_default())
}

/// The error envelope: `{"type": "error", "error": {"type", "message"}}`.
pub fn error_body(kind: ErrorKind, message: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "type": "error",
        "error": {"type": error_type(kind), "message": message},
        "request_id": null,
    }))
    .unwrap_or_default()
}

fn error_type(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidRequest | ErrorKind::TooLarge | ErrorKind::Conflict => {
            "invalid_request_error"
        }
        ErrorKind::Authentication => "authentication_error",
        ErrorKind::NotFound => "not_found_error",
        ErrorKind::Timeout => "timeout_error",
        ErrorKind::Busy | ErrorKind::Budget => "rate_limit_error",
        ErrorKind::Upstream | ErrorKind::Internal => "api_error",
        ErrorKind::Unavailable => "overloaded_error",
        ErrorKind::Interrupted => "api_error",
    }
}

/// The events of one streamed answer: `message_start` and `content_block_start` at once,
/// `content_block_delta` per piece of text, `ping` as keep-alive, then `content_block_stop`,
/// `message_delta` (stop reason and usage) and `message_stop`.
pub struct EventStream {
    id: String,
    model: String,
}

impl EventStream {
    pub fn new(id: &str, model: &str) -> EventStream {
        EventStream {
            id: format!("msg_{id}"),
            model: model.to_string(),
        }
    }

    /// `message_start` (usage still zero: it is known at the end) and the text block's start.
    pub fn start(&self) -> Vec<u8> {
        let start = message(&self.id, &self.model, json!([]), None, &Usage::default());
        let mut out = event(
            "message_start",
            &json!({"type": "message_start", "message": start}),
        );
        out.extend(event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": "", "citations": []}}),
        ));
        out
    }

    pub fn text(&self, text: &str) -> Vec<u8> {
        event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": text}}),
        )
    }

    pub fn keep_alive(&self) -> Vec<u8> {
        event("ping", &json!({"type": "ping"}))
    }

    /// The text block's stop, a `tool_use` block per call of a client tool (its input as
    /// one `input_json_delta`), `message_delta` and `message_stop`.
    pub fn finish(&self, r: &CompatReply) -> Vec<u8> {
        let mut out = event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": 0}),
        );
        for (i, c) in r.calls.iter().enumerate() {
            let index = i + 1;
            let mut start = tool_use_block(c);
            start["input"] = json!({});
            out.extend(event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": index, "content_block": start}),
            ));
            out.extend(event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta",
                                  "partial_json": serde_json::to_string(&c.arguments).unwrap_or_default()}}),
            ));
            out.extend(event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
        }
        out.extend(event(
            "message_delta",
            &json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason(r.finish), "stop_sequence": null,
                      "stop_details": null, "container": null},
            "usage": {
                "input_tokens": r.usage.input_tokens,
                "output_tokens": r.usage.output_tokens,
                "cache_creation_input_tokens": r.usage.cache_write_tokens,
                "cache_read_input_tokens": r.usage.cache_read_tokens,
                "server_tool_use": null,
            }}),
        ));
        out.extend(event("message_stop", &json!({"type": "message_stop"})));
        out
    }

    /// An `error` event after the stream started (the SDKs raise it).
    pub fn error(&self, kind: ErrorKind, message: &str) -> Vec<u8> {
        let mut out = b"event: error\ndata: ".to_vec();
        out.extend(error_body(kind, message));
        out.extend_from_slice(b"\n\n");
        out
    }
}

fn event(name: &str, data: &Value) -> Vec<u8> {
    let mut out = format!("event: {name}\ndata: ").into_bytes();
    out.extend(serde_json::to_vec(data).unwrap_or_default());
    out.extend_from_slice(b"\n\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Usage;

    fn parse(v: Value) -> Result<CompatRequest, Invalid> {
        parse_request(&serde_json::to_vec(&v).unwrap())
    }

    /// SPEC §17 structured output: `output_config.format` (or the deprecated `output_format`)
    /// into the neutral format, beside the effort; bad shapes are 400 naming the field.
    #[test]
    fn output_config_format_is_parsed_and_bad_shapes_name_the_field() {
        use crate::message::call::OutputFormat;
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let with = |extra: Value| {
            let mut body = json!({"model": "agentd", "max_tokens": 100,
                                  "messages": [{"role": "user", "content": "hi"}]});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            parse(body)
        };
        let expected = Some(&OutputFormat::JsonSchema {
            name: compat::DEFAULT_FORMAT_NAME.into(),
            schema: schema.clone(),
            strict: None,
            description: None,
        });
        let r = with(json!({"output_config": {"effort": "low",
                                              "format": {"type": "json_schema", "schema": schema}}}))
        .unwrap();
        assert_eq!(r.options.format.as_deref(), expected);
        assert_eq!(r.options.effort.as_deref(), Some("low"));
        let r = with(json!({"output_format": {"type": "json_schema", "schema": schema}})).unwrap();
        assert_eq!(r.options.format.as_deref(), expected);
        assert_eq!(
            with(json!({"output_config": {"effort": "low"}}))
                .unwrap()
                .options
                .format,
            None
        );
        for (extra, param) in [
            (
                json!({"output_config": {"format": "json"}}),
                "output_config.format",
            ),
            (
                json!({"output_config": {"format": {"type": "json_object"}}}),
                "output_config.format.type",
            ),
            (
                json!({"output_config": {"format": {"type": "json_schema", "schema": []}}}),
                "output_config.format.schema",
            ),
            (
                json!({"output_format": {"type": "json_schema"}}),
                "output_format.schema",
            ),
            (
                json!({"output_format": {"type": "json_schema", "schema": schema},
                       "output_config": {"format": {"type": "json_schema", "schema": schema}}}),
                "output_format",
            ),
        ] {
            let e = with(extra.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {e:?}");
        }
    }

    #[test]
    fn a_message_or_the_system_text_may_have_at_most_400_blocks() {
        let blocks = vec![json!({"type": "text", "text": "a"}); compat::MAX_PARTS + 1];
        let e = parse(json!({"model": "agentd", "max_tokens": 10, "messages": [
            {"role": "user", "content": blocks}
        ]}))
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0]"), "{e:?}");
        assert!(e.message.contains("at most 400 content parts"), "{e:?}");
        let e = parse(
            json!({"model": "agentd", "max_tokens": 10, "system": blocks,
                             "messages": [{"role": "user", "content": "hi"}]}),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("system"), "{e:?}");
    }

    #[test]
    fn a_conversation_is_split_into_system_history_and_new_input() {
        let r = parse(json!({
            "model": "agentd:primary",
            "max_tokens": 2000,
            "system": [{"type": "text", "text": "Be brief."}],
            "metadata": {"user_id": "bob"},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "temperature": 0.5,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "…", "signature": "s"},
                                                   {"type": "text", "text": "hello"}]},
                {"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "aGVsbG8="}},
                    {"type": "text", "text": "and this?"}
                ]}
            ],
            "top_k": 5
        }))
        .unwrap();
        assert_eq!(r.system.as_deref(), Some("Be brief."));
        assert_eq!(r.session.as_deref(), Some("bob"));
        assert_eq!(r.history.len(), 2);
        assert_eq!(r.text, "and this?");
        assert_eq!(r.attachments[0].media_type, "image/jpeg");
        assert_eq!(r.options.max_tokens, Some(2000));
        assert_eq!(
            r.options.thinking,
            Some(ClientThinking::Enabled {
                budget_tokens: 1024
            })
        );
        assert_eq!(r.options.temperature, Some(0.5));
        assert!(!r.stream);
    }

    #[test]
    fn client_tools_their_calls_and_results_are_parsed() {
        let r = parse(json!({
            "model": "agentd",
            "max_tokens": 100,
            "tools": [
                {"name": "lookup", "description": "Find", "input_schema": {"type": "object"},
                 "cache_control": {"type": "ephemeral"}},
                {"type": "custom", "name": "ping", "input_schema": {"type": "object"}}
            ],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "find x"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "ping", "input": {}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "found"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
                     "content": [{"type": "text", "text": "timeout"}]},
                    {"type": "text", "text": "and hurry"}
                ]}
            ]
        }))
        .unwrap();
        assert_eq!(r.tools.len(), 2);
        assert_eq!(r.tool_choice, Some(ClientToolChoice::Required));
        assert_eq!(r.options.parallel_tool_calls, Some(false));
        assert_eq!(r.text, "and hurry");
        assert_eq!(r.tool_results.len(), 2);
        assert_eq!(r.tool_results[1].at, "messages[2].content[1]");
        assert!(r.tool_results[1].result.is_error);
        assert_eq!(r.tool_results[1].result.content, "timeout");
        let Message::Assistant {
            text, tool_calls, ..
        } = &r.history[1]
        else {
            panic!("{:?}", r.history)
        };
        assert_eq!(text, "Looking.");
        assert_eq!(tool_calls[0].arguments, json!({"q": "x"}));
        // Only results: no text in the new input.
        let r = parse(json!({"model": "agentd", "messages": [
            {"role": "user", "content": "find x"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "found"}]}
        ]}))
        .unwrap();
        assert_eq!((r.text.as_str(), r.tool_results.len()), ("", 1));
        assert_eq!(r.history.len(), 2);
    }

    #[test]
    fn no_tools_with_a_tool_choice_of_none_or_auto_is_accepted() {
        let msgs = json!([{"role": "user", "content": "x"}]);
        for choice in ["none", "auto"] {
            let body = json!({"model": "agentd", "max_tokens": 10, "messages": msgs,
                              "tools": [], "tool_choice": {"type": choice}});
            assert!(parse(body).is_ok(), "{choice}");
        }
    }

    #[test]
    fn tools_and_bad_fields_are_refused_with_the_field() {
        let msgs = json!([{"role": "user", "content": "x"}]);
        let cases = [
            (
                json!({"model": "agentd", "max_tokens": 10, "messages": msgs, "tools": [{"name": "t"}]}),
                "tools[0].input_schema",
            ),
            (
                json!({"model": "agentd", "max_tokens": 10, "messages": msgs,
                       "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"model": "agentd", "max_tokens": 10, "messages": msgs, "mcp_servers": [{"url": "x"}]}),
                "mcp_servers",
            ),
            (
                json!({"model": "agentd", "max_tokens": 10, "messages": msgs, "tool_choice": {"type": "any"}}),
                "tool_choice",
            ),
            (
                json!({"model": "agentd", "max_tokens": 10, "messages": msgs, "temperature": 1.5}),
                "temperature",
            ),
            (
                json!({"model": "agentd", "max_tokens": 2000, "messages": msgs, "thinking": {"type": "enabled", "budget_tokens": 100}}),
                "thinking.budget_tokens",
            ),
            (
                json!({"model": "agentd", "max_tokens": 1500, "messages": msgs, "thinking": {"type": "enabled", "budget_tokens": 2000}}),
                "thinking.budget_tokens",
            ),
            (
                json!({"model": "agentd", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Sure,"}]}),
                "messages",
            ),
            (
                json!({"model": "agentd", "messages": [{"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]},
                {"role": "user", "content": "y"}]}),
                "messages[1].content[0]",
            ),
            (
                json!({"model": "agentd", "messages": [{"role": "user", "content": [
                {"type": "tool_result", "content": "x"}]}]}),
                "messages[0].content[0].tool_use_id",
            ),
            (
                json!({"model": "agentd", "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"model": "agentd", "messages": [{"role": "system", "content": "x"}]}),
                "messages[0].role",
            ),
        ];
        for (body, param) in cases {
            let e = parse(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        }
    }

    fn reply() -> CompatReply {
        CompatReply {
            id: "abc".into(),
            session_id: String::new(),
            model: "agentd".into(),
            created: 1,
            text: "Hi".into(),
            calls: vec![],
            finish: FinishReason::Length,
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
    fn the_message_reports_usage_as_anthropic_does() {
        let v: Value = serde_json::from_slice(&message_body(&reply())).unwrap();
        assert_eq!(v["id"], "msg_abc");
        assert_eq!(v["content"][0]["text"], "Hi");
        assert_eq!(v["stop_reason"], "max_tokens");
        assert_eq!(v["usage"]["input_tokens"], 10);
        assert_eq!(v["usage"]["output_tokens"], 5);
        assert_eq!(v["usage"]["cache_creation_input_tokens"], 20);
        assert_eq!(v["usage"]["cache_read_input_tokens"], 100);
    }

    #[test]
    fn the_event_sequence() {
        let s = EventStream::new("abc", "agentd");
        let mut all = s.start();
        all.extend(s.keep_alive());
        all.extend(s.text("Hi"));
        all.extend(s.finish(&reply()));
        let text = String::from_utf8(all).unwrap();
        let names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("event: "))
            .collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "ping",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
    }

    #[test]
    fn errors_use_anthropics_envelope() {
        let v: Value =
            serde_json::from_slice(&error_body(ErrorKind::Authentication, "bad key")).unwrap();
        assert_eq!(
            v,
            json!({"type": "error", "error": {"type": "authentication_error", "message": "bad key"},
                   "request_id": null})
        );
        let v: Value = serde_json::from_slice(&error_body(ErrorKind::Budget, "x")).unwrap();
        assert_eq!(v["error"]["type"], "rate_limit_error");
    }
}
