//! Neutral request → OpenAI-compatible chat-completions JSON. Deterministic, like Anthropic's:
//! OpenAI's automatic prefix cache also needs byte-identical prefixes.

use serde_json::{Map, Value, json};

use crate::config::ModelSpec;
use crate::llm::{ChatRequest, Message, ToolChoice, UserBlock};

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
        let choice = match req.tool_choice {
            ToolChoice::Auto => "auto",
            ToolChoice::None => "none",
        };
        body.insert("tool_choice".into(), json!(choice));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProviderKind;
    use crate::llm::testutil::{model_spec, sample_request};

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
        req.tools.clear();
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
