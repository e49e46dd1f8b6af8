//! MCP servers (SPEC §12): one supervisor task per enabled server keeps a client session
//! alive (restart with backoff 0, 1, 2, 5, 10, 30, 60 s, then every 60 s) and the tools it lists
//! are exposed to the model as proxy tools named `<server>__<tool>`. Every stdio server runs
//! through the exec sandbox helper ([`McpSandbox`], docs/security.md). rmcp stays behind this
//! module so its next major touches one file.
//!
//! The tool set follows the servers: a server that comes up late, restarts with other tools or
//! sends `notifications/tools/list_changed` (re-listed, bounded) changes its tools, and
//! [`McpManager::reconcile`] adds, removes and restarts servers on a reload. Each change bumps a
//! generation counter ([`McpManager::subscribe`]); `tools::assemble` keeps the registry's MCP
//! set equal to [`McpManager::tools`] through [`McpManager::sync_into`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, PaginatedRequestParams};
use rmcp::service::{MaybeSendFuture, NotificationContext, Peer, RoleClient, ServiceError};
use rmcp::transport::ConfigureCommandExt;
use rmcp::transport::async_rw::AsyncRwTransport;
use secrecy::ExposeSecret;
use serde_json::{Map, Value, json};
use tokio::process::Command;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

mod guard;
pub mod limits;
mod stdio;

use self::guard::{Guarded, Tripwire};
use super::registry::ToolRegistry;
use super::{Tool, ToolContext, ToolError};
use crate::backoff::Backoff;
use crate::config::{Config, ExecSandbox, McpServerConfig, McpTransport};
use crate::llm::ToolSpec;
use crate::sandbox::runner::SANDBOX_PATH;
use crate::sandbox::{HELPER_SUBCOMMAND, Policy, SandboxMode};

/// Log targets kept at `error` unless the log filter names them: rmcp logs every notification
/// a server sends at `info` and every refused request at `warn`, so a hostile server could fill
/// the log through it; what the daemon logs of its servers is bounded here per server.
pub const QUIET_LOG_TARGETS: &[&str] = &["rmcp"];

/// At most this many tools are taken from one server's list; the rest are dropped with a
/// warning (a hostile or broken server must not flood the model's tool list).
pub const MAX_TOOLS_PER_SERVER: usize = 500;
/// At most this many `tools/list` pages are read (a cursor that never ends).
const MAX_LIST_PAGES: usize = 64;
/// One server is re-listed at most this often, however many `list_changed` it sends.
const RELIST_MIN_INTERVAL: Duration = Duration::from_secs(1);
/// How long a stop waits for a supervisor to end (its child killed) before moving on.
const STOP_WAIT: Duration = Duration::from_secs(5);
/// Restart delays after consecutive failures (SPEC §9); the last one repeats.
static RESTART_DELAYS: [Duration; 7] = [
    Duration::ZERO,
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(5),
    Duration::from_secs(10),
    Duration::from_secs(30),
    Duration::from_secs(60),
];
/// A server that stayed up this long starts the backoff sequence from the beginning again.
const STABLE_AFTER: Duration = Duration::from_secs(60);

/// Lifecycle state of one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Starting,
    Ready,
    Backoff,
    Disabled,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Ready => "ready",
            State::Backoff => "backoff",
            State::Disabled => "disabled",
        }
    }
}

/// Mutable facts about one server, behind a short-held mutex.
struct Shared {
    state: State,
    peer: Option<Peer<RoleClient>>,
    /// The server's tools as last listed (kept while it is down), after the allow-list and the
    /// clash check, sorted by exposed name.
    exposed: Vec<Exposed>,
    /// Listed tools not offered because another of the server's tools has the same exposed
    /// name (found when listing).
    clashes: Vec<RefusedTool>,
    /// Tools not offered by the last [`McpManager::sync_into`] (a clash with another server or a
    /// built-in tool, a schema the registry cannot compile).
    sync_refused: Vec<RefusedTool>,
    restarts: u64,
    last_error: Option<String>,
    /// True once the first start attempt finished (ready or failed).
    settled: bool,
}

/// One server tool as offered to the model.
#[derive(Debug, Clone, PartialEq)]
struct Exposed {
    /// `<server>__<tool>`, cleaned ([`exposed_name`]).
    name: String,
    /// The tool's name on the server.
    remote: String,
    description: String,
    schema: Value,
}

/// A server tool that is not offered, and why (shown in [`McpManager::status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct RefusedTool {
    /// The exposed name it would have had.
    name: String,
    /// Its name on the server.
    remote: String,
    reason: String,
}

impl RefusedTool {
    fn to_json(&self) -> Value {
        json!({"name": self.name, "remote": self.remote, "reason": self.reason})
    }
}

/// One configured server and its live state.
struct Server {
    cfg: McpServerConfig,
    sandbox: Arc<McpSandbox>,
    shared: Mutex<Shared>,
    /// Signalled by a call that saw the transport closed, and on every settle.
    closed: Notify,
    settled: Notify,
    /// The manager's change signal, bumped when this server's tools change.
    changed: Arc<watch::Sender<u64>>,
}

