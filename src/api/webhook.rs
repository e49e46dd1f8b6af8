//! The callback POSTed after every processed message (SPEC §10.2 "Webhook").
//!
//! [`Webhook::send`] spawns the delivery and returns at once; at most [`MAX_IN_FLIGHT`]
//! deliveries run at a time (beyond that a payload is dropped, so a dead receiver cannot grow
//! memory). Each delivery makes up to [`MAX_ATTEMPTS`] attempts, retrying connect errors, 429
//! and 5xx after 0.5 s, 1 s, …. A redirect is followed only within the callback URL's origin
//! (scheme, host and port): the payload and the token never go to another origin. Every
//! callback's outcome (delivered, failed, dropped) is counted in `/metrics` and the monitor;
//! drops are logged at most once per [`DROP_LOG_EVERY`] with the count since the last line.
//! Logs never contain the token or the URL.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::header::AUTHORIZATION;
use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::error::ApiError;
use crate::backoff::Backoff;
use crate::config::HttpConfig;
use crate::message::Usage;
use crate::metrics::Metrics;
use crate::monitor::{Monitor, WebhookCounts};
use crate::net::scrub::reqwest_error_text;

/// Attempts per delivery.
pub const MAX_ATTEMPTS: u32 = 3;
/// Deliveries running at once.
pub const MAX_IN_FLIGHT: usize = 64;
/// Redirects followed within the callback URL's origin.
pub const MAX_REDIRECTS: usize = 5;
/// At most one log line per this long about dropped callbacks.
pub const DROP_LOG_EVERY: Duration = Duration::from_secs(60);
/// Waits before the 2nd, 3rd, … attempt.
static BACKOFF: [Duration; 3] = [
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

/// Token totals as the HTTP API shows them: `{input, output, cache_read, cache_write}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TokenCounts {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

impl From<&Usage> for TokenCounts {
    fn from(u: &Usage) -> TokenCounts {
        TokenCounts {
            input: u.input_tokens,
            output: u.output_tokens,
            cache_read: u.cache_read_tokens,
            cache_write: u.cache_write_tokens,
        }
    }
}

/// What the daemon reports after a processed message; the webhook adds `agent`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WebhookPayload {
    pub reply: String,
    pub session_id: String,
    pub sender: String,
    /// `telegram`, `user`, `system`, `http`, …
    pub source: String,
    pub silent: bool,
    pub tokens: TokenCounts,
    /// For notifications: `{source, ref, data}` as received.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notify_meta: Option<Value>,
}

/// The body on the wire.
#[derive(Serialize)]
struct Wire<'a> {
    #[serde(flatten)]
    payload: &'a WebhookPayload,
    agent: &'a str,
}

/// Why a delivery gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookError {
    /// `[http] callback_url` is empty.
    #[error("the webhook is disabled ([http] callback_url is empty)")]
    Disabled,
    /// The receiver answered with a status that is not retried, or kept failing.
    #[error("the webhook receiver answered HTTP {status} (after {attempts} attempt(s))")]
    Status { status: u16, attempts: u32 },
    /// The request failed (connect error, timeout, …).
    #[error("the webhook request failed after {attempts} attempt(s): {error}")]
    Request { error: String, attempts: u32 },
}

struct Target {
    client: reqwest::Client,
    url: String,
    token: Option<SecretString>,
    agent: String,
    backoff: Backoff,
}

/// The webhook client; cheap to clone.
#[derive(Clone)]
pub struct Webhook {
    target: Option<Arc<Target>>,
    in_flight: Arc<Semaphore>,
    tally: Arc<Tally>,
}

/// What became of the callbacks, and where that is shown.
#[derive(Default)]
struct Tally {
    counts: Mutex<WebhookCounts>,
    metrics: Option<Arc<Metrics>>,
    monitor: Option<Arc<Monitor>>,
    /// When a drop was last logged, and the drops since then that were not.
    drop_log: Mutex<(Option<Instant>, u64)>,
}

