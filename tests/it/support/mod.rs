//! Test support: a fake LLM server speaking the real wire formats, the launcher for the real
//! binaries, the shared end-to-end helpers (`e2e`), and small polling helpers.

// Not every test module uses every helper.
#![allow(dead_code)]

pub mod daemon;
pub mod e2e;
pub mod fake_audio;
pub mod fake_embed;
pub mod fake_llm;
pub mod fake_telegram;
pub mod provider_spec;

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
