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
