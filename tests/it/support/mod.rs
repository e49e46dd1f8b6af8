//! Test support: a fake LLM server speaking the real wire formats, the launcher for the real
//! binaries, the shared end-to-end helpers (`e2e`), and small polling helpers.

// Not every test module uses every helper.
#![allow(dead_code)]

pub mod audio_files;
pub mod daemon;
pub mod e2e;
pub mod fake_audio;
pub mod fake_embed;
pub mod fake_llm;
pub mod fake_telegram;
pub mod fault_proxy;
pub mod llama;
pub mod provider_spec;
pub mod synapse;

use std::time::{Duration, Instant};

/// A loopback port that was free a moment ago (bound, read, released): for a daemon's HTTP
/// listener in a test.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("cannot bind 127.0.0.1:0")
        .local_addr()
        .expect("listener has no address")
        .port()
}

/// The status of `GET <path>` on 127.0.0.1:`port` (HTTP/1.1, no client library), or `None`
/// while nothing answers there: for a peer's health check while it starts.
pub fn get_status(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split(' ').nth(1)?.parse().ok()
}

/// Polls `f` every 20 ms until it returns `Some`, for at most `timeout`; panics naming `what`.
/// Blocking: call it from `#[test]` functions or multi-threaded tokio tests.
pub fn wait_until<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Installs `part` of the real test peers (`scripts/install-test-peers.sh`: `mcp`, `sdk`,
/// `metrics`, `llama`, `clients`, `a2a`, `synapse`, …) once per target dir and returns the peers' directory; panics naming `needs`
/// (what the install needs) when it fails. Installs run one at a time: they share the
/// directory.
pub fn test_peers(part: &str, needs: &str) -> std::path::PathBuf {
    static DONE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let dest = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("test-peers");
    let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
    if !done.iter().any(|p| p == part) {
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-test-peers.sh");
        let out = std::process::Command::new("bash")
            .arg(&script)
            .arg(&dest)
            .arg(part)
            .output()
            .expect("run scripts/install-test-peers.sh");
        assert!(
            out.status.success(),
            "installing the test peers' part {part} failed (needs {needs}):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        done.push(part.to_string());
    }
    dest
}
