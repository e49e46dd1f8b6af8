//! What the web console asks of the daemon beyond the HTTP API (SPEC §22): the daily spend,
//! the schedules, long-term memory, stop, and the chat page's streamed messages. The
//! `ApiBackend` methods in `http_backend` call these.

use chrono::Utc;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::http_backend::{DaemonBackend, backend_error};
use crate::api::backend::{BackendError, ChatOutcome, ConsoleChat};
use crate::channels::intake::{reply_text, valid_key};
use crate::config::{ScheduleAction, ScheduleEntry, ScheduleWhen};
use crate::control::Source;
use crate::session::Intake;

/// Facts listed at most on the memory page (entities, then their facts).
const MAX_FACT_ENTITIES: usize = 100;
/// Hits of one memory search.
const SEARCH_K: usize = 8;

fn internal(e: impl std::fmt::Display) -> BackendError {
    BackendError::Internal(e.to_string())
}

impl DaemonBackend {
    pub(super) fn console_cost_days(
        &self,
        days: u32,
    ) -> BoxFuture<'_, Result<Value, BackendError>> {
        let dir = self.cfg.paths.state_dir.clone();
        let tz = self.cfg.agent.timezone.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let rows =
                    crate::report::cost::daily(&dir, days, &tz, Utc::now()).map_err(internal)?;
                let days: Vec<Value> = rows
                    .into_iter()
                    .map(|r| {
                        let day = chrono::DateTime::from_timestamp(r.day * 86_400, 0)
                            .map(|d| d.format("%Y-%m-%d").to_string())
                            .unwrap_or_default();
                        let mut v = serde_json::to_value(&r).unwrap_or_default();
                        v["day"] = json!(day);
                        v
                    })
                    .collect();
                Ok(json!({ "days": days }))
            })
            .await
            .map_err(internal)?
        })
    }

    pub(super) fn console_schedules(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        Box::pin(async move {
            let now = Utc::now().timestamp();
            let prechecks = self.monitor.snapshot()["prechecks"].clone();
            let mut entries = Vec::new();
            for e in &self.cfg.schedules {
                let last_run = self.db.schedule_last_run(&e.name).await.ok().flatten();
                entries.push(json!({
                    "name": e.name,
                    "when": when_text(e),
                    "action": action_text(&e.action),
                    "precheck": e.precheck.as_ref().map(|p| p.command.clone()),
                    "next_run": next_run(e, last_run, now, &self.cfg.agent.timezone),
                    "last_run": last_run,
                    "last_precheck": prechecks.get(&e.name).cloned(),
                }));
            }
            let pending: Vec<Value> = self
                .db
                .schedule_pending()
                .await
                .map_err(internal)?
                .into_iter()
                .map(|s| json!({"id": s.id, "target": s.target, "text": s.text, "due_at": s.due_at, "created_by": s.created_by}))
                .collect();
            Ok(json!({ "entries": entries, "pending": pending }))
        })
    }

    pub(super) fn console_memory(
        &self,
        query: String,
    ) -> BoxFuture<'_, Result<Value, BackendError>> {
        Box::pin(async move {
            let Some(m) = &self.memory else {
                return Err(BackendError::Unavailable(
                    "long-term memory is off ([memory] enabled = false)".into(),
                ));
            };
            if !query.trim().is_empty() {
                let r = m
                    .search(&query, SEARCH_K, "console")
                    .await
                    .map_err(internal)?;
                return serde_json::to_value(r).map_err(internal);
            }
            let mut facts = Vec::new();
            let entities = m.db().entities_with_facts().await.map_err(internal)?;
            for entity in entities.iter().take(MAX_FACT_ENTITIES) {
                facts.extend(m.db().facts_of(entity, false).await.map_err(internal)?);
            }
            Ok(json!({ "chunks": [], "episodes": [], "facts": facts }))
        })
    }

    /// Session `web:<name>`, source HTTP, streamed like the compatible endpoints' answers.
    pub(super) fn console_chat_accept(
        &self,
        name: String,
        text: String,
    ) -> BoxFuture<'_, Result<ConsoleChat, BackendError>> {
        Box::pin(async move {
            let key = format!("web:{name}");
            if !valid_key(&key) || text.trim().is_empty() {
                return Err(BackendError::BadRequest(
                    "name: 1-59 characters, no control characters or slashes; and a message".into(),
                ));
            }
            let id = uuid::Uuid::now_v7().to_string();
            let intake = Intake {
                id: id.clone(),
                source: Source::Http,
                from: format!("web:{name}"),
                text,
                tier: None,
                attachments: vec![],
                route: None,
                notify_meta: None,
                relayed_from: None,
            };
            let (sink, deltas) = tokio::sync::mpsc::unbounded_channel();
            let super::http_backend::Waited {
                session_id, waiter, ..
            } = self
                .accept_waited(&key, intake, Some(sink))
                .await
                .map_err(backend_error)?;
            let done: BoxFuture<'static, Result<ChatOutcome, BackendError>> =
                Box::pin(async move {
                    let c = waiter
                        .await
                        .map_err(|_| BackendError::Unavailable("agentd is shutting down".into()))?;
                    Ok(match reply_text(&c.finish) {
                        Some(reply) => ChatOutcome::Reply {
                            reply: reply.to_string(),
                            session_id: c.session_id,
                            silent: false,
                            tokens: Default::default(),
                            cost_usd: 0.0,
                            attachments: Vec::new(),
                        },
                        None => ChatOutcome::Failed {
                            error: "no reply".into(),
                            session_id: c.session_id,
                        },
                    })
                });
            Ok(ConsoleChat {
                session_id,
                deltas,
                done,
            })
        })
    }
}

fn when_text(e: &ScheduleEntry) -> String {
    match &e.when {
        ScheduleWhen::Cron(c) => format!("cron {c}"),
        ScheduleWhen::Every(d) => format!("every {} s", d.as_secs()),
    }
}

fn action_text(a: &ScheduleAction) -> String {
    match a {
        ScheduleAction::System(t) => format!("system: {t}"),
        ScheduleAction::Message { text, to } => format!("message to {to}: {text}"),
        ScheduleAction::Job(j) => format!("job: {j:?}").to_lowercase(),
    }
}

/// The next run: an interval entry runs `every` after its last run (at once when overdue);
/// a cron entry at its next slot.
fn next_run(e: &ScheduleEntry, last: Option<i64>, now: i64, tz: &crate::zone::Zone) -> Option<i64> {
    match (&e.when, last) {
        (ScheduleWhen::Every(d), Some(last)) => Some((last + d.as_secs().max(1) as i64).max(now)),
        _ => crate::scheduler::next_after(e, now, tz),
    }
}
