//! The server side of OpenAI's Responses API (SPEC §17): a `POST /v1/responses` body into a
//! neutral [`CompatRequest`], and the answers back: the `response` object and its stream of
//! events (`response.created` … `response.output_text.delta` … `response.completed`). Errors
//! use the envelope of Chat Completions (`server::error_body`), as OpenAI's own do.

use std::cell::{Cell, RefCell};

use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::server::{at_most, data_url, opt_bool, opt_str, opt_u32, user_message};
use crate::llm::compat::{
    self, CompatAttachment, CompatReply, CompatRequest, Continuation, ErrorKind, FinishReason,
    Invalid, OpenAiUsage, Turn, short,
};
use crate::message::call::{CallOptions, ClientTool, ClientToolChoice, EFFORTS};
use crate::message::{Message, ToolCall, ToolResult};

/// The route of the endpoint.
pub const RESPONSES_PATH: &str = "/v1/responses";

/// Parses a request body. Fields that change nothing the agent does (`top_p`, `truncation`,
/// `include`, `metadata`, `prompt_cache_key`, …) are ignored; fields it cannot honour are
/// refused with the reason.
pub fn parse_request(body: &[u8]) -> Result<CompatRequest, Invalid> {
    let compat::RequestObject {
        fields: o,
        messages: input,
        model,
    } = compat::request_object_with(body, "input", &[])?;
    refuse_unsupported(&o)?;
    let stream = opt_bool(&o, "stream")?.unwrap_or(false);
    let continuation = Continuation {
        previous_response: opt_str(&o, "previous_response_id")?.filter(|p| !p.trim().is_empty()),
        store: opt_bool(&o, "store")?.unwrap_or(true),
    };
    let session = match (opt_str(&o, "safety_identifier")?, opt_str(&o, "user")?) {
        (Some(s), _) | (None, Some(s)) if !s.trim().is_empty() => Some(s),
        _ => None,
    };
    let options = CallOptions {
        max_tokens: opt_u32(&o, "max_output_tokens")?,
        temperature: compat::temperature(o.get("temperature"), 2.0)?,
        effort: effort(&o)?,
        thinking: None,
        format: text_format(&o)?,
        parallel_tool_calls: opt_bool(&o, "parallel_tool_calls")?,
    };
    let tools = client_tools(&o)?;
    let tool_choice = tool_choice(&o)?;
    compat::check_tool_choice(tool_choice.as_ref(), &tools, "tool_choice")?;
    let mut system = Vec::new();
    if let Some(i) = opt_str(&o, "instructions")? {
        system.push(i);
    }
    let (input, history) = match input {
        None => {
            return Err(Invalid::new(
                "input",
                "`input` is required: a string or a list of items",
            ));
        }
        Some(raw) if raw.get().trim_start().starts_with('"') => {
            let text: String = serde_json::from_str(raw.get())
                .map_err(|e| Invalid::new("input", format!("not valid JSON: {e}")))?;
            let input = compat::NewInput {
                text,
                attachments: Vec::new(),
                tool_results: Vec::new(),
            };
            (input, Vec::new())
        }
        Some(raw) => {
            let items = compat::item_list(Some(raw), "input")?;
            let (more_system, mut turns) = conversation(&items)?;
            system.extend(more_system);
            let input = compat::new_input(
                &mut turns,
                items.len(),
                "the last input item must be a user message or function_call_output items: it is the new input",
            )
            .map_err(|e| Invalid::new("input", e.message))?;
            (input, turns.into_iter().map(|t| t.message).collect())
        }
    };
    if input.text.trim().is_empty() && input.attachments.is_empty() && input.tool_results.is_empty()
    {
        return Err(Invalid::new("input", "the input is empty"));
    }
    let history = compat::normalise_history(history);
    compat::check_history(&history).map_err(|e| Invalid::new("input", e.message))?;
    let system = system.join("\n\n");
    Ok(CompatRequest {
        model,
        session,
        system: (!system.trim().is_empty()).then_some(system),
        history,
        text: input.text,
        attachments: input.attachments,
        tool_results: input.tool_results,
        tools,
        tool_choice,
        options,
        stream,
        include_usage: true,
        continuation,
    })
}

