//! Tools the model can call: the `Tool` trait, the `ToolRegistry` (JSON-Schema validation of
//! arguments, per-call timeout, output truncation, concurrent execution with ordered results)
//! and the built-in tools. SPEC §11.

pub mod approval;
pub mod arg_schema;
pub mod assemble;
pub mod edit;
pub mod effects;
pub mod exec;
pub mod fs;
pub mod listing;
pub mod mcp;
pub mod memory;
pub mod messaging;
pub mod outbound;
pub mod paths;
pub mod registry;
pub mod schedule;
pub mod session_status;
pub mod spawn;
pub mod tts;
pub mod untrusted;
pub mod web;
pub mod web_search;
pub mod write;

pub use assemble::{Assembled, ToolDeps, assemble, follow_mcp};
pub use fs::ReadTool;
pub use registry::{ToolRegistry, truncate_output};
pub use session_status::SessionStatusTool;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::Value;

use crate::llm::ToolSpec;
use crate::message::{ToolImage, Usage};

/// A tool. Implementations are small and stateless where possible; everything per-call comes in
/// through `ToolContext`.
pub trait Tool: Send + Sync {
    /// Name, description and the JSON Schema of the arguments.
    fn spec(&self) -> ToolSpec;
    /// Per-call timeout; `None` = the registry default.
    fn timeout(&self) -> Option<Duration> {
        None
    }
    /// Whether the output comes from outside the daemon (a web page, an MCP server, a command,
    /// a file) and must reach the model marked as untrusted data. The registry then wraps the
    /// output, and the text of a `ToolError::Failed`, with `untrusted::wrap` (SPEC §11);
    /// `Invalid` and `Denied` errors are the tool's own checks and are not wrapped.
    fn untrusted_output(&self) -> bool {
        false
    }
    /// What a call with `args` reads and writes on disk, so that the calls of one answer that
    /// touch the same paths run in the order the model wrote them (`effects::waits_for`).
    /// Default: nothing.
    fn effects(&self, _args: &Value, _ctx: &ToolContext) -> effects::Effects {
        effects::Effects::default()
    }
    /// Run the tool. Arguments were already validated against `spec().input_schema`.
    fn call<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>>;
    /// Run the tool for the registry: its text and, for a model that sees images
    /// (`ToolContext::sees_images`), the images it returned. Default: [`Tool::call`], no
    /// images; a tool that returns images (the MCP proxy) overrides both.
    fn call_with_images<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            self.call(args, ctx).await.map(|text| ToolOutput {
                text,
                images: Vec::new(),
            })
        })
    }
}

/// What a call returned: its text (with a placeholder line per image) and the images a model
/// that sees them is sent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolOutput {
    pub text: String,
    pub images: Vec<ToolImage>,
}

/// An error the model gets to read as an error result.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Denied(String),
    #[error("{0}")]
    Failed(String),
}

/// Everything a tool may need about the call it serves.
#[derive(Clone)]
pub struct ToolContext {
    pub session_id: String,
    pub session_key: String,
    /// Absolute workspace path; relative tool paths resolve against it.
    pub workspace: PathBuf,
    /// `[tools] filesystem.allowed_paths`, absolute.
    pub allowed_paths: Vec<PathBuf>,
    /// The state and config directories, guarded by the file tools whatever `allowed_paths`
    /// says (SPEC §16.8).
    pub protected: paths::Protected,
    /// Where this message's reply goes (`Work::reply_to`): `tts` sends its voice note there.
    pub reply_to: Option<crate::message::Address>,
    /// Live facts for `session_status`.
    pub status: Arc<dyn StatusSource>,
    /// Whether the model that runs the call sees images (`[models.<name>] supports_vision`):
    /// a tool's images are passed to it, else they stay text placeholders.
    pub sees_images: bool,
}

/// Where `session_status` gets its figures (the agent loop implements it).
pub trait StatusSource: Send + Sync {
    fn session_status(&self) -> BoxFuture<'_, Result<SessionStatus, String>>;
}

