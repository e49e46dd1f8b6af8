//! Neutral request → Anthropic Messages API JSON. Deterministic: the same input always renders
//! the same bytes, which is what lets the prompt cache hit (SPEC §6).
//!
//! The body is serialised straight from borrowed views of the request into bytes: no
//! `serde_json::Value` tree and no copy of the history. Every object writes its keys in sorted
//! order, which is the order the earlier `Value` rendering produced (serde_json's map is a
//! `BTreeMap`); `render/reference.rs` keeps that rendering as a test oracle, and a property test
//! checks that both give the same bytes for arbitrary requests.

#[cfg(test)]
mod reference;

use serde::Serialize;
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde_json::Value;

use crate::config::{CacheTtl, ModelSpec, Thinking};
use crate::llm::tool_memo::{ToolListMemo, finish_body};
use crate::llm::{ChatRequest, ClientThinking, SystemTier, ToolChoice, ToolSpec};
use crate::message::call::OutputFormat;
use crate::message::rendered::{Rendered, WireFormat};
use crate::message::{Message, ToolImage, UserBlock};

/// Text of a block that would otherwise be empty (the API rejects empty content).
const EMPTY: &str = "(empty)";

/// The request body for `POST /v1/messages` (always streamed), as bytes.
///
/// Cache breakpoints (when `spec.cache`): the last stable system block, the last semi-stable
/// system block, the last block of message `previous_messages - 1` (the end of the previous
/// call) and the last block of this request.
///
/// With the request's render cache (`message::rendered`) enabled, each message's blocks are serialised once and
/// their bytes reused by later calls ([`render_cached`]); the result is the same bytes.
pub fn render_body(spec: &ModelSpec, req: &ChatRequest) -> serde_json::Result<Vec<u8>> {
    match render_cached(spec, req) {
        Some(cached) => {
            let cached = cached?;
            #[cfg(debug_assertions)]
            crate::llm::check_cached_render(&cached, &render_full(spec, req)?);
            Ok(cached)
        }
        None => render_full(spec, req),
    }
}

/// The whole body serialised from the request, no cache.
fn render_full(spec: &ModelSpec, req: &ChatRequest) -> serde_json::Result<Vec<u8>> {
    let body = Body::new(spec, req);
    let mut out = Vec::with_capacity(body.size_hint);
    serde_json::to_writer(&mut out, &body)?;
    Ok(out)
}

/// The body with each message's blocks taken from the request's render cache, rendering (and
/// keeping) only the messages it does not hold. The cache keeps blocks without breakpoint; the
/// last block of the (at most two) messages that carry one this call is written fresh with
/// it. `None` when the cache is disabled.
fn render_cached(spec: &ModelSpec, req: &ChatRequest) -> Option<serde_json::Result<Vec<u8>>> {
    let entries = match req
        .rendered
        .sync(WireFormat::Anthropic, &req.messages, render_message)?
    {
        Ok(entries) => entries,
        Err(e) => return Some(Err(e)),
    };
    let head = Head::new(spec, req);
    let mut size = head.size_hint + entries.iter().map(|e| e.bytes.len() + 32).sum::<usize>();
    size += 128;
    let mut out = crate::llm::body_pool::take(size);
    let result = (|| {
        out.extend_from_slice(b"{\"max_tokens\":");
        serde_json::to_writer(&mut out, &Effective::of(spec, req).max_tokens)?;
        out.extend_from_slice(b",\"messages\":[");
        let n = req.messages.len();
        let marked = |i: usize| {
            head.marker.is_some() && (i + 1 == n || req.previous_messages == Some(i + 1))
        };
        let mut open: Option<&str> = None;
        for (i, (message, entry)) in req.messages.iter().zip(entries.iter()).enumerate() {
            let role = role(message);
            match open {
                Some(r) if r == role => out.push(b','),
                Some(r) => {
                    close_wire_message(&mut out, r);
                    out.extend_from_slice(b",{\"content\":[");
                }
                None => out.extend_from_slice(b"{\"content\":["),
            }
            open = Some(role);
            if marked(i) {
                out.extend_from_slice(&entry.bytes[..entry.last]);
                let mut blocks = Vec::new();
                push_blocks(message, &mut blocks, &mut 0);
                let last = blocks.last().expect("a message has at least one block");
                serde_json::to_writer(
                    &mut out,
                    &BlockOut {
                        kind: &last.kind,
                        marker: head.marker,
                    },
                )?;
            } else {
                out.extend_from_slice(&entry.bytes);
            }
        }
        if let Some(r) = open {
            close_wire_message(&mut out, r);
        }
        out.push(b']');
        let choice = tool_choice(req, Effective::of(spec, req).thinking);
        finish_body(
            &mut out,
            |out| serde_json::to_writer(out, &Rest(&head)),
            &req.tools,
            &choice,
            (&TOOLS_JSON, crate::llm::schema::tag(&spec.tool_schema)),
            |tools| serde_json::to_vec(&Tools(tools, &spec.tool_schema)),
        )
    })();
    Some(result.map(|()| out))
}