/// Refuses what agentd cannot do: background responses, server-side conversations and prompt
/// templates.
fn refuse_unsupported(o: &Map<String, Value>) -> Result<(), Invalid> {
    let set = |k: &str| {
        o.get(k)
            .is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
    };
    if set("background") {
        return Err(Invalid::new(
            "background",
            "background responses are not supported: send the request without `background` (streaming keeps a long answer alive)",
        ));
    }
    if set("conversation") {
        return Err(Invalid::new(
            "conversation",
            "conversations are not supported: continue with `previous_response_id`, or name a session (`user` or the X-Agentd-Session header)",
        ));
    }
    if set("prompt") {
        return Err(Invalid::new(
            "prompt",
            "prompt templates are not supported: send `instructions` and `input`",
        ));
    }
    Ok(())
}

/// `text.format`: `text` (or absent) asks for nothing; `json_object`; `json_schema` with its
/// `name`, `schema` and `strict` beside the type.
fn text_format(o: &Map<String, Value>) -> Result<Option<Box<compat::OutputFormat>>, Invalid> {
    const AT: &str = "text.format";
    let f = match o.get("text").and_then(|t| t.get("format")) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(f)) => f,
        Some(_) => return Err(Invalid::new(AT, "`text.format` must be an object")),
    };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Box::new(compat::OutputFormat::JsonObject))),
        Some("json_schema") => Ok(Some(Box::new(compat::json_schema_format(f, AT, true)?))),
        other => Err(Invalid::new(
            "text.format.type",
            format!(
                "unknown text.format type {}: use \"text\", \"json_object\" or \"json_schema\"",
                short(&other.map_or("(none)".to_string(), |t| format!("{t:?}")))
            ),
        )),
    }
}

/// `reasoning.effort`, checked.
fn effort(o: &Map<String, Value>) -> Result<Option<String>, Invalid> {
    let Some(r) = o.get("reasoning").filter(|r| !r.is_null()) else {
        return Ok(None);
    };
    let Value::Object(r) = r else {
        return Err(Invalid::new("reasoning", "`reasoning` must be an object"));
    };
    match opt_str(r, "effort").map_err(|e| Invalid::new("reasoning.effort", e.message))? {
        None => Ok(None),
        Some(e) if EFFORTS.contains(&e.as_str()) => Ok(Some(e)),
        Some(e) => Err(Invalid::new(
            "reasoning.effort",
            format!(
                "unknown reasoning.effort {:?}: use one of {}",
                short(&e),
                EFFORTS.join(", ")
            ),
        )),
    }
}

/// `tools`: function tools only (a built-in tool type is refused naming it).
fn client_tools(o: &Map<String, Value>) -> Result<Vec<ClientTool>, Invalid> {
    let list = match o.get("tools") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(Invalid::new("tools", "`tools` must be an array")),
    };
    let mut tools = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            other => {
                return Err(Invalid::new(
                    format!("{at}.type"),
                    format!(
                        "only tools of type \"function\" are supported (agentd runs its own search, file and MCP tools), got {}",
                        short(other.unwrap_or("none"))
                    ),
                ));
            }
        }
        tools.push(compat::client_tool(
            &at,
            t.get("name"),
            t.get("description"),
            t.get("parameters"),
            "parameters",
        )?);
    }
    compat::check_client_tools(&tools, "tools")?;
    Ok(tools)
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"` or `{"type": "function", "name": …}`.
fn tool_choice(o: &Map<String, Value>) -> Result<Option<ClientToolChoice>, Invalid> {
    match o.get("tool_choice") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(c)) if c == "none" => Ok(Some(ClientToolChoice::None)),
        Some(Value::String(c)) if c == "auto" => Ok(Some(ClientToolChoice::Auto)),
        Some(Value::String(c)) if c == "required" => Ok(Some(ClientToolChoice::Required)),
        Some(v) => match (
            v.get("type").and_then(Value::as_str),
            v.get("name").and_then(Value::as_str),
        ) {
            (Some("function"), Some(name)) => Ok(Some(ClientToolChoice::Tool {
                name: name.to_string(),
            })),
            _ => Err(Invalid::new(
                "tool_choice",
                format!(
                    "`tool_choice` must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"name\": …}}, got {}",
                    short(&v.to_string())
                ),
            )),
        },
    }
}

