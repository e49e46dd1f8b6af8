//! Outside input on the intake path is validated and bounded (SPEC §16.9, issue 12 findings
//! 9, 10, 12 and 15): FIFO fragments, `text_file`, client ids and queue caps.

use std::io::Write;
use std::time::Duration;

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, daemon_with, fifo_write, provider_toml, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};
use crate::support::wait_until;

/// A fragment without a newline (`echo -n`, a writer killed mid-line) is dropped after a short
/// wait and logged; the next writer's complete line is not glued to it and is answered.
#[test]
fn fifo_fragment_is_dropped_and_next_line_accepted() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let d = daemon_with(&fake, "openai");
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(d.state_dir.join("control.pipe"))
            .expect("open control.pipe");
        f.write_all(br#"{"id":"frag","type":"user","text":"half a li"#)
            .expect("write fragment");
    }
    // Longer than the daemon's fragment wait (2 s).
    std::thread::sleep(Duration::from_secs(3));
    let out = d.agent_send(&["-m", "after the fragment", "--from", "ivy", "--wait", "20"]);
    assert!(
        out.status.success(),
        "agent-send failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("after the fragment"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let log = d.log();
    assert!(
        log.contains("FIFO fragment without a newline discarded"),
        "{log}"
    );
    assert!(
        d.trail("ivy").iter().all(|l| l["id"] != "frag"),
        "the fragment never became a message"
    );
}

/// The same, when the next writer comes before the wait is over: its whole line, glued to the
/// fragment, is recognised and accepted, and the fragment is dropped.
#[test]
fn fifo_line_right_after_a_fragment_is_not_lost() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let d = daemon_with(&fake, "openai");
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(d.state_dir.join("control.pipe"))
            .expect("open control.pipe");
        f.write_all(br#"{"id":"frag2","type":"user","te"#)
            .expect("write fragment");
    }
    // Well within the fragment wait: the reader has the fragment, the wait is still running.
    std::thread::sleep(Duration::from_millis(300));
    let out = d.agent_send(&["-m", "right after", "--from", "lou", "--wait", "20"]);
    assert!(
        out.status.success(),
        "agent-send failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    let log = d.log();
    assert!(
        log.contains("FIFO fragment without a newline discarded"),
        "{log}"
    );
}

/// `text_file` must be a regular file under a size cap ([http] max_body_bytes): a FIFO named
/// there is refused at once (it used to stall all FIFO intake), an oversize file is refused
/// with a clear error, and the next message is accepted either way.
#[test]
fn text_file_must_be_a_small_regular_file() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let toml = format!("{}\n[http]\nmax_body_bytes = 1000\n", agentd_toml("fake"));
    let mut d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("openai", &fake.base_url()))],
    );
    d.start();
    let inbox = d.state_dir.join("inbox");
    std::fs::create_dir_all(&inbox).unwrap();
    let pipe = inbox.join("a-fifo.txt");
    nix::unistd::mkfifo(&pipe, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let big = inbox.join("big.txt");
    std::fs::write(&big, "y".repeat(30_000)).unwrap();
    for (id, path) in [("tf-fifo", &pipe), ("tf-big", &big)] {
        let line = serde_json::json!({
            "id": id, "type": "user", "text_file": path, "sender": "jo",
        });
        fifo_write(&d, &line.to_string());
    }
    let out = d.agent_send(&["-m", "still listening?", "--from", "jo", "--wait", "20"]);
    assert!(
        out.status.success(),
        "agent-send failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    let log = d.log();
    assert!(log.contains("is a FIFO, not a regular file"), "{log}");
    assert!(
        log.contains("is 30000 bytes, over the limit of 1000 ([http] max_body_bytes)"),
        "{log}"
    );
    let trail = d.trail("jo");
    assert!(
        trail
            .iter()
            .all(|l| l["id"] != "tf-fifo" && l["id"] != "tf-big"),
        "refused lines are not recorded"
    );
}

/// A client id outside the short safe charset (here with a newline that would forge a log
/// line) is refused with a clear error, never logged raw, and the next line is accepted.
#[test]
fn fifo_id_with_a_newline_is_refused() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let d = daemon_with(&fake, "openai");
    let evil = serde_json::json!({
        "id": "evil\nFORGED-LINE  INFO message accepted",
        "type": "user", "text": "hi", "sender": "kay",
    });
    fifo_write(&d, &evil.to_string());
    fifo_write(
        &d,
        r#"{"id":"after-evil","type":"user","text":"hello","sender":"kay"}"#,
    );
    let fin = wait_outcome(&d, "kay", "after-evil");
    assert!(fin["text"].as_str().unwrap().starts_with("echo: "), "{fin}");
    let log = d.log();
    assert!(log.contains("invalid `id`"), "{log}");
    assert!(
        !log.lines().any(|l| l.starts_with("FORGED-LINE")),
        "a raw newline reached the log: {log}"
    );
    assert!(
        d.trail("kay")
            .iter()
            .all(|l| l["type"] != "intake" || l["id"] == "after-evil"),
        "the refused line was not recorded"
    );
}

