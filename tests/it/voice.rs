//! Voice in and out (SPEC §19, issue 17) against the real binary: a Telegram voice note and an
//! HTTP audio attachment carrying the committed OGG/Opus fixture are transcribed (the fake
//! checks the request carries exactly its bytes) and the transcript is the user turn; the
//! `tts` tool's speech goes out as `sendVoice` through the outbox; mirror mode answers a voice
//! note with text and a voice note; a failing speech endpoint still delivers the text; a
//! kill -9 during a transcription transcribes once after the restart; §6 retries and refusals.

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

use crate::support::audio_files::{self, silent_wav};
use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, provider_toml};
use crate::support::fake_audio::{FIXTURE, FakeAudio};
use crate::support::fake_llm::{FakeLlm, Reply, Wire, last_user_text};
use crate::support::fake_telegram::FakeTelegram;
use crate::support::{free_port, wait_until};

const TOKEN: &str = "123456:TEST-voice-token";
const ALICE: i64 = 1001;
const WAIT: Duration = Duration::from_secs(40);
const AUDIO_KEY: &str = "sk-audio-test";
/// What the fake transcribes the fixture as (what espeak-ng said when it was made).
const SAID: &str = "Hello agent, what is the weather tomorrow?";
/// The fixture plays 2.822 s (opusinfo), shown rounded.
const LABEL: &str = "[voice note 0:03]";

/// The provider file of the audio models on `audio`.
fn audio_provider(audio: &FakeAudio) -> String {
    format!(
        r#"
type = "openai"
base_url = "{}"
api_key_env = "AGENTD_AUDIO_KEY"

[models.whisper]
model = "whisper-1"
cost_per_minute = 0.006

[models.speech]
model = "gpt-4o-mini-tts"
cost_per_1k_chars = 0.015
"#,
        audio.base_url()
    )
}

/// A daemon with `primary` on `llm`, the audio models on `audio`, `[voice]` lines `voice`,
/// and `extra` sections (Telegram, HTTP).
fn daemon(llm: &FakeLlm, audio: &FakeAudio, voice: &str, extra: &str, key: &str) -> TestDaemon {
    let toml = agentd_toml("fake")
        .replace(r#"load = ["fake"]"#, r#"load = ["fake", "audio"]"#)
        .replace(
            "[behavior]",
            &format!("[voice]\n{voice}\n\n{extra}\n[behavior]\ndebounce_ms = 50"),
        );
    let mut d = TestDaemon::new(
        &toml,
        &[
            ("fake", &provider_toml("openai", &llm.base_url())),
            ("audio", &audio_provider(audio)),
        ],
    );
    d.set_env("AGENTD_AUDIO_KEY", key);
    d.set_env("AGENTD_TELEGRAM_TOKEN", TOKEN);
    d
}

/// A started daemon (see [`daemon`]) with HTTP on and its token set, once its API answers.
struct HttpDaemon {
    d: TestDaemon,
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    base: String,
}

impl HttpDaemon {
    fn start(llm: &FakeLlm, audio: &FakeAudio, voice: &str, key: &str) -> HttpDaemon {
        let port = free_port();
        let http = format!("[http]\nenabled = true\nport = {port}\n");
        let mut d = daemon(llm, audio, voice, &http, key);
        d.set_env("AGENTD_HTTP_TOKEN", "http-token");
        d.start();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        wait_until(WAIT, "HTTP up", || {
            rt.block_on(client.get(format!("{base}/api/v1/status")).send())
                .ok()
        });
        HttpDaemon {
            d,
            rt,
            client,
            base,
        }
    }

    /// POST `body` to `path` with the token; the answer must be 200, its JSON is returned.
    fn post(&self, path: &str, body: Value) -> Value {
        let r = self
            .rt
            .block_on(
                self.client
                    .post(format!("{}{path}", self.base))
                    .bearer_auth("http-token")
                    .json(&body)
                    .send(),
            )
            .unwrap();
        assert_eq!(r.status(), 200);
        self.rt.block_on(r.json()).unwrap()
    }
}

fn telegram(tg: &FakeTelegram) -> String {
    format!(
        "[channel.telegram]\nenabled = true\napi_url = \"{}\"\nallow_from = [{ALICE}]\npoll_timeout_seconds = 1\ncontacts = {{ Alice = {ALICE} }}\n",
        tg.api_url()
    )
}

/// `(call_type, model, cost_usd)` of every cost row.
fn costs(state_dir: &Path) -> Vec<(String, String, f64)> {
    let conn = rusqlite::Connection::open(state_dir.join("agentd.db")).unwrap();
    let mut st = conn
        .prepare("SELECT call_type, model, cost_usd FROM costs ORDER BY id")
        .unwrap();
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn intakes(d: &TestDaemon, key: &str) -> Vec<Value> {
    d.trail(key)
        .into_iter()
        .filter(|l| l["type"] == "intake")
        .collect()
}

#[test]
fn a_telegram_voice_note_is_transcribed_answered_echoed_and_billed() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("Sunny tomorrow."));
    let audio = FakeAudio::spawn(Some(AUDIO_KEY), SAID);
    // §6: a 429 and a 503 are retried with backoff, then the answer comes.
    audio.fail_next("transcriptions", &[429, 503]);
    let tg = FakeTelegram::spawn(TOKEN);
    let mut d = daemon(
        &llm,
        &audio,
        r#"stt_model = "whisper""#,
        &telegram(&tg),
        AUDIO_KEY,
    );
    d.start();
    tg.push_voice(ALICE, ALICE, FIXTURE, 3);
    wait_until(WAIT, "the reply", || {
        tg.sent_to(ALICE)
            .iter()
            .any(|m| m.contains("Sunny tomorrow."))
            .then_some(())
    });
    let sent = audio.transcriptions();
    assert_eq!(sent.len(), 3, "two refusals retried, then the answer");
    for t in &sent {
        assert_eq!(
            t.bytes, FIXTURE,
            "the request carries exactly the voice note's bytes"
        );
        assert_eq!(t.model, "whisper-1");
        assert!(t.file_name.ends_with(".oga"), "{}", t.file_name);
        assert_eq!(t.authorization.as_deref(), Some("Bearer sk-audio-test"));
    }
    assert!(audio.rejected().is_empty(), "{:?}", audio.rejected());
    // The transcript is the user turn, with the duration read from the OGG stream.
    let asked = last_user_text(&llm.requests()[0]);
    assert!(asked.contains(&format!("{LABEL} {SAID}")), "{asked}");
    // Echoed in the chat.
    wait_until(WAIT, "the echo", || {
        tg.sent_to(ALICE)
            .iter()
            .any(|m| m.contains(SAID))
            .then_some(())
    });
    // The audio stays in inbox/, named in the intake.
    let intake = &intakes(&d, "Alice")[0];
    let file = intake["attachments"][0].as_str().unwrap();
    assert_eq!(std::fs::read(file).unwrap(), FIXTURE);
    // One transcription row, priced per minute (2.822 s at $0.006/min).
    let rows: Vec<_> = costs(&d.state_dir)
        .into_iter()
        .filter(|r| r.0 == "transcription")
        .collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].1, "whisper-1");
    assert!((rows[0].2 - 0.006 * 2.822 / 60.0).abs() < 1e-6, "{rows:?}");
}

