//! What the HTTP API needs from the daemon. The router (`api/`) is written against this trait
//! so it can be tested with an in-memory backend; the daemon implements it.

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::a2a::{A2aIn, A2aTicket, TaskResult};
use crate::cost::Period;
use crate::llm::compat::{Api, CompatReply, CompatRequest, ErrorKind};
use crate::message::Usage;

/// `POST /api/v1/chat` body (SPEC §10.2).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatIn {
    pub message: String,
    #[serde(default)]
    pub sender: Option<String>,
    /// Prepended to the message as `[context] …`.
    #[serde(default)]
    pub context: Option<String>,
    #[serde(default)]
    pub tier: Option<String>,
    #[serde(default)]
    pub attachments: Vec<AttachmentIn>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachmentIn {
    pub content_type: String,
    /// Base64.
    pub data: String,
    #[serde(default)]
    pub filename: Option<String>,
}

/// The outcome of a chat message, after the whole loop.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatOutcome {
    Reply {
        reply: String,
        session_id: String,
        silent: bool,
        /// Token totals over the whole loop.
        tokens: Usage,
        cost_usd: f64,
        /// Files the answer made for the client, e.g. speech of the `tts` tool (SPEC §19).
        attachments: Vec<ReplyAttachment>,
    },
    Failed {
        error: String,
        session_id: String,
    },
}

/// A file a `/chat` answer lists: where it is kept (`inbox/`) and what it is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplyAttachment {
    pub content_type: String,
    pub path: String,
}

/// `POST /api/v1/notify` body.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyIn {
    pub message: String,
    #[serde(default)]
    pub source: Option<String>,
    #[serde(default, rename = "ref")]
    pub reference: Option<String>,
    #[serde(default)]
    pub data: Option<Value>,
    #[serde(default)]
    pub sender: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NotifyAccepted {
    pub accepted: bool,
    /// RFC 3339.
    pub queued_at: String,
}

/// A request of the OpenAI- or Anthropic-compatible endpoints (SPEC §17), parsed, with what
/// its headers said.
#[derive(Debug, Clone, PartialEq)]
pub struct CompatIn {
    pub api: Api,
    pub request: CompatRequest,
    /// `X-Agentd-Session` (wins over the body's session field).
    pub session_header: Option<String>,
    /// `Idempotency-Key`: the intake id, so a retried request is recorded once.
    pub idempotency_key: Option<String>,
    /// SHA-256 (hex) of the request body: a key reused with another body is refused.
    pub body_digest: String,
}

/// A compatible request durably accepted: its id (the answer's id) and the wait for it.
pub struct CompatTicket {
    /// The intake id.
    pub id: String,
    /// The session that takes the message (a UUID; Responses ids name it).
    pub session_id: String,
    /// Resolves when the message is done. Dropping it stops the wait, never the work.
    pub done: BoxFuture<'static, Result<CompatOutcome, BackendError>>,
    /// While the answer is made: pieces of its text as the model writes them (streaming).
    /// Best effort: the final text in the outcome is what counts.
    pub deltas: Option<tokio::sync::mpsc::UnboundedReceiver<crate::llm::StreamDelta>>,
}

/// A message an MCP client sends to session `key` (SPEC §23): the `ask` and `send` tools.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionMessageIn {
    /// The session key (checked with the HTTP API's key rule).
    pub key: String,
    pub text: String,
    /// The client's idempotency key: the intake id, so a retried call is recorded once.
    pub id: Option<String>,
}

/// A session message durably accepted: its intake id, its session and the wait for it.
pub struct MessageTicket {
    pub id: String,
    pub session_id: String,
    /// Resolves when the message is done. Dropping it stops the wait, never the work.
    pub done: BoxFuture<'static, Result<crate::session::Outcome, BackendError>>,
}

/// A change of `POST /api/v1/sessions/{key}/model` or `/skills` (SPEC §18.2).
#[derive(Debug, Clone, PartialEq)]
pub enum SessionChange {
    /// `{model: NAME | null}`; `null` or `"default"` returns to routing.
    Model(Option<String>),
    /// `{name, enabled}`.
    Skill { name: String, enabled: bool },
}

/// A message from the web console's chat page (SPEC §22), accepted: its session, the text as
/// the model writes it, and the end.
pub struct ConsoleChat {
    pub session_id: String,
    /// Pieces of the answer as the model writes them.
    pub deltas: tokio::sync::mpsc::UnboundedReceiver<crate::llm::StreamDelta>,
    /// Resolves when the message is done. Dropping it stops the wait, never the work.
    pub done: BoxFuture<'static, Result<ChatOutcome, BackendError>>,
}

