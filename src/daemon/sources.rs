//! Starting the sources (SPEC §5.1): the scheduler, the chat channels (`super::chat`), the
//! control FIFO, the HTTP API and, for `agentd chat`, the terminal. Each runs as a task of the
//! run's tracker until `stop`, and hands its messages to intake (`IntakeSink`).

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::services::{Services, Tasks};
use super::{DaemonError, http_backend};
use crate::channels::fifo;
use crate::channels::fifo_intake::{Request, request_of};
use crate::channels::intake::IntakeSink;

/// Capacity of the bounded queue between the FIFO reader and intake.
const INTAKE_QUEUE: usize = 64;

/// A source's main task: it runs until the stop token fires, then returns `Ok(())`.
pub type SourceTask = BoxFuture<'static, Result<(), String>>;

/// One more source, started with the configured ones and watched like them (an embedder's own
/// source; a test injects one that fails).
#[derive(Clone)]
pub struct ExtraSource {
    pub name: &'static str,
    /// Builds the task from the run's stop token.
    pub start: Arc<dyn Fn(CancellationToken) -> SourceTask + Send + Sync>,
}

impl std::fmt::Debug for ExtraSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtraSource")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Watches the sources (SPEC §16.7): one that ends other than by shutdown fires [`died`], with
/// the reason, and the lifecycle stops the daemon gracefully with exit code 3.
///
/// [`died`]: SourceWatch::died
#[derive(Clone, Default)]
pub struct SourceWatch {
    died: CancellationToken,
    why: Arc<Mutex<Option<String>>>,
}

impl SourceWatch {
    /// Runs `task` on the run's tracker; its end before `tasks.stop` is a death.
    pub fn spawn(&self, tasks: &Tasks, name: &'static str, task: SourceTask) {
        let (stop, watch) = (tasks.stop.clone(), self.clone());
        tasks.tracker.spawn(async move {
            let result = task.await;
            if stop.is_cancelled() {
                if let Err(e) = result {
                    tracing::warn!(source = name, error = %e, "source ended with an error during shutdown");
                }
                return;
            }
            let why = match result {
                Ok(()) => format!("source {name} ended unexpectedly"),
                Err(e) => format!("source {name} failed: {e}"),
            };
            tracing::error!(source = name, reason = %why, "a source died; stopping the daemon (exit 3) so that it is restarted");
            watch.record(why);
        });
    }

    fn record(&self, why: String) {
        let mut slot = self.why.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert(why);
        self.died.cancel();
    }

    /// Resolves with the first death's reason.
    pub async fn died(&self) -> String {
        self.died.cancelled().await;
        self.reason().unwrap_or_default()
    }

