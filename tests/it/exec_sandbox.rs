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
        scratch_dir: std::env::temp_dir(),
        subagent_deny: vec![],
        subagent_model: "subagent".into(),
        web_search_provider: "brave".into(),
        web_search_base_url: String::new(),
        web_fetch_max_bytes: 0,
        web_fetch_allow_hosts: vec![],
        max_scheduled: 0,
        max_delay: Duration::from_secs(1),
        max_parallel_calls: 8,
        writable_context: vec![],
        web_search_key: None,
    }
}

fn ctx(ws: &Path, allowed: Vec<PathBuf>) -> ToolContext {
    ToolContext {
        session_id: "s1".into(),
        session_key: "test".into(),
        workspace: ws.to_path_buf(),
        allowed_paths: allowed,
        protected: Default::default(),
        reply_to: None,
        status: Arc::new(NoStatus),
        sees_images: false,
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
}

/// Issue #12 finding 5 (SPEC §16.8): an allowed path that contains the state and config
/// directories (the README's state directory under `/tmp`, with `/tmp` allowed) is split
/// around them. exec runs, works in the workspace, and still cannot read `config/.env` or the
/// state directory, nor write there — on every isolation path. Through the tool, too (it used
/// to refuse every command).
#[tokio::test]
async fn allowed_parent_of_state_and_config_is_split_around_them() {
    let root = tempfile::tempdir().unwrap();
    let root_path = std::fs::canonicalize(root.path()).unwrap();
    let (ws, state, config) = (
        root_path.join("workspace"),
        root_path.join("state"),
        root_path.join("config"),
    );
    for dir in [&ws, &state, &config] {
        std::fs::create_dir(dir).unwrap();
    }
    std::fs::write(config.join(".env"), "AGENTD_X=env-secret-9\n").unwrap();
    std::fs::write(state.join("agentd.db"), "state-secret-9").unwrap();
    let protected = vec![state.clone(), config.clone()];
    let cmd = format!(
        "echo in > inside.txt && echo WROTE-INSIDE; cat {c}/.env || echo ENV-DENIED; \
         cat {s}/agentd.db || echo STATE-DENIED; echo x > {s}/x || echo STATE-WRITE-DENIED; \
         echo x > {c}/agentd.toml || echo CONFIG-WRITE-DENIED; ls {s} || echo LIST-DENIED",
        c = config.display(),
        s = state.display()
    );
    let expected = [
        "WROTE-INSIDE",
        "ENV-DENIED",
        "STATE-DENIED",
        "STATE-WRITE-DENIED",
        "CONFIG-WRITE-DENIED",
        "LIST-DENIED",
    ];
    let check = |label: &str, text: &str| {
        for e in expected {
            assert!(text.contains(e), "{label}: missing {e}:\n{text}");
        }
        assert!(!text.contains("env-secret-9"), "{label}: {text}");
        assert!(!text.contains("state-secret-9"), "{label}: {text}");
        assert!(!state.join("x").exists(), "{label}");
        assert!(!config.join("agentd.toml").exists(), "{label}");
    };
    for ns in [Ns::Full, Ns::NoMount, Ns::Off] {
        let mut p = Policy::build(
            SandboxMode::Landlock,
            false,
            std::slice::from_ref(&root_path),
            &protected,
            Duration::from_secs(20),
        )
        .unwrap();
        p.no_namespaces = ns == Ns::Off;
        p.no_mount_namespace = ns == Ns::NoMount;
        let out = run(&p, &ws, &cmd).await;
        assert_eq!(out.exit_code, Some(0), "{ns:?}: {out:?}");
        check(&format!("{ns:?}"), &out.stdout);
        std::fs::remove_file(ws.join("inside.txt")).unwrap();
    }
    let tool =
        ExecTool::new(&tools_cfg(ExecSandbox::Landlock), protected.clone()).with_helper(helper());
    let out = tool
        .call(
            serde_json::json!({ "command": cmd }),
            &ctx(&ws, vec![root_path.clone()]),
        )
        .await
        .unwrap();
    assert!(out.starts_with("exit code 0\n"), "{out}");
    check("tool", &out);
}

/// SPEC §16.8: `TMPDIR` is the scratch directory, and where a mount namespace is available
/// the command's `/tmp` is private and empty: a file it writes there never appears in the
/// host's `/tmp`, while the workspace and the scratch directory (both under `/tmp` here) stay
/// at their paths.
#[tokio::test]
async fn tmpdir_is_the_scratch_dir_and_tmp_is_private_with_a_mount_namespace() {
    let ws = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let scratch_path = std::fs::canonicalize(scratch.path()).unwrap();
    let mut cfg = tools_cfg(ExecSandbox::Landlock);
    cfg.scratch_dir = scratch_path.clone();
    let tool = ExecTool::new(&cfg, vec![]).with_helper(helper());
    let marker = format!("agentd-private-tmp-{}", std::process::id());
    let cmd = format!(
        "echo TMPDIR=$TMPDIR; echo s > \"$TMPDIR/scratch.txt\" && echo SCRATCH-OK; \
         echo w > inside.txt && echo WS-OK; echo leak > /tmp/{marker} && echo TMP-WRITTEN; \
         ls -A /tmp"
    );
    let c = ctx(ws.path(), vec![ws.path().into(), scratch_path.clone()]);
    let out = tool
        .call(serde_json::json!({ "command": cmd }), &c)
        .await
        .unwrap();
    assert!(out.starts_with("exit code 0\n"), "{out}");
    assert!(
        out.contains(&format!("TMPDIR={}", scratch_path.display())),
        "{out}"
    );
    assert!(out.contains("SCRATCH-OK") && out.contains("WS-OK"), "{out}");
    assert!(scratch_path.join("scratch.txt").exists());
    assert!(ws.path().join("inside.txt").exists());
    if namespaces_available(ws.path()).await {
        // The namespace path (development machine, CI): /tmp is a private tmpfs.
        assert!(out.contains("TMP-WRITTEN"), "{out}");
        assert!(
            !Path::new("/tmp").join(&marker).exists(),
            "a file written to the sandbox's /tmp appeared on the host"
        );
    } else {
        // Without namespaces the host /tmp is not an allowed path: the write fails.
        assert!(!out.contains("TMP-WRITTEN"), "{out}");
    }
    let _ = std::fs::remove_file(Path::new("/tmp").join(&marker));
}

/// (d) No network: TCP connect to a local listener and a UDP datagram to a local socket fail
/// on every path, also on the subreaper fallback without a network namespace (issue 12 #6).
#[tokio::test]
async fn network_is_off_unless_allowed() {
    let ws = tempfile::tempdir().unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp_port = tcp.local_addr().unwrap().port();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    // A datagram to loopback is queued before `sendto` returns, so whatever got through is
    // there once the command has exited.
    let datagrams = || {
        let mut n = 0;
        while udp.recv(&mut [0u8; 64]).is_ok() {
            n += 1;
        }
        n
    };
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
        assert!(text.contains("UDP-FAILED"), "{mode:?}/{ns:?}: {text}");
        assert_eq!(
            datagrams(),
            0,
            "{mode:?}/{ns:?}: a UDP datagram got out: {text}"
        );
    }
    // With the network allowed the same connect and send work (the test can tell the
    // difference), on the fallback too.
    for ns in [Ns::Full, Ns::Off] {
        let mut p = policy(
            ws.path(),
            SandboxMode::Landlock,
            ns,
            Duration::from_secs(20),
        );
        p.network = true;
        let out = run(&p, ws.path(), &cmd).await;
        assert!(out.stdout.contains("TCP-CONNECTED"), "{ns:?}: {out:?}");
        assert!(out.stdout.contains("UDP-SENT"), "{ns:?}: {out:?}");
        assert_eq!(datagrams(), 1, "{ns:?}");
        let mut accepted = tcp.accept().unwrap().0;
        let _ = accepted.read(&mut [0u8; 1]);
    }
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

/// A Python probe that tries every way to a Unix socket outside the sandbox: a pathname stream
/// socket, an abstract one, a datagram socket by path, and a datagram `socketpair` re-aimed at
/// that path with `sendto`. A stream `socketpair` (no address, nothing outside) must keep
/// working. Prints `<LABEL>-REACHED` or `<LABEL>-FAILED <error>` per attempt.
const UNIX_PROBE: &str = r#"
import socket, sys
path, abstract, dgram = sys.argv[1], sys.argv[2], sys.argv[3]
def attempt(label, f):
    try:
        f()
        print(label + "-REACHED", flush=True)
    except OSError as e:
        print(label + "-FAILED " + str(e), flush=True)
def stream(addr, flags=0):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | flags)
    s.settimeout(3)
    s.connect(addr)
