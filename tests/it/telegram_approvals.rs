//! Approvals through Telegram (SPEC §18.1) against the fake Bot API: a gated `exec` shows a
//! prompt with three buttons; the command does not run before the yes (a marker file);
//! *Approve* runs it once, *Always in this session* lets the next call through unasked, *Deny*
//! gives the model a denied result, a timeout denies; a button pressed by a user not in
//! `allow_from` is refused; every decision edits the prompt.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{telegram_daemon, telegram_daemon_for};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};
use crate::support::fake_telegram::{FakeTelegram, SentMessage};
use crate::support::wait_until;

const TOKEN: &str = "123456:APPROVALS-secret-token";
const ALICE: i64 = 1001;
const MALLORY: i64 = 2002;
const WAIT: Duration = Duration::from_secs(40);

fn daemon(llm: &FakeLlm, tg: &FakeTelegram, timeout_seconds: u64) -> TestDaemon {
    let channel = format!("poll_timeout_seconds = 1\ncontacts = {{ Alice = {ALICE} }}");
    let sections =
        format!("[approvals]\nrequire = [\"exec\"]\ntimeout_seconds = {timeout_seconds}\n\n");
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

fn exec_touch(id: &str, marker: &Path) -> Reply {
    Reply::tool_calls(vec![(
        id,
        "exec",
        json!({ "command": format!("touch {}", marker.display()) }),
    )])
}

fn prompts(tg: &FakeTelegram) -> Vec<SentMessage> {
    tg.sent()
        .into_iter()
        .filter(|m| m.chat_id == ALICE && !m.buttons.is_empty())
        .collect()
}

/// The `n`th prompt (from 1) once it is sent, and its approval id.
fn wait_prompt(tg: &FakeTelegram, n: usize) -> (SentMessage, String) {
    let p = wait_until(WAIT, &format!("approval prompt {n}"), || {
        prompts(tg).get(n - 1).cloned()
    });
    let id = p.buttons[0]
        .strip_prefix("ap:")
        .and_then(|r| r.strip_suffix(":a"))
        .expect("approve button data")
        .to_string();
    (p, id)
}

fn wait_reply(tg: &FakeTelegram, text: &str) {
    wait_until(WAIT, &format!("reply {text:?}"), || {
        tg.sent_to(ALICE)
            .iter()
            .any(|t| t.contains(text))
            .then_some(())
    });
}

fn answer_of(tg: &FakeTelegram, query: &str) -> String {
    wait_until(WAIT, "answerCallbackQuery", || {
        tg.callback_answers()
            .into_iter()
            .find(|a| a.query_id == query)
            .map(|a| a.text.unwrap_or_default())
    })
}

fn edit_of(tg: &FakeTelegram, message_id: i64) -> String {
    wait_until(WAIT, "the prompt edited", || {
        tg.edits()
            .into_iter()
            .find(|e| e.message_id == message_id)
            .map(|e| {
                assert!(e.buttons.is_empty(), "buttons left on a decided prompt");
                e.text
            })
    })
}

fn model_saw(llm: &FakeLlm, needle: &str) -> bool {
    llm.requests()
        .iter()
        .any(|r| r.to_string().contains(needle))
}

#[test]
fn telegram_buttons_approve_always_deny_and_refuse_strangers() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let tg = FakeTelegram::spawn(TOKEN);
    let mut d = daemon(&llm, &tg, 300);
    let ws = d.workspace();
    let (approved, denied, always1, always2) = (
        ws.join("approved"),
        ws.join("denied"),
        ws.join("always1"),
        ws.join("always2"),
    );

    // Approve, after a stranger's press was refused.
    llm.push(exec_touch("c1", &approved));
    llm.push(Reply::text("first done"));
    tg.push_text(ALICE, ALICE, "run the thing");
    let (prompt, id) = wait_prompt(&tg, 1);
    assert_eq!(
        prompt.buttons,
        vec![
            format!("ap:{id}:a"),
            format!("ap:{id}:s"),
            format!("ap:{id}:d")
        ]
    );
    assert!(prompt.text.contains("exec: touch"), "{}", prompt.text);
    assert!(!approved.exists(), "the command ran before the yes");
    let q = tg.push_callback(MALLORY, ALICE, prompt.message_id, &format!("ap:{id}:a"));
    assert!(answer_of(&tg, &q).contains("not allowed"));
    assert!(!approved.exists(), "a stranger's press ran the command");
    assert!(
        d.trail("Alice")
            .iter()
            .all(|l| l["type"] != "approval_decision"),
        "a stranger's press was recorded as a decision"
    );
    let q = tg.push_callback(ALICE, ALICE, prompt.message_id, &format!("ap:{id}:a"));
    assert_eq!(answer_of(&tg, &q), "Approved.");
    wait_reply(&tg, "first done");
    assert!(approved.exists());
    assert!(edit_of(&tg, prompt.message_id).contains("Approved"));
    // A second press on the decided prompt changes nothing.
    let q = tg.push_callback(ALICE, ALICE, prompt.message_id, &format!("ap:{id}:d"));
    assert!(answer_of(&tg, &q).contains("Already decided"));

    // Deny: the model reads a denied result; the command never runs.
    llm.push(exec_touch("c2", &denied));
    llm.push(Reply::text("second done"));
    tg.push_text(ALICE, ALICE, "run the other thing");
    let (prompt, id) = wait_prompt(&tg, 2);
    let q = tg.push_callback(ALICE, ALICE, prompt.message_id, &format!("ap:{id}:d"));
    assert_eq!(answer_of(&tg, &q), "Denied.");
    wait_reply(&tg, "second done");
    assert!(!denied.exists());
    assert!(model_saw(&llm, "denied by the user"));
    assert!(edit_of(&tg, prompt.message_id).contains("Denied"));

    // Always in this session: this call runs, and the next one runs without a prompt.
    llm.push(exec_touch("c3", &always1));
    llm.push(Reply::text("third done"));
    tg.push_text(ALICE, ALICE, "and again");
    let (prompt, id) = wait_prompt(&tg, 3);
    let q = tg.push_callback(ALICE, ALICE, prompt.message_id, &format!("ap:{id}:s"));
    assert_eq!(answer_of(&tg, &q), "Approved for this session.");
    wait_reply(&tg, "third done");
    assert!(always1.exists());
    llm.push(exec_touch("c4", &always2));
    llm.push(Reply::text("fourth done"));
    tg.push_text(ALICE, ALICE, "once more");
    wait_reply(&tg, "fourth done");
    assert!(always2.exists());
    assert_eq!(prompts(&tg).len(), 3, "the call after Always asked again");

    let decisions: Vec<String> = d
        .trail("Alice")
        .iter()
        .filter(|l| l["type"] == "approval_decision")
        .map(|l| format!("{} {} {}", l["decision"], l["by"], l["channel"]))
        .collect();
    assert_eq!(
        decisions,
        vec![
            format!("\"approve\" \"{ALICE}\" \"telegram\""),
            format!("\"deny\" \"{ALICE}\" \"telegram\""),
            format!("\"always\" \"{ALICE}\" \"telegram\""),
        ]
    );
    assert!(!d.log().contains("APPROVALS-secret-token"));
    assert!(d.sigterm().success());
}

