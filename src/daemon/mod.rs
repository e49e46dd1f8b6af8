//! The daemon (SPEC §5, §10.4): builds the subsystems, recovers unfinished work, runs the
//! sources and per-session workers, and owns the lifecycle (PID lock, signals, graceful stop).

pub mod delivery;
pub mod http_backend;
pub mod intake;
pub mod notify;
pub mod pidlock;
pub mod signals;
pub mod telegram;
pub mod workers;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agent::Agent;
use crate::channels::fifo;
use crate::config::Config;
use crate::fsutil;
use crate::llm::Llm;
use crate::monitor::Monitor;
use crate::session::SessionStore;
use crate::store::Db;
use crate::tools::{ToolRegistry, builtin_tools};

use intake::IntakeHandler;
use pidlock::PidLock;
use workers::Dispatcher;

/// How long in-flight messages may run after SIGTERM before they are interrupted (they resume
/// after the next start).
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(15);

/// Capacity of the bounded intake queue between sources and intake.
const INTAKE_QUEUE: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Configuration or start-up problem (exit code 1).
    #[error("{0}")]
    Startup(String),
    /// Failure while running (exit code 3).
    #[error("{0}")]
    Runtime(String),
}

impl DaemonError {
    pub fn exit_code(&self) -> i32 {
        match self {
            DaemonError::Startup(_) => 1,
            DaemonError::Runtime(_) => 3,
        }
    }
}

/// Well-known paths under the state directory (SPEC §2).
pub struct StatePaths {
    pub root: PathBuf,
}

impl StatePaths {
    pub fn pid(&self) -> PathBuf {
        self.root.join("agentd.pid")
    }
    pub fn db(&self) -> PathBuf {
        self.root.join("agentd.db")
    }
    pub fn sessions(&self) -> PathBuf {
        self.root.join("sessions")
    }
    pub fn monitor(&self) -> PathBuf {
        self.root.join("monitor.json")
    }
    pub fn inbox(&self) -> PathBuf {
        self.root.join("inbox")
    }
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }
}

/// A state directory that existed wider than 0700 (made by hand, 0755) is tightened, with a
/// warning; one owned by another uid is only warned about (issue #12, finding 16).
fn tighten_state_dir(dir: &std::path::Path) {
    match fsutil::tighten_private_dir(dir) {
        Ok(fsutil::Tightened::AlreadyPrivate) => {}
        Ok(fsutil::Tightened::From(mode)) => tracing::warn!(
            dir = %dir.display(),
            "state directory had mode {mode:o}, which let other users in; changed to 700"
        ),
        Ok(fsutil::Tightened::NotOurs { uid, mode }) => tracing::warn!(
            dir = %dir.display(),
            "state directory has mode {mode:o} and belongs to uid {uid}, not to us; left as \
             it is: run chmod 700 on it as its owner"
        ),
        Err(e) => tracing::warn!(
            dir = %dir.display(),
            error = %e,
            "cannot check the state directory's mode"
        ),
    }
}

/// Root is not a supported deployment: `exec` could read `/etc/shadow` and every user's
/// files (the sandbox confines paths, not privilege).
fn warn_if_root() {
    if nix::unistd::geteuid().is_root() {
        tracing::warn!("{}", crate::doctor::ROOT_WARNING);
    }
}

/// How the daemon runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// `agentd chat`: stdin/stdout is one more channel (source `terminal`); EOF stops the daemon.
    pub terminal: bool,
}