def dgram_send():
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"leak", dgram)
def pair_dgram():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"leak", dgram)
def pair_stream():
    a, b = socket.socketpair()
    a.sendall(b"x")
    assert b.recv(1) == b"x"
attempt("PATH", lambda: stream(path))
attempt("PATH-CLOEXEC", lambda: stream(path, socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK))
attempt("ABSTRACT", lambda: stream("\0" + abstract))
attempt("DGRAM", dgram_send)
attempt("PAIR-DGRAM", pair_dgram)
attempt("PAIR-STREAM", pair_stream)
"#;

/// Unix sockets outside the sandbox that count what reaches them.
struct UnixTargets {
    _dir: tempfile::TempDir,
    path: PathBuf,
    stream: std::os::unix::net::UnixListener,
    abstract_name: String,
    abstract_listener: std::os::unix::net::UnixListener,
    dgram_path: PathBuf,
    dgram: std::os::unix::net::UnixDatagram,
}

impl UnixTargets {
    fn new(tag: &str) -> UnixTargets {
        use std::os::linux::net::SocketAddrExt as _;
        use std::os::unix::net::{SocketAddr, UnixDatagram, UnixListener};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outside.sock");
        let stream = UnixListener::bind(&path).unwrap();
        stream.set_nonblocking(true).unwrap();
        let abstract_name = format!("agentd-it-{tag}-{}", std::process::id());
        let abstract_listener = UnixListener::bind_addr(
            &SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap(),
        )
        .unwrap();
        abstract_listener.set_nonblocking(true).unwrap();
        let dgram_path = dir.path().join("outside.dgram");
        let dgram = UnixDatagram::bind(&dgram_path).unwrap();
        dgram.set_nonblocking(true).unwrap();
        UnixTargets {
            _dir: dir,
            path,
            stream,
            abstract_name,
            abstract_listener,
            dgram_path,
            dgram,
        }
    }

