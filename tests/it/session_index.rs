//! The session index `sessions.json` is written in the background (issue 14): a new session's
//! first message pays no index fsync and makes no other session's intake wait. The record of a
//! session is its trail's `session` event, durable before the intake is acknowledged; a start
//! repairs what a crash kept from the index (`session::repair`), and finishes a reset that a
//! crash stopped between its index write and its file moves.

use serde_json::Value;

use crate::support::daemon::{TestDaemon, read_trail_files};
use crate::support::e2e::WAIT;
use crate::support::e2e::{daemon_with, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Usage, Wire};
use crate::support::wait_until;

/// `agent-send <args>`, which must succeed.
fn agent_send_ok(d: &TestDaemon, args: &[&str]) -> Vec<u8> {
    let out = d.agent_send(args);
    assert!(
        out.status.success(),
        "agent-send {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The files of session `id` in `dir`.
fn files_of(dir: &std::path::Path, id: &str) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{id}.")))
        })
        .collect()
}

/// Both crash windows of the background index write, made while the daemon is down after a
/// kill -9: a new session whose acknowledged first message the index does not name, and a
/// reset whose index write landed but whose files did not move. The restart answers the
/// message in its session, which the index and the sessions report name again, and finishes
/// the reset.
#[test]
fn kill9_before_the_index_write_loses_no_session() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let mut d = daemon_with(&fake, "openai");
    // otto: reset, then (below) its files put back as a kill before the move leaves them.
    agent_send_ok(&d, &["-m", "hello", "--from", "otto", "--wait", "20"]);
    let otto = d.session_id("otto").unwrap();
    agent_send_ok(&d, &["--reset", "otto", "--wait", "20"]);
    // nina: a new session; her message is acknowledged, its model call hangs.
    fake.push(Reply::Hang);
    fake.push(Reply::Text {
        text: "answered after restart".into(),
        usage: Usage::new(10, 5, 0, 0),
    });
    let before = fake.requests().len();
    agent_send_ok(&d, &["-m", "remember me", "--from", "nina"]);
    wait_until(WAIT, "nina's model call", || {
        (fake.requests().len() > before).then_some(())
    });
    let nina = d.indexed_session_id("nina").expect("nina's session");
    d.kill9();

    // The index as a kill before its write leaves it: without nina.
    let index_path = d.sessions_dir().join("sessions.json");
    let mut index: Value = serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    index.as_object_mut().unwrap().remove("nina");
    std::fs::write(&index_path, index.to_string()).unwrap();
    assert_eq!(d.indexed_session_id("nina"), None);
    // otto's files as a kill between the reset's index write and the move leaves them.
    let archive = d.sessions_dir().join(".archive");
    for f in files_of(&archive, &otto) {
        std::fs::rename(&f, d.sessions_dir().join(f.file_name().unwrap())).unwrap();
    }
    assert_eq!(d.indexed_session_id("otto"), None);

    d.start();
    let intake_id = read_trail_files(&d.sessions_dir(), &nina)
        .into_iter()
        .find(|l| l["type"] == "intake")
        .expect("nina's intake")["id"]
        .as_str()
        .unwrap()
        .to_string();
    let fin = wait_outcome(&d, "nina", &intake_id);
    assert_eq!(fin["text"], "answered after restart");
    assert_eq!(
        d.indexed_session_id("nina").as_deref(),
        Some(nina.as_str()),
        "the start wrote the repaired index"
    );
    assert!(d.log().contains("session index repaired"), "{}", d.log());
    let report: Value =
        serde_json::from_slice(&agent_send_ok(&d, &["--sessions", "--json"])).unwrap();
    let listed: Vec<(&str, &str)> = report["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["key"].as_str().unwrap(),
                s["session_id"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(listed, [("nina", nina.as_str())], "{report:#}");

    // otto's reset is finished: every file in the archive, its trail ending with the reset.
    assert!(files_of(&d.sessions_dir(), &otto).is_empty());
    let archived = read_trail_files(&archive, &otto);
    assert_eq!(archived.last().unwrap()["type"], "reset");
    assert!(d.log().contains("finished archiving a session"));

    // nina goes on in her session; otto starts a new one.
    agent_send_ok(&d, &["-m", "and now?", "--from", "nina", "--wait", "20"]);
    assert_eq!(d.indexed_session_id("nina").as_deref(), Some(nina.as_str()));
    agent_send_ok(&d, &["-m", "hi again", "--from", "otto", "--wait", "20"]);
    assert_ne!(d.session_id("otto").unwrap(), otto);
}