impl Server {
    /// `text` without the secrets of this server's URL and headers: rmcp's and reqwest's
    /// errors name the URL, which may carry a key (docs/security.md).
    fn scrub(&self, text: &str) -> String {
        match &self.cfg.transport {
            McpTransport::Http { url, headers } => {
                let mut secrets = crate::redact::url_secrets(url);
                secrets.extend(headers.values().map(|v| v.expose_secret().to_string()));
                secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
                let refs: Vec<&str> = secrets.iter().map(String::as_str).collect();
                crate::redact::redact(text, &refs)
            }
            McpTransport::Stdio { .. } => text.to_string(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take a fresh tool list: allow-list, exposed names, clashes (logged at error when new);
    /// the change signal is bumped when what is offered changed.
    fn set_tools(&self, listed: Vec<rmcp::model::Tool>) {
        let (exposed, clashes) = expose(&self.cfg.name, self.cfg.tools.as_deref(), listed);
        let changed = {
            let mut s = self.lock();
            let new: Vec<&RefusedTool> =
                clashes.iter().filter(|c| !s.clashes.contains(c)).collect();
            log_refused(&self.cfg.name, &new);
            let changed = s.exposed != exposed || s.clashes != clashes;
            s.exposed = exposed;
            s.clashes = clashes;
            changed
        };
        if changed {
            bump(&self.changed);
        }
    }
}

/// Tools refused of one server, newly: each logged at error up to a few, then one line with
/// the count (a server can list hundreds, again and again); all of them are in the status.
fn log_refused(server: &str, refused: &[&RefusedTool]) {
    const LOGGED: usize = 5;
    for r in refused.iter().take(LOGGED) {
        tracing::error!(server = %server, tool = %r.name, remote = %r.remote, "MCP tool not offered: {}", r.reason);
    }
    if refused.len() > LOGGED {
        tracing::error!(server = %server, "{} more MCP tools not offered; the status lists them", refused.len() - LOGGED);
    }
}

/// One running server: its state and the supervisor that can be stopped alone.
struct Handle {
    server: Arc<Server>,
    /// A child of the manager's token.
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

/// Supervises the configured MCP servers and hands out proxy tools for them.
pub struct McpManager {
    /// By server name (so tools and status come out in name order).
    servers: Mutex<BTreeMap<String, Handle>>,
    cancel: CancellationToken,
    /// The generation counter: bumped whenever a server's tool list changes.
    changed: Arc<watch::Sender<u64>>,
    /// One reconcile at a time.
    reconciling: tokio::sync::Mutex<()>,
}

/// What [`McpManager::reconcile`] did, by server name (sorted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconciled {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub restarted: Vec<String>,
}

fn bump(changed: &watch::Sender<u64>) {
    changed.send_modify(|g| *g = g.wrapping_add(1));
}

/// How stdio servers are confined (SPEC §16.9 "Processes"): each runs through the exec
/// sandbox helper (`agentd sandbox-exec`) under [`Policy::for_mcp_server`] — no read of the
/// state or config directory (nor `.env`), a private directory as HOME and TMPDIR, network per
/// server — with only the configured `env` plus `PATH`, `HOME` and `TMPDIR`. A reload with a
/// different sandbox restarts every stdio server.
#[derive(Debug, Clone, PartialEq)]
pub struct McpSandbox {
    /// `[tools] exec_sandbox`: `landlock` refuses to start a server the kernel cannot confine.
    pub mode: SandboxMode,
    /// `filesystem.allowed_paths`: what a server may write besides its private directory.
    pub allowed_paths: Vec<PathBuf>,
    /// Never readable by a server: the state and config directories.
    pub protected: Vec<PathBuf>,
    /// The system prompt's files: read-only to a server, as to `exec`.
    pub prompt: super::paths::PromptFiles,
    /// Each server's private directory is `<private_root>/<name>` (created 0700).
    pub private_root: PathBuf,
    /// Working directory of a server without `cwd` (the workspace).
    pub default_cwd: PathBuf,
    /// The `agentd` binary that provides `sandbox-exec`; `None` = the running executable.
    pub helper_exe: Option<PathBuf>,
    /// Force the subreaper fallback (tests of that path; see [`Policy::no_namespaces`]).
    pub no_namespaces: bool,
    /// Skip the mount namespace, as under the shipped units (tests of that path).
    pub no_mount_namespace: bool,
}

impl McpSandbox {
    /// From the whole config; private directories under `agentd-mcp-<uid>` in the system
    /// temporary directory.
    pub fn from_config(cfg: &Config) -> McpSandbox {
        McpSandbox {
            mode: match cfg.tools.exec_sandbox {
                ExecSandbox::Landlock => SandboxMode::Landlock,
                ExecSandbox::None => SandboxMode::None,
            },
            allowed_paths: cfg.tools.allowed_paths.clone(),
            protected: vec![cfg.paths.state_dir.clone(), cfg.config_dir.clone()],
            prompt: super::paths::PromptFiles::from_config(cfg),
            private_root: std::env::temp_dir()
                .join(format!("agentd-mcp-{}", nix::unistd::geteuid())),
            default_cwd: cfg.agent.workspace.clone(),
            helper_exe: None,
            no_namespaces: false,
            no_mount_namespace: false,
        }
    }

    /// The helper command that runs `command args…` for server `cfg`, its environment set.
    fn command(
        &self,
        cfg: &McpServerConfig,
        command: &str,
        args: &[String],
        env: &BTreeMap<String, secrecy::SecretString>,
        cwd: Option<&PathBuf>,
    ) -> Result<Command, String> {
        let private = private_dir(&self.private_root, &cfg.name)?;
        let mut policy = Policy::for_mcp_server(
            self.mode,
            cfg.network,
            &self.allowed_paths,
            &self.protected,
            &private,
        )?;
        let (read_only, writable) = self.prompt.sandbox_paths();
        policy.keep_read_only(&read_only, &writable, &self.protected);
        policy.no_namespaces = self.no_namespaces;
        policy.no_mount_namespace = self.no_mount_namespace;
        let policy = serde_json::to_string(&policy)
            .map_err(|e| format!("cannot encode the sandbox policy: {e}"))?;
        let exe = match &self.helper_exe {
            Some(exe) => exe.clone(),
            None => std::env::current_exe()
                .map_err(|e| format!("cannot find the agentd executable: {e}"))?,
        };
        let private = private.display().to_string();
        let defaults = [
            ("PATH", SANDBOX_PATH.to_string()),
            ("HOME", private.clone()),
            ("TMPDIR", private),
        ];
        let cwd = cwd.unwrap_or(&self.default_cwd).clone();
        Ok(Command::new(exe).configure(|c| {
            c.arg(HELPER_SUBCOMMAND)
                .arg("--policy")
                .arg(policy)
                .arg("--")
                .arg(command)
                .args(args)
                .env_clear()
                .envs(
                    defaults
                        .iter()
                        .filter(|(k, _)| !env.contains_key(*k))
                        .cloned(),
                )
                .envs(env.iter().map(|(k, v)| (k, v.expose_secret())))
                .current_dir(cwd);
        }))
    }
}

/// `<root>/<name>`, created 0700 (with `root`), refused unless both are real directories of
/// ours that nobody else can enter: a name in the shared temporary directory could have been
/// planted by another user.
fn private_dir(root: &Path, name: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let dir = root.join(name);
    for d in [root, dir.as_path()] {
        match std::fs::DirBuilder::new().mode(0o700).create(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", d.display())),
        }
        let meta = std::fs::symlink_metadata(d)
            .map_err(|e| format!("cannot stat {}: {e}", d.display()))?;
        let uid = nix::unistd::geteuid().as_raw();
        if !meta.is_dir() || meta.uid() != uid {
            return Err(format!(
                "{} is not a directory owned by uid {uid}; remove it so the MCP server's \
                 private directory can be created",
                d.display()
            ));
        }
        if meta.mode() & 0o077 != 0 {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("cannot make {} private (0700): {e}", d.display()))?;
        }
    }
    Ok(dir)
}

impl McpManager {
    /// Spawn one supervisor task per enabled server and return at once (needs a tokio
    /// runtime). Start-up failures are logged and retried, never fatal. Call
    /// [`McpManager::wait_ready`] to let servers list their tools before building the tool
    /// registry. `cancel` stops every server (and [`McpManager::sync_into`]'s follower).
    pub fn start(
        servers: &BTreeMap<String, McpServerConfig>,
        sandbox: McpSandbox,
        cancel: CancellationToken,
    ) -> Arc<McpManager> {
        let mgr = Arc::new(McpManager {
            servers: Mutex::new(BTreeMap::new()),
            cancel,
            changed: Arc::new(watch::channel(0).0),
            reconciling: tokio::sync::Mutex::new(()),
        });
        let sandbox = Arc::new(sandbox);
        {
            let mut map = mgr.lock();
            for (name, cfg) in servers {
                map.insert(name.clone(), mgr.launch(cfg, &sandbox));
            }
        }
        mgr
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Handle>> {
        self.servers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The servers, in name order.
    fn servers(&self) -> Vec<Arc<Server>> {
        self.lock().values().map(|h| h.server.clone()).collect()
    }

    /// A new server for `cfg` with its own child token; its supervisor is spawned unless the
    /// server is disabled.
    fn launch(&self, cfg: &McpServerConfig, sandbox: &Arc<McpSandbox>) -> Handle {
        let (state, last_error) = match cfg.enabled {
            true => (State::Starting, None),
            false => (State::Disabled, Some("disabled in config".to_string())),
        };
        let server = Arc::new(Server {
            cfg: cfg.clone(),
            sandbox: sandbox.clone(),
            shared: Mutex::new(Shared {
                state,
                peer: None,
                exposed: Vec::new(),
                clashes: Vec::new(),
                sync_refused: Vec::new(),
                restarts: 0,
                last_error,
                settled: state == State::Disabled,
            }),
            closed: Notify::new(),
            settled: Notify::new(),
            changed: self.changed.clone(),
        });
        let cancel = self.cancel.child_token();
        let task = (state == State::Starting)
            .then(|| tokio::spawn(supervise(server.clone(), cancel.clone())));
        Handle {
            server,
            cancel,
            task,
        }
    }

    /// Apply a new server list (a reload): servers not running yet start, servers no longer
    /// listed stop (supervisor cancelled, child killed, tools gone), servers whose config
    /// differs — or, for stdio servers, whose sandbox differs — restart; the others keep
    /// running untouched. Waits (bounded) for the stopped servers to end, so a restarted server
    /// never runs twice. The change signal is bumped when anything was removed or restarted.
    pub async fn reconcile(
        &self,
        servers: &BTreeMap<String, McpServerConfig>,
        sandbox: McpSandbox,
    ) -> Reconciled {
        let _one = self.reconciling.lock().await;
        let sandbox = Arc::new(sandbox);
        let mut done = Reconciled::default();
        let mut stopping = Vec::new();
        {
            let mut map = self.lock();
            let gone: Vec<String> = map
                .keys()
                .filter(|name| !servers.contains_key(*name))
                .cloned()
                .collect();
            for name in gone {
                stopping.extend(map.remove(&name));
                done.removed.push(name);
            }
            for (name, cfg) in servers {
                match map.get(name) {
                    None => {
                        map.insert(name.clone(), self.launch(cfg, &sandbox));
                        done.added.push(name.clone());
                    }
                    Some(h) if needs_restart(&h.server, cfg, &sandbox) => {
                        stopping.extend(map.remove(name));
                        done.restarted.push(name.clone());
                    }
                    Some(_) => {}
                }
            }
        }
        if !stopping.is_empty() {
            // Their tools leave the registry now; calls still in flight fail.
            bump(&self.changed);
        }
        stop_all(stopping).await;
        if !done.restarted.is_empty() {
            let mut map = self.lock();
            for name in &done.restarted {
                map.insert(name.clone(), self.launch(&servers[name], &sandbox));
            }
        }
        for name in &done.added {
            tracing::info!(server = %name, "MCP server added");
        }
        for name in &done.removed {
            tracing::info!(server = %name, "MCP server removed");
        }
        for name in &done.restarted {
            tracing::info!(server = %name, "MCP server changed; restarted");
        }
        done
    }

    /// Wait (at most `within`, all servers in parallel) until every server finished its first
    /// start attempt, so [`McpManager::tools`] knows their tools.
    pub async fn wait_ready(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        for server in self.servers() {
            loop {
                let notified = server.settled.notified();
                if server.lock().settled {
                    break;
                }
                if tokio::time::timeout_at(deadline, notified).await.is_err() {
                    return;
                }
            }
        }
    }

    /// The change signal: its value (a generation counter) moves whenever a server's tool
    /// list changes (ready, re-listed, restarted with other tools, removed).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The manager's token: cancelled, every server stops.
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// One proxy tool per server tool currently offered, in server then tool name order. A
    /// name two servers' tools clean up to goes to the first server (by name).
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.offer().tools
    }

    /// The offered tools, who owns each name, and the tools another server's tool took the
    /// name of.
    fn offer(&self) -> Offer {
        let mut offer = Offer::default();
        for server in self.servers() {
            let exposed = server.lock().exposed.clone();
            for tool in exposed {
                if let Some((other, other_remote)) = offer.owners.get(&tool.name) {
                    let reason = format!(
                        "tool '{}' of server '{}' and tool '{other_remote}' of server '{}' both \
                         become '{}'; only the latter is offered. Fix: rename one of the \
                         servers, or leave one tool out with its server's `tools` allow-list",
                        tool.remote, server.cfg.name, other.cfg.name, tool.name
                    );
                    offer.refused.push((
                        server.clone(),
                        RefusedTool {
                            name: tool.name,
                            remote: tool.remote,
                            reason,
                        },
                    ));
                    continue;
                }
                offer
                    .owners
                    .insert(tool.name.clone(), (server.clone(), tool.remote.clone()));
                offer.tools.push(Arc::new(McpTool {
                    name: tool.name,
                    description: tool.description,
                    schema: tool.schema,
                    remote: tool.remote,
                    server: server.clone(),
                }));
            }
        }
        offer
    }

    /// Make `registry`'s dynamic set equal to the offered tools. What is not offered (a clash
    /// between servers, a name of a built-in tool, a schema that does not compile) is logged at
    /// error once, when it first appears, and shown in [`McpManager::status`].
    pub fn sync_into(&self, registry: &ToolRegistry) {
        let Offer {
            tools,
            owners,
            mut refused,
        } = self.offer();
        for r in registry.set_dynamic(tools) {
            if let Some((server, remote)) = owners.get(&r.name) {
                refused.push((
                    server.clone(),
                    RefusedTool {
                        remote: remote.clone(),
                        name: r.name,
                        reason: r.reason,
                    },
                ));
            }
        }
        for server in self.servers() {
            let mine: Vec<RefusedTool> = refused
                .iter()
                .filter(|(s, _)| Arc::ptr_eq(s, &server))
                .map(|(_, r)| r.clone())
                .collect();
            let mut s = server.lock();
            let new: Vec<&RefusedTool> = mine
                .iter()
                .filter(|r| !s.sync_refused.contains(r))
                .collect();
            log_refused(&server.cfg.name, &new);
            s.sync_refused = mine;
        }
    }

    /// Per server: `state` (starting|ready|backoff|disabled), `tools` (how many it offers),
    /// `restarts`, `last_error`, and `refused`: the tools not offered, each with `name` (the
    /// exposed name), `remote` (its name on the server) and `reason`.
    pub fn status(&self) -> Value {
        let mut map = Map::new();
        for server in self.servers() {
            let s = server.lock();
            let refused: Vec<Value> = s
                .clashes
                .iter()
                .chain(&s.sync_refused)
                .map(RefusedTool::to_json)
                .collect();
            map.insert(
                server.cfg.name.clone(),
                json!({
                    "state": s.state.as_str(),
                    "tools": s.exposed.len().saturating_sub(s.sync_refused.len()),
                    "restarts": s.restarts,
                    "last_error": s.last_error,
                    "refused": refused,
                }),
            );
        }
        Value::Object(map)
    }
}

/// What the servers offer right now ([`McpManager::offer`]).
#[derive(Default)]
struct Offer {
    tools: Vec<Arc<dyn Tool>>,
    /// Exposed name → the server offering it and the tool's name there.
    owners: BTreeMap<String, (Arc<Server>, String)>,
    /// Tools not offered because an earlier server's tool has their exposed name.
    refused: Vec<(Arc<Server>, RefusedTool)>,
}

/// Whether a running server must restart to take `cfg` and `sandbox`.
fn needs_restart(server: &Server, cfg: &McpServerConfig, sandbox: &McpSandbox) -> bool {
    server.cfg != *cfg
        || (matches!(cfg.transport, McpTransport::Stdio { .. }) && *server.sandbox != *sandbox)
}

/// Cancel the servers' supervisors and wait for them (each at most [`STOP_WAIT`]); a
/// supervisor kills its child before it ends.
async fn stop_all(handles: Vec<Handle>) {
    for h in &handles {
        h.cancel.cancel();
    }
    let waits = handles.into_iter().filter_map(|h| {
        let name = h.server.cfg.name.clone();
        h.task.map(|task| async move {
            if tokio::time::timeout(STOP_WAIT, task).await.is_err() {
                tracing::warn!(server = %name, "MCP server did not stop in time");
            }
        })
    });
    futures::future::join_all(waits).await;
}

/// Keep one server running until `cancel` fires.
async fn supervise(server: Arc<Server>, cancel: CancellationToken) {
    let name = server.cfg.name.clone();
    let mut backoff = Backoff::steps(&RESTART_DELAYS);
    loop {
        {
            let mut s = server.lock();
            s.state = State::Starting;
        }
        let started = tokio::select! {
            _ = cancel.cancelled() => return stopped(&server),
            r = connect(&server) => r,
        };
        match started {
            Ok(conn) => {
                tracing::info!(server = %name, tools = conn.tools.len(), "MCP server ready");
                {
                    let mut s = server.lock();
                    s.state = State::Ready;
                    s.peer = Some(conn.session.service.peer().clone());
                    s.settled = true;
                }
                server.set_tools(conn.tools);
                server.settled.notify_waiters();
                let up_since = Instant::now();
                let why = match serve(&server, conn.session, &conn.relist, &cancel).await {
                    Ended::Stopped => return stopped(&server),
                    Ended::Closed(why) => why,
                };
                if up_since.elapsed() >= STABLE_AFTER {
                    backoff.reset();
                }
                let why = why.map_or_else(
                    || "connection closed".to_string(),
                    |w| format!("cut off: {w}"),
                );
                tracing::warn!(server = %name, "MCP server {why}; restarting");
                let mut s = server.lock();
                s.peer = None;
                s.last_error = Some(why);
            }
            Err(e) => {
                tracing::warn!(server = %name, error = %e, "MCP server failed to start");
                {
                    let mut s = server.lock();
                    s.last_error = Some(e);
                    s.settled = true;
                }
                server.settled.notify_waiters();
            }
        }
        let delay = backoff.next_delay();
        {
            let mut s = server.lock();
            s.state = State::Backoff;
            s.restarts += 1;
        }
        tokio::select! {
            _ = cancel.cancelled() => return stopped(&server),
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// The state of a server whose supervisor was cancelled: no calls reach it any more.
fn stopped(server: &Server) {
    let mut s = server.lock();
    s.state = State::Disabled;
    s.peer = None;
    s.last_error = Some("stopped".to_string());
}

/// How a connection ended.
enum Ended {
    /// `cancel` fired: the server was stopped for good.
    Stopped,
    /// The connection closed, cut off by its guard when the reason is given.
    Closed(Option<String>),
}

/// Serve one connection until it closes or `cancel` fires, re-listing the tools when the
/// server says they changed. Either way the service and the process tree have ended when this
/// returns.
async fn serve(
    server: &Server,
    session: Session,
    relist: &Notify,
    cancel: &CancellationToken,
) -> Ended {
    let name = &server.cfg.name;
    let timeout = server.cfg.timeout;
    let Session {
        service,
        process,
        wire,
    } = session;
    let peer = service.peer().clone();
    let stop = service.cancellation_token();
    let waiting = service.waiting();
    tokio::pin!(waiting);
    let closed = server.closed.notified();
    tokio::pin!(closed);
    let mut last_relist: Option<Instant> = None;
    let mut finished = false;
    let ended = loop {
        tokio::select! {
            _ = cancel.cancelled() => break Ended::Stopped,
            _ = &mut closed => break Ended::Closed(wire.why()),
            _ = &mut waiting => {
                finished = true;
                break Ended::Closed(wire.why());
            }
            _ = relist.notified() => {
                let pause = last_relist
                    .map(|at| RELIST_MIN_INTERVAL.saturating_sub(at.elapsed()))
                    .unwrap_or_default();
                let listed = async {
                    tokio::time::sleep(pause).await;
                    tokio::time::timeout(timeout, list_tools(&peer, name)).await
                };
                let listed = tokio::select! {
                    _ = cancel.cancelled() => break Ended::Stopped,
                    r = listed => r,
                };
                last_relist = Some(Instant::now());
                match listed {
                    Ok(Ok(tools)) => {
                        tracing::info!(server = %name, tools = tools.len(), "MCP tools re-listed");
                        server.set_tools(tools);
                    }
                    Ok(Err(e)) => {
                        let e = server.scrub(&e.to_string());
                        tracing::warn!(server = %name, error = %e, "MCP tools/list failed; keeping the last list");
                    }
                    Err(_) => {
                        tracing::warn!(server = %name, "MCP tools/list timed out after {}s; keeping the last list", timeout.as_secs());
                    }
                }
            }
        }
    };
    stop.cancel();
    if !finished {
        let _ = tokio::time::timeout(STOP_WAIT, &mut waiting).await;
    }
    if let Some(p) = process {
        p.end().await;
    }
    ended
}

/// `tools/list`, every page, at most [`MAX_TOOLS_PER_SERVER`] tools and [`MAX_LIST_PAGES`]
/// pages; a longer list is cut with a warning.
async fn list_tools(
    peer: &Peer<RoleClient>,
    server: &str,
) -> Result<Vec<rmcp::model::Tool>, ServiceError> {
    let mut tools = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_LIST_PAGES {
        let page = peer
            .list_tools(Some(PaginatedRequestParams::default().with_cursor(cursor)))
            .await?;
        tools.extend(page.tools);
        if tools.len() > MAX_TOOLS_PER_SERVER {
            break;
        }
        match page.next_cursor {
            None => return Ok(tools),
            Some(next) => cursor = Some(next),
        }
    }
    tracing::warn!(
        server = %server,
        max_tools = MAX_TOOLS_PER_SERVER,
        max_pages = MAX_LIST_PAGES,
        "MCP server lists too many tools; only the first are taken"
    );
    tools.truncate(MAX_TOOLS_PER_SERVER);
    Ok(tools)
}

/// Our side of each connection: a `notifications/tools/list_changed` asks the supervisor to
/// re-list (whether or not the server advertised `tools.listChanged`); many at once make one
/// re-list.
struct Client {
    relist: Arc<Notify>,
}

impl rmcp::ClientHandler for Client {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.relist.notify_one();
        std::future::ready(())
    }
}

type Running = rmcp::service::RunningService<RoleClient, Client>;

/// A started server: the session, its process (stdio), the wire its guard trips, its first
/// tool list, and the re-list signal.
struct Connection {
    session: Session,
    tools: Vec<rmcp::model::Tool>,
    relist: Arc<Notify>,
}

/// One connection to a server: rmcp's service over the [`Guarded`] transport, and for stdio
/// the process tree behind it.
struct Session {
    service: Running,
    process: Option<stdio::ServerProcess>,
    wire: Arc<Tripwire>,
}

impl Session {
    /// Stop the service and kill the process tree, waiting (bounded) for both: after this the
    /// server runs no more, so a restart never runs it twice.
    async fn end(self) {
        let Session {
            service, process, ..
        } = self;
        let stop = service.cancellation_token();
        stop.cancel();
        let _ = tokio::time::timeout(STOP_WAIT, service.waiting()).await;
        if let Some(p) = process {
            p.end().await;
        }
    }
}

/// Spawn the child (or connect), do the handshake and list its tools (bounded by the server
/// timeout). Every error text is scrubbed of the server URL's secrets.
async fn connect(server: &Server) -> Result<Connection, String> {
    let timeout = server.cfg.timeout;
    let relist = Arc::new(Notify::new());
    let session = start_session(server, relist.clone())
        .await
        .map_err(|e| server.scrub(&e))?;
    let listed = tokio::time::timeout(
        timeout,
        list_tools(session.service.peer(), &server.cfg.name),
    )
    .await;
    let tools = match listed {
        Ok(Ok(tools)) => tools,
        failed => {
            let why = match failed {
                Err(_) => format!("tools/list timed out after {}s", timeout.as_secs()),
                Ok(Err(e)) => format!("tools/list failed: {e}"),
                Ok(Ok(_)) => String::new(),
            };
            let why = session.wire.why().map_or(why, |w| format!("cut off: {w}"));
            session.end().await;
            return Err(server.scrub(&why));
        }
    };
    Ok(Connection {
        session,
        tools,
        relist,
    })
}

/// Spawn the child (or connect) and do the handshake, bounded by the server timeout.
async fn start_session(server: &Server, relist: Arc<Notify>) -> Result<Session, String> {
    let client = Client { relist };
    let timeout = server.cfg.timeout;
    let wire = Arc::new(Tripwire::default());
    let (command, args, env, cwd) = match &server.cfg.transport {
        McpTransport::Stdio {
            command,
            args,
            env,
            cwd,
        } => (command, args, env, cwd),
        McpTransport::Http { url, headers } => {
            use rmcp::transport::StreamableHttpClientTransport;
            use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
            for (k, v) in headers {
                let v = v.expose_secret();
                if k.eq_ignore_ascii_case("authorization") {
                    config.auth_header = Some(v.strip_prefix("Bearer ").unwrap_or(v).to_string());
                } else {
                    let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                        .map_err(|_| format!("headers: {k:?} is not a valid header name"))?;
                    let value = reqwest::header::HeaderValue::from_str(v)
                        .map_err(|_| format!("headers.{k}: not a valid header value"))?;
                    config.custom_headers.insert(name, value);
                }
            }
            let transport = Guarded::new(
                StreamableHttpClientTransport::from_config(config),
                wire.clone(),
            );
            let service = tokio::time::timeout(timeout, client.serve(transport))
                .await
                .map_err(|_| format!("initialize timed out after {}s", timeout.as_secs()))?
                .map_err(|e| format!("initialize failed: {e}"))?;
            return Ok(Session {
                service,
                process: None,
                wire,
            });
        }
    };
    let cmd = server
        .sandbox
        .command(&server.cfg, command, args, env, cwd.as_ref())?;
    let spawned = stdio::spawn(cmd, &server.cfg.name)
        .map_err(|e| format!("cannot start `{command}`: {e}"))?;
    let transport = Guarded::new(
        AsyncRwTransport::new_client(spawned.stdout, spawned.stdin),
        wire.clone(),
    );
    let process = spawned.process;
    match tokio::time::timeout(timeout, client.serve(transport)).await {
        Ok(Ok(service)) => Ok(Session {
            service,
            process: Some(process),
            wire,
        }),
        failed => {
            process.end().await;
            // Let the stderr reader see the helper's last line.
            tokio::time::sleep(Duration::from_millis(100)).await;
            // The helper's own complaint (sandbox setup failed, command not found) explains a
            // failed handshake better than "connection closed".
            let why = spawned
                .setup_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            Err(match (failed, why) {
                (Err(_), _) => format!("initialize timed out after {}s", timeout.as_secs()),
                (Ok(Err(e)), Some(why)) => format!("initialize failed: {e} ({why})"),
                (Ok(Err(e)), None) => format!("initialize failed: {e}"),
                (Ok(Ok(_)), _) => "initialize failed".to_string(),
            })
        }
    }
}

/// A model-facing tool that forwards to one MCP server tool.
struct McpTool {
    name: String,
    description: String,
    schema: Value,
    remote: String,
    server: Arc<Server>,
}

impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.clone(),
            description: self.description.clone(),
            input_schema: self.schema.clone(),
        }
    }

    /// An MCP server's answer comes from outside: marked untrusted.
    fn untrusted_output(&self) -> bool {
        true
    }

    fn timeout(&self) -> Option<Duration> {
        // A little headroom so our own, clearer timeout error wins.
        Some(self.server.cfg.timeout + Duration::from_secs(1))
    }

    fn call<'a>(
        &'a self,
        args: Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let server_name = &self.server.cfg.name;
            let peer = {
                let s = self.server.lock();
                match (&s.peer, s.state) {
                    (Some(p), State::Ready) => p.clone(),
                    (_, state) => {
                        return Err(ToolError::Failed(format!(
                            "MCP server '{server_name}' is not available (state: {})",
                            state.as_str()
                        )));
                    }
                }
            };
            let mut params = CallToolRequestParams::new(self.remote.clone());
            if let Value::Object(map) = args {
                params = params.with_arguments(map);
            }
            let timeout = self.server.cfg.timeout;
            let result = match tokio::time::timeout(timeout, peer.call_tool(params)).await {
                Err(_) => {
                    return Err(ToolError::Failed(format!(
                        "MCP server '{server_name}': tool '{}' timed out after {}s",
                        self.remote,
                        timeout.as_secs()
                    )));
                }
                Ok(Err(e)) => {
                    if matches!(e, ServiceError::TransportClosed) || peer.is_transport_closed() {
                        self.server.closed.notify_waiters();
                    }
                    return Err(ToolError::Failed(self.server.scrub(&format!(
                        "MCP server '{server_name}': tool '{}' failed: {e}",
                        self.remote
                    ))));
                }
                Ok(Ok(r)) => r,
            };
            let value = serde_json::to_value(&result).unwrap_or(Value::Null);
            let text = render_content(&value);
            if result.is_error == Some(true) {
                Err(ToolError::Failed(
                    self.server
                        .scrub(&format!("MCP server '{server_name}': {text}")),
                ))
            } else {
                Ok(self.server.scrub(&text))
            }
        })
    }
}

