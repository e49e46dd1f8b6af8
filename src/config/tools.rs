//! `[tools]` (SPEC §3, §11).

use std::path::{Path, PathBuf};

use secrecy::SecretString;

use super::keys::tools as kt;
use super::paths::{normalize, resolve};
use super::types::ToolsConfig;
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

/// Environment variable holding the search key.
pub const BRAVE_KEY_ENV: &str = "AGENTD_BRAVE_KEY";

/// The default `[tools] scratch_dir`: `agentd-scratch-<uid>` under the system temp directory
/// (`$TMPDIR`, else `/tmp`), so two users of one machine never share it.
pub fn default_scratch_dir() -> PathBuf {
    std::env::temp_dir().join(format!("agentd-scratch-{}", nix::unistd::geteuid()))
}

/// `[tools]`. `allowed_paths` and `scratch_dir` resolve against `config_dir`; default
/// `allowed_paths` = `[workspace, scratch_dir]` (SPEC §16.8).
pub fn tools(root: &mut Section<'_>, config_dir: &Path, workspace: &Path) -> ToolsConfig {
    let mut s = root.section("tools");
    let enabled = s.read(&kt::ENABLED);
    if let Some(list) = &enabled {
        check_tool_names(&s, "enabled", list);
    }
    let subagent_deny = s.read(&kt::SUBAGENT_DENY);
    check_tool_names(&s, "subagent_deny", &subagent_deny);

    let exec_timeout = s.read(&kt::EXEC_TIMEOUT);
    let exec_max_timeout = s.read(&kt::EXEC_MAX_TIMEOUT);
    if exec_timeout > exec_max_timeout {
        s.problem(
            "exec_timeout_seconds",
            format!(
                "must not exceed exec_max_timeout_seconds ({})",
                exec_max_timeout.as_secs()
            ),
        );
    }

    // Lexical, not canonical: a symlink planted at the scratch path must stay visible, so the
    // start-up check (`tools::paths::ensure_scratch_dir`) can refuse it.
    let scratch_dir = s
        .read_opt(&kt::SCRATCH_DIR)
        .map(|p| normalize(&config_dir.join(p)))
        .unwrap_or_else(default_scratch_dir);
    if scratch_dir.parent().is_none() {
        s.problem(
            "scratch_dir",
            "must not be the root directory; give a directory of its own, e.g. \"/tmp/agentd-scratch\"",
        );
    }

    let mut fs = s.section("filesystem");
    let allowed_paths = match fs.read_opt(&kt::ALLOWED_PATHS) {
        Some(list) => list.iter().map(|p| resolve(p, config_dir)).collect(),
        None => vec![workspace.to_path_buf(), scratch_dir.clone()],
    };
    drop(fs);

    let mut ws = s.section("web_search");
    let web_search_provider = ws.read(&kt::WEB_SEARCH_PROVIDER);
    let web_search_base_url = ws.read(&kt::WEB_SEARCH_BASE_URL);
    drop(ws);

    let mut wf = s.section("web_fetch");
    let web_fetch_max_bytes = wf.read(&kt::WEB_FETCH_MAX_BYTES);
    let web_fetch_allow_hosts = wf.read(&kt::WEB_FETCH_ALLOW_HOSTS);
    drop(wf);

    let mut sc = s.section("scheduling");
    let max_scheduled = sc.read(&kt::MAX_SCHEDULED);
    let max_delay = sc.read(&kt::MAX_DELAY);
    drop(sc);

    let max_parallel_calls = s.read(&kt::MAX_PARALLEL_CALLS);
    let writable_context = s.read(&kt::WRITABLE_CONTEXT);
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
        exec_timeout,
        exec_max_timeout,
        exec_sandbox: s.read(&kt::EXEC_SANDBOX),
        exec_network: s.read(&kt::EXEC_NETWORK),
        allowed_paths: allowed_paths.into_iter().collect::<Vec<PathBuf>>(),
        scratch_dir,
        subagent_deny,
        subagent_model: s.read(&kt::SUBAGENT_MODEL),
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
