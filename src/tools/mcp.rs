//! MCP servers (SPEC §12): one supervisor task per enabled stdio server keeps a client session
//! alive (restart with backoff 0, 1, 2, 5, 10, 30, 60 s, then every 60 s) and the tools it lists
//! are exposed to the model as proxy tools named `<server>__<tool>`. Every stdio server runs
//! through the exec sandbox helper ([`McpSandbox`], docs/security.md). rmcp stays behind this
//! module so its next major touches one file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{Peer, RoleClient, ServiceError};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use secrecy::ExposeSecret;
use serde_json::{Map, Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::process::Command;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{Tool, ToolContext, ToolError};
use crate::config::{Config, ExecSandbox, McpServerConfig, McpTransport};
use crate::llm::ToolSpec;
use crate::sandbox::helper::ERROR_PREFIX as HELPER_ERROR_PREFIX;
use crate::sandbox::runner::SANDBOX_PATH;
use crate::sandbox::{HELPER_SUBCOMMAND, Policy, SandboxMode};

/// Restart delays after consecutive failures; the last one repeats.
const BACKOFF_SECS: [u64; 7] = [0, 1, 2, 5, 10, 30, 60];
/// A server that stayed up this long starts the backoff sequence from the beginning again.
const STABLE_AFTER: Duration = Duration::from_secs(60);

/// Lifecycle state of one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Starting,
    Ready,
    Backoff,
    Disabled,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Ready => "ready",
            State::Backoff => "backoff",
            State::Disabled => "disabled",
        }
    }
}

/// Mutable facts about one server, behind a short-held mutex.
struct Shared {
    state: State,
    peer: Option<Peer<RoleClient>>,
    /// The server's tools as last listed (kept while it is down).
    tools: Vec<rmcp::model::Tool>,
    restarts: u64,
    last_error: Option<String>,
    /// True once the first start attempt finished (ready or failed).
    settled: bool,
}

/// One configured server and its live state.
struct Server {
    cfg: McpServerConfig,
    sandbox: Arc<McpSandbox>,
    shared: Mutex<Shared>,
    /// Signalled by a call that saw the transport closed, and on every settle.
    closed: Notify,
    settled: Notify,
}

impl Server {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Supervises the configured MCP servers and hands out proxy tools for them.
pub struct McpManager {
    servers: Vec<Arc<Server>>,
}

/// How stdio servers are confined (SPEC §16.9 "Processes"): each runs through the exec
/// sandbox helper (`agentd sandbox-exec`) under [`Policy::for_mcp_server`] — no read of the
/// state or config directory (nor `.env`), a private directory as HOME and TMPDIR, network per
/// server — with only the configured `env` plus `PATH`, `HOME` and `TMPDIR`.
#[derive(Debug, Clone)]
pub struct McpSandbox {
    /// `[tools] exec_sandbox`: `landlock` refuses to start a server the kernel cannot confine.
    pub mode: SandboxMode,
    /// `filesystem.allowed_paths`: what a server may write besides its private directory.
    pub allowed_paths: Vec<PathBuf>,
    /// Never readable by a server: the state and config directories.
    pub protected: Vec<PathBuf>,
    /// Each server's private directory is `<private_root>/<name>` (created 0700).
    pub private_root: PathBuf,
    /// Working directory of a server without `cwd` (the workspace).
    pub default_cwd: PathBuf,
    /// The `agentd` binary that provides `sandbox-exec`; `None` = the running executable.
    pub helper_exe: Option<PathBuf>,
    /// Force the subreaper fallback (tests of that path; see [`Policy::no_namespaces`]).
    pub no_namespaces: bool,
    /// Skip the mount namespace, as under the shipped units (tests of that path).
    pub no_mount_namespace: bool,
}

impl McpSandbox {
    /// From the whole config; private directories under `agentd-mcp-<uid>` in the system
    /// temporary directory.
    pub fn from_config(cfg: &Config) -> McpSandbox {
        McpSandbox {
            mode: match cfg.tools.exec_sandbox {
                ExecSandbox::Landlock => SandboxMode::Landlock,
                ExecSandbox::None => SandboxMode::None,
            },
            allowed_paths: cfg.tools.allowed_paths.clone(),
            protected: vec![cfg.paths.state_dir.clone(), cfg.config_dir.clone()],
            private_root: std::env::temp_dir()
                .join(format!("agentd-mcp-{}", nix::unistd::geteuid())),
            default_cwd: cfg.agent.workspace.clone(),
            helper_exe: None,
            no_namespaces: false,
            no_mount_namespace: false,
        }
    }

