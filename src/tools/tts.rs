//! Text to speech (SPEC §19): the [`Speaker`] (one `/audio/speech` call through the provider
//! gateway, `Gateway::speak`: budget check, retries, a `tts` cost row; the OGG/Opus file kept in
//! `inbox/`) and the `tts` tool.
//! When the message is answered in a chat (`ToolContext::reply_to`) the tool sends the file
//! there as a voice note through the outbox (the `message` tool's recorded, retried send);
//! elsewhere the file stays in `inbox/` and its path is the tool's result (HTTP `/chat` answers
//! list it, see [`spoken_files`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::messaging::Messaging;
use super::outbound::{FileKind, Piece};
use super::{Tool, ToolContext, ToolError};
use crate::config::VoiceConfig;
use crate::gateway::{Bill, CallError, Gateway};
use crate::llm::ToolSpec;
use crate::message::Message;
use crate::session::{Event, TrailLine};

/// The start of a successful `tts` result; the path follows (read back by [`spoken_files`]).
pub const SAVED_AS: &str = "voice note saved as ";

/// Synthesises speech with `[voice] tts_model`.
pub struct Speaker {
    pub gateway: Arc<Gateway>,
    pub cfg: VoiceConfig,
    /// `state_dir/inbox`, where the files are kept.
    pub inbox: PathBuf,
}

impl Speaker {
    /// Speak `text` (in `voice`, else the configured one) into a new `inbox/tts-<id>.ogg`,
    /// billed to `session_id`. Text beyond `max_tts_chars` is refused.
    pub async fn speak(
        &self,
        session_id: &str,
        text: &str,
        voice: Option<&str>,
    ) -> Result<PathBuf, String> {
        let Some(model) = &self.cfg.tts_model else {
            return Err("no speech model is configured ([voice] tts_model)".into());
        };
        let chars = text.chars().count();
        if text.trim().is_empty() {
            return Err("there is no text to speak".into());
        }
        if chars > self.cfg.max_tts_chars {
            return Err(format!(
                "the text has {chars} characters, more than [voice] max_tts_chars ({}); shorten it",
                self.cfg.max_tts_chars
            ));
        }
        let voice = voice.unwrap_or(&self.cfg.voice);
        let max = usize::try_from(self.cfg.max_audio_bytes).unwrap_or(usize::MAX);
        // The budget, under the call gate of the session's message in flight (held until the
        // cost is recorded).
        let bill = Bill::message(session_id);
        let speech = match self.gateway.speak(bill, model, text, voice, max).await {
            Ok(paid) => paid.out,
            Err(CallError::Budget(e)) => return Err(format!("speech not made: {e}")),
            Err(e) => return Err(format!("speech failed: {e}")),
        };
        let path = self
            .inbox
            .join(format!("tts-{}.ogg", uuid::Uuid::now_v7().simple()));
        let (p, bytes) = (path.clone(), speech.bytes);
        tokio::task::spawn_blocking(move || {
            crate::fsutil::create_private_dir(p.parent().unwrap_or(Path::new(".")))?;
            crate::fsutil::atomic_write(&p, &bytes)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot save the speech: {e}"))?;
        Ok(path)
    }
}

/// Most characters of a `voice` argument.
const MAX_VOICE_NAME: usize = 64;

/// The `tts` tool: `text`, `voice?`.
pub struct TtsTool {
    pub speaker: Arc<Speaker>,
    /// The outbox to the chat channels, when one runs.
    pub messaging: Option<Messaging>,
}

impl Tool for TtsTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "tts".into(),
            description: "Speak a text aloud: synthesises it as a voice note. In a chat it is sent there as a voice note; elsewhere the .ogg file is kept in the inbox and its path returned (attach it with `message`).".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "text": {"type": "string", "minLength": 1, "description": "What to say."},
                    "voice": {"type": "string", "minLength": 1, "maxLength": MAX_VOICE_NAME, "description": "A voice of the speech provider (default: [voice] voice)."}
                },
                "required": ["text"],
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
            let text = args["text"].as_str().unwrap_or_default();
            let voice = args["voice"].as_str();
            if voice.is_some_and(|v| v.chars().any(char::is_control)) {
                return Err(ToolError::Invalid(
                    "voice: a name without control characters".into(),
                ));
            }
            let path = self
                .speaker
                .speak(&ctx.session_id, text, voice)
                .await
                .map_err(ToolError::Failed)?;
            let saved = format!("{SAVED_AS}{}", path.display());
            let Some(m) = &self.messaging else {
                return Ok(saved);
            };
            // Where this message's reply goes (one rule: `daemon::delivery::target_for`).
            let Some(to) = &ctx.reply_to else {
                return Ok(format!("{saved} (this message is not answered in a chat)"));
            };
            let piece = Piece::File {
                path: path.clone(),
                kind: FileKind::Voice,
            };
            let material = format!("{}\n", path.display());
            let name = format!("chat {}", to.chat);
            let sent = m
                .send(ctx, to, &name, "tts", &material, vec![piece])
                .await?;
            Ok(format!("{saved}; {sent}"))
        })
    }

    fn timeout(&self) -> Option<Duration> {
        // The speech call (retried) and a send within the tool's retry window.
        let send = self
            .messaging
            .as_ref()
            .map_or(Duration::ZERO, Messaging::timeout);
        Some(Duration::from_secs(120) + send)
    }
}