    /// The command that runs the probe (written into `ws`) against these sockets.
    fn command(&self, ws: &Path) -> String {
        std::fs::write(ws.join("unix_probe.py"), UNIX_PROBE).unwrap();
        format!(
            "/usr/bin/python3 unix_probe.py {} {} {}",
            self.path.display(),
            self.abstract_name,
            self.dgram_path.display()
        )
    }

    /// Connections and datagrams that arrived since the last call (each is accepted or read).
    fn arrivals(&self) -> usize {
        let mut n = 0;
        while self.stream.accept().is_ok() {
            n += 1;
        }
        while self.abstract_listener.accept().is_ok() {
            n += 1;
        }
        while self.dgram.recv(&mut [0u8; 64]).is_ok() {
            n += 1;
        }
        n
    }
}

/// Assert that the probe ran, reached nothing, and that nothing arrived.
fn assert_no_unix_escape(label: &str, text: &str, targets: &UnixTargets) {
    assert!(text.contains("PAIR-STREAM-REACHED"), "{label}: {text}");
    for l in ["PATH", "PATH-CLOEXEC", "ABSTRACT", "DGRAM", "PAIR-DGRAM"] {
        assert!(
            text.contains(&format!("{l}-FAILED")),
            "{label}: {l}: {text}"
        );
    }
    assert_eq!(targets.arrivals(), 0, "{label}: reached a socket: {text}");
}

