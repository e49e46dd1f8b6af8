//! Media from Matrix reaches the model: an `m.image` goes to the vision model as an image part,
//! an `m.file` lands in `inbox/` and is named to the model, an `m.audio` voice message is
//! transcribed (the harness's fake audio endpoint) and the transcript is the user turn.

use base64::Engine;
use serde_json::json;

use super::{Login, World, asked};
use crate::support::e2e::provider_toml;
use crate::support::fake_audio::{FIXTURE, FakeAudio};
use crate::support::fake_llm::{FakeLlm, Reply, Wire, last_user_text};
use crate::support::synapse::synapse;

const AUDIO_KEY: &str = "sk-audio-test";
/// What the fake transcribes the fixture as.
const SAID: &str = "Hello agent, what is the weather tomorrow?";

#[test]
fn an_image_a_file_and_a_voice_note_reach_the_model() {
    let alice = synapse().register("alice");
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let audio = FakeAudio::spawn(Some(AUDIO_KEY), SAID);
    let fake = format!(
        "{}\n[models.vision]\nmodel = \"fake-vision\"\nsupports_vision = true\n",
        provider_toml("openai", &llm.base_url())
    );
    let audio_provider = format!(
        "type = \"openai\"\nbase_url = \"{}\"\napi_key_env = \"AGENTD_AUDIO_KEY\"\n\n[models.whisper]\nmodel = \"whisper-1\"\ncost_per_minute = 0.006\n",
        audio.base_url()
    );
    let providers = [("fake", fake), ("audio", audio_provider)];
    let mut w = World::new(
        llm,
        &[&alice.user_id],
        "",
        "[voice]\nstt_model = \"whisper\"\n",
        &providers,
        Login::Token,
    );
    w.d.set_env("AGENTD_AUDIO_KEY", AUDIO_KEY);
    w.llm.push(Reply::text("a picture of bytes"));
    w.llm.push(Reply::text("file received"));
    w.llm.push(Reply::text("sunny tomorrow"));
    w.d.start();
    let room = w.dm(&alice, false);
    let files = tempfile::tempdir().unwrap();

    // An image: the vision model gets it as an image part.
    let png = b"\x89PNG\r\n\x1a\nfake-png-bytes-for-matrix".to_vec();
    let png_path = files.path().join("photo.png");
    std::fs::write(&png_path, &png).unwrap();
    alice.send(
        &room,
        "image",
        json!({"path": png_path, "mimetype": "image/png", "body": "photo.png"}),
    );
    w.answer_containing(&alice, &room, "a picture of bytes");
    let first = asked(&w.llm, 0);
    assert_eq!(first["model"], "fake-vision", "routed to the vision model");
    let b64 = base64::engine::general_purpose::STANDARD.encode(&png);
    assert!(first.to_string().contains(&b64), "the image part: {first}");

    // A file: saved into inbox/ with its bytes, named to the model.
    let doc = b"quarterly numbers: 1, 2, 3\n".to_vec();
    let doc_path = files.path().join("report.txt");
    std::fs::write(&doc_path, &doc).unwrap();
    let file_event = alice.send(
        &room,
        "file",
        json!({"path": doc_path, "mimetype": "text/plain", "body": "report.txt"}),
    );
    w.answer_containing(&alice, &room, "file received");
    let intake = w.wait_intake(&room, &file_event);
    let saved = intake["attachments"][0]
        .as_str()
        .unwrap_or_else(|| panic!("the file is an attachment of its intake: {intake:#}"));
    assert!(saved.contains("inbox"), "{saved}");
    assert_eq!(std::fs::read(saved).unwrap(), doc);
    let second = asked(&w.llm, 1).to_string();
    let name = std::path::Path::new(saved)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        second.contains(&name),
        "the model is told the file: {second}"
    );

    // A voice message: transcribed from exactly its bytes; the transcript is the user turn.
    let ogg_path = files.path().join("voice.ogg");
    std::fs::write(&ogg_path, FIXTURE).unwrap();
    alice.send(
        &room,
        "audio",
        json!({"path": ogg_path, "mimetype": "audio/ogg", "body": "Voice message", "duration_ms": 2822}),
    );
    w.answer_containing(&alice, &room, "sunny tomorrow");
    let sent = audio.transcriptions();
    assert_eq!(sent.len(), 1, "transcribed once");
    assert_eq!(
        sent[0].bytes, FIXTURE,
        "the request carries the voice note's bytes"
    );
    let third = last_user_text(&asked(&w.llm, 2));
    assert!(
        third.contains(SAID),
        "the transcript is the user turn: {third}"
    );
}

