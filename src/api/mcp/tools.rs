//! The tools an MCP client calls (SPEC §23). Every input schema is strict
//! (`additionalProperties: false`, bounded strings and numbers) and every call is checked
//! against it again here: a client's arguments are outside input.

use std::sync::Arc;

use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, JsonObject, Tool};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::handler::AgentdMcp;
use crate::api::backend::BackendError;

/// The longest message `ask` and `send` take, in characters (the HTTP body cap still applies).
pub(super) const MAX_MESSAGE_CHARS: usize = 100_000;
/// The longest memory query, in characters.
const MAX_QUERY_CHARS: usize = 2_000;
/// At most this many memory hits, and history events per page.
const MAX_HITS: usize = 50;
const MAX_PAGE: usize = 200;

fn schema(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(o) => Arc::new(o),
        _ => Arc::new(JsonObject::new()),
    }
}

fn object(props: Value, required: &[&str]) -> Arc<JsonObject> {
    schema(json!({
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": false,
    }))
}

fn session_prop() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": 64,
           "description": "session key (default `mcp:<client name>`)"})
}

fn id_prop() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[A-Za-z0-9._:-]+$",
           "description": "idempotency key: a retried call with the same id is recorded once"})
}

/// The tool list; `approvals` and `decide` only with `[mcp_server] allow_approvals`.
pub(super) fn list(allow_approvals: bool) -> Vec<Tool> {
    let message = json!({"type": "string", "minLength": 1, "maxLength": MAX_MESSAGE_CHARS});
    let mut tools = vec![
        Tool::new(
            "ask",
            "Send a message to an agentd session and wait for the reply (progress while it works; cancel to stop it).",
            object(
                json!({"message": message, "session": session_prop(), "id": id_prop()}),
                &["message"],
            ),
        ),
        Tool::new(
            "send",
            "Queue a message for an agentd session without waiting; returns the intake id.",
            object(
                json!({"message": message, "session": session_prop(), "id": id_prop()}),
                &["message"],
            ),
        ),
        Tool::new(
            "sessions",
            "The sessions: key, id, size, last activity.",
            object(json!({}), &[]),
        ),
        Tool::new(
            "history",
            "One session's events (by session id or key), paged.",
            object(
                json!({
                    "session": {"type": "string", "minLength": 1, "maxLength": 128},
                    "offset": {"type": "integer", "minimum": 0, "maximum": 1_000_000},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
                }),
                &["session"],
            ),
        ),
        Tool::new(
            "memory_search",
            "Search agentd's long-term memory (notes, facts, episodes).",
            object(
                json!({
                    "query": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_HITS},
                }),
                &["query"],
            ),
        ),
        Tool::new(
            "cost",
            "The cost report for a period, optionally grouped.",
            object(
                json!({
                    "period": {"type": "string", "enum": ["today", "week", "month", "all"]},
                    "by": {"type": "string", "enum": ["session", "source", "model"]},
                }),
                &[],
            ),
        ),
        Tool::new(
            "status",
            "agentd's status: uptime, models, queue, today's cost.",
            object(json!({}), &[]),
        ),
    ];
    if allow_approvals {
        tools.push(Tool::new(
            "approvals",
            "Tool calls waiting for a yes.",
            object(json!({}), &[]),
        ));
        tools.push(Tool::new(
            "decide",
            "Decide a waiting approval.",
            object(
                json!({
                    "id": {"type": "string", "minLength": 1, "maxLength": 128},
                    "decision": {"type": "string", "enum": ["approve", "always", "deny"]},
                }),
                &["id", "decision"],
            ),
        ));
    }
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    tools
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MessageArgs {
    pub message: String,
    #[serde(default)]
    pub session: Option<String>,
    #[serde(default)]
    pub id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryArgs {
    session: String,
    #[serde(default)]
    offset: usize,
    #[serde(default)]
    limit: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    query: String,
    #[serde(default)]
    limit: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CostArgs {
    #[serde(default)]
    period: Option<String>,
    #[serde(default)]
    by: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecideArgs {
    id: String,
    decision: String,
}

/// Arguments of `request` as `T`; unknown fields and wrong types are refused.
fn args<T: DeserializeOwned>(request: &CallToolRequestParams) -> Result<T, McpError> {
    let v = Value::Object(request.arguments.clone().unwrap_or_default());
    serde_json::from_value(v).map_err(|e| {
        McpError::invalid_params(format!("{}: bad arguments: {e}", request.name), None)
    })
}

fn bad(msg: impl Into<String>) -> McpError {
    McpError::invalid_params(msg.into(), None)
}

/// A result as text plus `structuredContent`.
pub(super) fn structured(text: String, value: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = Some(value);
    r
}

/// A backend refusal the client should read (a tool error, not a protocol error).
pub(super) fn failed(e: &BackendError) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(e.to_string())])
}

