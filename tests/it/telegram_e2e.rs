//! The real daemon against the fake Bot API (issue: channels, must-show 1): allowed users get
//! the model's reply, others get nothing (and are logged with their id), long replies arrive
//! split within the limit, 409 storms are survived, and a restart in the middle of a
//! conversation neither loses nor repeats a message.

use std::time::Duration;

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, provider_toml, telegram_daemon, telegram_daemon_for};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};
use crate::support::fake_telegram::FakeTelegram;
use crate::support::wait_until;

const TOKEN: &str = "123456:TEST-secret-token";
const ALICE: i64 = 1001;
const MALLORY: i64 = 2002;
const WAIT: Duration = Duration::from_secs(40);

fn daemon(llm: &FakeLlm, tg: &FakeTelegram, format: &str) -> TestDaemon {
    let channel = format!(
        "poll_timeout_seconds = 1\nformat = \"{format}\"\ncontacts = {{ Alice = {ALICE} }}"
    );
    telegram_daemon(llm, tg, TOKEN, ALICE, &channel, "", "debounce_ms = 50")
}

fn sent_to(tg: &FakeTelegram, chat: i64) -> Vec<String> {
    tg.sent_to(chat)
}

#[test]
fn allowed_user_gets_the_reply_and_others_get_nothing() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("Hello **Alice**!"));
    let tg = FakeTelegram::spawn(TOKEN);
    let d = daemon(&llm, &tg, "html");
    tg.push_text(MALLORY, MALLORY, "let me in");
    tg.push_text(ALICE, ALICE, "hi bot");
    wait_until(WAIT, "reply to Alice", || {
        (!sent_to(&tg, ALICE).is_empty()).then_some(())
    });
    let got = sent_to(&tg, ALICE);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].contains("Hello") && got[0].contains("Alice"),
        "{got:?}"
    );
    assert!(sent_to(&tg, MALLORY).is_empty());
    assert_eq!(
        llm.requests().len(),
        1,
        "only Alice's message reached the model"
    );
    d.wait_log(&MALLORY.to_string());
    assert!(!d.log().contains("TEST-secret-token"), "token never logged");
    // The session is keyed by the contact name and the trail records the delivery.
    // (the `done` record is written right after the send returns)
    wait_until(WAIT, "delivery done record", || {
        d.trail("Alice")
            .iter()
            .any(|l| l["type"] == "delivery" && l["status"] == "done")
            .then_some(())
    });
    assert!(!tg.actions().is_empty(), "typing indicator sent");
}

#[test]
fn long_reply_is_split_within_the_limit() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let para = "The quick brown fox jumps over the lazy dog. ".repeat(20);
    let long: String = (0..10).map(|i| format!("Part {i}. {para}\n\n")).collect();
    let long = long[..9000.min(long.len())].to_string();
    llm.push(Reply::text(long.clone()));
    let tg = FakeTelegram::spawn(TOKEN);
    let _d = daemon(&llm, &tg, "plain");
    tg.push_text(ALICE, ALICE, "tell me a long story");
    let chunks = wait_until(WAIT, "the split reply", || {
        let s = sent_to(&tg, ALICE);
        let total: usize = s
            .iter()
            .map(|c| c.chars().filter(|c| !c.is_whitespace()).count())
            .sum();
        let want = long.chars().filter(|c| !c.is_whitespace()).count();
        (total >= want).then_some(s)
    });
    assert!(chunks.len() >= 3, "{} chunks", chunks.len());
    for c in &chunks {
        assert!(c.encode_utf16().count() <= 4096);
    }
    let squash = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    assert_eq!(squash(&chunks.concat()), squash(&long));
}

#[test]
fn conflict_storm_is_survived() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let tg = FakeTelegram::spawn(TOKEN);
    tg.fail_next(4, 409);
    let _d = daemon(&llm, &tg, "plain");
    tg.push_text(ALICE, ALICE, "are you there?");
    wait_until(WAIT, "reply after the 409 storm", || {
        (!sent_to(&tg, ALICE).is_empty()).then_some(())
    });
    // The storm really happened: every injected 409 was answered before the reply.
    assert_eq!(tg.served_failures(409), 4);
}

