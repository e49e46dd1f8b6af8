//! Neutral request → OpenAI-compatible chat-completions JSON. Deterministic, like Anthropic's:
//! OpenAI's automatic prefix cache also needs byte-identical prefixes.
//!
//! Serialised straight from the borrowed request into bytes, every object's keys in sorted
//! order — the order of the earlier `serde_json::Value` rendering, which `render/reference.rs`
//! keeps as the oracle of a byte-identity property test.

#[cfg(test)]
mod reference;

use std::fmt;

use serde::Serialize;
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde_json::Value;

use crate::config::ModelSpec;
use crate::llm::each::Each;
use crate::llm::tool_memo::{ToolListMemo, finish_body};
use crate::llm::{ChatRequest, ToolChoice, ToolSpec};
use crate::message::call::OutputFormat;
use crate::message::rendered::{Rendered, WireFormat};
use crate::message::{Message, ToolCall, ToolResult, UserBlock};

/// The request body for `POST {base_url}/chat/completions` (always streamed, usage included),
/// as bytes.
pub fn render_body(spec: &ModelSpec, req: &ChatRequest) -> serde_json::Result<Vec<u8>> {
    let mut size = 512 + req.system.iter().map(|b| b.text.len() + 2).sum::<usize>();
    for m in &req.messages {
        size += match m {
            Message::User { content } => content
                .iter()
                .map(|b| match b {
                    UserBlock::Text { text } => text.len() + 32,
                    UserBlock::Image { data, .. } => data.len() + 64,
                })
                .sum(),
            Message::Assistant { text, .. } => text.len() + 128,
            Message::ToolResults { results, .. } => results
                .iter()
                .map(|r| {
                    r.content.len() + 64 + r.images.iter().map(|i| i.data.len() + 96).sum::<usize>()
                })
                .sum(),
        } + 32;
    }
    if let Some(cached) = render_cached(spec, req) {
        let cached = cached?;
        #[cfg(debug_assertions)]
        {
            let mut full = Vec::with_capacity(size);
            serde_json::to_writer(&mut full, &Body { spec, req })?;
            crate::llm::check_cached_render(&cached, &full);
        }
        return Ok(cached);
    }
    let mut out = Vec::with_capacity(size);
    serde_json::to_writer(&mut out, &Body { spec, req })?;
    Ok(out)
}

/// The body with each message's wire messages taken from the request's render cache
/// (`message::rendered`), rendering (and keeping) only the messages it does not hold; the same
/// bytes as the full render. `None` when the cache is disabled.
fn render_cached(spec: &ModelSpec, req: &ChatRequest) -> Option<serde_json::Result<Vec<u8>>> {
    let entries = match req
        .rendered
        .sync(WireFormat::OpenAi, &req.messages, render_message)?
    {
        Ok(entries) => entries,
        Err(e) => return Some(Err(e)),
    };
    let mut size = 1024 + req.system.iter().map(|b| b.text.len() + 2).sum::<usize>();
    size += entries.iter().map(|e| e.bytes.len() + 1).sum::<usize>();
    size += req
        .tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + 256)
        .sum::<usize>();
    let mut out = crate::llm::body_pool::take(size);
    let result = (|| {
        out.push(b'{');
        serde_json::to_writer(&mut out, max_tokens_key(spec))?;
        out.push(b':');
        serde_json::to_writer(&mut out, &max_tokens(spec, req))?;
        out.extend_from_slice(b",\"messages\":[");
        let mut first = true;
        if let Some(system) = system_message(req) {
            serde_json::to_writer(&mut out, &system.element())?;
            first = false;
        }
        for entry in entries.iter().filter(|e| !e.bytes.is_empty()) {
            if !first {
                out.push(b',');
            }
            out.extend_from_slice(&entry.bytes);
            first = false;
        }
        out.push(b']');
        let choice = tool_choice(req);
        finish_body(
            &mut out,
            |out| serde_json::to_writer(out, &Rest(Body { spec, req })),
            &req.tools,
            &choice,
            (&TOOLS_JSON, crate::llm::schema::tag(&spec.tool_schema)),
            |tools| serde_json::to_vec(&Tools(tools, &spec.tool_schema)),
        )
    })();
    Some(result.map(|()| out))
}

