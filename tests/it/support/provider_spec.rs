//! A small validator of the tool parts of a provider request, both wires, so a test can say
//! "this request would not be rejected for its tool calls".
//!
//! Provenance: the rules are copied from the providers' published API descriptions kept in
//! `/work/shared/specs/` (`anthropic.openapi.json`: `RequestToolUseBlock.id` and
//! `RequestToolResultBlock.tool_use_id` match `^[a-zA-Z0-9_-]+$`, `input` is an object, `Tool.name`
//! matches `^[a-zA-Z0-9_-]{1,128}$`; `openai.openapi.json`: `FunctionObject.name` is "a-z, A-Z,
//! 0-9, underscores and dashes, with a maximum length of 64", `function.arguments` is a JSON
//! string), plus the pairing rules both APIs enforce at run time (every tool_use answered by a
//! tool_result in the next message, ids unique, no result without its call).
//!
//! The id and name rules are checked on BOTH wires with the stricter of the two, because a
//! session's history is replayed to whichever provider answers next (a fallback on the other
//! wire): an OpenAI id with `.` or `:` is valid for OpenAI and rejected by Anthropic.

use std::collections::HashSet;

use serde_json::Value;

use super::fake_llm::Wire;

/// `^[a-zA-Z0-9_-]{1,64}$`: what both providers accept as a tool-call id and a tool name.
pub fn is_valid_token(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Every violation of the tool rules in request `body` (empty = valid).
pub fn violations(wire: Wire, body: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for t in body["tools"].as_array().into_iter().flatten() {
        let name = match wire {
            Wire::Anthropic => &t["name"],
            Wire::OpenAi => &t["function"]["name"],
        };
        check_name(&mut out, "tools[].name", name);
    }
    match wire {
        Wire::Anthropic => anthropic(&mut out, body),
        Wire::OpenAi => openai(&mut out, body),
    }
    out
}

/// Panics with the violations (and the request) when `body` is not valid.
pub fn assert_valid(wire: Wire, body: &Value) {
    let v = violations(wire, body);
    assert!(
        v.is_empty(),
        "the request breaks the provider's rules:\n- {}\nrequest messages: {}",
        v.join("\n- "),
        body["messages"]
    );
}

fn check_name(out: &mut Vec<String>, at: &str, name: &Value) {
    match name.as_str() {
        Some(n) if is_valid_token(n) => {}
        _ => out.push(format!("{at}: invalid tool name {name}")),
    }
}

fn check_id(out: &mut Vec<String>, at: &str, id: &Value, seen: &mut HashSet<String>) {
    match id.as_str() {
        Some(s) if is_valid_token(s) => {
            if !seen.insert(s.to_string()) {
                out.push(format!("{at}: tool-call id {s:?} is used twice"));
            }
        }
        _ => out.push(format!("{at}: invalid tool-call id {id}")),
    }
}

fn anthropic(out: &mut Vec<String>, body: &Value) {
    let mut seen = HashSet::new();
    // Ids of the previous assistant message's tool_use blocks, still waiting for results.
    let mut pending: Vec<String> = Vec::new();
    for (i, m) in body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let blocks: Vec<&Value> = m["content"].as_array().into_iter().flatten().collect();
        match m["role"].as_str() {
            Some("assistant") => {
                if !pending.is_empty() {
                    out.push(format!(
                        "messages[{i}]: tool_use ids {pending:?} got no tool_result"
                    ));
                }
                pending.clear();
                for b in blocks.iter().filter(|b| b["type"] == "tool_use") {
                    let at = format!("messages[{i}].tool_use");
                    check_id(out, &at, &b["id"], &mut seen);
                    check_name(out, &at, &b["name"]);
                    if !b["input"].is_object() {
                        out.push(format!("{at}: input is not an object: {}", b["input"]));
                    }
                    pending.push(b["id"].as_str().unwrap_or_default().to_string());
                }
            }
            Some("user") => {
                let mut answered = HashSet::new();
                for b in blocks.iter().filter(|b| b["type"] == "tool_result") {
                    let id = b["tool_use_id"].as_str().unwrap_or_default();
                    let at = format!("messages[{i}].tool_result");
                    if !is_valid_token(id) {
                        out.push(format!("{at}: invalid tool_use_id {}", b["tool_use_id"]));
                    }
                    if !pending.iter().any(|p| p == id) {
                        out.push(format!(
                            "{at}: {id:?} answers no tool_use of the previous message"
                        ));
                    }
                    if !answered.insert(id.to_string()) {
                        out.push(format!("{at}: {id:?} is answered twice"));
                    }
                }
                for p in &pending {
                    if !answered.contains(p) {
                        out.push(format!("messages[{i}]: tool_use {p:?} got no tool_result"));
                    }
                }
                pending.clear();
            }
            other => out.push(format!("messages[{i}]: unexpected role {other:?}")),
        }
    }
}

