//! Provider faults end to end, against the real binary: the `primary` model (Anthropic wire)
//! has `fallback = ["backup"]` (OpenAI wire, another fake server). For each fault the test
//! counts the requests each fake received (retries are bounded: `api_retries` per model, then
//! the fallback, then `message_retries` of the whole chain), checks which model answered, what
//! the user got, and the `costs` table: one row per successful provider call, none for a failed
//! one (no double billing).
//!
//! The retry policy itself (`backoff`, `llm::router`) is unit-tested; this checks that the
//! daemon wires it up the same way for real messages.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{cost_rows, free_port, http};
use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, fifo_write, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};

const HTTP_TOKEN: &str = "faults-http-token";
const DEFAULT_ERROR: &str = "Sorry, something went wrong on my side. Please try again in a moment.";

/// `[models.<name>]` in a provider file of `kind` at `base_url`, with `extra` lines.
fn provider(kind: &str, base_url: &str, name: &str, model: &str, extra: &str) -> String {
    format!(
        "type = \"{kind}\"\nbase_url = \"{base_url}\"\n\n[models.{name}]\nmodel = \"{model}\"\n\
         max_tokens = 1024\ncost_per_mtok = {{ input = 3.0, output = 15.0, cache_read = 0.3, cache_write = 3.75 }}\n{extra}"
    )
}

/// A daemon whose `primary` (Anthropic wire at `primary_url`) falls back to `backup` (OpenAI
/// wire at `backup_url`); HTTP enabled on `port`. Defaults otherwise: `api_retries = 2`,
/// `message_retries = 1` (base delay 10 ms).
fn daemon(primary_url: &str, backup_url: &str, port: u16) -> TestDaemon {
    let toml = agentd_toml("anth")
        .replace("load = [\"anth\"]", "load = [\"anth\", \"oai\"]")
        .replace(
            "[behavior]",
            &format!("[http]\nenabled = true\nport = {port}\n\n[behavior]\ndebounce_ms = 0"),
        );
    let mut d = TestDaemon::new(
        &toml,
        &[
            (
                "anth",
                &provider(
                    "anthropic",
                    primary_url,
                    "primary",
                    "primary-model",
                    "fallback = [\"backup\"]\n",
                ),
            ),
            (
                "oai",
                &provider("openai", backup_url, "backup", "backup-model", ""),
            ),
        ],
    );
    d.set_env("AGENTD_HTTP_TOKEN", HTTP_TOKEN);
    d.start();
    d
}

/// Sends `text` as intake `id` through the FIFO and returns its outcome line and how long it
/// took.
fn ask(d: &TestDaemon, id: &str, text: &str) -> (Value, Duration) {
    let started = Instant::now();
    fifo_write(
        d,
        &json!({"id": id, "type": "user", "text": text, "sender": "faults"}).to_string(),
    );
    let fin = wait_outcome(d, "faults", id);
    (fin, started.elapsed())
}

fn costs(d: &TestDaemon) -> BTreeMap<(String, String), usize> {
    cost_rows(&d.state_dir.join("agentd.db"))
}

fn row(model: &str, n: usize) -> ((String, String), usize) {
    ((model.to_string(), "chat".to_string()), n)
}

/// Asserts the fakes got exactly `a` and `b` more requests than `before`, and that every
/// scripted reply was used (an extra request would have been answered by the echo instead).
fn assert_requests(
    primary: &FakeLlm,
    backup: &FakeLlm,
    before: (usize, usize),
    a: usize,
    b: usize,
    what: &str,
) {
    assert_eq!(
        primary.requests().len() - before.0,
        a,
        "{what}: requests to primary"
    );
    assert_eq!(
        backup.requests().len() - before.1,
        b,
        "{what}: requests to backup"
    );
    assert_eq!(
        primary.pending_replies(),
        0,
        "{what}: primary script used up"
    );
    assert_eq!(backup.pending_replies(), 0, "{what}: backup script used up");
}

fn counts(primary: &FakeLlm, backup: &FakeLlm) -> (usize, usize) {
    (primary.requests().len(), backup.requests().len())
}

