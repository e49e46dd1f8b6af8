//! MCP tools that follow their servers (issue 13): `notifications/tools/list_changed`, a server
//! that comes up after the first tool list, names that clash, and `McpManager::reconcile`
//! (servers added, removed, changed and unchanged on a reload). The registry is kept in step by
//! `tools::follow_mcp`, the follower `tools::assemble` starts.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agentd::config::{McpServerConfig, McpTransport};
use agentd::message::ToolCall;
use agentd::tools::mcp::{McpManager, Reconciled};
use agentd::tools::{ToolRegistry, follow_mcp};
use secrecy::SecretString;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::mcp::{child_pids, ctx, sandbox};

/// A stdio server whose tool list can change. Options: `--clash` adds tools "a.b" and "a_b"
/// (both become `<server>__a_b`); `--many N` adds N tools; `--late MARKER GO`: without MARKER,
/// create it and exit (a failed first start), else wait for the file GO before serving;
/// `--wait GO`: wait for the file GO before serving (a slow start);
/// `--tag T` only marks the command line. Tools: `echo`, `boot` (an id per process), `env`
/// (`SECRET_CHECK`), `grow` (adds a tool `grownN` and sends `list_changed`); any other tool
/// answers "called <name>".
const LIVE_SERVER: &str = r#"
import json, os, sys, time, uuid
args = sys.argv[1:]
def opt(name):
    return args[args.index(name) + 1]
def tool(name):
    return {"name": name, "description": "tool " + name, "inputSchema": {"type": "object", "properties": {}}}
if "--late" in args:
    marker, go = opt("--late"), args[args.index("--late") + 2]
    if not os.path.exists(marker):
        open(marker, "w").close()
        sys.exit(1)
    while not os.path.exists(go):
        time.sleep(0.05)
if "--wait" in args:
    while not os.path.exists(opt("--wait")):
        time.sleep(0.05)
BOOT = uuid.uuid4().hex
TOOLS = [tool("echo"), tool("boot"), tool("env"), tool("grow")]
if "--clash" in args:
    TOOLS += [tool("a.b"), tool("a_b")]
if "--many" in args:
    TOOLS += [tool("t%d" % i) for i in range(int(opt("--many")))]
grown = 0
def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
def result(mid, text):
    send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": text}], "isError": False}})
for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    msg = json.loads(line)
    mid = msg.get("id"); method = msg.get("method")
    if mid is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": msg["params"].get("protocolVersion", "2025-06-18"), "capabilities": {"tools": {}}, "serverInfo": {"name": "live", "version": "0.1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        name = msg["params"]["name"]
        if name == "echo":
            result(mid, "echo: " + (msg["params"].get("arguments") or {}).get("text", ""))
        elif name == "boot":
            result(mid, BOOT)
        elif name == "env":
            result(mid, "SECRET_CHECK=%s" % os.environ.get("SECRET_CHECK", "<unset>"))
        elif name == "grow":
            grown += 1
            TOOLS.append(tool("grown%d" % grown))
            result(mid, "grew grown%d" % grown)
            send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        else:
            result(mid, "called " + name)
    else:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no such method"}})
"#;

