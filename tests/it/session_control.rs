//! Per-session model and skills (SPEC §18.2) against the real daemon: `/model` on the fake Bot
//! API switches the next call's model, a kill -9 keeps the choice, `default` returns to
//! routing; the HTTP route and `agent-send` do the same and refuse unknown names with the
//! list; a skill turned off for one session is absent from that session's requests and
//! present in another's.

use std::time::Duration;

use serde_json::{Value, json};

use crate::http_daemon::reqwest::blocking_client;
use crate::support::daemon::TestDaemon;
use crate::support::e2e::agentd_toml;
use crate::support::fake_llm::{FakeLlm, Wire};
use crate::support::fake_telegram::FakeTelegram;
use crate::support::{free_port, wait_until};

const TOKEN: &str = "123456:TEST-secret-token";
const ALICE: i64 = 1001;
const WAIT: Duration = Duration::from_secs(40);

/// Two models on one fake server: `primary` (API model `fake-model`) and `cheap`
/// (`cheap-model`); a request's `model` field says which one was called.
fn two_models(base_url: &str) -> String {
    format!(
        r#"
type = "openai"
base_url = "{base_url}"

[models.primary]
model = "fake-model"
max_tokens = 1024

[models.cheap]
model = "cheap-model"
max_tokens = 1024
"#
    )
}

/// The API model of the `n`th request (0-based), once it arrived.
fn model_of(llm: &FakeLlm, n: usize) -> String {
    let reqs = wait_until(WAIT, &format!("request {}", n + 1), || {
        let r = llm.requests();
        (r.len() > n).then_some(r)
    });
    reqs[n]["model"].as_str().unwrap_or_default().to_string()
}

/// Alice's `n`th Telegram message (1-based) once it is there.
fn nth_answer(tg: &FakeTelegram, n: usize) -> String {
    wait_until(WAIT, &format!("answer {n} to Alice"), || {
        let s = tg.sent_to(ALICE);
        (s.len() >= n).then(|| s[n - 1].clone())
    })
}

/// The daemon of `e2e::telegram_daemon`, with both models loaded.
fn tg_daemon(llm: &FakeLlm, tg: &FakeTelegram, behavior: &str) -> TestDaemon {
    let toml = agentd_toml("fake").replace(
        "[behavior]",
        &format!(
            "[channel.telegram]\nenabled = true\napi_url = \"{}\"\nallow_from = [{ALICE}]\npoll_timeout_seconds = 1\ncontacts = {{ Alice = {ALICE} }}\n\n[behavior]\n{behavior}",
            tg.api_url()
        ),
    );
    let mut d = TestDaemon::new(&toml, &[("fake", &two_models(&llm.base_url()))]);
    write_skill(&d, "weather", "forecast", "WEATHER-BODY-7");
    d.set_env("AGENTD_TELEGRAM_TOKEN", TOKEN);
    d.start();
    d
}

