//! What the loop asks of a final answer before it is the reply: some text (an empty answer is
//! asked again once, SPEC §16), and, when the client of a compatible endpoint asked for
//! structured output (SPEC §17), JSON that fits its format: a JSON object, or a value valid
//! under its schema (checked by `tools::arg_schema`, the checker of tool arguments). An answer
//! that does not fit is asked again once with the reason as a user-side note; the second
//! misfit fails the message.

use serde_json::Value;

use super::{Fail, FailCause};
use crate::llm::ChatResponse;
use crate::llm::compat::unfenced;
use crate::message::Message;
use crate::message::call::OutputFormat;
use crate::session::MessageEvent;
use crate::tools::arg_schema::ArgSchema;

/// What the model is told after an empty answer (recorded as a user turn of source `system`).
pub(super) const EMPTY_ANSWER_NUDGE: &str = "[agentd] Your last answer was empty. Answer the \
     message above now, in plain text.";

/// The start of the note after an answer that does not fit the client's format.
pub(super) const FORMAT_NOTE: &str =
    "[agentd] Your last answer does not fit the response format the client asked for:";

/// At most this many schema violations are named in the note and the error.
const MAX_LISTED: usize = 5;

/// Whether an answer has nothing to give: no text and no tool calls (on the last turn, calls
/// are dropped, so only its text counts).
pub(super) fn is_empty(resp: &ChatResponse, last_turn: bool) -> bool {
    resp.text.trim().is_empty() && (resp.tool_calls.is_empty() || last_turn)
}

/// A user turn from agentd (source `system`) that the model reads before it answers again.
pub(super) fn note(text: String) -> MessageEvent {
    let mut ev = MessageEvent::new(Message::User {
        content: vec![crate::message::UserBlock::Text { text }],
    });
    ev.source = Some("system".to_string());
    ev.from = Some("agentd".to_string());
    ev
}

/// The user turn that asks again after an empty answer.
pub(super) fn nudge() -> MessageEvent {
    note(EMPTY_ANSWER_NUDGE.to_string())
}

/// The user turn that asks again after an answer that does not fit the format (`why`).
pub(super) fn format_note(why: &str) -> MessageEvent {
    note(format!(
        "{FORMAT_NOTE} {why}. Answer the message above again with only the JSON, no other text."
    ))
}

/// Why the final answer `resp` does not fit `format` (`None`: it fits, no format was asked
/// for, or the answer calls tools and is not final). A fitting answer's text becomes its JSON
/// without a code fence, so the client gets what was checked.
pub(super) fn misfit(
    format: Option<&OutputFormat>,
    resp: &mut ChatResponse,
    last_turn: bool,
) -> Option<String> {
    let format = format?;
    if !resp.tool_calls.is_empty() && !last_turn {
        return None;
    }
    match check(format, &resp.text) {
        Ok(json) => {
            if json.len() != resp.text.len() {
                resp.text = json.to_string();
            }
            None
        }
        Err(why) => Some(why),
    }
}

/// `text` as JSON that fits `format` (trimmed, a ```` ```json ```` fence taken off), or why
/// it does not.
pub fn check<'a>(format: &OutputFormat, text: &'a str) -> Result<&'a str, String> {
    let json = unfenced(text);
    let value: Value = serde_json::from_str(json).map_err(|e| format!("it is not JSON ({e})"))?;
    match format {
        OutputFormat::JsonObject if value.is_object() => Ok(json),
        OutputFormat::JsonObject => Err("it is JSON but not an object".into()),
        OutputFormat::JsonSchema { schema, name, .. } => {
            let compiled = ArgSchema::compile(schema)
                .map_err(|e| format!("the schema {name:?} cannot be checked: {e}"))?;
            let Err(invalid) = compiled.validate(&value, MAX_LISTED) else {
                return Ok(json);
            };
            let mut why: Vec<String> = invalid
                .violations
                .iter()
                .map(|v| {
                    let at = if v.path.is_empty() { "(root)" } else { &v.path };
                    format!("at {at}: {}", v.message)
                })
                .collect();
            if invalid.total > invalid.violations.len() {
                why.push(format!(
                    "and {} more",
                    invalid.total - invalid.violations.len()
                ));
            }
            Err(format!(
                "it does not match the JSON schema {name:?}: {}",
                why.join("; ")
            ))
        }
    }
}

/// The failure after a second answer that does not fit the format: the model's failure.
pub(super) fn format_fail(reply: String, model: &str, why: &str, retried: bool) -> Fail {
    Fail {
        reply,
        error: format!(
            "the model ({model}) did not answer in the response format the client asked for{}: {why}",
            if retried {
                ", also when asked again"
            } else {
                " on the last turn"
            }
        ),
        cause: FailCause::Model,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> OutputFormat {
        OutputFormat::JsonSchema {
            name: "city".into(),
            schema: json!({"type": "object", "properties": {"name": {"type": "string"},
                           "people": {"type": "integer", "minimum": 0}},
                           "required": ["name", "people"], "additionalProperties": false}),
            strict: None,
            description: None,
        }
    }

    #[test]
    fn a_json_object_is_any_object() {
        assert_eq!(
            check(&OutputFormat::JsonObject, " {\"a\": 1}\n"),
            Ok("{\"a\": 1}")
        );
        let e = check(&OutputFormat::JsonObject, "[1]").unwrap_err();
        assert!(e.contains("not an object"), "{e}");
        let e = check(&OutputFormat::JsonObject, "Sure! {\"a\": 1}").unwrap_err();
        assert!(e.contains("not JSON"), "{e}");
    }

    #[test]
    fn a_schema_is_checked_and_violations_are_named() {
        let ok = r#"{"name": "Oslo", "people": 700000}"#;
        assert_eq!(check(&schema(), ok), Ok(ok));
        let e = check(&schema(), r#"{"name": "Oslo", "people": -1, "x": 1}"#).unwrap_err();
        assert!(e.contains("\"city\""), "{e}");
        assert!(e.contains("/people"), "{e}");
        assert!(e.contains("x"), "{e}");
    }

    #[test]
    fn a_fenced_answer_is_unfenced() {
        let fenced = "```json\n{\"name\": \"Oslo\", \"people\": 1}\n```";
        assert_eq!(
            check(&schema(), fenced),
            Ok("{\"name\": \"Oslo\", \"people\": 1}")
        );
        assert_eq!(check(&OutputFormat::JsonObject, "```\n{}\n```\n"), Ok("{}"));
        let mut resp = ChatResponse {
            text: fenced.into(),
            tool_calls: vec![],
            thinking: vec![],
            stop_reason: crate::llm::StopReason::EndTurn,
            usage: Default::default(),
            model: String::new(),
        };
        assert_eq!(misfit(Some(&schema()), &mut resp, false), None);
        assert_eq!(resp.text, "{\"name\": \"Oslo\", \"people\": 1}");
    }

    #[test]
    fn only_a_final_answer_is_checked() {
        let mut resp = ChatResponse {
            text: "Let me look that up.".into(),
            tool_calls: vec![crate::message::ToolCall {
                id: "c1".into(),
                name: "echo".into(),
                arguments: json!({}),
            }],
            thinking: vec![],
            stop_reason: crate::llm::StopReason::ToolUse,
            usage: Default::default(),
            model: String::new(),
        };
        assert_eq!(misfit(Some(&schema()), &mut resp, false), None);
        assert!(misfit(Some(&schema()), &mut resp, true).is_some());
        assert_eq!(misfit(None, &mut resp, true), None);
    }
}
