//! The router, its shared state, binding and serving.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::HeaderValue;
use axum::http::header::AUTHORIZATION;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::trace::TraceLayer;

use super::auth::require_bearer;
use super::backend::ApiBackend;
use super::error::ApiError;
use super::handlers;
use super::ratelimit::{Group, RateLimiter, rate_limit};
use super::reply::{agent_header_value, finish};
use crate::config::HttpConfig;

/// How long [`serve`] lets requests in flight finish after `cancel` before it returns anyway
/// (a `/chat` may wait up to `call_timeout`; its work continues in the daemon regardless).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// What every handler and layer shares.
pub struct ApiState {
    backend: Arc<dyn ApiBackend>,
    cfg: HttpConfig,
    agent_name: String,
    agent_header: HeaderValue,
    call_timeout: Duration,
    post_limiter: RateLimiter,
    read_limiter: RateLimiter,
}

impl ApiState {
    /// State for `router`; the rate limiters start empty.
    pub fn new(
        backend: Arc<dyn ApiBackend>,
        cfg: &HttpConfig,
        agent_name: &str,
        call_timeout: Duration,
    ) -> ApiState {
        ApiState {
            backend,
            post_limiter: RateLimiter::new(cfg.rate_limit, cfg.rate_window),
            read_limiter: RateLimiter::new(cfg.status_rate_limit, cfg.rate_window),
            cfg: cfg.clone(),
            agent_name: agent_name.to_owned(),
            agent_header: agent_header_value(agent_name),
            call_timeout,
        }
    }

    pub(crate) fn backend(&self) -> &Arc<dyn ApiBackend> {
        &self.backend
    }

    pub(crate) fn config(&self) -> &HttpConfig {
        &self.cfg
    }

    pub(crate) fn agent_name(&self) -> &str {
        &self.agent_name
    }

    pub(crate) fn agent_header(&self) -> &HeaderValue {
        &self.agent_header
    }

    pub(crate) fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    pub(crate) fn max_body_bytes(&self) -> usize {
        self.cfg.max_body_bytes
    }

    pub(crate) fn limiter(&self, group: Group) -> &RateLimiter {
        match group {
            Group::Post => &self.post_limiter,
            Group::Read => &self.read_limiter,
        }
    }
}

/// The HTTP API of SPEC §10.2 over `backend`. Serve it with [`serve`] (which supplies the peer
/// address the rate limits key on). `call_timeout` bounds how long `/chat` waits (then 408).
///
/// Layers, outermost first: sensitive `Authorization` (never logged), trace, `finish` (`agent`
/// field and `X-Agentd-Agent` header, JSON for every error), panic → 500, body limit → 413;
/// per route: rate limit (POST or read group), then bearer auth (all but `/api/v1/status`).
pub fn router(
    backend: Arc<dyn ApiBackend>,
    cfg: &HttpConfig,
    agent_name: &str,
    call_timeout: Duration,
) -> Router {
    let state = Arc::new(ApiState::new(backend, cfg, agent_name, call_timeout));
    let auth = from_fn_with_state(state.clone(), require_bearer);
    let posts = Router::new()
        .route("/api/v1/chat", post(handlers::chat))
        .route("/api/v1/notify", post(handlers::notify))
        .route("/api/v1/sessions/reset", post(handlers::reset))
        .route_layer(auth.clone())
        .route_layer(from_fn_with_state((state.clone(), Group::Post), rate_limit));
    let reads = Router::new()
        .route("/api/v1/sessions", get(handlers::sessions))
        .route("/api/v1/cost", get(handlers::cost))
        .route("/api/v1/monitor", get(handlers::monitor))
        .route("/api/v1/sessions/{id}/history", get(handlers::history))
        .route("/metrics", get(handlers::metrics))
        .route_layer(auth)
        .route("/api/v1/status", get(handlers::status))
        .route_layer(from_fn_with_state((state.clone(), Group::Read), rate_limit));
    Router::new()
        .merge(posts)
        .merge(reads)
        .fallback(handlers::not_found)
        .layer(DefaultBodyLimit::disable())
        .layer(RequestBodyLimitLayer::new(cfg.max_body_bytes))
        .layer(CatchPanicLayer::new())
        .layer(from_fn_with_state(state.clone(), finish))
        .layer(TraceLayer::new_for_http())
        .layer(SetSensitiveRequestHeadersLayer::new([AUTHORIZATION]))
        .with_state(state)
}

/// Binds `[http] host:port`. The error names the address and the fix.
pub async fn bind(cfg: &HttpConfig) -> Result<TcpListener, ApiError> {
    let addr = if cfg.host.contains(':') && !cfg.host.starts_with('[') {
        format!("[{}]:{}", cfg.host, cfg.port)
    } else {
        format!("{}:{}", cfg.host, cfg.port)
    };
    TcpListener::bind((cfg.host.as_str(), cfg.port))
        .await
        .map_err(|source| ApiError::Bind { addr, source })
}

/// Serves `router` on `listener` until `cancel`, then lets requests in flight finish for up to
/// [`SHUTDOWN_GRACE`]. The bound address is `listener.local_addr()` — known before this is
/// called, so the daemon can report READY after [`bind`]. Errors name the address.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "HTTP API listening");
    let server = axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(cancel.clone().cancelled_owned());
    let deadline = async {
        cancel.cancelled().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        result = server => result.map_err(|e| {
            std::io::Error::new(e.kind(), format!("HTTP API on {addr}: {e}"))
        }),
        () = deadline => {
            tracing::warn!(%addr, "HTTP API requests still in flight after the shutdown grace; closing");
            Ok(())
        }
    }
}