fn json_result(r: Result<Value, BackendError>) -> CallToolResult {
    match r {
        Ok(v) => structured(serde_json::to_string_pretty(&v).unwrap_or_default(), v),
        Err(e) => failed(&e),
    }
}

/// Check a message's bounds and pick its session key.
pub(super) fn message_of(
    server: &AgentdMcp,
    a: MessageArgs,
    context: &RequestContext<RoleServer>,
) -> Result<crate::api::backend::SessionMessageIn, McpError> {
    if a.message.trim().is_empty() || a.message.chars().count() > MAX_MESSAGE_CHARS {
        return Err(bad(format!("message: 1 to {MAX_MESSAGE_CHARS} characters")));
    }
    let key = match a.session {
        Some(k) => k,
        None => {
            let name = context
                .peer
                .peer_info()
                .map(|i| i.client_info.name.clone())
                .unwrap_or_default();
            default_key(server.opts.key_prefix, &name)
        }
    };
    if !crate::channels::intake::valid_key(&key) {
        return Err(bad(
            "session: 1-64 characters, no control characters or slashes",
        ));
    }
    Ok(crate::api::backend::SessionMessageIn {
        key,
        text: a.message,
        id: a.id,
    })
}

/// `mcp:<client name>`: the name cut to the key's length, characters outside `A-Za-z0-9._-`
/// as `-`; `mcp:client` without a name.
fn default_key(prefix: &str, name: &str) -> String {
    let clean: String = name
        .chars()
        .filter(|c| !c.is_control())
        .map(|c| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '.' | '_' | '-' => c,
            _ => '-',
        })
        .take(64 - prefix.len())
        .collect();
    if clean.is_empty() {
        format!("{prefix}client")
    } else {
        format!("{prefix}{clean}")
    }
}

/// Run one tool call.
pub(super) async fn call(
    server: &AgentdMcp,
    request: CallToolRequestParams,
    context: RequestContext<RoleServer>,
) -> Result<CallToolResult, McpError> {
    let backend = &server.backend;
    match request.name.as_ref() {
        "ask" => {
            let m = message_of(server, args(&request)?, &context)?;
            Ok(super::ask::ask(server, m, &context).await)
        }
        "send" => {
            let m = message_of(server, args(&request)?, &context)?;
            let key = m.key.clone();
            Ok(match backend.message(m).await {
                Ok(t) => structured(
                    format!("queued as {} in session {key}", t.id),
                    json!({"id": t.id, "session_id": t.session_id, "session": key}),
                ),
                Err(e) => failed(&e),
            })
        }
        "sessions" => {
            args::<NoArgs>(&request)?;
            Ok(json_result(backend.sessions().await))
        }
        "history" => history(server, args(&request)?).await,
        "memory_search" => {
            let a: SearchArgs = args(&request)?;
            if a.query.trim().is_empty() || a.query.chars().count() > MAX_QUERY_CHARS {
                return Err(bad(format!("query: 1 to {MAX_QUERY_CHARS} characters")));
            }
            let k = a.limit.unwrap_or(10).clamp(1, MAX_HITS);
            Ok(json_result(backend.memory_search(a.query, k).await))
        }
        "cost" => {
            let a: CostArgs = args(&request)?;
            let period = match a.period.as_deref() {
                None => crate::cost::Period::Today,
                Some(p) => p.parse().map_err(|e| bad(format!("period: {e}")))?,
            };
            let by = match a.by.as_deref() {
                None => None,
                Some(b) => Some(b.parse().map_err(|e| bad(format!("by: {e}")))?),
            };
            Ok(json_result(backend.cost(period, by).await))
        }
        "status" => {
            args::<NoArgs>(&request)?;
            Ok(json_result(backend.status().await))
        }
        "approvals" if server.opts.allow_approvals => {
            args::<NoArgs>(&request)?;
            Ok(json_result(backend.approvals().await))
        }
        "decide" if server.opts.allow_approvals => {
            let a: DecideArgs = args(&request)?;
            let decision = crate::session::approval::Decision::parse(&a.decision)
                .filter(|d| !matches!(d, crate::session::approval::Decision::Timeout))
                .ok_or_else(|| bad("decision: approve, always or deny"))?;
            Ok(json_result(backend.decide_approval(a.id, decision).await))
        }
        other => Err(McpError::invalid_params(
            format!("unknown tool {:?}", crate::control::escaped_preview(other)),
            None,
        )),
    }
}