#[test]
fn telegram_model_switches_the_next_call_survives_kill9_and_default_routes_again() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let tg = FakeTelegram::spawn(TOKEN);
    let mut d = tg_daemon(&llm, &tg, "");

    tg.push_text(ALICE, ALICE, "/model");
    let listing = nth_answer(&tg, 1);
    assert!(
        listing.contains("cheap") && listing.contains("primary") && listing.contains("default"),
        "{listing}"
    );
    tg.push_text(ALICE, ALICE, "/model gpt-9");
    let refused = nth_answer(&tg, 2);
    assert!(
        refused.contains("unknown model") && refused.contains("cheap, primary"),
        "{refused}"
    );
    // The listing carries one button per loaded model and `default`.
    let markup = tg
        .requests()
        .into_iter()
        .filter(|(m, _)| m == "sendmessage")
        .find_map(|(_, p)| {
            let text = serde_json::to_string(&p).unwrap();
            text.contains("inline_keyboard").then_some(text)
        })
        .expect("a message with inline buttons");
    for data in ["model:cheap", "model:primary", "model:default"] {
        assert!(markup.contains(data), "{data} in {markup}");
    }
    // A press by someone not in allow_from changes nothing; Alice's press pins `cheap`.
    press(&tg, 666, "model:primary");
    press(&tg, ALICE, "model:cheap");
    assert!(nth_answer(&tg, 3).contains("now uses cheap"));
    wait_until(WAIT, "the press answered", || {
        tg.requests()
            .iter()
            .any(|(m, p)| m == "answercallbackquery" && p.to_string().contains("now uses cheap"))
            .then_some(())
    });
    tg.push_text(ALICE, ALICE, "first");
    nth_answer(&tg, 4);
    assert_eq!(model_of(&llm, 0), "cheap-model");
    let trail = d.trail("Alice");
    let ev: Vec<&Value> = trail
        .iter()
        .filter(|l| l["type"] == "session_model")
        .collect();
    assert_eq!(ev.len(), 1, "the refused name is not recorded: {ev:?}");
    assert_eq!(ev[0]["model"], "cheap");
    assert_eq!(ev[0]["channel"], "telegram");

    // A kill -9 (no snapshot written at a stop): the trail's event keeps the choice.
    d.kill9();
    d.start();
    tg.push_text(ALICE, ALICE, "after the restart");
    nth_answer(&tg, 5);
    assert_eq!(model_of(&llm, 1), "cheap-model");

    tg.push_text(ALICE, ALICE, "/model default");
    assert!(nth_answer(&tg, 6).contains("routing"));
    tg.push_text(ALICE, ALICE, "back to routing");
    nth_answer(&tg, 7);
    assert_eq!(model_of(&llm, 2), "fake-model");
    assert!(sent(&llm.requests()[2]).contains("- weather:"));

    // `/skills` lists the skill with a button that turns it off; the press does.
    tg.push_text(ALICE, ALICE, "/skills");
    assert!(nth_answer(&tg, 8).contains("on  weather"));
    let buttons = tg
        .requests()
        .into_iter()
        .filter(|(m, p)| m == "sendmessage" && p.to_string().contains("skill:off:weather"))
        .count();
    assert_eq!(buttons, 1);
    press(&tg, ALICE, "skill:off:weather");
    assert!(nth_answer(&tg, 9).contains("off weather"));
    tg.push_text(ALICE, ALICE, "the forecast?");
    nth_answer(&tg, 10);
    let last = sent(&llm.requests()[3]);
    assert!(
        !last.contains("- weather:") && !last.contains("WEATHER-BODY-7"),
        "{last}"
    );
}

/// A press of the inline button with `data` under a message of the bot in the user's chat.
fn press(tg: &FakeTelegram, from: i64, data: &str) {
    let user = json!({"id": from, "is_bot": false, "first_name": "U"});
    tg.push_update(
        "callback_query",
        json!({
            "id": format!("q-{from}"),
            "from": user,
            "chat_instance": "ci",
            "data": data,
            "message": {
                "message_id": 1, "date": 1_700_000_000, "text": "Loaded models",
                "chat": {"id": from, "type": "private", "first_name": "U"},
            },
        }),
    );
}

fn write_skill(d: &TestDaemon, name: &str, trigger: &str, body: &str) {
    let dir = d.workspace().join("skills").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("SKILL.md"),
        format!(
            "---\nname: {name}\ndescription: the {name} skill\ntriggers: [{trigger}]\n---\n{body}\n"
        ),
    )
    .unwrap();
}

/// Everything a request sent the model, as one string.
fn sent(req: &Value) -> String {
    serde_json::to_string(req).unwrap()
}

