//! Building the daemon's services from the config (SPEC §5): the state directory, the PID
//! lock, the database, sessions, models, memory, skills, the chat channels (`super::chat`),
//! the tools, the dispatcher and intake. Nothing runs yet, except the MCP servers (started so their tools can
//! be listed).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::intake::IntakeHandler;
use super::pidlock::PidLock;
use super::workers::{Dispatcher, DispatcherDeps};
use super::{DaemonError, StatePaths};
use crate::agent::Agent;
use crate::config::Config;
use crate::fsutil;
use crate::gateway::Gateway;
use crate::memory::Memory;
use crate::memory::consolidate::Consolidator;
use crate::monitor::Monitor;
use crate::session::SessionStore;
use crate::store::Db;
use crate::tools::mcp::McpManager;
use crate::tools::outbound::{Contacts, Outbound};

/// The tasks of one run and the two stages of stopping them.
#[derive(Clone, Default)]
pub struct Tasks {
    pub tracker: TaskTracker,
    /// Fired at shutdown: sources stop, workers start no new job.
    pub stop: CancellationToken,
    /// Fired when the shutdown deadline passed: running messages are interrupted.
    pub abort: CancellationToken,
}

/// Everything the sources and the lifecycle need, built once.
pub struct Services {
    /// The config the daemon started with: what needs a restart is read from here.
    pub cfg: Arc<Config>,
    /// The running config, replaced by a SIGHUP reload (`super::reload`): what applies live.
    pub live: crate::config::Live,
    pub paths: StatePaths,
    pub pid: PidLock,
    pub db: Db,
    pub store: Arc<SessionStore>,
    pub monitor: Arc<Monitor>,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub skills: Arc<crate::skills::SkillSet>,
    pub memory: Option<Memory>,
    pub consolidator: Option<Consolidator>,
    /// The chat channels the config turns on, opened (their sources start with the others).
    pub chats: super::chat::Opened,
    /// Costs and the budget (a reload sets new limits on it).
    pub ledger: crate::cost::Ledger,
    pub mcp: Arc<McpManager>,
    /// Stops the MCP servers (after the workers, at the very end).
    pub mcp_cancel: CancellationToken,
    /// Woken when `schedule_message` changes the one-shot schedule.
    pub schedule_wake: Arc<Notify>,
    pub dispatcher: Arc<Dispatcher>,
    pub intake: Arc<IntakeHandler>,
    /// Tool calls waiting for a person's yes (SPEC §18.1).
    pub approvals: Arc<crate::tools::approval::Approvals>,
    /// The agent's tools (MCP ones included): a compatible endpoint's client tools may not
    /// take their names (SPEC §17).
    pub tools: Arc<crate::tools::ToolRegistry>,
    /// How an alert reaches the `[alerts]` chat (the cache alarm's, a failed scheduled backup).
    pub alert: Option<crate::cost::alarm::Notify>,
    pub started: Instant,
}

fn startup(what: &str, e: &dyn std::fmt::Display) -> DaemonError {
    DaemonError::Startup(format!("{what}: {e}"))
}

/// What lives in the state directory, opened in order: the directory, the PID lock (one
/// daemon per state directory), `agentd.db`, the sessions, `monitor.json`.
struct State {
    paths: StatePaths,
    pid: PidLock,
    db: Db,
    store: Arc<SessionStore>,
    monitor: Arc<Monitor>,
}

fn open_state(cfg: &Config) -> Result<State, DaemonError> {
    let paths = StatePaths {
        root: cfg.paths.state_dir.clone(),
    };
    prepare_state_dir(&paths, cfg)?;
    let pid = PidLock::acquire(&paths.pid()).map_err(|e| DaemonError::Startup(e.to_string()))?;
    let before = super::upgrade::backup_before_migration(cfg)?;
    let db = Db::open(&paths.db()).map_err(|e| match &before {
        Some(b) => super::upgrade::failed_after_backup("cannot open the database", &e, b),
        None => startup("cannot open the database", &e),
    })?;
    let store = Arc::new(
        SessionStore::open(&paths.sessions(), cfg.agent.timezone.clone())
            .map_err(|e| startup("cannot open the sessions directory", &e))?,
    );
    let monitor = Arc::new(Monitor::new(paths.monitor()));
    Ok(State {
        paths,
        pid,
        db,
        store,
        monitor,
    })
}