/// `],"role":"<role>"}`: the end of a wire message (`WireMessage`'s keys are content, role).
fn close_wire_message(out: &mut Vec<u8>, role: &str) {
    out.extend_from_slice(b"],\"role\":\"");
    out.extend_from_slice(role.as_bytes());
    out.extend_from_slice(b"\"}");
}

/// The blocks of one message without breakpoint, comma-separated, for the render cache.
fn render_message(message: &Message, r: &mut Rendered) -> serde_json::Result<()> {
    let mut blocks = Vec::new();
    let mut size = 0;
    push_blocks(message, &mut blocks, &mut size);
    r.bytes.reserve(size);
    for (i, b) in blocks.iter().enumerate() {
        if i > 0 {
            r.bytes.push(b',');
        }
        r.last = r.bytes.len();
        serde_json::to_writer(
            &mut r.bytes,
            &BlockOut {
                kind: &b.kind,
                marker: None,
            },
        )?;
    }
    Ok(())
}

/// The wire role of a neutral message.
fn role(message: &Message) -> &'static str {
    match message {
        Message::Assistant { .. } => "assistant",
        Message::User { .. } | Message::ToolResults { .. } => "user",
    }
}

/// [`render_body`] as a JSON value, for tests (the client sends the bytes).
#[cfg(test)]
pub fn render_request(spec: &ModelSpec, req: &ChatRequest) -> Value {
    render_body(spec, req)
        .and_then(|bytes| serde_json::from_slice(&bytes))
        .expect("a rendered body is valid JSON")
}

/// Everything of the body but the messages, borrowing from the request.
struct Head<'a> {
    spec: &'a ModelSpec,
    req: &'a ChatRequest,
    marker: Option<CacheTtl>,
    /// The marker of the system breakpoints: 1 hour when the request asks for it
    /// (`stable_ttl`), else `marker`. The system comes before the messages, so a 1-hour
    /// marker here never follows a 5-minute one.
    system_marker: Option<CacheTtl>,
    /// Non-empty system blocks: (text, carries a breakpoint).
    system: Vec<(&'a str, bool)>,
    /// Rough length of its output.
    size_hint: usize,
}

/// The whole body, borrowing from the request.
struct Body<'a> {
    head: Head<'a>,
    /// Wire messages: role and the range of `blocks` they hold.
    wire: Vec<(&'static str, std::ops::Range<usize>)>,
    blocks: Vec<Block<'a>>,
    /// Rough length of the output, to allocate it once.
    size_hint: usize,
}

/// One content block and whether it carries a breakpoint.
struct Block<'a> {
    kind: Kind<'a>,
    marked: bool,
}

enum Kind<'a> {
    Text(&'a str),
    Image {
        media_type: &'a str,
        data: &'a str,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    RedactedThinking(&'a str),
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: &'a Value,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: &'a str,
        is_error: bool,
        /// Sent as `image` blocks after the text inside the result's content.
        images: &'a [ToolImage],
    },
}

impl<'a> Head<'a> {
    fn new(spec: &'a ModelSpec, req: &'a ChatRequest) -> Head<'a> {
        let marker = spec.cache.then_some(spec.cache_ttl);
        let mut size_hint = 512;

        // System: empty blocks are left out (the API rejects them); the breakpoint goes on the
        // last kept block of each tier.
        let kept: Vec<_> = req.system.iter().filter(|b| !b.text.is_empty()).collect();
        let mut system: Vec<(&str, bool)> = kept
            .iter()
            .map(|b| {
                size_hint += b.text.len() + 64;
                (b.text.as_str(), false)
            })
            .collect();
        if marker.is_some() {
            for tier in [SystemTier::Stable, SystemTier::SemiStable] {
                if let Some(i) = kept.iter().rposition(|b| b.tier == tier) {
                    system[i].1 = true;
                }
            }
        }

