//! Wiring of the Matrix channel into the daemon (SPEC §21): the login and the sync loop as a
//! source (its token in `agentd.db`, saved after durable intake), the sink that records
//! messages of allowed users (`channels::intake::IntakeSink`), runs the chat commands of
//! `channels::commands`, decides approvals answered by reaction or reply
//! (`daemon::approvals::decide`), takes images, files and audio into `inbox/`, and answers
//! what it cannot read; the outbound side is `channels::matrix::outbound`. Health goes to the
//! monitor. Its one line in the daemon is [`CHANNEL`] in `daemon::chat`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::chat::{ChatChannel, OpenChannel};
use super::services::{Services, Tasks};
use super::sources::SourceTask;
use crate::channels::commands::{self, ChatCommand, SessionControl};
use crate::channels::intake::{AcceptError, IntakeSink};
use crate::channels::matrix::address::{self as mx, address, intake_id, session_key};
use crate::channels::matrix::client::{MxClient, MxError};
use crate::channels::matrix::inbound::{Kind, MediaKind, MxEvent, with_quote};
use crate::channels::matrix::media::Media;
use crate::channels::matrix::outbound::{MxOutbound, Sent, Shared};
use crate::channels::matrix::sync::{self, MxSink, SyncHealth, SyncLoop, SyncState, TokenStore};
use crate::config::{Config, Live};
use crate::session::approval::Decision;
use crate::session::{Intake, Route};
use crate::store::Db;
use crate::tools::outbound::{Outbound, RetryPolicy};

/// Matrix in the daemon's list of chat channels.
pub const CHANNEL: ChatChannel = ChatChannel {
    name: mx::CHANNEL,
    book: mx::BOOK,
    enabled: |cfg| cfg.matrix.enabled,
    open,
};

/// The notice for an event that could not be decrypted (SPEC §21).
pub const UNDECRYPTABLE: &str = "I could not decrypt your message; verify this device or resend.";

const BUSY_REPLY: &str =
    "I'm busy with earlier messages; this one was not taken. Please send it again in a moment.";

/// The Matrix channel of this run: the client (set once the sync task logged in) and the
/// outbound side.
struct Matrix {
    client: Shared,
    outbound: Arc<MxOutbound>,
}

fn open(cfg: &Arc<Config>) -> Result<Arc<dyn OpenChannel>, String> {
    let client = Shared::default();
    let outbound = Arc::new(MxOutbound {
        client: client.clone(),
        text_chunk_limit: cfg.matrix.text_chunk_limit,
        sent: Arc::new(Mutex::new(Sent::default())),
    });
    Ok(Arc::new(Matrix { client, outbound }))
}

impl OpenChannel for Matrix {
    fn outbound(&self) -> Arc<dyn Outbound> {
        self.outbound.clone()
    }

    fn start(&self, s: &Services, tasks: &Tasks) -> SourceTask {
        start(self.client.clone(), self.outbound.clone(), s, tasks)
    }
}

/// The sync token belongs to one account.
struct DbTokens(Db, String);

impl TokenStore for DbTokens {
    fn load(&self) -> BoxFuture<'_, Option<String>> {
        Box::pin(async move {
            match self.0.kv_get(&self.1).await {
                Ok(v) => v,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the Matrix sync token; starting afresh");
                    None
                }
            }
        })
    }

    fn save(&self, token: &str) -> BoxFuture<'_, ()> {
        let token = token.to_string();
        Box::pin(async move {
            if let Err(e) = self.0.kv_set(&self.1, &token).await {
                tracing::error!(error = %e, "cannot save the Matrix sync token");
            }
        })
    }
}

