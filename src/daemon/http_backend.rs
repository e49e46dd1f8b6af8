//! The daemon side of the HTTP API: `ApiBackend` over durable intake, the dispatcher, the
//! session files and the ledger. Query answers reuse `cli`'s report builders, so HTTP and
//! `agent-send --json` answer with the same shapes (parity).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use base64::Engine;
use chrono::{SecondsFormat, Utc};
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::intake::{AcceptError, IntakeHandler};
use super::workers::Dispatcher;
use crate::agent::Finish;
use crate::api::backend::{
    ApiBackend, BackendError, ChatIn, ChatOutcome, CompatIn, CompatTicket, NotifyAccepted,
    NotifyIn, SessionChange,
};
use crate::channels::intake::{IntakeSink, notify_meta, notify_text, reply_text, valid_key};
use crate::config::Config;
use crate::control::Source;
use crate::cost::Period;
use crate::metrics::Metrics;
use crate::monitor::Monitor;
use crate::session::Intake;

pub struct DaemonBackend {
    pub cfg: Arc<Config>,
    pub intake: Arc<IntakeHandler>,
    pub dispatcher: Arc<Dispatcher>,
    pub monitor: Arc<Monitor>,
    pub metrics: Arc<Metrics>,
    pub mcp: Arc<crate::tools::mcp::McpManager>,
    pub started: Instant,
    /// Answers to recent compatible requests with an `Idempotency-Key` (SPEC §17).
    pub recent: Arc<super::compat::RecentAnswers>,
    /// Tool calls waiting for a yes (SPEC §18.1).
    pub approvals: Arc<crate::tools::approval::Approvals>,
    /// The agent's tools: a client tool may not take one's name (SPEC §17).
    pub tools: Arc<crate::tools::ToolRegistry>,
    /// The skills (the A2A card lists them, SPEC §23).
    pub skills: Arc<crate::skills::SkillSet>,
    /// `agentd.db`: the schedules' last runs (the web console, SPEC §22).
    pub db: crate::store::Db,
    /// Long-term memory, when on: the MCP server's `memory_search`, the console's memory page.
    pub memory: Option<crate::memory::Memory>,
}

/// An intake accepted for a caller that waits for its answer.
pub(super) struct Waited {
    /// `false`: its id was already in the trail (a retry); nothing was queued.
    pub new: bool,
    pub session_id: String,
    pub waiter: tokio::sync::oneshot::Receiver<crate::channels::intake::Completion>,
}

impl DaemonBackend {
    /// Accept `intake` into session `key` with its waiter (and `sink`, for the answer as the
    /// model writes it) registered first, so no completion or delta is missed; a refused
    /// intake leaves neither behind. The one way an HTTP-side caller (compatible endpoints,
    /// MCP, A2A, console chat) sends a message and waits for its answer.
    pub(super) async fn accept_waited(
        &self,
        key: &str,
        intake: Intake,
        sink: Option<crate::llm::DeltaSink>,
    ) -> Result<Waited, AcceptError> {
        let id = intake.id.clone();
        let waiter = self.dispatcher.wait_in(key, &id);
        if let Some(sink) = sink {
            self.dispatcher.stream_to(key, &id, sink);
        }
        match IntakeSink::accept(self.intake.as_ref(), key, intake).await {
            Ok(a) => Ok(Waited {
                new: a.new,
                session_id: a.session_id,
                waiter,
            }),
            Err(e) => {
                self.dispatcher.forget(key, &id);
                Err(e)
            }
        }
    }

    fn state_dir(&self) -> PathBuf {
        self.cfg.paths.state_dir.clone()
    }