/// The wire messages of one neutral message (possibly none), comma-separated, for the cache.
fn render_message(message: &Message, r: &mut Rendered) -> serde_json::Result<()> {
    let mut result = Ok(());
    for_each_element(message, |e| {
        if result.is_err() {
            return;
        }
        if !r.bytes.is_empty() {
            r.bytes.push(b',');
        }
        r.last = r.bytes.len();
        result = serde_json::to_writer(&mut r.bytes, &e);
    });
    result
}

/// The output cap of the call: the model's `max_tokens`, or less when the client of a
/// compatible endpoint asked for less (SPEC §17).
fn max_tokens(spec: &ModelSpec, req: &ChatRequest) -> u32 {
    req.options
        .max_tokens
        .map_or(spec.max_tokens, |m| m.clamp(1, spec.max_tokens))
}

/// OpenAI's reasoning models reject `max_tokens`; other servers often only know it.
fn max_tokens_key(spec: &ModelSpec) -> &'static str {
    if spec.base_url.contains("api.openai.com") {
        "max_completion_tokens"
    } else {
        "max_tokens"
    }
}

/// The system blocks joined into one system message (none without blocks).
struct SystemMessage(String);

impl SystemMessage {
    fn element(&self) -> Element<'_> {
        Element::Simple(Simple {
            content: &self.0,
            role: "system",
        })
    }
}

fn system_message(req: &ChatRequest) -> Option<SystemMessage> {
    (!req.system.is_empty()).then(|| {
        SystemMessage(
            req.system
                .iter()
                .map(|b| b.text.as_str())
                .collect::<Vec<_>>()
                .join("\n\n"),
        )
    })
}

/// One wire message.
enum Element<'a> {
    Simple(Simple<'a>),
    User(User<'a>),
    Assistant(Assistant<'a>),
    Tool(ToolMessage<'a>),
    ToolImages(ToolImages<'a>),
}

impl Serialize for Element<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Element::Simple(e) => e.serialize(s),
            Element::User(e) => e.serialize(s),
            Element::Assistant(e) => e.serialize(s),
            Element::Tool(e) => e.serialize(s),
            Element::ToolImages(e) => e.serialize(s),
        }
    }
}

/// The wire messages of one neutral message, in order: a tool-results message becomes one
/// `tool` message per result, then a user message with the results' images (a `tool` message
/// carries text only), then its notice as a user message.
fn for_each_element<'a>(message: &'a Message, mut f: impl FnMut(Element<'a>)) {
    match message {
        Message::User { content } => f(Element::User(User(content))),
        Message::Assistant {
            text, tool_calls, ..
        } => f(Element::Assistant(Assistant { text, tool_calls })),
        Message::ToolResults { results, notice } => {
            for r in results {
                f(Element::Tool(ToolMessage(r)));
            }
            if results.iter().any(|r| !r.images.is_empty()) {
                f(Element::ToolImages(ToolImages(results)));
            }
            if let Some(notice) = notice {
                f(Element::Simple(Simple {
                    content: notice,
                    role: "user",
                }));
            }
        }
    }
}

/// [`render_body`] as a JSON value, for tests (the client sends the bytes).
#[cfg(test)]
pub fn render_request(spec: &ModelSpec, req: &ChatRequest) -> serde_json::Value {
    render_body(spec, req)
        .and_then(|bytes| serde_json::from_slice(&bytes))
        .expect("a rendered body is valid JSON")
}

struct Body<'a> {
    spec: &'a ModelSpec,
    req: &'a ChatRequest,
}

impl Serialize for Body<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry(max_tokens_key(self.spec), &max_tokens(self.spec, self.req))?;
        m.serialize_entry("messages", &Messages(self.req))?;
        self.serialize_rest(&mut m, true)?;
        m.end()
    }
}

/// The keys of the body after "messages", as an object of their own.
struct Rest<'a>(Body<'a>);

impl Serialize for Rest<'_> {
    /// The keys after "messages" but the tool keys.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        self.0.serialize_rest(&mut m, false)?;
        m.end()
    }
}

/// The `"tools"` array of the most recent tool list (`tool_memo`).
static TOOLS_JSON: ToolListMemo<std::sync::Arc<[u8]>> = ToolListMemo::new();