/// How a callback ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Delivered,
    Failed,
    Dropped,
}

impl Tally {
    fn count(&self, ending: Ending) {
        let counts = {
            let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
            match ending {
                Ending::Delivered => c.delivered += 1,
                Ending::Failed => c.failed += 1,
                Ending::Dropped => c.dropped += 1,
            }
            *c
        };
        if let Some(m) = &self.metrics {
            m.webhook(match ending {
                Ending::Delivered => "delivered",
                Ending::Failed => "failed",
                Ending::Dropped => "dropped",
            });
        }
        if let Some(m) = &self.monitor {
            m.set_webhook(counts);
        }
    }

    /// Count a dropped callback; log it unless a drop was logged less than
    /// [`DROP_LOG_EVERY`] ago (the next line says how many were not).
    fn dropped(&self, session_id: &str) {
        self.count(Ending::Dropped);
        let mut log = self.drop_log.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if log
            .0
            .is_some_and(|t| now.duration_since(t) < DROP_LOG_EVERY)
        {
            log.1 += 1;
            return;
        }
        tracing::warn!(
            session_id = %session_id,
            limit = MAX_IN_FLIGHT,
            also_dropped_since_last_line = log.1,
            "webhook deliveries in flight are at their bound; this callback is dropped (counted in /metrics agentd_webhooks_total{{outcome=\"dropped\"}} and monitor.json webhook.dropped)"
        );
        *log = (Some(now), 0);
    }
}

/// Follow a redirect only to the origin (scheme, host, port) of the URL first asked, at most
/// [`MAX_REDIRECTS`] times; a redirect elsewhere is not followed, and its 3xx is the answer
/// (a failed delivery).
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same = attempt
            .previous()
            .first()
            .is_some_and(|first| same_origin(first, attempt.url()));
        if !same {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    })
}

fn same_origin(a: &reqwest::Url, b: &reqwest::Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("enabled", &self.is_enabled())
            .finish_non_exhaustive()
    }
}

impl Webhook {
    /// From `[http] callback_url`, `callback_token` and `callback_timeout` (empty URL →
    /// disabled). `agent_name` goes into every payload.
    pub fn new(cfg: &HttpConfig, agent_name: &str) -> Result<Webhook, ApiError> {
        let target = if cfg.callback_url.trim().is_empty() {
            None
        } else {
            let client = crate::net::tls::client_builder()
                .timeout(cfg.callback_timeout)
                .connect_timeout(cfg.callback_timeout)
                .redirect(same_origin_redirects())
                .build()
                .map_err(|e| ApiError::WebhookClient(reqwest_error_text(e)))?;
            Some(Arc::new(Target {
                client,
                url: cfg.callback_url.trim().to_owned(),
                token: cfg.callback_token.clone(),
                agent: agent_name.to_owned(),
                backoff: Backoff::steps(&BACKOFF),
            }))
        };
        Ok(Webhook {
            target,
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            tally: Arc::default(),
        })
    }

    /// Count every callback's outcome in `metrics` (`agentd_webhooks_total`) and `monitor`
    /// (`webhook`). Call before the first send.
    pub fn observed(mut self, metrics: Arc<Metrics>, monitor: Arc<Monitor>) -> Webhook {
        if self.is_enabled() {
            monitor.set_webhook(WebhookCounts::default());
        }
        self.tally = Arc::new(Tally {
            metrics: Some(metrics),
            monitor: Some(monitor),
            ..Tally::default()
        });
        self
    }

