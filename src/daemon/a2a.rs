//! The daemon side of the A2A endpoint (SPEC §23): a message becomes an intake (source
//! `http`, from `a2a`) of session `a2a:<context id>` with the message id as its id, through
//! `DaemonBackend::accept_waited` like the compatible endpoints, the MCP server and the console; a
//! task is read back from the trail (`session::outcome_of`), and cancelled as `/stop` does.

use std::time::Duration;

use futures::future::BoxFuture;

use super::http_backend::{AttachmentSaver, DaemonBackend, backend_error};
use super::workers::STOPPED_ERROR;
use crate::agent::Finish;
use crate::api::a2a::{A2aIn, A2aTicket, RecordedTask, TaskEnd};
use crate::api::backend::BackendError;
use crate::channels::intake::Completion;
use crate::control::Source;
use crate::session::{Event, Intake, Outcome, TrailLine};

/// How long `tasks/cancel` waits for a stopped message to record its end.
pub const CANCEL_WAIT: Duration = Duration::from_secs(30);

/// The intake's `from`.
const FROM: &str = "a2a";

/// A failure as the client is told it: stopped is `Canceled`.
fn failed(reply: String, error: String) -> TaskEnd {
    if error == STOPPED_ERROR {
        TaskEnd::Canceled
    } else if reply == error {
        TaskEnd::Failed { message: error }
    } else {
        TaskEnd::Failed {
            message: format!("{reply} ({error})"),
        }
    }
}

/// A finished message as a task's end (a shutdown leaves it working: it resumes).
fn end_of(finish: Finish) -> TaskEnd {
    match finish {
        Finish::Reply { text, silent, .. } => TaskEnd::Completed {
            text: if silent { String::new() } else { text },
        },
        Finish::Failed { reply, error, .. } => failed(reply, error),
        Finish::Cancelled => TaskEnd::Working,
    }
}

/// Intake `id` as `lines` record it: its text and how far it got; `None` if not there.
pub fn recorded(lines: &[TrailLine], id: &str) -> Option<RecordedTask> {
    let text = lines.iter().find_map(|l| match &l.event {
        Event::Intake(i) if i.id == id => Some(i.text.clone()),
        _ => None,
    })?;
    let end = match crate::session::outcome_of(lines, id) {
        None => TaskEnd::Working,
        Some(Outcome::Reply { text, silent }) => TaskEnd::Completed {
            text: if silent { String::new() } else { text },
        },
        Some(Outcome::Failed { reply, error }) => failed(reply, error),
    };
    Some(RecordedTask { text, end })
}

impl DaemonBackend {
    /// `ApiBackend::a2a_send`.
    pub(super) async fn a2a_accept(&self, req: A2aIn) -> Result<A2aTicket, BackendError> {
        let A2aIn {
            key,
            id,
            text,
            images,
            stream,
        } = req;
        let attachments = {
            let saver = AttachmentSaver {
                inbox: self.cfg.paths.state_dir.join("inbox"),
            };
            let file_id = format!("a2a-{}", uuid::Uuid::now_v7());
            tokio::task::spawn_blocking(move || saver.save(&file_id, &images))
                .await
                .map_err(|e| BackendError::Internal(e.to_string()))??
        };
        let intake = Intake {
            id: id.clone(),
            source: Source::Http,
            from: FROM.into(),
            text: text.clone(),
            tier: None,
            attachments,
            route: None,
            notify_meta: None,
            relayed_from: None,
        };
        let (sink, deltas) = stream.then(tokio::sync::mpsc::unbounded_channel).unzip();
        let super::http_backend::Waited { new, waiter, .. } = self
            .accept_waited(&key, intake, sink)
            .await
            .map_err(backend_error)?;
        // A retry of a message that is done already: answered from the trail. A message id
        // reused for another text is refused (the client must not get another's answer).
        let replay = match new {
            true => None,
            false => match self.recorded_task(&key, &id).await? {
                Some(t) if t.text != text => {
                    self.dispatcher.forget(&key, &id);
                    return Err(BackendError::BadRequest(format!(
                        "messageId {} was already used for another message in this context: a retry must send the same message, a new message needs a new messageId",
                        crate::control::escaped_preview(&id)
                    )));
                }
                t => t.map(|t| t.end).filter(|e| *e != TaskEnd::Working),
            },
        };
        if replay.is_some() {
            self.dispatcher.forget(&key, &id);
        }
        Ok(A2aTicket {
            done: wait(replay, waiter),
            deltas,
        })
    }

