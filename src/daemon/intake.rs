//! Durable intake (SPEC §5.2): every inbound item is appended to its session's trail before it
//! is acknowledged, then queued. Also turns control lines into jobs and re-queues what a crash
//! left unfinished.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::agent::Work;
use crate::control::{self, ControlLine, Source};

/// The text of a control line, or `None` (logged: the line is skipped). A `text_file` holds at
/// most `max_bytes` (the HTTP body cap: the same bound for a message however it arrives).
async fn text_or_skip(
    id: &str,
    text: Option<String>,
    text_file: Option<std::path::PathBuf>,
    state_dir: &std::path::Path,
    max_bytes: usize,
) -> Option<String> {
    match resolve_text(text, text_file, state_dir.to_path_buf(), max_bytes as u64).await {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(id = %id, error = %e, "FIFO line skipped");
            None
        }
    }
}

/// `control::resolve_text` reads `text_file` from disk: run it on the blocking pool. Its open
/// is non-blocking and it reads a bounded regular file, so it cannot stall the next line.
async fn resolve_text(
    text: Option<String>,
    text_file: Option<std::path::PathBuf>,
    state_dir: std::path::PathBuf,
    max_bytes: u64,
) -> Result<String, control::ControlError> {
    if text_file.is_none() {
        return control::resolve_text(&text, &None, &state_dir, max_bytes);
    }
    tokio::task::spawn_blocking(move || {
        control::resolve_text(&text, &text_file, &state_dir, max_bytes)
    })
    .await
    .unwrap_or_else(|e| {
        Err(control::ControlError::TextFile {
            path: Default::default(),
            error: e.to_string(),
        })
    })
}
use crate::session::{self, Event, Intake, SessionStore};

use super::workers::{Dispatcher, Job};
pub use crate::channels::intake::AcceptError;
use crate::channels::intake::{Completion, IntakeSink};

/// Turns control lines (FIFO) into durable intakes and jobs.
pub struct IntakeHandler {
    /// The running config (SIGHUP replaces it).
    pub cfg: crate::config::Live,
    pub store: Arc<SessionStore>,
    pub dispatcher: Arc<Dispatcher>,
    /// Transcribes audio attachments before the intake is recorded (SPEC §19); `None` in
    /// set-ups without voice (audio then stays an attachment as sent).
    pub voice: Option<Arc<super::voice::Transcriber>>,
}

/// A session key from outside input: non-empty, at most 64 characters, no control characters
/// and no path separators.
pub fn valid_key(key: &str) -> bool {
    !key.trim().is_empty()
        && key.chars().count() <= 64
        && !key.chars().any(|c| c.is_control() || c == '/' || c == '\\')
}

