//! `POST /v1/responses` of the real daemon (SPEC §17), driven by the official `openai` Python
//! SDK (`compat_clients.py responses`) against a fake provider: answers streamed and not,
//! `previous_response_id` through one-off and named sessions, `store: false`, refusals.

use serde_json::Value;

use crate::compat::{daemon, run_clients};
use crate::support::fake_llm::{
    FakeLlm, Reply, Usage, Wire, last_user_text, tool_results_in_last_message,
};

/// Answers by the new input's last line naming `responses <what>`: `<what> answer`; a
/// `weather` question calls the client's `get_weather`, and its result is read back.
fn answer(body: &Value) -> Option<Reply> {
    let usage = Usage::new(20, 4, 100, 10);
    let results = tool_results_in_last_message(body);
    if !results.is_empty() {
        return Some(Reply::Text {
            text: format!("the weather: {}", results.join(", ")),
            usage,
        });
    }
    let text = last_user_text(body);
    if let Some(tag) = text
        .lines()
        .last()
        .and_then(|l| l.split("responses weather ").nth(1))
    {
        return Some(Reply::ToolCalls {
            text: None,
            calls: vec![(
                format!("call_{tag}"),
                "get_weather".into(),
                serde_json::json!({"city": "Paris"}),
            )],
            usage,
        });
    }
    let line = (text.lines().rev())
        .find(|l| l.contains("responses "))
        .unwrap_or_default();
    let what = line.rsplit("responses ").next().unwrap_or(line);
    Some(Reply::Text {
        text: format!("{what} answer"),
        usage,
    })
}

/// The provider requests whose new input names `question`.
fn requests_for(fake: &FakeLlm, question: &str) -> Vec<Value> {
    fake.requests()
        .into_iter()
        .filter(|r| last_user_text(r).contains(&format!("responses {question}")))
        .collect()
}

#[test]
fn the_openai_sdk_uses_the_responses_api_and_continues_its_conversations() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.set_responder(answer);
    let (mut d, base) = daemon(&fake, "");
    let steps = run_clients(&base, "responses");

    let first = &steps["first"];
    assert_eq!(first["text"], "first question answer");
    assert_eq!(first["status"], "completed");
    assert_eq!(first["instructions"], "Answer in English.");
    // Input counts cache reads and writes; the cached part is the reads.
    assert_eq!(first["usage"]["input_tokens"], 130);
    assert_eq!(first["usage"]["input_tokens_details"]["cached_tokens"], 100);
    assert_eq!(first["usage"]["output_tokens"], 4);
    assert_eq!(first["usage"]["total_tokens"], 134);

    // previous_response_id of a one-off conversation: its messages are the new one's history.
    let second = &steps["second"];
    assert_eq!(second["text"], "second question answer");
    assert_eq!(second["previous"], first["id"]);
    assert_ne!(second["id"], first["id"]);
    let sent = requests_for(&fake, "second question")[0]["messages"].to_string();
    assert!(
        sent.contains("responses first question") && sent.contains("first question answer"),
        "the first exchange reached the provider with the second: {sent}"
    );

    // Streamed: the documented sequence, the text as deltas, the image kept as an attachment
    // (the model of this config cannot see images).
    let stream = &steps["stream"];
    let events: Vec<&str> = stream["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(
        events.first().copied(),
        Some("response.created"),
        "{events:?}"
    );
    assert_eq!(events.last().copied(), Some("response.completed"));
    for kind in [
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ] {
        assert!(events.contains(&kind), "{kind} missing: {events:?}");
    }
    assert_eq!(stream["text"], "stream to me answer");
    assert_eq!(stream["final_text"], "stream to me answer");
    let streamed = &requests_for(&fake, "stream to me")[0];
    let text = last_user_text(streamed);
    assert!(
        text.contains("[attachment: ") && text.contains(".png]"),
        "the image was saved: {text}"
    );
    assert_eq!(steps["stream_continued"]["text"], "third question answer");
    let sent = requests_for(&fake, "third question")[0]["messages"].to_string();
    assert!(sent.contains("stream to me answer"), "{sent}");

    // A named session goes on in that session.
    let named = &steps["named"];
    assert_eq!(named["text"], "named second answer");
    let trail = d.trail("api:resp-user");
    let intakes = trail.iter().filter(|l| l["type"] == "intake").count();
    assert_eq!(intakes, 2, "both requests in api:resp-user: {trail:?}");

    // store: false answers, and ids agentd did not make, cannot be continued.
    assert_eq!(steps["unstored"]["store"], false);
    assert_eq!(steps["unstored"]["text"], "not stored answer");
    for step in ["unstored_continue", "unknown_continue", "foreign_continue"] {
        assert_eq!(steps[step]["error"], "NotFoundError", "{}", steps[step]);
        assert!(
            steps[step]["message"]
                .as_str()
                .unwrap()
                .contains("previous_response_id"),
            "{}",
            steps[step]
        );
    }
    assert_eq!(steps["background"]["status"], 400);

    // Client tools: the call comes back as a function_call item; its output, sent with
    // previous_response_id (a one-off conversation) or to the named session, goes on.
    let round = &steps["tool_round"];
    assert_eq!(round["status"], "completed");
    assert_eq!(round["calls"][0]["name"], "get_weather");
    assert_eq!(round["calls"][0]["call_id"], "call_tool");
    assert_eq!(round["calls"][0]["arguments"], "{\"city\":\"Paris\"}");
    assert!(
        round["text"].as_str().unwrap().contains("18 C and sunny"),
        "{round}"
    );
    let stream = &steps["tool_stream"];
    assert_eq!(stream["calls"][0], "call_stream");
    for kind in [
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
    ] {
        assert!(stream["events"].to_string().contains(kind), "{stream}");
    }
    assert!(
        stream["text"].as_str().unwrap().contains("rain"),
        "{stream}"
    );
    assert_eq!(
        steps["tool_unknown"]["status"], 400,
        "{}",
        steps["tool_unknown"]
    );
    assert!(d.sigterm().success());
}
