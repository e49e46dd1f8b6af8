//! The router, its shared state, binding and serving.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::extract::DefaultBodyLimit;
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderName, HeaderValue, Method};
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::trace::TraceLayer;

use super::auth::{require_bearer, require_bearer_or_api_key};
use super::backend::ApiBackend;
use super::compat;
use super::error::ApiError;
use super::handlers;
use super::ratelimit::{Group, RateLimiter, rate_limit};
use super::reply::{agent_header_value, finish};
use crate::config::HttpConfig;
use crate::llm::anthropic::server as anthropic;
use crate::llm::openai::responses;
use crate::llm::openai::server as openai;

/// How long [`serve`] lets requests in flight finish after `cancel` before it returns anyway
/// (a `/chat` may wait up to `call_timeout`; its work continues in the daemon regardless).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How long a client has to send a complete request head, from the moment the connection
/// waits for one: after it is accepted, and again after each response on a keep-alive
/// connection (hyper starts the timer whenever it waits for a head). So this is also the idle
/// timeout between requests. It never runs while a response is being written, however long
/// that response streams. A connection that runs out of it is closed (SPEC §16.9).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The share of the process's file-descriptor limit (`RLIMIT_NOFILE`, soft) that HTTP
/// connections may hold at most: a quarter, so the trail, the FIFO, the databases, the
/// provider connections and the tools always have the rest.
pub const FD_SHARE_DIVISOR: u64 = 4;

/// The connection cap actually used: `configured` (`[http] max_connections`), but never more
/// than [`FD_SHARE_DIVISOR`]th of `fd_limit`, and at least 1.
pub fn connection_cap(configured: usize, fd_limit: u64) -> usize {
    let share = usize::try_from(fd_limit / FD_SHARE_DIVISOR).unwrap_or(usize::MAX);
    configured.min(share).max(1)
}

/// Raise this process's soft `RLIMIT_NOFILE` to its hard limit (the daemon calls it at start),
/// so that the HTTP share ([`connection_cap`]) and everything else have room. Returns the
/// limit now in force (`(soft, hard)`), or why it could not be read or raised.
pub fn raise_fd_limit() -> Result<(u64, u64), nix::Error> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    getrlimit(Resource::RLIMIT_NOFILE)
}

/// This process's soft `RLIMIT_NOFILE` (1024, the usual default, if it cannot be read).
fn fd_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft)
}

/// What every handler and layer shares.
pub struct ApiState {
    backend: Arc<dyn ApiBackend>,
    cfg: HttpConfig,
    agent_name: String,
    agent_header: HeaderValue,
    call_timeout: Duration,
    post_limiter: RateLimiter,
    read_limiter: RateLimiter,
    /// When the router was built (Unix seconds): the `created` of `GET /v1/models`.
    started_unix: i64,
    /// The web console's open sessions (empty until the first login).
    console: super::console::Sessions,
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
            started_unix: chrono::Utc::now().timestamp(),
            console: Default::default(),
        }
    }

    pub(crate) fn console(&self) -> &super::console::Sessions {
        &self.console
    }

    pub(crate) fn started_unix(&self) -> i64 {
        self.started_unix
    }

    pub(crate) fn keep_alive_every(&self) -> Duration {
        super::compat::KEEP_ALIVE_EVERY
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
    router_with_mcp(backend, cfg, agent_name, call_timeout, None)
}