/// Issue 12 #1: whatever `exec_network` says, the command reaches no Unix socket outside the
/// sandbox, pathname or abstract, stream or datagram, on every isolation path.
#[tokio::test]
async fn unix_sockets_outside_the_sandbox_are_unreachable() {
    let targets = UnixTargets::new("paths");
    // The listeners work: a connection from here is counted.
    drop(std::os::unix::net::UnixStream::connect(&targets.path).unwrap());
    assert_eq!(targets.arrivals(), 1);
    for network in [false, true] {
        for (mode, ns) in VARIANTS {
            let ws = tempfile::tempdir().unwrap();
            let mut p = policy(ws.path(), mode, ns, Duration::from_secs(20));
            p.network = network;
            let out = run(&p, ws.path(), &targets.command(ws.path())).await;
            let text = format!("{}{}", out.stdout, out.stderr);
            let label = format!("{mode:?}/{ns:?}/network={network}");
            assert_eq!(out.exit_code, Some(0), "{label}: {text}");
            assert_no_unix_escape(&label, &text, &targets);
        }
    }
}

/// The same through the `exec` tool as the daemon runs it, with `exec_network = true`.
#[tokio::test]
async fn exec_tool_with_network_reaches_no_unix_socket() {
    let targets = UnixTargets::new("tool");
    let ws = tempfile::tempdir().unwrap();
    let mut cfg = tools_cfg(ExecSandbox::Landlock);
    cfg.exec_network = true;
    let tool = ExecTool::new(&cfg, vec![]).with_helper(helper());
    let c = ctx(ws.path(), vec![ws.path().into()]);
    let out = tool
        .call(
            serde_json::json!({ "command": targets.command(ws.path()) }),
            &c,
        )
        .await
        .unwrap();
    assert!(out.starts_with("exit code 0\n"), "{out}");
    assert_no_unix_escape("exec tool", &out, &targets);
}

/// `agentd doctor` against the test layout, with or without the fallback forced.
fn doctor_table(d: &crate::support::daemon::TestDaemon, force_fallback: bool) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentd"));
    cmd.args(["doctor", "-c"])
        .arg(&d.config_path)
        .env("AGENTD_STATE_DIR", &d.state_dir)
        .env_remove("AGENTD_SANDBOX_FALLBACK");
    if force_fallback {
        cmd.env("AGENTD_SANDBOX_FALLBACK", "1");
    }
    let out = cmd.output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `sandbox` line of a doctor table.
fn sandbox_line(table: &str) -> String {
    table
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("sandbox"))
        .unwrap_or_else(|| panic!("no sandbox line in:\n{table}"))
        .to_string()
}

