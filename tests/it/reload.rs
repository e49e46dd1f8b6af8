//! Live reload (SPEC §16.5, issue 13 "SIGHUP"): the real daemon, its config file edited, then
//! SIGHUP. A new `[[schedule]]` entry runs, a removed `allow_from` id is refused, an invalid
//! config is refused while the old one keeps running, and `agentd check-config --diff` tells
//! what a reload applies and what needs a restart.

use std::process::Command;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{WAIT, daemon_with, fifo_write, telegram_daemon, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};
use crate::support::fake_telegram::FakeTelegram;
use crate::support::wait_until;

const TOKEN: &str = "123456:TEST-reload-token";
const ALICE: i64 = 1001;
const BOB: i64 = 1002;

/// The monitor's `reload` entry, once there is one.
fn reload_entry(d: &TestDaemon) -> Option<Value> {
    let text = std::fs::read_to_string(d.state_dir.join("monitor.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    Some(v["reload"].clone()).filter(|r| !r.is_null())
}

/// Send SIGHUP and wait until the daemon reports that reload in the monitor.
pub(crate) fn sighup(d: &TestDaemon) -> Value {
    let before = reload_entry(d).map(|r| r["at"].clone());
    kill(Pid::from_raw(d.pid().unwrap() as i32), Signal::SIGHUP).unwrap();
    wait_until(WAIT, "the reload's outcome in monitor.json", || {
        reload_entry(d).filter(|r| Some(&r["at"]) != before.as_ref())
    })
}

/// Rewrite the daemon's config file through `f`.
pub(crate) fn edit_config(d: &TestDaemon, f: impl FnOnce(String) -> String) {
    let text = std::fs::read_to_string(&d.config_path).unwrap();
    std::fs::write(&d.config_path, f(text)).unwrap();
}

fn keys(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|k| k.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_new_schedule_entry_runs_after_sighup() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.set_responder(|_| Some(Reply::text("noted")));
    let mut d = daemon_with(&llm, "openai");
    edit_config(&d, |t| {
        format!(
            "{t}\n[[schedule]]\nname = \"beat\"\nevery = \"1s\"\nsystem = \"heartbeat from the reloaded schedule\"\n"
        )
    });
    let r = sighup(&d);
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(keys(&r["applied"]), vec!["schedule.beat"], "{r}");
    assert!(keys(&r["needs_restart"]).is_empty(), "{r}");
    wait_until(WAIT, "the new schedule's system event in a trail", || {
        d.trail("system")
            .iter()
            .any(|l| {
                l["role"] == "user"
                    && l["content"]
                        .to_string()
                        .contains("heartbeat from the reloaded schedule")
            })
            .then_some(())
    });
    assert!(d.sigterm().success(), "{}", d.log());
}

#[test]
fn a_removed_allow_from_id_is_refused_after_sighup() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.set_responder(|_| Some(Reply::text("hello")));
    let tg = FakeTelegram::spawn(TOKEN);
    let channel =
        format!("poll_timeout_seconds = 1\ncontacts = {{ Alice = {ALICE}, Bob = {BOB} }}");
    let mut d = telegram_daemon(&llm, &tg, TOKEN, ALICE, &channel, "", "debounce_ms = 50");
    tg.push_text(ALICE, ALICE, "before the reload");
    wait_until(WAIT, "Alice's first reply", || {
        (!tg.sent_to(ALICE).is_empty()).then_some(())
    });
    // Alice is taken off the list, Bob is put on it.
    edit_config(&d, |t| {
        t.replace(
            &format!("allow_from = [{ALICE}]"),
            &format!("allow_from = [{BOB}]"),
        )
    });
    let r = sighup(&d);
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(
        keys(&r["applied"]),
        vec!["channel.telegram.allow_from"],
        "{r}"
    );
    let requests = llm.requests().len();
    tg.push_text(ALICE, ALICE, "after the reload");
    tg.push_text(BOB, BOB, "let me in");
    wait_until(WAIT, "Bob's reply (he was added)", || {
        (!tg.sent_to(BOB).is_empty()).then_some(())
    });
    assert_eq!(tg.sent_to(ALICE).len(), 1, "Alice got nothing more");
    assert_eq!(
        llm.requests().len(),
        requests + 1,
        "only Bob reached the model"
    );
    assert!(
        d.log()
            .contains(&format!("message from user {ALICE} rejected")),
        "the refusal is logged"
    );
    assert!(d.sigterm().success(), "{}", d.log());
}

#[test]
fn an_invalid_config_is_refused_and_the_old_one_keeps_running() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.set_responder(|_| Some(Reply::text("still here")));
    let mut d = daemon_with(&llm, "openai");
    let good = std::fs::read_to_string(&d.config_path).unwrap();
    edit_config(&d, |t| {
        format!(
            "{t}\n[budget]\ndaily_usd = \"lots\"\n[[schedule]]\nname = \"x\"\nevery = \"1s\"\nsystem = \"never\"\n"
        )
    });
    let r = sighup(&d);
    assert_eq!(r["ok"], false, "{r}");
    let error = r["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("daily_usd"),
        "the error names the key: {error}"
    );
    d.wait_log("reload refused");
    // The old config still runs: messages are answered, the invalid file's schedule never fires.
    fifo_write(
        &d,
        r#"{"id":"m1","type":"user","sender":"ops","text":"are you still running?"}"#,
    );
    let out = wait_outcome(&d, "ops", "m1");
    assert_eq!(out["final"], true, "{out}");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        d.trail("system").is_empty(),
        "the refused config's schedule must not run"
    );
    // Fixed again: the next reload applies cleanly.
    std::fs::write(&d.config_path, good).unwrap();
    let r = sighup(&d);
    assert_eq!(r["ok"], true, "{r}");
    assert!(d.sigterm().success(), "{}", d.log());
}

