//! Conformance of the request bodies the hand-written clients send with the providers' published
//! API descriptions: every body `render_request` produces for a representative set of neutral
//! requests must validate against the request-body schema of `POST /v1/messages` (Anthropic) or
//! `POST /chat/completions` (OpenAI). The schemas are extracted from the OpenAPI files by
//! `scripts/extract-spec-schemas.py`; provenance and spec gaps are in
//! `tests/fixtures/specs/README.md`.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::LazyLock;

use jsonschema::error::ValidationErrorKind;
use jsonschema::{Draft, ValidationError, Validator};
use serde_json::{Value, json};

use crate::config::{CacheTtl, ModelSpec, ProviderKind, Thinking};
use crate::llm::testutil::{model_spec, sample_request};
use crate::llm::{ChatRequest, SystemBlock, SystemTier, ToolChoice, ToolSpec, anthropic, openai};
use crate::message::{Message, ThinkingBlock, ToolCall, ToolImage, ToolResult, UserBlock};

const ANTHROPIC_SCHEMA: &str =
    include_str!("../../tests/fixtures/specs/anthropic-messages-request.schema.json");
const OPENAI_SCHEMA: &str =
    include_str!("../../tests/fixtures/specs/openai-chat-request.schema.json");

static ANTHROPIC: LazyLock<Validator> =
    LazyLock::new(|| compile("anthropic-messages-request", ANTHROPIC_SCHEMA));
static OPENAI: LazyLock<Validator> =
    LazyLock::new(|| compile("openai-chat-request", OPENAI_SCHEMA));

/// Compile a fixture. Every `$ref` in it is local (`#/components/schemas/...`), so nothing is
/// retrieved.
fn compile(name: &str, text: &str) -> Validator {
    let schema: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("fixture {name} is not JSON: {e}; regenerate it"));
    jsonschema::options()
        .with_draft(Draft::Draft202012)
        .build(&schema)
        .unwrap_or_else(|e| panic!("fixture {name} does not compile: {e}"))
}

/// One error line, with the failures of the `anyOf`/`oneOf` branches indented below it (the
/// top-level message alone does not say which field of which branch was wrong). Branches for
/// another variant (their `type` or `role` does not match) are counted, not listed.
fn describe(error: &ValidationError<'_>, depth: usize, out: &mut String) {
    let indent = "  ".repeat(depth);
    let _ = writeln!(
        out,
        "{indent}- at {} (schema {}): {}",
        shown(&error.instance_path().to_string()),
        error.evaluation_path(),
        error.masked_with("<value>")
    );
    let branches = match error.kind() {
        ValidationErrorKind::AnyOf { context } | ValidationErrorKind::OneOfNotValid { context } => {
            context
        }
        _ => return,
    };
    let at = error.instance_path().to_string();
    let mut relevant: Vec<_> = branches
        .iter()
        .enumerate()
        .filter(|(_, branch)| !other_variant(&at, branch))
        .collect();
    if relevant.is_empty() {
        relevant = branches.iter().enumerate().collect();
    }
    let omitted = branches.len() - relevant.len();
    if omitted > 0 {
        let _ = writeln!(
            out,
            "{indent}  ({omitted} branches for other variants omitted)"
        );
    }
    for (i, branch) in relevant {
        let _ = writeln!(out, "{indent}  branch {i}:");
        for e in branch {
            describe(e, depth + 2, out);
        }
    }
}

