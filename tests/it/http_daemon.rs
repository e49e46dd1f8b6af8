//! The HTTP API of the real daemon (SPEC §10.2): `/chat` runs the whole loop against a fake
//! provider and answers with the reply and the token totals; `/notify` is accepted durably;
//! `/metrics` counts what happened.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::daemon::TestDaemon;
use crate::support::e2e::{agentd_toml, provider_toml, wait_outcome};
use crate::support::fake_llm::{FakeLlm, Reply, Usage, Wire};
use crate::support::{free_port, wait_until};

#[test]
fn http_chat_notify_status_metrics_against_the_real_daemon() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.push(Reply::ToolCalls {
        text: None,
        calls: vec![("h1".into(), "session_status".into(), json!({}))],
        usage: Usage::new(100, 10, 0, 50),
    });
    fake.push(Reply::Text {
        text: "Hi over HTTP".into(),
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
    d.set_env("AGENTD_HTTP_TOKEN", "test-token-123");
    d.start();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::blocking_client();

    let status: Value = wait_until(Duration::from_secs(20), "HTTP status", || {
        client
            .get(format!("{base}/api/v1/status"))
            .send()
            .ok()
            .and_then(|r| r.json().ok())
    });
    assert_eq!(status["status"], "ok");
    assert_eq!(status["agent"], "testbot");

    let r = client
        .post(format!("{base}/api/v1/chat"))
        .bearer_auth("test-token-123")
        .json(&json!({"message": "hello", "sender": "svc", "context": "from a test"}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().unwrap();
    assert_eq!(body["reply"], "Hi over HTTP");
    // Token totals cover the whole loop (two calls).
    assert_eq!(
        body["tokens"],
        json!({"input": 120, "output": 15, "cache_read": 50, "cache_write": 60})
    );
    let sid = body["session_id"].as_str().unwrap().to_string();
    assert_eq!(d.session_id("http-svc").as_deref(), Some(sid.as_str()));
    let sent = serde_json::to_string(&fake.requests()[0]["messages"]).unwrap();
    assert!(sent.contains("[context] from a test\\nhello"), "{sent}");

    let r = client
        .post(format!("{base}/api/v1/chat"))
        .bearer_auth("wrong")
        .json(&json!({"message": "x"}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 401);

    let r = client
        .post(format!("{base}/api/v1/notify"))
        .bearer_auth("test-token-123")
        .json(&json!({"message": "disk almost full", "source": "monitoring", "ref": "alert-7"}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 202);
    let intake = wait_until(Duration::from_secs(20), "notify intake", || {
        d.trail("system")
            .into_iter()
            .find(|l| l["type"] == "intake")
    });
    assert!(
        intake["text"]
            .as_str()
            .unwrap()
            .contains("[notification from monitoring, ref alert-7] disk almost full")
    );
    wait_outcome(&d, "system", intake["id"].as_str().unwrap());

    let hist: Value = client
        .get(format!("{base}/api/v1/sessions/{sid}/history"))
        .bearer_auth("test-token-123")
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(hist["session_id"], sid.as_str());
    assert!(hist["events"].as_array().unwrap().len() >= 5);

    let metrics = client
        .get(format!("{base}/metrics"))
        .bearer_auth("test-token-123")
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(metrics.contains("agentd_messages_total"), "{metrics}");
    assert!(metrics.contains("agentd_tool_calls_total"), "{metrics}");

    let r: Value = client
        .post(format!("{base}/api/v1/sessions/reset"))
        .bearer_auth("test-token-123")
        .json(&json!({"target": "http-svc"}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(r["count"], 1);
    wait_until(Duration::from_secs(20), "reset", || {
        d.session_id("http-svc").is_none().then_some(())
    });
    assert!(d.sigterm().success());
}

/// The value of an unlabelled gauge in the OpenMetrics text of `/metrics`.
fn gauge(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Sessions seen once do not pin resources (the soak leak, docs/BENCHMARKS.md): each worker
/// exits when its queue is empty, and at most 64 session handles keep a trail file open.
#[test]
fn many_sessions_leave_no_workers_and_a_bounded_number_of_open_trails() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let port = free_port();
    let mut d = TestDaemon::new(
        &format!(
            "{}\n[http]\nenabled = true\nport = {port}\nrate_limit = 100000\n",
            agentd_toml("fake")
        ),
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    d.set_env("AGENTD_HTTP_TOKEN", "tok");
    d.start();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::blocking_client();
    wait_until(Duration::from_secs(20), "HTTP status", || {
        client.get(format!("{base}/api/v1/status")).send().ok()
    });
    let sessions = 90;
    for n in 0..sessions {
        let r = client
            .post(format!("{base}/api/v1/chat"))
            .bearer_auth("tok")
            .json(&json!({"message": format!("hello {n}"), "sender": format!("s{n}")}))
            .send()
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let metrics = wait_until(Duration::from_secs(20), "workers to exit", || {
        let m = client
            .get(format!("{base}/metrics"))
            .bearer_auth("tok")
            .send()
            .ok()?
            .text()
            .ok()?;
        (gauge(&m, "agentd_session_workers") == Some(0.0)).then_some(m)
    });
    let open = gauge(&metrics, "agentd_open_sessions").expect("open sessions gauge");
    assert!(open <= 64.0, "{open} session handles open\n{metrics}");
    // What the kernel says: trail files the daemon holds open.
    let pid = d.pid().unwrap();
    let trails = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| p.to_string_lossy().ends_with(".jsonl"))
        .count();
    assert!(
        trails <= 64,
        "{trails} trail files open after {sessions} sessions"
    );
    // Sessions whose handle was closed still work, in the same session.
    let first = d.session_id("http-s0").unwrap();
    let r: Value = client
        .post(format!("{base}/api/v1/chat"))
        .bearer_auth("tok")
        .json(&json!({"message": "again", "sender": "s0"}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(r["session_id"], first.as_str());
    assert!(d.sigterm().success());
}

/// A webhook receiver: every POST body, as JSON, goes to the returned channel; answers 200.
fn webhook_receiver() -> (u16, std::sync::mpsc::Receiver<Value>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0u8; len];
            if reader.read_exact(&mut body).is_ok()
                && let Ok(v) = serde_json::from_slice(&body)
            {
                let _ = tx.send(v);
            }
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    (port, rx)
}

/// SPEC §10.2: the webhook after a `/notify` carries `notify_meta` — the `source`, `ref` and
/// `data` as received — besides the text the model saw.
#[test]
fn webhook_after_notify_carries_notify_meta() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    fake.push(Reply::Text {
        text: "Noted.".into(),
        usage: Usage::new(20, 5, 0, 0),
    });
    let (hook_port, hooks) = webhook_receiver();
    let port = free_port();
    let mut d = TestDaemon::new(
        &format!(
            "{}\n[http]\nenabled = true\nport = {port}\ncallback_url = \"http://127.0.0.1:{hook_port}/cb\"\n",
            agentd_toml("fake")
        ),
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    d.set_env("AGENTD_HTTP_TOKEN", "tok");
    d.start();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::blocking_client();
    wait_until(Duration::from_secs(20), "HTTP status", || {
        client.get(format!("{base}/api/v1/status")).send().ok()
    });
    let r = client
        .post(format!("{base}/api/v1/notify"))
        .bearer_auth("tok")
        .json(
            &json!({"message": "build failed", "source": "ci", "ref": "run-9",
                       "data": {"job": 7}}),
        )
        .send()
        .unwrap();
    assert_eq!(r.status(), 202);
    let hook = hooks
        .recv_timeout(Duration::from_secs(30))
        .expect("a webhook call");
    assert_eq!(hook["reply"], "Noted.", "{hook}");
    assert_eq!(hook["source"], "system", "{hook}");
    assert_eq!(
        hook["notify_meta"],
        json!({"source": "ci", "ref": "run-9", "data": {"job": 7}}),
        "{hook}"
    );
    assert!(d.sigterm().success());
}

pub(crate) mod reqwest {
    pub use ::reqwest::*;
    /// A blocking-style client: these tests are plain `#[test]`s, so run each request on a
    /// small private runtime.
    pub fn blocking_client() -> Blocking {
        Blocking {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            c: Client::new(),
        }
    }
    pub struct Blocking {
        rt: tokio::runtime::Runtime,
        c: Client,
    }
    pub struct Req<'a> {
        rt: &'a tokio::runtime::Runtime,
        b: RequestBuilder,
    }
    pub struct Resp<'a> {
        rt: &'a tokio::runtime::Runtime,
        r: Response,
    }
    impl Blocking {
        pub fn get(&self, url: String) -> Req<'_> {
            Req {
                rt: &self.rt,
                b: self.c.get(url),
            }
        }
        pub fn post(&self, url: String) -> Req<'_> {
            Req {
                rt: &self.rt,
                b: self.c.post(url),
            }
        }
    }
    impl<'a> Req<'a> {
        pub fn bearer_auth(self, t: &str) -> Self {
            Req {
                rt: self.rt,
                b: self.b.bearer_auth(t),
            }
        }
        pub fn json(self, v: &serde_json::Value) -> Self {
            Req {
                rt: self.rt,
                b: self.b.json(v),
            }
        }
        pub fn body(self, b: String) -> Self {
            Req {
                rt: self.rt,
                b: self.b.body(b),
            }
        }
        pub fn header(self, k: &str, v: &str) -> Self {
            Req {
                rt: self.rt,
                b: self.b.header(k, v),
            }
        }
        pub fn send(self) -> Result<Resp<'a>> {
            let r = self.rt.block_on(self.b.send())?;
            Ok(Resp { rt: self.rt, r })
        }
    }
    impl Resp<'_> {
        pub fn status(&self) -> u16 {
            self.r.status().as_u16()
        }
        pub fn headers(&self) -> &header::HeaderMap {
            self.r.headers()
        }
        pub fn json<T: serde::de::DeserializeOwned>(self) -> Result<T> {
            self.rt.block_on(self.r.json())
        }
        pub fn text(self) -> Result<String> {
            self.rt.block_on(self.r.text())
        }
    }
}

/// `(rows, cost, input tokens, output tokens)` of the cost rows billed to `session_id`.
fn rows_of(d: &TestDaemon, session_id: &str) -> (i64, f64, i64, i64) {
    let conn = rusqlite::Connection::open(d.state_dir.join("agentd.db")).unwrap();
    conn.query_row(
        "SELECT COUNT(*), COALESCE(SUM(cost_usd), 0), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0) FROM costs WHERE session_id = ?1",
        [session_id],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )
    .unwrap()
}

/// A fake provider for the fan-out attack: the main agent's first answer is 40
/// `sessions_spawn` calls, each sub-agent calls a tool on every turn, and the main agent
/// answers "done" once it has results. Every call costs 1000 input and 100 output tokens
/// ($0.0045 at the test prices).
fn fan_out_provider() -> FakeLlm {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let usage = Usage::new(1000, 100, 0, 0);
    fake.set_responder(move |r| {
        let sub = r["system"]
            .to_string()
            .contains("sub-agent working for the main agent");
        let has_results = r["messages"].to_string().contains("tool_result");
        Some(if sub {
            Reply::ToolCalls {
                text: None,
                calls: vec![("s1".into(), "session_status".into(), json!({}))],
                usage,
            }
        } else if has_results {
            Reply::Text {
                text: "done".into(),
                usage,
            }
        } else {
            Reply::ToolCalls {
                text: None,
                calls: (0..40)
                    .map(|i| {
                        let args = json!({"prompt": format!("task {i}")});
                        (format!("p{i}"), "sessions_spawn".to_string(), args)
                    })
                    .collect(),
                usage,
            }
        })
    });
    fake
}

fn http_daemon(fake: &FakeLlm, extra: &str) -> (TestDaemon, String) {
    let port = free_port();
    let mut d = TestDaemon::new(
        &format!(
            "{}\n[http]\nenabled = true\nport = {port}\n{extra}",
            agentd_toml("fake")
        ),
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    d.set_env("AGENTD_HTTP_TOKEN", "test-token-123");
    d.start();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::blocking_client();
    wait_until(Duration::from_secs(20), "HTTP status", || {
        client
            .get(format!("{base}/api/v1/status"))
            .send()
            .ok()
            .filter(|r| r.status() == 200)
            .map(|_| ())
    });
    (d, base)
}

/// Item 7 of the third security round: one answer with 40 `sessions_spawn` calls. At most
/// `MAX_SPAWNS_PER_ANSWER` (4) sub-agents run, the rest get an error result; the reply's
/// `cost_usd` and tokens (and the compatible endpoint's usage) are the sum of every cost row
/// of the message, sub-agents included.
#[test]
fn a_fan_out_of_40_sub_agents_is_capped_and_billed_in_the_reply() {
    let fake = fan_out_provider();
    let (d, base) = http_daemon(&fake, "");
    let client = reqwest::blocking_client();
    let body: Value = client
        .post(format!("{base}/api/v1/chat"))
        .bearer_auth("test-token-123")
        .json(&json!({"message": "fan out", "sender": "fan"}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let calls = fake.requests().len();
    let sid = body["session_id"].as_str().unwrap();
    let (rows, cost, input, output) = rows_of(&d, sid);
    eprintln!(
        "40 spawns: {calls} provider calls, {rows} cost rows of ${cost:.4}; the reply says ${} and {}",
        body["cost_usd"], body["tokens"]
    );
    assert_eq!(body["reply"], "done", "{body}");
    assert!(calls <= 2 + 4 * 20, "{calls} provider calls");
    assert_eq!(rows as usize, calls);
    assert!(
        (body["cost_usd"].as_f64().unwrap() - cost).abs() < 1e-9,
        "the reply's cost {} is not the rows' {cost}",
        body["cost_usd"]
    );
    assert_eq!(body["tokens"]["input"], input);
    assert_eq!(body["tokens"]["output"], output);
    let results = d
        .trail("http-fan")
        .into_iter()
        .find(|l| l["results"].is_array())
        .unwrap();
    let refused = results["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["is_error"] == true && r["content"].as_str().unwrap().contains("at most 4"))
        .count();
    assert_eq!(refused, 36, "{results}");

    // The compatible endpoint reports the same sum as its usage.
    let before = fake.requests().len();
    let answer: Value = client
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth("test-token-123")
        .header("X-Agentd-Session", "fan2")
        .json(&json!({"model": "agentd", "messages": [{"role": "user", "content": "fan out"}]}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let sid = d.session_id("api:fan2").unwrap();
    let (rows, _, input, output) = rows_of(&d, &sid);
    eprintln!(
        "compatible endpoint: {} calls, {rows} rows, usage {}",
        fake.requests().len() - before,
        answer["usage"]
    );
    assert_eq!(answer["usage"]["prompt_tokens"], input, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], output, "{answer}");
}

/// Item 7: with a per-message budget B, parallel sub-agents each check the budget before
/// every call, one at a time: the message costs at most B plus one call.
#[test]
fn parallel_sub_agents_stop_within_one_call_of_the_per_message_budget() {
    const B: f64 = 0.05;
    const CALL: f64 = 0.0045;
    let fake = fan_out_provider();
    let (d, base) = http_daemon(&fake, &format!("[budget]\nper_message_usd = {B}\n"));
    let body: Value = reqwest::blocking_client()
        .post(format!("{base}/api/v1/chat"))
        .bearer_auth("test-token-123")
        .json(&json!({"message": "fan out", "sender": "tight"}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let sid = d.session_id("http-tight").unwrap();
    let (rows, cost, _, _) = rows_of(&d, &sid);
    eprintln!(
        "per-message budget ${B}: {rows} calls cost ${cost:.4} (bound ${:.4}); answer: {body}",
        B + CALL
    );
    assert!(cost <= B + CALL + 1e-9, "${cost} spent on a ${B} budget");
}
