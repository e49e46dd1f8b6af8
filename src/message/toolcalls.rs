//! Tool calls from a provider answer made safe to store and replay (SPEC §16.9 "Provider
//! answers"). Pure, on neutral types.
//!
//! A session's history is sent again with every later request, to whichever model answers it
//! (a fallback may speak the other wire). So a call is stored only in a shape both providers
//! accept: an id and a name matching `^[A-Za-z0-9_-]{1,64}$`, ids unique within the session,
//! and an input that is a JSON object. Whatever breaks that is rewritten here, before the
//! answer is recorded, and the calls that cannot be run as asked get an error result instead.
//! The inputs of one answer are also bounded in size ([`MAX_ANSWER_INPUT_BYTES`]): a 1 MB
//! input stored as it came would be sent again with every later request, over the model's
//! context window, and fail each of them until a reset.

use std::collections::HashSet;

use serde_json::Value;

use super::{Message, ToolCall};

/// The name a call with an invalid name is stored under.
pub const INVALID_NAME: &str = "invalid_tool_name";

/// The prefix of ids the daemon gives calls whose own id was invalid or taken.
const ID_PREFIX: &str = "call_agentd_";

/// The most bytes (as JSON) the inputs of one answer's calls may have together. A call whose
/// input does not fit in what is left is stored with `{}` and answered with an error instead
/// of being run. About 64k tokens: a third of a 200k context window.
pub const MAX_ANSWER_INPUT_BYTES: usize = 256 * 1024;

/// At most this many characters of a rejected name are quoted back to the model.
const MAX_QUOTED_NAME: usize = 80;

/// What [`normalise`] changed in one call.
#[derive(Debug, Clone, PartialEq)]
pub struct Rewrite {
    /// Index of the call in the answer.
    pub index: usize,
    /// The id as received, when it was replaced.
    pub original_id: Option<String>,
    /// The name as received, when it was replaced.
    pub original_name: Option<String>,
    /// The error result that answers this call instead of running it.
    pub refusal: Option<String>,
}