/// Log in, retrying what may pass (a refused token or a fatal error is logged once, the
/// health red, and tried again at the longest interval: no restart loop). `None` at stop.
async fn connect(
    cfg: &Config,
    health: &watch::Sender<SyncHealth>,
    stop: &CancellationToken,
) -> Option<MxClient> {
    let mut backoff =
        crate::backoff::Backoff::exponential(Duration::from_secs(1), Duration::from_secs(60))
            .honouring_retry_after();
    let mut logged = false;
    loop {
        let wait = match MxClient::connect(&cfg.matrix, &cfg.paths.state_dir).await {
            Ok(c) => return Some(c),
            Err(MxError::Retry { after, error }) => {
                let d = backoff.next_delay_after(after);
                tracing::warn!(error = %error, retry_in_ms = d.as_millis() as u64, "matrix: cannot log in yet");
                health.send_modify(|h| {
                    h.state = SyncState::Retrying;
                    h.last_error = Some(error);
                });
                d
            }
            Err(e) => {
                let unauthorized = matches!(e, MxError::Unauthorized(_));
                let alert = if unauthorized {
                    format!(
                        "the Matrix homeserver refused the access token: set a valid token in {} and restart",
                        cfg.matrix.token_env
                    )
                } else {
                    format!("the Matrix channel cannot start: {e}")
                };
                if !logged {
                    tracing::error!(token_env = %cfg.matrix.token_env, "ALERT: {alert}");
                    logged = true;
                }
                health.send_modify(|h| {
                    h.healthy = false;
                    h.state = if unauthorized {
                        SyncState::Unauthorized
                    } else {
                        SyncState::Retrying
                    };
                    h.alert = Some(alert);
                    h.last_error = Some(e.to_string());
                });
                Duration::from_secs(60)
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Start the channel's source: health relay now; login and the sync loop in the returned
/// task, which `sources` runs and watches (SPEC §16.7).
fn start(shared: Shared, out: Arc<MxOutbound>, s: &Services, tasks: &Tasks) -> SourceTask {
    let (cfg, db, monitor, live) = (
        s.cfg.clone(),
        s.db.clone(),
        s.monitor.clone(),
        s.live.clone(),
    );
    let (tracker, stop) = (tasks.tracker.clone(), tasks.stop.clone());
    let (health_tx, mut health_rx) = sync::health_channel();
    {
        let stop = stop.clone();
        tracker.spawn(async move {
            loop {
                let h = health_rx.borrow_and_update().clone();
                monitor.set_channel(mx::CHANNEL, serde_json::to_value(&h).unwrap_or_default());
                tokio::select! {
                    _ = stop.cancelled() => return,
                    r = health_rx.changed() => if r.is_err() { return },
                }
            }
        });
    }
    let (intake, retry, approvals) = (
        s.intake.clone(),
        s.dispatcher.delivery_retry(),
        s.approvals.clone(),
    );
    Box::pin(async move {
        let Some(client) = connect(&cfg, &health_tx, &stop).await else {
            return Ok(());
        };
        tracing::info!(user = %client.user_id, device = %client.device_id, "matrix: logged in");
        let _ = shared.set(client.clone());
        if let Some(key) = &cfg.matrix.recovery_key {
            use secrecy::ExposeSecret;
            match client.recover(key.expose_secret()).await {
                Ok(()) => {
                    tracing::info!("matrix: recovered the account's keys; this device is verified")
                }
                Err(e) => {
                    tracing::error!(error = %e, "matrix: recovery with {} failed; the device stays unverified", cfg.matrix.recovery_key_env)
                }
            }
        }
        let verified = client.device_verified().await;
        health_tx.send_modify(|h| h.device_verified = verified);
        let sink = Arc::new(Sink {
            cfg: cfg.clone(),
            live: live.clone(),
            client: client.clone(),
            intake: intake.clone(),
            control: intake,
            outbound: out.clone(),
            retry,
            tracker,
            approvals,
        });
        let key = format!("matrix.{}.next_batch", client.user_id);
        SyncLoop {
            client,
            live,
            tokens: Arc::new(DbTokens(db, key)),
            sink,
            health: health_tx,
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
        }
        .run(stop)
        .await;
        Ok(())
    })
}

struct Sink {
    cfg: Arc<Config>,
    live: Live,
    client: MxClient,
    intake: Arc<dyn IntakeSink>,
    control: Arc<dyn SessionControl>,
    outbound: Arc<MxOutbound>,
    retry: RetryPolicy,
    tracker: tokio_util::task::TaskTracker,
    approvals: Arc<crate::tools::approval::Approvals>,
}

/// The decision a reaction or a reply names, if any.
pub fn decision_of(answer: &str) -> Option<Decision> {
    let a = answer.trim().trim_end_matches('\u{fe0f}').to_lowercase();
    match a.as_str() {
        "✅" | "✔" | "👍" | "approve" | "yes" => Some(Decision::Approve),
        "🔁" | "always" => Some(Decision::Always),
        "❌" | "👎" | "deny" | "no" => Some(Decision::Deny),
        _ => None,
    }
}

impl Sink {
    /// Send `text` to `room_id` in the background with the outbox's retries (unrecorded).
    fn answer(&self, room_id: &str, text: String, what: &'static str) {
        let (out, policy, to) = (self.outbound.clone(), self.retry.clone(), address(room_id));
        self.tracker.spawn(async move {
            let sent =
                crate::tools::outbound::send_text_with_retry(&*out, &to, &text, &policy).await;
            if let Err(e) = sent {
                tracing::warn!(error = %e, what, "cannot send a Matrix answer");
            }
        });
    }

    /// Approval `id` answered by `sender` in `room_id` (SPEC §18.1): decided once, by an
    /// allowed user (the sync loop lets no one else through) in the room it was asked in.
    fn decide(&self, room_id: &str, sender: &str, id: &str, decision: Decision) {
        use crate::tools::approval::DecideError;
        let text = match self.approvals.offered_in(id, &address(room_id)) {
            None => "This approval is no longer waiting.".to_string(),
            Some(false) => {
                tracing::warn!(sender, room = %room_id, approval = %id, "matrix: approval answered outside its room; refused");
                "This approval was asked in another room.".to_string()
            }
            Some(true) => {
                match super::approvals::decide(&self.approvals, id, decision, sender, mx::CHANNEL) {
                    Ok(_) => return,
                    Err(DecideError::AlreadyDecided { decision, .. }) => {
                        format!("Already decided: {decision}.")
                    }
                    Err(DecideError::Unknown(_)) => {
                        "This approval is no longer waiting.".to_string()
                    }
                }
            }
        };
        self.answer(room_id, text, "approval answer");
    }

    async fn command(&self, room_id: &str, cmd: ChatCommand) {
        let key = session_key(room_id);
        let answer = commands::run(&*self.control, &key, mx::CHANNEL, cmd).await;
        let (out, policy, to) = (self.outbound.clone(), self.retry.clone(), address(room_id));
        self.tracker.spawn(async move {
            let text = answer.await.text;
            let sent =
                crate::tools::outbound::send_text_with_retry(&*out, &to, &text, &policy).await;
            if let Err(e) = sent {
                tracing::warn!(error = %e, "cannot send a Matrix command answer");
            }
        });
    }

    /// Record a message of `sender` in `room_id`'s session; read receipt once recorded.
    async fn record(
        &self,
        room_id: &str,
        ev: &MxEvent,
        text: String,
        attachments: Vec<String>,
    ) -> Result<(), String> {
        if text.trim().is_empty() && attachments.is_empty() {
            return Ok(());
        }
        let intake = Intake {
            id: intake_id(&ev.event_id),
            source: crate::control::Source::Matrix,
            from: ev.sender.clone(),
            text,
            tier: None,
            attachments,
            route: Some(Route::Chat {
                to: address(room_id),
                message: Some(ev.event_id.clone()),
            }),
            notify_meta: None,
            relayed_from: None,
        };
        match self.intake.accept(&session_key(room_id), intake).await {
            Ok(accepted) => {
                let (client, room, event) = (
                    self.client.clone(),
                    room_id.to_string(),
                    ev.event_id.clone(),
                );
                self.tracker
                    .spawn(async move { client.read_receipt(&room, &event).await });
                if self.cfg.voice.echo_transcript {
                    for t in accepted.transcripts {
                        self.answer(room_id, format!("🎙 “{t}”"), "transcript echo");
                    }
                }
                Ok(())
            }
            Err(AcceptError::Busy(_)) => {
                self.answer(room_id, BUSY_REPLY.to_string(), "busy answer");
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// An image, a file or audio: downloaded into `inbox/` (audio is transcribed at intake).
    async fn media(&self, room_id: &str, ev: &MxEvent) -> Result<(), String> {
        let Kind::Media {
            kind,
            body,
            size,
            mimetype,
            source,
        } = &ev.kind
        else {
            return Ok(());
        };
        // Offered again after a crash although recorded: nothing to download.
        if self
            .intake
            .is_recorded(&session_key(room_id), &intake_id(&ev.event_id))
            .await
        {
            return Ok(());
        }
        let media = Media {
            event_id: &ev.event_id,
            source,
            size: *size,
            body,
            default_ext: kind.default_ext(mimetype.as_deref()),
        };
        let inbox = self.cfg.paths.state_dir.join("inbox");
        let max = self
            .live
            .get()
            .matrix
            .max_download_bytes
            .min(self.cfg.matrix.max_download_bytes);
        let (text, attachments) = match self.client.download(&media, &inbox, max).await {
            Ok(path) => (caption(*kind, body), vec![path.display().to_string()]),
            Err(e) => {
                tracing::warn!(error = %e, event = %ev.event_id, "matrix: download failed");
                (
                    format!("{body}\n[attachment could not be downloaded: {e}]"),
                    Vec::new(),
                )
            }
        };
        self.record(room_id, ev, text, attachments).await
    }
}

/// The text that goes with a download: the sender's caption when it is not just the file name.
fn caption(kind: MediaKind, body: &str) -> String {
    let is_name = !body.contains(char::is_whitespace) && body.contains('.');
    match (kind, is_name) {
        (MediaKind::Audio, _) | (_, true) => String::new(),
        _ => body.to_string(),
    }
}

impl MxSink for Sink {
    fn event<'a>(&'a self, room_id: &'a str, ev: MxEvent) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            match &ev.kind {
                Kind::Undecryptable => {
                    tracing::warn!(event = %ev.event_id, room = %room_id, sender = %ev.sender, "matrix: cannot decrypt an event");
                    if self.cfg.matrix.encryption {
                        self.answer(room_id, UNDECRYPTABLE.to_string(), "undecryptable notice");
                    }
                    Ok(())
                }
                Kind::Unsupported { msgtype } => {
                    let text = format!(
                        "I cannot read messages of type {msgtype}; send text, an image, a file or audio."
                    );
                    self.answer(room_id, text, "unsupported notice");
                    Ok(())
                }
                Kind::Reaction { to, key } => {
                    let (prompt, own) = {
                        let sent = self.outbound.sent.lock().unwrap_or_else(|p| p.into_inner());
                        (sent.approval(to), sent.is_own(to))
                    };
                    match (prompt, decision_of(key)) {
                        (Some(id), Some(d)) => self.decide(room_id, &ev.sender, &id, d),
                        (Some(_), None) => {}
                        (None, _) if own => {
                            let text = format!("[reacted {key} to your message]");
                            return self.record(room_id, &ev, text, Vec::new()).await;
                        }
                        (None, _) => {}
                    }
                    Ok(())
                }
                Kind::Media { .. } => self.media(room_id, &ev).await,
                Kind::Text {
                    text,
                    edit_of,
                    reply_to,
                    quoted,
                } => {
                    let prompt = reply_to.as_deref().and_then(|r| {
                        let sent = self.outbound.sent.lock().unwrap_or_else(|p| p.into_inner());
                        sent.approval(r)
                    });
                    if let Some(id) = prompt
                        && let Some(d) = decision_of(text)
                    {
                        self.decide(room_id, &ev.sender, &id, d);
                        return Ok(());
                    }
                    if edit_of.is_none()
                        && let Some(cmd) = commands::parse(text)
                    {
                        self.command(room_id, cmd).await;
                        return Ok(());
                    }
                    let mut text = with_quote(text, quoted.as_deref());
                    if edit_of.is_some() {
                        text = format!("[edited] {text}");
                    }
                    self.record(room_id, &ev, text, Vec::new()).await
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reactions_and_replies_name_decisions() {
        assert_eq!(decision_of("✅"), Some(Decision::Approve));
        assert_eq!(decision_of("✔\u{fe0f}"), Some(Decision::Approve));
        assert_eq!(decision_of("🔁"), Some(Decision::Always));
        assert_eq!(decision_of("❌"), Some(Decision::Deny));
        assert_eq!(decision_of(" Approve "), Some(Decision::Approve));
        assert_eq!(decision_of("deny"), Some(Decision::Deny));
        assert_eq!(decision_of("🎉"), None);
        assert_eq!(decision_of("approve this please"), None);
    }

    #[test]
    fn captions_are_not_file_names() {
        assert_eq!(caption(MediaKind::Image, "IMG_1.jpg"), "");
        assert_eq!(caption(MediaKind::Image, "what is this?"), "what is this?");
        assert_eq!(caption(MediaKind::Audio, "voice message"), "");
    }
}
