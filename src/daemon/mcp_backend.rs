//! The daemon side of the MCP server's session tools (SPEC §23): a message for a named
//! session through the same intake, waiters and `/stop` as every other source, and memory
//! search over the daemon's own `Memory`.

use futures::FutureExt;
use serde_json::Value;

use super::http_backend::{DaemonBackend, backend_error};
use crate::agent::Finish;
use crate::api::backend::{BackendError, MessageTicket, SessionMessageIn};
use crate::channels::intake::valid_key;
use crate::control::{Source, valid_id};
use crate::session::{Intake, Outcome};

impl DaemonBackend {
    /// `ApiBackend::message`: recorded with source `http` (the listener it came through or
    /// the FIFO's twin, `agentd mcp`, which writes `user` lines), answered to its waiter only.
    pub(super) async fn session_message(
        &self,
        req: SessionMessageIn,
    ) -> Result<MessageTicket, BackendError> {
        let SessionMessageIn { key, text, id } = req;
        if !valid_key(&key) {
            return Err(BackendError::BadRequest(
                "session: 1-64 characters, no control characters or slashes".into(),
            ));
        }
        let id = match id {
            Some(id) if valid_id(&id) => id,
            Some(_) => {
                return Err(BackendError::BadRequest(
                    "id: 1-128 characters of A-Z a-z 0-9 . _ : -".into(),
                ));
            }
            None => uuid::Uuid::now_v7().to_string(),
        };
        let intake = Intake {
            id: id.clone(),
            source: Source::Http,
            from: key.clone(),
            text,
            tier: None,
            attachments: vec![],
            route: None,
            notify_meta: None,
            relayed_from: None,
        };
        let accepted = self
            .accept_waited(&key, intake, None)
            .await
            .map_err(backend_error)?;
        let waiter = accepted.waiter;
        if !accepted.new
            && let Some(done) = self.outcome_in_trail(&key, &id).await
        {
            // Answered before: no completion will wake the waiter again.
            self.dispatcher.forget(&key, &id);
            return Ok(MessageTicket {
                id,
                session_id: accepted.session_id,
                done: futures::future::ready(Ok(done)).boxed(),
            });
        }
        let done = async move {
            let c = waiter
                .await
                .map_err(|_| BackendError::Unavailable("agentd is shutting down".into()))?;
            match c.finish {
                Finish::Reply { text, silent, .. } => Ok(Outcome::Reply { text, silent }),
                Finish::Failed { reply, error, .. } => Ok(Outcome::Failed { reply, error }),
                Finish::Cancelled => Err(BackendError::Unavailable(
                    "interrupted by shutdown; the message resumes after restart".into(),
                )),
            }
        };
        Ok(MessageTicket {
            id,
            session_id: accepted.session_id,
            done: done.boxed(),
        })
    }

    /// How intake `id` of session `key` ended, from its trail; `None` while it runs.
    async fn outcome_in_trail(&self, key: &str, id: &str) -> Option<Outcome> {
        let (store, key, id) = (self.intake.store.clone(), key.to_string(), id.to_string());
        tokio::task::spawn_blocking(move || {
            let h = store.get(&key).ok()??;
            let lines = crate::session::trail::read_trail(h.dir(), &h.id).ok()?;
            crate::session::outcome_of(&lines, &id)
        })
        .await
        .ok()
        .flatten()
    }

    /// `ApiBackend::memory_search`.
    pub(super) async fn search_memory(&self, query: &str, k: usize) -> Result<Value, BackendError> {
        let Some(memory) = &self.memory else {
            return Err(BackendError::Unavailable(
                "long-term memory is off ([memory] enabled = false, or memory.db did not open)"
                    .into(),
            ));
        };
        let found = memory
            .search(query, k, "mcp")
            .await
            .map_err(|e| BackendError::Internal(e.to_string()))?;
        serde_json::to_value(found).map_err(|e| BackendError::Internal(e.to_string()))
    }
}
