//! MCP servers (SPEC §12): one supervisor task per enabled server keeps a client session
//! alive (restart with backoff 0, 1, 2, 5, 10, 30, 60 s, then every 60 s) and the tools it lists
//! are exposed to the model as proxy tools named `<server>__<tool>`. Every stdio server runs
//! through the exec sandbox helper ([`McpSandbox`], docs/security.md) unless its config says
//! `sandbox = false`. rmcp stays behind this module so its next major touches one file.
//!
//! The tool set follows the servers: a server that comes up late, restarts with other tools or
//! sends `notifications/tools/list_changed` (re-listed, bounded) changes its tools, and
//! [`McpManager::reconcile`] adds, removes and restarts servers on a reload. Each change bumps a
//! generation counter ([`McpManager::subscribe`]); `tools::assemble` keeps the registry's MCP
//! set equal to [`McpManager::tools`] through [`McpManager::sync_into`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rmcp::service::{Peer, RoleClient};
use secrecy::ExposeSecret;
use serde_json::{Map, Value, json};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

mod client;
mod content;
mod guard;
pub mod limits;
mod proxy;
mod sandbox;
mod stdio;
mod supervise;
mod tasks;

use self::proxy::{McpTool, expose};
pub use self::sandbox::{McpSandbox, unix_sockets_note, unsandboxed_note};
use self::supervise::{stop_all, supervise};
use super::Tool;
use super::registry::ToolRegistry;
use crate::config::{McpServerConfig, McpTransport};

/// Log targets (with their cap) kept at `error` unless the log filter names them: rmcp logs every notification
/// a server sends at `info` and every refused request at `warn`, so a hostile server could fill
/// the log through it; what the daemon logs of its servers is bounded here per server.
pub const QUIET_LOG_TARGETS: &[(&str, &str)] = &[("rmcp", "error")];

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
    /// `<server>__<tool>`, cleaned ([`proxy::exposed_name`]).
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
    /// Its tools that run only as tasks, as its stdio pump saw them listed.
    task_only: Arc<tasks::TaskOnly>,
}

impl Server {
    /// `text` without the secrets of this server's URL and headers: rmcp's and reqwest's
    /// errors name the URL, which may carry a key (docs/security.md).
    fn scrub(&self, text: &str) -> String {
        scrub(text, &self.secrets())
    }

    /// The secrets of this server's URL and headers, longest first (none for stdio).
    fn secrets(&self) -> Vec<String> {
        match &self.cfg.transport {
            McpTransport::Http { url, headers } => {
                let mut secrets = crate::redact::url_secrets(url);
                secrets.extend(headers.values().map(|v| v.expose_secret().to_string()));
                secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
                secrets
            }
            McpTransport::Stdio { .. } => Vec::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take a fresh tool list: allow-list, exposed names, clashes (logged at error when new);
    /// the change signal is bumped when what is offered changed, and the result says so.
    fn set_tools(&self, listed: Vec<rmcp::model::Tool>) -> bool {
        let task_only = |remote: &str| self.task_only.contains(remote);
        let (exposed, clashes) = expose(
            &self.cfg.name,
            self.cfg.tools.as_deref(),
            listed,
            &task_only,
        );
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
        changed
    }
}

/// `text` without `secrets` (longest first).
fn scrub(text: &str, secrets: &[String]) -> String {
    if secrets.is_empty() {
        return text.to_string();
    }
    let refs: Vec<&str> = secrets.iter().map(String::as_str).collect();
    crate::redact::redact(text, &refs)
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
        sandbox::log_exposure(cfg);
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
            task_only: Arc::default(),
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

    /// Whether any server is configured (enabled or not).
    pub fn has_servers(&self) -> bool {
        !self.lock().is_empty()
    }

    /// Whether every server has settled (listed its tools or failed its first start).
    pub fn all_settled(&self) -> bool {
        self.servers().iter().all(|s| s.lock().settled)
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
    /// error once, when it first appears, and shown in [`McpManager::status`]. Returns how many
    /// MCP tools the registry offers now.
    pub fn sync_into(&self, registry: &ToolRegistry) -> usize {
        let Offer {
            tools,
            owners,
            mut refused,
        } = self.offer();
        let mut offered = tools.len();
        for r in registry.set_dynamic(tools) {
            offered = offered.saturating_sub(1);
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
        offered
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

#[cfg(test)]
mod tests {
    use super::proxy::{exposed_name, normalise_schema};
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
            let (exposed, refused) = expose("s", None, listed(&order), &|_| false);
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
        let (exposed, refused) = expose("s", None, listed(&["a b", "a.b"]), &|_| false);
        assert_eq!(exposed[0].remote, "a b");
        assert_eq!(refused[0].remote, "a.b");
        // Listed twice: one offered.
        let (exposed, refused) = expose("s", None, listed(&["x", "x"]), &|_| false);
        assert_eq!(exposed.len(), 1);
        assert!(refused[0].reason.contains("twice"), "{refused:?}");
    }

    #[test]
    fn the_allow_list_filters_before_names_clash() {
        let allow = vec!["a.b".to_string()];
        let (exposed, refused) =
            expose("s", Some(&allow), listed(&["a.b", "a_b", "c"]), &|_| false);
        let names: Vec<_> = exposed.iter().map(|e| e.remote.as_str()).collect();
        assert_eq!(names, ["a.b"]);
        assert!(refused.is_empty());
    }

    /// A tool that runs only as an MCP task is refused, with a reason that says so; the others
    /// are offered.
    #[test]
    fn task_only_tools_are_refused() {
        let (exposed, refused) =
            expose("s", None, listed(&["a", "research"]), &|r| r == "research");
        let names: Vec<_> = exposed.iter().map(|e| e.remote.as_str()).collect();
        assert_eq!(names, ["a"]);
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(
            (refused[0].name.as_str(), refused[0].remote.as_str()),
            ("s__research", "research")
        );
        assert!(
            refused[0].reason.contains("runs only as an MCP task"),
            "{}",
            refused[0].reason
        );
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
            sandbox: true,
            unix_sockets: Vec::new(),
        };
        assert_eq!(cfg("one"), cfg("one"));
        assert_ne!(cfg("one"), cfg("two"));
        let mut other = cfg("one");
        other.timeout = Duration::from_secs(6);
        assert_ne!(cfg("one"), other);
        // A change of the sandbox keys restarts the server on a reload.
        let mut other = cfg("one");
        other.sandbox = false;
        assert_ne!(cfg("one"), other);
        let mut other = cfg("one");
        other.unix_sockets = vec!["/run/a.sock".into()];
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
}