/// The system (and developer) texts and the turns of `input`'s items, in order: messages,
/// the client's function calls (joined to the assistant turn before them) and their
/// outputs. Reasoning items a client sends back are skipped.
fn conversation(items: &[&RawValue]) -> Result<(Vec<String>, Vec<Turn>), Invalid> {
    let mut system = Vec::new();
    let mut turns: Vec<Turn> = Vec::new();
    for (i, raw) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let Value::Object(item) = compat::message_value(raw, &at)? else {
            return Err(Invalid::new(at, "each input item must be an object"));
        };
        match item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message")
        {
            "message" => {}
            "reasoning" => continue,
            "function_call" => {
                let call = function_call(&item, &at)?;
                if let Some(Turn {
                    message: Message::Assistant { tool_calls, .. },
                    ..
                }) = turns.last_mut()
                {
                    tool_calls.push(call);
                } else {
                    let mut m = compat::assistant_text(String::new());
                    if let Message::Assistant { tool_calls, .. } = &mut m {
                        tool_calls.push(call);
                    }
                    turns.push(Turn::of(m));
                }
                continue;
            }
            "function_call_output" => {
                compat::push_result(&mut turns, function_output(&item, &at)?, at);
                continue;
            }
            other => {
                return Err(Invalid::new(
                    format!("{at}.type"),
                    format!(
                        "input items of type {:?} are not supported: send messages, function_call and function_call_output items",
                        short(other)
                    ),
                ));
            }
        }
        match item.get("role").and_then(Value::as_str).unwrap_or("") {
            "system" | "developer" => system.push(content(item.get("content"), &at, false)?.0),
            "user" => {
                let (text, files) = content(item.get("content"), &at, true)?;
                let mut turn = Turn::of(user_message(text, &files));
                turn.files = files;
                turns.push(turn);
            }
            "assistant" => {
                let text = content(item.get("content"), &at, false)?.0;
                turns.push(Turn::of(compat::assistant_text(text)));
            }
            other => {
                return Err(Invalid::new(
                    format!("{at}.role"),
                    format!(
                        "unknown role {:?}: use system, developer, user or assistant",
                        short(other)
                    ),
                ));
            }
        }
    }
    Ok((system, turns))
}

/// A `function_call` item of the client's history: `call_id`, `name` and `arguments` (a
/// JSON string).
fn function_call(item: &Map<String, Value>, at: &str) -> Result<ToolCall, Invalid> {
    let field = |k: &str| item.get(k).and_then(Value::as_str);
    let (Some(id), Some(name)) = (field("call_id"), field("name")) else {
        return Err(Invalid::new(
            at,
            "a function_call item needs `call_id`, `name` and `arguments`",
        ));
    };
    let arguments = match field("arguments") {
        Some(a) if !a.trim().is_empty() => serde_json::from_str(a).map_err(|e| {
            Invalid::new(format!("{at}.arguments"), format!("not a JSON object: {e}"))
        })?,
        _ => Value::Object(Map::new()),
    };
    compat::history_call(id, name, arguments, &format!("{at}.arguments"))
}

/// A `function_call_output` item: the result of the call `call_id` (a string, or text parts).
fn function_output(item: &Map<String, Value>, at: &str) -> Result<ToolResult, Invalid> {
    let Some(id) = (item.get("call_id").and_then(Value::as_str)).filter(|i| !i.is_empty()) else {
        return Err(Invalid::new(
            format!("{at}.call_id"),
            "a function_call_output item needs the `call_id` of the call it answers",
        ));
    };
    let content = match item.get("output") {
        Some(Value::String(s)) => s.clone(),
        Some(v @ Value::Array(_)) => content(Some(v), at, false)?.0,
        _ => {
            return Err(Invalid::new(
                format!("{at}.output"),
                "`output` must be a string or a list of input_text parts",
            ));
        }
    };
    Ok(ToolResult {
        tool_call_id: id.to_string(),
        content,
        is_error: false,
        images: Vec::new(),
    })
}

