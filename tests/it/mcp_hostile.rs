//! Hostile MCP servers against the real daemon (issue 30, items 1–4, 16, 17): credentials in a
//! server's URL never shown, floods of requests, notifications and stderr bounded in memory,
//! log size and CPU, at most one process tree per server and none left after the daemon,
//! oversized and deeply nested tool definitions refused one by one.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, fifo_write, provider_toml, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};
use crate::support::{free_port, wait_until};

/// `wait_until` at a pace the status rate limit allows (60 a minute).
fn poll_slowly<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let mut last = Instant::now() - Duration::from_secs(1);
    wait_until(timeout, what, || {
        if last.elapsed() < Duration::from_millis(1100) {
            return None;
        }
        last = Instant::now();
        f()
    })
}

/// A stdio MCP server that misbehaves as told. After the handshake (initialize, tools/list):
/// `--ping-flood` sends `ping` requests as fast as it can (with `--no-read` it never reads
/// stdin again, so the answers pile up in front of it); `--notify-flood` sends logging
/// notifications; `--stderr-flood` writes lines to stderr. Tool lists: `--huge` adds one tool
/// with a 10 MB schema string; `--many-big` adds 500 tools with 20 KB descriptions; `--deep N`
/// adds a tool whose schema nests N levels. `--tag T` only marks the command line. Every list
/// has the tool `ok`. `--after S` delays the flood by S seconds. `--linger`: stay after stdin closes (a server that does not notice the
/// daemon went away).
pub const HOSTILE_SERVER: &str = r#"
import json, os, sys, threading, time
args = sys.argv[1:]
def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default
def tool(name, desc="a tool", schema=None):
    return {"name": name, "description": desc, "inputSchema": schema or {"type": "object", "properties": {}}}
TOOLS = [tool("ok")]
if "--huge" in args:
    TOOLS.append(tool("huge", "huge", {"type": "object", "properties": {"x": {"type": "string", "description": "x" * 10_000_000}}}))
if "--many-big" in args:
    TOOLS += [tool("big%03d" % i, "d" * 20_000) for i in range(500)]
if "--deep" in args:
    s = {"type": "string"}
    for _ in range(int(opt("--deep"))):
        s = {"type": "object", "properties": {"a": s}}
    TOOLS.append(tool("deep", "deep", s))
out = sys.stdout.buffer
lock = threading.Lock()
def send(obj):
    data = (json.dumps(obj) + "\n").encode()
    with lock:
        out.write(data); out.flush()
def flood():
    time.sleep(float(opt("--after", "0")))
    if "--stderr-flood" in args:
        line = b"stderr flood line from a hostile server " + b"x" * 60 + b"\n"
        while True:
            sys.stderr.buffer.write(line * 64); sys.stderr.buffer.flush()
    n = 0
    batch = []
    while True:
        n += 1
        if "--ping-flood" in args:
            batch.append(json.dumps({"jsonrpc": "2.0", "id": "p%d" % n, "method": "ping"}))
        else:
            batch.append(json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "notification %d" % n}}))
        if len(batch) >= 64:
            data = ("\n".join(batch) + "\n").encode()
            batch = []
            with lock:
                out.write(data); out.flush()
flooding = any(a in args for a in ("--ping-flood", "--notify-flood", "--stderr-flood"))
for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    msg = json.loads(line)
    mid = msg.get("id"); method = msg.get("method")
    if method == "notifications/initialized" and flooding:
        threading.Thread(target=flood, daemon=True).start()
        if "--no-read" in args:
            while True:
                time.sleep(3600)
    if mid is None or method is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": msg["params"].get("protocolVersion", "2025-06-18"), "capabilities": {"tools": {}}, "serverInfo": {"name": "hostile", "version": "0.1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": "called"}], "isError": False}})
    elif method == "ping":
        send({"jsonrpc": "2.0", "id": mid, "result": {}})
    else:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no such method"}})
if "--linger" in args:
    while True:
        time.sleep(3600)
"#;

fn write_server(dir: &Path) -> String {
    let path = dir.join("hostile.py");
    std::fs::write(&path, HOSTILE_SERVER).expect("write hostile.py");
    path.display().to_string()
}

/// `[mcp.servers.<name>]` running the hostile server with `args` (and `--tag <name>-srv`).
fn stdio_server(name: &str, script: &str, args: &[&str]) -> String {
    let mut all = vec![format!("{script:?}")];
    all.extend(args.iter().map(|a| format!("{a:?}")));
    all.push(format!("\"--tag\", \"{name}-srv\""));
    format!(
        "\n[mcp.servers.{name}]\ncommand = \"python3\"\nargs = [{}]\ntimeout_seconds = 10\n",
        all.join(", ")
    )
}