    /// The first death's reason, if a source died.
    pub fn reason(&self) -> Option<String> {
        self.why.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Start every configured source, and `extra`; the returned watch reports one that dies. The
/// FIFO is created after the others it follows here: its existence tells clients the daemon is
/// ready.
pub async fn start(
    s: &Services,
    tasks: &Tasks,
    extra: &[ExtraSource],
) -> Result<SourceWatch, DaemonError> {
    let watch = SourceWatch::default();
    start_scheduler(s, tasks);
    super::retention::start(s, tasks);
    super::backups::start(s, tasks);
    super::idle::start(s, tasks);
    for (name, chat) in &s.chats.channels {
        watch.spawn(tasks, name, chat.start(s, tasks));
    }
    if s.cfg.fifo.enabled {
        start_fifo(s, tasks, &watch)?;
    }
    if s.cfg.http.enabled {
        start_http(s, tasks, &watch).await?;
    }
    for source in extra {
        watch.spawn(tasks, source.name, (source.start)(tasks.stop.clone()));
    }
    Ok(watch)
}

fn start_scheduler(s: &Services, tasks: &Tasks) {
    let scheduler =
        Arc::new(crate::scheduler::Scheduler {
            cfg: s.live.clone(),
            db: s.db.clone(),
            intake: s.intake.clone(),
            wake: s.schedule_wake.clone(),
            memory_jobs: s.memory.clone().zip(s.consolidator.clone()).map(
                |(memory, consolidator)| crate::memory::MemoryJobs {
                    memory,
                    consolidator,
                    sessions_dir: s.paths.sessions(),
                },
            ),
            unrecorded: Default::default(),
            prechecks: Some(crate::scheduler::PrecheckRecorder {
                store: s.store.clone(),
                monitor: s.monitor.clone(),
            }),
        });
    let stop = tasks.stop.clone();
    tasks
        .tracker
        .spawn(async move { scheduler.run(stop).await });
}

/// The FIFO reader feeds a bounded queue; one task turns its lines into intake, in order.
fn start_fifo(s: &Services, tasks: &Tasks, watch: &SourceWatch) -> Result<(), DaemonError> {
    let (tx, mut rx) = mpsc::channel(INTAKE_QUEUE);
    fifo::create(&s.cfg.fifo.path).map_err(|e| DaemonError::Startup(e.to_string()))?;
    let path = s.cfg.fifo.path.clone();
    let max = s.cfg.fifo.max_line_bytes;
    let stop = tasks.stop.clone();
    let reader = fifo::run(path, max, tx, stop);
    watch.spawn(
        tasks,
        "fifo",
        Box::pin(async move { reader.await.map_err(|e| e.to_string()) }),
    );
    let (intake, live) = (s.intake.clone(), s.live.clone());
    let sink: Arc<dyn IntakeSink> = s.intake.clone();
    let approvals = s.approvals.clone();
    tasks.tracker.spawn(async move {
        while let Some(line) = rx.recv().await {
            let cfg = live.get();
            let (state_dir, max_text) = (&cfg.paths.state_dir, cfg.http.max_body_bytes);
            match request_of(line, state_dir, max_text).await {
                // Errors are logged by intake; the FIFO writer sees no intake record and
                // times out.
                Some(Request::Message { key, intake }) => {
                    let _ = sink.accept(&key, *intake).await;
                }
                Some(Request::Control(line @ crate::control::ControlLine::Approval { .. })) => {
                    super::approvals::handle_line(&approvals, &line)
                }
                Some(Request::Control(line)) => intake.control(line).await,
                None => {}
            }
        }
    });
    Ok(())
}

async fn start_http(s: &Services, tasks: &Tasks, watch: &SourceWatch) -> Result<(), DaemonError> {
    let cfg = &s.cfg;
    let listener = crate::api::bind(&cfg.http)
        .await
        .map_err(|e| DaemonError::Startup(e.to_string()))?;
    let addr = listener
        .local_addr()
        .map_err(|e| DaemonError::Startup(format!("HTTP listener: {e}")))?;
    let backend = Arc::new(http_backend::DaemonBackend {
        cfg: cfg.clone(),
        intake: s.intake.clone(),
        dispatcher: s.dispatcher.clone(),
        monitor: s.monitor.clone(),
        metrics: s.metrics.clone(),
        mcp: s.mcp.clone(),
        started: s.started,
        recent: Default::default(),
        approvals: s.approvals.clone(),
        tools: s.tools.clone(),
        skills: s.skills.clone(),
        db: s.db.clone(),
        memory: s.memory.clone(),
    });
    let mcp = crate::api::mcp::McpOptions::from_config(cfg);
    let router = crate::api::router_with_mcp(
        backend,
        &cfg.http,
        &cfg.agent.name,
        cfg.behavior.call_timeout,
        Some((mcp, tasks.stop.clone())),
    );
    let stop = tasks.stop.clone();
    let max_connections = cfg.http.max_connections;
    let server = crate::api::serve(listener, router, stop, max_connections);
    watch.spawn(
        tasks,
        "http",
        Box::pin(async move { server.await.map_err(|e| e.to_string()) }),
    );
    tracing::info!(%addr, "HTTP API listening");
    Ok(())
}

/// `agentd chat`: stdin/stdout as one more source. The returned token fires at end of input.
pub fn start_terminal(s: &Services, tasks: &Tasks) -> CancellationToken {
    let closed = CancellationToken::new();
    let intake: Arc<dyn IntakeSink> = s.intake.clone();
    let stop = tasks.stop.clone();
    let done = closed.clone();
    tasks.tracker.spawn(async move {
        crate::channels::terminal::run(intake, stop).await;
        done.cancel();
    });
    closed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_source_that_ends_before_stop_is_a_death_with_its_reason() {
        let tasks = Tasks::default();
        let watch = SourceWatch::default();
        watch.spawn(
            &tasks,
            "fifo",
            Box::pin(async { Err("read failed".into()) }),
        );
        let why = tokio::time::timeout(std::time::Duration::from_secs(5), watch.died())
            .await
            .expect("the death is reported");
        assert_eq!(why, "source fifo failed: read failed");
        // A second death does not replace the first reason.
        watch.spawn(&tasks, "http", Box::pin(async { Ok(()) }));
        tasks.tracker.close();
        tasks.tracker.wait().await;
        assert_eq!(
            watch.reason().as_deref(),
            Some("source fifo failed: read failed")
        );
    }

    #[tokio::test]
    async fn a_source_that_ends_at_shutdown_is_not_a_death() {
        let tasks = Tasks::default();
        let watch = SourceWatch::default();
        let stop = tasks.stop.clone();
        watch.spawn(
            &tasks,
            "http",
            Box::pin(async move {
                stop.cancelled().await;
                Err("closed".into())
            }),
        );
        tasks.stop.cancel();
        tasks.tracker.close();
        tasks.tracker.wait().await;
        assert_eq!(watch.reason(), None);
    }
}
