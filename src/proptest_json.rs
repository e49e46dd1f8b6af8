//! Test helper: proptest strategies for the property tests of parsers of outside input —
//! arbitrary JSON values, and edits that turn a valid document into a plausible broken one
//! (a field removed, a value of the wrong type, an unknown key), the way real peers get it
//! wrong. See docs/reliability.md "Property tests".

use proptest::prelude::*;
use serde_json::{Value, json};

/// Arbitrary JSON (at most 3 levels, a few dozen nodes) with the values parsers trip on:
/// extreme and negative integers, floats, empty and non-ASCII strings, nesting.
pub fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        (-1.0e12f64..1.0e12).prop_map(|f| json!(f)),
        "\\PC{0,12}".prop_map(Value::String),
        Just(json!("")),
        Just(json!(0)),
    ];
    leaf.prop_recursive(3, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,10}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// One edit of a JSON document, applied at a node chosen by [`mutate`].
#[derive(Debug, Clone)]
pub enum Edit {
    /// Remove the node from its parent (the root becomes `null`).
    Remove,
    /// Replace the node with another value.
    Replace(Value),
    /// Add a key to the node when it is an object (otherwise replace it with `{key: value}`).
    Insert(String, Value),
}

/// Up to `max` edits, each with a number that picks the node it applies to.
pub fn edits(max: usize) -> impl Strategy<Value = Vec<(usize, Edit)>> {
    let edit = prop_oneof![
        Just(Edit::Remove),
        any_json().prop_map(Edit::Replace),
        ("[a-z_]{1,10}", any_json()).prop_map(|(k, v)| Edit::Insert(k, v)),
    ];
    prop::collection::vec((any::<usize>(), edit), 0..=max)
}

/// `doc` with `edits` applied in order; each picks its node as `n % nodes` in pre-order.
pub fn mutate(doc: &Value, edits: &[(usize, Edit)]) -> Value {
    let mut v = doc.clone();
    for (n, edit) in edits {
        let mut pointers = Vec::new();
        collect_pointers(&v, String::new(), &mut pointers);
        let at = pointers[n % pointers.len()].clone();
        apply(&mut v, &at, edit);
    }
    v
}

fn collect_pointers(v: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let key = k.replace('~', "~0").replace('/', "~1");
                collect_pointers(child, format!("{at}/{key}"), out);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                collect_pointers(child, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

fn apply(doc: &mut Value, at: &str, edit: &Edit) {
    match edit {
        Edit::Remove => {
            let Some((parent, last)) = at.rsplit_once('/') else {
                *doc = Value::Null;
                return;
            };
            let key = last.replace("~1", "/").replace("~0", "~");
            match doc.pointer_mut(parent) {
                Some(Value::Object(m)) => {
                    m.remove(&key);
                }
                Some(Value::Array(a)) => {
                    if let Ok(i) = key.parse::<usize>()
                        && i < a.len()
                    {
                        a.remove(i);
                    }
                }
                _ => {}
            }
        }
        Edit::Replace(new) => {
            if let Some(node) = doc.pointer_mut(at) {
                *node = new.clone();
            }
        }
        Edit::Insert(key, value) => {
            if let Some(node) = doc.pointer_mut(at) {
                match node {
                    Value::Object(m) => {
                        m.insert(key.clone(), value.clone());
                    }
                    other => *other = json!({ key.clone(): value.clone() }),
                }
            }
        }
    }
}

/// An event-level edit of a transcript: the ways a broken server or proxy gets a stream
/// wrong.
#[derive(Debug, Clone)]
pub enum StreamEdit {
    /// Edit the JSON of event n's data.
    Data(usize, Vec<(usize, Edit)>),
    /// Drop event n.
    Drop(usize),
    /// Send event n twice.
    Repeat(usize),
    /// Swap events n and m.
    Swap(usize, usize),
}

pub fn stream_edits() -> impl Strategy<Value = Vec<StreamEdit>> {
    proptest::collection::vec(
        prop_oneof![
            (any::<usize>(), edits(2)).prop_map(|(n, e)| StreamEdit::Data(n, e)),
            any::<usize>().prop_map(StreamEdit::Drop),
            any::<usize>().prop_map(StreamEdit::Repeat),
            (any::<usize>(), any::<usize>()).prop_map(|(n, m)| StreamEdit::Swap(n, m)),
        ],
        1..5,
    )
}

/// An SSE `transcript` (events separated by blank lines) with `edits` applied, event by event.
pub fn edited_transcript(transcript: &str, edits: &[StreamEdit]) -> String {
    let mut events: Vec<String> = transcript
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(str::to_string)
        .collect();
    for e in edits {
        let len = events.len();
        if len == 0 {
            break;
        }
        match e {
            StreamEdit::Data(n, edits) => {
                let ev = &mut events[n % len];
                if let Some((head, data)) = ev.split_once("data: ")
                    && let Ok(v) = serde_json::from_str::<serde_json::Value>(data)
                {
                    let v = mutate(&v, edits);
                    *ev = format!("{head}data: {v}");
                }
            }
            StreamEdit::Drop(n) => {
                events.remove(n % len);
            }
            StreamEdit::Repeat(n) => {
                let ev = events[n % len].clone();
                events.insert(n % len, ev);
            }
            StreamEdit::Swap(n, m) => events.swap(n % len, m % len),
        }
    }
    events.iter().map(|e| format!("{e}\n\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_reach_every_node() {
        let doc = json!({"a": {"b": [1, 2]}, "c/d": "x"});
        // Pre-order: "", /a, /a/b, /a/b/0, /a/b/1, /c~1d.
        assert_eq!(
            mutate(&doc, &[(3, Edit::Remove)]),
            json!({"a": {"b": [2]}, "c/d": "x"})
        );
        assert_eq!(
            mutate(&doc, &[(5, Edit::Remove)]),
            json!({"a": {"b": [1, 2]}})
        );
        assert_eq!(
            mutate(&doc, &[(1, Edit::Replace(json!(7)))]),
            json!({"a": 7, "c/d": "x"})
        );
        assert_eq!(
            mutate(&doc, &[(2, Edit::Insert("k".into(), json!(null)))]),
            json!({"a": {"b": {"k": null}}, "c/d": "x"})
        );
        assert_eq!(mutate(&doc, &[(6, Edit::Remove)]), Value::Null);
        assert_eq!(mutate(&doc, &[]), doc);
    }
}