#[test]
fn restart_mid_conversation_neither_loses_nor_repeats() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::Hang);
    llm.push(Reply::text("answer one"));
    llm.push(Reply::text("answer two"));
    let tg = FakeTelegram::spawn(TOKEN);
    let mut d = daemon(&llm, &tg, "plain");
    tg.push_text(ALICE, ALICE, "first question");
    wait_until(WAIT, "the model call", || {
        (llm.requests().len() == 1).then_some(())
    });
    d.kill9();
    d.start();
    wait_until(WAIT, "answer one", || {
        sent_to(&tg, ALICE)
            .iter()
            .any(|m| m.contains("answer one"))
            .then_some(())
    });
    tg.push_text(ALICE, ALICE, "second question");
    wait_until(WAIT, "answer two", || {
        sent_to(&tg, ALICE)
            .iter()
            .any(|m| m.contains("answer two"))
            .then_some(())
    });
    let sent = sent_to(&tg, ALICE);
    assert_eq!(
        sent,
        vec!["answer one".to_string(), "answer two".to_string()],
        "{sent:?}"
    );
    let trail = d.trail("Alice");
    let intakes = trail.iter().filter(|l| l["type"] == "intake").count();
    assert_eq!(
        intakes, 2,
        "the first update is not taken in twice: {trail:#?}"
    );
}

/// A 5xx from the Bot API and a poll that never answers: the daemon's poller backs off,
/// detects the hung poll, restarts it, and the message still gets its reply.
#[test]
fn server_error_and_hanging_poll_are_survived() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let tg = FakeTelegram::spawn(TOKEN);
    tg.fail_next(1, 502);
    tg.hang_next_poll();
    let d = daemon(&llm, &tg, "plain");
    tg.push_text(ALICE, ALICE, "still alive?");
    wait_until(
        Duration::from_secs(120),
        "reply after a 502 and a hung poll",
        || (!sent_to(&tg, ALICE).is_empty()).then_some(()),
    );
    // Written by the monitor's own thread: wait for the newest state.
    let mon: serde_json::Value = wait_until(Duration::from_secs(30), "telegram health", || {
        let bytes = std::fs::read(d.state_dir.join("monitor.json")).ok()?;
        serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .filter(|m| m["channels"]["telegram"]["last_poll_ok_at"].is_string())
    });
    let health = &mon["channels"]["telegram"];
    assert!(health["last_poll_ok_at"].is_string(), "{mon}");
    assert!(
        health["restarts"].as_u64().unwrap_or(0) >= 1,
        "hung poll restarted: {mon}"
    );
}

/// A photo from Telegram is downloaded into inbox/, routed to the `vision` model and passed as
/// an image block for that message's calls only; later requests carry the text placeholder.
#[test]
fn photo_goes_to_the_vision_model_once() {
    use base64::Engine;
    let llm = FakeLlm::spawn(Wire::Anthropic);
    let tg = FakeTelegram::spawn(TOKEN);
    let providers = format!(
        "{}\n[models.vision]\nmodel = \"fake-vision\"\nsupports_vision = true\n",
        provider_toml("anthropic", &llm.base_url())
    );
    let toml = agentd_toml("fake").replace(
        "[behavior]",
        &format!(
            "[channel.telegram]\nenabled = true\napi_url = \"{}\"\nallow_from = [{ALICE}]\npoll_timeout_seconds = 1\nformat = \"plain\"\ncontacts = {{ Alice = {ALICE} }}\n\n[behavior]\ndebounce_ms = 50",
            tg.api_url()
        ),
    );
    let mut d = TestDaemon::new(&toml, &[("fake", &providers)]);
    d.set_env("AGENTD_TELEGRAM_TOKEN", TOKEN);
    d.start();
    let png = b"\x89PNG\r\n\x1a\nfake-png-bytes".to_vec();
    tg.push_photo(ALICE, ALICE, &png, Some("what is this?"));
    wait_until(WAIT, "reply to the photo", || {
        (!sent_to(&tg, ALICE).is_empty()).then_some(())
    });
    tg.push_text(ALICE, ALICE, "and now?");
    wait_until(WAIT, "second reply", || {
        (sent_to(&tg, ALICE).len() == 2).then_some(())
    });
    let reqs = llm.requests();
    assert_eq!(reqs[0]["model"], "fake-vision");
    let first = serde_json::to_string(&reqs[0]["messages"]).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&png);
    assert!(first.contains(&b64), "image block sent: {first}");
    assert!(first.contains("what is this?"));
    assert_eq!(reqs[1]["model"], "fake-model");
    let second = serde_json::to_string(&reqs[1]["messages"]).unwrap();
    assert!(!second.contains(&b64), "image not re-sent");
    assert!(second.contains("[image: "), "placeholder instead: {second}");
    // Never persisted: the trail has no image data.
    let trail = serde_json::to_string(&d.trail("Alice")).unwrap();
    assert!(!trail.contains(&b64));
}

