//! The callback POSTed after every processed message (SPEC §10.2 "Webhook").
//!
//! [`Webhook::send`] spawns the delivery and returns at once; at most [`MAX_IN_FLIGHT`]
//! deliveries run at a time (beyond that a payload is dropped with a warning, so a dead receiver
//! cannot grow memory). Each delivery makes up to [`MAX_ATTEMPTS`] attempts, retrying connect
//! errors, 429 and 5xx after 0.5 s, 1 s, …. Logs never contain the token or the URL.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::AUTHORIZATION;
use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::error::ApiError;
use crate::config::HttpConfig;
use crate::message::Usage;
use crate::net::scrub::reqwest_error_text;

/// Attempts per delivery.
pub const MAX_ATTEMPTS: u32 = 3;
/// Deliveries running at once.
pub const MAX_IN_FLIGHT: usize = 64;
/// Waits before the 2nd, 3rd, … attempt.
const BACKOFF: [Duration; 3] = [
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
    backoff: Vec<Duration>,
}

/// The webhook client; cheap to clone.
#[derive(Clone)]
pub struct Webhook {
    target: Option<Arc<Target>>,
    in_flight: Arc<Semaphore>,
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
                .build()
                .map_err(|e| ApiError::WebhookClient(reqwest_error_text(e)))?;
            Some(Arc::new(Target {
                client,
                url: cfg.callback_url.trim().to_owned(),
                token: cfg.callback_token.clone(),
                agent: agent_name.to_owned(),
                backoff: BACKOFF.to_vec(),
            }))
        };
        Ok(Webhook {
            target,
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
        })
    }

    /// Shorter waits between attempts (tests).
    #[cfg(test)]
    fn with_backoff(mut self, backoff: Vec<Duration>) -> Webhook {
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
    /// payload is dropped with a warning). Failures are logged; awaiting the handle is optional.
    pub fn send(&self, payload: WebhookPayload) -> Option<JoinHandle<Result<u32, WebhookError>>> {
        self.target.as_ref()?;
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            tracing::warn!(
                session_id = %payload.session_id,
                limit = MAX_IN_FLIGHT,
                "webhook backlog full; dropping this callback"
            );
            return None;
        };
        let webhook = self.clone();
        Some(tokio::spawn(async move {
            let result = webhook.deliver(&payload).await;
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
            let wait = target
                .backoff
                .get(attempt as usize - 1)
                .or(target.backoff.last())
                .copied()
                .unwrap_or_default();
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
            .with_backoff(vec![Duration::from_millis(10)])
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
