//! Router tests in process (`oneshot`) against an in-memory backend.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::ConnectInfo;
use axum::http::{Request, Response, StatusCode};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use secrecy::SecretString;
use serde_json::{Value, json};
use tower::ServiceExt as _;

use super::backend::*;
use super::router;
use crate::config::HttpConfig;
use crate::cost::Period;
use crate::llm::StreamDelta;
use crate::llm::compat::{CompatReply, ErrorKind, FinishReason};
use crate::message::Usage;

const TOKEN: &str = "test-token";

#[derive(Default)]
struct Fake {
    chat_delay: Duration,
    chats: Mutex<Vec<ChatIn>>,
    chat_finished: AtomicBool,
    history_ids: Mutex<Vec<(String, bool)>>,
    periods: Mutex<Vec<Period>>,
    groupings: Mutex<Vec<Option<crate::store::GroupBy>>>,
    panic_on_status: bool,
    compats: Mutex<Vec<CompatIn>>,
}

impl ApiBackend for Fake {
    fn chat(&self, req: ChatIn) -> BoxFuture<'_, Result<ChatOutcome, BackendError>> {
        async move {
            tokio::time::sleep(self.chat_delay).await;
            let message = req.message.clone();
            self.chats.lock().unwrap().push(req);
            self.chat_finished.store(true, Ordering::SeqCst);
            if message == "fail" {
                return Ok(ChatOutcome::Failed {
                    error: "model exploded".into(),
                    session_id: "s-fail".into(),
                });
            }
            Ok(ChatOutcome::Reply {
                reply: format!("echo: {message}"),
                session_id: "s1".into(),
                silent: false,
                tokens: Usage {
                    input_tokens: 1,
                    output_tokens: 2,
                    cache_read_tokens: 3,
                    cache_write_tokens: 4,
                    cache_write_1h_tokens: 0,
                },
                cost_usd: 0.5,
                attachments: vec![],
            })
        }
        .boxed()
    }
    fn notify(&self, _req: NotifyIn) -> BoxFuture<'_, Result<NotifyAccepted, BackendError>> {
        async {
            Ok(NotifyAccepted {
                accepted: true,
                queued_at: "2026-01-01T00:00:00Z".into(),
            })
        }
        .boxed()
    }
    fn reset(&self, target: String) -> BoxFuture<'_, Result<usize, BackendError>> {
        async move {
            match target.as_str() {
                "all" => Ok(3),
                "busy" => Err(BackendError::Unavailable("shutting down".into())),
                _ => Ok(1),
            }
        }
        .boxed()
    }
    fn status(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        async {
            assert!(!self.panic_on_status, "status exploded");
            Ok(json!({"status": "ok", "pid": 1}))
        }
        .boxed()
    }
    fn sessions(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        async { Ok(json!({"sessions": []})) }.boxed()
    }
    fn cost(
        &self,
        period: Period,
        by: Option<crate::store::GroupBy>,
    ) -> BoxFuture<'_, Result<Value, BackendError>> {
        async move {
            self.periods.lock().unwrap().push(period);
            self.groupings.lock().unwrap().push(by);
            Ok(json!({"period": period.as_str(), "total_cost": 0.0, "models": []}))
        }
        .boxed()
    }
    fn monitor(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        async { Ok(json!({"state": "idle"})) }.boxed()
    }
    fn history(
        &self,
        session_id: String,
        full: bool,
    ) -> BoxFuture<'_, Result<Option<Value>, BackendError>> {
        async move {
            self.history_ids
                .lock()
                .unwrap()
                .push((session_id.clone(), full));
            Ok((session_id == "s1").then(|| json!({"session_id": session_id, "events": []})))
        }
        .boxed()
    }
    fn metrics(&self) -> BoxFuture<'_, Result<String, BackendError>> {
        async { Ok("# HELP agentd_x X.\n# TYPE agentd_x counter\nagentd_x 1\n".to_owned()) }.boxed()
    }
    fn models(&self) -> Vec<String> {
        vec!["primary".into(), "cheap".into()]
    }
    /// By the new input's text: `busy` is refused before intake, `budget` and `model` fail
    /// after it, `slow` outlasts the call timeout, `stream` sends deltas (text, a tool batch,
    /// the final text's start); anything else is echoed.
    fn compat(&self, req: CompatIn) -> BoxFuture<'_, Result<CompatTicket, BackendError>> {
        async move {
            let text = req.request.text.clone();
            let model = req.request.model.clone();
            self.compats.lock().unwrap().push(req);
            if text == "busy" {
                return Err(BackendError::Busy("queue full".into()));
            }
            let reply = CompatReply {
                id: "i1".into(),
                session_id: String::new(),
                model,
                created: 1,
                text: format!("echo: {text}"),
                calls: vec![],
                finish: FinishReason::Stop,
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 5,
                    cache_read_tokens: 100,
                    cache_write_tokens: 20,
                    cache_write_1h_tokens: 0,
                },
            };
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            if text == "stream" {
                for d in [
                    StreamDelta::Text("Let me look.".into()),
                    StreamDelta::Tools,
                    StreamDelta::Text("echo: ".into()),
                ] {
                    tx.send(d).unwrap();
                }
            }
            let done: BoxFuture<'static, Result<CompatOutcome, BackendError>> = match text.as_str()
            {
                "budget" => async {
                    Ok(CompatOutcome::Failed {
                        kind: ErrorKind::Budget,
                        message: "daily budget of $1.00 reached".into(),
                    })
                }
                .boxed(),
                "model" => async {
                    Ok(CompatOutcome::Failed {
                        kind: ErrorKind::Upstream,
                        message: "the model failed".into(),
                    })
                }
                .boxed(),
                "slow" => async move {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    Ok(CompatOutcome::Reply(reply))
                }
                .boxed(),
                _ => async move {
                    // The deltas are read before the answer.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    drop(tx);
                    Ok(CompatOutcome::Reply(reply))
                }
                .boxed(),
            };
            Ok(CompatTicket {
                id: "i1".into(),
                session_id: "0196f3a2-7c1e-7b40-9a51-3d2f0e8c4b11".into(),
                done,
                deltas: Some(rx),
            })
        }
        .boxed()
    }
}

