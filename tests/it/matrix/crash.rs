//! Crashes and homeserver faults: a message is answered exactly once, counted on the server
//! (the bot's events in the room, from /messages), after
//! - kill -9 between the recorded intake and the sync acknowledgement: the save of the sync
//!   position (`agentd.db` kv `matrix.<bot user id>.next_batch`) is made to fail by a trigger,
//!   so the position cannot move past the recorded message before the kill;
//! - kill -9 between the delivery record and the send: the send is held at the proxy (never
//!   reaches the server), or reaches the server but its answer is withheld; the resend after
//!   the restart carries the same transaction id (the server deduplicates);
//! - 5xx, 429 with `retry_after_ms` and a connection dropped mid-body, on the sync that carries
//!   the message and on the send of the answer.
//!
//! And a revoked token turns the channel red with one ERROR naming `AGENTD_MATRIX_TOKEN`, no
//! restart loop.

use std::path::Path;
use std::time::Duration;

use super::{WAIT, World};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};
use crate::support::fault_proxy::{Fault, Rule};
use crate::support::synapse::{MatrixUser, synapse};
use crate::support::wait_until;

/// The path of the bot's sends of `m.room.message` (`…/send/m.room.message/<txn id>`).
const SEND: &str = "/send/m.room.message/";

/// The kv key of the bot's persisted sync position.
fn next_batch_key(w: &World) -> String {
    format!("matrix.{}.next_batch", w.bot.user_id)
}

fn kv(db: &Path, key: &str) -> Option<String> {
    let conn = rusqlite::Connection::open(db).ok()?;
    conn.query_row("SELECT value FROM kv WHERE key = ?1", [key], |r| {
        r.get::<_, String>(0)
    })
    .ok()
}

/// Makes every write of a `matrix.` kv key fail (as a full disk would), or work again.
fn fail_matrix_kv_writes(db: &Path, fail: bool) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch(if fail {
        "CREATE TRIGGER mx_ack_insert BEFORE INSERT ON kv WHEN NEW.key LIKE 'matrix.%' \
         BEGIN SELECT RAISE(FAIL, 'database or disk is full'); END; \
         CREATE TRIGGER mx_ack_update BEFORE UPDATE ON kv WHEN NEW.key LIKE 'matrix.%' \
         BEGIN SELECT RAISE(FAIL, 'database or disk is full'); END;"
    } else {
        "DROP TRIGGER mx_ack_insert; DROP TRIGGER mx_ack_update;"
    })
    .unwrap();
}