/// Processes (anywhere on the machine) whose command line contains `needle`, with their
/// parent pid.
fn processes_with(needle: &str) -> Vec<(i32, i32)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if !cmd.contains(needle) {
            continue;
        }
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() == Some(&"Z") {
            continue;
        }
        let ppid = fields.get(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        out.push((pid, ppid));
    }
    out
}

/// Process trees running `needle`: processes with the needle whose parent has none.
fn trees_of(needle: &str) -> usize {
    let procs = processes_with(needle);
    procs
        .iter()
        .filter(|(_, ppid)| !procs.iter().any(|(p, _)| p == ppid))
        .count()
}

/// Resident set size of `pid` in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // Fields after the command: state is 0, utime 11, stime 12.
    n(11) + n(12)
}

fn ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

fn get_json(url: &str, token: Option<&str>) -> (u16, String) {
    let client = crate::http_daemon::reqwest::blocking_client();
    let mut req = client.get(url.to_string());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    match req.send() {
        Ok(r) => {
            let status = r.status();
            (status, r.text().unwrap_or_default())
        }
        Err(e) => (0, format!("{e}")),
    }
}

/// Total size of the files in `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// The text of every file in `dir`.
fn dir_text(dir: &Path) -> String {
    let mut text = String::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        text.push_str(&String::from_utf8_lossy(
            &std::fs::read(e.path()).unwrap_or_default(),
        ));
    }
    text
}

const CANARIES: [&str; 4] = [
    "canaryuser",
    "CanaryPass4321",
    "CanaryPathKey0123456789abcdef",
    "CanaryQueryValue98765",
];

fn assert_no_canary(what: &str, text: &str) {
    for c in CANARIES {
        assert!(
            !text.contains(c),
            "{what} shows the canary {c:?}:\n{}",
            text.chars().take(4000).collect::<String>()
        );
    }
}

/// Item 1 and 17: a URL with a key in its userinfo, path and query appears in no output: the
/// public status (which carries no error text at all), the authenticated status, `doctor`,
/// `check-config`, `/metrics`, the monitor, the log.
#[test]
fn credentials_in_urls_are_never_shown() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let port = free_port();
    let closed = free_port();
    let secret_url = |path: &str| {
        format!(
            "http://canaryuser:CanaryPass4321@127.0.0.1:{closed}/{path}/CanaryPathKey0123456789abcdef?api_key=CanaryQueryValue98765&v=1"
        )
    };
    let toml = format!(
        "{}\n[logging]\nfile = true\n\n[http]\nenabled = true\nport = {port}\ncallback_url = \"{}\"\n\n[mcp.servers.remote]\nurl = \"{}\"\ntimeout_seconds = 2\n",
        agentd_toml("fake").replace("[logging]\nfile = false\n", ""),
        secret_url("hook"),
        secret_url("mcp"),
    );
    let mut d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    d.set_env("AGENTD_HTTP_TOKEN", "tok-123");
    d.start();
    let base = format!("http://127.0.0.1:{port}");

    // Wait until the server failed at least once (its error is known to the daemon).
    let authed = poll_slowly(
        Duration::from_secs(30),
        "the MCP server's first failure",
        || {
            let (code, body) = get_json(&format!("{base}/api/v1/status"), Some("tok-123"));
            let v: Value = serde_json::from_str(&body).ok()?;
            (code == 200 && v["mcp"]["remote"]["last_error"].is_string()).then_some(body)
        },
    );
    assert_no_canary("the authenticated status", &authed);

    let (code, public) = get_json(&format!("{base}/api/v1/status"), None);
    assert_eq!(code, 200, "{public}");
    assert_no_canary("the public status", &public);
    let v: Value = serde_json::from_str(&public).expect("status JSON");
    assert!(v["mcp"]["remote"]["state"].as_str().is_some(), "{v}");
    for free_text in ["last_error", "refused", "skipped", "error", "reason"] {
        assert!(
            !public.contains(&format!("\"{free_text}\"")),
            "the public status carries free-form text ({free_text}): {public}"
        );
    }

    let (_, metrics) = get_json(&format!("{base}/metrics"), Some("tok-123"));
    assert_no_canary("/metrics", &metrics);
    let (_, monitor) = get_json(&format!("{base}/api/v1/monitor"), Some("tok-123"));
    assert_no_canary("the monitor", &monitor);
    assert_no_canary(
        "monitor.json",
        &std::fs::read_to_string(d.state_dir.join("monitor.json")).unwrap_or_default(),
    );

    for args in [
        &["doctor"][..],
        &["check-config"],
        &["check-config", "--diff"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
            .args(args)
            .arg("-c")
            .arg(&d.config_path)
            .env("AGENTD_STATE_DIR", &d.state_dir)
            .env("AGENTD_HTTP_TOKEN", "tok-123")
            .output()
            .expect("run agentd");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if args[0] != "check-config" || args.len() == 1 {
            assert!(
                text.contains("127.0.0.1"),
                "{args:?} shows the URL's host: {text}"
            );
        }
        assert_no_canary(&format!("agentd {args:?}"), &text);
    }

    d.sigterm();
    assert!(d.log().contains("remote"), "{}", d.log());
    assert_no_canary("the daemon's stderr", &d.log());
    assert_no_canary("the log files", &dir_text(&d.state_dir.join("logs")));
}

