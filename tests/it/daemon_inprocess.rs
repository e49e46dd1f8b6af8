//! The daemon run in-process (issue 11, item 3): `daemon::run` takes its shutdown token from
//! the caller, as mini-redis's `server::run(listener, shutdown)` does, so a test can start it
//! on a temporary config, talk to it, cancel the token and see it return cleanly.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, fifo_write, provider_toml, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Usage, Wire};
use crate::support::wait_until;

/// A daemon home on the fake provider (OpenAI wire) that answers once with `text`, and its
/// config as `daemon::run` takes it. The fake is returned so it lives as long as the test.
async fn home(text: &str) -> (FakeLlm, TestDaemon, agentd::config::Config) {
    let fake = FakeLlm::start(Wire::OpenAi).await;
    fake.push(Reply::Text {
        text: text.into(),
        usage: Usage::new(100, 5, 0, 0),
    });
    let d = TestDaemon::new(
        &agentd_toml("fake"),
        &[("fake", &provider_toml("openai", &fake.base_url()))],
    );
    let env = BTreeMap::from([
        (
            "AGENTD_STATE_DIR".to_string(),
            d.state_dir.display().to_string(),
        ),
        ("HOME".to_string(), d.dir.path().display().to_string()),
    ]);
    let cfg = agentd::config::load_with_env(&d.config_path, env).expect("config");
    (fake, d, cfg)
}

/// Once the FIFO exists, send message `id` from alice and check the answer is `expect`.
async fn ask_over_the_fifo(d: TestDaemon, id: &'static str, expect: &'static str) -> TestDaemon {
    tokio::task::spawn_blocking(move || {
        let fifo = d.state_dir.join("control.pipe");
        wait_until(Duration::from_secs(20), "the control FIFO", || {
            fifo.exists().then_some(())
        });
        let line = format!(r#"{{"type":"user","id":"{id}","sender":"alice","text":"hi"}}"#);
        fifo_write(&d, &line);
        let outcome = wait_outcome(&d, "alice", id);
        assert_eq!(outcome["text"], expect, "{outcome}");
        d
    })
    .await
    .expect("the test's blocking part")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_runs_in_process_and_returns_when_its_token_is_cancelled() {
    let (_fake, d, cfg) = home("Hello from in-process!").await;
    let shutdown = CancellationToken::new();
    let daemon = tokio::spawn(agentd::daemon::run(
        cfg,
        agentd::daemon::RunOptions::default(),
        shutdown.clone(),
    ));

    let d = ask_over_the_fifo(d, "inproc-1", "Hello from in-process!").await;

    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(30), daemon)
        .await
        .expect("run returns within 30 s of the cancel")
        .expect("run did not panic");
    assert!(result.is_ok(), "{result:?}");
    assert!(!d.state_dir.join("control.pipe").exists(), "FIFO removed");
    assert!(!d.state_dir.join("agentd.pid").exists(), "PID file removed");
}

/// SPEC §16.7: a source that ends other than by shutdown stops the daemon gracefully (FIFO and
/// PID file removed, the message in flight answered) and `run` fails with a runtime error, exit
/// code 3, so systemd restarts it. The failure is injected through the source seam: one more
/// source, watched like the FIFO reader, the HTTP listener and the Telegram poller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_dies_stops_the_daemon_gracefully_with_exit_code_3() {
    use std::sync::Arc;

    let (_fake, d, cfg) = home("answered before the stop").await;
    // The injected source fails once `fail` fires.
    let fail = CancellationToken::new();
    let trigger = fail.clone();
    let opts = agentd::daemon::RunOptions {
        extra_sources: vec![agentd::daemon::sources::ExtraSource {
            name: "injected",
            start: Arc::new(move |stop: CancellationToken| {
                let fail = fail.clone();
                Box::pin(async move {
                    tokio::select! {
                        _ = stop.cancelled() => Ok(()),
                        _ = fail.cancelled() => Err("connection lost".to_string()),
                    }
                })
            }),
        }],
        ..Default::default()
    };
    let shutdown = CancellationToken::new();
    let daemon = tokio::spawn(agentd::daemon::run(cfg, opts, shutdown.clone()));

    let d = ask_over_the_fifo(d, "dies-1", "answered before the stop").await;

    trigger.cancel();
    let result = tokio::time::timeout(Duration::from_secs(30), daemon)
        .await
        .expect("run returns within 30 s of the death, without a cancel")
        .expect("run did not panic");
    let err = result.expect_err("a dead source is a runtime failure");
    assert_eq!(err.exit_code(), 3, "{err}");
    assert!(err.to_string().contains("injected"), "{err}");
    assert!(!shutdown.is_cancelled());
    assert!(!d.state_dir.join("control.pipe").exists(), "FIFO removed");
    assert!(!d.state_dir.join("agentd.pid").exists(), "PID file removed");
}
