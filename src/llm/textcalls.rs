//! Tool calls a model wrote as text (SPEC §4 `tool_calls_in_text`). Small local models often
//! answer a tool call with its JSON instead of the provider's tool-call field: a bare object
//! `{"name": "write", "arguments": {…}}` (or a list of them, or one a line), Qwen's and
//! Hermes' `<tool_call>{…}</tool_call>` tags, `<tools>…</tools>`, `<{…}>`, or a fenced ```json
//! block (the forms a real Qwen2.5 1.5B wrote: tests/fixtures/local-model). [`recover`] turns those into
//! tool calls, which then go through exactly the checks native ones do (normalisation, the
//! tool's argument schema). Text that only looks like a call stays text: the name must be one
//! of the request's tools and the arguments an object.
//!
//! [`HoldBack`] keeps a streamed answer's text from a client while it may still turn out to
//! be a call, so raw call JSON is never shown as the answer.

use serde_json::{Map, Value};

use crate::llm::ToolSpec;
use crate::message::ToolCall;

/// Calls recovered from an answer's text, and the text left around them.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovered {
    pub text: String,
    pub calls: Vec<ToolCall>,
}

/// The tool calls written in `text`, when it holds any for one of `tools`; `None` leaves the
/// answer as it is.
pub fn recover(text: &str, tools: &[ToolSpec]) -> Option<Recovered> {
    let known = |name: &str| tools.iter().any(|t| t.name == name);
    let trimmed = text.trim();
    // The whole answer is one object or a list of them.
    if let Some(calls) = calls_in(trimmed, &known) {
        return Some(Recovered {
            text: String::new(),
            calls,
        });
    }
    // Tagged or fenced calls anywhere in the text; the rest stays the answer's text.
    let mut rest = String::new();
    let mut calls = Vec::new();
    let mut cursor = trimmed;
    while let Some((before, inner, after)) = next_block(cursor) {
        match calls_in(inner.trim(), &known) {
            Some(found) => {
                rest.push_str(before);
                calls.extend(found);
            }
            None => rest.push_str(&cursor[..cursor.len() - after.len()]),
        }
        cursor = after;
    }
    rest.push_str(cursor);
    if calls.is_empty() {
        return None;
    }
    Some(Recovered {
        text: rest.trim().to_string(),
        calls,
    })
}

/// The tags models wrap calls in: (opening, closing). `<{…}>` keeps the object's own braces
/// (a model wrote `<{{"name": …}}>`).
const TAGS: [(&str, &str); 3] = [
    ("<tool_call>", "</tool_call>"),
    ("<tools>", "</tools>"),
    ("<{", "}>"),
];

/// The next tagged or fenced block of `text`: (text before it, its content, text after it).
/// An unclosed tag runs to the end (models stop there).
fn next_block(text: &str) -> Option<(&str, &str, &str)> {
    let tag = TAGS
        .iter()
        .filter_map(|&(open, close)| text.find(open).map(|at| (at, open, close)))
        .min_by_key(|&(at, ..)| at);
    let fence = text.find("```");
    match (tag, fence) {
        (Some((t, open, close)), f) if f.is_none_or(|f| t < f) => {
            let body = &text[t + open.len()..];
            let (inner, after) = match body.find(close) {
                Some(end) => (&body[..end], &body[end + close.len()..]),
                None => (body, ""),
            };
            Some((&text[..t], inner, after))
        }
        (_, Some(f)) => {
            let body = &text[f + 3..];
            let end = body.find("```")?;
            // The info string (`json`) ends at the first newline.
            let inner = &body[..end];
            let inner = match inner.split_once('\n') {
                Some((info, code)) if !info.trim_start().starts_with(['{', '[']) => code,
                _ => inner,
            };
            Some((&text[..f], inner, &body[end + 3..]))
        }
        _ => None,
    }
}

