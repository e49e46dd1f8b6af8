//! End-to-end tests of the real `agentd` binary (issue: foundation). Each test lays out a
//! temporary config/state, points providers.d at a fake LLM on 127.0.0.1 that speaks the real
//! wire format (JSON + SSE), and talks to the daemon the way users do: the control FIFO and
//! `agent-send`.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{
    WAIT, agentd_toml, daemon_with, db_rows, fail_cost_inserts, fifo_write, is_outcome_of,
    provider_toml, wait_outcome,
};
use crate::support::fake_llm::{FakeLlm, Reply, Usage, Wire};
use crate::support::wait_until;

fn count(lines: &[Value], pred: impl Fn(&Value) -> bool) -> usize {
    lines.iter().filter(|l| pred(l)).count()
}

/// Must-show 2: `agent-send -m hello --from alice --wait 20` prints the model's reply; the
/// trail, the state snapshot, the costs row and monitor.json match SPEC §7–§9.
#[test]
fn agent_send_roundtrip_records_trail_costs_and_monitor() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    fake.push(Reply::Text {
        text: "Hello Alice!".into(),
        usage: Usage::new(1200, 30, 800, 0),
    });
    let d = daemon_with(&fake, "openai");

    let out = d.agent_send(&["-m", "hello", "--from", "alice", "--wait", "20"]);
    assert!(
        out.status.success(),
        "agent-send failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "Hello Alice!");

    // The request the provider saw.
    let req = &fake.requests()[0];
    assert_eq!(req["model"], "fake-model");
    assert_eq!(req["stream"], true);
    let msgs = req["messages"].as_array().unwrap();
    assert_eq!(msgs[0]["role"], "system");
    assert!(
        msgs[0]["content"]
            .as_str()
            .unwrap()
            .contains("--- SOUL.md ---")
    );
    let user = serde_json::to_string(&msgs[1]["content"]).unwrap();
    assert!(user.contains("<agentd-context>") && user.contains("] hello"));

    // Trail (SPEC §7): session, intake, user message, final assistant message.
    let id = d.session_id("alice").expect("session in index");
    let trail = d.trail("alice");
    let types: Vec<&str> = trail.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        ["session", "intake", "message", "message"],
        "{trail:#?}"
    );
    for (i, l) in trail.iter().enumerate() {
        assert_eq!(l["seq"], i as u64 + 1);
        assert!(chrono::DateTime::parse_from_rfc3339(l["ts"].as_str().unwrap()).is_ok());
    }
    let fin = &trail[3];
    assert_eq!(fin["role"], "assistant");
    assert_eq!(fin["text"], "Hello Alice!");
    assert_eq!(fin["final"], true);
    assert_eq!(fin["reply_to"], serde_json::json!([trail[1]["id"]]));
    assert_eq!(fin["usage"]["input_tokens"], 1200);
    assert_eq!(fin["usage"]["cache_read_tokens"], 800);

    // The session's state (SPEC §7): the snapshot is a cache written on a cadence, so what
    // counts is the fold the report shows, snapshot or not.
    let out = d.agent_send(&["--sessions", "--json"]);
    assert!(out.status.success());
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let state = &report["sessions"][0];
    assert_eq!(state["key"], "alice");
    assert_eq!(state["session_id"], id.as_str());
    assert_eq!(state["message_count"], 2);
    assert_eq!(state["context_tokens"], 2030);

    // Costs (SPEC §8): OpenAI prompt 2000 incl. 800 cached → input 1200, cache_read 800.
    let rows = db_rows(&d.state_dir);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (model, call_type, i, o, cr, cw, cost, provider) = rows[0].clone();
    assert_eq!(
        (model.as_str(), call_type.as_str(), provider.as_str()),
        ("fake-model", "chat", "fake")
    );
    assert_eq!((i, o, cr, cw), (1200, 30, 800, 0));
    let want = (1200.0 * 3.0 + 30.0 * 15.0 + 800.0 * 0.3) / 1e6;
    assert!((cost - want).abs() < 1e-12, "cost {cost} != {want}");

    // Monitor (SPEC §9): idle, describing the finished message (written by its own thread).
    let mon: Value = wait_until(Duration::from_secs(30), "an idle monitor", || {
        let bytes = std::fs::read(d.state_dir.join("monitor.json")).ok()?;
        serde_json::from_slice::<Value>(&bytes)
            .ok()
            .filter(|m| m["state"] == "idle" && m["session_id"] == id.as_str())
    });
    assert_eq!(mon["state"], "idle");
    assert_eq!(mon["session_id"], id.as_str());
    assert_eq!(mon["queue_depth"], 0);
    assert_eq!(mon["turns"][0]["input_tokens"], 1200);
    assert_eq!(mon["turns"][0]["stop_reason"], "end_turn");
    assert!(mon["active"].as_array().unwrap().is_empty());

    // Queries work, also with --json.
    let cost_out = d.agent_send(&["--cost", "all", "--json"]);
    assert!(cost_out.status.success());
    let v: Value = serde_json::from_slice(&cost_out.stdout).unwrap();
    assert!((v["total_cost"].as_f64().unwrap() - want).abs() < 1e-12);
}

