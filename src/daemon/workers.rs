//! The queue behind intake (SPEC §5.3–§5.5): one worker task per session key processes that
//! session's jobs one at a time in arrival order; different sessions run concurrently up to
//! `max_concurrent_sessions` (a semaphore). Messages of one sender arriving within
//! `debounce_ms` are merged into one turn (one sender, one chat). After each message the reply
//! is delivered (with intent/done records) and anyone waiting for it (HTTP `/chat`) is told.
//! Queues are bounded by counting, not by the channel: intake reserves a slot
//! (`try_reserve`) before it records a message, so a full queue refuses instead of dropping.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{Mutex, Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use futures::future::BoxFuture;

use super::delivery::{Outbound, Target, target_for};
use crate::agent::{Agent, Finish, Work};
pub use crate::channels::intake::{Completion, QueueFull};
use crate::config::Config;
use crate::control::Source;
use crate::memory::consolidate::Consolidator;
use crate::metrics::Metrics;
use crate::monitor::Monitor;
use crate::session::{DeliveryStatus, Event, SessionHandle, SessionState, SessionStore};

/// What the dispatcher asks of the agent: the model for a unit of work, running it, and the
/// after-message check (compaction). Implemented by [`Agent`]; the tests use a fake.
pub trait Runner: Send + Sync {
    fn route(&self, work: &Work) -> String;
    fn process<'a>(
        &'a self,
        session: &'a Arc<SessionHandle>,
        state: &'a mut SessionState,
        work: &'a Work,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Finish>;
    fn after_message<'a>(
        &'a self,
        session: &'a Arc<SessionHandle>,
        state: &'a mut SessionState,
        work: &'a Work,
    ) -> BoxFuture<'a, ()>;
}

impl Runner for Agent {
    fn route(&self, work: &Work) -> String {
        self.route_work(work)
    }
    fn process<'a>(
        &'a self,
        session: &'a Arc<SessionHandle>,
        state: &'a mut SessionState,
        work: &'a Work,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Finish> {
        Box::pin(Agent::process(self, session, state, work, cancel))
    }
    fn after_message<'a>(
        &'a self,
        session: &'a Arc<SessionHandle>,
        state: &'a mut SessionState,
        work: &'a Work,
    ) -> BoxFuture<'a, ()> {
        Box::pin(Agent::after_message(self, session, state, work))
    }
}

/// What a [`Dispatcher`] is built from: it holds its own dependencies, not the agent's.
pub struct DispatcherDeps {
    pub cfg: Arc<Config>,
    pub runner: Arc<dyn Runner>,
    pub store: Arc<SessionStore>,
    pub monitor: Arc<Monitor>,
    pub metrics: Arc<Metrics>,
    /// Closed sessions are consolidated when `memory.consolidation_enabled`.
    pub consolidator: Option<Consolidator>,
    pub webhook: Option<crate::api::webhook::Webhook>,
    /// Where replies go (Telegram), when a channel is configured.
    pub outbound: Option<Arc<dyn Outbound>>,
}

/// A job for one session.
#[derive(Debug)]
pub enum Job {
    Message(Work),
    /// Archive the session (through the queue so it never races a running message).
    Reset {
        reason: String,
    },
}

/// Session states kept in memory for sessions whose worker has exited (the most recently
/// used ones). A worker exits as soon as its queue is empty, so memory held for idle sessions
/// is bounded by this, not by the number of session keys ever seen; a session not in here
/// loads its snapshot again (docs/BENCHMARKS.md, soak).
const IDLE_STATES: usize = 8;

/// The states of sessions without a worker, least recently used first.
#[derive(Default)]
struct IdleStates {
    entries: VecDeque<(String, SessionState)>,
}

impl IdleStates {
    fn take(&mut self, key: &str) -> Option<SessionState> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        self.entries.remove(i).map(|(_, s)| s)
    }

    fn put(&mut self, key: String, state: SessionState, cap: usize) {
        self.entries.retain(|(k, _)| *k != key);
        self.entries.push_back((key, state));
        while self.entries.len() > cap {
            self.entries.pop_front();
        }
    }
}

/// Sources whose messages are merged when they arrive within the debounce window.
fn debounced(source: Source) -> bool {
    matches!(source, Source::Telegram | Source::User)
}

