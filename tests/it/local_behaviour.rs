//! What small local models do, answered by the daemon as a user expects (issue 38): tool calls
//! written as text become calls, an empty answer is asked again and then fails, silence is
//! offered only to system events (and recognised when wrapped), dependent calls of one answer
//! run in order, and schemas reach the provider in its dialect. Against the fake OpenAI wire,
//! with the shipped `providers.d/llamacpp.toml` settings.

use serde_json::{Value, json};

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, fifo_write, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};

/// The shipped llama.cpp provider file, pointed at `fake`.
fn llamacpp_provider(fake: &FakeLlm) -> String {
    let shipped = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("providers.d/llamacpp.toml"),
    )
    .expect("providers.d/llamacpp.toml");
    shipped.replace(
        "base_url = \"http://127.0.0.1:8080/v1\"",
        &format!("base_url = \"{}\"", fake.base_url()),
    )
}

fn local_daemon(fake: &FakeLlm, extra: &str) -> TestDaemon {
    let mut d = TestDaemon::new(
        &format!("{}{extra}", agentd_toml("local")),
        &[("local", &llamacpp_provider(fake))],
    );
    d.start();
    d
}

/// A tool call written as a bare JSON object, as `<tool_call>` tags and as fenced JSON: each
/// runs (the file is written), and the user gets the model's final words, never the JSON.
#[test]
fn tool_calls_written_as_text_run_as_calls() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let forms = [
        r#"{"name": "write", "arguments": {"path": "one.txt", "content": "1"}}"#.to_string(),
        "Saving.\n<tool_call>\n{\"name\": \"write\", \"arguments\": {\"path\": \"two.txt\", \"content\": \"2\"}}\n</tool_call>".to_string(),
        "```json\n{\"name\": \"write\", \"arguments\": {\"path\": \"three.txt\", \"content\": \"3\"}}\n```".to_string(),
    ];
    for f in &forms {
        fake.push(Reply::text(f));
        fake.push(Reply::text("Written."));
    }
    let d = local_daemon(&fake, "");
    for (i, name) in ["one", "two", "three"].iter().enumerate() {
        let id = format!("tc{i}");
        fifo_write(
            &d,
            &format!(r#"{{"id":"{id}","type":"user","text":"write {name}","sender":"max"}}"#),
        );
        let fin = wait_outcome(&d, "max", &id);
        assert_eq!(fin["text"], "Written.", "{fin}");
        let path = d.workspace().join(format!("{name}.txt"));
        assert_eq!(
            std::fs::read_to_string(&path).ok().as_deref(),
            Some(["1", "2", "3"][i]),
            "{} was written",
            path.display()
        );
    }
    // The calls are recorded as tool calls, with their results.
    let trail = d.trail("max");
    let calls: Vec<&Value> = trail
        .iter()
        .filter_map(|l| l["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(calls.len(), 3, "{trail:?}");
    assert!(calls.iter().all(|c| c["name"] == "write"));
}

/// An empty answer, then another: asked again once, then the failure path — the trail has a
/// failure, and `agent-send --wait` exits non-zero with the error message.
#[test]
fn an_empty_answer_twice_fails_the_message() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    fake.push(Reply::text(""));
    fake.push(Reply::text("   "));
    let d = local_daemon(&fake, "");
    let out = d.agent_send(&["-m", "hello", "--from", "eve", "--wait", "20"]);
    assert!(
        !out.status.success(),
        "agent-send --wait exits non-zero: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    let trail = d.trail("eve");
    assert!(
        trail.iter().any(|l| l["type"] == "failure"),
        "a failure is recorded: {trail:?}"
    );
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2, "asked again once");
    let last = reqs[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        last["content"]
            .to_string()
            .contains("Your last answer was empty"),
        "{last}"
    );
}

/// The silence rule is in the system prompt of a system event's call only, never in a user
/// turn; a JSON-wrapped silent token is silence.
#[test]
fn silence_is_offered_to_system_events_only() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    fake.push(Reply::text("<json>{\"name\": \"NO_REPLY\"}</json>"));
    fake.push(Reply::text("The capital of France is Paris."));
    let d = local_daemon(&fake, "");
    fifo_write(
        &d,
        r#"{"id":"sys1","type":"system","text":"Execute HEARTBEAT.md"}"#,
    );
    let fin = wait_outcome(&d, "system", "sys1");
    assert_eq!(fin["silent"], true, "{fin}");
    fifo_write(
        &d,
        r#"{"id":"q1","type":"user","text":"What is the capital of France?","sender":"max"}"#,
    );
    let fin = wait_outcome(&d, "max", "q1");
    assert_eq!(fin["text"], "The capital of France is Paris.");
    let reqs = fake.requests();
    let system_of = |r: &Value| r["messages"][0]["content"].to_string();
    assert!(
        system_of(&reqs[0]).contains("NO_REPLY"),
        "{}",
        system_of(&reqs[0])
    );
    assert!(
        !reqs[1].to_string().contains("NO_REPLY"),
        "no silence for a question"
    );
}

/// `write` then `read` of the same file in one answer: the read sees the write.
#[test]
fn a_write_then_read_in_one_answer_run_in_order() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    fake.push(Reply::tool_calls(vec![
        (
            "w1",
            "write",
            json!({"path": "notes.txt", "content": "milk, eggs"}),
        ),
        ("r1", "read", json!({"path": "notes.txt"})),
    ]));
    fake.push(Reply::text("Saved and checked."));
    let d = local_daemon(&fake, "");
    fifo_write(
        &d,
        r#"{"id":"wr1","type":"user","text":"note milk and eggs","sender":"max"}"#,
    );
    let fin = wait_outcome(&d, "max", "wr1");
    assert_eq!(fin["text"], "Saved and checked.");
    let results = fake.requests()[1].to_string();
    assert!(
        results.contains("milk, eggs"),
        "the read saw the write: {results}"
    );
}

/// The tool schemas reach the provider in the dialect of the shipped llama.cpp file: no
/// string bound of 2,000 or more, no keyword outside its list.
#[test]
fn schemas_reach_llamacpp_in_its_dialect() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    fake.push(Reply::text("hi"));
    let d = local_daemon(&fake, "");
    fifo_write(
        &d,
        r#"{"id":"s1","type":"user","text":"hi","sender":"max"}"#,
    );
    wait_outcome(&d, "max", "s1");
    let tools = fake.requests()[0]["tools"].clone();
    assert!(tools.as_array().is_some_and(|t| t.len() > 5), "{tools}");
    fn check(v: &Value) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    if ["maxLength", "minLength"].contains(&k.as_str()) {
                        assert!(v.as_u64().unwrap() < 2000, "{k}: {v}");
                    }
                    check(v);
                }
            }
            Value::Array(a) => a.iter().for_each(check),
            _ => {}
        }
    }
    check(&tools);
}