/// The server `name` running `script` with `args`, `SECRET_CHECK=secret`.
fn server(name: &str, script: &Path, args: &[&str], secret: &str) -> McpServerConfig {
    let mut all = vec![script.display().to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    McpServerConfig {
        name: name.into(),
        transport: McpTransport::Stdio {
            command: "python3".into(),
            args: all,
            env: BTreeMap::from([("SECRET_CHECK".to_string(), SecretString::from(secret))]),
            cwd: None,
        },
        enabled: true,
        tools: None,
        timeout: Duration::from_secs(10),
        network: false,
        sandbox: true,
        unix_sockets: Vec::new(),
    }
}

fn servers(list: Vec<McpServerConfig>) -> BTreeMap<String, McpServerConfig> {
    list.into_iter().map(|s| (s.name.clone(), s)).collect()
}

fn script(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("live.py");
    std::fs::write(&path, LIVE_SERVER).unwrap();
    path
}

/// A registry without built-in tools, following `mgr`.
fn followed(mgr: &Arc<McpManager>) -> Arc<ToolRegistry> {
    let registry =
        Arc::new(ToolRegistry::new(Vec::new(), Duration::from_secs(30), 10_000).unwrap());
    follow_mcp(mgr.clone(), registry.clone());
    registry
}

/// Call `name` through the registry; `Err` is an error result.
async fn call(registry: &ToolRegistry, dir: &Path, name: &str) -> Result<String, String> {
    let call = ToolCall {
        id: format!("c-{name}"),
        name: name.into(),
        arguments: json!({}),
    };
    let res = registry.execute(&call, &ctx(dir)).await;
    // MCP output comes wrapped as untrusted content: take the text inside.
    let text = res
        .content
        .split_once(">\n")
        .and_then(|(_, rest)| rest.rsplit_once("\n</"))
        .map(|(inner, _)| inner.to_string())
        .unwrap_or(res.content);
    if res.is_error { Err(text) } else { Ok(text) }
}

/// Wait (generous deadline) until `check` holds; `what` explains a timeout.
async fn wait_until(what: &str, mut check: impl FnMut() -> bool, show: impl Fn() -> String) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not happen: {}",
            show()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `grow` adds a tool and sends `notifications/tools/list_changed` (the server does not
/// advertise `tools.listChanged`): the tool appears in the registry and can be called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_changed_brings_a_new_tool_into_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    let script = script(dir.path());
    let cancel = CancellationToken::new();
    let mgr = McpManager::start(
        &servers(vec![server("live", &script, &[], "s")]),
        sandbox(dir.path()),
        cancel.clone(),
    );
    mgr.wait_ready(Duration::from_secs(60)).await;
    let registry = followed(&mgr);
    assert!(registry.contains("live__grow"), "{:?}", registry.names());
    assert!(!registry.contains("live__grown1"));

    assert_eq!(
        call(&registry, dir.path(), "live__grow").await.unwrap(),
        "grew grown1"
    );
    wait_until(
        "live__grown1 in the registry",
        || registry.contains("live__grown1"),
        || format!("{:?} {}", registry.names(), mgr.status()),
    )
    .await;
    assert_eq!(
        call(&registry, dir.path(), "live__grown1").await.unwrap(),
        "called grown1"
    );
    // Sorted, the new tool among the old ones.
    assert_eq!(
        registry.names(),
        [
            "live__boot",
            "live__echo",
            "live__env",
            "live__grow",
            "live__grown1"
        ]
    );
    assert_eq!(mgr.status()["live"]["tools"], 5);
    cancel.cancel();
}

/// A server whose first start fails and whose second start waits for the test: the first tool
/// list (what `assemble` takes) has none of its tools; once it is up, they are in the registry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_server_exposes_its_tools_once_ready() {
    let dir = tempfile::tempdir().unwrap();
    let script = script(dir.path());
    // A directory of its own: new entries directly in `dir` (split around the servers'
    // private directories) are not writable by a server.
    let markers = dir.path().join("markers");
    std::fs::create_dir(&markers).unwrap();
    let marker = markers.join("started-once");
    let go = markers.join("go");
    let cancel = CancellationToken::new();
    let late = server(
        "late",
        &script,
        &[
            "--late",
            &marker.display().to_string(),
            &go.display().to_string(),
        ],
        "s",
    );
    let mgr = McpManager::start(&servers(vec![late]), sandbox(dir.path()), cancel.clone());
    mgr.wait_ready(Duration::from_secs(60)).await;
    assert!(marker.exists(), "the first start ran: {}", mgr.status());
    let registry = followed(&mgr);
    assert!(registry.is_empty(), "{:?}", registry.names());
    assert_ne!(mgr.status()["late"]["state"], "ready");

    std::fs::write(&go, "").unwrap();
    wait_until(
        "the late server's tools in the registry",
        || registry.contains("late__echo"),
        || format!("{:?} {}", registry.names(), mgr.status()),
    )
    .await;
    assert_eq!(registry.len(), 4, "{:?}", registry.names());
    assert_eq!(mgr.status()["late"]["state"], "ready");
    assert!(mgr.status()["late"]["restarts"].as_u64().unwrap() >= 1);
    cancel.cancel();
}

