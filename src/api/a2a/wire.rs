//! The A2A protocol's JSON (version [`PROTOCOL_VERSION`], the JSON-RPC binding): requests read
//! and checked, the agent card, tasks, stream events and errors written. Pure: no I/O.

use serde_json::{Value, json};

use super::contract::TaskEnd;
use crate::api::backend::AttachmentIn;

/// The A2A specification version followed (`protocolVersion` of the card).
pub const PROTOCOL_VERSION: &str = "0.3.0";

/// Where the agent card is served (A2A §5.3, well-known URI).
pub const CARD_PATH: &str = "/.well-known/agent-card.json";

/// The JSON-RPC endpoint on the API listener (the card's `url`).
pub const ENDPOINT: &str = "/a2a";

/// JSON-RPC and A2A error codes (A2A §8).
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL: i64 = -32603;
    /// Server-defined (JSON-RPC's -32000..-32099): the queue is full or agentd is stopping;
    /// nothing was recorded, retry later.
    pub const BUSY: i64 = -32000;
    pub const TASK_NOT_FOUND: i64 = -32001;
    pub const TASK_NOT_CANCELABLE: i64 = -32002;
    pub const PUSH_NOT_SUPPORTED: i64 = -32003;
    pub const UNSUPPORTED_OPERATION: i64 = -32004;
    pub const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;
}

/// Most parts in one message.
pub const MAX_PARTS: usize = 16;
/// Most image files in one message (their bytes are bounded by `[http] max_body_bytes`).
pub const MAX_IMAGES: usize = 4;
/// The longest context id kept as it is in the session key `a2a:<context id>` (a session key
/// has at most 64 characters); a longer one is hashed.
pub const MAX_PLAIN_CONTEXT: usize = 60;
/// The images a file part may carry.
pub const IMAGE_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

/// Separates the context id and the message id in a task id (not an id character).
const TASK_SEP: char = '~';

/// A JSON-RPC error.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }

    /// An `InvalidParams` error.
    pub fn params(message: impl Into<String>) -> RpcError {
        RpcError::new(code::INVALID_PARAMS, message)
    }
}

/// One JSON-RPC call: its id (echoed), method and params.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub id: Value,
    pub method: String,
    pub params: Value,
}

/// A request body as a [`Call`], or the error to answer (with the id when one was readable).
pub fn parse_call(body: &[u8]) -> Result<Call, (Value, RpcError)> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        (
            Value::Null,
            RpcError::new(code::PARSE_ERROR, format!("not JSON: {e}")),
        )
    })?;
    let invalid = |m: &str| RpcError::new(code::INVALID_REQUEST, m);
    let Value::Object(o) = v else {
        return Err((
            Value::Null,
            invalid("the body must be one JSON-RPC 2.0 request object (batches are not served)"),
        ));
    };
    let id = match o.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => id.clone(),
        None => Value::Null,
        Some(_) => {
            return Err((
                Value::Null,
                invalid("id must be a string, a number or null"),
            ));
        }
    };
    if o.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((id, invalid("jsonrpc must be \"2.0\"")));
    }
    let Some(method) = o.get("method").and_then(Value::as_str) else {
        return Err((id, invalid("method must be a string")));
    };
    Ok(Call {
        method: method.chars().take(100).collect(),
        params: o.get("params").cloned().unwrap_or(Value::Null),
        id,
    })
}

/// `message/send` and `message/stream` params, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct SendParams {
    /// `messageId`: the intake id (a retry with the same id is recorded once).
    pub message_id: String,
    /// `contextId` when the client continues a context.
    pub context_id: Option<String>,
    /// `taskId`: a task the message refers to (none of ours waits for input).
    pub task_id: Option<String>,
    /// The text parts, joined by blank lines.
    pub text: String,
    /// The image file parts (inline bytes).
    pub images: Vec<AttachmentIn>,
    /// `configuration.blocking` (default true).
    pub blocking: bool,
    /// `configuration.historyLength`.
    pub history_length: Option<usize>,
}