/// `^[A-Za-z0-9_-]{1,64}$`: a tool-call id or tool name both providers accept.
pub fn is_valid_token(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Normalise `calls` (one answer) in place, against the ids already in `history`:
/// - an id that is invalid, or repeats an earlier id of this answer or of the history, gets a
///   fresh `call_agentd_<n>` unique in both (the first use of a valid id keeps it);
/// - an invalid name becomes [`INVALID_NAME`], and the call an error result;
/// - a `null` input becomes `{}` (a call of a tool without arguments); any other input that is
///   not a JSON object becomes `{}`, and the call an error result;
/// - an input that does not fit in what is left of [`MAX_ANSWER_INPUT_BYTES`] for this answer
///   becomes `{}`, and the call an error result.
///
/// Returns one entry per changed call (empty when the answer was already well formed). A
/// result that answers a call refers to its stored (rewritten) id, since results are built
/// from the stored calls; `original_id` keeps the mapping for the log.
pub fn normalise(calls: &mut [ToolCall], history: &[Message]) -> Vec<Rewrite> {
    if calls.is_empty() {
        return Vec::new();
    }
    // Ids of this answer that clash with the history: only those are looked up there, so a
    // well-formed answer costs one pass over the history's calls and no allocation per call.
    let wanted: HashSet<&str> = calls.iter().map(|c| c.id.as_str()).collect();
    let mut taken: HashSet<String> = history
        .iter()
        .flat_map(Message::tool_calls)
        .filter(|c| wanted.contains(c.id.as_str()))
        .map(|c| c.id.clone())
        .collect();

    // Fresh ids avoid every id of the history and of this answer (also of calls after the one
    // rewritten).
    let mut fresh = FreshIds::new(history.iter().flat_map(Message::tool_calls).chain(&*calls));
    let mut rewrites = Vec::new();
    let mut room = MAX_ANSWER_INPUT_BYTES;
    for (index, call) in calls.iter_mut().enumerate() {
        rewrites.extend(normalise_call(
            call, index, &mut taken, &mut fresh, &mut room,
        ));
    }
    rewrites
}

/// Apply the rules of [`normalise`] to one call: `taken` holds the ids used before it (its
/// own is added), `fresh` hands out new ones, `room` is what is left of the answer's input
/// bytes (this call's are taken from it). `None` when the call was already well formed.
fn normalise_call(
    call: &mut ToolCall,
    index: usize,
    taken: &mut HashSet<String>,
    fresh: &mut FreshIds,
    room: &mut usize,
) -> Option<Rewrite> {
    let mut rewrite = Rewrite {
        index,
        original_id: None,
        original_name: None,
        refusal: None,
    };
    if !is_valid_token(&call.id) || taken.contains(&call.id) {
        let new_id = fresh.next(taken);
        rewrite.original_id = Some(std::mem::replace(&mut call.id, new_id));
    }
    taken.insert(call.id.clone());

    if !is_valid_token(&call.name) {
        let original = std::mem::replace(&mut call.name, INVALID_NAME.to_string());
        rewrite.refusal = Some(format!(
            "error: the tool name {} is not valid (a name has 1 to 64 characters from \
             A-Z, a-z, 0-9, '_' and '-'), so the call was not run. Call one of the tools \
             you were given, by its exact name.",
            quote(&original)
        ));
        rewrite.original_name = Some(original);
    }
    match &call.arguments {
        Value::Object(_) => {}
        Value::Null => call.arguments = Value::Object(serde_json::Map::new()),
        other => {
            let kind = json_kind(other);
            call.arguments = Value::Object(serde_json::Map::new());
            if rewrite.refusal.is_none() {
                rewrite.refusal = Some(format!(
                    "error: the arguments of this call were {kind}, not a JSON object, so \
                     the call was not run. Send the arguments as one JSON object."
                ));
            }
        }
    }
    let size = json_size(&call.arguments);
    if size > *room {
        call.arguments = Value::Object(serde_json::Map::new());
        if rewrite.refusal.is_none() {
            rewrite.refusal = Some(format!(
                "error: the input of this call was {size} bytes of JSON, more than the \
                 {MAX_ANSWER_INPUT_BYTES} bytes the calls of one answer may have together \
                 ({room} were left), so the call was not run and its input was not kept. \
                 Send less in one call: split large content over several calls in separate \
                 answers.",
                room = *room
            ));
        }
    } else {
        *room -= size;
    }
    let changed = rewrite.original_id.is_some()
        || rewrite.original_name.is_some()
        || rewrite.refusal.is_some();
    changed.then_some(rewrite)
}

/// Apply the rules of [`normalise`] to a history stored before they existed (a session
/// poisoned by an earlier answer), in memory: each assistant message's calls against the ones
/// before them, and the results of the next message renamed with their calls (matched by the
/// old id, in order). Results that were recorded stay as they are. Returns how many calls
/// changed; a well-formed history costs one pass and is left alone.
pub fn repair_history(messages: &mut [Message]) -> usize {
    let mut seen = HashSet::new();
    let well_formed = messages.iter().flat_map(Message::tool_calls).all(|c| {
        is_valid_token(&c.id)
            && is_valid_token(&c.name)
            && c.arguments.is_object()
            && seen.insert(c.id.as_str())
    }) && messages.iter().all(|m| {
        m.tool_calls()
            .iter()
            .map(|c| json_size(&c.arguments))
            .sum::<usize>()
            <= MAX_ANSWER_INPUT_BYTES
    });
    if well_formed {
        return 0;
    }
    let mut fresh = FreshIds::new(messages.iter().flat_map(Message::tool_calls));
    let mut taken = HashSet::new();
    let mut changed = 0;
    // (old id, new id) of the last assistant message's renamed calls, in call order.
    let mut renamed: Vec<(String, String)> = Vec::new();
    for m in messages.iter_mut() {
        match m {
            Message::Assistant { tool_calls, .. } => {
                renamed.clear();
                let mut room = MAX_ANSWER_INPUT_BYTES;
                for (i, call) in tool_calls.iter_mut().enumerate() {
                    let old = call.id.clone();
                    if normalise_call(call, i, &mut taken, &mut fresh, &mut room).is_some() {
                        changed += 1;
                    }
                    renamed.push((old, call.id.clone()));
                }
            }
            Message::ToolResults { results, .. } => {
                for r in results.iter_mut() {
                    if let Some(at) = renamed.iter().position(|(old, _)| *old == r.tool_call_id) {
                        r.tool_call_id = renamed.remove(at).1;
                    }
                }
                renamed.clear();
            }
            Message::User { .. } => renamed.clear(),
        }
    }
    changed
}

/// Hands out `call_agentd_<n>` ids that no call of the history or of the answer uses.
struct FreshIds {
    used: HashSet<String>,
    next: u64,
}

impl FreshIds {
    /// Never hands out an id of `calls`.
    fn new<'a>(calls: impl Iterator<Item = &'a ToolCall>) -> FreshIds {
        let used = calls
            .filter(|c| c.id.starts_with(ID_PREFIX))
            .map(|c| c.id.clone())
            .collect();
        FreshIds { used, next: 1 }
    }

    fn next(&mut self, taken: &HashSet<String>) -> String {
        loop {
            let id = format!("{ID_PREFIX}{}", self.next);
            self.next += 1;
            if !self.used.contains(&id) && !taken.contains(&id) {
                self.used.insert(id.clone());
                return id;
            }
        }
    }
}