/// `agentd doctor` checks Telegram with getMe against the configured API.
#[test]
fn doctor_checks_telegram_get_me() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let tg = FakeTelegram::spawn(TOKEN);
    let toml = agentd_toml("fake").replace(
        "[behavior]",
        &format!(
            "[channel.telegram]\nenabled = true\napi_url = \"{}\"\nallow_from = [{ALICE}]\n\n[behavior]",
            tg.api_url()
        ),
    );
    let d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("openai", &llm.base_url()))],
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["doctor", "-c"])
        .arg(&d.config_path)
        .env("AGENTD_STATE_DIR", &d.state_dir)
        .env("AGENTD_TELEGRAM_TOKEN", TOKEN)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(table.contains("PASS  telegram getMe"), "{table}");
    assert!(!table.contains("secret-token"), "{table}");
}

/// A message scheduled with `schedule_message` survives a kill -9 before it is due, is
/// delivered once to the contact after restart, and is recorded in the contact's trail.
#[test]
fn scheduled_message_survives_restart_and_is_delivered_once() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::tool_calls(vec![(
        "c1",
        "schedule_message",
        serde_json::json!({"target": "Alice", "text": "Reminder: stretch!", "delay_seconds": 2}),
    )]));
    llm.push(Reply::text("Scheduled."));
    let tg = FakeTelegram::spawn(TOKEN);
    let mut d = daemon(&llm, &tg, "plain");
    crate::support::e2e::fifo_write(
        &d,
        r#"{"id":"s1","type":"user","text":"remind Alice to stretch","sender":"ops"}"#,
    );
    crate::support::e2e::wait_outcome(&d, "ops", "s1");
    d.kill9();
    d.start();
    wait_until(WAIT, "the scheduled message", || {
        sent_to(&tg, ALICE)
            .iter()
            .any(|m| m.contains("Reminder: stretch!"))
            .then_some(())
    });
    // Restart again, then a normal exchange: the reminder is not sent a second time.
    assert!(d.sigterm().success());
    d.start();
    tg.push_text(ALICE, ALICE, "thanks");
    wait_until(WAIT, "reply to thanks", || {
        (sent_to(&tg, ALICE).len() >= 2).then_some(())
    });
    let sent = sent_to(&tg, ALICE);
    assert_eq!(
        sent.iter()
            .filter(|m| m.contains("Reminder: stretch!"))
            .count(),
        1,
        "{sent:?}"
    );
    // Scheduled by the session "ops" for the contact's conversation: marked as ops's words.
    let trail = d.trail("Alice");
    assert!(
        trail
            .iter()
            .any(|l| l["final"] == true && l["text"] == "[from session ops] Reminder: stretch!"),
        "{trail:#?}"
    );
    wait_until(WAIT, "delivery done record", || {
        d.trail("Alice")
            .iter()
            .any(|l| l["type"] == "delivery" && l["status"] == "done")
            .then_some(())
    });
}