/// How a compatible request ended.
#[derive(Debug, Clone, PartialEq)]
pub enum CompatOutcome {
    Reply(CompatReply),
    /// The message failed (recorded): what the client is told, and the class.
    Failed {
        kind: ErrorKind,
        message: String,
    },
}

/// An error a backend call reports; the router maps it to a status code and `{"error": …}`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// 400
    #[error("{0}")]
    BadRequest(String),
    /// 400 naming the field of the request at fault (`messages[3]`).
    #[error("{message}")]
    BadField { param: String, message: String },
    /// 404
    #[error("{0}")]
    NotFound(String),
    /// 503 (e.g. shutting down)
    #[error("{0}")]
    Unavailable(String),
    /// 409: the approval was already decided.
    #[error("{0}")]
    Conflict(String),
    /// 429: the session's queue is full; nothing was recorded, the client may retry.
    #[error("{0}")]
    Busy(String),
    /// 500
    #[error("{0}")]
    Internal(String),
}

/// The daemon as the HTTP API sees it. Every JSON value returned is the endpoint's body
/// without the `agent` field (the router adds `agent` and the `X-Agentd-Agent` header).
pub trait ApiBackend: Send + Sync + 'static {
    /// Durably accept the message (HTTP source, session `http-<sender>`, not debounced), then
    /// wait for the whole loop. Dropping the future does NOT cancel the work: the router uses
    /// that for the 408 after `call_timeout_seconds`; the reply still lands in the trail and
    /// the webhook.
    fn chat(&self, req: ChatIn) -> BoxFuture<'_, Result<ChatOutcome, BackendError>>;
    /// Durably accept a notification (a `system` event) and return at once.
    fn notify(&self, req: NotifyIn) -> BoxFuture<'_, Result<NotifyAccepted, BackendError>>;
    /// Reset through the queue; returns how many sessions were queued for reset.
    fn reset(&self, target: String) -> BoxFuture<'_, Result<usize, BackendError>>;
    /// `{status:"ok", pid, uptime_seconds, version, models, channels, active_sessions, queue_depth, today_cost}`
    fn status(&self) -> BoxFuture<'_, Result<Value, BackendError>>;
    /// `{sessions:[…]}`
    fn sessions(&self) -> BoxFuture<'_, Result<Value, BackendError>>;
    /// `{period, total_cost, models:[…]}`
    /// `by`: also totals and the cache hit ratio per group (SPEC §20).
    fn cost(
        &self,
        period: Period,
        by: Option<crate::store::GroupBy>,
    ) -> BoxFuture<'_, Result<Value, BackendError>>;
    /// Contents of monitor.json.
    fn monitor(&self) -> BoxFuture<'_, Result<Value, BackendError>>;
    /// `{session_id, events:[…]}` for a session id of the index or archive; `Ok(None)` = 404.
    /// The router has already checked that `session_id` has no path or glob characters.
    fn history(
        &self,
        session_id: String,
        full: bool,
    ) -> BoxFuture<'_, Result<Option<Value>, BackendError>>;
    /// The OpenMetrics text of `/metrics` (`crate::metrics::Metrics::render`).
    fn metrics(&self) -> BoxFuture<'_, Result<String, BackendError>>;
    /// `GET /api/v1/approvals` (SPEC §18.1): `{approvals: [...]}`.
    fn approvals(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        Box::pin(async { Ok(serde_json::json!({ "approvals": [] })) })
    }
    /// `POST /api/v1/approvals/{id}`: `{id, decision}`; `NotFound` unknown, `Conflict` decided.
    fn decide_approval(
        &self,
        id: String,
        decision: crate::session::approval::Decision,
    ) -> BoxFuture<'_, Result<Value, BackendError>> {
        let _ = decision;
        Box::pin(async move {
            Err(BackendError::NotFound(format!(
                "no approval with id {id:?}"
            )))
        })
    }
    /// The config names of the chat models (`GET /v1/models` lists `agentd:<name>`): not the
    /// embedding or speech models.
    fn models(&self) -> Vec<String> {
        Vec::new()
    }
    /// Change a session's settings (SPEC §18.2) and answer with them: `{key, session_id,
    /// model, models, skills:[{name, enabled, always_on}]}`. An unknown model or skill is a
    /// `BadRequest` naming the loaded ones.
    fn session_settings(
        &self,
        key: String,
        change: SessionChange,
    ) -> BoxFuture<'_, Result<Value, BackendError>> {
        let _ = (key, change);
        Box::pin(async {
            Err(BackendError::Unavailable(
                "session settings are not served by this backend".into(),
            ))
        })
    }
    /// Durably accept a message for session `key` (the MCP server's `ask` and `send`, SPEC
    /// §23), not debounced; a duplicate id is answered from the same message.
    fn message(&self, req: SessionMessageIn) -> BoxFuture<'_, Result<MessageTicket, BackendError>> {
        let _ = req;
        Box::pin(async {
            Err(BackendError::Unavailable(
                "messages are not served by this backend".into(),
            ))
        })
    }
    /// Stop the message session `key` is running, as `/stop` does; `false`: none was running.
    fn stop(&self, key: String) -> BoxFuture<'_, Result<bool, BackendError>> {
        let _ = key;
        Box::pin(async {
            Err(BackendError::Unavailable(
                "stop is not served by this backend".into(),
            ))
        })
    }
    /// Long-term memory search (SPEC §13): `crate::memory::search::SearchResults` as JSON.
    fn memory_search(&self, query: String, k: usize) -> BoxFuture<'_, Result<Value, BackendError>> {
        let _ = (query, k);
        Box::pin(async {
            Err(BackendError::Unavailable(
                "memory search is not served by this backend".into(),
            ))
        })
    }
    /// Durably accept a compatible request (source `api`): the session, the model, the
    /// intake (its id the `Idempotency-Key` when given: a duplicate is answered from the same
    /// message), then the ticket to wait on. Refusals before intake are errors here.
    fn compat(&self, req: CompatIn) -> BoxFuture<'_, Result<CompatTicket, BackendError>> {
        let _ = req;
        Box::pin(async {
            Err(BackendError::Unavailable(
                "the compatible endpoints are not served by this backend".into(),
            ))
        })
    }
    /// A2A (SPEC §23): durably accept a message into session `req.key` (its intake id the
    /// message id: a retry is recorded once and answered from the same message), then the
    /// ticket to wait on.
    fn a2a_send(&self, req: A2aIn) -> BoxFuture<'_, Result<A2aTicket, BackendError>> {
        let _ = req;
        Box::pin(async { Err(BackendError::Unavailable("A2A is not served here".into())) })
    }
    /// A2A `tasks/get`: intake `id` of session `key`, read back from its trail.
    fn a2a_task(&self, key: String, id: String) -> BoxFuture<'_, TaskResult> {
        let _ = (key, id);
        Box::pin(async { Ok(None) })
    }
    /// A2A `tasks/cancel`: stop intake `id` of session `key` if it runs (as `/stop`), then the
    /// task as recorded. `Conflict` when it is done already or still queued.
    fn a2a_cancel(&self, key: String, id: String) -> BoxFuture<'_, TaskResult> {
        let _ = (key, id);
        Box::pin(async { Ok(None) })
    }
    /// The skills of the agent card: `(name, description)`, sorted by name.
    fn skills(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Told each time the live state (the monitor) changes: the console's overview (SPEC
    /// §22). `None`: this backend has no live state.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
    /// Spend per day, model and source over the last `days` days (`report::cost::daily`):
    /// `{days:[{day, model, source, input_tokens, cache_read_tokens, cache_write_tokens,
    /// cost_usd}]}` with `day` as `YYYY-MM-DD`, oldest first.
    fn cost_days(&self, days: u32) -> BoxFuture<'_, Result<Value, BackendError>> {
        let _ = days;
        Box::pin(async { Ok(serde_json::json!({ "days": [] })) })
    }
    /// The `[[schedule]]` entries and the messages scheduled once: `{entries:[{name, when,
    /// action, precheck, next_run, last_run, last_precheck}], pending:[…]}`.
    fn schedules(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        Box::pin(async { Ok(serde_json::json!({ "entries": [], "pending": [] })) })
    }
    /// Long-term memory: the memory tool's search for `query` (`memory::Memory::search`), or
    /// with an empty query the facts list: `{mode?, chunks, facts, episodes, warning?}`.
    fn memory(&self, query: String) -> BoxFuture<'_, Result<Value, BackendError>> {
        let _ = query;
        Box::pin(async {
            Err(BackendError::Unavailable(
                "long-term memory is off ([memory] enabled = false)".into(),
            ))
        })
    }
    /// Accept `text` for session `web:<name>` and stream its answer (the console's chat).
    fn console_chat(
        &self,
        name: String,
        text: String,
    ) -> BoxFuture<'_, Result<ConsoleChat, BackendError>> {
        let _ = (name, text);
        Box::pin(async {
            Err(BackendError::Unavailable(
                "the console chat is not served by this backend".into(),
            ))
        })
    }
    /// A request came with a wrong or missing token (the API's bearer, the console's login):
    /// counted as `agentd_errors_total{kind="http_auth"}` by the daemon.
    fn auth_failed(&self) {}
}
