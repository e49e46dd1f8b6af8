//! `GET /metrics` of the real daemon, read by a real Prometheus parser: the Prometheus
//! project's `prometheus_client` Python package (installed from PyPI by
//! `scripts/install-test-peers.sh`), through `openmetrics_parse.py`. Any line it cannot parse
//! fails the test; the families it reads must be today's names with the values of one chat.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::http_daemon::reqwest;
use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, provider_toml};
use crate::support::fake_llm::{FakeLlm, Reply, Usage, Wire};
use crate::support::{free_port, wait_until};

const TOKEN: &str = "metrics-token-123";

/// `prometheus_client`, installed once per target dir.
fn prometheus_client_dir() -> PathBuf {
    crate::support::test_peers("metrics", "python3/pip with registry access").join("prom")
}

/// The families `prometheus_client`'s OpenMetrics parser reads from `text`, by name; panics
/// with the parser's error when it rejects the text.
fn parse_with_prometheus_client(text: &str) -> BTreeMap<String, Value> {
    run_parser(text).unwrap_or_else(|e| {
        panic!("the OpenMetrics parser rejected /metrics:\n{e}\n--- text ---\n{text}")
    })
}

/// Runs `openmetrics_parse.py` on `text`: its families by name, or the parser's error.
fn run_parser(text: &str) -> Result<BTreeMap<String, Value>, String> {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/openmetrics_parse.py");
    let mut parser = Command::new("python3");
    parser
        .arg(&script)
        .env("PYTHONPATH", prometheus_client_dir());
    let out = piped(parser, text);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let families: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    Ok(families
        .into_iter()
        .map(|f| (f["name"].as_str().unwrap().to_owned(), f))
        .collect())
}

/// Hostile label values (quotes, backslashes, newlines, more tools than the cap) still render
/// text the parser reads back exactly; and the parser is strict: text without its final
/// `# EOF` is rejected.
#[test]
fn hostile_labels_render_text_the_prometheus_parser_reads_back() {
    let m = agentd::metrics::Metrics::new();
    let cap = agentd::metrics::MAX_LABEL_VALUES;
    for i in 0..cap + 20 {
        m.tool_call(&format!("tool{i}"), i % 3 != 0);
    }
    let nasty = "quote\"back\\slash\nline # EOF";
    m.error(nasty);
    m.error("");
    m.message_done(
        "telegram",
        agentd::metrics::Outcome::Failed,
        Duration::from_secs(1000),
    );
    let text = m.render();
    let families = parse_with_prometheus_client(&text);
    let tools = &families["agentd_tool_calls"];
    let series = tools["samples"].as_array().unwrap();
    assert!(
        series
            .iter()
            .all(|s| s["labels"]["tool"].as_str().unwrap().len() <= 64)
    );
    let distinct: std::collections::BTreeSet<&str> = series
        .iter()
        .map(|s| s["labels"]["tool"].as_str().unwrap())
        .collect();
    assert_eq!(distinct.len(), cap + 1, "the cap plus \"other\"");
    assert_eq!(
        sample(
            tools,
            "agentd_tool_calls_total",
            &[("tool", "other"), ("outcome", "ok")]
        ),
        Some(13.0)
    );
    let errors = &families["agentd_errors"];
    assert_eq!(
        sample(errors, "agentd_errors_total", &[("kind", nasty)]),
        Some(1.0)
    );
    assert_eq!(
        sample(errors, "agentd_errors_total", &[("kind", "unknown")]),
        Some(1.0)
    );
    let durations = &families["agentd_message_duration_seconds"];
    assert_eq!(
        sample(
            durations,
            "agentd_message_duration_seconds_bucket",
            &[("le", "600.0")]
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(durations, "agentd_message_duration_seconds_sum", &[]),
        Some(1000.0)
    );

    let truncated = text.strip_suffix("# EOF\n").unwrap();
    let err = run_parser(truncated).expect_err("text without # EOF must be rejected");
    assert!(err.contains("EOF"), "{err}");
}

/// The value of the sample `name` with exactly `labels` in `family`.
fn sample(family: &Value, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: BTreeMap<&str, &str> = labels.iter().copied().collect();
    family["samples"].as_array()?.iter().find_map(|s| {
        let have: BTreeMap<&str, &str> = s["labels"]
            .as_object()?
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or_default()))
            .collect();
        (s["name"] == name && have == want).then(|| s["value"].as_f64())?
    })
}

