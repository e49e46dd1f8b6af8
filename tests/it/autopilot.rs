//! The cost autopilot end to end (SPEC §20): `[[schedule]]` prechecks run in the exec sandbox
//! and decide whether the job calls the provider; the cache TTL on the wire.

use std::time::Duration;

use serde_json::Value;

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{WAIT, agentd_toml, provider_toml, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Wire, last_user_text};
use crate::support::wait_until;

/// A value in the daemon's environment that the precheck must never see.
const CANARY: &str = "sk-precheck-canary-7f3a";

/// A daemon on `fake` (Anthropic wire) with one `[[schedule]]` entry `beat` every second,
/// whose precheck is `precheck`, and a secret in its environment.
fn daemon(fake: &FakeLlm, precheck: &str) -> TestDaemon {
    let mut d = TestDaemon::new(
        &format!(
            "{}\n[[schedule]]\nname = \"beat\"\nevery = \"1s\"\nsystem = \"Execute HEARTBEAT.md\"\nprecheck = {}\n",
            agentd_toml("fake"),
            toml_string(precheck)
        ),
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    d.set_env("AGENTD_ANTHROPIC_KEY", CANARY);
    d.set_env("PRECHECK_CANARY", CANARY);
    d.start();
    d
}

fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

fn events(d: &TestDaemon, kind: &str) -> Vec<Value> {
    d.trail("system")
        .into_iter()
        .filter(|l| l["type"] == kind)
        .collect()
}

fn monitor(d: &TestDaemon) -> Value {
    let text = std::fs::read_to_string(d.state_dir.join("monitor.json")).unwrap_or_default();
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

/// Exit 1: a `skipped` trail event, no intake, no provider call, a skipped-run row, and the
/// outcome in the monitor and in `agent-send --sessions`.
#[test]
fn precheck_exit_1_skips_without_a_provider_call() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let d = daemon(&fake, "test -e nothing-to-do.txt");
    let skipped = wait_until(WAIT, "two skipped events", || {
        let s = events(&d, "skipped");
        (s.len() >= 2).then_some(s)
    });
    assert_eq!(skipped[0]["schedule"], "beat");
    assert_eq!(skipped[0]["outcome"], "skip");
    assert_eq!(skipped[0]["exit_code"], 1);
    assert!(skipped[0]["ms"].is_u64());
    assert!(
        events(&d, "intake").is_empty(),
        "a skipped job has no intake"
    );
    assert!(fake.requests().is_empty(), "no provider call");
    let m = wait_until(WAIT, "the precheck in monitor.json", || {
        let m = monitor(&d);
        (m["prechecks"]["beat"]["outcome"] == "skip").then_some(m)
    });
    assert_eq!(m["prechecks"]["beat"]["exit_code"], 1);
    let out = d.agent_send(&["--sessions"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("precheck beat at "), "{text}");
    assert!(text.contains(": skip (exit 1, "), "{text}");
    let conn = rusqlite::Connection::open(d.state_dir.join("agentd.db")).unwrap();
    // The row is written after the trail event (scheduler::precheck): the second skip's may
    // still be on its way when its event is seen.
    wait_until(WAIT, "two skipped-run rows", || {
        let runs: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM skipped_runs WHERE schedule = 'beat'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        (runs >= 2).then_some(())
    });
    let costs: i64 = conn
        .query_row("SELECT COUNT(*) FROM costs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(costs, 0);
}

/// Exit 0: the job runs with the precheck's stdout in the request, marked as untrusted; the
/// command ran sandboxed with an environment that holds none of the daemon's secrets.
#[test]
fn precheck_exit_0_passes_its_stdout_and_sees_no_secrets() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.set_responder(|_| Some(Reply::text("HEARTBEAT_OK")));
    let d = daemon(
        &fake,
        "echo PRECHECK-SAYS-3-NEW; env | sed 's/^/ENV:/'; cat /proc/$PPID/environ 2>/dev/null | tr '\\0' '\\n' | sed 's/^/PARENT:/'",
    );
    let requests = wait_until(WAIT, "a provider call", || {
        let r = fake.requests();
        (!r.is_empty()).then_some(r)
    });
    let text = last_user_text(&requests[0]);
    assert!(
        text.contains("] Execute HEARTBEAT.md\n\nThe precheck's output:\n"),
        "{text}"
    );
    assert!(text.contains("PRECHECK-SAYS-3-NEW"), "{text}");
    assert!(
        text.contains("<untrusted-content source=\"precheck\">"),
        "{text}"
    );
    assert!(
        text.contains("ENV:PATH="),
        "the environment was listed: {text}"
    );
    assert!(
        !text.contains(CANARY),
        "a secret reached the precheck: {text}"
    );
    assert!(!text.contains("ENV:PRECHECK_CANARY"), "{text}");
    let pre = wait_until(WAIT, "a precheck event", || {
        events(&d, "precheck").into_iter().next()
    });
    assert_eq!(pre["outcome"], "run");
    assert_eq!(pre["exit_code"], 0);
    let intake = events(&d, "intake").into_iter().next().unwrap();
    wait_outcome(&d, "system", intake["id"].as_str().unwrap());
}

/// Any other exit: the job runs (without the output) and a warning is logged.
#[test]
fn precheck_exit_2_runs_the_job_with_a_warning() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.set_responder(|_| Some(Reply::text("HEARTBEAT_OK")));
    let d = daemon(&fake, "echo broken; exit 2");
    let requests = wait_until(WAIT, "a provider call", || {
        let r = fake.requests();
        (!r.is_empty()).then_some(r)
    });
    let text = last_user_text(&requests[0]);
    assert!(text.ends_with("] Execute HEARTBEAT.md"), "{text}");
    assert!(!text.contains("broken"), "{text}");
    let pre = wait_until(WAIT, "a precheck event", || {
        events(&d, "precheck").into_iter().next()
    });
    assert_eq!(pre["outcome"], "warn");
    assert_eq!(pre["exit_code"], 2);
    d.wait_log("precheck exited neither 0 nor 1");
    assert!(wait_until(Duration::from_secs(30), "monitor", || {
        let m = monitor(&d);
        (m["prechecks"]["beat"]["outcome"] == "warn").then_some(true)
    }));
}

/// The cache alarm (SPEC §20): the fake provider stops reporting cache reads; once 20 calls
/// went without them, the monitor shows the alert and the `[alerts] telegram_chat` gets one
/// notice. When the reads come back, the episode ends (no second notice).
#[test]
fn cache_alarm_starts_once_and_ends_when_reads_return() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use crate::support::e2e::{fifo_write, telegram_daemon};
    use crate::support::fake_llm::Usage;
    use crate::support::fake_telegram::FakeTelegram;

    const CHAT: i64 = 4242;
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let reads = Arc::new(AtomicBool::new(true));
    let r = reads.clone();
    fake.set_responder(move |_| {
        let usage = if r.load(Ordering::SeqCst) {
            Usage::new(100, 5, 900, 0)
        } else {
            Usage::new(1000, 5, 0, 0)
        };
        Some(Reply::Text {
            text: "ok".into(),
            usage,
        })
    });
    let tg = FakeTelegram::spawn("123:alarm");
    let d = telegram_daemon(
        &fake,
        &tg,
        "123:alarm",
        CHAT,
        "",
        &format!("[alerts]\ntelegram_chat = {CHAT}\n\n"),
        "",
    );
    let mut n = 0;
    let mut call = |d: &TestDaemon| {
        n += 1;
        let id = format!("alarm-{n}");
        fifo_write(
            d,
            &format!(r#"{{"type":"user","id":"{id}","sender":"cli","text":"hi {n}"}}"#),
        );
        wait_outcome(d, "cli", &id);
    };
    for _ in 0..10 {
        call(&d);
    }
    // monitor.json is written in the background: wait for the view of the last call.
    let m = wait_until(WAIT, "the cache section", || {
        let m = monitor(&d);
        (m["cache"]["recent_calls"] == 10).then_some(m)
    });
    assert!(
        m["cache"]["hit_ratio_recent"].as_f64().unwrap() > 0.8,
        "{m}"
    );
    assert_eq!(m["alerts"], serde_json::json!([]), "{m}");
    reads.store(false, Ordering::SeqCst);
    let notices = || {
        tg.sent_to(CHAT)
            .into_iter()
            .filter(|t| t.contains("cache hit ratio"))
            .count()
    };
    for _ in 0..20 {
        call(&d);
    }
    // The view of the last call (an earlier view may already show the alert, which starts
    // while the ratio falls): the alert, and the ratio of 20 calls without reads.
    let m = wait_until(WAIT, "the alert and the last call in monitor.json", || {
        let m = monitor(&d);
        let low = m["cache"]["hit_ratio_recent"]
            .as_f64()
            .is_some_and(|r| r < 0.01);
        (m["alerts"][0]["kind"] == "cache" && low).then_some(m)
    });
    assert_eq!(m["cache"]["recent_calls"], 20, "{m}");
    d.wait_log("cache alarm: prompt cache hit ratio fell");
    wait_until(WAIT, "one alert notice", || (notices() == 1).then_some(()));
    reads.store(true, Ordering::SeqCst);
    let mut ended_after = None;
    for i in 1..=20 {
        call(&d);
        if d.log().contains("cache alarm over") {
            ended_after = Some(i);
            break;
        }
    }
    assert!(
        ended_after.is_some(),
        "the episode never ended: {}",
        monitor(&d)
    );
    wait_until(WAIT, "no alert in monitor.json", || {
        (monitor(&d)["alerts"] == serde_json::json!([])).then_some(())
    });
    assert_eq!(notices(), 1, "one notice per episode");
}

/// The `ttl` of every `cache_control` in body order (tools, system, messages).
fn ttls(body: &Value) -> (Vec<String>, Vec<String>) {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => {
                if let Some(cc) = o.get("cache_control") {
                    out.push(cc["ttl"].as_str().unwrap_or("5m").to_string());
                }
                o.values().for_each(|v| walk(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let (mut system, mut messages) = (Vec::new(), Vec::new());
    walk(&body["tools"], &mut system);
    walk(&body["system"], &mut system);
    walk(&body["messages"], &mut messages);
    (system, messages)
}

/// TTL on the wire (SPEC §20): with `[caching] ttl = "1h"` the daemon's requests carry
/// `ttl: "1h"` on the system breakpoints only, before every 5-minute message breakpoint, and
/// are valid against the published request schema; with `"5m"` none carries a TTL.
#[test]
fn cache_ttl_on_the_wire() {
    for (setting, system_ttl) in [("1h", "1h"), ("5m", "5m")] {
        let fake = FakeLlm::spawn(Wire::Anthropic);
        fake.set_responder(|_| Some(Reply::text("fine")));
        let toml = agentd_toml("fake").replace(
            "[behavior]",
            &format!("[caching]\nttl = \"{setting}\"\n\n[behavior]"),
        );
        let mut d = TestDaemon::new(
            &toml,
            &[("fake", &provider_toml("anthropic", &fake.base_url()))],
        );
        d.start();
        for n in 1..=2 {
            let id = format!("ttl-{setting}-{n}");
            crate::support::e2e::fifo_write(
                &d,
                &format!(r#"{{"type":"user","id":"{id}","sender":"cli","text":"hello {n}"}}"#),
            );
            wait_outcome(&d, "cli", &id);
        }
        let requests = fake.requests();
        assert_eq!(requests.len(), 2);
        for body in &requests {
            crate::support::provider_spec::assert_valid(Wire::Anthropic, body);
            let (system, messages) = ttls(body);
            assert!(!system.is_empty() && !messages.is_empty(), "{body}");
            assert!(
                system.iter().all(|t| t == system_ttl),
                "{setting}: {system:?}"
            );
            assert!(
                messages.iter().all(|t| t == "5m"),
                "{setting}: {messages:?}"
            );
            let raw = body.to_string();
            if setting == "5m" {
                assert!(!raw.contains("\"ttl\""), "no ttl key with 5m: {raw}");
            }
        }
    }
}
