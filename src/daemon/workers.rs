//! The workers behind intake (SPEC §5.3–§5.5): one worker task per session key processes that
//! session's jobs one at a time in arrival order; different sessions run concurrently up to
//! `max_concurrent_sessions`. The queues and the debounce are in [`super::queue`]; the steps
//! after a message (delivery, metrics, webhook, waiters) in [`super::after`]. A worker routes
//! each message once, runs it through the [`Runner`] (the agent), hands the reply out, then
//! checks compaction and, when `SessionState::snapshot_due` (every 64 trail lines, or half the
//! history's length in lines when longer), queues the snapshot.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::after::{AfterMessage, Waiters, log_finish};
use super::delivery::{Address, Contacts, Outbound, target_for};
use super::queue::Queue;
pub use super::queue::{Job, QueueSlot};
use super::session_control::{self, Control, ControlError, Request, Settings, SkillInfo};
use crate::agent::{Agent, Finish, Work};
pub use crate::channels::intake::{Completion, QueueFull};
use crate::memory::consolidate::Consolidator;
use crate::metrics::Metrics;
use crate::monitor::Monitor;
use crate::session::{Event, SessionHandle, SessionState, SessionStore};

/// The recorded error of a message a person (or an A2A client) stopped.
pub const STOPPED_ERROR: &str = "stopped by the user";

/// What the dispatcher asks of the agent: the model for a unit of work (decided once per
/// message, here, with the session's pinned model), running it on that model, and the
/// after-message check (compaction). Implemented by [`Agent`]; the tests use a fake.
pub trait Runner: Send + Sync {
    fn route(&self, work: &Work, pinned: Option<&str>) -> String;
    fn process<'a>(
        &'a self,
        session: &'a Arc<SessionHandle>,
        state: &'a mut SessionState,
        work: &'a Work,
        model: &'a str,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Finish>;
    fn after_message<'a>(
        &'a self,
        session: &'a Arc<SessionHandle>,
        state: &'a mut SessionState,
        work: &'a Work,
    ) -> BoxFuture<'a, ()>;
    /// The loaded skills a session can turn on and off (SPEC §18.2).
    fn skills(&self) -> Vec<SkillInfo> {
        Vec::new()
    }
}

impl Runner for Agent {
    fn route(&self, work: &Work, pinned: Option<&str>) -> String {
        self.route_work(work, pinned)
    }
    fn process<'a>(
        &'a self,
        session: &'a Arc<SessionHandle>,
        state: &'a mut SessionState,
        work: &'a Work,
        model: &'a str,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Finish> {
        Box::pin(Agent::process(self, session, state, work, model, cancel))
    }
    fn after_message<'a>(
        &'a self,
        session: &'a Arc<SessionHandle>,
        state: &'a mut SessionState,
        work: &'a Work,
    ) -> BoxFuture<'a, ()> {
        Box::pin(Agent::after_message(self, session, state, work))
    }
    fn skills(&self) -> Vec<SkillInfo> {
        let set = Agent::skills(self);
        set.all()
            .iter()
            .map(|s| SkillInfo {
                name: s.name.clone(),
                always_on: set.is_always_on(&s.name),
            })
            .collect()
    }
}

/// What a [`Dispatcher`] is built from: it holds its own dependencies, not the agent's.
pub struct DispatcherDeps {
    /// The running config (SIGHUP replaces it).
    pub cfg: crate::config::Live,
    pub runner: Arc<dyn Runner>,
    pub store: Arc<SessionStore>,
    pub monitor: Arc<Monitor>,
    pub metrics: Arc<Metrics>,
    /// Closed sessions are consolidated when `memory.consolidation_enabled`.
    pub consolidator: Option<Consolidator>,
    pub webhook: Option<crate::api::webhook::Webhook>,
    /// Where replies go (the router over the chat channels), when one runs.
    pub outbound: Option<Arc<dyn Outbound>>,
    /// Who the contacts are: a FIFO or scheduled message from one is answered in its chat.
    pub contacts: Contacts,
    /// Spoken replies (SPEC §19), when `[voice] tts_model` is set.
    pub speaker: Option<Arc<crate::tools::tts::Speaker>>,
}

