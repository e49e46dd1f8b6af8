//! Where replies go (SPEC §5.6) and what a trail says about their delivery (SPEC §5.2, §16.1):
//! an `intent` before the first send, `attempt`/`sent` around each part, `done`, `failed` or
//! `unknown` to close it. On restart a `sent` part is skipped, an `attempt`ed part without
//! `sent` is never sent again (sent again with the same key where the channel's sends are
//! idempotent: Matrix), and the rest are sent.

use crate::agent::Work;
use crate::control::Source;
use crate::session::{DeliveryStatus, Ending, Event, TrailLine};

pub use crate::tools::outbound::{Address, Contacts, Outbound, Progress};

/// Where the reply to `work` goes (SPEC §5.6): a message a chat channel took in is answered
/// in its chat (`Work::chat`, the one rule for which chat a message belongs to); a FIFO or
/// scheduled message goes to the sender's chat when the sender is a contact; system, HTTP (the
/// response itself) and terminal messages have no chat. `None` too when the chat's channel
/// does not run (`out`). The worker computes it once (`Work::reply_to`) for the reply, the
/// typing indicator and the `tts` tool.
pub fn target_for(work: &Work, contacts: &Contacts, out: &dyn Outbound) -> Option<Address> {
    let first = work.intakes.first()?;
    let to = match (work.chat(), first.source) {
        (Some(chat), _) => chat.clone(),
        (None, Source::User | Source::Scheduler) => contacts.address_of(&first.from)?,
        (None, _) => return None,
    };
    out.serves(&to.channel).then_some(to)
}

/// A reply whose delivery is not closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub ids: Vec<String>,
    pub text: String,
    /// `None`: never started (send it whole). `Some`: resume it part by part.
    pub progress: Option<Progress>,
    /// When the reply was recorded (the trail line's `ts`).
    pub ts: String,
}

/// `(replies to send or resume), (ids whose send is uncertain: an intent written before the
/// outbox, without parts, and no outcome)`.
pub type Undelivered = (Vec<Pending>, Vec<Vec<String>>);

/// Replies of a trail that still need a send: final, non-silent assistant messages and
/// failures whose delivery is not closed by `done`/`failed`/`unknown`. Those never started are
/// sent whole; those with an `intent` resume with their [`Progress`]. A legacy intent (no
/// `parts`) with no outcome is returned separately: logged, never repeated.
pub fn undelivered(lines: &[TrailLine]) -> Undelivered {
    use std::collections::HashMap;
    #[derive(Default)]
    struct State {
        started: bool,
        legacy: bool,
        closed: bool,
        progress: Progress,
    }
    let mut state: HashMap<&str, State> = HashMap::new();
    for l in lines {
        if let Event::Delivery {
            reply_to,
            status,
            parts,
            part,
            ..
        } = &l.event
        {
            let Some(first) = reply_to.first() else {
                continue;
            };
            let st = state.entry(first.as_str()).or_default();
            match status {
                DeliveryStatus::Intent => {
                    st.started = true;
                    st.legacy = parts.is_none();
                    st.progress.parts = *parts;
                }
                DeliveryStatus::Attempt | DeliveryStatus::Sent => {
                    st.progress.record(*status, *part)
                }
                s if s.closes() => st.closed = true,
                _ => {}
            }
        }
    }
    let mut todo = Vec::new();
    let mut uncertain = Vec::new();
    for l in lines {
        let (ids, text) = match crate::session::ending(&l.event) {
            Some((_, Ending::Reply { event, .. })) if event.silent => continue,
            Some((ids, Ending::Reply { text, .. } | Ending::Failed { reply: text, .. })) => {
                (ids, text.to_string())
            }
            None => continue,
        };
        let Some(first) = ids.first() else { continue };
        match state.get(first.as_str()) {
            None => todo.push(Pending {
                ids: ids.to_vec(),
                text,
                progress: None,
                ts: l.ts.clone(),
            }),
            Some(st) if st.closed => {}
            Some(st) if st.legacy || !st.started => uncertain.push(ids.to_vec()),
            Some(st) => todo.push(Pending {
                ids: ids.to_vec(),
                text,
                progress: Some(st.progress.clone()),
                ts: l.ts.clone(),
            }),
        }
    }
    (todo, uncertain)
}

/// A delivery a restore closed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Closed {
    pub session_id: String,
    pub reply_to: Vec<String>,
    pub channel: String,
}

/// A message in flight when the backup was taken, closed by the restore.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ClosedMessage {
    pub session_id: String,
    pub intake_id: String,
}