/// `text` as call objects — one, a non-empty list, or several one after another — every one
/// naming a known tool. A `<{…}>` block's content lost its outer braces: tried with them too.
fn calls_in(text: &str, known: &dyn Fn(&str) -> bool) -> Option<Vec<ToolCall>> {
    if text.starts_with('"') {
        return calls_in(&format!("{{{text}}}"), known);
    }
    if !(text.starts_with('{') || text.starts_with('[')) {
        return None;
    }
    let mut objects = Vec::new();
    for value in serde_json::Deserializer::from_str(text).into_iter::<Value>() {
        match value.ok()? {
            Value::Object(o) => objects.push(o),
            Value::Array(items) if !items.is_empty() => {
                for v in items {
                    match v {
                        Value::Object(o) => objects.push(o),
                        _ => return None,
                    }
                }
            }
            _ => return None,
        }
    }
    if objects.is_empty() {
        return None;
    }
    objects
        .into_iter()
        .map(|o| call_of(o, known))
        .collect::<Option<Vec<_>>>()
}

/// One call object: `name` (or `function.name`) naming a known tool, and `arguments` (or
/// `parameters`) as an object or a string holding one; nothing else but an `id` or `type`.
fn call_of(mut o: Map<String, Value>, known: &dyn Fn(&str) -> bool) -> Option<ToolCall> {
    if let Some(Value::Object(f)) = o.remove("function") {
        o.extend(f);
    }
    let name = match o.remove("name") {
        Some(Value::String(n)) if known(&n) => n,
        _ => return None,
    };
    let arguments = match o.remove("arguments").or_else(|| o.remove("parameters")) {
        None => Value::Object(Map::new()),
        Some(Value::Object(a)) => Value::Object(a),
        Some(Value::String(s)) => match serde_json::from_str(&s).ok()? {
            Value::Object(a) => Value::Object(a),
            _ => return None,
        },
        Some(_) => return None,
    };
    o.remove("id");
    o.remove("type");
    if !o.is_empty() {
        return None;
    }
    Some(ToolCall {
        id: format!("text_{}", uuid::Uuid::new_v4().simple()),
        name,
        arguments,
    })
}

/// Text of a streamed answer, held while it may still be a call written as text (it begins
/// with `{`, `[`, `<` or a fence); once it plainly is not, everything held and all that
/// follows passes at once.
#[derive(Debug, Default)]
pub struct HoldBack {
    held: String,
    passing: bool,
}

impl HoldBack {
    /// A piece of text: what may be shown now.
    pub fn push(&mut self, piece: &str) -> Option<String> {
        if self.passing {
            return Some(piece.to_string());
        }
        self.held.push_str(piece);
        let start = self.held.trim_start();
        let may_be_call = start.is_empty() || start.starts_with(['{', '[', '<', '`']);
        if may_be_call {
            return None;
        }
        self.passing = true;
        Some(std::mem::take(&mut self.held))
    }

