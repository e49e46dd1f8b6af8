//! Wiring of the Telegram channel into the daemon: the poller's sink is durable intake (SPEC
//! §5.2: the offset advances only after the intake record is written), chat commands for allowed
//! users, media downloads into `inbox/`, reply delivery and the typing indicator, the offset in
//! `agentd.db`, and poller health in the monitor.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::delivery::{Outbound, Target};
use super::intake::{AcceptError, IntakeHandler};
use crate::tools::outbound::{FileKind, PartError};

/// The answer to a Telegram message refused because its session's queue is full.
const BUSY_REPLY: &str =
    "I'm busy with earlier messages; this one was not taken. Please send it again in a moment.";
use super::services::{Services, Tasks};
use super::workers::Dispatcher;
use crate::channels::telegram::client::{
    FileKind as TgFileKind, HTTP_TIMEOUT_SLACK, SendFault, TelegramClient, TgError,
};
use crate::channels::telegram::inbound::{
    APPROVAL_BUTTON, MAX_CALLBACK_DATA, TgCallback, TgCommand, TgInbound, allowed, approval_button,
};
use crate::channels::telegram::poll::{self, OffsetStore, TgSink};
use crate::config::Config;
use crate::session::{Intake, Route};
use crate::store::Db;

/// The offset belongs to one bot: switching tokens must not skip the new bot's updates.
fn offset_key(bot_id: Option<i64>) -> String {
    match bot_id {
        Some(id) => format!("telegram.{id}.offset"),
        None => "telegram.offset".to_string(),
    }
}

struct DbOffsets(Db, String);

impl OffsetStore for DbOffsets {
    fn load(&self) -> BoxFuture<'_, Option<i64>> {
        Box::pin(async move {
            match self.0.kv_get(&self.1).await {
                Ok(v) => v.and_then(|s| s.parse().ok()),
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the Telegram offset; starting from the server's");
                    None
                }
            }
        })
    }

    fn save(&self, offset: i64) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Err(e) = self.0.kv_set(&self.1, &offset.to_string()).await {
                tracing::error!(error = %e, "cannot save the Telegram offset");
            }
        })
    }
}

struct Sink {
    cfg: Arc<Config>,
    client: TelegramClient,
    intake: Arc<IntakeHandler>,
    dispatcher: Arc<Dispatcher>,
    /// Command and "busy" answers go out through it with the outbox's retries
    /// (`tools::outbound::send_text_with_retry`), unrecorded, as tasks of this tracker: the
    /// poller never waits on them.
    outbound: Arc<dyn Outbound>,
    tracker: tokio_util::task::TaskTracker,
    /// Approval buttons (SPEC §18.1): decided here, `allow_from` read live.
    approvals: Arc<crate::tools::approval::Approvals>,
    live: crate::config::Live,
}

impl Sink {
    /// An approval button (SPEC §18.1): it decides when pressed by a user listed in
    /// `[approvals] approvers`, or by a user in `allow_from` in the chat the prompt was
    /// offered in (a modified client can send any button data from its own chat); everyone
    /// gets an answer. Both lists are read live.
    async fn approval_button(&self, cb: &TgCallback) {
        let notice = match approval_button(&cb.data) {
            Some((id, what)) if crate::tools::approval::is_valid_id(id) => {
                self.approval_decision(cb, id, what)
            }
            _ => "This button is not one of mine.".to_string(),
        };
        if let Err(e) = self.client.answer_callback(&cb.query_id, &notice).await {
            tracing::warn!(error = %e, "telegram: answerCallbackQuery failed");
        }
    }

