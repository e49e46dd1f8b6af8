//! Unix sockets for MCP stdio servers (issue 33 item 1): without `unix_sockets` a sandboxed
//! server reaches no Unix socket; with it, the listed one (abstract sockets outside stay out of
//! reach where Landlock scopes them); `sandbox = false` runs a server unconfined and says so in
//! the log and in `doctor`; a reload that changes the key restarts the server; the keys are
//! validated by `check-config`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentd::config::{McpServerConfig, McpTransport};
use agentd::sandbox::SandboxMode;
use agentd::sandbox::probe::{ABSTRACT_SCOPE_ABI, RESOLVE_UNIX_ABI, landlock_abi};
use agentd::tools::mcp::McpManager;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::mcp::{CONNECT_SERVER, ctx, find, sandbox};
use crate::reload::{edit_config, sighup};
use crate::support::daemon::TestDaemon;
use crate::support::e2e::{WAIT, agentd_toml, fifo_write, provider_toml, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};
use crate::support::wait_until;

const GREETING: &str = "hello from the socket";
const ABSTRACT_GREETING: &str = "hello from the abstract socket";

/// Answer every connection to `listener` with `greeting`, on a thread of its own (it lives as
/// long as the test binary; the socket file goes with the test's directory).
fn greet(listener: UnixListener, greeting: &'static str) {
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = stream.write_all(greeting.as_bytes());
        }
    });
}

/// A greeting listener at `path`.
fn greet_at(path: &Path) {
    greet(UnixListener::bind(path).unwrap(), GREETING);
}

/// A greeting listener on an abstract socket of a fresh name, which it returns.
fn greet_abstract() -> String {
    use std::os::linux::net::SocketAddrExt;
    let name = format!(
        "agentd-it-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    greet(UnixListener::bind_addr(&addr).unwrap(), ABSTRACT_GREETING);
    name
}

/// The connect server (`crate::mcp::CONNECT_SERVER`) as `name`, network on, with
/// `unix_sockets`.
fn server(name: &str, script: &Path, unix_sockets: Vec<PathBuf>) -> McpServerConfig {
    McpServerConfig {
        name: name.into(),
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
        unix_sockets,
    }
}

/// What the server's `unix` tool says about a connection that the sandbox refused: the
/// `socket()` or `connect()` call failed with EPERM.
fn assert_refused(what: &str, out: &str) {
    assert!(
        out.starts_with("refused") && out.contains("[Errno 1]"),
        "{what}: expected EPERM, got {out:?}"
    );
}

/// A sandboxed server without `unix_sockets` reaches no Unix socket (EPERM, as before the
/// key existed); one that lists a socket reads its greeting, and still cannot reach an
/// abstract socket created outside its sandbox where the kernel has Landlock's scope (ABI 6;
/// on an older kernel it can, which is asserted too). On every isolation path of the helper
/// and in mode `none`. The sandbox's own directory is outside `/tmp` and the socket under
/// it, so the private `/tmp` must keep the listed socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_sockets_reach_the_listed_socket_and_nothing_else() {
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let sockets = tempfile::tempdir().unwrap();
    let path = sockets.path().join("agent.sock");
    greet_at(&path);
    let abstract_name = greet_abstract();
    let script = root.path().join("net.py");
    std::fs::write(&script, CONNECT_SERVER).unwrap();
    let abi = landlock_abi();
    for (label, mode, no_namespaces) in [
        ("namespaces", SandboxMode::Landlock, false),
        ("subreaper", SandboxMode::Landlock, true),
        ("mode none", SandboxMode::None, false),
    ] {
        let servers: BTreeMap<String, McpServerConfig> = [
            server("closed", &script, Vec::new()),
            server("listed", &script, vec![path.clone()]),
        ]
        .into_iter()
        .map(|s| (s.name.clone(), s))
        .collect();
        let mut sb = sandbox(root.path());
        sb.mode = mode;
        sb.no_namespaces = no_namespaces;
        let cancel = CancellationToken::new();
        let mgr = McpManager::start(&servers, sb, cancel.clone());
        mgr.wait_ready(Duration::from_secs(60)).await;
        let status = mgr.status();
        for name in ["closed", "listed"] {
            assert_eq!(status[name]["state"], "ready", "{label}: {status}");
        }
        let tools = mgr.tools();
        let call = |tool: &str, args: Value| {
            let tool = find(&tools, tool);
            let c = ctx(root.path());
            async move { tool.call(args, &c).await.expect("tool call") }
        };
        let by_path = json!({ "path": path });
        let by_name = json!({ "abstract": abstract_name });
        let out = call("closed__unix", by_path.clone()).await;
        assert_refused(&format!("{label}: closed, the socket"), &out);
        let out = call("closed__unix", by_name.clone()).await;
        assert_refused(&format!("{label}: closed, the abstract socket"), &out);
        let out = call("listed__unix", by_path).await;
        assert_eq!(out, format!("read: {GREETING}"), "{label}: listed");
        let out = call("listed__unix", by_name).await;
        if abi >= ABSTRACT_SCOPE_ABI {
            assert_refused(&format!("{label}: listed, the abstract socket"), &out);
        } else {
            eprintln!("Landlock ABI {abi}: abstract sockets are not scoped on this kernel");
            assert_eq!(out, format!("read: {ABSTRACT_GREETING}"), "{label}");
        }
        cancel.cancel();
    }
}

