//! Outside input is validated and bounded (SPEC §16.9, issue #12): absurd usage figures from a
//! provider, a provider that never finishes, an oversized reply, and HTTP connections that
//! never send their headers. Each test drives the real daemon against the fake provider.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, provider_toml, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Usage, Wire};
use crate::support::{free_port, wait_until};

const WAIT: Duration = Duration::from_secs(30);
const TOKEN: &str = "limits-token";

/// `GET path` on 127.0.0.1:`port` over a fresh connection (`Connection: close`), with the
/// test token: `(status, body)`, or `None` when the connection or the read failed.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(WAIT)).ok()?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\
         Connection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Some((status, body))
}

/// A daemon with the HTTP API on a free port, a daily budget of $5 and the fake provider;
/// `behavior` is added to its `[behavior]` table.
fn daemon(fake: &FakeLlm, behavior: &str) -> (TestDaemon, u16) {
    let port = free_port();
    let base = agentd_toml("fake").replace("[behavior]\n", &format!("[behavior]\n{behavior}\n"));
    let mut d = TestDaemon::new(
        &format!("{base}\n[budget]\ndaily_usd = 5.0\n\n[http]\nenabled = true\nport = {port}\n"),
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    d.set_env("AGENTD_HTTP_TOKEN", TOKEN);
    (d, port)
}

/// The first answer on `path` once the listener is up.
fn get_when_up(port: u16, path: &str) -> (u16, String) {
    wait_until(WAIT, &format!("GET {path}"), || http_get(port, path))
}

/// `/api/v1/status` and `/api/v1/cost` answer 200 with a sane spend for today.
fn assert_status_and_cost_ok(d: &TestDaemon, port: u16) {
    let (code, body) = get_when_up(port, "/api/v1/status");
    assert_eq!(code, 200, "/api/v1/status: {body}\n{}", d.log());
    let status: Value = serde_json::from_str(&body).unwrap();
    let today = status["today_cost"].as_f64().expect("today_cost");
    assert!((0.0..5.0).contains(&today), "today_cost {today}");
    let (code, body) = get_when_up(port, "/api/v1/cost?period=all");
    assert_eq!(code, 200, "/api/v1/cost: {body}\n{}", d.log());
    let cost: Value = serde_json::from_str(&body).unwrap();
    let total = cost["total_cost"].as_f64().expect("total_cost");
    assert!((0.0..5.0).contains(&total), "total_cost {total}");
}

/// Sends `text` from `from` with agent-send and waits for its outcome line in the trail.
fn send_and_wait(d: &TestDaemon, from: &str, text: &str) -> Value {
    let out = d.agent_send(&["-m", text, "--from", from]);
    assert!(
        out.status.success(),
        "agent-send: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    let id = d
        .trail(from)
        .into_iter()
        .rev()
        .find(|l| l["type"] == "intake")
        .expect("intake line")["id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_outcome(d, from, &id)
}

/// Must-show of issue #12: a provider answering `input_tokens = u64::MAX` bricked `/status`,
/// `/cost` and the budget, across restarts. Now the answer is malformed (nothing stored or
/// billed), and after a restart the API answers and the next message is answered.
#[test]
fn absurd_usage_is_refused_and_status_survives_a_restart() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.push(Reply::Text {
        text: "absurd".into(),
        usage: Usage::new(u64::MAX, 5, 0, 0),
    });
    let (mut d, port) = daemon(&fake, "");
    d.start();
    let outcome = send_and_wait(&d, "alice", "hello");
    assert_eq!(outcome["type"], "failure", "{outcome}");

    assert!(d.sigterm().success());
    d.start();
    assert_status_and_cost_ok(&d, port);
    fake.push(Reply::text("fine after"));
    let outcome = send_and_wait(&d, "alice", "again");
    assert_eq!(outcome["text"], "fine after", "{outcome}\n{}", d.log());
    assert!(d.sigterm().success());
}

/// A ledger that already holds the incident's row (tokens clamped to `i64::MAX`, 5.5e13 USD)
/// still serves `/status` and `/cost`, and the daily budget is not spent by it.
#[test]
fn a_ledger_holding_an_i64_max_row_still_serves_status_and_the_budget() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let (mut d, port) = daemon(&fake, "");
    d.start();
    assert!(d.sigterm().success());
    insert_absurd_row(&d.state_dir);
    d.start();
    assert_status_and_cost_ok(&d, port);
    let outcome = send_and_wait(&d, "bob", "still there?");
    assert_eq!(outcome["final"], true, "{outcome}");
    assert!(
        outcome["text"].as_str().unwrap().ends_with("still there?"),
        "{outcome}"
    );
    assert!(d.sigterm().success());
}

/// Issue #12 finding 8: a provider sending `ping` events and never content kept a message
/// "thinking" for as long as it liked, since only inactivity was timed. The call's total
/// deadline ends it; before any content that is a retryable failure, so the retry answers.
#[test]
fn a_provider_that_only_pings_hits_the_call_deadline_and_the_retry_answers() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.push(Reply::PingForever);
    fake.push(Reply::text("answered on the retry"));
    let (mut d, _) = daemon(
        &fake,
        "call_deadline_seconds = 3\napi_retries = 1\nmessage_retries = 0",
    );
    d.start();
    let outcome = send_and_wait(&d, "carol", "are you there?");
    assert_eq!(
        outcome["text"],
        "answered on the retry",
        "{outcome}\n{}",
        d.log()
    );
    assert_eq!(fake.requests().len(), 2);
    d.wait_log("call_deadline_seconds");
    assert!(d.sigterm().success());
}

