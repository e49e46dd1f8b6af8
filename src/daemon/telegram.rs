//! Wiring of the Telegram channel into the daemon: the poller's sink is durable intake (SPEC
//! §5.2: the offset advances only after the intake record is written, through
//! `channels::intake::IntakeSink`), the chat commands of `channels::commands` for allowed
//! users, approval buttons, media downloads into `inbox/`, the outbound side ([`TgOutbound`],
//! which the router reaches by the channel's name), the offset in `agentd.db`, and poller
//! health in the monitor. Its one line in the daemon is [`CHANNEL`] in `daemon::chat`.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::chat::{ChatChannel, OpenChannel};
use super::services::{Services, Tasks};
use super::sources::SourceTask;
use crate::channels::commands::{self, ChatCommand, Reply, SessionControl};
use crate::channels::intake::{AcceptError, IntakeSink};
use crate::channels::telegram::address::{self as tg, address, chat_id, message_ref};
use crate::channels::telegram::client::{
    FileKind as TgFileKind, HTTP_TIMEOUT_SLACK, SendFault, TelegramClient, TgError,
};
use crate::channels::telegram::inbound::{
    APPROVAL_BUTTON, MAX_CALLBACK_DATA, TgCallback, TgInbound, allowed, approval_button,
};
use crate::channels::telegram::poll::{self, OffsetStore, TgSink};
use crate::config::Config;
use crate::session::{Intake, Route};
use crate::store::Db;
use crate::tools::outbound::{Address, FileKind, Outbound, PartError, RetryPolicy};

/// Telegram in the daemon's list of chat channels.
pub const CHANNEL: ChatChannel = ChatChannel {
    name: tg::CHANNEL,
    book: tg::BOOK,
    enabled: |cfg| cfg.telegram.enabled,
    open,
};

/// The Telegram channel of this run: its client, shared by the poller and the outbound side.
struct Telegram {
    client: TelegramClient,
    outbound: Arc<dyn Outbound>,
}

fn open(cfg: &Arc<Config>) -> Result<Arc<dyn OpenChannel>, String> {
    let client = TelegramClient::new(&cfg.telegram).map_err(|e| format!("telegram: {e}"))?;
    let outbound = Arc::new(TgOutbound::new(cfg.clone(), client.clone()));
    Ok(Arc::new(Telegram { client, outbound }))
}

impl OpenChannel for Telegram {
    fn outbound(&self) -> Arc<dyn Outbound> {
        self.outbound.clone()
    }

    fn start(&self, s: &Services, tasks: &Tasks) -> SourceTask {
        start_poller(self.client.clone(), self.outbound.clone(), s, tasks)
    }
}

/// The answer to a Telegram message refused because its session's queue is full.
const BUSY_REPLY: &str =
    "I'm busy with earlier messages; this one was not taken. Please send it again in a moment.";

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
    intake: Arc<dyn IntakeSink>,
    /// What the chat commands act on (the session queues).
    control: Arc<dyn SessionControl>,
    /// Command and "busy" answers go out through it with the outbox's retries
    /// (`tools::outbound::send_text_with_retry`), unrecorded, as tasks of this tracker: the
    /// poller never waits on them.
    outbound: Arc<dyn Outbound>,
    retry: RetryPolicy,
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
            match self.approvals.offered_in(id, &address(cb.chat_id)) {
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
        match super::approvals::decide(&self.approvals, id, decision, &by, tg::CHANNEL) {
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
        let (out, policy) = (self.outbound.clone(), self.retry.clone());
        self.tracker
            .spawn(async move { send_answer(&*out, chat_id, &text, &policy, what).await });
    }

    /// A chat command (`channels::commands`) in `msg`'s chat: run now (a reset or a settings
    /// change is queued in order with the chat's next messages), answered in the background
    /// once its answer is ready (the poller does not wait for a message in flight). An answer
    /// with buttons gets them as an inline keyboard (one try; plain text otherwise).
    async fn command(&self, msg: &TgInbound, cmd: ChatCommand) {
        let answer = commands::run(&*self.control, &msg.session_key, tg::CHANNEL, cmd).await;
        let (client, out, policy) = (
            self.client.clone(),
            self.outbound.clone(),
            self.retry.clone(),
        );
        let chat = msg.chat_id;
        self.tracker.spawn(async move {
            let Reply { text, buttons } = answer.await;
            // Names too long for Telegram's callback data are left out: typed, they still work.
            let buttons: Vec<(String, String)> = buttons
                .into_iter()
                .filter(|b| b.data.len() <= MAX_CALLBACK_DATA)
                .map(|b| (b.label, b.data))
                .collect();
            if !buttons.is_empty() {
                match client.send_with_buttons(chat, &text, &buttons).await {
                    Ok(_) => return,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot send the buttons; answering in text")
                    }
                }
            }
            send_answer(&*out, chat, &text, &policy, "command answer").await;
        });
    }

    /// A settings button of a command's answer (`model:NAME`, `skill:on|off:NAME`, SPEC
    /// §18.2): changed through the session's queue, then, in the background, the press is
    /// answered and the chat told what changed.
    async fn settings_button(&self, cb: TgCallback) {
        let pressed = commands::press(&*self.control, &cb.session_key, tg::CHANNEL, &cb.data);
        let Some(answer) = pressed.await else {
            return;
        };
        let (client, out, policy) = (
            self.client.clone(),
            self.outbound.clone(),
            self.retry.clone(),
        );
        self.tracker.spawn(async move {
            let text = answer.await;
            if let Err(e) = client.answer_callback(&cb.query_id, &text).await {
                tracing::debug!(error = %e, "cannot answer a button press");
            }
            send_answer(&*out, cb.chat_id, &text, &policy, "command answer").await;
        });
    }
}

