//! Tools the model can call: the `Tool` trait, the `ToolRegistry` (JSON-Schema validation of
//! arguments, per-call timeout, output truncation, concurrent execution with ordered results)
//! and the built-in tools. SPEC §11.

pub mod fs;
pub mod paths;
pub mod registry;
pub mod session_status;

pub use registry::ToolRegistry;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::Value;

use crate::llm::{ToolSpec, Usage};

/// A tool. Implementations are small and stateless where possible; everything per-call comes in
/// through `ToolContext`.
pub trait Tool: Send + Sync {
    /// Name, description and the JSON Schema of the arguments.
    fn spec(&self) -> ToolSpec;
    /// Per-call timeout; `None` = the registry default.
    fn timeout(&self) -> Option<Duration> {
        None
    }
    /// Run the tool. Arguments were already validated against `spec().input_schema`.
    fn call<'a>(&'a self, args: Value, ctx: &'a ToolContext)
    -> BoxFuture<'a, Result<String, ToolError>>;
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
    /// Live facts for `session_status`.
    pub status: Arc<dyn StatusSource>,
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