        for t in req.tools.iter() {
            size_hint += t.name.len() + t.description.len() + 256;
        }
        let system_marker = marker.map(|ttl| match req.stable_ttl {
            Some(CacheTtl::OneHour) => CacheTtl::OneHour,
            _ => ttl,
        });
        Head {
            spec,
            req,
            marker,
            system_marker,
            system,
            size_hint,
        }
    }
}

impl<'a> Body<'a> {
    fn new(spec: &'a ModelSpec, req: &'a ChatRequest) -> Body<'a> {
        let head = Head::new(spec, req);
        let mut size_hint = head.size_hint;
        // Messages: consecutive neutral messages with the same wire role become one wire
        // message.
        let mut wire: Vec<(&'static str, std::ops::Range<usize>)> = Vec::new();
        let mut blocks: Vec<Block<'a>> = Vec::with_capacity(req.messages.len() * 2);
        // The block that ended neutral message `previous_messages - 1`.
        let mut previous_end: Option<usize> = None;
        for (i, message) in req.messages.iter().enumerate() {
            let role = role(message);
            let start = blocks.len();
            push_blocks(message, &mut blocks, &mut size_hint);
            match wire.last_mut() {
                Some((r, range)) if *r == role => range.end = blocks.len(),
                _ => wire.push((role, start..blocks.len())),
            }
            if req.previous_messages == Some(i + 1) {
                previous_end = Some(blocks.len() - 1);
            }
        }
        if head.marker.is_some()
            && let Some(end) = blocks.len().checked_sub(1)
        {
            for b in previous_end.into_iter().chain([end]) {
                blocks[b].marked = true;
            }
        }
        Body {
            head,
            wire,
            blocks,
            size_hint,
        }
    }
}

/// The content blocks of one neutral message (never none). Empty text blocks are left out: the
/// API rejects them.
fn push_blocks<'a>(message: &'a Message, out: &mut Vec<Block<'a>>, size: &mut usize) {
    let start = out.len();
    let mut push = |kind: Kind<'a>, len: usize| {
        *size += len + 64;
        out.push(Block {
            kind,
            marked: false,
        });
    };
    match message {
        Message::User { content } => {
            for block in content {
                match block {
                    UserBlock::Text { text } if text.is_empty() => {}
                    UserBlock::Text { text } => push(Kind::Text(text), text.len()),
                    UserBlock::Image {
                        media_type, data, ..
                    } => push(Kind::Image { media_type, data }, data.len()),
                }
            }
        }
        Message::Assistant {
            text,
            tool_calls,
            thinking,
            ..
        } => {
            for t in thinking {
                match &t.redacted_data {
                    Some(data) => push(Kind::RedactedThinking(data), data.len()),
                    None => {
                        let thinking = t.thinking.as_deref().unwrap_or("");
                        let signature = t.signature.as_deref().unwrap_or("");
                        push(
                            Kind::Thinking {
                                thinking,
                                signature,
                            },
                            thinking.len() + signature.len(),
                        );
                    }
                }
            }
            if !text.is_empty() {
                push(Kind::Text(text), text.len());
            }
            for call in tool_calls {
                push(
                    Kind::ToolUse {
                        id: &call.id,
                        name: &call.name,
                        input: &call.arguments,
                    },
                    128,
                );
            }
        }
        Message::ToolResults { results, notice } => {
            for r in results {
                push(
                    Kind::ToolResult {
                        tool_use_id: &r.tool_call_id,
                        content: &r.content,
                        is_error: r.is_error,
                        images: &r.images,
                    },
                    r.content.len() + r.images.iter().map(|i| i.data.len() + 96).sum::<usize>(),
                );
            }
            if let Some(notice) = notice.as_deref().filter(|n| !n.is_empty()) {
                push(Kind::Text(notice), notice.len());
            }
        }
    }
    if out.len() == start {
        out.push(Block {
            kind: Kind::Text(EMPTY),
            marked: false,
        });
    }
}

/// The model's output and thinking settings for one call: its configuration, with what the
/// client of a compatible endpoint chose (SPEC §17) applied within it. The configured
/// `max_tokens` stays the ceiling; a thinking budget stays at least 1024 (the API minimum) and
/// below `max_tokens`, or thinking is off for the call.
struct Effective<'a> {
    max_tokens: u32,
    thinking: Thinking,
    budget: u32,
    effort: Option<&'a str>,
}