/// Send an unrecorded answer to chat `chat_id` with the outbox's retries; a failure is logged.
async fn send_answer(
    out: &dyn Outbound,
    chat_id: i64,
    text: &str,
    policy: &RetryPolicy,
    what: &'static str,
) {
    let to = address(chat_id);
    let sent = crate::tools::outbound::send_text_with_retry(out, &to, text, policy).await;
    if let Err(e) = sent {
        tracing::warn!(error = %e, what, "cannot send a Telegram answer");
    }
}

impl TgSink for Sink {
    fn callback(&self, cb: TgCallback) -> BoxFuture<'_, ()> {
        Box::pin(async move {
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
            self.settings_button(cb).await;
        })
    }

    fn accept(&self, msg: TgInbound) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            if let Some(cmd) = msg.is_command.clone() {
                self.command(&msg, cmd).await;
                return Ok(());
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
                route: Some(Route::Chat {
                    to: address(msg.chat_id),
                    message: Some(message_ref(msg.message_id)),
                }),
                notify_meta: None,
                relayed_from: None,
            };
            match self.intake.accept(&msg.session_key, intake).await {
                Ok(accepted) => {
                    if self.cfg.voice.echo_transcript {
                        for t in accepted.transcripts {
                            self.answer(msg.chat_id, format!("🎙 “{t}”"), "transcript echo");
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

/// The chat id of `to`, or the outbox's refusal naming it.
fn chat_of(to: &Address) -> Result<i64, PartError> {
    chat_id(to).map_err(PartError::Failed)
}

impl Outbound for TgOutbound {
    fn parts(&self, _to: &Address, text: &str) -> Vec<String> {
        TelegramClient::parts(text, self.cfg.telegram.text_chunk_limit)
    }

    fn send_part<'a>(
        &'a self,
        to: &'a Address,
        part: &'a str,
    ) -> BoxFuture<'a, Result<(), PartError>> {
        Box::pin(async move {
            let chat = chat_of(to)?;
            let sent = (self.client)
                .send_part(chat, part, self.cfg.telegram.format)
                .await;
            sent.map(|_| ()).map_err(part_error)
        })
    }

    fn send_file<'a>(
        &'a self,
        to: &'a Address,
        path: &'a std::path::Path,
        kind: FileKind,
    ) -> BoxFuture<'a, Result<(), PartError>> {
        Box::pin(async move {
            let chat = chat_of(to)?;
            let kind = match kind {
                FileKind::Photo => TgFileKind::Photo,
                FileKind::Voice => TgFileKind::Voice,
                FileKind::Document => TgFileKind::Document,
            };
            let sent = self.client.send_file(chat, path, kind, None).await;
            sent.map(|_| ()).map_err(part_error)
        })
    }

    fn react<'a>(
        &'a self,
        to: &'a Address,
        message: &'a str,
        emoji: &'a str,
    ) -> BoxFuture<'a, Result<(), PartError>> {
        Box::pin(async move {
            let chat = chat_of(to)?;
            let message = tg::message_id(message).map_err(PartError::Failed)?;
            let reacted = self.client.react(chat, message, emoji).await;
            reacted.map_err(part_error)
        })
    }

    fn attempt_timeout(&self) -> std::time::Duration {
        self.cfg.telegram.poll_timeout + HTTP_TIMEOUT_SLACK
    }

    fn ask_approval<'a>(
        &'a self,
        to: &'a Address,
        text: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<String, PartError>> {
        Box::pin(async move {
            let chat = chat_of(to)?;
            let sent = self.client.send_approval_prompt(chat, text, id).await;
            sent.map(message_ref).map_err(part_error)
        })
    }

    fn settle_approval<'a>(
        &'a self,
        to: &'a Address,
        message: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let (Ok(chat), Ok(message)) = (chat_of(to), tg::message_id(message)) else {
                return;
            };
            if let Err(e) = self.client.edit_text(chat, message, text).await {
                tracing::warn!(error = %e, "telegram: cannot edit the approval prompt");
            }
        })
    }

    fn typing<'a>(&'a self, to: &'a Address) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Ok(chat) = chat_of(to) else { return };
            if let Err(e) = self.client.send_typing(chat).await {
                tracing::debug!(error = %e, "typing indicator failed");
            }
        })
    }
}

/// Start the poller (not waiting for Telegram: its health goes to the monitor): the health
/// relay starts here; the poll loop is returned for `sources` to run and watch (SPEC §16.7).
fn start_poller(
    client: TelegramClient,
    outbound: Arc<dyn Outbound>,
    s: &Services,
    tasks: &Tasks,
) -> SourceTask {
    let (cfg, db, monitor) = (s.cfg.clone(), s.db.clone(), s.monitor.clone());
    let live = s.live.clone();
    let (tracker, stop) = (&tasks.tracker, tasks.stop.clone());
    let (health_tx, mut health_rx) = poll::health_channel();
    {
        let stop = stop.clone();
        tracker.spawn(async move {
            loop {
                let h = health_rx.borrow_and_update().clone();
                monitor.set_channel(tg::CHANNEL, serde_json::to_value(&h).unwrap_or_default());
                tokio::select! {
                    _ = stop.cancelled() => return,
                    r = health_rx.changed() => if r.is_err() { return },
                }
            }
        });
    }
    let sink = Arc::new(Sink {
        cfg: cfg.clone(),
        client: client.clone(),
        intake: s.intake.clone(),
        control: s.intake.clone(),
        outbound,
        retry: s.dispatcher.delivery_retry(),
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