/// The agentd.toml of [`the_daemon_says_what_each_server_may_reach`]: server `bare` (sandboxed
/// unless `bare_unsandboxed`) and server `listed` with `unix_sockets = [listed…]`.
fn sockets_toml(script: &Path, bare_unsandboxed: bool, listed: &[&Path]) -> String {
    let listed: Vec<String> = listed
        .iter()
        .map(|p| format!("\"{}\"", p.display()))
        .collect();
    format!(
        "{}\n[mcp.servers.bare]\ncommand = \"python3\"\nargs = [\"{script}\"]\n{}\n\
         [mcp.servers.listed]\ncommand = \"python3\"\nargs = [\"{script}\"]\nunix_sockets = [{}]\n",
        agentd_toml("fake"),
        if bare_unsandboxed {
            "sandbox = false\n"
        } else {
            ""
        },
        listed.join(", "),
        script = script.display(),
    )
}

/// Ask the fake model to call `tool` on the socket at `path` for message `id`, and return the
/// tool's answer as the model saw it (inside the untrusted-content wrapper).
fn unix_call(d: &TestDaemon, fake: &FakeLlm, id: &str, tool: &str, path: &Path) -> String {
    fake.push(Reply::tool_calls(vec![(
        "c1",
        tool,
        json!({ "path": path }),
    )]));
    fake.push(Reply::text("done"));
    let before = fake.requests().len();
    fifo_write(
        d,
        &format!(r#"{{"id":"{id}","type":"user","text":"connect","sender":"max"}}"#),
    );
    let fin = wait_outcome(d, "max", id);
    assert_eq!(fin["text"], "done", "{fin}");
    let reqs = fake.requests();
    let messages = reqs[before + 1]["messages"].as_array().unwrap();
    let result = messages
        .iter()
        .rev()
        .flat_map(|m| m["content"].as_array().into_iter().flatten())
        .find(|b| b["type"] == "tool_result")
        .unwrap_or_else(|| panic!("no tool result in {messages:?}"));
    result["content"].as_str().unwrap().to_string()
}

/// The greeting as `tool`'s answer reaches the model.
fn greeted(tool: &str) -> String {
    agentd::tools::untrusted::wrap(tool, &format!("read: {GREETING}"))
}

/// How many log lines contain every one of `needles`.
fn log_lines(d: &TestDaemon, needles: &[&str]) -> usize {
    d.log()
        .lines()
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .count()
}

/// Through the real daemon: a sandboxed server reaches no socket, and after a reload that sets
/// `sandbox = false` it is restarted, the log warns that it runs unsandboxed, and it reads the
/// greeting; the listed server reads it all along, and the start log says whether the kernel
/// enforces its list. `doctor --json` warns about both (and about a listed socket that does
/// not exist).
#[test]
fn the_daemon_says_what_each_server_may_reach() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let sockets = tempfile::tempdir().unwrap();
    let path = sockets.path().join("agent.sock");
    greet_at(&path);
    let missing = sockets.path().join("not-there.sock");
    let scripts = tempfile::tempdir().unwrap();
    let script = scripts.path().join("net.py");
    std::fs::write(&script, CONNECT_SERVER).unwrap();
    let mut d = TestDaemon::new(
        &sockets_toml(&script, false, &[&path, &missing]),
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    d.start();
    let abi = landlock_abi();
    let listed_line = if abi >= RESOLVE_UNIX_ABI {
        format!("unix_sockets is enforced (Landlock ABI {abi}): server listed")
    } else {
        format!(
            "unix_sockets is not enforced on this kernel (Landlock ABI {abi} < 9): server \
             listed can reach any Unix socket it can name"
        )
    };
    d.wait_log(&listed_line);
    let out = unix_call(&d, &fake, "m1", "listed__unix", &path);
    assert_eq!(out, greeted("listed__unix"));
    let out = unix_call(&d, &fake, "m2", "bare__unix", &path);
    assert!(
        out.contains("refused: [Errno 1]"),
        "bare, sandboxed: expected EPERM, got {out:?}"
    );
    let unsandboxed = "MCP server bare runs without the sandbox (sandbox = false)";
    assert!(!d.log().contains(unsandboxed), "{}", d.log());

    let ready = ["MCP server ready", "bare"];
    let readies = log_lines(&d, &ready);
    edit_config(&d, |_| sockets_toml(&script, true, &[&path, &missing]));
    let r = sighup(&d);
    assert_eq!(r["ok"], true, "{r}");
    d.wait_log(unsandboxed);
    d.wait_log("MCP server changed; restarted");
    wait_until(WAIT, "bare ready again after the reload", || {
        (log_lines(&d, &ready) > readies).then_some(())
    });
    let out = unix_call(&d, &fake, "m3", "bare__unix", &path);
    assert_eq!(out, greeted("bare__unix"));

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["doctor", "--json", "-c"])
        .arg(&d.config_path)
        .env("AGENTD_STATE_DIR", &d.state_dir)
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let checks = doc["checks"].as_array().unwrap();
    let named = |name: &str| {
        checks
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check {name:?} in {doc}"))
    };
    let bare = named("mcp bare sandbox");
    assert_eq!(bare["status"], "warn", "{bare}");
    assert!(
        bare["detail"].as_str().unwrap().contains(unsandboxed),
        "{bare}"
    );
    let listed = named("mcp listed unix_sockets");
    let expected = if abi >= RESOLVE_UNIX_ABI {
        "pass"
    } else {
        "warn"
    };
    assert_eq!(listed["status"], expected, "{listed}");
    assert!(
        listed["detail"].as_str().unwrap().contains(&listed_line),
        "{listed}"
    );
    let gone = named(&format!("mcp listed socket {}", missing.display()));
    assert_eq!(gone["status"], "warn", "{gone}");
    assert!(
        gone["detail"].as_str().unwrap().contains("does not exist"),
        "{gone}"
    );
    assert!(
        checks
            .iter()
            .all(|c| c["name"] != format!("mcp listed socket {}", path.display())),
        "the socket that exists is not reported: {doc}"
    );
    assert!(d.sigterm().success(), "{}", d.log());
}

