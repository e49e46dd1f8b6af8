//! agentd as an A2A agent (SPEC §23, A2A 0.3.0), driven by the official A2A Python SDK
//! (`a2a-sdk`, installed by `scripts/install-test-peers.sh a2a`, run by `a2a_client.py`)
//! against a fake provider; the card and every answer are validated against the published
//! schema (`tests/fixtures/specs/a2a-0.3.0.schema.json`).

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::compat::{TOKEN, daemon};
use crate::support::daemon::TestDaemon;
use crate::support::fake_llm::{FakeLlm, Reply, Usage, Wire, last_user_text};

/// `a2a <what>` → `<what> answer (<n> user turns)`; `a2a hold cancel` waits for a permit of
/// `cancel` (never given), `a2a hold disconnect` for one of `disconnect`.
fn responder(
    cancel: Arc<Semaphore>,
    disconnect: Arc<Semaphore>,
) -> impl Fn(&Value) -> Option<Reply> {
    move |body: &Value| {
        let text = last_user_text(body);
        let what = text
            .rsplit("a2a ")
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        let turns = body["messages"]
            .as_array()
            .map_or(0, |m| m.iter().filter(|m| m["role"] == "user").count());
        let reply = Reply::Text {
            text: format!("{what} answer ({turns} user turns)"),
            usage: Usage::new(20, 5, 0, 0),
        };
        Some(match what.as_str() {
            "hold cancel" => reply.gated(&cancel),
            "hold disconnect" => reply.gated(&disconnect),
            _ => reply,
        })
    }
}

/// The published schema's definition `name`, compiled.
fn validator(name: &str) -> jsonschema::Validator {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/specs/a2a-0.3.0.schema.json");
    let mut schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    schema["$ref"] = json!(format!("#/definitions/{name}"));
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft7)
        .build(&schema)
        .unwrap_or_else(|e| panic!("schema {name}: {e}"))
}

