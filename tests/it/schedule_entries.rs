//! `[[schedule]]` entries end to end (SPEC §14, issue 33 "untested promises"): a `message`
//! entry reaches its contact's chat once, as written; `job = "index"` indexes a note written
//! into the workspace; `job = "consolidate"` extracts facts from a session through the model.
//! (`system` entries: `daemon_e2e`, `autopilot`, `reload`.)

use std::time::Duration;

use rusqlite::OptionalExtension;
use serde_json::json;

use crate::memory::{agentd, ask, is_consolidation, last_tool_result, memory_toml};
use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, provider_toml, telegram_daemon_unstarted};
use crate::support::fake_llm::{FakeLlm, Reply, Wire, last_user_text};
use crate::support::fake_telegram::FakeTelegram;
use crate::support::wait_until;

const TOKEN: &str = "123456:TEST-secret-token";
const ALICE: i64 = 1001;
const WAIT: Duration = Duration::from_secs(40);

/// A connection to the state directory's database `name` (`agentd.db`, `memory.db`).
fn db(d: &TestDaemon, name: &str) -> rusqlite::Connection {
    rusqlite::Connection::open(d.state_dir.join(name)).unwrap()
}

/// The run log's last run of the schedule entry `name` (Unix seconds).
fn last_run(d: &TestDaemon, name: &str) -> Option<i64> {
    db(d, "agentd.db")
        .query_row(
            "SELECT last_run_at FROM schedule_runs WHERE name = ?1",
            [name],
            |r| r.get(0),
        )
        .optional()
        .unwrap()
}

/// A daemon (not started) on a fake Anthropic model with `extra` appended to its config.
fn daemon(llm: &FakeLlm, extra: &str) -> TestDaemon {
    TestDaemon::new(
        &format!("{}{extra}", agentd_toml("fake")),
        &[("fake", &provider_toml("anthropic", &llm.base_url()))],
    )
}

/// `message` + `to`: the text goes to the contact's chat as written (no model call), in the
/// contact's session, once. The entry runs hourly; the first start only starts the count, so
/// the run log is set back an hour while the daemon is stopped: the missed slot runs once at
/// the next start, and the next one is an hour away.
#[test]
fn a_message_entry_reaches_its_contact_once() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let tg = FakeTelegram::spawn(TOKEN);
    let channel =
        format!("poll_timeout_seconds = 1\nformat = \"plain\"\ncontacts = {{ Alice = {ALICE} }}");
    let entry = "[[schedule]]\nname = \"stretch\"\nevery = \"1h\"\nmessage = \"Time to stretch!\"\nto = \"Alice\"\n\n";
    let mut d = telegram_daemon_unstarted(&llm, &tg, TOKEN, &[ALICE], &channel, entry, "");
    d.start();
    let first = wait_until(WAIT, "the entry's first run record", || {
        last_run(&d, "stretch")
    });
    assert!(d.sigterm().success());
    assert!(tg.sent_to(ALICE).is_empty(), "nothing was due yet");
    db(&d, "agentd.db")
        .execute(
            "UPDATE schedule_runs SET last_run_at = ?1 WHERE name = 'stretch'",
            [first - 3600],
        )
        .unwrap();
    d.start();
    wait_until(WAIT, "the delivery done", || {
        d.trail("Alice")
            .iter()
            .any(|l| l["type"] == "delivery" && l["status"] == "done")
            .then_some(())
    });
    let trail = d.trail("Alice");
    let intakes: Vec<_> = trail.iter().filter(|l| l["type"] == "intake").collect();
    assert_eq!(intakes.len(), 1, "{trail:#?}");
    let id = intakes[0]["id"].as_str().unwrap();
    assert!(id.starts_with("schedule-stretch-"), "{id}");
    assert_eq!(intakes[0]["source"], "scheduler", "{trail:#?}");
    assert!(
        trail
            .iter()
            .any(|l| l["final"] == true && l["text"] == "Time to stretch!"),
        "{trail:#?}"
    );
    assert!(d.sigterm().success());
    assert_eq!(tg.sent_to(ALICE), ["Time to stretch!"]);
    assert!(
        llm.requests().is_empty(),
        "sent as written, not by the model"
    );
    assert!(
        last_run(&d, "stretch").unwrap() >= first,
        "the run is recorded"
    );
}

