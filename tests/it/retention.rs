//! Bounded state (SPEC §16.3) on the real daemon: with `idle_session_after = "2s"`, the
//! sessions of many distinct HTTP senders are archived as by `/reset`, the index shrinks and
//! the daemon's open descriptors do not grow with the number of senders; an old inbox file and
//! an old archived session are deleted while fresh ones stay. Every wait has a deadline and
//! waits for the condition, never for a fixed time.

use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::http_daemon::reqwest;
use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, provider_toml};
use crate::support::fake_llm::{FakeLlm, Wire};
use crate::support::{free_port, wait_until};

/// How long a test waits for a retention pass to have done its work (passes run every second
/// with these ages).
const WAIT: Duration = Duration::from_secs(60);

/// Keys of `sessions.json` that start with `prefix`.
fn index_keys(d: &TestDaemon, prefix: &str) -> usize {
    let Ok(text) = std::fs::read_to_string(d.sessions_dir().join("sessions.json")) else {
        return 0;
    };
    let index: Value = serde_json::from_str(&text).unwrap();
    let map = index.get("sessions").unwrap_or(&index);
    map.as_object()
        .map(|m| m.keys().filter(|k| k.starts_with(prefix)).count())
        .unwrap_or(0)
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// A file at `path` last modified `age` ago.
fn old_file(path: &Path, age: Duration) {
    std::fs::write(path, "x").unwrap();
    let f = std::fs::File::options().append(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - age).unwrap();
}

#[test]
fn idle_sessions_old_inbox_files_and_old_archives_are_bounded() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let port = free_port();
    let mut d = TestDaemon::new(
        &format!(
            "{}\n[http]\nenabled = true\nport = {port}\nrate_limit = 1000\n\n[retention]\nidle_session_after = \"2s\"\ninbox_max_age = \"1h\"\narchive_max_age = \"1h\"\n",
            agentd_toml("fake")
        ),
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    d.set_env("AGENTD_HTTP_TOKEN", "tok");
    d.start();
    let pid = d.pid().expect("daemon pid");
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::blocking_client();
    let chat = |sender: &str| {
        let r = client
            .post(format!("{base}/api/v1/chat"))
            .bearer_auth("tok")
            .json(&json!({"message": "hello", "sender": sender}))
            .send()
            .unwrap();
        assert_eq!(r.status(), 200, "chat of {sender}");
    };

    // Inbox: an old file goes, a fresh one stays. Archive: an old archived session goes.
    let inbox = d.state_dir.join("inbox");
    std::fs::create_dir_all(&inbox).unwrap();
    old_file(&inbox.join("old.ogg"), Duration::from_secs(7200));
    std::fs::write(inbox.join("fresh.txt"), "keep me").unwrap();
    let archive = d.sessions_dir().join(".archive");
    let old_id = "01900000-0000-7000-8000-000000000001";
    old_file(
        &archive.join(format!("{old_id}.2026-01-01.jsonl")),
        Duration::from_secs(7200),
    );
    old_file(
        &archive.join(format!("{old_id}.state.json")),
        Duration::from_secs(7200),
    );
    wait_until(WAIT, "old inbox file and old archive deleted", || {
        (!inbox.join("old.ogg").exists()
            && !archive.join(format!("{old_id}.state.json")).exists()
            && !archive.join(format!("{old_id}.2026-01-01.jsonl")).exists())
        .then_some(())
    });
    assert!(inbox.join("fresh.txt").exists(), "a fresh inbox file stays");

    // A few senders first, archived once idle: the baseline of descriptors.
    for n in 0..5 {
        chat(&format!("warm{n}"));
    }
    wait_until(WAIT, "warm-up sessions archived", || {
        (index_keys(&d, "http-warm") == 0).then_some(())
    });
    let baseline = open_fds(pid);

    // Fifty distinct senders: each gets a session, then loses it once idle.
    let senders = 50;
    for n in 0..senders {
        chat(&format!("s{n}"));
    }
    // An archive removes the index entry first, then moves the files: both must be seen.
    wait_until(WAIT, "every sender's session archived", || {
        let archived = std::fs::read_dir(&archive)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".jsonl"))
            .count();
        (index_keys(&d, "http-s") == 0 && archived >= senders + 5).then_some(())
    });
    // Archived as by /reset: each trail ends with a reset event naming the idle time.
    let trails: Vec<_> = std::fs::read_dir(&archive)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".jsonl"))
        .collect();
    for t in trails {
        let text = std::fs::read_to_string(t.path()).unwrap();
        let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(last["type"], "reset", "{text}");
        assert!(last["reason"].as_str().unwrap().contains("idle"), "{text}");
    }
    let after = open_fds(pid);
    assert!(
        after <= baseline + 4,
        "open descriptors grew with the number of senders: {baseline} before, {after} after {senders} senders"
    );
    // Each answered session was marked settled, so a restart need not read its trail.
    let settled = std::fs::read_dir(&archive)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".settled"))
        .count();
    assert!(settled >= senders, "settled marks: {settled}");
    // The archived sessions are not older than archive_max_age: they stay.
    assert!(archive.read_dir().unwrap().count() >= senders);

    // A sender whose session was archived starts a new one.
    let before = d.session_id("http-s0");
    assert!(before.is_none());
    chat("s0");
    assert!(d.session_id("http-s0").is_some());
    assert!(d.sigterm().success());
}
