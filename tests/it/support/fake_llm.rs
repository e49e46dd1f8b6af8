//! A fake LLM server on 127.0.0.1 that speaks the real Anthropic Messages and OpenAI
//! chat-completions wire formats, streaming (SSE) and non-streaming, including the prompt-cache
//! usage fields that off-the-shelf mocks leave out.
//!
//! Tests script replies with [`FakeLlm::push`]; each request consumes one reply in FIFO order.
//! With an empty script the fake asks the responder set with [`FakeLlm::set_responder`], if
//! any, and otherwise echoes the last user message, so smoke tests need no script.
//!
//! The server runs on its own thread with its own single-threaded tokio runtime, so test code
//! that blocks (waiting on a child process, polling files) can never starve it, whatever the
//! flavour of the test's runtime. It stops when the last [`FakeLlm`] handle is dropped or on
//! [`FakeLlm::shutdown`]; dropping the runtime closes every open connection (also `Hang` ones).

use std::collections::VecDeque;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::Response;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

/// Which provider protocol the fake speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// `POST /v1/messages` (base URL is the origin).
    Anthropic,
    /// `POST /v1/chat/completions` (base URL ends in `/v1`).
    OpenAi,
}

/// Token counts of one scripted answer, in Anthropic's terms: `input` excludes cache reads and
/// writes. On the OpenAI wire `prompt_tokens = input + cache_read`,
/// `prompt_tokens_details.cached_tokens = cache_read`, and `cache_write` is not reported (OpenAI
/// has no such field).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

impl Usage {
    /// `Usage { input, output, cache_read, cache_write }`.
    pub fn new(input: u64, output: u64, cache_read: u64, cache_write: u64) -> Usage {
        Usage {
            input,
            output,
            cache_read,
            cache_write,
        }
    }
}

/// The usage of the default echo answer and of [`Reply::text`].
pub const DEFAULT_USAGE: Usage = Usage {
    input: 10,
    output: 5,
    cache_read: 0,
    cache_write: 0,
};

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A text answer; stop reason `end_turn` / finish reason `stop`.
    Text { text: String, usage: Usage },
    /// Optional text, then tool calls `(id, name, arguments)`; stop reason `tool_use` /
    /// finish reason `tool_calls`. Arguments are streamed in 2+ pieces.
    ToolCalls {
        text: Option<String>,
        calls: Vec<(String, String, Value)>,
        usage: Usage,
    },
    /// Anthropic only: a thinking block (with signature) before `then`'s blocks. On the OpenAI
    /// wire the thinking is left out and `then` is answered as is.
    Thinking {
        thinking: String,
        signature: String,
        then: Box<Reply>,
    },
    /// A text answer cut by the token limit: stop reason `max_tokens` / finish reason `length`.
    MaxTokens { text: String, usage: Usage },
    /// An HTTP error in the wire's error shape, with an optional `retry-after` header (seconds).
    Error {
        status: u16,
        message: String,
        retry_after: Option<u64>,
    },
    /// Waits for a permit of `gate` (acquired and consumed: one `add_permits(1)` releases one
    /// gated call) before answering with `then`. The request is recorded before it waits, so
    /// `wait_for_requests` tells a test that the call is in flight.
    Gated {
        gate: Arc<Semaphore>,
        then: Box<Reply>,
    },
    /// Accepts and never answers (the connection stays open until the fake shuts down).
    Hang,
    /// Status 200 and the start of a streamed answer, then a keep-alive every second and
    /// nothing else, for ever (until the client hangs up or the fake shuts down): Anthropic
    /// `ping` events, OpenAI chunks with an empty delta. No content ever arrives.
    PingForever,
    /// Sends status 200 and the first half of a text answer, then drops the connection.
    DropMidStream { text: String },
    /// Status 200 with a body that is neither valid JSON nor valid event data.
    Garbage,
    /// A recorded event stream replayed verbatim: status 200, `text/event-stream`, and these
    /// bytes as the body, one body chunk per event (split after each blank line), so the
    /// concatenation is byte for byte what the real server sent. Only for streaming requests
    /// (a non-streaming one gets a 400 saying so). See [`Reply::recorded`].
    RawSse(Bytes),
}