fn config(token: Option<&str>) -> HttpConfig {
    HttpConfig {
        enabled: true,
        host: "127.0.0.1".into(),
        port: 0,
        token_env: "AGENTD_HTTP_TOKEN".into(),
        token: token.map(SecretString::from),
        max_body_bytes: 2048,
        max_connections: 64,
        rate_limit: 100,
        status_rate_limit: 100,
        rate_window: Duration::from_secs(60),
        callback_url: String::new(),
        callback_token_env: String::new(),
        callback_token: None,
        callback_timeout: Duration::from_secs(1),
        cors_origins: Vec::new(),
        console: true,
        console_secure_cookie: false,
    }
}

fn app_with(fake: Arc<Fake>, cfg: HttpConfig, timeout: Duration) -> Router {
    router(fake, &cfg, "kira", timeout)
}

fn app() -> (Arc<Fake>, Router) {
    let fake = Arc::new(Fake::default());
    (
        fake.clone(),
        app_with(fake, config(Some(TOKEN)), Duration::from_secs(5)),
    )
}

fn req(method: &str, uri: &str, body: Option<&str>) -> Request<Body> {
    let mut b = Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {TOKEN}"));
    if body.is_some() {
        b = b.header("content-type", "application/json");
    }
    b.body(body.map(|s| Body::from(s.to_owned())).unwrap_or_default())
        .unwrap()
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, Value, Response<()>) {
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = to_bytes(body, 16 << 20).await.unwrap();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    let head = Response::from_parts(parts, ());
    (head.status(), value, head)
}

/// Every answer names the agent in the header, and JSON answers in the body.
fn assert_agent(value: &Value, head: &Response<()>) {
    assert_eq!(head.headers()["x-agentd-agent"], "kira");
    if head.headers()["content-type"] == "application/json" {
        assert_eq!(value["agent"], "kira", "{value}");
    }
}

