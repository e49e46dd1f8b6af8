//! The delivery outbox (SPEC §16.1) against the fake Bot API: sends that fail, then recover,
//! arrive exactly once and in order; a 400 that is not an HTML problem fails at once and is
//! recorded `failed`; every part has `attempt` and `sent` records.

use std::time::Duration;

use crate::support::daemon::TestDaemon;
use crate::support::e2e::telegram_daemon;
use crate::support::fake_llm::{FakeLlm, Reply, Wire};
use crate::support::fake_telegram::FakeTelegram;
use crate::support::wait_until;

const TOKEN: &str = "123456:TEST-secret-token";
const ALICE: i64 = 1001;
const WAIT: Duration = Duration::from_secs(40);

fn daemon(llm: &FakeLlm, tg: &FakeTelegram, chunk_limit: usize) -> TestDaemon {
    daemon_with(llm, tg, chunk_limit, "")
}

/// [`daemon`] with more config sections.
fn daemon_with(llm: &FakeLlm, tg: &FakeTelegram, chunk_limit: usize, extra: &str) -> TestDaemon {
    let channel = format!(
        "poll_timeout_seconds = 1\nformat = \"plain\"\ntext_chunk_limit = {chunk_limit}\ncontacts = {{ Alice = {ALICE} }}"
    );
    let sections = format!("[delivery]\nretry_minutes = 1\n\n{extra}");
    telegram_daemon(
        llm,
        tg,
        TOKEN,
        ALICE,
        &channel,
        &sections,
        "debounce_ms = 50",
    )
}

fn sent_to(tg: &FakeTelegram, chat: i64) -> Vec<String> {
    tg.sent_to(chat)
}

fn statuses(d: &TestDaemon) -> Vec<String> {
    d.trail("Alice")
        .iter()
        .filter(|l| l["type"] == "delivery")
        .map(|l| l["status"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn wait_closed(d: &TestDaemon) -> Vec<String> {
    wait_until(WAIT, "the delivery is closed", || {
        let s = statuses(d);
        s.iter()
            .any(|s| s == "done" || s == "failed" || s == "unknown")
            .then_some(s)
    })
}

#[test]
fn outbox_502_three_times_then_works_arrives_once() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("Hello Alice!"));
    let tg = FakeTelegram::spawn(TOKEN);
    tg.fail_next_send(3, 502);
    let d = daemon(&llm, &tg, 4096);
    let started = std::time::Instant::now();
    tg.push_text(ALICE, ALICE, "hi bot");
    let s = wait_closed(&d);
    assert_eq!(sent_to(&tg, ALICE), vec!["Hello Alice!".to_string()]);
    assert_eq!(tg.served_send_failures(), 3);
    assert_eq!(s, vec!["intent", "attempt", "sent", "done"], "{s:?}");
    // Our backoff sets the pace, not teloxide's 10 s sleep after every 5xx.
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "{:?}",
        started.elapsed()
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(sent_to(&tg, ALICE).len(), 1, "exactly once");
}

#[test]
fn outbox_part_two_fails_twice_each_part_once_in_order() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let parts = ["First part here.", "Second part here.", "Third part here."];
    llm.push(Reply::text(parts.join("\n\n")));
    let tg = FakeTelegram::spawn(TOKEN);
    // Part 1 goes through; then the next two sends (part 2's first tries) fail.
    tg.fail_send_after(1, 2, 502);
    let d = daemon(&llm, &tg, 20);
    tg.push_text(ALICE, ALICE, "three parts please");
    let s = wait_closed(&d);
    let got: Vec<String> = sent_to(&tg, ALICE)
        .iter()
        .map(|p| p.trim().to_string())
        .collect();
    assert_eq!(got, parts.map(String::from).to_vec(), "{s:?}");
    assert_eq!(tg.served_send_failures(), 2);
    let sent = s.iter().filter(|s| *s == "sent").count();
    let attempts = s.iter().filter(|s| *s == "attempt").count();
    assert_eq!((attempts, sent), (3, 3), "{s:?}");
}

