//! agentd as an MCP server (SPEC §23), against the real binary: the official Python MCP SDK
//! (`mcp_server_py.py`) over stdio (`agentd mcp`) and over Streamable HTTP (`/mcp`), the MCP
//! Inspector's CLI mode, and agentd using a second agentd's `/mcp` as an MCP server. The clients
//! are installed by `scripts/install-test-peers.sh mcpclients`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::clients::steps;
use crate::compat::{TOKEN, daemon};
use crate::support::daemon::TestDaemon;
use crate::support::fake_llm::{
    FakeLlm, Reply, Usage, Wire, last_user_text, tool_results_in_last_message,
};

/// The installed MCP clients.
fn clients() -> PathBuf {
    crate::support::test_peers("mcpclients", "python3/pip and npm with registry access")
        .join("mcpclients")
}

/// `mcp hello …` answers after a second and a half (so `ask` reports progress); `mcp slow`
/// never answers (until stopped); anything else is echoed.
fn answer(body: &Value) -> Option<Reply> {
    let usage = Usage::new(20, 5, 0, 0);
    let text = last_user_text(body);
    if text.contains("mcp slow") {
        return Some(Reply::Hang);
    }
    // The user turn is stamped `[<time>] `: the answer repeats what was said after it.
    let said = text.lines().last().unwrap_or_default();
    let said = said.split_once("] ").map_or(said, |(_, s)| s);
    let reply = Reply::Text {
        text: format!("answer to: {said}"),
        usage,
    };
    if !text.contains("mcp hello") {
        return Some(reply);
    }
    let gate = Arc::new(Semaphore::new(0));
    let open = gate.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        open.add_permits(1);
    });
    Some(Reply::Gated {
        gate,
        then: Box::new(reply),
    })
}

/// A started daemon with the HTTP API and a memory note about a zebra, indexed. One client's
/// session makes more requests than the default POST rate limit allows in a minute.
fn mcp_daemon(fake: &FakeLlm, extra: &str) -> (TestDaemon, String) {
    let (d, base) = daemon(fake, &format!("rate_limit = 1000\n{extra}"));
    std::fs::write(
        d.workspace().join("memory/zebra.md"),
        "# Zebra\n\nThe zebra password is striped-42.\n",
    )
    .expect("write a memory note");
    let out = crate::memory::agentd(&d, &["index"]);
    assert!(
        out.status.success(),
        "agentd index: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (d, base)
}

fn python(d: &TestDaemon, base: &str, mode: &str) -> BTreeMap<String, Value> {
    let mut cmd = Command::new("python3");
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/mcp_server_py.py"))
        .arg(mode)
        .env("PYTHONPATH", clients().join("py"))
        .env("AGENTD_BIN", env!("CARGO_BIN_EXE_agentd"))
        .env("AGENTD_CONFIG", &d.config_path)
        .env("AGENTD_STATE_DIR", &d.state_dir);
    steps(cmd, base, &format!("the Python MCP SDK ({mode})"))
}

/// What both transports must show; `label` is the script's name for the run.
fn assert_exercised(s: &BTreeMap<String, Value>, label: &str, approvals: bool) {
    assert_eq!(s["init"]["server"], "agentd", "{}", s["init"]);
    let mut tools = vec![
        "ask",
        "cost",
        "history",
        "memory_search",
        "send",
        "sessions",
        "status",
    ];
    if approvals {
        tools.extend(["approvals", "decide"]);
        tools.sort_unstable();
    }
    assert_eq!(s["tools"]["names"], json!(tools));
    assert_eq!(s["tools"]["strict"], true);
    let uris = s["resources"]["uris"].to_string();
    assert!(uris.contains("agentd://monitor"), "{uris}");
    assert!(uris.contains("agentd://memory/memory/zebra.md"), "{uris}");
    assert_eq!(
        s["resources"]["templates"],
        json!(["agentd://sessions/{session}/trail"])
    );
    assert!(
        s["prompts"]["names"].to_string().contains("\"example\""),
        "{}",
        s["prompts"]
    );
    assert!(
        s["prompt"]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("Example skill"),
        "{}",
        s["prompt"]
    );

    let ask = &s["ask"];
    assert_eq!(
        ask["text"],
        format!("answer to: mcp hello {label}"),
        "{ask}"
    );
    assert_eq!(ask["is_error"], false, "{ask}");
    assert!(
        ask["structured"]["session"]
            .as_str()
            .unwrap_or_default()
            .starts_with("mcp:"),
        "{ask}"
    );
    assert!(
        ask["progress"].to_string().contains("thinking"),
        "progress while the model works: {ask}"
    );
    assert_eq!(s["strict"]["refused"], true, "{}", s["strict"]);
    assert!(
        s["strict"]["error"]
            .to_string()
            .contains("unknown field `bogus`"),
        "{}",
        s["strict"]
    );
    let found = s["memory_search"]["text"].as_str().unwrap_or_default();
    assert!(found.contains("striped-42"), "{}", s["memory_search"]);
    assert_eq!(s["cost"]["is_error"], false, "{}", s["cost"]);
    assert!(
        s["memory_file"]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("striped-42")
            || s["memory_file"]["uri"].is_string(),
        "{}",
        s["memory_file"]
    );
    assert!(s["monitor"]["json"].is_object(), "{}", s["monitor"]);
    assert_eq!(s["updated"]["reply"], "answer to: mcp update");
    assert!(
        s["trail"]["json"]["events"]
            .as_array()
            .is_some_and(|e| !e.is_empty()),
        "{}",
        s["trail"]
    );
    assert!(s.contains_key("cancelled") && s.contains_key("stopped"));
}

/// The stdio server: everything through the FIFO and the state files.
#[test]
fn the_python_sdk_drives_agentd_mcp_over_stdio() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.set_responder(answer);
    let (mut d, base) = mcp_daemon(&fake, "");
    let s = python(&d, &base, "stdio");
    assert_exercised(&s, "stdio", false);
    // The cancelled message was stopped, as /stop does, and recorded so.
    let trail = d.trail("mcp-stdio-slow");
    assert!(
        trail
            .iter()
            .any(|l| l["type"] == "failure" && l["reply"] == "Stopped."),
        "{trail:?}"
    );
    assert!(d.sigterm().success());
}

