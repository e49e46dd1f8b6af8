//! MCP client against a tiny Python stdio server: tool discovery, calls, env isolation and
//! restart after the child dies.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agentd::config::{McpServerConfig, McpTransport};
use agentd::tools::mcp::{McpManager, McpSandbox};
use agentd::tools::{SessionStatus, StatusSource, Tool, ToolContext};
use futures::future::BoxFuture;
use secrecy::SecretString;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub const SERVER: &str = r#"
import json, os, sys
TOOLS = [
  {"name": "echo", "description": "echo text", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
  {"name": "env", "description": "report env", "inputSchema": {"type": "object", "properties": {}}},
  {"name": "pid", "description": "report pid", "inputSchema": {"type": "object", "properties": {}}},
  {"name": "fail", "description": "always fails", "inputSchema": {"type": "object", "properties": {}}},
  {"name": "hidden", "description": "not on the allow-list", "inputSchema": {"type": "object"}},
]
def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    msg = json.loads(line)
    mid = msg.get("id"); method = msg.get("method")
    if mid is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": msg["params"].get("protocolVersion", "2025-06-18"), "capabilities": {"tools": {}}, "serverInfo": {"name": "fake", "version": "0.1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        name = msg["params"]["name"]; args = msg["params"].get("arguments") or {}
        err = False
        if name == "echo":
            text = "echo: " + args.get("text", "")
        elif name == "env":
            text = "SECRET_CHECK=%s AGENTD_TEST_SECRET=%s" % (os.environ.get("SECRET_CHECK", "<unset>"), os.environ.get("AGENTD_TEST_SECRET", "<unset>"))
        elif name == "pid":
            text = str(os.getpid())
        else:
            text = "it broke"; err = True
        send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": text}], "isError": err}})
    else:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no such method"}})
"#;

struct NoStatus;
impl StatusSource for NoStatus {
    fn session_status(&self) -> BoxFuture<'_, Result<SessionStatus, String>> {
        Box::pin(async { Err("none".to_string()) })
    }
}

pub(crate) fn ctx(dir: &std::path::Path) -> ToolContext {
    ToolContext {
        session_id: "s".into(),
        session_key: "k".into(),
        workspace: dir.to_path_buf(),
        allowed_paths: vec![],
        protected: Default::default(),
        reply_to: None,
        status: Arc::new(NoStatus),
        sees_images: false,
    }
}

/// Servers run through the real `agentd sandbox-exec` helper (Landlock on), with `dir` as the
/// workspace, writable, and their private directories below it.
pub(crate) fn sandbox(dir: &std::path::Path) -> McpSandbox {
    McpSandbox {
        mode: agentd::sandbox::SandboxMode::Landlock,
        allowed_paths: vec![dir.to_path_buf()],
        protected: vec![dir.join("state"), dir.join("config")],
        prompt: Default::default(),
        private_root: dir.join("mcp-private"),
        default_cwd: dir.to_path_buf(),
        helper_exe: Some(env!("CARGO_BIN_EXE_agentd").into()),
        no_namespaces: false,
        no_mount_namespace: false,
    }
}

pub(crate) fn find(tools: &[Arc<dyn Tool>], name: &str) -> Arc<dyn Tool> {
    tools
        .iter()
        .find(|t| t.spec().name == name)
        .cloned()
        .unwrap_or_else(|| panic!("tool {name} missing"))
}