    /// The helper command that runs `command args…` for server `cfg`, its environment set.
    fn command(
        &self,
        cfg: &McpServerConfig,
        command: &str,
        args: &[String],
        env: &BTreeMap<String, secrecy::SecretString>,
        cwd: Option<&PathBuf>,
    ) -> Result<Command, String> {
        let private = private_dir(&self.private_root, &cfg.name)?;
        let mut policy = Policy::for_mcp_server(
            self.mode,
            cfg.network,
            &self.allowed_paths,
            &self.protected,
            &private,
        )?;
        policy.no_namespaces = self.no_namespaces;
        policy.no_mount_namespace = self.no_mount_namespace;
        let policy = serde_json::to_string(&policy)
            .map_err(|e| format!("cannot encode the sandbox policy: {e}"))?;
        let exe = match &self.helper_exe {
            Some(exe) => exe.clone(),
            None => std::env::current_exe()
                .map_err(|e| format!("cannot find the agentd executable: {e}"))?,
        };
        let private = private.display().to_string();
        let defaults = [
            ("PATH", SANDBOX_PATH.to_string()),
            ("HOME", private.clone()),
            ("TMPDIR", private),
        ];
        let cwd = cwd.unwrap_or(&self.default_cwd).clone();
        Ok(Command::new(exe).configure(|c| {
            c.arg(HELPER_SUBCOMMAND)
                .arg("--policy")
                .arg(policy)
                .arg("--")
                .arg(command)
                .args(args)
                .env_clear()
                .envs(
                    defaults
                        .iter()
                        .filter(|(k, _)| !env.contains_key(*k))
                        .cloned(),
                )
                .envs(env.iter().map(|(k, v)| (k, v.expose_secret())))
                .current_dir(cwd);
        }))
    }
}

/// `<root>/<name>`, created 0700 (with `root`), refused unless both are real directories of
/// ours that nobody else can enter: a name in the shared temporary directory could have been
/// planted by another user.
fn private_dir(root: &Path, name: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let dir = root.join(name);
    for d in [root, dir.as_path()] {
        match std::fs::DirBuilder::new().mode(0o700).create(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", d.display())),
        }
        let meta = std::fs::symlink_metadata(d)
            .map_err(|e| format!("cannot stat {}: {e}", d.display()))?;
        let uid = nix::unistd::geteuid().as_raw();
        if !meta.is_dir() || meta.uid() != uid {
            return Err(format!(
                "{} is not a directory owned by uid {uid}; remove it so the MCP server's \
                 private directory can be created",
                d.display()
            ));
        }
        if meta.mode() & 0o077 != 0 {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("cannot make {} private (0700): {e}", d.display()))?;
        }
    }
    Ok(dir)
}

impl McpManager {
    /// Spawn one supervisor task per enabled stdio server and return at once (needs a tokio
    /// runtime). Start-up failures are logged and retried, never fatal. HTTP servers are marked
    /// disabled ("not supported yet"). Call [`McpManager::wait_ready`] to let servers list their
    /// tools before building the tool registry.
    pub fn start(
        servers: &BTreeMap<String, McpServerConfig>,
        sandbox: McpSandbox,
        cancel: CancellationToken,
    ) -> Arc<McpManager> {
        let sandbox = Arc::new(sandbox);
        let mut list = Vec::new();
        for cfg in servers.values() {
            let mut state = State::Starting;
            let mut last_error = None;
            if !cfg.enabled {
                state = State::Disabled;
                last_error = Some("disabled in config".to_string());
            }
            let server = Arc::new(Server {
                cfg: cfg.clone(),
                sandbox: sandbox.clone(),
                shared: Mutex::new(Shared {
                    state,
                    peer: None,
                    tools: Vec::new(),
                    restarts: 0,
                    last_error,
                    settled: state == State::Disabled,
                }),
                closed: Notify::new(),
                settled: Notify::new(),
            });
            if state == State::Starting {
                tokio::spawn(supervise(server.clone(), cancel.clone()));
            }
            list.push(server);
        }
        Arc::new(McpManager { servers: list })
    }

