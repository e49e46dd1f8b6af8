//! Conversations: DMs from allowed users answered (plain and end-to-end encrypted), strangers
//! ignored and unrecorded, their invites declined; approvals by reaction; `/model`, `/stop`;
//! a password login keeps its one device across restarts.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Semaphore;

use super::{Login, WAIT, World, asked, model_saw};
use crate::support::fake_llm::{FakeLlm, Reply, Wire, last_user_text};
use crate::support::synapse::synapse;
use crate::support::wait_until;

#[test]
fn an_allowed_users_dm_is_answered_and_a_strangers_gets_nothing() {
    let hs = synapse();
    let (alice, mallory) = (hs.register("alice"), hs.register("mallory"));
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("Hello **Alice**!"));
    let w = World::started(llm, &[&alice.user_id]);

    // A stranger's invite is declined: the bot never joins.
    let strangers = mallory.create_dm(&[&w.bot.user_id], false);
    mallory.wait_membership(&strangers, &w.bot.user_id, "leave");

    // In a room an allowed user invited both to, the stranger's message is not recorded.
    let room = alice.create_dm(&[&w.bot.user_id, &mallory.user_id], false);
    alice.wait_membership(&room, &w.bot.user_id, "join");
    mallory.join(&room);
    mallory.send_text(&room, "mallory wants in");
    let hi = alice.send_text(&room, "hi bot");
    let answer = w.nth_answer(&alice, &room, 1);
    // `body` is the plain fallback (the Markdown source is fine there, as Element sends it).
    assert!(
        answer["body"]
            .as_str()
            .is_some_and(|b| b.contains("Hello") && b.contains("Alice")),
        "{answer:#?}"
    );
    assert!(
        answer["formatted_body"]
            .as_str()
            .is_some_and(|h| h.contains("<strong>Alice</strong>")),
        "HTML from the model's Markdown: {answer:#?}"
    );
    assert_eq!(
        w.llm.requests().len(),
        1,
        "only Alice's message reached the model"
    );
    assert!(!model_saw(&w.llm, "mallory wants in"));
    let intakes = w.intakes(&room);
    assert_eq!(intakes.len(), 1, "{intakes:#?}");
    assert_eq!(intakes[0]["id"], format!("mx-{hi}"));
    let trail = serde_json::to_string(&w.trail(&room)).unwrap();
    assert!(!trail.contains("mallory wants in"), "{trail}");
    assert!(
        w.d.session_id(&format!("mx:{strangers}")).is_none(),
        "no session for the stranger's room"
    );
    // The delivery is recorded as done (right after the send returned).
    wait_until(WAIT, "the delivery's done record", || {
        w.trail(&room)
            .iter()
            .any(|l| l["type"] == "delivery" && l["status"] == "done")
            .then_some(())
    });
    let log = w.d.log();
    assert!(
        log.contains(&mallory.user_id),
        "the declined invite is logged"
    );
    assert!(
        !log.contains(&w.bot.access_token),
        "the token never appears in the log"
    );
}

#[test]
fn an_encrypted_dm_is_decrypted_and_answered_encrypted() {
    let alice = synapse().register("alice");
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("Noted, swordfish."));
    let w = World::started(llm, &[&alice.user_id]);
    let room = w.dm(&alice, true);
    alice.send_text(&room, "the password is swordfish");
    let answer = w.nth_answer(&alice, &room, 1);
    assert_eq!(answer["body"], "Noted, swordfish.", "{answer:#?}");
    assert_eq!(
        answer["type"], "m.room.encrypted",
        "answered encrypted: {answer:#?}"
    );
    let asked = last_user_text(&asked(&w.llm, 0));
    assert!(
        asked.contains("the password is swordfish"),
        "the model saw the plaintext: {asked}"
    );
    // Everything the bot posted in the encrypted room is encrypted.
    for e in alice.messages(&room) {
        if e["sender"] == w.bot.user_id.as_str() && e["state_key"].is_null() {
            assert_eq!(e["type"], "m.room.encrypted", "{e:#?}");
        }
    }
}

/// `echo x >> marker` through `exec` (gated by approvals).
fn exec_append(id: &str, marker: &std::path::Path) -> Reply {
    Reply::tool_calls(vec![(
        id,
        "exec",
        json!({ "command": format!("echo x >> {}", marker.display()) }),
    )])
}

