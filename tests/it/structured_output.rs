//! Structured output on the compatible endpoints (SPEC §17), driven by the official `openai`
//! and `anthropic` Python SDKs (`compat_clients.py`) against a fake provider: the format
//! reaches the provider, the final answer is checked against it (asked again once with the
//! reason, then a clear error), and a model configured `structured_output = false` is
//! refused before anything is recorded.

use serde_json::{Value, json};

use crate::compat::{daemon_with, run_clients};
use crate::support::e2e::provider_toml;
use crate::support::fake_llm::{FakeLlm, Reply, Wire, last_user_text};

/// The start of the note agentd writes after an answer that does not fit
/// (`agent::answer::FORMAT_NOTE`).
const NOTE: &str = "does not fit the response format the client asked for";

/// The question of a provider request: its last user message that is not agentd's note.
fn question(body: &Value) -> String {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    messages
        .iter()
        .rev()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].to_string())
        .find(|t| !t.contains(NOTE))
        .unwrap_or_default()
}

/// Answers by the question: JSON, prose then JSON once told, or always prose.
fn answer(body: &Value) -> Option<Reply> {
    let q = question(body);
    let told = last_user_text(body).contains(NOTE);
    let city = r#"{"name": "Oslo", "people": 700000}"#;
    Some(Reply::text(
        if q.contains("structured city") || (q.contains("structured retry") && told) {
            city.to_string()
        } else if q.contains("structured anthropic") {
            format!("```json\n{city}\n```")
        } else if q.contains("plain please") {
            "plain answer".to_string()
        } else {
            "Oslo has about 700,000 people.".to_string()
        },
    ))
}

/// The provider requests made for the question `q`.
fn calls_with(fake: &FakeLlm, q: &str) -> Vec<Value> {
    fake.requests()
        .into_iter()
        .filter(|r| question(r).contains(q))
        .collect()
}

#[test]
fn the_sdks_get_structured_answers_checked_against_their_schema() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.set_responder(answer);
    let (mut d, base) = daemon_with("", &provider_toml("anthropic", &fake.base_url()));
    let steps = run_clients(&base, "structured");

    // (a) `client.chat.completions.parse` with a pydantic model: the provider received the
    // schema as `output_config.format`, the answer parses.
    assert_eq!(
        steps["parsed"]["parsed"],
        json!({"name": "Oslo", "people": 700000})
    );
    let sent = &calls_with(&fake, "structured city")[0];
    let format = &sent["output_config"]["format"];
    assert_eq!(format["type"], "json_schema", "{sent}");
    assert_eq!(
        format["schema"]["required"],
        json!(["name", "people"]),
        "{format}"
    );

    // (b) Prose first, JSON once told why: the client gets the JSON, the trail holds the note.
    assert_eq!(
        steps["retry"]["content"],
        r#"{"name": "Oslo", "people": 700000}"#
    );
    assert_eq!(calls_with(&fake, "structured retry").len(), 2);
    let trail = d.trail("api:structured");
    let notes: Vec<&Value> = trail
        .iter()
        .filter(|l| l["type"] == "message" && l.to_string().contains(NOTE))
        .collect();
    assert_eq!(notes.len(), 2, "one note each for (b) and (c): {trail:?}");
    assert!(notes[0].to_string().contains("not JSON"), "{}", notes[0]);

    // (c) Prose twice: a clear error, the model's failure (502), not retried by the SDK.
    let never = &steps["never"];
    assert_eq!(never["status"], 502, "{never}");
    let message = never["body"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("did not answer in the response format"),
        "{never}"
    );
    assert_eq!(calls_with(&fake, "structured never").len(), 2);

    // (e) `anthropic` `messages.parse` with `output_format=City` (sent as
    // `output_config.format`): the fenced answer reaches the client without its fence.
    let ant = &steps["anthropic"];
    assert_eq!(ant["parsed"], json!({"name": "Oslo", "people": 700000}));
    assert_eq!(ant["text"], r#"{"name": "Oslo", "people": 700000}"#);
    let sent = &calls_with(&fake, "structured anthropic")[0];
    assert_eq!(sent["output_config"]["format"]["type"], "json_schema");
    assert!(d.sigterm().success());
}

/// (d) A model with `structured_output = false`: a request with a format is refused (400
/// naming the field, the model and the key) before intake: nothing recorded, no model call.
#[test]
fn a_model_without_structured_output_refuses_a_format_with_400() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.set_responder(answer);
    let provider = format!(
        "{}structured_output = false\n",
        provider_toml("anthropic", &fake.base_url())
    );
    let (mut d, base) = daemon_with("", &provider);
    let steps = run_clients(&base, "unsupported");
    let openai = &steps["openai"];
    assert_eq!(openai["error"], "BadRequestError", "{openai}");
    assert_eq!(openai["body"]["param"], "response_format", "{openai}");
    let message = openai["body"]["message"].as_str().unwrap_or_default();
    for part in [
        "\"primary\"",
        "structured_output",
        "fake-model",
        "fake.toml",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    let anthropic = &steps["anthropic"];
    assert_eq!(anthropic["error"], "BadRequestError", "{anthropic}");
    assert!(
        anthropic["body"]["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("structured_output"),
        "{anthropic}"
    );
    assert_eq!(steps["plain"]["content"], "plain answer");
    assert!(calls_with(&fake, "structured refused").is_empty());
    assert!(d.session_id("api:refused").is_none(), "nothing recorded");
    assert!(d.sigterm().success());
}