/// Issue 12 #6: `agentd doctor` says which sandbox path exec takes (namespaces or the
/// subreaper fallback, whether a mount namespace gives a private /proc and /tmp, the Landlock
/// ABI, seccomp), and the daemon logs the same once at start.
#[test]
fn doctor_and_the_start_log_name_the_sandbox_path() {
    use crate::support::e2e::{agentd_toml, provider_toml};
    use crate::support::fake_llm::{FakeLlm, Wire};
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let mut d = crate::support::daemon::TestDaemon::new(
        &agentd_toml("fake"),
        &[("fake", &provider_toml("openai", &fake.base_url()))],
    );
    let line = sandbox_line(&doctor_table(&d, false));
    assert!(line.contains("Landlock ABI"), "{line}");
    assert!(line.contains("seccomp filter enforced"), "{line}");
    let ws = tempfile::tempdir().unwrap();
    let have_ns = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(namespaces_available(ws.path()));
    if have_ns {
        assert!(line.starts_with("PASS"), "{line}");
        assert!(line.contains("namespaces (user, PID, network"), "{line}");
    } else {
        assert!(line.contains("subreaper fallback"), "{line}");
    }

    let forced = sandbox_line(&doctor_table(&d, true));
    assert!(forced.starts_with("WARN"), "{forced}");
    assert!(forced.contains("subreaper fallback"), "{forced}");
    assert!(forced.contains("AGENTD_SANDBOX_FALLBACK"), "{forced}");
    assert!(forced.contains("no private /proc or /tmp"), "{forced}");

    d.set_env("AGENTD_SANDBOX_FALLBACK", "1");
    d.start();
    let logged =
        crate::support::wait_until(Duration::from_secs(30), "the sandbox log line", || {
            d.log()
                .lines()
                .find(|l| l.contains("exec sandbox:"))
                .map(str::to_string)
        });
    assert!(logged.contains("WARN"), "{logged}");
    assert!(logged.contains("subreaper fallback"), "{logged}");
    assert_eq!(d.log().matches("exec sandbox:").count(), 1, "{}", d.log());
}

/// Issue 12 #1 end to end: the fake model scripts an `exec` call of the probe, the daemon runs
/// with `exec_network = true` on the forced fallback (no namespaces at all), and no Unix
/// socket outside the allowed paths sees a connection.
#[test]
fn daemon_exec_on_the_fallback_reaches_no_unix_socket() {
    use crate::support::e2e::{agentd_toml, fifo_write, provider_toml, wait_outcome};
    use crate::support::fake_llm::{FakeLlm, Reply, Wire};
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let targets = UnixTargets::new("daemon");
    let toml = format!(
        "{}\n[tools]\nexec_network = true\n\n[tools.filesystem]\nallowed_paths = \
         [\"../workspace\"]\n",
        agentd_toml("fake")
    );
    let mut d = crate::support::daemon::TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    let command = targets.command(&d.workspace());
    fake.push(Reply::tool_calls(vec![(
        "u1",
        "exec",
        serde_json::json!({ "command": command }),
    )]));
    fake.push(Reply::text("done"));
    d.set_env("AGENTD_SANDBOX_FALLBACK", "1");
    d.start();
    fifo_write(
        &d,
        r#"{"id":"ux1","type":"user","text":"probe the sockets","sender":"sam"}"#,
    );
    wait_outcome(&d, "sam", "ux1");
    let reqs = fake.requests();
    let result = &reqs[1]["messages"][2]["content"][0];
    assert_eq!(result["tool_use_id"], "u1", "{result}");
    let text = result["content"].to_string().replace("\\n", "\n");
    assert!(text.contains("exit code 0"), "{text}");
    assert_no_unix_escape("daemon on the fallback", &text, &targets);
    d.wait_log("subreaper fallback");
}

