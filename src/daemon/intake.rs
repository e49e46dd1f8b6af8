//! Durable intake (SPEC §5.2): every inbound item is appended to its session's trail before it
//! is acknowledged, then queued. Sources reach it only through `channels::intake::IntakeSink`;
//! the chat commands through `channels::commands::SessionControl`. Also handles the FIFO's
//! control lines that are not messages and re-queues what a crash left unfinished.

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::agent::Work;
use crate::channels::commands::{Change, Load, SessionControl, SettingsAnswer};
use crate::control::ControlLine;
use crate::session::{self, Event, Intake, Route, SessionStore};

use super::workers::{Dispatcher, Job};
pub use crate::channels::intake::{AcceptError, valid_key};
use crate::channels::intake::{Accepted, Completion, IntakeSink};

/// Durable intake and the session controls over the dispatcher's queues.
pub struct IntakeHandler {
    /// The running config (SIGHUP replaces it).
    pub cfg: crate::config::Live,
    pub store: Arc<SessionStore>,
    pub dispatcher: Arc<Dispatcher>,
    /// Transcribes audio attachments before the intake is recorded (SPEC §19); `None` in
    /// set-ups without voice (audio then stays an attachment as sent).
    pub voice: Option<Arc<super::voice::Transcriber>>,
    /// Where a refused FIFO session setting is shown, for the `agent-send` waiting on it.
    pub monitor: Arc<crate::monitor::Monitor>,
}

impl IntakeHandler {
    /// A FIFO control line that is not a message (`channels::fifo_intake`): a reset or a
    /// session setting. Approval lines are decided by the FIFO task
    /// (`daemon::approvals::handle_line`), never here.
    pub async fn control(&self, line: ControlLine) {
        let id = line.id().unwrap_or_default().to_string();
        match line {
            ControlLine::SessionModel { key, model, .. } => {
                self.session_setting(key, Change::Model(model), id).await
            }
            ControlLine::SessionSkill {
                key, name, enabled, ..
            } => {
                let change = Change::Skill { name, enabled };
                self.session_setting(key, change, id).await
            }
            ControlLine::Reset { target, .. } => {
                self.reset(&target, "control FIFO reset").await;
            }
            ControlLine::Stop { key, .. } => {
                let stopped = self.dispatcher.stop_session(&key);
                tracing::info!(id = %id, session_key = %crate::control::escaped_preview(&key), stopped, "FIFO stop");
            }
            ControlLine::Approval { .. }
            | ControlLine::User { .. }
            | ControlLine::System { .. }
            | ControlLine::Notify { .. } => {}
        }
    }

