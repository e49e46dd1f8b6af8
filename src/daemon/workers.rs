//! The queue behind intake (SPEC §5.4): one worker task per session key processes that
//! session's jobs one at a time in arrival order; different sessions run concurrently up to
//! `max_concurrent_sessions` (a semaphore).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Mutex, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agent::{Agent, Finish, Work};
use crate::session::{SessionState, SessionStore};

/// A job for one session.
#[derive(Debug)]
pub enum Job {
    Message(Work),
    /// Archive the session (through the queue so it never races a running message).
    Reset {
        reason: String,
    },
}

/// Routes jobs to per-session workers.
pub struct Dispatcher {
    agent: Agent,
    store: Arc<SessionStore>,
    workers: Mutex<HashMap<String, mpsc::UnboundedSender<Job>>>,
    permits: Arc<Semaphore>,
    depth: Arc<AtomicUsize>,
    tracker: TaskTracker,
    /// Fired at shutdown: workers start no new job.
    stop: CancellationToken,
    /// Fired when the shutdown deadline passed: running messages are interrupted.
    abort: CancellationToken,
}

impl Dispatcher {
    pub fn new(
        agent: Agent,
        store: Arc<SessionStore>,
        tracker: TaskTracker,
        stop: CancellationToken,
        abort: CancellationToken,
    ) -> Arc<Dispatcher> {
        let permits = Arc::new(Semaphore::new(
            agent.cfg.behavior.max_concurrent_sessions.max(1),
        ));
        Arc::new(Dispatcher {
            agent,
            store,
            workers: Mutex::new(HashMap::new()),
            permits,
            depth: Arc::new(AtomicUsize::new(0)),
            tracker,
            stop,
            abort,
        })
    }

    /// Jobs queued and not yet started.
    pub fn queue_depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    /// Keys of sessions that have a worker.
    pub async fn active_keys(&self) -> Vec<String> {
        self.workers.lock().await.keys().cloned().collect()
    }

    pub async fn submit(self: &Arc<Self>, key: &str, job: Job) {
        let mut workers = self.workers.lock().await;
        self.depth.fetch_add(1, Ordering::Relaxed);
        self.agent.monitor.set_queue_depth(self.queue_depth());
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

    async fn worker(self: Arc<Self>, key: String, mut rx: mpsc::UnboundedReceiver<Job>) {
        let mut state: Option<SessionState> = None;
        loop {
            let job = tokio::select! {
                _ = self.stop.cancelled() => break,
                j = rx.recv() => match j { Some(j) => j, None => break },
            };
            self.depth.fetch_sub(1, Ordering::Relaxed);
            self.agent.monitor.set_queue_depth(self.queue_depth());
            match job {
                Job::Message(work) => {
                    let Ok(_permit) = self.permits.clone().acquire_owned().await else {
                        break;
                    };
                    if let Err(e) = self.run_message(&key, &mut state, work).await {
                        tracing::error!(session_key = %key, error = %e, "message processing failed");
                        state = None;
                    }
                }
                Job::Reset { reason } => {
                    let store = self.store.clone();
                    let k = key.clone();
                    match tokio::task::spawn_blocking(move || store.archive(&k, &reason)).await {
                        Ok(Ok(true)) => {
                            tracing::info!(session_key = %key, "session reset and archived")
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

    async fn run_message(
        &self,
        key: &str,
        state: &mut Option<SessionState>,
        work: Work,
    ) -> std::io::Result<()> {
        let model = self
            .agent
            .route(work.intakes.first().map_or("user", |i| i.source.as_str()));
        let store = self.store.clone();
        let k = key.to_string();
        let m = model.clone();
        let session = tokio::task::spawn_blocking(move || store.get_or_create(&k, &m))
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
        let finish = self.agent.process(&session, st, &work, &self.abort).await;
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
        let snapshot = st.clone();
        let s = session.clone();
        tokio::task::spawn_blocking(move || s.save_state(&snapshot))
            .await
            .map_err(std::io::Error::other)??;
        Ok(())
    }
}
