//! `message` and `react` (SPEC §11): talk to contacts from the loop, through the [`Outbound`]
//! seam (the router: a contact is reached on its chat channel, [`Contacts`]). Registered only
//! when a chat channel runs. Attachments follow `read`'s path rules (`paths::open_for_read`).
//!
//! Both go through the outbox (SPEC §16.1, [`Outbox`]): retried like a reply, but within the
//! tool's own time ([`TOOL_RETRY_WINDOW`]), and recorded in the session's trail under a key
//! made of what is sent (`tool-<hash>`). The tool runs inside a message's turn; a kill -9 in
//! the middle leaves the turn to resume after the restart, and when the model asks for the
//! same send again in that turn, the records decide: parts `sent` are not sent again, a part
//! `attempt`ed without `sent` is never sent again (the model is told it may be missing), the
//! rest are sent. A send that completed is not repeated within the turn either.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::outbound::{
    Address, Contacts, FileKind, Outbound, Outbox, PartEnd, Piece, Progress, Window,
    send_with_retry,
};
use super::{Tool, ToolContext, ToolError, paths};
use crate::llm::ToolSpec;
use crate::message::Message;
use crate::session::{DeliveryStatus, Event, SessionHandle, SessionStore, TrailLine};

/// The longest a tool retries a send (less when `[delivery] retry_minutes` is shorter): the
/// model waits for the tool's answer, so its window is shorter than a reply's.
pub const TOOL_RETRY_WINDOW: Duration = Duration::from_secs(60);

#[derive(Clone)]
pub struct Messaging {
    /// The running config (`[delivery] retry_minutes`).
    pub cfg: crate::config::Live,
    pub outbound: Arc<dyn Outbound>,
    /// Who can be reached: follows a SIGHUP reload (SPEC §16.5).
    pub contacts: Contacts,
    pub sessions: Arc<SessionStore>,
}