/// Issue #12 finding 15: a 20 MB model reply was accepted whole. A reply beyond
/// `max_reply_bytes` (default 1 MiB) is a malformed answer: the message fails, nothing of the
/// reply is stored.
#[test]
fn a_reply_beyond_the_size_cap_is_refused() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.push(Reply::text("x".repeat(2 * 1024 * 1024)));
    let (mut d, _) = daemon(&fake, "");
    d.start();
    let outcome = send_and_wait(&d, "dan", "write a lot");
    let shown: String = outcome.to_string().chars().take(300).collect();
    assert_eq!(outcome["type"], "failure", "{shown}");
    assert!(
        d.trail("dan")
            .iter()
            .all(|l| l.to_string().len() < 1024 * 1024),
        "an oversized reply reached the trail"
    );
    d.wait_log("max_reply_bytes");
    assert!(d.sigterm().success());
}

/// Must-show of issue #12 finding 3: with the fd limit at 1024, 1,100 connections that send
/// half a request head and stall made `/status` time out, and a FIFO message was not accepted
/// ("Too many open files" writing the trail). Now headers must arrive within seconds and
/// connections are capped below the fd budget: `/status` answers and FIFO intake works.
#[test]
fn half_open_connections_leave_status_and_fifo_intake_working() {
    // This process holds the 1,100 sockets: its own soft limit up to the hard one.
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .expect("getrlimit");
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard)
        .expect("setrlimit");
    assert!(
        hard >= 1500,
        "the test needs 1,500 fds, the hard limit is {hard}"
    );

    let fake = FakeLlm::spawn(Wire::Anthropic);
    let (mut d, port) = daemon(&fake, "");
    // The daemon raises its soft limit to the hard one; pin both at 1024.
    let state = d.state_dir.clone();
    d.run_through(
        vec!["prlimit".into(), "--nofile=1024:1024".into(), "--".into()],
        state,
    );
    d.start();
    assert_eq!(get_when_up(port, "/api/v1/status").0, 200);

    let mut stalled = Vec::new();
    for _ in 0..1100 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        // Half a request head, never finished (write errors: the server closed it already).
        let _ = s.write_all(b"GET /api/v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Stall: ");
        stalled.push(s);
    }

    let (code, body) = wait_until(Duration::from_secs(120), "/api/v1/status = 200", || {
        http_get(port, "/api/v1/status").filter(|(code, _)| *code == 200)
    });
    assert_eq!(code, 200, "{body}");

    let outcome = send_and_wait(&d, "erin", "fifo under siege");
    assert_eq!(outcome["final"], true, "{outcome}");
    assert!(
        d.trail("erin")
            .iter()
            .any(|l| l["type"] == "intake" && l["text"] == "fifo under siege"),
        "{:#?}",
        d.trail("erin")
    );
    drop(stalled);
    assert!(d.sigterm().success());
}

fn insert_absurd_row(state_dir: &Path) {
    let conn = rusqlite::Connection::open(state_dir.join("agentd.db")).unwrap();
    let now = chrono::Utc::now().timestamp();
    for tokens in [i64::MAX, i64::MAX - 1] {
        conn.execute(
            "INSERT INTO costs (timestamp, session_id, model, provider, call_type, input_tokens, \
             output_tokens, cache_read_tokens, cache_write_tokens, cost_usd) \
             VALUES (?1, 's', 'fake-model', 'fake', 'chat', ?2, 5, 0, 0, 5.5e13)",
            rusqlite::params![now, tokens],
        )
        .unwrap();
    }
}