#[test]
fn outbox_other_400_fails_at_once_and_is_recorded() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("Hello Alice!"));
    let tg = FakeTelegram::spawn(TOKEN);
    tg.fail_next_send(1, 400);
    let d = daemon(&llm, &tg, 4096);
    tg.push_text(ALICE, ALICE, "hi bot");
    let s = wait_closed(&d);
    assert_eq!(s, vec!["intent", "attempt", "failed"], "{s:?}");
    assert!(sent_to(&tg, ALICE).is_empty());
    assert_eq!(tg.served_send_failures(), 1, "not retried");
    // Counted in the monitor.
    wait_until(WAIT, "the failed delivery in monitor.json", || {
        let text = std::fs::read_to_string(d.state_dir.join("monitor.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        (v["deliveries"]["failed"] == 1 && v["deliveries"]["pending"] == 0).then_some(())
    });
}

/// Removes the trailing `delivery` records of the session `key`'s last trail file: the state a
/// kill -9 leaves when it falls between the final record and the delivery intent.
fn strip_trailing_deliveries(d: &TestDaemon, key: &str) {
    let id = d.session_id(key).expect("session");
    let mut files: Vec<_> = std::fs::read_dir(d.sessions_dir())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{id}.")) && n.ends_with(".jsonl"))
        })
        .collect();
    files.sort();
    let last = files.last().expect("a trail file");
    let text = std::fs::read_to_string(last).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    while lines.last().is_some_and(|l| {
        serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| v["type"] == "delivery")
    }) {
        lines.pop();
    }
    std::fs::write(
        last,
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
}

/// Drive one reply to Alice to the point where its send hangs, kill -9, take the delivery
/// records away (the kill fell before the intent), restart with Telegram holding every send:
/// READY comes anyway; once Telegram answers, the reply arrives exactly once.
fn kill9_before_the_intent(
    replies: Vec<Reply>,
    trigger: impl FnOnce(&TestDaemon, &FakeTelegram),
    want: &str,
) {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    for r in replies {
        llm.push(r);
    }
    let tg = FakeTelegram::spawn(TOKEN);
    tg.hang_next_sends(1);
    let mut d = daemon(&llm, &tg, 4096);
    trigger(&d, &tg);
    wait_until(WAIT, "the send in flight", || {
        let trail = d.trail("Alice");
        let final_reply = trail
            .iter()
            .any(|l| l["final"] == true && l["text"].as_str().is_some_and(|t| t.contains(want)));
        let attempt = trail
            .iter()
            .any(|l| l["type"] == "delivery" && l["status"] == "attempt");
        let requested = tg.requests().iter().any(|(m, _)| m == "sendmessage");
        (final_reply && attempt && requested).then_some(())
    });
    d.kill9();
    strip_trailing_deliveries(&d, "Alice");
    tg.hold_sends(true);
    d.start();
    // READY while Telegram holds the send.
    wait_until(WAIT, "READY", || {
        d.log().matches("agentd ready").count().ge(&2).then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(sent_to(&tg, ALICE).is_empty(), "nothing sent while held");
    tg.hold_sends(false);
    wait_until(WAIT, "the reply after the restart", || {
        sent_to(&tg, ALICE)
            .iter()
            .any(|m| m.contains(want))
            .then_some(())
    });
    wait_closed(&d);
    std::thread::sleep(Duration::from_millis(500));
    let sent = sent_to(&tg, ALICE);
    assert_eq!(
        sent.iter().filter(|m| m.contains(want)).count(),
        1,
        "{sent:?}"
    );
    d.kill9();
}

#[test]
fn outbox_kill9_before_intent_telegram_reply_delivered_once() {
    kill9_before_the_intent(
        vec![Reply::text("Reply to Alice.")],
        |_, tg| {
            tg.push_text(ALICE, ALICE, "hi bot");
        },
        "Reply to Alice.",
    );
}

#[test]
fn outbox_kill9_before_intent_fifo_contact_reply_delivered_once() {
    kill9_before_the_intent(
        vec![Reply::text("Reply to Alice.")],
        |d, _| {
            crate::support::e2e::fifo_write(
                d,
                r#"{"id":"f1","type":"user","text":"hello from the cli","sender":"Alice"}"#,
            );
        },
        "Reply to Alice.",
    );
}

#[test]
fn outbox_kill9_before_intent_scheduled_message_delivered_once() {
    kill9_before_the_intent(
        vec![
            Reply::tool_calls(vec![(
                "c1",
                "schedule_message",
                serde_json::json!({"target": "Alice", "text": "Reminder: stretch!", "delay_seconds": 1}),
            )]),
            Reply::text("Scheduled."),
        ],
        |d, _| {
            crate::support::e2e::fifo_write(
                d,
                r#"{"id":"s1","type":"user","text":"remind Alice to stretch","sender":"ops"}"#,
            );
        },
        "Reminder: stretch!",
    );
}

#[test]
fn outbox_kill9_after_the_attempt_is_not_sent_again() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("Maybe delivered."));
    let tg = FakeTelegram::spawn(TOKEN);
    tg.hang_next_sends(1);
    let mut d = daemon(&llm, &tg, 4096);
    tg.push_text(ALICE, ALICE, "hi bot");
    wait_until(WAIT, "the send in flight", || {
        let attempt = d
            .trail("Alice")
            .iter()
            .any(|l| l["type"] == "delivery" && l["status"] == "attempt");
        let requested = tg.requests().iter().any(|(m, _)| m == "sendmessage");
        (attempt && requested).then_some(())
    });
    d.kill9();
    d.start();
    wait_until(WAIT, "the at-most-once warning", || {
        d.log()
            .contains("a part was being sent when agentd stopped")
            .then_some(())
    });
    let s = wait_closed(&d);
    assert_eq!(s.last().map(String::as_str), Some("unknown"), "{s:?}");
    std::thread::sleep(Duration::from_millis(500));
    let sent = sent_to(&tg, ALICE);
    assert!(
        !sent.iter().any(|m| m.contains("Maybe delivered.")),
        "never sent twice: {sent:?}"
    );
    // Alice is told the reply may be incomplete (SPEC §16.1: the attempted part is skipped).
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(sent[0].contains("may be missing"), "{sent:?}");
    d.kill9();
}

