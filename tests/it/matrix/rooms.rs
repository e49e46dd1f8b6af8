//! Rooms the bot must not stay in: a room over `[matrix] max_room_members` is left and not
//! answered in (every member's devices would get the keys of what is said there); a
//! stranger's invite is declined, also 25 at once (more than one sync handles), and nothing of
//! them is recorded.

use super::{Login, WAIT, World};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};
use crate::support::synapse::synapse;
use crate::support::wait_until;

#[test]
fn a_room_over_max_room_members_is_left_and_not_answered() {
    let hs = synapse();
    let (alice, carol) = (hs.register("alice"), hs.register("carol"));
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("this must not be said"));
    let mut w = World::new(
        llm,
        &[&alice.user_id],
        "max_room_members = 2",
        "",
        &[],
        Login::Token,
    );
    w.d.start();
    let room = alice.create_dm(&[&w.bot.user_id, &carol.user_id], false);
    // Two joined members (Alice and the bot) are within the bound.
    alice.wait_membership(&room, &w.bot.user_id, "join");
    carol.join(&room);
    alice.send_text(&room, "hello, both of you");
    alice.wait_membership(&room, &w.bot.user_id, "leave");

    assert!(w.llm.requests().is_empty(), "not answered in the big room");
    assert!(w.intakes(&room).is_empty(), "nothing recorded");
    let log = w.d.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("over [matrix] max_room_members = 2"))
        .collect();
    assert_eq!(said.len(), 1, "logged once: {said:#?}");
    assert!(
        said[0].contains("3 joined members") && said[0].contains("raise max_room_members"),
        "the count and the fix: {}",
        said[0]
    );
}

#[test]
fn strangers_invites_are_declined_also_in_a_flood_and_nothing_is_recorded() {
    let hs = synapse();
    let (alice, mallory) = (hs.register("alice"), hs.register("mallory"));
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let mut w = World::new(llm, &[&alice.user_id], "", "", &[], Login::Token);
    // One invite while the daemon runs.
    w.d.start();
    let one = mallory.create_dm(&[&w.bot.user_id], false);
    mallory.wait_membership(&one, &w.bot.user_id, "leave");
    let declined = |log: &str| {
        log.lines()
            .filter(|l| l.contains("declined") && l.contains(&mallory.user_id))
            .count()
    };
    wait_until(WAIT, "the declined invite logged", || {
        (declined(&w.d.log()) == 1).then_some(())
    });

    // 25 while it is down: its next sync brings them all, more than one sync handles.
    assert!(w.d.sigterm().success());
    let flood = mallory.create_dms(&[&w.bot.user_id], 25);
    assert_eq!(flood.len(), 25);
    w.d.start();
    wait_until(WAIT, "all 25 invites declined", || {
        let now = mallory.memberships(&flood, &w.bot.user_id);
        now.iter().all(|m| m == "leave").then_some(())
    });
    let log = w.d.log();
    assert_eq!(declined(&log), 26, "each invite logged");
    assert!(
        log.contains("more invites than handled per sync"),
        "the flood was bounded per sync"
    );
    assert!(w.llm.requests().is_empty());
    for room in flood.iter().chain([&one]) {
        assert!(
            w.d.session_id(&format!("mx:{room}")).is_none(),
            "no session for a stranger's room {room}"
        );
    }
}