impl Reply {
    /// `Reply::Text` with [`DEFAULT_USAGE`].
    pub fn text(s: impl Into<String>) -> Reply {
        Reply::Text {
            text: s.into(),
            usage: DEFAULT_USAGE,
        }
    }

    /// `Reply::ToolCalls` without text, with [`DEFAULT_USAGE`].
    pub fn tool_calls(calls: Vec<(&str, &str, Value)>) -> Reply {
        Reply::ToolCalls {
            text: None,
            calls: calls
                .into_iter()
                .map(|(id, name, args)| (id.to_string(), name.to_string(), args))
                .collect(),
            usage: DEFAULT_USAGE,
        }
    }

    /// `Reply::Error` without `retry-after`.
    pub fn error(status: u16, message: impl Into<String>) -> Reply {
        Reply::Error {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    /// `Reply::RawSse` of `tests/fixtures/local-model/<name>.sse`, a real server's answer
    /// recorded on the wire (the folder's README says how each was made).
    pub fn recorded(name: &str) -> Reply {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/local-model")
            .join(format!("{name}.sse"));
        let bytes = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("cannot read the recording {}: {e}", path.display()));
        Reply::RawSse(Bytes::from(bytes))
    }

    /// Wraps `self` in `Reply::Gated`.
    pub fn gated(self, gate: &Arc<Semaphore>) -> Reply {
        Reply::Gated {
            gate: Arc::clone(gate),
            then: Box::new(self),
        }
    }
}

/// The text sent by `Reply::Garbage` (non-streaming; streaming sends it as event data).
pub const GARBAGE: &str = "<html>\u{1}this is {not json";

/// One request as received.
struct Recorded {
    headers: HeaderMap,
    body: Value,
}

/// Answers a request (its JSON body) when the script is empty; `None` falls back to the echo.
pub type Responder = dyn Fn(&Value) -> Option<Reply> + Send + Sync;

/// State shared by the handle and the server.
struct Shared {
    wire: Wire,
    queue: Mutex<VecDeque<Reply>>,
    responder: Mutex<Option<Arc<Responder>>>,
    recorded: Mutex<Vec<Recorded>>,
    count: watch::Sender<usize>,
    next_id: AtomicU64,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, VecDeque<Reply>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn recorded(&self) -> MutexGuard<'_, Vec<Recorded>> {
        self.recorded.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// Cancels the server when the last handle goes away.
struct StopOnDrop(CancellationToken);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Handle to a running fake. Clones share the server; it stops when the last clone is dropped.
#[derive(Clone)]
pub struct FakeLlm {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: Arc<StopOnDrop>,
}

impl FakeLlm {
    /// Binds 127.0.0.1 on a free port and starts serving `wire`.
    pub async fn start(wire: Wire) -> FakeLlm {
        FakeLlm::spawn(wire)
    }

