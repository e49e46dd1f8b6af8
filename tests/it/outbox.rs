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
    let channel = format!(
        "poll_timeout_seconds = 1\nformat = \"plain\"\ntext_chunk_limit = {chunk_limit}\ncontacts = {{ Alice = {ALICE} }}"
    );
    let sections = "[delivery]\nretry_minutes = 1\n\n";
    telegram_daemon(
        llm,
        tg,
        TOKEN,
        ALICE,
        &channel,
        sections,
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
    let started = std::time::Instant::now();
    tg.push_text(ALICE, ALICE, "hi bot");
    let s = wait_closed(&d);
    assert_eq!(s, vec!["intent", "attempt", "failed"], "{s:?}");
    assert!(sent_to(&tg, ALICE).is_empty());
    assert_eq!(tg.served_send_failures(), 1, "not retried");
    assert!(started.elapsed() < Duration::from_secs(15));
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
    std::thread::sleep(Duration::from_millis(500));
    assert!(sent_to(&tg, ALICE).is_empty(), "never sent twice");
    let s = wait_closed(&d);
    assert_eq!(s.last().map(String::as_str), Some("unknown"), "{s:?}");
    d.kill9();
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
    let t = std::time::Instant::now();
    tg.push_text(ALICE, ALICE, "two");
    wait_until(WAIT, "the second model call", || {
        (llm.requests().len() >= 2).then_some(())
    });
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "the second message waited for the first delivery: {:?}",
        t.elapsed()
    );
    assert!(
        sent_to(&tg, ALICE).is_empty(),
        "the first reply still retries"
    );
    let got = wait_until(WAIT, "both replies", || {
        let s = sent_to(&tg, ALICE);
        (s.len() >= 2).then_some(s)
    });
    assert_eq!(got, vec!["First reply.", "Second reply."], "in order");
}
