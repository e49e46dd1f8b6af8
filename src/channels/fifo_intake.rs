//! What the FIFO's control lines (SPEC §10.1) ask of the daemon: a message line (`user`,
//! `system`, `notify`) becomes an intake for [`super::intake::IntakeSink`], like every other
//! source's; the other lines (`reset`, `session_model`, `session_skill`, `approval`) are
//! controls the daemon handles itself.

use std::path::{Path, PathBuf};

use super::intake::{notify_meta, notify_text, valid_key};
use crate::control::{self, ControlLine, Source};
use crate::session::Intake;

/// What one control line asks.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// A message: `intake` for session `key` (boxed: an intake is far larger than a control
    /// line).
    Message { key: String, intake: Box<Intake> },
    /// A control line that is not a message.
    Control(ControlLine),
}

/// What `line` asks. A message line's text is read from its `text_file` when it has one (a
/// file in `state_dir/inbox/`, at most `max_bytes`: the HTTP body cap, the same bound for a
/// message however it arrives), its attachments from its `attachments_file`. `None` (logged):
/// the line cannot be taken in and is skipped.
pub async fn request_of(line: ControlLine, state_dir: &Path, max_bytes: usize) -> Option<Request> {
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
                return None;
            }
            let text = text_or_skip(&id, text, text_file, state_dir, max_bytes).await?;
            let attachments =
                attachments_or_skip(&id, attachments, attachments_file, state_dir, max_bytes)
                    .await?;
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
            let text = text_or_skip(&id, text, text_file, state_dir, max_bytes).await?;
            let intake = Intake {
                id,
                source: Source::System,
                from: "system".into(),
                text,
                tier,
                attachments: vec![],
                route: None,
                notify_meta: None,
                relayed_from: None,
            };
            ("system".to_string(), intake)
        }
        ControlLine::Notify {
            text,
            text_file,
            source,
            reference,
            data,
            ..
        } => {
            let body = text_or_skip(&id, text, text_file, state_dir, max_bytes).await?;
            let (source, reference, data) =
                (source.as_deref(), reference.as_deref(), data.as_ref());
            let intake = Intake {
                id,
                source: Source::System,
                from: source.unwrap_or("notify").to_string(),
                text: notify_text(&body, source, reference, data),
                tier: None,
                attachments: vec![],
                route: None,
                notify_meta: Some(notify_meta(source, reference, data)),
                relayed_from: None,
            };
            ("system".to_string(), intake)
        }
        other => return Some(Request::Control(other)),
    };
    Some(Request::Message {
        key,
        intake: Box::new(intake),
    })
}

/// The text of a control line, or `None` (logged: the line is skipped).
async fn text_or_skip(
    id: &str,
    text: Option<String>,
    text_file: Option<PathBuf>,
    state_dir: &Path,
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
    text_file: Option<PathBuf>,
    state_dir: PathBuf,
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

/// A user line's attachments with those of its `attachments_file`, or `None` (logged: the
/// line is skipped).
async fn attachments_or_skip(
    id: &str,
    attachments: Vec<PathBuf>,
    attachments_file: Option<PathBuf>,
    state_dir: &Path,
    max_bytes: usize,
) -> Option<Vec<PathBuf>> {
    let Some(file) = attachments_file else {
        return Some(attachments);
    };
    let dir = state_dir.to_path_buf();
    let read = tokio::task::spawn_blocking(move || {
        control::resolve_attachments(&attachments, &Some(file), &dir, max_bytes as u64)
    })
    .await;
    match read {
        Ok(Ok(all)) => Some(all),
        Ok(Err(e)) => {
            tracing::warn!(id = %id, error = %e, "FIFO line skipped");
            None
        }
        Err(e) => {
            tracing::warn!(id = %id, error = %e, "FIFO line skipped");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn message_lines_become_intakes_and_the_rest_stay_controls() {
        let dir = tempfile::tempdir().unwrap();
        let line = |s: &str| control::parse_line(s.as_bytes(), 4096).unwrap();
        let user = line(r#"{"type":"user","id":"u1","text":"hi","sender":"alice"}"#);
        let Some(Request::Message { key, intake }) = request_of(user, dir.path(), 1000).await
        else {
            panic!("a user line is a message")
        };
        assert_eq!(
            (key.as_str(), intake.source, intake.from.as_str()),
            ("alice", Source::User, "alice")
        );
        let notify = line(r#"{"type":"notify","id":"n1","text":"down","source":"ci","ref":"7"}"#);
        let Some(Request::Message { key, intake }) = request_of(notify, dir.path(), 1000).await
        else {
            panic!("a notify line is a message")
        };
        assert_eq!(key, "system");
        assert_eq!(intake.text, "[notification from ci, ref 7] down");
        assert_eq!(
            intake.notify_meta,
            Some(serde_json::json!({"source": "ci", "ref": "7"}))
        );
        let bad = line(r#"{"type":"user","id":"u2","text":"hi","sender":"a/b"}"#);
        assert_eq!(request_of(bad, dir.path(), 1000).await, None);
        let reset = line(r#"{"type":"reset","id":"r1","target":"alice"}"#);
        assert!(matches!(
            request_of(reset, dir.path(), 1000).await,
            Some(Request::Control(ControlLine::Reset { .. }))
        ));
    }
}