/// `/mcp` on the HTTP API: the token, the origin check, the approvals switch.
#[test]
fn the_python_sdk_drives_mcp_over_streamable_http() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.set_responder(answer);
    let (mut d, base) = mcp_daemon(&fake, "[mcp_server]\nallow_approvals = true\n");
    let s = python(&d, &base, "http");
    assert_exercised(&s, "http", true);
    let trail = d.trail("mcp-http-slow");
    assert!(
        trail
            .iter()
            .any(|l| l["type"] == "failure" && l["reply"] == "Stopped."),
        "{trail:?}"
    );
    // Each refused connection differs from the accepted one in one header only.
    let r = python(&d, &base, "refusals");
    assert_eq!(r["bad_token"]["refused"], true, "{}", r["bad_token"]);
    assert_eq!(r["bad_origin"]["refused"], true, "{}", r["bad_origin"]);
    assert_eq!(r["own_origin"]["refused"], false, "{}", r["own_origin"]);
    let log = d.log();
    assert!(
        log.contains("uri=/mcp") && log.contains("status=401"),
        "{log}"
    );
    assert!(log.contains("status=403"), "{log}");
    assert!(d.sigterm().success());
}

/// The MCP Inspector's CLI mode lists the tools of `agentd mcp`.
#[test]
fn the_inspector_cli_lists_the_tools_of_agentd_mcp() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.set_responder(answer);
    let (mut d, _base) = daemon(&fake, "");
    let cli = clients().join("npm/node_modules/@modelcontextprotocol/inspector/cli/build/cli.js");
    let out = Command::new("node")
        .arg(&cli)
        .arg("--cli")
        .arg("-e")
        .arg(format!("AGENTD_CONFIG={}", d.config_path.display()))
        .arg("-e")
        .arg(format!("AGENTD_STATE_DIR={}", d.state_dir.display()))
        .arg(env!("CARGO_BIN_EXE_agentd"))
        .arg("mcp")
        .arg("--method")
        .arg("tools/list")
        .output()
        .expect("run the MCP Inspector");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "inspector failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let names: Vec<&str> = v["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "ask",
            "cost",
            "history",
            "memory_search",
            "send",
            "sessions",
            "status"
        ]
    );
    assert!(d.sigterm().success());
}

/// `agentd mcp` without a running daemon exits 1 and says so.
#[test]
fn agentd_mcp_refuses_when_the_daemon_is_not_running() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let d = TestDaemon::new(
        &crate::support::e2e::agentd_toml("fake"),
        &[(
            "fake",
            &crate::support::e2e::provider_toml("anthropic", &fake.base_url()),
        )],
    );
    let out = crate::memory::agentd(&d, &["mcp"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("agentd is not running"), "{err}");
    assert!(out.stdout.is_empty(), "stdout is the protocol's");
}

/// agentd connected to itself: a second daemon's `/mcp` is a `url` MCP server of the first,
/// whose model calls the proxied `ask`; the second daemon's answer comes back.
#[test]
fn agentd_answers_through_a_second_agentd_over_mcp() {
    let far_llm = FakeLlm::spawn(Wire::Anthropic);
    far_llm.set_responder(answer);
    let (mut far, far_base) = daemon(&far_llm, "");
    let near_llm = FakeLlm::spawn(Wire::Anthropic);
    near_llm.set_responder(|body| {
        let usage = Usage::new(20, 5, 0, 0);
        let results = tool_results_in_last_message(body);
        if !results.is_empty() {
            return Some(Reply::Text {
                text: format!("the other agent said: {}", results.join(" ")),
                usage,
            });
        }
        Some(Reply::ToolCalls {
            text: None,
            calls: vec![(
                "call_far".into(),
                "far__ask".into(),
                json!({"message": "what is the capital of France?", "session": "from-near"}),
            )],
            usage,
        })
    });
    let near = TestDaemon::new(
        &format!(
            "{}\n[mcp.servers.far]\nurl = \"{far_base}/mcp\"\nheaders = {{ Authorization = \"Bearer {TOKEN}\" }}\n",
            crate::support::e2e::agentd_toml("fake")
        ),
        &[(
            "fake",
            &crate::support::e2e::provider_toml("anthropic", &near_llm.base_url()),
        )],
    );
    let mut near = near;
    near.start();
    // The far server's tools join the registry once it has answered its listing.
    let offered = crate::support::e2e::wait_mcp_tools(&near);
    assert!(offered.contains("tools=7"), "{offered}");
    let out = near.agent_send(&[
        "-m",
        "ask the other agent",
        "--from",
        "alice",
        "--wait",
        "120",
    ]);
    let reply = String::from_utf8_lossy(&out.stdout);
    assert!(
        reply.starts_with("the other agent said:")
            && reply.contains("<untrusted-content source=\\\"far__ask\\\">")
            && reply.contains("answer to: what is the capital of France?"),
        "{reply}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let far_trail = far.trail("from-near");
    assert!(
        far_trail.iter().any(|l| l["type"] == "intake"),
        "{far_trail:?}"
    );
    assert!(near.sigterm().success());
    assert!(far.sigterm().success());
}