/// The dispatcher (queues and workers) and durable intake in front of it.
fn queues(
    deps: DispatcherDeps,
    tasks: &Tasks,
    voice: Arc<super::voice::Transcriber>,
) -> (Arc<Dispatcher>, Arc<IntakeHandler>) {
    let (cfg, store, monitor) = (deps.cfg.clone(), deps.store.clone(), deps.monitor.clone());
    let dispatcher = Dispatcher::new(
        deps,
        tasks.tracker.clone(),
        tasks.stop.clone(),
        tasks.abort.clone(),
    );
    let intake = Arc::new(IntakeHandler {
        cfg,
        store,
        dispatcher: dispatcher.clone(),
        voice: Some(voice),
        monitor,
    });
    (dispatcher, intake)
}

/// The state directories, 0700; a wider one is tightened (or warned about).
fn prepare_state_dir(paths: &StatePaths, cfg: &Config) -> Result<(), DaemonError> {
    for dir in [
        paths.root.clone(),
        paths.sessions(),
        paths.inbox(),
        paths.logs(),
    ] {
        fsutil::create_private_dir(&dir)
            .map_err(|e| startup(&format!("cannot create {}", dir.display()), &e))?;
        super::tighten_state_dir(&dir);
    }
    super::warn_if_root();
    // The tools' scratch space (SPEC §16.8): 0700, ours, not a symlink — or no start.
    crate::tools::paths::ensure_scratch_dir(&cfg.tools.scratch_dir).map_err(DaemonError::Startup)
}

/// Long-term memory (SPEC §13). Not fatal: without memory the agent still answers (the log
/// and `agentd doctor` say why).
fn open_memory(cfg: &Config, gateway: &Arc<Gateway>) -> (Option<Memory>, Option<Consolidator>) {
    if !cfg.memory.enabled {
        return (None, None);
    }
    let memory = match Memory::open(cfg, gateway.clone()) {
        Ok(m) => m,
        Err(e) => {
            tracing::error!(error = %e, "long-term memory is off for this run: cannot open memory.db (see `agentd doctor`)");
            return (None, None);
        }
    };
    let consolidator = Consolidator::new(memory.clone(), gateway.clone(), cfg);
    (Some(memory), Some(consolidator))
}

/// How the cache alarm's one notice per episode (SPEC §20) reaches the chat `[alerts]` names
/// (`telegram_chat`): through the outbox's retry loop, in the background. `None` without such
/// a chat, or when its channel is off.
fn alert_notice(
    cfg: &Config,
    contacts: &Contacts,
    outbound: Option<Arc<dyn Outbound>>,
    tasks: &Tasks,
) -> Option<crate::cost::alarm::Notify> {
    let to = contacts.alerts_chat()?;
    let Some(outbound) = outbound.filter(|o| o.serves(&to.channel)) else {
        tracing::warn!(
            chat = %to,
            "[alerts] names a chat on {}, which is off: alerts go to the log and the monitor only (enable that channel)",
            to.channel
        );
        return None;
    };
    let policy = crate::tools::outbound::RetryPolicy {
        within: cfg.delivery.retry,
        abort: tasks.abort.clone(),
    };
    let tracker = tasks.tracker.clone();
    Some(Arc::new(move |text: String| {
        let (outbound, policy) = (outbound.clone(), policy.clone());
        let to = to.clone();
        tracker.spawn(async move {
            match crate::tools::outbound::send_text_with_retry(&*outbound, &to, &text, &policy)
                .await
            {
                Ok(_) => tracing::info!(chat = %to, "alert notice sent"),
                Err(e) => tracing::warn!(chat = %to, error = %e, "alert notice not sent"),
            }
        });
    }))
}