    /// Callbacks delivered, failed and dropped since the start.
    pub fn counts(&self) -> WebhookCounts {
        *self.tally.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Shorter waits between attempts (tests).
    #[cfg(test)]
    fn with_backoff(mut self, backoff: Backoff) -> Webhook {
        if let Some(t) = self.target.take() {
            let t = Arc::try_unwrap(t).unwrap_or_else(|_| unreachable!("not shared yet"));
            self.target = Some(Arc::new(Target { backoff, ..t }));
        }
        self
    }

    /// True when a callback URL is configured.
    pub fn is_enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Delivers `payload` in the background and returns at once (needs a tokio runtime).
    /// `None` when disabled or when [`MAX_IN_FLIGHT`] deliveries are already running (the
    /// payload is dropped, counted, and logged at most once a minute). Failures are counted
    /// and logged; awaiting the handle is optional.
    pub fn send(&self, payload: WebhookPayload) -> Option<JoinHandle<Result<u32, WebhookError>>> {
        self.target.as_ref()?;
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            self.tally.dropped(&payload.session_id);
            return None;
        };
        let webhook = self.clone();
        Some(tokio::spawn(async move {
            let result = webhook.deliver(&payload).await;
            webhook.tally.count(if result.is_ok() {
                Ending::Delivered
            } else {
                Ending::Failed
            });
            match &result {
                Ok(attempts) => tracing::debug!(
                    session_id = %payload.session_id,
                    attempts,
                    "webhook delivered"
                ),
                Err(e) => tracing::warn!(
                    session_id = %payload.session_id,
                    error = %e,
                    "webhook delivery failed"
                ),
            }
            drop(permit);
            result
        }))
    }

    /// Delivers `payload` now; `Ok(attempts)` once the receiver answered 2xx.
    pub async fn deliver(&self, payload: &WebhookPayload) -> Result<u32, WebhookError> {
        let target = self.target.as_ref().ok_or(WebhookError::Disabled)?;
        let body = Wire {
            payload,
            agent: &target.agent,
        };
        let mut attempt = 0;
        let mut backoff = target.backoff.clone();
        loop {
            attempt += 1;
            let mut request = target.client.post(&target.url).json(&body);
            if let Some(token) = &target.token {
                request =
                    request.header(AUTHORIZATION, format!("Bearer {}", token.expose_secret()));
            }
            let (retry, error) = match request.send().await {
                Ok(response) if response.status().is_success() => return Ok(attempt),
                Ok(response) => {
                    let status = response.status();
                    (
                        retryable_status(status),
                        WebhookError::Status {
                            status: status.as_u16(),
                            attempts: attempt,
                        },
                    )
                }
                Err(e) => (
                    e.is_connect(),
                    WebhookError::Request {
                        error: reqwest_error_text(e),
                        attempts: attempt,
                    },
                ),
            };
            if !retry || attempt >= MAX_ATTEMPTS {
                return Err(error);
            }
            let wait = backoff.next_delay();
            tracing::debug!(attempt, error = %error, ?wait, "webhook attempt failed; retrying");
            tokio::time::sleep(wait).await;
        }
    }
}

