//! An HTTP/1.1 fault proxy on 127.0.0.1 in front of a real server (the test homeserver,
//! `support::synapse`): every request is forwarded and answered unchanged, except those a
//! [`Rule`] picks, which get a [`Fault`]: a status with a Matrix error body, 429 with
//! `retry_after_ms`, a connection dropped in the middle of the answer, or a request held
//! (before or after the server saw it) until [`FaultProxy::release`]. A rule can wait for an
//! answer whose body contains a needle (the sync response that carries a given message), so
//! the fault hits exactly the answer the client needed. Every request is recorded.
//!
//! Like the other fakes, the proxy runs on its own thread with its own current-thread runtime,
//! so blocking test code cannot starve it; it stops when the last handle is dropped.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use futures::StreamExt;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The largest request body forwarded (uploads in the tests stay below).
const MAX_BODY: usize = 200 << 20;

/// What a picked request gets instead of the server's answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// This status with `{"errcode":"M_UNKNOWN","error":…}` (after the server answered).
    Status(u16),
    /// 429 `M_LIMIT_EXCEEDED` with `retry_after_ms` (and a `Retry-After` header in seconds).
    RateLimited { retry_after_ms: u64 },
    /// The server's status and headers, half of its body, then the connection is cut.
    DropMidBody,
    /// Not forwarded until [`FaultProxy::release`] (then forwarded and answered).
    Hold,
    /// Forwarded (the server acts on it), the answer withheld until [`FaultProxy::release`].
    ForwardThenHold,
}

/// Which requests a fault applies to, and how many times.
#[derive(Clone, Debug)]
pub struct Rule {
    /// `GET`, `PUT`, …; any when `None`.
    pub method: Option<String>,
    /// A substring of the path and query (`/sync`, `/send/m.room.message/`).
    pub path: String,
    /// Only answers whose body contains this (ignored by [`Fault::Hold`], which acts before
    /// there is an answer).
    pub body_contains: Option<String>,
    pub fault: Fault,
    /// How many requests it still applies to.
    pub times: usize,
}

impl Rule {
    /// The next `times` requests of `method` whose path contains `path`.
    pub fn new(method: &str, path: &str, fault: Fault, times: usize) -> Rule {
        Rule {
            method: Some(method.to_string()),
            path: path.to_string(),
            body_contains: None,
            fault,
            times,
        }
    }

    /// Only answers whose body contains `needle`.
    pub fn answering(mut self, needle: &str) -> Rule {
        self.body_contains = Some(needle.to_string());
        self
    }

    fn matches_request(&self, method: &str, path: &str) -> bool {
        self.times > 0
            && self.method.as_deref().is_none_or(|m| m == method)
            && path.contains(&self.path)
    }
}

/// One request the proxy saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    /// Path and query.
    pub path: String,
    /// The fault it got, if any.
    pub fault: Option<Fault>,
    /// How many bytes of the answer's body went out to the client (passed-through answers
    /// are sent in chunks: a client that stops reading stops the count).
    pub delivered: Arc<AtomicUsize>,
}

struct Shared {
    upstream: String,
    client: reqwest::Client,
    rules: Mutex<Vec<Rule>>,
    seen: Mutex<Vec<Seen>>,
    released: watch::Sender<bool>,
}

struct StopOnDrop(CancellationToken);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Handle to a running proxy. Clones share it; it stops when the last clone is dropped.
#[derive(Clone)]
pub struct FaultProxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    _stop: Arc<StopOnDrop>,
}

