//! The renderer as it was before `render_body` (a `serde_json::Value` tree), kept as the
//! oracle of the byte-identity test (docs/BENCHMARKS.md, overhead).

use serde_json::{Map, Value, json};

use crate::config::ModelSpec;
use crate::llm::{ChatRequest, ToolChoice};
use crate::message::{Message, UserBlock};

/// The request body for `POST {base_url}/chat/completions` (always streamed, usage included).
pub fn render_request(spec: &ModelSpec, req: &ChatRequest) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(spec.model));
    body.insert("messages".into(), Value::Array(render_messages(req)));
    body.insert("stream".into(), json!(true));
    body.insert("stream_options".into(), json!({ "include_usage": true }));
    // OpenAI's reasoning models reject `max_tokens`; other servers often only know it.
    let max_key = if spec.base_url.contains("api.openai.com") {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    body.insert(max_key.into(), json!(spec.max_tokens));

    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.input_schema,
                    },
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        let choice = match &req.tool_choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Tool(name) => json!({"type": "function", "function": {"name": name}}),
        };
        body.insert("tool_choice".into(), choice);
        if req.options.parallel_tool_calls == Some(false) && req.tool_choice != ToolChoice::None {
            body.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    if spec.prompt_cache_key {
        body.insert("prompt_cache_key".into(), json!(req.session_id));
    }
    Value::Object(body)
}

fn render_messages(req: &ChatRequest) -> Vec<Value> {
    let mut out = Vec::new();
    if !req.system.is_empty() {
        let joined = req
            .system
            .iter()
            .map(|b| b.text.as_str())
            .collect::<Vec<_>>()
            .join("\n\n");
        out.push(json!({ "role": "system", "content": joined }));
    }
    for message in &req.messages {
        match message {
            Message::User { content } => {
                out.push(json!({ "role": "user", "content": user_content(content) }));
            }
            Message::Assistant {
                text, tool_calls, ..
            } => {
                let mut m = Map::new();
                m.insert("role".into(), json!("assistant"));
                let content = if !text.is_empty() {
                    json!(text)
                } else if tool_calls.is_empty() {
                    // Without tool calls, content is required.
                    json!("")
                } else {
                    Value::Null
                };
                m.insert("content".into(), content);
                if !tool_calls.is_empty() {
                    let calls: Vec<Value> = tool_calls
                        .iter()
                        .map(|c| {
                            json!({
                                "id": c.id,
                                "type": "function",
                                "function": { "name": c.name, "arguments": c.arguments.to_string() },
                            })
                        })
                        .collect();
                    m.insert("tool_calls".into(), Value::Array(calls));
                }
                out.push(Value::Object(m));
            }
            Message::ToolResults { results, notice } => {
                for r in results {
                    let content = if r.is_error {
                        format!("ERROR: {}", r.content)
                    } else {
                        r.content.clone()
                    };
                    out.push(json!({
                        "role": "tool",
                        "tool_call_id": r.tool_call_id,
                        "content": content,
                    }));
                }
                let images: Vec<Value> = results
                    .iter()
                    .flat_map(|r| &r.images)
                    .flat_map(|i| {
                        [
                            json!({ "type": "text", "text": i.placeholder }),
                            json!({
                                "type": "image_url",
                                "image_url": { "url": format!("data:{};base64,{}", i.media_type, i.data) },
                            }),
                        ]
                    })
                    .collect();
                if !images.is_empty() {
                    out.push(json!({ "role": "user", "content": images }));
                }
                if let Some(notice) = notice {
                    out.push(json!({ "role": "user", "content": notice }));
                }
            }
        }
    }
    out
}

/// A plain string for a single text block, else content parts.
fn user_content(blocks: &[UserBlock]) -> Value {
    match blocks {
        [] => json!(""),
        [UserBlock::Text { text }] => json!(text),
        _ => Value::Array(
            blocks
                .iter()
                .map(|b| match b {
                    UserBlock::Text { text } => json!({ "type": "text", "text": text }),
                    UserBlock::Image {
                        media_type, data, ..
                    } => json!({
                        "type": "image_url",
                        "image_url": { "url": format!("data:{media_type};base64,{data}") },
                    }),
                })
                .collect(),
        ),
    }
}
