//! The HTTP API over a real port (SPEC §10.2): `agentd::api::{bind, router, serve}` against a
//! fake backend in this process, called with reqwest (and raw HTTP/1.1 where a client would
//! normalise the path). The daemon is not started here.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentd::api::backend::{
    ApiBackend, BackendError, ChatIn, ChatOutcome, NotifyAccepted, NotifyIn,
};
use agentd::api::{TokenCounts, Webhook, WebhookPayload, bind, router, serve};
use agentd::config::HttpConfig;
use agentd::cost::Period;
use agentd::message::Usage;
use agentd::metrics::{Metrics, Outcome};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use secrecy::SecretString;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "it-http-token";
const AGENT: &str = "kira";

/// The backend: canned answers, and a record of what reached it.
struct Fake {
    chat_delay: Duration,
    chats: Mutex<Vec<ChatIn>>,
    chat_done: AtomicBool,
    notifies: Mutex<Vec<NotifyIn>>,
    history_ids: Mutex<Vec<String>>,
    metrics: Metrics,
}

impl Fake {
    fn new(chat_delay: Duration) -> Fake {
        let metrics = Metrics::new();
        metrics.message_done("http", Outcome::Reply, Duration::from_millis(1200));
        metrics.llm_call(
            "primary",
            &Usage {
                input_tokens: 10,
                output_tokens: 5,
                cache_read_tokens: 100,
                cache_write_tokens: 0,
                cache_write_1h_tokens: 0,
            },
            0.01,
            Duration::from_millis(900),
        );
        metrics.tool_call("exec", true);
        Fake {
            chat_delay,
            chats: Mutex::default(),
            chat_done: AtomicBool::new(false),
            notifies: Mutex::default(),
            history_ids: Mutex::default(),
            metrics,
        }
    }
}

impl ApiBackend for Fake {
    fn chat(&self, req: ChatIn) -> BoxFuture<'_, Result<ChatOutcome, BackendError>> {
        async move {
            tokio::time::sleep(self.chat_delay).await;
            let message = req.message.clone();
            self.chats.lock().unwrap().push(req);
            self.chat_done.store(true, Ordering::SeqCst);
            Ok(ChatOutcome::Reply {
                reply: format!("you said: {message}"),
                session_id: "20260101-http".into(),
                silent: message.contains("quiet"),
                tokens: Usage {
                    input_tokens: 7,
                    output_tokens: 3,
                    cache_read_tokens: 50,
                    cache_write_tokens: 20,
                    cache_write_1h_tokens: 0,
                },
                cost_usd: 0.0123,
                attachments: vec![],
            })
        }
        .boxed()
    }

    fn notify(&self, req: NotifyIn) -> BoxFuture<'_, Result<NotifyAccepted, BackendError>> {
        async move {
            self.notifies.lock().unwrap().push(req);
            Ok(NotifyAccepted {
                accepted: true,
                queued_at: "2026-03-01T10:00:00+00:00".into(),
            })
        }
        .boxed()
    }

    fn reset(&self, target: String) -> BoxFuture<'_, Result<usize, BackendError>> {
        async move { Ok(if target == "all" { 4 } else { 1 }) }.boxed()
    }

    fn status(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        async {
            Ok(
                json!({"status": "ok", "pid": 42, "uptime_seconds": 5, "version": "0.1.0",
                      "models": ["primary"], "channels": ["http"], "active_sessions": 0,
                      "queue_depth": 0, "today_cost": 0.0}),
            )
        }
        .boxed()
    }

    fn sessions(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        async { Ok(json!({"sessions": [{"session_id": "20260101-http", "key": "http-ci"}]})) }
            .boxed()
    }

    fn cost(
        &self,
        period: Period,
        _by: Option<agentd::store::GroupBy>,
    ) -> BoxFuture<'_, Result<Value, BackendError>> {
        async move { Ok(json!({"period": period.as_str(), "total_cost": 0.5, "models": []})) }
            .boxed()
    }

    fn monitor(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        async { Ok(json!({"state": "idle", "updated_at": "2026-03-01T10:00:00Z"})) }.boxed()
    }

    fn history(
        &self,
        session_id: String,
        full: bool,
    ) -> BoxFuture<'_, Result<Option<Value>, BackendError>> {
        async move {
            self.history_ids.lock().unwrap().push(session_id.clone());
            Ok((session_id == "20260101-http").then(
                || json!({"session_id": session_id, "full": full, "events": [{"type": "user"}]}),
            ))
        }
        .boxed()
    }

    fn metrics(&self) -> BoxFuture<'_, Result<String, BackendError>> {
        async { Ok(self.metrics.render()) }.boxed()
    }
}