/// Under the shipped units: their `SystemCallFilter=@system-service` refuses the `seccomp`
/// system call (EPERM) and `RestrictNamespaces=user pid net` the mount namespace. The helper,
/// started under such a filter, still installs its own (through prctl) and no Unix socket
/// outside is reachable, with the network on and off.
#[test]
fn unix_sockets_stay_unreachable_under_a_unit_like_filter() {
    use std::os::unix::process::CommandExt as _;
    let unit_like: seccompiler::BpfProgram = seccompiler::SeccompFilter::new(
        [(nix::libc::SYS_seccomp, Vec::new())].into_iter().collect(),
        seccompiler::SeccompAction::Allow,
        seccompiler::SeccompAction::Errno(nix::libc::EPERM as u32),
        std::env::consts::ARCH.try_into().unwrap(),
    )
    .unwrap()
    .try_into()
    .unwrap();
    let targets = UnixTargets::new("unit");
    for network in [false, true] {
        let ws = tempfile::tempdir().unwrap();
        let mut p = policy(
            ws.path(),
            SandboxMode::Landlock,
            Ns::NoMount,
            Duration::from_secs(20),
        );
        p.network = network;
        let command = targets.command(ws.path());
        let filter = unit_like.clone();
        let mut cmd = Command::new(helper());
        cmd.arg("sandbox-exec")
            .arg("--policy")
            .arg(serde_json::to_string(&p).unwrap())
            .args(["--", "/bin/sh", "-c", &command])
            .current_dir(ws.path())
            .env_clear()
            .env("PATH", "/usr/bin:/bin");
        // SAFETY: between fork and exec only prctl/seccomp calls on a prepared program.
        unsafe {
            cmd.pre_exec(move || seccompiler::apply_filter(&filter).map_err(std::io::Error::other));
        }
        let out = cmd.output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let label = format!("unit-like filter, network={network}");
        assert_eq!(out.status.code(), Some(0), "{label}: {text}");
        assert_no_unix_escape(&label, &text, &targets);
    }
}

