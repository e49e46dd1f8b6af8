//! Malformed tool calls from the provider (issue #12 finding 7, SPEC §16.9 "Provider answers"):
//! an id with `/` or a space, duplicate ids, a name with spaces, a string input. Each is
//! normalised before it is stored, so the next request passes the provider-spec validation on
//! both wires and the session keeps working, including when the history written by an
//! OpenAI-compatible model is replayed to an Anthropic fallback.

use serde_json::{Value, json};

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, daemon_with, fifo_write, provider_toml, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Wire, last_user_text};
use crate::support::provider_spec::{assert_valid, is_valid_token};

fn kind(wire: Wire) -> &'static str {
    match wire {
        Wire::Anthropic => "anthropic",
        Wire::OpenAi => "openai",
    }
}

/// Sends message `id` with `text` to session `key` and returns its outcome line.
fn send(d: &TestDaemon, key: &str, id: &str, text: &str) -> Value {
    fifo_write(
        d,
        &json!({"id": id, "type": "user", "text": text, "sender": key}).to_string(),
    );
    wait_outcome(d, key, id)
}

/// The tool results (id, content, is_error) of the last `tool_results` trail line of `key`.
fn last_results(d: &TestDaemon, key: &str) -> Vec<(String, String, bool)> {
    let trail = d.trail(key);
    let line = trail
        .iter()
        .rev()
        .find(|l| l["results"].is_array())
        .unwrap_or_else(|| panic!("no tool results in the trail: {trail:?}"));
    line["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["tool_call_id"].as_str().unwrap().to_string(),
                r["content"].as_str().unwrap().to_string(),
                r["is_error"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

/// The fake answers message 1 with `calls`, then text; message 2 must work, and every request
/// after the malformed answer must be valid. Returns the daemon (for more checks) and the
/// tool results recorded for `calls`.
fn run_case(
    wire: Wire,
    calls: Vec<(&str, &str, Value)>,
) -> (TestDaemon, Vec<(String, String, bool)>) {
    let fake = FakeLlm::spawn(wire);
    fake.push(Reply::tool_calls(calls));
    fake.push(Reply::text("first done"));
    fake.push(Reply::text("second done"));
    let d = daemon_with(&fake, kind(wire));
    let first = send(&d, "mal", "m1", "do something");
    assert_eq!(first["type"], "message", "{first}");
    let results = last_results(&d, "mal");
    let second = send(&d, "mal", "m2", "and again");
    assert_eq!(second["type"], "message", "message 2 failed: {second}");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 3, "{reqs:?}");
    for r in &reqs[1..] {
        assert_valid(wire, r);
    }
    (d, results)
}

#[test]
fn an_id_with_a_slash_or_a_space_is_rewritten() {
    for wire in [Wire::Anthropic, Wire::OpenAi] {
        let (_d, results) = run_case(
            wire,
            vec![
                ("toolu/../1", "session_status", json!({})),
                ("call 2", "session_status", json!({})),
            ],
        );
        assert_eq!(results.len(), 2);
        for (id, content, is_error) in &results {
            assert!(is_valid_token(id), "{id:?}");
            // The calls themselves were fine: they ran.
            assert!(!is_error, "{content}");
        }
    }
}

#[test]
fn duplicate_ids_become_unique() {
    for wire in [Wire::Anthropic, Wire::OpenAi] {
        let (_d, results) = run_case(
            wire,
            vec![
                ("dup", "session_status", json!({})),
                ("dup", "session_status", json!({})),
                ("dup", "session_status", json!({})),
            ],
        );
        let ids: std::collections::HashSet<_> = results.iter().map(|r| r.0.clone()).collect();
        assert_eq!(ids.len(), 3, "{results:?}");
        assert!(
            ids.contains("dup"),
            "the first use keeps its id: {results:?}"
        );
    }
}

#[test]
fn a_name_with_spaces_becomes_an_error_result() {
    for wire in [Wire::Anthropic, Wire::OpenAi] {
        let (_d, results) = run_case(wire, vec![("t1", "session status", json!({}))]);
        assert_eq!(results.len(), 1);
        let (_, content, is_error) = &results[0];
        assert!(is_error, "{content}");
        assert!(content.contains("session status"), "{content}");
        assert!(content.contains("not run"), "{content}");
    }
}

#[test]
fn a_string_input_becomes_an_error_result() {
    for wire in [Wire::Anthropic, Wire::OpenAi] {
        let (_d, results) = run_case(
            wire,
            vec![
                ("t1", "session_status", json!("just a string")),
                ("t2", "session_status", json!([1, 2])),
            ],
        );
        assert_eq!(results.len(), 2);
        for (_, content, is_error) in &results {
            assert!(is_error, "{content}");
            assert!(content.contains("JSON object"), "{content}");
        }
    }
}

/// An id that a later answer uses again (within the session, not the response) is rewritten
/// too: the history would otherwise hold two calls with one id.
#[test]
fn an_id_repeated_in_a_later_answer_is_rewritten() {
    for wire in [Wire::Anthropic, Wire::OpenAi] {
        let fake = FakeLlm::spawn(wire);
        fake.push(Reply::tool_calls(vec![(
            "same",
            "session_status",
            json!({}),
        )]));
        fake.push(Reply::text("first done"));
        fake.push(Reply::tool_calls(vec![(
            "same",
            "session_status",
            json!({}),
        )]));
        fake.push(Reply::text("second done"));
        fake.push(Reply::text("third done"));
        let d = daemon_with(&fake, kind(wire));
        assert_eq!(send(&d, "rep", "r1", "one")["type"], "message");
        assert_eq!(send(&d, "rep", "r2", "two")["type"], "message");
        assert_eq!(send(&d, "rep", "r3", "three")["type"], "message");
        let reqs = fake.requests();
        assert_eq!(reqs.len(), 5);
        for r in &reqs[1..] {
            assert_valid(wire, r);
        }
    }
}

/// The real mix: an OpenAI-compatible primary whose ids contain `.` and `:`, and an Anthropic
/// fallback that gets the history replayed.
#[test]
fn openai_ids_with_dots_and_colons_replay_to_an_anthropic_fallback() {
    let primary = FakeLlm::spawn(Wire::OpenAi);
    let backup = FakeLlm::spawn(Wire::Anthropic);
    primary.push(Reply::tool_calls(vec![(
        "chatcmpl.tool:0",
        "session_status",
        json!({}),
    )]));
    primary.push(Reply::text("first done"));
    // The primary is gone for good (401 falls back without retries).
    primary.set_responder(|_| Some(Reply::error(401, "key revoked")));
    backup.push(Reply::text("second done from the fallback"));
    let providers = format!(
        "{}fallback = [\"backup\"]\n",
        provider_toml("openai", &primary.base_url())
    );
    let backup_toml = provider_toml("anthropic", &backup.base_url())
        .replace("[models.primary]", "[models.backup]");
    let mut d = TestDaemon::new(
        &agentd_toml("fake\", \"fake2"),
        &[("fake", &providers), ("fake2", &backup_toml)],
    );
    d.start();
    assert_eq!(send(&d, "mix", "x1", "one")["type"], "message");
    let second = send(&d, "mix", "x2", "two");
    assert_eq!(second["type"], "message", "{second}");
    let reqs = backup.requests();
    assert_eq!(reqs.len(), 1);
    assert_valid(Wire::Anthropic, &reqs[0]);
    for r in &primary.requests()[1..] {
        assert_valid(Wire::OpenAi, r);
    }
}

/// A session poisoned before this fix (bad ids, a bad name, a string input and a duplicate
/// already in its trail) works again: its history is repaired when it is loaded, so the next
/// request is valid.
#[test]
fn a_session_poisoned_before_the_fix_works_again() {
    for wire in [Wire::Anthropic, Wire::OpenAi] {
        let fake = FakeLlm::spawn(wire);
        fake.push(Reply::text("working again"));
        let mut d = TestDaemon::new(
            &agentd_toml("fake"),
            &[("fake", &provider_toml(kind(wire), &fake.base_url()))],
        );
        let sessions = d.sessions_dir();
        std::fs::create_dir_all(&sessions).unwrap();
        let id = "0190aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee";
        std::fs::write(
            sessions.join("sessions.json"),
            format!(r#"{{"old": {{"session_id": "{id}", "created_at": 1795300000}}}}"#),
        )
        .unwrap();
        let lines = [
            format!(
                r#"{{"v":1,"seq":1,"ts":"2026-11-22T01:00:00.000+00:00","type":"session","session_id":"{id}","key":"old","model":"primary"}}"#
            ),
            r#"{"v":1,"seq":2,"ts":"2026-11-22T01:00:00.100+00:00","type":"intake","id":"o1","source":"user","from":"old","text":"go"}"#.to_string(),
            r#"{"v":1,"seq":3,"ts":"2026-11-22T01:00:00.200+00:00","type":"message","role":"user","content":[{"type":"text","text":"go"}],"reply_to":["o1"],"source":"user","from":"old"}"#.to_string(),
            r#"{"v":1,"seq":4,"ts":"2026-11-22T01:00:01.000+00:00","type":"message","role":"assistant","text":"","tool_calls":[{"id":"a/b c","name":"read file","arguments":"just a string"},{"id":"dup","name":"session_status","arguments":{}},{"id":"dup","name":"session_status","arguments":{}}],"model":"primary","turn":1,"sent_messages":1}"#.to_string(),
            r#"{"v":1,"seq":5,"ts":"2026-11-22T01:00:01.100+00:00","type":"tool_result","results":[{"tool_call_id":"a/b c","content":"unknown tool","is_error":true},{"tool_call_id":"dup","content":"one","is_error":false},{"tool_call_id":"dup","content":"two","is_error":false}]}"#.to_string(),
            r#"{"v":1,"seq":6,"ts":"2026-11-22T01:00:02.000+00:00","type":"message","role":"assistant","text":"done","final":true,"reply_to":["o1"],"model":"primary","turn":2,"sent_messages":3}"#.to_string(),
        ];
        std::fs::write(
            sessions.join(format!("{id}.2026-11-22.jsonl")),
            lines.join("\n") + "\n",
        )
        .unwrap();
        d.start();
        let fin = send(&d, "old", "o2", "again");
        assert_eq!(fin["text"], "working again", "{fin}");
        let reqs = fake.requests();
        assert_eq!(reqs.len(), 1);
        assert_valid(wire, &reqs[0]);
    }
}

/// One answer with 100 `exec` calls runs at most `[tools] max_parallel_calls` of them at once
/// (issue #12 finding 15): each command counts the commands running beside it (a directory
/// per running command, made before and removed after its work), and no count exceeds the cap.
#[test]
fn a_hundred_exec_calls_run_at_most_max_parallel_calls_at_once() {
    const CAP: usize = 4;
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let calls: Vec<(String, Value)> = (0..100)
        .map(|i| {
            (
                format!("e{i}"),
                json!({"command": format!(
                    "mkdir running/{i} && ls running | wc -l > counts/{i}; sleep 0.05; rmdir running/{i}"
                )}),
            )
        })
        .collect();
    fake.push(Reply::tool_calls(
        calls
            .iter()
            .map(|(id, args)| (id.as_str(), "exec", args.clone()))
            .collect(),
    ));
    fake.push(Reply::text("all ran"));
    // The test's state directory is under /tmp: keep exec to the workspace.
    let mut d = TestDaemon::new(
        &format!(
            "{}\n[tools]\nmax_parallel_calls = {CAP}\n\n[tools.filesystem]\nallowed_paths = [\"../workspace\"]\n",
            agentd_toml("fake")
        ),
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    std::fs::create_dir_all(d.workspace().join("running")).unwrap();
    std::fs::create_dir_all(d.workspace().join("counts")).unwrap();
    d.start();
    let fin = send(&d, "par", "p1", "run them all");
    assert_eq!(fin["text"], "all ran", "{fin}");
    let counts: Vec<usize> = (0..100)
        .map(|i| {
            let path = d.workspace().join(format!("counts/{i}"));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            text.trim().parse().unwrap()
        })
        .collect();
    let max = counts.iter().copied().max().unwrap();
    assert!(max <= CAP, "{max} commands ran at once: {counts:?}");
}

/// Item 11 of the third security round (SPEC §16.9): one tool call whose input is 1 MB (a
/// `memory_write` value, far over its schema) must not break the session. The provider here
/// refuses a request over 512 KB as a real one refuses a prompt over its context window: the
/// oversized input is stored cut to a stub and the call answered with an error, so the next
/// message's request stays small and works.
#[test]
fn a_1_mb_tool_input_does_not_break_the_session() {
    const LIMIT: usize = 512 * 1024;
    for wire in [Wire::Anthropic, Wire::OpenAi] {
        let fake = FakeLlm::spawn(wire);
        // 1 MB: under [behavior] max_reply_bytes (1 MiB), so the answer is accepted.
        let huge = "x".repeat(1_000_000);
        fake.push(Reply::tool_calls(vec![(
            "t1",
            "memory_write",
            json!({"entity": "Anna", "attribute": "notes", "value": huge}),
        )]));
        fake.set_responder(|req| {
            let size = req.to_string().len();
            if size > LIMIT {
                return Some(Reply::error(
                    400,
                    format!("prompt is too long: {size} bytes > {LIMIT} maximum"),
                ));
            }
            let last = last_user_text(req);
            Some(Reply::text(if last.contains("and again") {
                "second done"
            } else {
                "first done"
            }))
        });
        let d = daemon_with(&fake, kind(wire));
        let first = send(&d, "big", "b1", "remember this");
        eprintln!("{wire:?} message 1: {}", first["type"]);
        let results = last_results(&d, "big");
        assert_eq!(results.len(), 1, "{results:?}");
        assert!(
            results[0].2,
            "the call is answered with an error: {results:?}"
        );
        let second = send(&d, "big", "b2", "and again");
        let sizes: Vec<usize> = fake
            .requests()
            .iter()
            .map(|r| r.to_string().len())
            .collect();
        eprintln!("{wire:?} request sizes: {sizes:?}");
        assert_eq!(second["type"], "message", "message 2 failed: {second}");
        assert_eq!(second["text"], "second done");
        for r in &fake.requests()[1..] {
            assert_valid(wire, r);
        }
        let stored = serde_json::to_string(&d.trail("big")).unwrap();
        assert!(
            stored.len() < LIMIT,
            "the trail holds {} bytes",
            stored.len()
        );
    }
}