/// `"name"` as JSON (escapes controls and quotes), cut to a bounded length.
fn quote(s: &str) -> String {
    let shown: String = s.chars().take(MAX_QUOTED_NAME).collect();
    let mut q = Value::String(shown.clone()).to_string();
    if shown.len() < s.len() {
        q.push('…');
    }
    q
}

/// The length of `v` written as compact JSON, counted without building the text.
fn json_size(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    match serde_json::to_writer(&mut n, v) {
        Ok(()) => n.0,
        Err(_) => usize::MAX,
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: &str, name: &str, arguments: Value) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments,
        }
    }

    fn assistant(calls: Vec<ToolCall>) -> Message {
        Message::Assistant {
            text: String::new(),
            tool_calls: calls,
            thinking: vec![],
            usage: None,
        }
    }

    #[test]
    fn an_oversized_input_is_stored_as_an_empty_object_and_refused() {
        let big = "x".repeat(1_000_000);
        let mut calls = vec![
            call("t1", "read", json!({"path": "a"})),
            call("t2", "memory_write", json!({"entity": "A", "value": big})),
            call("t3", "read", json!({"path": "b"})),
        ];
        let rw = normalise(&mut calls, &[]);
        assert_eq!(rw.len(), 1, "{rw:?}");
        assert_eq!(rw[0].index, 1);
        let refusal = rw[0].refusal.as_deref().unwrap();
        assert!(
            refusal.contains("not run") && refusal.contains("1000025 bytes"),
            "{refusal}"
        );
        assert_eq!(calls[1].arguments, json!({}));
        assert_eq!(calls[2].arguments, json!({"path": "b"}), "the rest run");
    }

    #[test]
    fn the_inputs_of_one_answer_share_one_bound() {
        let quarter = "x".repeat(MAX_ANSWER_INPUT_BYTES / 3);
        let mut calls: Vec<ToolCall> = (0..4)
            .map(|i| call(&format!("t{i}"), "write", json!({"content": quarter})))
            .collect();
        let rw = normalise(&mut calls, &[]);
        let refused: Vec<usize> = rw.iter().map(|r| r.index).collect();
        assert_eq!(refused, [2, 3], "the calls past the bound: {rw:?}");
        let stored: usize = calls.iter().map(|c| json_size(&c.arguments)).sum();
        assert!(stored <= MAX_ANSWER_INPUT_BYTES, "{stored}");
        // Each answer has its own bound.
        let history = vec![assistant(calls)];
        let mut next = vec![call("u1", "write", json!({"content": quarter}))];
        assert!(normalise(&mut next, &history).is_empty());
    }

    #[test]
    fn a_history_with_an_oversized_input_is_repaired() {
        let mut history = vec![
            assistant(vec![call(
                "t1",
                "tts",
                json!({"text": "y".repeat(1_000_000)}),
            )]),
            Message::ToolResults {
                results: vec![crate::message::ToolResult {
                    tool_call_id: "t1".into(),
                    content: "error".into(),
                    is_error: true,
                    images: Vec::new(),
                }],
                notice: None,
            },
        ];
        assert_eq!(repair_history(&mut history), 1);
        assert_eq!(history[0].tool_calls()[0].arguments, json!({}));
        assert_eq!(history[0].tool_calls()[0].id, "t1");
    }

    #[test]
    fn a_well_formed_answer_is_left_alone() {
        let mut calls = vec![
            call("toolu_01A", "read", json!({"path": "a"})),
            call("call-2", "exec", json!({})),
        ];
        let before = calls.clone();
        assert!(normalise(&mut calls, &[]).is_empty());
        assert_eq!(calls, before);
    }

    #[test]
    fn invalid_ids_get_fresh_ones_and_the_mapping_is_kept() {
        let mut calls = vec![
            call("a/b", "read", json!({})),
            call("a b", "read", json!({})),
            call("chatcmpl.tool:0", "read", json!({})),
            call("", "read", json!({})),
            call(&"x".repeat(65), "read", json!({})),
        ];
        let rw = normalise(&mut calls, &[]);
        assert_eq!(rw.len(), 5);
        let ids: Vec<&str> = calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "call_agentd_1",
                "call_agentd_2",
                "call_agentd_3",
                "call_agentd_4",
                "call_agentd_5"
            ]
        );
        assert_eq!(rw[0].original_id.as_deref(), Some("a/b"));
        assert_eq!(rw[2].original_id.as_deref(), Some("chatcmpl.tool:0"));
        // An id rewrite alone does not stop the call.
        assert!(rw.iter().all(|r| r.refusal.is_none()));
    }

    #[test]
    fn duplicates_within_the_answer_and_the_history_are_renamed() {
        let history = vec![
            assistant(vec![call("old", "read", json!({}))]),
            assistant(vec![call("call_agentd_1", "read", json!({}))]),
        ];
        let mut calls = vec![
            call("dup", "read", json!({})),
            call("dup", "read", json!({})),
            call("old", "read", json!({})),
            // Already taken by the rewrite of a later call? No: fresh ids skip every id in use.
            call("call_agentd_3", "read", json!({})),
        ];
        let rw = normalise(&mut calls, &history);
        let ids: Vec<&str> = calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            ids,
            ["dup", "call_agentd_2", "call_agentd_4", "call_agentd_3"]
        );
        assert_eq!(rw.len(), 2);
        assert_eq!(rw[0].index, 1);
        assert_eq!(rw[1].original_id.as_deref(), Some("old"));
    }

    #[test]
    fn an_invalid_name_becomes_a_refusal_under_a_valid_name() {
        let mut calls = vec![call("t1", "read file\n[fake log]", json!({"path": "a"}))];
        let rw = normalise(&mut calls, &[]);
        assert_eq!(calls[0].name, INVALID_NAME);
        let refusal = rw[0].refusal.as_deref().unwrap();
        assert!(refusal.contains(r#""read file\n[fake log]""#), "{refusal}");
        assert!(refusal.contains("not run"), "{refusal}");
        assert_eq!(
            rw[0].original_name.as_deref(),
            Some("read file\n[fake log]")
        );
        let mut long = vec![call("t1", &"é".repeat(300), json!({}))];
        let refusal = normalise(&mut long, &[])[0].refusal.clone().unwrap();
        assert!(refusal.chars().count() < 400 && refusal.contains('…'));
    }

    #[test]
    fn non_object_inputs_become_empty_objects_and_refusals() {
        let mut calls = vec![
            call("t1", "read", json!("a string")),
            call("t2", "read", json!([1])),
            call("t3", "read", json!(3)),
            call("t4", "read", Value::Null),
        ];
        let rw = normalise(&mut calls, &[]);
        assert!(calls.iter().all(|c| c.arguments == json!({})));
        // null: the call of a tool without arguments; it runs, nothing to report.
        assert_eq!(rw.len(), 3);
        assert!(rw[0].refusal.as_deref().unwrap().contains("a string"));
        assert!(rw[1].refusal.as_deref().unwrap().contains("an array"));
        assert!(rw[2].refusal.as_deref().unwrap().contains("a number"));
    }

    #[test]
    fn the_adapters_invalid_json_marker_is_an_object_and_stays() {
        let mut calls = vec![call("t1", "read", json!({"__invalid_json": "{bad"}))];
        assert!(normalise(&mut calls, &[]).is_empty());
    }

    fn results(ids: &[&str]) -> Message {
        Message::ToolResults {
            results: ids
                .iter()
                .map(|id| crate::message::ToolResult {
                    tool_call_id: id.to_string(),
                    content: format!("result of {id}"),
                    is_error: false,
                    images: Vec::new(),
                })
                .collect(),
            notice: None,
        }
    }

    fn result_ids(m: &Message) -> Vec<String> {
        match m {
            Message::ToolResults { results, .. } => {
                results.iter().map(|r| r.tool_call_id.clone()).collect()
            }
            _ => panic!("not results"),
        }
    }

    #[test]
    fn a_poisoned_history_is_repaired_with_its_results() {
        let mut history = vec![
            Message::user_text("hi"),
            assistant(vec![
                call("a/b", "read file", json!("s")),
                call("dup", "read", json!({})),
                call("dup", "read", json!({})),
            ]),
            results(&["a/b", "dup", "dup"]),
            assistant(vec![call("dup", "read", json!({}))]),
            results(&["dup"]),
        ];
        assert_eq!(repair_history(&mut history), 3);
        let ids: Vec<String> = history
            .iter()
            .flat_map(Message::tool_calls)
            .map(|c| c.id.clone())
            .collect();
        assert_eq!(
            ids,
            ["call_agentd_1", "dup", "call_agentd_2", "call_agentd_3"]
        );
        assert_eq!(
            result_ids(&history[2]),
            ["call_agentd_1", "dup", "call_agentd_2"]
        );
        assert_eq!(result_ids(&history[4]), ["call_agentd_3"]);
        let first = &history[1].tool_calls()[0];
        assert_eq!(
            (first.name.as_str(), &first.arguments),
            (INVALID_NAME, &json!({}))
        );
        // Repaired once, well formed after: a second pass changes nothing.
        let again = history.clone();
        assert_eq!(repair_history(&mut history), 0);
        assert_eq!(history, again);
    }

    #[test]
    fn tokens() {
        assert!(is_valid_token("toolu_01AbC-9"));
        assert!(is_valid_token(&"a".repeat(64)));
        assert!(!is_valid_token(&"a".repeat(65)));
        assert!(!is_valid_token(""));
        assert!(!is_valid_token("a.b"));
        assert!(!is_valid_token("a:b"));
        assert!(!is_valid_token("ü"));
    }
}
