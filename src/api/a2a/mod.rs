//! agentd as an A2A agent (SPEC §23; A2A [`wire::PROTOCOL_VERSION`], JSON-RPC binding): the
//! agent card at [`wire::CARD_PATH`] and the JSON-RPC endpoint [`wire::ENDPOINT`] with
//! `message/send`, `message/stream`, `tasks/get`, `tasks/cancel` and
//! `agent/getAuthenticatedExtendedCard`. A context is the session `a2a:<context id>`, a task
//! one intake (its id the context id and the message id, so it is found again from the trail
//! after a restart). The card without the token shows no skills; the endpoint needs the token.
//! A client that goes away never cancels the message: the backend waits for it on its own.

mod contract;
mod stream;
pub mod wire;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::Value;

pub use contract::{A2aIn, A2aTicket, RecordedTask, TaskEnd, TaskResult};
use wire::{RpcError, TaskView, code};

use super::backend::BackendError;
use super::reply::too_large_message;
use super::server::ApiState;

/// `GET /.well-known/agent-card.json`: the public card, or the full one (skills) for a
/// caller that sends the token.
pub(crate) async fn card(State(state): State<Arc<ApiState>>, headers: HeaderMap) -> Response {
    let full = authorized(&state, &headers);
    json_response(&full_card(&state, &headers, full))
}

/// Whether `headers` carry the configured token (none configured: nobody does).
fn authorized(state: &ApiState, headers: &HeaderMap) -> bool {
    use secrecy::ExposeSecret;
    (state.config().token.as_ref())
        .map(|t| t.expose_secret())
        .filter(|t| !t.is_empty())
        .is_some_and(|t| super::auth::bearer_matches(headers, t))
}

fn full_card(state: &ApiState, headers: &HeaderMap, skills: bool) -> Value {
    let list = skills.then(|| state.backend().skills());
    wire::card(&wire::CardInfo {
        name: state.agent_name(),
        url: &endpoint_url(state, headers),
        skills: list.as_deref(),
    })
}

/// The endpoint's absolute URL as the client reached the listener (its `Host`, and
/// `X-Forwarded-Proto: https` from a proxy in front), else the configured address.
fn endpoint_url(state: &ApiState, headers: &HeaderMap) -> String {
    let host = (headers.get(axum::http::header::HOST))
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            (1..=255).contains(&h.len())
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b))
        })
        .map(str::to_string)
        .unwrap_or_else(|| format!("{}:{}", state.config().host, state.config().port));
    let https = (headers.get("x-forwarded-proto"))
        .and_then(|h| h.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"));
    let scheme = if https { "https" } else { "http" };
    format!("{scheme}://{host}{}", wire::ENDPOINT)
}

fn json_response(body: &Value) -> Response {
    super::compat::raw(StatusCode::OK, "application/json", body.to_string())
}

/// `POST /a2a`: one JSON-RPC call (behind the bearer check and the POST rate limit).
pub(crate) async fn rpc(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            let message = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                too_large_message(state.max_body_bytes())
            } else {
                e.body_text()
            };
            let e = RpcError::new(code::INVALID_REQUEST, message);
            return json_response(&wire::error(&Value::Null, &e));
        }
    };
    let call = match wire::parse_call(&body) {
        Ok(c) => c,
        Err((id, e)) => return json_response(&wire::error(&id, &e)),
    };
    let id = call.id.clone();
    let answer = match call.method.as_str() {
        "message/send" => send(&state, &call.params).await,
        "message/stream" => return stream::open(state, id, &call.params).await,
        "tasks/get" => get(&state, &call.params).await,
        "tasks/cancel" => cancel(&state, &call.params).await,
        "agent/getAuthenticatedExtendedCard" => Ok(full_card(&state, &headers, true)),
        "tasks/resubscribe" => Err(RpcError::new(
            code::UNSUPPORTED_OPERATION,
            "tasks/resubscribe is not supported: poll tasks/get",
        )),
        m if m.starts_with("tasks/pushNotificationConfig/") => Err(RpcError::new(
            code::PUSH_NOT_SUPPORTED,
            "push notifications are not supported: use message/stream or tasks/get",
        )),
        m => Err(RpcError::new(
            code::METHOD_NOT_FOUND,
            format!(
                "method {:?} not found: message/send, message/stream, tasks/get, tasks/cancel and agent/getAuthenticatedExtendedCard are served",
                crate::control::escaped_preview(m)
            ),
        )),
    };
    json_response(&match answer {
        Ok(result) => wire::success(&id, result),
        Err(e) => wire::error(&id, &e),
    })
}