/// Run the daemon until SIGTERM/SIGINT (or, in terminal mode, end of input).
pub async fn run(cfg: Config, opts: RunOptions) -> Result<(), DaemonError> {
    let started = Instant::now();
    // Handlers first, so a SIGTERM during start-up is a graceful stop too.
    let mut signals = signals::Signals::install()
        .map_err(|e| DaemonError::Startup(format!("cannot install signal handlers: {e}")))?;
    let notifier = notify::Notifier::from_env();
    let cfg = Arc::new(cfg);
    let paths = StatePaths {
        root: cfg.paths.state_dir.clone(),
    };
    let startup =
        |what: &str, e: &dyn std::fmt::Display| DaemonError::Startup(format!("{what}: {e}"));

    for dir in [
        paths.root.clone(),
        paths.sessions(),
        paths.inbox(),
        paths.logs(),
    ] {
        fsutil::create_private_dir(&dir)
            .map_err(|e| startup(&format!("cannot create {}", dir.display()), &e))?;
        tighten_state_dir(&dir);
    }
    warn_if_root();
    // The tools' scratch space (SPEC §16.8): 0700, ours, not a symlink — or no start.
    crate::tools::paths::ensure_scratch_dir(&cfg.tools.scratch_dir)
        .map_err(DaemonError::Startup)?;
    let pid = PidLock::acquire(&paths.pid()).map_err(|e| DaemonError::Startup(e.to_string()))?;
    let db = Db::open(&paths.db()).map_err(|e| startup("cannot open the database", &e))?;
    let store = Arc::new(
        SessionStore::open(&paths.sessions(), cfg.agent.timezone)
            .map_err(|e| startup("cannot open the sessions directory", &e))?,
    );
    let monitor = Arc::new(Monitor::new(paths.monitor()));

    for (name, reason) in &cfg.models.skipped {
        tracing::warn!(model = %name, %reason, "model not loaded");
    }
    for (name, spec) in &cfg.models.loaded {
        tracing::info!(model = %name, provider = %spec.provider, api_model = %spec.model, "model loaded");
    }
    let llm = Arc::new(Llm::new(cfg.models.clone(), &cfg.behavior));
    // Long-term memory (SPEC §13): memory.db, its tools, recall, consolidation.
    let ledger = crate::cost::Ledger::new(db.clone(), &cfg);
    // Not fatal: without memory the agent still answers (the log and `agentd doctor` say why).
    let memory = if cfg.memory.enabled {
        match crate::memory::Memory::open(&cfg, llm.clone(), Some(ledger.clone())) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::error!(error = %e, "long-term memory is off for this run: cannot open memory.db (see `agentd doctor`)");
                None
            }
        }
    } else {
        None
    };
    let consolidator = memory.as_ref().map(|m| {
        crate::memory::consolidate::Consolidator::new(m.clone(), llm.clone(), ledger.clone(), &cfg)
    });
    let skills = Arc::new(crate::skills::SkillSet::load(
        &cfg.agent.skills.dir,
        &cfg.agent.skills.always_on,
    ));
    // Built-in tools: every candidate, then one `[tools] enabled` filter. MCP tools are
    // governed by their server's `tools` list instead (SPEC §3).
    let mut tool_list = builtin_tools(&cfg.tools);
    if let Some(key) = &cfg.tools.web_search_key {
        tool_list.push(Arc::new(crate::tools::web_search::WebSearchTool::new(
            &cfg.tools.web_search_base_url,
            key.clone(),
        )));
    }
    // Sandboxed shell: never the state or config directory (see docs/security.md).
    tool_list.push(Arc::new(crate::tools::exec::ExecTool::from_config(&cfg)));
    // Which sandbox path exec takes here, logged once (a probe in the background).
    crate::sandbox::probe::log_at_start(
        crate::tools::exec::sandbox_mode(cfg.tools.exec_sandbox),
        cfg.tools.exec_network,
    );
    tool_list.push(Arc::new(crate::skills::LoadSkillTool {
        skills: skills.clone(),
    }));
    // The Telegram client is built before the tools (message/react use it) and installed as
    // the reply deliverer before recovery.
    let telegram = if cfg.telegram.enabled {
        Some(
            crate::channels::telegram::client::TelegramClient::new(&cfg.telegram)
                .map_err(|e| DaemonError::Startup(format!("telegram: {e}")))?,
        )
    } else {
        None
    };
    let outbound: Option<Arc<dyn crate::tools::outbound::Outbound>> = telegram.as_ref().map(|c| {
        Arc::new(telegram::TgOutbound::new(cfg.clone(), c.clone()))
            as Arc<dyn crate::tools::outbound::Outbound>
    });
    if let Some(outbound) = &outbound {
        let m = crate::tools::messaging::Messaging {
            cfg: cfg.clone(),
            outbound: outbound.clone(),
            sessions: store.clone(),
        };
        tool_list.extend(m.tools());
    }
    let schedule_wake = Arc::new(tokio::sync::Notify::new());
    let schedule_tools = crate::tools::schedule::ScheduleTools {
        db: db.clone(),
        wake: schedule_wake.clone(),
        max_scheduled: cfg.tools.max_scheduled,
        max_delay: cfg.tools.max_delay,
        tz: cfg.agent.timezone,
    };
    tool_list.extend(schedule_tools.tools());
    let spawn_tool = Arc::new(crate::tools::spawn::SpawnTool {
        cfg: cfg.clone(),
        llm: llm.clone(),
        db: db.clone(),
        registry: std::sync::OnceLock::new(),
    });
    tool_list.push(spawn_tool.clone());
    if let Some(m) = &memory {
        tool_list.extend(crate::tools::memory::tools(m));
    }
    tool_list.retain(|t| cfg.tools.is_enabled(&t.spec().name));
    // MCP servers (SPEC §12): started now, their tools listed within 10 s; failures are
    // logged and retried by each server's supervisor, never fatal.
    let mcp_cancel = CancellationToken::new();
    let mcp = crate::tools::mcp::McpManager::start(
        &cfg.mcp_servers,
        crate::tools::mcp::McpSandbox::from_config(&cfg),
        mcp_cancel.clone(),
    );
    if !cfg.mcp_servers.is_empty() {
        mcp.wait_ready(Duration::from_secs(10)).await;
        tool_list.extend(mcp.tools());
    }
    let tools = Arc::new(
        ToolRegistry::new(
            tool_list,
            cfg.tools.exec_timeout,
            cfg.behavior.output_truncation,
        )
        .map_err(|e| DaemonError::Startup(format!("tool registry: {e}")))?
        .with_max_parallel(cfg.tools.max_parallel_calls),
    );
    let _ = spawn_tool.registry.set(tools.clone());
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let agent = Agent {
        cfg: cfg.clone(),
        llm,
        db,
        tools,
        monitor: monitor.clone(),
        metrics: metrics.clone(),
        skills: skills.clone(),
        memory: memory.clone(),
        consolidator: consolidator.clone(),
        started,
    };
    let webhook = crate::api::webhook::Webhook::new(&cfg.http, &cfg.agent.name)
        .map_err(|e| DaemonError::Startup(e.to_string()))?;

    let tracker = TaskTracker::new();
    let stop = CancellationToken::new();
    let abort = CancellationToken::new();
    let dispatcher = Dispatcher::new(
        workers::DispatcherDeps {
            cfg: cfg.clone(),
            runner: Arc::new(agent.clone()),
            store: store.clone(),
            monitor: monitor.clone(),
            metrics: metrics.clone(),
            consolidator: consolidator.clone(),
            webhook: webhook.is_enabled().then_some(webhook),
            outbound,
        },
        tracker.clone(),
        stop.clone(),
        abort.clone(),
    );
    let intake = Arc::new(IntakeHandler {
        agent: agent.clone(),
        store: store.clone(),
        dispatcher: dispatcher.clone(),
    });
    // Replies a crash left unsent first, then unfinished work, then new input.
    intake.recover_deliveries().await;
    intake.recover().await;
    {
        let scheduler = Arc::new(crate::scheduler::Scheduler {
            cfg: cfg.clone(),
            db: agent.db.clone(),
            intake: intake.clone(),
            wake: schedule_wake.clone(),
            memory_jobs: memory
                .clone()
                .zip(consolidator.clone())
                .map(|(memory, consolidator)| crate::memory::MemoryJobs {
                    memory,
                    consolidator,
                    sessions_dir: paths.sessions(),
                }),
        });
        let stop = stop.clone();
        tracker.spawn(async move { scheduler.run(stop).await });
    }
    if let Some(client) = telegram {
        telegram::start_poller(
            client,
            cfg.clone(),
            agent.db.clone(),
            intake.clone(),
            dispatcher.clone(),
            monitor.clone(),
            &tracker,
            stop.clone(),
        );
    }

    // Sources. The FIFO is created last: its existence tells clients the daemon is ready.
    let (tx, mut rx) = mpsc::channel(INTAKE_QUEUE);
    if cfg.fifo.enabled {
        fifo::create(&cfg.fifo.path).map_err(|e| DaemonError::Startup(e.to_string()))?;
        let path = cfg.fifo.path.clone();
        let max = cfg.fifo.max_line_bytes;
        let stop = stop.clone();
        tracker.spawn(async move {
            if let Err(e) = fifo::run(path, max, tx, stop).await {
                tracing::error!(error = %e, "FIFO reader stopped");
            }
        });
    } else {
        drop(tx);
    }
    {
        let intake = intake.clone();
        tracker.spawn(async move {
            while let Some(line) = rx.recv().await {
                intake.handle(line).await;
            }
        });
    }
    if cfg.http.enabled {
        let listener = crate::api::bind(&cfg.http)
            .await
            .map_err(|e| DaemonError::Startup(e.to_string()))?;
        let addr = listener
            .local_addr()
            .map_err(|e| DaemonError::Startup(format!("HTTP listener: {e}")))?;
        let backend = Arc::new(http_backend::DaemonBackend {
            cfg: cfg.clone(),
            intake: intake.clone(),
            dispatcher: dispatcher.clone(),
            monitor: monitor.clone(),
            metrics: metrics.clone(),
            mcp: mcp.clone(),
            started,
        });
        let router = crate::api::router(
            backend,
            &cfg.http,
            &cfg.agent.name,
            cfg.behavior.call_timeout,
        );
        let stop = stop.clone();
        let max_connections = cfg.http.max_connections;
        tracker.spawn(async move {
            if let Err(e) = crate::api::serve(listener, router, stop, max_connections).await {
                tracing::error!(error = %e, "HTTP server stopped");
            }
        });
        tracing::info!(%addr, "HTTP API listening");
    }
    tracing::info!(
        pid = std::process::id(),
        state_dir = %paths.root.display(),
        startup_ms = started.elapsed().as_millis() as u64,
        "agentd ready"
    );

    let input_closed = CancellationToken::new();
    if opts.terminal {
        let intake = intake.clone();
        let stop = stop.clone();
        let closed = input_closed.clone();
        tracker.spawn(async move {
            crate::channels::terminal::run(intake, stop).await;
            closed.cancel();
        });
    }
    notifier.ready(&format!(
        "ready: {} model(s) loaded, {} skipped",
        cfg.models.loaded.len(),
        cfg.models.skipped.len()
    ));
    let mut watchdog = notifier.watchdog_interval().map(tokio::time::interval);
    loop {
        let tick = async {
            match watchdog.as_mut() {
                Some(i) => {
                    i.tick().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            sig = signals.next() => match sig {
                Some(sig) if sig.is_shutdown() => {
                    tracing::info!(signal = sig.name(), "shutdown signal received");
                    break;
                }
                Some(signals::Signal::Hangup) => {
                    // Workspace files are re-read for every message; skills and schedules
                    // will reload here once they exist. agentd.toml needs a restart.
                    notifier.reloading("reloading workspace and skills");
                    let n = skills.rescan();
                    tracing::info!(skills = n, "SIGHUP: workspace and skills reloaded (workspace files are re-read per message; agentd.toml changes need a restart)");
                    notifier.ready_again("ready");
                }
                Some(signals::Signal::User1) => {
                    let n = skills.rescan();
                    tracing::info!(skills = n, "SIGUSR1: skills rescanned");
                }
                Some(_) => {}
                None => break,
            },
            _ = input_closed.cancelled() => {
                tracing::info!("end of terminal input");
                break;
            }
            _ = tick => {
                // Ping only while the main loop runs and the database thread answers.
                match tokio::time::timeout(Duration::from_secs(5), agent.db.kv_get("health")).await {
                    Ok(Ok(_)) => notifier.watchdog(),
                    other => tracing::error!(result = ?other.map(|r| r.map(|_| ())), "health check failed; not pinging the watchdog"),
                }
                notifier.status(&format!(
                    "{} active, {} queued",
                    dispatcher.active_sessions(),
                    dispatcher.queue_depth()
                ));
            }
        }
    }
    notifier.stopping("stopping: finishing messages in flight");
    tracing::info!("shutting down: no new work; waiting for messages in flight");
    stop.cancel();
    tracker.close();
    if tokio::time::timeout(SHUTDOWN_DEADLINE, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            deadline_s = SHUTDOWN_DEADLINE.as_secs(),
            "messages still running at the deadline; interrupting (they resume after restart)"
        );
        abort.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await;
    }
    let s = store.clone();
    let _ = tokio::task::spawn_blocking(move || s.flush_snapshots()).await;
    if cfg.fifo.enabled {
        fifo::remove(&cfg.fifo.path);
    }
    mcp_cancel.cancel();
    pid.release();
    tracing::info!("agentd stopped");
    Ok(())
}