impl Messaging {
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        vec![
            Arc::new(MessageTool(self.clone())),
            Arc::new(ReactTool(self.clone())),
        ]
    }

    /// How long a send of these tools is retried.
    fn window(&self) -> Duration {
        self.cfg.get().delivery.retry.min(TOOL_RETRY_WINDOW)
    }

    /// The tools' own timeout: the retry window, one more send in flight, and some slack.
    pub(super) fn timeout(&self) -> Duration {
        self.window() + self.outbound.attempt_timeout() + Duration::from_secs(10)
    }

    /// Send `pieces` to `to` through the outbox, recorded under a key made of `what` and
    /// `material` (see the module doc), and say how it went in words for the model.
    pub(super) async fn send(
        &self,
        ctx: &ToolContext,
        to: &Address,
        name: &str,
        what: &str,
        material: &str,
        pieces: Vec<Piece>,
    ) -> Result<String, ToolError> {
        let key = send_key(what, to, material);
        let window = Window {
            until: Instant::now() + self.window(),
            strict: true,
        };
        // The turn's run is what a shutdown cancels; the tool's future is dropped then.
        let never = CancellationToken::new();
        let Some((session, lines)) = self.trail_of(ctx).await else {
            // No session to record in (not expected inside a turn): retried, unrecorded.
            let mut n = 0;
            for piece in &pieces {
                let send = || piece.send(self.outbound.as_ref(), to);
                match send_with_retry(send, window.until, &never, what).await {
                    PartEnd::Sent => n += 1,
                    PartEnd::Closed(DeliveryStatus::Unknown, e) => {
                        return Err(ToolError::Failed(maybe_delivered(n, pieces.len(), &e)));
                    }
                    PartEnd::Closed(_, e) => return Err(ToolError::Failed(not_delivered(n, &e))),
                    PartEnd::Aborted => break,
                }
            }
            return Ok(format!("{what}: done ({n} of {} to {name})", pieces.len()));
        };
        let prior = prior_of(&lines, &key);
        let resume = match &prior {
            Some(Prior {
                closed: Some(DeliveryStatus::Done),
                ..
            }) => {
                return Ok(format!(
                    "{what}: already done for {name} earlier in this turn (the same request); not repeated"
                ));
            }
            Some(Prior {
                closed: Some(DeliveryStatus::Unknown),
                ..
            }) => {
                return Err(ToolError::Failed(format!(
                    "{what}: the same request to {name} was made earlier in this turn and may or may not have been delivered; not repeated"
                )));
            }
            Some(Prior {
                closed: None,
                progress,
            }) if progress.parts == Some(pieces.len()) => Some(progress),
            // Failed before, or begun as something else: a new delivery.
            _ => None,
        };
        let ids = [key];
        let outbox = Outbox {
            session: &session,
            out: self.outbound.as_ref(),
            target: to,
            ids: &ids,
            window,
            abort: &never,
        };
        let done = outbox.deliver(&pieces, resume, None).await;
        let n = pieces.len();
        let before = resume.map_or(0, |p| p.sent.len());
        let sent = before + done.sent;
        let detail = done.detail.unwrap_or_default();
        match done.status {
            Some(DeliveryStatus::Done) => Ok(format!("{what}: done ({sent} of {n} to {name})")),
            Some(DeliveryStatus::Unknown) if !done.uncertain.is_empty() => {
                let list: Vec<String> =
                    done.uncertain.iter().map(|i| (i + 1).to_string()).collect();
                Err(ToolError::Failed(format!(
                    "{what}: {sent} of {n} part(s) delivered to {name}; part(s) {} were being sent when agentd stopped and may or may not have been delivered (not sent again)",
                    list.join(", ")
                )))
            }
            Some(DeliveryStatus::Unknown) => {
                Err(ToolError::Failed(maybe_delivered(sent, n, &detail)))
            }
            Some(_) => Err(ToolError::Failed(not_delivered(sent, &detail))),
            None => Err(ToolError::Failed(format!(
                "{what}: stopped after {sent} of {n} part(s): the send could not be recorded, so nothing more was sent"
            ))),
        }
    }

    /// The session of this turn and its trail.
    pub(super) async fn trail_of(
        &self,
        ctx: &ToolContext,
    ) -> Option<(Arc<SessionHandle>, Vec<TrailLine>)> {
        let (sessions, key, id) = (
            self.sessions.clone(),
            ctx.session_key.clone(),
            ctx.session_id.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let h = sessions.get(&key).ok()??;
            if h.id != id {
                return None;
            }
            let lines = h.read_trail().ok()?;
            Some((h, lines))
        })
        .await
        .ok()
        .flatten()
    }

    /// The chat of contact `target`, on a channel that runs.
    fn chat_of(&self, target: &str) -> Result<Address, ToolError> {
        let Some(to) = self.contacts.address_of(target) else {
            return Err(ToolError::Invalid(format!(
                "unknown contact {target:?}; contacts: {}",
                self.contacts.names().join(", ")
            )));
        };
        if !self.outbound.serves(&to.channel) {
            return Err(ToolError::Failed(format!(
                "{target} is a contact on {}, which is not running here",
                to.channel
            )));
        }
        Ok(to)
    }
}

pub struct MessageTool(Messaging);
pub struct ReactTool(Messaging);

impl Tool for MessageTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "message".into(),
            description: "Send a message to a contact in their chat: text and/or files (photos, voice notes .ogg, documents) from the allowed paths or the inbox.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "target": {"type": "string", "minLength": 1, "description": "Contact name."},
                    "text": {"type": "string"},
                    "attachments": {"type": "array", "items": {"type": "string"}, "maxItems": 10}
                },
                "required": ["target"],
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
            let m = &self.0;
            let target = args["target"].as_str().unwrap_or_default();
            let chat = m.chat_of(target)?;
            let text = args["text"].as_str().unwrap_or_default();
            let files: Vec<PathBuf> = args["attachments"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>())
                .unwrap_or_default()
                .into_iter()
                // The read rules (SPEC §16.8): allowed paths or the state directory's inbox/,
                // never the config directory, .env or the rest of the state directory, and no
                // file with several hard links.
                .map(|p| {
                    paths::open_for_read(p, &ctx.workspace, &ctx.allowed_paths, &ctx.protected)
                        .map(|(resolved, _file)| resolved)
                })
                .collect::<Result<_, _>>()?;
            if text.trim().is_empty() && files.is_empty() {
                return Err(ToolError::Invalid("give text or attachments".into()));
            }
            let mut pieces: Vec<Piece> = match text.trim().is_empty() {
                true => Vec::new(),
                false => m
                    .outbound
                    .parts(&chat, text)
                    .into_iter()
                    .map(Piece::Text)
                    .collect(),
            };
            let mut material = format!("{text}\n");
            for f in &files {
                material.push_str(&format!("{}\n", f.display()));
                let kind = FileKind::for_path(f);
                pieces.push(Piece::File {
                    path: f.clone(),
                    kind,
                });
            }
            m.send(ctx, &chat, target, "message", &material, pieces)
                .await
        })
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.0.timeout())
    }
}