/// `sendMessage` calls whose text contains `text`, answered or not.
fn send_requests_with(tg: &FakeTelegram, text: &str) -> usize {
    tg.requests()
        .iter()
        .filter(|(m, p)| m == "sendmessage" && p["text"].as_str().is_some_and(|t| t.contains(text)))
        .count()
}

/// Issue 33: the live path of the at-most-once rule (SPEC §16.1), without a restart. A send
/// Telegram never answers ends at the send timeout (`poll_timeout_seconds` + 15 s: 16 s
/// here), is recorded `unknown` and never sent again; the next message of the same chat,
/// which arrived while the send hung, still gets its reply.
#[test]
fn outbox_send_timeout_while_running_is_unknown_and_not_resent() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("Maybe delivered."));
    llm.push(Reply::text("Second reply."));
    let tg = FakeTelegram::spawn(TOKEN);
    tg.hang_next_sends(1);
    let d = daemon(&llm, &tg, 4096);
    tg.push_text(ALICE, ALICE, "hi bot");
    wait_until(WAIT, "the send in flight", || {
        (statuses(&d).iter().any(|s| s == "attempt")
            && send_requests_with(&tg, "Maybe delivered.") == 1)
            .then_some(())
    });
    tg.push_text(ALICE, ALICE, "still there?");
    let s = wait_until(Duration::from_secs(90), "the timed-out send closed", || {
        let s = statuses(&d);
        s.iter().any(|s| s == "unknown").then_some(s)
    });
    assert_eq!(s[..3], ["intent", "attempt", "unknown"], "{s:?}");
    assert!(!s.iter().any(|s| s == "failed"), "{s:?}");
    wait_until(WAIT, "the second reply", || {
        sent_to(&tg, ALICE)
            .iter()
            .any(|m| m == "Second reply.")
            .then_some(())
    });
    let s = wait_until(WAIT, "the second delivery done", || {
        let s = statuses(&d);
        s.iter().any(|s| s == "done").then_some(s)
    });
    assert_eq!(s.iter().filter(|s| *s == "unknown").count(), 1, "{s:?}");
    assert_eq!(s.iter().filter(|s| *s == "intent").count(), 2, "{s:?}");
    assert_eq!(
        send_requests_with(&tg, "Maybe delivered."),
        1,
        "the timed-out part is never sent again"
    );
    assert_eq!(sent_to(&tg, ALICE), ["Second reply."]);
    assert_eq!(
        llm.requests().len(),
        2,
        "each message reached the model once: nothing was run again"
    );
}

