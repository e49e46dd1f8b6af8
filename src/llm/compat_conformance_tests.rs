//! The answers agentd gives as an OpenAI- or Anthropic-compatible API (SPEC §17), validated
//! against the response, stream-event and error schemas of the providers' published OpenAPI
//! descriptions (extracted into `tests/fixtures/specs/` by `scripts/extract-spec-schemas.py`,
//! see the README there): every body, every stream frame and every error envelope agentd
//! can send, for every error class.

use std::sync::LazyLock;

use jsonschema::{Draft, Validator};
use serde_json::Value;

use crate::llm::anthropic::server as anthropic;
use crate::llm::compat::{CompatReply, ErrorKind, FinishReason};
use crate::llm::openai::responses;
use crate::llm::openai::server as openai;
use crate::message::Usage;

fn compile(name: &str, text: &str) -> Validator {
    let mut schema: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("fixture {name} is not JSON: {e}; regenerate it"));
    strictest(&mut schema);
    jsonschema::options()
        .with_draft(Draft::Draft202012)
        .build(&schema)
        .unwrap_or_else(|e| panic!("fixture {name} does not compile: {e}"))
}

/// The strictest reading of a published schema, as the strictest clients apply it (the AI
/// SDK's validators): `null` is refused where the property is optional (leave it out) and
/// where the other choice is a list (send `[]`).
fn strictest(schema: &mut Value) {
    match schema {
        Value::Object(o) => {
            let required: Vec<String> = o
                .get("required")
                .and_then(Value::as_array)
                .map(|r| {
                    r.iter()
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            if let Some(Value::Object(props)) = o.get_mut("properties") {
                for (name, prop) in props.iter_mut() {
                    drop_null(prop, !required.contains(name));
                }
            }
            for v in o.values_mut() {
                strictest(v);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(strictest),
        _ => {}
    }
}

/// Remove the `null` choice of a property (in `anyOf` or a list of types) when it is
/// `optional` or when another choice is an array.
fn drop_null(prop: &mut Value, optional: bool) {
    if let Some(Value::Array(types)) = prop.get_mut("type") {
        let list = types.iter().any(|t| t == "array");
        if (optional || list) && types.len() > 1 {
            types.retain(|t| t != "null");
        }
        return;
    }
    let is_null = |v: &Value| v.get("type").and_then(Value::as_str) == Some("null");
    let Some(Value::Array(choices)) = prop.get_mut("anyOf") else {
        return;
    };
    let list = choices
        .iter()
        .any(|c| c.get("type").and_then(Value::as_str) == Some("array"));
    if (optional || list) && choices.len() > 1 && choices.iter().any(is_null) {
        choices.retain(|c| !is_null(c));
    }
}

#[test]
fn the_strictest_reading_refuses_null_for_optional_and_list_properties() {
    let mut schema = serde_json::json!({
        "type": "object",
        "required": ["kept", "list"],
        "properties": {
            "kept": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "list": {"anyOf": [{"type": "array"}, {"type": "null"}]},
            "optional": {"anyOf": [{"type": "string"}, {"type": "null"}]}
        }
    });
    strictest(&mut schema);
    let v = jsonschema::validator_for(&schema).unwrap();
    assert!(v.is_valid(&serde_json::json!({"kept": null, "list": []})));
    assert!(!v.is_valid(&serde_json::json!({"kept": null, "list": null})));
    assert!(!v.is_valid(&serde_json::json!({"kept": "", "list": [], "optional": null})));
    assert!(v.is_valid(&serde_json::json!({"kept": "", "list": []})));
}

macro_rules! fixture {
    ($name:ident, $file:literal) => {
        static $name: LazyLock<Validator> = LazyLock::new(|| {
            compile(
                $file,
                include_str!(concat!(
                    "../../tests/fixtures/specs/",
                    $file,
                    ".schema.json"
                )),
            )
        });
    };
}

fixture!(OPENAI_RESPONSE, "openai-chat-response");
fixture!(OPENAI_CHUNK, "openai-chat-chunk");
fixture!(OPENAI_MODELS, "openai-models-response");
fixture!(OPENAI_ERROR, "openai-error");
fixture!(OPENAI_RESPONSES, "openai-response");
fixture!(OPENAI_RESPONSES_EVENT, "openai-response-event");
fixture!(ANTHROPIC_MESSAGE, "anthropic-message-response");
fixture!(ANTHROPIC_EVENT, "anthropic-stream-event");
fixture!(ANTHROPIC_ERROR, "anthropic-error");
fixture!(ANTHROPIC_MODEL, "anthropic-model-response");
fixture!(ANTHROPIC_COUNT, "anthropic-count-tokens-response");

/// Fails with every schema error of `body`, and the body.
fn assert_valid(schema: &Validator, what: &str, body: &Value) {
    let errors: Vec<String> = schema
        .iter_errors(body)
        .map(|e| format!("- at {}: {e}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{what} does not match the published schema:\n{}\n{body:#}",
        errors.join("\n")
    );
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("a body is JSON")
}

const KINDS: &[ErrorKind] = &[
    ErrorKind::InvalidRequest,
    ErrorKind::Authentication,
    ErrorKind::NotFound,
    ErrorKind::Timeout,
    ErrorKind::Conflict,
    ErrorKind::TooLarge,
    ErrorKind::Busy,
    ErrorKind::Budget,
    ErrorKind::Internal,
    ErrorKind::Upstream,
    ErrorKind::Unavailable,
    ErrorKind::Interrupted,
];

fn reply(finish: FinishReason) -> CompatReply {
    CompatReply {
        id: "0196f3a2-7c1e-7b40-9a51-3d2f0e8c4b11".into(),
        session_id: String::new(),
        model: "agentd".into(),
        created: 1_764_320_000,
        text: "Milk and bread.".into(),
        calls: vec![],
        finish,
        usage: Usage {
            input_tokens: 30,
            output_tokens: 9,
            cache_read_tokens: 2710,
            cache_write_tokens: 60,
            cache_write_1h_tokens: 0,
        },
    }
}

/// The `data:` payloads (and `event:` names) of an SSE text, in order.
fn sse(bytes: &[u8]) -> Vec<(Option<String>, String)> {
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    text.split("\n\n")
        .filter(|f| !f.trim().is_empty() && !f.starts_with(':'))
        .map(|f| {
            let mut name = None;
            let mut data = String::new();
            for l in f.lines() {
                if let Some(n) = l.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = l.strip_prefix("data: ") {
                    data = d.to_string();
                }
            }
            (name, data)
        })
        .collect()
}

#[test]
fn openai_completion_models_and_errors_match_the_schemas() {
    for finish in [FinishReason::Stop, FinishReason::Length] {
        let body = json(&openai::completion_body(&reply(finish)));
        assert_valid(&OPENAI_RESPONSE, "chat.completion", &body);
    }
    let models = json(&openai::models_body(
        &["primary".into(), "cheap".into()],
        1,
        "kira",
    ));
    assert_valid(&OPENAI_MODELS, "model list", &models);
    for kind in KINDS {
        let body = json(&openai::error_body(*kind, "what went wrong", Some("tools")));
        assert_valid(&OPENAI_ERROR, &format!("error {kind:?}"), &body);
        let body = json(&openai::error_body(*kind, "what went wrong", None));
        assert_valid(&OPENAI_ERROR, &format!("error {kind:?}"), &body);
    }
}

#[test]
fn openai_stream_chunks_match_the_schema() {
    for include_usage in [false, true] {
        let s = openai::ChunkStream::new("i1", "agentd:primary", 1_764_320_000, include_usage);
        let mut all = s.start();
        all.extend(s.keep_alive());
        all.extend(s.text("Milk "));
        all.extend(s.text("and bread."));
        all.extend(s.finish(&reply(FinishReason::Length)));
        let frames = sse(&all);
        assert_eq!(frames.last().unwrap().1, "[DONE]");
        for (_, data) in &frames[..frames.len() - 1] {
            assert_valid(
                &OPENAI_CHUNK,
                "chat.completion.chunk",
                &json(data.as_bytes()),
            );
        }
        let errors = sse(&s.error(ErrorKind::Upstream, "the model failed"));
        assert_valid(&OPENAI_ERROR, "stream error", &json(errors[0].1.as_bytes()));
    }
}

#[test]
fn anthropic_message_and_errors_match_the_schemas() {
    for finish in [FinishReason::Stop, FinishReason::Length] {
        let body = json(&anthropic::message_body(&reply(finish)));
        assert_valid(&ANTHROPIC_MESSAGE, "message", &body);
    }
    for kind in KINDS {
        let body = json(&anthropic::error_body(*kind, "what went wrong"));
        assert_valid(&ANTHROPIC_ERROR, &format!("error {kind:?}"), &body);
    }
}

#[test]
fn anthropic_models_and_token_counts_match_the_schemas() {
    let names = ["primary".to_string()];
    let list = json(&anthropic::models_body(&names, "2026-12-07T12:00:00Z"));
    assert_eq!(list["data"].as_array().unwrap().len(), 2);
    for m in list["data"].as_array().unwrap() {
        assert_valid(&ANTHROPIC_MODEL, "model in list", m);
    }
    assert_eq!(list["first_id"], "agentd");
    assert_eq!(list["last_id"], "agentd:primary");
    let one = anthropic::model_body(&names, "agentd:primary", "2026-12-07T12:00:00Z").unwrap();
    assert_valid(&ANTHROPIC_MODEL, "model", &json(&one));
    assert!(anthropic::model_body(&names, "claude", "2026-12-07T12:00:00Z").is_none());
    assert_valid(
        &ANTHROPIC_COUNT,
        "count",
        &json(&anthropic::count_tokens_body(42)),
    );
}

#[test]
fn anthropic_stream_events_match_the_schema() {
    let s = anthropic::EventStream::new("i1", "agentd");
    let mut all = s.start();
    all.extend(s.keep_alive());
    all.extend(s.text("Milk "));
    all.extend(s.text("and bread."));
    all.extend(s.finish(&reply(FinishReason::Stop)));
    let frames = sse(&all);
    assert_eq!(frames.len(), 8);
    for (name, data) in &frames {
        let event = json(data.as_bytes());
        assert_eq!(name.as_deref(), event["type"].as_str(), "event name = type");
        assert_valid(&ANTHROPIC_EVENT, name.as_deref().unwrap(), &event);
    }
    let errors = sse(&s.error(ErrorKind::Budget, "daily budget reached"));
    assert_eq!(errors[0].0.as_deref(), Some("error"));
    assert_valid(
        &ANTHROPIC_ERROR,
        "stream error",
        &json(errors[0].1.as_bytes()),
    );
}

fn echo() -> responses::Echo {
    responses::Echo {
        instructions: Some("Be brief.".into()),
        previous_response: Some("resp_0196f3a27c1e7b409a513d2f0e8c4b110123456789abcdef".into()),
        store: true,
        temperature: Some(0.5),
        max_output_tokens: Some(300),
        effort: Some("low".into()),
        format: Some(serde_json::json!({"type": "json_schema", "name": "city",
            "schema": {"type": "object", "properties": {"name": {"type": "string"}}}, "strict": true})),
    }
}

#[test]
fn responses_bodies_and_events_match_the_schemas() {
    for finish in [FinishReason::Stop, FinishReason::Length] {
        let mut r = reply(finish);
        r.session_id = "0196f3a2-7c1e-7b40-9a51-3d2f0e8c4b11".into();
        for e in [echo(), responses::Echo::default()] {
            let body = json(&responses::response_body(&r, &e));
            assert_valid(&OPENAI_RESPONSES, "response", &body);
            assert!(body["id"].as_str().unwrap().starts_with("resp_0196f3a2"));
        }
        let s = responses::ResponseStream::new("resp_1", "agentd", 1_764_320_000, echo());
        let mut all = s.start();
        all.extend(s.keep_alive());
        all.extend(s.text("Milk "));
        all.extend(s.text("and bread."));
        all.extend(s.finish(&r));
        // An answer with no text streamed still opens and closes its message.
        let quiet = responses::ResponseStream::new("resp_2", "agentd", 1, echo());
        all.extend(quiet.finish(&r));
        all.extend(quiet.error(ErrorKind::Budget, "daily budget reached"));
        // A turn that calls the client's tools, with text and without.
        let mut calls = r.clone();
        calls.finish = FinishReason::ToolCalls;
        calls.calls = vec![crate::message::ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: serde_json::json!({"city": "Paris"}),
        }];
        for text in ["", "Checking."] {
            calls.text = text.into();
            let body = json(&responses::response_body(&calls, &echo()));
            assert_valid(&OPENAI_RESPONSES, "response with calls", &body);
            let s = responses::ResponseStream::new("resp_3", "agentd", 1, echo());
            if !text.is_empty() {
                all.extend(s.text(text));
            }
            all.extend(s.finish(&calls));
        }
        let frames = sse(&all);
        assert_eq!(frames.len(), 10 + 6 + 1 + 5 + 3 + 8);
        for (name, data) in &frames {
            let event = json(data.as_bytes());
            assert_eq!(name.as_deref(), event["type"].as_str(), "event name = type");
            assert_valid(&OPENAI_RESPONSES_EVENT, name.as_deref().unwrap(), &event);
        }
    }
}

/// The schemas are not vacuous: a body missing a required field fails.
#[test]
fn the_response_schemas_reject_what_they_should() {
    let mut body = json(&openai::completion_body(&reply(FinishReason::Stop)));
    body["choices"][0]["finish_reason"] = "done".into();
    assert!(!OPENAI_RESPONSE.is_valid(&body));
    let mut body = json(&anthropic::message_body(&reply(FinishReason::Stop)));
    body.as_object_mut().unwrap().remove("stop_details");
    assert!(!ANTHROPIC_MESSAGE.is_valid(&body));
    let body = serde_json::json!({"type": "error", "error": {"type": "request_too_large", "message": "x"}, "request_id": null});
    assert!(!ANTHROPIC_ERROR.is_valid(&body));
    let mut body = json(&responses::response_body(
        &reply(FinishReason::Stop),
        &echo(),
    ));
    body["output"][0]["content"][0]["annotations"] = Value::Null;
    assert!(!OPENAI_RESPONSES.is_valid(&body));
}

/// An answer that ended on calls of the client's tools (SPEC §17): with text before them,
/// and without.
fn with_calls(text: &str) -> CompatReply {
    CompatReply {
        text: text.into(),
        calls: vec![
            crate::message::ToolCall {
                id: "toolu_01A".into(),
                name: "lookup".into(),
                arguments: serde_json::json!({"city": "Paris", "days": 2}),
            },
            crate::message::ToolCall {
                id: "call_2".into(),
                name: "ping".into(),
                arguments: serde_json::json!({}),
            },
        ],
        ..reply(FinishReason::ToolCalls)
    }
}

#[test]
fn answers_with_client_tool_calls_match_the_schemas() {
    for text in ["Let me look that up.", ""] {
        let r = with_calls(text);
        let body = json(&openai::completion_body(&r));
        assert_valid(&OPENAI_RESPONSE, "chat.completion with tool calls", &body);
        assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
        let call = &body["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "lookup");
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
            .expect("arguments are a JSON string");
        assert_eq!(args["city"], "Paris");
        assert_eq!(
            body["choices"][0]["message"]["content"].is_null(),
            text.is_empty()
        );

        let body = json(&anthropic::message_body(&r));
        assert_valid(&ANTHROPIC_MESSAGE, "message with tool_use", &body);
        assert_eq!(body["stop_reason"], "tool_use");
        let blocks = body["content"].as_array().unwrap();
        assert_eq!(blocks.len(), if text.is_empty() { 2 } else { 3 });
        let tool_use = &blocks[blocks.len() - 2];
        assert_eq!(tool_use["type"], "tool_use");
        assert_eq!(tool_use["input"]["days"], 2);

        let s = openai::ChunkStream::new("i1", "agentd", 1_764_320_000, true);
        let mut all = s.start();
        all.extend(s.text(text));
        all.extend(s.finish(&r));
        let frames = sse(&all);
        let mut calls = Vec::new();
        for (_, data) in &frames[..frames.len() - 1] {
            let chunk = json(data.as_bytes());
            assert_valid(&OPENAI_CHUNK, "chunk with tool calls", &chunk);
            if let Some(c) = chunk["choices"][0]["delta"]["tool_calls"].as_array() {
                calls.extend(c.iter().cloned());
            }
        }
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1]["index"], 1);
        assert_eq!(calls[1]["id"], "call_2");
        let last = json(frames[frames.len() - 3].1.as_bytes());
        assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");

        let s = anthropic::EventStream::new("i1", "agentd");
        let mut all = s.start();
        all.extend(s.text(text));
        all.extend(s.finish(&r));
        let mut names = Vec::new();
        for (name, data) in sse(&all) {
            let event = json(data.as_bytes());
            assert_valid(&ANTHROPIC_EVENT, name.as_deref().unwrap(), &event);
            if event["type"] == "content_block_start" && event["index"] != 0 {
                assert_eq!(event["content_block"]["type"], "tool_use");
            }
            if let Some(p) = event["delta"]["partial_json"].as_str() {
                assert!(serde_json::from_str::<Value>(p).unwrap().is_object());
            }
            if event["type"] == "message_delta" {
                assert_eq!(event["delta"]["stop_reason"], "tool_use");
            }
            names.push(name.unwrap());
        }
        assert_eq!(
            names.iter().filter(|n| *n == "content_block_start").count(),
            3
        );
    }
}