#[test]
fn telegram_prompt_times_out_as_a_deny() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let tg = FakeTelegram::spawn(TOKEN);
    let mut d = daemon(&llm, &tg, 1);
    let late = d.workspace().join("late");
    llm.push(exec_touch("t1", &late));
    llm.push(Reply::text("nobody answered"));
    tg.push_text(ALICE, ALICE, "run it");
    let (prompt, _) = wait_prompt(&tg, 1);
    wait_reply(&tg, "nobody answered");
    assert!(!late.exists());
    assert!(model_saw(&llm, "approval timed out"));
    assert!(edit_of(&tg, prompt.message_id).contains("Timed out"));
    assert!(d.sigterm().success());
}

/// A daemon with Alice and Mallory allowed, `exec` gated, and `extra` lines in `[approvals]`.
fn daemon_two(llm: &FakeLlm, tg: &FakeTelegram, extra: &str) -> TestDaemon {
    let channel =
        format!("poll_timeout_seconds = 1\ncontacts = {{ Alice = {ALICE}, Mallory = {MALLORY} }}");
    let sections = format!("[approvals]\nrequire = [\"exec\"]\n{extra}\n\n");
    telegram_daemon_for(
        llm,
        tg,
        TOKEN,
        &[ALICE, MALLORY],
        &channel,
        &sections,
        "debounce_ms = 50",
    )
}