/// Per-session queues are bounded (`[behavior] max_queued_per_session`): while the model is
/// slow, `/notify` calls beyond the cap are refused with 429 before anything is recorded, and
/// every accepted one is processed — nothing acknowledged is dropped.
#[test]
fn notify_beyond_the_session_queue_cap_gets_429_and_accepted_ones_all_run() {
    use crate::http_daemon::reqwest;
    use serde_json::{Value, json};
    use std::sync::Arc;
    use tokio::sync::Semaphore;

    let fake = FakeLlm::spawn(Wire::OpenAi);
    let gate = Arc::new(Semaphore::new(0));
    fake.push(Reply::text("first, slowly").gated(&gate));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let toml = agentd_toml("fake").replace(
        "[behavior]",
        &format!(
            "[http]\nenabled = true\nport = {port}\nrate_limit = 1000\n\n[behavior]\nmax_queued_per_session = 8"
        ),
    );
    let mut d = TestDaemon::new(
        &toml,
        &[("fake", &provider_toml("openai", &fake.base_url()))],
    );
    d.set_env("AGENTD_HTTP_TOKEN", "tok");
    d.start();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::blocking_client();
    let notify = |n: usize| {
        let r = client
            .post(format!("{base}/api/v1/notify"))
            .bearer_auth("tok")
            .json(&json!({"message": format!("event {n}"), "source": "load"}))
            .send()
            .unwrap();
        let status = r.status();
        let body: Value = r.json().unwrap();
        (status, body)
    };
    wait_until(Duration::from_secs(20), "the HTTP API", || {
        client.get(format!("{base}/api/v1/status")).send().ok()
    });
    // The first one runs (its model call waits at the gate), so it holds no queue slot.
    assert_eq!(notify(0).0, 202);
    wait_until(Duration::from_secs(20), "the first model call", || {
        (fake.requests().len() == 1).then_some(())
    });
    let mut accepted = 1;
    let mut refused = 0;
    for n in 1..100 {
        let (status, body) = notify(n);
        match status {
            202 => accepted += 1,
            429 => {
                refused += 1;
                let e = body["error"].as_str().unwrap_or_default();
                assert!(e.contains("max_queued_per_session"), "{body}");
            }
            other => panic!("unexpected status {other}: {body}"),
        }
    }
    assert_eq!(accepted, 1 + 8, "one running, eight queued");
    assert_eq!(refused, 91);
    let intakes = d
        .trail("system")
        .iter()
        .filter(|l| l["type"] == "intake")
        .count();
    assert_eq!(intakes, accepted, "refused before anything was recorded");
    gate.add_permits(1);
    wait_until(
        Duration::from_secs(60),
        "every accepted notification answered",
        || {
            let done = d
                .trail("system")
                .iter()
                .filter(|l| l["final"] == true || l["type"] == "failure")
                .count();
            (done == accepted).then_some(())
        },
    );
    // Drained: accepted again.
    assert_eq!(notify(100).0, 202);
}