/// Whether `next` may be merged into a turn that began with `first` (SPEC §5.3, §16.9): the
/// same source, the same sender and — for Telegram — the same chat, so one reply never
/// answers messages of two chats.
fn same_thread(first: &crate::session::Intake, next: &crate::session::Intake) -> bool {
    let chat = |i: &crate::session::Intake| match &i.route {
        Some(crate::session::Route::Telegram { chat_id, .. }) => Some(*chat_id),
        _ => None,
    };
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

/// A reserved place in a session's queue (see [`Dispatcher::try_reserve`]); released on drop
/// unless used.
pub struct QueueSlot {
    dispatcher: Arc<Dispatcher>,
    key: String,
    armed: bool,
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        if self.armed {
            self.dispatcher.release(&self.key);
        }
    }
}

/// Routes jobs to per-session workers.
pub struct Dispatcher {
    cfg: Arc<Config>,
    runner: Arc<dyn Runner>,
    store: Arc<SessionStore>,
    monitor: Arc<Monitor>,
    metrics: Arc<Metrics>,
    consolidator: Option<Consolidator>,
    /// The queue of each session that has a worker. A worker removes its own entry (under this
    /// lock, after finding its queue empty) when it exits.
    workers: Mutex<HashMap<String, mpsc::UnboundedSender<Job>>>,
    idle: std::sync::Mutex<IdleStates>,
    permits: Arc<Semaphore>,
    /// Jobs queued and not yet started (or reserved by intake), per session key; keys with
    /// none are removed. `depth` is their sum.
    queued: std::sync::Mutex<HashMap<String, usize>>,
    depth: Arc<AtomicUsize>,
    active: Arc<AtomicUsize>,
    waiters: std::sync::Mutex<HashMap<String, oneshot::Sender<Completion>>>,
    running: std::sync::Mutex<HashMap<String, CancellationToken>>,
    /// Where replies go (Telegram), when a channel is configured.
    outbound: Option<Arc<dyn Outbound>>,
    webhook: Option<crate::api::webhook::Webhook>,
    tracker: TaskTracker,
    /// Fired at shutdown: workers start no new job.
    stop: CancellationToken,
    /// Fired when the shutdown deadline passed: running messages are interrupted.
    abort: CancellationToken,
}

impl Dispatcher {
    pub fn new(
        deps: DispatcherDeps,
        tracker: TaskTracker,
        stop: CancellationToken,
        abort: CancellationToken,
    ) -> Arc<Dispatcher> {
        let DispatcherDeps {
            cfg,
            runner,
            store,
            monitor,
            metrics,
            consolidator,
            webhook,
            outbound,
        } = deps;
        let permits = Arc::new(Semaphore::new(cfg.behavior.max_concurrent_sessions.max(1)));
        Arc::new(Dispatcher {
            cfg,
            runner,
            store,
            monitor,
            metrics,
            consolidator,
            workers: Mutex::new(HashMap::new()),
            idle: std::sync::Mutex::new(IdleStates::default()),
            permits,
            queued: std::sync::Mutex::new(HashMap::new()),
            depth: Arc::new(AtomicUsize::new(0)),
            active: Arc::new(AtomicUsize::new(0)),
            waiters: std::sync::Mutex::new(HashMap::new()),
            running: std::sync::Mutex::new(HashMap::new()),
            outbound,
            webhook,
            tracker,
            stop,
            abort,
        })
    }

    /// The channel that delivers replies (Telegram), if any.
    pub fn outbound(&self) -> Option<Arc<dyn Outbound>> {
        self.outbound.clone()
    }