/// A client id (`messageId`, `contextId`): the rule of intake ids (`control::valid_id`).
fn client_id(v: Option<&Value>, field: &str) -> Result<Option<String>, RpcError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if crate::control::valid_id(s) => Ok(Some(s.clone())),
        Some(v) => Err(RpcError::params(format!(
            "{field} must be 1 to {} characters of A-Z, a-z, 0-9, '.', '_', ':' or '-' (a UUID works), got {}",
            crate::control::MAX_ID_LEN,
            crate::control::escaped_preview(&v.to_string())
        ))),
    }
}

/// `params` of `message/send` or `message/stream` (MessageSendParams).
pub fn parse_send(params: &Value) -> Result<SendParams, RpcError> {
    let m = params
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| RpcError::params("params.message must be a Message object"))?;
    if m.get("kind").and_then(Value::as_str) != Some("message") {
        return Err(RpcError::params("params.message.kind must be \"message\""));
    }
    if m.get("role").and_then(Value::as_str) != Some("user") {
        return Err(RpcError::params("params.message.role must be \"user\""));
    }
    let message_id = client_id(m.get("messageId"), "params.message.messageId")?
        .ok_or_else(|| RpcError::params("params.message.messageId is required"))?;
    let context_id = client_id(m.get("contextId"), "params.message.contextId")?;
    let task_id = match m.get("taskId") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.len() <= 2 * crate::control::MAX_ID_LEN + 1 => Some(s.clone()),
        Some(_) => return Err(RpcError::params("params.message.taskId must be a task id")),
    };
    let (text, images) = parts(m.get("parts"))?;
    let config = params.get("configuration").filter(|c| !c.is_null());
    if config
        .and_then(|c| c.get("pushNotificationConfig"))
        .is_some_and(|p| !p.is_null())
    {
        return Err(RpcError::new(
            code::PUSH_NOT_SUPPORTED,
            "push notifications are not supported: leave out configuration.pushNotificationConfig and use message/stream or tasks/get",
        ));
    }
    let blocking = match config.and_then(|c| c.get("blocking")) {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(RpcError::params(
                "params.configuration.blocking must be a boolean",
            ));
        }
    };
    Ok(SendParams {
        message_id,
        context_id,
        task_id,
        text,
        images,
        blocking,
        history_length: history_length(config.and_then(|c| c.get("historyLength")))?,
    })
}

fn history_length(v: Option<&Value>) -> Result<Option<usize>, RpcError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(usize::try_from(n).unwrap_or(usize::MAX)))
            .ok_or_else(|| RpcError::params("historyLength must be a non-negative integer")),
    }
}

/// The text and images of a message's parts; other parts are refused, naming what is served.
fn parts(parts: Option<&Value>) -> Result<(String, Vec<AttachmentIn>), RpcError> {
    let Some(Value::Array(parts)) = parts else {
        return Err(RpcError::params("params.message.parts must be a list"));
    };
    if parts.len() > MAX_PARTS {
        return Err(RpcError::params(format!(
            "params.message.parts: at most {MAX_PARTS} parts, got {}",
            parts.len()
        )));
    }
    let unsupported = |n: usize, what: &str| {
        RpcError::new(
            code::CONTENT_TYPE_NOT_SUPPORTED,
            format!(
                "params.message.parts[{n}]: {what} is not supported: send text parts, and images ({}) as file parts with inline bytes",
                IMAGE_TYPES.join(", ")
            ),
        )
    };
    let (mut texts, mut images) = (Vec::new(), Vec::new());
    for (n, p) in parts.iter().enumerate() {
        match p.get("kind").and_then(Value::as_str) {
            Some("text") => match p.get("text").and_then(Value::as_str) {
                Some(t) => texts.push(t.to_string()),
                None => {
                    return Err(RpcError::params(format!(
                        "params.message.parts[{n}].text must be a string"
                    )));
                }
            },
            Some("file") => {
                let file = p.get("file").unwrap_or(&Value::Null);
                let Some(bytes) = file.get("bytes").and_then(Value::as_str) else {
                    return Err(unsupported(n, "a file by uri"));
                };
                let mime = file.get("mimeType").and_then(Value::as_str).unwrap_or("");
                if !IMAGE_TYPES.contains(&mime) {
                    let shown = crate::control::escaped_preview(mime);
                    return Err(unsupported(n, &format!("a file of type \"{shown}\"")));
                }
                if !is_base64(bytes) {
                    return Err(RpcError::params(format!(
                        "params.message.parts[{n}].file.bytes must be standard base64"
                    )));
                }
                if images.len() == MAX_IMAGES {
                    return Err(RpcError::params(format!(
                        "params.message.parts: at most {MAX_IMAGES} images"
                    )));
                }
                images.push(AttachmentIn {
                    content_type: mime.to_string(),
                    data: bytes.to_string(),
                    filename: None,
                });
            }
            Some("data") => return Err(unsupported(n, "a data part")),
            _ => {
                return Err(RpcError::params(format!(
                    "params.message.parts[{n}].kind must be \"text\", \"file\" or \"data\""
                )));
            }
        }
    }
    let text = texts.join("\n\n");
    if text.trim().is_empty() && images.is_empty() {
        return Err(RpcError::params(
            "params.message has no text: send at least one text part",
        ));
    }
    Ok((text, images))
}

