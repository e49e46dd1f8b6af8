//! agentd as an MCP server (SPEC §23), on rmcp's server side. Only this module and
//! `tools/mcp/` name `rmcp`.
//!
//! One handler ([`handler::AgentdMcp`]) over an [`ApiBackend`]: the daemon's own
//! (`DaemonBackend`) behind `/mcp` on the HTTP API listener, or the FIFO and state files
//! (`cli::mcp`) behind `agentd mcp` on stdio. So both transports run the same tools, resources
//! and prompts through the same backend the HTTP API uses.
//!
//! - `handler`: the `ServerHandler`: tools, resources, prompts, subscriptions, cancellation.
//! - `tools`: the tool list (strict schemas) and the calls; `ask` in `ask`.
//! - `resources`: the monitor, the session trails, the workspace's memory files, the skills.

mod ask;
mod handler;
mod resources;
mod tools;

use std::path::PathBuf;
use std::sync::Arc;

use rmcp::ServiceExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::backend::ApiBackend;
use crate::config::{Config, HttpConfig};

/// Where the HTTP API serves it.
pub const PATH: &str = "/mcp";

/// What the MCP server reads besides its backend.
#[derive(Debug, Clone)]
pub struct McpOptions {
    /// The agent's name (server info).
    pub agent_name: String,
    /// The workspace: its memory files are resources.
    pub workspace: PathBuf,
    /// `[agent.skills] dir`: each skill is a prompt.
    pub skills_dir: Option<PathBuf>,
    /// `[mcp_server] allow_approvals`.
    pub allow_approvals: bool,
    /// The key prefix of sessions the client does not name: `mcp:` + the client's name.
    pub key_prefix: &'static str,
}

impl McpOptions {
    pub fn from_config(cfg: &Config) -> McpOptions {
        McpOptions {
            agent_name: cfg.agent.name.clone(),
            workspace: cfg.agent.workspace.clone(),
            skills_dir: Some(cfg.agent.skills.dir.clone()),
            allow_approvals: cfg.mcp_server.allow_approvals,
            key_prefix: "mcp:",
        }
    }
}

/// Errors of the stdio server.
#[derive(Debug, thiserror::Error)]
pub enum McpServeError {
    #[error("MCP stdio session failed to start: {0}")]
    Start(String),
    #[error("MCP stdio session ended with an error: {0}")]
    Run(String),
}

/// Serve one MCP session on stdin/stdout until the client closes it (or `cancel`).
pub async fn serve_stdio(
    backend: Arc<dyn ApiBackend>,
    opts: McpOptions,
    cancel: CancellationToken,
) -> Result<(), McpServeError> {
    let handler = handler::AgentdMcp::new(backend, Arc::new(opts), cancel.clone());
    let running = handler
        .serve_with_ct(rmcp::transport::stdio(), cancel)
        .await
        .map_err(|e| McpServeError::Start(e.to_string()))?;
    running
        .waiting()
        .await
        .map(|_| ())
        .map_err(|e| McpServeError::Run(e.to_string()))
}

/// The Streamable HTTP service mounted at `/mcp`: sessions with `Mcp-Session-Id`, the Host
/// checked against the listener's names (DNS rebinding), a browser `Origin` only when it is
/// the listener's own or one of `[http] cors_origins`.
pub(crate) fn http_service(
    backend: Arc<dyn ApiBackend>,
    opts: McpOptions,
    http: &HttpConfig,
    cancel: CancellationToken,
) -> StreamableHttpService<handler::AgentdMcp, LocalSessionManager> {
    let opts = Arc::new(opts);
    let port = http.port;
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    let mut origins: Vec<String> = vec![
        format!("http://localhost:{port}"),
        format!("http://127.0.0.1:{port}"),
        format!("http://[::1]:{port}"),
    ];
    let wildcard = matches!(http.host.as_str(), "0.0.0.0" | "::" | "[::]");
    if !wildcard && !hosts.contains(&http.host) {
        hosts.push(http.host.clone());
        origins.push(format!("http://{}:{port}", http.host));
        origins.push(format!("https://{}:{port}", http.host));
    }
    origins.extend(http.cors_origins.iter().cloned());
    let mut config = StreamableHttpServerConfig::default()
        .with_allowed_origins(origins)
        .enforce_origin_validation()
        .with_max_request_body_bytes(http.max_body_bytes)
        .with_cancellation_token(cancel.clone());
    // Bound to every address: any Host may be the listener's own name; the token guards it.
    config = if wildcard {
        config.disable_allowed_hosts()
    } else {
        config.with_allowed_hosts(hosts)
    };
    let cancel_all = cancel;
    StreamableHttpService::new(
        move || {
            Ok(handler::AgentdMcp::new(
                backend.clone(),
                opts.clone(),
                cancel_all.clone(),
            ))
        },
        Arc::new(LocalSessionManager::default()),
        config,
    )
}