#[test]
fn an_approval_by_reaction_runs_the_call_once_and_a_strangers_reaction_is_ignored() {
    let hs = synapse();
    let (alice, mallory) = (hs.register("alice"), hs.register("mallory"));
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let mut w = World::new(
        llm,
        &[&alice.user_id],
        "",
        "[approvals]\nrequire = [\"exec\"]\ntimeout_seconds = 300\n",
        &[],
        Login::Token,
    );
    let marker = w.d.workspace().join("approved");
    w.llm.push(exec_append("c1", &marker));
    w.llm.push(Reply::text("the command ran"));
    w.d.start();
    let room = alice.create_dm(&[&w.bot.user_id, &mallory.user_id], false);
    alice.wait_membership(&room, &w.bot.user_id, "join");
    mallory.join(&room);

    alice.send_text(&room, "run the thing");
    let prompt = w.answer_containing(&alice, &room, "exec");
    let prompt_id = prompt["event_id"].as_str().unwrap().to_string();
    mallory.react(&room, &prompt_id, "✅");
    // The stranger's ✅ decides nothing: give the daemon time to see it.
    std::thread::sleep(Duration::from_secs(5));
    assert!(!marker.exists(), "a stranger's reaction approved the call");
    assert_eq!(w.llm.requests().len(), 1);

    alice.react(&room, &prompt_id, "✅");
    w.answer_containing(&alice, &room, "the command ran");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "x\n", "ran once");
    assert_eq!(w.llm.requests().len(), 2);
    assert!(!model_saw(&w.llm, "denied"), "the call was not denied");
}

/// Two models on one fake server: `primary` (`fake-model`) and `cheap` (`cheap-model`).
fn two_models(base_url: &str) -> String {
    format!(
        "type = \"openai\"\nbase_url = \"{base_url}\"\n\n[models.primary]\nmodel = \"fake-model\"\nmax_tokens = 1024\n\n[models.cheap]\nmodel = \"cheap-model\"\nmax_tokens = 1024\n"
    )
}

#[test]
fn model_and_stop_commands_work_in_a_room() {
    let alice = synapse().register("alice");
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let providers = [("fake", two_models(&llm.base_url()))];
    let mut w = World::new(llm, &[&alice.user_id], "", "", &providers, Login::Token);
    w.d.start();
    let room = w.dm(&alice, false);

    alice.send_text(&room, "/model");
    let listing = w.nth_answer(&alice, &room, 1);
    let body = listing["body"].as_str().unwrap_or_default();
    assert!(
        body.contains("cheap") && body.contains("primary"),
        "{listing:#?}"
    );
    alice.send_text(&room, "/model cheap");
    let changed = w.nth_answer(&alice, &room, 2);
    assert!(
        changed["body"]
            .as_str()
            .is_some_and(|b| b.contains("now uses cheap")),
        "{changed:#?}"
    );
    assert!(
        w.llm.requests().is_empty(),
        "a command never reaches the model"
    );
    w.llm.push(Reply::text("cheap answer"));
    alice.send_text(&room, "which model?");
    w.answer_containing(&alice, &room, "cheap answer");
    assert_eq!(asked(&w.llm, 0)["model"], "cheap-model");

    // /stop ends the message in flight: the model call is held open.
    let gate = Arc::new(Semaphore::new(0));
    w.llm.push(Reply::text("too late").gated(&gate));
    alice.send_text(&room, "do something slow");
    asked(&w.llm, 1);
    alice.send_text(&room, "/stop");
    w.answer_containing(&alice, &room, "Stopped.");
    let trail = w.trail(&room);
    assert!(
        trail
            .iter()
            .any(|l| l["type"] == "failure" && l["reply"] == "Stopped."),
        "{trail:#?}"
    );
    gate.add_permits(1);
    std::thread::sleep(Duration::from_secs(2));
    let bodies: Vec<String> = alice
        .messages_from(&room, &w.bot.user_id)
        .iter()
        .map(|e| e["body"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(!bodies.iter().any(|b| b.contains("too late")), "{bodies:?}");
    assert_eq!(w.llm.requests().len(), 2, "the model was not asked again");
}

#[test]
fn a_password_login_keeps_its_one_device_across_restarts() {
    let alice = synapse().register("alice");
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("first answer"));
    llm.push(Reply::text("second answer"));
    let mut w = World::new(llm, &[&alice.user_id], "", "", &[], Login::Password);
    w.d.start();
    let room = w.dm(&alice, true);
    alice.send_text(&room, "first");
    w.answer_containing(&alice, &room, "first answer");
    let devices = alice.devices(&w.bot.user_id);
    assert_eq!(devices.len(), 1, "{devices:?}");

    assert!(w.d.sigterm().success());
    w.d.start();
    alice.send_text(&room, "second");
    w.answer_containing(&alice, &room, "second answer");
    assert_eq!(
        alice.devices(&w.bot.user_id),
        devices,
        "no new device after a restart"
    );
    let log = w.d.log();
    assert!(
        !log.contains(&w.bot.password),
        "the password never appears in the log"
    );
}