/// Security round 3, item 14: an allowed user cannot decide another user's approval from her
/// own chat (the press names the approval's id, as a modified client can send any callback
/// data); the prompt and the live view show format characters (a right-to-left override, a
/// zero-width space) as visible escapes, and a summary cut short says so.
#[test]
fn approvals_are_decided_only_in_their_chat_and_hide_no_characters() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let tg = FakeTelegram::spawn(TOKEN);
    let d = daemon_two(&llm, &tg, "");
    let marker = d.workspace().join("marker");
    let command = format!(
        "touch {} # harmless\u{202E}fdp.exe\u{200B} {}",
        marker.display(),
        "x".repeat(300)
    );
    llm.push(Reply::tool_calls(vec![(
        "c1",
        "exec",
        json!({ "command": command }),
    )]));
    llm.push(Reply::text("all done"));
    tg.push_text(ALICE, ALICE, "run the thing");
    let (prompt, id) = wait_prompt(&tg, 1);
    eprintln!("prompt: {}", prompt.text);
    assert!(
        !prompt.text.contains('\u{202E}') && !prompt.text.contains('\u{200B}'),
        "format characters reach the person: {:?}",
        prompt.text
    );
    assert!(
        prompt.text.contains("\\u{202e}") && prompt.text.contains("\\u{200b}"),
        "{}",
        prompt.text
    );
    assert!(prompt.text.contains("… (cut)"), "{}", prompt.text);
    let view = std::fs::read_to_string(d.state_dir.join("approvals.json")).unwrap();
    assert!(!view.contains('\u{202E}'), "{view}");

    // Mallory is allowed, but the prompt was offered in Alice's chat.
    let q = tg.push_callback(MALLORY, MALLORY, prompt.message_id, &format!("ap:{id}:a"));
    let answer = answer_of(&tg, &q);
    eprintln!("Mallory's press from her own chat: {answer:?}");
    assert!(answer.contains("not allowed"), "{answer}");
    assert!(!marker.exists(), "another chat's press ran the command");
    assert!(
        d.trail("Alice")
            .iter()
            .all(|l| l["type"] != "approval_decision"),
        "another chat's press was recorded as a decision"
    );
    let q = tg.push_callback(ALICE, ALICE, prompt.message_id, &format!("ap:{id}:d"));
    assert_eq!(answer_of(&tg, &q), "Denied.");
    wait_reply(&tg, "all done");
}

/// `[approvals] approvers`: a listed user decides from any chat; an allowed user who is not
/// listed still cannot.
#[test]
fn a_listed_approver_decides_from_her_own_chat() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let tg = FakeTelegram::spawn(TOKEN);
    let mut d = daemon_two(&llm, &tg, &format!("approvers = [{MALLORY}]"));
    let marker = d.workspace().join("approved");
    llm.push(exec_touch("c1", &marker));
    llm.push(Reply::text("done"));
    tg.push_text(ALICE, ALICE, "run the thing");
    let (prompt, id) = wait_prompt(&tg, 1);
    let q = tg.push_callback(MALLORY, MALLORY, prompt.message_id, &format!("ap:{id}:a"));
    assert_eq!(answer_of(&tg, &q), "Approved.");
    wait_reply(&tg, "done");
    let decided: Vec<String> = d
        .trail("Alice")
        .iter()
        .filter(|l| l["type"] == "approval_decision")
        .map(|l| format!("{} {}", l["decision"], l["by"]))
        .collect();
    assert_eq!(decided, vec![format!("\"approve\" \"{MALLORY}\"")]);
    assert!(d.sigterm().success());
}