/// A bad key is a 401, not retried (§6), and the message still goes through with the
/// placeholder naming the saved file.
#[test]
fn a_refused_transcription_keeps_the_placeholder() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("I got a voice note."));
    let audio = FakeAudio::spawn(Some(AUDIO_KEY), SAID);
    let tg = FakeTelegram::spawn(TOKEN);
    let mut d = daemon(
        &llm,
        &audio,
        r#"stt_model = "whisper""#,
        &telegram(&tg),
        "sk-wrong",
    );
    d.start();
    tg.push_voice(ALICE, ALICE, FIXTURE, 3);
    wait_until(WAIT, "the reply", || {
        (!tg.sent_to(ALICE).is_empty()).then_some(())
    });
    assert_eq!(audio.rejected().len(), 1, "a 401 is not retried");
    assert_eq!(audio.rejected()[0].0, 401);
    let asked = last_user_text(&llm.requests()[0]);
    assert!(
        asked.contains("[voice note saved as ") && asked.contains("HTTP 401"),
        "{asked}"
    );
    assert!(!d.log().contains("sk-wrong"), "the key is never logged");
}

#[test]
fn an_http_audio_attachment_is_transcribed_after_the_message_text() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("It will rain."));
    let audio = FakeAudio::spawn(None, SAID);
    audio.set_duration(Some(2.822));
    let http = HttpDaemon::start(&llm, &audio, r#"stt_model = "whisper""#, "unused");
    let data = base64::engine::general_purpose::STANDARD.encode(FIXTURE);
    let body = http.post(
        "/api/v1/chat",
        json!({"message": "Please answer this", "sender": "svc",
            "attachments": [{"content_type": "audio/ogg", "data": data, "filename": "q.ogg"}]}),
    );
    assert_eq!(body["reply"], "It will rain.");
    assert!(
        body.get("attachments").is_none(),
        "no speech was made: {body}"
    );
    let sent = audio.transcriptions();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].bytes, FIXTURE);
    let asked = last_user_text(&llm.requests()[0]);
    assert!(
        asked.contains(&format!("Please answer this\n{LABEL} {SAID}")),
        "{asked}"
    );
}