#[test]
fn http_and_agent_send_pin_models_and_turn_skills_off_per_session() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let port = free_port();
    let mut d = TestDaemon::new(
        &format!(
            "{}\n[http]\nenabled = true\nport = {port}\n\n[agent.skills]\nalways_on = [\"tides\"]\n",
            agentd_toml("fake")
        ),
        &[("fake", &two_models(&llm.base_url()))],
    );
    write_skill(&d, "weather", "forecast", "WEATHER-BODY-7");
    write_skill(&d, "tides", "harbour", "TIDES-BODY-3");
    d.set_env("AGENTD_HTTP_TOKEN", "test-token-123");
    d.start();
    let base = format!("http://127.0.0.1:{port}");
    let client = blocking_client();
    let post = |path: &str, body: Value| {
        let r = client
            .post(format!("{base}{path}"))
            .bearer_auth("test-token-123")
            .json(&body)
            .send()
            .unwrap();
        (r.status(), r.json::<Value>().unwrap())
    };
    wait_until(WAIT, "HTTP up", || {
        client.get(format!("{base}/api/v1/status")).send().ok()
    });

    // HTTP: an unknown model is refused with the list; a known one is pinned.
    let (status, body) = post("/api/v1/sessions/alice/model", json!({"model": "gpt-9"}));
    assert_eq!(status, 400, "{body}");
    let err = body["error"].as_str().unwrap();
    assert!(err.contains("cheap, primary"), "{err}");
    let (status, body) = post("/api/v1/sessions/alice/model", json!({"model": "cheap"}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "cheap");
    // Skills: alice turns both off; bob keeps them.
    let (status, body) = post(
        "/api/v1/sessions/alice/skills",
        json!({"name": "nope", "enabled": false}),
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("tides, weather"),
        "{body}"
    );
    for name in ["weather", "tides"] {
        let (status, body) = post(
            "/api/v1/sessions/alice/skills",
            json!({"name": name, "enabled": false}),
        );
        assert_eq!(status, 200, "{body}");
    }

    let ok = d.agent_send(&[
        "-m",
        "the forecast at the harbour?",
        "--from",
        "alice",
        "--wait",
    ]);
    assert!(ok.status.success(), "{ok:?}");
    let ok = d.agent_send(&[
        "-m",
        "the forecast at the harbour?",
        "--from",
        "bob",
        "--wait",
    ]);
    assert!(ok.status.success(), "{ok:?}");
    let reqs = llm.requests();
    let (alice, bob) = (sent(&reqs[0]), sent(&reqs[1]));
    assert_eq!(reqs[0]["model"], "cheap-model");
    assert_eq!(reqs[1]["model"], "fake-model");
    for marker in ["WEATHER-BODY-7", "TIDES-BODY-3", "- weather:", "- tides:"] {
        assert!(
            !alice.contains(marker),
            "{marker} in alice's request: {alice}"
        );
        assert!(
            bob.contains(marker),
            "{marker} missing from bob's request: {bob}"
        );
    }

    // agent-send: an unknown model is a usage error naming the loaded ones; `default` and
    // `--skill NAME on` are recorded in the trail with the line's id.
    let bad = d.agent_send(&["--session", "alice", "--model", "gpt-9"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("cheap, primary"));
    let ok = d.agent_send(&["--session", "alice", "--model", "default"]);
    assert!(ok.status.success(), "{ok:?}");
    let ok = d.agent_send(&["--session", "alice", "--skill", "weather", "on"]);
    assert!(ok.status.success(), "{ok:?}");
    let ok = d.agent_send(&["-m", "another forecast", "--from", "alice", "--wait"]);
    assert!(ok.status.success(), "{ok:?}");
    let reqs = llm.requests();
    let again = sent(&reqs[2]);
    assert_eq!(reqs[2]["model"], "fake-model", "default returns to routing");
    assert!(again.contains("WEATHER-BODY-7") && !again.contains("TIDES-BODY-3"));
    let trail = d.trail("alice");
    let fifo: Vec<&Value> = trail
        .iter()
        .filter(|l| {
            l["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("session_"))
        })
        .filter(|l| l["channel"] == "fifo")
        .collect();
    assert_eq!(fifo.len(), 2, "{fifo:?}");
    assert!(fifo[0]["model"].is_null() && fifo[0]["id"].is_string());
    assert_eq!(fifo[1]["name"], "weather");
    assert!(d.sigterm().success());
}

/// `primary` falls back to `backup`; `primary` answers 529 throughout.
fn with_fallback(base_url: &str) -> String {
    format!(
        r#"
type = "openai"
base_url = "{base_url}"

[models.primary]
model = "fake-model"
max_tokens = 1024
fallback = ["backup"]

[models.backup]
model = "backup-model"
max_tokens = 1024
"#
    )
}

#[test]
fn a_fallback_answer_is_named_in_the_trail_costs_monitor_and_telegram() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.set_responder(|body| {
        (body["model"] == "fake-model")
            .then(|| crate::support::fake_llm::Reply::error(529, "Overloaded"))
    });
    let tg = FakeTelegram::spawn(TOKEN);
    let toml = agentd_toml("fake").replace(
        "[behavior]",
        &format!(
            "[channel.telegram]\nenabled = true\napi_url = \"{}\"\nallow_from = [{ALICE}]\npoll_timeout_seconds = 1\ncontacts = {{ Alice = {ALICE} }}\n\n[behavior]\napi_retries = 1\nmessage_retries = 0",
            tg.api_url()
        ),
    );
    let mut d = TestDaemon::new(&toml, &[("fake", &with_fallback(&llm.base_url()))]);
    d.set_env("AGENTD_TELEGRAM_TOKEN", TOKEN);
    d.start();

    tg.push_text(ALICE, ALICE, "are you there?");
    let reply = nth_answer(&tg, 1);
    assert!(
        reply.contains("answered by backup (primary was unavailable)"),
        "{reply}"
    );
    let models: Vec<String> = llm
        .requests()
        .iter()
        .map(|r| r["model"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        models,
        ["fake-model", "fake-model", "backup-model"],
        "a try, a retry, the fallback"
    );

    // The trail's final message.
    let trail = d.trail("Alice");
    let fin = trail.iter().find(|l| l["final"] == true).expect("a reply");
    assert_eq!(fin["model"], "backup");
    assert_eq!(fin["fallback_from"], "primary");
    let why = fin["fallback_reason"].as_str().unwrap();
    assert!(why.contains("529"), "{why}");
    assert!(
        !fin["text"].as_str().unwrap().contains("answered by"),
        "the line is not part of the reply"
    );

    // The costs row.
    let db = rusqlite::Connection::open(d.state_dir.join("agentd.db")).unwrap();
    let (model, from): (String, Option<String>) = db
        .query_row("SELECT model, fallback_from FROM costs", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(
        (model.as_str(), from.as_deref()),
        ("backup-model", Some("primary"))
    );

    // The monitor, idle, describes the finished message.
    let mon: Value = wait_until(WAIT, "the idle monitor", || {
        let bytes = std::fs::read(d.state_dir.join("monitor.json")).ok()?;
        serde_json::from_slice::<Value>(&bytes)
            .ok()
            .filter(|m| m["state"] == "idle" && m["fallback_from"] == "primary")
    });
    assert_eq!(mon["model"], "backup");
    let shown = d.agent_send(&["--monitor"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("fallback:   answering for primary"), "{text}");
    assert!(d.sigterm().success());
}

/// Issue 33 item 4: `agent-send --session KEY --model NAME` checks NAME against the config it
/// reads (exit 2 with the list); when the daemon refuses anyway because its config differs,
/// the daemon's reason reaches agent-send's stderr (exit 1) instead of a wait for the intake
/// that never comes and exit 3.
#[test]
fn agent_send_shows_the_daemons_refusal_of_an_unknown_model() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let mut d = TestDaemon::new(
        &agentd_toml("fake"),
        &[("fake", &two_models(&llm.base_url()))],
    );
    d.start();

    // The client's own config: exit 2 listing the loaded names, nothing sent.
    let bad = d.agent_send(&["--session", "alice", "--model", "gpt-9"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(
        err.contains("unknown model \"gpt-9\"") && err.contains("cheap, primary"),
        "{err}"
    );

    // A client config that defines gpt-9: the daemon's refusal, with its list, on stderr.
    let three = format!(
        "{}\n[models.gpt-9]\nmodel = \"gpt-9\"\n",
        two_models(&llm.base_url())
    );
    let other = TestDaemon::new(&agentd_toml("fake"), &[("fake", &three)]);
    let timeout = 30;
    let started = std::time::Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-send"))
        .arg("--state-dir")
        .arg(&d.state_dir)
        .arg("-c")
        .arg(&other.config_path)
        .args(["--session", "alice", "--model", "gpt-9", "--timeout"])
        .arg(timeout.to_string())
        .env_remove("AGENTD_CONFIG")
        .env_remove("AGENTD_STATE_DIR")
        .output()
        .unwrap();
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "daemon refusal reached agent-send in {took:?} (--timeout {timeout}): {:?} {err}",
        out.status.code()
    );
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("agentd refused the setting"), "{err}");
    assert!(
        err.contains("unknown model \"gpt-9\"") && err.contains("cheap, primary"),
        "{err}"
    );
    assert!(
        took < Duration::from_secs(timeout),
        "waited out --timeout: {took:?}"
    );
    assert!(d.log().contains("FIFO session setting refused"));
    assert!(
        !d.trail("alice")
            .iter()
            .any(|e| e["type"] == "session_model"),
        "a refused setting is not recorded"
    );
}