impl FaultProxy {
    /// A proxy to `upstream` (`http://127.0.0.1:P`) on a free loopback port.
    pub fn spawn(upstream: &str) -> FaultProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("fault proxy: cannot bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("fault proxy: cannot make the listener non-blocking");
        let addr = listener.local_addr().expect("fault proxy: no address");
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("fault proxy: cannot build the upstream client");
        let shared = Arc::new(Shared {
            upstream: upstream.trim_end_matches('/').to_string(),
            client,
            rules: Mutex::new(Vec::new()),
            seen: Mutex::new(Vec::new()),
            released: watch::channel(false).0,
        });
        let token = CancellationToken::new();
        let (server_shared, server_token) = (Arc::clone(&shared), token.clone());
        std::thread::Builder::new()
            .name(format!("fault-proxy-{}", addr.port()))
            .spawn(move || serve(listener, server_shared, server_token))
            .expect("fault proxy: cannot spawn the server thread");
        FaultProxy {
            shared,
            addr,
            _stop: Arc::new(StopOnDrop(token)),
        }
    }

    /// `http://127.0.0.1:P`, to give the client instead of the server's URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Adds a rule (rules are tried in the order they were added).
    pub fn inject(&self, rule: Rule) {
        self.shared.rules.lock().unwrap().push(rule);
    }

    /// Lets held requests ([`Fault::Hold`], [`Fault::ForwardThenHold`]) go on, and every later
    /// one pass without holding.
    pub fn release(&self) {
        self.shared.released.send_replace(true);
    }

    /// Every request so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }

    /// The requests of `method` whose path contains `path`.
    pub fn seen_matching(&self, method: &str, path: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == method && s.path.contains(path))
            .collect()
    }

    /// How many requests got `fault`.
    pub fn served(&self, fault: &Fault) -> usize {
        self.seen()
            .iter()
            .filter(|s| s.fault.as_ref() == Some(fault))
            .count()
    }

    /// How many rules' applications are still to come.
    pub fn pending(&self) -> usize {
        self.shared
            .rules
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.times)
            .sum()
    }
}

fn serve(listener: std::net::TcpListener, shared: Arc<Shared>, token: CancellationToken) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fault proxy: cannot build a runtime: {e}");
            return;
        }
    };
    rt.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("fault proxy: cannot register the listener: {e}");
                return;
            }
        };
        let app = Router::new().fallback(handle).with_state(shared);
        tokio::select! {
            _ = token.cancelled() => {}
            r = axum::serve(listener, app).into_future() => {
                if let Err(e) = r {
                    eprintln!("fault proxy: server error: {e}");
                }
            }
        }
    });
    rt.shutdown_background();
}

/// Takes one application of the first rule matching the request (and, for answer-time
/// faults, the answer's body).
fn take_rule(shared: &Shared, method: &str, path: &str, body: Option<&[u8]>) -> Option<Fault> {
    let mut rules = shared.rules.lock().unwrap();
    let rule = rules.iter_mut().find(|r| {
        r.matches_request(method, path)
            && match body {
                // Before forwarding: only holds.
                None => r.fault == Fault::Hold,
                Some(b) => {
                    r.fault != Fault::Hold
                        && r.body_contains
                            .as_ref()
                            .is_none_or(|n| String::from_utf8_lossy(b).contains(n.as_str()))
                }
            }
    })?;
    rule.times -= 1;
    Some(rule.fault.clone())
}

fn record(shared: &Shared, method: &str, path: &str, fault: Option<Fault>) -> Arc<AtomicUsize> {
    let delivered = Arc::new(AtomicUsize::new(0));
    shared.seen.lock().unwrap().push(Seen {
        method: method.to_string(),
        path: path.to_string(),
        fault,
        delivered: delivered.clone(),
    });
    delivered
}