/// The model calls `tts`: one speech request (model, input, voice, opus), the fixture goes to
/// Alice's chat as `sendVoice`, a `tts` cost row is written.
#[test]
fn the_tts_tool_sends_a_voice_note_to_the_chat() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::tool_calls(vec![(
        "t1",
        "tts",
        json!({"text": "It will be sunny."}),
    )]));
    llm.push(Reply::text("Sent you a voice note."));
    let audio = FakeAudio::spawn(Some(AUDIO_KEY), SAID);
    let tg = FakeTelegram::spawn(TOKEN);
    let mut d = daemon(
        &llm,
        &audio,
        r#"tts_model = "speech""#,
        &telegram(&tg),
        AUDIO_KEY,
    );
    d.start();
    tg.push_text(ALICE, ALICE, "say the forecast");
    let voice = wait_until(WAIT, "the voice note", || {
        tg.sent_files()
            .into_iter()
            .find(|f| f.method == "sendvoice")
    });
    assert_eq!(voice.chat_id, ALICE);
    assert_eq!(voice.bytes, FIXTURE);
    let speech = audio.speeches();
    assert_eq!(speech.len(), 1);
    assert_eq!(
        speech[0].body,
        json!({"model": "gpt-4o-mini-tts", "input": "It will be sunny.", "voice": "alloy",
               "response_format": "opus"})
    );
    wait_until(WAIT, "the text reply", || {
        tg.sent_to(ALICE)
            .iter()
            .any(|m| m.contains("Sent you a voice note."))
            .then_some(())
    });
    let rows: Vec<_> = costs(&d.state_dir)
        .into_iter()
        .filter(|r| r.0 == "tts")
        .collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!((rows[0].2 - 0.015 * 17.0 / 1000.0).abs() < 1e-9, "{rows:?}");
    // The send is in the outbox's records.
    assert!(d.trail("Alice").iter().any(|l| {
        l["type"] == "delivery"
            && l["status"] == "done"
            && l["reply_to"][0]
                .as_str()
                .is_some_and(|r| r.starts_with("tool-"))
    }));
}

/// Mirror: a voice note is answered with the text and a voice note of it.
#[test]
fn mirror_mode_answers_a_voice_note_with_text_and_voice() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("Sunny and warm."));
    let audio = FakeAudio::spawn(Some(AUDIO_KEY), SAID);
    let tg = FakeTelegram::spawn(TOKEN);
    let voice = "stt_model = \"whisper\"\ntts_model = \"speech\"\nreply = \"mirror\"\necho_transcript = false";
    let mut d = daemon(&llm, &audio, voice, &telegram(&tg), AUDIO_KEY);
    d.start();
    tg.push_voice(ALICE, ALICE, FIXTURE, 3);
    let sent = wait_until(WAIT, "the spoken reply", || {
        tg.sent_files()
            .into_iter()
            .find(|f| f.method == "sendvoice")
    });
    assert_eq!((sent.chat_id, sent.bytes.as_slice()), (ALICE, FIXTURE));
    assert_eq!(
        tg.sent_to(ALICE),
        vec!["Sunny and warm.".to_string()],
        "text too, no echo"
    );
    assert_eq!(audio.speeches()[0].body["input"], "Sunny and warm.");
    wait_until(WAIT, "the voice delivery record", || {
        d.trail("Alice")
            .iter()
            .any(|l| {
                l["type"] == "delivery"
                    && l["status"] == "done"
                    && l["reply_to"][0]
                        .as_str()
                        .is_some_and(|r| r.ends_with(":voice"))
            })
            .then_some(())
    });
}

/// A speech endpoint that refuses still lets the text through.
#[test]
fn a_failing_speech_endpoint_still_delivers_the_text() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("Here is the text anyway."));
    let audio = FakeAudio::spawn(Some(AUDIO_KEY), SAID);
    audio.fail_next("speech", &[400]);
    let tg = FakeTelegram::spawn(TOKEN);
    let voice = "stt_model = \"whisper\"\ntts_model = \"speech\"\nreply = \"always\"";
    let mut d = daemon(&llm, &audio, voice, &telegram(&tg), AUDIO_KEY);
    d.start();
    tg.push_text(ALICE, ALICE, "hi");
    wait_until(WAIT, "the text reply", || {
        tg.sent_to(ALICE)
            .iter()
            .any(|m| m.contains("Here is the text anyway."))
            .then_some(())
    });
    d.wait_log("the spoken reply was not made");
    assert_eq!(audio.speeches().len(), 1, "a 400 is not retried");
    assert!(tg.sent_files().is_empty());
}

