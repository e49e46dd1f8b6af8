//! `message/stream`: an SSE stream of JSON-RPC responses: the `Task` (submitted), a
//! `status-update` (working), the reply's text as `artifact-update` pieces as the model writes
//! it, the last piece, and the final `status-update`. Keep-alive comments while the agent works.
//! Produced by a task of its own into a bounded channel; a client that goes away ends the
//! stream, never the message.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::header::CACHE_CONTROL;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::Value;
use tokio::sync::mpsc;

use super::wire::{self, TaskView};
use super::{A2aTicket, Accepted, TaskEnd};
use crate::api::compat::{Sent, remainder};
use crate::api::server::ApiState;
use crate::llm::StreamDelta;

/// Frames waiting for a slow client (beyond these the producer waits).
const STREAM_BUFFER: usize = 64;

/// One SSE event carrying a JSON-RPC response.
fn frame(id: &Value, result: Value) -> Bytes {
    Bytes::from(format!("data: {}\n\n", wire::success(id, result)))
}

/// The answer to `message/stream`: the stream, or (refused before intake) one error event.
pub(crate) async fn open(state: Arc<ApiState>, id: Value, params: &Value) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(STREAM_BUFFER);
    match super::accept(&state, params, true).await {
        Ok((a, ticket)) => {
            let keep_alive = state.keep_alive_every();
            tokio::spawn(produce(tx, id, a, ticket, keep_alive));
        }
        Err(e) => {
            let event = format!("data: {}\n\n", wire::error(&id, &e));
            let _ = tx.try_send(Bytes::from(event));
        }
    }
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    let mut r =
        crate::api::compat::raw(StatusCode::OK, "text/event-stream", Body::from_stream(body));
    let headers = r.headers_mut();
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        crate::api::compat::ACCEL_BUFFERING,
        HeaderValue::from_static("no"),
    );
    r
}

async fn produce(
    tx: mpsc::Sender<Bytes>,
    id: Value,
    a: Accepted,
    ticket: A2aTicket,
    keep_alive: std::time::Duration,
) {
    let send = |b: Bytes| {
        let tx = tx.clone();
        async move { tx.send(b).await.is_ok() }
    };
    let working = TaskEnd::Working;
    if !send(frame(&id, wire::task(&a.view(None)))).await
        || !send(frame(&id, wire::status_update(&a.view(Some(&working))))).await
    {
        return;
    }
    let A2aTicket {
        mut done,
        mut deltas,
    } = ticket;
    let mut sent = Sent::default();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + keep_alive, keep_alive);
    let end = loop {
        tokio::select! {
            end = &mut done => break end,
            delta = async {
                match deltas.as_mut() {
                    Some(d) => d.recv().await,
                    None => std::future::pending().await,
                }
            } => match delta {
                Some(StreamDelta::Text(d)) => {
                    let piece = if std::mem::take(&mut sent.new_turn) { format!("\n\n{d}") } else { d.clone() };
                    let append = sent.any;
                    sent.turn.push_str(&d);
                    sent.any = true;
                    if !send(frame(&id, wire::artifact_update(&a.view(None), &piece, append, false))).await {
                        return;
                    }
                    tick.reset();
                }
                Some(StreamDelta::Tools) => {
                    sent.turn.clear();
                    sent.new_turn = sent.any;
                    if !send(Bytes::from_static(b": keep-alive\n\n")).await {
                        return;
                    }
                    tick.reset();
                }
                None => deltas = None,
            },
            _ = tick.tick() => {
                if !send(Bytes::from_static(b": keep-alive\n\n")).await {
                    return;
                }
            }
        }
    };
    if let TaskEnd::Completed { text } = &end {
        let rest = remainder(&sent, text);
        let last = wire::artifact_update(&a.view(None), &rest, sent.any, true);
        if !send(frame(&id, last)).await {
            return;
        }
    }
    let view: TaskView = a.view(Some(&end));
    let _ = send(frame(&id, wire::status_update(&view))).await;
}
