//! Starting the sources (SPEC §5.1): the scheduler, the Telegram poller, the control FIFO, the
//! HTTP API and, for `agentd chat`, the terminal. Each runs as a task of the run's tracker until
//! `stop`, and hands its messages to intake.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::services::{Services, Tasks};
use super::{DaemonError, http_backend, telegram};
use crate::channels::fifo;
use crate::channels::intake::IntakeSink;

/// Capacity of the bounded queue between the FIFO reader and intake.
const INTAKE_QUEUE: usize = 64;

/// Start every configured source. The FIFO is created after the others it follows here: its
/// existence tells clients the daemon is ready.
pub async fn start(s: &Services, tasks: &Tasks) -> Result<(), DaemonError> {
    start_scheduler(s, tasks);
    if let Some(client) = s.telegram.clone() {
        telegram::start_poller(client, s, tasks);
    }
    if s.cfg.fifo.enabled {
        start_fifo(s, tasks)?;
    }
    if s.cfg.http.enabled {
        start_http(s, tasks).await?;
    }
    Ok(())
}

fn start_scheduler(s: &Services, tasks: &Tasks) {
    let scheduler =
        Arc::new(crate::scheduler::Scheduler {
            cfg: s.cfg.clone(),
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
        });
    let stop = tasks.stop.clone();
    tasks
        .tracker
        .spawn(async move { scheduler.run(stop).await });
}

/// The FIFO reader feeds a bounded queue; one task turns its lines into intake, in order.
fn start_fifo(s: &Services, tasks: &Tasks) -> Result<(), DaemonError> {
    let (tx, mut rx) = mpsc::channel(INTAKE_QUEUE);
    fifo::create(&s.cfg.fifo.path).map_err(|e| DaemonError::Startup(e.to_string()))?;
    let path = s.cfg.fifo.path.clone();
    let max = s.cfg.fifo.max_line_bytes;
    let stop = tasks.stop.clone();
    tasks.tracker.spawn(async move {
        if let Err(e) = fifo::run(path, max, tx, stop).await {
            tracing::error!(error = %e, "FIFO reader stopped");
        }
    });
    let intake = s.intake.clone();
    tasks.tracker.spawn(async move {
        while let Some(line) = rx.recv().await {
            intake.handle(line).await;
        }
    });
    Ok(())
}

async fn start_http(s: &Services, tasks: &Tasks) -> Result<(), DaemonError> {
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
    });
    let router = crate::api::router(
        backend,
        &cfg.http,
        &cfg.agent.name,
        cfg.behavior.call_timeout,
    );
    let stop = tasks.stop.clone();
    let max_connections = cfg.http.max_connections;
    tasks.tracker.spawn(async move {
        if let Err(e) = crate::api::serve(listener, router, stop, max_connections).await {
            tracing::error!(error = %e, "HTTP server stopped");
        }
    });
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