#[test]
fn check_config_diff_splits_live_changes_from_restart_ones() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let mut d = daemon_with(&llm, "openai");
    let diff = |d: &TestDaemon| {
        Command::new(env!("CARGO_BIN_EXE_agentd"))
            .args([
                "-c",
                d.config_path.to_str().unwrap(),
                "check-config",
                "--diff",
            ])
            .env("AGENTD_STATE_DIR", &d.state_dir)
            .output()
            .unwrap()
    };
    let out = diff(&d);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("no changes"), "{text}");
    edit_config(&d, |t| {
        t.replace(
            "[behavior]",
            "[budget]\ndaily_usd = 7.5\n\n[fifo]\nmax_line_bytes = 9000\n\n[behavior]",
        )
    });
    let out = diff(&d);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{out:?}");
    let (live, restart) = text
        .split_once("needs a restart")
        .unwrap_or_else(|| panic!("{text}"));
    assert!(live.contains("applies live"), "{text}");
    assert!(live.contains("~ budget.daily_usd: 0.0 -> 7.5"), "{text}");
    assert!(restart.contains("~ fifo.max_line_bytes:"), "{text}");
    // After the reload, the live part is in force and only the restart part is left.
    let r = sighup(&d);
    assert_eq!(keys(&r["applied"]), vec!["budget.daily_usd"], "{r}");
    assert_eq!(
        keys(&r["needs_restart"]),
        vec!["fifo.max_line_bytes"],
        "{r}"
    );
    let text = String::from_utf8_lossy(&diff(&d).stdout).to_string();
    assert!(!text.contains("budget.daily_usd"), "{text}");
    assert!(text.contains("fifo.max_line_bytes"), "{text}");
    // No daemon: a clear error, exit 1.
    assert!(d.sigterm().success());
    let out = diff(&d);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no agentd is running"),
        "{out:?}"
    );
}

/// Issue 31: every key of the key table is rendered, so a changed
/// `cost_per_mtok.cache_write_1h` in a provider file shows in `check-config --diff` and in the
/// reload report, as a change that needs a restart (it was parsed but never rendered).
#[test]
fn a_changed_cache_write_1h_shows_in_the_diff_and_the_reload_report() {
    const KEY: &str = "models.primary.cost_per_mtok.cache_write_1h";
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let mut d = daemon_with(&llm, "openai");
    let provider = d.dir.path().join("providers.d/fake.toml");
    let text = std::fs::read_to_string(&provider).unwrap();
    let changed = text.replace(
        "cache_write = 3.75 }",
        "cache_write = 3.75, cache_write_1h = 9.5 }",
    );
    assert_ne!(
        text, changed,
        "the fake provider file changed shape: {text}"
    );
    std::fs::write(&provider, changed).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args([
            "-c",
            d.config_path.to_str().unwrap(),
            "check-config",
            "--diff",
        ])
        .env("AGENTD_STATE_DIR", &d.state_dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{out:?}");
    let (_, restart) = text
        .split_once("needs a restart")
        .unwrap_or_else(|| panic!("{text}"));
    // The default is twice `input` (3.0).
    assert!(restart.contains(&format!("~ {KEY}: 6.0 -> 9.5")), "{text}");
    let r = sighup(&d);
    assert_eq!(r["ok"], true, "{r}");
    assert!(keys(&r["applied"]).is_empty(), "{r}");
    assert_eq!(keys(&r["needs_restart"]), vec![KEY], "{r}");
    assert!(d.sigterm().success(), "{}", d.log());
}

#[test]
fn a_new_mcp_servers_tools_appear_after_sighup() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.set_responder(|_| Some(Reply::text("ok")));
    let mut d = daemon_with(&llm, "openai");
    let script = d.dir.path().join("mcp_fake.py");
    std::fs::write(&script, crate::mcp::SERVER).unwrap();
    let offered = |llm: &FakeLlm| {
        llm.requests()
            .last()
            .is_some_and(|r| r["tools"].to_string().contains("fake__echo"))
    };
    fifo_write(
        &d,
        r#"{"id":"before","type":"user","sender":"ops","text":"which tools?"}"#,
    );
    wait_outcome(&d, "ops", "before");
    assert!(!offered(&llm), "no MCP server yet");
    edit_config(&d, |t| {
        format!(
            "{t}\n[mcp.servers.fake]\ncommand = \"python3\"\nargs = [\"{}\"]\n",
            script.display()
        )
    });
    let r = sighup(&d);
    assert_eq!(r["ok"], true, "{r}");
    assert!(
        keys(&r["applied"])
            .iter()
            .any(|k| k.starts_with("mcp.servers.fake.")),
        "{r}"
    );
    assert!(keys(&r["needs_restart"]).is_empty(), "{r}");
    // The server starts in the background; its tools join the next message's list once it
    // is up.
    let mut n = 0;
    wait_until(WAIT, "the new server's tools offered to the model", || {
        n += 1;
        let id = format!("after{n}");
        fifo_write(
            &d,
            &format!(r#"{{"id":"{id}","type":"user","sender":"ops","text":"and now?"}}"#),
        );
        wait_outcome(&d, "ops", &id);
        if offered(&llm) {
            return Some(());
        }
        std::thread::sleep(Duration::from_millis(300));
        None
    });
    assert!(d.sigterm().success(), "{}", d.log());
}