/// Join the text parts of a `CallToolResult` (as JSON); other parts are summarised.
fn render_content(result: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(items) = result.get("content").and_then(Value::as_array) {
        for item in items {
            let kind = item
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("unknown");
            match (kind, item.get("text").and_then(Value::as_str)) {
                ("text", Some(text)) => parts.push(text.to_string()),
                _ => {
                    let mime = item
                        .get("mimeType")
                        .or_else(|| item.get("resource").and_then(|r| r.get("mimeType")))
                        .and_then(Value::as_str);
                    parts.push(match mime {
                        Some(m) => format!("[{kind} content, {m}]"),
                        None => format!("[{kind} content]"),
                    });
                }
            }
        }
    }
    if parts.is_empty()
        && let Some(structured) = result.get("structuredContent")
    {
        return structured.to_string();
    }
    parts.join("\n")
}

/// The tools of server `server` to offer: those on the allow-list (all without one), named by
/// [`exposed_name`], sorted by that name. Two remote names that clean up to the same name
/// cannot both be offered: the one that needed no cleaning wins, else the smaller; the others
/// come back refused with a reason that names both and the fix.
fn expose(
    server: &str,
    allow: Option<&[String]>,
    listed: Vec<rmcp::model::Tool>,
) -> (Vec<Exposed>, Vec<RefusedTool>) {
    let mut by_name: BTreeMap<String, Vec<Exposed>> = BTreeMap::new();
    let mut refused = Vec::new();
    for tool in listed {
        let remote = tool.name.to_string();
        if let Some(allow) = allow
            && !allow.contains(&remote)
        {
            continue;
        }
        let name = exposed_name(server, &remote);
        let description = tool.description.as_deref().unwrap_or("");
        let schema_bytes =
            serde_json::to_string(&tool.input_schema).map_or(usize::MAX, |s| s.len());
        let checked = limits::check_tool(&remote, description, schema_bytes).and_then(|size| {
            match limits::holds_pruned(&tool.input_schema) {
                true => Err(format!(
                    "its input schema is nested deeper than {} levels",
                    limits::MAX_MESSAGE_DEPTH
                )),
                false => Ok(size),
            }
        });
        if let Err(why) = checked {
            refused.push(RefusedTool {
                reason: format!("tool '{}' is not offered: {why}", cut(&remote, 80)),
                name,
                remote: cut(&remote, limits::MAX_NAME_BYTES),
            });
            continue;
        }
        by_name.entry(name.clone()).or_default().push(Exposed {
            name,
            description: tool.description.as_deref().unwrap_or("").to_string(),
            schema: normalise_schema(Value::Object((*tool.input_schema).clone())),
            remote,
        });
    }
    let mut exposed = Vec::new();
    for (name, mut group) in by_name {
        let exact = format!("{server}__");
        // Stable: `sort_by_key` keeps the server's order among equal keys.
        group.sort_by_key(|t| {
            (
                name.strip_prefix(&exact) != Some(t.remote.as_str()),
                t.remote.clone(),
            )
        });
        let mut group = group.into_iter();
        let Some(kept) = group.next() else { continue };
        for other in group {
            let reason = if other.remote == kept.remote {
                format!(
                    "the server lists tool '{}' twice; the first is offered",
                    other.remote
                )
            } else {
                format!(
                    "tools '{}' and '{}' both become '{name}'; only '{}' is offered. Fix: \
                     rename one on the server, or leave one out with the server's `tools` \
                     allow-list",
                    kept.remote, other.remote, kept.remote
                )
            };
            refused.push(RefusedTool {
                name: name.clone(),
                remote: other.remote,
                reason,
            });
        }
        exposed.push(kept);
    }
    let mut total = 0usize;
    exposed.retain(|t: &Exposed| {
        total += t.name.len() + t.description.len() + t.schema.to_string().len();
        if total <= limits::MAX_SERVER_BYTES {
            return true;
        }
        refused.push(RefusedTool {
            name: t.name.clone(),
            remote: t.remote.clone(),
            reason: format!(
                "tool '{}' is not offered: the server's tools before it (by name) already fill \
                 its share of {} KiB. Fix: leave tools out with the server's `tools` allow-list",
                t.remote,
                limits::MAX_SERVER_BYTES >> 10
            ),
        });
        false
    });
    (exposed, refused)
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// `<server>__<tool>` reduced to `[A-Za-z0-9_-]{1,64}`.
fn exposed_name(server: &str, tool: &str) -> String {
    let raw = format!("{server}__{tool}");
    let mut name: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if name.is_empty() {
        name.push('_');
    }
    name
}

/// Make sure the registry gets an object schema: add a missing `type`, replace a non-object one.
fn normalise_schema(schema: Value) -> Value {
    let Value::Object(mut map) = schema else {
        return json!({"type": "object", "properties": {}});
    };
    match map.get("type") {
        None => {
            map.insert("type".into(), json!("object"));
            map.entry("properties").or_insert_with(|| json!({}));
            Value::Object(map)
        }
        Some(Value::String(t)) if t == "object" => Value::Object(map),
        Some(_) => json!({"type": "object", "properties": {}, "additionalProperties": true}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_are_namespaced_and_sanitised() {
        assert_eq!(exposed_name("fs", "read_file"), "fs__read_file");
        assert_eq!(exposed_name("fs", "a.b c"), "fs__a_b_c");
        assert_eq!(exposed_name("s", &"x".repeat(100)).len(), 64);
    }

    proptest! {
        #[test]
        fn exposed_names_are_always_valid(server in ".{0,40}", tool in ".{0,80}") {
            let n = exposed_name(&server, &tool);
            prop_assert!(!n.is_empty() && n.len() <= 64);
            prop_assert!(n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'));
        }
    }

    fn listed(names: &[&str]) -> Vec<rmcp::model::Tool> {
        names
            .iter()
            .map(|n| {
                serde_json::from_value(json!({
                    "name": n,
                    "description": format!("tool {n}"),
                    "inputSchema": {"type": "object", "properties": {}}
                }))
                .expect("tool")
            })
            .collect()
    }

    /// "a.b" and "a_b" both clean up to `s__a_b`: the exact one is offered whatever the listing
    /// order, the other is refused with a reason naming both and the fix.
    #[test]
    fn a_name_clash_keeps_one_tool_and_explains_the_other() {
        for order in [["a.b", "a_b", "z"], ["z", "a_b", "a.b"]] {
            let (exposed, refused) = expose("s", None, listed(&order));
            let names: Vec<_> = exposed
                .iter()
                .map(|e| (e.name.as_str(), e.remote.as_str()))
                .collect();
            assert_eq!(names, [("s__a_b", "a_b"), ("s__z", "z")]);
            assert_eq!(refused.len(), 1, "{refused:?}");
            let r = &refused[0];
            assert_eq!((r.name.as_str(), r.remote.as_str()), ("s__a_b", "a.b"));
            assert!(
                r.reason.contains("'a_b'")
                    && r.reason.contains("'a.b'")
                    && r.reason.contains("allow-list"),
                "{}",
                r.reason
            );
        }
        // Neither exact: the smaller remote name wins.
        let (exposed, refused) = expose("s", None, listed(&["a b", "a.b"]));
        assert_eq!(exposed[0].remote, "a b");
        assert_eq!(refused[0].remote, "a.b");
        // Listed twice: one offered.
        let (exposed, refused) = expose("s", None, listed(&["x", "x"]));
        assert_eq!(exposed.len(), 1);
        assert!(refused[0].reason.contains("twice"), "{refused:?}");
    }

    #[test]
    fn the_allow_list_filters_before_names_clash() {
        let allow = vec!["a.b".to_string()];
        let (exposed, refused) = expose("s", Some(&allow), listed(&["a.b", "a_b", "c"]));
        let names: Vec<_> = exposed.iter().map(|e| e.remote.as_str()).collect();
        assert_eq!(names, ["a.b"]);
        assert!(refused.is_empty());
    }

    /// Reload compares configs field by field, secrets by value.
    #[test]
    fn server_configs_compare_secrets_by_value() {
        let cfg = |secret: &str| McpServerConfig {
            name: "s".into(),
            transport: McpTransport::Stdio {
                command: "srv".into(),
                args: vec!["a".into()],
                env: BTreeMap::from([("K".to_string(), secrecy::SecretString::from(secret))]),
                cwd: None,
            },
            enabled: true,
            tools: None,
            timeout: Duration::from_secs(5),
            network: true,
        };
        assert_eq!(cfg("one"), cfg("one"));
        assert_ne!(cfg("one"), cfg("two"));
        let mut other = cfg("one");
        other.timeout = Duration::from_secs(6);
        assert_ne!(cfg("one"), other);
        let http = |h: &str| McpTransport::Http {
            url: "https://m".into(),
            headers: BTreeMap::from([("A".to_string(), secrecy::SecretString::from(h))]),
        };
        assert_eq!(http("x"), http("x"));
        assert_ne!(http("x"), http("y"));
        assert_ne!(http("x"), cfg("x").transport);
    }

    #[test]
    fn schemas_become_object_schemas() {
        assert_eq!(
            normalise_schema(json!({"properties": {"a": {"type": "string"}}})),
            json!({"type": "object", "properties": {"a": {"type": "string"}}})
        );
        assert_eq!(
            normalise_schema(json!({"type": "string"}))["type"],
            json!("object")
        );
        let ok = json!({"type": "object", "required": ["a"]});
        assert_eq!(normalise_schema(ok.clone()), ok);
    }

    #[test]
    fn content_is_rendered() {
        let r = json!({"content": [
            {"type": "text", "text": "one"},
            {"type": "image", "data": "xx", "mimeType": "image/png"},
            {"type": "text", "text": "two"}
        ]});
        assert_eq!(render_content(&r), "one\n[image content, image/png]\ntwo");
        assert_eq!(
            render_content(&json!({"content": [], "structuredContent": {"a": 1}})),
            "{\"a\":1}"
        );
    }
}
