//! `[tools]` (SPEC §3, §11).

use std::path::{Path, PathBuf};
use std::time::Duration;

use secrecy::SecretString;

use super::paths::{normalize, resolve};
use super::sections::{strings, tilde};
use super::types::{ExecSandbox, ToolsConfig};
use super::walker::{Section, closest};

/// Names of the built-in tools (SPEC §11). `[tools] enabled` and `subagent_deny` may only name
/// these; MCP tools are governed by their server's `tools` list.
pub const BUILTIN_TOOLS: &[&str] = &[
    "read",
    "list",
    "glob",
    "write",
    "edit",
    "exec",
    "web_fetch",
    "web_search",
    "message",
    "react",
    "schedule_message",
    "list_scheduled",
    "cancel_scheduled",
    "session_status",
    "load_skill",
    "sessions_spawn",
    "memory_search",
    "memory_get",
    "memory_write",
    "memory_forget",
    "commitment_update",
    "tts",
];

/// Default `web_search.base_url` for the Brave provider.
pub const BRAVE_SEARCH_URL: &str = "https://api.search.brave.com/res/v1/web/search";

/// Environment variable holding the search key.
pub const BRAVE_KEY_ENV: &str = "AGENTD_BRAVE_KEY";

const MIB: u64 = 1024 * 1024;

/// The default `[tools] scratch_dir`: `agentd-scratch-<uid>` under the system temp directory
/// (`$TMPDIR`, else `/tmp`), so two users of one machine never share it.
pub fn default_scratch_dir() -> PathBuf {
    std::env::temp_dir().join(format!("agentd-scratch-{}", nix::unistd::geteuid()))
}

/// `[tools]`. `allowed_paths` and `scratch_dir` resolve against `config_dir`; default
/// `allowed_paths` = `[workspace, scratch_dir]` (SPEC §16.8).
pub fn tools(root: &mut Section<'_>, config_dir: &Path, workspace: &Path) -> ToolsConfig {
    let mut s = root.section("tools");
    let enabled: Option<Vec<String>> = s.get("enabled");
    if let Some(list) = &enabled {
        check_tool_names(&s, "enabled", list);
    }
    let subagent_deny: Vec<String> = s
        .get("subagent_deny")
        .unwrap_or_else(|| strings(&["sessions_spawn", "schedule_message", "react"]));
    check_tool_names(&s, "subagent_deny", &subagent_deny);

    let exec_timeout: u64 = s.int("exec_timeout_seconds", 1).unwrap_or(120);
    let exec_max_timeout: u64 = s.int("exec_max_timeout_seconds", 1).unwrap_or(600);
    if exec_timeout > exec_max_timeout {
        s.problem(
            "exec_timeout_seconds",
            format!("must not exceed exec_max_timeout_seconds ({exec_max_timeout})"),
        );
    }

    // Lexical, not canonical: a symlink planted at the scratch path must stay visible, so the
    // start-up check (`tools::paths::ensure_scratch_dir`) can refuse it.
    let scratch_dir = match s.non_empty("scratch_dir") {
        Some(raw) => tilde(&s, "scratch_dir", &raw)
            .map(|p| normalize(&config_dir.join(p)))
            .unwrap_or_else(default_scratch_dir),
        None => default_scratch_dir(),
    };
    if scratch_dir.parent().is_none() {
        s.problem(
            "scratch_dir",
            "must not be the root directory; give a directory of its own, e.g. \"/tmp/agentd-scratch\"",
        );
    }

    let mut fs = s.section("filesystem");
    let allowed_paths = match fs.get::<Vec<String>>("allowed_paths") {
        Some(list) => list
            .iter()
            .enumerate()
            .filter_map(|(i, raw)| {
                if raw.trim().is_empty() {
                    fs.problem(&format!("allowed_paths[{i}]"), "must not be empty");
                    return None;
                }
                tilde(&fs, &format!("allowed_paths[{i}]"), raw).map(|p| resolve(&p, config_dir))
            })
            .collect(),
        None => vec![workspace.to_path_buf(), scratch_dir.clone()],
    };
    drop(fs);

    let mut ws = s.section("web_search");
    let web_search_provider = ws
        .choice("provider", &[("brave", "brave")])
        .unwrap_or("brave")
        .to_string();
    let web_search_base_url = ws
        .non_empty("base_url")
        .unwrap_or_else(|| BRAVE_SEARCH_URL.into());
    super::channels::check_url(&ws, "base_url", &web_search_base_url);
    drop(ws);

    let mut wf = s.section("web_fetch");
    let web_fetch_max_bytes = wf.int("max_bytes", 1).unwrap_or(2 * MIB);
    let web_fetch_allow_hosts = wf.get("allow_hosts").unwrap_or_default();
    drop(wf);

    let mut sc = s.section("scheduling");
    let max_scheduled = sc.int("max_scheduled", 0).unwrap_or(50);
    let max_delay = Duration::from_secs(sc.int("max_delay_seconds", 1).unwrap_or(30 * 86_400));
    drop(sc);

    let max_parallel_calls: usize = s.int("max_parallel_calls", 1).unwrap_or(8);
    let writable_context: Vec<String> = s
        .get("writable_context")
        .unwrap_or_else(|| strings(&["MEMORY.md"]));
    for (i, name) in writable_context.iter().enumerate() {
        let p = Path::new(name);
        let plain = p
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if name.trim().is_empty() || !plain {
            s.problem(
                &format!("writable_context[{i}]"),
                format!(
                    "{name:?} must be a file path relative to the workspace without `..`, as in [agent.context], e.g. \"MEMORY.md\""
                ),
            );
        }
    }

    let web_search_key = s
        .walker()
        .env()
        .get_non_empty(BRAVE_KEY_ENV)
        .map(SecretString::from);
    ToolsConfig {
        enabled,
        exec_timeout: Duration::from_secs(exec_timeout),
        exec_max_timeout: Duration::from_secs(exec_max_timeout),
        exec_sandbox: s
            .choice(
                "exec_sandbox",
                &[
                    ("landlock", ExecSandbox::Landlock),
                    ("none", ExecSandbox::None),
                ],
            )
            .unwrap_or(ExecSandbox::Landlock),
        exec_network: s.get("exec_network").unwrap_or(false),
        allowed_paths: allowed_paths.into_iter().collect::<Vec<PathBuf>>(),
        scratch_dir,
        subagent_deny,
        subagent_model: s
            .non_empty("subagent_model")
            .unwrap_or_else(|| "subagent".into()),
        web_search_provider,
        web_search_base_url,
        web_fetch_max_bytes,
        web_fetch_allow_hosts,
        max_scheduled,
        max_delay,
        max_parallel_calls,
        writable_context,
        web_search_key,
    }
}

fn check_tool_names(s: &Section<'_>, key: &str, names: &[String]) {
    for (i, name) in names.iter().enumerate() {
        if BUILTIN_TOOLS.contains(&name.as_str()) {
            continue;
        }
        let hint = match closest(name, BUILTIN_TOOLS) {
            Some(near) => format!(" (did you mean {near:?}?)"),
            None => format!("; built-in tools are: {}", BUILTIN_TOOLS.join(", ")),
        };
        s.problem(
            &format!("{key}[{i}]"),
            format!("unknown tool {name:?}{hint}"),
        );
    }
}
