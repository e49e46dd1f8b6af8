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
    Invalid, OpenAiUsage, short,
};
use crate::message::Message;
use crate::message::call::{CallOptions, EFFORTS};

/// The route of the endpoint.
pub const RESPONSES_PATH: &str = "/v1/responses";

/// Fields that ask the server to run client-side tools (refused while agentd runs its own).
const CLIENT_TOOL_FIELDS: &[&str] = &["tools", "tool_choice"];

/// Parses a request body. Fields that change nothing the agent does (`top_p`, `truncation`,
/// `include`, `metadata`, `prompt_cache_key`, …) are ignored; fields it cannot honour are
/// refused with the reason.
pub fn parse_request(body: &[u8]) -> Result<CompatRequest, Invalid> {
    let compat::RequestObject {
        fields: o,
        messages: input,
        model,
    } = compat::request_object_with(body, "input", CLIENT_TOOL_FIELDS)?;
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
    };
    let mut system = Vec::new();
    if let Some(i) = opt_str(&o, "instructions")? {
        system.push(i);
    }
    let (text, attachments, history) = match input {
        None => {
            return Err(Invalid::new(
                "input",
                "`input` is required: a string or a list of items",
            ));
        }
        Some(raw) if raw.get().trim_start().starts_with('"') => {
            let text: String = serde_json::from_str(raw.get())
                .map_err(|e| Invalid::new("input", format!("not valid JSON: {e}")))?;
            (text, Vec::new(), Vec::new())
        }
        Some(raw) => {
            let items = compat::item_list(Some(raw), "input")?;
            let (more_system, mut turns) = conversation(&items)?;
            system.extend(more_system);
            let (text, attachments) = new_input(&mut turns, items.len())?;
            (
                text,
                attachments,
                turns.into_iter().map(|(m, _)| m).collect(),
            )
        }
    };
    if text.trim().is_empty() && attachments.is_empty() {
        return Err(Invalid::new("input", "the input is empty"));
    }
    let system = system.join("\n\n");
    Ok(CompatRequest {
        model,
        session,
        system: (!system.trim().is_empty()).then_some(system),
        history: compat::normalise_history(history),
        text,
        attachments,
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

/// A turn of the conversation and the attachments of its user message.
type Turn = (Message, Vec<CompatAttachment>);

/// The system (and developer) texts and the turns of `input`'s items, in order. Reasoning
/// items a client sends back are skipped.
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
            "function_call" | "function_call_output" => {
                return Err(Invalid::new(
                    format!("{at}.type"),
                    "client-side tool calls are not supported: agentd runs its own tools",
                ));
            }
            other => {
                return Err(Invalid::new(
                    format!("{at}.type"),
                    format!(
                        "input items of type {:?} are not supported: send messages",
                        short(other)
                    ),
                ));
            }
        }
        match item.get("role").and_then(Value::as_str).unwrap_or("") {
            "system" | "developer" => system.push(content(item.get("content"), &at, false)?.0),
            "user" => {
                let (text, files) = content(item.get("content"), &at, true)?;
                turns.push((user_message(text, &files), files));
            }
            "assistant" => {
                let text = content(item.get("content"), &at, false)?.0;
                turns.push((compat::assistant_text(text), Vec::new()));
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

/// Takes the last turn off `turns`: it must be a user message (the new input).
fn new_input(
    turns: &mut Vec<Turn>,
    count: usize,
) -> Result<(String, Vec<CompatAttachment>), Invalid> {
    let last_user = || {
        Invalid::new(
            format!("input[{}]", count.saturating_sub(1)),
            "the last input item must be a user message: it is the new input",
        )
    };
    let Some((last, attachments)) = turns.pop() else {
        return Err(last_user());
    };
    let Message::User { content } = last else {
        return Err(last_user());
    };
    let text = match content.into_iter().next() {
        Some(crate::message::UserBlock::Text { text }) => text,
        _ => String::new(),
    };
    Ok((text, attachments))
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
        FinishReason::Stop => Status::Completed,
        FinishReason::Length => Status::Incomplete,
    }
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
    let item = message_item(&id, status, Some(&r.text));
    serde_json::to_vec(&head.object(status, vec![item], Some(usage(r)), None)).unwrap_or_default()
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
        let status = end_status(r);
        let item = message_item(&self.id, status, Some(&text));
        out.extend(self.event(
            "response.output_item.done",
            json!({"output_index": 0, "item": item}),
        ));
        let done = self.head().object(status, vec![item], Some(usage(r)), None);
        let kind = match status {
            Status::Incomplete => "response.incomplete",
            _ => "response.completed",
        };
        out.extend(self.event(kind, json!({"response": done})));
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
                json!({"model": "agentd", "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}),
                "input[0].type",
            ),
            (
                json!({"model": "agentd", "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"model": "agentd", "input": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}),
                "input[1]",
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