#[test]
fn metrics_of_the_real_daemon_parse_with_the_prometheus_parser() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.push(Reply::ToolCalls {
        text: None,
        calls: vec![("m1".into(), "session_status".into(), json!({}))],
        usage: Usage::new(100, 10, 0, 50),
    });
    fake.push(Reply::Text {
        text: "Counted".into(),
        usage: Usage::new(20, 5, 50, 10),
    });
    let port = free_port();
    let mut d = TestDaemon::new(
        &format!(
            "{}\n[http]\nenabled = true\nport = {port}\n",
            agentd_toml("fake")
        ),
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    d.set_env("AGENTD_HTTP_TOKEN", TOKEN);
    d.start();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::blocking_client();
    wait_until(Duration::from_secs(20), "HTTP status", || {
        client
            .get(format!("{base}/api/v1/status"))
            .send()
            .ok()
            .filter(|r| r.status() == 200)
    });

    let r = client.get(format!("{base}/metrics")).send().unwrap();
    assert_eq!(r.status(), 401, "/metrics needs the token");

    let r = client
        .post(format!("{base}/api/v1/chat"))
        .bearer_auth(TOKEN)
        .json(&json!({"message": "count me", "sender": "svc"}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().unwrap();
    assert_eq!(body["reply"], "Counted");

    let r = client
        .get(format!("{base}/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let text = r.text().unwrap();
    let families = parse_with_prometheus_client(&text);

    let f = |name: &str| &families[name];
    let kinds: BTreeMap<&str, &str> = families
        .iter()
        .map(|(name, f)| (name.as_str(), f["type"].as_str().unwrap()))
        .collect();
    let expected: BTreeMap<&str, &str> = [
        ("agentd_messages", "counter"),
        ("agentd_llm_calls", "counter"),
        ("agentd_tokens", "counter"),
        ("agentd_cost_usd", "counter"),
        ("agentd_tool_calls", "counter"),
        ("agentd_approvals_pending", "gauge"),
        ("agentd_queue_depth", "gauge"),
        ("agentd_active_sessions", "gauge"),
        ("agentd_session_workers", "gauge"),
        ("agentd_open_sessions", "gauge"),
        ("agentd_deliveries_pending", "gauge"),
        ("agentd_deliveries", "counter"),
        ("agentd_webhooks", "counter"),
        ("agentd_backups", "counter"),
        // The request without the token above, counted as kind `http_auth`.
        ("agentd_errors", "counter"),
        ("agentd_message_duration_seconds", "histogram"),
        ("agentd_session_slot_wait_seconds", "histogram"),
        ("agentd_llm_call_duration_seconds", "histogram"),
    ]
    .into_iter()
    .collect();
    // A labelled family has no samples before its first count.
    assert_eq!(kinds, expected, "{text}");
    assert_eq!(
        sample(
            f("agentd_deliveries"),
            "agentd_deliveries_total",
            &[("status", "failed")]
        ),
        Some(0.0),
        "known statuses are sampled from the start"
    );
    assert_eq!(
        sample(
            f("agentd_errors"),
            "agentd_errors_total",
            &[("kind", "http_auth")]
        ),
        Some(1.0),
        "the request without the token is counted: {text}"
    );

    assert_eq!(
        sample(
            f("agentd_messages"),
            "agentd_messages_total",
            &[("source", "http"), ("outcome", "reply")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            f("agentd_tool_calls"),
            "agentd_tool_calls_total",
            &[("tool", "session_status"), ("outcome", "ok")]
        ),
        Some(1.0),
        "{text}"
    );
    for (kind, n) in [
        ("input", 120.0),
        ("output", 15.0),
        ("cache_read", 50.0),
        ("cache_write", 60.0),
    ] {
        assert_eq!(
            sample(f("agentd_tokens"), "agentd_tokens_total", &[("kind", kind)]),
            Some(n),
            "{kind}: {text}"
        );
    }
    let llm = f("agentd_llm_call_duration_seconds");
    assert_eq!(llm["unit"], "seconds");
    assert_eq!(
        sample(llm, "agentd_llm_call_duration_seconds_count", &[]),
        Some(2.0)
    );
    let messages = f("agentd_message_duration_seconds");
    assert_eq!(
        sample(messages, "agentd_message_duration_seconds_count", &[]),
        Some(1.0)
    );
    assert_eq!(
        messages["samples"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["name"] == "agentd_message_duration_seconds_bucket")
            .count(),
        13,
        "12 bounds and +Inf"
    );
    assert_eq!(
        sample(f("agentd_queue_depth"), "agentd_queue_depth", &[]),
        Some(0.0)
    );

    // A client that asks for the classic text format (promtool, older scrapers) gets it, the
    // same samples, and Prometheus' own linter finds nothing to say.
    let r = client
        .get(format!("{base}/metrics"))
        .bearer_auth(TOKEN)
        .header("accept", "text/plain")
        .send()
        .unwrap();
    assert_eq!(
        r.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let classic = r.text().unwrap();
    assert!(!classic.contains("# EOF"), "{classic}");
    assert!(
        classic.contains("# TYPE agentd_messages_total counter")
            && classic.contains("agentd_messages_total{source=\"http\",outcome=\"reply\"} 1"),
        "{classic}"
    );
    let (ok, said) = promtool_check(&classic);
    assert!(ok && said.trim().is_empty(), "promtool: {said}\n{classic}");
    assert!(d.sigterm().success());
}

/// `promtool check metrics` on `text`: whether it passed, and what it printed.
fn promtool_check(text: &str) -> (bool, String) {
    let promtool =
        crate::support::test_peers("metrics", "Debian's package lists (apt-get download)")
            .join("promtool/usr/bin/promtool");
    let mut check = Command::new(&promtool);
    check.args(["check", "metrics"]);
    let out = piped(check, text);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// Run `command` with `text` on its standard input; its whole output.
fn piped(mut command: Command, text: &str) -> std::process::Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}