/// A message's content: a string, or a list of `input_text` / `output_text` parts (joined by
/// newlines) and, when `images`, `input_image` parts with `data:` URLs.
fn content(
    content: Option<&Value>,
    at: &str,
    images: bool,
) -> Result<(String, Vec<CompatAttachment>), Invalid> {
    let parts = match content {
        Some(Value::String(s)) => return Ok((s.clone(), Vec::new())),
        Some(Value::Array(parts)) => parts,
        _ => {
            return Err(Invalid::new(
                format!("{at}.content"),
                "must be a string or a list of content parts",
            ));
        }
    };
    let mut text = Vec::new();
    let mut files = Vec::new();
    for (j, p) in parts.iter().enumerate() {
        let here = format!("{at}.content[{j}]");
        match p.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text") => match p.get("text") {
                Some(Value::String(t)) => text.push(t.clone()),
                _ => return Err(Invalid::new(here, "a text part needs a string `text`")),
            },
            Some("refusal") => {}
            Some("input_image") if images => {
                let url = p.get("image_url").and_then(Value::as_str).ok_or_else(|| {
                    Invalid::new(
                        &here,
                        "an input_image part needs `image_url` as a data: URL (file ids are not supported)",
                    )
                })?;
                files.push(data_url(url).map_err(|m| Invalid::new(&here, m))?);
                at_most(&files, "image/", compat::MAX_IMAGES, "images", &here)?;
            }
            Some(other) => {
                return Err(Invalid::new(
                    here,
                    format!(
                        "content parts of type {:?} are not supported here: send input_text{}",
                        short(other),
                        if images { " and input_image" } else { "" }
                    ),
                ));
            }
            None => return Err(Invalid::new(here, "a content part needs a `type`")),
        }
    }
    Ok((text.join("\n"), files))
}

/// What an answer repeats of its request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Echo {
    pub instructions: Option<String>,
    pub previous_response: Option<String>,
    pub store: bool,
    pub temperature: Option<f32>,
    pub max_output_tokens: Option<u32>,
    pub effort: Option<String>,
    /// `text.format` as asked (`{"type": "text"}` when none).
    pub format: Option<Value>,
}

impl Echo {
    pub fn of(r: &CompatRequest) -> Echo {
        Echo {
            instructions: r.system.clone(),
            previous_response: r.continuation.previous_response.clone(),
            store: r.continuation.store,
            temperature: r.options.temperature,
            max_output_tokens: r.options.max_tokens,
            effort: r.options.effort.clone(),
            format: r.options.format.as_deref().map(format_echo),
        }
    }
}

/// A format as the Responses API shows it in `text.format`.
fn format_echo(f: &compat::OutputFormat) -> Value {
    match f {
        compat::OutputFormat::JsonObject => json!({"type": "json_object"}),
        compat::OutputFormat::JsonSchema {
            name,
            schema,
            strict,
            description,
        } => {
            let mut v = json!({"type": "json_schema", "name": name, "schema": schema});
            if let Some(s) = strict {
                v["strict"] = (*s).into();
            }
            if let Some(d) = description {
                v["description"] = d.as_str().into();
            }
            v
        }
    }
}

/// The usage object: input counts cache reads and writes; the cached part is the reads.
fn usage(r: &CompatReply) -> Value {
    let u = OpenAiUsage::from(&r.usage);
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": u.cached_tokens,
            "cache_write_tokens": r.usage.cache_write_tokens,
        },
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.total_tokens,
    })
}

/// How a response stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Status {
    InProgress,
    Completed,
    Incomplete,
    Failed,
}

impl Status {
    fn name(self) -> &'static str {
        match self {
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Incomplete => "incomplete",
            Status::Failed => "failed",
        }
    }
}

/// One response's identity and its request's echo.
struct Head<'a> {
    id: &'a str,
    model: &'a str,
    created: i64,
    echo: &'a Echo,
}