/// `history`: a session id, or a key resolved through the sessions report; one page of its
/// events.
async fn history(server: &AgentdMcp, a: HistoryArgs) -> Result<CallToolResult, McpError> {
    if !crate::control::valid_id(&a.session) && !crate::channels::intake::valid_key(&a.session) {
        return Err(bad("session: a session id or key"));
    }
    let id = resolve_session(server, &a.session).await;
    if !crate::control::valid_id(&id) {
        return Err(bad("session: no such session"));
    }
    let limit = a.limit.unwrap_or(50).clamp(1, MAX_PAGE);
    let found = match server.backend.history(id.clone(), false).await {
        Ok(Some(v)) => v,
        Ok(None) => return Ok(failed(&BackendError::NotFound(format!("no session {id}")))),
        Err(e) => return Ok(failed(&e)),
    };
    let events = found["events"].as_array().cloned().unwrap_or_default();
    let total = events.len();
    let page: Vec<Value> = events.into_iter().skip(a.offset).take(limit).collect();
    let next = (a.offset + page.len() < total).then_some(a.offset + page.len());
    let value = json!({"session_id": id, "total": total, "offset": a.offset,
                       "next_offset": next, "events": page});
    Ok(structured(
        serde_json::to_string_pretty(&value).unwrap_or_default(),
        value,
    ))
}

/// A session key's current session id (through the sessions report), else `target` itself.
pub(super) async fn resolve_session(server: &AgentdMcp, target: &str) -> String {
    let Ok(v) = server.backend.sessions().await else {
        return target.to_string();
    };
    v["sessions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["key"].as_str() == Some(target))
        .and_then(|s| s["session_id"].as_str().or(s["id"].as_str()))
        .unwrap_or(target)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_is_strict_and_the_list_sorted() {
        for allow in [false, true] {
            let tools = list(allow);
            let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
            let mut sorted = names.clone();
            sorted.sort_unstable();
            assert_eq!(names, sorted);
            assert_eq!(names.contains(&"decide"), allow);
            assert_eq!(names.contains(&"approvals"), allow);
            for t in &tools {
                assert_eq!(t.input_schema["additionalProperties"], false, "{}", t.name);
                assert_eq!(t.input_schema["type"], "object", "{}", t.name);
            }
        }
    }

    #[test]
    fn a_client_name_becomes_a_valid_key() {
        assert_eq!(default_key("mcp:", "Claude Desktop"), "mcp:Claude-Desktop");
        assert_eq!(default_key("mcp:", ""), "mcp:client");
        let long = default_key("mcp:", &"x/".repeat(100));
        assert!(crate::channels::intake::valid_key(&long), "{long}");
    }
}
