//! agentd against llama.cpp's real `llama-server` (installed from PyPI by
//! `scripts/install-test-peers.sh`, part `llama`), the way a user runs a local model: the
//! shipped `providers.d/llamacpp.toml` pointed at the server, a message through the FIFO, and
//! agentd's whole default tool list in the request. llama.cpp turns every tool's JSON Schema
//! into a grammar and refuses the whole request when one schema is beyond it, so one accepted
//! request proves every schema agentd sends is accepted.
//!
//! The model is SmolLM2-135M (the smallest that loads) under the Qwen2.5 chat template, which
//! declares tools: llama.cpp builds the grammar only under a template that does. What the
//! model answers is not judged here; that the server takes the request is.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, daemon_with, fifo_write, is_outcome_of, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Wire};
use crate::support::llama::{self, LlamaServer};
use crate::support::wait_until;

/// The server's context (SmolLM2 caps it at its 8,192 training tokens): agentd's system prompt
/// and default tool list take about 3,400.
const CTX: u32 = 8192;
/// Prompt processing runs at 50-100 tokens/s on a shared 2-core CPU: one request with the
/// whole tool list takes minutes, not seconds.
const OUTCOME_TIMEOUT: Duration = Duration::from_secs(1200);

/// The shipped `providers.d/llamacpp.toml` with the test server's `base_url`, and a small
/// `max_tokens` (the 135M model would otherwise ramble for thousands of tokens at a few per
/// second). `drop_keys` removes lines starting with those keys.
fn shipped_provider(base_url: &str, drop_keys: &[&str]) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("providers.d/llamacpp.toml");
    let text = std::fs::read_to_string(&path).expect("read providers.d/llamacpp.toml");
    assert!(
        text.contains("\nbase_url = ") && text.contains("\nmax_tokens = "),
        "providers.d/llamacpp.toml has no base_url or max_tokens line:\n{text}"
    );
    text.lines()
        .filter(|l| !drop_keys.iter().any(|k| l.starts_with(&format!("{k} ="))))
        .map(|l| {
            if l.starts_with("base_url = ") {
                format!("base_url = \"{base_url}\"")
            } else if l.starts_with("max_tokens = ") {
                "max_tokens = 32".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A started daemon whose only provider is `provider` (as `providers.d/llamacpp.toml`).
fn daemon(provider: &str) -> TestDaemon {
    let mut d = TestDaemon::new(&agentd_toml("llamacpp"), &[("llamacpp", provider)]);
    d.start();
    d
}

/// Sends one message through the FIFO and waits for its outcome line; returns it and how long
/// it took.
fn send(d: &TestDaemon, key: &str, id: &str, text: &str) -> (Value, Duration) {
    let t0 = Instant::now();
    let line = serde_json::json!({"id": id, "type": "user", "text": text, "sender": key});
    fifo_write(d, &line.to_string());
    let outcome = wait_until(OUTCOME_TIMEOUT, &format!("the outcome of {id}"), || {
        d.trail(key).into_iter().find(|l| is_outcome_of(l, id))
    });
    (outcome, t0.elapsed())
}

/// The tools of a request agentd sent, as the server rendered them into the prompt (Qwen2.5's
/// template lists one JSON object per line between a `<tools>` line and a `</tools>` line).
fn tools_in_prompt(prompt: &str) -> Vec<Value> {
    let Some(start) = prompt.find("\n<tools>\n") else {
        return Vec::new();
    };
    let end = prompt[start..]
        .find("\n</tools>")
        .map_or(prompt.len(), |e| start + e);
    prompt[start + "\n<tools>\n".len()..end]
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .collect()
}

/// The sorted names of `tools` (OpenAI's `{"type": "function", "function": {"name": …}}`).
fn names(tools: &[Value]) -> Vec<String> {
    let mut names: Vec<String> = tools
        .iter()
        .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
        .map(String::from)
        .collect();
    names.sort();
    names
}

/// The tools agentd sends with the same `agentd.toml` to any OpenAI-wire provider, read off a
/// fake one: the default tool list.
fn default_tools() -> Vec<Value> {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let d = daemon_with(&fake, "openai");
    fifo_write(
        &d,
        r#"{"id":"t1","type":"user","text":"hi","sender":"ref"}"#,
    );
    wait_outcome(&d, "ref", "t1");
    let first = fake.requests().into_iter().next().expect("a request");
    first["tools"].as_array().cloned().unwrap_or_default()
}

/// The issue's finding 1, fixed: with the shipped provider file, llama-server takes a request
/// carrying agentd's whole default tool list (every schema becomes a grammar) and answers it.
#[test]
fn llama_server_accepts_agentd_s_whole_tool_list() {
    let t0 = Instant::now();
    let install = llama::install();
    let installed = t0.elapsed();
    let server = LlamaServer::small(&install, CTX);
    let d = daemon(&shipped_provider(&server.base_url(), &[]));
    let (outcome, took) = send(&d, "lena", "m1", "Say hello in one word.");
    eprintln!(
        "local_model: install {:.1} s, message answered in {:.1} s, test {:.1} s",
        installed.as_secs_f64(),
        took.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    let log = server.log();
    assert!(
        !log.contains("failed to parse grammar"),
        "llama-server refused a schema; {}",
        server.log_tail()
    );
    assert!(
        log.contains("prompt eval time"),
        "llama-server answered nothing; {}",
        server.log_tail()
    );
    let prompts = server.prompts();
    let sent = tools_in_prompt(prompts.first().expect("llama-server logged no prompt"));
    let expected = default_tools();
    eprintln!(
        "local_model: {} tools in the request: {:?}",
        sent.len(),
        names(&sent)
    );
    assert!(expected.len() >= 10, "{expected:?}");
    assert_eq!(
        names(&sent),
        names(&expected),
        "not the whole default tool list"
    );
    // The bounds that made llama.cpp refuse (`maxLength: 2000`) are left out of what is sent:
    // agentd still checks each call against the full schema.
    for (tool, arg) in [("memory_write", "value"), ("memory_search", "query")] {
        let schema = sent
            .iter()
            .find(|t| t["function"]["name"] == tool)
            .unwrap_or_else(|| panic!("{tool} not sent"));
        let bound = &schema["function"]["parameters"]["properties"][arg]["maxLength"];
        assert!(
            bound.is_null() || bound.as_u64().is_some_and(|b| b < 2000),
            "{tool}.{arg} maxLength {bound}"
        );
    }
    // What the 135M model answers is not judged (an empty answer may fail the message): only
    // that no request was refused.
    eprintln!("local_model: the outcome: {outcome}");
    assert!(
        outcome["final"] == true || !outcome["error"].to_string().contains("HTTP"),
        "the message failed on a refused request: {outcome}"
    );
}

/// Before the fix agentd sent each schema whole: `memory_search.query` and
/// `memory_write.value` declare `maxLength: 2000`, and llama.cpp refuses the whole request
/// with 400 "failed to parse grammar". A provider file without `schema_keywords` and
/// `schema_max_length` still does, and the refusal reaches the trail as the failure.
#[test]
fn without_the_schema_dialect_llama_server_refuses_every_request() {
    let install = llama::install();
    let server = LlamaServer::small(&install, CTX);
    let provider = shipped_provider(
        &server.base_url(),
        &["schema_keywords", "schema_max_length"],
    );
    assert!(!provider.contains("schema_"), "{provider}");
    let d = daemon(&provider);
    let (outcome, took) = send(&d, "otto", "m1", "Say hello in one word.");
    eprintln!(
        "local_model: whole schemas refused in {:.1} s",
        took.as_secs_f64()
    );
    eprintln!("local_model: the failure: {outcome}");
    assert_eq!(outcome["type"], "failure", "{outcome}");
    let shown = outcome.to_string();
    assert!(
        shown.contains("400") && shown.to_lowercase().contains("failed to parse grammar"),
        "the failure does not name the refusal: {outcome}"
    );
    assert!(
        server.log().contains("failed to parse grammar"),
        "{}",
        server.log_tail()
    );
}
