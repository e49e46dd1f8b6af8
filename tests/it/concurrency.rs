//! Concurrency and shutdown without timed assertions (issue: channels, must-show 3 and 5).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, fifo_write, provider_toml, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Wire};
use crate::support::wait_until;

fn daemon(fake: &FakeLlm, extra_behavior: &str) -> TestDaemon {
    let mut d = TestDaemon::new(
        &agentd_toml("fake").replace("[behavior]", &format!("[behavior]\n{extra_behavior}")),
        &[("fake", &provider_toml("openai", &fake.base_url()))],
    );
    d.start();
    d
}

/// Two sessions' messages are answered by a provider that holds every call until a second call
/// has arrived: this can only finish if the two sessions run concurrently.
#[test]
fn two_sessions_run_concurrently() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let gate = Arc::new(Semaphore::new(0));
    fake.push(Reply::text("one").gated(&gate));
    fake.push(Reply::text("two").gated(&gate));
    let d = daemon(&fake, "");
    fifo_write(
        &d,
        r#"{"id":"c1","type":"user","text":"first","sender":"s1"}"#,
    );
    fifo_write(
        &d,
        r#"{"id":"c2","type":"user","text":"second","sender":"s2"}"#,
    );
    // The barrier: both calls are in flight at once.
    wait_until(Duration::from_secs(30), "two concurrent calls", || {
        (fake.requests().len() == 2).then_some(())
    });
    gate.add_permits(2);
    wait_outcome(&d, "s1", "c1");
    wait_outcome(&d, "s2", "c2");
}

/// Two messages of one session reach the provider in arrival order, the second only after the
/// first's reply (its request carries that reply).
#[test]
fn one_session_is_serial_in_arrival_order() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    let gate = Arc::new(Semaphore::new(0));
    fake.push(Reply::text("reply to first").gated(&gate));
    fake.push(Reply::text("reply to second"));
    let d = daemon(&fake, "debounce_ms = 0");
    fifo_write(
        &d,
        r#"{"id":"o1","type":"user","text":"first","sender":"solo"}"#,
    );
    wait_until(Duration::from_secs(30), "first call", || {
        (fake.requests().len() == 1).then_some(())
    });
    fifo_write(
        &d,
        r#"{"id":"o2","type":"user","text":"second","sender":"solo"}"#,
    );
    // The second message is recorded (acknowledged) while the first is still running.
    wait_until(Duration::from_secs(30), "intake of o2", || {
        d.trail("solo")
            .iter()
            .any(|l| l["type"] == "intake" && l["id"] == "o2")
            .then_some(())
    });
    assert_eq!(
        fake.requests().len(),
        1,
        "second call must wait for the first reply"
    );
    gate.add_permits(1);
    wait_outcome(&d, "solo", "o2");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2);
    let second = serde_json::to_string(&reqs[1]["messages"]).unwrap();
    let first_user = second.find("] first").expect("first message in history");
    let first_reply = second
        .find("reply to first")
        .expect("first reply in history");
    let second_user = second.find("] second").expect("second message");
    assert!(
        first_user < first_reply && first_reply < second_user,
        "{second}"
    );
}

/// SIGTERM during a model call: the daemon exits within its deadline, removes the FIFO and the
/// PID file, and the message is answered after the next start.
#[test]
fn sigterm_during_model_call_then_answer_after_restart() {
    let fake = FakeLlm::spawn(Wire::OpenAi);
    fake.push(Reply::Hang);
    fake.push(Reply::text("answered after restart"));
    let mut d = daemon(&fake, "");
    fifo_write(
        &d,
        r#"{"id":"t1","type":"user","text":"long job","sender":"tess"}"#,
    );
    wait_until(Duration::from_secs(30), "the model call", || {
        (fake.requests().len() == 1).then_some(())
    });
    let t0 = Instant::now();
    let status = d.sigterm();
    let took = t0.elapsed();
    assert!(status.success(), "{status:?}\n{}", d.log());
    // Deadline 15 s + 5 s grace; generous margin for a loaded 2-core machine.
    assert!(took < Duration::from_secs(28), "shutdown took {took:?}");
    assert!(!d.state_dir.join("control.pipe").exists());
    assert!(!d.state_dir.join("agentd.pid").exists());
    d.start();
    let fin = wait_outcome(&d, "tess", "t1");
    assert_eq!(fin["text"], "answered after restart");
}