/// Items 2 and 3: four hostile servers flood at once for 60 s — pings read and answered, pings
/// whose answers are never read, logging notifications, stderr lines. The daemon's RSS stays
/// within a fixed bound over idle, its CPU under a fixed share, the log grows by at most about
/// 1 MB a minute per server, each server has at most one process tree at every sample, and a
/// message is still answered.
#[test]
fn floods_from_mcp_servers_are_bounded() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let dir = tempfile::tempdir().unwrap();
    let script = write_server(dir.path());
    let mut servers = String::new();
    // The floods start 5 s after the handshake, so the idle figures are taken before them.
    let floods: [(&str, &[&str]); 4] = [
        ("pings", &["--ping-flood", "--after", "5"]),
        ("deaf", &["--ping-flood", "--no-read", "--after", "5"]),
        ("notes", &["--notify-flood", "--after", "5"]),
        ("noisy", &["--stderr-flood", "--after", "5"]),
    ];
    for (name, args) in floods {
        servers.push_str(&stdio_server(name, &script, args));
    }
    let toml = format!(
        "{}\n[logging]\nfile = true\n{servers}",
        agentd_toml("fake").replace("[logging]\nfile = false\n", "")
    );
    let mut d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    d.set_env("AGENTD_LOG", "info");
    d.start();
    let pid = d.pid().expect("daemon pid");
    std::thread::sleep(Duration::from_secs(2));
    let logs = d.state_dir.join("logs");
    let idle_rss = rss_kib(pid);
    let log_before = dir_bytes(&logs);
    let text_before = dir_text(&logs).len();
    std::thread::sleep(Duration::from_secs(3));
    let cpu_before = cpu_ticks(pid);
    let started = Instant::now();
    let mut max_rss = idle_rss;
    let mut max_trees: BTreeMap<&str, usize> = BTreeMap::new();
    while started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
        max_rss = max_rss.max(rss_kib(pid));
        for (name, _) in floods {
            let trees = trees_of(&format!("{name}-srv"));
            let m = max_trees.entry(name).or_default();
            *m = (*m).max(trees);
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = (cpu_ticks(pid) - cpu_before) as f64 / ticks_per_second() as f64 / elapsed;
    let log_growth = dir_bytes(&logs).saturating_sub(log_before);
    let all_text = dir_text(&logs);
    let log_text = all_text.get(text_before..).unwrap_or(&all_text);
    let per_server: Vec<(&str, usize)> = floods
        .iter()
        .map(|(name, _)| {
            let mine = format!("server={name}");
            let bytes = log_text
                .lines()
                .filter(|l| l.contains(&mine))
                .map(|l| l.len() + 1)
                .sum();
            (*name, bytes)
        })
        .collect();
    eprintln!(
        "mcp floods over {elapsed:.0} s: RSS idle {idle_rss} KiB, max {max_rss} KiB (+{} KiB); \
         CPU {:.1}% of one core; log +{log_growth} B ({per_server:?}); trees per server \
         {max_trees:?}",
        max_rss - idle_rss,
        cpu * 100.0
    );

    // A message still gets through while they flood.
    fake.push(Reply::text("still here"));
    fifo_write(
        &d,
        r#"{"id":"fl1","type":"user","text":"hello","sender":"max"}"#,
    );
    let fin = wait_outcome(&d, "max", "fl1");
    assert_eq!(fin["text"], "still here", "{fin}");

    assert!(
        max_rss - idle_rss < 64 * 1024,
        "RSS grew from {idle_rss} KiB to {max_rss} KiB under the floods"
    );
    assert!(cpu < 0.5, "the daemon used {:.0}% of a core", cpu * 100.0);
    for (name, bytes) in &per_server {
        assert!(
            *bytes < 2 * 1024 * 1024,
            "server {name} wrote {bytes} B of log in a minute"
        );
    }
    assert!(
        log_growth < 8 * 1024 * 1024,
        "the log grew by {log_growth} B in a minute"
    );
    assert!(
        log_text.contains("suppressed"),
        "no summary of suppressed lines in the log"
    );
    for (name, trees) in &max_trees {
        assert!(
            *trees <= 1,
            "server {name} ran {trees} process trees at once"
        );
    }
}