#[tokio::test]
async fn stdio_server_tools_env_and_restart() -> anyhow::Result<()> {
    // SAFETY: set before any child is spawned; only this test reads it.
    unsafe { std::env::set_var("AGENTD_TEST_SECRET", "leaked") };
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("server.py");
    std::fs::write(&script, SERVER)?;
    let python = ["/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("/usr/bin/python3");

    let mut env = BTreeMap::new();
    env.insert("SECRET_CHECK".to_string(), SecretString::from("configured"));
    let mut servers = BTreeMap::new();
    servers.insert(
        "fake".to_string(),
        McpServerConfig {
            name: "fake".into(),
            transport: McpTransport::Stdio {
                command: python.into(),
                args: vec![script.display().to_string()],
                env,
                cwd: Some(dir.path().to_path_buf()),
            },
            enabled: true,
            tools: Some(vec![
                "echo".into(),
                "env".into(),
                "pid".into(),
                "fail".into(),
            ]),
            timeout: Duration::from_secs(10),
            network: true,
            sandbox: true,
            unix_sockets: Vec::new(),
        },
    );
    servers.insert(
        "remote".to_string(),
        McpServerConfig {
            name: "remote".into(),
            transport: McpTransport::Http {
                url: "http://127.0.0.1:1/mcp".into(),
                headers: BTreeMap::new(),
            },
            enabled: true,
            tools: None,
            timeout: Duration::from_secs(10),
            network: true,
            sandbox: true,
            unix_sockets: Vec::new(),
        },
    );
    let cancel = CancellationToken::new();
    let mgr = McpManager::start(&servers, sandbox(dir.path()), cancel.clone());
    mgr.wait_ready(Duration::from_secs(60)).await;

    let status = mgr.status();
    assert_eq!(status["fake"]["state"], "ready", "{status}");
    // Nothing listens on port 1: the HTTP server is not ready and says why (and is retried).
    assert_ne!(status["remote"]["state"], "ready", "{status}");
    assert!(status["remote"]["last_error"].is_string(), "{status}");

    let tools = mgr.tools();
    let mut names: Vec<String> = tools.iter().map(|t| t.spec().name).collect();
    names.sort();
    assert_eq!(
        names,
        ["fake__echo", "fake__env", "fake__fail", "fake__pid"]
    );
    // The registry accepts them.
    agentd::tools::ToolRegistry::new(tools.clone(), Duration::from_secs(30), 10_000)
        .map_err(anyhow::Error::msg)?;

    let c = ctx(dir.path());
    let out = find(&tools, "fake__echo")
        .call(json!({"text": "hi"}), &c)
        .await?;
    assert_eq!(out, "echo: hi");

    let out = find(&tools, "fake__env").call(json!({}), &c).await?;
    assert_eq!(out, "SECRET_CHECK=configured AGENTD_TEST_SECRET=<unset>");

    let err = find(&tools, "fake__fail").call(json!({}), &c).await;
    assert!(
        matches!(&err, Err(e) if e.to_string().contains("it broke")),
        "{err:?}"
    );

    // Kill the server (its sandbox helper, our direct child: the server is PID 2 of its own
    // PID namespace and dies with it); the supervisor restarts it and calls work again.
    let pid: i32 = find(&tools, "fake__pid")
        .call(json!({}), &c)
        .await?
        .parse()?;
    assert!(pid > 0);
    let script_arg = script.display().to_string();
    let helpers = child_pids(&script_arg);
    assert_eq!(helpers.len(), 1, "{helpers:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(helpers[0]),
        nix::sys::signal::Signal::SIGKILL,
    )?;

    let echo = find(&tools, "fake__echo");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let status = mgr.status();
        if status["fake"]["restarts"].as_u64().unwrap_or(0) >= 1
            && status["fake"]["state"] == "ready"
            && let Ok(out) = echo.call(json!({"text": "again"}), &c).await
        {
            assert_eq!(out, "echo: again");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "server did not come back: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let new_helpers = child_pids(&script_arg);
    assert_eq!(new_helpers.len(), 1, "{new_helpers:?}");
    assert_ne!(new_helpers, helpers, "a new server process");
    let _: Value = mgr.status();
    cancel.cancel();
    Ok(())
}

/// The real daemon with an MCP server in its config: the server's tools reach the model's tool
/// list under namespaced names, a call returns the server's result, and the server's state is
/// in `/api/v1/status` and `agentd doctor`.
#[test]
fn daemon_offers_mcp_tools_to_the_model() {
    use crate::support::daemon::TestDaemon;
    use crate::support::e2e::{agentd_toml, fifo_write, provider_toml, wait_outcome};
    use crate::support::fake_llm::{FakeLlm, Reply, Wire};

    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.push(Reply::tool_calls(vec![(
        "m1",
        "fake__echo",
        serde_json::json!({"text": "ping"}),
    )]));
    fake.push(Reply::text("done"));
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("server.py");
    std::fs::write(&script, SERVER).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let toml = format!(
        "{}\n[http]\nenabled = true\nport = {port}\n\n[mcp.servers.fake]\ncommand = \"python3\"\nargs = [\"{}\"]\nenv = {{ SECRET_CHECK = \"configured\" }}\n",
        agentd_toml("fake"),
        script.display()
    );
    let mut d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    d.start();
    crate::support::e2e::wait_mcp_tools(&d);
    fifo_write(
        &d,
        r#"{"id":"mc1","type":"user","text":"use mcp","sender":"max"}"#,
    );
    let fin = wait_outcome(&d, "max", "mc1");
    assert_eq!(fin["text"], "done");
    let reqs = fake.requests();
    let names: Vec<&str> = reqs[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"fake__echo"), "{names:?}");
    let result = &reqs[1]["messages"][2]["content"][0];
    assert_eq!(result["type"], "tool_result", "{result}");
    // The server's own answer, marked as untrusted like all external content.
    assert_eq!(
        result["content"],
        agentd::tools::untrusted::wrap("fake__echo", "echo: ping"),
        "the server's own answer: {result}"
    );
    assert_eq!(result["is_error"], false);
    let status: serde_json::Value = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            reqwest::get(format!("http://127.0.0.1:{port}/api/v1/status"))
                .await
                .unwrap()
                .json()
                .await
                .unwrap()
        });
    assert_eq!(status["mcp"]["fake"]["state"], "ready", "{status}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["doctor", "-c"])
        .arg(&d.config_path)
        .env("AGENTD_STATE_DIR", &d.state_dir)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("PASS  mcp fake"), "{table}");
}