/// kill -9 while the transcription is in flight: nothing was recorded, Telegram offers the
/// update again, it is transcribed once more and answered once; one cost row.
#[test]
fn kill9_during_a_transcription_transcribes_once_after_restart() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("Answered after the restart."));
    let audio = FakeAudio::spawn(Some(AUDIO_KEY), SAID);
    audio.hang_next("transcriptions", 1);
    let tg = FakeTelegram::spawn(TOKEN);
    let mut d = daemon(
        &llm,
        &audio,
        r#"stt_model = "whisper""#,
        &telegram(&tg),
        AUDIO_KEY,
    );
    d.start();
    tg.push_voice(ALICE, ALICE, FIXTURE, 3);
    wait_until(WAIT, "the transcription in flight", || {
        (audio.transcriptions().len() == 1).then_some(())
    });
    d.kill9();
    assert!(intakes(&d, "Alice").is_empty(), "nothing was acknowledged");
    d.start();
    wait_until(WAIT, "the reply", || {
        tg.sent_to(ALICE)
            .iter()
            .any(|m| m.contains("Answered after the restart."))
            .then_some(())
    });
    assert_eq!(audio.transcriptions().len(), 2);
    let all = intakes(&d, "Alice");
    assert_eq!(all.len(), 1, "{all:?}");
    assert!(all[0]["text"].as_str().unwrap().contains(SAID));
    assert_eq!(llm.requests().len(), 1, "answered once");
    let rows = costs(&d.state_dir);
    assert_eq!(
        rows.iter().filter(|r| r.0 == "transcription").count(),
        1,
        "{rows:?}"
    );
}

/// Outside Telegram the speech stays in `inbox/`, the tool's result is its path, and the HTTP
/// `/chat` answer lists it in `attachments`.
#[test]
fn over_http_the_speech_file_is_listed_in_the_answer() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::tool_calls(vec![(
        "t1",
        "tts",
        json!({"text": "Good morning.", "voice": "nova"}),
    )]));
    llm.push(Reply::text("Here it is."));
    let audio = FakeAudio::spawn(Some(AUDIO_KEY), SAID);
    let http = HttpDaemon::start(&llm, &audio, r#"tts_model = "speech""#, AUDIO_KEY);
    let body = http.post(
        "/api/v1/chat",
        json!({"message": "say good morning", "sender": "svc"}),
    );
    assert_eq!(body["reply"], "Here it is.");
    let listed = body["attachments"].as_array().expect("attachments listed");
    assert_eq!(listed.len(), 1, "{body}");
    assert_eq!(listed[0]["content_type"], "audio/ogg");
    let path = listed[0]["path"].as_str().unwrap();
    assert!(
        Path::new(path).starts_with(http.d.state_dir.join("inbox")),
        "{path}"
    );
    assert_eq!(std::fs::read(path).unwrap(), FIXTURE);
    assert_eq!(audio.speeches()[0].body["voice"], "nova");
    // The model read the path as the tool's result.
    let results = llm.requests()[1]["messages"].to_string();
    assert!(results.contains(path), "{results}");
}

/// ElevenLabs as a provider type: the `tts` tool asks its own API for OGG/Opus with the key in
/// `xi-api-key`, and the voice note reaches the chat.
#[test]
fn elevenlabs_speaks_through_its_own_api() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::tool_calls(vec![(
        "t1",
        "tts",
        json!({"text": "Bonjour."}),
    )]));
    llm.push(Reply::text("Voilà."));
    let audio = FakeAudio::spawn(Some(AUDIO_KEY), SAID);
    let tg = FakeTelegram::spawn(TOKEN);
    let toml = agentd_toml("fake")
        .replace(r#"load = ["fake"]"#, r#"load = ["fake", "eleven"]"#)
        .replace(
            "[behavior]",
            &format!(
                "[voice]\ntts_model = \"eleven\"\nvoice = \"JBFqnCBsd6RMkjVDRZzb\"\n\n{}\n[behavior]",
                telegram(&tg)
            ),
        );
    let eleven = format!(
        "type = \"elevenlabs\"\nbase_url = \"{}\"\napi_key_env = \"AGENTD_ELEVENLABS_KEY\"\n\n[models.eleven]\nmodel = \"eleven_multilingual_v2\"\ncost_per_1k_chars = 0.3\n",
        audio.base_url()
    );
    let mut d = TestDaemon::new(
        &toml,
        &[
            ("fake", &provider_toml("openai", &llm.base_url())),
            ("eleven", &eleven),
        ],
    );
    d.set_env("AGENTD_ELEVENLABS_KEY", AUDIO_KEY);
    d.set_env("AGENTD_TELEGRAM_TOKEN", TOKEN);
    d.start();
    tg.push_text(ALICE, ALICE, "say hello in French");
    let voice = wait_until(WAIT, "the voice note", || {
        tg.sent_files()
            .into_iter()
            .find(|f| f.method == "sendvoice")
    });
    assert_eq!((voice.chat_id, voice.bytes.as_slice()), (ALICE, FIXTURE));
    assert_eq!(
        audio.speeches()[0].body,
        json!({"text": "Bonjour.", "model_id": "eleven_multilingual_v2",
               "voice_id": "JBFqnCBsd6RMkjVDRZzb", "output_format": "opus_48000_64"})
    );
    assert!(audio.rejected().is_empty(), "{:?}", audio.rejected());
    let rows: Vec<_> = costs(&d.state_dir)
        .into_iter()
        .filter(|r| r.0 == "tts")
        .collect();
    assert_eq!(rows.len(), 1);
    assert!((rows[0].2 - 0.3 * 8.0 / 1000.0).abs() < 1e-9, "{rows:?}");
}