/// The files `tts` produced in the turn answering intake `id` (SPEC §19: HTTP `/chat` answers
/// list them), read from the trail: results of `tts` calls that start with [`SAVED_AS`],
/// inside `inbox` and still there.
pub fn spoken_files(lines: &[TrailLine], id: &str, inbox: &Path) -> Vec<PathBuf> {
    let Some(start) = lines
        .iter()
        .position(|l| matches!(&l.event, Event::Intake(i) if i.id == id))
    else {
        return Vec::new();
    };
    let mut calls = std::collections::HashSet::new();
    let mut out = Vec::new();
    for l in &lines[start..] {
        let results = match &l.event {
            Event::Message(m) => match &m.message {
                Message::Assistant { tool_calls, .. } => {
                    let tts = tool_calls.iter().filter(|c| c.name == "tts");
                    calls.extend(tts.map(|c| c.id.clone()));
                    continue;
                }
                Message::ToolResults { results, .. } => results,
                Message::User { .. } => continue,
            },
            Event::ToolResult { results, .. } => results,
            _ => continue,
        };
        for r in results.iter().filter(|r| !r.is_error) {
            if !calls.contains(&r.tool_call_id) {
                continue;
            }
            let Some(rest) = r.content.strip_prefix(SAVED_AS) else {
                continue;
            };
            let end = rest.find([';', ' ', '\n']).unwrap_or(rest.len());
            let path = PathBuf::from(&rest[..end]);
            if path.starts_with(inbox) && path.is_file() && !out.contains(&path) {
                out.push(path);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{ToolCall, ToolResult};
    use crate::session::{Intake, MessageEvent};

    fn line(seq: u64, event: Event) -> TrailLine {
        TrailLine {
            v: 1,
            seq,
            ts: "2026-11-28T00:00:00Z".into(),
            event,
        }
    }

    fn intake(id: &str) -> Event {
        Event::Intake(Intake {
            id: id.into(),
            source: crate::control::Source::Http,
            from: "svc".into(),
            text: "say it".into(),
            tier: None,
            attachments: vec![],
            route: None,
            notify_meta: None,
            relayed_from: None,
        })
    }

    fn calls(names: &[(&str, &str)]) -> Event {
        Event::Message(MessageEvent::new(Message::Assistant {
            text: String::new(),
            tool_calls: names
                .iter()
                .map(|(id, name)| ToolCall {
                    id: id.to_string(),
                    name: name.to_string(),
                    arguments: serde_json::json!({}),
                })
                .collect(),
            thinking: vec![],
            usage: None,
        }))
    }

    fn results(r: &[(&str, &str, bool)]) -> Event {
        Event::ToolResult {
            results: r
                .iter()
                .map(|(id, content, is_error)| ToolResult {
                    tool_call_id: id.to_string(),
                    content: content.to_string(),
                    is_error: *is_error,
                    images: Vec::new(),
                })
                .collect(),
            notice: None,
        }
    }

    /// Only this turn's successful `tts` results naming an existing file in the inbox count.
    #[test]
    fn spoken_files_are_read_back_from_the_turn() {
        let d = tempfile::tempdir().unwrap();
        let inbox = d.path().join("inbox");
        std::fs::create_dir_all(&inbox).unwrap();
        let (a, b, old) = (
            inbox.join("tts-a.ogg"),
            inbox.join("tts-b.ogg"),
            inbox.join("tts-0.ogg"),
        );
        for f in [&a, &b, &old] {
            std::fs::write(f, b"OggS").unwrap();
        }
        let outside = d.path().join("tts-x.ogg");
        std::fs::write(&outside, b"OggS").unwrap();
        let saved = |p: &Path| format!("{SAVED_AS}{}", p.display());
        let lines = vec![
            line(1, intake("earlier")),
            line(2, calls(&[("c0", "tts")])),
            line(3, results(&[("c0", &saved(&old), false)])),
            line(4, intake("now")),
            line(
                5,
                calls(&[("c1", "tts"), ("c2", "read"), ("c3", "tts"), ("c4", "tts")]),
            ),
            line(
                6,
                results(&[
                    (
                        "c1",
                        &format!("{}; message: done (1 of 1 to chat 5)", saved(&a)),
                        false,
                    ),
                    ("c2", &saved(&b), false),
                    ("c3", &saved(&outside), false),
                    ("c4", "speech failed: HTTP 400", true),
                ]),
            ),
            line(7, calls(&[("c5", "tts")])),
            line(8, results(&[("c5", &saved(&b), false)])),
        ];
        assert_eq!(spoken_files(&lines, "now", &inbox), vec![a, b]);
        assert_eq!(
            spoken_files(&lines, "missing", &inbox),
            Vec::<PathBuf>::new()
        );
    }
}
