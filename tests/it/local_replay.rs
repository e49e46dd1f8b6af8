//! Replays of a real small model's answers (issue 38): the event streams llama-server sent for
//! agentd's own requests, serving Qwen2.5-Coder-1.5B (tests/fixtures/local-model/README.md
//! says how each was recorded), played back byte for byte by the fake LLM to the daemon with
//! the shipped `providers.d/llamacpp.toml`. Each form the model wrote is handled as a user
//! expects: calls written as text run as calls, a write and a read of one file run in order,
//! wrapped silence markers are silence, a short answer is an answer.

use serde_json::{Value, json};

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, fifo_write, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};

fn local_daemon(fake: &FakeLlm) -> TestDaemon {
    let shipped = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("providers.d/llamacpp.toml"),
    )
    .expect("providers.d/llamacpp.toml");
    let provider = shipped.replace(
        "base_url = \"http://127.0.0.1:8080/v1\"",
        &format!("base_url = \"{}\"", fake.base_url()),
    );
    assert_ne!(
        provider, shipped,
        "the shipped base_url moved: update this test"
    );
    let mut d = TestDaemon::new(&agentd_toml("local"), &[("local", &provider)]);
    d.start();
    d
}

/// Sends `text` from `sender` through the FIFO and waits for its outcome.
fn ask(d: &TestDaemon, sender: &str, text: &str) -> Value {
    let id = format!("{sender}-1");
    let line = json!({"id": id, "type": "user", "text": text, "sender": sender});
    fifo_write(d, &line.to_string());
    wait_outcome(d, sender, &id)
}

/// The names of the tool calls in `sender`'s trail, in order.
fn called(d: &TestDaemon, sender: &str) -> Vec<String> {
    d.trail(sender)
        .iter()
        .filter_map(|l| l["tool_calls"].as_array())
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect()
}

/// Every form of call-as-text the model wrote: fenced JSON, a bare object, `<tools>` with one
/// and with three calls, `<{{…}}>` before prose. Each runs as calls; the user gets the final
/// words only.
#[test]
fn recorded_text_calls_run_as_calls() {
    let cases: [(&str, &[&str]); 5] = [
        ("text-call-fenced-json", &["write"]),
        ("text-call-bare-json", &["memory_search"]),
        ("text-call-tools-tags", &["exec"]),
        (
            "text-calls-tools-tags-three",
            &["memory_write", "memory_search", "write"],
        ),
        ("text-call-double-braces", &["list_scheduled"]),
    ];
    let fake = FakeLlm::spawn(Wire::OpenAi);
    for (fixture, _) in &cases {
        fake.push(Reply::recorded(fixture));
        fake.push(Reply::text("Done."));
    }
    let d = local_daemon(&fake);
    for (i, (fixture, names)) in cases.iter().enumerate() {
        let sender = format!("replay{i}");
        let fin = ask(&d, &sender, "do it");
        assert_eq!(fin["text"], "Done.", "{fixture}: {fin}");
        assert_eq!(called(&d, &sender), *names, "{fixture}");
    }
    assert_eq!(
        std::fs::read_to_string(d.workspace().join("notes.txt"))
            .ok()
            .as_deref(),
        Some("buy milk"),
        "the fenced write ran"
    );
    assert!(
        std::fs::read_to_string(d.workspace().join("todo.txt"))
            .is_ok_and(|t| t.contains("call mum")),
        "the third call of the <tools> block ran"
    );
}

/// `write` then `read` of fruit.txt, two JSON lines in one fence: the read sees the write.
#[test]
fn recorded_write_read_pair_runs_in_order() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    fake.push(Reply::recorded("write-read-pair"));
    fake.push(Reply::text("It says pear."));
    let d = local_daemon(&fake);
    let fin = ask(&d, "fruit", "save pear");
    assert_eq!(fin["text"], "It says pear.");
    assert_eq!(called(&d, "fruit"), ["write", "read"]);
    assert_eq!(
        std::fs::read_to_string(d.workspace().join("fruit.txt"))
            .ok()
            .as_deref(),
        Some("pear")
    );
    let results = fake.requests()[1]["messages"].to_string();
    assert!(
        results.contains("pear") && !results.contains("not found"),
        "the read found the written file: {results}"
    );
}

/// A `workspace/` prefix the model wrote: no nested folder; the error names the intended path
/// so the model can retry it.
#[test]
fn recorded_workspace_prefix_names_the_intended_path() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    fake.push(Reply::recorded("text-call-workspace-prefix"));
    fake.push(Reply::text("Could not write."));
    let d = local_daemon(&fake);
    ask(&d, "prefix", "write alpha");
    assert!(
        !d.workspace().join("workspace").exists(),
        "no nested folder"
    );
    let results = fake.requests()[1]["messages"].to_string();
    assert!(
        results.contains("'notes2.txt'") || results.contains("\\\"notes2.txt\\\""),
        "the error names notes2.txt: {results}"
    );
}

/// The silence markers as the model wrapped them (a fence, bare JSON, `HEARTBEAT_OK` as a
/// call, the context block echoed before the marker): never delivered.
#[test]
fn recorded_silence_markers_are_silent() {
    let fixtures = [
        "no-reply-fenced-json",
        "no-reply-bare-json",
        "heartbeat-ok-bare-json",
        "context-echo-no-reply",
    ];
    let fake = FakeLlm::spawn(Wire::OpenAi);
    for f in fixtures {
        fake.push(Reply::recorded(f));
    }
    let d = local_daemon(&fake);
    for (i, f) in fixtures.iter().enumerate() {
        let fin = ask(&d, &format!("quiet{i}"), "ok");
        assert_eq!(fin["silent"], true, "{f}: {fin}");
        assert!(called(&d, &format!("quiet{i}")).is_empty(), "{f}");
    }
}

/// The shortest answer the model gave after a tool result, `OK`, is an answer.
#[test]
fn recorded_short_answer_is_delivered() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    fake.push(Reply::tool_calls(vec![("s1", "session_status", json!({}))]));
    fake.push(Reply::recorded("after-tool-result-ok"));
    let d = local_daemon(&fake);
    let fin = ask(&d, "short", "ok");
    assert_eq!(fin["text"], "OK", "{fin}");
    assert_ne!(fin["silent"], true);
}
