//! The OpenAI- and Anthropic-compatible endpoints of the real daemon (SPEC §17), driven by the
//! official `openai` and `anthropic` Python SDKs (installed from PyPI by
//! `scripts/install-test-peers.sh`, run by `compat_clients.py`) against a fake provider.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::daemon::{TestDaemon, read_trail_files};
use crate::support::e2e::{agentd_toml, provider_toml};
use crate::support::fake_llm::{FakeLlm, Reply, Usage, Wire, last_user_text};
use crate::support::{free_port, wait_until};

pub(crate) const TOKEN: &str = "compat-token-123";

/// The SDKs, installed once per target dir.
pub(crate) fn sdk_dir() -> PathBuf {
    crate::support::test_peers("sdk", "python3/pip with registry access").join("sdk")
}

/// A started daemon with the HTTP API on a free port and `extra` appended to its config.
pub(crate) fn daemon(fake: &FakeLlm, extra: &str) -> (TestDaemon, String) {
    daemon_with(extra, &provider_toml("anthropic", &fake.base_url()))
}

/// [`daemon`] with `provider` as the text of its one provider file, `fake.toml`.
pub(crate) fn daemon_with(extra: &str, provider: &str) -> (TestDaemon, String) {
    let port = free_port();
    let mut d = TestDaemon::new(
        &format!(
            "{}\n[http]\nenabled = true\nport = {port}\n{extra}",
            agentd_toml("fake")
        ),
        &[("fake", provider)],
    );
    d.set_env("AGENTD_HTTP_TOKEN", TOKEN);
    d.start();
    let base = format!("http://127.0.0.1:{port}");
    wait_until(Duration::from_secs(20), "HTTP status", || {
        http_get(port, "/api/v1/status").filter(|r| r.starts_with("HTTP/1.1 200"))
    });
    (d, base)
}

/// A plain HTTP/1.1 GET on loopback; the whole answer, or `None` when nothing listens yet.
fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// Runs `compat_clients.py SCENARIO` and returns its steps by name.
pub(crate) fn run_clients(base: &str, scenario: &str) -> std::collections::BTreeMap<String, Value> {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/compat_clients.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(scenario)
        .env("PYTHONPATH", sdk_dir())
        .env("AGENTD_BASE", base)
        .env("AGENTD_TOKEN", TOKEN)
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "compat_clients.py {scenario} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            (v["step"].as_str().unwrap().to_string(), v)
        })
        .collect()
}

/// Answers by the new input: the last line of the last user text names the question.
fn answer(body: &Value) -> Option<Reply> {
    let text = last_user_text(body);
    let reply = |t: &str, usage| Reply::Text {
        text: t.into(),
        usage,
    };
    let last = text.lines().last().unwrap_or_default().to_string();
    Some(if last.ends_with("first question") {
        reply("Hello from agentd", Usage::new(100, 10, 50, 20))
    } else if last.ends_with("second question") {
        reply("Second answer", Usage::new(10, 5, 0, 0))
    } else if last.ends_with("hello messages") {
        reply("Hi from messages", Usage::new(30, 7, 40, 0))
    } else if last.ends_with("only once please") {
        reply("Once only", Usage::new(10, 5, 0, 0))
    } else if last.ends_with("what is my name?") {
        reply("Your name is Zed", Usage::new(10, 5, 0, 0))
    } else {
        reply(&format!("echo: {last}"), Usage::new(10, 5, 0, 0))
    })
}

