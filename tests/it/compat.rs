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
use crate::support::wait_until;

const TOKEN: &str = "compat-token-123";

/// The SDKs, installed once per target dir.
fn sdk_dir() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let dest = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("test-peers");
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-test-peers.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg(&dest)
            .arg("sdk")
            .output()
            .expect("run scripts/install-test-peers.sh");
        assert!(
            out.status.success(),
            "installing the openai and anthropic SDKs failed (needs python3/pip with registry access):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dest.join("sdk")
    })
    .clone()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A started daemon with the HTTP API on a free port and `extra` appended to its config.
fn daemon(fake: &FakeLlm, extra: &str) -> (TestDaemon, String) {
    let port = free_port();
    let mut d = TestDaemon::new(
        &format!(
            "{}\n[http]\nenabled = true\nport = {port}\n{extra}",
            agentd_toml("fake")
        ),
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
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
fn run_clients(base: &str, scenario: &str) -> std::collections::BTreeMap<String, Value> {
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

    // Client tools: a BadRequestError naming the reason, nothing recorded.
    let tools = &steps["tools"];
    assert_eq!(tools["error"], "BadRequestError");
    assert_eq!(tools["status"], 400);
    assert!(
        tools["message"]
            .as_str()
            .unwrap()
            .contains("runs its own tools"),
        "{tools}"
    );
    assert!(
        !requests
            .iter()
            .any(|r| last_user_text(r).contains("use my tool"))
    );

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
