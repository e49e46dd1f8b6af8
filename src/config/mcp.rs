//! `[mcp.servers.<name>]` (SPEC §12).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use secrecy::SecretString;

use super::channels::check_url;
use super::env::is_var_name;
use super::paths::resolve;
use super::sections::path_value;
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
    let command: Option<String> = s.non_empty("command");
    let url: Option<String> = s.non_empty("url");
    let has_args = s.has("args");
    let args: Vec<String> = s.get("args").unwrap_or_default();
    let has_env = s.has("env");
    let mut e = s.section("env");
    let env = secrets(&mut e, true);
    drop(e);
    let has_cwd = s.has("cwd");
    let cwd = path_value(s, "cwd").map(|p| resolve(&p, config_dir));
    let has_headers = s.has("headers");
    let mut h = s.section("headers");
    let headers = secrets(&mut h, false);
    drop(h);
    let enabled = s.get("enabled").unwrap_or(true);
    let tools: Option<Vec<String>> = s.get("tools");
    let timeout = Duration::from_secs(s.int("timeout_seconds", 1).unwrap_or(60));
    let has_network = s.has("network");
    let network = s.get("network").unwrap_or(true);

    let transport = match (command, url) {
        (Some(command), None) => {
            if has_headers {
                s.problem(
                    "headers",
                    "only valid with url (streamable HTTP); pass values to a command server through env",
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
            check_url(s, "url", &url);
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
    })
}

/// A user-keyed table of strings (env or headers) as secrets. Env keys must be variable names.
fn secrets(s: &mut Section<'_>, var_names: bool) -> BTreeMap<String, SecretString> {
    s.entries::<String>()
        .into_iter()
        .filter(|(k, _)| {
            let ok = !var_names || is_var_name(k);
            if !ok {
                s.problem(
                    k,
                    "invalid environment variable name; use letters, digits and _",
                );
            }
            ok
        })
        .map(|(k, v)| (k, SecretString::from(v)))
        .collect()
}
