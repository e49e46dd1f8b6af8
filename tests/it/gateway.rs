//! The provider gateway against the real binary (issue 31 item 1): every provider call of
//! every kind passes the same budget check and leaves the same two traces, a cost row in the
//! ledger and a count in `/metrics`.
//!
//! - With the daily budget spent, a voice note is not transcribed and the `tts` tool makes no
//!   speech, each refused with the budget message (SPEC §8, §19); nothing reaches the audio
//!   server and no row is written.
//! - After a run that makes a call of each of the seven kinds (chat, streamed and not,
//!   subagent, compaction, consolidation, embedding, transcription, tts), `agentd_cost_usd_total` in `/metrics` equals
//!   the sum of the ledger's rows.

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

use crate::memory::memory_toml;
use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, provider_toml};
use crate::support::fake_audio::{FIXTURE, FakeAudio};
use crate::support::fake_embed::FakeEmbed;
use crate::support::fake_llm::{FakeLlm, Reply, Usage, Wire, last_user_text};
use crate::support::{free_port, wait_until};

const WAIT: Duration = Duration::from_secs(60);
const HTTP_TOKEN: &str = "gateway-token";
const AUDIO_KEY: &str = "sk-audio-gateway";
/// What the fake transcribes every file as.
const SAID: &str = "Hello agent, what is the weather tomorrow?";
/// Marks the compaction's summary requests.
const SUMMARY_MARK: &str = "COMPACTION-INSTRUCTIONS";
/// The start of the consolidation prompt (`memory::consolidate`).
const CONSOLIDATION_MARK: &str = "You maintain the long-term memory";
/// The start of the sub-agent's system prompt (`agent::subagent`).
const SUBAGENT_MARK: &str = "You are a sub-agent";
/// Every kind of provider call (SPEC §8).
const KINDS: [&str; 7] = [
    "chat",
    "subagent",
    "compaction",
    "consolidation",
    "embedding",
    "transcription",
    "tts",
];

/// The provider file of the audio models on `audio`, each priced.
fn audio_provider(audio: &FakeAudio) -> String {
    format!(
        "type = \"openai\"\nbase_url = \"{}\"\napi_key_env = \"AGENTD_AUDIO_KEY\"\n\n\
         [models.whisper]\nmodel = \"whisper-1\"\ncost_per_minute = 0.006\n\n\
         [models.speech]\nmodel = \"gpt-4o-mini-tts\"\ncost_per_1k_chars = 0.015\n",
        audio.base_url()
    )
}

/// A started daemon: `primary` on `llm` (Anthropic wire), the audio models on `audio`, HTTP
/// on, `[voice]` with both models, and the config sections `extra`.
struct Daemon {
    d: TestDaemon,
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    base: String,
}