/// Must-show 1: with no key the daemon starts, and a message gets an answer naming the missing
/// variable.
#[test]
fn missing_key_answer_names_the_variable() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shipped = std::fs::read_to_string(repo.join("config/agentd.toml")).unwrap();
    let anthropic = std::fs::read_to_string(repo.join("providers.d/anthropic.toml")).unwrap();
    let mut d = TestDaemon::new(&shipped, &[("anthropic", &anthropic)]);
    d.start();
    let out = d.agent_send(&["-m", "hello", "--from", "alice", "--wait", "20"]);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("AGENTD_ANTHROPIC_KEY"), "{all}\n{}", d.log());
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failed message exits 1: {all}"
    );
    assert!(d.is_running());
}

fn blocks_of(req: &Value) -> Vec<Value> {
    let strip = |b: &Value| {
        let mut b = b.clone();
        if let Some(o) = b.as_object_mut() {
            o.remove("cache_control");
        }
        b
    };
    let mut out = Vec::new();
    for t in req["tools"].as_array().into_iter().flatten() {
        out.push(serde_json::json!({"tool": strip(t)}));
    }
    for s in req["system"].as_array().into_iter().flatten() {
        out.push(serde_json::json!({"system": strip(s)}));
    }
    for m in req["messages"].as_array().unwrap() {
        for b in m["content"].as_array().unwrap() {
            out.push(serde_json::json!({"role": m["role"], "block": strip(b)}));
        }
    }
    out
}

/// Positions (in `blocks_of` order) of the blocks that carry `cache_control`.
fn marker_positions(req: &Value) -> Vec<usize> {
    let mut pos = Vec::new();
    let mut i = 0;
    let mut visit = |b: &Value| {
        if b.get("cache_control").is_some() {
            pos.push(i);
        }
        i += 1;
    };
    for t in req["tools"].as_array().into_iter().flatten() {
        visit(t);
    }
    for s in req["system"].as_array().into_iter().flatten() {
        visit(s);
    }
    for m in req["messages"].as_array().unwrap() {
        for b in m["content"].as_array().unwrap() {
            visit(b);
        }
    }
    pos
}