impl<'a> Effective<'a> {
    fn of(spec: &'a ModelSpec, req: &'a ChatRequest) -> Effective<'a> {
        let o = &req.options;
        let max_tokens = o
            .max_tokens
            .map_or(spec.max_tokens, |m| m.clamp(1, spec.max_tokens));
        let (mut thinking, mut budget) = match o.thinking {
            None => (spec.thinking, spec.thinking_budget),
            Some(ClientThinking::Disabled) => (Thinking::Off, 0),
            Some(ClientThinking::Adaptive) => (Thinking::Adaptive, 0),
            Some(ClientThinking::Enabled { budget_tokens }) => (Thinking::Budgeted, budget_tokens),
        };
        // The configuration alone was validated when it was loaded: sent as it is.
        let client_chose = o.max_tokens.is_some() || o.thinking.is_some();
        if thinking == Thinking::Budgeted && client_chose {
            budget = budget.min(max_tokens.saturating_sub(1));
            if budget < 1024 {
                thinking = Thinking::Off;
            }
        }
        Effective {
            max_tokens,
            thinking,
            budget,
            effort: o.effort.as_deref().or(spec.thinking_effort.as_deref()),
        }
    }
}

// ---- serialisation: every object's keys in sorted order -----------------------------------

impl Serialize for Body<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        let effective = Effective::of(self.head.spec, self.head.req);
        m.serialize_entry("max_tokens", &effective.max_tokens)?;
        m.serialize_entry("messages", &Messages(self))?;
        self.head.serialize_rest(&mut m, true)?;
        m.end()
    }
}

/// The keys of the body after "messages" but the tool keys, as an object of their own.
struct Rest<'a>(&'a Head<'a>);

impl Serialize for Rest<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        self.0.serialize_rest(&mut m, false)?;
        m.end()
    }
}

/// The `"tools"` array of the most recent tool list (`tool_memo`).
static TOOLS_JSON: ToolListMemo<std::sync::Arc<[u8]>> = ToolListMemo::new();

impl Head<'_> {
    /// The body's entries after "messages" (the keys sort after it), into `m`; the tool keys
    /// (the last ones) only `with_tools`.
    fn serialize_rest<M: SerializeMap>(&self, m: &mut M, with_tools: bool) -> Result<(), M::Error> {
        let spec = self.spec;
        let effective = Effective::of(spec, self.req);
        m.serialize_entry("model", &spec.model)?;
        let effort = match effective.thinking {
            Thinking::Adaptive => effective.effort,
            _ => None,
        };
        // Anthropic has no JSON mode: a `json_object` request is only checked (agent::run).
        let schema = match self.req.options.format.as_deref() {
            Some(OutputFormat::JsonSchema { schema, .. }) => Some(schema),
            _ => None,
        };
        if effort.is_some() || schema.is_some() {
            let format = schema.map(|schema| JsonOutputFormat {
                schema,
                kind: "json_schema",
            });
            m.serialize_entry("output_config", &OutputConfig { effort, format })?;
        }
        m.serialize_entry("stream", &true)?;
        if !self.system.is_empty() {
            m.serialize_entry("system", &System(self))?;
        }
        if let (Thinking::Off, Some(t)) = (effective.thinking, self.req.options.temperature) {
            m.serialize_entry("temperature", &t)?;
        }
        match effective.thinking {
            Thinking::Off => {}
            Thinking::Adaptive => m.serialize_entry("thinking", &ThinkingConfig(None))?,
            Thinking::Budgeted => {
                m.serialize_entry("thinking", &ThinkingConfig(Some(effective.budget)))?
            }
        }
        if with_tools && !self.req.tools.is_empty() {
            let choice = tool_choice(self.req, effective.thinking);
            let choice = serde_json::value::RawValue::from_string(
                String::from_utf8(choice).map_err(serde::ser::Error::custom)?,
            )
            .map_err(serde::ser::Error::custom)?;
            m.serialize_entry("tool_choice", &choice)?;
            m.serialize_entry("tools", &Tools(&self.req.tools, &spec.tool_schema))?;
        }
        Ok(())
    }
}

/// The `tool_choice` object, keys sorted: `auto`, `none`, `any` (a tool is required) or `tool`
/// with its name; `disable_parallel_tool_use` when the client asked for one call at a time.
/// A forced tool (`any`, `tool`) is refused by the API while thinking is on: `auto` then.
fn tool_choice(req: &ChatRequest, thinking: Thinking) -> Vec<u8> {
    let forced_ok = thinking == Thinking::Off;
    let (kind, name) = match &req.tool_choice {
        ToolChoice::None => ("none", None),
        ToolChoice::Required if forced_ok => ("any", None),
        ToolChoice::Tool(name) if forced_ok => ("tool", Some(name.as_str())),
        ToolChoice::Auto | ToolChoice::Required | ToolChoice::Tool(_) => ("auto", None),
    };
    let mut v = serde_json::Map::new();
    if kind != "none" && req.options.parallel_tool_calls == Some(false) {
        v.insert("disable_parallel_tool_use".into(), Value::Bool(true));
    }
    if let Some(name) = name {
        v.insert("name".into(), Value::String(name.to_string()));
    }
    v.insert("type".into(), Value::String(kind.into()));
    serde_json::to_vec(&v).unwrap_or_default()
}

