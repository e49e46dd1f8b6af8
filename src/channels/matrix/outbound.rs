//! The outbound seam on Matrix (SPEC §16.1, §21): text parts as `m.text` with a
//! `formatted_body` (HTML from the reply's Markdown, Telegram's renderer: its tags are all
//! Matrix HTML), files and voice (`m.audio` for the OGG of `tts`), reactions, typing, and
//! approval prompts answered by reaction. Every send's transaction id derives from the
//! outbox's delivery record (`tools::outbound::send_key`), so a resend of the same part is the
//! same transaction and the homeserver posts it once.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use matrix_sdk::attachment::AttachmentConfig;
use matrix_sdk::ruma::events::reaction::ReactionEventContent;
use matrix_sdk::ruma::events::relation::Annotation;
use matrix_sdk::ruma::events::room::message::RoomMessageEventContent;
use matrix_sdk::ruma::{EventId, OwnedTransactionId};
use tokio::sync::OnceCell;

use super::address::{target, txn_id};
use super::client::{MxClient, MxError, REQUEST_TIMEOUT};
use crate::channels::telegram::format::{markdown_to_html, strip_to_plain};
use crate::channels::telegram::split::split_message;
use crate::tools::outbound::{Address, FileKind, Outbound, PartError, send_key};

/// The largest file sent.
pub const MAX_UPLOAD_BYTES: u64 = 50 * 1024 * 1024;
/// Sent event ids remembered, so reactions to the bot's messages are recognised.
const REMEMBERED: usize = 512;

/// The client, once the sync task has logged in (sends before that are retried).
pub type Shared = Arc<OnceCell<MxClient>>;

/// What the bot sent lately: its own events, and the approval prompts by event id.
#[derive(Default)]
pub struct Sent {
    own: VecDeque<String>,
    prompts: HashMap<String, String>,
}

impl Sent {
    fn remember(&mut self, event_id: &str) {
        if self.own.len() >= REMEMBERED {
            self.own.pop_front();
        }
        self.own.push_back(event_id.to_string());
    }

    /// Whether `event_id` is one of the bot's recent messages.
    pub fn is_own(&self, event_id: &str) -> bool {
        self.own.iter().any(|e| e == event_id)
    }

    /// The approval asked by prompt `event_id`.
    pub fn approval(&self, event_id: &str) -> Option<String> {
        self.prompts.get(event_id).cloned()
    }
}

/// The Matrix side of the outbound router.
pub struct MxOutbound {
    pub client: Shared,
    pub text_chunk_limit: usize,
    pub sent: Arc<Mutex<Sent>>,
}

/// What a failed call means for the outbox. With a transaction id a resend is the same
/// transaction, so even a lost answer is safe to retry.
pub fn part_error(e: MxError) -> PartError {
    match e {
        MxError::Retry { after, error } => PartError::Retry { after, error },
        MxError::Unauthorized(e) => {
            PartError::Failed(format!("{e} (the access token was refused)"))
        }
        MxError::Fatal(e) => PartError::Failed(e),
    }
}

/// The transaction id of this send: from the delivery record, else a fresh one.
fn txn(kind: &str) -> OwnedTransactionId {
    let id = match send_key() {
        Some(key) => txn_id(kind, &key),
        None => format!("agentd-{}", uuid::Uuid::new_v4().simple()),
    };
    id.into()
}

/// A part's `formatted_body`: Telegram's renderer (its text is escaped, so every `<` left is
/// one of its tags), with the tags Matrix recommends for bold, italic and strike-through.
pub fn html(part: &str) -> String {
    markdown_to_html(part)
        .replace("<b>", "<strong>")
        .replace("</b>", "</strong>")
        .replace("<i>", "<em>")
        .replace("</i>", "</em>")
        .replace("<s>", "<del>")
        .replace("</s>", "</del>")
}

/// The MIME type of a file sent as `kind`, from its extension.
pub fn mime_of(path: &Path, kind: FileKind) -> &'static str {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    match ext.as_str() {
        "jpg" | "jpeg" => "image/jpeg",
        "png" => "image/png",
        "webp" => "image/webp",
        "gif" => "image/gif",
        "ogg" | "oga" | "opus" => "audio/ogg",
        "mp3" => "audio/mpeg",
        "pdf" => "application/pdf",
        "txt" | "md" => "text/plain",
        _ if kind == FileKind::Voice => "audio/ogg",
        _ => "application/octet-stream",
    }
}

impl MxOutbound {
    fn client(&self) -> Result<&MxClient, PartError> {
        self.client.get().ok_or_else(|| PartError::Retry {
            after: Some(Duration::from_secs(2)),
            error: "the Matrix channel is not logged in yet".into(),
        })
    }

    async fn room(&self, to: &Address) -> Result<matrix_sdk::Room, PartError> {
        let target = target(to).map_err(PartError::Failed)?;
        self.client()?.room_for(target).await.map_err(part_error)
    }

