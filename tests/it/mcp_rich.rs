//! Rich MCP results through the real daemon and `@modelcontextprotocol/server-everything`
//! (stdio): an embedded resource reaches the model as its text, resource links as lines, an
//! image as an image for a vision model (Anthropic: inside the `tool_result`; OpenAI: a user
//! message after the tool messages) and as a placeholder otherwise, and never in the trail or
//! the session files; the server's task-only tool is not offered, with one log line.

use serde_json::{Value, json};

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, fifo_write, provider_toml, wait_mcp_tools, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};

/// The start of the PNG server-everything's `get-tiny-image` returns, in base64.
const TINY_PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAABQAAAAU";

/// A daemon whose `primary` model (`vision`: it sees images) is `fake`, with server-everything
/// as the MCP server `everything`, started and its tools offered.
fn daemon(fake: &FakeLlm, kind: &str, vision: bool) -> TestDaemon {
    let peers = crate::mcp::real_peers();
    let script =
        peers.join("npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let toml = format!(
        "{}\n[mcp.servers.everything]\ncommand = \"node\"\nargs = [\"{}\", \"stdio\"]\nenv = {{ PATH = \"/usr/local/bin:/usr/bin:/bin\" }}\n",
        agentd_toml("fake"),
        script.display()
    );
    let provider = format!(
        "{}supports_vision = {vision}\n",
        provider_toml(kind, &fake.base_url())
    );
    let mut d = TestDaemon::new(&toml, &[("fake", &provider)]);
    d.start();
    wait_mcp_tools(&d);
    d
}

/// Ask for `calls` of the everything server's tools, then "done"; the requests the fake got.
fn run(fake: &FakeLlm, d: &TestDaemon, calls: Vec<(&str, &str, Value)>) -> Vec<Value> {
    fake.push(Reply::tool_calls(calls));
    fake.push(Reply::text("done"));
    fifo_write(
        d,
        r#"{"id":"r1","type":"user","text":"use the tools","sender":"max"}"#,
    );
    let fin = wait_outcome(d, "max", "r1");
    assert_eq!(fin["text"], "done", "{fin}");
    fake.requests()
}

/// Every file under the session directory, as text: none may hold the image's data.
fn session_files(d: &TestDaemon) -> String {
    fn walk(dir: &std::path::Path, out: &mut String) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push_str(&String::from_utf8_lossy(
                    &std::fs::read(&p).unwrap_or_default(),
                ));
            }
        }
    }
    let mut out = String::new();
    walk(&d.sessions_dir(), &mut out);
    out
}

/// The Anthropic `tool_result` block answering call `id` in `request`.
fn anthropic_result<'a>(request: &'a Value, id: &str) -> &'a Value {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| m["content"].as_array().into_iter().flatten())
        .find(|b| b["type"] == "tool_result" && b["tool_use_id"] == id)
        .unwrap_or_else(|| panic!("no tool_result for {id}: {request}"))
}

#[test]
fn resources_links_and_images_reach_a_vision_model_on_anthropic() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let d = daemon(&fake, "anthropic", true);
    // The task-only tool of the listing is refused with one line.
    d.wait_log("runs only as an MCP task");
    let reqs = run(
        &fake,
        &d,
        vec![
            ("t1", "everything__get-resource-reference", json!({})),
            ("t2", "everything__get-resource-links", json!({"count": 2})),
            ("t3", "everything__get-tiny-image", json!({})),
        ],
    );
    let offered: Vec<&str> = reqs[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        offered.contains(&"everything__get-tiny-image"),
        "{offered:?}"
    );
    assert!(
        !offered.contains(&"everything__simulate-research-query"),
        "{offered:?}"
    );
    let log = d.log();
    let refusals: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("runs only as an MCP task"))
        .collect();
    assert_eq!(refusals.len(), 1, "{refusals:#?}");
    assert!(
        refusals[0].contains("simulate-research-query"),
        "{}",
        refusals[0]
    );

    let resource = anthropic_result(&reqs[1], "t1")["content"]
        .as_str()
        .unwrap();
    assert!(
        resource.contains(
            "[resource demo://resource/dynamic/text/1]\nResource 1: This is a plaintext resource"
        ),
        "{resource}"
    );
    let links = anthropic_result(&reqs[1], "t2")["content"]
        .as_str()
        .unwrap();
    assert!(
        links.contains("[resource link demo://resource/dynamic/blob/1: Blob Resource 1 — ")
            && links.contains("[resource link demo://resource/dynamic/text/2: Text Resource 2 — "),
        "{links}"
    );
    let image = &anthropic_result(&reqs[1], "t3")["content"];
    let parts = image.as_array().unwrap_or_else(|| panic!("{image}"));
    assert_eq!(parts[0]["type"], "text");
    assert!(
        parts[0]["text"]
            .as_str()
            .unwrap()
            .contains("[image from MCP tool everything__get-tiny-image: image/png, "),
        "{image}"
    );
    assert_eq!(parts[1]["type"], "image", "{image}");
    assert_eq!(parts[1]["source"]["media_type"], "image/png");
    assert!(
        parts[1]["source"]["data"]
            .as_str()
            .unwrap()
            .starts_with(TINY_PNG)
    );

    // Never persisted: the trail keeps the placeholder only.
    let trail = serde_json::to_string(&d.trail("max")).unwrap();
    assert!(
        trail.contains("[image from MCP tool everything__get-tiny-image: image/png, "),
        "{trail}"
    );
    assert!(!session_files(&d).contains(TINY_PNG));
}

#[test]
fn an_image_reaches_a_vision_model_on_openai_in_a_user_message() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let d = daemon(&fake, "openai", true);
    let reqs = run(
        &fake,
        &d,
        vec![("t1", "everything__get-tiny-image", json!({}))],
    );
    let messages = reqs[1]["messages"].as_array().unwrap();
    let tool = messages.iter().position(|m| m["role"] == "tool").unwrap();
    assert!(
        messages[tool]["content"]
            .as_str()
            .unwrap()
            .contains("[image from MCP tool everything__get-tiny-image: image/png, ")
    );
    let user = &messages[tool + 1];
    assert_eq!(user["role"], "user", "{user}");
    let url = user["content"][1]["image_url"]["url"].as_str().unwrap();
    assert!(
        url.starts_with(&format!("data:image/png;base64,{TINY_PNG}")),
        "{user}"
    );
    assert!(!session_files(&d).contains(TINY_PNG));
}

#[test]
fn a_model_without_vision_gets_a_placeholder() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let d = daemon(&fake, "anthropic", false);
    let reqs = run(
        &fake,
        &d,
        vec![("t1", "everything__get-tiny-image", json!({}))],
    );
    let content = &anthropic_result(&reqs[1], "t1")["content"];
    let text = content
        .as_str()
        .unwrap_or_else(|| panic!("text only: {content}"));
    assert!(
        text.contains("[image from MCP tool everything__get-tiny-image: image/png, ")
            && text.contains("; this model cannot see images]"),
        "{text}"
    );
    assert!(!reqs[1].to_string().contains(TINY_PNG));
}
