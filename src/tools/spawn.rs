//! `sessions_spawn` (SPEC §11): a sub-agent with its own loop, model, turn limit and timeout.
//! `[tools] subagent_deny` is enforced when a call is executed, not only by hiding the tool:
//! a denied call gets an error result and never runs. Costs are recorded as `subagent`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolRegistry};
use crate::config::Config;
use crate::cost::Ledger;
use crate::llm::{
    ChatRequest, Llm, Message, SystemBlock, SystemTier, ToolChoice, ToolResult, ToolSpec,
};
use crate::store::CallType;

/// Turn limit of a sub-agent.
const MAX_SUBAGENT_TURNS: u32 = 20;

pub struct SpawnTool {
    pub cfg: Arc<Config>,
    pub llm: Arc<Llm>,
    /// Budget check before and cost row (`subagent`) after every call.
    pub ledger: Ledger,
    /// Set after the registry is built (the registry contains this tool).
    pub registry: OnceLock<Arc<ToolRegistry>>,
}

impl SpawnTool {
    fn denied(&self, name: &str, allow: Option<&[String]>) -> bool {
        self.cfg.tools.subagent_deny.iter().any(|d| d == name)
            || name == "sessions_spawn"
            || allow.is_some_and(|a| !a.iter().any(|x| x == name))
    }

    async fn run(&self, args: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
        let registry = self
            .registry
            .get()
            .ok_or_else(|| ToolError::Failed("tool registry not ready".into()))?;
        let prompt = args["prompt"].as_str().unwrap_or_default().to_string();
        let allow: Option<Vec<String>> = args["tools"].as_array().map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        });
        let model = args["model"].as_str().map(String::from).unwrap_or_else(|| {
            if self
                .llm
                .models()
                .get(&self.cfg.tools.subagent_model)
                .is_some()
            {
                self.cfg.tools.subagent_model.clone()
            } else {
                "primary".to_string()
            }
        });
        // Hidden from the sub-agent's tool list, and refused again at execution below.
        let specs: Vec<ToolSpec> = registry
            .specs()
            .into_iter()
            .filter(|s| !self.denied(&s.name, allow.as_deref()))
            .collect();
        let system = vec![SystemBlock {
            tier: SystemTier::Stable,
            text: "You are a sub-agent working for the main agent. Do the task below with the tools you have, then answer with a concise result. Your answer is returned to the main agent, not to a person.".into(),
        }];
        let mut messages = vec![Message::user_text(prompt)];
        let mut previous = None;
        for turn in 1..=MAX_SUBAGENT_TURNS {
            let last = turn == MAX_SUBAGENT_TURNS;
            let req = ChatRequest {
                session_id: format!("{}-sub", ctx.session_id),
                system: system.clone(),
                messages: messages.clone(),
                tools: specs.clone(),
                tool_choice: if last {
                    ToolChoice::None
                } else {
                    ToolChoice::Auto
                },
                previous_messages: previous,
            };
            if let Err(e) = self.ledger.gate().await {
                return Err(ToolError::Denied(e.to_string()));
            }
            let out = self
                .llm
                .chat(&model, &req, &|_| {})
                .await
                .map_err(|e| ToolError::Failed(format!("sub-agent model call failed: {e}")))?;
            previous = Some(req.messages.len());
            self.ledger
                .record(
                    &ctx.session_id,
                    &out.model,
                    CallType::Subagent,
                    out.response.usage,
                )
                .await;
            let mut resp = out.response;
            if last {
                resp.tool_calls.clear();
            }
            // Replayed in the sub-agent's next requests: stored as both providers accept it.
            let mut refused = vec![None; resp.tool_calls.len()];
            for r in crate::llm::toolcalls::normalise(&mut resp.tool_calls, &messages) {
                tracing::warn!(index = r.index, original_id = ?r.original_id, original_name = ?r.original_name, "sub-agent: malformed tool call normalised");
                refused[r.index] = r.refusal;
            }
            messages.push(resp.to_message());
            if resp.tool_calls.is_empty() {
                return Ok(resp.text);
            }
            let mut results = Vec::new();
            for (call, refusal) in resp.tool_calls.iter().zip(refused) {
                if let Some(content) = refusal {
                    results.push(ToolResult {
                        tool_call_id: call.id.clone(),
                        content,
                        is_error: true,
                    });
                } else if self.denied(&call.name, allow.as_deref()) {
                    tracing::warn!(tool = %call.name, "sub-agent called a denied tool; refused");
                    results.push(ToolResult {
                        tool_call_id: call.id.clone(),
                        content: format!(
                            "error: tool '{}' is not allowed for sub-agents ([tools] subagent_deny)",
                            call.name
                        ),
                        is_error: true,
                    });
                } else {
                    results.push(registry.execute(call, ctx).await);
                }
            }
            messages.push(Message::ToolResults {
                results,
                notice: None,
            });
        }
        Err(ToolError::Failed("sub-agent ran out of turns".into()))
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