#[test]
fn outbox_retrying_delivery_does_not_hold_the_next_message() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("First reply."));
    llm.push(Reply::text("Second reply."));
    let tg = FakeTelegram::spawn(TOKEN);
    // About 15 s of backoff before the first reply gets through.
    tg.fail_next_send(5, 502);
    let d = daemon(&llm, &tg, 4096);
    tg.push_text(ALICE, ALICE, "one");
    wait_until(WAIT, "the first reply recorded", || {
        d.trail("Alice")
            .iter()
            .any(|l| l["final"] == true)
            .then_some(())
    });
    tg.push_text(ALICE, ALICE, "two");
    wait_until(WAIT, "the second model call", || {
        (llm.requests().len() >= 2).then_some(())
    });
    // The order shows it: the second message reached the model while the first reply had
    // not been delivered yet.
    assert!(
        sent_to(&tg, ALICE).is_empty(),
        "the second message waited for the first delivery"
    );
    let got = wait_until(WAIT, "both replies", || {
        let s = sent_to(&tg, ALICE);
        (s.len() >= 2).then_some(s)
    });
    assert_eq!(got, vec!["First reply.", "Second reply."], "in order");
}

// ---- the message and react tools (SPEC §16.1: one outbox for every send) ----

/// A FIFO message from `ops` (not a contact: its own reply goes nowhere) whose turn calls
/// the `message` tool with `args`, then answers "Done.".
fn message_tool_turn(llm: &FakeLlm, args: serde_json::Value) {
    llm.push(Reply::tool_calls(vec![("c1", "message", args)]));
    llm.push(Reply::text("Done."));
}