#[test]
fn the_official_sdks_talk_to_the_real_daemon() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.set_responder(answer);
    let (mut d, base) = daemon(&fake, "");
    let steps = run_clients(&base, "basics");

    assert_eq!(steps["models"]["ids"], json!(["agentd", "agentd:primary"]));
    assert_eq!(steps["model"]["id"], "agentd:primary");
    let request_id = steps["model"]["request_id"].as_str().unwrap_or_default();
    assert_eq!(request_id.len(), 36, "{}", steps["model"]);
    assert_eq!(steps["missing_model"]["error"], "NotFoundError");
    // Anthropic clients get Anthropic's model objects, and an estimate of a request's tokens.
    assert_eq!(
        steps["ant_models"]["ids"],
        json!(["agentd", "agentd:primary"])
    );
    assert_eq!(steps["ant_model"]["type"], "model");
    assert_eq!(steps["ant_model"]["display_name"], "agentd:primary");
    assert_eq!(steps["ant_missing_model"]["status"], 404);
    let (short, long) = (
        steps["count_tokens"]["short"].as_u64().unwrap(),
        steps["count_tokens"]["long"].as_u64().unwrap(),
    );
    assert!(short > 0 && long > short + 400, "{}", steps["count_tokens"]);
    let no_tools = steps["no_tools"]["text"].as_str().unwrap_or_default();
    assert!(no_tools.ends_with("no tools please"), "{no_tools}");

    let chat = &steps["chat"];
    assert_eq!(chat["content"], "Hello from agentd");
    assert_eq!(chat["finish"], "stop");
    // SPEC §17: prompt = input + cache read + cache write; cached = cache read.
    assert_eq!(chat["usage"]["prompt_tokens"], 170);
    assert_eq!(chat["usage"]["completion_tokens"], 10);
    assert_eq!(chat["usage"]["total_tokens"], 180);
    assert_eq!(chat["usage"]["prompt_tokens_details"]["cached_tokens"], 50);

    // The second message of the session reached the provider with the first in its history,
    // and the client's system text as client instructions in the dynamic context.
    assert_eq!(steps["chat2"]["content"], "Second answer");
    let requests = fake.requests();
    let second = requests
        .iter()
        .find(|r| last_user_text(r).ends_with("second question"))
        .expect("the second question reached the provider");
    let sent = second["messages"].to_string();
    assert!(
        sent.contains("first question") && sent.contains("Hello from agentd"),
        "{sent}"
    );
    let first = &requests[0];
    let context = first["messages"].to_string();
    assert!(
        context.contains("<client-instructions>\\nAnswer in English.\\n</client-instructions>"),
        "{context}"
    );
    assert!(context.contains("Source: api"), "{context}");
    let trail = d.trail("api:sdk");
    let intakes: Vec<&Value> = trail.iter().filter(|l| l["type"] == "intake").collect();
    assert_eq!(intakes[0]["source"], "api");

    assert_eq!(steps["bad_key"]["error"], "AuthenticationError");
    assert_eq!(steps["bad_key_anthropic"]["error"], "AuthenticationError");

    let m = &steps["messages"];
    assert_eq!(m["text"], "Hi from messages");
    assert_eq!(m["stop"], "end_turn");
    assert_eq!(m["usage"]["input_tokens"], 30);
    assert_eq!(m["usage"]["cache_read_input_tokens"], 40);
    assert_eq!(m["usage"]["output_tokens"], 7);
    assert!(d.session_id("api:ant").is_some());

    // The same Idempotency-Key twice: one intake, one provider call, the same answer.
    let idem = &steps["idempotent"];
    assert_eq!(idem["ids"][0], idem["ids"][1]);
    assert_eq!(idem["content"], "Once only");
    let recorded = d
        .trail("api:sdk")
        .into_iter()
        .filter(|l| l["type"] == "intake" && l["id"] == "idem-0001")
        .count();
    assert_eq!(recorded, 1);
    let calls = fake
        .requests()
        .iter()
        .filter(|r| last_user_text(r).ends_with("only once please"))
        .count();
    assert_eq!(calls, 1);

    // No session: a one-off session with the request's history, answered, then archived.
    assert_eq!(steps["one_off"]["content"], "Your name is Zed");
    let call = fake
        .requests()
        .into_iter()
        .find(|r| last_user_text(r).ends_with("what is my name?"))
        .unwrap();
    let sent = call["messages"].to_string();
    assert!(
        sent.contains("my name is Zed") && sent.contains("Hello Zed."),
        "{sent}"
    );
    let archive = d.sessions_dir().join(".archive");
    let archived = wait_until(
        Duration::from_secs(20),
        "the one-off session archived",
        || {
            std::fs::read_dir(&archive).ok()?.flatten().find_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let id = name.split('.').next()?.to_string();
                let trail = read_trail_files(&archive, &id);
                trail
                    .iter()
                    .any(|l| {
                        l["type"] == "session"
                            && l["key"]
                                .as_str()
                                .is_some_and(|k| k.starts_with("api-once-"))
                    })
                    .then_some(trail)
            })
        },
    );
    assert!(archived.iter().any(|l| l["type"] == "reset"));
    assert!(
        archived
            .iter()
            .any(|l| l["final"] == true && l["text"] == "Your name is Zed"),
        "the reply is in the archived trail: {archived:?}"
    );
    assert!(d.sigterm().success());
}

