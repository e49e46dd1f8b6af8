//! The Matrix channel (SPEC §21, issue 34) end to end: the real daemon against a real Synapse
//! (`support::synapse`, one per test binary, every test with users of its own), driven by
//! matrix-nio users (`tests/it/matrix_client.py`); the daemon reaches the homeserver through a
//! fault proxy (`support::fault_proxy`), which records its requests and injects faults.
//!
//! - `chat`: DMs answered, strangers ignored and their invites declined, encrypted DMs,
//!   `/model` and `/stop`, approvals by reaction, a password login's device kept;
//! - `media`: an image, a file and a voice note reach the model;
//! - `rooms`: a room over `max_room_members` left; strangers' invites declined, also in a flood;
//! - `verify`: the recovery key verifies the device, `doctor` says whether it is;
//! - `crash`: kill -9 between the recorded intake and the sync acknowledgement, and between
//!   the delivery record and the send: answered exactly once; homeserver faults (5xx, 429 with
//!   `retry_after_ms`, a connection dropped mid-sync, a revoked token).
//!
//! No fault point inside the daemon is needed: the kills are placed from outside (a held
//! request at the proxy, a trigger that makes the sync position's save fail in `agentd.db`).

mod chat;
mod crash;
mod media;
mod rooms;
mod verify;

use std::time::Duration;

use serde_json::Value;

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, provider_toml};
use crate::support::fake_llm::FakeLlm;
use crate::support::fault_proxy::{Fault, FaultProxy, Rule};
use crate::support::synapse::{MatrixUser, synapse};
use crate::support::wait_until;

/// How long a test waits for one outcome in the daemon's files.
const WAIT: Duration = Duration::from_secs(120);

/// A test's world: the fake model, the bot's account, the proxy the daemon reaches the
/// homeserver through, and the daemon (not started by [`World::new`]).
struct World {
    llm: FakeLlm,
    bot: MatrixUser,
    proxy: FaultProxy,
    d: TestDaemon,
}

/// How the daemon logs in.
#[derive(Clone, Copy, PartialEq)]
enum Login {
    Token,
    Password,
}

impl World {
    /// A daemon with `[matrix]` for a new bot account on the proxy, `allow_from = allow`,
    /// `matrix` more lines of `[matrix]`, `sections` more sections, `providers` the provider
    /// files (the first one is `fake`, on `llm`, when empty).
    fn new(
        llm: FakeLlm,
        allow: &[&str],
        matrix: &str,
        sections: &str,
        providers: &[(&str, String)],
        login: Login,
    ) -> World {
        let hs = synapse();
        let bot = hs.register("bot");
        let proxy = FaultProxy::spawn(&hs.url());
        let allow: Vec<String> = allow.iter().map(|a| format!("\"{a}\"")).collect();
        let names: Vec<String> = providers.iter().map(|(n, _)| format!("\"{n}\"")).collect();
        let mut toml = agentd_toml("fake").replace(
            "[behavior]",
            &format!(
                "[matrix]\nhomeserver = \"{}\"\nuser_id = \"{}\"\nallow_from = [{}]\n{matrix}\n\n{sections}\n[behavior]\ndebounce_ms = 50",
                proxy.url(),
                bot.user_id,
                allow.join(", ")
            ),
        );
        if !names.is_empty() {
            toml = toml.replace(
                r#"load = ["fake"]"#,
                &format!("load = [{}]", names.join(", ")),
            );
        }
        let default = [("fake", provider_toml("openai", &llm.base_url()))];
        let files: Vec<(&str, &str)> = if providers.is_empty() {
            default.iter().map(|(n, t)| (*n, t.as_str())).collect()
        } else {
            providers.iter().map(|(n, t)| (*n, t.as_str())).collect()
        };
        let mut d = TestDaemon::new(&toml, &files);
        match login {
            Login::Token => d.set_env("AGENTD_MATRIX_TOKEN", &bot.access_token),
            Login::Password => d.set_env("AGENTD_MATRIX_PASSWORD", &bot.password),
        }
        World { llm, bot, proxy, d }
    }

    /// [`World::new`] with the token, one fake provider and no extra config, started.
    fn started(llm: FakeLlm, allow: &[&str]) -> World {
        let mut w = World::new(llm, allow, "", "", &[], Login::Token);
        w.d.start();
        w
    }

    /// A direct chat `user` opens with the bot (encrypted when `encrypted`), once the bot has
    /// joined it.
    fn dm(&self, user: &MatrixUser, encrypted: bool) -> String {
        let room = user.create_dm(&[&self.bot.user_id], encrypted);
        user.wait_membership(&room, &self.bot.user_id, "join");
        room
    }