    /// Send one text part; the event id.
    pub async fn text(&self, to: &Address, part: &str, kind: &str) -> Result<String, PartError> {
        let room = self.room(to).await?;
        let content = RoomMessageEventContent::text_html(strip_to_plain(part), html(part));
        let sent = room.send(content).with_transaction_id(txn(kind)).await;
        let id = sent
            .map_err(|e| part_error(e.into()))?
            .response
            .event_id
            .to_string();
        self.lock().remember(&id);
        Ok(id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sent> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Outbound for MxOutbound {
    fn parts(&self, _to: &Address, text: &str) -> Vec<String> {
        split_message(text, self.text_chunk_limit)
            .into_iter()
            .filter(|c| !c.trim().is_empty())
            .collect()
    }

    fn send_part<'a>(
        &'a self,
        to: &'a Address,
        part: &'a str,
    ) -> BoxFuture<'a, Result<(), PartError>> {
        Box::pin(async move { self.text(to, part, "text").await.map(|_| ()) })
    }

    fn send_file<'a>(
        &'a self,
        to: &'a Address,
        path: &'a Path,
        kind: FileKind,
    ) -> BoxFuture<'a, Result<(), PartError>> {
        Box::pin(async move {
            let size = tokio::fs::metadata(path)
                .await
                .map_err(|e| PartError::Failed(format!("cannot read {}: {e}", path.display())))?
                .len();
            if size > MAX_UPLOAD_BYTES {
                return Err(PartError::Failed(format!(
                    "{} has {size} bytes; at most {MAX_UPLOAD_BYTES} are sent",
                    path.display()
                )));
            }
            let data = tokio::fs::read(path)
                .await
                .map_err(|e| PartError::Failed(format!("cannot read {}: {e}", path.display())))?;
            let room = self.room(to).await?;
            let mime = mime_of(path, kind)
                .parse()
                .map_err(|_| PartError::Failed("bad MIME type".into()))?;
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("file")
                .to_string();
            let config = AttachmentConfig::new().txn_id(txn("file"));
            let sent = room.send_attachment(name, &mime, data, config).await;
            let id = sent.map_err(|e| part_error(e.into()))?.event_id.to_string();
            self.lock().remember(&id);
            Ok(())
        })
    }

    fn react<'a>(
        &'a self,
        to: &'a Address,
        message: &'a str,
        emoji: &'a str,
    ) -> BoxFuture<'a, Result<(), PartError>> {
        Box::pin(async move {
            let event = EventId::parse(message)
                .map_err(|_| PartError::Failed(format!("{message:?} is not a Matrix event id")))?;
            let room = self.room(to).await?;
            let content = ReactionEventContent::new(Annotation::new(event, emoji.to_string()));
            let sent = room.send(content).with_transaction_id(txn("react")).await;
            sent.map(|_| ()).map_err(|e| part_error(e.into()))
        })
    }

    fn typing<'a>(&'a self, to: &'a Address) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Ok(room) = self.room(to).await else {
                return;
            };
            if let Err(e) = room.typing_notice(true).await {
                tracing::debug!(error = %e, "matrix: typing notice failed");
            }
        })
    }

    fn attempt_timeout(&self) -> Duration {
        REQUEST_TIMEOUT + Duration::from_secs(5)
    }

    /// `PUT …/send/{type}/{txnId}` is idempotent per device: the txn id comes from the send key.
    fn idempotent_sends(&self, _to: &Address) -> bool {
        true
    }

    fn ask_approval<'a>(
        &'a self,
        to: &'a Address,
        text: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<String, PartError>> {
        Box::pin(async move {
            let prompt = format!(
                "{text}\n\nReact ✅ to approve, 🔁 to approve for this session, ❌ to deny (or reply `approve` / `deny`)."
            );
            let event = self.text(to, &prompt, "approval").await?;
            self.lock().prompts.insert(event.clone(), id.to_string());
            Ok(event)
        })
    }

    fn settle_approval<'a>(
        &'a self,
        to: &'a Address,
        message: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.lock().prompts.remove(message);
            let Ok(room) = self.room(to).await else {
                return;
            };
            // An edit of the prompt (`m.replace`): clients show the decision in its place.
            let edit = serde_json::json!({
                "msgtype": "m.notice",
                "body": format!("* {text}"),
                "m.new_content": {"msgtype": "m.notice", "body": text},
                "m.relates_to": {"rel_type": "m.replace", "event_id": message},
            });
            if let Err(e) = room.send_raw("m.room.message", edit).await {
                tracing::warn!(error = %e, "matrix: cannot edit the approval prompt");
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatted_bodies_use_matrix_tags() {
        assert_eq!(
            html("Hello **Alice**, *b* ~~c~~"),
            "Hello <strong>Alice</strong>, <em>b</em> <del>c</del>"
        );
        assert_eq!(html("a <b> tag"), "a &lt;b&gt; tag");
        assert_eq!(strip_to_plain("Hello **Alice**!"), "Hello Alice!");
    }

    #[test]
    fn mime_types_follow_the_extension() {
        assert_eq!(mime_of(Path::new("v.ogg"), FileKind::Voice), "audio/ogg");
        assert_eq!(mime_of(Path::new("a.PNG"), FileKind::Photo), "image/png");
        assert_eq!(
            mime_of(Path::new("r"), FileKind::Document),
            "application/octet-stream"
        );
    }

    #[test]
    fn sent_events_are_remembered_within_a_bound() {
        let mut s = Sent::default();
        for i in 0..REMEMBERED + 10 {
            s.remember(&format!("$e{i}"));
        }
        assert!(!s.is_own("$e0"));
        assert!(s.is_own(&format!("$e{}", REMEMBERED + 9)));
    }
}