/// 429 and 5xx are worth another attempt.
fn retryable_status(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    use axum::Router;
    use axum::extract::State;
    use axum::http::HeaderMap;
    use axum::routing::post;

    fn config(url: &str, token: Option<&str>) -> HttpConfig {
        HttpConfig {
            enabled: true,
            host: "127.0.0.1".into(),
            port: 0,
            token_env: "AGENTD_HTTP_TOKEN".into(),
            token: None,
            max_body_bytes: 1024,
            max_connections: 64,
            rate_limit: 10,
            status_rate_limit: 10,
            rate_window: Duration::from_secs(60),
            callback_url: url.into(),
            callback_token_env: "CB".into(),
            callback_token: token.map(SecretString::from),
            callback_timeout: Duration::from_secs(5),
            cors_origins: Vec::new(),
            console: true,
            console_secure_cookie: false,
        }
    }

    fn payload() -> WebhookPayload {
        WebhookPayload {
            reply: "hi".into(),
            session_id: "s1".into(),
            sender: "ci".into(),
            source: "http".into(),
            silent: false,
            tokens: TokenCounts {
                input: 1,
                output: 2,
                cache_read: 3,
                cache_write: 4,
            },
            notify_meta: None,
        }
    }

    #[derive(Default)]
    struct Receiver {
        hits: AtomicU32,
        statuses: Vec<u16>,
        seen: Mutex<Vec<(Option<String>, Value)>>,
    }

    /// A receiver answering `statuses` in turn (200 after the list ends).
    async fn receiver(statuses: Vec<u16>) -> (String, Arc<Receiver>) {
        let rx = Arc::new(Receiver {
            statuses,
            ..Receiver::default()
        });
        let app = Router::new()
            .route(
                "/hook",
                post(
                    |State(rx): State<Arc<Receiver>>, headers: HeaderMap, body: String| async move {
                        let n = rx.hits.fetch_add(1, Ordering::SeqCst) as usize;
                        let auth = headers
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned);
                        let json = serde_json::from_str(&body).unwrap_or(Value::Null);
                        rx.seen.lock().unwrap().push((auth, json));
                        let code = rx.statuses.get(n).copied().unwrap_or(200);
                        axum::http::StatusCode::from_u16(code).unwrap()
                    },
                ),
            )
            .with_state(rx.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{addr}/hook"), rx)
    }

    fn fast(url: &str, token: Option<&str>) -> Webhook {
        Webhook::new(&config(url, token), "kira")
            .unwrap()
            .with_backoff(
                Backoff::exponential(Duration::from_millis(10), Duration::from_millis(10)).exact(),
            )
    }

    #[tokio::test]
    async fn disabled_without_a_url() {
        let w = Webhook::new(&config("", None), "kira").unwrap();
        assert!(!w.is_enabled());
        assert!(w.send(payload()).is_none());
        assert_eq!(w.deliver(&payload()).await, Err(WebhookError::Disabled));
    }

    #[tokio::test]
    async fn posts_the_payload_with_agent_and_bearer() {
        let (url, rx) = receiver(vec![]).await;
        let w = fast(&url, Some("cb-token"));
        let attempts = w.send(payload()).unwrap().await.unwrap().unwrap();
        assert_eq!(attempts, 1);
        let seen = rx.seen.lock().unwrap();
        assert_eq!(seen[0].0.as_deref(), Some("Bearer cb-token"));
        assert_eq!(
            seen[0].1,
            serde_json::json!({
                "reply": "hi", "session_id": "s1", "sender": "ci", "source": "http",
                "silent": false, "agent": "kira",
                "tokens": {"input": 1, "output": 2, "cache_read": 3, "cache_write": 4}
            })
        );
    }

    #[tokio::test]
    async fn retries_5xx_and_429_then_succeeds() {
        let (url, rx) = receiver(vec![503, 429]).await;
        let w = fast(&url, None);
        assert_eq!(w.deliver(&payload()).await, Ok(3));
        assert_eq!(rx.hits.load(Ordering::SeqCst), 3);
        assert_eq!(rx.seen.lock().unwrap()[0].0, None);
    }

    #[tokio::test]
    async fn gives_up_after_three_attempts() {
        let (url, rx) = receiver(vec![500, 500, 500, 500]).await;
        let w = fast(&url, None);
        assert_eq!(
            w.deliver(&payload()).await,
            Err(WebhookError::Status {
                status: 500,
                attempts: 3
            })
        );
        assert_eq!(rx.hits.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn client_errors_are_not_retried() {
        let (url, rx) = receiver(vec![400]).await;
        let w = fast(&url, None);
        assert!(matches!(
            w.deliver(&payload()).await,
            Err(WebhookError::Status {
                status: 400,
                attempts: 1
            })
        ));
        assert_eq!(rx.hits.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn connect_errors_are_retried_and_reported_without_the_token() {
        // A port that was just free: nothing listens there.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let w = fast(
            &format!("http://{addr}/hook?key=secret-in-url"),
            Some("cb-token"),
        );
        match w.deliver(&payload()).await {
            Err(WebhookError::Request { error, attempts }) => {
                assert_eq!(attempts, 3);
                assert!(
                    !error.contains("cb-token") && !error.contains("secret-in-url"),
                    "{error}"
                );
            }
            other => panic!("expected a request error, got {other:?}"),
        }
    }

    /// A receiver whose `/hook` answers 307 to `location`.
    async fn redirecting(location: String) -> String {
        let app = Router::new().route(
            "/hook",
            post(move || {
                let location = location.clone();
                async move {
                    (
                        axum::http::StatusCode::TEMPORARY_REDIRECT,
                        [(axum::http::header::LOCATION, location)],
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/hook")
    }

    #[tokio::test]
    async fn a_redirect_to_another_origin_is_not_followed() {
        let (elsewhere, rx) = receiver(vec![]).await;
        let url = redirecting(elsewhere).await;
        let w = fast(&url, Some("cb-token"));
        let result = w.deliver(&payload()).await;
        eprintln!("a 307 to another origin: {result:?}");
        assert_eq!(
            rx.hits.load(Ordering::SeqCst),
            0,
            "the reply went to another origin"
        );
        assert!(
            matches!(result, Err(WebhookError::Status { status: 307, .. })),
            "{result:?}"
        );
    }

    #[tokio::test]
    async fn a_redirect_within_the_origin_is_followed() {
        let (target, rx) = receiver(vec![]).await;
        // The same listener: /hook redirects to /hook2 on a server that serves both.
        let app = Router::new()
            .route(
                "/hook",
                post(|| async {
                    (
                        axum::http::StatusCode::TEMPORARY_REDIRECT,
                        [(axum::http::header::LOCATION, "/hook2")],
                    )
                }),
            )
            .route(
                "/hook2",
                post(|State(rx): State<Arc<Receiver>>| async move {
                    rx.hits.fetch_add(1, Ordering::SeqCst);
                    axum::http::StatusCode::OK
                }),
            )
            .with_state(rx.clone());
        drop(target);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let w = fast(&format!("http://{addr}/hook"), None);
        assert_eq!(w.deliver(&payload()).await, Ok(1));
        assert_eq!(rx.hits.load(Ordering::SeqCst), 1);
    }

    /// A receiver that never answers: every delivery stays in flight.
    async fn stuck() -> String {
        let app = Router::new().route("/hook", post(std::future::pending::<()>));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/hook")
    }

    #[tokio::test]
    async fn callbacks_not_delivered_are_counted_in_metrics_and_the_monitor() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let monitor = Arc::new(Monitor::new(dir.path().join("monitor.json")));
        let w = fast(&stuck().await, None).observed(metrics.clone(), monitor.clone());
        let held: Vec<_> = (0..MAX_IN_FLIGHT).map(|_| w.send(payload())).collect();
        assert!(held.iter().all(Option::is_some));
        for _ in 0..3 {
            assert!(w.send(payload()).is_none(), "beyond the bound");
        }
        let (refusing, _) = receiver(vec![400]).await;
        let r = fast(&refusing, None).observed(metrics.clone(), monitor.clone());
        assert!(r.send(payload()).unwrap().await.unwrap().is_err());
        eprintln!("counts: {:?} and {:?}", w.counts(), r.counts());
        assert_eq!(w.counts().dropped, 3);
        assert_eq!(r.counts().failed, 1);
        let text = metrics.render();
        assert!(
            text.contains(r#"agentd_webhooks_total{outcome="dropped"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"agentd_webhooks_total{outcome="failed"} 1"#),
            "{text}"
        );
        let m = monitor.snapshot();
        assert_eq!(m["webhook"]["failed"], 1, "{m}");
        for h in held.into_iter().flatten() {
            h.abort();
        }
    }

    #[test]
    fn payload_omits_absent_notify_meta() {
        let v = serde_json::to_value(Wire {
            payload: &WebhookPayload {
                notify_meta: Some(serde_json::json!({"ref": "x"})),
                ..payload()
            },
            agent: "a",
        })
        .unwrap();
        assert_eq!(v["notify_meta"]["ref"], "x");
        let v = serde_json::to_value(Wire {
            payload: &payload(),
            agent: "a",
        })
        .unwrap();
        assert!(v.get("notify_meta").is_none());
    }
}