impl Body<'_> {
    /// The body's entries after "messages" (the keys sort after it), into `m`; the tool keys
    /// (the last ones) only `with_tools`.
    fn serialize_rest<M: SerializeMap>(&self, m: &mut M, with_tools: bool) -> Result<(), M::Error> {
        let (spec, req) = (self.spec, self.req);
        m.serialize_entry("model", &spec.model)?;
        if spec.prompt_cache_key {
            m.serialize_entry("prompt_cache_key", &req.session_id)?;
        }
        if let Some(effort) = &req.options.effort {
            m.serialize_entry("reasoning_effort", effort)?;
        }
        if let Some(format) = &req.options.format {
            m.serialize_entry(
                "response_format",
                &ResponseFormat(format, &spec.tool_schema),
            )?;
        }
        m.serialize_entry("stream", &true)?;
        m.serialize_entry(
            "stream_options",
            &StreamOptions {
                include_usage: true,
            },
        )?;
        if let Some(t) = req.options.temperature {
            m.serialize_entry("temperature", &t)?;
        }
        if with_tools && !req.tools.is_empty() {
            m.serialize_entry("tool_choice", &ChoiceValue(&req.tool_choice))?;
            if parallel_off(req) {
                m.serialize_entry("parallel_tool_calls", &false)?;
            }
            m.serialize_entry("tools", &Tools(&req.tools, &spec.tool_schema))?;
        }
        Ok(())
    }
}

/// Whether the client asked for one tool call at a time (and there is a call to make).
fn parallel_off(req: &ChatRequest) -> bool {
    req.options.parallel_tool_calls == Some(false) && req.tool_choice != ToolChoice::None
}

/// The value of `tool_choice`, and `parallel_tool_calls` after it when the client turned
/// parallel calls off: the bytes that follow `"tool_choice":` in the body.
fn tool_choice(req: &ChatRequest) -> Vec<u8> {
    let mut out = serde_json::to_vec(&ChoiceValue(&req.tool_choice)).unwrap_or_default();
    if parallel_off(req) {
        out.extend_from_slice(b",\"parallel_tool_calls\":false");
    }
    out
}

/// `"auto"`, `"none"`, `"required"` or `{"type": "function", "function": {"name": …}}`.
struct ChoiceValue<'a>(&'a ToolChoice);

impl Serialize for ChoiceValue<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            ToolChoice::Auto => s.serialize_str("auto"),
            ToolChoice::None => s.serialize_str("none"),
            ToolChoice::Required => s.serialize_str("required"),
            ToolChoice::Tool(name) => {
                let mut m = s.serialize_map(Some(2))?;
                m.serialize_entry("type", "function")?;
                m.serialize_entry("function", &NameOnly { name })?;
                m.end()
            }
        }
    }
}

#[derive(Serialize)]
struct NameOnly<'a> {
    name: &'a str,
}

// Fixed-shape objects derive `Serialize`: their fields are declared in key order.

/// `response_format` (SPEC §17 structured output): `{"type": "json_object"}` or
/// `{"json_schema": {"description"?, "name", "schema", "strict"?}, "type": "json_schema"}`,
/// the schema reduced to what the provider's grammar accepts (`schema_keywords`), as tool
/// schemas are: the final answer is still checked against the full one.
struct ResponseFormat<'a>(&'a OutputFormat, &'a crate::config::ToolSchemaDialect);

impl Serialize for ResponseFormat<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        match self.0 {
            OutputFormat::JsonObject => m.serialize_entry("type", "json_object")?,
            OutputFormat::JsonSchema {
                name,
                schema,
                strict,
                description,
            } => {
                m.serialize_entry(
                    "json_schema",
                    &JsonSchema {
                        description: description.as_deref(),
                        name,
                        schema: &crate::llm::schema::for_dialect(schema, self.1),
                        strict: *strict,
                    },
                )?;
                m.serialize_entry("type", "json_schema")?;
            }
        }
        m.end()
    }
}

#[derive(Serialize)]
struct JsonSchema<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    name: &'a str,
    schema: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

struct Messages<'a>(&'a ChatRequest);

impl Serialize for Messages<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let req = self.0;
        let mut seq = s.serialize_seq(None)?;
        if let Some(system) = system_message(req) {
            seq.serialize_element(&system.element())?;
        }
        for message in &req.messages {
            let mut result = Ok(());
            for_each_element(message, |e| {
                if result.is_ok() {
                    result = seq.serialize_element(&e);
                }
            });
            result?;
        }
        seq.end()
    }
}

