//! Tool-argument schemas (`tools::arg_schema`, issue 14): every schema the daemon offers and
//! the schemas real MCP servers send (tests/fixtures/mcp_tool_schemas/, captured with
//! `tools/list` from the reference servers on npm and PyPI) compile, and bad arguments come
//! back to the model as the registry's error result, naming the path and the fix.

use std::collections::BTreeSet;

use agentd::tools::arg_schema::ArgSchema;
use serde_json::{Value, json};

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, fifo_write, provider_toml, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};
use crate::support::fake_telegram::FakeTelegram;

const TOKEN: &str = "123456:TEST-secret-token";

fn fixtures() -> Vec<(String, Value)> {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_tool_schemas");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        for tool in doc["tools"].as_array().unwrap() {
            let name = format!(
                "{} {}",
                doc["package"].as_str().unwrap(),
                tool["name"].as_str().unwrap()
            );
            out.push((name, tool["inputSchema"].clone()));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn schema_of<'a>(all: &'a [(String, Value)], name: &str) -> &'a Value {
    &all.iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no fixture for {name}"))
        .1
}

/// The reference servers' 52 tools compile, and their arguments are checked as the servers
/// mean them: nullable `anyOf` fields, type lists, `minItems`, `minLength`, bounds, `enum`.
#[test]
fn reference_mcp_server_schemas_compile_and_check_arguments() {
    let all = fixtures();
    assert!(all.len() >= 50, "{} fixture tools", all.len());
    for (name, schema) in &all {
        ArgSchema::compile(schema).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let check = |name: &str, args: Value| {
        ArgSchema::compile(schema_of(&all, name))
            .unwrap()
            .validate(&args, 20)
            .map_err(|inv| {
                inv.violations
                    .iter()
                    .map(|v| format!("{}: {}", v.path, v.message))
                    .collect::<Vec<_>>()
            })
    };
    let git_log = "mcp-server-git git_log";
    assert!(check(git_log, json!({"repo_path": "/r", "start_timestamp": null})).is_ok());
    assert!(
        check(
            git_log,
            json!({"repo_path": "/r", "start_timestamp": "yesterday"})
        )
        .is_ok()
    );
    let e = check(git_log, json!({"repo_path": "/r", "start_timestamp": 5})).unwrap_err();
    assert!(
        e[0].starts_with("/start_timestamp: 5 matches none"),
        "{e:?}"
    );
    assert_eq!(
        check(git_log, json!({})).unwrap_err(),
        [": \"repo_path\" is a required property"]
    );
    let think = "@modelcontextprotocol/server-sequential-thinking sequentialthinking";
    let ok =
        json!({"thought": "t", "nextThoughtNeeded": "yes", "thoughtNumber": 1, "totalThoughts": 3});
    assert!(check(think, ok.clone()).is_ok());
    let mut bad = ok;
    bad["thoughtNumber"] = json!(0);
    bad["nextThoughtNeeded"] = json!(1);
    assert_eq!(
        check(think, bad).unwrap_err(),
        [
            "/nextThoughtNeeded: 1 is not of type \"boolean\" or \"string\"",
            "/thoughtNumber: 0 is less than the minimum of 1"
        ]
    );
    assert_eq!(
        check(
            "@modelcontextprotocol/server-filesystem read_multiple_files",
            json!({"paths": []})
        )
        .unwrap_err(),
        ["/paths: the list has 0 items, fewer than the minimum of 1"]
    );
    assert_eq!(
        check(
            "mcp-server-fetch fetch",
            json!({"url": "", "max_length": 1_000_000})
        )
        .unwrap_err(),
        [
            "/max_length: 1000000 is greater than the maximum of 999999",
            "/url: \"\" has 0 characters, fewer than the minimum of 1"
        ]
    );
    assert_eq!(
        check(
            "@modelcontextprotocol/server-everything get-annotated-message",
            json!({"messageType": "info"})
        )
        .unwrap_err(),
        ["/messageType: \"info\" is not one of \"error\", \"success\", \"debug\""]
    );
    let e = check(
        "@modelcontextprotocol/server-memory create_entities",
        json!({"entities": [{"name": "a", "entityType": "person", "observations": [1]}]}),
    )
    .unwrap_err();
    assert_eq!(
        e,
        ["/entities/0/observations/0: 1 is not of type \"string\""]
    );
}

/// The daemon with every built-in tool (Telegram for `message`/`react`, a search key, a skill,
/// memory, a speech model for `tts`): each offered schema compiles, and calls with bad arguments are answered with the
/// registry's error naming each path, without running the tool.
#[test]
fn every_builtin_schema_compiles_and_bad_arguments_are_answered() {
    let llm = FakeLlm::spawn(Wire::Anthropic);
    llm.push(Reply::tool_calls(vec![
        ("c1", "read", json!({"path": 5, "extra": true})),
        (
            "c2",
            "memory_write",
            json!({"entity": "Anna", "attribute": "", "value": "x", "confidence": 2}),
        ),
    ]));
    llm.push(Reply::text("ok"));
    let tg = FakeTelegram::spawn(TOKEN);
    let toml = agentd_toml("fake").replace(
        "[behavior]",
        &format!(
            "[channel.telegram]\nenabled = true\napi_url = \"{}\"\nallow_from = [1001]\n\
             poll_timeout_seconds = 1\ncontacts = {{ Alice = 1001 }}\n\n\
             [models.speech]\ntype = \"openai\"\nmodel = \"tts-1\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\n\
             [voice]\ntts_model = \"speech\"\n\n[behavior]",
            tg.api_url()
        ),
    );
    let mut d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("anthropic", &llm.base_url()))],
    );
    let skill = d.workspace().join("skills/weather");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: weather\ndescription: Check the weather\n---\nLook outside.",
    )
    .unwrap();
    d.set_env("AGENTD_TELEGRAM_TOKEN", TOKEN);
    d.set_env(agentd::config::BRAVE_KEY_ENV, "brave-test-key");
    d.start();
    fifo_write(
        &d,
        r#"{"id":"s1","type":"user","text":"go","sender":"ops"}"#,
    );
    assert_eq!(wait_outcome(&d, "ops", "s1")["text"], "ok");

    let reqs = llm.requests();
    let tools = reqs[0]["tools"].as_array().unwrap();
    let mut offered = BTreeSet::new();
    for t in tools {
        let name = t["name"].as_str().unwrap();
        ArgSchema::compile(&t["input_schema"]).unwrap_or_else(|e| panic!("{name}: {e}"));
        offered.insert(name.to_string());
    }
    let builtin: BTreeSet<String> = agentd::config::BUILTIN_TOOLS
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(offered, builtin, "every built-in tool is offered");

    let results = &reqs[1]["messages"];
    let text = |id: &str| -> String {
        for m in results.as_array().unwrap() {
            for block in m["content"].as_array().into_iter().flatten() {
                if block["tool_use_id"] == id {
                    assert_eq!(block["is_error"], true, "{block}");
                    return block["content"].to_string();
                }
            }
        }
        panic!("no result for {id}: {results}")
    };
    let read = text("c1");
    assert!(
        read.contains("invalid arguments for tool 'read':"),
        "{read}"
    );
    assert!(
        read.contains(r#"- at /path: 5 is not of type \"string\""#),
        "{read}"
    );
    assert!(
        read.contains(r#"- at (root): property \"extra\" is not allowed"#),
        "{read}"
    );
    let mem = text("c2");
    assert!(
        mem.contains(r#"- at /attribute: \"\" has 0 characters, fewer than the minimum of 1"#),
        "{mem}"
    );
    assert!(
        mem.contains("- at /confidence: 2 is greater than the maximum of 1"),
        "{mem}"
    );
}