    /// Wait (at most `within`, all servers in parallel) until every server finished its first
    /// start attempt, so [`McpManager::tools`] knows their tools.
    pub async fn wait_ready(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        for server in &self.servers {
            loop {
                let notified = server.settled.notified();
                if server.lock().settled {
                    break;
                }
                if tokio::time::timeout_at(deadline, notified).await.is_err() {
                    return;
                }
            }
        }
    }

    /// One proxy tool per server tool currently known, filtered by the server's allow-list.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        let mut out: Vec<Arc<dyn Tool>> = Vec::new();
        for server in &self.servers {
            let tools = server.lock().tools.clone();
            for tool in tools {
                let remote = tool.name.to_string();
                if let Some(allow) = &server.cfg.tools
                    && !allow.contains(&remote)
                {
                    continue;
                }
                out.push(Arc::new(McpTool {
                    name: exposed_name(&server.cfg.name, &remote),
                    description: tool.description.as_deref().unwrap_or("").to_string(),
                    schema: normalise_schema(Value::Object((*tool.input_schema).clone())),
                    remote,
                    server: server.clone(),
                }));
            }
        }
        out
    }

    /// Per server: `state` (starting|ready|backoff|disabled), `tools`, `restarts`, `last_error`.
    pub fn status(&self) -> Value {
        let mut map = Map::new();
        for server in &self.servers {
            let s = server.lock();
            map.insert(
                server.cfg.name.clone(),
                json!({
                    "state": s.state.as_str(),
                    "tools": s.tools.len(),
                    "restarts": s.restarts,
                    "last_error": s.last_error,
                }),
            );
        }
        Value::Object(map)
    }
}

/// Keep one server running until `cancel` fires.
async fn supervise(server: Arc<Server>, cancel: CancellationToken) {
    let name = server.cfg.name.clone();
    let mut failures: usize = 0;
    loop {
        {
            let mut s = server.lock();
            s.state = State::Starting;
        }
        let started = tokio::select! {
            _ = cancel.cancelled() => return,
            r = connect(&server) => r,
        };
        match started {
            Ok((service, tools)) => {
                tracing::info!(server = %name, tools = tools.len(), "MCP server ready");
                {
                    let mut s = server.lock();
                    s.state = State::Ready;
                    s.peer = Some(service.peer().clone());
                    s.tools = tools;
                    s.settled = true;
                }
                server.settled.notify_waiters();
                let up_since = Instant::now();
                let closed = server.closed.notified();
                let stop = service.cancellation_token();
                // Dropping the `waiting` future drops the service, which kills the child.
                tokio::select! {
                    _ = cancel.cancelled() => {
                        stop.cancel();
                        return;
                    }
                    _ = closed => {}
                    _ = service.waiting() => {}
                }
                if up_since.elapsed() >= STABLE_AFTER {
                    failures = 0;
                }
                tracing::warn!(server = %name, "MCP server connection closed; restarting");
                let mut s = server.lock();
                s.peer = None;
                s.last_error = Some("connection closed".to_string());
            }
            Err(e) => {
                tracing::warn!(server = %name, error = %e, "MCP server failed to start");
                {
                    let mut s = server.lock();
                    s.last_error = Some(e);
                    s.settled = true;
                }
                server.settled.notify_waiters();
            }
        }
        let delay = BACKOFF_SECS[failures.min(BACKOFF_SECS.len() - 1)];
        failures += 1;
        {
            let mut s = server.lock();
            s.state = State::Backoff;
            s.restarts += 1;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(delay)) => {}
        }
    }
}

type Running = rmcp::service::RunningService<RoleClient, ()>;

