//! The intake seam: how every source (Telegram, the FIFO, HTTP, the terminal, the scheduler)
//! hands a message to the daemon without knowing the daemon. The daemon implements
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
    /// 429, a short "busy" answer on Telegram).
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

/// Where sources put messages. `accept` returns once the intake is recorded durably and
/// queued (the acknowledgement of SPEC §5.2); a duplicate id is accepted and not queued again.
pub trait IntakeSink: Send + Sync {
    /// Record `intake` in session `key`'s trail and queue it.
    fn accept<'a>(&'a self, key: &'a str, intake: Intake)
    -> BoxFuture<'a, Result<(), AcceptError>>;

    /// `accept`, then wait until the message is done. `Ok(None)`: the daemon stopped before
    /// it finished (it resumes after the next start). Dropping the future stops the wait,
    /// never the work.
    fn ask<'a>(
        &'a self,
        key: &'a str,
        intake: Intake,
    ) -> BoxFuture<'a, Result<Option<Completion>, AcceptError>>;
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