    /// The answer ended: what was held, unless it was taken as calls.
    pub fn finish(&mut self, was_calls: bool) -> Option<String> {
        let held = std::mem::take(&mut self.held);
        (!was_calls && !held.is_empty()).then_some(held)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn tools() -> Vec<ToolSpec> {
        ["write", "read"]
            .iter()
            .map(|n| ToolSpec {
                name: n.to_string(),
                description: String::new(),
                input_schema: json!({"type": "object"}),
            })
            .collect()
    }

    fn names(r: &Recovered) -> Vec<(&str, &Value)> {
        r.calls
            .iter()
            .map(|c| (c.name.as_str(), &c.arguments))
            .collect()
    }

    #[test]
    fn a_bare_object_or_list_is_a_call() {
        let r = recover(
            r#" {"name": "write", "arguments": {"path": "a.txt", "content": "hi"}} "#,
            &tools(),
        )
        .unwrap();
        assert_eq!(r.text, "");
        assert_eq!(
            names(&r),
            [("write", &json!({"path": "a.txt", "content": "hi"}))]
        );
        let r = recover(
            r#"[{"name": "write", "arguments": "{\"path\": \"b\"}"}, {"name": "read", "parameters": {"path": "b"}}]"#,
            &tools(),
        )
        .unwrap();
        assert_eq!(
            names(&r),
            [
                ("write", &json!({"path": "b"})),
                ("read", &json!({"path": "b"}))
            ]
        );
        let r = recover(
            r#"{"type": "function", "function": {"name": "read", "arguments": {"path": "x"}}}"#,
            &tools(),
        )
        .unwrap();
        assert_eq!(names(&r), [("read", &json!({"path": "x"}))]);
    }

    #[test]
    fn tags_and_fences_are_calls_and_the_prose_stays() {
        let r = recover(
            "I'll save it.\n<tool_call>\n{\"name\": \"write\", \"arguments\": {\"path\": \"n.txt\"}}\n</tool_call>",
            &tools(),
        )
        .unwrap();
        assert_eq!(r.text, "I'll save it.");
        assert_eq!(names(&r), [("write", &json!({"path": "n.txt"}))]);
        let r = recover(
            "Reading:\n```json\n{\"name\": \"read\", \"arguments\": {\"path\": \"n.txt\"}}\n```\nDone.",
            &tools(),
        )
        .unwrap();
        assert_eq!(r.text, "Reading:\n\nDone.");
        assert_eq!(names(&r), [("read", &json!({"path": "n.txt"}))]);
        // An unclosed tag, as a model that stopped at the end of its call leaves it.
        let r = recover(
            "<tool_call>{\"name\": \"read\", \"arguments\": {}}",
            &tools(),
        )
        .unwrap();
        assert_eq!(names(&r), [("read", &json!({}))]);
    }

    /// The forms a real Qwen2.5 1.5B wrote (tests/fixtures/local-model).
    #[test]
    fn the_forms_a_real_small_model_wrote_are_calls() {
        let r = recover(
            "<tools>\n{\"name\": \"write\", \"arguments\": {\"path\": \"t.txt\"}}\n{\"name\": \"read\", \"arguments\": {\"path\": \"t.txt\"}}\n</tools>",
            &tools(),
        )
        .unwrap();
        assert_eq!(r.text, "");
        assert_eq!(
            names(&r),
            [
                ("write", &json!({"path": "t.txt"})),
                ("read", &json!({"path": "t.txt"}))
            ]
        );
        let r = recover(
            "```json\n{\"name\": \"write\", \"arguments\": {}}\n{\"name\": \"read\", \"arguments\": {}}\n```",
            &tools(),
        )
        .unwrap();
        assert_eq!(r.calls.len(), 2);
        let r = recover(
            "<{{\"name\": \"read\", \"arguments\": {}}}>\n\nThat lists nothing.",
            &tools(),
        )
        .unwrap();
        assert_eq!(names(&r), [("read", &json!({}))]);
        assert_eq!(r.text, "That lists nothing.");
        let r = recover("<{\"name\": \"read\", \"arguments\": {}}>", &tools()).unwrap();
        assert_eq!(names(&r), [("read", &json!({}))]);
    }

    #[test]
    fn what_only_looks_like_a_call_stays_text() {
        for text in [
            r#"{"name": "John", "arguments": {"age": 3}}"#,
            r#"{"name": "write", "arguments": [1, 2]}"#,
            r#"{"name": "write", "arguments": {}, "comment": "extra"}"#,
            "```json\n{\"name\": \"sudo\", \"arguments\": {}}\n```",
            "```\nplain code\n```",
            "Here is JSON: {\"name\": \"write\"}",
            r#"{"name": "NO_REPLY"}"#,
            "[]",
            "hello",
            "<tools>\n{\"name\": \"write\", \"arguments\": {}}\nnot json\n</tools>",
            "a <{b}> c",
            "{} {}",
        ] {
            assert_eq!(recover(text, &tools()), None, "{text}");
        }
    }

    #[test]
    fn held_text_passes_once_it_is_plainly_prose() {
        let mut h = HoldBack::default();
        assert_eq!(h.push("  "), None);
        assert_eq!(h.push("Hello"), Some("  Hello".into()));
        assert_eq!(h.push(" world"), Some(" world".into()));
        assert_eq!(h.finish(false), None);
        let mut h = HoldBack::default();
        assert_eq!(h.push("{\"name\""), None);
        assert_eq!(h.push(": \"write\"}"), None);
        assert_eq!(h.finish(true), None);
        let mut h = HoldBack::default();
        assert_eq!(h.push("[1, 2]"), None);
        assert_eq!(h.finish(false), Some("[1, 2]".into()));
    }

    proptest! {
        /// Any text: recovered calls name known tools with object arguments, and the text
        /// left is part of the original.
        #[test]
        fn recovery_is_sound(text in ".{0,200}") {
            if let Some(r) = recover(&text, &tools()) {
                prop_assert!(!r.calls.is_empty());
                for c in &r.calls {
                    prop_assert!(c.name == "write" || c.name == "read");
                    prop_assert!(c.arguments.is_object());
                }
            }
        }
    }
}