    /// Intake `id` of session `key` as its trail records it.
    pub(super) async fn recorded_task(
        &self,
        key: &str,
        id: &str,
    ) -> Result<Option<RecordedTask>, BackendError> {
        let (store, key, id) = (self.intake.store.clone(), key.to_string(), id.to_string());
        tokio::task::spawn_blocking(move || {
            if !store.has_intake(&key, &id)? {
                return Ok(None);
            }
            let Some(session) = store.get(&key)? else {
                return Ok(None);
            };
            Ok(recorded(&session.read_trail()?, &id))
        })
        .await
        .map_err(|e| BackendError::Internal(e.to_string()))?
        .map_err(|e: std::io::Error| {
            BackendError::Internal(format!("cannot read the session trail: {e}"))
        })
    }

    /// `ApiBackend::a2a_cancel`.
    pub(super) async fn a2a_stop(
        &self,
        key: &str,
        id: &str,
    ) -> Result<Option<RecordedTask>, BackendError> {
        let Some(task) = self.recorded_task(key, id).await? else {
            return Ok(None);
        };
        if task.end != TaskEnd::Working {
            return Err(not_cancelable(id, &task.end));
        }
        let waiter = self.dispatcher.wait_in(key, id);
        if !self.dispatcher.stop_intake(key, id) {
            // Done meanwhile, or waiting behind another message of its session.
            return match self.recorded_task(key, id).await? {
                Some(t) if t.end != TaskEnd::Working => Err(not_cancelable(id, &t.end)),
                _ => Err(BackendError::Conflict(format!(
                    "task of message {} is queued behind another message of its context and has not started: cancel that one first, or wait",
                    crate::control::escaped_preview(id)
                ))),
            };
        }
        let _ = tokio::time::timeout(CANCEL_WAIT, waiter).await;
        self.recorded_task(key, id).await
    }
}

fn not_cancelable(id: &str, end: &TaskEnd) -> BackendError {
    let state = crate::api::a2a::wire::state_name(Some(end));
    BackendError::Conflict(format!(
        "task of message {} is {state} already: only a working task can be canceled",
        crate::control::escaped_preview(id)
    ))
}

/// The wait for a message's end, in a task of its own (a client that goes away never stops
/// the work): the end already in the trail, or the one the waiter is told.
fn wait(
    replay: Option<TaskEnd>,
    waiter: tokio::sync::oneshot::Receiver<Completion>,
) -> BoxFuture<'static, TaskEnd> {
    if let Some(end) = replay {
        return Box::pin(async move { end });
    }
    let task = tokio::spawn(async move {
        match waiter.await {
            Ok(Completion { finish, .. }) => end_of(finish),
            Err(_) => TaskEnd::Working,
        }
    });
    Box::pin(async move { task.await.unwrap_or(TaskEnd::Working) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;
    use crate::session::MessageEvent;

    fn line(seq: u64, event: Event) -> TrailLine {
        TrailLine {
            v: 1,
            seq,
            ts: "2026-01-01T00:00:00Z".into(),
            event,
        }
    }

    fn intake(id: &str) -> TrailLine {
        line(
            1,
            Event::Intake(Intake {
                id: id.into(),
                source: Source::Http,
                from: FROM.into(),
                text: format!("question {id}"),
                tier: None,
                attachments: vec![],
                route: None,
                notify_meta: None,
                relayed_from: None,
            }),
        )
    }

    fn failure(id: &str, error: &str) -> TrailLine {
        line(
            2,
            Event::Failure {
                reply_to: vec![id.into()],
                error: error.into(),
                reply: "Stopped.".into(),
            },
        )
    }

    #[test]
    fn a_task_is_read_back_from_the_trail() {
        assert_eq!(recorded(&[intake("a")], "b"), None);
        let t = recorded(&[intake("a")], "a").unwrap();
        assert_eq!((t.text.as_str(), t.end), ("question a", TaskEnd::Working));
        let mut reply = MessageEvent::new(Message::Assistant {
            text: "answer".into(),
            tool_calls: vec![],
            thinking: vec![],
            usage: None,
        });
        reply.is_final = true;
        reply.reply_to = vec!["a".into()];
        let done = [intake("a"), line(2, Event::Message(reply))];
        assert_eq!(
            recorded(&done, "a").unwrap().end,
            TaskEnd::Completed {
                text: "answer".into()
            }
        );
        let stopped = [intake("a"), failure("a", STOPPED_ERROR)];
        assert_eq!(recorded(&stopped, "a").unwrap().end, TaskEnd::Canceled);
        let failed = [intake("a"), failure("a", "budget reached")];
        assert_eq!(
            recorded(&failed, "a").unwrap().end,
            TaskEnd::Failed {
                message: "Stopped. (budget reached)".into()
            }
        );
    }
}
