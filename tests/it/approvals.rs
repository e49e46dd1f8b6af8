//! Approvals (SPEC §18.1) against the real daemon: a gated `exec` waits for a yes given
//! through the HTTP API or `agent-send`; it never runs before the yes (a marker file the
//! command would create); a deny and a timeout give the model an error result; a `system`
//! message is denied at once; a kill -9 while an approval waits asks again after the restart.

use std::path::Path;

use serde_json::{Value, json};

use crate::http_daemon::reqwest;
use crate::support::daemon::TestDaemon;
use crate::support::e2e::{WAIT, agentd_toml, fifo_write, provider_toml, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};
use crate::support::{free_port, wait_until};

const TOKEN: &str = "approvals-token-1";

/// A daemon with `[approvals] extra` and the HTTP API on `port`.
fn daemon(fake: &FakeLlm, approvals: &str, port: u16) -> TestDaemon {
    let toml = format!(
        "{}\n[http]\nenabled = true\nport = {port}\n\n[approvals]\n{approvals}\n",
        agentd_toml("fake")
    );
    let mut d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    d.set_env("AGENTD_HTTP_TOKEN", TOKEN);
    d.start();
    d
}

/// A scripted `exec` that creates `marker` (absolute) when it runs.
fn exec_touch(id: &str, marker: &Path) -> Reply {
    Reply::tool_calls(vec![(
        id,
        "exec",
        json!({ "command": format!("touch {}", marker.display()) }),
    )])
}

fn list_http(base: &str) -> Vec<Value> {
    let c = reqwest::blocking_client();
    let r = c
        .get(format!("{base}/api/v1/approvals"))
        .bearer_auth(TOKEN)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().unwrap();
    v["approvals"].as_array().cloned().unwrap_or_default()
}

fn decide_http(base: &str, id: &str, decision: &str) -> (u16, Value) {
    let c = reqwest::blocking_client();
    let r = c
        .post(format!("{base}/api/v1/approvals/{id}"))
        .bearer_auth(TOKEN)
        .json(&json!({ "decision": decision }))
        .send()
        .unwrap();
    let status = r.status();
    (status, r.json().unwrap_or(Value::Null))
}

/// The one pending approval, once it shows.
fn one_pending_http(base: &str) -> Value {
    wait_until(WAIT, "a pending approval", || {
        let l = list_http(base);
        (l.len() == 1).then(|| l[0].clone())
    })
}

/// The tool result the model got for call `call_id` (from the requests the fake received).
fn tool_result(fake: &FakeLlm, call_id: &str) -> String {
    for req in fake.requests().iter().rev() {
        for m in req["messages"].as_array().into_iter().flatten() {
            for block in m["content"].as_array().into_iter().flatten() {
                if block["type"] == "tool_result" && block["tool_use_id"] == call_id {
                    return block["content"].to_string();
                }
            }
        }
    }
    panic!("no tool result for {call_id}");
}

fn trail_events<'a>(trail: &'a [Value], kind: &str) -> Vec<&'a Value> {
    trail.iter().filter(|l| l["type"] == kind).collect()
}