/// Installs the real peers once per target dir (scripts/install-test-peers.sh) and returns
/// their directory.
pub(crate) fn real_peers() -> std::path::PathBuf {
    crate::support::test_peers("mcp", "python3/pip and node/npm with registry access")
}

/// Pids of our direct children whose command line contains `needle`.
pub(crate) fn child_pids(needle: &str) -> Vec<i32> {
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .unwrap_or("");
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if ppid == me && String::from_utf8_lossy(&cmd).contains(needle) {
            out.push(pid);
        }
    }
    out
}

/// The real reference servers, installed by the project's script: `mcp-server-time` (PyPI)
/// and `@modelcontextprotocol/server-everything` (npm) over stdio. Their tools appear with
/// namespaced names, calls return the servers' results, and killing a server leads to a
/// restart and working calls again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_reference_servers_time_and_everything() {
    let peers = tokio::task::spawn_blocking(real_peers).await.unwrap();
    let path = SecretString::from("/usr/local/bin:/usr/bin:/bin".to_string());
    let mut servers = BTreeMap::new();
    let mut time_env = BTreeMap::new();
    time_env.insert(
        "PYTHONPATH".to_string(),
        SecretString::from(peers.join("py").display().to_string()),
    );
    time_env.insert("PATH".to_string(), path.clone());
    servers.insert(
        "time".to_string(),
        McpServerConfig {
            name: "time".into(),
            transport: McpTransport::Stdio {
                command: "python3".into(),
                args: vec!["-m".into(), "mcp_server_time".into()],
                env: time_env,
                cwd: None,
            },
            enabled: true,
            tools: None,
            timeout: Duration::from_secs(30),
            network: true,
            sandbox: true,
            unix_sockets: Vec::new(),
        },
    );
    let mut node_env = BTreeMap::new();
    node_env.insert("PATH".to_string(), path);
    servers.insert(
        "everything".to_string(),
        McpServerConfig {
            name: "everything".into(),
            transport: McpTransport::Stdio {
                command: "node".into(),
                args: vec![
                    peers
                        .join("npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
                        .display()
                        .to_string(),
                    "stdio".into(),
                ],
                env: node_env,
                cwd: None,
            },
            enabled: true,
            tools: None,
            timeout: Duration::from_secs(30),
            network: true,
            sandbox: true,
            unix_sockets: Vec::new(),
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let cancel = CancellationToken::new();
    let mgr = McpManager::start(&servers, sandbox(dir.path()), cancel.clone());
    mgr.wait_ready(Duration::from_secs(60)).await;
    let status = mgr.status();
    assert_eq!(status["time"]["state"], "ready", "{status}");
    assert_eq!(status["everything"]["state"], "ready", "{status}");
    let tools = mgr.tools();
    let c = ctx(dir.path());
    let now = find(&tools, "time__get_current_time")
        .call(json!({"timezone": "UTC"}), &c)
        .await
        .expect("time call");
    assert!(now.contains("UTC") && now.contains("datetime"), "{now}");
    let echo = find(&tools, "everything__echo")
        .call(json!({"message": "hello mcp"}), &c)
        .await
        .expect("echo call");
    assert!(echo.contains("hello mcp"), "{echo}");

    // Kill the time server: the supervisor restarts it and calls work again.
    let pids = child_pids("mcp_server_time");
    assert_eq!(pids.len(), 1, "{pids:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[0]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let s = mgr.status();
        if s["time"]["restarts"].as_u64().unwrap_or(0) >= 1 && s["time"]["state"] == "ready" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no restart: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = find(&tools, "time__get_current_time")
        .call(json!({"timezone": "Europe/Berlin"}), &c)
        .await
        .expect("time call after restart");
    assert!(again.contains("Europe/Berlin"), "{again}");
    cancel.cancel();
}

/// `@modelcontextprotocol/server-everything` over streamable HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_everything_server_over_streamable_http() {
    let peers = tokio::task::spawn_blocking(real_peers).await.unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = std::process::Command::new("node")
        .arg(peers.join("npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start node");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "server-everything did not listen"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut servers = BTreeMap::new();
    servers.insert(
        "web".to_string(),
        McpServerConfig {
            name: "web".into(),
            transport: McpTransport::Http {
                url: format!("http://127.0.0.1:{port}/mcp"),
                headers: BTreeMap::new(),
            },
            enabled: true,
            tools: Some(vec!["echo".into()]),
            timeout: Duration::from_secs(30),
            network: true,
            sandbox: true,
            unix_sockets: Vec::new(),
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let cancel = CancellationToken::new();
    let mgr = McpManager::start(&servers, sandbox(dir.path()), cancel.clone());
    mgr.wait_ready(Duration::from_secs(60)).await;
    let status = mgr.status();
    assert_eq!(status["web"]["state"], "ready", "{status}");
    let tools = mgr.tools();
    assert_eq!(tools.len(), 1, "the allow-list keeps only echo");
    let out = find(&tools, "web__echo")
        .call(json!({"message": "over http"}), &ctx(dir.path()))
        .await
        .expect("echo over streamable HTTP");
    assert!(out.contains("over http"), "{out}");
    cancel.cancel();
    let _ = child.kill();
    let _ = child.wait();
}

/// A server whose tools try a connection: `connect` a TCP one to the port it is given, `unix`
/// a Unix stream one to `path` (or to the abstract name `abstract`), reading what the
/// listener sends ("read: …"); each answers "refused: <error>" when it fails.
pub(crate) const CONNECT_SERVER: &str = r#"
import json, socket, sys
TOOLS = [
  {"name": "connect", "description": "connect", "inputSchema": {"type": "object", "properties": {"port": {"type": "integer"}}}},
  {"name": "unix", "description": "connect to a Unix socket", "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}, "abstract": {"type": "string"}}}},
]
def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
def unix(args):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(5)
        s.connect(args["path"] if "path" in args else "\0" + args["abstract"])
        return "read: " + s.recv(1024).decode()
    finally:
        s.close()
for line in sys.stdin:
    msg = json.loads(line) if line.strip() else {}
    mid, method = msg.get("id"), msg.get("method")
    if mid is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": msg["params"].get("protocolVersion", "2025-06-18"), "capabilities": {"tools": {}}, "serverInfo": {"name": "net", "version": "0.1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        name, args = msg["params"]["name"], msg["params"]["arguments"]
        try:
            if name == "unix":
                text = unix(args)
            else:
                socket.create_connection(("127.0.0.1", args["port"]), timeout=5).close()
                text = "connected"
        except Exception as e:
            text = "refused: %s" % e
        send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": text}], "isError": False}})
"#;

/// `network` per stdio server (default on): a server with `network = false` cannot reach a
/// local listener, one with the default can; a server whose command cannot be run says why in
/// its status (the sandbox helper's own message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_server_network_is_per_server() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("net.py");
    std::fs::write(&script, CONNECT_SERVER).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = |name: &str, command: &str, network: bool| McpServerConfig {
        name: name.into(),
        transport: McpTransport::Stdio {
            command: command.into(),
            args: vec![script.display().to_string()],
            env: BTreeMap::new(),
            cwd: None,
        },
        enabled: true,
        tools: None,
        timeout: Duration::from_secs(10),
        network,
        sandbox: true,
        unix_sockets: Vec::new(),
    };
    let mut servers = BTreeMap::new();
    for cfg in [
        server("online", "python3", true),
        server("offline", "python3", false),
        server("missing", "/nonexistent/mcp-server", true),
    ] {
        servers.insert(cfg.name.clone(), cfg);
    }
    let cancel = CancellationToken::new();
    let mgr = McpManager::start(&servers, sandbox(dir.path()), cancel.clone());
    mgr.wait_ready(Duration::from_secs(60)).await;
    let status = mgr.status();
    assert_eq!(status["online"]["state"], "ready", "{status}");
    assert_eq!(status["offline"]["state"], "ready", "{status}");
    let why = status["missing"]["last_error"].as_str().unwrap_or_default();
    assert!(
        why.contains("cannot run") && why.contains("/nonexistent/mcp-server"),
        "{status}"
    );
    let tools = mgr.tools();
    let c = ctx(dir.path());
    let online = find(&tools, "online__connect")
        .call(json!({"port": port}), &c)
        .await
        .expect("online call");
    assert_eq!(online, "connected");
    let offline = find(&tools, "offline__connect")
        .call(json!({"port": port}), &c)
        .await
        .expect("offline call");
    assert!(offline.starts_with("refused"), "{offline}");
    cancel.cancel();
}

/// The hostile server of `process_hardening` on every isolation path of the helper: with
/// namespaces, without a mount namespace (the shipped units) and on the subreaper fallback.
/// It inherits no variable of the calling process's environment and cannot read
/// `config/.env` or the state directory. (Reading a parent's `/proc/<pid>/environ` is covered
/// by `process_hardening::hostile_mcp_server_gets_no_secret`, with the secret in the daemon's
/// real initial environment; `set_var` here does not change `/proc/self/environ`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_server_gets_no_secret_on_every_isolation_path() {
    const PROCESS_SECRET: &str = "process-secret-3e8d61c0";
    const DOTENV_SECRET: &str = "dotenv-secret-a4c2917e";
    // SAFETY: set before any child is spawned by this test; no other test reads it.
    unsafe { std::env::set_var("AGENTD_MCP_PATHS_SECRET", PROCESS_SECRET) };
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("hostile.py");
    std::fs::write(&script, crate::process_hardening::HOSTILE_SERVER).unwrap();
    std::fs::create_dir_all(dir.path().join("config")).unwrap();
    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    std::fs::write(
        dir.path().join("config/.env"),
        format!("K={DOTENV_SECRET}\n"),
    )
    .unwrap();
    std::fs::write(dir.path().join("state/agentd.db"), DOTENV_SECRET).unwrap();
    let paths: Vec<String> = ["config/.env", "state/agentd.db"]
        .iter()
        .map(|p| dir.path().join(p).display().to_string())
        .collect();
    for (label, no_namespaces, no_mount_namespace) in [
        ("namespaces", false, false),
        ("no-mount-ns", false, true),
        ("subreaper", true, false),
    ] {
        let mut servers = BTreeMap::new();
        servers.insert(
            "evil".to_string(),
            McpServerConfig {
                name: "evil".into(),
                transport: McpTransport::Stdio {
                    command: "python3".into(),
                    args: vec![script.display().to_string()],
                    env: BTreeMap::new(),
                    cwd: None,
                },
                enabled: true,
                tools: None,
                timeout: Duration::from_secs(10),
                network: true,
                sandbox: true,
                unix_sockets: Vec::new(),
            },
        );
        let mut sb = sandbox(dir.path());
        sb.no_namespaces = no_namespaces;
        sb.no_mount_namespace = no_mount_namespace;
        let cancel = CancellationToken::new();
        let mgr = McpManager::start(&servers, sb, cancel.clone());
        mgr.wait_ready(Duration::from_secs(60)).await;
        let status = mgr.status();
        assert_eq!(status["evil"]["state"], "ready", "{label}: {status}");
        let out = find(&mgr.tools(), "evil__probe")
            .call(json!({ "paths": paths }), &ctx(dir.path()))
            .await
            .expect("probe call");
        assert!(out.starts_with("probe ran"), "{label}: {out}");
        for secret in [PROCESS_SECRET, DOTENV_SECRET] {
            assert!(
                !out.contains(secret),
                "{label}: the server read {secret}:\n{out}"
            );
        }
        cancel.cancel();
    }
}
