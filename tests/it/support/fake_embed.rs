//! A deterministic OpenAI-compatible embeddings server on 127.0.0.1 (`POST /v1/embeddings`),
//! for wiring tests: every word (lowercased alphanumeric run, a trailing `s` dropped) is hashed
//! into one of [`DIMS`] buckets, so texts that share words get similar vectors. It records every
//! input text and can fail the next requests on demand. The quality comparison uses a real
//! model instead (scripts/retrieval-eval.sh).

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Vector size.
pub const DIMS: usize = 64;

#[derive(Default)]
struct Shared {
    /// Every input text, in arrival order.
    inputs: Vec<String>,
    requests: usize,
    /// Answer the next this many requests with this status.
    fail_next: Option<(usize, u16)>,
}

/// Handle to a running server; it stops when the last clone is dropped.
#[derive(Clone)]
pub struct FakeEmbed {
    shared: Arc<Mutex<Shared>>,
    addr: SocketAddr,
    _stop: Arc<StopOnDrop>,
}

struct StopOnDrop(CancellationToken);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The fake's vector for `text` (unit length; all zeros for a text without words).
pub fn embed(text: &str) -> Vec<f32> {
    let mut v = vec![0f32; DIMS];
    for w in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let w = w.to_lowercase();
        let w = w.strip_suffix('s').filter(|s| s.len() > 2).unwrap_or(&w);
        // FNV-1a: stable across runs and platforms.
        let mut h: u64 = 0xcbf29ce484222325;
        for b in w.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
        }
        v[(h % DIMS as u64) as usize] += 1.0;
    }
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

impl FakeEmbed {
    pub fn spawn() -> FakeEmbed {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("fake embed: bind");
        listener
            .set_nonblocking(true)
            .expect("fake embed: nonblocking");
        let addr = listener.local_addr().expect("fake embed: address");
        let shared = Arc::new(Mutex::new(Shared::default()));
        let token = CancellationToken::new();
        let (s, t) = (shared.clone(), token.clone());
        std::thread::Builder::new()
            .name(format!("fake-embed-{}", addr.port()))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("fake embed: runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                    let app = Router::new()
                        .route("/v1/embeddings", post(handle))
                        .with_state(s);
                    tokio::select! {
                        _ = t.cancelled() => {}
                        r = axum::serve(listener, app).into_future() => {
                            if let Err(e) = r { eprintln!("fake embed: {e}"); }
                        }
                    }
                });
                rt.shutdown_background();
            })
            .expect("fake embed: thread");
        FakeEmbed {
            shared,
            addr,
            _stop: Arc::new(StopOnDrop(token)),
        }
    }

    /// `http://127.0.0.1:PORT/v1`: the `base_url` of an `openai`-type model.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every text embedded so far.
    pub fn inputs(&self) -> Vec<String> {
        self.shared.lock().unwrap().inputs.clone()
    }

    /// Requests answered so far (failed ones included).
    pub fn requests(&self) -> usize {
        self.shared.lock().unwrap().requests
    }

    /// Answer the next `n` requests with HTTP `status` (`n = 0`: answer normally again).
    pub fn fail_next(&self, n: usize, status: u16) {
        self.shared.lock().unwrap().fail_next = (n > 0).then_some((n, status));
    }
}

async fn handle(State(shared): State<Arc<Mutex<Shared>>>, Json(body): Json<Value>) -> Response {
    let inputs: Vec<String> = match body.get("input") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect(),
        _ => {
            return (
                StatusCode::BAD_REQUEST,
                Json(
                    json!({"error": {"message": "input must be a string or an array of strings"}}),
                ),
            )
                .into_response();
        }
    };
    {
        let mut s = shared.lock().unwrap();
        s.requests += 1;
        if let Some((n, status)) = s.fail_next {
            s.fail_next = (n > 1).then_some((n - 1, status));
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return (
                code,
                Json(json!({"error": {"message": "injected failure"}})),
            )
                .into_response();
        }
        s.inputs.extend(inputs.iter().cloned());
    }
    let tokens: usize = inputs.iter().map(|t| t.split_whitespace().count()).sum();
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"object": "embedding", "index": i, "embedding": embed(t)}))
        .collect();
    Json(json!({
        "object": "list",
        "data": data,
        "model": body.get("model").cloned().unwrap_or(Value::Null),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}
    }))
    .into_response()
}