    /// Decide approval `id` as `what` (`a`, `s`, `d`) for the press `cb`, if it may; the
    /// answer for the presser.
    fn approval_decision(&self, cb: &TgCallback, id: &str, what: char) -> String {
        use crate::session::approval::Decision;
        use crate::tools::approval::DecideError;
        let live = self.live.get();
        let user_id = cb.user_id;
        if !live.approvals.is_approver(user_id) {
            if !allowed(user_id, &live.telegram) {
                tracing::warn!(
                    user_id,
                    "telegram: approval button from a user not in allow_from refused"
                );
                return "You are not allowed to decide approvals (not in allow_from).".into();
            }
            match self.approvals.offered_in(id, cb.chat_id) {
                None => return "This approval is no longer waiting.".into(),
                Some(false) => {
                    tracing::warn!(
                        user_id,
                        chat_id = cb.chat_id,
                        approval = %id,
                        "telegram: approval button pressed outside the chat it was asked in; refused"
                    );
                    return "You are not allowed to decide this approval here: it was asked in \
                            another chat."
                        .into();
                }
                Some(true) => {}
            }
        }
        let decision = match what {
            'a' => Decision::Approve,
            's' => Decision::Always,
            _ => Decision::Deny,
        };
        let by = user_id.to_string();
        match super::approvals::decide(&self.approvals, id, decision, &by, "telegram") {
            Ok(_) => match decision {
                Decision::Deny => "Denied.".to_string(),
                Decision::Always => "Approved for this session.".to_string(),
                _ => "Approved.".to_string(),
            },
            Err(DecideError::AlreadyDecided { decision, .. }) => {
                format!("Already decided: {decision}.")
            }
            Err(DecideError::Unknown(_)) => "This approval is no longer waiting.".to_string(),
        }
    }

    /// Send `text` to `chat_id` in the background, retried like a reply (SPEC §16.1).
    fn answer(&self, chat_id: i64, text: String, what: &'static str) {
        let (out, policy) = (self.outbound.clone(), self.dispatcher.delivery_retry());
        self.tracker.spawn(async move {
            let to = Target::Telegram { chat_id };
            let sent =
                crate::tools::outbound::send_text_with_retry(out.as_ref(), &to, &text, &policy)
                    .await;
            if let Err(e) = sent {
                tracing::warn!(error = %e, what, "cannot send a Telegram answer");
            }
        });
    }

    /// `/model`, `/skills`, `/skill` (SPEC §18.2): through the session's queue, answered in
    /// the background once the change is recorded (the poller does not wait for a message in
    /// flight).
    fn session_command(&self, msg: &TgInbound, cmd: TgCommand) {
        use super::session_control::{Change, Request, model_text, skills_text};
        let (change, listing) = match cmd {
            TgCommand::Model(None) => (None, Listing::Models),
            TgCommand::Model(Some(name)) => (Some(Change::Model(Some(name))), Listing::Models),
            TgCommand::Skills => (None, Listing::Skills),
            TgCommand::Skill {
                enabled: Some(enabled),
                name,
            } => (Some(Change::Skill { name, enabled }), Listing::Skills),
            TgCommand::Skill { enabled: None, .. } => {
                let usage = "Use /skill on NAME or /skill off NAME; /skills lists them.";
                self.answer(msg.chat_id, usage.to_string(), "command answer");
                return;
            }
            _ => return,
        };
        let (dispatcher, out) = (self.dispatcher.clone(), self.outbound.clone());
        let policy = self.dispatcher.delivery_retry();
        let (key, chat_id) = (msg.session_key.clone(), msg.chat_id);
        let client = self.client.clone();
        self.tracker.spawn(async move {
            let changed = change.is_some();
            let request = Request {
                change,
                channel: "telegram".into(),
                id: None,
            };
            let answer = dispatcher.session_control(&key, request).await;
            // `/model` alone: the choices as inline buttons (one try; plain text otherwise).
            // `/skills`: one button per skill that turns it the other way.
            let with_buttons = match (&answer, listing, changed) {
                (Ok(s), Listing::Models, false) => Some((model_text(s), model_buttons(&s.models))),
                (Ok(s), Listing::Skills, false) => Some((skills_text(s), skill_buttons(s))),
                _ => None,
            };
            if let Some((text, buttons)) = with_buttons {
                match client.send_with_buttons(chat_id, &text, &buttons).await {
                    Ok(_) => return,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot send the buttons; answering in text")
                    }
                }
            }
            let text = match answer {
                Ok(s) => match (listing, changed) {
                    (Listing::Models, true) => match &s.model {
                        Some(m) => format!("This chat now uses {m}."),
                        None => "This chat's model follows routing again (default).".into(),
                    },
                    (Listing::Models, false) => model_text(&s),
                    (Listing::Skills, _) => skills_text(&s),
                },
                Err(e) => e.to_string(),
            };
            let to = Target::Telegram { chat_id };
            let sent =
                crate::tools::outbound::send_text_with_retry(out.as_ref(), &to, &text, &policy)
                    .await;
            if let Err(e) = sent {
                tracing::warn!(error = %e, "cannot send a Telegram answer");
            }
        });
    }

    /// A `model:NAME` button of `/model` or a `skill:on|off:NAME` button of `/skills` (SPEC
    /// §18.2): changed through the session's queue in the background (the poller does not wait
    /// for a message in flight), then the press is answered and the chat told what changed.
    fn settings_button(&self, cb: TgCallback, change: super::session_control::Change) {
        use super::session_control::{Change, Request, skills_text};
        let (dispatcher, client) = (self.dispatcher.clone(), self.client.clone());
        let (out, policy) = (self.outbound.clone(), self.dispatcher.delivery_retry());
        self.tracker.spawn(async move {
            let is_model = matches!(change, Change::Model(_));
            let request = Request {
                change: Some(change),
                channel: "telegram".into(),
                id: None,
            };
            let text = match dispatcher.session_control(&cb.session_key, request).await {
                Ok(s) if !is_model => skills_text(&s),
                Ok(s) => match &s.model {
                    Some(m) => format!("This chat now uses {m}."),
                    None => "This chat's model follows routing again (default).".into(),
                },
                Err(e) => e.to_string(),
            };
            if let Err(e) = client.answer_callback(&cb.query_id, &text).await {
                tracing::debug!(error = %e, "cannot answer a button press");
            }
            let to = Target::Telegram {
                chat_id: cb.chat_id,
            };
            let sent =
                crate::tools::outbound::send_text_with_retry(out.as_ref(), &to, &text, &policy)
                    .await;
            if let Err(e) = sent {
                tracing::warn!(error = %e, "cannot send a Telegram answer");
            }
        });
    }

    async fn command(&self, msg: &TgInbound, cmd: TgCommand) -> Result<(), String> {
        // This chat's session: the contact's in a private chat, the group's in a group.
        let key = &msg.session_key;
        let reply = match cmd {
            TgCommand::Model(_) | TgCommand::Skills | TgCommand::Skill { .. } => {
                self.session_command(msg, cmd);
                return Ok(());
            }
            TgCommand::Reset => {
                let n = self.intake.reset(key, "telegram /reset").await;
                if n > 0 {
                    "Session reset. The conversation so far is archived."
                } else {
                    "There is no session to reset."
                }
                .to_string()
            }
            TgCommand::Stop => {
                if self.dispatcher.stop_session(key) {
                    "Stopping the message in flight.".to_string()
                } else {
                    "Nothing is running.".to_string()
                }
            }
            TgCommand::Status => format!(
                "{}: {} message(s) running, {} queued.",
                self.cfg.agent.name,
                self.dispatcher.active_sessions(),
                self.dispatcher.queue_depth()
            ),
        };
        self.answer(msg.chat_id, reply, "command answer");
        Ok(())
    }
}