/// The private `/tmp` never widens a grant (SPEC §16.8): Landlock's rules are hierarchical
/// across mounts, so whatever the helper binds back under the read-write tmpfs would inherit
/// its grant. A read-only grant under `/tmp` (an MCP server may read everything but the
/// protected directories) stays read-only, and a working directory that holds the config
/// directory is not brought back, so `.env` stays out of reach — on every isolation path.
#[tokio::test]
async fn private_tmp_keeps_read_only_grants_read_only() {
    let root = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(root.path()).unwrap();
    assert!(
        root.starts_with("/tmp"),
        "the test needs a directory under /tmp"
    );
    for d in ["ws", "data", "config", "private"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::write(root.join("data/file.txt"), "readable-data").unwrap();
    std::fs::write(root.join("config/.env"), "K=env-secret-77d1").unwrap();
    let r = root.display();
    let cmd = format!(
        "cat {r}/data/file.txt; echo; echo x > {r}/data/new && echo DATA-WRITTEN; \
         cat {r}/config/.env; echo y > {r}/ws/ok && echo WS-OK; \
         echo z > /tmp/agentd-fresh-$$ && echo TMP-OK"
    );
    for ns in [Ns::Full, Ns::NoMount, Ns::Off] {
        let mut p = Policy::for_mcp_server(
            SandboxMode::Landlock,
            false,
            &[root.join("ws")],
            &[root.join("config")],
            &root.join("private/srv"),
        )
        .unwrap();
        p.timeout_ms = 10_000;
        p.no_namespaces = ns == Ns::Off;
        p.no_mount_namespace = ns == Ns::NoMount;
        std::fs::create_dir_all(root.join("private/srv")).unwrap();
        // The working directory is the root that holds the config directory.
        let out = run(&p, &root, &cmd).await;
        let text = format!("{ns:?}: {}{}", out.stdout, out.stderr);
        assert!(text.contains("readable-data"), "{text}");
        assert!(text.contains("WS-OK"), "{text}");
        assert!(!text.contains("DATA-WRITTEN"), "{text}");
        assert!(!root.join("data/new").exists(), "{text}");
        assert!(!text.contains("env-secret-77d1"), "{text}");
    }
}

/// Issue "Security, third round", item 10: the system prompt's files stay unchanged on every
/// isolation path: read-only bind mounts with a mount namespace, the Landlock split without
/// one (or when a guarded file does not exist). The command still reads them and writes the
/// rest of the workspace; an opted-in file in the skills directory stays writable.
#[tokio::test]
async fn prompt_files_stay_read_only_on_every_isolation_path() {
    let root = tempfile::tempdir().unwrap();
    let ws = std::fs::canonicalize(root.path()).unwrap().join("ws");
    let (agents, skill, opted) = (
        ws.join("AGENTS.md"),
        ws.join("skills/example/SKILL.md"),
        ws.join("skills/mine/SKILL.md"),
    );
    for dir in ["skills/example", "skills/mine", "notes"] {
        std::fs::create_dir_all(ws.join(dir)).unwrap();
    }
    std::fs::write(&agents, "rules\n").unwrap();
    std::fs::write(&skill, "skill\n").unwrap();
    std::fs::write(&opted, "mine\n").unwrap();
    let attack = "cat AGENTS.md; echo X >> AGENTS.md; echo X >> skills/example/SKILL.md; \
                  rm -f AGENTS.md; mv skills/example skills/gone; mkdir skills/evil; \
                  echo X > IDENTITY.md; ln AGENTS.md notes/hard; \
                  echo note > notes/n.txt && echo WROTE-NOTE; \
                  echo more >> skills/mine/SKILL.md && echo WROTE-OPTED; \
                  ls | grep -q AGENTS.md && echo LISTED; true";
    let unchanged = |label: &str, identity_guarded: bool| {
        assert_eq!(
            std::fs::read_to_string(&agents).unwrap(),
            "rules\n",
            "{label}"
        );
        assert_eq!(
            std::fs::read_to_string(&skill).unwrap(),
            "skill\n",
            "{label}"
        );
        for p in ["skills/evil", "skills/gone", "notes/hard"] {
            assert!(!ws.join(p).exists(), "{label}: {p} appeared");
        }
        if identity_guarded {
            assert!(
                !ws.join("IDENTITY.md").exists(),
                "{label}: IDENTITY.md appeared"
            );
        }
        let _ = std::fs::remove_file(ws.join("IDENTITY.md"));
    };
    let cases = [
        // Every guarded file exists: bound read-only where a mount namespace exists.
        (Ns::Full, false),
        (Ns::NoMount, false),
        (Ns::Off, false),
        // IDENTITY.md is guarded but missing: the Landlock split on every path.
        (Ns::Full, true),
    ];
    for (ns, missing) in cases {
        let label = format!("{ns:?}, a guarded file missing: {missing}");
        let mut read_only = vec![agents.clone(), ws.join("skills")];
        if missing {
            read_only.push(ws.join("IDENTITY.md"));
        }
        let mut p = policy(&ws, SandboxMode::Landlock, ns, Duration::from_secs(20));
        p.keep_read_only(&read_only, std::slice::from_ref(&opted), &[]);
        let out = run(&p, &ws, attack).await;
        eprintln!("{label}: {out:?}");
        unchanged(&label, missing);
        assert!(
            out.stdout.starts_with("rules\n"),
            "{label}: still readable: {out:?}"
        );
        assert!(out.stdout.contains("WROTE-NOTE"), "{label}: {out:?}");
        assert!(out.stdout.contains("WROTE-OPTED"), "{label}: {out:?}");
        assert!(out.stdout.contains("LISTED"), "{label}: {out:?}");
        std::fs::write(&opted, "mine\n").unwrap();
        std::fs::remove_file(ws.join("notes/n.txt")).unwrap();
    }
    // Through the tool, as the daemon builds it.
    let prompt = agentd::tools::paths::PromptFiles {
        files: vec![agents.clone()],
        skills_dir: Some(ws.join("skills")),
        writable_skill_files: vec![opted.clone()],
    };
    let tool = ExecTool::new(&tools_cfg(ExecSandbox::Landlock), vec![])
        .with_helper(helper())
        .with_prompt_files(prompt);
    let out = tool
        .call(
            serde_json::json!({ "command": attack }),
            &ctx(&ws, vec![ws.clone()]),
        )
        .await
        .unwrap();
    unchanged("tool", false);
    assert!(
        out.contains("WROTE-NOTE") && out.contains("WROTE-OPTED"),
        "{out}"
    );
}