/// Routes jobs to per-session workers.
pub struct Dispatcher {
    cfg: crate::config::Live,
    runner: Arc<dyn Runner>,
    store: Arc<SessionStore>,
    consolidator: Option<Consolidator>,
    contacts: Contacts,
    queue: Arc<Queue>,
    after: AfterMessage,
    /// The `/stop` token of each session's running message, with the intake ids it answers.
    running: std::sync::Mutex<std::collections::HashMap<String, (CancellationToken, Vec<String>)>>,
    active: AtomicUsize,
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
            contacts,
            speaker,
        } = deps;
        let (live, cfg) = (cfg.clone(), cfg.get());
        Arc::new(Dispatcher {
            queue: Queue::new(&cfg.behavior, monitor.clone(), store.clone()),
            after: AfterMessage {
                outbound,
                webhook,
                metrics: metrics.clone(),
                waiters: Waiters::default(),
                retry: super::after::RetryPolicy {
                    within: cfg.delivery.retry,
                    abort: abort.clone(),
                },
                tracker: tracker.clone(),
                lanes: Default::default(),
                stats: Arc::new(super::after::DeliveryStats {
                    metrics: metrics.clone(),
                    monitor: monitor.clone(),
                    counts: Default::default(),
                }),
                speaker,
            },
            cfg: live,
            runner,
            store,
            consolidator,
            contacts,
            running: Default::default(),
            active: AtomicUsize::new(0),
            tracker,
            stop,
            abort,
        })
    }

    /// The router that delivers replies to the chat channels, if one runs.
    pub fn outbound(&self) -> Option<Arc<dyn Outbound>> {
        self.after.outbound.clone()
    }

    /// Where the reply to `work` goes: [`target_for`], on the channels that run.
    pub fn reply_address(&self, work: &Work) -> Option<Address> {
        let out = self.after.outbound.as_deref()?;
        target_for(work, &self.contacts, out)
    }

    /// The outbox's retry rule (SPEC §16.1), for deliveries resumed after a restart.
    pub fn delivery_retry(&self) -> super::after::RetryPolicy {
        self.after.retry.clone()
    }

    /// Queue a delivery on its session's lane (see `after::AfterMessage::deliver`).
    #[allow(clippy::too_many_arguments)]
    pub fn deliver(
        &self,
        session: &Arc<SessionHandle>,
        target: &Address,
        ids: Vec<String>,
        text: String,
        resume: Option<super::delivery::Progress>,
        window: crate::tools::outbound::Window,
        gate: Option<CancellationToken>,
    ) {
        (self.after).deliver(session, target, ids, text, resume, window, gate);
    }

    /// Jobs queued and not yet started.
    pub fn queue_depth(&self) -> usize {
        self.queue.depth()
    }

    /// Messages being processed right now.
    pub fn active_sessions(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Be told when intake `id` is done. Register before submitting.
    pub fn wait_for(&self, id: &str) -> oneshot::Receiver<Completion> {
        self.after.waiters.wait_for(None, id)
    }

    /// [`Self::wait_for`], told only about intake `id` of session `key` (the compatible
    /// endpoints: a client's `Idempotency-Key` may be reused in another session).
    pub fn wait_in(&self, key: &str, id: &str) -> oneshot::Receiver<Completion> {
        self.after.waiters.wait_for(Some(key), id)
    }

    /// Drop the waiters of intake `id` of session `key` when its message was never accepted
    /// (or was answered already).
    pub fn forget(&self, key: &str, id: &str) {
        self.after.waiters.forget(key, id)
    }

    /// Stream the answer to intake `id` of session `key` into `sink` (the compatible
    /// endpoints, SPEC §17).
    pub fn stream_to(&self, key: &str, id: &str, sink: crate::llm::DeltaSink) {
        self.after.waiters.stream_to(key, id, sink)
    }

    /// Cancel the message in flight for `key` (Telegram `/stop`). Returns whether one ran.
    pub fn stop_session(&self, key: &str) -> bool {
        match self.running_tokens().get(key) {
            Some((t, _)) => {
                t.cancel();
                true
            }
            None => false,
        }
    }

    /// [`Self::stop_session`], only when the running message answers intake `id` (A2A
    /// `tasks/cancel`). Returns whether it did.
    pub fn stop_intake(&self, key: &str, id: &str) -> bool {
        match self.running_tokens().get(key) {
            Some((t, ids)) if ids.iter().any(|i| i == id) => {
                t.cancel();
                true
            }
            _ => false,
        }
    }

    /// Change (or read) the settings of `key`'s session (SPEC §18.2) through its queue: the
    /// answer comes once the change is in the trail, after any message queued before it.
    pub async fn session_control(
        self: &Arc<Self>,
        key: &str,
        request: Request,
    ) -> Result<Settings, ControlError> {
        let answer = self.queue_session_control(key, request).await;
        answer.await.unwrap_or(Err(ControlError::Stopping))
    }

    /// [`Self::session_control`] queued now (in order with what is queued after it), the
    /// answer to wait for.
    pub async fn queue_session_control(
        self: &Arc<Self>,
        key: &str,
        request: Request,
    ) -> oneshot::Receiver<Result<Settings, ControlError>> {
        let (done, answer) = oneshot::channel();
        self.submit(key, Job::Control(Control { request, done }))
            .await;
        answer
    }

    fn running_tokens(
        &self,
    ) -> std::sync::MutexGuard<
        '_,
        std::collections::HashMap<String, (CancellationToken, Vec<String>)>,
    > {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserve a queue slot for a message of `key` before it is recorded (SPEC §16.9,
    /// bounded queues): refused when that session already has `max_queued_per_session`
    /// messages waiting or all sessions together `max_queued_total`. The slot is released when
    /// dropped unless it is used by [`Dispatcher::submit_reserved`].
    pub fn try_reserve(&self, key: &str) -> Result<QueueSlot, QueueFull> {
        self.queue.try_reserve(key)
    }

    /// Queue a job in the slot reserved for it.
    pub async fn submit_reserved(self: &Arc<Self>, slot: QueueSlot, job: Job) {
        let key = slot.take();
        self.enqueue(&key, job).await;
    }

    /// Queue a job without a cap: work already acknowledged (recovery after a restart) and
    /// resets.
    pub async fn submit(self: &Arc<Self>, key: &str, job: Job) {
        self.queue.add(key);
        self.enqueue(key, job).await;
    }

    async fn enqueue(self: &Arc<Self>, key: &str, job: Job) {
        if let Some(rx) = self.queue.send(key, job).await {
            let me = self.clone();
            let key = key.to_string();
            self.tracker.spawn(async move { me.worker(key, rx).await });
        }
    }

    /// Session handles the store holds open (bounded: see `session::SessionStore`).
    pub fn open_sessions(&self) -> usize {
        self.store.open_handles()
    }

    /// Sessions with a worker right now (workers exit when their queue is empty).
    pub async fn workers(&self) -> usize {
        self.queue.workers().await
    }

    /// Queue a snapshot of every idle session state that lacks trail lines (a graceful stop,
    /// once the workers are done: each snapshots its own state when it exits). Returns how
    /// many were queued; `SessionStore::flush_snapshots` writes them.
    pub fn snapshot_idle_states(&self) -> usize {
        self.queue.snapshot_idle_states()
    }

    /// Runs the session's jobs in order and exits when its queue is empty, leaving the session
    /// state with the queue for the next worker of this key.
    /// A boxed future (not an `async fn`): a worker can queue a job that starts a worker
    /// (`Job::Settle`), and the compiler cannot prove `Send` through that cycle otherwise.
    fn worker(
        self: Arc<Self>,
        key: String,
        mut rx: mpsc::UnboundedReceiver<Job>,
    ) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(async move {
            let mut state: Option<SessionState> = self.queue.idle_state(&key);
            let mut held: VecDeque<Job> = VecDeque::new();
            while let Some(job) = self
                .queue
                .next_job(&key, &mut rx, &mut held, &mut state)
                .await
            {
                if self.stop.is_cancelled() {
                    break;
                }
                match job {
                    Job::Message(mut work) => {
                        let window = self.cfg.get().behavior.debounce;
                        (self.queue)
                            .debounce(&key, window, &self.stop, &mut work, &mut rx, &mut held)
                            .await;
                        let waited = std::time::Instant::now();
                        let Some(_permit) = self.queue.permit().await else {
                            break;
                        };
                        self.after.metrics.slot_wait(waited.elapsed());
                        // Shutdown began during the debounce window or the wait for a permit: do
                        // not start the message; its intake is pending and resumes after restart.
                        if self.stop.is_cancelled() {
                            break;
                        }
                        let ids = work.ids();
                        work.deltas = self.after.waiters.stream_of(&key, &ids);
                        let one_off = work.api().is_some_and(|a| a.one_off);
                        let ran = self.run_message(&key, &mut state, work).await;
                        if let Ok(Some(session)) = &ran
                            && held.is_empty()
                            && !one_off
                        {
                            self.mark_settled(&key, session).await;
                        }
                        // A one-off session of the compatible endpoints (SPEC §17) is archived
                        // once answered.
                        if one_off && matches!(ran, Ok(Some(_))) {
                            self.reset(&key, "one-off API session answered".into())
                                .await;
                            state = None;
                        }
                        if let Err(e) = ran {
                            tracing::error!(session_key = %key, error = %e, "message processing failed");
                            state = None;
                            // Nobody waits forever: tell waiters (HTTP /chat, agentd chat).
                            let finish = Finish::Failed {
                                reply: self.cfg.get().behavior.error_message.clone(),
                                error: e.to_string(),
                                cause: crate::agent::FailCause::Other,
                            };
                            let session_id = String::new();
                            (self.after.waiters).complete(
                                &key,
                                &ids,
                                Completion { session_id, finish },
                            );
                        }
                    }
                    Job::Reset { reason } => {
                        self.reset(&key, reason).await;
                        state = None;
                    }
                    Job::Control(Control { request, done }) => {
                        let answer = self.control(&key, &mut state, request).await;
                        let _ = done.send(answer);
                    }
                    Job::Settle { session_id } => {
                        if held.is_empty() {
                            self.settle_after_delivery(&key, &session_id).await;
                        }
                    }
                    Job::Expire {
                        session_id,
                        idle_for,
                    } => {
                        let reason = format!("idle for more than {}s", idle_for.as_secs());
                        if self
                            .reset_if(&key, reason, Some((session_id, idle_for)))
                            .await
                        {
                            state = None;
                        }
                    }
                }
            }
            // Left the loop other than by an empty queue (which parks the state): a shutdown.
            // The snapshot lags the state (`snapshot_due`); save it now (SPEC §7:
            // always on a graceful stop).
            if let Some(s) = state.take() {
                self.store.snapshot_if_dirty(s);
            }
        })
    }

    /// Archive the session of `key`, then consolidate it in the background.
    async fn reset(&self, key: &str, reason: String) {
        self.reset_if(key, reason, None).await;
    }

    /// `reset`; with `idle` = (session id, age), only if the key still names that session and
    /// it has been idle that long (`Job::Expire`). Returns whether the session was archived.
    async fn reset_if(
        &self,
        key: &str,
        reason: String,
        idle: Option<(String, std::time::Duration)>,
    ) -> bool {
        let store = self.store.clone();
        let k = key.to_string();
        let closing = self.store.index().get(key).map(|e| e.session_id.clone());
        // A reply of this session still being delivered would record its `attempt`/`sent`
        // into the archived trail (and a restart would not see them). Expiry skips such a
        // session (the next retention pass sees it again); a reset waits for its lane.
        if let Some(id) = &closing
            && self.after.lanes.is_busy(id)
        {
            if idle.is_some() {
                tracing::debug!(session_key = %key, "not expiring: a reply is being delivered");
                return false;
            }
            tracing::info!(session_key = %key, "reset waits for the delivery of the last reply");
            tokio::select! {
                _ = self.after.lanes.drained(id) => {}
                _ = self.abort.cancelled() => {
                    tracing::warn!(session_key = %key, "reset not done: agentd stopped while a reply was being delivered");
                    return false;
                }
            }
        }
        let archive = move || match idle {
            None => store.archive(&k, &reason),
            Some((id, age)) => store.archive_if_idle(&k, &id, age, &reason),
        };
        match tokio::task::spawn_blocking(archive).await {
            Ok(Ok(true)) => {
                tracing::info!(session_key = %key, "session reset and archived");
                // One-off API sessions are not consolidated (SPEC §16.3).
                if let Some(id) = closing
                    && !key.starts_with(crate::session::event::ONE_OFF_PREFIX)
                {
                    self.consolidate_closed(id);
                }
                true
            }
            Ok(Ok(false)) => false,
            Ok(Err(e)) => {
                tracing::error!(session_key = %key, error = %e, "reset failed");
                false
            }
            Err(e) => {
                tracing::error!(session_key = %key, error = %e, "reset task failed");
                false
            }
        }
    }

    /// After a message that finished: when nothing else of `key` is queued, reserved or held,
    /// mark the session settled so that neither recovery nor the search for open deliveries
    /// need read its trail at the next start (`is_settled`). While a reply of the session is
    /// still being delivered the mark waits: a `Job::Settle` is queued once its lane runs dry,
    /// so the mark never hides an unfinished delivery. The seq is read before the queue is
    /// checked: an intake reserved later lies after it.
    async fn mark_settled(self: &Arc<Self>, key: &str, session: &Arc<SessionHandle>) {
        if self.after.lanes.is_busy(&session.id) {
            let (me, key, id) = (self.clone(), key.to_string(), session.id.clone());
            self.tracker.spawn(async move {
                tokio::select! {
                    _ = me.stop.cancelled() => {}
                    _ = me.after.lanes.drained(&id) => {
                        me.submit(&key, Job::Settle { session_id: id }).await;
                    }
                }
            });
            return;
        }
        let seq = session.last_seq();
        if self.queue.queued_for(key) > 0 || self.stop.is_cancelled() {
            return;
        }
        let s = session.clone();
        let written = tokio::task::spawn_blocking(move || s.mark_settled(seq)).await;
        if let Ok(Err(e)) = written {
            tracing::debug!(session = %session.id, error = %e, "cannot write the settled mark");
        }
    }

    /// `Job::Settle`: mark the key's session settled if it is still `session_id` and its
    /// deliveries are over (a new reply may have joined its lane meanwhile: then that
    /// message's own settle follows).
    async fn settle_after_delivery(self: &Arc<Self>, key: &str, session_id: &str) {
        if self.after.lanes.is_busy(session_id) {
            return;
        }
        let (store, k) = (self.store.clone(), key.to_string());
        let session = match tokio::task::spawn_blocking(move || store.get(&k)).await {
            Ok(Ok(Some(s))) if s.id == session_id => s,
            _ => return,
        };
        self.mark_settled(key, &session).await;
    }

    /// `Job::Control`: check the request, record its event and fold it into the state. A
    /// look (no change) at a key without a session creates none.
    async fn control(
        &self,
        key: &str,
        state: &mut Option<SessionState>,
        request: Request,
    ) -> Result<Settings, ControlError> {
        let cfg = self.cfg.get();
        let models: Vec<String> = cfg.models.loaded.keys().cloned().collect();
        let skills = self.runner.skills();
        let event = match &request.change {
            Some(change) => Some(session_control::event_for(
                &models,
                &skills,
                change,
                &request.channel,
                request.id.clone(),
            )?),
            None => None,
        };
        let failed = |e: std::io::Error| ControlError::Failed(e.to_string());
        let store = self.store.clone();
        let k = key.to_string();
        let session = match &event {
            Some(_) => {
                let routed = self.runner.route(&Work::default(), None);
                let s = tokio::task::spawn_blocking(move || store.get_or_create(&k, &routed))
                    .await
                    .map_err(std::io::Error::other)
                    .and_then(|r| r)
                    .map_err(failed)?;
                Some(s)
            }
            None => tokio::task::spawn_blocking(move || store.get(&k))
                .await
                .map_err(std::io::Error::other)
                .and_then(|r| r)
                .map_err(failed)?,
        };
        let Some(session) = session else {
            return Ok(session_control::settings(key, None, &models, &skills));
        };
        if state.as_ref().is_none_or(|s| s.id != session.id) {
            let s = session.clone();
            let routed = self.runner.route(&Work::default(), None);
            *state = Some(
                tokio::task::spawn_blocking(move || s.load_state(&routed))
                    .await
                    .map_err(std::io::Error::other)
                    .and_then(|r| r)
                    .map_err(failed)?,
            );
        }
        let st = state.as_mut().expect("loaded above");
        if let Some(event) = event {
            let line = crate::agent::append(&session, event)
                .await
                .map_err(failed)?;
            st.apply(&line);
            tracing::info!(session = %session.id, session_key = %key, channel = %request.channel, "session settings changed");
            if st.snapshot_due() {
                st.mark_saved();
                session.queue_snapshot(st.clone());
            }
        }
        Ok(session_control::settings(key, Some(st), &models, &skills))
    }

    /// One message: route it, open its session and state, run it, hand the reply out, then
    /// the compaction check and the snapshot. Returns the session when the message finished
    /// (answered or failed for good), `None` when a shutdown interrupted it.
    async fn run_message(
        &self,
        key: &str,
        state: &mut Option<SessionState>,
        mut work: Work,
    ) -> std::io::Result<Option<Arc<SessionHandle>>> {
        let routed = self.runner.route(&work, None);
        let session = self.open_session(key, &routed, &work).await?;
        if state.as_ref().is_none_or(|s| s.id != session.id) {
            let (s, m) = (session.clone(), routed.clone());
            *state = Some(
                tokio::task::spawn_blocking(move || s.load_state(&m))
                    .await
                    .map_err(std::io::Error::other)??,
            );
        }
        let st = state.as_mut().expect("loaded above");
        // A model pinned for the session (SPEC §18.2) is in its state, known only now.
        let model = match st.pinned_model.as_deref() {
            Some(pinned) => self.runner.route(&work, Some(pinned)),
            None => routed,
        };
        // Where the reply, the typing indicator, approval prompts and `tts` go: decided once.
        work.reply_to = self.reply_address(&work);
        let target = work.reply_to.clone();
        let started = std::time::Instant::now();
        let finish = self
            .run_agent(key, &session, st, &work, &model, target.as_ref())
            .await?;
        log_finish(&session.id, &finish);
        let finished = finish != Finish::Cancelled;
        (self.after)
            .reply_out(
                &session,
                &work,
                target.as_ref(),
                finish,
                started,
                self.cfg.get().behavior.show_fallback,
            )
            .await;
        // Check compaction last, once the reply is out (SPEC §5.5), also after silent replies
        // and failures. A shutdown deadline interrupts it; nothing is recorded then.
        if finished && !self.stop.is_cancelled() {
            tokio::select! {
                _ = self.abort.cancelled() => {}
                _ = self.runner.after_message(&session, st, &work) => {}
            }
        }
        // The snapshot too waits until the reply is out, and is written by the snapshot thread,
        // only when `snapshot_due` (every 64 trail lines or more): it is a cache of the trail (a load
        // folds the lines after it; rebuilt when missing), not part of the acknowledgement, and
        // copying, serialising and syncing a long history after every message was the largest
        // per-message cost after the reply (docs/BENCHMARKS.md, overhead). A graceful stop and
        // an eviction from the idle cache save what lags.
        if st.snapshot_due() {
            st.mark_saved();
            session.queue_snapshot(st.clone());
        }
        Ok(finished.then_some(session))
    }

    /// The session that answers `work`. Its intake records must be in that session's trail:
    /// after a reset that was queued before this message (and so archived the session its
    /// intake was recorded in) they are recorded again in the new session — a no-op for ids
    /// the session already has — so recovery and `agent-send --wait` find them.
    async fn open_session(
        &self,
        key: &str,
        model: &str,
        work: &Work,
    ) -> std::io::Result<Arc<SessionHandle>> {
        let store = self.store.clone();
        let (k, m) = (key.to_string(), model.to_string());
        let intakes = if work.resume {
            Vec::new()
        } else {
            work.intakes.clone()
        };
        tokio::task::spawn_blocking(move || {
            let mut session = store.get_or_create(&k, &m)?;
            for i in intakes {
                session = store.append_intake(&k, &m, i)?.0;
            }
            Ok::<_, std::io::Error>(session)
        })
        .await
        .map_err(std::io::Error::other)?
    }

    /// Run the agent with a `/stop` token and the typing indicator. A user's `/stop` (not the
    /// shutdown deadline) ends the message for good: recorded as a failure, "Stopped.".
    async fn run_agent(
        &self,
        key: &str,
        session: &Arc<SessionHandle>,
        st: &mut SessionState,
        work: &Work,
        model: &str,
        target: Option<&Address>,
    ) -> std::io::Result<Finish> {
        let stop = self.abort.child_token();
        (self.running_tokens()).insert(key.to_string(), (stop.clone(), work.ids()));
        let typing = (self.after).typing(target, self.cfg.get().behavior.typing_indicators);
        self.active.fetch_add(1, Ordering::Relaxed);
        let finish = self.runner.process(session, st, work, model, &stop).await;
        self.active.fetch_sub(1, Ordering::Relaxed);
        if let Some(t) = typing {
            t.cancel();
        }
        self.running_tokens().remove(key);
        if finish != Finish::Cancelled || self.abort.is_cancelled() {
            return Ok(finish);
        }
        let (reply, error) = ("Stopped.".to_string(), STOPPED_ERROR.to_string());
        let ev = Event::Failure {
            reply_to: work.ids(),
            error: error.clone(),
            reply: reply.clone(),
        };
        crate::agent::append(session, ev).await?;
        Ok(Finish::Failed {
            reply,
            error,
            cause: crate::agent::FailCause::Other,
        })
    }

    /// Consolidate a session that was just closed (SPEC §13 "on session close", when
    /// `consolidation.enabled`), from its archived trail, in the background: the reset does not
    /// wait for the model. If the daemon stops first, `agentd consolidate` picks it up (the
    /// watermark did not move).
    fn consolidate_closed(&self, session_id: String) {
        let Some(c) = self.consolidator.clone() else {
            return;
        };
        if !self.cfg.get().memory.consolidation_enabled {
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
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::control::Source;

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
        fn route(&self, _work: &Work, _pinned: Option<&str>) -> String {
            "primary".into()
        }
        fn process<'a>(
            &'a self,
            _session: &'a Arc<SessionHandle>,
            _state: &'a mut SessionState,
            work: &'a Work,
            _model: &'a str,
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
                        truncated: false,
                        fallback: None,
                        client_calls: vec![],
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
        let store =
            Arc::new(SessionStore::open(&root.join("sessions"), crate::zone::Zone::utc()).unwrap());
        let runner = Arc::new(FakeRunner::default());
        let tracker = TaskTracker::new();
        let live = crate::config::Live::new(Arc::new(cfg));
        let dispatcher = Dispatcher::new(
            DispatcherDeps {
                cfg: live.clone(),
                runner: runner.clone(),
                store,
                monitor: Arc::new(Monitor::new(root.join("monitor.json"))),
                metrics: Arc::new(Metrics::new()),
                consolidator: None,
                webhook: None,
                outbound: None,
                contacts: Contacts::new(live.clone(), Vec::new()),
                speaker: None,
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
            notify_meta: None,
            relayed_from: None,
        }
    }

    fn message(intake: crate::session::Intake) -> Job {
        Job::Message(Work::new(vec![intake]))
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
            Finish::Failed { reply, error, .. } => {
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

    /// A reset queued before a message archives the session its intake was recorded in; the
    /// worker records the intake again in the new session (the "second append"), so the
    /// answer and its question share a trail.
    #[tokio::test]
    async fn a_message_after_a_queued_reset_is_recorded_in_the_new_session() {
        let f = fixture(|b| b.debounce = Duration::ZERO);
        let store = f.dispatcher.store.clone();
        let (old, _) = store
            .append_intake("k", "primary", user("r1", "alice", "after reset"))
            .unwrap();
        let done = f.dispatcher.wait_for("r1");
        let reset = Job::Reset {
            reason: "test".into(),
        };
        f.dispatcher.submit("k", reset).await;
        f.dispatcher
            .submit("k", message(user("r1", "alice", "after reset")))
            .await;
        let c = tokio::time::timeout(Duration::from_secs(10), done)
            .await
            .unwrap()
            .unwrap();
        let new = store.get("k").unwrap().unwrap();
        assert_ne!(new.id, old.id, "the reset archived the first session");
        assert_eq!(c.session_id, new.id);
        let trail = new.read_trail().unwrap();
        assert!(
            trail
                .iter()
                .any(|l| matches!(&l.event, Event::Intake(i) if i.id == "r1")),
            "the intake is in the answering session's trail"
        );
    }

    /// Telegram messages of one sender in two chats are two turns, each answering its chat
    /// (SPEC §16.9: debounce is per sender and chat).
    #[tokio::test]
    async fn debounce_keeps_one_senders_chats_apart() {
        let f = fixture(|b| b.debounce = Duration::from_millis(200));
        let tg = |id: &str, chat: i64, text: &str| {
            let mut i = user(id, "alice", text);
            i.source = Source::Telegram;
            i.route = Some(crate::session::Route::Chat {
                to: crate::message::Address::new("telegram", chat.to_string()),
                message: None,
            });
            i
        };
        let last = f.dispatcher.wait_for("g1");
        f.dispatcher
            .submit("k", message(tg("p1", 1, "private")))
            .await;
        f.dispatcher
            .submit("k", message(tg("p2", 1, "again")))
            .await;
        f.dispatcher
            .submit("k", message(tg("g1", -5, "group")))
            .await;
        assert_eq!(reply_text(&f.reply_of(last).await), "re: group");
        assert_eq!(
            f.seen(),
            vec![
                vec!["private".to_string(), "again".to_string()],
                vec!["group".to_string()]
            ]
        );
    }
}
