//! The per-session queues with debounce (SPEC §5.3, §16.9): one unbounded channel per session
//! key that has a worker, bounded by counting — intake reserves a slot (`try_reserve`) before
//! it records a message, so a full queue refuses instead of dropping — a semaphore for
//! `max_concurrent_sessions`, the session states of recently idle keys, and the debounce that
//! merges one sender's messages of one chat into one turn.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::agent::Work;
use crate::channels::intake::QueueFull;
use crate::control::Source;
use crate::monitor::Monitor;
use crate::session::{Intake, Route, SessionState, SessionStore};

/// A job for one session.
#[derive(Debug)]
pub enum Job {
    Message(Work),
    /// Archive the session (through the queue so it never races a running message).
    Reset {
        reason: String,
    },
    /// Archive session `session_id` of this key as `Reset` does, if it is still idle for
    /// `idle_for` when the job's turn comes (`[retention] idle_session_after`).
    Expire {
        session_id: String,
        idle_for: Duration,
    },
    /// Mark session `session_id` of this key settled, if it still is the key's session and
    /// nothing else of the key waits: queued when the session's delivery lane ran dry after a
    /// message (the mark could not be written while a reply was still being delivered).
    Settle {
        session_id: String,
    },
    /// Change or read the session's settings (SPEC §18.2), in order with its messages.
    Control(super::session_control::Control),
}

/// Session states kept in memory for sessions whose worker has exited (the most recently
/// used ones). A worker exits as soon as its queue is empty, so memory held for idle sessions
/// is bounded by this count and by `[behavior] idle_session_cache_bytes` (SPEC §16.3: by size,
/// not only by count), not by the number of session keys ever seen; a session not in here
/// loads its snapshot and the trail lines after it again (docs/BENCHMARKS.md, soak). A state
/// evicted with lines its snapshot lacks is snapshotted (moved to the snapshot thread, no
/// copy), so the next load folds few lines.
const IDLE_STATES: usize = 8;

/// A state in the cache, with its size when it was parked ([`parked_bytes`]; a parked state
/// does not change).
struct Parked {
    key: String,
    state: SessionState,
    bytes: usize,
}

/// The memory a state takes in the cache: what it holds (`SessionState::heap_bytes`) and its
/// entry, so no state is free and a bound of 0 keeps none.
fn parked_bytes(state: &SessionState) -> usize {
    state.heap_bytes() + std::mem::size_of::<Parked>()
}

/// The states of sessions without a worker, least recently used first, within `max_count`
/// states and `max_bytes` bytes together.
struct IdleStates {
    entries: VecDeque<Parked>,
    /// The sum of the entries' `bytes`.
    bytes: usize,
    max_count: usize,
    max_bytes: usize,
}

impl IdleStates {
    fn new(max_count: usize, max_bytes: usize) -> IdleStates {
        IdleStates {
            entries: VecDeque::new(),
            bytes: 0,
            max_count,
            max_bytes,
        }
    }

    fn take(&mut self, key: &str) -> Option<SessionState> {
        let i = self.entries.iter().position(|p| p.key == key)?;
        let parked = self.entries.remove(i)?;
        self.bytes -= parked.bytes;
        Some(parked.state)
    }

    /// Keep `state` as the newest; returns the states evicted, least recently used first, to
    /// stay within both bounds, or `state` itself when it alone is over the byte bound (the
    /// others stay). An older entry of the same key is dropped: `state` supersedes it.
    fn put(&mut self, key: String, state: SessionState) -> Vec<SessionState> {
        drop(self.take(&key));
        let bytes = parked_bytes(&state);
        if bytes > self.max_bytes {
            return vec![state];
        }
        self.entries.push_back(Parked { key, state, bytes });
        self.bytes += bytes;
        let mut evicted = Vec::new();
        while self.entries.len() > self.max_count || self.bytes > self.max_bytes {
            let Some(old) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= old.bytes;
            evicted.push(old.state);
        }
        evicted
    }

    /// Every state, emptying the cache.
    fn drain(&mut self) -> Vec<SessionState> {
        self.bytes = 0;
        self.entries.drain(..).map(|p| p.state).collect()
    }
}