/// [`router`], with the MCP server at `/mcp` when `mcp` is given (SPEC §23): the same token,
/// rate limit (the POST group) and body limit as the other routes; `cancel` ends its sessions.
pub fn router_with_mcp(
    backend: Arc<dyn ApiBackend>,
    cfg: &HttpConfig,
    agent_name: &str,
    call_timeout: Duration,
    mcp: Option<(super::mcp::McpOptions, CancellationToken)>,
) -> Router {
    let mcp =
        mcp.map(|(opts, cancel)| super::mcp::http_service(backend.clone(), opts, cfg, cancel));
    let state = Arc::new(ApiState::new(backend, cfg, agent_name, call_timeout));
    let auth = from_fn_with_state(state.clone(), require_bearer);
    let api_key_auth = from_fn_with_state(state.clone(), require_bearer_or_api_key);
    let posts = Router::new()
        .route("/api/v1/chat", post(handlers::chat))
        .route("/api/v1/notify", post(handlers::notify))
        .route("/api/v1/sessions/reset", post(handlers::reset))
        .route("/api/v1/approvals/{id}", post(super::approvals::decide))
        .route(
            "/api/v1/sessions/{key}/model",
            post(handlers::session_model),
        )
        .route(
            "/api/v1/sessions/{key}/skills",
            post(handlers::session_skill),
        )
        .route(
            openai::CHAT_COMPLETIONS_PATH,
            post(compat::chat_completions),
        )
        .route(responses::RESPONSES_PATH, post(compat::responses))
        .route(super::a2a::wire::ENDPOINT, post(super::a2a::rpc))
        .route_layer(auth.clone())
        .route(
            anthropic::MESSAGES_PATH,
            post(compat::messages).route_layer(api_key_auth.clone()),
        )
        .route(
            anthropic::COUNT_TOKENS_PATH,
            post(compat::count_tokens).route_layer(api_key_auth.clone()),
        )
        .route_layer(from_fn_with_state((state.clone(), Group::Post), rate_limit));
    let reads = Router::new()
        .route("/api/v1/sessions", get(handlers::sessions))
        .route("/api/v1/cost", get(handlers::cost))
        .route("/api/v1/monitor", get(handlers::monitor))
        .route("/api/v1/approvals", get(super::approvals::list))
        .route("/api/v1/sessions/{id}/history", get(handlers::history))
        .route("/metrics", get(handlers::metrics))
        .route_layer(auth)
        // Clients of either API list models: the token as bearer or as `x-api-key`.
        .route(
            openai::MODELS_PATH,
            get(compat::models).route_layer(api_key_auth.clone()),
        )
        .route(
            openai::MODEL_PATH,
            get(compat::model).route_layer(api_key_auth.clone()),
        )
        .route("/api/v1/status", get(handlers::status))
        // Strangers may read the card; it shows the skills only to a caller with the token.
        .route(super::a2a::wire::CARD_PATH, get(super::a2a::card))
        .route_layer(from_fn_with_state((state.clone(), Group::Read), rate_limit));
    let console = if cfg.console {
        super::console::router(&state)
    } else {
        Router::new()
    };
    let mut routes = Router::new().merge(posts).merge(reads).merge(console);
    if let Some(service) = mcp {
        routes = routes.merge(
            Router::new()
                .route_service(super::mcp::PATH, service)
                .route_layer(from_fn_with_state(state.clone(), require_bearer))
                .route_layer(from_fn_with_state((state.clone(), Group::Post), rate_limit)),
        );
    }
    routes
        .fallback(handlers::not_found)
        .layer(DefaultBodyLimit::disable())
        .layer(RequestBodyLimitLayer::new(cfg.max_body_bytes))
        .layer(CatchPanicLayer::new())
        .layer(from_fn_with_state(state.clone(), finish))
        .layer(TraceLayer::new_for_http())
        .layer(SetSensitiveRequestHeadersLayer::new([
            AUTHORIZATION,
            HeaderName::from_static(anthropic::API_KEY_HEADER),
        ]))
        // Every answer names its request (the client's own `x-request-id`, else a new one),
        // errors and preflights included.
        .layer(cors(&cfg.cors_origins))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .with_state(state)
}

/// CORS for the browser clients of `[http] cors_origins` only (none by default): the listed
/// origins may send any header and read `x-request-id`; the token is still required.
fn cors(origins: &[String]) -> CorsLayer {
    let origins: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o).ok())
        .collect();
    if origins.is_empty() {
        return CorsLayer::new();
    }
    CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins))
        .allow_methods([Method::GET, Method::POST])
        .allow_headers(AllowHeaders::mirror_request())
        .expose_headers([HeaderName::from_static("x-request-id")])
        .max_age(Duration::from_secs(600))
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
///
/// Every connection must send its request head within [`HEADER_READ_TIMEOUT`] (also the idle
/// time allowed between keep-alive requests). At most [`connection_cap`]`(max_connections,
/// RLIMIT_NOFILE)` connections are open at once; one beyond that is answered `503` and closed
/// at once, so HTTP clients can never take the file descriptors the trail, the FIFO and the
/// databases need (SPEC §16.9).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    cancel: CancellationToken,
    max_connections: usize,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    let cap = connection_cap(max_connections, fd_limit());
    tracing::info!(%addr, max_connections = cap, "HTTP API listening");
    let permits = Arc::new(Semaphore::new(cap));
    let connections = TaskTracker::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let mut refused_logged = false;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_error(&addr, &e).await;
                    continue;
                }
            },
            () = cancel.cancelled() => break,
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            if !refused_logged {
                tracing::warn!(%addr, max_connections = cap,
                    "HTTP connection cap reached; refusing new connections with 503 until some close");
                refused_logged = true;
            }
            refuse(stream);
            continue;
        };
        refused_logged = false;
        let router = router.clone();
        let service = hyper::service::service_fn(move |mut request| {
            request.extensions_mut().insert(ConnectInfo(peer));
            router.clone().oneshot(request)
        });
        let http = http.clone();
        let cancel = cancel.clone();
        connections.spawn(async move {
            let _permit = permit;
            let connection = http.serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = cancel.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "HTTP connection ended with an error");
            }
        });
    }
    connections.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(%addr, "HTTP API requests still in flight after the shutdown grace; closing");
    }
    Ok(())
}

