//! Neutral request → Anthropic Messages API JSON. Deterministic: the same input always renders
//! the same bytes, which is what lets the prompt cache hit (SPEC §6).

use serde_json::{Map, Value, json};

use crate::config::{CacheTtl, ModelSpec, Thinking};
use crate::llm::{ChatRequest, Message, SystemBlock, SystemTier, ToolChoice, UserBlock};

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
        let choice = match req.tool_choice {
            ToolChoice::Auto => "auto",
            ToolChoice::None => "none",
        };
        body.insert("tool_choice".into(), json!({ "type": choice }));
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
                blocks.push(json!({
                    "type": "tool_result",
                    "tool_use_id": r.tool_call_id,
                    "content": r.content,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::testutil::{model_spec, sample_request};
    use crate::llm::{ThinkingBlock, ToolCall, ToolResult};

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
        let a = serde_json::to_vec(&render_request(&s, &sample_request())).unwrap();
        let b = serde_json::to_vec(&render_request(&s, &sample_request())).unwrap();
        assert_eq!(a, b);
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
        req.tools.clear();
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
                    }],
                    notice: None,
                },
                Message::user_text("three"),
            ],
            tools: vec![],
            tool_choice: ToolChoice::Auto,
            previous_messages: None,
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
                    }],
                    notice: None,
                },
                Message::user_text("next"),
            ],
            tools: vec![],
            tool_choice: ToolChoice::Auto,
            previous_messages: Some(3),
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
                    }],
                    notice: Some(String::new()),
                },
                Message::User {
                    content: vec![text("")],
                },
            ],
            tools: vec![],
            tool_choice: ToolChoice::Auto,
            previous_messages: None,
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