    /// Like [`FakeLlm::start`], for tests without a tokio runtime.
    pub fn spawn(wire: Wire) -> FakeLlm {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("fake LLM: cannot bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("fake LLM: cannot make the listener non-blocking");
        let addr = listener
            .local_addr()
            .expect("fake LLM: listener has no address");
        let (count, _) = watch::channel(0usize);
        let shared = Arc::new(Shared {
            wire,
            queue: Mutex::new(VecDeque::new()),
            responder: Mutex::new(None),
            recorded: Mutex::new(Vec::new()),
            count,
            next_id: AtomicU64::new(0),
        });
        let token = CancellationToken::new();
        let server_shared = Arc::clone(&shared);
        let server_token = token.clone();
        std::thread::Builder::new()
            .name(format!("fake-llm-{}", addr.port()))
            .spawn(move || serve(listener, server_shared, server_token))
            .expect("fake LLM: cannot spawn the server thread");
        FakeLlm {
            shared,
            addr,
            stop: Arc::new(StopOnDrop(token)),
        }
    }

    /// The base URL to put in a provider file: `http://127.0.0.1:PORT` for Anthropic,
    /// `http://127.0.0.1:PORT/v1` for OpenAI.
    pub fn base_url(&self) -> String {
        match self.shared.wire {
            Wire::Anthropic => format!("http://{}", self.addr),
            Wire::OpenAi => format!("http://{}/v1", self.addr),
        }
    }

    /// The address the fake listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Appends a scripted reply; replies are consumed one per request, in order.
    pub fn push(&self, r: Reply) {
        self.shared.queue().push_back(r);
    }

    /// Sets a responder consulted for each request that finds the script empty (scripted
    /// replies still come first); when it returns `None` the fake echoes as usual. Lets a test
    /// drive long conversations whose answers depend on the request.
    pub fn set_responder(&self, f: impl Fn(&Value) -> Option<Reply> + Send + Sync + 'static) {
        *self
            .shared
            .responder
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(f));
    }

    /// Scripted replies not consumed yet.
    pub fn pending_replies(&self) -> usize {
        self.shared.queue().len()
    }

    /// Bodies of all requests to the wire's endpoint, in arrival order, including those answered
    /// with errors. A body that is not JSON is recorded as a JSON string of its text.
    pub fn requests(&self) -> Vec<Value> {
        self.shared
            .recorded()
            .iter()
            .map(|r| r.body.clone())
            .collect()
    }

    /// Headers of the same requests, in the same order.
    pub fn request_headers(&self) -> Vec<HeaderMap> {
        self.shared
            .recorded()
            .iter()
            .map(|r| r.headers.clone())
            .collect()
    }

    /// Waits until at least `n` requests arrived and returns all bodies; panics after `timeout`
    /// naming how many arrived.
    pub async fn wait_for_requests(&self, n: usize, timeout: Duration) -> Vec<Value> {
        let mut rx = self.shared.count.subscribe();
        let waited = tokio::time::timeout(timeout, rx.wait_for(|c| *c >= n)).await;
        if waited.is_err() {
            let got = self.requests();
            panic!(
                "fake LLM ({:?}): expected at least {n} request(s) within {timeout:?}, got {}; \
                 last body: {}",
                self.shared.wire,
                got.len(),
                got.last().map_or("-".to_string(), |b| b.to_string())
            );
        }
        self.requests()
    }

    /// Stops the server now (also for other clones); open connections are closed.
    pub fn shutdown(&self) {
        self.stop.0.cancel();
    }
}

/// The server thread: a current-thread runtime serving until `token` is cancelled. Dropping the
/// runtime afterwards drops every connection task, including hanging ones.
fn serve(listener: std::net::TcpListener, shared: Arc<Shared>, token: CancellationToken) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fake LLM: cannot build a runtime: {e}");
            return;
        }
    };
    rt.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("fake LLM: cannot register the listener: {e}");
                return;
            }
        };
        let app = Router::new().fallback(handle).with_state(shared);
        tokio::select! {
            _ = token.cancelled() => {}
            r = axum::serve(listener, app).into_future() => {
                if let Err(e) = r {
                    eprintln!("fake LLM: server error: {e}");
                }
            }
        }
    });
    rt.shutdown_background();
}