/// Must-show 3: ten consecutive requests of one session, with parallel tool calls in between:
/// each request's block list (tools, system, messages; markers stripped) starts with the
/// previous request's list, and the four breakpoints sit where SPEC §6 says.
#[test]
fn anthropic_requests_are_append_only_with_four_breakpoints() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let u = |i, o, cr, cw| Usage::new(i, o, cr, cw);
    let script: Vec<Vec<Reply>> = vec![
        vec![
            Reply::ToolCalls {
                text: Some("Let me look.".into()),
                calls: vec![
                    (
                        "t1".into(),
                        "read".into(),
                        serde_json::json!({"path": "SOUL.md"}),
                    ),
                    ("t2".into(), "session_status".into(), serde_json::json!({})),
                ],
                usage: u(2000, 40, 0, 1800),
            },
            Reply::Text {
                text: "first".into(),
                usage: u(300, 10, 1800, 250),
            },
        ],
        vec![
            Reply::ToolCalls {
                text: None,
                calls: vec![
                    (
                        "t3".into(),
                        "read".into(),
                        serde_json::json!({"path": "AGENTS.md"}),
                    ),
                    (
                        "t4".into(),
                        "read".into(),
                        serde_json::json!({"path": "USER.md", "limit": 2}),
                    ),
                    ("t5".into(), "session_status".into(), serde_json::json!({})),
                ],
                usage: u(100, 40, 2050, 60),
            },
            Reply::ToolCalls {
                text: None,
                calls: vec![(
                    "t6".into(),
                    "read".into(),
                    serde_json::json!({"path": "nope/../../etc/passwd"}),
                )],
                usage: u(100, 20, 2110, 500),
            },
            Reply::Text {
                text: "second".into(),
                usage: u(50, 10, 2610, 80),
            },
        ],
        vec![Reply::Text {
            text: "third".into(),
            usage: u(60, 10, 2690, 70),
        }],
        vec![
            Reply::ToolCalls {
                text: None,
                calls: vec![
                    (
                        "t7".into(),
                        "read".into(),
                        serde_json::json!({"path": "IDENTITY.md"}),
                    ),
                    (
                        "t8".into(),
                        "read".into(),
                        serde_json::json!({"path": "TOOLS.md"}),
                    ),
                ],
                usage: u(60, 30, 2760, 90),
            },
            Reply::Text {
                text: "fourth".into(),
                usage: u(40, 10, 2850, 300),
            },
        ],
        vec![
            Reply::ToolCalls {
                text: Some("checking".into()),
                calls: vec![("t9".into(), "session_status".into(), serde_json::json!({}))],
                usage: u(60, 30, 3150, 70),
            },
            Reply::Text {
                text: "fifth".into(),
                usage: u(40, 10, 3220, 60),
            },
        ],
    ];
    let mut expected_requests = 0;
    for msg in &script {
        for r in msg {
            fake.push(r.clone());
            expected_requests += 1;
        }
    }
    assert_eq!(expected_requests, 10);
    let d = daemon_with(&fake, "anthropic");
    for (n, _) in script.iter().enumerate() {
        let id = format!("m{n}");
        fifo_write(
            &d,
            &format!(r#"{{"id":"{id}","type":"user","text":"message {n}","sender":"carol"}}"#),
        );
        let done = wait_outcome(&d, "carol", &id);
        assert_eq!(done["type"], "message", "{done}\n{}", d.log());
    }
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 10);

    let lists: Vec<Vec<Value>> = reqs.iter().map(blocks_of).collect();
    for i in 1..lists.len() {
        let (prev, cur) = (&lists[i - 1], &lists[i]);
        assert!(cur.len() > prev.len(), "request {i} did not grow");
        assert_eq!(
            &cur[..prev.len()],
            &prev[..],
            "request {i} is not an append-only extension of request {}",
            i - 1
        );
    }

    let n_tools = reqs[0]["tools"].as_array().unwrap().len();
    let names: Vec<&str> = reqs[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"read") && names.contains(&"session_status"),
        "{names:?}"
    );
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "tools in a stable (sorted) order");
    for (i, req) in reqs.iter().enumerate() {
        let sys = req["system"].as_array().unwrap();
        assert_eq!(sys.len(), 2, "stable + semi_stable blocks");
        let stable_end = n_tools; // index of the stable block
        let semi_end = n_tools + 1;
        let last = lists[i].len() - 1;
        let mut want = vec![stable_end, semi_end];
        if i > 0 {
            let prev_last = lists[i - 1].len() - 1;
            if prev_last != last {
                want.push(prev_last);
            }
        }
        want.push(last);
        assert_eq!(marker_positions(req), want, "breakpoints of request {i}");
        assert!(marker_positions(req).len() <= 4);
        // No tool definition carries a marker: the stable block's marker covers them.
        for t in req["tools"].as_array().unwrap() {
            assert!(t.get("cache_control").is_none());
        }
    }

    // Snapshot of the first request's wire shape (what Anthropic sees).
    let first = &reqs[0];
    assert_eq!(first["model"], "fake-model");
    assert_eq!(first["stream"], true);
    assert_eq!(first["max_tokens"], 1024);
    assert_eq!(first["tool_choice"], serde_json::json!({"type": "auto"}));
    assert_eq!(
        first["system"][0]["cache_control"],
        serde_json::json!({"type": "ephemeral"})
    );
    assert!(
        first["system"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("--- SOUL.md ---")
    );
    assert!(
        first["system"][1]["text"]
            .as_str()
            .unwrap()
            .starts_with("--- MEMORY.md ---")
    );
    let content = &first["messages"][0]["content"];
    assert!(
        content[0]["text"]
            .as_str()
            .unwrap()
            .starts_with("<agentd-context>")
    );
    assert!(
        content[1]["text"]
            .as_str()
            .unwrap()
            .ends_with("] message 0")
    );
    assert_eq!(
        content[1]["cache_control"],
        serde_json::json!({"type": "ephemeral"})
    );
    // Parallel results come back in the order the model issued the calls.
    let second = &reqs[1]["messages"];
    let results = second[2]["content"].as_array().unwrap();
    assert_eq!(results[0]["tool_use_id"], "t1");
    assert_eq!(results[1]["tool_use_id"], "t2");
    assert!(results[0]["content"].as_str().unwrap().contains("Soul"));
    // The escape attempt became an error result, not a file read.
    let fourth = serde_json::to_string(&reqs[4]["messages"]).unwrap();
    assert!(fourth.contains("\"is_error\":true"));
    assert!(!fourth.contains("root:x:0:0"));
}

