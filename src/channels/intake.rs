//! The intake seam: how every source (the chat channels, the FIFO, HTTP and the compatible
//! endpoints, the terminal, the scheduler) hands a message to the daemon without knowing the
//! daemon. The daemon implements
//! [`IntakeSink`] (durable intake + the per-session queue, `daemon::intake`); sources hold an
//! `Arc<dyn IntakeSink>`.

use futures::future::BoxFuture;

use crate::agent::Finish;
use crate::session::Intake;

/// Why a message was refused before intake: its queue is full. The message names the key to
/// raise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueFull {
    #[error(
        "this session already has {max} messages waiting ([behavior] max_queued_per_session); try again once they are processed"
    )]
    Session { max: usize },
    #[error(
        "{max} messages are already waiting across all sessions ([behavior] max_queued_total); try again once they are processed"
    )]
    Total { max: usize },
}

/// Why a message was not accepted. Either way nothing was recorded and nothing acknowledged.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AcceptError {
    /// The session's queue (or all queues together) is full: refused before intake (HTTP
    /// 429, a short "busy" answer in a chat).
    #[error("{0}")]
    Busy(#[from] QueueFull),
    /// The intake record could not be written.
    #[error("{0}")]
    Failed(String),
}

/// What a waiter learns when its message is done.
#[derive(Debug, Clone)]
pub struct Completion {
    pub session_id: String,
    pub finish: Finish,
}

/// What [`IntakeSink::accept`] did with an intake.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accepted {
    /// `false`: its id was already in the session's trail; it was not queued again.
    pub new: bool,
    /// The session that holds it (a UUID).
    pub session_id: String,
    /// The transcripts of its audio (SPEC §19), which a chat channel may echo.
    pub transcripts: Vec<String>,
}

/// Where sources put messages: every source (the chat channels, the FIFO, HTTP and the
/// compatible endpoints, the terminal, the scheduler) records its intakes only through this.
/// `accept` returns once the intake is recorded durably and queued (the acknowledgement of
/// SPEC §5.2); a duplicate id is accepted and not queued again.
pub trait IntakeSink: Send + Sync {
    /// Record `intake` in session `key`'s trail and queue it.
    fn accept<'a>(
        &'a self,
        key: &'a str,
        intake: Intake,
    ) -> BoxFuture<'a, Result<Accepted, AcceptError>>;

    /// `accept`, then wait until the message is done. `Ok(None)`: the daemon stopped before
    /// it finished (it resumes after the next start). Dropping the future stops the wait,
    /// never the work.
    fn ask<'a>(
        &'a self,
        key: &'a str,
        intake: Intake,
    ) -> BoxFuture<'a, Result<Option<Completion>, AcceptError>>;

    /// Whether intake `id` is already in session `key`'s trail (offered again after a crash:
    /// the source need not fetch or transcribe anything for it; `accept` would drop it).
    fn is_recorded<'a>(&'a self, _key: &'a str, _id: &'a str) -> BoxFuture<'a, bool> {
        Box::pin(async { false })
    }
}

/// A session key from outside input: non-empty, at most 64 characters, no control characters
/// and no path separators.
pub fn valid_key(key: &str) -> bool {
    !key.trim().is_empty()
        && key.chars().count() <= 64
        && !key.chars().any(|c| c.is_control() || c == '/' || c == '\\')
}

/// A notification's `{source, ref, data}` as received (FIFO `notify`, HTTP `/notify`), for
/// the webhook's `notify_meta` (SPEC §10.2); absent fields are left out.
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

/// The text a person is sent for a finished message: the answer, or what they are told when
/// it failed. `None`: nothing is sent (a silent reply, or an interrupted message that resumes
/// after restart). Channel delivery, the HTTP answer and the terminal all decide with this.
pub fn reply_text(finish: &Finish) -> Option<&str> {
    match finish {
        Finish::Reply {
            text,
            silent: false,
            ..
        } => Some(text),
        Finish::Failed { reply, .. } => Some(reply),
        Finish::Reply { silent: true, .. } | Finish::Cancelled => None,
    }
}

/// What a source tells a person about a finished message, without knowing the agent's types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The reply text.
    Reply(String),
    /// The agent chose not to answer (a silent token).
    Silent,
    /// The message failed; what the person is told.
    Failed(String),
    /// Shutdown came first; the message resumes after the next start.
    Interrupted,
}

impl Answer {
    /// The answer for a completion (`None`: the daemon stopped before it finished).
    pub fn of(completion: Option<&Completion>) -> Answer {
        let Some(finish) = completion.map(|c| &c.finish) else {
            return Answer::Interrupted;
        };
        match (reply_text(finish), finish) {
            (Some(text), Finish::Failed { .. }) => Answer::Failed(text.to_string()),
            (Some(text), _) => Answer::Reply(text.to_string()),
            (None, Finish::Reply { .. }) => Answer::Silent,
            (None, _) => Answer::Interrupted,
        }
    }
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

    fn done(finish: Finish) -> Completion {
        Completion {
            session_id: "s".into(),
            finish,
        }
    }

    #[test]
    fn answers_follow_the_reply_text() {
        let reply = |text: &str, silent| {
            done(Finish::Reply {
                text: text.into(),
                silent,
                usage: Default::default(),
                cost_usd: 0.0,
                truncated: false,
                fallback: None,
                client_calls: vec![],
            })
        };
        assert_eq!(
            Answer::of(Some(&reply("hi", false))),
            Answer::Reply("hi".into())
        );
        assert_eq!(Answer::of(Some(&reply("NO_REPLY", true))), Answer::Silent);
        let failed = done(Finish::Failed {
            reply: "sorry".into(),
            error: "boom".into(),
            cause: crate::agent::FailCause::Other,
        });
        assert_eq!(Answer::of(Some(&failed)), Answer::Failed("sorry".into()));
        assert_eq!(
            Answer::of(Some(&done(Finish::Cancelled))),
            Answer::Interrupted
        );
        assert_eq!(Answer::of(None), Answer::Interrupted);
    }
}
