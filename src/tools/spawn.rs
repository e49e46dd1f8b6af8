//! `sessions_spawn` (SPEC §11): a sub-agent on a task, with its own model, turn limit and
//! timeout. The tool decides what the sub-agent may do (model, [`ToolScope`]) and hands the
//! task to a [`SubAgents`] runner — the agent loop, wired in by whoever builds the tools —
//! so there is one model loop in the crate. `[tools] subagent_deny` is enforced when a call is
//! executed, not only by hiding the tool: a denied call gets an error result and never runs.
//! Costs are recorded as `subagent`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError};
use crate::config::Config;
use crate::llm::ToolSpec;

/// Turn limit of a sub-agent.
pub const MAX_SUBAGENT_TURNS: u32 = 20;

/// `sessions_spawn` calls run per model answer; the rest of the answer's spawn calls get an
/// error result. With [`MAX_SUBAGENT_TURNS`] this bounds what one answer can start:
/// 4 × 20 model calls.
pub const MAX_SPAWNS_PER_ANSWER: usize = 4;

/// Which tools a sub-agent may see and call: never `sessions_spawn` nor a tool of
/// `[tools] subagent_deny`, and only those of the call's `tools` list when it gave one.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolScope {
    deny: Vec<String>,
    allow: Option<Vec<String>>,
}

impl ToolScope {
    pub fn new(deny: Vec<String>, allow: Option<Vec<String>>) -> ToolScope {
        ToolScope { deny, allow }
    }

    /// Whether the sub-agent may see and call `name`.
    pub fn permits(&self, name: &str) -> bool {
        !(self.deny.iter().any(|d| d == name)
            || name == "sessions_spawn"
            || self
                .allow
                .as_ref()
                .is_some_and(|a| !a.iter().any(|x| x == name)))
    }

    /// The error result that answers a call of `name` instead of running it, if it is denied.
    pub fn refusal(&self, name: &str) -> Option<String> {
        (!self.permits(name)).then(|| {
            format!("error: tool '{name}' is not allowed for sub-agents ([tools] subagent_deny)")
        })
    }
}

/// One task for a sub-agent.
#[derive(Debug, Clone, PartialEq)]
pub struct SubAgentTask {
    pub prompt: String,
    /// Model name (already defaulted: `[tools] subagent_model`, else `primary`).
    pub model: String,
    pub scope: ToolScope,
    pub max_turns: u32,
}

/// Why a sub-agent gave no answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubAgentError {
    /// The budget refused a call (the message names the limit).
    #[error("{0}")]
    Budget(String),
    /// The model call failed after retries and fallbacks.
    #[error("sub-agent model call failed: {0}")]
    Model(String),
    #[error("{0}")]
    Failed(String),
}

/// Runs sub-agents: the agent loop implements it; the tool only sees this.
pub trait SubAgents: Send + Sync {
    /// Run `task` to its final answer. `parent` is the context of the `sessions_spawn` call:
    /// the sub-agent's tool calls run in it and its costs are billed to its session.
    fn run<'a>(
        &'a self,
        task: SubAgentTask,
        parent: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, SubAgentError>>;
}

pub struct SpawnTool {
    cfg: Arc<Config>,
    /// Set once the runner exists (it holds the tool registry, which holds this tool).
    runner: OnceLock<Arc<dyn SubAgents>>,
}

impl SpawnTool {
    pub fn new(cfg: Arc<Config>) -> SpawnTool {
        SpawnTool {
            cfg,
            runner: OnceLock::new(),
        }
    }

    /// Wire the runner in (the first call wins).
    pub fn connect(&self, runner: Arc<dyn SubAgents>) {
        let _ = self.runner.set(runner);
    }

    /// The task for the call's arguments: the sub-agent model unless the call names one, and
    /// the deny-list with the call's `tools` list.
    fn task(&self, args: &Value) -> SubAgentTask {
        let allow: Option<Vec<String>> = args["tools"].as_array().map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        });
        let model = args["model"].as_str().map(String::from).unwrap_or_else(|| {
            if self
                .cfg
                .models
                .get(&self.cfg.tools.subagent_model)
                .is_some()
            {
                self.cfg.tools.subagent_model.clone()
            } else {
                "primary".to_string()
            }
        });
        SubAgentTask {
            prompt: args["prompt"].as_str().unwrap_or_default().to_string(),
            model,
            scope: ToolScope::new(self.cfg.tools.subagent_deny.clone(), allow),
            max_turns: MAX_SUBAGENT_TURNS,
        }
    }

    async fn run(&self, args: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
        let runner = self
            .runner
            .get()
            .ok_or_else(|| ToolError::Failed("sub-agents are not ready".into()))?;
        runner.run(self.task(args), ctx).await.map_err(|e| match e {
            SubAgentError::Budget(msg) => ToolError::Denied(msg),
            e => ToolError::Failed(e.to_string()),
        })
    }
}

impl Tool for SpawnTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "sessions_spawn".into(),
            description: "Run a sub-agent on a self-contained task with its own context (optionally another model, a subset of tools and a timeout); returns its final answer.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "prompt": {"type": "string", "minLength": 1},
                    "model": {"type": "string"},
                    "tools": {"type": "array", "items": {"type": "string"}},
                    "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": 3600}
                },
                "required": ["prompt"],
                "additionalProperties": false
            }),
        }
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(3600))
    }

    fn call<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let limit = Duration::from_secs(args["timeout_seconds"].as_u64().unwrap_or(600));
            match tokio::time::timeout(limit, self.run(&args, ctx)).await {
                Ok(r) => r,
                Err(_) => Err(ToolError::Failed(format!(
                    "sub-agent timed out after {} s",
                    limit.as_secs()
                ))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_hides_spawn_the_deny_list_and_what_the_call_did_not_allow() {
        let open = ToolScope::new(vec!["react".into()], None);
        assert!(open.permits("read"));
        assert!(!open.permits("react"));
        assert!(!open.permits("sessions_spawn"));
        let narrow = ToolScope::new(vec![], Some(vec!["read".into(), "sessions_spawn".into()]));
        assert!(narrow.permits("read"));
        assert!(!narrow.permits("exec"));
        assert!(!narrow.permits("sessions_spawn"), "never, even when listed");
        assert_eq!(narrow.refusal("read"), None);
        assert!(
            narrow
                .refusal("exec")
                .unwrap()
                .contains("not allowed for sub-agents")
        );
    }
}
