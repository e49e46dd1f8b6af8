//! What the A2A endpoint needs from the daemon (the `a2a_*` methods of `ApiBackend`).

use futures::future::BoxFuture;

use crate::api::backend::{AttachmentIn, BackendError};
use crate::llm::StreamDelta;

/// A message for session `key` (`a2a:<context id>`), its intake id the message id.
#[derive(Debug, Clone, PartialEq)]
pub struct A2aIn {
    pub key: String,
    pub id: String,
    pub text: String,
    /// Images (base64), saved into `inbox/` as attachments.
    pub images: Vec<AttachmentIn>,
    /// Stream the reply's text as the model writes it.
    pub stream: bool,
}

/// How far a task got.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskEnd {
    /// Running, queued, or interrupted by a shutdown (it resumes after the restart).
    Working,
    /// The final answer (empty when the agent chose to stay silent).
    Completed { text: String },
    /// It failed; what the client is told.
    Failed { message: String },
    /// Stopped (`tasks/cancel`, or a chat's /stop).
    Canceled,
}

/// A message durably accepted: the wait for its end and, when asked for, its text as it comes.
pub struct A2aTicket {
    /// Resolves when the message is done ([`TaskEnd::Working`] if agentd stops first).
    /// Dropping it stops the wait, never the work.
    pub done: BoxFuture<'static, TaskEnd>,
    pub deltas: Option<tokio::sync::mpsc::UnboundedReceiver<StreamDelta>>,
}

/// A task read back from its session's trail.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedTask {
    /// The user's text.
    pub text: String,
    pub end: TaskEnd,
}

/// A task looked up in its session: `None` when the session has no such intake.
pub type TaskResult = Result<Option<RecordedTask>, BackendError>;