/// `{"content": "…", "role": …}`.
#[derive(Serialize)]
struct Simple<'a> {
    content: &'a str,
    role: &'a str,
}

/// A user message: a plain string for a single text block, else content parts.
struct User<'a>(&'a [UserBlock]);

impl Serialize for User<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        match self.0 {
            [] => m.serialize_entry("content", "")?,
            [UserBlock::Text { text }] => m.serialize_entry("content", text)?,
            blocks => m.serialize_entry("content", &Each(blocks, Part))?,
        }
        m.serialize_entry("role", "user")?;
        m.end()
    }
}

struct Part<'a>(&'a UserBlock);

impl Serialize for Part<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            UserBlock::Text { text } => TextPart(text).serialize(s),
            UserBlock::Image {
                media_type, data, ..
            } => ImagePart(ImageUrl { media_type, data }).serialize(s),
        }
    }
}

/// `{"url": "data:<media type>;base64,<data>"}`.
struct ImageUrl<'a> {
    media_type: &'a str,
    data: &'a str,
}

impl Serialize for ImageUrl<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry(
            "url",
            &Display(format_args!(
                "data:{};base64,{}",
                self.media_type, self.data
            )),
        )?;
        m.end()
    }
}

struct Assistant<'a> {
    text: &'a str,
    tool_calls: &'a [ToolCall],
}

impl Serialize for Assistant<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        if !self.text.is_empty() {
            m.serialize_entry("content", self.text)?;
        } else if self.tool_calls.is_empty() {
            // Without tool calls, content is required.
            m.serialize_entry("content", "")?;
        } else {
            m.serialize_entry("content", &())?;
        }
        m.serialize_entry("role", "assistant")?;
        if !self.tool_calls.is_empty() {
            m.serialize_entry("tool_calls", &Each(self.tool_calls, call))?;
        }
        m.end()
    }
}

#[derive(Serialize)]
struct Call<'a> {
    function: CallFunction<'a>,
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
}

/// `{"arguments": "<the arguments as compact JSON text>", "name": …}`.
#[derive(Serialize)]
struct CallFunction<'a> {
    arguments: Display<&'a serde_json::Value>,
    name: &'a str,
}

fn call(c: &ToolCall) -> Call<'_> {
    Call {
        function: CallFunction {
            arguments: Display(&c.arguments),
            name: &c.name,
        },
        id: &c.id,
        kind: "function",
    }
}

/// The images of tool results as one user message: each image after a text part with its
/// placeholder, which the `tool` message's text also holds.
struct ToolImages<'a>(&'a [ToolResult]);

impl Serialize for ToolImages<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Parts<'a>(&'a [ToolResult]);
        impl Serialize for Parts<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut seq = s.serialize_seq(None)?;
                for image in self.0.iter().flat_map(|r| &r.images) {
                    seq.serialize_element(&TextPart(&image.placeholder))?;
                    seq.serialize_element(&ImagePart(ImageUrl {
                        media_type: &image.media_type,
                        data: &image.data,
                    }))?;
                }
                seq.end()
            }
        }
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("content", &Parts(self.0))?;
        m.serialize_entry("role", "user")?;
        m.end()
    }
}

/// `{"text": …, "type": "text"}`.
struct TextPart<'a>(&'a str);

impl Serialize for TextPart<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("text", self.0)?;
        m.serialize_entry("type", "text")?;
        m.end()
    }
}

/// `{"image_url": {"url": …}, "type": "image_url"}`.
struct ImagePart<'a>(ImageUrl<'a>);

impl Serialize for ImagePart<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("image_url", &self.0)?;
        m.serialize_entry("type", "image_url")?;
        m.end()
    }
}

/// A tool result as a `tool` message; errors are prefixed so the model can tell.
struct ToolMessage<'a>(&'a ToolResult);

impl Serialize for ToolMessage<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.0;
        let mut m = s.serialize_map(Some(3))?;
        if r.is_error {
            m.serialize_entry("content", &Display(format_args!("ERROR: {}", r.content)))?;
        } else {
            m.serialize_entry("content", &r.content)?;
        }
        m.serialize_entry("role", "tool")?;
        m.serialize_entry("tool_call_id", &r.tool_call_id)?;
        m.end()
    }
}

/// Serialises a `Display` value as a JSON string, without building the string first.
struct Display<T: fmt::Display>(T);