    /// A FIFO `session_model` / `session_skill` line (SPEC §18.2): queued on the session's
    /// queue (so later lines of the FIFO come after it) without waiting for it; `agent-send`
    /// sees the event with its id in the trail, or a refusal with its id and reason in the
    /// monitor's `refused` list (and the log).
    async fn session_setting(&self, key: String, change: Change, id: String) {
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
        let monitor = self.monitor.clone();
        tokio::spawn(async move {
            match answer.await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(id = %id, session_key = %key, error = %e, "FIFO session setting refused");
                    monitor.refused(&id, &e.to_string());
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

    /// Reserve a queue slot, transcribe the audio, record the intake durably, then queue it
    /// (`IntakeSink::accept`). A message refused because its queue is full, or that cannot be
    /// recorded, is not acknowledged (the FIFO writer times out and may retry).
    async fn take_in(&self, key: &str, mut intake: Intake) -> Result<Accepted, AcceptError> {
        let slot = self.reserve(key, &intake.id)?;
        let heard = self.hear(key, &mut intake).await;
        let (new, session_id) = self.record(key, intake, slot).await?;
        let transcripts = match new {
            true => heard.into_iter().map(|h| h.transcript).collect(),
            false => Vec::new(),
        };
        Ok(Accepted {
            new,
            session_id,
            transcripts,
        })
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
    async fn is_recorded(&self, key: &str, id: &str) -> bool {
        let (store, k, id) = (self.store.clone(), key.to_string(), id.to_string());
        let known = tokio::task::spawn_blocking(move || store.has_intake(&k, &id)).await;
        matches!(known, Ok(Ok(true)))
    }

    async fn record(
        &self,
        key: &str,
        intake: Intake,
        slot: super::workers::QueueSlot,
    ) -> Result<(bool, String), AcceptError> {
        let store = self.store.clone();
        let k = key.to_string();
        // The model a new session is created with (the worker routes each message itself).
        let model = crate::agent::route_source(&self.cfg.get(), intake.source.as_str());
        let item = intake.clone();
        let recorded =
            tokio::task::spawn_blocking(move || store.append_intake(&k, &model, item)).await;
        let err = match recorded {
            Ok(Ok((h, false))) => {
                tracing::info!(id = %intake.id, session_key = %key, "duplicate intake id; already accepted, not queued again");
                return Ok((false, h.id.clone()));
            }
            Ok(Ok((h, true))) => {
                tracing::info!(id = %intake.id, session_key = %key, source = %intake.source, "message accepted");
                self.dispatcher
                    .submit_reserved(slot, Job::Message(Work::new(vec![intake])))
                    .await;
                return Ok((true, h.id.clone()));
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
                        Job::Message(Work::resumed(
                            started.into_iter().map(|p| p.intake).collect(),
                        )),
                    )
                    .await;
            }
            for p in fresh {
                count += 1;
                self.dispatcher
                    .submit(&key, Job::Message(Work::new(vec![p.intake])))
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
                // A chat message's address was fixed when it arrived (its route). For the
                // FIFO and the scheduler it is today's contact list, so a reply never started
                // goes out only if it is younger than the retry window: a sender who became a
                // contact later must not get weeks-old replies. (A started one resumes: its
                // intent proves the address held then.)
                let from_chat = intakes
                    .first()
                    .is_some_and(|i| i.route.as_ref().and_then(Route::address).is_some());
                if progress.is_none() && !from_chat && !recent(&ts, window) {
                    continue;
                }
                let work = Work::new(intakes);
                if let Some(target) = self.dispatcher.reply_address(&work) {
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
    /// (READY never waits on a channel).
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
    ) -> BoxFuture<'a, Result<Accepted, AcceptError>> {
        Box::pin(self.take_in(key, intake))
    }

    fn ask<'a>(
        &'a self,
        key: &'a str,
        intake: Intake,
    ) -> BoxFuture<'a, Result<Option<Completion>, AcceptError>> {
        Box::pin(async move {
            let id = intake.id.clone();
            let done = self.dispatcher.wait_for(&id);
            if let Err(e) = self.take_in(key, intake).await {
                self.dispatcher.forget(key, &id);
                return Err(e);
            }
            Ok(done.await.ok())
        })
    }

    fn is_recorded<'a>(&'a self, key: &'a str, id: &'a str) -> BoxFuture<'a, bool> {
        Box::pin(IntakeHandler::is_recorded(self, key, id))
    }
}

/// The chat commands (`channels::commands`) over the session queues.
impl SessionControl for IntakeHandler {
    fn reset<'a>(&'a self, key: &'a str, reason: &'a str) -> BoxFuture<'a, usize> {
        Box::pin(IntakeHandler::reset(self, key, reason))
    }

    fn stop(&self, key: &str) -> bool {
        self.dispatcher.stop_session(key)
    }

    fn load(&self) -> Load {
        Load {
            agent: self.cfg.get().agent.name.clone(),
            running: self.dispatcher.active_sessions(),
            queued: self.dispatcher.queue_depth(),
        }
    }

    fn settings<'a>(
        &'a self,
        key: &'a str,
        change: Option<Change>,
        channel: &'a str,
    ) -> BoxFuture<'a, SettingsAnswer> {
        Box::pin(async move {
            let request = super::session_control::Request {
                change,
                channel: channel.to_string(),
                id: None,
            };
            let answer = self.dispatcher.queue_session_control(key, request).await;
            let stopping = crate::channels::commands::ControlError::Stopping;
            SettingsAnswer::new(async move { answer.await.unwrap_or(Err(stopping)) })
        })
    }
}