fn is_base64(s: &str) -> bool {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(s.as_bytes())
        .is_ok()
}

/// `params` of `tasks/get` and `tasks/cancel`: the task's id, and `historyLength`.
pub fn parse_task_params(params: &Value) -> Result<(String, Option<usize>), RpcError> {
    let id = params
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::params("params.id must be a task id (a string)"))?;
    Ok((id.to_string(), history_length(params.get("historyLength"))?))
}

/// The session of a context: `a2a:<context id>`, or `a2a:h-<hash>` for a long id.
pub fn session_key(context_id: &str) -> String {
    if context_id.chars().count() <= MAX_PLAIN_CONTEXT {
        format!("a2a:{context_id}")
    } else {
        let hash = crate::llm::compat::sha256_hex(context_id.as_bytes());
        format!("a2a:h-{}", &hash[..32])
    }
}

/// The task of intake `intake_id` (the message id) in context `context_id`.
pub fn task_id(context_id: &str, intake_id: &str) -> String {
    format!("{context_id}{TASK_SEP}{intake_id}")
}

/// The context id and intake id a task id names; `None` for an id agentd did not make.
pub fn parse_task_id(task_id: &str) -> Option<(String, String)> {
    let (context, intake) = task_id.split_once(TASK_SEP)?;
    (crate::control::valid_id(context) && crate::control::valid_id(intake))
        .then(|| (context.to_string(), intake.to_string()))
}

/// A task as agentd knows it: its ids, the user's message, and how far it got.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskView<'a> {
    pub context_id: &'a str,
    pub intake_id: &'a str,
    /// The user's text (and how many images came with it, which are not sent back).
    pub text: &'a str,
    /// `None`: accepted, not yet started (`submitted`).
    pub end: Option<&'a TaskEnd>,
    pub history_length: Option<usize>,
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The task's state name (TaskState).
pub fn state_name(end: Option<&TaskEnd>) -> &'static str {
    match end {
        None => "submitted",
        Some(TaskEnd::Working) => "working",
        Some(TaskEnd::Completed { .. }) => "completed",
        Some(TaskEnd::Failed { .. }) => "failed",
        Some(TaskEnd::Canceled) => "canceled",
    }
}

fn text_message(role: &str, message_id: &str, task: &str, context: &str, text: &str) -> Value {
    json!({
        "kind": "message",
        "role": role,
        "messageId": message_id,
        "taskId": task,
        "contextId": context,
        "parts": [{"kind": "text", "text": text}],
    })
}

