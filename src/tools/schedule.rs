//! `schedule_message`, `list_scheduled`, `cancel_scheduled` (SPEC §11, §14): one-shot messages
//! persisted in `agentd.db`, delivered by the scheduler through the queue.
//!
//! A message belongs to the session that scheduled it (`created_by`, its session key): only
//! that session lists or cancels it. It goes to that session itself or to a configured contact
//! (a chat channel's `contacts`), nowhere else; text for another session than the caller's is
//! delivered marked as coming from the caller's session (`scheduler::Scheduler`), so one
//! conversation's model cannot put words in another conversation's assistant's mouth. The
//! limit `scheduling.max_scheduled` is checked and the row inserted in one transaction.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::{Tool, ToolContext, ToolError};
use crate::llm::ToolSpec;
use crate::store::{Db, ScheduleInsert, Scheduled};

/// Shared state of the three tools.
#[derive(Clone)]
pub struct ScheduleTools {
    pub db: Db,
    /// The contacts a message may go to (every chat channel's; they follow a reload, SPEC
    /// §16.5).
    pub contacts: super::outbound::Contacts,
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

/// Where a scheduled message may go: the calling session itself (`own`, its session key) or a
/// contact (a chat channel's `contacts`). Anything else is refused, naming both.
fn check_target(
    target: &str,
    own: &str,
    contacts: &super::outbound::Contacts,
) -> Result<(), ToolError> {
    if target.contains('/') || target.chars().any(char::is_control) {
        return Err(ToolError::Invalid(
            "target: no slashes or control characters".into(),
        ));
    }
    if target == own || contacts.address_of(target).is_some() {
        return Ok(());
    }
    let names = contacts.names();
    let known = if names.is_empty() {
        "none are configured".to_string()
    } else {
        names.join(", ")
    };
    Err(ToolError::Denied(format!(
        "target {target:?} is neither this conversation (session key {own:?}) nor a contact \
         ([channel.*] contacts: {known}); a scheduled message goes to one of those"
    )))
}

pub struct ScheduleMessage(ScheduleTools);
pub struct ListScheduled(ScheduleTools);
pub struct CancelScheduled(ScheduleTools);

impl Tool for ScheduleMessage {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "schedule_message".into(),
            description: "Schedule a message to be sent later to this conversation (target = your session key, see session_status) or to a contact. Give either delay_seconds or at (RFC 3339). The text is sent as written; in another conversation than this one it is marked as coming from this session.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "target": {"type": "string", "minLength": 1, "maxLength": 64, "description": "This conversation's session key, or a contact name."},
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
            let target = args["target"].as_str().unwrap_or_default().to_string();
            check_target(&target, &ctx.session_key, &t.contacts)?;
            let id = uuid::Uuid::now_v7().to_string();
            let row = Scheduled {
                id: id.clone(),
                target: target.clone(),
                text: args["text"].as_str().unwrap_or_default().to_string(),
                due_at: due,
                created_at: now,
                created_by: ctx.session_key.clone(),
                status: "pending".into(),
            };
            match t
                .db
                .schedule_insert(row, t.max_scheduled)
                .await
                .map_err(store_err)?
            {
                ScheduleInsert::Inserted => {}
                ScheduleInsert::Full { pending } => {
                    return Err(ToolError::Denied(format!(
                        "{pending} messages are already scheduled (limit [tools] scheduling.max_scheduled = {}); cancel one first",
                        t.max_scheduled
                    )));
                }
            }
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
            description: "List the pending messages this conversation scheduled (id, target, due time, text).".into(),
            input_schema: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        }
    }

    fn call<'a>(
        &'a self,
        _args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let list = self
                .0
                .db
                .schedule_pending_of(&ctx.session_key)
                .await
                .map_err(store_err)?;
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
            description: "Cancel a pending message this conversation scheduled, by id.".into(),
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
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let id = args["id"].as_str().unwrap_or_default();
            if self
                .0
                .db
                .schedule_cancel(id, &ctx.session_key)
                .await
                .map_err(store_err)?
            {
                self.0.wake.notify_one();
                Ok(format!("cancelled {id}"))
            } else {
                Err(ToolError::Invalid(format!(
                    "no pending message with id {id} scheduled by this conversation (list_scheduled shows them)"
                )))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoStatus;
    impl super::super::StatusSource for NoStatus {
        fn session_status(&self) -> BoxFuture<'_, Result<super::super::SessionStatus, String>> {
            Box::pin(async { Err("no status in tests".to_string()) })
        }
    }

    fn ctx(key: &str) -> ToolContext {
        ToolContext {
            session_id: format!("{key}-id"),
            session_key: key.into(),
            workspace: std::path::PathBuf::from("/nonexistent"),
            allowed_paths: vec![],
            protected: Default::default(),
            reply_to: None,
            status: Arc::new(NoStatus),
            sees_images: false,
        }
    }

    /// The tools over a fresh database, with `max` as the limit and `carol` as the one contact.
    fn tools(dir: &std::path::Path, max: u32) -> ScheduleTools {
        std::fs::create_dir_all(dir.join("providers.d")).unwrap();
        std::fs::write(
            dir.join("providers.d/anthropic.toml"),
            "type = \"anthropic\"\napi_key_env = \"K\"\n[models.primary]\nmodel = \"m\"\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("agentd.toml"),
            "[paths]\nstate_dir = \"state\"\n[agent]\nname = \"t\"\nworkspace = \"ws\"\ntimezone = \"UTC\"\n[providers]\ndir = \"providers.d\"\n[channel.telegram]\ncontacts = { carol = 3003 }\n",
        )
        .unwrap();
        let env = std::collections::BTreeMap::from([
            ("K".to_string(), "sk-test".to_string()),
            ("HOME".to_string(), dir.display().to_string()),
        ]);
        let cfg = crate::config::load_with_env(&dir.join("agentd.toml"), env).unwrap();
        ScheduleTools {
            db: Db::open(&dir.join("a.db")).unwrap(),
            contacts: crate::tools::outbound::Contacts::new(
                crate::config::Live::new(Arc::new(cfg)),
                vec![crate::channels::telegram::address::BOOK],
            ),
            wake: Arc::new(Notify::new()),
            max_scheduled: max,
            max_delay: Duration::from_secs(3600),
            tz: crate::zone::Zone::utc(),
        }
    }

    async fn schedule(t: &ScheduleTools, by: &str, target: &str) -> Result<String, ToolError> {
        let args = json!({"target": target, "text": format!("from {by}"), "delay_seconds": 60});
        ScheduleMessage(t.clone()).call(args, &ctx(by)).await
    }

    /// `max_scheduled` holds when the model asks for many messages in one batch: the calls
    /// run in parallel, and only the limit's worth is stored.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_limit_holds_under_parallel_calls() {
        let dir = tempfile::tempdir().unwrap();
        let t = Arc::new(tools(dir.path(), 5));
        let calls = (0..40).map(|_| {
            let t = t.clone();
            tokio::spawn(async move { schedule(&t, "me", "me").await.is_ok() })
        });
        let ok = futures::future::join_all(calls)
            .await
            .into_iter()
            .filter(|r| *r.as_ref().unwrap())
            .count();
        let stored = t.db.schedule_pending().await.unwrap().len();
        eprintln!("40 parallel calls, limit 5: {ok} accepted, {stored} stored");
        assert_eq!(stored, 5);
        assert_eq!(ok, 5);
    }

    /// A message goes to the caller's own conversation or a contact; another session's key is
    /// refused and nothing is stored.
    #[tokio::test]
    async fn targets_are_the_own_session_or_a_contact() {
        let dir = tempfile::tempdir().unwrap();
        let t = tools(dir.path(), 10);
        assert!(schedule(&t, "eve", "eve").await.is_ok());
        assert!(schedule(&t, "eve", "carol").await.is_ok());
        let Err(ToolError::Denied(msg)) = schedule(&t, "eve", "bob").await else {
            panic!("eve scheduled into bob's conversation");
        };
        assert!(msg.contains("\"bob\"") && msg.contains("carol"), "{msg}");
        assert!(matches!(
            schedule(&t, "eve", "a/b").await,
            Err(ToolError::Invalid(_))
        ));
        assert_eq!(t.db.schedule_pending().await.unwrap().len(), 2);
    }

    /// `list_scheduled` and `cancel_scheduled` see only the calling session's rows.
    #[tokio::test]
    async fn list_and_cancel_see_only_the_own_rows() {
        let dir = tempfile::tempdir().unwrap();
        let t = tools(dir.path(), 10);
        let made = schedule(&t, "bob", "bob").await.unwrap();
        let id = made.split_whitespace().nth(1).unwrap().to_string();
        let list = |key: &'static str| {
            let t = t.clone();
            async move { ListScheduled(t).call(json!({}), &ctx(key)).await.unwrap() }
        };
        assert_eq!(list("eve").await, "no scheduled messages");
        assert!(list("bob").await.contains(&id));
        let cancel = |key: &'static str| {
            let (t, id) = (t.clone(), id.clone());
            async move { CancelScheduled(t).call(json!({"id": id}), &ctx(key)).await }
        };
        assert!(matches!(cancel("eve").await, Err(ToolError::Invalid(_))));
        assert!(list("bob").await.contains(&id), "still pending");
        assert!(cancel("bob").await.is_ok());
        assert_eq!(list("bob").await, "no scheduled messages");
    }
}
