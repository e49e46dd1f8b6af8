//! Snapshots on a cadence (issue 14, SPEC §7 and §16.6): `<id>.state.json` is a cache of the
//! trail's fold, written every few dozen trail lines and on a graceful stop, not after every
//! message. What must hold: a kill -9 between snapshots loses nothing (the next start, the next
//! message and the sessions report all see the whole history), and a graceful stop leaves
//! every session's snapshot at its trail's last line.

use serde_json::Value;

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{WAIT, agentd_toml, daemon_with, provider_toml};
use crate::support::fake_llm::{FakeLlm, Wire};
use crate::support::wait_until;

/// `agent-send -m <text> --from <from> --wait 20`, which must succeed.
fn send(d: &TestDaemon, from: &str, text: &str) {
    let out = d.agent_send(&["-m", text, "--from", from, "--wait", "20"]);
    assert!(
        out.status.success(),
        "agent-send {text:?} from {from}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `last_seq` of the session's snapshot, `None` when it has none.
fn snapshot_seq(d: &TestDaemon, id: &str) -> Option<u64> {
    let bytes = std::fs::read(d.sessions_dir().join(format!("{id}.state.json"))).ok()?;
    let v: Value = serde_json::from_slice(&bytes).expect("a snapshot is whole JSON");
    v["last_seq"].as_u64()
}

/// The `seq` of the session's last trail line.
fn trail_seq(d: &TestDaemon, id: &str) -> u64 {
    let trail = d.trail_by_id(id);
    trail.last().expect("a trail")["seq"].as_u64().unwrap()
}

/// `agent-send --sessions --json`: the entry of `key`.
fn report_of(d: &TestDaemon, key: &str) -> Value {
    let out = d.agent_send(&["--sessions", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("--sessions --json is JSON");
    v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == key)
        .unwrap_or_else(|| panic!("no session {key} in {v:#}"))
        .clone()
}

/// A kill -9 right after a message, while the snapshot lags the trail, loses nothing: the report
/// counts every message (before and after the restart) and the next message's request carries
/// the whole conversation.
#[test]
fn kill9_between_snapshots_loses_nothing() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let mut d = daemon_with(&fake, "openai");
    // Enough messages (3 trail lines each) for one snapshot on the cadence, then a few more.
    let n = 25;
    for i in 0..n {
        send(&d, "kim", &format!("note {i}"));
    }
    let id = d.session_id("kim").unwrap();
    let last = trail_seq(&d, &id);
    let snap = snapshot_seq(&d, &id).expect("a snapshot was written on the cadence");
    assert!(
        snap < last,
        "the snapshot ({snap}) lags the trail ({last}): not written after every message"
    );
    // The report folds the newer trail lines into the lagging snapshot.
    let r = report_of(&d, "kim");
    assert_eq!(r["message_count"], 2 * n, "{r:#}");

    d.kill9();
    assert_eq!(snapshot_seq(&d, &id), Some(snap), "nothing wrote it since");
    let r = report_of(&d, "kim");
    assert_eq!(r["message_count"], 2 * n, "{r:#} (daemon down)");

    d.start();
    send(&d, "kim", "what did I say?");
    let body = fake.requests().pop().unwrap();
    let sent = body["messages"].to_string();
    for i in 0..n {
        assert!(
            sent.contains(&format!("note {i}")),
            "note {i} missing from the request after the restart"
        );
    }
    let r = report_of(&d, "kim");
    assert_eq!(r["message_count"], 2 * (n + 1), "{r:#}");
    assert_eq!(d.session_id("kim"), Some(id));
}

/// A graceful stop snapshots every session with lines its snapshot lacks: those a worker or
/// the idle cache still held and those evicted from that cache earlier.
#[test]
fn graceful_stop_leaves_every_snapshot_at_its_trails_last_line() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let mut d = daemon_with(&fake, "openai");
    // More senders than the daemon keeps idle states for (8), so some are evicted.
    let senders: Vec<String> = (0..12).map(|i| format!("s{i}")).collect();
    for s in &senders {
        send(&d, s, "hello");
    }
    send(&d, "s0", "again");
    let status = d.sigterm();
    assert!(status.success(), "{status}");
    for s in &senders {
        let id = d.session_id(s).unwrap();
        assert_eq!(
            snapshot_seq(&d, &id),
            Some(trail_seq(&d, &id)),
            "snapshot of {s} after a graceful stop"
        );
    }
    // And a start reads them: the report and the next message agree with the trail.
    d.start();
    send(&d, "s0", "third");
    assert_eq!(report_of(&d, "s0")["message_count"], 6);
    let sent = fake.requests().pop().unwrap()["messages"].to_string();
    assert!(sent.contains("hello") && sent.contains("again"), "{sent}");
}

/// Issue 33: `[behavior] idle_session_cache_bytes = 0` keeps no idle state. A session's state
/// leaves memory when its worker exits and, as every evicted state, is snapshotted then if it
/// lags its trail: the snapshot reaches the trail's last line without a stop (a cached state's
/// would lag for dozens of lines), and the next message reads it back whole.
#[test]
fn with_no_idle_cache_bytes_a_state_is_snapshotted_when_its_worker_exits() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let config =
        agentd_toml("fake").replace("[behavior]", "[behavior]\nidle_session_cache_bytes = 0");
    let mut d = TestDaemon::new(
        &config,
        &[("fake", &provider_toml("openai", &fake.base_url()))],
    );
    d.start();
    let at_trail_end = |d: &TestDaemon, id: &str| {
        wait_until(WAIT, "the snapshot at the trail's last line", || {
            (snapshot_seq(d, id) == Some(trail_seq(d, id))).then_some(())
        })
    };
    send(&d, "kim", "hello");
    let id = d.session_id("kim").unwrap();
    at_trail_end(&d, &id);
    send(&d, "kim", "again");
    at_trail_end(&d, &id);
    assert_eq!(report_of(&d, "kim")["message_count"], 4);
    let sent = fake.requests().pop().unwrap()["messages"].to_string();
    assert!(sent.contains("hello") && sent.contains("again"), "{sent}");
    d.kill9();
}