impl Daemon {
    fn start(llm: &FakeLlm, audio: &FakeAudio, extra: &str) -> Daemon {
        let port = free_port();
        let toml = agentd_toml("fake")
            .replace(r#"load = ["fake"]"#, r#"load = ["fake", "audio"]"#)
            .replace(
                "[behavior]",
                &format!(
                    "[voice]\nstt_model = \"whisper\"\ntts_model = \"speech\"\n\n\
                     [http]\nenabled = true\nport = {port}\n\n[behavior]"
                ),
            );
        let mut d = TestDaemon::new(
            &format!("{toml}\n{extra}"),
            &[
                ("fake", &provider_toml("anthropic", &llm.base_url())),
                ("audio", &audio_provider(audio)),
            ],
        );
        d.set_env("AGENTD_AUDIO_KEY", AUDIO_KEY);
        d.set_env("AGENTD_HTTP_TOKEN", HTTP_TOKEN);
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
        Daemon {
            d,
            rt,
            client,
            base,
        }
    }

    /// `POST /api/v1/chat` from `svc`, with the fixture voice note attached when `voice`; the
    /// answer's status and JSON.
    fn chat(&self, text: &str, voice: bool) -> (u16, Value) {
        let mut body = json!({"message": text, "sender": "svc"});
        if voice {
            let data = base64::engine::general_purpose::STANDARD.encode(FIXTURE);
            body["attachments"] =
                json!([{"content_type": "audio/ogg", "data": data, "filename": "note.ogg"}]);
        }
        self.rt.block_on(async {
            let r = self
                .client
                .post(format!("{}/api/v1/chat", self.base))
                .bearer_auth(HTTP_TOKEN)
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
        })
    }

    /// A streamed `POST /v1/chat/completions` (the answer's deltas as the model writes them)
    /// in session `session`; the whole event stream.
    fn stream(&self, session: &str, text: &str) -> String {
        let body = json!({"model": "agentd", "stream": true,
                          "messages": [{"role": "user", "content": text}]});
        self.rt.block_on(async {
            let r = self
                .client
                .post(format!("{}/v1/chat/completions", self.base))
                .bearer_auth(HTTP_TOKEN)
                .header("X-Agentd-Session", session)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.text().await.unwrap()
        })
    }

    /// The value of the unlabelled counter `agentd_cost_usd_total` in `/metrics`.
    fn metrics_cost(&self) -> f64 {
        let text = self.rt.block_on(async {
            let r = self
                .client
                .get(format!("{}/metrics", self.base))
                .bearer_auth(HTTP_TOKEN)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.text().await.unwrap()
        });
        text.lines()
            .find_map(|l| l.strip_prefix("agentd_cost_usd_total "))
            .unwrap_or_else(|| panic!("no agentd_cost_usd_total in:\n{text}"))
            .trim()
            .parse()
            .unwrap()
    }
}

/// `(call_type, rows, sum of cost_usd)` per call type.
type Kinds = Vec<(String, i64, f64)>;

/// The ledger's rows per call type, and the sum over every row.
fn ledger(state_dir: &Path) -> (Kinds, f64) {
    let conn = rusqlite::Connection::open(state_dir.join("agentd.db")).unwrap();
    let mut st = conn
        .prepare(
            "SELECT call_type, COUNT(*), SUM(cost_usd) FROM costs GROUP BY call_type ORDER BY call_type",
        )
        .unwrap();
    let kinds: Kinds = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let total = conn
        .query_row("SELECT COALESCE(SUM(cost_usd), 0) FROM costs", [], |r| {
            r.get(0)
        })
        .unwrap();
    (kinds, total)
}

/// The contents of every tool result in `key`'s trail.
fn tool_results(d: &TestDaemon, key: &str) -> Vec<String> {
    d.trail(key)
        .iter()
        .filter(|l| l["type"] == "tool_result")
        .flat_map(|l| l["results"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["content"].as_str().map(str::to_string))
        .collect()
}

/// SPEC §8, §19: with the daily budget spent, neither a transcription nor a speech call is
/// made; the voice note keeps its placeholder and the `tts` tool's result is an error, each
/// naming the limit. The first answer costs $3.00 (a million input tokens at $3/Mtok) against
/// `daily_usd = 1.0` and asks for `tts`; the second message carries a voice note.
#[test]
fn a_spent_daily_budget_refuses_transcription_and_the_tts_tool() {
    let llm = FakeLlm::spawn(Wire::Anthropic);
    llm.push(Reply::ToolCalls {
        text: None,
        calls: vec![(
            "t1".into(),
            "tts".into(),
            json!({"text": "It will be sunny."}),
        )],
        usage: Usage::new(1_000_000, 0, 0, 0),
    });
    let audio = FakeAudio::spawn(Some(AUDIO_KEY), SAID);
    let d = Daemon::start(&llm, &audio, "[budget]\ndaily_usd = 1.0\n");
    const BUDGET: &str = "daily budget of $1.00 reached ($3.00 spent today)";

    let (status, first) = d.chat("say the forecast aloud", false);
    eprintln!("first message ({status}): {first}");
    let spoken = tool_results(&d.d, "http-svc");
    eprintln!("the tts tool's result: {spoken:?}");
    assert_eq!(spoken.len(), 1, "{spoken:?}");
    assert!(
        spoken[0].contains("speech not made") && spoken[0].contains(BUDGET),
        "{spoken:?}"
    );

    let (status, second) = d.chat("listen to this", true);
    eprintln!("second message ({status}): {second}");
    let intake =
        d.d.trail("http-svc")
            .into_iter()
            .filter(|l| l["type"] == "intake")
            .nth(1)
            .expect("the voice note's intake");
    let text = intake["text"].as_str().unwrap_or_default().to_string();
    eprintln!("the voice note was recorded as: {text}");
    assert!(
        text.contains("[voice note saved as ")
            && text.contains("not transcribed")
            && text.contains(BUDGET),
        "{text}"
    );

    assert!(audio.transcriptions().is_empty(), "transcribed over budget");
    assert!(audio.speeches().is_empty(), "spoke over budget");
    assert_eq!(llm.requests().len(), 1, "no model call over budget either");
    let (kinds, _) = ledger(&d.d.state_dir);
    assert_eq!(
        kinds
            .iter()
            .map(|(k, n, _)| (k.as_str(), *n))
            .collect::<Vec<_>>(),
        [("chat", 1)],
        "only the first answer is billed: {kinds:?}"
    );
}

/// About one token per four bytes of the request, so costs grow with the context.
fn usage_for(body: &Value, output: u64) -> Usage {
    Usage::new(body.to_string().len() as u64 / 4, output, 0, 0)
}

fn system_starts_with(body: &Value, mark: &str) -> bool {
    body["system"][0]["text"]
        .as_str()
        .is_some_and(|t| t.starts_with(mark))
}

fn answers_tool_results(body: &Value) -> bool {
    body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_array())
        .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"))
}

/// The fake's answers: the first message's first call asks for a sub-agent, speech and a
/// memory search; summaries, consolidations and the sub-agent get what they expect.
fn respond(body: &Value) -> Option<Reply> {
    let text = |t: String, output| Reply::Text {
        text: t,
        usage: usage_for(body, output),
    };
    if system_starts_with(body, CONSOLIDATION_MARK) {
        return Some(text(json!({"facts": []}).to_string(), 30));
    }
    if system_starts_with(body, SUMMARY_MARK) {
        return Some(text("SUMMARY: a voice note and two questions.".into(), 40));
    }
    if system_starts_with(body, SUBAGENT_MARK) {
        return Some(text("three".into(), 5));
    }
    if last_user_text(body).contains("FIRST") && !answers_tool_results(body) {
        let calls = vec![
            (
                "c1".to_string(),
                "sessions_spawn".to_string(),
                json!({"prompt": "count to three"}),
            ),
            ("c2".into(), "tts".into(), json!({"text": "Good morning."})),
            (
                "c3".into(),
                "memory_search".into(),
                json!({"query": "weather tomorrow"}),
            ),
        ];
        return Some(Reply::ToolCalls {
            text: None,
            calls,
            usage: usage_for(body, 20),
        });
    }
    Some(text(format!("answer {}", "r".repeat(400)), 80))
}

/// Issue 31: `/metrics` counted the cost of the agent loop's calls only (chat, sub-agent,
/// compaction), so it disagreed with the ledger. After a run with a call of every kind (a
/// streamed chat among them), its cost is the ledger's sum.
#[test]
fn metrics_cost_equals_the_ledger_after_every_call_kind() {
    let llm = FakeLlm::spawn(Wire::Anthropic);
    llm.set_responder(respond);
    let audio = FakeAudio::spawn(Some(AUDIO_KEY), SAID);
    let embed = FakeEmbed::spawn();
    let extra = format!(
        "[behavior.compaction]\nthreshold_tokens = 1500\nprompt = \"{SUMMARY_MARK}: summarise the conversation.\"\n\n\
         [tools]\nenabled = [\"sessions_spawn\", \"tts\", \"memory_search\"]\n{}",
        memory_toml(
            Some(&embed),
            "\n[memory.consolidation]\nenabled = true\nmin_messages = 2\n"
        )
    );
    let d = Daemon::start(&llm, &audio, &extra);

    let (status, first) = d.chat("FIRST: what does this say?", true);
    assert_eq!(status, 200, "{first}");
    for n in 2..=3 {
        let (status, body) = d.chat(&format!("question {n}: {}", "u".repeat(400)), false);
        assert_eq!(status, 200, "{body}");
    }
    let streamed = d.stream("streamed", "stream the answer");
    assert!(
        streamed.contains("answer rrr") && streamed.trim_end().ends_with("data: [DONE]"),
        "{streamed}"
    );
    // Compaction (and the consolidation before it) runs after a reply is delivered: wait
    // for a row of every kind, then for a second without a new row.
    let mut seen: Option<(Kinds, std::time::Instant)> = None;
    let kinds = wait_until(WAIT, "a cost row of every kind, then quiet", || {
        let (kinds, _) = ledger(&d.d.state_dir);
        let all = KINDS
            .iter()
            .all(|k| kinds.iter().any(|(have, _, _)| have == k));
        match &seen {
            Some((before, since)) if *before == kinds => {
                (all && since.elapsed() >= Duration::from_secs(1)).then_some(kinds)
            }
            _ => {
                seen = Some((kinds, std::time::Instant::now()));
                None
            }
        }
    });
    let metrics = d.metrics_cost();
    let (after, sum) = ledger(&d.d.state_dir);
    eprintln!("ledger rows per kind (kind, rows, usd): {after:?}");
    eprintln!("ledger sum ${sum:.9}, /metrics agentd_cost_usd_total ${metrics:.9}");
    assert_eq!(kinds, after, "a call was still in flight");
    assert!(
        kinds.iter().all(|(_, _, usd)| *usd > 0.0),
        "every kind costs something here: {kinds:?}"
    );
    assert!(
        (metrics - sum).abs() < 1e-9,
        "/metrics says ${metrics}, the ledger ${sum}: {kinds:?}"
    );
}
