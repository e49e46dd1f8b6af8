//! Where replies go (SPEC §5.6) and how they get there idempotently (SPEC §5.2): a `delivery`
//! intent is recorded before each send and `done`/`failed` after it; a restart never repeats a
//! send that has an intent record.

use crate::agent::Work;
use crate::config::Config;
use crate::control::Source;
use crate::session::{DeliveryStatus, Event, Route, TrailLine};

pub use crate::tools::outbound::{Outbound, Target};

/// The delivery rule of SPEC §5.6 for a unit of work: Telegram messages are answered in their
/// chat; FIFO user messages go to Telegram when the sender is a contact; system, HTTP (the
/// response itself) and terminal messages have no channel delivery here.
pub fn target_for(work: &Work, cfg: &Config) -> Option<Target> {
    let first = work.intakes.first()?;
    match (first.source, &first.route) {
        (Source::Telegram, Some(Route::Telegram { chat_id, .. })) => {
            Some(Target::Telegram { chat_id: *chat_id })
        }
        (Source::User | Source::Scheduler, _) if cfg.telegram.enabled => cfg
            .telegram
            .contacts
            .get(&first.from)
            .map(|id| Target::Telegram { chat_id: *id }),
        _ => None,
    }
}

/// `(replies to send: (ids, text)), (ids whose send is uncertain)`.
pub type Undelivered = (Vec<(Vec<String>, String)>, Vec<Vec<String>>);

/// Replies of a trail that still need a send: final, non-silent assistant messages and
/// failures whose ids have no `delivery` record at all. Those with an intent but no outcome
/// are returned separately: they are logged, never repeated.
pub fn undelivered(lines: &[TrailLine]) -> Undelivered {
    use std::collections::HashMap;
    let mut status: HashMap<&str, DeliveryStatus> = HashMap::new();
    for l in lines {
        if let Event::Delivery {
            reply_to,
            status: s,
            ..
        } = &l.event
        {
            for id in reply_to {
                let e = status.entry(id.as_str()).or_insert(*s);
                if *s != DeliveryStatus::Intent {
                    *e = *s;
                }
            }
        }
    }
    let mut todo = Vec::new();
    let mut uncertain = Vec::new();
    for l in lines {
        let (ids, text) = match &l.event {
            Event::Message(m) if m.is_final && !m.silent => match &m.message {
                crate::message::Message::Assistant { text, .. } => (&m.reply_to, text.clone()),
                _ => continue,
            },
            Event::Failure {
                reply_to, reply, ..
            } => (reply_to, reply.clone()),
            _ => continue,
        };
        let Some(first) = ids.first() else { continue };
        match status.get(first.as_str()) {
            None => todo.push((ids.clone(), text)),
            Some(DeliveryStatus::Intent) => uncertain.push(ids.clone()),
            Some(_) => {}
        }
    }
    (todo, uncertain)
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
        }
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
        assert_eq!(
            todo,
            vec![
                (vec!["b".to_string()], "lost b".to_string()),
                (vec!["e".to_string()], "sorry".to_string())
            ]
        );
        assert_eq!(uncertain, vec![vec!["c".to_string()]]);
    }
}