fn config(token: Option<&str>) -> HttpConfig {
    HttpConfig {
        enabled: true,
        host: "127.0.0.1".into(),
        port: 0,
        token_env: "AGENTD_HTTP_TOKEN".into(),
        token: token.map(SecretString::from),
        max_body_bytes: 4096,
        max_connections: 64,
        rate_limit: 1000,
        status_rate_limit: 1000,
        rate_window: Duration::from_secs(60),
        callback_url: String::new(),
        callback_token_env: String::new(),
        callback_token: None,
        callback_timeout: Duration::from_secs(5),
        cors_origins: vec!["http://localhost:3000".into()],
        console: true,
        console_secure_cookie: false,
    }
}

/// A served router on 127.0.0.1 with its fake backend.
struct Server {
    addr: SocketAddr,
    fake: Arc<Fake>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    client: reqwest::Client,
}

enum Auth {
    Token,
    None,
    Wrong,
}

/// One answer, already checked for the agent header (and the `agent` field on JSON).
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    json: Value,
    text: String,
}

impl Server {
    async fn start(cfg: HttpConfig, call_timeout: Duration, chat_delay: Duration) -> Server {
        let fake = Arc::new(Fake::new(chat_delay));
        let listener = bind(&cfg).await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().unwrap();
        let app = router(fake.clone(), &cfg, AGENT, call_timeout);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(serve(listener, app, cancel.clone(), 64));
        Server {
            addr,
            fake,
            cancel,
            task,
            client: reqwest::Client::new(),
        }
    }

    async fn default() -> Server {
        Server::start(config(Some(TOKEN)), Duration::from_secs(10), Duration::ZERO).await
    }