impl<T: fmt::Display> Serialize for Display<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

#[derive(Serialize)]
struct Tool<'a> {
    function: ToolFunction<'a>,
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Serialize)]
struct ToolFunction<'a> {
    description: &'a str,
    name: &'a str,
    parameters: std::borrow::Cow<'a, serde_json::Value>,
}

/// The `"tools"` array: each schema as the model's provider accepts it (`llm::schema`).
struct Tools<'a>(&'a [ToolSpec], &'a crate::config::ToolSchemaDialect);

impl Serialize for Tools<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|t| Tool {
            function: ToolFunction {
                description: &t.description,
                name: &t.name,
                parameters: crate::llm::schema::for_dialect(&t.input_schema, self.1),
            },
            kind: "function",
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProviderKind;
    use crate::llm::testutil::{model_spec, sample_request};
    use serde_json::{Value, json};

    proptest::proptest! {
        /// The bytes on the wire are exactly those of the earlier `Value` rendering.
        #[test]
        fn same_bytes_as_the_value_rendering(
            req in crate::llm::testutil::arb::request(),
            s in crate::llm::testutil::arb::spec(ProviderKind::OpenAi),
        ) {
            let new = render_body(&s, &req).unwrap();
            let old = serde_json::to_vec(&reference::render_request(&s, &req)).unwrap();
            proptest::prop_assert_eq!(String::from_utf8(new).unwrap(), String::from_utf8(old).unwrap());
        }
    }

    #[test]
    fn snapshot_small_conversation() {
        let mut spec = model_spec("primary", ProviderKind::OpenAi, "http://localhost:11434/v1");
        spec.model = "llama".into();
        spec.max_tokens = 512;
        let body = render_request(&spec, &sample_request());
        assert_eq!(
            body,
            json!({
                "model": "llama",
                "stream": true,
                "stream_options": { "include_usage": true },
                "max_tokens": 512,
                "messages": [
                    { "role": "system", "content": "S1\n\nS2\n\nM1" },
                    { "role": "user", "content": [
                        { "type": "text", "text": "look" },
                        { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBO" } },
                    ]},
                    { "role": "assistant", "content": "checking", "tool_calls": [
                        { "id": "tu1", "type": "function", "function": { "name": "read", "arguments": "{\"path\":\"a\"}" } },
                        { "id": "tu2", "type": "function", "function": { "name": "exec", "arguments": "{}" } },
                    ]},
                    { "role": "tool", "tool_call_id": "tu1", "content": "A" },
                    { "role": "tool", "tool_call_id": "tu2", "content": "ERROR: boom" },
                    { "role": "user", "content": "wrap up" },
                    { "role": "user", "content": "and also" },
                ],
                "tools": [
                    { "type": "function", "function": { "name": "read", "description": "Read a file", "parameters": { "type": "object" } } },
                    { "type": "function", "function": { "name": "exec", "description": "Run", "parameters": { "type": "object", "properties": {} } } },
                ],
                "tool_choice": "auto",
            })
        );
    }

    #[test]
    fn openai_host_uses_max_completion_tokens_and_cache_key() {
        let mut spec = model_spec("primary", ProviderKind::OpenAi, "https://api.openai.com/v1");
        spec.prompt_cache_key = true;
        let mut req = sample_request();
        req.tools = Default::default();
        let body = render_request(&spec, &req);
        assert_eq!(body["max_completion_tokens"], json!(1000));
        assert!(body.get("max_tokens").is_none());
        assert_eq!(body["prompt_cache_key"], json!("sess-1"));
        assert!(body.get("tools").is_none());
        assert!(body.get("tool_choice").is_none());
    }

    #[test]
    fn assistant_without_text_has_null_content_and_tool_choice_none() {
        let spec = model_spec("primary", ProviderKind::OpenAi, "http://x");
        let mut req = sample_request();
        req.tool_choice = ToolChoice::None;
        req.system.clear();
        if let Message::Assistant { text, .. } = &mut req.messages[1] {
            text.clear();
        }
        let body = render_request(&spec, &req);
        assert_eq!(body["tool_choice"], json!("none"));
        assert_eq!(body["messages"][1]["role"], json!("assistant"));
        assert_eq!(body["messages"][1]["content"], Value::Null);
        assert!(body.get("prompt_cache_key").is_none());
    }
}