/// `message` sends text and files to a contact; `react` reacts to the contact's last message.
#[test]
fn message_and_react_tools_reach_telegram() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("hey"));
    llm.push(Reply::tool_calls(vec![
        (
            "m1",
            "message",
            serde_json::json!({"target": "Alice", "text": "Hi from ops", "attachments": ["SOUL.md"]}),
        ),
        ("r1", "react", serde_json::json!({"target": "Alice", "emoji": "👍"})),
    ]));
    llm.push(Reply::text("done"));
    let tg = FakeTelegram::spawn(TOKEN);
    let d = daemon(&llm, &tg, "plain");
    let pushed = tg.push_text(ALICE, ALICE, "hello");
    wait_until(WAIT, "reply to hello", || {
        (!sent_to(&tg, ALICE).is_empty()).then_some(())
    });
    crate::support::e2e::fifo_write(
        &d,
        r#"{"id":"o1","type":"user","text":"greet Alice","sender":"ops"}"#,
    );
    let fin = crate::support::e2e::wait_outcome(&d, "ops", "o1");
    assert_eq!(fin["text"], "done");
    assert!(sent_to(&tg, ALICE).iter().any(|m| m == "Hi from ops"));
    let files = tg.sent_files();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].chat_id, ALICE);
    assert!(String::from_utf8_lossy(&files[0].bytes).contains("Soul"));
    let r = tg.reactions();
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].message_id, pushed.message_id);
    assert_eq!(r[0].emoji, vec!["👍".to_string()]);
}

/// SPEC §16.9: messages are merged and answered per chat. The same user writes in a private
/// chat and in a group within one debounce window: each chat gets its own reply, to its own
/// message only, and the group is its own session `tg:group:<chat id>`.
#[test]
fn private_and_group_messages_are_answered_each_in_its_own_chat() {
    const GROUP: i64 = -4242;
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let tg = FakeTelegram::spawn(TOKEN);
    let channel = format!("poll_timeout_seconds = 1\ncontacts = {{ Alice = {ALICE} }}");
    let d = telegram_daemon(&llm, &tg, TOKEN, ALICE, &channel, "", "debounce_ms = 1500");
    tg.push_text(ALICE, ALICE, "private words");
    tg.push_text(ALICE, GROUP, "group words");
    wait_until(WAIT, "a reply in both chats", || {
        (!sent_to(&tg, ALICE).is_empty() && !sent_to(&tg, GROUP).is_empty()).then_some(())
    });
    let private = sent_to(&tg, ALICE);
    let group = sent_to(&tg, GROUP);
    assert_eq!(private.len(), 1, "{private:?}");
    assert_eq!(group.len(), 1, "{group:?}");
    assert!(
        private[0].contains("private words") && !private[0].contains("group words"),
        "{private:?}"
    );
    assert!(
        group[0].contains("group words") && !group[0].contains("private words"),
        "{group:?}"
    );
    let group_trail = d.trail(&format!("tg:group:{GROUP}"));
    let intake = group_trail
        .iter()
        .find(|l| l["type"] == "intake")
        .expect("the group has its own session");
    assert_eq!(intake["text"], "group words");
    assert_eq!(intake["from"], "Alice", "the sender is still named");
    assert!(
        d.trail("Alice")
            .iter()
            .filter(|l| l["type"] == "intake")
            .all(|l| l["text"] == "private words"),
        "the private chat keeps the contact's key"
    );
}

/// `/reset` archives the chat's session: a reply comes back, the next message starts a new
/// session id, and the old trail is kept under `.archive/` rather than deleted.
#[test]
fn reset_command_archives_the_chats_session() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("first answer"));
    llm.push(Reply::text("second answer"));
    let tg = FakeTelegram::spawn(TOKEN);
    let d = daemon(&llm, &tg, "plain");
    tg.push_text(ALICE, ALICE, "remember the word banana");
    wait_until(WAIT, "first answer", || {
        sent_to(&tg, ALICE)
            .iter()
            .any(|m| m.contains("first answer"))
            .then_some(())
    });
    let before = d.session_id("Alice").expect("Alice's session");
    tg.push_text(ALICE, ALICE, "/reset");
    wait_until(WAIT, "the /reset answer", || {
        sent_to(&tg, ALICE)
            .iter()
            .any(|m| m.contains("Session reset"))
            .then_some(())
    });
    assert_eq!(llm.requests().len(), 1, "a command never reaches the model");
    tg.push_text(ALICE, ALICE, "what was the word?");
    wait_until(WAIT, "second answer", || {
        sent_to(&tg, ALICE)
            .iter()
            .any(|m| m.contains("second answer"))
            .then_some(())
    });
    let after = d.session_id("Alice").expect("a new session");
    assert_ne!(before, after, "a new session id after /reset");
    // The new session's request carries no trace of the archived conversation.
    let second = serde_json::to_string(&llm.requests()[1]["messages"]).unwrap();
    assert!(!second.contains("banana"), "{second}");
    assert!(
        d.trail_by_id(&after)
            .iter()
            .all(|l| l["text"] != "remember the word banana"),
        "the old message is not in the new trail"
    );
    let archived = d.sessions_dir().join(".archive");
    let names: Vec<String> = std::fs::read_dir(&archived)
        .unwrap_or_else(|e| panic!("{}: {e}", archived.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().any(|n| n.contains(&before)),
        "the old trail is archived: {names:?}"
    );
}