/// The bodies of the bot's messages in `room`.
fn bot_bodies(w: &World, user: &MatrixUser, room: &str) -> Vec<String> {
    user.messages_from(room, &w.bot.user_id)
        .iter()
        .map(|e| e["body"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// After a quiet moment, the bot posted `want` exactly once (and nothing else containing it).
fn assert_posted_once(w: &World, user: &MatrixUser, room: &str, want: &str) {
    std::thread::sleep(Duration::from_secs(3));
    let bodies = bot_bodies(w, user, room);
    let n = bodies.iter().filter(|b| b.contains(want)).count();
    assert_eq!(n, 1, "{want:?} posted {n} times: {bodies:?}");
}

#[test]
fn kill9_between_the_recorded_intake_and_the_sync_acknowledgement_answers_once() {
    let alice = synapse().register("alice");
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::Hang);
    llm.push(Reply::text("answer one"));
    llm.push(Reply::text("answer two"));
    let mut w = World::started(llm, &[&alice.user_id]);
    let room = w.dm(&alice, false);
    let db = w.d.state_dir.join("agentd.db");
    let key = next_batch_key(&w);
    let before = wait_until(WAIT, "the sync position saved", || kv(&db, &key));

    fail_matrix_kv_writes(&db, true);
    let first = alice.send_text(&room, "first question");
    w.wait_intake(&room, &first);
    wait_until(WAIT, "the model call", || {
        (!w.llm.requests().is_empty()).then_some(())
    });
    assert_eq!(
        kv(&db, &key),
        Some(before.clone()),
        "the position did not move"
    );
    w.d.kill9();
    fail_matrix_kv_writes(&db, false);

    // The restart syncs from the old position: the message comes again, is not taken in
    // twice, and its recorded intake is answered once.
    w.d.start();
    w.answer_containing(&alice, &room, "answer one");
    wait_until(WAIT, "the position saved past the message", || {
        kv(&db, &key).filter(|v| *v != before)
    });
    let second = alice.send_text(&room, "second question");
    w.answer_containing(&alice, &room, "answer two");
    assert_posted_once(&w, &alice, &room, "answer one");
    assert_posted_once(&w, &alice, &room, "answer two");
    let ids: Vec<String> = w
        .intakes(&room)
        .iter()
        .map(|l| l["id"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        ids,
        [format!("mx-{first}"), format!("mx-{second}")],
        "one intake each"
    );
}

/// Kill -9 while the answer's send is held at the proxy (`fault`: before or after the server
/// saw it); after the restart the answer is in the room exactly once, and a send that never
/// reached the server is repeated with its transaction id.
fn kill9_during_the_send(fault: Fault) {
    let alice = synapse().register("alice");
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("the one answer"));
    llm.push(Reply::text("after the restart"));
    let mut w = World::started(llm, &[&alice.user_id]);
    let room = w.dm(&alice, false);
    w.proxy.inject(Rule::new("PUT", SEND, fault.clone(), 1));
    let question = alice.send_text(&room, "a question");
    w.wait_intake(&room, &question);
    wait_until(WAIT, "the send held at the proxy", || {
        (w.proxy.pending() == 0).then_some(())
    });
    if fault == Fault::ForwardThenHold {
        // The server has it: only the answer to the daemon is missing.
        w.answer_containing(&alice, &room, "the one answer");
    }
    wait_until(WAIT, "the delivery record", || {
        w.trail(&room)
            .iter()
            .any(|l| l["type"] == "delivery")
            .then_some(())
    });
    w.d.kill9();
    let held = w.proxy.seen_matching("PUT", SEND)[0].path.clone();

    w.d.start();
    w.answer_containing(&alice, &room, "the one answer");
    alice.send_text(&room, "still there?");
    w.answer_containing(&alice, &room, "after the restart");
    assert_posted_once(&w, &alice, &room, "the one answer");
    let txns: Vec<String> = w
        .proxy
        .seen_matching("PUT", SEND)
        .into_iter()
        .map(|s| s.path)
        .collect();
    let resends = txns.iter().filter(|p| **p == held).count();
    if fault == Fault::Hold {
        // The interrupted send is repeated with its transaction id (the server deduplicates).
        assert!(resends >= 2, "the held answer was sent again: {txns:#?}");
    }
    assert_eq!(
        txns.len() - resends,
        1,
        "one send for the second answer, every other one the held transaction: {txns:#?}"
    );
}

#[test]
fn kill9_between_the_delivery_record_and_the_send_answers_once() {
    kill9_during_the_send(Fault::Hold);
}

#[test]
fn kill9_after_the_server_took_the_send_answers_once() {
    kill9_during_the_send(Fault::ForwardThenHold);
}

#[test]
fn sync_faults_are_retried_and_nothing_is_lost_or_doubled() {
    let alice = synapse().register("alice");
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("still here"));
    let w = World::started(llm, &[&alice.user_id]);
    let room = w.dm(&alice, false);
    let text = "are you still there, through the faults?";
    // The sync answers that carry the message: a 502, then a 429, then a cut connection.
    let faults = [
        Fault::Status(502),
        Fault::RateLimited {
            retry_after_ms: 1500,
        },
        Fault::DropMidBody,
    ];
    for f in &faults {
        w.proxy
            .inject(Rule::new("GET", "/sync", f.clone(), 1).answering(text));
    }
    let question = alice.send_text(&room, text);
    w.answer_containing(&alice, &room, "still here");
    for f in &faults {
        assert_eq!(w.proxy.served(f), 1, "{f:?} served once");
    }
    assert_posted_once(&w, &alice, &room, "still here");
    assert_eq!(w.llm.requests().len(), 1, "asked once");
    let intakes = w.intakes(&room);
    assert_eq!(intakes.len(), 1, "{intakes:#?}");
    assert_eq!(intakes[0]["id"], format!("mx-{question}"));
}

#[test]
fn send_faults_are_retried_with_one_transaction_id() {
    let alice = synapse().register("alice");
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("delivered despite the faults"));
    let w = World::started(llm, &[&alice.user_id]);
    let room = w.dm(&alice, false);
    // The server takes the first send but the daemon gets a 500; the retry gets a 429; the
    // next one a cut connection.
    let faults = [
        Fault::Status(500),
        Fault::RateLimited {
            retry_after_ms: 1000,
        },
        Fault::DropMidBody,
    ];
    for f in &faults {
        w.proxy.inject(Rule::new("PUT", SEND, f.clone(), 1));
    }
    alice.send_text(&room, "answer me");
    w.answer_containing(&alice, &room, "delivered despite the faults");
    wait_until(WAIT, "every fault served", || {
        (w.proxy.pending() == 0).then_some(())
    });
    assert_posted_once(&w, &alice, &room, "delivered despite the faults");
    let sends = w.proxy.seen_matching("PUT", SEND);
    assert!(
        sends.len() >= 4,
        "three faults, then the send that worked: {sends:#?}"
    );
    assert!(
        sends.iter().all(|s| s.path == sends[0].path),
        "one transaction id for every try: {sends:#?}"
    );
}

#[test]
fn a_revoked_token_turns_matrix_red_with_one_error_and_no_restart_loop() {
    let alice = synapse().register("alice");
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("before the revocation"));
    let mut w = World::started(llm, &[&alice.user_id]);
    let room = w.dm(&alice, false);
    alice.send_text(&room, "hello");
    w.answer_containing(&alice, &room, "before the revocation");
    let pid = w.d.pid();

    alice.revoke(&w.bot.access_token);
    let health = wait_until(WAIT, "Matrix red in monitor.json", || {
        w.matrix_health().filter(|h| h["healthy"] == false)
    });
    let errors = |log: &str| {
        log.lines()
            .filter(|l| l.contains("ERROR") && l.contains("AGENTD_MATRIX_TOKEN"))
            .count()
    };
    wait_until(WAIT, "the ERROR naming the variable", || {
        (errors(&w.d.log()) >= 1).then_some(())
    });
    let requests = w.proxy.seen().len();
    std::thread::sleep(Duration::from_secs(10));
    let log = w.d.log();
    assert_eq!(errors(&log), 1, "one ERROR, not one per try: {log}");
    assert!(w.d.is_running(), "a revoked token must not end the daemon");
    assert_eq!(w.d.pid(), pid, "no restart");
    let more = w.proxy.seen().len() - requests;
    assert!(
        more <= 3,
        "no retry storm with a revoked token: {more} requests in 10 s"
    );
    assert!(
        !log.contains(&w.bot.access_token),
        "the token never appears in the log"
    );
    assert!(
        !health.to_string().contains(&w.bot.access_token),
        "{health}"
    );
    assert!(w.d.sigterm().success());
}