impl Tool for ReactTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "react".into(),
            description: "React with an emoji (e.g. 👍 ❤ 🔥 🎉 👀; Telegram allows only its own reaction set) to the last message a contact sent in their chat.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "target": {"type": "string", "minLength": 1, "description": "Contact name."},
                    "emoji": {"type": "string", "minLength": 1, "maxLength": 16}
                },
                "required": ["target", "emoji"],
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
            let m = &self.0;
            let target = args["target"].as_str().unwrap_or_default().to_string();
            let chat = m.chat_of(&target)?;
            let sessions = m.sessions.clone();
            let (key, at) = (target.clone(), chat.clone());
            // The contact's last message in that chat, from its session trail (the contact
            // name is its session key).
            let last = tokio::task::spawn_blocking(move || {
                let h = sessions.get(&key).ok()??;
                let lines = h.read_trail().ok()?;
                last_message_in(&lines, &at)
            })
            .await
            .ok()
            .flatten()
            .ok_or_else(|| {
                ToolError::Invalid(format!("{target} has no message in their chat to react to"))
            })?;
            let emoji = args["emoji"].as_str().unwrap_or_default();
            let material = format!("{last} {emoji}");
            let piece = Piece::Reaction {
                message: last,
                emoji: emoji.to_string(),
            };
            m.send(ctx, &chat, &target, "react", &material, vec![piece])
                .await
                .map(|_| format!("reacted {emoji} to {target}'s last message"))
        })
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.0.timeout())
    }
}

/// The id of the last message recorded in `lines` from chat `at`.
fn last_message_in(lines: &[TrailLine], at: &Address) -> Option<String> {
    lines.iter().rev().find_map(|l| match &l.event {
        Event::Intake(i) => {
            let route = i.route.as_ref()?;
            (route.address() == Some(at)).then(|| route.message().map(str::to_string))?
        }
        _ => None,
    })
}

/// The key a tool send is recorded under: the tool, the target and what is sent. Only the
/// chat (and thread) of the address go in: the key is looked up within one session's turn,
/// where chats of two channels never share an id, and a send recorded before neutral
/// addresses (a Telegram chat id) keeps its key.
fn send_key(what: &str, to: &Address, material: &str) -> String {
    let chat = match &to.thread {
        Some(t) => format!("{}/{t}", to.chat),
        None => to.chat.clone(),
    };
    let digest = Sha256::digest(format!("{what}\n{chat}\n{material}").as_bytes());
    let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
    format!("tool-{hex}")
}

/// An earlier send under the same key in this turn.
#[derive(Debug, PartialEq)]
struct Prior {
    progress: Progress,
    /// How it closed; `None`: open (agentd stopped in the middle of it).
    closed: Option<DeliveryStatus>,
}

/// The last delivery recorded under `key` since the turn's user message.
fn prior_of(lines: &[TrailLine], key: &str) -> Option<Prior> {
    let start = lines
        .iter()
        .rposition(
            |l| matches!(&l.event, Event::Message(m) if matches!(m.message, Message::User { .. })),
        )
        .map_or(0, |i| i + 1);
    let mut prior: Option<Prior> = None;
    for l in &lines[start..] {
        let Event::Delivery {
            reply_to,
            status,
            parts,
            part,
            ..
        } = &l.event
        else {
            continue;
        };
        if reply_to.first().map(String::as_str) != Some(key) {
            continue;
        }
        match status {
            DeliveryStatus::Intent => {
                prior = Some(Prior {
                    progress: Progress {
                        parts: *parts,
                        ..Default::default()
                    },
                    closed: None,
                })
            }
            s if s.closes() => {
                if let Some(p) = &mut prior {
                    p.closed = Some(*s);
                }
            }
            s => {
                if let Some(p) = &mut prior {
                    p.progress.record(*s, *part);
                }
            }
        }
    }
    prior
}

fn maybe_delivered(sent: usize, n: usize, detail: &str) -> String {
    format!(
        "{sent} of {n} part(s) delivered; one part may or may not have been delivered ({detail}); it was not sent again, and parts after it were not sent"
    )
}

fn not_delivered(sent: usize, detail: &str) -> String {
    format!("not delivered: {detail} ({sent} part(s) before it were delivered)")
}