fn assert_valid(name: &str, v: &Value) {
    let errors: Vec<String> = validator(name)
        .iter_errors(v)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{name} invalid: {errors:?}\n{v:#}");
}

/// Runs the client script; releases `disconnect` when the client has left its stream.
fn run_client(base: &str, disconnect: &Semaphore) -> BTreeMap<String, Value> {
    let py = crate::support::test_peers("a2a", "python3/pip with registry access").join("a2a/py");
    let mut child = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/a2a_client.py"))
        .env("PYTHONPATH", py)
        .env("AGENTD_BASE", base)
        .env("AGENTD_TOKEN", TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");
    let mut steps = BTreeMap::new();
    for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let step = v["step"].as_str().unwrap().to_string();
        if step == "disconnected" {
            disconnect.add_permits(1);
        }
        steps.insert(step, v);
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "a2a_client.py failed after {:?}:\n{}",
        steps.keys().collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
    steps
}

#[test]
fn the_official_a2a_client_talks_to_agentd() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let (cancel, disconnect) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    fake.set_responder(responder(cancel, disconnect.clone()));
    let (mut d, base) = daemon(&fake, "");
    let s = run_client(&base, &disconnect);
    check_card(&s, &base);
    check_conversation(&s, &fake, &d);
    check_cancel(&s);
    check_raw(&s, &fake);
    // A client that left its stream cancelled nothing: the message was answered.
    let after = &s["after_disconnect"]["body"]["result"];
    assert_eq!(after["status"]["state"], "completed");
    assert_eq!(
        after["artifacts"][0]["parts"][0]["text"],
        "hold disconnect answer (1 user turns)"
    );
    assert!(d.sigterm().success());
}

type Steps = BTreeMap<String, Value>;

fn check_card(s: &Steps, base: &str) {
    // The card: public without skills, full (by the token, and by the JSON-RPC method).
    let public = &s["card_public"]["card"];
    assert_eq!(public["protocolVersion"], "0.3.0");
    assert_eq!(public["url"], format!("{base}/a2a"));
    assert_eq!(public["skills"], json!([]));
    assert_eq!(public["supportsAuthenticatedExtendedCard"], true);
    assert_eq!(public["securitySchemes"]["bearer"]["scheme"], "bearer");
    // The workspace template's skill.
    assert_eq!(s["card_full"]["card"]["skills"][0]["id"], "example");
    assert_eq!(s["raw_card_full"]["body"]["skills"][0]["name"], "example");
    for step in ["raw_card_public", "raw_card_full"] {
        assert_valid("AgentCard", &s[step]["body"]);
    }
}

fn check_conversation(s: &Steps, fake: &FakeLlm, d: &TestDaemon) {
    // message/send, and a second message in the same context continuing the session.
    let first = &s["send"];
    assert_eq!(first["task"]["status"]["state"], "completed");
    assert_eq!(first["text"], "first answer (1 user turns)");
    assert_eq!(
        s["send_again"]["task"]["contextId"],
        first["task"]["contextId"]
    );
    assert_eq!(s["send_again"]["text"], "second answer (2 user turns)");
    let context = first["task"]["contextId"].as_str().unwrap();
    let second_request = fake
        .requests()
        .into_iter()
        .find(|r| last_user_text(r).contains("a2a second"))
        .unwrap();
    assert!(
        second_request.to_string().contains("first answer"),
        "{second_request}"
    );
    let trail = d.trail(&format!("a2a:{context}"));
    assert!(
        (trail.iter().map(Value::to_string))
            .any(|l| l.contains("\"a2a first\"") && l.contains("\"from\":\"a2a\"")),
        "{trail:?}"
    );

    // tasks/get, tasks/cancel of a done task, an unknown task.
    assert_eq!(s["get"]["task"]["id"], first["task"]["id"]);
    assert_eq!(s["get"]["text"], "first answer (1 user turns)");
    assert_eq!(s["cancel_done"]["code"], -32002);
    assert_eq!(s["get_unknown"]["code"], -32001);

    // message/stream: the task, working, the reply's pieces, the end.
    let kinds: Vec<&str> = s["stream"]["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(kinds.first(), Some(&"task"), "{kinds:?}");
    assert!(kinds.contains(&"artifact-update"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"status-update"), "{kinds:?}");
    assert_eq!(s["stream"]["task"]["status"]["state"], "completed");
    assert_eq!(s["stream"]["text"], "streamed answer (1 user turns)");
}

fn check_cancel(s: &Steps) {
    // tasks/cancel stops the work as /stop does.
    assert_eq!(s["submitted"]["task"]["status"]["state"], "submitted");
    assert_eq!(s["cancel"]["task"]["status"]["state"], "canceled");
    assert_eq!(s["cancel_queued"]["code"], -32002);
    let why = s["cancel_queued"]["message"].as_str().unwrap_or_default();
    assert!(why.contains("queued behind"), "{why}");
    assert_eq!(s["after_cancel"]["task"]["status"]["state"], "completed");
    assert!(
        s["after_cancel"]["text"]
            .as_str()
            .unwrap()
            .starts_with("after hold answer")
    );
}

fn check_raw(s: &Steps, fake: &FakeLlm) {
    // The endpoint's own JSON against the published schema, and the refusals.
    assert_valid("SendMessageResponse", &s["raw_send"]["body"]);
    assert_eq!(
        s["raw_get"]["body"]["result"]["history"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_valid("GetTaskResponse", &s["raw_get"]["body"]);
    // The message id is the idempotency key: a retry is answered from the same message
    // (recorded once), another message under the same id is refused.
    let retry = &s["raw_retry"]["body"]["result"];
    assert_eq!(retry["id"], s["raw_send"]["body"]["result"]["id"]);
    assert_eq!(
        retry["artifacts"],
        s["raw_send"]["body"]["result"]["artifacts"]
    );
    assert_eq!(s["raw_reused_id"]["body"]["error"]["code"], -32602);
    let raw_requests = fake
        .requests()
        .into_iter()
        .filter(|r| last_user_text(r).trim_end().ends_with("a2a raw"))
        .count();
    assert_eq!(raw_requests, 1, "the retry was not recorded again");
    // An image as a file part with inline bytes becomes the message's attachment (a model
    // without vision is given its path).
    assert_eq!(
        s["raw_picture"]["body"]["result"]["status"]["state"],
        "completed"
    );
    let picture = last_user_text(
        &fake
            .requests()
            .into_iter()
            .find(|r| last_user_text(r).contains("a2a picture"))
            .unwrap(),
    );
    let path = picture
        .split("[attachment: ")
        .nth(1)
        .and_then(|p| p.split(']').next())
        .unwrap();
    assert!(
        std::fs::read(path).unwrap().starts_with(b"\x89PNG"),
        "{path}"
    );
    assert_eq!(s["raw_cancel"]["body"]["error"]["code"], -32002);
    assert_valid("CancelTaskResponse", &s["raw_cancel"]["body"]);
    assert_eq!(s["raw_unknown_method"]["body"]["error"]["code"], -32601);
    assert_eq!(s["raw_data_part"]["body"]["error"]["code"], -32005);
    assert_eq!(s["raw_parse_error"]["body"]["error"]["code"], -32700);
    for step in ["raw_unknown_method", "raw_data_part", "raw_parse_error"] {
        assert_valid("JSONRPCErrorResponse", &s[step]["body"]);
    }
    let events = s["raw_stream"]["events"].as_array().unwrap();
    assert!(events.len() >= 4, "{events:?}");
    for e in events {
        assert_valid("SendStreamingMessageResponse", e);
    }
    assert_eq!(s["raw_bad_token"]["status"], 401);
    assert_eq!(s["bad_token"]["status"], 401);
}