impl IntakeHandler {
    pub async fn handle(&self, line: ControlLine) {
        let cfg = self.cfg.get();
        let state_dir = &cfg.paths.state_dir;
        let max_text = cfg.http.max_body_bytes;
        let id = line.id().unwrap_or_default().to_string();
        let (key, intake) = match line {
            ControlLine::User {
                text,
                text_file,
                sender,
                tier,
                attachments,
                attachments_file,
                ..
            } => {
                let key = sender.unwrap_or_else(|| "cli".to_string());
                if !valid_key(&key) {
                    tracing::warn!(id = %id, "FIFO line skipped: invalid sender (1-64 characters, no control characters or slashes)");
                    return;
                }
                let Some(text) = text_or_skip(&id, text, text_file, state_dir, max_text).await
                else {
                    return;
                };
                let attachments = match attachments_file {
                    None => attachments,
                    Some(file) => {
                        let dir = state_dir.clone();
                        let r = tokio::task::spawn_blocking(move || {
                            control::resolve_attachments(
                                &attachments,
                                &Some(file),
                                &dir,
                                max_text as u64,
                            )
                        })
                        .await;
                        match r {
                            Ok(Ok(all)) => all,
                            Ok(Err(e)) => {
                                tracing::warn!(id = %id, error = %e, "FIFO line skipped");
                                return;
                            }
                            Err(e) => {
                                tracing::warn!(id = %id, error = %e, "FIFO line skipped");
                                return;
                            }
                        }
                    }
                };
                let intake = Intake {
                    id,
                    source: Source::User,
                    from: key.clone(),
                    text,
                    tier,
                    attachments: attachments
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect(),
                    route: None,
                    notify_meta: None,
                    relayed_from: None,
                };
                (key, intake)
            }
            ControlLine::System {
                text,
                text_file,
                tier,
                ..
            } => {
                let Some(text) = text_or_skip(&id, text, text_file, state_dir, max_text).await
                else {
                    return;
                };
                (
                    "system".to_string(),
                    Intake {
                        id,
                        source: Source::System,
                        from: "system".into(),
                        text,
                        tier,
                        attachments: vec![],
                        route: None,
                        notify_meta: None,
                        relayed_from: None,
                    },
                )
            }
            ControlLine::Notify {
                text,
                text_file,
                source,
                reference,
                data,
                ..
            } => {
                let Some(body) = text_or_skip(&id, text, text_file, state_dir, max_text).await
                else {
                    return;
                };
                (
                    "system".to_string(),
                    Intake {
                        id,
                        source: Source::System,
                        from: source.clone().unwrap_or_else(|| "notify".into()),
                        text: notify_text(
                            &body,
                            source.as_deref(),
                            reference.as_deref(),
                            data.as_ref(),
                        ),
                        tier: None,
                        attachments: vec![],
                        route: None,
                        notify_meta: Some(notify_meta(
                            source.as_deref(),
                            reference.as_deref(),
                            data.as_ref(),
                        )),
                        relayed_from: None,
                    },
                )
            }
            ControlLine::SessionModel { key, model, .. } => {
                let change = super::session_control::Change::Model(model);
                self.session_setting(key, change, id).await;
                return;
            }
            ControlLine::SessionSkill {
                key, name, enabled, ..
            } => {
                let change = super::session_control::Change::Skill { name, enabled };
                self.session_setting(key, change, id).await;
                return;
            }
            ControlLine::Reset { target, .. } => {
                self.reset(&target, "control FIFO reset").await;
                return;
            }
            // Decided by the FIFO task (`daemon::approvals::handle_line`), never an intake.
            ControlLine::Approval { .. } => return,
        };
        // Errors are logged by `accept`; the FIFO writer sees no intake record and times out.
        let _ = self.accept(&key, intake).await;
    }