/// The `/model` buttons: one per loaded model and `default`, data `model:NAME` (names too long
/// for Telegram's 64-byte callback data are left out: `/model NAME` still sets them).
fn model_buttons(models: &[String]) -> Vec<(String, String)> {
    models
        .iter()
        .map(String::as_str)
        .chain(["default"])
        .map(|m| (m.to_string(), format!("{MODEL_BUTTON}{m}")))
        .filter(|(_, data)| data.len() <= MAX_CALLBACK_DATA)
        .collect()
}

/// The callback-data prefix of the `/model` buttons.
const MODEL_BUTTON: &str = "model:";

/// The callback-data prefix of the `/skills` buttons: `skill:on:NAME`, `skill:off:NAME`.
const SKILL_BUTTON: &str = "skill:";

/// The `/skills` buttons: per skill, the switch to the other state (names too long for the
/// callback data are left out: `/skill on|off NAME` still works).
fn skill_buttons(s: &super::session_control::Settings) -> Vec<(String, String)> {
    s.skills
        .iter()
        .map(|k| {
            let (label, to) = if k.enabled {
                ("turn off", "off")
            } else {
                ("turn on", "on")
            };
            (
                format!("{label} {}", k.name),
                format!("{SKILL_BUTTON}{to}:{}", k.name),
            )
        })
        .filter(|(_, data)| data.len() <= MAX_CALLBACK_DATA)
        .collect()
}