fn openai(out: &mut Vec<String>, body: &Value) {
    let mut seen = HashSet::new();
    let mut pending: Vec<String> = Vec::new();
    for (i, m) in body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        match m["role"].as_str() {
            Some("tool") => {
                let id = m["tool_call_id"].as_str().unwrap_or_default();
                if !is_valid_token(id) {
                    out.push(format!(
                        "messages[{i}]: invalid tool_call_id {}",
                        m["tool_call_id"]
                    ));
                }
                match pending.iter().position(|p| p == id) {
                    Some(at) => {
                        pending.remove(at);
                    }
                    None => out.push(format!(
                        "messages[{i}]: tool_call_id {id:?} answers no pending tool call"
                    )),
                }
            }
            role => {
                // A user/system note after the results is fine; a new assistant turn is not
                // while calls are unanswered.
                if role == Some("assistant") && !pending.is_empty() {
                    out.push(format!(
                        "messages[{i}]: tool calls {pending:?} got no result"
                    ));
                    pending.clear();
                }
                for c in m["tool_calls"].as_array().into_iter().flatten() {
                    let at = format!("messages[{i}].tool_calls");
                    check_id(out, &at, &c["id"], &mut seen);
                    check_name(out, &at, &c["function"]["name"]);
                    let args = c["function"]["arguments"].as_str();
                    let parsed = args.and_then(|a| serde_json::from_str::<Value>(a).ok());
                    if !parsed.as_ref().is_some_and(Value::is_object) {
                        out.push(format!(
                            "{at}: arguments are not a JSON object string: {}",
                            c["function"]["arguments"]
                        ));
                    }
                    pending.push(c["id"].as_str().unwrap_or_default().to_string());
                }
            }
        }
    }
    if !pending.is_empty() {
        out.push(format!("tool calls {pending:?} got no result"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_validator_catches_each_malformed_case() {
        let anth = |id: &str, name: &str, input: Value, result_id: &str| {
            json!({"messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": name, "input": input}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": result_id, "content": "x"}]},
            ]})
        };
        assert!(
            violations(
                Wire::Anthropic,
                &anth("toolu_1", "read", json!({}), "toolu_1")
            )
            .is_empty()
        );
        assert!(!violations(Wire::Anthropic, &anth("a/b", "read", json!({}), "a/b")).is_empty());
        assert!(
            !violations(
                Wire::Anthropic,
                &anth("call.1:x", "read", json!({}), "call.1:x")
            )
            .is_empty()
        );
        assert!(!violations(Wire::Anthropic, &anth("t1", "read file", json!({}), "t1")).is_empty());
        assert!(!violations(Wire::Anthropic, &anth("t1", "read", json!("s"), "t1")).is_empty());
        assert!(!violations(Wire::Anthropic, &anth("t1", "read", json!({}), "t2")).is_empty());
        let oa = |id: &str, args: &str| {
            json!({"messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": id, "type": "function", "function": {"name": "read", "arguments": args}}]},
                {"role": "tool", "tool_call_id": id, "content": "x"},
            ]})
        };
        assert!(violations(Wire::OpenAi, &oa("call_1", "{}")).is_empty());
        assert!(!violations(Wire::OpenAi, &oa("call 1", "{}")).is_empty());
        assert!(!violations(Wire::OpenAi, &oa("call_1", "\"s\"")).is_empty());
    }
}