/// `check-config` refuses the keys where they cannot apply or do not fit, each problem naming
/// the key, the value and the fix: a relative path, a path with `..`, too many paths,
/// `unix_sockets` or `network = false` with `sandbox = false`, and either key on a `url`
/// server.
#[test]
fn check_config_refuses_bad_sandbox_keys() {
    let many: Vec<String> = (0..33).map(|i| format!("\"/run/s{i}.sock\"")).collect();
    let toml = format!(
        "{}\n[mcp.servers.relative]\ncommand = \"srv\"\nunix_sockets = [\"run/agent.sock\"]\n\
         [mcp.servers.dotdot]\ncommand = \"srv\"\nunix_sockets = [\"/run/../etc/agent.sock\"]\n\
         [mcp.servers.many]\ncommand = \"srv\"\nunix_sockets = [{}]\n\
         [mcp.servers.both]\ncommand = \"srv\"\nsandbox = false\nunix_sockets = [\"/run/a.sock\"]\n\
         network = false\n\
         [mcp.servers.remote]\nurl = \"https://mcp.example.org/mcp\"\nsandbox = false\n\
         unix_sockets = [\"/run/a.sock\"]\n",
        agentd_toml("fake"),
        many.join(", ")
    );
    let d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("openai", "http://127.0.0.1:9/v1"))],
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["check-config", "-c"])
        .arg(&d.config_path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    for expected in [
        "mcp.servers.relative.unix_sockets[0]: \"run/agent.sock\" must be an absolute path \
         without `..`; write the full path",
        "mcp.servers.dotdot.unix_sockets[0]: \"/run/../etc/agent.sock\" must be an absolute path",
        "mcp.servers.many.unix_sockets: 33 paths, over the limit of 32",
        "mcp.servers.both.unix_sockets: has no effect with sandbox = false",
        "mcp.servers.both.network: false has no effect with sandbox = false",
        "mcp.servers.remote.sandbox: only valid with command",
        "mcp.servers.remote.unix_sockets: only valid with command",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
}