/// `/stop` stops the chat's running message: the model call is held open, `/stop` is
/// acknowledged at once, and the message ends as "Stopped." (recorded as a failure).
#[test]
fn stop_command_stops_the_running_message() {
    use std::sync::Arc;
    use tokio::sync::Semaphore;
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let gate = Arc::new(Semaphore::new(0));
    llm.push(Reply::text("too late").gated(&gate));
    let tg = FakeTelegram::spawn(TOKEN);
    let d = daemon(&llm, &tg, "plain");
    tg.push_text(ALICE, ALICE, "do something slow");
    wait_until(WAIT, "the held model call", || {
        (llm.requests().len() == 1).then_some(())
    });
    tg.push_text(ALICE, ALICE, "/stop");
    // The acknowledgement and the message's end, in either order.
    let sent = wait_until(WAIT, "the acknowledgement and Stopped.", || {
        let sent = sent_to(&tg, ALICE);
        (sent.iter().any(|m| m == "Stopped.")
            && sent
                .iter()
                .any(|m| m.contains("Stopping the message in flight")))
        .then_some(sent)
    });
    assert!(!sent.iter().any(|m| m.contains("too late")), "{sent:?}");
    let trail = d.trail("Alice");
    assert!(
        trail
            .iter()
            .any(|l| l["type"] == "failure" && l["reply"] == "Stopped."),
        "{trail:#?}"
    );
    // Nothing is running any more: a second /stop says so.
    tg.push_text(ALICE, ALICE, "/stop");
    wait_until(WAIT, "Nothing is running.", || {
        sent_to(&tg, ALICE)
            .iter()
            .any(|m| m.contains("Nothing is running"))
            .then_some(())
    });
    gate.add_permits(1);
    assert_eq!(llm.requests().len(), 1, "the model was not asked again");
}

/// `/status` answers with the agent's name and what is running and queued, without a model call.
#[test]
fn status_command_answers_with_the_status_text() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let tg = FakeTelegram::spawn(TOKEN);
    let _d = daemon(&llm, &tg, "plain");
    tg.push_text(ALICE, ALICE, "/status");
    let status = wait_until(WAIT, "the /status answer", || {
        sent_to(&tg, ALICE).into_iter().next()
    });
    assert_eq!(status, "testbot: 0 message(s) running, 0 queued.");
    assert!(
        llm.requests().is_empty(),
        "a command never reaches the model"
    );
    // Only allowed users may use commands.
    tg.push_text(MALLORY, MALLORY, "/status");
    std::thread::sleep(Duration::from_secs(2));
    assert!(sent_to(&tg, MALLORY).is_empty());
}