// Fixed-shape objects derive `Serialize`: their fields are declared in key order.

#[derive(Serialize)]
struct OutputConfig<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    effort: Option<&'a str>,
    /// Structured output (SPEC §17).
    #[serde(skip_serializing_if = "Option::is_none")]
    format: Option<JsonOutputFormat<'a>>,
}

#[derive(Serialize)]
struct JsonOutputFormat<'a> {
    schema: &'a serde_json::Value,
    #[serde(rename = "type")]
    kind: &'static str,
}

/// `{"type": "adaptive"}` or `{"budget_tokens": n, "type": "enabled"}`.
struct ThinkingConfig(Option<u32>);

impl Serialize for ThinkingConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        match self.0 {
            None => m.serialize_entry("type", "adaptive")?,
            Some(budget) => {
                m.serialize_entry("budget_tokens", &budget)?;
                m.serialize_entry("type", "enabled")?;
            }
        }
        m.end()
    }
}

/// The breakpoint marker: `{"type": "ephemeral"}`, with `"ttl": "1h"` for the long TTL.
struct CacheControl(CacheTtl);

impl Serialize for CacheControl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        if self.0 == CacheTtl::OneHour {
            m.serialize_entry("ttl", "1h")?;
        }
        m.serialize_entry("type", "ephemeral")?;
        m.end()
    }
}

struct System<'a>(&'a Head<'a>);

impl Serialize for System<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.system.len()))?;
        for (text, marked) in &self.0.system {
            seq.serialize_element(&BlockOut {
                kind: &Kind::Text(text),
                marker: self.0.system_marker.filter(|_| *marked),
            })?;
        }
        seq.end()
    }
}

struct Messages<'a>(&'a Body<'a>);

impl Serialize for Messages<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let body = self.0;
        let mut seq = s.serialize_seq(Some(body.wire.len()))?;
        for (role, range) in &body.wire {
            seq.serialize_element(&WireMessage {
                body,
                role,
                blocks: &body.blocks[range.clone()],
            })?;
        }
        seq.end()
    }
}

struct WireMessage<'a> {
    body: &'a Body<'a>,
    role: &'a str,
    blocks: &'a [Block<'a>],
}

impl Serialize for WireMessage<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("content", &Content(self))?;
        m.serialize_entry("role", self.role)?;
        m.end()
    }
}

struct Content<'a>(&'a WireMessage<'a>);

impl Serialize for Content<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let marker = self.0.body.head.marker;
        let mut seq = s.serialize_seq(Some(self.0.blocks.len()))?;
        for b in self.0.blocks {
            seq.serialize_element(&BlockOut {
                kind: &b.kind,
                marker: marker.filter(|_| b.marked),
            })?;
        }
        seq.end()
    }
}

/// One content block; `cache_control` sorts before every other key of a block.
struct BlockOut<'a> {
    kind: &'a Kind<'a>,
    marker: Option<CacheTtl>,
}

impl Serialize for BlockOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        if let Some(ttl) = self.marker {
            m.serialize_entry("cache_control", &CacheControl(ttl))?;
        }
        match *self.kind {
            Kind::Text(text) => {
                m.serialize_entry("text", text)?;
                m.serialize_entry("type", "text")?;
            }
            Kind::Image { media_type, data } => {
                m.serialize_entry(
                    "source",
                    &ImageSource {
                        data,
                        media_type,
                        kind: "base64",
                    },
                )?;
                m.serialize_entry("type", "image")?;
            }
            Kind::Thinking {
                thinking,
                signature,
            } => {
                m.serialize_entry("signature", signature)?;
                m.serialize_entry("thinking", thinking)?;
                m.serialize_entry("type", "thinking")?;
            }
            Kind::RedactedThinking(data) => {
                m.serialize_entry("data", data)?;
                m.serialize_entry("type", "redacted_thinking")?;
            }
            Kind::ToolUse { id, name, input } => {
                m.serialize_entry("id", id)?;
                m.serialize_entry("input", input)?;
                m.serialize_entry("name", name)?;
                m.serialize_entry("type", "tool_use")?;
            }
            Kind::ToolResult {
                tool_use_id,
                content,
                is_error,
                images,
            } => {
                if images.is_empty() {
                    m.serialize_entry("content", content)?;
                } else {
                    m.serialize_entry("content", &ResultParts { content, images })?;
                }
                m.serialize_entry("is_error", &is_error)?;
                m.serialize_entry("tool_use_id", tool_use_id)?;
                m.serialize_entry("type", "tool_result")?;
            }
        }
        m.end()
    }
}

