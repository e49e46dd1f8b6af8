//! The device's verification (SPEC §21, docs/matrix.md): the operator sets up recovery for the
//! bot's account in a client of their own (here matrix-sdk, as Element does: cross-signing,
//! key backup and secret storage, and a recovery key); agentd, logged in with the password on
//! a device of its own, recovers the account's keys with that key from
//! `AGENTD_MATRIX_RECOVERY_KEY` and so cross-signs its device. `doctor` says whether the
//! device is verified; a wrong key is one ERROR naming the variable and the channel works on.

use matrix_sdk::Client;
use matrix_sdk::config::SyncSettings;
use matrix_sdk::ruma::api::client::uiaa;
use serde_json::Value;

use super::{Login, WAIT, World};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};
use crate::support::synapse::{MatrixUser, synapse};
use crate::support::wait_until;

const KEY_ENV: &str = "AGENTD_MATRIX_RECOVERY_KEY";

/// What the operator does once in their own client, logged in as the bot (a device of its
/// own, a memory store): cross-signing, then recovery (a key backup and secret storage that
/// holds the cross-signing keys). Returns the recovery key the client shows.
fn set_up_recovery(bot: &MatrixUser) -> String {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let http = agentd::channels::matrix::client::http_client().unwrap();
        let client = Client::builder()
            .homeserver_url(synapse().url())
            .http_client(http)
            .build()
            .await
            .unwrap();
        client
            .matrix_auth()
            .login_username(&bot.user_id, &bot.password)
            .initial_device_display_name("the operator's client")
            .send()
            .await
            .unwrap();
        client.sync_once(SyncSettings::default()).await.unwrap();
        if let Err(e) = client.encryption().bootstrap_cross_signing(None).await {
            let uiaa = e
                .as_uiaa_response()
                .unwrap_or_else(|| panic!("cross-signing bootstrap: {e:?}"));
            let mut password = uiaa::Password::new(
                uiaa::UserIdentifier::Matrix(uiaa::MatrixUserIdentifier::new(bot.user_id.clone())),
                bot.password.clone(),
            );
            password.session = uiaa.session.clone();
            client
                .encryption()
                .bootstrap_cross_signing(Some(uiaa::AuthData::Password(password)))
                .await
                .unwrap();
        }
        client.encryption().recovery().enable().await.unwrap()
    })
}

/// `agentd doctor --json`'s check named `name`.
fn doctor_check(w: &World, name: &str) -> Value {
    let out = w.d.agentd(&["doctor", "--json"]).output().unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor --json: {e}: {out:?}"));
    doc["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name).cloned())
        .unwrap_or_else(|| panic!("no {name} check: {doc:#}"))
}

/// Waits until the monitor's Matrix health says whether the device is verified.
fn wait_verified(w: &World) -> bool {
    wait_until(WAIT, "device_verified in the Matrix health", || {
        w.matrix_health()?["device_verified"].as_bool()
    })
}

#[test]
fn the_recovery_key_verifies_the_device_and_doctor_says_so() {
    let alice = synapse().register("alice");
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let mut w = World::new(llm, &[&alice.user_id], "", "", &[], Login::Password);
    let key = set_up_recovery(&w.bot);

    // Without the key: a new device, not verified, and doctor says so (a warning).
    w.d.start();
    assert!(!wait_verified(&w), "not verified without the key");
    let device = doctor_check(&w, "matrix device");
    assert_eq!(device["status"], "warn", "{device:#}");
    assert!(
        device["detail"]
            .as_str()
            .is_some_and(|d| d.contains("not verified") && d.contains("docs/matrix.md")),
        "{device:#}"
    );
    assert!(w.d.sigterm().success());

    // With the key: the same device recovers the account's keys and is cross-signed.
    w.d.set_env(KEY_ENV, &key);
    w.d.start();
    assert!(wait_verified(&w), "verified with the key: {}", w.d.log());
    assert!(w.d.log().contains("this device is verified"));
    assert!(
        !w.d.log().contains(&key),
        "the key never appears in the log"
    );
    let device = doctor_check(&w, "matrix device");
    assert_eq!(device["status"], "pass", "{device:#}");
    assert!(
        device["detail"]
            .as_str()
            .is_some_and(|d| d.contains("verified (cross-signed)") && !d.contains("not")),
        "{device:#}"
    );
}

#[test]
fn a_wrong_recovery_key_is_one_error_and_the_channel_still_answers() {
    let alice = synapse().register("alice");
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("still here"));
    let mut w = World::new(llm, &[&alice.user_id], "", "", &[], Login::Password);
    set_up_recovery(&w.bot);
    w.d.set_env(
        KEY_ENV,
        "EsTj 3yST y93F SLpB jJsz eAXc 2XzA ygD3 w69H fGaN TKBj jXEd",
    );
    w.d.start();
    assert!(!wait_verified(&w), "not verified with a wrong key");
    let errors: Vec<String> =
        w.d.log()
            .lines()
            .filter(|l| l.contains("ERROR") && l.contains(KEY_ENV))
            .map(str::to_string)
            .collect();
    assert_eq!(
        errors.len(),
        1,
        "one ERROR naming the variable: {errors:#?}"
    );
    let room = w.dm(&alice, true);
    alice.send_text(&room, "are you there?");
    w.answer_containing(&alice, &room, "still here");
}