/// Every request lands here: wrong routes get a 404 in the wire's error shape, the endpoint gets
/// recorded and answered from the script.
async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let wire = shared.wire;
    let endpoint = match wire {
        Wire::Anthropic => "/v1/messages",
        Wire::OpenAi => "/v1/chat/completions",
    };
    if method != Method::POST || uri.path() != endpoint {
        let msg = format!(
            "fake LLM ({wire:?}): no route {method} {} (expected POST {endpoint})",
            uri.path()
        );
        eprintln!("{msg}");
        return error_response(wire, 404, &msg, None);
    }
    let body: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    shared.recorded().push(Recorded {
        headers: headers.clone(),
        body: body.clone(),
    });
    shared.count.send_modify(|c| *c += 1);

    if wire == Wire::Anthropic && !headers.contains_key("anthropic-version") {
        return error_response(wire, 400, "anthropic-version: header is required", None);
    }
    if !body.is_object() {
        return error_response(wire, 400, "the request body is not a JSON object", None);
    }
    let scripted = shared.queue().pop_front();
    let responder = shared
        .responder
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let reply = scripted
        .or_else(|| responder.and_then(|f| f(&body)))
        .unwrap_or_else(|| Reply::Text {
            text: format!("echo: {}", last_user_text(&body)),
            usage: DEFAULT_USAGE,
        });
    let ctx = Ctx {
        wire,
        stream: body.get("stream").and_then(Value::as_bool) == Some(true),
        include_usage: body
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true),
        model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("fake-model")
            .to_string(),
        id: shared.id(),
    };
    respond(resolve(reply).await, &ctx).await
}

/// The text of the last user message that has any text (tool-result-only turns are skipped),
/// text blocks joined with newlines. Works for both wires.
pub fn last_user_text(body: &Value) -> String {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return String::new();
    };
    messages
        .iter()
        .rev()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .map(|m| match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(blocks)) => blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        })
        .find(|t| !t.is_empty())
        .unwrap_or_default()
}

/// The contents of the `tool_result` blocks of an Anthropic-wire request's last message, as
/// JSON text (empty when it has none).
pub fn tool_results_in_last_message(body: &Value) -> Vec<String> {
    let last = body["messages"].as_array().and_then(|m| m.last());
    let blocks = last.and_then(|l| l["content"].as_array());
    (blocks.into_iter().flatten())
        .filter(|b| b["type"] == "tool_result")
        .map(|b| b["content"].to_string())
        .collect()
}

/// Facts about the request that shape the answer.
struct Ctx {
    wire: Wire,
    stream: bool,
    include_usage: bool,
    model: String,
    id: u64,
}