/// The files of the daemon's `inbox/`, by name.
fn inbox(w: &World) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(w.d.state_dir.join("inbox"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Downloads are streamed with the cap (`max_download_bytes` = 1 MiB here): a 2 MiB file that
/// says so and a 24 MiB one whose `info.size` lies (1 KiB) are both refused (the model is told,
/// nothing is left in inbox/), and the liar is not read whole: the proxy delivers far less than
/// its size before the daemon hangs up. An encrypted file under the cap arrives intact.
#[test]
fn downloads_stop_at_the_cap_whatever_the_size_declared_and_encrypted_files_arrive_intact() {
    const MIB: usize = 1 << 20;
    let alice = synapse().register("alice");
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let mut w = World::new(
        llm,
        &[&alice.user_id],
        &format!("max_download_bytes = {MIB}"),
        "",
        &[],
        Login::Token,
    );
    w.llm.push(Reply::text("too big noted"));
    w.llm.push(Reply::text("liar noted"));
    w.llm.push(Reply::text("secret file received"));
    w.d.start();
    let room = w.dm(&alice, false);
    let files = tempfile::tempdir().unwrap();
    let write = |name: &str, len: usize| {
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let path = files.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        (path, bytes)
    };

    // True size declared: refused before any byte is fetched.
    let (big, _) = write("big.bin", 2 * MIB);
    alice.send(
        &room,
        "file",
        json!({"path": big, "mimetype": "application/octet-stream", "body": "big.bin"}),
    );
    w.answer_containing(&alice, &room, "too big noted");
    let first = asked(&w.llm, 0).to_string();
    assert!(
        first.contains("[attachment could not be downloaded: the file has 2097152 bytes"),
        "{first}"
    );

    // A lie: 1 KiB declared, 24 MiB sent. Stopped once the bytes pass the cap.
    let (liar, _) = write("liar.bin", 24 * MIB);
    alice.send(
        &room,
        "file",
        json!({"path": liar, "mimetype": "application/octet-stream", "body": "liar.bin", "declared_size": 1024}),
    );
    w.answer_containing(&alice, &room, "liar noted");
    let second = asked(&w.llm, 1).to_string();
    assert!(
        second
            .contains("[attachment could not be downloaded: the file has more than 1048576 bytes"),
        "{second}"
    );
    let fetched = w.proxy.seen_matching("GET", "/media/download/");
    assert_eq!(fetched.len(), 1, "only the liar was fetched: {fetched:#?}");
    let delivered = fetched[0]
        .delivered
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        delivered < 16 * MIB,
        "the download went on after the cap: {delivered} of {} bytes read",
        24 * MIB
    );
    assert!(inbox(&w).is_empty(), "nothing left behind: {:?}", inbox(&w));

    // Encrypted, under the cap: decrypted from a streamed ciphertext, byte for byte.
    let secret_room = w.dm(&alice, true);
    let (doc, bytes) = write("secret.bin", 300 * 1024);
    let event = alice.send(
        &secret_room,
        "file",
        json!({"path": doc, "mimetype": "application/octet-stream", "body": "secret.bin"}),
    );
    w.answer_containing(&alice, &secret_room, "secret file received");
    let intake = w.wait_intake(&secret_room, &event);
    let saved = intake["attachments"][0]
        .as_str()
        .unwrap_or_else(|| panic!("the file is an attachment of its intake: {intake:#}"));
    assert_eq!(std::fs::read(saved).unwrap(), bytes, "decrypted intact");
    let name = std::path::Path::new(saved)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_eq!(inbox(&w), [name], "no ciphertext left beside it");
}
