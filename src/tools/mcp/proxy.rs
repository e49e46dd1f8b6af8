//! The proxy tools: which tools of a server are offered and under what name
//! (`<server>__<tool>`), and [`McpTool`], which forwards a call to the server.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::CallToolRequestParams;
use rmcp::service::ServiceError;
use serde_json::{Value, json};

use super::content::{self, cut};
use super::{Exposed, RefusedTool, Server, State, limits};
use crate::llm::ToolSpec;
use crate::tools::{Tool, ToolContext, ToolError, ToolOutput};

/// A model-facing tool that forwards to one MCP server tool.
pub(super) struct McpTool {
    pub(super) name: String,
    pub(super) description: String,
    pub(super) schema: Value,
    pub(super) remote: String,
    pub(super) server: Arc<Server>,
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
        Box::pin(async move { self.run(args, false).await.map(|out| out.text) })
    }

    fn call_with_images<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(self.run(args, ctx.sees_images))
    }
}

impl McpTool {
    /// Forward the call and render the answer ([`content::render`]); images only when
    /// `sees_images`. Every text is scrubbed of the server's secrets.
    async fn run(&self, args: Value, sees_images: bool) -> Result<ToolOutput, ToolError> {
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
                return Err(ToolError::Failed(self.server.scrub(&format!(
                    "MCP server '{server_name}': tool '{}' failed: {e}",
                    self.remote
                ))));
            }
            Ok(Ok(r)) => r,
        };
        let value = serde_json::to_value(&result).unwrap_or(Value::Null);
        let mut out = content::render(&value, &self.name, sees_images);
        if result.is_error == Some(true) {
            return Err(ToolError::Failed(
                self.server
                    .scrub(&format!("MCP server '{server_name}': {}", out.text)),
            ));
        }
        out.text = self.server.scrub(&out.text);
        Ok(out)
    }
}

/// The tools of server `server` to offer: those on the allow-list (all without one) that do not
/// run only as MCP tasks (`task_only`, by remote name: refused), named by [`exposed_name`],
/// sorted by that name. Two remote names that clean up to the same name
/// cannot both be offered: the one that needed no cleaning wins, else the smaller; the others
/// come back refused with a reason that names both and the fix.
pub(super) fn expose(
    server: &str,
    allow: Option<&[String]>,
    listed: Vec<rmcp::model::Tool>,
    task_only: &dyn Fn(&str) -> bool,
) -> (Vec<Exposed>, Vec<RefusedTool>) {
    let mut by_name: BTreeMap<String, Vec<Exposed>> = BTreeMap::new();
    let mut refused = Vec::new();
    for tool in listed {
        let remote = tool.name.to_string();
        if let Some(allow) = allow
            && !allow.contains(&remote)
        {
            continue;
        }
        let name = exposed_name(server, &remote);
        if task_only(&remote) {
            refused.push(RefusedTool {
                reason: format!(
                    "tool '{}' is not offered: it runs only as an MCP task (execution.taskSupport \
                     = \"required\"), and agentd calls tools directly",
                    cut(&remote, 80)
                ),
                name,
                remote: cut(&remote, limits::MAX_NAME_BYTES),
            });
            continue;
        }
        let description = tool.description.as_deref().unwrap_or("");
        let schema_bytes =
            serde_json::to_string(&tool.input_schema).map_or(usize::MAX, |s| s.len());
        let checked = limits::check_tool(&remote, description, schema_bytes).and_then(|size| {
            match limits::holds_pruned(&tool.input_schema) {
                true => Err(format!(
                    "its input schema is nested deeper than {} levels",
                    limits::MAX_MESSAGE_DEPTH
                )),
                false => Ok(size),
            }
        });
        if let Err(why) = checked {
            refused.push(RefusedTool {
                reason: format!("tool '{}' is not offered: {why}", cut(&remote, 80)),
                name,
                remote: cut(&remote, limits::MAX_NAME_BYTES),
            });
            continue;
        }
        by_name.entry(name.clone()).or_default().push(Exposed {
            name,
            description: tool.description.as_deref().unwrap_or("").to_string(),
            schema: normalise_schema(Value::Object((*tool.input_schema).clone())),
            remote,
        });
    }
    let mut exposed = Vec::new();
    for (name, mut group) in by_name {
        let exact = format!("{server}__");
        // Stable: `sort_by_key` keeps the server's order among equal keys.
        group.sort_by_key(|t| {
            (
                name.strip_prefix(&exact) != Some(t.remote.as_str()),
                t.remote.clone(),
            )
        });
        let mut group = group.into_iter();
        let Some(kept) = group.next() else { continue };
        for other in group {
            let reason = if other.remote == kept.remote {
                format!(
                    "the server lists tool '{}' twice; the first is offered",
                    other.remote
                )
            } else {
                format!(
                    "tools '{}' and '{}' both become '{name}'; only '{}' is offered. Fix: \
                     rename one on the server, or leave one out with the server's `tools` \
                     allow-list",
                    kept.remote, other.remote, kept.remote
                )
            };
            refused.push(RefusedTool {
                name: name.clone(),
                remote: other.remote,
                reason,
            });
        }
        exposed.push(kept);
    }
    let mut total = 0usize;
    exposed.retain(|t: &Exposed| {
        total += t.name.len() + t.description.len() + t.schema.to_string().len();
        if total <= limits::MAX_SERVER_BYTES {
            return true;
        }
        refused.push(RefusedTool {
            name: t.name.clone(),
            remote: t.remote.clone(),
            reason: format!(
                "tool '{}' is not offered: the server's tools before it (by name) already fill \
                 its share of {} KiB. Fix: leave tools out with the server's `tools` allow-list",
                t.remote,
                limits::MAX_SERVER_BYTES >> 10
            ),
        });
        false
    });
    (exposed, refused)
}

/// `<server>__<tool>` reduced to `[A-Za-z0-9_-]{1,64}`.
pub(super) fn exposed_name(server: &str, tool: &str) -> String {
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
pub(super) fn normalise_schema(schema: Value) -> Value {
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