/// What a restore closed: messages in flight at backup time and deliveries open then.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RestoreClosed {
    pub messages: Vec<ClosedMessage>,
    pub deliveries: Vec<Closed>,
}

/// The failure a restore records for a message in flight at backup time.
const IN_FLIGHT_ERROR: &str = "restored from a backup taken while this message was in flight: it \
     may have been answered after the backup; not answered again";

/// After a restore (SPEC §24): a message in flight when the backup was taken, or a delivery open
/// then, may have been answered or sent after it. So each intake without an ending gets a
/// failure line (it is not answered again), and each reply bound for a chat whose delivery is not
/// closed (those failures included) gets an `unknown` line and is never sent. Replies without a
/// chat (HTTP, terminal) have nothing to close. Blocking.
pub fn close_restored(
    sessions_dir: &std::path::Path,
    tz: crate::zone::Zone,
) -> std::io::Result<RestoreClosed> {
    use crate::session::{TrailWriter, index::read_index, trail::read_trail};
    let mut closed = RestoreClosed::default();
    for entry in read_index(sessions_dir)?.into_values() {
        let id = entry.session_id;
        let mut lines = read_trail(sessions_dir, &id)?;
        // Opened at the first line to write: most trails have nothing to close.
        let mut writer = None;
        let mut append = |event: Event| -> std::io::Result<TrailLine> {
            let w = match &mut writer {
                Some(w) => w,
                None => writer.insert(TrailWriter::open(sessions_dir, &id, tz.clone())?),
            };
            w.append(event)
        };
        let mut stopped = Vec::new();
        for pending in crate::session::pending_intakes(&lines) {
            lines.push(append(Event::Failure {
                reply_to: vec![pending.intake.id.clone()],
                error: IN_FLIGHT_ERROR.into(),
                reply: "This message was in flight when a backup was taken and the state was \
                        later restored from it; send it again if it was not answered."
                    .into(),
            })?);
            stopped.push(pending.intake.id.clone());
            closed.messages.push(ClosedMessage {
                session_id: id.clone(),
                intake_id: pending.intake.id,
            });
        }
        for (reply_to, channel) in open_chat_deliveries(&lines) {
            let detail = if reply_to.iter().all(|i| stopped.contains(i)) {
                "restored from a backup: the message was in flight at backup time; not sent"
            } else {
                "restored from a backup: it may have been delivered after the backup was taken; \
                 not sent again"
            };
            append(Event::Delivery {
                reply_to: reply_to.clone(),
                channel: channel.clone(),
                status: DeliveryStatus::Unknown,
                detail: Some(detail.into()),
                parts: None,
                part: None,
            })?;
            closed.deliveries.push(Closed {
                session_id: id.clone(),
                reply_to,
                channel,
            });
        }
    }
    Ok(closed)
}