/// Whether messages like `first` are merged when they arrive within the debounce window: a
/// chat channel's (it has a chat) and the FIFO's user messages.
fn debounced(first: &Intake) -> bool {
    first.source == Source::User || first.route.as_ref().and_then(Route::address).is_some()
}

/// Whether `next` may be merged into a turn that began with `first` (SPEC §5.3, §16.9): the
/// same source, the same sender and — for a chat channel — the same chat (and thread), so one
/// reply never answers messages of two chats.
fn same_thread(first: &Intake, next: &Intake) -> bool {
    fn chat(i: &Intake) -> Option<&crate::message::Address> {
        i.route.as_ref().and_then(Route::address)
    }
    first.source == next.source && first.from == next.from && chat(first) == chat(next)
}

/// Whether one more message fits: `session` waiting in its session, `total` in all.
fn room_for_one(
    session: usize,
    total: usize,
    max_session: usize,
    max_total: usize,
) -> Result<(), QueueFull> {
    if total >= max_total {
        return Err(QueueFull::Total { max: max_total });
    }
    if session >= max_session {
        return Err(QueueFull::Session { max: max_session });
    }
    Ok(())
}

/// A reserved place in a session's queue (see [`Queue::try_reserve`]); released on drop
/// unless used.
pub struct QueueSlot {
    queue: Arc<Queue>,
    key: String,
    armed: bool,
}

impl QueueSlot {
    /// The session key the slot is for; the slot is used (not released) from now on.
    pub(super) fn take(mut self) -> String {
        self.armed = false;
        std::mem::take(&mut self.key)
    }
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        if self.armed {
            self.queue.release(&self.key);
        }
    }
}

/// The queues of all sessions.
pub struct Queue {
    /// The queue of each session that has a worker. A worker removes its own entry (under this
    /// lock, after finding its queue empty) when it exits.
    workers: Mutex<HashMap<String, mpsc::UnboundedSender<Job>>>,
    idle: std::sync::Mutex<IdleStates>,
    /// Where states evicted from `idle` (and all of them at shutdown) are snapshotted.
    store: Arc<SessionStore>,
    permits: Arc<Semaphore>,
    /// Jobs queued and not yet started (or reserved by intake), per session key; keys with
    /// none are removed. `depth` is their sum.
    queued: std::sync::Mutex<HashMap<String, usize>>,
    depth: AtomicUsize,
    max_per_session: usize,
    max_total: usize,
    monitor: Arc<Monitor>,
}

impl Queue {
    pub fn new(
        behavior: &crate::config::BehaviorConfig,
        monitor: Arc<Monitor>,
        store: Arc<SessionStore>,
    ) -> Arc<Queue> {
        Arc::new(Queue {
            workers: Mutex::new(HashMap::new()),
            idle: std::sync::Mutex::new(IdleStates::new(
                IDLE_STATES,
                behavior.idle_session_cache_bytes,
            )),
            store,
            permits: Arc::new(Semaphore::new(behavior.max_concurrent_sessions.max(1))),
            queued: std::sync::Mutex::new(HashMap::new()),
            depth: AtomicUsize::new(0),
            max_per_session: behavior.max_queued_per_session,
            max_total: behavior.max_queued_total,
            monitor,
        })
    }

    /// Jobs queued and not yet started.
    pub fn depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    /// Sessions with a worker right now.
    pub async fn workers(&self) -> usize {
        self.workers.lock().await.len()
    }