impl Head<'_> {
    /// The `response` object with `output`, `usage` and `error` as given.
    fn object(
        &self,
        status: Status,
        output: Vec<Value>,
        usage: Option<Value>,
        error: Option<Value>,
    ) -> Value {
        let e = self.echo;
        let mut v = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status.name(),
            "error": error,
            "incomplete_details": (status == Status::Incomplete)
                .then(|| json!({"reason": "max_output_tokens"})),
            "instructions": e.instructions,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": true,
            "store": e.store,
            "temperature": e.temperature.unwrap_or(1.0),
            "text": {"format": e.format.clone().unwrap_or_else(|| json!({"type": "text"}))},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "metadata": {},
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        // Optional fields are left out when empty: the strictest readers refuse null there.
        if let Some(effort) = &e.effort {
            v["reasoning"] = json!({"effort": effort});
        }
        if let Some(m) = e.max_output_tokens {
            v["max_output_tokens"] = m.into();
        }
        if let Some(p) = &e.previous_response {
            v["previous_response_id"] = p.as_str().into();
        }
        v
    }
}

/// The id of the message item of response `id` (`resp_…` → `msg_…`).
fn message_id(id: &str) -> String {
    format!("msg_{}", id.strip_prefix("resp_").unwrap_or(id))
}

fn message_item(id: &str, status: Status, text: Option<&str>) -> Value {
    let content: Vec<Value> = text.map(output_text).into_iter().collect();
    json!({"type": "message", "id": message_id(id), "status": status.name(),
           "role": "assistant", "content": content})
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn end_status(r: &CompatReply) -> Status {
    match r.finish {
        FinishReason::Stop | FinishReason::ToolCalls => Status::Completed,
        FinishReason::Length => Status::Incomplete,
    }
}

/// A call of a client tool as an output item: `{"type": "function_call", "call_id", "name",
/// "arguments"}` (the arguments as a JSON string).
fn call_item(c: &ToolCall) -> Value {
    json!({"type": "function_call", "id": format!("fc_{}", c.id), "call_id": c.id,
           "name": c.name, "arguments": c.arguments.to_string(), "status": "completed"})
}

/// The `response` object of a finished answer.
pub fn response_body(r: &CompatReply, echo: &Echo) -> Vec<u8> {
    let id = compat::response_id(&r.session_id, &r.id);
    let head = Head {
        id: &id,
        model: &r.model,
        created: r.created,
        echo,
    };
    let status = end_status(r);
    // A turn that only calls the client's tools has no message.
    let mut output = Vec::new();
    if r.calls.is_empty() || !r.text.is_empty() {
        output.push(message_item(&id, status, Some(&r.text)));
    }
    output.extend(r.calls.iter().map(call_item));
    serde_json::to_vec(&head.object(status, output, Some(usage(r)), None)).unwrap_or_default()
}

/// The events of one streamed answer, each with its `sequence_number`: `response.created`
/// and `response.in_progress` at once; the message item and its text part opened with the
/// first text; `response.output_text.delta` per piece; then the text, part and item closed
/// and `response.completed` (or `response.incomplete`, or `response.failed`). Keep-alives are
/// SSE comments.
pub struct ResponseStream {
    id: String,
    model: String,
    created: i64,
    echo: Echo,
    seq: Cell<u64>,
    /// The text streamed so far (what the `done` events repeat).
    text: RefCell<String>,
    opened: Cell<bool>,
}

impl ResponseStream {
    pub fn new(id: &str, model: &str, created: i64, echo: Echo) -> ResponseStream {
        ResponseStream {
            id: id.to_string(),
            model: model.to_string(),
            created,
            echo,
            seq: Cell::new(0),
            text: RefCell::new(String::new()),
            opened: Cell::new(false),
        }
    }

    fn head(&self) -> Head<'_> {
        Head {
            id: &self.id,
            model: &self.model,
            created: self.created,
            echo: &self.echo,
        }
    }

    /// One event: `fields` with its `type` and the next `sequence_number`.
    fn event(&self, kind: &str, fields: Value) -> Vec<u8> {
        let mut v = fields;
        v["type"] = kind.into();
        v["sequence_number"] = self.seq.get().into();
        self.seq.set(self.seq.get() + 1);
        frame_named(kind, &v)
    }

    pub fn start(&self) -> Vec<u8> {
        let pending = self.head().object(Status::InProgress, vec![], None, None);
        let mut out = self.event("response.created", json!({"response": pending}));
        out.extend(self.event("response.in_progress", json!({"response": pending})));
        out
    }

    /// The message item and its text part, once.
    fn open(&self) -> Vec<u8> {
        if self.opened.replace(true) {
            return Vec::new();
        }
        let mut out = self.event(
            "response.output_item.added",
            json!({"output_index": 0, "item": message_item(&self.id, Status::InProgress, None)}),
        );
        out.extend(self.event(
            "response.content_part.added",
            json!({"item_id": message_id(&self.id), "output_index": 0, "content_index": 0,
                   "part": output_text("")}),
        ));
        out
    }

    pub fn text(&self, piece: &str) -> Vec<u8> {
        let mut out = self.open();
        self.text.borrow_mut().push_str(piece);
        out.extend(self.event(
            "response.output_text.delta",
            json!({"item_id": message_id(&self.id), "output_index": 0, "content_index": 0,
                   "delta": piece, "logprobs": []}),
        ));
        out
    }

    pub fn keep_alive(&self) -> Vec<u8> {
        b": keep-alive\n\n".to_vec()
    }

    /// The closing events and `response.completed` (or `response.incomplete`).
    pub fn finish(&self, r: &CompatReply) -> Vec<u8> {
        let status = end_status(r);
        let mut output = Vec::new();
        let mut out = Vec::new();
        // A turn that only calls the client's tools, with no text, has no message.
        if self.opened.get() || r.calls.is_empty() {
            out.extend(self.close_message(status, &mut output));
        }
        for c in &r.calls {
            let index = output.len();
            let mut item = call_item(c);
            item["status"] = "in_progress".into();
            item["arguments"] = "".into();
            out.extend(self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            ));
            let item = call_item(c);
            let (item_id, arguments) = (item["id"].clone(), item["arguments"].clone());
            out.extend(self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": index, "delta": arguments}),
            ));
            out.extend(self.event(
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": index, "name": c.name,
                       "arguments": arguments}),
            ));
            out.extend(self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            ));
            output.push(item);
        }
        let done = self.head().object(status, output, Some(usage(r)), None);
        let kind = match status {
            Status::Incomplete => "response.incomplete",
            _ => "response.completed",
        };
        out.extend(self.event(kind, json!({"response": done})));
        out
    }

    /// The message item's closing events (opened first if no text came); its item joins
    /// `output`.
    fn close_message(&self, status: Status, output: &mut Vec<Value>) -> Vec<u8> {
        let mut out = self.open();
        let text = self.text.borrow().clone();
        let item_id = message_id(&self.id);
        out.extend(self.event(
            "response.output_text.done",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0,
                   "text": text, "logprobs": []}),
        ));
        out.extend(self.event(
            "response.content_part.done",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0,
                   "part": output_text(&text)}),
        ));
        let item = message_item(&self.id, status, Some(&text));
        out.extend(self.event(
            "response.output_item.done",
            json!({"output_index": 0, "item": item}),
        ));
        output.push(item);
        out
    }

    /// `response.failed`, with the error in the response.
    pub fn error(&self, kind: ErrorKind, message: &str) -> Vec<u8> {
        let code = match kind {
            ErrorKind::Busy | ErrorKind::Budget => "rate_limit_exceeded",
            _ => "server_error",
        };
        let error = json!({"code": code, "message": message});
        let failed = self
            .head()
            .object(Status::Failed, vec![], None, Some(error));
        self.event("response.failed", json!({"response": failed}))
    }
}