/// A tool result's content with images: its text block (none when empty, the API rejects
/// that) and an `image` block per image.
struct ResultParts<'a> {
    content: &'a str,
    images: &'a [ToolImage],
}

impl Serialize for ResultParts<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(None)?;
        if !self.content.is_empty() {
            seq.serialize_element(&BlockOut {
                kind: &Kind::Text(self.content),
                marker: None,
            })?;
        }
        for image in self.images {
            seq.serialize_element(&BlockOut {
                kind: &Kind::Image {
                    media_type: &image.media_type,
                    data: &image.data,
                },
                marker: None,
            })?;
        }
        seq.end()
    }
}

#[derive(Serialize)]
struct ImageSource<'a> {
    data: &'a str,
    media_type: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Serialize)]
struct Tool<'a> {
    description: &'a str,
    input_schema: std::borrow::Cow<'a, Value>,
    name: &'a str,
}

/// The `"tools"` array: each schema as the model's provider accepts it (`llm::schema`).
struct Tools<'a>(&'a [ToolSpec], &'a crate::config::ToolSchemaDialect);

impl Serialize for Tools<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|t| Tool {
            description: &t.description,
            input_schema: crate::llm::schema::for_dialect(&t.input_schema, self.1),
            name: &t.name,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::SystemBlock;
    use crate::llm::testutil::{model_spec, sample_request};
    use crate::message::{ThinkingBlock, ToolCall, ToolResult};
    use serde_json::json;

    fn spec(ttl: CacheTtl) -> ModelSpec {
        let mut s = model_spec(
            "primary",
            crate::config::ProviderKind::Anthropic,
            "http://x",
        );
        s.model = "claude-test".into();
        s.max_tokens = 1000;
        s.cache = true;
        s.cache_ttl = ttl;
        s
    }

    /// The expected body for `sample_request` with breakpoint marker `cc`.
    fn expected(cc: Value) -> Value {
        json!({
            "model": "claude-test",
            "max_tokens": 1000,
            "stream": true,
            "system": [
                { "type": "text", "text": "S1" },
                { "type": "text", "text": "S2", "cache_control": cc },
                { "type": "text", "text": "M1", "cache_control": cc },
            ],
            "messages": [
                { "role": "user", "content": [
                    { "type": "text", "text": "look" },
                    { "type": "image", "source": { "type": "base64", "media_type": "image/png", "data": "iVBO" } },
                ]},
                { "role": "assistant", "content": [
                    { "type": "thinking", "thinking": "hmm", "signature": "sig1" },
                    { "type": "redacted_thinking", "data": "opaque" },
                    { "type": "text", "text": "checking" },
                    { "type": "tool_use", "id": "tu1", "name": "read", "input": { "path": "a" } },
                    { "type": "tool_use", "id": "tu2", "name": "exec", "input": {} },
                ]},
                { "role": "user", "content": [
                    { "type": "tool_result", "tool_use_id": "tu1", "content": "A", "is_error": false },
                    { "type": "tool_result", "tool_use_id": "tu2", "content": "boom", "is_error": true },
                    { "type": "text", "text": "wrap up", "cache_control": cc },
                    { "type": "text", "text": "and also", "cache_control": cc },
                ]},
            ],
            "tools": [
                { "name": "read", "description": "Read a file", "input_schema": { "type": "object" } },
                { "name": "exec", "description": "Run", "input_schema": { "type": "object", "properties": {} } },
            ],
            "tool_choice": { "type": "auto" },
        })
    }

    #[test]
    fn snapshot_five_minute_ttl() {
        let body = render_request(&spec(CacheTtl::FiveMinutes), &sample_request());
        assert_eq!(body, expected(json!({ "type": "ephemeral" })));
    }

    #[test]
    fn snapshot_one_hour_ttl() {
        let body = render_request(&spec(CacheTtl::OneHour), &sample_request());
        assert_eq!(body, expected(json!({ "type": "ephemeral", "ttl": "1h" })));
    }