/// A backend refusal as a JSON-RPC error.
fn rpc_error(e: BackendError) -> RpcError {
    let code = match &e {
        BackendError::BadRequest(_) | BackendError::BadField { .. } => code::INVALID_PARAMS,
        BackendError::NotFound(_) => code::TASK_NOT_FOUND,
        BackendError::Conflict(_) => code::TASK_NOT_CANCELABLE,
        BackendError::Busy(_) | BackendError::Unavailable(_) => code::BUSY,
        BackendError::Internal(_) => {
            tracing::warn!(error = %e, "A2A: backend error");
            code::INTERNAL
        }
    };
    RpcError::new(code, e.to_string())
}

/// A message accepted: its context and params (the ticket apart, to be consumed).
pub(crate) struct Accepted {
    context_id: String,
    params: wire::SendParams,
}

impl Accepted {
    fn view<'a>(&'a self, end: Option<&'a TaskEnd>) -> TaskView<'a> {
        TaskView {
            context_id: &self.context_id,
            intake_id: &self.params.message_id,
            text: &self.params.text,
            end,
            history_length: self.params.history_length,
        }
    }
}

/// Check and durably accept a `message/send` or `message/stream`.
pub(crate) async fn accept(
    state: &ApiState,
    params: &Value,
    stream: bool,
) -> Result<(Accepted, A2aTicket), RpcError> {
    let params = wire::parse_send(params)?;
    if let Some(task) = &params.task_id {
        refuse_continued_task(state, task, params.context_id.as_deref()).await?;
    }
    let context_id =
        (params.context_id.clone()).unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    let ticket = state
        .backend()
        .a2a_send(A2aIn {
            key: wire::session_key(&context_id),
            id: params.message_id.clone(),
            text: params.text.clone(),
            images: params.images.clone(),
            stream,
        })
        .await
        .map_err(rpc_error)?;
    Ok((Accepted { context_id, params }, ticket))
}

/// A message naming a task: none of agentd's tasks waits for more input, so it is refused
/// (unknown task: `TaskNotFound`).
async fn refuse_continued_task(
    state: &ApiState,
    task: &str,
    context: Option<&str>,
) -> Result<(), RpcError> {
    let recorded = match wire::parse_task_id(task) {
        Some((ctx, id)) if context.is_none_or(|c| c == ctx) => state
            .backend()
            .a2a_task(wire::session_key(&ctx), id)
            .await
            .map_err(rpc_error)?,
        _ => None,
    };
    let Some(t) = recorded else {
        return Err(not_found(task));
    };
    Err(RpcError::params(format!(
        "task {} is {}: a task cannot be continued; send the message without taskId (with the same contextId to go on in the conversation)",
        crate::control::escaped_preview(task),
        wire::state_name(Some(&t.end))
    )))
}

fn not_found(task: &str) -> RpcError {
    RpcError::new(
        code::TASK_NOT_FOUND,
        format!(
            "task {} not found (unknown, or its context's session was reset)",
            crate::control::escaped_preview(task)
        ),
    )
}

/// `message/send`: the task when it ends (blocking, at most `call_timeout_seconds`, then as
/// it is: `working`), or at once as `submitted`.
async fn send(state: &ApiState, params: &Value) -> Result<Value, RpcError> {
    let (a, ticket) = accept(state, params, false).await?;
    if !a.params.blocking {
        return Ok(wire::task(&a.view(None)));
    }
    let end = tokio::time::timeout(state.call_timeout(), ticket.done)
        .await
        .unwrap_or(TaskEnd::Working);
    Ok(wire::task(&a.view(Some(&end))))
}

/// The context and intake a task id names, with `historyLength`.
fn task_params(params: &Value) -> Result<(String, String, String, Option<usize>), RpcError> {
    let (task, history_length) = wire::parse_task_params(params)?;
    let (ctx, id) = wire::parse_task_id(&task).ok_or_else(|| not_found(&task))?;
    Ok((task, ctx, id, history_length))
}

fn recorded_task(
    task: &str,
    ctx: &str,
    id: &str,
    history_length: Option<usize>,
    found: Option<RecordedTask>,
) -> Result<Value, RpcError> {
    let t = found.ok_or_else(|| not_found(task))?;
    Ok(wire::task(&TaskView {
        context_id: ctx,
        intake_id: id,
        text: &t.text,
        end: Some(&t.end),
        history_length,
    }))
}

/// `tasks/get`: the task as its session's trail records it.
async fn get(state: &ApiState, params: &Value) -> Result<Value, RpcError> {
    let (task, ctx, id, n) = task_params(params)?;
    let found = (state.backend())
        .a2a_task(wire::session_key(&ctx), id.clone())
        .await
        .map_err(rpc_error)?;
    recorded_task(&task, &ctx, &id, n, found)
}

/// `tasks/cancel`: stop the task's work (as `/stop`) and answer it as now recorded.
async fn cancel(state: &ApiState, params: &Value) -> Result<Value, RpcError> {
    let (task, ctx, id, n) = task_params(params)?;
    let found = (state.backend())
        .a2a_cancel(wire::session_key(&ctx), id.clone())
        .await
        .map_err(rpc_error)?;
    recorded_task(&task, &ctx, &id, n, found)
}
