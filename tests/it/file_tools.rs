//! The file tools against the daemon's own state (issue #12, finding 5; SPEC §16.8): with the
//! state and config directories under an allowed path, `read`, `write` and `edit` still never
//! reach the config directory or `.env`, `write`/`edit` never reach the state directory, and
//! `read` may read `state_dir/inbox/` and nothing else of it.

use std::path::Path;

use serde_json::{Value, json};

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, fifo_write, provider_toml, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};

/// The `tool_result` block answering `id` in any request the fake model received.
fn tool_result(reqs: &[Value], id: &str) -> Value {
    for req in reqs {
        for msg in req["messages"].as_array().into_iter().flatten() {
            for block in msg["content"].as_array().into_iter().flatten() {
                if block["type"] == "tool_result" && block["tool_use_id"] == id {
                    return block.clone();
                }
            }
        }
    }
    panic!("no tool_result for {id} in {reqs:?}");
}

fn result_text(block: &Value) -> String {
    match &block["content"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn assert_refused(reqs: &[Value], id: &str, secret: Option<&str>) {
    let block = tool_result(reqs, id);
    assert_eq!(block["is_error"], true, "{id} should be refused: {block}");
    if let Some(secret) = secret {
        assert!(
            !result_text(&block).contains(secret),
            "{id} leaked: {block}"
        );
    }
}

fn abs(p: &Path) -> String {
    p.to_str().expect("utf-8 temp path").to_string()
}

/// The issue's scenario: `allowed_paths` holds the parent of the state and config directories
/// (as `/tmp` did with the README's `AGENTD_STATE_DIR=/tmp/…`). The model tries to read
/// `config/.env`, rewrite `agentd.toml` to turn the sandbox off, write and edit inside the
/// state directory, and read a state file outside `inbox/`; every one is refused and nothing
/// changes on disk. Reading a file in `state_dir/inbox/` works.
#[test]
fn file_tools_keep_out_of_state_and_config_under_an_allowed_parent() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let toml = format!(
        "{}\n[tools.filesystem]\nallowed_paths = [\"../workspace\", \"..\"]\n",
        agentd_toml("fake")
    );
    let mut d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    let root = std::fs::canonicalize(d.dir.path()).unwrap();
    let config_dir = root.join("config");
    std::fs::write(config_dir.join(".env"), "AGENTD_TEST_SECRET=hunter2-env\n").unwrap();
    let toml_before = std::fs::read_to_string(&d.config_path).unwrap();
    d.start();
    let state = std::fs::canonicalize(&d.state_dir).unwrap();
    std::fs::create_dir_all(state.join("inbox")).unwrap();
    std::fs::write(state.join("inbox/note.txt"), "inbox hello\n").unwrap();
    std::fs::write(state.join("private.txt"), "state-secret-42\n").unwrap();
    // A `.env` in the workspace is refused too.
    std::fs::write(d.workspace().join(".env"), "WS_SECRET=ws-env-secret\n").unwrap();

    let cfg_toml = abs(&config_dir.join("agentd.toml"));
    fake.push(Reply::tool_calls(vec![
        ("r_env", "read", json!({"path": abs(&config_dir.join(".env"))})),
        ("r_toml", "read", json!({"path": cfg_toml})),
        (
            "w_toml",
            "write",
            json!({"path": cfg_toml, "content": "[tools]\nexec_sandbox = \"none\"\nexec_network = true\n"}),
        ),
        (
            "e_toml",
            "edit",
            json!({"path": cfg_toml, "old_string": "[logging]", "new_string": "[tools]\nexec_sandbox = \"none\"\n[logging]"}),
        ),
        ("w_new", "write", json!({"path": abs(&config_dir.join("providers.d.toml")), "content": "x"})),
        ("r_state", "read", json!({"path": abs(&state.join("private.txt"))})),
        ("w_state", "write", json!({"path": abs(&state.join("x")), "content": "x"})),
        ("w_inbox", "write", json!({"path": abs(&state.join("inbox/evil.txt")), "content": "x"})),
        ("e_inbox", "edit", json!({"path": abs(&state.join("inbox/note.txt")), "old_string": "hello", "new_string": "bye"})),
        ("r_ws_env", "read", json!({"path": ".env"})),
        ("r_inbox", "read", json!({"path": abs(&state.join("inbox/note.txt"))})),
        ("r_ws", "read", json!({"path": "AGENTS.md"})),
    ]));
    fake.push(Reply::text("done"));
    fifo_write(
        &d,
        r#"{"id":"f1","type":"user","text":"poke around","sender":"mallory"}"#,
    );
    wait_outcome(&d, "mallory", "f1");
    let reqs = fake.requests();

    assert_refused(&reqs, "r_env", Some("hunter2-env"));
    assert_refused(&reqs, "r_toml", None);
    assert_refused(&reqs, "w_toml", None);
    assert_refused(&reqs, "e_toml", None);
    assert_refused(&reqs, "w_new", None);
    assert_refused(&reqs, "r_state", Some("state-secret-42"));
    assert_refused(&reqs, "w_state", None);
    assert_refused(&reqs, "w_inbox", None);
    assert_refused(&reqs, "e_inbox", None);
    assert_refused(&reqs, "r_ws_env", Some("ws-env-secret"));
    let env_err = result_text(&tool_result(&reqs, "r_env"));
    assert!(env_err.contains(".env"), "names the file: {env_err}");
    let toml_err = result_text(&tool_result(&reqs, "w_toml"));
    assert!(
        toml_err.contains("config"),
        "names the directory: {toml_err}"
    );

    assert_eq!(
        std::fs::read_to_string(&d.config_path).unwrap(),
        toml_before,
        "agentd.toml unchanged"
    );
    assert!(!config_dir.join("providers.d.toml").exists());
    assert!(!state.join("x").exists());
    assert!(!state.join("inbox/evil.txt").exists());
    assert_eq!(
        std::fs::read_to_string(state.join("inbox/note.txt")).unwrap(),
        "inbox hello\n"
    );

    let inbox = tool_result(&reqs, "r_inbox");
    assert_ne!(inbox["is_error"], true, "inbox is readable: {inbox}");
    assert!(result_text(&inbox).contains("inbox hello"), "{inbox}");
    let ws = tool_result(&reqs, "r_ws");
    assert_ne!(ws["is_error"], true, "workspace is readable: {ws}");
}

/// `message` attachments follow `read`'s rules: a file of the state directory's `inbox/` is
/// sent; `config/.env` and a hard link (in the workspace) to `agentd.toml` are refused
/// (findings 5 and 14), and nothing of them reaches Telegram.
#[test]
fn message_attachments_follow_the_read_rules() {
    use crate::support::fake_telegram::FakeTelegram;
    const TOKEN: &str = "123456:TEST-secret-token";
    const ALICE: i64 = 1001;
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let tg = FakeTelegram::spawn(TOKEN);
    let toml = agentd_toml("fake").replace(
        "[behavior]",
        &format!(
            "[channel.telegram]\nenabled = true\napi_url = \"{}\"\nallow_from = [{ALICE}]\n\
             poll_timeout_seconds = 1\ncontacts = {{ Alice = {ALICE} }}\n\n\
             [tools.filesystem]\nallowed_paths = [\"..\"]\n\n[behavior]",
            tg.api_url()
        ),
    );
    let mut d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    let root = std::fs::canonicalize(d.dir.path()).unwrap();
    std::fs::write(root.join("config/.env"), "AGENTD_TEST_SECRET=hunter2-att\n").unwrap();
    std::fs::hard_link(&d.config_path, d.workspace().join("linked.toml")).unwrap();
    d.set_env("AGENTD_TELEGRAM_TOKEN", TOKEN);
    d.start();
    let state = std::fs::canonicalize(&d.state_dir).unwrap();
    std::fs::write(state.join("inbox/voice.txt"), "inbox attachment\n").unwrap();

    fake.push(Reply::tool_calls(vec![
        (
            "m_env",
            "message",
            json!({"target": "Alice", "attachments": [abs(&root.join("config/.env"))]}),
        ),
        (
            "m_link",
            "message",
            json!({"target": "Alice", "attachments": ["linked.toml"]}),
        ),
        (
            "m_inbox",
            "message",
            json!({"target": "Alice", "attachments": [abs(&state.join("inbox/voice.txt"))]}),
        ),
    ]));
    fake.push(Reply::text("done"));
    fifo_write(
        &d,
        r#"{"id":"a1","type":"user","text":"send files","sender":"ops"}"#,
    );
    wait_outcome(&d, "ops", "a1");
    let reqs = fake.requests();
    assert_refused(&reqs, "m_env", Some("hunter2-att"));
    assert_refused(&reqs, "m_link", None);
    let link_err = result_text(&tool_result(&reqs, "m_link"));
    assert!(link_err.contains("hard link"), "{link_err}");
    let sent = tool_result(&reqs, "m_inbox");
    assert_ne!(sent["is_error"], true, "inbox attachment is sent: {sent}");
    let files = tg.sent_files();
    assert_eq!(files.len(), 1, "only the inbox file reaches Telegram");
    assert_eq!(
        String::from_utf8_lossy(&files[0].bytes),
        "inbox attachment\n"
    );
}