#[test]
fn the_sdks_stream_chat_completions_and_messages() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.set_responder(|body| {
        let text = last_user_text(body);
        let last = text.lines().last().unwrap_or_default();
        Some(Reply::Text {
            text: if last.ends_with("stream to me") {
                "Streamed chat answer".into()
            } else {
                "Streamed messages answer".into()
            },
            usage: Usage::new(12, 6, 30, 4),
        })
    });
    let (mut d, base) = daemon(&fake, "");
    let steps = run_clients(&base, "streaming");
    let chat = &steps["chat_stream"];
    assert_eq!(chat["content"], "Streamed chat answer");
    assert_eq!(chat["finish"], "stop");
    assert_eq!(chat["usage"]["prompt_tokens"], 46);
    assert_eq!(chat["usage"]["completion_tokens"], 6);
    assert_eq!(chat["usage"]["prompt_tokens_details"]["cached_tokens"], 30);
    let m = &steps["messages_stream"];
    assert_eq!(m["text"], "Streamed messages answer");
    assert_eq!(m["stop"], "end_turn");
    assert_eq!(m["usage"]["input_tokens"], 12);
    assert_eq!(m["usage"]["cache_read_input_tokens"], 30);
    assert_eq!(m["usage"]["cache_creation_input_tokens"], 4);
    assert_eq!(m["usage"]["output_tokens"], 6);
    assert!(d.sigterm().success());
}

/// A streamed request over a raw connection: the request is sent, the answer read line by line.
struct RawStream {
    reader: std::io::BufReader<std::net::TcpStream>,
}

impl RawStream {
    fn post(port: u16, path: &str, headers: &[(&str, &str)], body: &Value) -> RawStream {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let body = body.to_string();
        let mut head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body.as_bytes()).unwrap();
        RawStream {
            reader: std::io::BufReader::new(s),
        }
    }

    /// Everything the server sends until it closes.
    fn rest(mut self) -> String {
        use std::io::Read;
        let mut out = String::new();
        let _ = self.reader.read_to_string(&mut out);
        out
    }

    /// The next SSE line (`data: …`, `event: …` or a `:` comment), skipping blank lines, the
    /// response head and the chunked-encoding size lines; `None` at the end.
    fn next(&mut self) -> Option<String> {
        use std::io::BufRead;
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let line = line.trim_end();
            if line.starts_with("data: ") || line.starts_with("event: ") || line.starts_with(':') {
                return Some(line.to_string());
            }
        }
    }
}

/// POST `body` to `path` with `headers` and the token; the JSON body of the answer (a plain,
/// not streamed, answer).
pub(crate) fn post_json(port: u16, path: &str, headers: &[(&str, &str)], body: &Value) -> Value {
    let all = RawStream::post(port, path, headers, body).rest();
    let (_, text) = all.split_once("\r\n\r\n").expect("an HTTP answer");
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {all}"))
}

/// The content of an OpenAI chunk line, if it carries any.
fn chunk_content(line: &str) -> Option<String> {
    let data = line.strip_prefix("data: ")?;
    let v: Value = serde_json::from_str(data).ok()?;
    v["choices"][0]["delta"]["content"]
        .as_str()
        .filter(|c| !c.is_empty())
        .map(str::to_string)
}

