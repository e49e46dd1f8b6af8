//! The daemon's tool set, assembled in one place (SPEC §3, §11): every built-in candidate,
//! then one `[tools] enabled` filter; MCP tools are governed by their server's `tools` list
//! instead. The daemon passes in what the tools need. One task starts here: the follower that
//! keeps the registry's MCP tools equal to what the servers offer ([`follow_mcp`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::mcp::McpManager;
use super::outbound::Outbound;
use super::{Tool, ToolRegistry, builtin_tools};
use crate::config::Config;
use crate::session::SessionStore;
use crate::store::Db;

/// What the tools are built from.
pub struct ToolDeps<'a> {
    pub db: Db,
    pub sessions: Arc<SessionStore>,
    pub memory: Option<&'a crate::memory::Memory>,
    /// `message` and `react` exist only with an outbound channel (the router over the chat
    /// channels, when one runs).
    pub outbound: Option<Arc<dyn Outbound>>,
    /// The contacts `message` and `react` reach.
    pub contacts: super::outbound::Contacts,
    /// Woken when `schedule_message` adds or cancels a message (the scheduler waits on it).
    pub schedule_wake: Arc<Notify>,
    /// Started MCP servers; their tools are followed ([`follow_mcp`]), never waited for.
    pub mcp: Arc<McpManager>,
    /// The running config, for tools that follow a reload.
    pub live: crate::config::Live,
    /// Tools other modules provide (`load_skill`), filtered like the built-in ones.
    pub extra: Vec<Arc<dyn Tool>>,
    /// Text to speech (SPEC §19): the `tts` tool exists only with `[voice] tts_model`.
    pub speaker: Option<Arc<super::tts::Speaker>>,
}

/// The assembled tool set: the registry, and the `sessions_spawn` tool, which the daemon
/// connects to the agent (`SpawnTool::connect`) once the agent holding the registry exists.
pub struct Assembled {
    pub registry: Arc<ToolRegistry>,
    pub spawn: Arc<super::spawn::SpawnTool>,
}

/// Build the registry of every tool the model may call. Fails only for a problem with a
/// built-in tool (our bug); an MCP tool the registry cannot take is left out and reported in
/// the MCP status.
pub async fn assemble(cfg: &Arc<Config>, deps: ToolDeps<'_>) -> Result<Assembled, String> {
    let mut list = builtin_tools(&cfg.tools);
    if let Some(key) = &cfg.tools.web_search_key {
        list.push(Arc::new(super::web_search::WebSearchTool::new(
            &cfg.tools.web_search_base_url,
            key.clone(),
        )));
    }
    // Sandboxed shell: never the state or config directory (see docs/security.md).
    list.push(Arc::new(super::exec::ExecTool::from_config(cfg)));
    list.extend(deps.extra);
    let messaging = deps.outbound.map(|outbound| super::messaging::Messaging {
        cfg: deps.live.clone(),
        outbound,
        contacts: deps.contacts.clone(),
        sessions: deps.sessions,
    });
    if let Some(m) = &messaging {
        list.extend(m.tools());
    }
    if let Some(speaker) = deps.speaker {
        list.push(Arc::new(super::tts::TtsTool { speaker, messaging }));
    }
    let schedule = super::schedule::ScheduleTools {
        db: deps.db.clone(),
        contacts: deps.contacts.clone(),
        wake: deps.schedule_wake,
        max_scheduled: cfg.tools.max_scheduled,
        max_delay: cfg.tools.max_delay,
        tz: cfg.agent.timezone.clone(),
    };
    list.extend(schedule.tools());
    // Sub-agents run through the agent's loop: the daemon connects it once the agent exists.
    let spawn = Arc::new(super::spawn::SpawnTool::new(cfg.clone()));
    list.push(spawn.clone());
    if let Some(m) = deps.memory {
        list.extend(super::memory::tools(m));
    }
    list.retain(|t| cfg.tools.is_enabled(&t.spec().name));
    let registry = Arc::new(
        ToolRegistry::new(list, cfg.tools.exec_timeout, cfg.behavior.output_truncation)?
            .with_max_parallel(cfg.tools.max_parallel_calls)
            .with_tool_budget(cfg.tool_budget_bytes()),
    );
    // Nothing waits for the servers (SPEC §16.2: READY never does): the follower brings
    // their tools in when they come, also for servers a reload adds.
    follow_mcp(deps.mcp, registry.clone());
    Ok(Assembled { registry, spawn })
}

/// How long the follower holds the servers' first tools back, waiting for the slowest
/// server's first start, so the tool block of the prompt changes once, not once per server.
const MCP_FIRST_WAIT: Duration = Duration::from_secs(60);

/// Keep `registry`'s MCP tools equal to what `mcp`'s servers offer, until the manager's cancel
/// token fires (the task then ends). When every server has already settled, their tools are
/// in the registry on return; otherwise they arrive together once every server has settled
/// (or after [`MCP_FIRST_WAIT`]), and every later change follows on its own.
pub fn follow_mcp(
    mcp: Arc<McpManager>,
    registry: Arc<ToolRegistry>,
) -> tokio::task::JoinHandle<()> {
    let mut changes = mcp.subscribe();
    changes.borrow_and_update();
    let settled = mcp.all_settled();
    if settled && mcp.has_servers() {
        sync(&mcp, &registry);
    }
    let cancel = mcp.cancel_token();
    tokio::spawn(async move {
        if !settled {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = mcp.wait_ready(MCP_FIRST_WAIT) => {}
            }
            changes.borrow_and_update();
            sync(&mcp, &registry);
        }
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
            changes.borrow_and_update();
            sync(&mcp, &registry);
        }
    })
}

/// One sync of the registry with the servers, logged: when the model's tool list changes is
/// worth knowing (each change costs one cache write).
fn sync(mcp: &McpManager, registry: &ToolRegistry) {
    let offered = mcp.sync_into(registry);
    tracing::info!(tools = offered, "MCP tools offered to the model");
}