    /// A FIFO `session_model` / `session_skill` line (SPEC §18.2): queued on the session's
    /// queue (so later lines of the FIFO come after it) without waiting for it; `agent-send`
    /// sees the event with its id in the trail, a refusal is logged.
    async fn session_setting(
        &self,
        key: String,
        change: super::session_control::Change,
        id: String,
    ) {
        if !valid_key(&key) {
            tracing::warn!(id = %id, "FIFO line skipped: invalid session key (1-64 characters, no control characters or slashes)");
            return;
        }
        let request = super::session_control::Request {
            change: Some(change),
            channel: "fifo".into(),
            id: Some(id.clone()).filter(|i| !i.is_empty()),
        };
        let answer = self.dispatcher.queue_session_control(&key, request).await;
        tokio::spawn(async move {
            match answer.await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(id = %id, session_key = %key, error = %e, "FIFO session setting refused")
                }
                Err(_) => {
                    tracing::warn!(id = %id, session_key = %key, "FIFO session setting not made: agentd is stopping")
                }
            }
        });
    }

    /// `accept`, for a message of `key` (session queues: SPEC §16.9). A full queue is refused
    /// here, before anything is recorded, so nothing acknowledged is ever dropped.
    fn reserve(&self, key: &str, id: &str) -> Result<super::workers::QueueSlot, AcceptError> {
        self.dispatcher.try_reserve(key).map_err(|e| {
            tracing::warn!(id = %id, session_key = %key, error = %e, "message NOT accepted: queue full");
            AcceptError::Busy(e)
        })
    }

    /// Reserve a queue slot, record the intake durably, then queue it. A message refused
    /// because its queue is full, or that cannot be recorded, is not acknowledged (the FIFO
    /// writer times out and may retry).
    pub async fn accept(&self, key: &str, intake: Intake) -> Result<(), AcceptError> {
        self.accept_new(key, intake).await.map(|_| ())
    }

    /// [`Self::accept`], telling whether the intake was new (`false`: its id was already in
    /// the session's trail, and it was not queued again).
    pub async fn accept_new(&self, key: &str, intake: Intake) -> Result<bool, AcceptError> {
        self.accept_heard(key, intake).await.map(|(new, _)| new)
    }

    /// [`Self::accept_new`], also returning what was transcribed of the intake's audio
    /// (SPEC §19; Telegram echoes it).
    pub async fn accept_heard(
        &self,
        key: &str,
        mut intake: Intake,
    ) -> Result<(bool, Vec<super::voice::Heard>), AcceptError> {
        let slot = self.reserve(key, &intake.id)?;
        let heard = self.hear(key, &mut intake).await;
        self.record(key, intake, slot)
            .await
            .map(|new| (new, if new { heard } else { Vec::new() }))
    }

    /// Transcribe `intake`'s audio into its text, unless it is already recorded (offered
    /// again after a crash: the recorded text already has its transcript).
    async fn hear(&self, key: &str, intake: &mut Intake) -> Vec<super::voice::Heard> {
        let Some(voice) = &self.voice else {
            return Vec::new();
        };
        let audio = |a: &String| super::voice::audio_mime(std::path::Path::new(a)).is_some();
        if !intake.attachments.iter().any(audio) {
            return Vec::new();
        }
        if self.is_recorded(key, &intake.id).await {
            return Vec::new();
        }
        let session_id =
            (self.store.index().get(key)).map_or_else(|| key.to_string(), |e| e.session_id.clone());
        voice.apply(&session_id, intake).await
    }

    /// Whether intake `id` is already in the trail of `key` (offered again after a crash:
    /// the source need not fetch or transcribe anything for it; `accept` drops it anyway).
    pub async fn is_recorded(&self, key: &str, id: &str) -> bool {
        let (store, k, id) = (self.store.clone(), key.to_string(), id.to_string());
        let known = tokio::task::spawn_blocking(move || store.has_intake(&k, &id)).await;
        matches!(known, Ok(Ok(true)))
    }

    async fn record(
        &self,
        key: &str,
        intake: Intake,
        slot: super::workers::QueueSlot,
    ) -> Result<bool, AcceptError> {
        let store = self.store.clone();
        let k = key.to_string();
        // The model a new session is created with (the worker routes each message itself).
        let model = crate::agent::route_source(&self.cfg.get(), intake.source.as_str());
        let item = intake.clone();
        let recorded =
            tokio::task::spawn_blocking(move || store.append_intake(&k, &model, item)).await;
        let err = match recorded {
            Ok(Ok((_, false))) => {
                tracing::info!(id = %intake.id, session_key = %key, "duplicate intake id; already accepted, not queued again");
                return Ok(false);
            }
            Ok(Ok((_, true))) => {
                tracing::info!(id = %intake.id, session_key = %key, source = %intake.source, "message accepted");
                self.dispatcher
                    .submit_reserved(
                        slot,
                        Job::Message(Work {
                            intakes: vec![intake],
                            resume: false,
                            deltas: None,
                        }),
                    )
                    .await;
                return Ok(true);
            }
            Ok(Err(e)) => format!("cannot record the message in the session trail: {e}"),
            Err(e) => format!("intake task failed: {e}"),
        };
        tracing::error!(id = %intake.id, session_key = %key, error = %err, "message NOT accepted");
        Err(AcceptError::Failed(err))
    }

    /// Reset `all`, a session key or a session id, through each session's queue.
    pub async fn reset(&self, target: &str, reason: &str) -> usize {
        let index = self.store.index();
        let keys: Vec<String> = if target == "all" {
            index.keys().cloned().collect()
        } else {
            session::index::lookup(&index, target)
                .map(|(k, _)| vec![k.clone()])
                .unwrap_or_default()
        };
        if keys.is_empty() {
            tracing::info!(%target, "reset: no such session");
        }
        for k in &keys {
            self.dispatcher
                .submit(
                    k,
                    Job::Reset {
                        reason: reason.to_string(),
                    },
                )
                .await;
        }
        keys.len()
    }

    /// Queue everything a previous run acknowledged but did not finish: turns that started are
    /// resumed, the rest processed as new (SPEC §5.2).
    pub async fn recover(&self) -> usize {
        let mut count = 0;
        for (key, entry) in self.store.index() {
            let dir = self.store.dir().to_path_buf();
            let id = entry.session_id.clone();
            let lines = match tokio::task::spawn_blocking(move || {
                // A session marked settled at its last line has nothing to recover.
                if session::is_settled(&dir, &id) {
                    return Ok(Vec::new());
                }
                session::trail::read_trail(&dir, &id)
            })
            .await
            {
                Ok(Ok(l)) => l,
                Ok(Err(e)) => {
                    tracing::error!(session_key = %key, error = %e, "cannot read trail for recovery");
                    continue;
                }
                Err(_) => continue,
            };
            let pending = session::pending_intakes(&lines);
            let (started, fresh): (Vec<_>, Vec<_>) = pending.into_iter().partition(|p| p.started);
            if !started.is_empty() {
                count += started.len();
                self.dispatcher
                    .submit(
                        &key,
                        Job::Message(Work {
                            intakes: started.into_iter().map(|p| p.intake).collect(),
                            resume: true,
                            deltas: None,
                        }),
                    )
                    .await;
            }
            for p in fresh {
                count += 1;
                self.dispatcher
                    .submit(
                        &key,
                        Job::Message(Work {
                            intakes: vec![p.intake],
                            resume: false,
                            deltas: None,
                        }),
                    )
                    .await;
            }
        }
        if count > 0 {
            tracing::info!(count, "recovered unfinished messages from the trails");
        }
        count
    }
}