/// The FIFO's audio attachments are transcribed too (SPEC §19).
#[test]
fn a_fifo_audio_attachment_is_transcribed() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("Noted."));
    let audio = FakeAudio::spawn(None, SAID);
    let mut d = daemon(&llm, &audio, r#"stt_model = "whisper""#, "", "unused");
    d.start();
    let inbox = d.state_dir.join("inbox");
    std::fs::create_dir_all(&inbox).unwrap();
    let file = inbox.join("memo.ogg");
    std::fs::write(&file, FIXTURE).unwrap();
    let line = json!({"id": "f1", "type": "user", "text": "a memo", "sender": "ops",
                      "attachments": [file]});
    crate::support::e2e::fifo_write(&d, &line.to_string());
    let outcome = crate::support::e2e::wait_outcome(&d, "ops", "f1");
    assert_eq!(outcome["text"], "Noted.");
    assert_eq!(audio.transcriptions()[0].bytes, FIXTURE);
    let asked = last_user_text(&llm.requests()[0]);
    assert!(
        asked.contains(&format!("a memo\n{LABEL} {SAID}")),
        "{asked}"
    );
}

/// The OpenAI-compatible endpoint (SPEC §17): an `input_audio` part is saved as an attachment
/// and transcribed by the intake like any other audio, the transcript after the text parts.
#[test]
fn an_openai_compatible_input_audio_part_is_transcribed() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::text("Heard you."));
    let audio = FakeAudio::spawn(None, SAID);
    audio.set_duration(Some(1.0));
    let http = HttpDaemon::start(&llm, &audio, r#"stt_model = "whisper""#, "unused");
    let wav = silent_wav(1000);
    let data = base64::engine::general_purpose::STANDARD.encode(&wav);
    let body = http.post(
        "/v1/chat/completions",
        json!({"model": "agentd", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Please answer this"},
            {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
        ]}]}),
    );
    assert_eq!(
        body["choices"][0]["message"]["content"], "Heard you.",
        "{body}"
    );
    let sent = audio.transcriptions();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].bytes, wav, "exactly the client's bytes");
    let asked = last_user_text(&llm.requests()[0]);
    assert!(
        asked.contains(&format!("Please answer this\n[voice note 0:01] {SAID}")),
        "{asked}"
    );
}

const BOB: i64 = 2002;

/// `[channel.telegram]` with Alice and Bob allowed, each a contact.
fn telegram_two(tg: &FakeTelegram) -> String {
    format!(
        "[channel.telegram]\nenabled = true\napi_url = \"{}\"\nallow_from = [{ALICE}, {BOB}]\npoll_timeout_seconds = 1\ncontacts = {{ Alice = {ALICE}, Bob = {BOB} }}\n",
        tg.api_url()
    )
}

/// Security round 3, item 5: a spent budget means no transcription call and no cost row; the
/// voice note keeps its placeholder, naming the limit.
#[test]
fn a_spent_budget_transcribes_nothing() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.push(Reply::Text {
        text: "expensive".into(),
        usage: crate::support::fake_llm::Usage::new(1_000_000, 0, 0, 0),
    });
    let audio = FakeAudio::spawn(Some(AUDIO_KEY), SAID);
    let tg = FakeTelegram::spawn(TOKEN);
    let extra = format!("{}\n[budget]\ndaily_usd = 1.0\n", telegram(&tg));
    let mut d = daemon(&llm, &audio, r#"stt_model = "whisper""#, &extra, AUDIO_KEY);
    d.start();
    tg.push_text(ALICE, ALICE, "spend it all");
    wait_until(WAIT, "the expensive reply", || {
        tg.sent_to(ALICE)
            .iter()
            .any(|m| m.contains("expensive"))
            .then_some(())
    });
    tg.push_voice(ALICE, ALICE, FIXTURE, 3);
    let intake = wait_until(WAIT, "the voice note's intake", || {
        intakes(&d, "Alice").get(1).cloned()
    });
    let text = intake["text"].as_str().unwrap_or_default().to_string();
    eprintln!("voice note recorded over budget as: {text}");
    assert!(
        text.contains("[voice note saved as ") && text.contains("daily_usd"),
        "{text}"
    );
    assert!(
        audio.transcriptions().is_empty(),
        "a transcription was made over budget"
    );
    let rows = costs(&d.state_dir);
    assert!(
        rows.iter().all(|r| r.0 != "transcription"),
        "a transcription row over budget: {rows:?}"
    );
}