#[test]
fn http_approve_runs_once_then_409_and_404() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut d = daemon(&fake, "require = [\"exec\"]\n", port);
    let marker = d.workspace().join("ran-http");
    fake.push(exec_touch("c1", &marker));
    fake.push(Reply::text("done"));
    fifo_write(
        &d,
        r#"{"id":"h1","type":"user","text":"run it","sender":"sam"}"#,
    );
    let pending = one_pending_http(&base);
    assert_eq!(pending["tool"], "exec");
    assert_eq!(pending["key"], "sam");
    assert!(
        pending["summary"].as_str().unwrap().contains("touch"),
        "{pending}"
    );
    assert!(pending["expires_at"].is_string() && pending["created_at"].is_string());
    // monitor.json is written in the background (at most 25 ms after a change).
    wait_until(WAIT, "waiting_approval in monitor.json", || {
        std::fs::read_to_string(d.state_dir.join("monitor.json"))
            .ok()
            .filter(|m| m.contains("waiting_approval"))
    });
    assert!(!marker.exists(), "the command ran before the yes");
    let id = pending["id"].as_str().unwrap().to_string();

    let (status, body) = decide_http(&base, &id, "approve");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["id"], id.as_str());
    assert_eq!(body["decision"], "approve");
    wait_outcome(&d, "sam", "h1");
    assert!(marker.exists(), "approved, but the command did not run");
    assert!(tool_result(&fake, "c1").contains("exit code 0"));

    let (status, body) = decide_http(&base, &id, "deny");
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("already decided"),
        "{body}"
    );
    let (status, _) = decide_http(&base, "ap-zzzzzzzzzz", "approve");
    assert_eq!(status, 404);
    let (status, _) = decide_http(&base, &id, "maybe");
    assert_eq!(status, 400);

    let trail = d.trail("sam");
    let asked = trail_events(&trail, "approval");
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0]["id"], id.as_str());
    let decided = trail_events(&trail, "approval_decision");
    assert_eq!(decided.len(), 1);
    assert_eq!(decided[0]["decision"], "approve");
    assert_eq!(decided[0]["channel"], "http");
    let metrics = reqwest::blocking_client()
        .get(format!("{base}/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(metrics.contains("agentd_approvals_pending 0"), "{metrics}");
    assert!(d.sigterm().success());
}

#[test]
fn agent_send_deny_always_and_refusals() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let port = free_port();
    let mut d = daemon(&fake, "require = [\"exec\"]\n", port);
    let ws = d.workspace();
    let (denied, always1, always2) = (ws.join("denied"), ws.join("always1"), ws.join("always2"));

    // Deny: the model reads a denied result; the command never ran.
    fake.push(exec_touch("d1", &denied));
    fake.push(Reply::text("ok, not done"));
    fifo_write(
        &d,
        r#"{"id":"s1","type":"user","text":"run it","sender":"ann"}"#,
    );
    let id = wait_until(WAIT, "agent-send --approvals", || {
        let out = d.agent_send(&["--approvals", "--json"]);
        assert!(out.status.success(), "{out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["approvals"][0]["id"].as_str().map(str::to_string)
    });
    let text = d.agent_send(&["--approvals"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains(&id));
    let out = d.agent_send(&["--deny", &id, "--json"]);
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, json!({"id": id, "decision": "deny"}));
    wait_outcome(&d, "ann", "s1");
    assert!(!denied.exists(), "denied, but the command ran");
    let result = tool_result(&fake, "d1");
    assert!(result.contains("denied by the user"), "{result}");
    // 409 and 404 through agent-send: exit 1 with the reason.
    let again = d.agent_send(&["--approve", &id]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already decided"),
        "{again:?}"
    );
    let unknown = d.agent_send(&["--approve", "ap-zzzzzzzzzz"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("no approval"),
        "{unknown:?}"
    );

    // Always: this call runs, and the next exec of the session runs without asking.
    fake.push(exec_touch("a1", &always1));
    fake.push(Reply::text("first"));
    fifo_write(
        &d,
        r#"{"id":"s2","type":"user","text":"again","sender":"ann"}"#,
    );
    let id2 = wait_until(WAIT, "second approval", || {
        let out = d.agent_send(&["--approvals", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["approvals"][0]["id"].as_str().map(str::to_string)
    });
    assert!(!always1.exists());
    let out = d.agent_send(&["--approve", &id2, "--always"]);
    assert!(out.status.success(), "{out:?}");
    wait_outcome(&d, "ann", "s2");
    assert!(always1.exists());
    fake.push(exec_touch("a2", &always2));
    fake.push(Reply::text("second"));
    fifo_write(
        &d,
        r#"{"id":"s3","type":"user","text":"once more","sender":"ann"}"#,
    );
    wait_outcome(&d, "ann", "s3");
    assert!(
        always2.exists(),
        "always in this session, yet the call did not run"
    );
    let trail = d.trail("ann");
    assert_eq!(
        trail_events(&trail, "approval").len(),
        2,
        "the third call asked"
    );
    let decided = trail_events(&trail, "approval_decision");
    assert_eq!(decided[1]["decision"], "always");
    assert_eq!(decided[1]["channel"], "fifo");
    assert!(d.sigterm().success());
}

#[test]
fn system_messages_are_denied_at_once_and_a_timeout_denies() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let port = free_port();
    let mut d = daemon(
        &fake,
        "require = [\"exec\", \"session_status\"]\nsystem_allow = [\"session_*\"]\ntimeout_seconds = 1\n",
        port,
    );
    let ws = d.workspace();
    let (beat, late) = (ws.join("beat"), ws.join("late"));

    // A heartbeat calls a gated tool: denied at once, the message finishes; system_allow lets
    // the other gated tool through.
    fake.push(Reply::tool_calls(vec![
        (
            "b1",
            "exec",
            json!({ "command": format!("touch {}", beat.display()) }),
        ),
        ("b2", "session_status", json!({})),
    ]));
    fake.push(Reply::text("HEARTBEAT_OK"));
    fifo_write(&d, r#"{"id":"sys1","type":"system","text":"heartbeat"}"#);
    wait_outcome(&d, "system", "sys1");
    assert!(!beat.exists());
    let result = tool_result(&fake, "b1");
    assert!(result.contains("system message"), "{result}");
    assert!(!tool_result(&fake, "b2").contains("error"));
    let trail = d.trail("system");
    let decided = trail_events(&trail, "approval_decision");
    assert_eq!(decided.len(), 1);
    assert_eq!(decided[0]["decision"], "deny");
    assert_eq!(decided[0]["by"], "agentd");

    // Nobody answers: after timeout_seconds the call is denied.
    fake.push(exec_touch("t1", &late));
    fake.push(Reply::text("gave up"));
    fifo_write(
        &d,
        r#"{"id":"late1","type":"user","text":"run it","sender":"tim"}"#,
    );
    wait_outcome(&d, "tim", "late1");
    assert!(!late.exists());
    let result = tool_result(&fake, "t1");
    assert!(result.contains("approval timed out"), "{result}");
    let trail = d.trail("tim");
    assert_eq!(
        trail_events(&trail, "approval_decision")[0]["decision"],
        "timeout"
    );
    assert!(d.sigterm().success());
}

#[test]
fn kill9_while_an_approval_waits_asks_again_after_restart() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut d = daemon(&fake, "require = [\"exec\"]\n", port);
    let marker = d.workspace().join("counted");
    // Appends a line per run: the file says how often the command ran.
    fake.push(Reply::tool_calls(vec![(
        "k1",
        "exec",
        json!({ "command": format!("echo run >> {}", marker.display()) }),
    )]));
    fake.push(Reply::text("done after restart"));
    fifo_write(
        &d,
        r#"{"id":"k9","type":"user","text":"run it","sender":"kim"}"#,
    );
    let first = one_pending_http(&base);
    d.kill9();
    assert!(!marker.exists(), "nothing ran before the kill");
    d.start();
    let second = wait_until(WAIT, "the approval asked again", || {
        let l = list_http(&base);
        (l.len() == 1).then(|| l[0].clone())
    });
    assert_ne!(second["id"], first["id"], "a new approval");
    assert_eq!(second["tool"], "exec");
    assert!(!marker.exists(), "the restart ran the call without a yes");
    let (status, _) = decide_http(&base, first["id"].as_str().unwrap(), "approve");
    assert_eq!(status, 404, "the old approval is gone with the old process");
    let (status, _) = decide_http(&base, second["id"].as_str().unwrap(), "approve");
    assert_eq!(status, 200);
    wait_outcome(&d, "kim", "k9");
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        "run\n",
        "ran exactly once"
    );
    // The model was called once for the tool call and once after its result: the batch was
    // asked again, not answered with an error and re-requested.
    assert_eq!(fake.requests().len(), 2);
    assert!(tool_result(&fake, "k1").contains("exit code 0"));
    assert!(d.sigterm().success());
}

/// Send SIGHUP and wait until the monitor shows that reload's outcome.
fn sighup(d: &TestDaemon) -> Value {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let reload = || {
        let text = std::fs::read_to_string(d.state_dir.join("monitor.json")).ok()?;
        let v: Value = serde_json::from_str(&text).ok()?;
        Some(v["reload"].clone()).filter(|r| !r.is_null())
    };
    let before = reload().map(|r| r["at"].clone());
    kill(Pid::from_raw(d.pid().unwrap() as i32), Signal::SIGHUP).unwrap();
    wait_until(WAIT, "the reload's outcome", || {
        reload().filter(|r| Some(&r["at"]) != before.as_ref())
    })
}

#[test]
fn approvals_apply_live_on_sighup() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut d = daemon(&fake, "", port);
    let ws = d.workspace();
    let (before, after) = (ws.join("before"), ws.join("after"));
    fake.push(exec_touch("r1", &before));
    fake.push(Reply::text("ran"));
    fifo_write(
        &d,
        r#"{"id":"r1","type":"user","text":"run","sender":"rob"}"#,
    );
    wait_outcome(&d, "rob", "r1");
    assert!(
        before.exists(),
        "no approvals configured, yet the call waited"
    );

    let text = std::fs::read_to_string(&d.config_path).unwrap();
    std::fs::write(
        &d.config_path,
        text.replace("[approvals]\n", "[approvals]\nrequire = [\"exec\"]\n"),
    )
    .unwrap();
    let r = sighup(&d);
    assert_eq!(r["ok"], true, "{r}");
    assert!(
        r["applied"].to_string().contains("approvals.require"),
        "{r}"
    );
    fake.push(exec_touch("r2", &after));
    fake.push(Reply::text("asked"));
    fifo_write(
        &d,
        r#"{"id":"r2","type":"user","text":"run","sender":"rob"}"#,
    );
    let pending = one_pending_http(&base);
    assert!(!after.exists());
    let (status, _) = decide_http(&base, pending["id"].as_str().unwrap(), "deny");
    assert_eq!(status, 200);
    wait_outcome(&d, "rob", "r2");
    assert!(!after.exists());
    assert!(d.sigterm().success());
}

#[test]
fn over_usd_asks_once_per_message() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut d = daemon(&fake, "over_usd = 0.000001\n", port);
    fake.push(Reply::tool_calls(vec![("o1", "session_status", json!({}))]));
    fake.push(Reply::tool_calls(vec![("o2", "session_status", json!({}))]));
    fake.push(Reply::text("spent"));
    fifo_write(
        &d,
        r#"{"id":"o1","type":"user","text":"go","sender":"olga"}"#,
    );
    let pending = one_pending_http(&base);
    assert_eq!(pending["tool"], "session_status");
    let (status, _) = decide_http(&base, pending["id"].as_str().unwrap(), "approve");
    assert_eq!(status, 200);
    wait_outcome(&d, "olga", "o1");
    let trail = d.trail("olga");
    let asked = trail_events(&trail, "approval");
    assert_eq!(
        asked.len(),
        1,
        "the second batch of the message asked again"
    );
    assert_eq!(asked[0]["reason"], "over_usd");
    assert!(!tool_result(&fake, "o2").contains("denied"));
    assert!(d.sigterm().success());
}