/// Tools "a.b" and "a_b" both become `clash__a_b`: "a_b" is offered, "a.b" is refused with a
/// reason in the status, and the rest of the server's tools work. A server listing more than
/// `MAX_TOOLS_PER_SERVER` tools is cut to that many.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clashing_names_keep_one_tool_and_report_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let script = script(dir.path());
    let cancel = CancellationToken::new();
    let mgr = McpManager::start(
        &servers(vec![
            server("clash", &script, &["--clash"], "s"),
            server("many", &script, &["--many", "600"], "s"),
        ]),
        sandbox(dir.path()),
        cancel.clone(),
    );
    mgr.wait_ready(Duration::from_secs(60)).await;
    let registry = followed(&mgr);
    let status = mgr.status();
    assert_eq!(status["clash"]["state"], "ready", "{status}");
    assert_eq!(status["clash"]["tools"], 5, "{status}");
    let refused = status["clash"]["refused"].as_array().unwrap();
    assert_eq!(refused.len(), 1, "{status}");
    assert_eq!(refused[0]["name"], "clash__a_b");
    assert_eq!(refused[0]["remote"], "a.b");
    let reason = refused[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("'a.b'") && reason.contains("'a_b'"),
        "{reason}"
    );
    assert_eq!(
        call(&registry, dir.path(), "clash__a_b").await.unwrap(),
        "called a_b"
    );
    assert_eq!(
        call(&registry, dir.path(), "clash__echo").await.unwrap(),
        "echo: "
    );

    assert_eq!(
        status["many"]["tools"],
        agentd::tools::mcp::MAX_TOOLS_PER_SERVER,
        "{}",
        status["many"]
    );
    let many = registry
        .names()
        .iter()
        .filter(|n| n.starts_with("many__"))
        .count();
    assert_eq!(many, agentd::tools::mcp::MAX_TOOLS_PER_SERVER);
    cancel.cancel();
}