/// The agent's message that ends a task (the reply, or why it failed), if any.
fn agent_message(view: &TaskView) -> Option<Value> {
    let text = match view.end? {
        TaskEnd::Completed { text } => text.as_str(),
        TaskEnd::Failed { message } => message.as_str(),
        TaskEnd::Canceled => "Stopped.",
        TaskEnd::Working => return None,
    };
    let task = task_id(view.context_id, view.intake_id);
    let id = format!("{}-reply", view.intake_id);
    Some(text_message("agent", &id, &task, view.context_id, text))
}

/// The reply as the task's one artifact.
pub fn reply_artifact(text: &str) -> Value {
    json!({"artifactId": "reply", "name": "reply", "parts": [{"kind": "text", "text": text}]})
}

/// A `Task` object.
pub fn task(view: &TaskView) -> Value {
    let id = task_id(view.context_id, view.intake_id);
    let reply = agent_message(view);
    let mut status = json!({"state": state_name(view.end), "timestamp": now()});
    if let Some(m) = &reply {
        status["message"] = m.clone();
    }
    let mut history = vec![text_message(
        "user",
        view.intake_id,
        &id,
        view.context_id,
        view.text,
    )];
    history.extend(reply);
    if let Some(n) = view.history_length {
        history.drain(..history.len().saturating_sub(n));
    }
    let mut t = json!({
        "kind": "task",
        "id": id,
        "contextId": view.context_id,
        "status": status,
        "history": history,
    });
    if let Some(TaskEnd::Completed { text }) = view.end {
        t["artifacts"] = json!([reply_artifact(text)]);
    }
    t
}

/// A `status-update` event; `final` when the state is terminal.
pub fn status_update(view: &TaskView) -> Value {
    let mut status = json!({"state": state_name(view.end), "timestamp": now()});
    if let Some(m) = agent_message(view) {
        status["message"] = m;
    }
    json!({
        "kind": "status-update",
        "taskId": task_id(view.context_id, view.intake_id),
        "contextId": view.context_id,
        "status": status,
        "final": view.end.is_some_and(|e| !matches!(e, TaskEnd::Working)),
    })
}

/// An `artifact-update` event: a piece of the reply (`append` after the first).
pub fn artifact_update(view: &TaskView, text: &str, append: bool, last: bool) -> Value {
    json!({
        "kind": "artifact-update",
        "taskId": task_id(view.context_id, view.intake_id),
        "contextId": view.context_id,
        "artifact": reply_artifact(text),
        "append": append,
        "lastChunk": last,
    })
}

/// A JSON-RPC success response.
pub fn success(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A JSON-RPC error response.
pub fn error(id: &Value, e: &RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": e.code, "message": e.message}})
}

/// What the card says about the agent.
pub struct CardInfo<'a> {
    pub name: &'a str,
    /// The JSON-RPC endpoint, absolute.
    pub url: &'a str,
    /// `(name, description)` of each skill; `None` for the public card (no skills shown).
    pub skills: Option<&'a [(String, String)]>,
}

/// The agent card (AgentCard). The public one lists no skills and says the authenticated
/// one (`agent/getAuthenticatedExtendedCard`) does.
pub fn card(info: &CardInfo) -> Value {
    let skills: Vec<Value> = (info.skills.unwrap_or_default().iter())
        .map(|(name, description)| {
            json!({"id": name, "name": name, "description": description, "tags": ["skill"]})
        })
        .collect();
    json!({
        "protocolVersion": PROTOCOL_VERSION,
        "name": info.name,
        "description": format!(
            "agentd agent {:?}: an always-on assistant with tools, memory and skills. Send it a message; each context is one conversation.",
            info.name
        ),
        "url": info.url,
        "preferredTransport": "JSONRPC",
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {"streaming": true, "pushNotifications": false, "stateTransitionHistory": false},
        "defaultInputModes": ["text/plain", "image/png", "image/jpeg", "image/gif", "image/webp"],
        "defaultOutputModes": ["text/plain"],
        "securitySchemes": {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "agentd's HTTP API token ([http] token_env)",
            }
        },
        "security": [{"bearer": []}],
        "skills": skills,
        "supportsAuthenticatedExtendedCard": true,
    })
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