/// Whether a branch failed because the instance at `at` is another variant: its `type` or
/// `role` property does not have the branch's constant/enum value.
fn other_variant(at: &str, branch: &[ValidationError<'_>]) -> bool {
    branch.iter().any(|e| {
        let path = e.instance_path().to_string();
        matches!(
            e.kind(),
            ValidationErrorKind::Constant { .. } | ValidationErrorKind::Enum { .. }
        ) && (path == format!("{at}/type") || path == format!("{at}/role"))
    })
}

/// Panics with every validation error (instance path, schema path, branch details) and the
/// rendered body unless `body` is a valid Anthropic Messages request.
fn assert_anthropic(case: &str, body: &Value) {
    let mut report = String::new();
    for e in ANTHROPIC.iter_errors(body) {
        describe(&e, 0, &mut report);
    }
    fail_on_report("anthropic", case, body, &report);
}

/// Like `assert_anthropic` for an OpenAI chat-completions request, plus `undeclared_keys`.
fn assert_openai(case: &str, body: &Value) {
    let mut report = String::new();
    for e in OPENAI.iter_errors(body) {
        describe(&e, 0, &mut report);
    }
    for problem in undeclared_keys(body) {
        let _ = writeln!(report, "- {problem}");
    }
    fail_on_report("openai", case, body, &report);
}

fn fail_on_report(api: &str, case: &str, body: &Value, report: &str) {
    if report.is_empty() {
        return;
    }
    let pretty = serde_json::to_string_pretty(body).unwrap_or_else(|e| e.to_string());
    panic!(
        "{api} request `{case}` violates the API description:\n{report}rendered body:\n{pretty}"
    );
}

/// A JSON pointer for humans: the root is "(root)", not "".
fn shown(pointer: &str) -> &str {
    if pointer.is_empty() {
        "(root)"
    } else {
        pointer
    }
}

/// A schema of the OpenAI fixture by name.
fn openai_schema(name: &str) -> &'static Value {
    static DOC: LazyLock<Value> = LazyLock::new(|| {
        serde_json::from_str(OPENAI_SCHEMA).unwrap_or_else(|e| panic!("openai fixture: {e}"))
    });
    &DOC["components"]["schemas"][name]
}

/// Property names `schema` declares, through `$ref`, `allOf` and the branches of
/// `anyOf`/`oneOf` (their union).
fn declared(schema: &Value, out: &mut BTreeSet<String>) {
    if let Some(props) = schema["properties"].as_object() {
        out.extend(props.keys().cloned());
    }
    if let Some(name) = schema["$ref"]
        .as_str()
        .and_then(|r| r.strip_prefix("#/components/schemas/"))
    {
        declared(openai_schema(name), out);
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        for sub in schema[key].as_array().into_iter().flatten() {
            declared(sub, out);
        }
    }
}

/// OpenAI's schemas leave `additionalProperties` open, so a misspelt optional field would
/// still validate. This closes the gap for the objects agentd builds: the body, each message,
/// tool call, content part, tool and function may only use keys the description declares.
fn undeclared_keys(body: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let mut check = |at: String, object: &Value, schema: &Value, name: &str| {
        let mut allowed = BTreeSet::new();
        declared(schema, &mut allowed);
        for key in object.as_object().into_iter().flat_map(|o| o.keys()) {
            if !allowed.contains(key) {
                problems.push(format!(
                    "at {}: `{key}` is not a property of {name}",
                    shown(&at)
                ));
            }
        }
    };
    let request = "CreateChatCompletionRequest";
    check(String::new(), body, openai_schema(request), request);
    let options = "ChatCompletionStreamOptions";
    check(
        "/stream_options".into(),
        &body["stream_options"],
        openai_schema(options),
        options,
    );
    for (i, message) in body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let name = match message["role"].as_str() {
            Some("system") => "ChatCompletionRequestSystemMessage",
            Some("user") => "ChatCompletionRequestUserMessage",
            Some("assistant") => "ChatCompletionRequestAssistantMessage",
            Some("tool") => "ChatCompletionRequestToolMessage",
            _ => continue, // the schema reports unknown roles
        };
        check(format!("/messages/{i}"), message, openai_schema(name), name);
        let part = "ChatCompletionRequestUserMessageContentPart";
        for (j, p) in message["content"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            check(
                format!("/messages/{i}/content/{j}"),
                p,
                openai_schema(part),
                part,
            );
        }
        let call = "ChatCompletionMessageToolCall";
        for (j, c) in message["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let at = format!("/messages/{i}/tool_calls/{j}");
            check(at.clone(), c, openai_schema(call), call);
            let function = &openai_schema(call)["properties"]["function"];
            check(
                format!("{at}/function"),
                &c["function"],
                function,
                "its function",
            );
        }
    }
    for (i, tool) in body["tools"].as_array().into_iter().flatten().enumerate() {
        let (t, f) = ("ChatCompletionTool", "FunctionObject");
        check(format!("/tools/{i}"), tool, openai_schema(t), t);
        check(
            format!("/tools/{i}/function"),
            &tool["function"],
            openai_schema(f),
            f,
        );
    }
    problems
}