#[test]
fn a_two_tool_call_turn_streams_keep_alives_then_the_answer_and_a_client_that_leaves_cancels_nothing()
 {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    // Streamed to the end: two tool batches, then the answer, written in pieces.
    fake.push(Reply::tool_calls(vec![("t1", "session_status", json!({}))]));
    fake.push(Reply::tool_calls(vec![("t2", "session_status", json!({}))]));
    fake.push(Reply::text("The answer after two tools"));
    // The client that goes away: one tool batch, then an answer that waits for the gate.
    fake.push(Reply::tool_calls(vec![("t3", "session_status", json!({}))]));
    fake.push(Reply::text("Answered anyway").gated(&gate));
    let (mut d, base) = daemon(&fake, "");
    let port: u16 = base.rsplit(':').next().unwrap().parse().unwrap();
    let body = json!({"model": "agentd", "stream": true,
                      "messages": [{"role": "user", "content": "use two tools"}]});

    let mut s = RawStream::post(
        port,
        "/v1/chat/completions",
        &[("X-Agentd-Session", "tools")],
        &body,
    );
    let mut lines = Vec::new();
    while let Some(l) = s.next() {
        lines.push(l);
    }
    let keep_alives: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].starts_with(':'))
        .collect();
    let contents: Vec<(usize, String)> = lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| chunk_content(l).map(|c| (i, c)))
        .collect();
    assert!(
        keep_alives.len() >= 2,
        "a keep-alive per tool batch: {lines:#?}"
    );
    assert!(
        keep_alives.iter().all(|k| *k < contents[0].0),
        "keep-alives come before the answer: {lines:#?}"
    );
    let text: String = contents.iter().map(|(_, c)| c.as_str()).collect();
    assert_eq!(text, "The answer after two tools");
    assert!(
        contents.len() >= 2,
        "the answer arrives in pieces as written: {contents:?}"
    );
    assert_eq!(lines.last().map(String::as_str), Some("data: [DONE]"));

    // A client that goes away mid-stream: the message is still answered and recorded.
    let body = json!({"model": "agentd", "stream": true,
                      "messages": [{"role": "user", "content": "then leave"}]});
    let mut s = RawStream::post(
        port,
        "/v1/chat/completions",
        &[("X-Agentd-Session", "gone"), ("Idempotency-Key", "gone-1")],
        &body,
    );
    // The tool batch's keep-alive: the agent is working on it.
    while let Some(l) = s.next() {
        if l.starts_with(':') {
            break;
        }
    }
    drop(s);
    gate.add_permits(1);
    let outcome = crate::support::e2e::wait_outcome(&d, "api:gone", "gone-1");
    assert_eq!(outcome["text"], "Answered anyway");
    assert!(d.sigterm().success());
}

/// SPEC §17 with §5.2: a kill -9 while a streamed request waits for the model. The client's
/// stream breaks off without a finish (its error); after the restart the message is resumed
/// and its reply is in the trail.
#[test]
fn a_kill_9_during_a_streamed_request_resumes_the_message_after_restart() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    fake.push(Reply::text("never sent").gated(&gate));
    fake.push(Reply::text("Answered after the restart"));
    let (mut d, base) = daemon(&fake, "");
    let port: u16 = base.rsplit(':').next().unwrap().parse().unwrap();
    let body = json!({"model": "agentd", "max_tokens": 100, "stream": true,
                      "messages": [{"role": "user", "content": "survive a crash"}]});
    let mut s = RawStream::post(
        port,
        "/v1/messages",
        &[
            ("X-Agentd-Session", "crash"),
            ("Idempotency-Key", "crash-1"),
        ],
        &body,
    );
    assert_eq!(s.next().as_deref(), Some("event: message_start"));
    wait_until(Duration::from_secs(20), "the model call in flight", || {
        (!fake.requests().is_empty()).then_some(())
    });
    d.kill9();
    let mut rest = Vec::new();
    while let Some(l) = s.next() {
        rest.push(l);
    }
    assert!(
        !rest.iter().any(|l| l.contains("message_stop")),
        "the stream broke off without a finish: {rest:?}"
    );
    d.start();
    let outcome = crate::support::e2e::wait_outcome(&d, "api:crash", "crash-1");
    assert_eq!(outcome["text"], "Answered after the restart");
    // The client's retry with the same Idempotency-Key and the same body, to the new process:
    // answered from the trail, not recorded or sent to the model again.
    let retry = body.clone();
    let answer = RawStream::post(
        port,
        "/v1/messages",
        &[
            ("X-Agentd-Session", "crash"),
            ("Idempotency-Key", "crash-1"),
        ],
        &retry,
    )
    .rest();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains(r#""text":"Answered after the restart""#),
        "{answer}"
    );
    assert!(answer.contains(r#""id":"msg_crash-1""#), "{answer}");
    assert_eq!(fake.requests().len(), 2, "the retry made no model call");
    let intakes = d
        .trail("api:crash")
        .into_iter()
        .filter(|l| l["type"] == "intake")
        .count();
    assert_eq!(intakes, 1, "recorded once");
    assert!(d.sigterm().success());
}

/// A spent budget is 429 in each envelope (`insufficient_quota`, `rate_limit_error`) with
/// `x-should-retry: false`: the SDKs, whose own retries are on, send each request once.
#[test]
fn a_spent_budget_is_429_and_the_sdks_do_not_retry_it() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.push(Reply::Text {
        text: "expensive".into(),
        usage: Usage::new(1_000_000, 0, 0, 0),
    });
    let (mut d, base) = daemon(&fake, "[budget]\ndaily_usd = 1.0\n");
    let steps = run_clients(&base, "budget");
    assert_eq!(steps["spent"]["content"], "expensive");
    let over = &steps["over_openai"];
    assert_eq!(over["error"], "RateLimitError", "{over}");
    assert_eq!(over["status"], 429);
    assert_eq!(over["should_retry"], "false");
    assert_eq!(over["body"]["type"], "insufficient_quota", "{over}");
    assert!(
        over["body"]["message"]
            .as_str()
            .unwrap()
            .contains("daily_usd"),
        "{over}"
    );
    let over = &steps["over_anthropic"];
    assert_eq!(over["error"], "RateLimitError", "{over}");
    assert_eq!(over["body"]["error"]["type"], "rate_limit_error", "{over}");
    let intakes = d
        .trail("api:budget")
        .into_iter()
        .filter(|l| l["type"] == "intake")
        .count();
    assert_eq!(intakes, 3, "each request recorded once, none retried");
    assert_eq!(fake.requests().len(), 1, "no call made over budget");
    assert!(d.sigterm().success());
}