fn ask_ops(d: &TestDaemon, id: &str) {
    crate::support::e2e::fifo_write(
        d,
        &format!(r#"{{"id":"{id}","type":"user","text":"tell Alice","sender":"ops"}}"#),
    );
}

/// The text of every tool result in the trail of `key`.
fn tool_results(d: &TestDaemon, key: &str) -> Vec<String> {
    d.trail(key)
        .iter()
        .filter_map(|l| l["results"].as_array().cloned())
        .flatten()
        .map(|r| r.to_string())
        .collect()
}

fn wait_done(d: &TestDaemon, key: &str) {
    wait_until(WAIT, "the turn's final answer", || {
        d.trail(key)
            .iter()
            .any(|l| l["final"] == true)
            .then_some(())
    });
}

fn requests_of(tg: &FakeTelegram, method: &str) -> usize {
    tg.requests().iter().filter(|(m, _)| m == method).count()
}

#[test]
fn outbox_message_tool_502_twice_then_ok_is_delivered_once() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    message_tool_turn(
        &llm,
        serde_json::json!({"target": "Alice", "text": "Hello from the tool."}),
    );
    let tg = FakeTelegram::spawn(TOKEN);
    tg.fail_next_send(2, 502);
    let d = daemon(&llm, &tg, 4096);
    ask_ops(&d, "m1");
    wait_done(&d, "ops");
    assert_eq!(
        sent_to(&tg, ALICE),
        vec!["Hello from the tool.".to_string()]
    );
    assert_eq!(tg.served_send_failures(), 2);
    assert_eq!(requests_of(&tg, "sendmessage"), 3, "retried by the tool");
    let results = tool_results(&d, "ops");
    assert!(
        results.iter().any(|r| r.contains("done (1 of 1 to Alice)")),
        "{results:?}"
    );
    // Recorded like a reply, under the tool's key.
    let s: Vec<String> = d
        .trail("ops")
        .iter()
        .filter(|l| l["type"] == "delivery")
        .map(|l| l["status"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(s, ["intent", "attempt", "sent", "done"], "{s:?}");
}

#[test]
fn outbox_message_tool_400_is_a_tool_error_at_once() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    message_tool_turn(
        &llm,
        serde_json::json!({"target": "Alice", "text": "Refused."}),
    );
    let tg = FakeTelegram::spawn(TOKEN);
    tg.fail_next_send(1, 400);
    let d = daemon(&llm, &tg, 4096);
    ask_ops(&d, "m1");
    wait_done(&d, "ops");
    assert!(sent_to(&tg, ALICE).is_empty());
    assert_eq!(tg.served_send_failures(), 1, "not retried");
    assert_eq!(requests_of(&tg, "sendmessage"), 1);
    let results = tool_results(&d, "ops");
    assert!(
        results
            .iter()
            .any(|r| r.contains("not delivered") && r.contains("400")),
        "{results:?}"
    );
}

/// Files go by our own multipart request: a 502 is retried by the outbox's backoff (the fake
/// sees the second request), not slept through by teloxide, and each file arrives once.
#[test]
fn outbox_message_tool_files_502_then_ok_arrive_once() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    message_tool_turn(
        &llm,
        serde_json::json!({"target": "Alice", "attachments": ["chart.png", "report.pdf"]}),
    );
    let tg = FakeTelegram::spawn(TOKEN);
    let d = daemon(&llm, &tg, 4096);
    std::fs::write(d.workspace().join("chart.png"), b"\x89PNG fake").unwrap();
    std::fs::write(d.workspace().join("report.pdf"), b"%PDF-1.7 fake").unwrap();
    // The photo goes through; the document's first two tries fail.
    tg.fail_send_after(1, 2, 502);
    ask_ops(&d, "m1");
    wait_done(&d, "ops");
    let files = tg.sent_files();
    let methods: Vec<&str> = files.iter().map(|f| f.method.as_str()).collect();
    assert_eq!(
        methods,
        ["sendphoto", "senddocument"],
        "each once, in order"
    );
    assert_eq!(files[0].bytes, b"\x89PNG fake");
    assert_eq!(files[1].file_name.as_deref(), Some("report.pdf"));
    assert_eq!(tg.served_send_failures(), 2);
    assert_eq!(requests_of(&tg, "sendphoto"), 1);
    assert_eq!(
        requests_of(&tg, "senddocument"),
        3,
        "the document was retried"
    );
    let results = tool_results(&d, "ops");
    assert!(
        results.iter().any(|r| r.contains("done (2 of 2 to Alice)")),
        "{results:?}"
    );
}

/// kill -9 while the tool's send is in flight (its `attempt` recorded): after the restart the
/// turn resumes, the model asks for the same send again, and the part is not sent twice; the
/// model is told it may or may not have been delivered.
#[test]
fn outbox_kill9_inside_the_message_tool_is_not_sent_again() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let args = serde_json::json!({"target": "Alice", "text": "Only once, please."});
    llm.push(Reply::tool_calls(vec![("c1", "message", args.clone())]));
    // After the restart: the repaired turn, and the same call again.
    llm.push(Reply::tool_calls(vec![("c2", "message", args)]));
    llm.push(Reply::text("Done."));
    let tg = FakeTelegram::spawn(TOKEN);
    tg.hang_next_sends(1);
    let mut d = daemon(&llm, &tg, 4096);
    ask_ops(&d, "m1");
    wait_until(WAIT, "the tool's send in flight", || {
        let attempt = d.trail("ops").iter().any(|l| {
            l["type"] == "delivery"
                && l["status"] == "attempt"
                && l["reply_to"][0]
                    .as_str()
                    .is_some_and(|k| k.starts_with("tool-"))
        });
        (attempt && requests_of(&tg, "sendmessage") == 1).then_some(())
    });
    d.kill9();
    d.start();
    wait_done(&d, "ops");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(requests_of(&tg, "sendmessage"), 1, "never sent again");
    assert!(sent_to(&tg, ALICE).is_empty());
    let results = tool_results(&d, "ops");
    assert!(
        results
            .iter()
            .any(|r| r.contains("may or may not have been delivered")),
        "{results:?}"
    );
    d.kill9();
}