    /// Where the trail of session `key` ends now (`Some(0)` for a session not yet created),
    /// when a `tts` tool exists (`[voice] tts_model`): the answer then reads only the lines
    /// written after it ([`Self::spoken`]). `None`: no speech model, nothing to look for.
    async fn trail_end(&self, key: &str) -> Option<u64> {
        self.cfg.voice.tts_model.as_ref()?;
        let (store, key) = (self.intake.store.clone(), key.to_string());
        tokio::task::spawn_blocking(move || match store.get(&key) {
            Ok(Some(h)) => crate::session::trail::last_seq(h.dir(), &h.id)
                .ok()
                .map(|s| s.unwrap_or(0)),
            Ok(None) => Some(0),
            Err(_) => None,
        })
        .await
        .ok()
        .flatten()
    }

    /// The speech files the `tts` tool made while answering intake `id` (SPEC §19), read from
    /// the lines of the session's trail after `after` ([`Self::trail_end`] before the intake):
    /// this turn's lines, not the whole history, so an answer costs the same at any length.
    async fn spoken(
        &self,
        key: &str,
        session_id: &str,
        id: &str,
        after: Option<u64>,
    ) -> Vec<crate::api::backend::ReplyAttachment> {
        let Some(after) = after else {
            return Vec::new();
        };
        let (store, key, sid, id) = (
            self.intake.store.clone(),
            key.to_string(),
            session_id.to_string(),
            id.to_string(),
        );
        let inbox = self.state_dir().join("inbox");
        let files = tokio::task::spawn_blocking(move || {
            let h = store.get(&key).ok()??;
            if h.id != sid {
                return None;
            }
            let lines = crate::session::trail::read_trail_after(h.dir(), &h.id, after).ok()?;
            Some(crate::tools::tts::spoken_files(&lines, &id, &inbox))
        })
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
        files
            .into_iter()
            .map(|p| crate::api::backend::ReplyAttachment {
                content_type: "audio/ogg".into(),
                path: p.display().to_string(),
            })
            .collect()
    }
}

/// Writes `/chat` attachments into `inbox/` (blocking: decode + fsync).
pub(super) struct AttachmentSaver {
    pub(super) inbox: PathBuf,
}

impl AttachmentSaver {
    /// Decode attachments into `inbox/` (mode 0600) and return their paths.
    pub(super) fn save(
        &self,
        id: &str,
        attachments: &[crate::api::backend::AttachmentIn],
    ) -> Result<Vec<String>, BackendError> {
        let mut out = Vec::new();
        for (n, a) in attachments.iter().enumerate() {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(a.data.as_bytes())
                .map_err(|e| {
                    BackendError::BadRequest(format!("attachments[{n}].data: not base64: {e}"))
                })?;
            let ext = a
                .filename
                .as_deref()
                .and_then(|f| std::path::Path::new(f).extension())
                .and_then(|e| e.to_str())
                .filter(|e| e.len() <= 8 && e.chars().all(|c| c.is_ascii_alphanumeric()))
                .or_else(|| extension_for(&a.content_type))
                .unwrap_or("bin");
            let path = self.inbox.join(format!("{id}-{n}.{ext}"));
            crate::fsutil::atomic_write(&path, &bytes)
                .map_err(|e| BackendError::Internal(format!("cannot save attachment: {e}")))?;
            out.push(path.display().to_string());
        }
        Ok(out)
    }
}

/// A file extension for common content types (images are recognised by extension later).
fn extension_for(content_type: &str) -> Option<&'static str> {
    Some(match content_type.split(';').next()?.trim() {
        "image/jpeg" => "jpg",
        "image/png" => "png",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "application/pdf" => "pdf",
        "text/plain" => "txt",
        // Audio is transcribed by its extension (SPEC §19, `daemon::voice::audio_mime`).
        "audio/ogg" | "audio/opus" => "ogg",
        "audio/mpeg" | "audio/mp3" => "mp3",
        "audio/mp4" | "audio/m4a" | "audio/x-m4a" => "m4a",
        "audio/wav" | "audio/x-wav" | "audio/wave" => "wav",
        "audio/webm" => "webm",
        "audio/flac" => "flac",
        _ => return None,
    })
}

/// A full queue is 429 (retry later); a failed intake record 503.
pub(super) fn backend_error(e: AcceptError) -> BackendError {
    match e {
        AcceptError::Busy(e) => BackendError::Busy(e.to_string()),
        AcceptError::Failed(e) => BackendError::Unavailable(e),
    }
}

fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BackendError> + Send + 'static,
) -> BoxFuture<'static, Result<T, BackendError>> {
    Box::pin(async move {
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| BackendError::Internal(e.to_string()))?
    })
}

impl ApiBackend for DaemonBackend {
    fn message(
        &self,
        req: crate::api::backend::SessionMessageIn,
    ) -> BoxFuture<'_, Result<crate::api::backend::MessageTicket, BackendError>> {
        Box::pin(self.session_message(req))
    }

    fn stop(&self, key: String) -> BoxFuture<'_, Result<bool, BackendError>> {
        Box::pin(async move { Ok(self.dispatcher.stop_session(&key)) })
    }

    fn memory_search(&self, query: String, k: usize) -> BoxFuture<'_, Result<Value, BackendError>> {
        Box::pin(async move { self.search_memory(&query, k).await })
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.monitor.subscribe())
    }

    fn cost_days(&self, days: u32) -> BoxFuture<'_, Result<Value, BackendError>> {
        self.console_cost_days(days)
    }

    fn schedules(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        self.console_schedules()
    }

    fn memory(&self, query: String) -> BoxFuture<'_, Result<Value, BackendError>> {
        self.console_memory(query)
    }

    fn auth_failed(&self) {
        self.metrics.error("http_auth");
    }

    fn console_chat(
        &self,
        name: String,
        text: String,
    ) -> BoxFuture<'_, Result<crate::api::backend::ConsoleChat, BackendError>> {
        self.console_chat_accept(name, text)
    }

    fn approvals(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        Box::pin(async move { Ok(json!({ "approvals": self.approvals.list() })) })
    }

    fn decide_approval(
        &self,
        id: String,
        decision: crate::session::approval::Decision,
    ) -> BoxFuture<'_, Result<Value, BackendError>> {
        Box::pin(async move {
            super::approvals::decide(&self.approvals, &id, decision, "http", "http").map_err(|e| {
                match e {
                    crate::tools::approval::DecideError::Unknown(_) => {
                        BackendError::NotFound(e.to_string())
                    }
                    crate::tools::approval::DecideError::AlreadyDecided { .. } => {
                        BackendError::Conflict(e.to_string())
                    }
                }
            })
        })
    }

    fn chat(&self, req: ChatIn) -> BoxFuture<'_, Result<ChatOutcome, BackendError>> {
        Box::pin(async move {
            let sender = req.sender.unwrap_or_else(|| "anonymous".to_string());
            let key = format!("http-{sender}");
            if !valid_key(&key) {
                return Err(BackendError::BadRequest(
                    "sender: 1-59 characters, no control characters or slashes".into(),
                ));
            }
            let id = uuid::Uuid::now_v7().to_string();
            let attachments = {
                let me = AttachmentSaver {
                    inbox: self.state_dir().join("inbox"),
                };
                let (id, list) = (id.clone(), req.attachments.clone());
                tokio::task::spawn_blocking(move || me.save(&id, &list))
                    .await
                    .map_err(|e| BackendError::Internal(e.to_string()))??
            };
            let id_for_files = id.clone();
            let intake = Intake {
                id,
                source: Source::Http,
                from: sender,
                text: req.message,
                tier: req.tier,
                attachments,
                route: None,
                notify_meta: None,
                relayed_from: None,
            };
            let trail_end = self.trail_end(&key).await;
            let c = IntakeSink::ask(self.intake.as_ref(), &key, intake)
                .await
                .map_err(backend_error)?
                .ok_or_else(|| BackendError::Unavailable("agentd is shutting down".into()))?;
            let reply = reply_text(&c.finish).unwrap_or_default().to_string();
            let attachments = self
                .spoken(&key, &c.session_id, &id_for_files, trail_end)
                .await;
            Ok(match c.finish {
                Finish::Reply {
                    silent,
                    usage,
                    cost_usd,
                    ..
                } => ChatOutcome::Reply {
                    reply,
                    session_id: c.session_id,
                    silent,
                    tokens: usage,
                    cost_usd,
                    attachments,
                },
                Finish::Failed { reply, error, .. } => ChatOutcome::Failed {
                    error: if reply == error {
                        error
                    } else {
                        format!("{reply} ({error})")
                    },
                    session_id: c.session_id,
                },
                Finish::Cancelled => {
                    return Err(BackendError::Unavailable(
                        "interrupted by shutdown; the message resumes after restart".into(),
                    ));
                }
            })
        })
    }

    fn notify(&self, req: NotifyIn) -> BoxFuture<'_, Result<NotifyAccepted, BackendError>> {
        Box::pin(async move {
            let intake = Intake {
                id: uuid::Uuid::now_v7().to_string(),
                source: Source::System,
                from: req
                    .sender
                    .clone()
                    .or(req.source.clone())
                    .unwrap_or_else(|| "notify".into()),
                text: notify_text(
                    &req.message,
                    req.source.as_deref(),
                    req.reference.as_deref(),
                    req.data.as_ref(),
                ),
                tier: None,
                attachments: vec![],
                route: None,
                notify_meta: Some(notify_meta(
                    req.source.as_deref(),
                    req.reference.as_deref(),
                    req.data.as_ref(),
                )),
                relayed_from: None,
            };
            self.intake
                .accept("system", intake)
                .await
                .map_err(backend_error)?;
            Ok(NotifyAccepted {
                accepted: true,
                queued_at: Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
            })
        })
    }

    fn session_settings(
        &self,
        key: String,
        change: SessionChange,
    ) -> BoxFuture<'_, Result<Value, BackendError>> {
        use super::session_control::{Change, ControlError, Request};
        Box::pin(async move {
            let change = match change {
                SessionChange::Model(m) => Change::Model(m),
                SessionChange::Skill { name, enabled } => Change::Skill { name, enabled },
            };
            let request = Request {
                change: Some(change),
                channel: "http".into(),
                id: None,
            };
            match self.dispatcher.session_control(&key, request).await {
                Ok(settings) => serde_json::to_value(&settings)
                    .map_err(|e| BackendError::Internal(e.to_string())),
                Err(
                    e @ (ControlError::UnknownModel { .. } | ControlError::UnknownSkill { .. }),
                ) => Err(BackendError::BadRequest(e.to_string())),
                Err(e @ ControlError::Stopping) => Err(BackendError::Unavailable(e.to_string())),
                Err(e @ ControlError::Failed(_)) => Err(BackendError::Internal(e.to_string())),
            }
        })
    }

    fn reset(&self, target: String) -> BoxFuture<'_, Result<usize, BackendError>> {
        Box::pin(async move { Ok(self.intake.reset(&target, "HTTP reset").await) })
    }

    fn status(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        let dir = self.state_dir();
        let tz = self.cfg.agent.timezone.clone();
        let models = json!({
            "loaded": self.cfg.models.loaded.keys().collect::<Vec<_>>(),
            "skipped": self.cfg.models.skipped,
        });
        let channels = self.monitor.snapshot()["channels"].clone();
        let base = json!({
            "status": "ok",
            "pid": std::process::id(),
            "uptime_seconds": self.started.elapsed().as_secs(),
            "version": env!("CARGO_PKG_VERSION"),
            "models": models,
            "channels": channels,
            "mcp": self.mcp.status(),
            "active_sessions": self.dispatcher.active_sessions(),
            "queue_depth": self.dispatcher.queue_depth(),
            "budget": {
                "daily_usd": self.cfg.budget.daily_usd,
                "monthly_usd": self.cfg.budget.monthly_usd,
            },
        });
        blocking(move || {
            let today = crate::report::cost::today_cost(&dir, &tz, Utc::now())
                .map_err(|e| BackendError::Internal(e.to_string()))?;
            let mut v = base;
            v["today_cost"] = json!(today);
            Ok(v)
        })
    }

    fn sessions(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        let dir = self.state_dir().join("sessions");
        let windows = self
            .cfg
            .models
            .loaded
            .iter()
            .map(|(k, m)| (k.clone(), m.context_window))
            .collect();
        blocking(move || {
            let r = crate::report::sessions::sessions_report(&dir, &windows)
                .map_err(|e| BackendError::Internal(e.to_string()))?;
            serde_json::to_value(r).map_err(|e| BackendError::Internal(e.to_string()))
        })
    }

    fn cost(
        &self,
        period: Period,
        by: Option<crate::store::GroupBy>,
    ) -> BoxFuture<'_, Result<Value, BackendError>> {
        let dir = self.state_dir();
        let tz = self.cfg.agent.timezone.clone();
        blocking(move || {
            let r = crate::report::cost::cost_report(&dir, period, by, &tz, Utc::now())
                .map_err(|e| BackendError::Internal(e.to_string()))?;
            serde_json::to_value(r).map_err(|e| BackendError::Internal(e.to_string()))
        })
    }

    fn monitor(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        let v = self.monitor.snapshot();
        Box::pin(async move { Ok(v) })
    }

    fn history(
        &self,
        session_id: String,
        full: bool,
    ) -> BoxFuture<'_, Result<Option<Value>, BackendError>> {
        let dir = self.state_dir().join("sessions");
        blocking(move || {
            // Session ids only (not keys): of the index, or with a trail in the sessions
            // directory (the index is written in the background: a session a moment old may
            // not be in it yet) or in the archive.
            let index = crate::session::index::read_index(&dir)
                .map_err(|e| BackendError::Internal(e.to_string()))?;
            let has_trail = |d: &std::path::Path| {
                !crate::session::trail::trail_files(d, &session_id)
                    .unwrap_or_default()
                    .is_empty()
            };
            let known = index.values().any(|e| e.session_id == session_id)
                || has_trail(&dir)
                || has_trail(&dir.join(".archive"));
            if !known {
                return Ok(None);
            }
            let h = crate::report::history::history(&dir, &session_id)
                .map_err(|e| BackendError::Internal(e.to_string()))?;
            Ok(Some(crate::report::history::to_json(&h, full)))
        })
    }

    fn models(&self) -> Vec<String> {
        // Only what a message can be routed to: not the embedding or speech models.
        self.cfg.chat_models().map(|m| m.name.clone()).collect()
    }

    fn a2a_send(
        &self,
        req: crate::api::a2a::A2aIn,
    ) -> BoxFuture<'_, Result<crate::api::a2a::A2aTicket, BackendError>> {
        Box::pin(self.a2a_accept(req))
    }

    fn a2a_task(&self, key: String, id: String) -> BoxFuture<'_, crate::api::a2a::TaskResult> {
        Box::pin(async move { self.recorded_task(&key, &id).await })
    }

    fn a2a_cancel(&self, key: String, id: String) -> BoxFuture<'_, crate::api::a2a::TaskResult> {
        Box::pin(async move { self.a2a_stop(&key, &id).await })
    }

    fn skills(&self) -> Vec<(String, String)> {
        let mut list: Vec<(String, String)> = (self.skills.all().iter())
            .map(|s| (s.name.clone(), s.description.clone()))
            .collect();
        list.sort();
        list
    }

    fn compat(&self, req: CompatIn) -> BoxFuture<'_, Result<CompatTicket, BackendError>> {
        Box::pin(self.compat_accept(req))
    }

    fn metrics(&self) -> BoxFuture<'_, Result<String, BackendError>> {
        self.metrics.set_queue_depth(self.dispatcher.queue_depth());
        self.metrics
            .set_approvals_pending(self.approvals.pending_count());
        self.metrics.set_active(self.dispatcher.active_sessions());
        Box::pin(async move {
            self.metrics.set_session_resources(
                self.dispatcher.workers().await,
                self.dispatcher.open_sessions(),
            );
            Ok(self.metrics.render())
        })
    }
}