#[tokio::test]
async fn chat_returns_the_reply_with_tokens_and_agent() {
    let (fake, app) = app();
    let (status, v, head) = send(
        &app,
        req(
            "POST",
            "/api/v1/chat",
            Some(r#"{"message":"hi","context":"ci run 7","sender":"ci"}"#),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_agent(&v, &head);
    assert_eq!(
        v,
        json!({"reply": "echo: [context] ci run 7\nhi", "session_id": "s1", "silent": false,
               "tokens": {"input": 1, "output": 2, "cache_read": 3, "cache_write": 4},
               "cost_usd": 0.5, "agent": "kira"})
    );
    let chats = fake.chats.lock().unwrap();
    assert_eq!(chats[0].context, None);
    assert_eq!(chats[0].sender.as_deref(), Some("ci"));
}

#[tokio::test]
async fn chat_failure_is_500_with_session_id() {
    let (_, app) = app();
    let (status, v, _) = send(
        &app,
        req("POST", "/api/v1/chat", Some(r#"{"message":"fail"}"#)),
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        v,
        json!({"error": "model exploded", "session_id": "s-fail", "agent": "kira"})
    );
}

#[tokio::test]
async fn chat_bad_input_is_400_naming_the_problem() {
    let (fake, app) = app();
    for (body, needle) in [
        ("{not json", "parse the request body as JSON"),
        (r#"{"sender":"x"}"#, "missing field `message`"),
        (r#"{"message":"hi","bogus":1}"#, "unknown field `bogus`"),
        (r#"{"message":"  "}"#, "message is empty"),
        (
            r#"{"message":"hi","attachments":[{"content_type":"image/png","data":"!!"}]}"#,
            "base64",
        ),
        (
            r#"{"message":"hi","attachments":[{"content_type":"nope","data":"aGk="}]}"#,
            "content_type",
        ),
    ] {
        let (status, v, head) = send(&app, req("POST", "/api/v1/chat", Some(body))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} → {v}");
        assert_agent(&v, &head);
        let error = v["error"].as_str().unwrap();
        assert!(error.contains(needle), "{body} → {error}");
    }
    assert!(fake.chats.lock().unwrap().is_empty());
}

#[tokio::test]
async fn chat_without_json_content_type_is_415() {
    let (_, app) = app();
    let request = Request::post("/api/v1/chat")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Body::from(r#"{"message":"hi"}"#))
        .unwrap();
    let (status, v, _) = send(&app, request).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(v["error"].as_str().unwrap().contains("application/json"));
}

#[tokio::test]
async fn chat_times_out_with_408_and_the_work_continues() {
    let fake = Arc::new(Fake {
        chat_delay: Duration::from_millis(300),
        ..Fake::default()
    });
    let app = app_with(fake.clone(), config(Some(TOKEN)), Duration::from_millis(50));
    let (status, v, head) = send(
        &app,
        req("POST", "/api/v1/chat", Some(r#"{"message":"slow"}"#)),
    )
    .await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
    assert_agent(&v, &head);
    let error = v["error"].as_str().unwrap();
    assert!(error.starts_with("still working after 0.05 s"), "{error}");
    assert!(!fake.chat_finished.load(Ordering::SeqCst));
    tokio::time::timeout(Duration::from_secs(5), async {
        while !fake.chat_finished.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the backend's chat finished after the 408");
}

#[tokio::test]
async fn notify_is_202() {
    let (_, app) = app();
    let (status, v, _) = send(
        &app,
        req(
            "POST",
            "/api/v1/notify",
            Some(r#"{"message":"build done","ref":"ci#7","data":{"x":1}}"#),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(
        v,
        json!({"accepted": true, "queued_at": "2026-01-01T00:00:00Z", "agent": "kira"})
    );
}

#[tokio::test]
async fn reset_reports_the_count_and_maps_backend_errors() {
    let (_, app) = app();
    let (status, v, _) = send(
        &app,
        req(
            "POST",
            "/api/v1/sessions/reset",
            Some(r#"{"target":"all"}"#),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        v,
        json!({"reset": true, "target": "all", "count": 3, "agent": "kira"})
    );
    let (status, v, _) = send(
        &app,
        req(
            "POST",
            "/api/v1/sessions/reset",
            Some(r#"{"target":"busy"}"#),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(v["error"], "shutting down");
    let (status, _, _) = send(&app, req("POST", "/api/v1/sessions/reset", Some("{}"))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn read_endpoints_answer_json_with_agent() {
    let (_, app) = app();
    for (uri, key) in [
        ("/api/v1/status", "status"),
        ("/api/v1/sessions", "sessions"),
        ("/api/v1/monitor", "state"),
        ("/api/v1/cost", "period"),
        ("/api/v1/sessions/s1/history", "events"),
    ] {
        let (status, v, head) = send(&app, req("GET", uri, None)).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {v}");
        assert_agent(&v, &head);
        assert!(v.get(key).is_some(), "{uri}: {v}");
    }
}

#[tokio::test]
async fn cost_period_defaults_to_today_and_bad_ones_are_400() {
    let (fake, app) = app();
    send(&app, req("GET", "/api/v1/cost", None)).await;
    send(&app, req("GET", "/api/v1/cost?period=WEEK", None)).await;
    let (status, v, _) = send(&app, req("GET", "/api/v1/cost?period=year", None)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("today, week, month, all")
    );
    assert_eq!(*fake.periods.lock().unwrap(), [Period::Today, Period::Week]);
    send(&app, req("GET", "/api/v1/cost?period=all&by=Source", None)).await;
    let (status, v, _) = send(&app, req("GET", "/api/v1/cost?by=contact", None)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("by: unknown grouping \"contact\": expected session, source or model"),
        "{v}"
    );
    assert_eq!(
        *fake.groupings.lock().unwrap(),
        [None, None, Some(crate::store::GroupBy::Source)]
    );
}

#[tokio::test]
async fn history_ids_are_checked_before_the_backend() {
    let (fake, app) = app();
    let (status, _, _) = send(
        &app,
        req("GET", "/api/v1/sessions/s1/history?full=true", None),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, v, _) = send(&app, req("GET", "/api/v1/sessions/nope/history", None)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(v["agent"], "kira");
    for uri in [
        "/api/v1/sessions/..%2F..%2Fetc/history",
        "/api/v1/sessions/a/b/history",
        "/api/v1/sessions/*/history",
        "/api/v1/sessions/%00/history",
        "/api/v1/sessions/a.b/history",
        "/api/v1/sessions/%2e%2e/history",
    ] {
        let (status, v, head) = send(&app, req("GET", uri, None)).await;
        assert!(
            status == StatusCode::BAD_REQUEST || status == StatusCode::NOT_FOUND,
            "{uri}: {status}"
        );
        assert_agent(&v, &head);
    }
    let (status, _, _) = send(
        &app,
        req("GET", "/api/v1/sessions/s1/history?full=maybe", None),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        *fake.history_ids.lock().unwrap(),
        [("s1".to_owned(), true), ("nope".to_owned(), false)]
    );
}

#[tokio::test]
async fn metrics_is_openmetrics_text_with_the_agent_header() {
    let (_, app) = app();
    let (status, v, head) = send(&app, req("GET", "/metrics", None)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        head.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert_eq!(head.headers()["x-agentd-agent"], "kira");
    assert!(v.as_str().unwrap().contains("agentd_x 1"));
}

#[tokio::test]
async fn auth_401_503_and_open_status() {
    let (_, app) = app();
    for auth in [None, Some("Bearer wrong"), Some("Basic dGVzdA==")] {
        let mut b = Request::get("/api/v1/sessions");
        if let Some(a) = auth {
            b = b.header("authorization", a);
        }
        let (status, v, head) = send(&app, b.body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{auth:?}");
        assert_eq!(head.headers()["www-authenticate"], "Bearer");
        assert_agent(&v, &head);
    }
    let (status, _, _) = send(
        &app,
        Request::get("/api/v1/status").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    let fake = Arc::new(Fake::default());
    let open = app_with(fake, config(None), Duration::from_secs(1));
    let (status, v, _) = send(&open, req("GET", "/metrics", None)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        v["error"],
        "HTTP API token not configured: set AGENTD_HTTP_TOKEN"
    );
    let (status, _, _) = send(&open, req("GET", "/api/v1/status", None)).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn unknown_routes_and_methods_are_json() {
    let (_, app) = app();
    let (status, v, head) = send(&app, Request::get("/nope").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_agent(&v, &head);
    assert_eq!(v["error"], "no such endpoint: GET /nope");
    let (status, v, head) = send(&app, req("GET", "/api/v1/chat", None)).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_agent(&v, &head);
    assert!(v["error"].is_string());
}

#[tokio::test]
async fn bodies_over_the_limit_are_413_json() {
    let (fake, app) = app();
    let big = format!(r#"{{"message":"{}"}}"#, "x".repeat(4096));
    let (status, v, head) = send(&app, req("POST", "/api/v1/chat", Some(&big))).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_agent(&v, &head);
    assert!(v["error"].as_str().unwrap().contains("2048"), "{v}");
    // Without a Content-Length (streamed body) the limit still holds.
    let stream = futures::stream::iter(vec![Ok::<_, std::io::Error>(big.clone())]);
    let request = Request::post("/api/v1/chat")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap();
    let (status, v, _) = send(&app, request).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(v["error"].as_str().unwrap().contains("max_body_bytes"));
    assert!(fake.chats.lock().unwrap().is_empty());
}

fn from(ip: &str, mut request: Request<Body>) -> Request<Body> {
    let addr: SocketAddr = format!("{ip}:1234").parse().unwrap();
    request.extensions_mut().insert(ConnectInfo(addr));
    request
}

#[tokio::test]
async fn rate_limits_are_per_group_and_per_ip() {
    let fake = Arc::new(Fake::default());
    let mut cfg = config(Some(TOKEN));
    cfg.rate_limit = 2;
    cfg.status_rate_limit = 3;
    let app = app_with(fake, cfg, Duration::from_secs(5));
    let notify = || req("POST", "/api/v1/notify", Some(r#"{"message":"m"}"#));
    for _ in 0..2 {
        let (status, _, _) = send(&app, from("10.0.0.1", notify())).await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
    let (status, v, head) = send(&app, from("10.0.0.1", notify())).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_agent(&v, &head);
    let retry: u64 = head.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry));
    // Another address, and the read group, are unaffected.
    let (status, _, _) = send(&app, from("10.0.0.2", notify())).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    for _ in 0..3 {
        let (status, _, _) = send(&app, from("10.0.0.1", req("GET", "/api/v1/status", None))).await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, _, head) = send(&app, from("10.0.0.1", req("GET", "/metrics", None))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(head.headers().contains_key("retry-after"));
}

#[tokio::test]
async fn a_panicking_handler_is_a_json_500() {
    let fake = Arc::new(Fake {
        panic_on_status: true,
        ..Fake::default()
    });
    let app = app_with(fake, config(Some(TOKEN)), Duration::from_secs(1));
    let (status, v, head) = send(&app, req("GET", "/api/v1/status", None)).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_agent(&v, &head);
}

#[tokio::test]
async fn the_configured_limit_replaces_axums_2_mb_default() {
    let fake = Arc::new(Fake::default());
    let mut cfg = config(Some(TOKEN));
    cfg.max_body_bytes = 4 * 1024 * 1024;
    let app = app_with(fake.clone(), cfg, Duration::from_secs(5));
    let body = format!(r#"{{"message":"{}"}}"#, "x".repeat(3 * 1024 * 1024));
    let (status, v, _) = send(&app, req("POST", "/api/v1/chat", Some(&body))).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(fake.chats.lock().unwrap()[0].message.len(), 3 * 1024 * 1024);
}

/// Property tests: request bodies, paths and headers are outside input.
mod prop {
    use proptest::prelude::*;

    use super::*;
    use crate::proptest_json::{any_json, edits, mutate};

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn post(uri: &str, body: Vec<u8>, content_type: Option<&str>) -> Request<Body> {
        let mut b = Request::builder()
            .method("POST")
            .uri(uri)
            .header("authorization", format!("Bearer {TOKEN}"));
        if let Some(ct) = content_type {
            b = b.header("content-type", ct);
        }
        b.body(Body::from(body)).unwrap()
    }

    /// A valid body for each POST endpoint.
    fn valid_body(uri: &str) -> Value {
        match uri {
            "/api/v1/chat" => {
                json!({"message": "hi", "sender": "svc", "context": "c", "tier": "full",
                "attachments": [{"content_type": "image/png", "data": "aGk=", "filename": "a.png"}]})
            }
            "/api/v1/notify" => {
                json!({"message": "built", "source": "ci", "ref": "#1", "data": {"n": 1}, "sender": "ci"})
            }
            _ => json!({"target": "alice"}),
        }
    }

    fn endpoint() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            Just("/api/v1/chat"),
            Just("/api/v1/notify"),
            Just("/api/v1/sessions/reset")
        ]
    }

    /// Bodies as clients get them wrong: raw bytes, any JSON, a valid body with edits, and
    /// bodies over the 2048-byte limit of the test config.
    fn body(uri: &'static str) -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..200),
            any_json().prop_map(|v| v.to_string().into_bytes()),
            edits(3).prop_map(move |e| mutate(&valid_body(uri), &e).to_string().into_bytes()),
            (2000usize..3000)
                .prop_map(|n| format!(r#"{{"message":"{}"}}"#, "x".repeat(n)).into_bytes()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// Whatever the body and content type, a POST gets a JSON answer whose status is one
        /// of the documented ones: success, 400 (bad JSON or fields), 413 (too large), 415
        /// (not JSON), or the backend's own 500 / 503 — never a panic or another 5xx — and an
        /// error answer says what was wrong in `error`.
        #[test]
        fn any_post_body_gets_a_documented_answer(
            (uri, body) in endpoint().prop_flat_map(|u| (Just(u), body(u))),
            content_type in prop_oneof![Just(Some("application/json")), Just(None), Just(Some("text/plain")), Just(Some("application/json; charset=utf-8"))],
        ) {
            let (fake, app) = app();
            let (status, v, head) = rt().block_on(send(&app, post(uri, body.clone(), content_type)));
            assert_agent(&v, &head);
            let chat = fake.chats.lock().unwrap().pop();
            let allowed = match status.as_u16() {
                200 => uri != "/api/v1/notify",
                202 => uri == "/api/v1/notify",
                400 | 413 | 415 | 422 => true,
                // The fake backend fails the message "fail" and the reset target "busy".
                500 => chat.as_ref().is_some_and(|c| c.message == "fail"),
                503 => serde_json::from_slice::<Value>(&body).is_ok_and(|b| b["target"] == "busy"),
                _ => false,
            };
            prop_assert!(allowed, "{uri} answered {status}: {v}");
            if status.as_u16() >= 400 {
                prop_assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
            }
            if status == StatusCode::OK && uri == "/api/v1/chat" {
                prop_assert!(chat.is_some_and(|c| !c.message.trim().is_empty()));
            }
        }

        /// The documented output for good input: `/chat` passes the message on with the context
        /// folded in as `[context] …` and answers the backend's reply.
        #[test]
        fn chat_messages_reach_the_backend_as_sent(
            message in "\\PC{1,80}",
            context in proptest::option::of("\\PC{0,40}"),
            sender in proptest::option::of("[a-z0-9_-]{1,20}"),
        ) {
            prop_assume!(!message.trim().is_empty() && message != "fail");
            let (fake, app) = app();
            let body = json!({"message": message, "context": context, "sender": sender});
            let (status, v, _) = rt().block_on(send(&app, post("/api/v1/chat", body.to_string().into_bytes(), Some("application/json"))));
            prop_assert_eq!(status, StatusCode::OK, "{}", v);
            let want = match context.as_deref().filter(|c| !c.trim().is_empty()) {
                Some(c) => format!("[context] {c}\n{message}"),
                None => message.clone(),
            };
            let echo = format!("echo: {want}");
            prop_assert_eq!(v["reply"].as_str(), Some(echo.as_str()));
            let chat = fake.chats.lock().unwrap().pop().unwrap();
            prop_assert_eq!(chat.sender, sender);
        }

        /// Any path and query under the API gets a JSON answer, never a panic; unknown ones are
        /// 404/405, history ids outside `[A-Za-z0-9_-]{1,64}` are refused before the backend.
        #[test]
        fn any_get_path_gets_a_json_answer(path in "/(api/v1/)?[a-z/._%*?=&-]{0,40}") {
            let (fake, app) = app();
            let Ok(request) = Request::builder()
                .method("GET")
                .uri(&path)
                .header("authorization", format!("Bearer {TOKEN}"))
                .body(Body::empty())
            else {
                return Ok(());
            };
            let (status, v, head) = rt().block_on(send(&app, request));
            prop_assert!(matches!(status.as_u16(), 200 | 400 | 404 | 405), "{path}: {status} {v}");
            if head.headers()["content-type"] == "application/json" && status.as_u16() >= 400 {
                prop_assert!(v["error"].is_string(), "{v}");
            }
            for (id, _) in fake.history_ids.lock().unwrap().iter() {
                prop_assert!(crate::api::handlers::is_session_id(id), "{id:?} reached the backend");
            }
        }
    }
}

// ---- the compatible endpoints (SPEC §17) ----------------------------------------------------

fn compat_req(uri: &str, body: Value, auth: (&str, &str)) -> Request<Body> {
    Request::builder()
        .method("POST")
        .uri(uri)
        .header(auth.0, auth.1)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn chat_body(text: &str) -> Value {
    json!({"model": "agentd", "messages": [{"role": "user", "content": text}]})
}

fn bearer() -> (&'static str, String) {
    ("authorization", format!("Bearer {TOKEN}"))
}

#[tokio::test]
async fn models_list_the_default_and_each_model_without_our_agent_field() {
    let (_, app) = app();
    let (status, v, head) = send(&app, req("GET", "/v1/models", None)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(head.headers()["x-agentd-agent"], "kira");
    assert!(v.get("agent").is_none(), "{v}");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["agentd", "agentd:primary", "agentd:cheap"]);
}

#[tokio::test]
async fn chat_completions_answer_with_usage_and_pass_the_headers_on() {
    let (fake, app) = app();
    let (b0, b1) = bearer();
    let mut r = compat_req("/v1/chat/completions", chat_body("hi"), (b0, &b1));
    r.headers_mut()
        .insert("x-agentd-session", "alice".parse().unwrap());
    r.headers_mut()
        .insert("idempotency-key", "k-1".parse().unwrap());
    let (status, v, _) = send(&app, r).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], "echo: hi");
    assert_eq!(v["usage"]["prompt_tokens"], 130);
    assert!(v.get("agent").is_none());
    let seen = fake.compats.lock().unwrap();
    assert_eq!(seen[0].session_header.as_deref(), Some("alice"));
    assert_eq!(seen[0].idempotency_key.as_deref(), Some("k-1"));
    assert_eq!(seen[0].api, crate::llm::compat::Api::OpenAi);
}

#[tokio::test]
async fn messages_take_x_api_key_and_answer_in_anthropics_shape() {
    let (_, app) = app();
    let body = json!({"model": "agentd", "max_tokens": 100,
                      "messages": [{"role": "user", "content": "hi"}]});
    let (status, v, _) = send(
        &app,
        compat_req("/v1/messages", body.clone(), ("x-api-key", TOKEN)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["text"], "echo: hi");
    assert_eq!(v["usage"]["cache_read_input_tokens"], 100);
    // x-api-key is not accepted on the OpenAI route, and a wrong key is 401 in each envelope.
    let (status, v, head) = send(
        &app,
        compat_req(
            "/v1/chat/completions",
            chat_body("hi"),
            ("x-api-key", TOKEN),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(v["error"]["type"], "authentication_error", "{v}");
    assert_eq!(head.headers()["x-should-retry"], "false");
    let (status, v, _) = send(
        &app,
        compat_req("/v1/messages", body, ("x-api-key", "nope")),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        v,
        json!({"type": "error", "error": {"type": "authentication_error",
            "message": "missing or wrong API token: send Authorization: Bearer <token> or x-api-key: <token>"},
            "request_id": null})
    );
}

#[tokio::test]
async fn refusals_and_failures_use_each_envelope_and_say_whether_to_retry() {
    let (fake, app) = app();
    let (b0, b1) = bearer();
    let tools = json!({"model": "agentd", "messages": [{"role": "user", "content": "x"}],
                       "functions": [{"name": "f"}]});
    let (status, v, head) = send(&app, compat_req("/v1/chat/completions", tools, (b0, &b1))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["param"], "functions");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("send the same definitions as `tools`")
    );
    assert_eq!(head.headers()["x-should-retry"], "false");
    assert!(
        fake.compats.lock().unwrap().is_empty(),
        "refused before the backend"
    );

    let cases = [
        (
            "budget",
            429,
            "insufficient_quota",
            "rate_limit_error",
            Some("false"),
        ),
        ("model", 502, "server_error", "api_error", Some("false")),
        ("busy", 429, "rate_limit_error", "rate_limit_error", None),
    ];
    for (text, code, openai_type, anthropic_type, retry) in cases {
        let (status, v, head) = send(
            &app,
            compat_req("/v1/chat/completions", chat_body(text), (b0, &b1)),
        )
        .await;
        assert_eq!(status.as_u16(), code, "{text}: {v}");
        assert_eq!(v["error"]["type"], openai_type, "{text}: {v}");
        assert_eq!(
            head.headers()
                .get("x-should-retry")
                .map(|h| h.to_str().unwrap()),
            retry,
            "{text}"
        );
        let body = json!({"model": "agentd", "max_tokens": 10,
                          "messages": [{"role": "user", "content": text}]});
        let (status, v, _) = send(&app, compat_req("/v1/messages", body, (b0, &b1))).await;
        assert_eq!(status.as_u16(), code, "{text}: {v}");
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], anthropic_type, "{text}: {v}");
    }
}

#[tokio::test]
async fn a_slow_answer_is_408_that_must_not_be_retried() {
    let fake = Arc::new(Fake::default());
    let app = app_with(fake, config(Some(TOKEN)), Duration::from_millis(100));
    let (b0, b1) = bearer();
    let (status, v, head) = send(
        &app,
        compat_req("/v1/chat/completions", chat_body("slow"), (b0, &b1)),
    )
    .await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT, "{v}");
    assert_eq!(head.headers()["x-should-retry"], "false");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("session trail")
    );
}

#[tokio::test]
async fn compat_bodies_over_the_limit_are_413_in_the_envelope() {
    let (_, app) = app();
    let (b0, b1) = bearer();
    let big = chat_body(&"x".repeat(4096));
    let (status, v, _) = send(&app, compat_req("/v1/chat/completions", big, (b0, &b1))).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_body_bytes"),
        "{v}"
    );
}

/// The text of every SSE `data:` line, and the comments and event names, in order.
fn sse_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn a_streamed_chat_sends_the_text_a_keep_alive_at_tools_and_ends_with_done() {
    let (_, app) = app();
    let (b0, b1) = bearer();
    let mut body = chat_body("stream");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (status, v, head) = send(&app, compat_req("/v1/chat/completions", body, (b0, &b1))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(head.headers()["content-type"], "text/event-stream");
    assert_eq!(
        head.headers()["x-accel-buffering"],
        "no",
        "nginx must not buffer it"
    );
    let lines = sse_lines(v.as_str().unwrap());
    let mut content = String::new();
    let mut keep_alive_at = None;
    for (n, l) in lines.iter().enumerate() {
        if l.starts_with(':') {
            keep_alive_at.get_or_insert(n);
        }
        if let Some(data) = l.strip_prefix("data: ")
            && data != "[DONE]"
        {
            let c: Value = serde_json::from_str(data).unwrap();
            if let Some(t) = c["choices"][0]["delta"]["content"].as_str() {
                content.push_str(t);
            }
        }
    }
    // The text of the turn that called tools, then the answer as a new paragraph.
    assert_eq!(content, "Let me look.\n\necho: stream");
    assert!(keep_alive_at.is_some(), "{lines:?}");
    assert_eq!(lines.last().unwrap(), "data: [DONE]");
    let usage: Value =
        serde_json::from_str(lines[lines.len() - 2].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(usage["usage"]["total_tokens"], 135);
}

#[tokio::test]
async fn a_streamed_message_follows_anthropics_event_sequence() {
    let (_, app) = app();
    let body = json!({"model": "agentd", "max_tokens": 10, "stream": true,
                      "messages": [{"role": "user", "content": "stream"}]});
    let (status, v, _) = send(&app, compat_req("/v1/messages", body, ("x-api-key", TOKEN))).await;
    assert_eq!(status, StatusCode::OK);
    let lines = sse_lines(v.as_str().unwrap());
    let events: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(events.first(), Some(&"message_start"));
    assert_eq!(
        &events[events.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert!(events.contains(&"ping"), "{events:?}");
    let failed = json!({"model": "agentd", "max_tokens": 10, "stream": true,
                        "messages": [{"role": "user", "content": "model"}]});
    let (_, v, _) = send(
        &app,
        compat_req("/v1/messages", failed, ("x-api-key", TOKEN)),
    )
    .await;
    let text = v.as_str().unwrap();
    assert!(text.contains("event: error\ndata: {\"error\":{\"message\":\"the model failed\",\"type\":\"api_error\"},\"request_id\":null,\"type\":\"error\"}"), "{text}");
}