/// A reload: an added server starts and its tools appear; a removed one stops (its process is
/// gone) and its tools leave; a changed one (another `env` value) restarts with the new value;
/// an unchanged one keeps its process. Cancelling the manager ends the follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_adds_removes_restarts_and_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let script = script(dir.path());
    let tagged = |name: &str, secret: &str| {
        server(name, &script, &["--tag", &format!("rtag-{name}")], secret)
    };
    let cancel = CancellationToken::new();
    let mgr = McpManager::start(
        &servers(vec![
            tagged("keep", "k"),
            tagged("change", "old"),
            tagged("remove", "r"),
        ]),
        sandbox(dir.path()),
        cancel.clone(),
    );
    mgr.wait_ready(Duration::from_secs(60)).await;
    let registry =
        Arc::new(ToolRegistry::new(Vec::new(), Duration::from_secs(30), 10_000).unwrap());
    let follower = follow_mcp(mgr.clone(), registry.clone());
    for name in ["keep__boot", "change__boot", "remove__boot"] {
        assert!(registry.contains(name), "{name}: {:?}", registry.names());
    }
    let d = dir.path();
    let keep_boot = call(&registry, d, "keep__boot").await.unwrap();
    let change_boot = call(&registry, d, "change__boot").await.unwrap();
    let keep_pids = child_pids("rtag-keep");
    let change_pids = child_pids("rtag-change");
    assert_eq!(keep_pids.len(), 1, "{keep_pids:?}");
    assert_eq!(change_pids.len(), 1, "{change_pids:?}");
    assert_eq!(child_pids("rtag-remove").len(), 1);
    assert_eq!(
        call(&registry, d, "change__env").await.unwrap(),
        "SECRET_CHECK=old"
    );

    let done = mgr
        .reconcile(
            &servers(vec![
                tagged("keep", "k"),
                tagged("change", "new"),
                tagged("add", "a"),
            ]),
            sandbox(d),
        )
        .await;
    assert_eq!(
        done,
        Reconciled {
            added: vec!["add".into()],
            removed: vec!["remove".into()],
            restarted: vec!["change".into()],
        }
    );
    wait_until(
        "the registry to follow the reload",
        || {
            registry.contains("add__boot")
                && registry.contains("change__boot")
                && !registry.contains("remove__boot")
        },
        || format!("{:?} {}", registry.names(), mgr.status()),
    )
    .await;
    wait_until(
        "the removed server's process to end",
        || child_pids("rtag-remove").is_empty(),
        || format!("{:?}", child_pids("rtag-remove")),
    )
    .await;
    let status = mgr.status();
    assert!(status.get("remove").is_none(), "{status}");
    assert_eq!(status["add"]["state"], "ready", "{status}");

    // Changed: a new process with the new environment.
    assert_eq!(
        call(&registry, d, "change__env").await.unwrap(),
        "SECRET_CHECK=new"
    );
    assert_ne!(
        call(&registry, d, "change__boot").await.unwrap(),
        change_boot
    );
    let new_change_pids = child_pids("rtag-change");
    assert_eq!(new_change_pids.len(), 1, "{new_change_pids:?}");
    assert_ne!(new_change_pids, change_pids);
    // Unchanged: the same process, never restarted.
    assert_eq!(call(&registry, d, "keep__boot").await.unwrap(), keep_boot);
    assert_eq!(child_pids("rtag-keep"), keep_pids);
    assert_eq!(mgr.status()["keep"]["restarts"], 0);

    // The same list again changes nothing.
    let again = mgr
        .reconcile(
            &servers(vec![
                tagged("keep", "k"),
                tagged("change", "new"),
                tagged("add", "a"),
            ]),
            sandbox(d),
        )
        .await;
    assert_eq!(again, Reconciled::default());

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(30), follower)
        .await
        .expect("the follower ends when the manager is cancelled")
        .unwrap();
    wait_until(
        "every server process to end",
        || {
            ["rtag-keep", "rtag-change", "rtag-add"]
                .iter()
                .all(|t| child_pids(t).is_empty())
        },
        || "still running".to_string(),
    )
    .await;
}

