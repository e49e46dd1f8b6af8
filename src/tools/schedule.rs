//! `schedule_message`, `list_scheduled`, `cancel_scheduled` (SPEC §11, §14): one-shot messages
//! persisted in `agentd.db`, delivered by the scheduler through the queue.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::{Tool, ToolContext, ToolError};
use crate::llm::ToolSpec;
use crate::store::{Db, Scheduled};

/// Shared state of the three tools.
#[derive(Clone)]
pub struct ScheduleTools {
    pub db: Db,
    pub wake: Arc<Notify>,
    pub max_scheduled: u32,
    pub max_delay: Duration,
    pub tz: crate::zone::Zone,
}

impl ScheduleTools {
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        vec![
            Arc::new(ScheduleMessage(self.clone())),
            Arc::new(ListScheduled(self.clone())),
            Arc::new(CancelScheduled(self.clone())),
        ]
    }
}

fn store_err(e: impl std::fmt::Display) -> ToolError {
    ToolError::Failed(format!("scheduled messages store: {e}"))
}

pub struct ScheduleMessage(ScheduleTools);
pub struct ListScheduled(ScheduleTools);
pub struct CancelScheduled(ScheduleTools);

impl Tool for ScheduleMessage {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "schedule_message".into(),
            description: "Schedule a message to be sent later to a contact (or to this conversation: target = your current session key). Give either delay_seconds or at (RFC 3339). The text is sent as written.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "target": {"type": "string", "minLength": 1, "maxLength": 64, "description": "Contact name or session key."},
                    "text": {"type": "string", "minLength": 1, "maxLength": 4000},
                    "delay_seconds": {"type": "integer", "minimum": 1},
                    "at": {"type": "string", "description": "RFC 3339 time, e.g. 2026-11-24T09:00:00+01:00"}
                },
                "required": ["target", "text"],
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let t = &self.0;
            let now = chrono::Utc::now().timestamp();
            let due = match (
                args.get("delay_seconds").and_then(Value::as_i64),
                args.get("at").and_then(Value::as_str),
            ) {
                (Some(d), None) => now + d,
                (None, Some(at)) => crate::store::parse_due_at(at).map_err(ToolError::Invalid)?,
                _ => {
                    return Err(ToolError::Invalid(
                        "give exactly one of delay_seconds or at".into(),
                    ));
                }
            };
            if due <= now {
                return Err(ToolError::Invalid("the time is in the past".into()));
            }
            if due - now > t.max_delay.as_secs() as i64 {
                return Err(ToolError::Invalid(format!(
                    "at most {} s ahead ([tools] scheduling.max_delay_seconds)",
                    t.max_delay.as_secs()
                )));
            }
            let pending = t.db.schedule_pending_count().await.map_err(store_err)?;
            if pending >= t.max_scheduled {
                return Err(ToolError::Denied(format!(
                    "{pending} messages are already scheduled (limit [tools] scheduling.max_scheduled = {}); cancel one first",
                    t.max_scheduled
                )));
            }
            let target = args["target"].as_str().unwrap_or_default().to_string();
            if target.contains('/') || target.chars().any(char::is_control) {
                return Err(ToolError::Invalid(
                    "target: no slashes or control characters".into(),
                ));
            }
            let id = uuid::Uuid::now_v7().to_string();
            t.db.schedule_insert(Scheduled {
                id: id.clone(),
                target: target.clone(),
                text: args["text"].as_str().unwrap_or_default().to_string(),
                due_at: due,
                created_at: now,
                created_by: ctx.session_key.clone(),
                status: "pending".into(),
            })
            .await
            .map_err(store_err)?;
            t.wake.notify_one();
            let when = chrono::DateTime::from_timestamp(due, 0)
                .map(|d| d.with_timezone(&t.tz).to_rfc3339())
                .unwrap_or_default();
            Ok(format!("scheduled {id} for {target} at {when}"))
        })
    }
}

impl Tool for ListScheduled {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "list_scheduled".into(),
            description: "List pending scheduled messages (id, target, due time, text).".into(),
            input_schema: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        }
    }

    fn call<'a>(
        &'a self,
        _args: Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let list = self.0.db.schedule_pending().await.map_err(store_err)?;
            if list.is_empty() {
                return Ok("no scheduled messages".into());
            }
            let tz = &self.0.tz;
            Ok(list
                .iter()
                .map(|s| {
                    let when = chrono::DateTime::from_timestamp(s.due_at, 0)
                        .map(|d| d.with_timezone(tz).to_rfc3339())
                        .unwrap_or_default();
                    format!("{}  {}  to {}: {}", s.id, when, s.target, s.text)
                })
                .collect::<Vec<_>>()
                .join("\n"))
        })
    }
}

impl Tool for CancelScheduled {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "cancel_scheduled".into(),
            description: "Cancel a pending scheduled message by id.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"id": {"type": "string", "minLength": 1}},
                "required": ["id"],
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(
        &'a self,
        args: Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let id = args["id"].as_str().unwrap_or_default();
            if self
                .0
                .db
                .schedule_finish(id, "cancelled")
                .await
                .map_err(store_err)?
            {
                self.0.wake.notify_one();
                Ok(format!("cancelled {id}"))
            } else {
                Err(ToolError::Invalid(format!(
                    "no pending scheduled message with id {id}"
                )))
            }
        })
    }
}
