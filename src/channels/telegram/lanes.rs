//! The per-chat lanes of the Telegram poller (SPEC §5.2, §10.3): which updates above the
//! offset are in hand, finished or left for a later poll, each chat's messages one at a time
//! and in order, different chats side by side. The poll loop (`poll.rs`) feeds them and
//! confirms the offset they compute.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use super::inbound::TgInbound;
use super::poll::TgSink;
use crate::backoff::Backoff;

/// At most this many chats have an update in hand at once (downloads and transcriptions run
/// side by side up to it); an update of another chat stays unconfirmed and is taken when a
/// lane is free.
pub const MAX_LANES: usize = 16;

/// One update's intake, finished by its lane.
pub(super) struct Finished {
    pub chat: i64,
    pub update_id: i64,
    pub result: Result<(), String>,
}

/// The per-chat lanes (SPEC §5.2, §10.3): the updates of one chat go to the sink one at a
/// time, in order; different chats run side by side, at most [`MAX_LANES`] of them, so a
/// slow download or transcription holds only its own chat. The bookkeeping says which
/// updates above the offset are finished, so the offset confirmed to Telegram (and saved)
/// never passes one whose intake is not done: a crash offers exactly the unfinished ones (and
/// finished ones above them, which intake drops by their id) again.
pub(super) struct Lanes {
    sink: Arc<dyn TgSink>,
    /// Updates handed to a lane and not finished: running, or waiting behind their chat's.
    open: BTreeSet<i64>,
    /// Updates finished (or with nothing to do) above the offset: not handed out again.
    done: BTreeSet<i64>,
    /// Updates seen and left for a later poll: their chat is held after a failed intake, or
    /// no lane was free.
    deferred: BTreeSet<i64>,
    /// The highest update id seen.
    max_seen: Option<i64>,
    /// Per chat with a lane: the messages waiting behind the running one.
    queues: HashMap<i64, VecDeque<TgInbound>>,
    /// Chats whose intake failed, not taken again before this instant (backoff).
    held: HashMap<i64, tokio::time::Instant>,
    hold_backoff: Backoff,
    tasks: tokio::task::JoinSet<Finished>,
    /// Task id → (chat, update id), so that even a task that ended abnormally is accounted.
    running: HashMap<tokio::task::Id, (i64, i64)>,
}

impl Lanes {
    pub(super) fn new(
        sink: Arc<dyn TgSink>,
        backoff_min: Duration,
        backoff_max: Duration,
    ) -> Lanes {
        Lanes {
            sink,
            open: Default::default(),
            done: Default::default(),
            deferred: Default::default(),
            max_seen: None,
            queues: Default::default(),
            held: Default::default(),
            hold_backoff: Backoff::exponential(backoff_min, backoff_max),
            tasks: tokio::task::JoinSet::new(),
            running: Default::default(),
        }
    }

    /// Whether Telegram holds updates of ours unconfirmed (so a poll answers at once).
    pub(super) fn busy(&self) -> bool {
        !self.open.is_empty() || !self.deferred.is_empty()
    }

    /// Whether `id` is already in hand or finished (a poll lists it again until confirmed).
    pub(super) fn known(&self, id: i64) -> bool {
        self.open.contains(&id) || self.done.contains(&id)
    }

    /// `id` is listed by this poll: it counts as seen, and as taken up again if it was left.
    pub(super) fn seen(&mut self, id: i64) {
        self.max_seen = Some(self.max_seen.map_or(id, |m| m.max(id)));
        self.deferred.remove(&id);
    }

    /// Updates left earlier that this poll did not list any more are gone from Telegram.
    pub(super) fn forget_unlisted(&mut self, listed: &HashSet<i64>) {
        self.deferred.retain(|id| listed.contains(id));
    }

    /// `id` needs no intake (a button press, an ignored or refused update): finished.
    pub(super) fn skip(&mut self, id: i64) {
        self.done.insert(id);
    }