/// A reused `Idempotency-Key` is bound to its session and the digest of its body: a reuse
/// with another body or another session is 409 in the endpoint's envelope, never another
/// request's answer, also after a restart (the digest is recorded with the intake); the same
/// request again is still answered from its message.
#[test]
fn a_reused_idempotency_key_with_another_body_or_session_is_409() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.push(Reply::text("Answer for alice"));
    fake.push(Reply::text("Answer for the one-off"));
    let (mut d, base) = daemon(&fake, "");
    let port: u16 = base.rsplit(':').next().unwrap().parse().unwrap();
    let body =
        |text: &str| json!({"model": "agentd", "messages": [{"role": "user", "content": text}]});
    let post = |session: Option<&str>, key: &str, b: &Value| {
        let mut h = vec![("Idempotency-Key", key)];
        if let Some(s) = session {
            h.push(("X-Agentd-Session", s));
        }
        RawStream::post(port, "/v1/chat/completions", &h, b).rest()
    };
    let first = post(Some("alice"), "shared-1", &body("alice's secret question"));
    assert!(first.contains("Answer for alice"), "{first}");
    let conflicts = [
        (
            "another body",
            post(Some("alice"), "shared-1", &body("a different question")),
        ),
        (
            "another session",
            post(
                Some("mallory"),
                "shared-1",
                &body("alice's secret question"),
            ),
        ),
        (
            "a one-off",
            post(None, "shared-1", &body("alice's secret question")),
        ),
    ];
    for (what, answer) in &conflicts {
        eprintln!("{what}: {}", answer.lines().next().unwrap_or(""));
        assert!(answer.starts_with("HTTP/1.1 409"), "{what}: {answer}");
        assert!(!answer.contains("Answer for alice"), "{what}: {answer}");
        assert!(answer.contains("Idempotency-Key"), "{what}: {answer}");
        assert!(
            answer.contains(r#""error""#),
            "the OpenAI envelope: {answer}"
        );
    }
    let once = post(None, "once-1", &body("a one-off question"));
    assert!(once.contains("Answer for the one-off"), "{once}");
    let other = post(None, "once-1", &body("another one-off question"));
    assert!(other.starts_with("HTTP/1.1 409"), "{other}");
    assert_eq!(
        fake.requests().len(),
        2,
        "no conflicting request reached the model"
    );
    // The same request again is answered from its message.
    let again = post(Some("alice"), "shared-1", &body("alice's secret question"));
    assert!(again.contains("Answer for alice"), "{again}");
    // After a restart the binding is read back from the trail.
    assert!(d.sigterm().success());
    d.start();
    wait_until(Duration::from_secs(20), "HTTP status", || {
        http_get(port, "/api/v1/status").filter(|r| r.starts_with("HTTP/1.1 200"))
    });
    let after = post(Some("alice"), "shared-1", &body("a different question"));
    eprintln!("after a restart: {}", after.lines().next().unwrap_or(""));
    assert!(after.starts_with("HTTP/1.1 409"), "{after}");
    assert!(!after.contains("Answer for alice"), "{after}");
    let again = post(Some("alice"), "shared-1", &body("alice's secret question"));
    assert!(again.contains("Answer for alice"), "{again}");
    assert_eq!(fake.requests().len(), 2);
    let intakes = d
        .trail("api:alice")
        .into_iter()
        .filter(|l| l["type"] == "intake")
        .count();
    assert_eq!(intakes, 1);
    assert!(d.sigterm().success());
}