impl TgSink for Sink {
    fn callback(&self, cb: TgCallback) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            use super::session_control::Change;
            if cb.data.starts_with(APPROVAL_BUTTON) {
                return self.approval_button(&cb).await;
            }
            if !allowed(cb.user_id, &self.live.get().telegram) {
                let user_id = cb.user_id;
                tracing::info!(
                    user_id,
                    "telegram: button press from user {user_id} rejected; add it to allow_from to allow"
                );
                return;
            }
            if let Some(name) = cb.data.strip_prefix(MODEL_BUTTON) {
                let change = Change::Model(Some(name.to_string()));
                self.settings_button(cb, change);
            } else if let Some(rest) = cb.data.strip_prefix(SKILL_BUTTON) {
                let change = match rest.split_once(':') {
                    Some(("on", name)) => Change::Skill {
                        name: name.to_string(),
                        enabled: true,
                    },
                    Some(("off", name)) => Change::Skill {
                        name: name.to_string(),
                        enabled: false,
                    },
                    _ => return,
                };
                self.settings_button(cb, change);
            }
        })
    }

    fn accept(&self, msg: TgInbound) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            if let Some(cmd) = msg.is_command.clone() {
                return self.command(&msg, cmd).await;
            }
            let id = match self.client.bot_id() {
                Some(bot) => format!("tg-{bot}-{}", msg.update_id),
                None => format!("tg-{}", msg.update_id),
            };
            // Offered again after a crash although recorded (it was finished while an earlier
            // update held the offset back): nothing to download, nothing to record.
            if msg.media.is_some() && self.intake.is_recorded(&msg.session_key, &id).await {
                return Ok(());
            }
            let mut text = msg.text.clone();
            let mut attachments = Vec::new();
            if let Some(media) = &msg.media {
                let inbox = self.cfg.paths.state_dir.join("inbox");
                match self
                    .client
                    .download(&media.file_id, &inbox, self.cfg.telegram.max_download_bytes)
                    .await
                {
                    // Audio is transcribed (or given its placeholder) at intake
                    // (`daemon::voice`), before the message is recorded.
                    Ok(path) => attachments.push(path.display().to_string()),
                    Err(e) => {
                        tracing::warn!(error = %e, "Telegram download failed");
                        text.push_str(&format!("\n[attachment could not be downloaded: {e}]"));
                    }
                }
            }
            if text.trim().is_empty() && attachments.is_empty() {
                return Ok(());
            }
            let intake = Intake {
                id,
                source: crate::control::Source::Telegram,
                from: msg.from_name.clone(),
                text,
                tier: None,
                attachments,
                route: Some(Route::Telegram {
                    chat_id: msg.chat_id,
                    message_id: Some(msg.message_id),
                }),
                notify_meta: None,
                relayed_from: None,
            };
            match self.intake.accept_heard(&msg.session_key, intake).await {
                Ok((_, heard)) => {
                    if self.cfg.voice.echo_transcript {
                        for h in heard {
                            let echo = format!("🎙 “{}”", h.transcript);
                            self.answer(msg.chat_id, echo, "transcript echo");
                        }
                    }
                    Ok(())
                }
                // Refused before intake: tell the sender and move on (the update is consumed,
                // so the message is not answered later; the sender knows to send it again).
                Err(AcceptError::Busy(_)) => {
                    self.answer(msg.chat_id, BUSY_REPLY.to_string(), "busy answer");
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            }
        })
    }
}

/// Which settings a session command answers with.
#[derive(Clone, Copy)]
enum Listing {
    Models,
    Skills,
}

/// What a failed Telegram call means for the outbox (SPEC §16.1).
fn part_error(e: TgError) -> PartError {
    match e.send_fault() {
        SendFault::Retry(after) => PartError::Retry {
            after,
            error: e.to_string(),
        },
        SendFault::Unknown => PartError::Unknown(e.to_string()),
        SendFault::Fatal => PartError::Failed(e.to_string()),
    }
}

/// The outbound seam on Telegram: replies, the `message`/`react` tools, command answers, typing.
pub struct TgOutbound {
    cfg: Arc<Config>,
    client: TelegramClient,
}

impl TgOutbound {
    pub fn new(cfg: Arc<Config>, client: TelegramClient) -> TgOutbound {
        TgOutbound { cfg, client }
    }
}

impl Outbound for TgOutbound {
    fn parts(&self, _to: &Target, text: &str) -> Vec<String> {
        TelegramClient::parts(text, self.cfg.telegram.text_chunk_limit)
    }