    /// Hand `msg` to its chat's lane, or leave it for a later poll.
    pub(super) fn offer(&mut self, msg: TgInbound) {
        let (chat, id) = (msg.chat_id, msg.update_id);
        let now = tokio::time::Instant::now();
        self.held.retain(|_, until| *until > now);
        if self.held.contains_key(&chat) {
            self.deferred.insert(id);
            return;
        }
        if let Some(queue) = self.queues.get_mut(&chat) {
            queue.push_back(msg);
            self.open.insert(id);
            return;
        }
        if self.queues.len() >= MAX_LANES {
            self.deferred.insert(id);
            return;
        }
        self.queues.insert(chat, Default::default());
        self.open.insert(id);
        self.start(msg);
    }

    fn start(&mut self, msg: TgInbound) {
        use futures::FutureExt;
        let (chat, update_id) = (msg.chat_id, msg.update_id);
        let sink = self.sink.clone();
        let task = self.tasks.spawn(async move {
            // A panicking intake is a failed one: retried later, the other chats go on.
            let result = std::panic::AssertUnwindSafe(sink.accept(msg))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| Err("the intake panicked".to_string()));
            Finished {
                chat,
                update_id,
                result,
            }
        });
        self.running.insert(task.id(), (chat, update_id));
    }

    /// The next finished intake (pending while none runs).
    pub(super) async fn next(&mut self) -> Finished {
        loop {
            match self.tasks.join_next_with_id().await {
                Some(Ok((id, f))) => {
                    self.running.remove(&id);
                    return f;
                }
                Some(Err(e)) => {
                    if let Some((chat, update_id)) = self.running.remove(&e.id()) {
                        return Finished {
                            chat,
                            update_id,
                            result: Err(format!("the intake task ended: {e}")),
                        };
                    }
                }
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// Account a finished intake: its chat's next message starts, or, after a failure, the
    /// chat's waiting messages are left (asked again) and the chat is held for a backoff.
    pub(super) fn finish(&mut self, f: &Finished) {
        self.open.remove(&f.update_id);
        match &f.result {
            Ok(()) => {
                self.done.insert(f.update_id);
                self.hold_backoff.reset();
                let next = self.queues.get_mut(&f.chat).and_then(|q| q.pop_front());
                match next {
                    Some(msg) => self.start(msg),
                    None => {
                        self.queues.remove(&f.chat);
                    }
                }
            }
            Err(_) => {
                self.deferred.insert(f.update_id);
                for msg in self.queues.remove(&f.chat).unwrap_or_default() {
                    self.open.remove(&msg.update_id);
                    self.deferred.insert(msg.update_id);
                }
                let until = tokio::time::Instant::now() + self.hold_backoff.next_delay();
                self.held.insert(f.chat, until);
            }
        }
    }

    /// The offset to confirm: the first update not finished, else past the last one seen
    /// (never below `current`); finished ones below it are forgotten. Also whether it passes
    /// a finished update (then it is worth saving: a move up to the first update in hand
    /// confirms nothing).
    pub(super) fn offset(&mut self, current: i64) -> (i64, bool) {
        let Some(max) = self.max_seen else {
            return (current, false);
        };
        let first_open = [self.open.first(), self.deferred.first()]
            .into_iter()
            .flatten()
            .min()
            .copied();
        let offset = first_open.unwrap_or(max + 1).max(current);
        let still = self.done.split_off(&offset);
        let passed = !self.done.is_empty();
        self.done = still;
        (offset, passed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::future::BoxFuture;
    use std::sync::Mutex;
    use tokio::sync::Semaphore;

    /// Accepts after its chat's gate lets it through; fails the update ids in `fail`.
    struct GatedSink {
        gates: HashMap<i64, Arc<Semaphore>>,
        fail: Mutex<HashSet<i64>>,
    }

    impl TgSink for GatedSink {
        fn accept(&self, msg: TgInbound) -> BoxFuture<'_, Result<(), String>> {
            Box::pin(async move {
                if let Some(gate) = self.gates.get(&msg.chat_id) {
                    gate.acquire().await.map_err(|e| e.to_string())?.forget();
                }
                match self.fail.lock().unwrap().remove(&msg.update_id) {
                    true => Err("disk full".into()),
                    false => Ok(()),
                }
            })
        }
    }

    fn msg(chat: i64, update_id: i64) -> TgInbound {
        TgInbound {
            update_id,
            chat_id: chat,
            user_id: chat,
            message_id: 1,
            from_name: format!("tg:{chat}"),
            session_key: format!("tg:{chat}"),
            text: "hi".into(),
            media: None,
            is_command: None,
        }
    }

    fn lanes(gated: &[i64], fail: &[i64]) -> (Lanes, HashMap<i64, Arc<Semaphore>>) {
        let gates: HashMap<i64, Arc<Semaphore>> = gated
            .iter()
            .map(|c| (*c, Arc::new(Semaphore::new(0))))
            .collect();
        let sink = Arc::new(GatedSink {
            gates: gates.clone(),
            fail: Mutex::new(fail.iter().copied().collect()),
        });
        let hold = Duration::from_millis(50);
        (Lanes::new(sink, hold, hold), gates)
    }

    fn offer(l: &mut Lanes, chat: i64, id: i64) {
        l.seen(id);
        l.offer(msg(chat, id));
    }

    async fn finish_next(l: &mut Lanes) -> (i64, bool) {
        let f = l.next().await;
        l.finish(&f);
        (f.update_id, f.result.is_ok())
    }

    #[tokio::test]
    async fn the_offset_waits_for_the_first_unfinished_update() {
        let (mut l, gates) = lanes(&[1], &[]);
        offer(&mut l, 1, 10);
        offer(&mut l, 2, 11);
        offer(&mut l, 1, 12);
        assert_eq!(
            l.offset(0),
            (10, false),
            "up to the first in hand: nothing passed"
        );
        // Chat 2 is not held by chat 1's slow update.
        assert_eq!(finish_next(&mut l).await, (11, true));
        assert_eq!(l.offset(10), (10, false));
        assert!(l.known(11) && l.known(12) && l.busy());
        gates[&1].add_permits(1);
        assert_eq!(finish_next(&mut l).await, (10, true));
        assert_eq!(l.offset(10), (12, true), "10 and 11 passed; 12 runs now");
        gates[&1].add_permits(1);
        assert_eq!(finish_next(&mut l).await, (12, true));
        assert_eq!(l.offset(12), (13, true));
        assert!(
            !l.busy() && !l.known(12),
            "finished ones below the offset are forgotten"
        );
        // Skipped updates count as finished.
        l.seen(13);
        l.skip(13);
        assert_eq!(l.offset(13), (14, true));
    }

    #[tokio::test]
    async fn a_failure_leaves_the_chat_for_a_later_poll() {
        let (mut l, _) = lanes(&[], &[20]);
        offer(&mut l, 1, 20);
        offer(&mut l, 1, 21);
        offer(&mut l, 2, 22);
        let mut got = vec![finish_next(&mut l).await, finish_next(&mut l).await];
        got.sort();
        assert_eq!(got, vec![(20, false), (22, true)], "21 waits behind 20");
        assert!(!l.known(20) && !l.known(21), "both asked again");
        assert_eq!(l.offset(0), (20, false));
        // Listed again at once: the chat is held (backoff), so both are left again.
        l.seen(20);
        l.offer(msg(1, 20));
        assert!(!l.known(20) && l.busy());
        tokio::time::sleep(Duration::from_millis(60)).await;
        l.seen(20);
        l.offer(msg(1, 20));
        l.seen(21);
        l.offer(msg(1, 21));
        assert_eq!(finish_next(&mut l).await, (20, true));
        assert_eq!(finish_next(&mut l).await, (21, true));
        assert_eq!(l.offset(20), (23, true));
    }

    #[tokio::test]
    async fn updates_telegram_no_longer_lists_are_forgotten() {
        let (mut l, _) = lanes(&[1], &[]);
        for chat in 1..=MAX_LANES as i64 {
            offer(&mut l, chat, 100 + chat);
        }
        offer(&mut l, 99, 200);
        assert!(!l.known(200), "no lane free: left for a later poll");
        assert_eq!(l.offset(0).0, 101);
        l.forget_unlisted(&[101].into_iter().collect());
        assert!(l.busy(), "chat 1 still runs");
        let _ = l.offset(0);
        assert!(!l.deferred.contains(&200));
    }
}