/// Item 2: no MCP process outlives the daemon, whether it stops gracefully or is killed.
#[test]
fn no_mcp_process_survives_the_daemon() {
    for how in ["sigterm", "sigkill"] {
        let fake = FakeLlm::spawn(Wire::Anthropic);
        let dir = tempfile::tempdir().unwrap();
        let script = write_server(dir.path());
        let tag = format!("survivor-{how}-{}", std::process::id());
        let toml = format!(
            "{}{}",
            agentd_toml("fake"),
            stdio_server(&tag, &script, &["--linger"])
        );
        let mut d = TestDaemon::new(
            &toml,
            &[("fake", &provider_toml("anthropic", &fake.base_url()))],
        );
        d.start();
        wait_until(Duration::from_secs(20), "the MCP server running", || {
            (trees_of(&format!("{tag}-srv")) == 1).then_some(())
        });
        match how {
            "sigterm" => {
                d.sigterm();
            }
            _ => d.kill9(),
        }
        let gone = (0..150).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            processes_with(&format!("{tag}-srv")).is_empty()
        });
        let left = processes_with(&format!("{tag}-srv"));
        for (pid, _) in &left {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        assert!(
            gone,
            "after {how}, MCP processes survive the daemon: {left:?}"
        );
    }
}

/// Items 4 and 16: a tool with a 10 MB schema, 500 tools with 20 KB descriptions and a schema
/// nested 100 deep are refused one by one and shown as refused; the server's sound tools are
/// offered; "hello" in a fresh session is answered, and the tool block stays below a fixed
/// share of the model's window.
#[test]
fn oversized_and_deep_tools_are_refused_one_by_one() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.push(Reply::text("hello back"));
    let dir = tempfile::tempdir().unwrap();
    let script = write_server(dir.path());
    let port = free_port();
    let servers = [
        stdio_server("huge", &script, &["--huge"]),
        stdio_server("many", &script, &["--many-big"]),
        stdio_server("deep", &script, &["--deep", "100"]),
    ]
    .concat();
    let provider = provider_toml("anthropic", &fake.base_url()).replace(
        "max_tokens = 1024",
        "max_tokens = 1024\ncontext_window = 32000",
    );
    let toml = format!(
        "{}\n[http]\nenabled = true\nport = {port}\n{servers}",
        agentd_toml("fake")
    );
    let mut d = TestDaemon::new(&toml, &[("fake", &provider)]);
    d.set_env("AGENTD_HTTP_TOKEN", "tok-123");
    d.start();
    let status: Value = poll_slowly(Duration::from_secs(60), "all three servers ready", || {
        let (_, body) = get_json(
            &format!("http://127.0.0.1:{port}/api/v1/status"),
            Some("tok-123"),
        );
        let v: Value = serde_json::from_str(&body).ok()?;
        ["huge", "many", "deep"]
            .iter()
            .all(|s| v["mcp"][s]["state"] == "ready")
            .then_some(v)
    });
    let refused = |server: &str| -> Vec<String> {
        status["mcp"][server]["refused"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| r["remote"].as_str().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let short = |server: &str| {
        let mut s = status["mcp"][server].to_string();
        s.truncate(600);
        s
    };
    assert!(
        refused("huge").contains(&"huge".to_string()),
        "{}",
        short("huge")
    );
    assert!(
        refused("deep").contains(&"deep".to_string()),
        "{}",
        short("deep")
    );
    // 501 listed: the first 500 are taken (`MAX_TOOLS_PER_SERVER`), `ok` and 499 refused.
    assert_eq!(refused("many").len(), 499, "{}", short("many"));
    for server in ["huge", "many", "deep"] {
        assert_eq!(
            status["mcp"][server]["tools"],
            1,
            "server {server} offers its sound tool: {}",
            short(server)
        );
    }

    crate::support::e2e::wait_mcp_tools(&d);
    fifo_write(
        &d,
        r#"{"id":"big1","type":"user","text":"hello","sender":"fresh"}"#,
    );
    let fin = wait_outcome(&d, "fresh", "big1");
    assert_eq!(fin["text"], "hello back", "{fin}");
    let req = &fake.requests()[0];
    let tools = req["tools"].as_array().expect("tools");
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    for ok in ["huge__ok", "deep__ok", "many__ok"] {
        assert!(names.contains(&ok), "{ok} offered: {names:?}");
    }
    assert!(!names.contains(&"huge__huge") && !names.contains(&"deep__deep"));
    let block = serde_json::to_string(&req["tools"]).unwrap().len();
    eprintln!("tool block: {} tools, {block} bytes", tools.len());
    // A quarter of a 32,000-token window, at 4 bytes a token (JSON punctuation aside).
    assert!(
        block <= 32_000 + 4 * tools.len() * 16,
        "tool block of {block} bytes"
    );
}