    fn send_part<'a>(
        &'a self,
        to: &'a Target,
        part: &'a str,
    ) -> BoxFuture<'a, Result<(), PartError>> {
        Box::pin(async move {
            let Target::Telegram { chat_id } = to;
            let sent = (self.client)
                .send_part(*chat_id, part, self.cfg.telegram.format)
                .await;
            sent.map(|_| ()).map_err(part_error)
        })
    }

    fn send_file<'a>(
        &'a self,
        to: &'a Target,
        path: &'a std::path::Path,
        kind: FileKind,
    ) -> BoxFuture<'a, Result<(), PartError>> {
        Box::pin(async move {
            let Target::Telegram { chat_id } = to;
            let kind = match kind {
                FileKind::Photo => TgFileKind::Photo,
                FileKind::Voice => TgFileKind::Voice,
                FileKind::Document => TgFileKind::Document,
            };
            let sent = self.client.send_file(*chat_id, path, kind, None).await;
            sent.map(|_| ()).map_err(part_error)
        })
    }

    fn react<'a>(
        &'a self,
        to: &'a Target,
        message_id: i32,
        emoji: &'a str,
    ) -> BoxFuture<'a, Result<(), PartError>> {
        Box::pin(async move {
            let Target::Telegram { chat_id } = to;
            let reacted = self.client.react(*chat_id, message_id, emoji).await;
            reacted.map_err(part_error)
        })
    }

    fn attempt_timeout(&self) -> std::time::Duration {
        self.cfg.telegram.poll_timeout + HTTP_TIMEOUT_SLACK
    }

    fn ask_approval<'a>(
        &'a self,
        to: &'a Target,
        text: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<i32, PartError>> {
        Box::pin(async move {
            let Target::Telegram { chat_id } = to;
            let sent = self.client.send_approval_prompt(*chat_id, text, id).await;
            sent.map_err(part_error)
        })
    }

    fn settle_approval<'a>(
        &'a self,
        to: &'a Target,
        message_id: i32,
        text: &'a str,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Target::Telegram { chat_id } = to;
            if let Err(e) = self.client.edit_text(*chat_id, message_id, text).await {
                tracing::warn!(error = %e, "telegram: cannot edit the approval prompt");
            }
        })
    }

    fn typing<'a>(&'a self, to: &'a Target) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Target::Telegram { chat_id } = to;
            if let Err(e) = self.client.send_typing(*chat_id).await {
                tracing::debug!(error = %e, "typing indicator failed");
            }
        })
    }
}

/// Start the poller (not waiting for Telegram: its health goes to the monitor): the health
/// relay starts here; the poll loop is returned for `sources` to run and watch (SPEC §16.7).
pub fn start_poller(
    client: TelegramClient,
    s: &Services,
    tasks: &Tasks,
) -> super::sources::SourceTask {
    let (cfg, db, monitor) = (s.cfg.clone(), s.db.clone(), s.monitor.clone());
    let live = s.live.clone();
    let (intake, dispatcher) = (s.intake.clone(), s.dispatcher.clone());
    let (tracker, stop) = (&tasks.tracker, tasks.stop.clone());
    let (health_tx, mut health_rx) = poll::health_channel();
    {
        let stop = stop.clone();
        tracker.spawn(async move {
            loop {
                let h = health_rx.borrow_and_update().clone();
                monitor.set_channel("telegram", serde_json::to_value(&h).unwrap_or_default());
                tokio::select! {
                    _ = stop.cancelled() => return,
                    r = health_rx.changed() => if r.is_err() { return },
                }
            }
        });
    }
    let outbound = dispatcher.outbound().unwrap_or_else(|| {
        Arc::new(TgOutbound::new(cfg.clone(), client.clone())) as Arc<dyn Outbound>
    });
    let sink = Arc::new(Sink {
        cfg: cfg.clone(),
        client: client.clone(),
        intake,
        dispatcher,
        outbound,
        tracker: tracker.clone(),
        approvals: s.approvals.clone(),
        live: live.clone(),
    });
    let tg_cfg = cfg.telegram.clone();
    let bot_id = client.bot_id();
    Box::pin(async move {
        poll::run_with(
            client,
            tg_cfg,
            Arc::new(DbOffsets(db, offset_key(bot_id))),
            sink,
            health_tx,
            stop,
            poll::PollOptions {
                live: Some(live),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| e.to_string())
    })
}