/// Security round 3, item 5: 20 voice notes from Alice, each taking the transcription server
/// 3 s, hold neither Bob's text nor Bob's press of an approval button: the text's intake is
/// recorded and the press decided within 2 s, while Alice's notes are still being transcribed.
#[test]
fn slow_voice_notes_hold_neither_another_chat_nor_a_button() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    // Bob's "please read" asks for a gated `read`; everything else is echoed.
    llm.set_responder(|body| {
        let asks = last_user_text(body).contains("please read");
        let answered = body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|x| x["role"] == "tool"));
        (asks && !answered)
            .then(|| Reply::tool_calls(vec![("r1", "read", json!({"path": "notes.txt"}))]))
    });
    let audio = FakeAudio::spawn(Some(AUDIO_KEY), SAID);
    let tg = FakeTelegram::spawn(TOKEN);
    let extra = format!("{}\n[approvals]\nrequire = [\"read\"]\n", telegram_two(&tg));
    let voice = "stt_model = \"whisper\"\necho_transcript = false";
    let mut d = daemon(&llm, &audio, voice, &extra, AUDIO_KEY);
    d.start();
    tg.push_text(BOB, BOB, "please read my notes");
    let prompt = wait_until(WAIT, "Bob's approval prompt", || {
        tg.sent()
            .into_iter()
            .find(|m| m.chat_id == BOB && !m.buttons.is_empty())
    });

    audio.set_delay(Duration::from_secs(3));
    for _ in 0..20 {
        tg.push_voice(ALICE, ALICE, FIXTURE, 3);
    }
    wait_until(WAIT, "Alice's first transcription in flight", || {
        (!audio.transcriptions().is_empty()).then_some(())
    });
    let t0 = std::time::Instant::now();
    let text = tg.push_text(BOB, BOB, "are you there?");
    let query = tg.push_callback(BOB, BOB, prompt.message_id, &prompt.buttons[0]);
    let id = format!("tg-{}-{}", tg.bot_id(), text.update_id);
    let (mut recorded, mut decided) = (None, None);
    wait_until(
        Duration::from_secs(10),
        "Bob's text recorded and his press decided",
        || {
            if recorded.is_none() && intakes(&d, "Bob").iter().any(|i| i["id"] == id.as_str()) {
                recorded = Some(t0.elapsed());
            }
            if decided.is_none() {
                decided = tg
                    .callback_answers()
                    .into_iter()
                    .find(|a| a.query_id == query)
                    .map(|a| (t0.elapsed(), a.text.unwrap_or_default()));
            }
            (recorded.is_some() && decided.is_some()).then_some(())
        },
    );
    let (recorded, (decided, answer)) = (recorded.unwrap(), decided.unwrap());
    let started = audio.transcriptions().len();
    eprintln!(
        "while Alice's 20 notes (3 s each) were transcribed: Bob's text recorded after {} ms, \
         his press decided after {} ms ({started} of 20 transcriptions started by then)",
        recorded.as_millis(),
        decided.as_millis()
    );
    assert_eq!(answer, "Approved.");
    assert!(recorded <= Duration::from_secs(2), "text: {recorded:?}");
    assert!(decided <= Duration::from_secs(2), "press: {decided:?}");
    assert!(
        started < 20,
        "the check must run while Alice's notes are still being transcribed"
    );
}

/// A daemon with HTTP on, `stt_model` and `max_audio_seconds = 60`.
fn limited_http(llm: &FakeLlm, audio: &FakeAudio) -> HttpDaemon {
    let voice = "stt_model = \"whisper\"\nmax_audio_seconds = 60";
    HttpDaemon::start(llm, audio, voice, "unused")
}

/// POST `bytes` to `/api/v1/chat` as an attachment `name` of `content_type`; the text the
/// model was asked.
fn chat_with_audio(http: &HttpDaemon, llm: &FakeLlm, bytes: &[u8], name: &str, ct: &str) -> String {
    let data = base64::engine::general_purpose::STANDARD.encode(bytes);
    http.post(
        "/api/v1/chat",
        json!({"message": "listen", "sender": "svc",
            "attachments": [{"content_type": ct, "data": data, "filename": name}]}),
    );
    let requests = llm.requests();
    last_user_text(requests.last().expect("a model call"))
}

