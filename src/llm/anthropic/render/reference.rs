//! The renderer as it was before `render_body` (a `serde_json::Value` tree), kept as the
//! oracle of the byte-identity test: the bytes on the wire, and so the prompt cache, must not
//! change with the rewrite (docs/BENCHMARKS.md, overhead).

use serde_json::{Map, Value, json};

use crate::config::{CacheTtl, ModelSpec, Thinking};
use crate::llm::{ChatRequest, SystemBlock, SystemTier, ToolChoice};
use crate::message::{Message, UserBlock};

/// Text of a block that would otherwise be empty (the API rejects empty content).
const EMPTY: &str = "(empty)";

/// The request body for `POST /v1/messages` (always streamed).
///
/// Cache breakpoints (when `spec.cache`): the last stable system block, the last semi-stable
/// system block, the last block of message `previous_messages - 1` (the end of the previous
/// call) and the last block of this request.
pub fn render_request(spec: &ModelSpec, req: &ChatRequest) -> Value {
    let marker = spec.cache.then(|| cache_control(spec.cache_ttl));

    let mut body = Map::new();
    body.insert("model".into(), json!(spec.model));
    body.insert("max_tokens".into(), json!(spec.max_tokens));
    body.insert("stream".into(), json!(true));

    if let Some(system) = render_system(req, marker.as_ref()) {
        body.insert("system".into(), system);
    }
    body.insert("messages".into(), render_messages(req, marker.as_ref()));

    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "description": t.description,
                    "input_schema": t.input_schema,
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        let forced_ok = spec.thinking == Thinking::Off;
        let mut choice = match &req.tool_choice {
            ToolChoice::None => json!({ "type": "none" }),
            ToolChoice::Required if forced_ok => json!({ "type": "any" }),
            ToolChoice::Tool(name) if forced_ok => json!({ "type": "tool", "name": name }),
            _ => json!({ "type": "auto" }),
        };
        if req.tool_choice != ToolChoice::None && req.options.parallel_tool_calls == Some(false) {
            choice["disable_parallel_tool_use"] = json!(true);
        }
        body.insert("tool_choice".into(), choice);
    }

    match spec.thinking {
        Thinking::Off => {}
        Thinking::Adaptive => {
            body.insert("thinking".into(), json!({ "type": "adaptive" }));
            if let Some(effort) = &spec.thinking_effort {
                body.insert("output_config".into(), json!({ "effort": effort }));
            }
        }
        Thinking::Budgeted => {
            body.insert(
                "thinking".into(),
                json!({ "type": "enabled", "budget_tokens": spec.thinking_budget }),
            );
        }
    }

    Value::Object(body)
}

fn cache_control(ttl: CacheTtl) -> Value {
    match ttl {
        CacheTtl::FiveMinutes => json!({ "type": "ephemeral" }),
        CacheTtl::OneHour => json!({ "type": "ephemeral", "ttl": "1h" }),
    }
}

fn mark(block: &mut Value, marker: &Value) {
    if let Some(obj) = block.as_object_mut() {
        obj.insert("cache_control".into(), marker.clone());
    }
}

/// The `system` blocks, without empty ones (the API rejects empty text blocks); `None` when
/// nothing is left.
fn render_system(req: &ChatRequest, marker: Option<&Value>) -> Option<Value> {
    let kept: Vec<&SystemBlock> = req.system.iter().filter(|b| !b.text.is_empty()).collect();
    if kept.is_empty() {
        return None;
    }
    let mut blocks: Vec<Value> = kept
        .iter()
        .map(|b| json!({ "type": "text", "text": b.text }))
        .collect();
    if let Some(marker) = marker {
        for tier in [SystemTier::Stable, SystemTier::SemiStable] {
            if let Some(i) = kept.iter().rposition(|b| b.tier == tier) {
                mark(&mut blocks[i], marker);
            }
        }
    }
    Some(Value::Array(blocks))
}

/// One wire message under construction.
struct WireMessage {
    role: &'static str,
    content: Vec<Value>,
}

fn render_messages(req: &ChatRequest, marker: Option<&Value>) -> Value {
    let mut wire: Vec<WireMessage> = Vec::new();
    // (wire message, block) that ended neutral message `previous_messages - 1`.
    let mut previous_end: Option<(usize, usize)> = None;

    for (i, message) in req.messages.iter().enumerate() {
        let role = match message {
            Message::Assistant { .. } => "assistant",
            Message::User { .. } | Message::ToolResults { .. } => "user",
        };
        let blocks = render_blocks(message);
        match wire.last_mut() {
            Some(last) if last.role == role => last.content.extend(blocks),
            _ => wire.push(WireMessage {
                role,
                content: blocks,
            }),
        }
        if req.previous_messages == Some(i + 1)
            && let Some(last) = wire.last()
        {
            previous_end = Some((wire.len() - 1, last.content.len().saturating_sub(1)));
        }
    }

    if let Some(marker) = marker
        && let Some(last) = wire.last()
    {
        let end = (wire.len() - 1, last.content.len().saturating_sub(1));
        for (m, b) in previous_end.into_iter().filter(|p| *p != end).chain([end]) {
            if let Some(block) = wire[m].content.get_mut(b) {
                mark(block, marker);
            }
        }
    }

    Value::Array(
        wire.into_iter()
            .map(|m| json!({ "role": m.role, "content": m.content }))
            .collect(),
    )
}

/// The content blocks of one neutral message (never empty). Empty text blocks are left out:
/// the API rejects them.
fn render_blocks(message: &Message) -> Vec<Value> {
    let mut blocks = Vec::new();
    match message {
        Message::User { content } => {
            for block in content {
                match block {
                    UserBlock::Text { text } if text.is_empty() => {}
                    UserBlock::Text { text } => {
                        blocks.push(json!({ "type": "text", "text": text }));
                    }
                    UserBlock::Image {
                        media_type, data, ..
                    } => blocks.push(json!({
                        "type": "image",
                        "source": { "type": "base64", "media_type": media_type, "data": data },
                    })),
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
                blocks.push(match &t.redacted_data {
                    Some(data) => json!({ "type": "redacted_thinking", "data": data }),
                    None => json!({
                        "type": "thinking",
                        "thinking": t.thinking.as_deref().unwrap_or(""),
                        "signature": t.signature.as_deref().unwrap_or(""),
                    }),
                });
            }
            if !text.is_empty() {
                blocks.push(json!({ "type": "text", "text": text }));
            }
            for call in tool_calls {
                blocks.push(json!({
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": call.arguments,
                }));
            }
        }
        Message::ToolResults { results, notice } => {
            for r in results {
                let content = if r.images.is_empty() {
                    json!(r.content)
                } else {
                    let text = (!r.content.is_empty())
                        .then(|| json!({ "type": "text", "text": r.content }));
                    let images = r.images.iter().map(|i| {
                        json!({
                            "type": "image",
                            "source": { "type": "base64", "media_type": i.media_type, "data": i.data },
                        })
                    });
                    Value::Array(text.into_iter().chain(images).collect())
                };
                blocks.push(json!({
                    "type": "tool_result",
                    "tool_use_id": r.tool_call_id,
                    "content": content,
                    "is_error": r.is_error,
                }));
            }
            if let Some(notice) = notice.as_deref().filter(|n| !n.is_empty()) {
                blocks.push(json!({ "type": "text", "text": notice }));
            }
        }
    }
    if blocks.is_empty() {
        blocks.push(json!({ "type": "text", "text": EMPTY }));
    }
    blocks
}
