//! The MCP servers in `doctor`: each one started and listed, and what its sandbox settings
//! leave open (`sandbox = false`, a `unix_sockets` list the kernel does not enforce, a listed
//! socket that is not there).

use std::path::Path;
use std::time::Duration;

use super::{Check, Status, check};
use crate::config::{Config, McpServerConfig, McpTransport};
use crate::tools::mcp::{McpManager, McpSandbox, unix_sockets_note, unsandboxed_note};

/// Start each MCP server, wait up to 10 s for its tool list, report its state; after each
/// one, what its sandbox leaves open.
pub(super) async fn servers(cfg: &Config) -> Vec<Check> {
    let cancel = tokio_util::sync::CancellationToken::new();
    let mgr = McpManager::start(
        &cfg.mcp_servers,
        McpSandbox::from_config(cfg),
        cancel.clone(),
    );
    mgr.wait_ready(Duration::from_secs(10)).await;
    let status = mgr.status();
    cancel.cancel();
    let abi = crate::sandbox::probe::landlock_abi();
    let mut out = Vec::new();
    for (name, st) in status.as_object().into_iter().flatten() {
        let state = st["state"].as_str().unwrap_or("unknown");
        let (status, detail) = match state {
            "ready" => (Status::Pass, format!("ready, {} tool(s)", st["tools"])),
            "disabled" => (Status::Warn, "disabled".to_string()),
            other => (
                Status::Fail,
                format!(
                    "{other}: {}",
                    st["last_error"].as_str().unwrap_or("not ready in 10 s")
                ),
            ),
        };
        out.push(check(format!("mcp {name}"), status, detail));
        if let Some(server) = cfg.mcp_servers.get(name) {
            out.extend(exposure(server, abi));
        }
    }
    out
}

/// What the sandbox settings of an enabled stdio server leave open on a kernel with Landlock
/// ABI `abi`: `sandbox = false` (a warning), the `unix_sockets` list (a warning where it is
/// not enforced) and each listed path that is not a socket (yet).
fn exposure(server: &McpServerConfig, abi: i32) -> Vec<Check> {
    let name = &server.name;
    if !server.enabled || !matches!(server.transport, McpTransport::Stdio { .. }) {
        return Vec::new();
    }
    if !server.sandbox {
        return vec![check(
            format!("mcp {name} sandbox"),
            Status::Warn,
            unsandboxed_note(name),
        )];
    }
    if server.unix_sockets.is_empty() {
        return Vec::new();
    }
    let (enforced, note) = unix_sockets_note(name, abi);
    let status = if enforced { Status::Pass } else { Status::Warn };
    let mut out = vec![check(format!("mcp {name} unix_sockets"), status, note)];
    for path in &server.unix_sockets {
        if let Some(problem) = not_a_socket(path) {
            out.push(check(
                format!("mcp {name} socket {}", path.display()),
                Status::Warn,
                problem,
            ));
        }
    }
    out
}

/// Why `path` is not a Unix socket the server could connect to now, if it is not.
fn not_a_socket(path: &Path) -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => None,
        Ok(_) => Some(format!(
            "{} is not a Unix socket; fix the path in unix_sockets",
            path.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(format!(
            "{} does not exist (yet): start the program that listens there before the server, \
             or fix the path in unix_sockets",
            path.display()
        )),
        Err(e) => Some(format!("cannot check {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn server(sandbox: bool, unix_sockets: Vec<std::path::PathBuf>) -> McpServerConfig {
        McpServerConfig {
            name: "s".into(),
            transport: McpTransport::Stdio {
                command: "srv".into(),
                args: Vec::new(),
                env: BTreeMap::new(),
                cwd: None,
            },
            enabled: true,
            tools: None,
            timeout: Duration::from_secs(5),
            network: true,
            sandbox,
            unix_sockets,
        }
    }

    /// Each setting has its line: nothing for the default, a warning for `sandbox = false`,
    /// the list's enforcement by ABI, and a warning per listed path that is not a socket.
    #[test]
    fn sandbox_settings_are_reported() {
        assert!(exposure(&server(true, Vec::new()), 7).is_empty());
        let off = exposure(&server(false, Vec::new()), 9);
        assert_eq!(off.len(), 1);
        assert_eq!(off[0].status, Status::Warn);
        assert!(off[0].detail.contains("sandbox = false"), "{:?}", off[0]);

        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, "").unwrap();
        let listed = vec![sock, file, dir.path().join("missing")];
        let old = exposure(&server(true, listed.clone()), 7);
        assert_eq!(old.len(), 3, "{old:?}");
        assert_eq!(old[0].status, Status::Warn);
        assert!(
            old[0]
                .detail
                .contains("unix_sockets is not enforced on this kernel (Landlock ABI 7 < 9)"),
            "{:?}",
            old[0]
        );
        assert!(
            old[1].detail.contains("is not a Unix socket"),
            "{:?}",
            old[1]
        );
        assert!(old[2].detail.contains("does not exist"), "{:?}", old[2]);
        let new = exposure(&server(true, listed), 9);
        assert_eq!(new[0].status, Status::Pass, "{:?}", new[0]);
        assert!(new[0].detail.contains("is enforced"), "{:?}", new[0]);
    }
}