/// A content block of an answer, wire-neutral.
enum Block {
    Thinking {
        thinking: String,
        signature: String,
    },
    Text(String),
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

#[derive(Clone, Copy)]
enum Stop {
    EndTurn,
    ToolUse,
    MaxTokens,
}

/// What the server will do, after gates and thinking wrappers are resolved.
enum Outcome {
    Content {
        blocks: Vec<Block>,
        stop: Stop,
        usage: Usage,
    },
    Error {
        status: u16,
        message: String,
        retry_after: Option<u64>,
    },
    Hang,
    PingForever,
    DropMidStream(String),
    Garbage,
    RawSse(Bytes),
}

/// Waits on gates and folds thinking wrappers into the content they precede.
async fn resolve(mut reply: Reply) -> Outcome {
    let mut blocks = Vec::new();
    loop {
        reply = match reply {
            Reply::Gated { gate, then } => {
                // A closed semaphore releases the call too: nothing could ever open it.
                if let Ok(permit) = gate.acquire().await {
                    permit.forget();
                }
                *then
            }
            Reply::Thinking {
                thinking,
                signature,
                then,
            } => {
                blocks.push(Block::Thinking {
                    thinking,
                    signature,
                });
                *then
            }
            Reply::Text { text, usage } => {
                blocks.push(Block::Text(text));
                return Outcome::Content {
                    blocks,
                    stop: Stop::EndTurn,
                    usage,
                };
            }
            Reply::MaxTokens { text, usage } => {
                blocks.push(Block::Text(text));
                return Outcome::Content {
                    blocks,
                    stop: Stop::MaxTokens,
                    usage,
                };
            }
            Reply::ToolCalls { text, calls, usage } => {
                blocks.extend(text.map(Block::Text));
                blocks.extend(calls.into_iter().map(|(id, name, input)| Block::ToolUse {
                    id,
                    name,
                    input,
                }));
                return Outcome::Content {
                    blocks,
                    stop: Stop::ToolUse,
                    usage,
                };
            }
            Reply::Error {
                status,
                message,
                retry_after,
            } => {
                return Outcome::Error {
                    status,
                    message,
                    retry_after,
                };
            }
            Reply::Hang => return Outcome::Hang,
            Reply::PingForever => return Outcome::PingForever,
            Reply::DropMidStream { text } => return Outcome::DropMidStream(text),
            Reply::Garbage => return Outcome::Garbage,
            Reply::RawSse(bytes) => return Outcome::RawSse(bytes),
        };
    }
}

async fn respond(outcome: Outcome, ctx: &Ctx) -> Response {
    match outcome {
        Outcome::Content {
            blocks,
            stop,
            usage,
        } => match (ctx.wire, ctx.stream) {
            (Wire::Anthropic, true) => sse_response(anthropic_events(ctx, &blocks, stop, usage)),
            (Wire::Anthropic, false) => {
                json_response(anthropic_message(ctx, &blocks, stop, usage).to_string())
            }
            (Wire::OpenAi, true) => sse_response(openai_events(ctx, &blocks, stop, usage)),
            (Wire::OpenAi, false) => {
                json_response(openai_completion(ctx, &blocks, stop, usage).to_string())
            }
        },
        Outcome::Error {
            status,
            message,
            retry_after,
        } => error_response(ctx.wire, status, &message, retry_after),
        Outcome::Hang => {
            // The runtime is dropped on shutdown, which ends this future and the connection.
            std::future::pending::<Response>().await
        }
        Outcome::PingForever => ping_forever(ctx),
        Outcome::RawSse(bytes) if ctx.stream => raw_sse_response(bytes),
        Outcome::RawSse(_) => error_response(
            ctx.wire,
            400,
            "fake LLM: a recorded event stream answers only a streaming request",
            None,
        ),
        Outcome::DropMidStream(text) => drop_mid_stream(ctx, &text),
        Outcome::Garbage => {
            let (body, content_type) = if ctx.stream {
                let ev = match ctx.wire {
                    Wire::Anthropic => format!("event: message_start\ndata: {GARBAGE}\n\n"),
                    Wire::OpenAi => format!("data: {GARBAGE}\n\n"),
                };
                (ev, SSE_CONTENT_TYPE)
            } else {
                (GARBAGE.to_string(), "application/json")
            };
            let mut resp = Response::new(Body::from(body));
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            resp
        }
    }
}

const SSE_CONTENT_TYPE: &str = "text/event-stream; charset=utf-8";

/// A 200 `text/event-stream` response; each string is sent as its own body chunk.
fn sse_response(events: Vec<String>) -> Response {
    let chunks = futures::stream::iter(events.into_iter().map(Ok::<_, std::io::Error>));
    let mut resp = Response::new(Body::from_stream(chunks));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(SSE_CONTENT_TYPE),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// A 200 `text/event-stream` response whose body is `bytes` verbatim, one chunk per event:
/// each chunk ends after a blank line (`\n\n`), the last one wherever the bytes end.
fn raw_sse_response(bytes: Bytes) -> Response {
    let chunks = split_events(&bytes)
        .into_iter()
        .map(Ok::<_, std::io::Error>)
        .collect::<Vec<_>>();
    let mut resp = Response::new(Body::from_stream(futures::stream::iter(chunks)));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    resp
}

/// `bytes` cut after every `\n\n`; the pieces concatenate to `bytes`.
pub fn split_events(bytes: &Bytes) -> Vec<Bytes> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i + 1 < bytes.len() {
        if bytes[i] == b'\n' && bytes[i + 1] == b'\n' {
            pieces.push(bytes.slice(start..i + 2));
            start = i + 2;
            i += 2;
        } else {
            i += 1;
        }
    }
    if start < bytes.len() {
        pieces.push(bytes.slice(start..));
    }
    pieces
}

fn json_response(body: String) -> Response {
    let mut resp = Response::new(Body::from(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A 200 whose body carries the first half of a text answer, then breaks off: the connection is
/// dropped without finishing the chunked body. The pause lets the partial data reach the client.
fn drop_mid_stream(ctx: &Ctx, text: &str) -> Response {
    let first_half = split_n(text, 2).into_iter().next().unwrap_or_default();
    let blocks = vec![Block::Text(first_half.to_string())];
    let (mut parts, content_type) = match (ctx.wire, ctx.stream) {
        (Wire::Anthropic, true) => {
            let mut ev = anthropic_events(ctx, &blocks, Stop::EndTurn, DEFAULT_USAGE);
            // Keep message_start .. the text deltas; cut before content_block_stop.
            let stop_at = ev
                .iter()
                .position(|e| e.starts_with("event: content_block_stop"))
                .unwrap_or(ev.len());
            ev.truncate(stop_at);
            (ev, SSE_CONTENT_TYPE)
        }
        (Wire::OpenAi, true) => {
            let mut ev = openai_events(ctx, &blocks, Stop::EndTurn, DEFAULT_USAGE);
            // Keep the role chunk and the content chunks; cut before the finish chunk.
            let stop_at = ev
                .iter()
                .position(|e| !e.contains("\"finish_reason\":null"))
                .unwrap_or(ev.len());
            ev.truncate(stop_at);
            (ev, SSE_CONTENT_TYPE)
        }
        (wire, false) => {
            let full = match wire {
                Wire::Anthropic => anthropic_message(ctx, &blocks, Stop::EndTurn, DEFAULT_USAGE),
                Wire::OpenAi => openai_completion(ctx, &blocks, Stop::EndTurn, DEFAULT_USAGE),
            }
            .to_string();
            let half = split_n(&full, 2).into_iter().next().unwrap_or_default();
            (vec![half.to_string()], "application/json")
        }
    };
    if parts.is_empty() {
        parts.push(String::new());
    }
    let head = futures::stream::iter(parts.into_iter().map(Ok::<_, std::io::Error>));
    let tail = futures::stream::once(async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        Err(std::io::Error::other(
            "fake LLM: connection dropped mid-stream",
        ))
    });
    let mut resp = Response::new(Body::from_stream(head.chain(tail)));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// The start of a streamed answer, then a keep-alive every second, never content nor an end.
fn ping_forever(ctx: &Ctx) -> Response {
    let (start, ping) = match ctx.wire {
        Wire::Anthropic => {
            let start = anthropic_events(ctx, &[], Stop::EndTurn, DEFAULT_USAGE)
                .into_iter()
                .next()
                .unwrap_or_default();
            (start, sse("ping", &json!({"type": "ping"})))
        }
        Wire::OpenAi => {
            let chunk = |delta: Value| {
                format!(
                    "data: {}\n\n",
                    json!({"id": format!("chatcmpl-fake{}", ctx.id), "object": "chat.completion.chunk",
                           "model": ctx.model,
                           "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
                )
            };
            (
                chunk(json!({"role": "assistant", "content": ""})),
                chunk(json!({})),
            )
        }
    };
    let pings = futures::stream::unfold((), move |()| {
        let ping = ping.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Some((Ok::<_, std::io::Error>(ping), ()))
        }
    });
    let body = futures::stream::once(async move { Ok::<_, std::io::Error>(start) }).chain(pings);
    let mut resp = Response::new(Body::from_stream(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(SSE_CONTENT_TYPE),
    );
    resp
}

/// An error in the wire's shape, with `retry-after` when given.
fn error_response(wire: Wire, status: u16, message: &str, retry_after: Option<u64>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = match wire {
        Wire::Anthropic => json!({
            "type": "error",
            "error": {"type": anthropic_error_type(status.as_u16()), "message": message},
        }),
        Wire::OpenAi => {
            let (ty, code) = openai_error_type(status.as_u16());
            json!({"error": {"message": message, "type": ty, "param": null, "code": code}})
        }
    };
    let mut resp = json_response(body.to_string());
    *resp.status_mut() = status;
    if let Some(secs) = retry_after {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

fn anthropic_error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

fn openai_error_type(status: u16) -> (&'static str, Value) {
    match status {
        401 => ("invalid_request_error", json!("invalid_api_key")),
        429 => ("requests", json!("rate_limit_exceeded")),
        500..=599 => ("server_error", Value::Null),
        _ => ("invalid_request_error", Value::Null),
    }
}

/// Splits `s` into at most `n` non-empty pieces of nearly equal length, at char boundaries.
/// An empty string gives no pieces.
pub fn split_n(s: &str, n: usize) -> Vec<&str> {
    let chars = s.chars().count();
    if chars == 0 || n == 0 {
        return Vec::new();
    }
    let per = chars.div_ceil(n.min(chars));
    let mut pieces = Vec::new();
    let mut start = 0;
    for (i, (byte, _)) in s.char_indices().enumerate() {
        if i > 0 && i % per == 0 {
            pieces.push(&s[start..byte]);
            start = byte;
        }
    }
    pieces.push(&s[start..]);
    pieces
}

fn sse(event: &str, data: &Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

fn anthropic_usage(usage: Usage, output: u64) -> Value {
    json!({
        "input_tokens": usage.input,
        "cache_creation_input_tokens": usage.cache_write,
        "cache_read_input_tokens": usage.cache_read,
        "output_tokens": output,
    })
}

fn anthropic_stop(stop: Stop) -> &'static str {
    match stop {
        Stop::EndTurn => "end_turn",
        Stop::ToolUse => "tool_use",
        Stop::MaxTokens => "max_tokens",
    }
}

/// The Anthropic event sequence: `message_start`, per block `content_block_start` / deltas /
/// `content_block_stop` (a `ping` after the first start), `message_delta`, `message_stop`.
fn anthropic_events(ctx: &Ctx, blocks: &[Block], stop: Stop, usage: Usage) -> Vec<String> {
    let mut out = vec![sse(
        "message_start",
        &json!({
            "type": "message_start",
            "message": {
                "id": format!("msg_fake{:016}", ctx.id),
                "type": "message",
                "role": "assistant",
                "model": ctx.model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": anthropic_usage(usage, 1),
            }
        }),
    )];
    for (index, block) in blocks.iter().enumerate() {
        let (start, deltas): (Value, Vec<Value>) = match block {
            Block::Thinking {
                thinking,
                signature,
            } => (
                json!({"type": "thinking", "thinking": ""}),
                split_n(thinking, 2)
                    .into_iter()
                    .map(|p| json!({"type": "thinking_delta", "thinking": p}))
                    .chain(std::iter::once(
                        json!({"type": "signature_delta", "signature": signature}),
                    ))
                    .collect(),
            ),
            Block::Text(text) => (
                json!({"type": "text", "text": ""}),
                split_n(text, 3)
                    .into_iter()
                    .map(|p| json!({"type": "text_delta", "text": p}))
                    .collect(),
            ),
            Block::ToolUse { id, name, input } => {
                let args = input.to_string();
                (
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    std::iter::once("")
                        .chain(split_n(&args, 3))
                        .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
                        .collect(),
                )
            }
        };
        out.push(sse(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        if index == 0 {
            out.push(sse("ping", &json!({"type": "ping"})));
        }
        for delta in deltas {
            out.push(sse(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
        }
        out.push(sse(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        ));
    }
    if blocks.is_empty() {
        out.push(sse("ping", &json!({"type": "ping"})));
    }
    out.push(sse(
        "message_delta",
        &json!({
            "type": "message_delta",
            "delta": {"stop_reason": anthropic_stop(stop), "stop_sequence": null},
            "usage": {"output_tokens": usage.output},
        }),
    ));
    out.push(sse("message_stop", &json!({"type": "message_stop"})));
    out
}

/// The non-streaming Anthropic `Message`.
fn anthropic_message(ctx: &Ctx, blocks: &[Block], stop: Stop, usage: Usage) -> Value {
    let content: Vec<Value> = blocks
        .iter()
        .map(|b| match b {
            Block::Thinking {
                thinking,
                signature,
            } => json!({"type": "thinking", "thinking": thinking, "signature": signature}),
            Block::Text(text) => json!({"type": "text", "text": text}),
            Block::ToolUse { id, name, input } => {
                json!({"type": "tool_use", "id": id, "name": name, "input": input})
            }
        })
        .collect();
    json!({
        "id": format!("msg_fake{:016}", ctx.id),
        "type": "message",
        "role": "assistant",
        "model": ctx.model,
        "content": content,
        "stop_reason": anthropic_stop(stop),
        "stop_sequence": null,
        "usage": anthropic_usage(usage, usage.output),
    })
}

fn openai_finish(stop: Stop) -> &'static str {
    match stop {
        Stop::EndTurn => "stop",
        Stop::ToolUse => "tool_calls",
        Stop::MaxTokens => "length",
    }
}

fn openai_usage(usage: Usage) -> Value {
    let prompt = usage.input + usage.cache_read;
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": usage.output,
        "total_tokens": prompt + usage.output,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0
        },
    })
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The OpenAI chunk sequence: a role chunk, content chunks, per tool call a header chunk then
/// argument chunks (by `index`), a finish chunk, a usage chunk with empty `choices` when
/// `stream_options.include_usage`, then `[DONE]`. Thinking blocks are left out.
fn openai_events(ctx: &Ctx, blocks: &[Block], stop: Stop, usage: Usage) -> Vec<String> {
    let id = format!("chatcmpl-fake{:016}", ctx.id);
    let created = unix_now();
    let chunk = |choices: Value, usage: Option<Value>| {
        let mut c = json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": ctx.model,
            "system_fingerprint": "fp_fake",
            "choices": choices,
        });
        if ctx.include_usage {
            c["usage"] = usage.unwrap_or(Value::Null);
        }
        format!("data: {c}\n\n")
    };
    let delta = |delta: Value| {
        chunk(
            json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}]),
            None,
        )
    };
    let mut out = vec![delta(
        json!({"role": "assistant", "content": "", "refusal": null}),
    )];
    let mut tool_index = 0usize;
    for block in blocks {
        match block {
            Block::Thinking { .. } => {}
            Block::Text(text) => {
                for p in split_n(text, 3) {
                    out.push(delta(json!({"content": p})));
                }
            }
            Block::ToolUse { id, name, input } => {
                out.push(delta(json!({"tool_calls": [{
                    "index": tool_index,
                    "id": id,
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }]})));
                for p in split_n(&input.to_string(), 3) {
                    out.push(delta(json!({"tool_calls": [{
                        "index": tool_index,
                        "function": {"arguments": p},
                    }]})));
                }
                tool_index += 1;
            }
        }
    }
    out.push(chunk(
        json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": openai_finish(stop)}]),
        None,
    ));
    if ctx.include_usage {
        out.push(chunk(json!([]), Some(openai_usage(usage))));
    }
    out.push("data: [DONE]\n\n".to_string());
    out
}

/// The non-streaming OpenAI `chat.completion`.
fn openai_completion(ctx: &Ctx, blocks: &[Block], stop: Stop, usage: Usage) -> Value {
    let text: String = blocks
        .iter()
        .filter_map(|b| match b {
            Block::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    let calls: Vec<Value> = blocks
        .iter()
        .filter_map(|b| match b {
            Block::ToolUse { id, name, input } => Some(json!({
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": input.to_string()},
            })),
            _ => None,
        })
        .collect();
    let mut message = json!({
        "role": "assistant",
        "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { json!(text) },
        "refusal": null,
        "annotations": [],
    });
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
    }
    json!({
        "id": format!("chatcmpl-fake{:016}", ctx.id),
        "object": "chat.completion",
        "created": unix_now(),
        "model": ctx.model,
        "system_fingerprint": "fp_fake",
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": openai_finish(stop)}],
        "usage": openai_usage(usage),
    })
}