    /// Jobs queued and not yet started.
    pub fn queue_depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    /// Messages being processed right now.
    pub fn active_sessions(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Be told when intake `id` is done. Register before submitting.
    pub fn wait_for(&self, id: &str) -> oneshot::Receiver<Completion> {
        let (tx, rx) = oneshot::channel();
        self.waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), tx);
        rx
    }

    /// Cancel the message in flight for `key` (Telegram `/stop`). Returns whether one ran.
    pub fn stop_session(&self, key: &str) -> bool {
        match self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
        {
            Some(t) => {
                t.cancel();
                true
            }
            None => false,
        }
    }

    /// Reserve a queue slot for a message of `key` before it is recorded (SPEC §16.9,
    /// bounded queues): refused when that session already has `max_queued_per_session`
    /// messages waiting or all sessions together `max_queued_total`. The slot is released when
    /// dropped unless it is used by [`Dispatcher::submit_reserved`].
    pub fn try_reserve(self: &Arc<Self>, key: &str) -> Result<QueueSlot, QueueFull> {
        let b = &self.cfg.behavior;
        let mut queued = self.queued_counts();
        let total = self.depth.load(Ordering::Relaxed);
        let n = queued.get(key).copied().unwrap_or(0);
        room_for_one(n, total, b.max_queued_per_session, b.max_queued_total)?;
        queued.insert(key.to_string(), n + 1);
        self.depth.fetch_add(1, Ordering::Relaxed);
        drop(queued);
        self.monitor.set_queue_depth(self.queue_depth());
        Ok(QueueSlot {
            dispatcher: self.clone(),
            key: key.to_string(),
            armed: true,
        })
    }

    /// Queue a job in the slot reserved for it.
    pub async fn submit_reserved(self: &Arc<Self>, mut slot: QueueSlot, job: Job) {
        slot.armed = false;
        self.enqueue(&slot.key, job).await;
    }

    /// Queue a job without a cap: work already acknowledged (recovery after a restart) and
    /// resets.
    pub async fn submit(self: &Arc<Self>, key: &str, job: Job) {
        {
            let mut queued = self.queued_counts();
            *queued.entry(key.to_string()).or_insert(0) += 1;
            self.depth.fetch_add(1, Ordering::Relaxed);
        }
        self.monitor.set_queue_depth(self.queue_depth());
        self.enqueue(key, job).await;
    }

    fn queued_counts(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.queued.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One job of `key` left the queue (started, or its slot was given back).
    fn release(&self, key: &str) {
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
        self.monitor.set_queue_depth(self.queue_depth());
    }

    async fn enqueue(self: &Arc<Self>, key: &str, job: Job) {
        let mut workers = self.workers.lock().await;
        let job = match workers.get(key) {
            Some(tx) => match tx.send(job) {
                Ok(()) => return,
                Err(mpsc::error::SendError(job)) => job,
            },
            None => job,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(job);
        workers.insert(key.to_string(), tx);
        let me = self.clone();
        let key = key.to_string();
        self.tracker.spawn(async move { me.worker(key, rx).await });
    }

    /// Session handles the store holds open (bounded: see `session::SessionStore`).
    pub fn open_sessions(&self) -> usize {
        self.store.open_handles()
    }

    /// Sessions with a worker right now (workers exit when their queue is empty).
    pub async fn workers(&self) -> usize {
        self.workers.lock().await.len()
    }

    fn idle_states(&self) -> std::sync::MutexGuard<'_, IdleStates> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs the session's jobs in order and exits when its queue is empty, leaving the session
    /// state in `idle` for the next worker of this key.
    async fn worker(self: Arc<Self>, key: String, mut rx: mpsc::UnboundedReceiver<Job>) {
        let mut state: Option<SessionState> = self.idle_states().take(&key);
        let mut held: VecDeque<Job> = VecDeque::new();
        loop {
            let job = match held.pop_front() {
                Some(j) => j,
                None => match rx.try_recv() {
                    Ok(j) => {
                        self.release(&key);
                        j
                    }
                    Err(TryRecvError::Disconnected) => break,
                    Err(TryRecvError::Empty) => {
                        // `submit` sends under the same lock: either a job slipped in before we
                        // took it, or no job can reach this queue once the entry is gone. The
                        // state is parked before the lock is released, so the next worker of
                        // this key finds it.
                        let mut workers = self.workers.lock().await;
                        match rx.try_recv() {
                            Ok(j) => {
                                drop(workers);
                                self.release(&key);
                                j
                            }
                            Err(_) => {
                                workers.remove(&key);
                                if let Some(s) = state.take() {
                                    self.idle_states().put(key, s, IDLE_STATES);
                                }
                                return;
                            }
                        }
                    }
                },
            };
            if self.stop.is_cancelled() {
                break;
            }
            match job {
                Job::Message(mut work) => {
                    if !work.resume && work.intakes.first().is_some_and(|i| debounced(i.source)) {
                        self.debounce(&key, &mut work, &mut rx, &mut held).await;
                    }
                    let Ok(_permit) = self.permits.clone().acquire_owned().await else {
                        break;
                    };
                    // Shutdown began during the debounce window or the wait for a permit: do
                    // not start the message; its intake is pending and resumes after restart.
                    if self.stop.is_cancelled() {
                        break;
                    }
                    let ids = work.ids();
                    if let Err(e) = self.run_message(&key, &mut state, work).await {
                        tracing::error!(session_key = %key, error = %e, "message processing failed");
                        state = None;
                        // Nobody waits forever: tell waiters (HTTP /chat, agentd chat).
                        self.complete(
                            &ids,
                            Completion {
                                session_id: String::new(),
                                finish: Finish::Failed {
                                    reply: self.cfg.behavior.error_message.clone(),
                                    error: e.to_string(),
                                },
                            },
                        );
                    }
                }
                Job::Reset { reason } => {
                    let store = self.store.clone();
                    let k = key.clone();
                    let closing = self.store.index().get(&key).map(|e| e.session_id.clone());
                    match tokio::task::spawn_blocking(move || store.archive(&k, &reason)).await {
                        Ok(Ok(true)) => {
                            tracing::info!(session_key = %key, "session reset and archived");
                            if let Some(id) = closing {
                                self.consolidate_closed(id);
                            }
                        }
                        Ok(Ok(false)) => {}
                        Ok(Err(e)) => {
                            tracing::error!(session_key = %key, error = %e, "reset failed")
                        }
                        Err(e) => {
                            tracing::error!(session_key = %key, error = %e, "reset task failed")
                        }
                    }
                    state = None;
                }
            }
        }
    }

    /// Merge further messages of the same source that arrive within the debounce window
    /// (restarted by each one, capped at 5 windows). Other jobs are held in order.
    async fn debounce(
        &self,
        key: &str,
        work: &mut Work,
        rx: &mut mpsc::UnboundedReceiver<Job>,
        held: &mut VecDeque<Job>,
    ) {
        let window = self.cfg.behavior.debounce;
        if window.is_zero() || !held.is_empty() {
            return;
        }
        let first = work.intakes[0].clone();
        let first = &first;
        let deadline = tokio::time::Instant::now() + window * 5;
        loop {
            let until = (tokio::time::Instant::now() + window).min(deadline);
            let next = tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep_until(until) => return,
                j = rx.recv() => j,
            };
            match next {
                Some(Job::Message(w))
                    if !w.resume && w.intakes.first().is_some_and(|i| same_thread(first, i)) =>
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

    async fn run_message(
        &self,
        key: &str,
        state: &mut Option<SessionState>,
        work: Work,
    ) -> std::io::Result<()> {
        let model = self.runner.route(&work);
        let store = self.store.clone();
        let k = key.to_string();
        let m = model.clone();
        // The intake records must be in the trail of the session that answers them: after a
        // reset that raced this message they are re-recorded in the new session (a no-op for
        // ids the session already has), so recovery and `agent-send --wait` find them.
        let intakes = if work.resume {
            Vec::new()
        } else {
            work.intakes.clone()
        };
        let session = tokio::task::spawn_blocking(move || {
            let mut session = store.get_or_create(&k, &m)?;
            for i in intakes {
                session = store.append_intake(&k, &m, i)?.0;
            }
            Ok::<_, std::io::Error>(session)
        })
        .await
        .map_err(std::io::Error::other)??;
        if state.as_ref().is_none_or(|s| s.id != session.id) {
            let s = session.clone();
            *state = Some(
                tokio::task::spawn_blocking(move || s.load_state(&model))
                    .await
                    .map_err(std::io::Error::other)??,
            );
        }
        let st = state.as_mut().expect("loaded above");

        let target = target_for(&work, &self.cfg);
        let outbound = self.outbound();
        let stop = self.abort.child_token();
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string(), stop.clone());
        let typing = match (&target, &outbound) {
            (Some(t), Some(d)) if self.cfg.behavior.typing_indicators => {
                Some(spawn_typing(d.clone(), t.clone()))
            }
            _ => None,
        };
        self.active.fetch_add(1, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let mut finish = self.runner.process(&session, st, &work, &stop).await;
        self.active.fetch_sub(1, Ordering::Relaxed);
        if let Some(t) = typing {
            t.cancel();
        }
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);

        // A user's /stop (not the shutdown deadline) ends the message for good.
        if finish == Finish::Cancelled && !self.abort.is_cancelled() {
            let reply = "Stopped.".to_string();
            let ev = Event::Failure {
                reply_to: work.ids(),
                error: "stopped by the user".into(),
                reply: reply.clone(),
            };
            crate::agent::append(&session, ev).await?;
            finish = Finish::Failed {
                reply,
                error: "stopped by the user".into(),
            };
        }
        match &finish {
            Finish::Reply {
                silent,
                usage,
                cost_usd,
                ..
            } => tracing::info!(
                session = %session.id, silent, input = usage.input_tokens, output = usage.output_tokens,
                cache_read = usage.cache_read_tokens, cache_write = usage.cache_write_tokens, cost_usd,
                "message answered"
            ),
            Finish::Failed { error, .. } => {
                tracing::warn!(session = %session.id, %error, "message failed")
            }
            Finish::Cancelled => {
                tracing::info!(session = %session.id, "message interrupted; it resumes after restart")
            }
        }
        let text = match &finish {
            Finish::Reply {
                text,
                silent: false,
                ..
            } => Some(text.clone()),
            Finish::Failed { reply, .. } => Some(reply.clone()),
            _ => None,
        };
        if let (Some(target), Some(d), Some(text)) = (&target, &outbound, text) {
            deliver_recorded(&session, d.as_ref(), target, &work.ids(), &text).await;
        }
        let source = work.intakes.first().map_or("", |i| i.source.as_str());
        let outcome = match &finish {
            Finish::Reply { silent: true, .. } => crate::metrics::Outcome::Silent,
            Finish::Reply { .. } => crate::metrics::Outcome::Reply,
            Finish::Failed { .. } => crate::metrics::Outcome::Failed,
            Finish::Cancelled => crate::metrics::Outcome::Cancelled,
        };
        self.metrics
            .message_done(source, outcome, started.elapsed());
        if let Some(w) = &self.webhook
            && finish != Finish::Cancelled
        {
            w.send(webhook_payload(&work, &session.id, &finish));
        }
        let finished = finish != Finish::Cancelled;
        self.complete(
            &work.ids(),
            Completion {
                session_id: session.id.clone(),
                finish,
            },
        );
        // Check compaction last, once the reply is out (SPEC §5.5), also after silent replies
        // and failures. A shutdown deadline interrupts it; nothing is recorded then.
        if finished && !self.stop.is_cancelled() {
            tokio::select! {
                _ = self.abort.cancelled() => {}
                _ = self.runner.after_message(&session, st, &work) => {}
            }
        }
        // The snapshot too waits until the reply is out, and is written by the snapshot thread:
        // it is a cache of the trail (rebuilt from it when missing or stale), not part of the
        // acknowledgement, and serialising and syncing a long history was the largest
        // per-message cost after the reply (docs/BENCHMARKS.md, overhead).
        session.queue_snapshot(st.clone());
        Ok(())
    }

    /// Tell whoever waits for these intake ids (also on `Cancelled`, so they stop waiting).
    fn complete(&self, ids: &[String], c: Completion) {
        let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        for id in ids {
            if let Some(tx) = waiters.remove(id) {
                let _ = tx.send(c.clone());
            }
        }
    }

    /// Consolidate a session that was just closed (SPEC §13 "on session close", when
    /// `consolidation.enabled`), from its archived trail, in the background: the reset does not
    /// wait for the model. If the daemon stops first, `agentd consolidate` picks it up (the
    /// watermark did not move).
    fn consolidate_closed(&self, session_id: String) {
        let Some(c) = self.consolidator.clone() else {
            return;
        };
        if !self.cfg.memory.consolidation_enabled {
            return;
        }
        let archive = self.store.dir().join(".archive");
        let stop = self.stop.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                r = c.session(&archive, &session_id) => match r {
                    Ok(outcome) => tracing::info!(session = %session_id, ?outcome, "closed session consolidated"),
                    Err(e) => tracing::warn!(session = %session_id, error = %e, "consolidating the closed session failed; `agentd consolidate` retries it"),
                },
            }
        });
    }

    /// Drop a waiter whose message was never accepted.
    pub fn forget(&self, id: &str) {
        self.waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }
}