fn check_anthropic(case: &str, spec: &ModelSpec, req: &ChatRequest) {
    assert_anthropic(case, &anthropic::render_request(spec, req));
}

fn check_openai(case: &str, spec: &ModelSpec, req: &ChatRequest) {
    assert_openai(case, &openai::render_request(spec, req));
}

// ---- neutral requests -------------------------------------------------------------------

fn request(messages: Vec<Message>) -> ChatRequest {
    ChatRequest {
        options: Default::default(),
        deltas: None,
        stable_ttl: None,
        session_id: "sess-42".into(),
        system: vec![],
        messages,
        tools: Default::default(),
        tool_choice: ToolChoice::Auto,
        previous_messages: None,
        rendered: Default::default(),
    }
}

fn plain_text() -> ChatRequest {
    request(vec![Message::user_text("hello")])
}

fn with_system() -> ChatRequest {
    let mut req = plain_text();
    req.system = vec![
        SystemBlock {
            tier: SystemTier::Stable,
            text: "You are agentd.".into(),
        },
        SystemBlock {
            tier: SystemTier::Stable,
            text: "Tools: read, exec.".into(),
        },
        SystemBlock {
            tier: SystemTier::SemiStable,
            text: "Memory: none yet.".into(),
        },
    ];
    req
}

fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "read_file".into(),
            description: "Read a file of the workspace".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "path": { "type": "string", "description": "relative path" },
                    "offset": { "type": "integer", "minimum": 0 },
                },
                "required": ["path"],
                "additionalProperties": false,
            }),
        },
        ToolSpec {
            name: "session_status".into(),
            description: "Show the session status".into(),
            input_schema: json!({ "type": "object", "properties": {} }),
        },
    ]
}

fn with_tools(choice: ToolChoice) -> ChatRequest {
    let mut req = with_system();
    req.tools = tools().into();
    req.tool_choice = choice;
    req
}

/// An assistant turn with only tool calls (no text, no thinking), its results, and a second
/// user message straight after the first (merged into one wire message by Anthropic).
fn tool_calls_without_text() -> ChatRequest {
    let mut req = request(vec![
        Message::user_text("first"),
        Message::user_text("second"),
        Message::Assistant {
            text: String::new(),
            tool_calls: vec![ToolCall {
                id: "toolu_01A".into(),
                name: "read_file".into(),
                arguments: json!({ "path": "notes.md" }),
            }],
            thinking: vec![],
            usage: None,
        },
        Message::ToolResults {
            results: vec![ToolResult {
                tool_call_id: "toolu_01A".into(),
                content: "# notes".into(),
                is_error: false,
                images: Vec::new(),
            }],
            notice: None,
        },
        Message::Assistant {
            text: String::new(),
            tool_calls: vec![],
            thinking: vec![],
            usage: None,
        },
        Message::user_text("thanks"),
    ]);
    req.tools = tools().into();
    req.previous_messages = Some(4);
    req
}

/// Empty strings wherever the neutral types allow them: a system block, a user text block, a
/// thinking block, a tool result and a notice.
fn empty_texts() -> ChatRequest {
    let mut req = request(vec![
        Message::User {
            content: vec![
                UserBlock::Text {
                    text: String::new(),
                },
                UserBlock::Text { text: "q".into() },
            ],
        },
        Message::Assistant {
            text: String::new(),
            tool_calls: vec![ToolCall {
                id: "toolu_01B".into(),
                name: "session_status".into(),
                arguments: json!({}),
            }],
            thinking: vec![ThinkingBlock {
                thinking: Some(String::new()),
                signature: Some("sig".into()),
                redacted_data: None,
            }],
            usage: None,
        },
        Message::ToolResults {
            results: vec![ToolResult {
                tool_call_id: "toolu_01B".into(),
                content: String::new(),
                is_error: true,
                images: Vec::new(),
            }],
            notice: Some(String::new()),
        },
        Message::User {
            content: vec![UserBlock::Text {
                text: String::new(),
            }],
        },
    ]);
    req.system = vec![
        SystemBlock {
            tier: SystemTier::Stable,
            text: "stable".into(),
        },
        SystemBlock {
            tier: SystemTier::SemiStable,
            text: String::new(),
        },
    ];
    req.tools = tools().into();
    req.previous_messages = Some(3);
    req
}

