//! `message` and `react` (SPEC §11): talk to Telegram contacts from the loop, through the
//! [`Outbound`] seam. Registered only when Telegram is configured. Attachments follow `read`'s
//! path rules (`paths::open_for_read`).

use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::outbound::{FileKind, Outbound, Target};
use super::{Tool, ToolContext, ToolError, paths};
use crate::config::Config;
use crate::llm::ToolSpec;
use crate::session::{Event, Route, SessionStore};

#[derive(Clone)]
pub struct Messaging {
    pub cfg: Arc<Config>,
    pub outbound: Arc<dyn Outbound>,
    pub sessions: Arc<SessionStore>,
}

impl Messaging {
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        vec![
            Arc::new(MessageTool(self.clone())),
            Arc::new(ReactTool(self.clone())),
        ]
    }

    fn chat_of(&self, target: &str) -> Result<Target, ToolError> {
        self.cfg
            .telegram
            .contacts
            .get(target)
            .map(|chat_id| Target::Telegram { chat_id: *chat_id })
            .ok_or_else(|| {
                ToolError::Invalid(format!(
                    "unknown contact {target:?}; contacts: {}",
                    self.cfg
                        .telegram
                        .contacts
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }
}

pub struct MessageTool(Messaging);
pub struct ReactTool(Messaging);

impl Tool for MessageTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "message".into(),
            description: "Send a Telegram message to a contact: text and/or files (photos, voice notes .ogg, documents) from the allowed paths or the inbox.".into(),
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
            let mut sent = 0;
            if !text.trim().is_empty() {
                sent += m
                    .outbound
                    .send_text(&chat, text)
                    .await
                    .map_err(ToolError::Failed)?;
            }
            for f in &files {
                m.outbound
                    .send_file(&chat, f, FileKind::for_path(f))
                    .await
                    .map_err(|e| ToolError::Failed(format!("{}: {e}", f.display())))?;
                sent += 1;
            }
            Ok(format!("sent {sent} message(s) to {target}"))
        })
    }
}

impl Tool for ReactTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "react".into(),
            description: "React with an emoji (from Telegram's reaction set, e.g. 👍 ❤ 🔥 🎉 👀) to the last message a contact sent.".into(),
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
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let m = &self.0;
            let target = args["target"].as_str().unwrap_or_default().to_string();
            let chat = m.chat_of(&target)?;
            let sessions = m.sessions.clone();
            let key = target.clone();
            // The last Telegram message of that contact, from its session trail.
            let last = tokio::task::spawn_blocking(move || {
                let h = sessions.get(&key).ok()??;
                let lines = h.read_trail().ok()?;
                lines.iter().rev().find_map(|l| match &l.event {
                    Event::Intake(i) => match &i.route {
                        Some(Route::Telegram {
                            message_id: Some(id),
                            ..
                        }) => Some(*id),
                        _ => None,
                    },
                    _ => None,
                })
            })
            .await
            .ok()
            .flatten()
            .ok_or_else(|| {
                ToolError::Invalid(format!("{target} has no Telegram message to react to"))
            })?;
            let emoji = args["emoji"].as_str().unwrap_or_default();
            m.outbound
                .react(&chat, last, emoji)
                .await
                .map_err(ToolError::Failed)?;
            Ok(format!("reacted {emoji} to {target}'s last message"))
        })
    }
}