/// The replies of `lines` whose delivery is open and bound for a chat: their ids and channel.
fn open_chat_deliveries(lines: &[TrailLine]) -> Vec<(Vec<String>, String)> {
    use crate::session::Route;
    let (todo, _legacy_never_sent_again) = undelivered(lines);
    todo.into_iter()
        .filter_map(|pending| {
            let intent = lines.iter().find_map(|l| match &l.event {
                Event::Delivery {
                    reply_to,
                    channel,
                    status: DeliveryStatus::Intent,
                    ..
                } if *reply_to == pending.ids => Some(channel.clone()),
                _ => None,
            });
            let routed = lines.iter().find_map(|l| match &l.event {
                Event::Intake(i) if pending.ids.contains(&i.id) => i
                    .route
                    .as_ref()
                    .and_then(Route::address)
                    .map(|a| a.channel.clone()),
                _ => None,
            });
            Some((pending.ids, intent.or(routed)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;
    use crate::session::{Intake, MessageEvent, Route};
    use crate::tools::outbound::{FileKind, PartError, Router};
    use futures::future::BoxFuture;
    use std::sync::Arc;

    /// A channel that sends nothing: only whether the router serves it matters here.
    struct Idle;

    impl Outbound for Idle {
        fn parts(&self, _to: &Address, text: &str) -> Vec<String> {
            vec![text.to_string()]
        }
        fn send_part<'a>(
            &'a self,
            _: &'a Address,
            _: &'a str,
        ) -> BoxFuture<'a, Result<(), PartError>> {
            Box::pin(async { Ok(()) })
        }
        fn send_file<'a>(
            &'a self,
            _: &'a Address,
            _: &'a std::path::Path,
            _: FileKind,
        ) -> BoxFuture<'a, Result<(), PartError>> {
            Box::pin(async { Ok(()) })
        }
        fn react<'a>(
            &'a self,
            _: &'a Address,
            _: &'a str,
            _: &'a str,
        ) -> BoxFuture<'a, Result<(), PartError>> {
            Box::pin(async { Ok(()) })
        }
        fn typing<'a>(&'a self, _: &'a Address) -> BoxFuture<'a, ()> {
            Box::pin(async {})
        }
        fn attempt_timeout(&self) -> std::time::Duration {
            std::time::Duration::from_secs(1)
        }
    }

    fn intake(source: Source, from: &str, route: Option<Route>) -> Intake {
        Intake {
            id: "m1".into(),
            source,
            from: from.into(),
            text: "hi".into(),
            tier: None,
            attachments: vec![],
            route,
            notify_meta: None,
            relayed_from: None,
        }
    }

    /// The one rule for which chat a message belongs to (issue 31 item 4): the chat it came
    /// from, on any channel; else the sender's as a contact (FIFO, scheduler); else none. A
    /// chat whose channel does not run here gets nothing.
    #[test]
    fn a_reply_goes_to_the_chat_it_came_from_else_to_the_contact() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("providers.d")).unwrap();
        std::fs::write(
            root.join("providers.d/anthropic.toml"),
            "type = \"anthropic\"\napi_key_env = \"K\"\n[models.primary]\nmodel = \"m\"\n",
        )
        .unwrap();
        std::fs::write(
            root.join("agentd.toml"),
            "[paths]\nstate_dir = \"state\"\n[agent]\nname = \"t\"\nworkspace = \"ws\"\n[providers]\ndir = \"providers.d\"\n[channel.telegram]\ncontacts = { Alice = 1001 }\n",
        )
        .unwrap();
        let env = std::collections::BTreeMap::from([
            ("K".to_string(), "sk-test".to_string()),
            ("HOME".to_string(), root.display().to_string()),
        ]);
        let cfg = crate::config::load_with_env(&root.join("agentd.toml"), env).unwrap();
        let live = crate::config::Live::new(Arc::new(cfg));
        let contacts = Contacts::new(live, vec![crate::channels::telegram::address::BOOK]);
        let mut router = Router::default();
        router.add("telegram", Arc::new(Idle));
        let group = Address::new("telegram", "-2002");
        let chat = |to: &Address| {
            Some(Route::Chat {
                to: to.clone(),
                message: Some("7".into()),
            })
        };
        let work = |i: Intake| Work::new(vec![i]);
        let at = |i: Intake| target_for(&work(i), &contacts, &router);
        // Alice writing in a group is answered in the group, not in her private chat.
        let w = work(intake(Source::Telegram, "Alice", chat(&group)));
        assert_eq!(w.chat(), Some(&group));
        assert_eq!(
            at(intake(Source::Telegram, "Alice", chat(&group))),
            Some(group)
        );
        let alice = Some(Address::new("telegram", "1001"));
        assert_eq!(at(intake(Source::User, "Alice", None)), alice);
        assert_eq!(at(intake(Source::Scheduler, "Alice", None)), alice);
        assert_eq!(at(intake(Source::User, "bob", None)), None);
        assert_eq!(at(intake(Source::System, "Alice", None)), None);
        assert_eq!(at(intake(Source::Http, "Alice", None)), None);
        let room = Address::new("matrix", "!r:example.org");
        assert_eq!(
            work(intake(Source::Terminal, "x", chat(&room))).chat(),
            Some(&room)
        );
        assert_eq!(
            at(intake(Source::Terminal, "x", chat(&room))),
            None,
            "matrix does not run"
        );
    }

    /// A restore closes a message in flight (a failure, its delivery `unknown`) and an open
    /// delivery (`unknown`): afterwards nothing is left to answer or to send.
    #[test]
    fn a_restore_closes_messages_in_flight_and_open_deliveries() {
        let dir = tempfile::tempdir().unwrap();
        let tz = crate::zone::Zone::utc();
        let store = crate::session::SessionStore::open(dir.path(), tz.clone()).unwrap();
        let chat = Some(Route::Chat {
            to: Address::new("telegram", "1001"),
            message: None,
        });
        let answered = intake(Source::Telegram, "1001", chat.clone());
        let mut in_flight = intake(Source::Telegram, "1001", chat);
        in_flight.id = "m2".into();
        let (h, _) = store.append_intake("tg:1001", "m", answered).unwrap();
        h.append(fin("m1", "hello", false)).unwrap();
        store.append_intake("tg:1001", "m", in_flight).unwrap();
        store.flush_index();
        drop((h, store));

        let closed = close_restored(dir.path(), tz.clone()).unwrap();
        assert_eq!(closed.messages.len(), 1);
        assert_eq!(closed.messages[0].intake_id, "m2");
        let reply_to: Vec<_> = closed
            .deliveries
            .iter()
            .map(|c| c.reply_to.clone())
            .collect();
        assert_eq!(reply_to, [vec!["m1".to_string()], vec!["m2".to_string()]]);
        let id = &closed.messages[0].session_id;
        let lines = crate::session::trail::read_trail(dir.path(), id).unwrap();
        assert!(crate::session::pending_intakes(&lines).is_empty());
        assert_eq!(undelivered(&lines), (vec![], vec![]));
        // A second run finds nothing more to close.
        assert_eq!(
            close_restored(dir.path(), tz).unwrap(),
            RestoreClosed::default()
        );
    }

    fn line(seq: u64, event: Event) -> TrailLine {
        TrailLine {
            v: 1,
            seq,
            ts: "2026-11-22T00:00:00Z".into(),
            event,
        }
    }

    fn fin(id: &str, text: &str, silent: bool) -> Event {
        let mut m = MessageEvent::new(Message::Assistant {
            text: text.into(),
            tool_calls: vec![],
            thinking: vec![],
            usage: None,
        });
        m.is_final = true;
        m.silent = silent;
        m.reply_to = vec![id.into()];
        Event::Message(m)
    }

    fn delivery(id: &str, s: DeliveryStatus) -> Event {
        Event::Delivery {
            reply_to: vec![id.into()],
            channel: "telegram".into(),
            status: s,
            detail: None,
            parts: None,
            part: None,
        }
    }

    fn part(id: &str, s: DeliveryStatus, parts: Option<usize>, part: Option<usize>) -> Event {
        Event::Delivery {
            reply_to: vec![id.into()],
            channel: "telegram".into(),
            status: s,
            detail: None,
            parts,
            part,
        }
    }

    #[test]
    fn resumes_parts_skipping_sent_and_attempted() {
        use DeliveryStatus::*;
        let lines = vec![
            line(1, fin("a", "three parts", false)),
            line(2, part("a", Intent, Some(3), None)),
            line(3, part("a", Attempt, None, Some(0))),
            line(4, part("a", Sent, None, Some(0))),
            line(5, part("a", Attempt, None, Some(1))),
            line(6, fin("b", "closed", false)),
            line(7, part("b", Intent, Some(1), None)),
            line(8, part("b", Attempt, None, Some(0))),
            line(9, part("b", Unknown, None, Some(0))),
        ];
        let (todo, uncertain) = undelivered(&lines);
        assert!(uncertain.is_empty());
        assert_eq!(todo.len(), 1, "{todo:?}");
        let p = todo[0].progress.clone().unwrap();
        assert!(
            !p.todo(0, false) && !p.todo(1, false) && p.todo(2, false),
            "{p:?}"
        );
        // A channel whose sends are idempotent sends the attempted part again, never a sent one.
        assert!(
            !p.todo(0, true) && p.todo(1, true) && p.todo(2, true),
            "{p:?}"
        );
    }

    #[test]
    fn classifies_replies_by_delivery_records() {
        let lines = vec![
            line(1, fin("a", "done a", false)),
            line(2, delivery("a", DeliveryStatus::Intent)),
            line(3, delivery("a", DeliveryStatus::Done)),
            line(4, fin("b", "lost b", false)),
            line(5, fin("c", "uncertain c", false)),
            line(6, delivery("c", DeliveryStatus::Intent)),
            line(7, fin("d", "HEARTBEAT_OK", true)),
            line(
                8,
                Event::Failure {
                    reply_to: vec!["e".into()],
                    error: "x".into(),
                    reply: "sorry".into(),
                },
            ),
        ];
        let (todo, uncertain) = undelivered(&lines);
        let todo: Vec<_> = todo
            .into_iter()
            .map(|p| (p.ids, p.text, p.progress))
            .collect();
        assert_eq!(
            todo,
            vec![
                (vec!["b".to_string()], "lost b".to_string(), None),
                (vec!["e".to_string()], "sorry".to_string(), None)
            ]
        );
        assert_eq!(uncertain, vec![vec!["c".to_string()]]);
    }
}
