//! A minimal Anthropic Messages server on 127.0.0.1 for the benchmarks: streamed (SSE) answers
//! chosen by a responder, and the fake's own time per request (from the handler being called
//! with the whole body until the whole answer is built), so that it can be subtracted from
//! what a client of the daemon sees. Only what the bench needs: the full-featured test fake is
//! `tests/it/support/fake_llm.rs`.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Token counts of an answer (Anthropic terms: `input` excludes cache reads and writes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

/// One answer.
#[derive(Clone, Debug)]
pub enum Answer {
    Text(String),
    /// `(id, name, input)`.
    Tools(Vec<(String, String, Value)>),
}

/// Chooses the answer for a request body (raw bytes).
pub type Responder = dyn Fn(&[u8]) -> (Answer, Usage) + Send + Sync;

struct Shared {
    responder: Box<Responder>,
    /// `(tag, fake's own time)` per request; the tag is the number after the last `BENCHID=`
    /// in the body (0 when there is none).
    spans: Mutex<Vec<(u64, Duration)>>,
    next_id: AtomicU64,
}

struct StopOnDrop(CancellationToken);
impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Handle to the server; it stops when the handle is dropped.
pub struct FakeProvider {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _stop: StopOnDrop,
}

impl FakeProvider {
    /// Serves on its own thread and current-thread runtime.
    pub fn spawn(responder: Box<Responder>) -> anyhow::Result<FakeProvider> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            responder,
            spans: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
        });
        let token = CancellationToken::new();
        let (s, t) = (shared.clone(), token.clone());
        std::thread::Builder::new()
            .name("fake-provider".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("fake provider runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)
                        .expect("fake provider listener");
                    let app = Router::new().fallback(handle).with_state(s);
                    tokio::select! {
                        _ = t.cancelled() => {}
                        r = axum::serve(listener, app).into_future() => {
                            if let Err(e) = r { eprintln!("fake provider: {e}"); }
                        }
                    }
                });
                rt.shutdown_background();
            })?;
        Ok(FakeProvider {
            addr,
            shared,
            _stop: StopOnDrop(token),
        })
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Takes the recorded spans.
    pub fn take_spans(&self) -> Vec<(u64, Duration)> {
        std::mem::take(&mut *self.shared.spans.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The number after the last `BENCHID=` in `body`.
pub fn tag_of(body: &[u8]) -> u64 {
    const MARK: &[u8] = b"BENCHID=";
    let Some(pos) = body.windows(MARK.len()).rposition(|w| w == MARK) else {
        return 0;
    };
    body[pos + MARK.len()..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .fold(0u64, |n, b| n * 10 + u64::from(b - b'0'))
}

async fn handle(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let t0 = Instant::now();
    let (answer, usage) = (shared.responder)(&body);
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let events = sse_body(id, &answer, usage);
    let mut resp = Response::new(Body::from(events));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    let tag = tag_of(&body);
    let span = t0.elapsed();
    shared
        .spans
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((tag, span));
    resp
}

fn sse(out: &mut String, event: &str, data: &Value) {
    out.push_str("event: ");
    out.push_str(event);
    out.push_str("\ndata: ");
    out.push_str(&data.to_string());
    out.push_str("\n\n");
}

/// The Anthropic event sequence for `answer`, in one body.
fn sse_body(id: u64, answer: &Answer, usage: Usage) -> String {
    let mut out = String::with_capacity(1024);
    sse(
        &mut out,
        "message_start",
        &json!({"type": "message_start", "message": {
            "id": format!("msg_bench{id:016}"), "type": "message", "role": "assistant",
            "model": "claude-sonnet-bench", "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": usage.input, "cache_creation_input_tokens": usage.cache_write,
                      "cache_read_input_tokens": usage.cache_read, "output_tokens": 1}}}),
    );
    let stop = match answer {
        Answer::Text(text) => {
            sse(
                &mut out,
                "content_block_start",
                &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            );
            sse(
                &mut out,
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
            );
            sse(
                &mut out,
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": 0}),
            );
            "end_turn"
        }
        Answer::Tools(calls) => {
            for (i, (id, name, input)) in calls.iter().enumerate() {
                sse(
                    &mut out,
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
                );
                sse(
                    &mut out,
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}),
                );
                sse(
                    &mut out,
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": i}),
                );
            }
            "tool_use"
        }
    };
    sse(
        &mut out,
        "message_delta",
        &json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                "usage": {"output_tokens": usage.output}}),
    );
    sse(&mut out, "message_stop", &json!({"type": "message_stop"}));
    out
}
