//! The exec sandbox end to end through the real `agentd sandbox-exec` helper: no secret of the
//! daemon leaks, the whole process tree (also `setsid` grandchildren) dies on timeout, writes
//! stay inside the allowed paths, the state directory is unreadable, and the network is off.
//! Each scenario runs with namespaces and with the subreaper fallback forced.

use std::io::Read as _;
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentd::config::{ExecSandbox, ToolsConfig};
use agentd::sandbox::{ExecOutput, Policy, SandboxMode, run_sandboxed};
use agentd::tools::exec::ExecTool;
use agentd::tools::{SessionStatus, StatusSource, Tool, ToolContext};
use futures::future::BoxFuture;

const CANARY: &str = "sk-secret-canary";
const CHILD_FLAG: &str = "AGENTD_IT_EXEC_CANARY_CHILD";

/// The `agentd` binary (`AGENTD_SANDBOX_HELPER` overrides it, e.g. when several worktrees
/// share one target directory and `target/debug/agentd` may be another build).
fn helper() -> PathBuf {
    std::env::var_os("AGENTD_SANDBOX_HELPER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_agentd")))
}

/// Which isolation path the helper is made to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ns {
    /// User + PID + mount + network namespaces (private /proc).
    Full,
    /// No mount namespace, as under the systemd unit (`RestrictNamespaces=user pid net`).
    NoMount,
    /// The subreaper fallback (no namespaces).
    Off,
}

fn policy(ws: &Path, mode: SandboxMode, ns: Ns, timeout: Duration) -> Policy {
    let mut p = Policy::build(mode, false, &[ws.to_path_buf()], &[], timeout).unwrap();
    p.no_namespaces = ns == Ns::Off;
    p.no_mount_namespace = ns == Ns::NoMount;
    p
}

async fn run(p: &Policy, ws: &Path, cmd: &str) -> ExecOutput {
    run_sandboxed(&helper(), p, ws, cmd, 1 << 20).await.unwrap()
}

/// Whether namespaces work here (so the assertions that need them apply).
async fn namespaces_available(ws: &Path) -> bool {
    let p = policy(ws, SandboxMode::None, Ns::Full, Duration::from_secs(10));
    run(&p, ws, "echo $$").await.stdout.trim() == "2"
}

const VARIANTS: [(SandboxMode, Ns); 4] = [
    (SandboxMode::Landlock, Ns::Full),
    (SandboxMode::Landlock, Ns::NoMount),
    (SandboxMode::Landlock, Ns::Off),
    (SandboxMode::None, Ns::Full),
];

/// (a) Runs in a child copy of this test binary whose real (initial) environment holds the
/// secret, like the daemon's would; the child prints what the sandboxed commands saw.
#[test]
fn secret_in_daemon_environment_never_reaches_the_command() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "exec_sandbox::canary_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("AGENTD_ANTHROPIC_KEY", CANARY)
        .env(CHILD_FLAG, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("DAEMON-HAS-SECRET=true"), "{stdout}");
    assert_eq!(
        stdout.matches("SANDBOX-RAN").count(),
        VARIANTS.len(),
        "{stdout}"
    );
    assert!(
        stdout.contains("PATH=/usr/local/bin:/usr/bin:/bin"),
        "{stdout}"
    );
    assert!(!stdout.contains(CANARY), "secret leaked:\n{stdout}");
    assert!(!stderr.contains(CANARY), "secret leaked:\n{stderr}");
}

#[tokio::test]
#[ignore = "run by secret_in_daemon_environment_never_reaches_the_command"]
async fn canary_child() {
    if std::env::var_os(CHILD_FLAG).is_none() {
        return;
    }
    let environ = std::fs::read("/proc/self/environ").unwrap();
    let has = String::from_utf8_lossy(&environ).contains(CANARY);
    println!("DAEMON-HAS-SECRET={has}");
    let ws = tempfile::tempdir().unwrap();
    let me = std::process::id();
    let cmd = format!(
        "echo SANDBOX-RAN; env; cat /proc/$PPID/environ; cat /proc/1/environ; \
         cat /proc/{me}/environ; tr '\\0' '\\n' < /proc/*/environ; \
         for f in /proc/[0-9]*/environ; do cat \"$f\"; done; true"
    );
    for (mode, ns) in VARIANTS {
        let p = policy(ws.path(), mode, ns, Duration::from_secs(20));
        let out = run(&p, ws.path(), &cmd).await;
        println!(
            "--- {mode:?} isolation={ns:?}\n{}\n{}",
            out.stdout, out.stderr
        );
    }
}