async fn wait_released(shared: &Shared) {
    let mut rx = shared.released.subscribe();
    let _ = rx.wait_for(|r| *r).await;
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let method = req.method().as_str().to_string();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let released = *shared.released.borrow();
    let held = !released && take_rule(&shared, &method, &path, None).is_some();
    let mut delivered = None;
    if held {
        delivered = Some(record(&shared, &method, &path, Some(Fault::Hold)));
        wait_released(&shared).await;
    }
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY).await else {
        return error_response(400, "M_TOO_LARGE", "request body unreadable or too large");
    };
    let mut upstream = shared
        .client
        .request(parts.method.clone(), format!("{}{path}", shared.upstream))
        .body(body);
    for (name, value) in &parts.headers {
        if !is_hop_by_hop(name.as_str()) {
            upstream = upstream.header(name, value);
        }
    }
    let answer = match upstream.send().await {
        Ok(r) => r,
        Err(e) => return error_response(502, "M_UNKNOWN", &format!("fault proxy: {e}")),
    };
    let status = answer.status();
    let headers = answer.headers().clone();
    let Ok(bytes) = answer.bytes().await else {
        return error_response(
            502,
            "M_UNKNOWN",
            "fault proxy: the upstream answer broke off",
        );
    };
    let fault = if held {
        None
    } else {
        take_rule(&shared, &method, &path, Some(&bytes))
    };
    let delivered = match delivered {
        Some(d) => d,
        None => record(&shared, &method, &path, fault.clone()),
    };
    match fault {
        None => passthrough(status, &headers, bytes, delivered),
        Some(Fault::Status(code)) => {
            error_response(code, "M_UNKNOWN", "injected by the test's fault proxy")
        }
        Some(Fault::RateLimited { retry_after_ms }) => {
            let mut r = error_response(429, "M_LIMIT_EXCEEDED", "Too Many Requests");
            let body = json!({
                "errcode": "M_LIMIT_EXCEEDED",
                "error": "Too Many Requests",
                "retry_after_ms": retry_after_ms,
            });
            *r.body_mut() = Body::from(body.to_string());
            let secs = retry_after_ms.div_ceil(1000).to_string();
            if let Ok(v) = HeaderValue::from_str(&secs) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            r
        }
        Some(Fault::DropMidBody) => cut_off(status, &headers, bytes),
        Some(Fault::ForwardThenHold) => {
            wait_released(&shared).await;
            passthrough(status, &headers, bytes, delivered)
        }
        Some(Fault::Hold) => unreachable!("holds are taken before forwarding"),
    }
}

fn is_hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "host" | "connection" | "keep-alive" | "transfer-encoding" | "content-length" | "upgrade"
    )
}

fn copy_headers(resp: &mut Response, headers: &HeaderMap) {
    for (name, value) in headers {
        if !is_hop_by_hop(name.as_str()) {
            resp.headers_mut().append(name.clone(), value.clone());
        }
    }
}

/// The answer as it came, its body in chunks of 64 KiB counted into `delivered` as they go.
fn passthrough(
    status: StatusCode,
    headers: &HeaderMap,
    bytes: Bytes,
    delivered: Arc<AtomicUsize>,
) -> Response {
    const CHUNK: usize = 64 << 10;
    let chunks: Vec<Bytes> = (0..bytes.len())
        .step_by(CHUNK)
        .map(|i| bytes.slice(i..(i + CHUNK).min(bytes.len())))
        .collect();
    let stream = futures::stream::iter(chunks).map(move |c| {
        delivered.fetch_add(c.len(), Ordering::Relaxed);
        Ok::<_, std::io::Error>(c)
    });
    let length = bytes.len();
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = status;
    copy_headers(&mut resp, headers);
    resp.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    resp
}

/// The status, the headers with the full `Content-Length`, half the body, then an error that
/// makes the server cut the connection.
fn cut_off(status: StatusCode, headers: &HeaderMap, bytes: Bytes) -> Response {
    let half = bytes.slice(..bytes.len() / 2);
    let stream = futures::stream::iter(vec![
        Ok(half),
        Err(std::io::Error::other(
            "fault proxy: connection dropped mid-body",
        )),
    ]);
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = status;
    copy_headers(&mut resp, headers);
    resp.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    resp
}

fn error_response(status: u16, errcode: &str, error: &str) -> Response {
    let body = json!({ "errcode": errcode, "error": error });
    let mut resp = Response::new(Body::from(body.to_string()));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
