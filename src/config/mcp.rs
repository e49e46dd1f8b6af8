//! `[mcp.servers.<name>]` (SPEC §12).

use std::collections::BTreeMap;
use std::path::Path;

use secrecy::SecretString;

use super::env::is_var_name;
use super::keys::tools::{
    MCP_ARGS, MCP_COMMAND, MCP_CWD, MCP_ENABLED, MCP_ENV, MCP_HEADERS, MCP_NETWORK, MCP_SANDBOX,
    MCP_TIMEOUT, MCP_TOOLS, MCP_UNIX_SOCKETS, MCP_URL,
};
use super::paths::resolve;
use super::types::{McpServerConfig, McpTransport};
use super::walker::Section;

/// Whether `name` is a valid MCP server name (`[A-Za-z0-9_-]+`).
pub fn is_server_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `[mcp]` with its `servers` table. `cwd` resolves against `config_dir`.
pub fn servers(root: &mut Section<'_>, config_dir: &Path) -> BTreeMap<String, McpServerConfig> {
    let mut mcp = root.section("mcp");
    let mut servers = mcp.section("servers");
    let mut out = BTreeMap::new();
    for (name, value) in servers.rest() {
        if !is_server_name(&name) {
            servers.problem(
                &name,
                "invalid server name; use only letters, digits, _ and - (tools are exposed as <name>__<tool>)",
            );
        }
        let Some(mut s) = servers.child(&name, value) else {
            continue;
        };
        if let Some(server) = server(&mut s, &name, config_dir) {
            out.insert(name, server);
        }
    }
    out
}

fn server(s: &mut Section<'_>, name: &str, config_dir: &Path) -> Option<McpServerConfig> {
    let command = s.read_opt(&MCP_COMMAND);
    let url = s.read_opt(&MCP_URL);
    let has_args = s.has("args");
    let args = s.read(&MCP_ARGS);
    let has_env = s.has("env");
    let env = s.read(&MCP_ENV);
    check_var_names(s, &env);
    let has_cwd = s.has("cwd");
    let cwd = s
        .read_opt(&MCP_CWD)
        .flatten()
        .map(|p| resolve(&p, config_dir));
    let has_headers = s.has("headers");
    let headers = s.read(&MCP_HEADERS);
    let enabled = s.read(&MCP_ENABLED);
    let tools = s.read(&MCP_TOOLS);
    let timeout = s.read(&MCP_TIMEOUT);
    let has_network = s.has("network");
    let network = s.read(&MCP_NETWORK);
    let has_sandbox = s.has("sandbox");
    let sandbox = s.read(&MCP_SANDBOX);
    let has_unix_sockets = s.has("unix_sockets");
    let unix_sockets = s.read(&MCP_UNIX_SOCKETS);

    let transport = match (command, url) {
        (Some(command), None) => {
            if has_headers {
                s.problem(
                    "headers",
                    "only valid with url (streamable HTTP); pass values to a command server through env",
                );
            }
            if !sandbox && !unix_sockets.is_empty() {
                s.problem(
                    "unix_sockets",
                    "has no effect with sandbox = false (the server reaches every socket then); remove it, or remove sandbox = false to keep the server sandboxed",
                );
            }
            if !sandbox && !network {
                s.problem(
                    "network",
                    "false has no effect with sandbox = false (nothing holds the network off then); remove it, or remove sandbox = false to keep the server sandboxed",
                );
            }
            McpTransport::Stdio {
                command,
                args,
                env,
                cwd,
            }
        }
        (None, Some(url)) => {
            for (present, key) in [
                (has_args, "args"),
                (has_env, "env"),
                (has_cwd, "cwd"),
                (has_network, "network"),
            ] {
                if present {
                    s.problem(key, "only valid with command (a child process); remove it");
                }
            }
            for (present, key) in [(has_sandbox, "sandbox"), (has_unix_sockets, "unix_sockets")] {
                if present {
                    s.problem(
                        key,
                        "only valid with command: a url server runs elsewhere and the daemon only sends it requests, so there is no process here to sandbox; remove it",
                    );
                }
            }
            McpTransport::Http { url, headers }
        }
        (Some(_), Some(_)) => {
            s.problem(
                "url",
                format!(
                    "server {name:?} has both command and url; keep command for a child process or url for streamable HTTP"
                ),
            );
            return None;
        }
        (None, None) => {
            s.problem(
                "command",
                format!(
                    "server {name:?} needs command = \"…\" (child process) or url = \"…\" (streamable HTTP)"
                ),
            );
            return None;
        }
    };
    Some(McpServerConfig {
        name: name.to_string(),
        transport,
        enabled,
        tools,
        timeout,
        network,
        sandbox,
        unix_sockets,
    })
}

/// `env` keys must be variable names.
fn check_var_names(s: &Section<'_>, env: &BTreeMap<String, SecretString>) {
    for k in env.keys().filter(|k| !is_var_name(k)) {
        s.walker().problem(
            super::walker::join_key(&s.key_path("env"), k),
            "invalid environment variable name; use letters, digits and _",
        );
    }
}
