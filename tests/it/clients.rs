//! More client families against the compatible endpoints of the real daemon (SPEC §17), each
//! with its defaults, installed by `scripts/install-test-peers.sh clients`: the Vercel AI SDK
//! (`clients_ai_sdk.mjs`: `openai()` on the Responses API, streamed and with a tool;
//! `anthropic()` on Messages, with a tool), two agent frameworks with function tools and two
//! client libraries (`clients_py.py`: the OpenAI Agents SDK, LangChain's ChatOpenAI,
//! LlamaIndex's OpenAILike, litellm), each configured as `docs/recipes.md` says.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::compat::{TOKEN, daemon};
use crate::support::fake_llm::{
    FakeLlm, Reply, Usage, Wire, last_user_text, tool_results_in_last_message,
};

/// `clients <what>` → `<what> answer`; `clients weather <tag>` calls the client's
/// `get_weather` (id `call_<tag>`); a result is read back.
fn answer(body: &Value) -> Option<Reply> {
    let usage = Usage::new(30, 6, 0, 0);
    let results = tool_results_in_last_message(body);
    if !results.is_empty() {
        return Some(Reply::Text {
            text: format!("the weather: {}", results.join(", ")),
            usage,
        });
    }
    let text = last_user_text(body);
    let line = (text.lines().rev())
        .find(|l| l.contains("clients "))
        .unwrap_or_default();
    let what = line.rsplit("clients ").next().unwrap_or_default();
    if let Some(tag) = what.strip_prefix("weather ") {
        return Some(Reply::ToolCalls {
            text: None,
            calls: vec![(
                format!("call_{tag}"),
                "get_weather".into(),
                serde_json::json!({"city": "Paris"}),
            )],
            usage,
        });
    }
    Some(Reply::Text {
        text: format!("{what} answer"),
        usage,
    })
}

/// The installed client families.
fn clients_dir() -> std::path::PathBuf {
    crate::support::test_peers("clients", "python3/pip and npm with registry access")
        .join("clients")
}

/// Runs a client program and returns its steps by name.
pub(crate) fn steps(mut cmd: Command, base: &str, what: &str) -> BTreeMap<String, Value> {
    let out = cmd
        .env("AGENTD_BASE", base)
        .env("AGENTD_TOKEN", TOKEN)
        .output()
        .unwrap_or_else(|e| panic!("run {what}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            (v["step"].as_str().unwrap().to_string(), v)
        })
        .collect()
}

fn text_of(steps: &BTreeMap<String, Value>, step: &str) -> String {
    steps[step]["text"].as_str().unwrap_or_default().to_string()
}

#[test]
fn the_vercel_ai_sdk_works_with_its_defaults() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.set_responder(answer);
    let (mut d, base) = daemon(&fake, "");
    let npm = clients_dir().join("npm");
    // Bare imports resolve from the script's directory: it runs beside the SDK's modules.
    let script = npm.join("clients_ai_sdk.mjs");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/clients_ai_sdk.mjs"),
        &script,
    )
    .expect("copy the AI SDK script");
    let mut cmd = Command::new("node");
    cmd.arg(&script);
    let steps = steps(cmd, &base, "the AI SDK client");

    assert_eq!(text_of(&steps, "openai"), "hello ai sdk answer");
    assert_eq!(steps["openai"]["finish"], "stop");
    assert_eq!(steps["openai"]["input"], 30);
    assert_eq!(text_of(&steps, "openai_stream"), "stream ai sdk answer");
    assert!(
        text_of(&steps, "openai_tools").contains("18 C and sunny in Paris"),
        "{}",
        steps["openai_tools"]
    );
    assert_eq!(steps["openai_tools"]["steps"], 2);
    assert_eq!(text_of(&steps, "anthropic"), "hello anthropic answer");
    assert!(
        text_of(&steps, "anthropic_tools").contains("18 C and sunny in Paris"),
        "{}",
        steps["anthropic_tools"]
    );
    // The AI SDK's OpenAI provider spoke the Responses API.
    let id = steps["openai"]["id"].as_str().unwrap_or_default();
    assert!(id.starts_with("resp_"), "{id}");
    assert!(d.sigterm().success());
}

#[test]
fn agent_frameworks_and_client_libraries_work_through_agentd() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.set_responder(answer);
    let (mut d, base) = daemon(&fake, "");
    let python = |group: &str, dir: &str| {
        let mut cmd = Command::new("python3");
        cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/clients_py.py"))
            .arg(group)
            .env("PYTHONPATH", clients_dir().join(dir));
        cmd
    };
    let mut steps = steps(python("frameworks", "py"), &base, "the agent frameworks");
    steps.extend(self::steps(
        python("libraries", "lite"),
        &base,
        "LlamaIndex and litellm",
    ));
    assert!(
        text_of(&steps, "agents").contains("18 C and sunny in Paris"),
        "{}",
        steps["agents"]
    );
    assert_eq!(text_of(&steps, "langchain"), "hello langchain answer");
    assert_eq!(steps["langchain_tools"]["calls"][0], "get_weather");
    assert!(
        text_of(&steps, "langchain_tools").contains("18 C and sunny in Paris"),
        "{}",
        steps["langchain_tools"]
    );
    assert_eq!(text_of(&steps, "llamaindex"), "hello llamaindex answer");
    assert_eq!(text_of(&steps, "litellm"), "hello litellm answer");
    assert!(d.sigterm().success());
}