/// Security round 3, item 6: the length that is billed and checked against
/// `max_audio_seconds` is read from the audio itself, every page and packet of it, not from a
/// header the sender writes: a 600 s OGG with a planted last page claiming 1 s is refused (60 s
/// limit), as is one whose every page understates its length; bytes that are no supported
/// audio (a PNG labelled `audio/ogg`) never reach the provider; an MP3 is billed by its frames
/// (the provider reports no duration).
#[test]
fn the_billed_length_is_read_from_the_audio_not_from_the_sender() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let audio = FakeAudio::spawn(None, SAID);
    let http = limited_http(&llm, &audio);

    // A valid last page (CRC and all) whose granule says 1 s, after 600 s of audio.
    let mut planted = audio_files::opus_stream_claiming(600, |g| g);
    let one_second = u64::from(audio_files::PRE_SKIP) + 48_000;
    planted.page(4, one_second, &[audio_files::PACKET_20MS]);
    let asked = chat_with_audio(&http, &llm, &planted.out, "long.ogg", "audio/ogg");
    eprintln!("600 s OGG claiming 1 s: {asked}");
    assert!(asked.contains("[voice note saved as "), "{asked}");
    assert!(audio.transcriptions().is_empty(), "the forged OGG was sent");

    // Every page understates by 600×: 600 s claiming 1 s, consistently.
    let forged = audio_files::opus_stream_claiming(600, |g| g / 600).out;
    let asked = chat_with_audio(&http, &llm, &forged, "quiet.ogg", "audio/ogg");
    eprintln!("600 s OGG whose every page claims 1/600: {asked}");
    assert!(asked.contains("max_audio_seconds"), "{asked}");
    assert!(audio.transcriptions().is_empty(), "the forged OGG was sent");

    // Not audio at all.
    let asked = chat_with_audio(&http, &llm, audio_files::PNG, "x.ogg", "audio/ogg");
    eprintln!("a PNG labelled audio/ogg: {asked}");
    assert!(asked.contains("[voice note saved as "), "{asked}");
    assert!(audio.transcriptions().is_empty(), "the PNG was sent");

    // An MP3 of 100 frames: transcribed and billed 2.61 s by its frames.
    let mp3 = audio_files::mp3_frames(100);
    let asked = chat_with_audio(&http, &llm, &mp3, "memo.mp3", "audio/mpeg");
    assert!(
        asked.contains(&format!("[voice note 0:03] {SAID}")),
        "{asked}"
    );
    assert_eq!(audio.transcriptions().len(), 1);
    let rows: Vec<_> = costs(&http.d.state_dir)
        .into_iter()
        .filter(|r| r.0 == "transcription")
        .collect();
    eprintln!("transcription rows: {rows:?}");
    assert_eq!(rows.len(), 1, "{rows:?}");
    let want = 0.006 * audio_files::mp3_seconds(100) / 60.0;
    assert!((rows[0].2 - want).abs() < 1e-9, "{rows:?}, want {want}");
}

/// Security round 3, item 6: the provider's reported duration counts when it is the larger:
/// the fixture (2.8 s by its pages) reported as 30 s is billed 30 s.
#[test]
fn the_providers_longer_duration_is_billed() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let audio = FakeAudio::spawn(None, SAID);
    audio.set_duration(Some(30.0));
    let http = HttpDaemon::start(&llm, &audio, r#"stt_model = "whisper""#, "unused");
    let asked = chat_with_audio(&http, &llm, FIXTURE, "q.ogg", "audio/ogg");
    assert!(
        asked.contains(&format!("[voice note 0:30] {SAID}")),
        "{asked}"
    );
    let rows: Vec<_> = costs(&http.d.state_dir)
        .into_iter()
        .filter(|r| r.0 == "transcription")
        .collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!((rows[0].2 - 0.006 * 30.0 / 60.0).abs() < 1e-9, "{rows:?}");
}

/// The stored Telegram offset of the fake's bot, if any.
fn stored_offset(d: &TestDaemon, tg: &FakeTelegram) -> Option<i64> {
    let conn = rusqlite::Connection::open(d.state_dir.join("agentd.db")).ok()?;
    conn.query_row(
        "SELECT value FROM kv WHERE key = ?1",
        [format!("telegram.{}.offset", tg.bot_id())],
        |r| r.get::<_, String>(0),
    )
    .ok()?
    .parse()
    .ok()
}