    fn queued_counts(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.queued.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn idle_states(&self) -> std::sync::MutexGuard<'_, IdleStates> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserve a slot for a message of `key` before it is recorded (SPEC §16.9, bounded
    /// queues): refused when that session already has `max_queued_per_session` messages
    /// waiting or all sessions together `max_queued_total`.
    pub fn try_reserve(self: &Arc<Self>, key: &str) -> Result<QueueSlot, QueueFull> {
        let mut queued = self.queued_counts();
        let n = queued.get(key).copied().unwrap_or(0);
        room_for_one(n, self.depth(), self.max_per_session, self.max_total)?;
        queued.insert(key.to_string(), n + 1);
        self.depth.fetch_add(1, Ordering::Relaxed);
        drop(queued);
        self.monitor.set_queue_depth(self.depth());
        Ok(QueueSlot {
            queue: self.clone(),
            key: key.to_string(),
            armed: true,
        })
    }

    /// Count one job of `key` without a cap (recovery, resets).
    pub fn add(&self, key: &str) {
        {
            let mut queued = self.queued_counts();
            *queued.entry(key.to_string()).or_insert(0) += 1;
            self.depth.fetch_add(1, Ordering::Relaxed);
        }
        self.monitor.set_queue_depth(self.depth());
    }

    /// Jobs of `key` queued or reserved and not yet started.
    pub fn queued_for(&self, key: &str) -> usize {
        self.queued_counts().get(key).copied().unwrap_or(0)
    }

    /// One job of `key` left the queue (started, or its slot was given back).
    pub fn release(&self, key: &str) {
        {
            let mut queued = self.queued_counts();
            if let Some(n) = queued.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    queued.remove(key);
                }
                self.depth.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.monitor.set_queue_depth(self.depth());
    }

    /// Hand `job` to the worker of `key`; when there is none, the receiver a new worker must
    /// run.
    pub async fn send(&self, key: &str, job: Job) -> Option<mpsc::UnboundedReceiver<Job>> {
        let mut workers = self.workers.lock().await;
        let job = match workers.get(key) {
            Some(tx) => match tx.send(job) {
                Ok(()) => return None,
                Err(mpsc::error::SendError(job)) => job,
            },
            None => job,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(job);
        workers.insert(key.to_string(), tx);
        Some(rx)
    }

    /// The state a previous worker of `key` left, if still cached.
    pub fn idle_state(&self, key: &str) -> Option<SessionState> {
        self.idle_states().take(key)
    }

    /// Snapshot every cached idle state that lacks trail lines, emptying the cache (a graceful
    /// stop, SPEC §7). Returns how many were queued; the caller flushes the snapshot writer.
    pub fn snapshot_idle_states(&self) -> usize {
        let mut idle = self.idle_states();
        (idle.drain().into_iter())
            .map(|s| self.store.snapshot_if_dirty(s))
            .filter(|queued| *queued)
            .count()
    }

    /// The next job of a worker: a held one, else the next queued. `None`: the worker exits
    /// (its queue is empty; `state` is parked for the next worker of this key).
    pub async fn next_job(
        &self,
        key: &str,
        rx: &mut mpsc::UnboundedReceiver<Job>,
        held: &mut VecDeque<Job>,
        state: &mut Option<SessionState>,
    ) -> Option<Job> {
        if let Some(j) = held.pop_front() {
            return Some(j);
        }
        match rx.try_recv() {
            Ok(j) => {
                self.release(key);
                Some(j)
            }
            Err(TryRecvError::Disconnected) => None,
            Err(TryRecvError::Empty) => {
                // `send` sends under the same lock: either a job slipped in before we took it,
                // or no job can reach this queue once the entry is gone. The state is parked
                // before the lock is released, so the next worker of this key finds it.
                let mut workers = self.workers.lock().await;
                match rx.try_recv() {
                    Ok(j) => {
                        drop(workers);
                        self.release(key);
                        Some(j)
                    }
                    Err(_) => {
                        workers.remove(key);
                        if let Some(s) = state.take() {
                            // Evicted states are handed to the snapshot writer while the cache
                            // is locked: a worker of an evicted key that starts now finds no
                            // state and loads one, so its snapshots are handed over after these.
                            let mut idle = self.idle_states();
                            for old in idle.put(key.to_string(), s) {
                                self.store.snapshot_if_dirty(old);
                            }
                        }
                        None
                    }
                }
            }
        }
    }

    /// A permit to run one message (`max_concurrent_sessions`).
    pub async fn permit(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().acquire_owned().await.ok()
    }

    /// Merge further messages of the same sender and chat that arrive within the debounce
    /// `window` (restarted by each one, capped at 5 windows) into `work`. Other jobs are held
    /// in order. Only new messages of debounced sources (the chat channels, the FIFO) wait.
    pub async fn debounce(
        &self,
        key: &str,
        window: Duration,
        stop: &CancellationToken,
        work: &mut Work,
        rx: &mut mpsc::UnboundedReceiver<Job>,
        held: &mut VecDeque<Job>,
    ) {
        let Some(first) = work.intakes.first().cloned() else {
            return;
        };
        if work.resume || !debounced(&first) || window.is_zero() || !held.is_empty() {
            return;
        }
        let deadline = tokio::time::Instant::now() + window * 5;
        loop {
            let until = (tokio::time::Instant::now() + window).min(deadline);
            let next = tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(until) => return,
                j = rx.recv() => j,
            };
            match next {
                Some(Job::Message(w))
                    if !w.resume && w.intakes.first().is_some_and(|i| same_thread(&first, i)) =>
                {
                    self.release(key);
                    work.intakes.extend(w.intakes);
                }
                Some(other) => {
                    self.release(key);
                    held.push_back(other);
                    return;
                }
                None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(id: &str) -> SessionState {
        SessionState::new(id, id, "primary", 0)
    }

    fn tg(from: &str, chat: i64) -> Intake {
        Intake {
            id: format!("{from}-{chat}"),
            source: Source::Telegram,
            from: from.into(),
            text: "x".into(),
            tier: None,
            attachments: vec![],
            route: Some(Route::Chat {
                to: crate::message::Address::new("telegram", chat.to_string()),
                message: None,
            }),
            notify_meta: None,
            relayed_from: None,
        }
    }

    #[test]
    fn queues_are_capped_per_session_and_in_total() {
        assert_eq!(room_for_one(0, 0, 8, 1024), Ok(()));
        assert_eq!(room_for_one(7, 500, 8, 1024), Ok(()));
        assert_eq!(
            room_for_one(8, 8, 8, 1024),
            Err(QueueFull::Session { max: 8 })
        );
        assert_eq!(
            room_for_one(0, 1024, 8, 1024),
            Err(QueueFull::Total { max: 1024 })
        );
        let msg = QueueFull::Session { max: 8 }.to_string();
        assert!(msg.contains("[behavior] max_queued_per_session"), "{msg}");
        let msg = QueueFull::Total { max: 3 }.to_string();
        assert!(msg.contains("[behavior] max_queued_total"), "{msg}");
    }

    /// Debounce merges one sender's messages of one chat only (SPEC §16.9).
    #[test]
    fn only_one_senders_messages_of_one_chat_are_merged() {
        assert!(same_thread(&tg("Alice", 1), &tg("Alice", 1)));
        assert!(!same_thread(&tg("Alice", 1), &tg("Alice", -5)));
        assert!(!same_thread(&tg("Alice", -5), &tg("Bob", -5)));
        let mut fifo = tg("Alice", 1);
        fifo.source = Source::User;
        fifo.route = None;
        assert!(!same_thread(&tg("Alice", 1), &fifo));
        assert!(same_thread(&fifo, &fifo.clone()));
        assert!(debounced(&tg("Alice", 1)) && debounced(&fifo));
        let mut room = tg("Alice", 1);
        room.source = Source::Terminal;
        room.route = Some(Route::Chat {
            to: crate::message::Address::new("matrix", "!r:example.org"),
            message: None,
        });
        assert!(
            debounced(&room),
            "every chat channel's messages are debounced"
        );
        for source in [Source::Http, Source::System, Source::Api] {
            let mut other = fifo.clone();
            other.source = source;
            assert!(!debounced(&other), "{source}");
        }
    }

    #[test]
    fn idle_states_keep_the_most_recent_few() {
        let mut idle = IdleStates::new(8, usize::MAX);
        for n in 0..20usize {
            let evicted = idle.put(format!("k{n}"), state(&format!("s{n}")));
            assert!(idle.entries.len() <= 8);
            // The least recently used one goes out, handed back to be snapshotted.
            let gone: Vec<String> = evicted.into_iter().map(|s| s.id).collect();
            match n.checked_sub(8) {
                Some(old) => assert_eq!(gone, [format!("s{old}")]),
                None => assert!(gone.is_empty()),
            }
        }
        assert!(idle.take("k11").is_none(), "evicted: least recently used");
        assert_eq!(idle.take("k12").map(|s| s.id), Some("s12".to_string()));
        assert!(
            idle.take("k12").is_none(),
            "taken once: the worker owns it now"
        );
        // Putting a key again replaces its entry and makes it the newest.
        idle.put("k13".into(), state("new13"));
        assert_eq!(idle.entries.len(), 7);
        assert_eq!(
            idle.entries
                .back()
                .map(|p| (p.key.as_str(), p.state.id.as_str())),
            Some(("k13", "new13"))
        );
        assert_eq!(idle.drain().len(), 7);
        assert!(idle.entries.is_empty());
        assert_eq!(idle.bytes, 0);
    }

    /// A state whose history holds `chars` characters of text.
    fn sized(id: &str, chars: usize) -> SessionState {
        let mut s = state(id);
        s.messages
            .push(crate::message::Message::user_text("x".repeat(chars)));
        s
    }

    fn keys(idle: &IdleStates) -> Vec<&str> {
        idle.entries.iter().map(|p| p.key.as_str()).collect()
    }

    /// Issue 33: the cache is bounded by bytes too (SPEC §16.3): the least recently used
    /// states go first until the kept ones fit, whatever the count allows; the rendered
    /// request bytes a state holds count.
    #[test]
    fn idle_states_are_bounded_by_bytes_least_recently_used_first() {
        let one = parked_bytes(&sized("probe", 10_000));
        assert!(one >= 10_000, "{one}");
        let mut idle = IdleStates::new(8, 3 * one + one / 2);
        for n in 0..3 {
            assert!(
                idle.put(format!("k{n}"), sized(&format!("s{n}"), 10_000))
                    .is_empty()
            );
        }
        // k0 is used again (taken by a worker, parked after its message): now the newest.
        let s0 = idle.take("k0").unwrap();
        assert!(idle.put("k0".into(), s0).is_empty());
        assert_eq!(keys(&idle), ["k1", "k2", "k0"]);
        let gone = idle.put("k3".into(), sized("s3", 10_000));
        assert_eq!(
            gone.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["s1"]
        );
        assert_eq!(keys(&idle), ["k2", "k0", "k3"]);
        assert_eq!(idle.bytes, 3 * one);
        // Twice as big: two states make room for it.
        let gone = idle.put("k4".into(), sized("s4", 20_000));
        assert_eq!(
            gone.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["s2", "s0"]
        );
        assert_eq!(keys(&idle), ["k3", "k4"]);
        // The request bytes rendered for a state's messages count as well.
        let rendered = sized("s5", 100);
        let cache = rendered.rendered.sync(
            crate::message::rendered::WireFormat::Anthropic,
            &rendered.messages,
            |_, r| {
                r.bytes = vec![b'r'; 2 * one];
                Ok::<(), ()>(())
            },
        );
        drop(cache);
        assert!(rendered.heap_bytes() >= 2 * one);
        let gone = idle.put("k5".into(), rendered);
        assert_eq!(
            gone.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["s3", "s4"]
        );
        assert_eq!(keys(&idle), ["k5"]);
        let total: usize = idle.entries.iter().map(|p| parked_bytes(&p.state)).sum();
        assert_eq!(idle.bytes, total);
        assert!(idle.bytes <= idle.max_bytes);
    }

    /// A state larger than the byte bound is not kept (handed back to be snapshotted), and
    /// it evicts nothing; `0` keeps none.
    #[test]
    fn a_state_over_the_byte_bound_alone_is_not_kept() {
        let mut idle = IdleStates::new(8, 50_000);
        assert!(idle.put("a".into(), sized("sa", 10_000)).is_empty());
        assert!(idle.put("b".into(), sized("sb", 10_000)).is_empty());
        let gone = idle.put("big".into(), sized("sbig", 60_000));
        assert_eq!(
            gone.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["sbig"]
        );
        assert_eq!(keys(&idle), ["a", "b"], "the others stay");
        // A key parked again with an oversized state loses its older entry too.
        let gone = idle.put("a".into(), sized("sa2", 60_000));
        assert_eq!(
            gone.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["sa2"]
        );
        assert_eq!(keys(&idle), ["b"]);
        assert!(idle.take("a").is_none(), "no stale state of a is served");

        let mut none = IdleStates::new(8, 0);
        let gone = none.put("k".into(), state("s"));
        assert_eq!(gone.len(), 1);
        assert!(none.entries.is_empty());
        assert_eq!(none.bytes, 0);
    }
}