/// Tool results with images (an MCP tool's, for a model that sees images): one with text and
/// two images, one with an empty text and an image (an error), then a notice.
fn tool_result_images() -> ChatRequest {
    let image = |n: u32| ToolImage {
        media_type: "image/png".into(),
        data: "iVBORw0KGgo=".into(),
        placeholder: format!("[image from MCP tool shot__take: image/png, {n} bytes]"),
    };
    let mut req = request(vec![
        Message::user_text("take two screenshots"),
        Message::Assistant {
            text: String::new(),
            tool_calls: vec![
                ToolCall {
                    id: "toolu_01C".into(),
                    name: "read_file".into(),
                    arguments: json!({ "path": "a.png" }),
                },
                ToolCall {
                    id: "toolu_01D".into(),
                    name: "read_file".into(),
                    arguments: json!({ "path": "b.png" }),
                },
            ],
            thinking: vec![],
            usage: None,
        },
        Message::ToolResults {
            results: vec![
                ToolResult {
                    tool_call_id: "toolu_01C".into(),
                    content: "two shots".into(),
                    is_error: false,
                    images: vec![image(8), image(9)],
                },
                ToolResult {
                    tool_call_id: "toolu_01D".into(),
                    content: String::new(),
                    is_error: true,
                    images: vec![image(10)],
                },
            ],
            notice: Some("wrap up".into()),
        },
    ]);
    req.tools = tools().into();
    req.previous_messages = Some(2);
    req
}

// ---- Anthropic ----------------------------------------------------------------------------

fn anthropic_spec() -> ModelSpec {
    let mut s = model_spec(
        "primary",
        ProviderKind::Anthropic,
        "https://api.anthropic.com",
    );
    s.model = "claude-sonnet-4-5".into();
    s.max_tokens = 8192;
    s
}

fn cached(ttl: CacheTtl) -> ModelSpec {
    let mut s = anthropic_spec();
    s.cache = true;
    s.cache_ttl = ttl;
    s
}

#[test]
fn anthropic_plain_text_turn() {
    check_anthropic("plain text", &anthropic_spec(), &plain_text());
}

#[test]
fn anthropic_system_blocks_with_and_without_cache() {
    check_anthropic("system, no cache", &anthropic_spec(), &with_system());
    check_anthropic(
        "system, cache 5m",
        &cached(CacheTtl::FiveMinutes),
        &with_system(),
    );
    check_anthropic(
        "system, cache 1h",
        &cached(CacheTtl::OneHour),
        &with_system(),
    );
}

#[test]
fn anthropic_tools_with_choice_auto_and_none() {
    let spec = cached(CacheTtl::FiveMinutes);
    check_anthropic("tools, auto", &spec, &with_tools(ToolChoice::Auto));
    check_anthropic("tools, none", &spec, &with_tools(ToolChoice::None));
}

/// Image, signed and redacted thinking, text + tool calls, results with is_error and a notice,
/// consecutive user-role messages merged, and four cache breakpoints.
#[test]
fn anthropic_full_conversation_with_both_ttls() {
    let req = sample_request();
    check_anthropic("full, no cache", &anthropic_spec(), &req);
    check_anthropic("full, cache 5m", &cached(CacheTtl::FiveMinutes), &req);
    check_anthropic("full, cache 1h", &cached(CacheTtl::OneHour), &req);
}