    async fn call(&self, method: &str, path: &str, auth: Auth, body: Option<&str>) -> Answer {
        let url = format!("http://{}{path}", self.addr);
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.client.request(method, url);
        request = match auth {
            Auth::Token => request.bearer_auth(TOKEN),
            Auth::Wrong => request.bearer_auth("not-the-token"),
            Auth::None => request,
        };
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        let response = request.send().await.expect("request reaches the server");
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        assert_eq!(
            headers.get("x-agentd-agent").map(|v| v.to_str().unwrap()),
            Some(AGENT),
            "{path}: every answer carries X-Agentd-Agent"
        );
        let json = if headers["content-type"] == "application/json" {
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["agent"], AGENT, "{path}: JSON answers carry agent: {v}");
            if !status.is_success() {
                assert!(v["error"].is_string(), "{path}: errors are {{error}}: {v}");
            }
            v
        } else {
            assert!(
                status.is_success(),
                "{path}: error answers are JSON, got {status} {text:?}"
            );
            Value::Null
        };
        Answer {
            status,
            headers,
            json,
            text,
        }
    }

    async fn get(&self, path: &str) -> Answer {
        self.call("GET", path, Auth::Token, None).await
    }

    async fn post(&self, path: &str, body: &str) -> Answer {
        self.call("POST", path, Auth::Token, Some(body)).await
    }

    /// The status code of a raw HTTP/1.1 request (the path is sent exactly as given).
    async fn raw_status(&self, path: &str) -> u16 {
        let mut stream = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n",
            self.addr
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.unwrap();
        let text = String::from_utf8_lossy(&response);
        assert!(
            text.to_ascii_lowercase().contains("x-agentd-agent: kira"),
            "{path}: {text}"
        );
        text.split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {text:?}"))
    }

    async fn stop(self) {
        self.cancel.cancel();
        let result = tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("serve returns after cancel")
            .unwrap();
        result.expect("serve ends cleanly");
        assert!(
            tokio::net::TcpStream::connect(self.addr).await.is_err(),
            "the port is closed after serve returns"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers_its_contract() {
    let s = Server::default().await;

    let a = s
        .post(
            "/api/v1/chat",
            r#"{"message":"hello","sender":"ci","context":"deploy 7","tier":"full",
                "attachments":[{"content_type":"text/plain","data":"aGVsbG8=","filename":"a.txt"}]}"#,
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(
        a.json,
        json!({"reply": "you said: [context] deploy 7\nhello", "session_id": "20260101-http",
               "silent": false, "cost_usd": 0.0123, "agent": AGENT,
               "tokens": {"input": 7, "output": 3, "cache_read": 50, "cache_write": 20}})
    );
    {
        let chats = s.fake.chats.lock().unwrap();
        assert_eq!(chats[0].sender.as_deref(), Some("ci"));
        assert_eq!(chats[0].tier.as_deref(), Some("full"));
        assert_eq!(chats[0].context, None);
        assert_eq!(chats[0].attachments[0].data, "aGVsbG8=");
    }
    let a = s.post("/api/v1/chat", r#"{"message":"be quiet"}"#).await;
    assert_eq!(a.json["silent"], true);

    let a = s
        .post(
            "/api/v1/notify",
            r#"{"message":"build failed","source":"ci","ref":"run-9","data":{"n":1},"sender":"ci"}"#,
        )
        .await;
    assert_eq!(a.status, StatusCode::ACCEPTED);
    assert_eq!(
        a.json,
        json!({"accepted": true, "queued_at": "2026-03-01T10:00:00+00:00", "agent": AGENT})
    );
    assert_eq!(
        s.fake.notifies.lock().unwrap()[0].reference.as_deref(),
        Some("run-9")
    );

    let a = s.call("GET", "/api/v1/status", Auth::None, None).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json["status"], "ok");
    assert_eq!(a.json["pid"], 42);

    let a = s.get("/api/v1/sessions").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json["sessions"][0]["key"], "http-ci");

    for (query, period) in [
        ("", "today"),
        ("?period=today", "today"),
        ("?period=week", "week"),
        ("?period=month", "month"),
        ("?period=all", "all"),
    ] {
        let a = s.get(&format!("/api/v1/cost{query}")).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.json["period"], period);
        assert_eq!(a.json["total_cost"], 0.5);
    }

    let a = s.get("/api/v1/monitor").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json["state"], "idle");

    let a = s
        .post("/api/v1/sessions/reset", r#"{"target":"all"}"#)
        .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.json,
        json!({"reset": true, "target": "all", "count": 4, "agent": AGENT})
    );

    let a = s
        .get("/api/v1/sessions/20260101-http/history?full=true")
        .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json["full"], true);
    assert_eq!(a.json["events"][0]["type"], "user");
    let a = s.get("/api/v1/sessions/20260101-http/history").await;
    assert_eq!(a.json["full"], false);
    let a = s.get("/api/v1/sessions/unknown-id/history").await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);

    let a = s.get("/metrics").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.headers["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let samples = parse_prometheus(&a.text);
    assert_eq!(
        samples.get(r#"agentd_messages_total{outcome="reply",source="http"}"#),
        Some(&1.0)
    );
    assert_eq!(
        samples.get(r#"agentd_tokens_total{kind="cache_read"}"#),
        Some(&100.0)
    );
    assert_eq!(
        samples.get(r#"agentd_llm_call_duration_seconds_bucket{le="+Inf"}"#),
        samples.get("agentd_llm_call_duration_seconds_count")
    );

    let a = s.get("/api/v1/nothing-here").await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    let a = s
        .call("DELETE", "/api/v1/sessions", Auth::Token, None)
        .await;
    assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED);

    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_is_required_everywhere_but_status() {
    let s = Server::default().await;
    let protected: [(&str, &str, Option<&str>); 8] = [
        ("POST", "/api/v1/chat", Some(r#"{"message":"hi"}"#)),
        ("POST", "/api/v1/notify", Some(r#"{"message":"hi"}"#)),
        (
            "POST",
            "/api/v1/sessions/reset",
            Some(r#"{"target":"all"}"#),
        ),
        ("GET", "/api/v1/sessions", None),
        ("GET", "/api/v1/cost", None),
        ("GET", "/api/v1/monitor", None),
        ("GET", "/api/v1/sessions/20260101-http/history", None),
        ("GET", "/metrics", None),
    ];
    for (method, path, body) in protected {
        for auth in [Auth::None, Auth::Wrong] {
            let a = s.call(method, path, auth, body).await;
            assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{method} {path}");
            assert_eq!(a.headers["www-authenticate"], "Bearer");
        }
    }
    assert!(s.fake.chats.lock().unwrap().is_empty());
    assert!(s.fake.notifies.lock().unwrap().is_empty());
    assert!(s.fake.history_ids.lock().unwrap().is_empty());
    let a = s.call("GET", "/api/v1/status", Auth::None, None).await;
    assert_eq!(a.status, StatusCode::OK);
    let a = s.call("GET", "/api/v1/status", Auth::Wrong, None).await;
    assert_eq!(a.status, StatusCode::OK);
    s.stop().await;

    // No token configured: protected endpoints are 503 naming the variable; status stays open.
    let s = Server::start(config(None), Duration::from_secs(5), Duration::ZERO).await;
    for (method, path, body) in protected {
        let a = s.call(method, path, Auth::Token, body).await;
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{method} {path}");
        assert_eq!(
            a.json["error"],
            "HTTP API token not configured: set AGENTD_HTTP_TOKEN"
        );
    }
    let a = s.call("GET", "/api/v1/status", Auth::None, None).await;
    assert_eq!(a.status, StatusCode::OK);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_400_and_never_reach_the_backend() {
    let s = Server::default().await;
    for body in [
        "{\"message\": ",
        "[1,2]",
        r#"{"sender":"ci"}"#,
        r#"{"message":42}"#,
        r#"{"message":"hi","attachments":[{"content_type":"image/png","data":"@@@"}]}"#,
    ] {
        let a = s.post("/api/v1/chat", body).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{body}: {}", a.text);
    }
    let a = s.post("/api/v1/chat", r#"{"sender":"ci"}"#).await;
    assert!(
        a.json["error"].as_str().unwrap().contains("message"),
        "{}",
        a.json
    );
    assert!(s.fake.chats.lock().unwrap().is_empty());

    let a = s.post("/api/v1/notify", r#"{"source":"ci"}"#).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(s.fake.notifies.lock().unwrap().is_empty());

    let a = s.get("/api/v1/cost?period=fortnight").await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.json["error"].as_str().unwrap().contains("fortnight"));

    for id in [
        "a.b",
        "*",
        "%00",
        "..%2F..%2Fetc",
        "%2e%2e",
        "x%20y",
        &"x".repeat(65),
    ] {
        let a = s.get(&format!("/api/v1/sessions/{id}/history")).await;
        assert!(
            a.status == StatusCode::BAD_REQUEST || a.status == StatusCode::NOT_FOUND,
            "{id}: {}",
            a.status
        );
    }
    let a = s.get("/api/v1/sessions/a/b/history").await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    let a = s.get("/api/v1/sessions/..%2F..%2Fetc/history").await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    // Paths exactly as an attacker would send them, without client-side normalisation.
    for path in [
        "/api/v1/sessions/../../etc/passwd/history",
        "/api/v1/sessions/..%2F..%2Fetc%2Fpasswd/history",
        "/api/v1/sessions/%2e%2e/history",
        "/api/v1/sessions/..%5C..%5Cx/history",
        "/api/v1/sessions/%00/history",
        "/api/v1/sessions/*/history",
    ] {
        let code = s.raw_status(path).await;
        assert!(code == 400 || code == 404, "{path}: {code}");
    }
    let a = s
        .get("/api/v1/sessions/20260101-http/history?full=perhaps")
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    let reached = s.fake.history_ids.lock().unwrap().clone();
    assert!(
        reached.iter().all(|id| !id.is_empty()
            && id.len() <= 64
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')),
        "the backend saw {reached:?}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_the_limit_are_413() {
    let s = Server::default().await;
    let big = format!(r#"{{"message":"{}"}}"#, "x".repeat(5000));
    let a = s.post("/api/v1/chat", &big).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(a.json["error"].as_str().unwrap().contains("4096"));
    let a = s.post("/api/v1/notify", &big).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(s.fake.chats.lock().unwrap().is_empty());
    // Just under the limit is fine.
    let fits = format!(r#"{{"message":"{}"}}"#, "x".repeat(4000));
    assert_eq!(s.post("/api/v1/chat", &fits).await.status, StatusCode::OK);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_answer_429_with_retry_after_per_group() {
    let mut cfg = config(Some(TOKEN));
    cfg.rate_limit = 3;
    cfg.status_rate_limit = 5;
    cfg.rate_window = Duration::from_secs(30);
    let s = Server::start(cfg, Duration::from_secs(5), Duration::ZERO).await;

    for i in 0..3 {
        let a = s.post("/api/v1/notify", r#"{"message":"n"}"#).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "POST {i}");
    }
    let a = s
        .post("/api/v1/chat", r#"{"message":"one too many"}"#)
        .await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = a.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=30).contains(&retry), "{retry}");
    assert!(s.fake.chats.lock().unwrap().is_empty());

    // The read group has its own budget: status, sessions, cost, monitor, history, metrics.
    let reads = [
        "/api/v1/status",
        "/api/v1/sessions",
        "/api/v1/cost",
        "/api/v1/monitor",
        "/metrics",
    ];
    for path in reads {
        assert_eq!(s.get(path).await.status, StatusCode::OK, "{path}");
    }
    for path in reads
        .iter()
        .chain(&["/api/v1/sessions/20260101-http/history"])
    {
        let a = s.get(path).await;
        assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{path}");
        assert!(a.headers.contains_key("retry-after"));
    }
    // Failed auth attempts count too (no unlimited token guessing).
    let a = s.call("GET", "/api/v1/sessions", Auth::Wrong, None).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_chat_is_408_and_the_work_still_completes() {
    let s = Server::start(
        config(Some(TOKEN)),
        Duration::from_millis(100),
        Duration::from_millis(600),
    )
    .await;
    let a = s.post("/api/v1/chat", r#"{"message":"long task"}"#).await;
    assert_eq!(a.status, StatusCode::REQUEST_TIMEOUT);
    let error = a.json["error"].as_str().unwrap();
    assert!(
        error.starts_with("still working after 0.1 s")
            && error.contains("session trail and the webhook"),
        "{error}"
    );
    assert!(!s.fake.chat_done.load(Ordering::SeqCst));
    tokio::time::timeout(Duration::from_secs(30), async {
        while !s.fake.chat_done.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the backend's chat completed after the 408");
    assert_eq!(s.fake.chats.lock().unwrap()[0].message, "long task");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_errors_name_the_address() {
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut cfg = config(Some(TOKEN));
    cfg.port = taken.local_addr().unwrap().port();
    let error = bind(&cfg).await.unwrap_err().to_string();
    assert!(
        error.contains(&format!("127.0.0.1:{}", cfg.port)) && error.contains("[http]"),
        "{error}"
    );
}

/// A webhook receiver that answers 500, 503, then 200, recording each attempt.
#[derive(Default)]
struct Receiver {
    attempts: AtomicU32,
    auth: Mutex<Vec<Option<String>>>,
    bodies: Mutex<Vec<Value>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_retries_until_the_receiver_accepts() {
    use axum::extract::State;
    use axum::routing::post;

    let rx = Arc::new(Receiver::default());
    let app =
        axum::Router::new()
            .route(
                "/callback",
                post(
                    |State(rx): State<Arc<Receiver>>,
                     headers: axum::http::HeaderMap,
                     body: String| async move {
                        let n = rx.attempts.fetch_add(1, Ordering::SeqCst);
                        rx.auth.lock().unwrap().push(
                            headers
                                .get("authorization")
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_owned),
                        );
                        rx.bodies
                            .lock()
                            .unwrap()
                            .push(serde_json::from_str(&body).unwrap_or(Value::Null));
                        match n {
                            0 => axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                            1 => axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            _ => axum::http::StatusCode::OK,
                        }
                    },
                ),
            )
            .with_state(rx.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let mut cfg = config(Some(TOKEN));
    cfg.callback_url = format!("http://{addr}/callback");
    cfg.callback_token_env = "AGENTD_CALLBACK_TOKEN".into();
    cfg.callback_token = Some(SecretString::from("cb-secret"));
    let webhook = Webhook::new(&cfg, AGENT).unwrap();
    assert!(webhook.is_enabled());
    let payload = WebhookPayload {
        reply: "done".into(),
        session_id: "20260101-http".into(),
        sender: "ci".into(),
        source: "system".into(),
        silent: false,
        tokens: TokenCounts {
            input: 1,
            output: 2,
            cache_read: 3,
            cache_write: 4,
        },
        notify_meta: Some(json!({"source": "ci", "ref": "run-9"})),
    };
    let started = std::time::Instant::now();
    let handle = webhook.send(payload).expect("enabled webhook spawns");
    assert!(
        started.elapsed() < Duration::from_millis(200),
        "send does not wait for the delivery"
    );
    let attempts = tokio::time::timeout(Duration::from_secs(20), handle)
        .await
        .expect("delivery finishes")
        .unwrap()
        .expect("delivered on the third attempt");
    assert_eq!(attempts, 3);
    assert_eq!(rx.attempts.load(Ordering::SeqCst), 3);
    assert!(
        started.elapsed() >= Duration::from_millis(1400),
        "backoff 0.5 s + 1 s between attempts"
    );
    let auth = rx.auth.lock().unwrap();
    assert!(
        auth.iter()
            .all(|a| a.as_deref() == Some("Bearer cb-secret")),
        "{auth:?}"
    );
    let body = &rx.bodies.lock().unwrap()[2];
    assert_eq!(
        body,
        &json!({"reply": "done", "session_id": "20260101-http", "sender": "ci",
                "source": "system", "silent": false, "agent": AGENT,
                "tokens": {"input": 1, "output": 2, "cache_read": 3, "cache_write": 4},
                "notify_meta": {"source": "ci", "ref": "run-9"}})
    );
}

/// OpenMetrics text → `series → value`, checking each line: comments are HELP/TYPE/UNIT and a
/// final EOF, every sample is `name{labels} value` with a float value and a family announced by
/// HELP and TYPE (a counter's samples are `<family>_total`). Labels are put in sorted order in
/// the key. (tests/it/metrics.rs parses the real daemon's text with the Prometheus parser.)
fn parse_prometheus(text: &str) -> BTreeMap<String, f64> {
    let mut help = BTreeSet::new();
    let mut types = BTreeMap::new();
    let mut samples = BTreeMap::new();
    let body = text.strip_suffix("# EOF\n").expect("ends with # EOF");
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help.insert(rest.split(' ').next().unwrap().to_owned());
            continue;
        }
        if line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            types.insert(name.to_owned(), kind.to_owned());
            continue;
        }
        assert!(
            !line.starts_with('#') && !line.is_empty(),
            "unexpected line {line:?}"
        );
        let (series, value) = line.rsplit_once(' ').expect("series and value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("not a float: {line:?}")),
        };
        let (name, key) = match series.split_once('{') {
            None => (series, series.to_owned()),
            Some((name, labels)) => {
                let labels = labels.strip_suffix('}').expect("labels close");
                let mut pairs: Vec<&str> = labels.split(',').collect();
                assert!(
                    pairs.iter().all(|p| p.contains("=\"") && p.ends_with('"')),
                    "{line}"
                );
                pairs.sort();
                (name, format!("{name}{{{}}}", pairs.join(",")))
            }
        };
        let family = [
            ("_total", "counter"),
            ("_bucket", "histogram"),
            ("_sum", "histogram"),
            ("_count", "histogram"),
        ]
        .iter()
        .find_map(|(suffix, kind)| {
            name.strip_suffix(suffix)
                .filter(|f| types.get(*f).is_some_and(|t| t == kind))
        })
        .unwrap_or(name);
        assert!(
            help.contains(family) && types.contains_key(family),
            "{line}"
        );
        samples.insert(key, value);
    }
    samples
}

/// SPEC §17: every answer names its request in `x-request-id` (the client's own, else a new
/// one; errors too); `[http] cors_origins` lets the listed browser origins in (preflight with
/// any header, `x-request-id` readable) and no other; `/v1/models` and `/v1/models/{id}` take
/// the token as bearer or `x-api-key`, and an unknown id is a 404 in OpenAI's envelope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_cors_and_model_lookup() {
    let s = Server::default().await;
    let url = |path: &str| format!("http://{}{path}", s.addr);

    let a = s.get("/api/v1/sessions").await;
    let id = a.headers["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(id.len(), 36, "a fresh UUID: {id}");
    let other = s.get("/api/v1/sessions").await.headers["x-request-id"].clone();
    assert_ne!(other, id.as_str());
    let a = s.call("GET", "/api/v1/sessions", Auth::Wrong, None).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert!(a.headers.contains_key("x-request-id"), "errors too");
    let r = s
        .client
        .get(url("/api/v1/status"))
        .header("x-request-id", "client-chosen-7")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "client-chosen-7");

    let preflight = |origin: &'static str| {
        s.client
            .request(reqwest::Method::OPTIONS, url("/v1/chat/completions"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization,content-type,x-stainless-os",
            )
            .send()
    };
    let r = preflight("http://localhost:3000").await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "http://localhost:3000");
    let allowed = h["access-control-allow-headers"].to_str().unwrap();
    assert!(allowed.contains("x-stainless-os"), "{allowed}");
    assert!(h.contains_key("x-request-id"));
    let r = preflight("https://evil.example").await.unwrap();
    assert!(
        !r.headers().contains_key("access-control-allow-origin"),
        "{:?}",
        r.headers()
    );
    let r = s
        .client
        .get(url("/v1/models"))
        .header("origin", "http://localhost:3000")
        .header("x-api-key", TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://localhost:3000"
    );
    let exposed = r.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap();
    assert!(exposed.contains("x-request-id"), "{exposed}");
    let listed: Value = r.json().await.unwrap();
    let first = listed["data"][0]["id"].as_str().unwrap().to_string();

    let r = s
        .client
        .get(url(&format!("/v1/models/{first}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let one: Value = r.json().await.unwrap();
    assert_eq!(one, listed["data"][0]);
    let r = s
        .client
        .get(url("/v1/models/agentd:nope"))
        .header("x-api-key", TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "not_found", "{v}");
    assert_eq!(v["error"]["param"], "model", "{v}");
    let r = s
        .client
        .get(url("/v1/models"))
        .header("x-api-key", "wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    s.stop().await;
}