/// Spawn the child, do the handshake and list its tools (bounded by the server timeout).
async fn connect(server: &Server) -> Result<(Running, Vec<rmcp::model::Tool>), String> {
    let timeout = server.cfg.timeout;
    let (command, args, env, cwd) = match &server.cfg.transport {
        McpTransport::Stdio {
            command,
            args,
            env,
            cwd,
        } => (command, args, env, cwd),
        McpTransport::Http { url, headers } => {
            use rmcp::transport::StreamableHttpClientTransport;
            use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
            for (k, v) in headers {
                let v = v.expose_secret();
                if k.eq_ignore_ascii_case("authorization") {
                    config.auth_header = Some(v.strip_prefix("Bearer ").unwrap_or(v).to_string());
                } else {
                    let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                        .map_err(|_| format!("headers: {k:?} is not a valid header name"))?;
                    let value = reqwest::header::HeaderValue::from_str(v)
                        .map_err(|_| format!("headers.{k}: not a valid header value"))?;
                    config.custom_headers.insert(name, value);
                }
            }
            let transport = StreamableHttpClientTransport::from_config(config);
            let service = tokio::time::timeout(timeout, ().serve(transport))
                .await
                .map_err(|_| format!("initialize timed out after {}s", timeout.as_secs()))?
                .map_err(|e| format!("initialize failed: {e}"))?;
            let tools = tokio::time::timeout(timeout, service.list_all_tools())
                .await
                .map_err(|_| format!("tools/list timed out after {}s", timeout.as_secs()))?
                .map_err(|e| format!("tools/list failed: {e}"))?;
            return Ok((service, tools));
        }
    };
    let cmd = server
        .sandbox
        .command(&server.cfg, command, args, env, cwd.as_ref())?;
    let (transport, stderr) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the sandbox helper for `{command}`: {e}"))?;
    // The helper's own complaint (sandbox setup failed, command not found) explains a failed
    // handshake better than "connection closed".
    let setup_error: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    if let Some(stderr) = stderr {
        let name = server.cfg.name.clone();
        let setup_error = setup_error.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(msg) = line.strip_prefix(HELPER_ERROR_PREFIX) {
                    let mut slot = setup_error.lock().unwrap_or_else(|p| p.into_inner());
                    slot.get_or_insert_with(|| msg.to_string());
                }
                tracing::info!(server = %name, "mcp stderr: {line}");
            }
        });
    }
    let service = match tokio::time::timeout(timeout, ().serve(transport)).await {
        Err(_) => return Err(format!("initialize timed out after {}s", timeout.as_secs())),
        Ok(Ok(service)) => service,
        Ok(Err(e)) => {
            // Give the stderr reader a moment to see the helper's last line.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let why = setup_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            return Err(match why {
                Some(why) => format!("initialize failed: {e} ({why})"),
                None => format!("initialize failed: {e}"),
            });
        }
    };
    let tools = tokio::time::timeout(timeout, service.list_all_tools())
        .await
        .map_err(|_| format!("tools/list timed out after {}s", timeout.as_secs()))?
        .map_err(|e| format!("tools/list failed: {e}"))?;
    Ok((service, tools))
}

/// A model-facing tool that forwards to one MCP server tool.
struct McpTool {
    name: String,
    description: String,
    schema: Value,
    remote: String,
    server: Arc<Server>,
}

impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.clone(),
            description: self.description.clone(),
            input_schema: self.schema.clone(),
        }
    }

    /// An MCP server's answer comes from outside: marked untrusted.
    fn untrusted_output(&self) -> bool {
        true
    }

    fn timeout(&self) -> Option<Duration> {
        // A little headroom so our own, clearer timeout error wins.
        Some(self.server.cfg.timeout + Duration::from_secs(1))
    }

    fn call<'a>(
        &'a self,
        args: Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let server_name = &self.server.cfg.name;
            let peer = {
                let s = self.server.lock();
                match (&s.peer, s.state) {
                    (Some(p), State::Ready) => p.clone(),
                    (_, state) => {
                        return Err(ToolError::Failed(format!(
                            "MCP server '{server_name}' is not available (state: {})",
                            state.as_str()
                        )));
                    }
                }
            };
            let mut params = CallToolRequestParams::new(self.remote.clone());
            if let Value::Object(map) = args {
                params = params.with_arguments(map);
            }
            let timeout = self.server.cfg.timeout;
            let result = match tokio::time::timeout(timeout, peer.call_tool(params)).await {
                Err(_) => {
                    return Err(ToolError::Failed(format!(
                        "MCP server '{server_name}': tool '{}' timed out after {}s",
                        self.remote,
                        timeout.as_secs()
                    )));
                }
                Ok(Err(e)) => {
                    if matches!(e, ServiceError::TransportClosed) || peer.is_transport_closed() {
                        self.server.closed.notify_waiters();
                    }
                    return Err(ToolError::Failed(format!(
                        "MCP server '{server_name}': tool '{}' failed: {e}",
                        self.remote
                    )));
                }
                Ok(Ok(r)) => r,
            };
            let value = serde_json::to_value(&result).unwrap_or(Value::Null);
            let text = render_content(&value);
            if result.is_error == Some(true) {
                Err(ToolError::Failed(format!(
                    "MCP server '{server_name}': {text}"
                )))
            } else {
                Ok(text)
            }
        })
    }
}