impl IntakeHandler {
    /// The deliveries a crash left open (SPEC §16.1, §16.2), for every channel: replies never
    /// started, and started ones with their progress. Read before `recover` queues any work,
    /// so no reply made by this run is taken for one a crash left unsent, and queued on their
    /// sessions' lanes at once, so they go before any reply this run makes; they start when
    /// [`Self::resume_deliveries`] opens the gate after READY.
    pub async fn open_deliveries(&self) -> OpenDeliveries {
        let open = OpenDeliveries {
            gate: CancellationToken::new(),
        };
        if self.dispatcher.outbound().is_none() {
            return open;
        }
        let policy = self.dispatcher.delivery_retry();
        let window = policy.within;
        for (key, entry) in self.store.index() {
            let store = self.store.clone();
            let k = key.clone();
            // A session settled at its last line has no delivery open (the mark waits for
            // its lane to run dry): its trail is not read.
            let Ok(Ok(Some(session))) = tokio::task::spawn_blocking(move || {
                if session::is_settled(store.dir(), &entry.session_id) {
                    return Ok(None);
                }
                store.get(&k)
            })
            .await
            else {
                continue;
            };
            let s = session.clone();
            let Ok(Ok(lines)) = tokio::task::spawn_blocking(move || s.read_trail()).await else {
                continue;
            };
            let (todo, uncertain) = super::delivery::undelivered(&lines);
            for ids in uncertain {
                tracing::warn!(session_key = %key, ?ids, "a reply was being sent when agentd stopped; not sending it again");
            }
            for super::delivery::Pending {
                ids,
                text,
                progress,
                ts,
            } in todo
            {
                let intakes: Vec<Intake> = lines
                    .iter()
                    .filter_map(|l| match &l.event {
                        Event::Intake(i) if ids.contains(&i.id) => Some(i.clone()),
                        _ => None,
                    })
                    .collect();
                // A Telegram message's target was fixed when it arrived. For the FIFO and the
                // scheduler the target is today's contact list, so a reply never started goes
                // out only if it is younger than the retry window: a sender who became a
                // contact later must not get weeks-old replies. (A started one resumes: its
                // intent proves the target held then.)
                let from_telegram = intakes
                    .first()
                    .is_some_and(|i| i.source == Source::Telegram);
                if progress.is_none() && !from_telegram && !recent(&ts, window) {
                    continue;
                }
                let work = Work {
                    intakes,
                    resume: false,
                    deltas: None,
                };
                if let Some(target) = super::delivery::target_for(&work, &self.cfg.get()) {
                    tracing::info!(session_key = %key, session = %session.id, resumed = progress.is_some(),
                        "delivering a reply left unsent by a restart");
                    // Retried within the window counted from when the reply was recorded.
                    let window = policy.window_aged(age_of(&ts));
                    let gate = Some(open.gate.clone());
                    self.dispatcher
                        .deliver(&session, &target, ids, text, progress, window, gate);
                }
            }
        }
        open
    }