    #[test]
    fn deterministic_bytes() {
        let s = spec(CacheTtl::FiveMinutes);
        let a = render_body(&s, &sample_request()).unwrap();
        let b = render_body(&s, &sample_request()).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn same_bytes_as_the_value_rendering_for_the_sample() {
        for ttl in [CacheTtl::FiveMinutes, CacheTtl::OneHour] {
            for cache in [true, false] {
                let mut s = spec(ttl);
                s.cache = cache;
                let req = sample_request();
                assert_eq!(
                    String::from_utf8(render_body(&s, &req).unwrap()).unwrap(),
                    serde_json::to_string(&reference::render_request(&s, &req)).unwrap()
                );
            }
        }
    }

    proptest::proptest! {
        /// The bytes on the wire are exactly those of the earlier `Value` rendering, for any
        /// request and model definition: the rewrite cannot move a prompt-cache prefix.
        #[test]
        fn same_bytes_as_the_value_rendering(
            req in crate::llm::testutil::arb::request(),
            s in crate::llm::testutil::arb::spec(crate::config::ProviderKind::Anthropic),
        ) {
            let new = render_body(&s, &req).unwrap();
            let old = serde_json::to_vec(&reference::render_request(&s, &req)).unwrap();
            proptest::prop_assert_eq!(String::from_utf8(new).unwrap(), String::from_utf8(old).unwrap());
        }
    }

    fn count_markers(v: &Value) -> usize {
        match v {
            Value::Object(o) => {
                usize::from(o.contains_key("cache_control"))
                    + o.values().map(count_markers).sum::<usize>()
            }
            Value::Array(a) => a.iter().map(count_markers).sum(),
            _ => 0,
        }
    }

    #[test]
    fn no_markers_without_cache_and_never_more_than_four() {
        let mut s = spec(CacheTtl::FiveMinutes);
        let req = sample_request();
        assert_eq!(count_markers(&render_request(&s, &req)), 4);
        s.cache = false;
        assert_eq!(count_markers(&render_request(&s, &req)), 0);
    }

    #[test]
    fn previous_end_equal_to_last_block_gets_one_marker() {
        let s = spec(CacheTtl::FiveMinutes);
        let mut req = sample_request();
        req.previous_messages = Some(req.messages.len());
        // Stable + semi-stable + last block.
        assert_eq!(count_markers(&render_request(&s, &req)), 3);
        // Out of range and zero: ignored.
        req.previous_messages = Some(99);
        assert_eq!(count_markers(&render_request(&s, &req)), 3);
        req.previous_messages = Some(0);
        assert_eq!(count_markers(&render_request(&s, &req)), 3);
        req.previous_messages = None;
        assert_eq!(count_markers(&render_request(&s, &req)), 3);
    }

    #[test]
    fn thinking_modes_and_tool_choice() {
        let mut s = spec(CacheTtl::FiveMinutes);
        s.cache = false;
        let mut req = sample_request();
        req.tool_choice = ToolChoice::None;

        s.thinking = Thinking::Adaptive;
        s.thinking_effort = Some("high".into());
        let body = render_request(&s, &req);
        assert_eq!(body["thinking"], json!({ "type": "adaptive" }));
        assert_eq!(body["output_config"], json!({ "effort": "high" }));
        assert_eq!(body["tool_choice"], json!({ "type": "none" }));

        s.thinking_effort = None;
        let body = render_request(&s, &req);
        assert!(body.get("output_config").is_none());

        s.thinking = Thinking::Budgeted;
        s.thinking_budget = 5000;
        let body = render_request(&s, &req);
        assert_eq!(
            body["thinking"],
            json!({ "type": "enabled", "budget_tokens": 5000 })
        );

        s.thinking = Thinking::Off;
        req.tools = Default::default();
        let body = render_request(&s, &req);
        assert!(body.get("thinking").is_none());
        assert!(body.get("tools").is_none());
        assert!(body.get("tool_choice").is_none());
    }

    #[test]
    fn consecutive_user_role_messages_merge_into_one() {
        let mut s = spec(CacheTtl::FiveMinutes);
        s.cache = false;
        let req = ChatRequest {
            options: Default::default(),
            deltas: None,
            stable_ttl: None,
            session_id: "s".into(),
            system: vec![],
            messages: vec![
                Message::user_text("one"),
                Message::user_text("two"),
                Message::Assistant {
                    text: String::new(),
                    tool_calls: vec![],
                    thinking: vec![],
                    usage: None,
                },
                Message::ToolResults {
                    results: vec![ToolResult {
                        tool_call_id: "x".into(),
                        content: "r".into(),
                        is_error: false,
                        images: Vec::new(),
                    }],
                    notice: None,
                },
                Message::user_text("three"),
            ],
            tools: Default::default(),
            tool_choice: ToolChoice::Auto,
            previous_messages: None,
            rendered: Default::default(),
        };
        let body = render_request(&s, &req);
        assert!(body.get("system").is_none());
        assert_eq!(
            body["messages"],
            json!([
                { "role": "user", "content": [
                    { "type": "text", "text": "one" },
                    { "type": "text", "text": "two" },
                ]},
                { "role": "assistant", "content": [ { "type": "text", "text": "(empty)" } ] },
                { "role": "user", "content": [
                    { "type": "tool_result", "tool_use_id": "x", "content": "r", "is_error": false },
                    { "type": "text", "text": "three" },
                ]},
            ])
        );
    }

    #[test]
    fn previous_breakpoint_inside_merged_message() {
        // Previous call ended with the tool results; this call added a user turn that merges
        // into the same wire message. The marker stays on the old last block.
        let s = spec(CacheTtl::FiveMinutes);
        let req = ChatRequest {
            options: Default::default(),
            deltas: None,
            stable_ttl: None,
            session_id: "s".into(),
            system: vec![SystemBlock {
                tier: SystemTier::Stable,
                text: "S".into(),
            }],
            messages: vec![
                Message::user_text("q"),
                Message::Assistant {
                    text: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "t".into(),
                        name: "n".into(),
                        arguments: json!({}),
                    }],
                    thinking: vec![ThinkingBlock {
                        thinking: Some("x".into()),
                        signature: Some("s".into()),
                        redacted_data: None,
                    }],
                    usage: None,
                },
                Message::ToolResults {
                    results: vec![ToolResult {
                        tool_call_id: "t".into(),
                        content: "ok".into(),
                        is_error: false,
                        images: Vec::new(),
                    }],
                    notice: None,
                },
                Message::user_text("next"),
            ],
            tools: Default::default(),
            tool_choice: ToolChoice::Auto,
            previous_messages: Some(3),
            rendered: Default::default(),
        };
        let body = render_request(&s, &req);
        let cc = json!({ "type": "ephemeral" });
        assert_eq!(
            body["messages"][2],
            json!({ "role": "user", "content": [
                { "type": "tool_result", "tool_use_id": "t", "content": "ok", "is_error": false, "cache_control": cc },
                { "type": "text", "text": "next", "cache_control": cc },
            ]})
        );
        assert_eq!(
            body["system"],
            json!([{ "type": "text", "text": "S", "cache_control": cc }])
        );
    }

    #[test]
    fn empty_texts_are_left_out() {
        let s = spec(CacheTtl::FiveMinutes);
        let cc = json!({ "type": "ephemeral" });
        let text = |t: &str| UserBlock::Text { text: t.into() };
        let mut req = ChatRequest {
            options: Default::default(),
            deltas: None,
            stable_ttl: None,
            session_id: "s".into(),
            system: vec![
                SystemBlock {
                    tier: SystemTier::Stable,
                    text: "S".into(),
                },
                SystemBlock {
                    tier: SystemTier::Stable,
                    text: String::new(),
                },
            ],
            messages: vec![
                Message::User {
                    content: vec![text(""), text("q")],
                },
                Message::ToolResults {
                    results: vec![ToolResult {
                        tool_call_id: "t".into(),
                        content: String::new(),
                        is_error: false,
                        images: Vec::new(),
                    }],
                    notice: Some(String::new()),
                },
                Message::User {
                    content: vec![text("")],
                },
            ],
            tools: Default::default(),
            tool_choice: ToolChoice::Auto,
            previous_messages: None,
            rendered: Default::default(),
        };
        let body = render_request(&s, &req);
        // The stable marker moves to the last non-empty stable block.
        assert_eq!(
            body["system"],
            json!([{ "type": "text", "text": "S", "cache_control": cc }])
        );
        assert_eq!(
            body["messages"],
            json!([{ "role": "user", "content": [
                { "type": "text", "text": "q" },
                { "type": "tool_result", "tool_use_id": "t", "content": "", "is_error": false },
                { "type": "text", "text": EMPTY, "cache_control": cc },
            ]}])
        );

        req.system[0].text.clear();
        assert!(render_request(&s, &req).get("system").is_none());
    }
}