/// Record the intent, send, record the outcome (SPEC §5.2).
pub async fn deliver_recorded(
    session: &Arc<SessionHandle>,
    d: &dyn Outbound,
    target: &Target,
    ids: &[String],
    text: &str,
) {
    let record = |status, detail| Event::Delivery {
        reply_to: ids.to_vec(),
        channel: target.channel().to_string(),
        status,
        detail,
    };
    if let Err(e) = crate::agent::append(session, record(DeliveryStatus::Intent, None)).await {
        tracing::error!(session = %session.id, error = %e, "cannot record delivery intent; not sending");
        return;
    }
    let (status, detail) = match d.send_text(target, text).await {
        Ok(_) => (DeliveryStatus::Done, None),
        Err(e) => {
            tracing::warn!(session = %session.id, channel = target.channel(), error = %e, "delivery failed");
            (DeliveryStatus::Failed, Some(e))
        }
    };
    if let Err(e) = crate::agent::append(session, record(status, detail)).await {
        tracing::error!(session = %session.id, error = %e, "cannot record delivery outcome");
    }
}

/// "typing…" every 4 s until the returned token is cancelled.
fn spawn_typing(d: Arc<dyn Outbound>, target: Target) -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        loop {
            d.typing(&target).await;
            tokio::select! {
                _ = t.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(4)) => {}
            }
        }
    });
    token
}