/// SPEC §16.7: a revoked token (401) is a permanent refusal, not a death. The daemon keeps
/// running (no exit, so no restart loop), Telegram's health turns red with an alert in
/// `/api/v1/status` and an error line in the log, polling waits the longest interval between
/// tries, and the FIFO is still answered.
#[test]
fn revoked_token_turns_telegram_red_and_the_daemon_runs_on() {
    use crate::http_daemon::reqwest;
    use crate::support::e2e::{fifo_write, wait_outcome};

    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("FIFO still answered"));
    let tg = FakeTelegram::spawn(TOKEN);
    tg.fail_next(1000, 401);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let toml = agentd_toml("fake").replace(
        "[behavior]",
        &format!(
            "[http]\nenabled = true\nport = {port}\n\n[channel.telegram]\nenabled = true\napi_url = \"{}\"\nallow_from = [{ALICE}]\npoll_timeout_seconds = 1\n\n[behavior]",
            tg.api_url()
        ),
    );
    let mut d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("openai", &llm.base_url()))],
    );
    d.set_env("AGENTD_TELEGRAM_TOKEN", TOKEN);
    d.set_env("AGENTD_HTTP_TOKEN", "tok");
    d.start();

    let client = reqwest::blocking_client();
    // The alert is a detail of the status: it needs the token.
    let status = wait_until(WAIT, "Telegram red in /api/v1/status", || {
        client
            .get(format!("http://127.0.0.1:{port}/api/v1/status"))
            .bearer_auth("tok")
            .send()
            .ok()
            .and_then(|r| r.json::<serde_json::Value>().ok())
            .filter(|s| s["channels"]["telegram"]["state"] == "unauthorized")
    });
    let tg_health = &status["channels"]["telegram"];
    assert_eq!(tg_health["healthy"], false, "{status}");
    assert!(
        tg_health["alert"]
            .as_str()
            .is_some_and(|a| a.contains("401") && a.contains("AGENTD_TELEGRAM_TOKEN")),
        "{status}"
    );
    assert!(!status.to_string().contains(TOKEN), "{status}");

    // The rest of the daemon runs on.
    fifo_write(
        &d,
        r#"{"type":"user","id":"after-401","sender":"alice","text":"hi"}"#,
    );
    let outcome = wait_outcome(&d, "alice", "after-401");
    assert_eq!(outcome["text"], "FIFO still answered", "{outcome}");
    std::thread::sleep(Duration::from_secs(2));
    assert!(d.is_running(), "a revoked token must not end the daemon");
    // Polling waits the longest interval (60 s) after a 401: one try so far, not a storm.
    assert_eq!(tg.served_failures(401), 1, "{:?}", tg.get_updates_calls());
    let log = d.log();
    assert!(
        log.contains("ERROR") && log.contains("telegram token rejected"),
        "{log}"
    );
    assert!(!log.contains(TOKEN), "the token leaked into the log");
    assert!(d.sigterm().success());
}

/// Security round 3, item 5: a download trickled by the file server (400 KB over about 5 s)
/// holds only its own chat: another allowed user's text is recorded within 1 s, and the
/// document still arrives whole afterwards.
#[test]
fn a_trickled_download_holds_no_other_chat() {
    const BOB: i64 = 3003;
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let tg = FakeTelegram::spawn(TOKEN);
    let channel =
        format!("poll_timeout_seconds = 1\ncontacts = {{ Alice = {ALICE}, Bob = {BOB} }}");
    let d = telegram_daemon_for(
        &llm,
        &tg,
        TOKEN,
        &[ALICE, BOB],
        &channel,
        "",
        "debounce_ms = 50",
    );
    tg.trickle_downloads(8 * 1024, Duration::from_millis(100));
    let big = vec![0x42u8; 400 * 1024];
    let doc = tg.push_document(
        ALICE,
        ALICE,
        &big,
        "big.bin",
        "application/octet-stream",
        Some("a big file"),
    );
    wait_until(WAIT, "the download under way", || {
        tg.requests()
            .iter()
            .any(|(m, _)| m == "getfile")
            .then_some(())
    });
    let t0 = std::time::Instant::now();
    let text = tg.push_text(BOB, BOB, "hello from Bob");
    let id = format!("tg-{}-{}", tg.bot_id(), text.update_id);
    let intake_of = |key: &str, id: &str| {
        d.trail(key)
            .into_iter()
            .find(|l| l["type"] == "intake" && l["id"] == id)
    };
    wait_until(Duration::from_secs(30), "Bob's intake", || {
        intake_of("Bob", &id)
    });
    let recorded = t0.elapsed();
    let alice_id = format!("tg-{}-{}", tg.bot_id(), doc.update_id);
    let alice_done = intake_of("Alice", &alice_id).is_some();
    eprintln!(
        "during a 400 KB download trickled over ~5 s, Bob's text was recorded after {} ms \
         (Alice's document recorded by then: {alice_done})",
        recorded.as_millis()
    );
    assert!(recorded <= Duration::from_secs(1), "{recorded:?}");
    assert!(
        !alice_done,
        "the check must run while the download trickles"
    );
    let alice = wait_until(WAIT, "Alice's document recorded", || {
        intake_of("Alice", &alice_id)
    });
    let path = alice["attachments"][0]
        .as_str()
        .expect("the document saved");
    assert_eq!(std::fs::read(path).unwrap(), big);
}