/// Join the text parts of a `CallToolResult` (as JSON); other parts are summarised.
fn render_content(result: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(items) = result.get("content").and_then(Value::as_array) {
        for item in items {
            let kind = item
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("unknown");
            match (kind, item.get("text").and_then(Value::as_str)) {
                ("text", Some(text)) => parts.push(text.to_string()),
                _ => {
                    let mime = item
                        .get("mimeType")
                        .or_else(|| item.get("resource").and_then(|r| r.get("mimeType")))
                        .and_then(Value::as_str);
                    parts.push(match mime {
                        Some(m) => format!("[{kind} content, {m}]"),
                        None => format!("[{kind} content]"),
                    });
                }
            }
        }
    }
    if parts.is_empty()
        && let Some(structured) = result.get("structuredContent")
    {
        return structured.to_string();
    }
    parts.join("\n")
}

/// `<server>__<tool>` reduced to `[A-Za-z0-9_-]{1,64}`.
fn exposed_name(server: &str, tool: &str) -> String {
    let raw = format!("{server}__{tool}");
    let mut name: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if name.is_empty() {
        name.push('_');
    }
    name
}

/// Make sure the registry gets an object schema: add a missing `type`, replace a non-object one.
fn normalise_schema(schema: Value) -> Value {
    let Value::Object(mut map) = schema else {
        return json!({"type": "object", "properties": {}});
    };
    match map.get("type") {
        None => {
            map.insert("type".into(), json!("object"));
            map.entry("properties").or_insert_with(|| json!({}));
            Value::Object(map)
        }
        Some(Value::String(t)) if t == "object" => Value::Object(map),
        Some(_) => json!({"type": "object", "properties": {}, "additionalProperties": true}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_are_namespaced_and_sanitised() {
        assert_eq!(exposed_name("fs", "read_file"), "fs__read_file");
        assert_eq!(exposed_name("fs", "a.b c"), "fs__a_b_c");
        assert_eq!(exposed_name("s", &"x".repeat(100)).len(), 64);
    }

    proptest! {
        #[test]
        fn exposed_names_are_always_valid(server in ".{0,40}", tool in ".{0,80}") {
            let n = exposed_name(&server, &tool);
            prop_assert!(!n.is_empty() && n.len() <= 64);
            prop_assert!(n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'));
        }
    }

    #[test]
    fn schemas_become_object_schemas() {
        assert_eq!(
            normalise_schema(json!({"properties": {"a": {"type": "string"}}})),
            json!({"type": "object", "properties": {"a": {"type": "string"}}})
        );
        assert_eq!(
            normalise_schema(json!({"type": "string"}))["type"],
            json!("object")
        );
        let ok = json!({"type": "object", "required": ["a"]});
        assert_eq!(normalise_schema(ok.clone()), ok);
    }

    #[test]
    fn content_is_rendered() {
        let r = json!({"content": [
            {"type": "text", "text": "one"},
            {"type": "image", "data": "xx", "mimeType": "image/png"},
            {"type": "text", "text": "two"}
        ]});
        assert_eq!(render_content(&r), "one\n[image content, image/png]\ntwo");
        assert_eq!(
            render_content(&json!({"content": [], "structuredContent": {"a": 1}})),
            "{\"a\":1}"
        );
    }
}
