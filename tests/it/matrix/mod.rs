//! The Matrix channel (SPEC §21, issue 34) end to end: the real daemon against a real Synapse
//! (`support::synapse`), driven by matrix-nio users (`tests/it/matrix_client.py`).

use crate::support::synapse::synapse;

/// The harness alone, no agentd code: two nio users exchange an end-to-end encrypted direct
/// message through the real homeserver, each reading the other's in clear.
#[test]
fn synapse_and_nio_selftest() {
    let hs = synapse();
    let alice = hs.register("alice");
    let bob = hs.register("bob");
    assert!(alice.user_id.ends_with(":localhost"), "{}", alice.user_id);
    let room = alice.create_dm(&[&bob.user_id], true);
    alice.wait_membership(&room, &bob.user_id, "invite");
    bob.join(&room);
    alice.wait_membership(&room, &bob.user_id, "join");

    alice.send_text(&room, "the secret is 42");
    let got = bob.wait_messages(&room, &alice.user_id, 1, None);
    assert_eq!(got[0]["body"], "the secret is 42", "{got:#?}");
    assert_eq!(
        got[0]["type"], "m.room.encrypted",
        "sent encrypted: {got:#?}"
    );

    let reply = bob.send_text(&room, "got it");
    let got = alice.wait_messages(&room, &bob.user_id, 1, None);
    assert_eq!(got[0]["body"], "got it");
    assert_eq!(got[0]["event_id"], reply.as_str());
    assert_eq!(got[0]["type"], "m.room.encrypted");
}
