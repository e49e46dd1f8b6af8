//! `ask`: a message to a session and the wait for its reply, with progress notifications from
//! the monitor while the loop runs, and `notifications/cancelled` stopping the work as `/stop`
//! does. A client that goes away stops only its wait: what was recorded runs to its end.

use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{CallToolResult, ContentBlock, ProgressNotificationParam, RequestId};
use rmcp::service::RequestContext;
use serde_json::{Value, json};

use super::handler::AgentdMcp;
use super::tools::{failed, structured};
use crate::api::backend::SessionMessageIn;
use crate::session::Outcome;

/// How often a running `ask` looks at the monitor for progress.
const PROGRESS_POLL: Duration = Duration::from_millis(250);
/// How long a cancelled `ask` stays findable for the `notifications/cancelled` that follows
/// its cancellation (rmcp cancels the call first, then hands the handler the notification).
const CANCEL_GRACE: Duration = Duration::from_secs(10);

/// The progress line of session `session_id` in `monitor`: its state, turn and tools.
fn progress_of(monitor: &Value, session_id: &str) -> Option<String> {
    let entry = monitor["active"]
        .as_array()?
        .iter()
        .find(|m| m["session_id"].as_str() == Some(session_id))?;
    let state = entry["state"].as_str().unwrap_or("working");
    let turn = entry["turn"].as_u64().unwrap_or(0);
    let tools: Vec<&str> = entry["tools_in_flight"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    Some(if tools.is_empty() {
        format!("{state} (turn {turn})")
    } else {
        format!("{state} (turn {turn}): {}", tools.join(", "))
    })
}

/// Forget `id` among the running asks (now, or after the grace when it was cancelled).
struct Running<'a> {
    server: &'a AgentdMcp,
    id: RequestId,
    cancelled: bool,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let (running, id) = (self.server.running.clone(), self.id.clone());
        if !self.cancelled {
            running
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&id);
            return;
        }
        tokio::spawn(async move {
            tokio::time::sleep(CANCEL_GRACE).await;
            running
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&id);
        });
    }
}

pub(super) async fn ask(
    server: &AgentdMcp,
    m: SessionMessageIn,
    context: &RequestContext<RoleServer>,
) -> CallToolResult {
    let key = m.key.clone();
    let ticket = match server.backend.message(m).await {
        Ok(t) => t,
        Err(e) => return failed(&e),
    };
    server
        .running
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(context.id.clone(), key.clone());
    let mut running = Running {
        server,
        id: context.id.clone(),
        cancelled: false,
    };
    let token = context.meta.get_progress_token();
    let (id, session_id) = (ticket.id, ticket.session_id);
    let mut done = ticket.done;
    let (mut step, mut last) = (0u32, None::<String>);
    loop {
        tokio::select! {
            outcome = &mut done => {
                return match outcome {
                    Ok(o) => answer(o, &id, &session_id, &key),
                    Err(e) => failed(&e),
                };
            }
            () = context.ct.cancelled() => {
                running.cancelled = true;
                return CallToolResult::error(vec![ContentBlock::text("cancelled")]);
            }
            () = tokio::time::sleep(PROGRESS_POLL) => {
                let Some(token) = &token else { continue };
                let Ok(monitor) = server.backend.monitor().await else { continue };
                let Some(line) = progress_of(&monitor, &session_id) else { continue };
                if last.as_ref() != Some(&line) {
                    step += 1;
                    let note = ProgressNotificationParam::new(token.clone(), f64::from(step))
                        .with_message(line.clone());
                    let _ = context.peer.notify_progress(note).await;
                    last = Some(line);
                }
            }
        }
    }
}

fn answer(o: Outcome, id: &str, session_id: &str, key: &str) -> CallToolResult {
    match o {
        Outcome::Reply { text, silent } => structured(
            text.clone(),
            json!({"reply": text, "silent": silent, "id": id, "session_id": session_id,
                   "session": key}),
        ),
        Outcome::Failed { reply, error } => {
            let mut r = structured(
                reply.clone(),
                json!({"reply": reply, "error": error, "id": id, "session_id": session_id,
                       "session": key}),
            );
            r.is_error = Some(true);
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_names_the_state_turn_and_tools_of_the_session() {
        let m = json!({"active": [
            {"session_id": "a", "state": "thinking", "turn": 1, "tools_in_flight": []},
            {"session_id": "b", "state": "tools", "turn": 2, "tools_in_flight": ["exec"]},
        ]});
        assert_eq!(progress_of(&m, "a").unwrap(), "thinking (turn 1)");
        assert_eq!(progress_of(&m, "b").unwrap(), "tools (turn 2): exec");
        assert_eq!(progress_of(&m, "c"), None);
    }
}