/// What `session_status` reports.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SessionStatus {
    pub session_id: String,
    pub session_key: String,
    pub model: String,
    /// Tokens of the last request's prompt plus its output.
    pub context_tokens: u64,
    pub context_window: u64,
    pub messages: usize,
    pub compactions: u32,
    pub uptime_seconds: u64,
    pub today_cost_usd: f64,
    pub today_tokens: Usage,
}

/// The built-in tools this module provides (`read`, `write`, `edit`, `web_fetch`,
/// `session_status`). When `cfg.enabled` is `Some`, only the tools it lists are returned; names
/// it lists that are not built here are other modules' business (MCP, exec, ...) and are ignored.
pub fn builtin_tools(cfg: &crate::config::ToolsConfig) -> Vec<Arc<dyn Tool>> {
    let all: Vec<Arc<dyn Tool>> = vec![
        Arc::new(fs::ReadTool::new()),
        Arc::new(listing::ListTool),
        Arc::new(listing::GlobTool),
        Arc::new(write::WriteTool::new()),
        Arc::new(edit::EditTool::new()),
        Arc::new(web::WebFetchTool::new(
            cfg.web_fetch_max_bytes,
            cfg.web_fetch_allow_hosts.clone(),
        )),
        Arc::new(session_status::SessionStatusTool::new()),
    ];
    all.into_iter()
        .filter(|tool| cfg.is_enabled(&tool.spec().name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ExecSandbox, ToolsConfig};

    fn cfg(enabled: Option<Vec<&str>>) -> ToolsConfig {
        ToolsConfig {
            enabled: enabled.map(|v| v.into_iter().map(String::from).collect()),
            exec_timeout: Duration::from_secs(60),
            exec_max_timeout: Duration::from_secs(600),
            exec_sandbox: ExecSandbox::None,
            exec_network: false,
            allowed_paths: vec![],
            scratch_dir: std::env::temp_dir(),
            subagent_deny: vec![],
            subagent_model: "subagent".into(),
            web_search_provider: "brave".into(),
            web_search_base_url: String::new(),
            web_fetch_max_bytes: 0,
            web_fetch_allow_hosts: vec![],
            max_scheduled: 0,
            max_delay: Duration::from_secs(1),
            max_parallel_calls: 8,
            writable_context: vec![],
            web_search_key: None,
        }
    }

    fn names(tools: &[Arc<dyn Tool>]) -> Vec<String> {
        tools.iter().map(|t| t.spec().name).collect()
    }

    #[test]
    fn builtin_tools_default_to_all() {
        assert_eq!(
            names(&builtin_tools(&cfg(None))),
            [
                "read",
                "list",
                "glob",
                "write",
                "edit",
                "web_fetch",
                "session_status"
            ]
        );
    }

    /// One marking policy: the tools whose output comes from outside declare it, the others
    /// do not (exec, web_search and MCP tools declare it in their own modules).
    #[test]
    fn external_content_tools_declare_untrusted_output() {
        let flagged: Vec<String> = builtin_tools(&cfg(None))
            .iter()
            .filter(|t| t.untrusted_output())
            .map(|t| t.spec().name)
            .collect();
        assert_eq!(flagged, ["read", "list", "glob", "web_fetch"]);
    }

    #[test]
    fn builtin_tools_honour_enabled() {
        let tools = builtin_tools(&cfg(Some(vec!["session_status", "exec"])));
        assert_eq!(names(&tools), ["session_status"]);
        assert!(builtin_tools(&cfg(Some(vec![]))).is_empty());
    }

    #[test]
    fn builtin_tools_form_a_valid_registry() {
        let reg = ToolRegistry::new(builtin_tools(&cfg(None)), Duration::from_secs(30), 30_000)
            .expect("built-in schemas compile");
        assert_eq!(
            reg.names(),
            [
                "edit",
                "glob",
                "list",
                "read",
                "session_status",
                "web_fetch",
                "write"
            ]
        );
    }
}