/// Command lines of live processes whose arguments contain `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let path = entry.path();
        let Ok(cmdline) = std::fs::read(path.join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let zombie = std::fs::read_to_string(path.join("stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true);
        if cmdline.contains(marker) && !zombie {
            found.push(format!(
                "{}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}

/// (b) `setsid` grandchildren die with the tree on timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_the_whole_tree_including_setsid_grandchildren() {
    for (i, (mode, ns)) in VARIANTS.into_iter().enumerate() {
        let ws = tempfile::tempdir().unwrap();
        // A unique sleep argument identifies this test's processes in the host's /proc.
        let marker = format!("300.{}{i}", std::process::id());
        let cmd = format!(
            "setsid sh -c 'sleep {marker}' & setsid sh -c 'sleep {marker} & wait' & \
             echo started > started; sleep {marker}"
        );
        let p = policy(ws.path(), mode, ns, Duration::from_secs(3));
        let ws_path = ws.path().to_path_buf();
        let task = tokio::spawn(async move { run(&p, &ws_path, &cmd).await });
        let t0 = Instant::now();
        while !ws.path().join("started").exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "command never started"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let running = processes_with(&marker);
        assert!(
            running.len() >= 3,
            "{mode:?}/{ns:?}: expected the sleeps, got {running:?}"
        );
        let out = task.await.unwrap();
        assert!(out.timed_out, "{mode:?}/{ns:?}: {out:?}");
        assert_eq!(out.exit_code, None);
        let survivors = processes_with(&marker);
        assert!(
            survivors.is_empty(),
            "{mode:?}/{ns:?}: survivors {survivors:?}"
        );
    }
}

struct NoStatus;
impl StatusSource for NoStatus {
    fn session_status(&self) -> BoxFuture<'_, Result<SessionStatus, String>> {
        Box::pin(async { Err("none".to_string()) })
    }
}

fn tools_cfg(sandbox: ExecSandbox) -> ToolsConfig {
    ToolsConfig {
        enabled: None,
        exec_timeout: Duration::from_secs(20),
        exec_max_timeout: Duration::from_secs(60),
        exec_sandbox: sandbox,
        exec_network: false,
        allowed_paths: vec![],
        subagent_deny: vec![],
        subagent_model: "subagent".into(),
        web_search_provider: "brave".into(),
        web_search_base_url: String::new(),
        web_fetch_max_bytes: 0,
        web_fetch_allow_hosts: vec![],
        max_scheduled: 0,
        max_delay: Duration::from_secs(1),
        max_parallel_calls: 8,
        web_search_key: None,
    }
}

fn ctx(ws: &Path, allowed: Vec<PathBuf>) -> ToolContext {
    ToolContext {
        session_id: "s1".into(),
        session_key: "test".into(),
        workspace: ws.to_path_buf(),
        allowed_paths: allowed,
        status: Arc::new(NoStatus),
    }
}

/// (c) Through the `exec` tool: writes inside the allowed paths succeed, outside fail; the
/// state directory cannot be read; an allowed path containing it is refused.
#[tokio::test]
async fn filesystem_is_confined_to_the_allowed_paths() {
    let ws = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    std::fs::write(state.path().join("secret.txt"), "state-secret").unwrap();
    let tool = ExecTool::new(&tools_cfg(ExecSandbox::Landlock), vec![state.path().into()])
        .with_helper(helper());
    let c = ctx(ws.path(), vec![ws.path().into()]);
    let cmd = format!(
        "echo in > inside.txt && echo WROTE-INSIDE; echo out > {o}/outside.txt || echo \
         OUTSIDE-DENIED; cat {s}/secret.txt || echo STATE-DENIED; ls {s} || echo LIST-DENIED; \
         ls /usr/bin/env >/dev/null && echo READ-USR",
        o = outside.path().display(),
        s = state.path().display()
    );
    let out = tool
        .call(serde_json::json!({ "command": cmd }), &c)
        .await
        .unwrap();
    assert!(out.starts_with("exit code 0\n"), "{out}");
    for expected in [
        "WROTE-INSIDE",
        "OUTSIDE-DENIED",
        "STATE-DENIED",
        "LIST-DENIED",
        "READ-USR",
    ] {
        assert!(out.contains(expected), "missing {expected}:\n{out}");
    }
    assert!(!out.contains("state-secret"), "{out}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("inside.txt")).unwrap(),
        "in\n"
    );
    assert!(!outside.path().join("outside.txt").exists());

    let parent = state.path().parent().unwrap().to_path_buf();
    let refused = tool
        .call(
            serde_json::json!({ "command": "true" }),
            &ctx(ws.path(), vec![ws.path().into(), parent]),
        )
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("must not read"), "{refused}");
}

/// (d) No network: TCP connect to a local listener fails in both paths; UDP is blocked only
/// with the network namespace.
#[tokio::test]
async fn network_is_off_unless_allowed() {
    let ws = tempfile::tempdir().unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp_port = tcp.local_addr().unwrap().port();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    let have_ns = namespaces_available(ws.path()).await;
    let cmd = format!(
        "/usr/bin/python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", \
         {tcp_port}), timeout=3); print(\"TCP-CONNECTED\")' || echo TCP-FAILED; \
         /usr/bin/python3 -c 'import socket; s = socket.socket(socket.AF_INET, \
         socket.SOCK_DGRAM); s.sendto(b\"udp-leak\", (\"127.0.0.1\", {udp_port})); \
         print(\"UDP-SENT\")' || echo UDP-FAILED"
    );
    for (mode, ns) in VARIANTS {
        let p = policy(ws.path(), mode, ns, Duration::from_secs(20));
        let out = run(&p, ws.path(), &cmd).await;
        let text = format!("{}{}", out.stdout, out.stderr);
        assert!(text.contains("TCP-FAILED"), "{mode:?}/{ns:?}: {text}");
        assert!(!text.contains("TCP-CONNECTED"), "{mode:?}/{ns:?}: {text}");
        let mut buf = [0u8; 64];
        let received = udp.recv(&mut buf).is_ok();
        if have_ns && ns != Ns::Off {
            assert!(text.contains("UDP-FAILED"), "{mode:?}/{ns:?}: {text}");
            assert!(!received, "UDP datagram escaped the network namespace");
        } else {
            println!(
                "note: {mode:?} isolation={ns:?}: subreaper fallback, UDP is not blocked \
                 (datagram received: {received})"
            );
        }
    }
    // With the network allowed the same connect works (the test can tell the difference).
    let mut p = policy(
        ws.path(),
        SandboxMode::Landlock,
        Ns::Full,
        Duration::from_secs(20),
    );
    p.network = true;
    let out = run(&p, ws.path(), &cmd).await;
    assert!(out.stdout.contains("TCP-CONNECTED"), "{out:?}");
    let mut accepted = tcp.accept().unwrap().0;
    let _ = accepted.read(&mut [0u8; 1]);
}

/// (c) on every isolation path with Landlock: the same confinement as through the tool.
#[tokio::test]
async fn filesystem_confinement_holds_on_every_isolation_path() {
    let outside = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    std::fs::write(state.path().join("secret.txt"), "state-secret").unwrap();
    for ns in [Ns::Full, Ns::NoMount, Ns::Off] {
        let ws = tempfile::tempdir().unwrap();
        let p = policy(
            ws.path(),
            SandboxMode::Landlock,
            ns,
            Duration::from_secs(20),
        );
        let cmd = format!(
            "echo in > inside.txt && echo WROTE-INSIDE; echo out > {o}/x || echo \
             OUTSIDE-DENIED; cat {s}/secret.txt || echo STATE-DENIED; echo gone > /dev/null \
             && echo DEVNULL-OK",
            o = outside.path().display(),
            s = state.path().display()
        );
        let out = run(&p, ws.path(), &cmd).await;
        assert_eq!(out.exit_code, Some(0), "{ns:?}: {out:?}");
        for expected in [
            "WROTE-INSIDE",
            "OUTSIDE-DENIED",
            "STATE-DENIED",
            "DEVNULL-OK",
        ] {
            assert!(
                out.stdout.contains(expected),
                "{ns:?}: missing {expected}: {out:?}"
            );
        }
        assert!(!out.stdout.contains("state-secret"), "{ns:?}: {out:?}");
        assert!(ws.path().join("inside.txt").exists());
        assert!(!outside.path().join("x").exists(), "{ns:?}");
    }
}