/// The daemon with a server whose tools clash: before issue 13 it exited 1 ("defined twice");
/// now it starts, answers `/api/v1/status`, and the status names the refused tool.
#[test]
fn daemon_starts_with_clashing_mcp_tool_names() {
    use crate::support::daemon::TestDaemon;
    use crate::support::e2e::{agentd_toml, provider_toml};
    use crate::support::fake_llm::{FakeLlm, Wire};

    let fake = FakeLlm::spawn(Wire::Anthropic);
    let dir = tempfile::tempdir().unwrap();
    let script = script(dir.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let toml = format!(
        "{}\n[http]\nenabled = true\nport = {port}\n\n[mcp.servers.clash]\ncommand = \"python3\"\nargs = [\"{}\", \"--clash\"]\n",
        agentd_toml("fake"),
        script.display()
    );
    let mut d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    // The refused tools are details of the status: they need the token.
    d.set_env("AGENTD_HTTP_TOKEN", "tok-live");
    d.start();
    let status: Value = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let url = format!("http://127.0.0.1:{port}/api/v1/status");
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                let req = reqwest::Client::new().get(&url).bearer_auth("tok-live");
                if let Ok(r) = req.send().await
                    && r.status().is_success()
                {
                    let status: Value = r.json().await.unwrap();
                    if status["mcp"]["clash"]["state"] == "ready" {
                        return status;
                    }
                }
                assert!(tokio::time::Instant::now() < deadline, "no ready status");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    assert!(d.is_running());
    let clash = &status["mcp"]["clash"];
    assert_eq!(clash["tools"], 5, "{status}");
    assert_eq!(clash["refused"][0]["remote"], "a.b", "{status}");
    assert_eq!(clash["refused"][0]["name"], "clash__a_b", "{status}");
}

/// SPEC §16.2: READY never waits for MCP servers. With a quick server and one that waits for a
/// file, the daemon answers a first message before either's tools are offered; once the slow
/// one serves, both servers' tools arrive together, and the tool block stays the same after.
#[test]
fn the_daemon_is_ready_before_its_mcp_servers_and_their_tools_arrive_together() {
    use crate::support::daemon::TestDaemon;
    use crate::support::e2e::{
        WAIT, agentd_toml, fifo_write, provider_toml, wait_mcp_tools, wait_outcome,
    };
    use crate::support::fake_llm::{FakeLlm, Reply, Wire};

    let llm = FakeLlm::spawn(Wire::OpenAi);
    llm.set_responder(|_| Some(Reply::text("ok")));
    let dir = tempfile::tempdir().unwrap();
    let script = script(dir.path());
    let go = dir.path().join("go");
    let toml = format!(
        "{}\n[mcp.servers.quick]\ncommand = \"python3\"\nargs = [\"{s}\"]\n\n\
         [mcp.servers.slow]\ncommand = \"python3\"\nargs = [\"{s}\", \"--wait\", \"{go}\"]\n",
        agentd_toml("fake"),
        s = script.display(),
        go = go.display(),
    );
    let mut d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("openai", &llm.base_url()))],
    );
    d.start();
    let ask = |id: &str| {
        fifo_write(
            &d,
            &format!(r#"{{"id":"{id}","type":"user","sender":"ops","text":"tools?"}}"#),
        );
        wait_outcome(&d, "ops", id);
        let tools = llm.requests().last().unwrap()["tools"].clone();
        let names: Vec<String> = tools
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str().map(String::from))
            .collect();
        (tools, names)
    };
    let mcp_tools = |names: &[String]| {
        let mut mine: Vec<String> = names
            .iter()
            .filter(|n| n.starts_with("quick__") || n.starts_with("slow__"))
            .cloned()
            .collect();
        mine.sort();
        mine
    };

    let (_, first) = ask("before");
    assert!(
        first.iter().any(|n| n == "read"),
        "built-in tools: {first:?}"
    );
    assert_eq!(mcp_tools(&first), Vec::<String>::new(), "{first:?}");
    // The quick server is up long before the slow one: its tools still wait for it.
    crate::support::wait_until(WAIT, "the quick server's start", || {
        d.log()
            .lines()
            .any(|l| l.contains("MCP server ready") && l.contains("quick"))
            .then_some(())
    });
    let (_, waiting) = ask("waiting");
    assert_eq!(mcp_tools(&waiting), Vec::<String>::new(), "{waiting:?}");
    assert!(!d.log().contains("MCP tools offered"), "{}", d.log());

    std::fs::write(&go, "").unwrap();
    let line = wait_mcp_tools(&d);
    assert!(line.contains("tools=8"), "{line}");
    let (block, names) = ask("after");
    let expected: Vec<String> = ["boot", "echo", "env", "grow"]
        .iter()
        .flat_map(|t| [format!("quick__{t}"), format!("slow__{t}")])
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(mcp_tools(&names), expected);
    let (again, _) = ask("again");
    assert_eq!(again, block, "the tool block changes once");
    let offered = d.log().matches("MCP tools offered").count();
    assert_eq!(offered, 1, "{}", d.log());
    assert!(d.sigterm().success(), "{}", d.log());
}