/// The ledger of costs and budgets (with the cache alarm), the metrics, and the gateway every
/// provider call of every kind goes through (budget, retries, cost, metrics).
fn accounting(
    cfg: &Config,
    db: &Db,
    monitor: &Arc<Monitor>,
    alert: Option<crate::cost::alarm::Notify>,
) -> (
    crate::cost::Ledger,
    Arc<crate::metrics::Metrics>,
    Arc<Gateway>,
) {
    let ledger = crate::cost::Ledger::new(db.clone(), cfg)
        .with_cache_watch(crate::cost::alarm::CacheWatch::new(monitor.clone(), alert));
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let gateway = Arc::new(Gateway::new(cfg, ledger.clone(), metrics.clone()));
    (ledger, metrics, gateway)
}

/// Which sandbox path exec takes here, logged once (a probe in the background).
fn log_sandbox(cfg: &Config) {
    crate::sandbox::probe::log_at_start(
        crate::tools::exec::sandbox_mode(cfg.tools.exec_sandbox),
        cfg.tools.exec_network,
    );
}

/// MCP servers (SPEC §12): started now, never waited for (their tools join the registry when
/// they come); failures are logged and retried by each server's supervisor, never fatal. The
/// token stops them.
fn start_mcp(cfg: &Config) -> (Arc<McpManager>, CancellationToken) {
    let cancel = CancellationToken::new();
    let mcp = McpManager::start(
        &cfg.mcp_servers,
        crate::tools::mcp::McpSandbox::from_config(cfg),
        cancel.clone(),
    );
    (mcp, cancel)
}

/// Text to speech (SPEC §19): the `tts` tool and spoken replies; `None` without a `tts_model`.
fn speaker(
    cfg: &Config,
    gateway: &Arc<Gateway>,
    paths: &StatePaths,
) -> Option<Arc<crate::tools::tts::Speaker>> {
    cfg.voice.tts_model.is_some().then(|| {
        Arc::new(crate::tools::tts::Speaker {
            gateway: gateway.clone(),
            cfg: cfg.voice.clone(),
            inbox: paths.inbox(),
        })
    })
}

/// The broker of tool calls waiting for a person's yes (SPEC §18.1).
fn approvals(
    live: &crate::config::Live,
    outbound: Option<Arc<dyn Outbound>>,
    contacts: &Contacts,
    paths: &StatePaths,
    tasks: &Tasks,
) -> Arc<crate::tools::approval::Approvals> {
    crate::tools::approval::Approvals::new(
        Some(live.clone()),
        outbound,
        Some(contacts.clone()),
        Some(paths.root.clone()),
        tasks.abort.clone(),
    )
}

/// The webhook of finished messages, `None` when the config turns it off.
fn webhook(
    cfg: &Config,
    metrics: &Arc<crate::metrics::Metrics>,
    monitor: &Arc<Monitor>,
) -> Result<Option<crate::api::webhook::Webhook>, DaemonError> {
    let webhook = crate::api::webhook::Webhook::new(&cfg.http, &cfg.agent.name)
        .map_err(|e| DaemonError::Startup(e.to_string()))?
        .observed(metrics.clone(), monitor.clone());
    Ok(webhook.is_enabled().then_some(webhook))
}

/// Speech to text (SPEC §19): transcribes inbound audio with `[voice] stt_model`.
fn transcriber(cfg: &Config, gateway: &Arc<Gateway>) -> Arc<super::voice::Transcriber> {
    Arc::new(super::voice::Transcriber {
        gateway: gateway.clone(),
        cfg: cfg.voice.clone(),
    })
}