#[test]
fn provider_faults_are_retried_fall_back_and_are_billed_once() {
    let primary = FakeLlm::spawn(Wire::Anthropic);
    let backup = FakeLlm::spawn(Wire::OpenAi);
    let port = free_port();
    let d = daemon(&primary.base_url(), &backup.base_url(), port);
    let mut expected: BTreeMap<(String, String), usize> = BTreeMap::new();

    // 429 with Retry-After: 1 → the retry waits the second the server asked for; no fallback.
    primary.push(Reply::Error {
        status: 429,
        message: "rate limited".into(),
        retry_after: Some(1),
    });
    primary.push(Reply::text("after the rate limit"));
    let before = counts(&primary, &backup);
    let (fin, took) = ask(&d, "f1", "one");
    assert_eq!(fin["text"], "after the rate limit", "{fin}");
    assert_eq!(fin["model"], "primary");
    assert!(
        took >= Duration::from_secs(1),
        "Retry-After honoured: {took:?}"
    );
    assert_requests(&primary, &backup, before, 2, 0, "429 + Retry-After");
    expected.extend([row("primary-model", 1)]);
    assert_eq!(
        costs(&d),
        expected,
        "one cost row for the one successful call"
    );

    // 500 until the model's retries are used up (1 + api_retries = 3) → the fallback answers.
    for _ in 0..3 {
        primary.push(Reply::error(500, "internal error"));
    }
    backup.push(Reply::text("from the backup"));
    let before = counts(&primary, &backup);
    let (fin, _) = ask(&d, "f2", "two");
    assert_eq!(fin["text"], "from the backup", "{fin}");
    assert_eq!(
        fin["model"], "backup",
        "the trail names the model that answered"
    );
    assert_requests(&primary, &backup, before, 3, 1, "500 ×3");
    expected.extend([row("backup-model", 1)]);
    assert_eq!(costs(&d), expected, "failed calls are not billed");

    // A stream that stops midway (after content: not retried, the fallback answers).
    primary.push(Reply::DropMidStream {
        text: "half of an answer that never ends".into(),
    });
    backup.push(Reply::text("backup after the cut"));
    let before = counts(&primary, &backup);
    let (fin, _) = ask(&d, "f3", "three");
    assert_eq!(fin["text"], "backup after the cut", "{fin}");
    assert_requests(&primary, &backup, before, 1, 1, "stream cut midway");
    expected.insert(("backup-model".into(), "chat".into()), 2);
    assert_eq!(costs(&d), expected);

    // Garbage instead of JSON / SSE: a decode error, not retried, the fallback answers.
    primary.push(Reply::Garbage);
    backup.push(Reply::text("backup after garbage"));
    let before = counts(&primary, &backup);
    let (fin, _) = ask(&d, "f4", "four");
    assert_eq!(fin["text"], "backup after garbage", "{fin}");
    assert_requests(&primary, &backup, before, 1, 1, "garbage");
    expected.insert(("backup-model".into(), "chat".into()), 3);
    assert_eq!(costs(&d), expected);

    // Everything overloaded: 529 from primary and 503 from the backup on every try. Bounded:
    // (1 + api_retries) per model, both models, then once more for message_retries = 1. The
    // user gets a clear error, nothing is billed.
    for _ in 0..6 {
        primary.push(Reply::Error {
            status: 529,
            message: "Overloaded".into(),
            retry_after: None,
        });
        backup.push(Reply::error(503, "unavailable"));
    }
    let before = counts(&primary, &backup);
    let (status, body) = http(
        port,
        "POST",
        "/api/v1/chat",
        Some(HTTP_TOKEN),
        Some(&json!({"message": "five", "sender": "faults-http"})),
    )
    .expect("POST /api/v1/chat");
    assert_eq!(status, 500, "{body}");
    let err: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let text = err["error"].as_str().unwrap_or_default();
    assert!(
        text.starts_with(DEFAULT_ERROR),
        "the configured error message: {err}"
    );
    assert!(text.contains("503"), "the last error is named: {err}");
    assert!(err["session_id"].is_string(), "{err}");
    assert_requests(&primary, &backup, before, 6, 6, "everything overloaded");
    let failure = d
        .trail("http-faults-http")
        .into_iter()
        .find(|l| l["type"] == "failure")
        .expect("a failure record");
    assert_eq!(failure["reply"], DEFAULT_ERROR);
    assert_eq!(costs(&d), expected, "no cost row for failed calls");

    // Requests stayed well-formed through it all: every retry sent the same body.
    let bodies = primary.requests();
    let last_six = &bodies[bodies.len() - 6..];
    assert!(
        last_six.windows(2).all(|w| w[0] == w[1]),
        "retries repeat the same request"
    );
    assert_eq!(cost_calls(&d.state_dir), expected.values().sum::<usize>());
}

/// The number of rows in `costs`.
fn cost_calls(state_dir: &Path) -> usize {
    cost_rows(&state_dir.join("agentd.db")).values().sum()
}

#[test]
fn unreachable_provider_is_retried_then_the_fallback_answers() {
    // A port nothing listens on: connection refused.
    let refused = format!("http://127.0.0.1:{}", free_port());
    let backup = FakeLlm::spawn(Wire::OpenAi);
    backup.push(Reply::text("backup answers"));
    let d = daemon(&refused, &backup.base_url(), free_port());
    let (fin, _) = ask(&d, "r1", "anyone there?");
    assert_eq!(fin["text"], "backup answers", "{fin}");
    assert_eq!(fin["model"], "backup");
    assert_eq!(backup.requests().len(), 1);
    let log = d.log();
    let retries = log
        .lines()
        .filter(|l| l.contains("retrying LLM call") && l.contains("model=primary"))
        .count();
    assert_eq!(
        retries, 2,
        "api_retries = 2 for a refused connection:\n{log}"
    );
    assert!(log.contains("falling back to the next model"), "{log}");
    assert_eq!(
        costs(&d),
        BTreeMap::from([row("backup-model", 1)]),
        "only the answered call is billed"
    );
}