/// Must-show 4: SIGKILL after the FIFO message was accepted and while the model call is in
/// flight; after restart the message is answered exactly once and every file parses.
#[test]
fn kill9_during_model_call_answers_once_after_restart() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    fake.push(Reply::Hang);
    fake.push(Reply::Text {
        text: "answered after restart".into(),
        usage: Usage::new(10, 5, 0, 0),
    });
    let mut d = daemon_with(&fake, "openai");
    let out = d.agent_send(&["-m", "survive this", "--from", "dave"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(WAIT, "the model call", || {
        (fake.requests().len() == 1).then_some(())
    });
    d.kill9();

    d.start();
    let intake_id = d
        .trail("dave")
        .into_iter()
        .find(|l| l["type"] == "intake")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let fin = wait_outcome(&d, "dave", &intake_id);
    assert_eq!(fin["text"], "answered after restart");
    // Give a duplicate a chance to appear, then check exactly-once.
    let out = d.agent_send(&["-m", "and now?", "--from", "dave", "--wait", "20"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trail = d.trail("dave");
    assert_eq!(
        count(&trail, |l| l["type"] == "intake"
            && l["id"] == intake_id.as_str()),
        1
    );
    assert_eq!(
        count(&trail, |l| l["role"] == "user"
            && l["reply_to"][0] == intake_id.as_str()),
        1,
        "the user turn is not appended twice"
    );
    assert_eq!(
        count(&trail, |l| is_outcome_of(l, &intake_id)),
        1,
        "{trail:#?}"
    );
    assert_eq!(
        fake.requests().len(),
        3,
        "hung call, resumed call, second message"
    );
    // Every state file parses.
    for e in std::fs::read_dir(d.sessions_dir()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            serde_json::from_slice::<Value>(&std::fs::read(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        }
    }
}

/// Must-show 6: malformed FIFO lines (invalid JSON, unknown type, oversize) are logged and
/// skipped; the next valid line is processed.
#[test]
fn malformed_fifo_lines_are_skipped() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let mut d = daemon_with(&fake, "openai");
    fifo_write(&d, "this is not json");
    fifo_write(&d, r#"{"type":"launch_missiles","text":"x"}"#);
    fifo_write(
        &d,
        &format!(r#"{{"type":"user","text":"{}"}}"#, "y".repeat(4100)),
    );
    fifo_write(&d, &"z".repeat(9000));
    fifo_write(&d, r#"{"type":"user","text":"   "}"#);
    fifo_write(
        &d,
        r#"{"id":"good","type":"user","text":"still there?","sender":"erin"}"#,
    );
    let fin = wait_outcome(&d, "erin", "good");
    assert!(fin["text"].as_str().unwrap().starts_with("echo: "), "{fin}");
    let log = d.log();
    assert_eq!(
        log.matches("malformed FIFO line skipped").count(),
        3,
        "{log}"
    );
    assert_eq!(log.matches("over max_line_bytes").count(), 2, "{log}");
    assert!(d.is_running());
    assert_eq!(fake.requests().len(), 1);
}

/// Must-show 5: three mistakes → all three reported with key paths, exit 1.
#[test]
fn check_config_reports_every_mistake() {
    let d = TestDaemon::new(
        r#"
[agent]
nmae = "typo"
name = "x"
workspace = "../workspace"

[providers]
dir = "../providers.d"
load = ["fake"]

[behavior]
max_turns_per_message = "many"

[fifo]
max_line_bytes = -5
"#,
        &[("fake", &provider_toml("openai", "http://127.0.0.1:9/v1"))],
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["check-config", "-c"])
        .arg(&d.config_path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    for key in [
        "agent.nmae",
        "behavior.max_turns_per_message",
        "fifo.max_line_bytes",
    ] {
        assert!(err.contains(key), "missing {key} in:\n{err}");
    }

    // A good config prints the effective config, secrets redacted.
    let with_key = format!(
        "api_key_env = \"AGENTD_TEST_KEY\"\n{}",
        provider_toml("openai", "http://127.0.0.1:9/v1")
    );
    let good = TestDaemon::new(&agentd_toml("fake"), &[("fake", &with_key)]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["check-config", "-c"])
        .arg(&good.config_path)
        .env("AGENTD_TEST_KEY", "sk-very-secret-value")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("primary"), "{text}");
    assert!(!text.contains("sk-very-secret-value"), "{text}");
}

/// Single instance: a second daemon on the same state dir exits 1 with a clear message;
/// SIGTERM stops the first cleanly and removes the FIFO and PID file.
#[test]
fn single_instance_and_graceful_stop() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let mut d = daemon_with(&fake, "openai");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["run", "-c"])
        .arg(&d.config_path)
        .env("AGENTD_STATE_DIR", &d.state_dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already running"));
    let status = d.sigterm();
    assert!(status.success(), "{status:?}\n{}", d.log());
    assert!(!d.state_dir.join("control.pipe").exists());
    assert!(!d.state_dir.join("agentd.pid").exists());
}

/// The loop's limits (SPEC §6): with 3 turns, the model is told to wrap up when 2 remain and
/// the last call has tool use disabled (tools still defined) so a final answer is guaranteed.
#[test]
fn wrap_up_notice_and_tools_withheld_on_last_turn() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    for n in 0..3 {
        fake.push(Reply::tool_calls(vec![(
            &format!("c{n}"),
            "session_status",
            serde_json::json!({}),
        )]));
    }
    let mut d = TestDaemon::new(
        &agentd_toml("fake").replace("[behavior]", "[behavior]\nmax_turns_per_message = 3"),
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    d.start();
    fifo_write(
        &d,
        r#"{"id":"w1","type":"user","text":"loop forever","sender":"frank"}"#,
    );
    let fin = wait_outcome(&d, "frank", "w1");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 3, "{}", d.log());
    assert_eq!(reqs[0]["tool_choice"], serde_json::json!({"type": "auto"}));
    assert_eq!(reqs[1]["tool_choice"], serde_json::json!({"type": "auto"}));
    assert_eq!(reqs[2]["tool_choice"], serde_json::json!({"type": "none"}));
    assert_eq!(
        reqs[2]["tools"].as_array().unwrap().len(),
        reqs[0]["tools"].as_array().unwrap().len(),
        "tools stay defined"
    );
    let second = serde_json::to_string(&reqs[1]["messages"]).unwrap();
    assert!(second.contains("Only 2 model calls remain"), "{second}");
    // The model called a tool anyway on the last turn: the call is dropped, and an answer
    // with nothing else is empty, so the message fails (issue 38: an empty answer is a
    // failure, never an empty reply).
    assert_eq!(fin["type"], "failure", "{fin}");
    assert!(
        fin.to_string().contains("empty text on the last turn"),
        "{fin}"
    );
}

/// Dangling tool calls (a crash between call and result) are answered with error results
/// before the next call; the acknowledged message is then finished.
#[test]
fn dangling_tool_call_is_repaired_on_resume() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.push(Reply::text("recovered"));
    let mut d = TestDaemon::new(
        &agentd_toml("fake"),
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    // A trail as a crash leaves it: the model asked for a tool, no result was recorded.
    let sessions = d.sessions_dir();
    std::fs::create_dir_all(&sessions).unwrap();
    let id = "0190aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee";
    std::fs::write(
        sessions.join("sessions.json"),
        format!(r#"{{"gina": {{"session_id": "{id}", "created_at": 1795300000}}}}"#),
    )
    .unwrap();
    let lines = [
        format!(r#"{{"v":1,"seq":1,"ts":"2026-11-22T01:00:00.000+00:00","type":"session","session_id":"{id}","key":"gina","model":"primary"}}"#),
        r#"{"v":1,"seq":2,"ts":"2026-11-22T01:00:00.100+00:00","type":"intake","id":"g1","source":"user","from":"gina","text":"read it"}"#.to_string(),
        r#"{"v":1,"seq":3,"ts":"2026-11-22T01:00:00.200+00:00","type":"message","role":"user","content":[{"type":"text","text":"read it"}],"reply_to":["g1"],"source":"user","from":"gina"}"#.to_string(),
        r#"{"v":1,"seq":4,"ts":"2026-11-22T01:00:01.000+00:00","type":"message","role":"assistant","text":"","tool_calls":[{"id":"tc1","name":"read","arguments":{"path":"SOUL.md"}}],"model":"primary","turn":1,"sent_messages":1}"#.to_string(),
        r#"{"v":1,"seq":5,"ts":"2026-11-22T01:00:01.5"#.to_string(), // torn line
    ];
    std::fs::write(
        sessions.join(format!("{id}.2026-11-22.jsonl")),
        lines.join("\n"),
    )
    .unwrap();
    d.start();
    let fin = wait_outcome(&d, "gina", "g1");
    assert_eq!(fin["text"], "recovered");
    let req = &fake.requests()[0];
    let msgs = req["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3, "{req}");
    let result = &msgs[2]["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["tool_use_id"], "tc1");
    assert_eq!(result["is_error"], true);
    // The previous call (1 message) ended with the user turn: its last block carries the
    // breakpoint that lets this call read what that call wrote.
    assert!(
        msgs[0]["content"][0].get("cache_control").is_some(),
        "{req}"
    );
    assert!(
        msgs[1]["content"][0].get("cache_control").is_none(),
        "{req}"
    );
    let trail = d.trail("gina");
    assert_eq!(count(&trail, |l| l["type"] == "tool_result"), 1);
    assert_eq!(count(&trail, |l| l["role"] == "user"), 1);
}

/// Budgets are enforced before the call (SPEC §8): once today's spend reached the daily limit
/// the call is not made and the user is told which limit.
#[test]
fn daily_budget_blocks_the_next_call() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    fake.push(Reply::Text {
        text: "expensive".into(),
        usage: Usage::new(1_000_000, 0, 0, 0),
    });
    let mut d = TestDaemon::new(
        &format!("{}\n[budget]\ndaily_usd = 1.0\n", agentd_toml("fake")),
        &[("fake", &provider_toml("openai", &fake.base_url()))],
    );
    d.start();
    fifo_write(
        &d,
        r#"{"id":"b1","type":"user","text":"one","sender":"hank"}"#,
    );
    assert_eq!(wait_outcome(&d, "hank", "b1")["text"], "expensive");
    fifo_write(
        &d,
        r#"{"id":"b2","type":"user","text":"two","sender":"hank"}"#,
    );
    let refused = wait_outcome(&d, "hank", "b2");
    assert_eq!(refused["type"], "failure");
    assert!(
        refused["reply"].as_str().unwrap().contains("daily_usd"),
        "{refused}"
    );
    assert_eq!(fake.requests().len(), 1, "no call made over budget");
}

/// `agent-send --reset KEY` goes through the session's queue: the session's files move to
/// `.archive/` (nothing deleted) and its index entry goes; the next message starts a new
/// session.
#[test]
fn reset_archives_the_session() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let d = daemon_with(&fake, "openai");
    let out = d.agent_send(&["-m", "remember me", "--from", "ivy", "--wait", "20"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let old = d.session_id("ivy").unwrap();
    let out = d.agent_send(&["--reset", "ivy", "--wait", "20"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(d.session_id("ivy"), None);
    let archived =
        crate::support::daemon::read_trail_files(&d.sessions_dir().join(".archive"), &old);
    assert_eq!(archived.last().unwrap()["type"], "reset");
    // The trail is the record the archive keeps (a snapshot is a cache and may lag it).
    assert_eq!(count(&archived, |l| l["type"] == "message"), 2);
    let out = d.agent_send(&["-m", "who am I?", "--from", "ivy", "--wait", "20"]);
    assert!(out.status.success());
    assert_ne!(d.session_id("ivy").unwrap(), old);
}

/// `agentd doctor` prints a pass/fail table; a reachable fake provider passes, an unreachable
/// one fails the run (exit 1).
#[test]
fn doctor_prints_a_table() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let d = TestDaemon::new(
        &agentd_toml("fake"),
        &[("fake", &provider_toml("openai", &fake.base_url()))],
    );
    let run = |cfg: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
            .args(["doctor", "-c"])
            .arg(cfg)
            .env("AGENTD_STATE_DIR", &d.state_dir)
            .output()
            .unwrap()
    };
    let out = run(&d.config_path);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(table.contains("PASS  model primary"), "{table}");
    assert!(table.contains("disk space"), "{table}");
    // SPEC §16.8: the scratch directory and which /tmp exec gets.
    assert!(table.contains("PASS  scratch dir"), "{table}");
    assert!(table.contains("exec /tmp"), "{table}");

    // Port 9 on loopback: nothing listens there.
    let down = TestDaemon::new(
        &agentd_toml("fake"),
        &[("fake", &provider_toml("openai", "http://127.0.0.1:9/v1"))],
    );
    let out = run(&down.config_path);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    assert!(table.contains("FAIL  model primary"), "{table}");
}

/// `agentd chat`: stdin lines are messages of the `terminal` session, replies go to stdout,
/// end of input stops the daemon cleanly.
#[test]
fn chat_answers_on_stdout_and_stops_at_eof() {
    use std::process::Stdio;
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let d = TestDaemon::new(
        &agentd_toml("fake"),
        &[("fake", &provider_toml("openai", &fake.base_url()))],
    );
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["chat", "-c"])
        .arg(&d.config_path)
        .env("AGENTD_STATE_DIR", &d.state_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello from the terminal\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("echo: "), "{stdout}");
    assert!(stdout.contains("hello from the terminal"), "{stdout}");
    assert_eq!(d.trail("terminal")[1]["source"], "terminal");
}

/// A message that was stopped during its tool calls leaves calls without results; the next
/// message must answer them first, or the provider would reject every later request.
#[test]
fn next_message_repairs_calls_left_by_a_stopped_message() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.push(Reply::text("fresh start"));
    let mut d = TestDaemon::new(
        &agentd_toml("fake"),
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    let sessions = d.sessions_dir();
    std::fs::create_dir_all(&sessions).unwrap();
    let id = "0190aaaa-bbbb-7ccc-8ddd-ffffffffffff";
    std::fs::write(
        sessions.join("sessions.json"),
        format!(r#"{{"kim": {{"session_id": "{id}", "created_at": 1795300000}}}}"#),
    )
    .unwrap();
    let lines = [
        format!(r#"{{"v":1,"seq":1,"ts":"2026-11-22T01:00:00.000+00:00","type":"session","session_id":"{id}","key":"kim","model":"primary"}}"#),
        r#"{"v":1,"seq":2,"ts":"2026-11-22T01:00:00.100+00:00","type":"intake","id":"k1","source":"user","from":"kim","text":"run it"}"#.to_string(),
        r#"{"v":1,"seq":3,"ts":"2026-11-22T01:00:00.200+00:00","type":"message","role":"user","content":[{"type":"text","text":"run it"}],"reply_to":["k1"]}"#.to_string(),
        r#"{"v":1,"seq":4,"ts":"2026-11-22T01:00:01.000+00:00","type":"message","role":"assistant","text":"","tool_calls":[{"id":"tc9","name":"read","arguments":{"path":"SOUL.md"}}],"turn":1,"sent_messages":1}"#.to_string(),
        r#"{"v":1,"seq":5,"ts":"2026-11-22T01:00:02.000+00:00","type":"failure","reply_to":["k1"],"error":"stopped by the user","reply":"Stopped."}"#.to_string(),
    ];
    std::fs::write(
        sessions.join(format!("{id}.2026-11-22.jsonl")),
        lines.join("\n") + "\n",
    )
    .unwrap();
    d.start();
    fifo_write(
        &d,
        r#"{"id":"k2","type":"user","text":"next","sender":"kim"}"#,
    );
    let fin = wait_outcome(&d, "kim", "k2");
    assert_eq!(fin["text"], "fresh start");
    let msgs = fake.requests()[0]["messages"].clone();
    let m = msgs.as_array().unwrap();
    // user, assistant(tool_use), user(tool_result error + new turn merged)
    assert_eq!(m.len(), 3, "{msgs}");
    assert_eq!(m[2]["content"][0]["type"], "tool_result");
    assert_eq!(m[2]["content"][0]["tool_use_id"], "tc9");
    assert!(serde_json::to_string(&m[2]).unwrap().contains("] next"));
}

/// Intake is idempotent by id: the same control line written twice is processed once.
#[test]
fn duplicate_intake_ids_are_accepted_once() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let d = daemon_with(&fake, "openai");
    let line = r#"{"id":"same-id","type":"user","text":"only once","sender":"lee"}"#;
    fifo_write(&d, line);
    wait_outcome(&d, "lee", "same-id");
    fifo_write(&d, line);
    fifo_write(
        &d,
        r#"{"id":"other","type":"user","text":"marker","sender":"lee"}"#,
    );
    wait_outcome(&d, "lee", "other");
    let trail = d.trail("lee");
    assert_eq!(
        count(&trail, |l| l["type"] == "intake" && l["id"] == "same-id"),
        1
    );
    assert_eq!(fake.requests().len(), 2, "one call per distinct message");
    d.wait_log("duplicate intake id");
}

/// Skills (issue: tools): the index is in the semi_stable block, a trigger word puts the body
/// into that message's dynamic context, `load_skill` returns a body, SIGUSR1 rescans.
#[test]
fn skills_index_triggers_load_skill_and_rescan() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.push(Reply::tool_calls(vec![(
        "s1",
        "load_skill",
        serde_json::json!({"name": "example"}),
    )]));
    fake.push(Reply::text("done"));
    let mut d = TestDaemon::new(
        &agentd_toml("fake"),
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    d.start();
    fifo_write(
        &d,
        r#"{"id":"sk1","type":"user","text":"show me the example skill","sender":"sam"}"#,
    );
    wait_outcome(&d, "sam", "sk1");
    let reqs = fake.requests();
    let semi = reqs[0]["system"][1]["text"].as_str().unwrap();
    assert!(
        semi.contains("--- SKILLS ---") && semi.contains("- example: "),
        "{semi}"
    );
    let turn = reqs[0]["messages"][0]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(
        turn.contains("--- SKILL example ---"),
        "triggered body in the dynamic context: {turn}"
    );
    let result = &reqs[1]["messages"][2]["content"][0];
    assert_eq!(result["tool_use_id"], "s1");
    assert!(
        result["content"]
            .as_str()
            .unwrap()
            .contains("Example skill"),
        "{result}"
    );

    // A new skill appears after SIGUSR1.
    let dir = d.workspace().join("skills/weather");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("SKILL.md"),
        "---\nname: weather\ndescription: Check the weather\n---\nLook outside.",
    )
    .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid().unwrap() as i32),
        nix::sys::signal::Signal::SIGUSR1,
    )
    .unwrap();
    wait_until(WAIT, "rescan", || {
        d.log().contains("skills rescanned").then_some(())
    });
    fifo_write(
        &d,
        r#"{"id":"sk2","type":"user","text":"hi","sender":"sam"}"#,
    );
    wait_outcome(&d, "sam", "sk2");
    let semi = fake.requests()[2]["system"][1]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(semi.contains("- weather: Check the weather"), "{semi}");
}

/// A `[[schedule]]` entry with `every` fires a system event through the queue.
#[test]
fn schedule_entry_fires_a_system_event() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let mut d = TestDaemon::new(
        &format!(
            "{}\n[[schedule]]\nname = \"beat\"\nevery = \"1s\"\nsystem = \"Execute HEARTBEAT.md\"\n",
            agentd_toml("fake")
        ),
        &[("fake", &provider_toml("openai", &fake.base_url()))],
    );
    d.start();
    let intake = wait_until(WAIT, "heartbeat intake", || {
        d.trail("system")
            .into_iter()
            .find(|l| l["type"] == "intake" && l["text"] == "Execute HEARTBEAT.md")
    });
    assert!(intake["id"].as_str().unwrap().starts_with("schedule-beat-"));
    wait_outcome(&d, "system", intake["id"].as_str().unwrap());
}

/// A sub-agent that calls a denied tool gets an error result and the tool does not run; its
/// calls are recorded as `subagent` costs.
#[test]
fn subagent_denied_tool_is_refused_at_execution() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.push(Reply::tool_calls(vec![(
        "p1",
        "sessions_spawn",
        serde_json::json!({"prompt": "schedule a reminder"}),
    )]));
    fake.push(Reply::tool_calls(vec![(
        "x1",
        "schedule_message",
        serde_json::json!({"target": "Bob", "text": "sneaky", "delay_seconds": 60}),
    )]));
    fake.push(Reply::text("sub done"));
    fake.push(Reply::text("ok"));
    let d = daemon_with(&fake, "anthropic");
    fifo_write(
        &d,
        r#"{"id":"sa1","type":"user","text":"delegate","sender":"una"}"#,
    );
    let fin = wait_outcome(&d, "una", "sa1");
    assert_eq!(fin["text"], "ok");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 4);
    let sub_tools: Vec<&str> = reqs[1]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for denied in ["sessions_spawn", "schedule_message", "react"] {
        assert!(!sub_tools.contains(&denied), "{sub_tools:?}");
    }
    let refused = serde_json::to_string(&reqs[2]["messages"]).unwrap();
    assert!(refused.contains("not allowed for sub-agents"), "{refused}");
    assert!(
        serde_json::to_string(&reqs[3]["messages"])
            .unwrap()
            .contains("sub done")
    );
    // The tool did not run: nothing was scheduled.
    let conn = rusqlite::Connection::open(d.state_dir.join("agentd.db")).unwrap();
    let n: i64 = conn
        .query_row("SELECT COUNT(*) FROM scheduled", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 0);
    let sub_calls: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM costs WHERE call_type = 'subagent'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(sub_calls, 2);
}

/// A one-shot fake of the Brave Search API: answers every request with `body` and records the
/// request heads.
fn fake_brave(body: &'static str) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{Read, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://{}/res/v1/web/search",
        listener.local_addr().unwrap()
    );
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let rec = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            let mut buf = [0u8; 8192];
            let n = s.read(&mut buf).unwrap_or(0);
            rec.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf[..n]).into_owned());
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, seen)
}