fn log_models(cfg: &Config) {
    for (name, reason) in &cfg.models.skipped {
        tracing::warn!(model = %name, %reason, "model not loaded");
    }
    for (name, spec) in &cfg.models.loaded {
        tracing::info!(model = %name, provider = %spec.provider, api_model = %spec.model, "model loaded");
    }
}

impl Services {
    pub async fn build(
        cfg: Arc<Config>,
        tasks: &Tasks,
        started: Instant,
    ) -> Result<Services, DaemonError> {
        let State {
            paths,
            pid,
            db,
            store,
            monitor,
        } = open_state(&cfg)?;
        log_models(&cfg);
        let live = crate::config::Live::new(cfg.clone());
        // The chat channels, and the one router replies, tools and approvals send through.
        let chats = super::chat::Opened::open(&cfg)?;
        let outbound = chats.router();
        let contacts = super::chat::contacts(&live);
        let alert = alert_notice(&cfg, &contacts, outbound.clone(), tasks);
        let (ledger, metrics, gateway) = accounting(&cfg, &db, &monitor, alert.clone());
        // Cost rows a stop or crash left in the spool count before any budget check.
        ledger.replay_spool().await;
        let (memory, consolidator) = open_memory(&cfg, &gateway);
        let skills = Arc::new(crate::skills::SkillSet::load(
            &cfg.agent.skills.dir,
            &cfg.agent.skills.always_on,
        ));
        log_sandbox(&cfg);
        let (mcp, mcp_cancel) = start_mcp(&cfg);
        let schedule_wake = Arc::new(Notify::new());
        let speaker = speaker(&cfg, &gateway, &paths);
        let deps = crate::tools::ToolDeps {
            live: live.clone(),
            db: db.clone(),
            sessions: store.clone(),
            memory: memory.as_ref(),
            outbound: outbound.clone(),
            contacts: contacts.clone(),
            schedule_wake: schedule_wake.clone(),
            mcp: mcp.clone(),
            extra: vec![Arc::new(crate::skills::LoadSkillTool {
                skills: skills.clone(),
            })],
            speaker: speaker.clone(),
        };
        let crate::tools::Assembled {
            registry: tools,
            spawn,
        } = crate::tools::assemble(&cfg, deps)
            .await
            .map_err(|e| DaemonError::Startup(format!("tool registry: {e}")))?;
        let approvals = approvals(&live, outbound.clone(), &contacts, &paths, tasks);
        let agent = Agent::new(
            cfg.clone(),
            gateway.clone(),
            tools.clone(),
            skills.clone(),
            monitor.clone(),
        )
        .with_memory(memory.clone(), consolidator.clone())
        .started_at(started)
        .with_approvals(approvals.clone());
        // Sub-agents run through the agent's loop.
        spawn.connect(Arc::new(agent.clone()));
        let webhook = webhook(&cfg, &metrics, &monitor)?;
        let deps = DispatcherDeps {
            cfg: live.clone(),
            runner: Arc::new(agent),
            store: store.clone(),
            monitor: monitor.clone(),
            metrics: metrics.clone(),
            consolidator: consolidator.clone(),
            webhook,
            outbound,
            contacts,
            speaker,
        };
        let (dispatcher, intake) = queues(deps, tasks, transcriber(&cfg, &gateway));
        Ok(Services {
            live,
            cfg,
            paths,
            pid,
            db,
            store,
            monitor,
            metrics,
            skills,
            memory,
            consolidator,
            chats,
            ledger,
            mcp,
            mcp_cancel,
            schedule_wake,
            dispatcher,
            intake,
            approvals,
            tools,
            alert,
            started,
        })
    }

    /// Whether the database thread answers within 5 s (the watchdog's health check).
    pub async fn healthy(&self) -> Result<(), String> {
        match tokio::time::timeout(Duration::from_secs(5), self.db.kv_get("health")).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("the database did not answer within 5 s".to_string()),
        }
    }
}