    /// The bot's `n`th message (from 1) in `room` as `user` reads it, once it is there.
    fn nth_answer(&self, user: &MatrixUser, room: &str, n: usize) -> Value {
        let got = user.wait_messages(room, &self.bot.user_id, n, None);
        got[n - 1].clone()
    }

    /// The bot's first message in `room` whose body contains `needle`.
    fn answer_containing(&self, user: &MatrixUser, room: &str, needle: &str) -> Value {
        let got = user.wait_messages(room, &self.bot.user_id, 1, Some(needle));
        got[0].clone()
    }

    /// The trail lines of the room's session (`mx:<room id>`).
    fn trail(&self, room: &str) -> Vec<Value> {
        self.d.trail(&format!("mx:{room}"))
    }

    /// The intake records of the room's session.
    fn intakes(&self, room: &str) -> Vec<Value> {
        self.trail(room)
            .into_iter()
            .filter(|l| l["type"] == "intake")
            .collect()
    }

    /// The Matrix channel's health in `monitor.json`, once there is one.
    fn matrix_health(&self) -> Option<Value> {
        let bytes = std::fs::read(self.d.state_dir.join("monitor.json")).ok()?;
        let m: Value = serde_json::from_slice(&bytes).ok()?;
        Some(m["channels"]["matrix"].clone()).filter(|h| !h.is_null())
    }

    /// Waits for the intake record of `event_id` (`mx-<event id>`).
    fn wait_intake(&self, room: &str, event_id: &str) -> Value {
        let id = format!("mx-{event_id}");
        wait_until(WAIT, &format!("the intake of {id}"), || {
            self.intakes(room).into_iter().find(|l| l["id"] == id)
        })
    }
}

/// The text the fake model was asked last in request `n` (0-based), once it arrived.
fn asked(llm: &FakeLlm, n: usize) -> Value {
    wait_until(WAIT, &format!("model request {}", n + 1), || {
        llm.requests().get(n).cloned()
    })
}

/// Whether any request to the fake model contains `needle`.
fn model_saw(llm: &FakeLlm, needle: &str) -> bool {
    llm.requests()
        .iter()
        .any(|r| r.to_string().contains(needle))
}

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

/// The fault proxy alone, in front of the real homeserver: requests pass unchanged, and the
/// rules' faults are served in order, once each (a 503, a 429 with `retry_after_ms`, a body
/// cut short, a request held until released).
#[test]
fn fault_proxy_selftest() {
    use crate::battery::http;
    let proxy = FaultProxy::spawn(&synapse().url());
    let port = proxy.port();
    let versions = "/_matrix/client/versions";
    let (status, body) = http(port, "GET", versions, None, None).unwrap();
    assert_eq!(status, 200, "{body}");
    let full: Value = serde_json::from_str(&body).unwrap();
    assert!(full["versions"].is_array(), "{full}");

    proxy.inject(Rule::new("GET", versions, Fault::Status(503), 1));
    proxy.inject(Rule::new(
        "GET",
        versions,
        Fault::RateLimited {
            retry_after_ms: 1500,
        },
        1,
    ));
    proxy.inject(Rule::new("GET", versions, Fault::DropMidBody, 1).answering("versions"));
    let (status, body) = http(port, "GET", versions, None, None).unwrap();
    assert_eq!(status, 503, "{body}");
    let (status, body) = http(port, "GET", versions, None, None).unwrap();
    assert_eq!(status, 429);
    let limited: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(limited["errcode"], "M_LIMIT_EXCEEDED");
    assert_eq!(limited["retry_after_ms"], 1500);
    match http(port, "GET", versions, None, None) {
        Ok((status, body)) => {
            assert_eq!(status, 200);
            assert!(
                serde_json::from_str::<Value>(&body).is_err(),
                "cut short: {body}"
            );
        }
        Err(e) => eprintln!("the cut connection: {e}"),
    }
    let (_, again) = http(port, "GET", versions, None, None).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&again).unwrap(),
        full,
        "passed unchanged"
    );
    assert_eq!(proxy.pending(), 0);

    proxy.inject(Rule::new("GET", versions, Fault::Hold, 1));
    let held = std::thread::spawn(move || http(port, "GET", versions, None, None));
    wait_until(WAIT, "the request held", || {
        (proxy.served(&Fault::Hold) == 1).then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(!held.is_finished(), "held until released");
    proxy.release();
    assert_eq!(held.join().unwrap().unwrap().0, 200);
    let seen = proxy.seen_matching("GET", versions);
    assert_eq!(seen.len(), 6, "{seen:#?}");
}