/// `web_search` is offered when a Brave key is configured and sends the key and the query.
#[test]
fn web_search_uses_the_configured_endpoint_and_key() {
    let (url, seen) = fake_brave(
        r#"{"web":{"results":[{"title":"Agentd docs","url":"https://example.org/agentd","description":"How to run it"}]}}"#,
    );
    let fake = FakeLlm::spawn(Wire::OpenAi);
    fake.push(Reply::tool_calls(vec![(
        "w1",
        "web_search",
        serde_json::json!({"query": "agentd daemon", "count": 3}),
    )]));
    fake.push(Reply::text("found it"));
    let mut d = TestDaemon::new(
        &format!(
            "{}\n[tools]\nweb_search.base_url = \"{url}\"\n",
            agentd_toml("fake")
        ),
        &[("fake", &provider_toml("openai", &fake.base_url()))],
    );
    d.set_env("AGENTD_BRAVE_KEY", "brave-test-key");
    d.start();
    fifo_write(
        &d,
        r#"{"id":"ws1","type":"user","text":"search","sender":"vic"}"#,
    );
    assert_eq!(wait_outcome(&d, "vic", "ws1")["text"], "found it");
    let head = seen.lock().unwrap()[0].clone();
    assert!(
        head.starts_with("GET /res/v1/web/search?q=agentd+daemon&count=3"),
        "{head}"
    );
    assert!(
        head.to_lowercase()
            .contains("x-subscription-token: brave-test-key"),
        "{head}"
    );
    let result = serde_json::to_string(&fake.requests()[1]["messages"]).unwrap();
    assert!(
        result.contains("Agentd docs") && result.contains("untrusted-content"),
        "{result}"
    );
    assert!(!d.log().contains("brave-test-key"));
}