/// SPEC §17 with §18: a request to the OpenAI-compatible endpoint whose tool call needs
/// approval waits like any other message (its HTTP request stays open), the approval is offered
/// through the approvals API, and the answer comes once it is given; the command did not run
/// before.
#[test]
fn a_compatible_endpoint_request_waits_for_its_approval() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut d = daemon(&fake, "require = [\"exec\"]\n", port);
    let marker = d.workspace().join("ran-compat");
    fake.push(exec_touch("c1", &marker));
    fake.push(Reply::text("ran it"));
    let url = format!("{base}/v1/chat/completions");
    let request = std::thread::spawn(move || {
        let client = reqwest::blocking_client();
        let r = client
            .post(url)
            .bearer_auth(TOKEN)
            .json(&json!({
                "model": "agentd",
                "user": "laptop",
                "messages": [{"role": "user", "content": "run it"}],
            }))
            .send()
            .unwrap();
        let status = r.status();
        (status, r.json::<Value>().unwrap_or(Value::Null))
    });
    let pending = one_pending_http(&base);
    assert_eq!(pending["tool"], "exec");
    assert!(!marker.exists(), "the command ran before the yes");
    assert!(
        !request.is_finished(),
        "the request answered before the approval"
    );
    let (status, body) = decide_http(&base, pending["id"].as_str().unwrap(), "approve");
    assert_eq!(status, 200, "{body}");
    let (status, body) = request.join().unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "ran it", "{body}");
    assert!(marker.exists(), "approved, but the command did not run");
    assert!(tool_result(&fake, "c1").contains("exit code 0"));
    assert!(d.sigterm().success());
}