/// An SSE event with its name (`event:`) and JSON data.
fn frame_named(name: &str, v: &Value) -> Vec<u8> {
    let mut out = format!("event: {name}\ndata: ").into_bytes();
    out.extend(serde_json::to_vec(v).unwrap_or_default());
    out.extend_from_slice(b"\n\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<CompatRequest, Invalid> {
        parse_request(&serde_json::to_vec(&v).unwrap())
    }

    #[test]
    fn a_string_input_is_the_new_message() {
        let r = parse(
            json!({"model": "agentd", "input": "hi", "instructions": "Be brief.",
                             "max_output_tokens": 50, "reasoning": {"effort": "low"},
                             "store": false, "previous_response_id": "resp_x"}),
        )
        .unwrap();
        assert_eq!(r.text, "hi");
        assert_eq!(r.system.as_deref(), Some("Be brief."));
        assert_eq!(r.options.max_tokens, Some(50));
        assert_eq!(r.options.effort.as_deref(), Some("low"));
        assert!(r.history.is_empty() && !r.stream);
        assert_eq!(
            r.continuation,
            Continuation {
                previous_response: Some("resp_x".into()),
                store: false
            }
        );
    }

    #[test]
    fn items_are_split_into_system_history_and_new_input() {
        let r = parse(json!({"model": "agentd", "input": [
            {"role": "developer", "content": "No emojis."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "hello", "annotations": []}]},
            {"role": "user", "content": [
                {"type": "input_text", "text": "what is this?"},
                {"type": "input_image", "image_url": "data:image/png;base64,aGVsbG8=", "detail": "auto"}
            ]}
        ]}))
        .unwrap();
        assert_eq!(r.system.as_deref(), Some("No emojis."));
        assert_eq!(r.history.len(), 2);
        assert_eq!(r.text, "what is this?");
        assert_eq!(r.attachments.len(), 1);
        assert!(r.continuation.store);
    }

    #[test]
    fn function_calls_and_their_outputs_are_history_and_new_input() {
        let r = parse(json!({"model": "agentd",
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "input": [
                {"role": "user", "content": "weather?"},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]}
            ]}))
        .unwrap();
        assert_eq!(r.tools[0].name, "get_weather");
        assert_eq!(
            r.tool_choice,
            Some(ClientToolChoice::Tool {
                name: "get_weather".into()
            })
        );
        assert_eq!(r.history.len(), 4, "{:?}", r.history);
        assert_eq!(r.history[1].tool_calls()[0].arguments["city"], "Paris");
        assert_eq!(r.tool_results.len(), 1);
        assert_eq!(r.tool_results[0].result.content, "rain");
        assert!(r.text.is_empty());
    }

    #[test]
    fn what_agentd_cannot_do_is_refused_with_the_field() {
        let cases = [
            (json!({"model": "agentd"}), "input"),
            (json!({"model": "agentd", "input": []}), "input"),
            (
                json!({"model": "agentd", "input": "x", "background": true}),
                "background",
            ),
            (
                json!({"model": "agentd", "input": "x", "conversation": "c"}),
                "conversation",
            ),
            (
                json!({"model": "agentd", "input": "x", "text": {"format": {"type": "json_schema"}}}),
                "text.format.name",
            ),
            (
                json!({"model": "agentd", "input": "x", "tools": [{"type": "web_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"model": "agentd", "input": [{"type": "item_reference", "id": "x"}]}),
                "input[0].type",
            ),
            (
                json!({"model": "agentd", "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"model": "agentd", "input": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}),
                "input",
            ),
            (
                json!({"model": "agentd", "input": "x", "reasoning": {"effort": "most"}}),
                "reasoning.effort",
            ),
        ];
        for (body, param) in cases {
            let e = parse(body.clone()).expect_err(&body.to_string());
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
        assert!(
            parse(
                json!({"model": "agentd", "input": "x", "tools": [], "tool_choice": "auto",
                             "text": {"format": {"type": "text"}}, "background": false})
            )
            .is_ok()
        );
    }

    #[test]
    fn stream_events_are_numbered_and_repeat_the_streamed_text() {
        let s = ResponseStream::new("resp_1", "agentd", 1, Echo::default());
        let mut all = s.start();
        all.extend(s.text("Hel"));
        all.extend(s.text("lo"));
        all.extend(s.finish(&CompatReply {
            id: "i".into(),
            session_id: String::new(),
            model: "agentd".into(),
            created: 1,
            text: "ignored: the stream repeats what it sent".into(),
            finish: FinishReason::Stop,
            usage: Default::default(),
            calls: Vec::new(),
        }));
        let text = String::from_utf8(all).unwrap();
        let events: Vec<Value> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e["sequence_number"], i as u64);
        }
        let last = events.last().unwrap();
        assert_eq!(last["type"], "response.completed");
        assert_eq!(last["response"]["output"][0]["content"][0]["text"], "Hello");
    }
}