/// SPEC §16.4 "costs on a full disk", end to end: while the cost insert fails (a trigger on
/// `costs` raises the disk-full error, added from outside the daemon), the reply of the call
/// already made arrives, the next message makes no provider call and tells the user the disk
/// is the problem, and once inserts work again the kept row is written with the new one.
#[test]
fn costs_on_a_full_disk_are_kept_and_stop_further_calls() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("one"));
    llm.push(Reply::text("three"));
    let d = daemon_with(&llm, "openai");
    let set_full = |full: bool| fail_cost_inserts(&d.state_dir, full);
    set_full(true);
    fifo_write(
        &d,
        r#"{"id":"d1","type":"user","text":"first","sender":"ops"}"#,
    );
    let first = wait_outcome(&d, "ops", "d1");
    assert_eq!(first["text"], "one", "{first}");
    fifo_write(
        &d,
        r#"{"id":"d2","type":"user","text":"second","sender":"ops"}"#,
    );
    let second = wait_outcome(&d, "ops", "d2");
    assert_eq!(second["type"], "failure", "{second}");
    let reply = second["reply"].as_str().unwrap_or_default();
    assert!(
        reply.contains("could not be written") && reply.contains("check the disk"),
        "{second}"
    );
    assert_eq!(
        llm.requests().len(),
        1,
        "no provider call while a row is pending"
    );
    assert!(db_rows(&d.state_dir).is_empty());
    set_full(false);
    fifo_write(
        &d,
        r#"{"id":"d3","type":"user","text":"third","sender":"ops"}"#,
    );
    let third = wait_outcome(&d, "ops", "d3");
    assert_eq!(third["text"], "three", "{third}");
    assert_eq!(llm.requests().len(), 2);
    let rows = db_rows(&d.state_dir);
    assert_eq!(rows.len(), 2, "the kept row and the new one: {rows:?}");
    assert!(rows.iter().all(|r| r.1 == "chat"), "{rows:?}");
}

/// SPEC §10.1: an attachment list too long for one FIFO line is spilled to a file under
/// `inbox/` (`attachments_file`) instead of refused; the daemon reads every path back.
#[test]
fn agent_send_spills_a_long_attachment_list() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    fake.push(Reply::Text {
        text: "Got them all.".into(),
        usage: Usage::new(100, 5, 0, 0),
    });
    let d = daemon_with(&fake, "openai");
    let files: Vec<String> = (0..80)
        .map(|i| {
            let p = d
                .workspace()
                .join(format!("an-attachment-with-a-rather-long-name-{i:03}.txt"));
            std::fs::write(&p, format!("file {i}")).unwrap();
            p.display().to_string()
        })
        .collect();
    let mut args = vec!["-m", "see the files", "--from", "erin", "--wait", "20"];
    for f in &files {
        args.extend(["-a", f.as_str()]);
    }
    let out = d.agent_send(&args);
    assert!(
        out.status.success(),
        "agent-send failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "Got them all.");
    let trail = d.trail("erin");
    let intake = trail.iter().find(|l| l["type"] == "intake").unwrap();
    let got: Vec<&str> = intake["attachments"]
        .as_array()
        .expect("attachments recorded")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(got, files, "{intake}");
}