    /// Let the deliveries [`Self::open_deliveries`] queued start; they run in the background
    /// (READY never waits on Telegram).
    pub fn resume_deliveries(&self, open: OpenDeliveries) {
        open.gate.cancel();
    }
}

/// The deliveries a crash left open, queued on their lanes and waiting for this gate.
pub struct OpenDeliveries {
    gate: CancellationToken,
}

/// How long ago the trail time `ts` was (zero when unreadable or in the future).
fn age_of(ts: &str) -> std::time::Duration {
    chrono::DateTime::parse_from_rfc3339(ts)
        .ok()
        .and_then(|t| chrono::Utc::now().signed_duration_since(t).to_std().ok())
        .unwrap_or_default()
}

/// Whether the trail time `ts` is at most `within` ago.
fn recent(ts: &str, within: std::time::Duration) -> bool {
    chrono::DateTime::parse_from_rfc3339(ts).is_ok_and(|t| {
        let age = chrono::Utc::now().signed_duration_since(t);
        age.to_std().map_or(true, |age| age <= within)
    })
}

impl IntakeSink for IntakeHandler {
    fn accept<'a>(
        &'a self,
        key: &'a str,
        intake: Intake,
    ) -> futures::future::BoxFuture<'a, Result<(), AcceptError>> {
        Box::pin(IntakeHandler::accept(self, key, intake))
    }

    fn ask<'a>(
        &'a self,
        key: &'a str,
        intake: Intake,
    ) -> futures::future::BoxFuture<'a, Result<Option<Completion>, AcceptError>> {
        Box::pin(async move {
            let id = intake.id.clone();
            let done = self.dispatcher.wait_for(&id);
            if let Err(e) = IntakeHandler::accept(self, key, intake).await {
                self.dispatcher.forget(key, &id);
                return Err(e);
            }
            Ok(done.await.ok())
        })
    }
}

/// A notification's `{source, ref, data}` as received, for the webhook's `notify_meta` (SPEC
/// §10.2); absent fields are left out.
pub fn notify_meta(
    source: Option<&str>,
    reference: Option<&str>,
    data: Option<&serde_json::Value>,
) -> serde_json::Value {
    let mut meta = serde_json::Map::new();
    if let Some(s) = source {
        meta.insert("source".into(), s.into());
    }
    if let Some(r) = reference {
        meta.insert("ref".into(), r.into());
    }
    if let Some(d) = data {
        meta.insert("data".into(), d.clone());
    }
    serde_json::Value::Object(meta)
}

/// The text a notification becomes: a header naming where it came from, the message, and any
/// structured data.
pub fn notify_text(
    body: &str,
    source: Option<&str>,
    reference: Option<&str>,
    data: Option<&serde_json::Value>,
) -> String {
    let mut head = format!("[notification from {}", source.unwrap_or("unknown"));
    if let Some(r) = reference {
        head.push_str(&format!(", ref {r}"));
    }
    head.push(']');
    let mut out = format!("{head} {body}");
    if let Some(d) = data {
        out.push_str(&format!("\ndata: {d}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_validated() {
        assert!(valid_key("alice"));
        assert!(valid_key("Bob Smith"));
        assert!(!valid_key(""));
        assert!(!valid_key("a/b"));
        assert!(!valid_key("a\nb"));
        assert!(!valid_key(&"x".repeat(65)));
    }

    #[test]
    fn notify_meta_keeps_what_was_received() {
        let data = serde_json::json!({"job": 7});
        assert_eq!(
            notify_meta(Some("ci"), Some("build-7"), Some(&data)),
            serde_json::json!({"source": "ci", "ref": "build-7", "data": {"job": 7}})
        );
        assert_eq!(notify_meta(None, None, None), serde_json::json!({}));
    }

    #[test]
    fn notify_text_names_source_ref_and_data() {
        let t = notify_text(
            "build failed",
            Some("ci"),
            Some("#42"),
            Some(&serde_json::json!({"a":1})),
        );
        assert_eq!(
            t,
            "[notification from ci, ref #42] build failed\ndata: {\"a\":1}"
        );
    }
}