// ---- a session archived while its last reply is delivered (SPEC §16.1, §16.3) ----

/// The `delivery` statuses and the `reset` of the archived trail of session `id`, in order.
fn archived_events(d: &TestDaemon, id: &str) -> Vec<String> {
    crate::support::daemon::read_trail_files(&d.sessions_dir().join(".archive"), id)
        .iter()
        .filter_map(|l| match l["type"].as_str() {
            Some("delivery") => l["status"].as_str().map(String::from),
            Some("reset") => Some("reset".into()),
            _ => None,
        })
        .collect()
}

/// Drive a reply to Alice into a retrying delivery, run `archive` (a /reset, or nothing and
/// let retention expire the session), and check the archived trail: the delivery closed
/// before the session was archived, and the reply went out once, also after a restart.
fn archive_during_delivery(extra: &str, archive: impl FnOnce(&FakeTelegram)) {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("Before the reset."));
    let tg = FakeTelegram::spawn(TOKEN);
    // Several seconds of backoff, with nothing written to the trail meanwhile.
    tg.fail_next_send(4, 502);
    let mut d = daemon_with(&llm, &tg, 4096, extra);
    tg.push_text(ALICE, ALICE, "hi bot");
    wait_until(WAIT, "the delivery retrying", || {
        (tg.served_send_failures() >= 1).then_some(())
    });
    let id = d.session_id("Alice").expect("session");
    archive(&tg);
    let events = wait_until(WAIT, "the session archived", || {
        let e = archived_events(&d, &id);
        e.contains(&"reset".to_string()).then_some(e)
    });
    let reset_at = events.iter().position(|e| e == "reset").unwrap();
    let done_at = events.iter().position(|e| e == "done");
    assert!(
        done_at.is_some_and(|i| i < reset_at),
        "the delivery closed before the archive: {events:?}"
    );
    let mine = |tg: &FakeTelegram| {
        sent_to(tg, ALICE)
            .iter()
            .filter(|m| m.contains("Before the reset."))
            .count()
    };
    assert_eq!(mine(&tg), 1);
    d.kill9();
    d.start();
    wait_until(WAIT, "READY", || {
        d.log().matches("agentd ready").count().ge(&2).then_some(())
    });
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(mine(&tg), 1, "not resent after the restart");
    d.kill9();
}

#[test]
fn outbox_reset_waits_for_the_last_reply_to_be_delivered() {
    archive_during_delivery("", |tg| {
        tg.push_text(ALICE, ALICE, "/reset");
    });
}

#[test]
fn outbox_idle_expiry_skips_a_session_whose_reply_is_being_delivered() {
    archive_during_delivery("[retention]\nidle_session_after = \"1s\"\n\n", |_| {});
}

/// A delivered reply leaves its session settled at its last line (the `done` record), so the
/// next start reads neither its trail for recovery nor for open deliveries; while the reply
/// was still being delivered the mark was not written.
#[test]
fn outbox_a_delivered_session_is_settled_at_its_done_record() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("Hello Alice!"));
    let tg = FakeTelegram::spawn(TOKEN);
    tg.fail_next_send(2, 502);
    let d = daemon(&llm, &tg, 4096);
    tg.push_text(ALICE, ALICE, "hi bot");
    wait_closed(&d);
    let id = d.session_id("Alice").expect("Alice's session");
    let last_seq = || {
        d.trail("Alice")
            .last()
            .and_then(|l| l["seq"].as_u64())
            .expect("a trail line with seq")
    };
    let mark = d.state_dir.join("sessions").join(format!("{id}.settled"));
    crate::support::wait_until(WAIT, "the settled mark at the done record", || {
        let m: u64 = std::fs::read_to_string(&mark).ok()?.trim().parse().ok()?;
        (m == last_seq()).then_some(())
    });
    assert_eq!(
        d.trail("Alice").last().unwrap()["status"],
        "done",
        "the mark names the delivery's done record"
    );
}