/// `VmHWM` or `VmRSS` of process `pid`, in bytes.
fn vm(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} not in /proc/{pid}/status"));
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    kb * 1024
}

/// A chat-completions body of `messages` user messages of `parts` text parts each.
fn parts_body(messages: usize, parts: usize) -> String {
    let part = r#"{"type":"text","text":"aaaaaaaaaa"}"#;
    let content = vec![part; parts].join(",");
    let message = format!(r#"{{"role":"user","content":[{content}]}}"#);
    format!(
        r#"{{"model":"agentd","messages":[{}]}}"#,
        vec![message.as_str(); messages].join(",")
    )
}

/// POST `body` (already JSON text) to `/v1/chat/completions`; the whole answer.
fn post_raw(port: u16, body: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Item 12 of the third security round: a ~10 MB request of 270,000 content parts. A message
/// may have at most 400 parts (400 naming the limit), and parsing such a body raises the
/// daemon's peak RSS by at most 3× the body size, and the RSS comes back down.
#[test]
fn a_request_of_270_000_content_parts_is_refused_within_3x_its_size_in_memory() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let (mut d, base) = daemon(&fake, "");
    let port: u16 = base.rsplit(':').next().unwrap().parse().unwrap();
    let pid = d.pid().unwrap();
    let body = parts_body(1, 270_000);
    let reset_peak = || std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    reset_peak();
    let before = vm(pid, "VmRSS");
    let answer = post_raw(port, &body);
    let (peak, after) = (vm(pid, "VmHWM"), vm(pid, "VmRSS"));
    let status = answer.lines().next().unwrap_or("").to_string();
    eprintln!(
        "one message of 270,000 parts, body {} bytes: {status}; RSS before {} MB, peak {} MB (+{} MB, {:.1}x the body), after {} MB",
        body.len(),
        before >> 20,
        peak >> 20,
        (peak - before) >> 20,
        (peak - before) as f64 / body.len() as f64,
        after >> 20
    );
    assert!(answer.starts_with("HTTP/1.1 400"), "{status}");
    assert!(answer.contains("400 content parts"), "{answer}");
    assert!(
        peak - before <= 3 * body.len() as u64,
        "peak RSS grew by {} bytes for a body of {}",
        peak - before,
        body.len()
    );
    assert!(
        after <= before + body.len() as u64,
        "RSS stays up: {after} after, {before} before"
    );
    // Within the caps (400 parts a message, 675 messages): still within 3x while parsed.
    let body = parts_body(675, 400);
    fake.set_responder(|_| Some(Reply::text("ok")));
    reset_peak();
    let before = vm(pid, "VmRSS");
    let answer = post_raw(port, &body);
    let peak = vm(pid, "VmHWM");
    eprintln!(
        "675 messages of 400 parts, body {} bytes: {}; RSS before {} MB, peak {} MB (+{} MB, {:.1}x the body)",
        body.len(),
        answer.lines().next().unwrap_or(""),
        before >> 20,
        peak >> 20,
        (peak - before) >> 20,
        (peak - before) as f64 / body.len() as f64,
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(d.sigterm().success());
}