/// Security round 3, item 5 (what the lanes must keep): kill -9 while Alice's voice note is
/// being transcribed and Bob's later document and text are already recorded and answered. The
/// saved offset never passed Alice's note, so the restart is offered her note (transcribed
/// and answered once) and Bob's updates again, which are neither downloaded nor recorded nor
/// answered a second time.
#[test]
fn kill9_with_chats_in_flight_loses_nothing_and_repeats_nothing() {
    let llm = FakeLlm::spawn(Wire::OpenAi);
    let audio = FakeAudio::spawn(Some(AUDIO_KEY), SAID);
    audio.hang_next("transcriptions", 1);
    let tg = FakeTelegram::spawn(TOKEN);
    let voice = "stt_model = \"whisper\"\necho_transcript = false";
    let mut d = daemon(&llm, &audio, voice, &telegram_two(&tg), AUDIO_KEY);
    d.start();
    let note = tg.push_voice(ALICE, ALICE, FIXTURE, 3);
    wait_until(WAIT, "Alice's transcription in flight", || {
        (audio.transcriptions().len() == 1).then_some(())
    });
    let doc = tg.push_document(
        BOB,
        BOB,
        b"minutes",
        "minutes.txt",
        "text/plain",
        Some("the minutes"),
    );
    let text = tg.push_text(BOB, BOB, "and a question");
    let bob_id = |u: i64| format!("tg-{}-{u}", tg.bot_id());
    wait_until(WAIT, "Bob's two intakes", || {
        let ids: Vec<Value> = intakes(&d, "Bob").iter().map(|i| i["id"].clone()).collect();
        (ids.contains(&json!(bob_id(doc.update_id)))
            && ids.contains(&json!(bob_id(text.update_id))))
        .then_some(())
    });
    wait_until(WAIT, "Bob's replies delivered", || {
        let trail = d.trail("Bob");
        let delivered = |id: String| {
            trail.iter().any(|l| {
                l["type"] == "delivery"
                    && l["status"] == "done"
                    && l["reply_to"]
                        .as_array()
                        .is_some_and(|r| r.contains(&json!(id)))
            })
        };
        (delivered(bob_id(doc.update_id)) && delivered(bob_id(text.update_id))).then_some(())
    });
    let bob_replies = tg.sent_to(BOB).len();
    let offset = stored_offset(&d, &tg);
    eprintln!(
        "before kill -9: saved offset {offset:?}, Alice's note is update {}, Bob's {} and {}",
        note.update_id, doc.update_id, text.update_id
    );
    assert!(
        offset.is_none_or(|o| o <= note.update_id),
        "the offset passed Alice's unfinished note"
    );
    d.kill9();
    assert!(intakes(&d, "Alice").is_empty());
    d.start();
    wait_until(WAIT, "Alice's note answered", || {
        (!tg.sent_to(ALICE).is_empty()).then_some(())
    });
    let alice = intakes(&d, "Alice");
    assert_eq!(alice.len(), 1, "{alice:?}");
    assert!(alice[0]["text"].as_str().unwrap().contains(SAID));
    assert_eq!(
        audio.transcriptions().len(),
        2,
        "the hung one, then once after the restart"
    );
    // Bob's updates came again and were dropped: one intake each, one download, no new reply.
    wait_until(WAIT, "the offset past Bob's updates", || {
        stored_offset(&d, &tg)
            .is_some_and(|o| o > text.update_id)
            .then_some(())
    });
    assert_eq!(intakes(&d, "Bob").len(), 2);
    let downloads = tg
        .requests()
        .iter()
        .filter(|(m, p)| m == "getfile" && p["file_id"] == json!(doc.file_id.clone().unwrap()))
        .count();
    assert_eq!(downloads, 1, "Bob's document was fetched again");
    assert_eq!(tg.sent_to(BOB).len(), bob_replies, "Bob was answered twice");
}

/// SPEC §19: "alloy" is the default voice only for OpenAI; an ElevenLabs `tts_model` without a
/// voice id fails `check-config` and the start (exit 1), naming the key, the model and the fix,
/// instead of a daemon whose every synthesis fails.
#[test]
fn elevenlabs_without_a_voice_id_fails_check_config_and_start() {
    let toml = agentd_toml("fake")
        .replace(r#"load = ["fake"]"#, r#"load = ["fake", "eleven"]"#)
        .replace(
            "[behavior]",
            "[voice]\ntts_model = \"eleven\"\n\n[behavior]",
        );
    let eleven = "type = \"elevenlabs\"\nbase_url = \"http://127.0.0.1:9/v1\"\napi_key_env = \"AGENTD_ELEVENLABS_KEY\"\n\n[models.eleven]\nmodel = \"eleven_multilingual_v2\"\n";
    let d = TestDaemon::new(
        &toml,
        &[
            ("fake", &provider_toml("openai", "http://127.0.0.1:9/v1")),
            ("eleven", eleven),
        ],
    );
    let expected = "voice.voice: not set, and tts_model \"eleven\" is an ElevenLabs model, which needs a voice id; set [voice] voice = \"<voice id>\"";
    for command in ["check-config", "run"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
            .args([command, "-c"])
            .arg(&d.config_path)
            .env("AGENTD_STATE_DIR", &d.state_dir)
            .env("AGENTD_ELEVENLABS_KEY", AUDIO_KEY)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!("agentd {command}: {:?}\n{err}", out.status.code());
        assert_eq!(out.status.code(), Some(1), "agentd {command}: {err}");
        assert!(err.contains(expected), "agentd {command}: {err}");
    }
}