/// The `ttl` of every `cache_control` in body order (tools, system, messages; Anthropic reads
/// the prefix in that order).
fn ttls_in_order(body: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => {
                if let Some(cc) = o.get("cache_control") {
                    out.push(
                        cc.get("ttl")
                            .and_then(Value::as_str)
                            .unwrap_or("5m")
                            .to_string(),
                    );
                }
                for v in o.values() {
                    walk(v, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for key in ["tools", "system", "messages"] {
        if let Some(v) = body.get(key) {
            walk(v, &mut out);
        }
    }
    out
}

/// SPEC §20: a session whose cadence calls for it gets `ttl: "1h"` on its stable and
/// semi_stable system breakpoints only; the message breakpoints keep 5 minutes, so every 1h
/// breakpoint comes before every 5m one (Anthropic's rule), and the body is valid against the
/// published request schema.
#[test]
fn anthropic_one_hour_stable_breakpoints_come_first() {
    let mut req = sample_request();
    for ttl in [None, Some(CacheTtl::FiveMinutes), Some(CacheTtl::OneHour)] {
        req.stable_ttl = ttl;
        for model_ttl in [CacheTtl::FiveMinutes, CacheTtl::OneHour] {
            let spec = cached(model_ttl);
            let body = anthropic::render_request(&spec, &req);
            assert_anthropic("stable ttl", &body);
            let ttls = ttls_in_order(&body);
            assert_eq!(ttls.len(), 4, "{ttls:?}");
            let system = &ttls[..2];
            let messages = &ttls[2..];
            let long_system = ttl == Some(CacheTtl::OneHour) || model_ttl == CacheTtl::OneHour;
            assert!(
                system.iter().all(|t| (t == "1h") == long_system),
                "{ttl:?}/{model_ttl:?}: {ttls:?}"
            );
            assert!(
                messages
                    .iter()
                    .all(|t| (t == "1h") == (model_ttl == CacheTtl::OneHour)),
                "{ttl:?}/{model_ttl:?}: {ttls:?}"
            );
            let first_short = ttls.iter().position(|t| t == "5m").unwrap_or(ttls.len());
            assert!(
                ttls[first_short..].iter().all(|t| t == "5m"),
                "a 1h breakpoint after a 5m one: {ttls:?}"
            );
        }
    }
    // A provider without 1-hour caching (OpenAI) is unaffected.
    req.stable_ttl = Some(CacheTtl::OneHour);
    let body = openai::render_request(&openai_spec("https://api.openai.com/v1"), &req);
    assert!(!body.to_string().contains("\"1h\""));
}

#[test]
fn anthropic_tool_calls_without_text_and_merged_users() {
    let req = tool_calls_without_text();
    let spec = cached(CacheTtl::OneHour);
    check_anthropic("tool calls only", &spec, &req);
    // The second user message really was merged into the first wire message.
    let body = anthropic::render_request(&spec, &req);
    assert_eq!(
        body["messages"][0]["content"].as_array().map(Vec::len),
        Some(2)
    );
}

#[test]
fn anthropic_thinking_modes() {
    let req = sample_request();

    let mut adaptive = cached(CacheTtl::FiveMinutes);
    adaptive.thinking = Thinking::Adaptive;
    check_anthropic("thinking adaptive", &adaptive, &req);

    for effort in ["low", "medium", "high", "max"] {
        adaptive.thinking_effort = Some(effort.into());
        let body = anthropic::render_request(&adaptive, &req);
        assert_eq!(body["output_config"], json!({ "effort": effort }));
        assert_anthropic("thinking adaptive + effort", &body);
    }

    let mut budgeted = cached(CacheTtl::FiveMinutes);
    budgeted.thinking = Thinking::Budgeted;
    budgeted.thinking_budget = 4096;
    check_anthropic("thinking budgeted", &budgeted, &req);
}

/// The API rejects empty text blocks ("text content blocks must be non-empty").
#[test]
fn anthropic_empty_texts() {
    check_anthropic(
        "empty texts",
        &cached(CacheTtl::FiveMinutes),
        &empty_texts(),
    );
    check_anthropic("empty texts, no cache", &anthropic_spec(), &empty_texts());
}

/// A tool result's images are `image` blocks inside its `tool_result` content, after its text.
#[test]
fn anthropic_tool_result_images() {
    let req = tool_result_images();
    check_anthropic("tool result images", &anthropic_spec(), &req);
    check_anthropic(
        "tool result images, cache",
        &cached(CacheTtl::FiveMinutes),
        &req,
    );
    let body = anthropic::render_request(&anthropic_spec(), &req);
    let first = &body["messages"][2]["content"][0]["content"];
    assert_eq!(first[0], json!({ "type": "text", "text": "two shots" }));
    assert_eq!(
        first[1],
        json!({ "type": "image", "source": { "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo=" } })
    );
    assert_eq!(first.as_array().map(Vec::len), Some(3));
    let second = &body["messages"][2]["content"][1]["content"];
    assert_eq!(second[0]["type"], "image", "no empty text block: {second}");
}

// ---- OpenAI --------------------------------------------------------------------------------

fn openai_spec(base_url: &str) -> ModelSpec {
    let mut s = model_spec("primary", ProviderKind::OpenAi, base_url);
    s.model = "gpt-5.1".into();
    s.max_tokens = 4096;
    s
}

const OPENAI_URL: &str = "https://api.openai.com/v1";
const LOCAL_URL: &str = "http://localhost:11434/v1";

#[test]
fn openai_plain_text_turn() {
    check_openai("plain text", &openai_spec(OPENAI_URL), &plain_text());
    check_openai("plain text, local", &openai_spec(LOCAL_URL), &plain_text());
}

#[test]
fn openai_system_and_tools_with_choice_auto_and_none() {
    let spec = openai_spec(OPENAI_URL);
    check_openai("system", &spec, &with_system());
    check_openai("tools, auto", &spec, &with_tools(ToolChoice::Auto));
    check_openai("tools, none", &spec, &with_tools(ToolChoice::None));
}

/// Image part, tool calls with text, tool results (one an error) and a notice.
#[test]
fn openai_full_conversation() {
    check_openai("full", &openai_spec(OPENAI_URL), &sample_request());
    check_openai("full, local", &openai_spec(LOCAL_URL), &sample_request());
}

#[test]
fn openai_tool_calls_without_text() {
    let spec = openai_spec(OPENAI_URL);
    let req = tool_calls_without_text();
    check_openai("tool calls only", &spec, &req);
    let body = openai::render_request(&spec, &req);
    assert_eq!(body["messages"][2]["content"], Value::Null);
    assert_eq!(body["messages"][4]["content"], json!(""));
}

#[test]
fn openai_prompt_cache_key_and_token_limit_keys() {
    let mut spec = openai_spec(OPENAI_URL);
    spec.prompt_cache_key = true;
    let body = openai::render_request(&spec, &with_tools(ToolChoice::Auto));
    assert_eq!(body["prompt_cache_key"], json!("sess-42"));
    assert_eq!(body["max_completion_tokens"], json!(4096));
    assert_openai("prompt_cache_key", &body);

    let local = openai_spec(LOCAL_URL);
    let body = openai::render_request(&local, &with_tools(ToolChoice::Auto));
    assert_eq!(body["max_tokens"], json!(4096));
    assert_openai("max_tokens (non-OpenAI host)", &body);
}

/// A `tool` message carries text only: the results' images follow the tool messages in one
/// user message, each after its placeholder, before the notice.
#[test]
fn openai_tool_result_images() {
    let spec = openai_spec(OPENAI_URL);
    let req = tool_result_images();
    check_openai("tool result images", &spec, &req);
    let body = openai::render_request(&spec, &req);
    let roles: Vec<&str> = body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| m["role"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(roles, ["user", "assistant", "tool", "tool", "user", "user"]);
    let parts = &body["messages"][4]["content"];
    assert_eq!(parts.as_array().map(Vec::len), Some(6));
    assert_eq!(
        parts[0],
        json!({ "type": "text", "text": "[image from MCP tool shot__take: image/png, 8 bytes]" })
    );
    assert_eq!(
        parts[1],
        json!({ "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBORw0KGgo=" } })
    );
    assert_eq!(body["messages"][5]["content"], "wrap up");
}

#[test]
fn openai_empty_texts() {
    check_openai("empty texts", &openai_spec(OPENAI_URL), &empty_texts());
}

// ---- the checker itself ---------------------------------------------------------------------

/// The schemas really constrain: bodies with a wrong field name, shape or value are rejected.
#[test]
fn schemas_reject_malformed_bodies() {
    let spec = cached(CacheTtl::FiveMinutes);
    let good = anthropic::render_request(&spec, &sample_request());
    assert!(ANTHROPIC.is_valid(&good));

    let mut unknown_field = good.clone();
    unknown_field["max_output_tokens"] = json!(10);
    assert!(!ANTHROPIC.is_valid(&unknown_field));

    let mut bad_ttl = good.clone();
    bad_ttl["system"][1]["cache_control"]["ttl"] = json!("2h");
    assert!(!ANTHROPIC.is_valid(&bad_ttl));

    let mut bad_block = good.clone();
    bad_block["messages"][1]["content"][3]["arguments"] = json!({});
    assert!(!ANTHROPIC.is_valid(&bad_block));

    let mut missing = good;
    if let Some(o) = missing.as_object_mut() {
        o.remove("max_tokens");
    }
    assert!(!ANTHROPIC.is_valid(&missing));

    let good = openai::render_request(&openai_spec(OPENAI_URL), &sample_request());
    assert!(OPENAI.is_valid(&good));

    let mut bad_role = good.clone();
    bad_role["messages"][0]["role"] = json!("narrator");
    assert!(!OPENAI.is_valid(&bad_role));

    let mut bad_choice = good.clone();
    bad_choice["tool_choice"] = json!("sometimes");
    assert!(!OPENAI.is_valid(&bad_choice));

    let mut bad_call = good.clone();
    bad_call["messages"][2]["tool_calls"][0]["function"]["arguments"] = json!({ "path": "a" });
    assert!(!OPENAI.is_valid(&bad_call));

    // Misspelt optional names pass OpenAI's open schemas; the key check catches them.
    assert!(undeclared_keys(&good).is_empty());
    let mut misspelt = good;
    misspelt["max_completion_token"] = json!(10);
    misspelt["messages"][3]["tool_call"] = json!("tu1");
    misspelt["messages"][1]["content"][1]["image"] = json!({});
    misspelt["tools"][0]["function"]["schema"] = json!({});
    misspelt["stream_options"]["usage"] = json!(true);
    assert!(OPENAI.is_valid(&misspelt));
    assert_eq!(
        undeclared_keys(&misspelt).len(),
        5,
        "{:?}",
        undeclared_keys(&misspelt)
    );
}

/// Values agentd takes from the configuration and passes through unchanged, which the API only
/// accepts in a range: `thinking_budget` of at least 1024 and an `effort` from a fixed list.
/// Config validation accepts any budget ≥ 1 and any non-empty effort today, so these bodies
/// can be sent; this pins the API's rule for whoever tightens the validation.
#[test]
fn api_ranges_for_configured_values() {
    let mut spec = anthropic_spec();
    spec.thinking = Thinking::Budgeted;
    spec.thinking_budget = 1024;
    assert!(ANTHROPIC.is_valid(&anthropic::render_request(&spec, &plain_text())));
    spec.thinking_budget = 1023;
    assert!(!ANTHROPIC.is_valid(&anthropic::render_request(&spec, &plain_text())));

    spec.thinking = Thinking::Adaptive;
    spec.thinking_effort = Some("xhigh".into());
    assert!(ANTHROPIC.is_valid(&anthropic::render_request(&spec, &plain_text())));
    spec.thinking_effort = Some("extreme".into());
    assert!(!ANTHROPIC.is_valid(&anthropic::render_request(&spec, &plain_text())));
}

/// What a client of the compatible endpoints may choose (SPEC §17) renders valid bodies for
/// both providers, within the model's configuration.
#[test]
fn client_call_options_render_valid_bodies() {
    use crate::llm::{CallOptions, ClientThinking};
    let mut req = plain_text();
    req.options = CallOptions {
        max_tokens: Some(64),
        temperature: Some(0.3),
        effort: Some("low".into()),
        thinking: None,
        format: None,
        parallel_tool_calls: None,
    };
    let spec = openai_spec("https://api.openai.com/v1");
    check_openai("client options", &spec, &req);
    let body = openai::render_request(&spec, &req);
    assert_eq!(body["max_completion_tokens"], 64);
    assert_eq!(body["reasoning_effort"], "low");
    assert!((body["temperature"].as_f64().unwrap() - 0.3).abs() < 1e-6);
    // The configured max_tokens stays the ceiling.
    req.options.max_tokens = Some(1_000_000);
    assert_eq!(
        openai::render_request(&spec, &req)["max_completion_tokens"],
        spec.max_tokens
    );

    let mut spec = anthropic_spec();
    spec.max_tokens = 8000;
    req.options.max_tokens = Some(64);
    check_anthropic("client options", &spec, &req);
    let body = anthropic::render_request(&spec, &req);
    assert_eq!(body["max_tokens"], 64);
    assert!(body.get("thinking").is_none());
    assert!(body.get("temperature").is_some());
    // Thinking asked for by the client: no temperature (the API refuses both), the budget
    // kept below max_tokens, or thinking off when that leaves less than 1024.
    req.options.thinking = Some(ClientThinking::Enabled {
        budget_tokens: 4000,
    });
    req.options.max_tokens = Some(3000);
    check_anthropic("client thinking", &spec, &req);
    let body = anthropic::render_request(&spec, &req);
    assert_eq!(body["thinking"]["budget_tokens"], 2999);
    assert!(body.get("temperature").is_none());
    req.options.max_tokens = Some(1000);
    let body = anthropic::render_request(&spec, &req);
    assert!(body.get("thinking").is_none(), "{body}");
    req.options.thinking = Some(ClientThinking::Adaptive);
    req.options.max_tokens = None;
    check_anthropic("client adaptive", &spec, &req);
    let body = anthropic::render_request(&spec, &req);
    assert_eq!(body["thinking"]["type"], "adaptive");
    assert_eq!(body["output_config"]["effort"], "low");
    // A configured thinking model turned off by the client.
    spec.thinking = Thinking::Budgeted;
    spec.thinking_budget = 2048;
    req.options.thinking = Some(ClientThinking::Disabled);
    let body = anthropic::render_request(&spec, &req);
    assert!(body.get("thinking").is_none());
}

/// Structured output (SPEC §17) renders bodies valid under both published schemas: OpenAI
/// `response_format` (json_schema with the schema reduced to the provider's dialect, or
/// json_object), Anthropic `output_config.format` beside the effort.
#[test]
fn structured_output_renders_valid_bodies() {
    use crate::llm::{CallOptions, ClientThinking};
    use crate::message::call::OutputFormat;
    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 5000}},
                        "required": ["city"], "additionalProperties": false});
    let mut req = plain_text();
    req.options = CallOptions {
        format: Some(Box::new(OutputFormat::JsonSchema {
            name: "place".into(),
            schema: schema.clone(),
            strict: Some(true),
            description: Some("where".into()),
        })),
        ..CallOptions::default()
    };
    let spec = openai_spec("https://api.openai.com/v1");
    check_openai("json_schema", &spec, &req);
    let body = openai::render_request(&spec, &req);
    assert_eq!(
        body["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "place", "schema": schema,
                                                      "strict": true, "description": "where"}})
    );
    // A local server's dialect reduces the schema sent, as it does a tool's.
    let mut local = openai_spec("http://127.0.0.1:8080/v1");
    local.tool_schema.max_length = Some(1999);
    let body = openai::render_request(&local, &req);
    assert_eq!(
        body["response_format"]["json_schema"]["schema"]["properties"]["city"],
        json!({"type": "string"})
    );
    let mut anthropic_spec = anthropic_spec();
    anthropic_spec.thinking_effort = Some("low".into());
    req.options.thinking = Some(ClientThinking::Adaptive);
    check_anthropic("json_schema", &anthropic_spec, &req);
    let body = anthropic::render_request(&anthropic_spec, &req);
    assert_eq!(
        body["output_config"],
        json!({"effort": "low", "format": {"type": "json_schema", "schema": schema}})
    );
    req.options.thinking = None;
    let body = anthropic::render_request(&anthropic_spec, &req);
    assert_eq!(
        body["output_config"],
        json!({"format": {"type": "json_schema", "schema": schema}})
    );

    req.options.format = Some(Box::new(OutputFormat::JsonObject));
    check_openai("json_object", &spec, &req);
    let body = openai::render_request(&spec, &req);
    assert_eq!(body["response_format"], json!({"type": "json_object"}));
    // Anthropic has no JSON mode: nothing sent, the answer is checked.
    let body = anthropic::render_request(&anthropic_spec, &req);
    assert!(body.get("output_config").is_none(), "{body}");
}