/// `job = "index"`: a note written into the workspace while the daemon runs (nothing else
/// indexes in a running daemon) is indexed by the scheduled run, and the daemon's
/// `memory_search` finds it.
#[test]
fn an_index_job_indexes_a_new_note() {
    let llm = FakeLlm::spawn(Wire::Anthropic);
    let mut d = daemon(
        &llm,
        "\n[[schedule]]\nname = \"reindex\"\nevery = \"1s\"\njob = \"index\"\n",
    );
    d.start();
    let notes = d.workspace().join("memory");
    std::fs::create_dir_all(&notes).unwrap();
    std::fs::write(
        notes.join("okapi.md"),
        "# Zoo\n\nThe okapi Zuri lives in the Wilhelma since spring.\n",
    )
    .unwrap();
    let chunk = wait_until(WAIT, "the note's chunk in memory.db", || {
        db(&d, "memory.db")
            .query_row(
                "SELECT text FROM chunks WHERE path = 'memory/okapi.md'",
                [],
                |r| r.get::<_, String>(0),
            )
            .optional()
            .ok()
            .flatten()
    });
    assert!(chunk.contains("okapi Zuri"), "{chunk}");
    d.wait_log("scheduled index run finished");

    llm.push(Reply::tool_calls(vec![(
        "m1",
        "memory_search",
        json!({"query": "okapi Zuri"}),
    )]));
    llm.push(Reply::text("In the Wilhelma."));
    let requests = ask(&d, &llm, "where does Zuri live?", 2);
    let found = last_tool_result(&requests[1]);
    assert!(found.contains("memory/okapi.md"), "{found}");
    assert!(found.contains("Wilhelma"), "{found}");
    assert!(d.sigterm().success());
}

/// `job = "consolidate"` with `[memory] consolidation.enabled`: the scheduled run sends the
/// session's new messages to the model for consolidation, once (the watermark holds across
/// the runs that follow), and the fact it answers lands in `memory.db`, billed as
/// `consolidation`.
#[test]
fn a_consolidate_job_extracts_facts_through_the_model() {
    let llm = FakeLlm::spawn(Wire::Anthropic);
    llm.set_responder(|body| {
        if !is_consolidation(body) {
            return Some(Reply::text("Noted."));
        }
        let facts = if last_user_text(body).contains("Dora has a cat named Mio") {
            json!([{"entity": "Dora", "attribute": "pet", "value": "a cat named Mio", "confidence": 0.9}])
        } else {
            json!([])
        };
        Some(Reply::text(json!({ "facts": facts }).to_string()))
    });
    let extra = memory_toml(
        None,
        "\n[memory.consolidation]\nenabled = true\nmin_messages = 2\n\n[[schedule]]\nname = \"tidy\"\nevery = \"1s\"\njob = \"consolidate\"\n",
    );
    let mut d = daemon(&llm, &extra);
    d.start();
    let out = d.agent_send(&[
        "-m",
        "Dora has a cat named Mio",
        "--from",
        "dora",
        "--wait",
        "30",
    ]);
    assert!(out.status.success(), "{}", d.log());
    let fact = wait_until(WAIT, "the extracted fact in memory.db", || {
        db(&d, "memory.db")
            .query_row(
                "SELECT entity, attribute, value, source FROM facts WHERE invalidated_at IS NULL",
                [],
                |r| {
                    let text = |i| r.get::<_, String>(i);
                    Ok([text(0)?, text(1)?, text(2)?, text(3)?])
                },
            )
            .optional()
            .ok()
            .flatten()
    });
    assert_eq!(fact, ["Dora", "pet", "a cat named Mio", "consolidation"]);
    // Two more scheduled runs: the session has nothing new, so it is not sent again.
    let runs = || d.log().matches("scheduled consolidation finished").count();
    let seen = runs();
    wait_until(WAIT, "two more consolidation runs", || {
        (runs() >= seen + 2).then_some(())
    });
    let session_calls = llm
        .requests()
        .iter()
        .filter(|b| is_consolidation(b) && last_user_text(b).contains("Dora has a cat named Mio"))
        .count();
    assert_eq!(session_calls, 1);
    assert!(
        crate::compaction::cost_types(&d.state_dir)
            .iter()
            .any(|t| t == "consolidation")
    );
    assert!(d.sigterm().success());
    let status = agentd(&d, &["index", "--status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["status"]["facts"], 1, "{v}");
}