/// The callback body of SPEC §10.2 for a finished message.
fn webhook_payload(
    work: &Work,
    session_id: &str,
    finish: &Finish,
) -> crate::api::webhook::WebhookPayload {
    let first = work.intakes.first();
    let (reply, silent, usage) = match finish {
        Finish::Reply {
            text,
            silent,
            usage,
            ..
        } => (text.clone(), *silent, *usage),
        Finish::Failed { reply, .. } => (reply.clone(), false, Default::default()),
        Finish::Cancelled => (String::new(), false, Default::default()),
    };
    crate::api::webhook::WebhookPayload {
        reply,
        session_id: session_id.to_string(),
        sender: first.map(|i| i.from.clone()).unwrap_or_default(),
        source: first.map(|i| i.source.to_string()).unwrap_or_default(),
        silent,
        tokens: (&usage).into(),
        notify_meta: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(id: &str) -> SessionState {
        SessionState::new(id, id, "primary", 0)
    }

    fn tg(from: &str, chat: i64) -> crate::session::Intake {
        crate::session::Intake {
            id: format!("{from}-{chat}"),
            source: Source::Telegram,
            from: from.into(),
            text: "x".into(),
            tier: None,
            attachments: vec![],
            route: Some(crate::session::Route::Telegram {
                chat_id: chat,
                message_id: None,
            }),
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
    }

    /// A runner that records each unit of work it is given (the texts of its intakes) and,
    /// for texts starting with "block", waits until cancelled (for `/stop`).
    #[derive(Default)]
    struct FakeRunner {
        seen: std::sync::Mutex<Vec<Vec<String>>>,
        running: AtomicUsize,
        overlapped: std::sync::atomic::AtomicBool,
        started: tokio::sync::Notify,
    }

    impl Runner for FakeRunner {
        fn route(&self, _work: &Work) -> String {
            "primary".into()
        }
        fn process<'a>(
            &'a self,
            _session: &'a Arc<SessionHandle>,
            _state: &'a mut SessionState,
            work: &'a Work,
            cancel: &'a CancellationToken,
        ) -> BoxFuture<'a, Finish> {
            Box::pin(async move {
                if self.running.fetch_add(1, Ordering::SeqCst) > 0 {
                    self.overlapped.store(true, Ordering::SeqCst);
                }
                let texts: Vec<String> = work.intakes.iter().map(|i| i.text.clone()).collect();
                let block = texts.first().is_some_and(|t| t.starts_with("block"));
                self.seen.lock().unwrap().push(texts.clone());
                self.started.notify_one();
                let finish = if block {
                    cancel.cancelled().await;
                    Finish::Cancelled
                } else {
                    // Long enough that a second worker of the same session would overlap.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Finish::Reply {
                        text: format!("re: {}", texts.join("+")),
                        silent: false,
                        usage: Default::default(),
                        cost_usd: 0.0,
                    }
                };
                self.running.fetch_sub(1, Ordering::SeqCst);
                finish
            })
        }
        fn after_message<'a>(
            &'a self,
            _session: &'a Arc<SessionHandle>,
            _state: &'a mut SessionState,
            _work: &'a Work,
        ) -> BoxFuture<'a, ()> {
            Box::pin(async {})
        }
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        runner: Arc<FakeRunner>,
        dispatcher: Arc<Dispatcher>,
        tracker: TaskTracker,
    }

    /// A dispatcher over a temporary session store and the fake runner.
    fn fixture(tune: impl FnOnce(&mut crate::config::BehaviorConfig)) -> Fixture {
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
            "[paths]\nstate_dir = \"state\"\n[agent]\nname = \"t\"\nworkspace = \"ws\"\n[providers]\ndir = \"providers.d\"\n",
        )
        .unwrap();
        let env = std::collections::BTreeMap::from([
            ("K".to_string(), "sk-test".to_string()),
            ("HOME".to_string(), root.display().to_string()),
        ]);
        let mut cfg = crate::config::load_with_env(&root.join("agentd.toml"), env).unwrap();
        tune(&mut cfg.behavior);
        let store = Arc::new(SessionStore::open(&root.join("sessions"), chrono_tz::UTC).unwrap());
        let runner = Arc::new(FakeRunner::default());
        let tracker = TaskTracker::new();
        let dispatcher = Dispatcher::new(
            DispatcherDeps {
                cfg: Arc::new(cfg),
                runner: runner.clone(),
                store,
                monitor: Arc::new(Monitor::new(root.join("monitor.json"))),
                metrics: Arc::new(Metrics::new()),
                consolidator: None,
                webhook: None,
                outbound: None,
            },
            tracker.clone(),
            CancellationToken::new(),
            CancellationToken::new(),
        );
        Fixture {
            _dir: dir,
            runner,
            dispatcher,
            tracker,
        }
    }

    fn user(id: &str, from: &str, text: &str) -> crate::session::Intake {
        crate::session::Intake {
            id: id.into(),
            source: Source::User,
            from: from.into(),
            text: text.into(),
            tier: None,
            attachments: vec![],
            route: None,
        }
    }

    fn message(intake: crate::session::Intake) -> Job {
        Job::Message(Work {
            intakes: vec![intake],
            resume: false,
        })
    }

    impl Fixture {
        async fn reply_of(&self, rx: oneshot::Receiver<Completion>) -> Finish {
            tokio::time::timeout(Duration::from_secs(10), rx)
                .await
                .expect("completion within 10 s")
                .expect("completion sent")
                .finish
        }

        fn seen(&self) -> Vec<Vec<String>> {
            self.runner.seen.lock().unwrap().clone()
        }
    }

    fn reply_text(f: &Finish) -> &str {
        match f {
            Finish::Reply { text, .. } => text,
            Finish::Failed { reply, .. } => reply,
            Finish::Cancelled => "",
        }
    }

    /// One session's messages run one at a time, in the order they were queued.
    #[tokio::test]
    async fn one_sessions_messages_run_one_at_a_time_in_order() {
        let f = fixture(|b| b.debounce = Duration::ZERO);
        let mut waits = Vec::new();
        for n in 0..5 {
            let id = format!("m{n}");
            waits.push(f.dispatcher.wait_for(&id));
            let slot = f.dispatcher.try_reserve("alice").unwrap();
            f.dispatcher
                .submit_reserved(slot, message(user(&id, "alice", &format!("t{n}"))))
                .await;
        }
        for (n, w) in waits.into_iter().enumerate() {
            assert_eq!(reply_text(&f.reply_of(w).await), format!("re: t{n}"));
        }
        let expected: Vec<Vec<String>> = (0..5).map(|n| vec![format!("t{n}")]).collect();
        assert_eq!(f.seen(), expected);
        assert!(!f.runner.overlapped.load(Ordering::SeqCst));
        assert_eq!(f.dispatcher.queue_depth(), 0);
        f.tracker.close();
        f.tracker.wait().await;
        assert_eq!(f.dispatcher.workers().await, 0, "idle workers exit");
    }

    /// Within the debounce window one sender's messages become one turn; another sender's
    /// message is held, not merged, and runs after it.
    #[tokio::test]
    async fn debounce_merges_one_senders_messages_and_holds_the_rest() {
        let f = fixture(|b| b.debounce = Duration::from_millis(200));
        let a1 = f.dispatcher.wait_for("a1");
        let a2 = f.dispatcher.wait_for("a2");
        let b1 = f.dispatcher.wait_for("b1");
        for (id, from, text) in [
            ("a1", "alice", "one"),
            ("a2", "alice", "two"),
            ("b1", "bob", "three"),
        ] {
            f.dispatcher
                .submit("shared", message(user(id, from, text)))
                .await;
        }
        assert_eq!(reply_text(&f.reply_of(a1).await), "re: one+two");
        assert_eq!(
            reply_text(&f.reply_of(a2).await),
            "re: one+two",
            "both ids are answered"
        );
        assert_eq!(reply_text(&f.reply_of(b1).await), "re: three");
        assert_eq!(
            f.seen(),
            vec![
                vec!["one".to_string(), "two".to_string()],
                vec!["three".to_string()]
            ]
        );
        assert_eq!(f.dispatcher.queue_depth(), 0);
    }

    /// Without a debounce window every message is its own turn; system messages are never
    /// merged.
    #[tokio::test]
    async fn no_window_no_merge() {
        let f = fixture(|b| b.debounce = Duration::ZERO);
        let w2 = f.dispatcher.wait_for("a2");
        f.dispatcher
            .submit("k", message(user("a1", "alice", "one")))
            .await;
        f.dispatcher
            .submit("k", message(user("a2", "alice", "two")))
            .await;
        f.reply_of(w2).await;
        assert_eq!(
            f.seen(),
            vec![vec!["one".to_string()], vec!["two".to_string()]]
        );
    }

    /// `try_reserve` counts reserved and queued messages against both caps; a dropped slot is
    /// given back.
    #[tokio::test]
    async fn reservations_count_against_the_caps_and_are_released_on_drop() {
        let f = fixture(|b| {
            b.max_queued_per_session = 2;
            b.max_queued_total = 3;
        });
        let a1 = f.dispatcher.try_reserve("a").unwrap();
        let a2 = f.dispatcher.try_reserve("a").unwrap();
        assert_eq!(
            f.dispatcher.try_reserve("a").err(),
            Some(QueueFull::Session { max: 2 })
        );
        let b1 = f.dispatcher.try_reserve("b").unwrap();
        assert_eq!(
            f.dispatcher.try_reserve("c").err(),
            Some(QueueFull::Total { max: 3 })
        );
        assert_eq!(f.dispatcher.queue_depth(), 3);
        drop(a2);
        drop(b1);
        assert_eq!(f.dispatcher.queue_depth(), 1);
        assert!(
            f.dispatcher.try_reserve("c").is_ok(),
            "the dropped slots were released"
        );
        let done = f.dispatcher.wait_for("x");
        f.dispatcher
            .submit_reserved(a1, message(user("x", "a", "hi")))
            .await;
        f.reply_of(done).await;
        assert_eq!(
            f.dispatcher.queue_depth(),
            0,
            "a started job leaves the queue"
        );
    }

    /// `/stop` cancels the running message of that session only: it ends as "Stopped.", a
    /// failure recorded in the trail, and the next message of the session runs.
    #[tokio::test]
    async fn stop_cancels_the_running_message() {
        let f = fixture(|b| b.debounce = Duration::ZERO);
        assert!(!f.dispatcher.stop_session("k"), "nothing runs yet");
        let first = f.dispatcher.wait_for("b1");
        let second = f.dispatcher.wait_for("n1");
        f.dispatcher
            .submit("k", message(user("b1", "alice", "block")))
            .await;
        f.dispatcher
            .submit("k", message(user("n1", "alice", "next")))
            .await;
        f.runner.started.notified().await;
        assert!(
            !f.dispatcher.stop_session("other"),
            "another session is not touched"
        );
        assert!(f.dispatcher.stop_session("k"));
        match f.reply_of(first).await {
            Finish::Failed { reply, error } => {
                assert_eq!(reply, "Stopped.");
                assert_eq!(error, "stopped by the user");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
        assert_eq!(reply_text(&f.reply_of(second).await), "re: next");
        let trail = f
            .dispatcher
            .store
            .get("k")
            .unwrap()
            .unwrap()
            .read_trail()
            .unwrap();
        assert!(trail.iter().any(|l| matches!(&l.event,
            Event::Failure { reply_to, reply, .. } if reply_to == &vec!["b1".to_string()] && reply == "Stopped.")));
    }

    #[test]
    fn idle_states_keep_the_most_recent_few() {
        let mut idle = IdleStates::default();
        for n in 0..20 {
            idle.put(format!("k{n}"), state(&format!("s{n}")), 8);
            assert!(idle.entries.len() <= 8);
        }
        assert!(idle.take("k11").is_none(), "evicted: least recently used");
        assert_eq!(idle.take("k12").map(|s| s.id), Some("s12".to_string()));
        assert!(
            idle.take("k12").is_none(),
            "taken once: the worker owns it now"
        );
        // Putting a key again replaces its entry and makes it the newest.
        idle.put("k13".into(), state("new13"), 8);
        assert_eq!(idle.entries.len(), 7);
        assert_eq!(
            idle.entries
                .back()
                .map(|(k, s)| (k.as_str(), s.id.as_str())),
            Some(("k13", "new13"))
        );
    }
}