/// Answer `503` without waiting (a non-blocking write into the fresh socket's empty buffer)
/// and close.
fn refuse(stream: TcpStream) {
    const BODY: &str = r#"{"error":"too many connections; try again later"}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = stream.try_write(answer.as_bytes());
}

/// An `accept` failure. Per-connection errors (the peer gave up already) are skipped at once;
/// anything else (out of file descriptors) is logged and waited out a little, so the loop does
/// not spin.
async fn accept_error(addr: &SocketAddr, e: &std::io::Error) {
    use std::io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | ConnectionRefused
    ) {
        return;
    }
    tracing::warn!(%addr, error = %e, "HTTP API cannot accept a connection; retrying shortly");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[test]
    fn the_cap_stays_below_a_quarter_of_the_fd_limit() {
        assert_eq!(connection_cap(256, 1024), 256);
        assert_eq!(connection_cap(256, 1000), 250);
        assert_eq!(connection_cap(10, 1 << 20), 10);
        assert_eq!(connection_cap(256, 0), 1);
        assert_eq!(connection_cap(0, 4096), 1);
    }

    /// A server with `cap` connections: `/` answers "ok", `/slow` streams seven one-second
    /// chunks (longer than the header-read timeout).
    async fn server(cap: usize) -> (SocketAddr, CancellationToken) {
        let router = Router::new().route("/", get(|| async { "ok" })).route(
            "/slow",
            get(|| async {
                let chunks = futures::stream::unfold(0u32, |n| async move {
                    if n == 7 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Some((Ok::<_, std::io::Error>(format!("chunk{n};")), n + 1))
                });
                Body::from_stream(chunks)
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cancel = CancellationToken::new();
        tokio::spawn(serve(listener, router, cancel.clone(), cap));
        (addr, cancel)
    }

    /// Reads until the server closes the connection (bounded far above the 5 s timeout, so a
    /// server that never closes fails the test instead of hanging it).
    async fn read_to_close(s: &mut TcpStream) -> String {
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut out))
            .await
            .expect("the server never closed the connection")
            .ok();
        String::from_utf8_lossy(&out).into_owned()
    }

    /// A connection that never finishes its request head is closed; one beyond the cap is
    /// answered 503 at once; once a slot is free, requests are served again.
    #[tokio::test]
    async fn stalled_heads_are_closed_and_the_cap_answers_503() {
        let (addr, cancel) = server(2).await;
        let mut stalled = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
            stalled.push(s);
        }
        // Accepted in the order of the kernel's queue: the third finds both slots taken.
        let mut third = TcpStream::connect(addr).await.unwrap();
        let answer = read_to_close(&mut third).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("too many connections"), "{answer}");
        for mut s in stalled {
            let answer = read_to_close(&mut s).await;
            assert!(!answer.contains(" 200 "), "{answer}");
        }
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let answer = read_to_close(&mut s).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        cancel.cancel();
    }

    /// An idle keep-alive connection is closed after its answer; a response that streams
    /// longer than the timeout is never cut.
    #[tokio::test]
    async fn idle_keep_alive_is_closed_but_a_streaming_answer_is_not_cut() {
        let (addr, cancel) = server(8).await;
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let (idle_answer, slow_answer) =
            tokio::join!(read_to_close(&mut idle), read_to_close(&mut slow));
        assert!(idle_answer.starts_with("HTTP/1.1 200"), "{idle_answer}");
        assert!(idle_answer.ends_with("ok"), "{idle_answer}");
        let want: String = (0..7).map(|n| format!("chunk{n};")).collect();
        let body: String = slow_answer
            .split("\r\n")
            .filter(|l| l.starts_with("chunk"))
            .collect();
        assert_eq!(body, want, "{slow_answer}");
        cancel.cancel();
    }
}
