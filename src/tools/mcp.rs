//! MCP servers (SPEC §12): one supervisor task per enabled stdio server keeps a client session
//! alive (restart with backoff 0, 1, 2, 5, 10, 30, 60 s, then every 60 s) and the tools it lists
//! are exposed to the model as proxy tools named `<server>__<tool>`. rmcp stays behind this
//! module so its next major touches one file.

use std::collections::BTreeMap;
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
use crate::config::{McpServerConfig, McpTransport};
use crate::llm::ToolSpec;

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

impl McpManager {
    /// Spawn one supervisor task per enabled stdio server and return at once (needs a tokio
    /// runtime). Start-up failures are logged and retried, never fatal. HTTP servers are marked
    /// disabled ("not supported yet"). Call [`McpManager::wait_ready`] to let servers list their
    /// tools before building the tool registry.
    pub fn start(
        servers: &BTreeMap<String, McpServerConfig>,
        cancel: CancellationToken,
    ) -> Arc<McpManager> {
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
    let cmd = Command::new(command).configure(|c| {
        c.args(args)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v.expose_secret())));
        if let Some(dir) = cwd {
            c.current_dir(dir);
        }
    });
    let (transport, stderr) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start `{command}`: {e}"))?;
    if let Some(stderr) = stderr {
        let name = server.cfg.name.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::info!(server = %name, "mcp stderr: {line}");
            }
        });
    }
    let service = tokio::time::timeout(timeout, ().serve(transport))
        .await
        .map_err(|_| format!("initialize timed out after {}s", timeout.as_secs()))?
        .map_err(|e| format!("initialize failed: {e}"))?;
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
