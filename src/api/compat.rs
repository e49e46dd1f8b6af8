//! The OpenAI- and Anthropic-compatible endpoints (SPEC §17): `GET /v1/models`,
//! `POST /v1/chat/completions` and `POST /v1/messages`, streamed or not. The wire formats are
//! `llm::openai::server` and `llm::anthropic::server`; this module reads the headers, hands
//! the parsed request to the backend (durable intake) and answers: the whole reply, or an SSE
//! stream with keep-alives while the agent works and the text as it is written. A client that
//! goes away never cancels the message: the backend waits for it in a task of its own.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;

use super::backend::{BackendError, CompatIn, CompatOutcome, CompatTicket};
use super::reply::{RawBody, too_large_message};
use super::server::ApiState;
use crate::llm::StreamDelta;
use crate::llm::anthropic::server as anthropic;
use crate::llm::compat::{Api, CompatReply, ErrorKind, Invalid};
use crate::llm::openai::responses;
use crate::llm::openai::server as openai;

/// The header that selects a persistent session.
pub(crate) const SESSION_HEADER: HeaderName = HeaderName::from_static("x-agentd-session");
/// The header whose value becomes the intake id.
pub(crate) const IDEMPOTENCY_HEADER: HeaderName = HeaderName::from_static("idempotency-key");
/// Tells nginx (and proxies that copy it) not to buffer a stream.
pub(super) const ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");
/// The header the official SDKs obey to retry or not.
pub(crate) const SHOULD_RETRY_HEADER: HeaderName = HeaderName::from_static("x-should-retry");

/// The longest silence on a stream: a keep-alive goes out after it (SSE comment for OpenAI,
/// `ping` for Anthropic), so clients and proxies in front do not time out while the agent
/// runs tools. The agent also sends one as each batch of tool calls starts.
pub(crate) const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(10);

/// Frames waiting for a slow client (beyond these the producer waits).
const STREAM_BUFFER: usize = 64;

/// Which API a path belongs to, for error envelopes (`None`: our own `{"error": …}`).
pub(crate) fn api_of(path: &str) -> Option<Api> {
    if path == anthropic::MESSAGES_PATH || path.starts_with("/v1/messages/") {
        Some(Api::Anthropic)
    } else if path.starts_with("/v1/") || path == "/v1" {
        Some(Api::OpenAi)
    } else {
        None
    }
}

/// An error in `api`'s envelope, with `x-should-retry: false` when a retry must not happen.
pub(crate) fn error_response(
    api: Api,
    kind: ErrorKind,
    message: &str,
    param: Option<&str>,
) -> Response {
    let body = match api {
        Api::OpenAi | Api::Responses => openai::error_body(kind, message, param),
        Api::Anthropic => anthropic::error_body(kind, message),
    };
    let status = StatusCode::from_u16(kind.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = raw(status, "application/json", body);
    if !kind.retry() {
        r.headers_mut()
            .insert(SHOULD_RETRY_HEADER, HeaderValue::from_static("false"));
    }
    r
}

/// A response whose body the outer `finish` layer leaves as it is.
pub(super) fn raw(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Body>,
) -> Response {
    let mut r = (status, body.into()).into_response();
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r.extensions_mut().insert(RawBody);
    r
}

/// Anthropic clients name their API version in every request.
const ANTHROPIC_VERSION: HeaderName = HeaderName::from_static(anthropic::VERSION_HEADER);

/// When the daemon started, as Anthropic's model objects date it.
fn created_at(state: &ApiState) -> String {
    chrono::DateTime::from_timestamp(state.started_unix(), 0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// `GET /v1/models`: OpenAI's list, or Anthropic's for a client that sends `anthropic-version`.
pub(crate) async fn models(State(state): State<Arc<ApiState>>, headers: HeaderMap) -> Response {
    let names = state.backend().models();
    let body = if headers.contains_key(ANTHROPIC_VERSION) {
        anthropic::models_body(&names, &created_at(&state))
    } else {
        openai::models_body(&names, state.started_unix(), state.agent_name())
    };
    raw(StatusCode::OK, "application/json", body)
}

/// `POST /v1/messages/count_tokens`: agentd's estimate of the tokens the request adds (its
/// messages, system text and images, at about 4 bytes a token, as compaction counts), not
/// counting agentd's own system prompt and tools, which come on top (and are cached). No
/// provider is called.
pub(crate) async fn count_tokens(
    State(state): State<Arc<ApiState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let api = Api::Anthropic;
    let body = match body {
        Ok(b) => b,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            let message = too_large_message(state.max_body_bytes());
            return error_response(api, ErrorKind::TooLarge, &message, None);
        }
        Err(e) => return error_response(api, ErrorKind::InvalidRequest, &e.body_text(), None),
    };
    match anthropic::parse_request(&body) {
        Ok(r) => {
            let count = crate::agent::compaction::request_estimate(&r);
            raw(
                StatusCode::OK,
                "application/json",
                anthropic::count_tokens_body(count),
            )
        }
        Err(Invalid { param, message }) => {
            error_response(api, ErrorKind::InvalidRequest, &message, param.as_deref())
        }
    }
}

/// `GET /v1/models/{id}`: one of the listed models, else 404 naming the list.
pub(crate) async fn model(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    let names = state.backend().models();
    let found = if headers.contains_key(ANTHROPIC_VERSION) {
        anthropic::model_body(&names, &id, &created_at(&state))
    } else {
        openai::model_body(&names, &id, state.started_unix(), state.agent_name())
    };
    let api = match headers.contains_key(ANTHROPIC_VERSION) {
        true => Api::Anthropic,
        false => Api::OpenAi,
    };
    match found {
        Some(body) => raw(StatusCode::OK, "application/json", body),
        None => error_response(
            api,
            ErrorKind::NotFound,
            &format!(
                "no model \"{}\": GET /v1/models lists them (\"agentd\" or \"agentd:<model name>\")",
                crate::control::escaped_preview(&id)
            ),
            Some("model"),
        ),
    }
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat_completions(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    serve(state, Api::OpenAi, headers, body).await
}

/// `POST /v1/responses`.
pub(crate) async fn responses(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    serve(state, Api::Responses, headers, body).await
}

/// `POST /v1/messages`.
pub(crate) async fn messages(
    State(state): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    serve(state, Api::Anthropic, headers, body).await
}

async fn serve(
    state: Arc<ApiState>,
    api: Api,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return error_response(
                api,
                ErrorKind::TooLarge,
                &too_large_message(state.max_body_bytes()),
                None,
            );
        }
        Err(e) => return error_response(api, ErrorKind::InvalidRequest, &e.body_text(), None),
    };
    let parsed = match api {
        Api::OpenAi => openai::parse_request(&body),
        Api::Anthropic => anthropic::parse_request(&body),
        Api::Responses => responses::parse_request(&body),
    };
    let request = match parsed {
        Ok(r) => r,
        Err(Invalid { param, message }) => {
            return error_response(api, ErrorKind::InvalidRequest, &message, param.as_deref());
        }
    };
    let session_header = match header(&headers, &SESSION_HEADER) {
        Ok(v) => v,
        Err(m) => return error_response(api, ErrorKind::InvalidRequest, &m, None),
    };
    let idempotency_key = match header(&headers, &IDEMPOTENCY_HEADER) {
        Ok(v) => v,
        Err(m) => return error_response(api, ErrorKind::InvalidRequest, &m, None),
    };
    let body_digest = body_digest(&body);
    let (stream, include_usage, model) =
        (request.stream, request.include_usage, request.model.clone());
    let echo = responses::Echo::of(&request);
    let ticket = match state
        .backend()
        .compat(CompatIn {
            api,
            request,
            session_header,
            idempotency_key,
            body_digest,
        })
        .await
    {
        Ok(t) => t,
        Err(e) => return backend_error(api, e),
    };
    if stream {
        return stream_answer(state, api, ticket, &model, include_usage, echo);
    }
    let timeout = state.call_timeout();
    match tokio::time::timeout(timeout, ticket.done).await {
        Err(_) => error_response(
            api,
            ErrorKind::Timeout,
            &format!(
                "still working after {} s ([behavior] call_timeout_seconds); the reply will land in the session trail and the webhook",
                timeout.as_secs()
            ),
            None,
        ),
        Ok(Err(e)) => backend_error(api, e),
        Ok(Ok(CompatOutcome::Failed { kind, message })) => {
            error_response(api, kind, &message, None)
        }
        Ok(Ok(CompatOutcome::Reply(reply))) => {
            let body = match api {
                Api::OpenAi => openai::completion_body(&reply),
                Api::Anthropic => anthropic::message_body(&reply),
                Api::Responses => responses::response_body(&reply, &echo),
            };
            raw(StatusCode::OK, "application/json", body)
        }
    }
}

/// The SHA-256 of the request body, hex: what an `Idempotency-Key` is bound to.
fn body_digest(body: &[u8]) -> String {
    crate::llm::compat::sha256_hex(body)
}

/// A header's trimmed value (`None` when absent or blank), or why it is unusable.
fn header(headers: &HeaderMap, name: &HeaderName) -> Result<Option<String>, String> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => match v.to_str() {
            Ok(s) if !s.trim().is_empty() => Ok(Some(s.trim().to_string())),
            Ok(_) => Ok(None),
            Err(_) => Err(format!("the {name} header must be visible ASCII")),
        },
    }
}

/// A backend refusal in the API's envelope.
fn backend_error(api: Api, e: BackendError) -> Response {
    let kind = match &e {
        BackendError::BadField { param, message } => {
            return error_response(api, ErrorKind::InvalidRequest, message, Some(param));
        }
        BackendError::BadRequest(_) => ErrorKind::InvalidRequest,
        BackendError::Conflict(_) => ErrorKind::Conflict,
        BackendError::NotFound(_) => ErrorKind::NotFound,
        BackendError::Unavailable(_) => ErrorKind::Unavailable,
        BackendError::Busy(_) => ErrorKind::Busy,
        BackendError::Internal(_) => ErrorKind::Internal,
    };
    if kind == ErrorKind::Internal {
        tracing::warn!(error = %e, "compatible endpoint: backend error");
    }
    let param = match &e {
        BackendError::BadField { param, .. } => Some(param.as_str()),
        _ => None,
    };
    error_response(api, kind, &e.to_string(), param)
}

/// The frames of one streamed answer in either API.
enum Frames {
    OpenAi(openai::ChunkStream),
    Anthropic(anthropic::EventStream),
    Responses(responses::ResponseStream),
}

impl Frames {
    fn start(&self) -> Vec<u8> {
        match self {
            Frames::OpenAi(s) => s.start(),
            Frames::Anthropic(s) => s.start(),
            Frames::Responses(s) => s.start(),
        }
    }
    fn text(&self, t: &str) -> Vec<u8> {
        match self {
            Frames::OpenAi(s) => s.text(t),
            Frames::Anthropic(s) => s.text(t),
            Frames::Responses(s) => s.text(t),
        }
    }
    fn keep_alive(&self) -> Vec<u8> {
        match self {
            Frames::OpenAi(s) => s.keep_alive(),
            Frames::Anthropic(s) => s.keep_alive(),
            Frames::Responses(s) => s.keep_alive(),
        }
    }
    fn finish(&self, r: &CompatReply) -> Vec<u8> {
        match self {
            Frames::OpenAi(s) => s.finish(r),
            Frames::Anthropic(s) => s.finish(r),
            Frames::Responses(s) => s.finish(r),
        }
    }
    fn error(&self, kind: ErrorKind, message: &str) -> Vec<u8> {
        match self {
            Frames::OpenAi(s) => s.error(kind, message),
            Frames::Anthropic(s) => s.error(kind, message),
            Frames::Responses(s) => s.error(kind, message),
        }
    }
}

/// What was streamed of the text so far, to send only the rest at the end.
#[derive(Default)]
pub(super) struct Sent {
    /// The text of the current model turn streamed so far.
    pub(super) turn: String,
    /// Any text was streamed.
    pub(super) any: bool,
    /// A tool batch ran after streamed text: the next text starts a new paragraph.
    pub(super) new_turn: bool,
}

/// The rest of `final_text` to send after `sent` streamed: everything after the part of the
/// last turn already sent, or all of it (after a blank line) when what was streamed is not
/// its start (text of a turn that went on to call tools).
pub(super) fn remainder<'a>(sent: &Sent, final_text: &'a str) -> std::borrow::Cow<'a, str> {
    if let Some(rest) = final_text
        .strip_prefix(sent.turn.as_str())
        .filter(|_| !sent.turn.is_empty())
    {
        std::borrow::Cow::Borrowed(rest)
    } else if sent.any {
        std::borrow::Cow::Owned(format!("\n\n{final_text}"))
    } else {
        std::borrow::Cow::Borrowed(final_text)
    }
}

/// The SSE answer: the start frames at once, then text as it comes and keep-alives while the
/// agent works, then the finish (or an error event). Produced by a task of its own into a
/// bounded channel; when the client goes away the task ends, the message does not.
fn stream_answer(
    state: Arc<ApiState>,
    api: Api,
    ticket: CompatTicket,
    model: &str,
    include_usage: bool,
    echo: responses::Echo,
) -> Response {
    let frames = match api {
        Api::OpenAi => Frames::OpenAi(openai::ChunkStream::new(
            &ticket.id,
            model,
            chrono::Utc::now().timestamp(),
            include_usage,
        )),
        Api::Anthropic => Frames::Anthropic(anthropic::EventStream::new(&ticket.id, model)),
        Api::Responses => Frames::Responses(responses::ResponseStream::new(
            &crate::llm::compat::response_id(&ticket.session_id, &ticket.id),
            model,
            chrono::Utc::now().timestamp(),
            echo,
        )),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(STREAM_BUFFER);
    let keep_alive = state.keep_alive_every();
    tokio::spawn(async move {
        let CompatTicket {
            done, mut deltas, ..
        } = ticket;
        let mut done = done;
        let send = |bytes: Vec<u8>| {
            let tx = tx.clone();
            async move { tx.send(Bytes::from(bytes)).await.is_ok() }
        };
        if !send(frames.start()).await {
            return;
        }
        let mut sent = Sent::default();
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + keep_alive, keep_alive);
        let outcome = loop {
            tokio::select! {
                outcome = &mut done => break outcome,
                delta = async {
                    match deltas.as_mut() {
                        Some(d) => d.recv().await,
                        None => std::future::pending().await,
                    }
                } => match delta {
                    Some(StreamDelta::Tools) => {
                        sent.turn.clear();
                        sent.new_turn = sent.any;
                        if !send(frames.keep_alive()).await {
                            return;
                        }
                        tick.reset();
                    }
                    Some(StreamDelta::Text(d)) => {
                        sent.turn.push_str(&d);
                        sent.any = true;
                        // What the model said before its tools ran stays; the next turn's
                        // text starts a new paragraph.
                        let piece = if std::mem::take(&mut sent.new_turn) {
                            format!("\n\n{d}")
                        } else {
                            d
                        };
                        if !send(frames.text(&piece)).await {
                            return;
                        }
                        tick.reset();
                    }
                    None => deltas = None,
                },
                _ = tick.tick() => {
                    if !send(frames.keep_alive()).await {
                        return;
                    }
                }
            }
        };
        let last = match outcome {
            Ok(CompatOutcome::Reply(reply)) => {
                let rest = remainder(&sent, &reply.text);
                let mut out = Vec::new();
                if !rest.is_empty() {
                    out.extend(frames.text(&rest));
                }
                out.extend(frames.finish(&reply));
                out
            }
            Ok(CompatOutcome::Failed { kind, message }) => frames.error(kind, &message),
            Err(e) => frames.error(ErrorKind::Unavailable, &e.to_string()),
        };
        let _ = send(last).await;
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    let mut r = raw(StatusCode::OK, "text/event-stream", Body::from_stream(body));
    let headers = r.headers_mut();
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // A proxy in front (nginx) would otherwise hold the stream back in its buffer.
    headers.insert(ACCEL_BUFFERING, HeaderValue::from_static("no"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_pick_the_envelope() {
        assert_eq!(api_of("/v1/messages"), Some(Api::Anthropic));
        assert_eq!(api_of("/v1/chat/completions"), Some(Api::OpenAi));
        assert_eq!(api_of("/v1/models"), Some(Api::OpenAi));
        assert_eq!(api_of("/api/v1/chat"), None);
    }

    #[test]
    fn the_end_of_a_stream_sends_only_what_is_missing() {
        let mut sent = Sent::default();
        assert_eq!(remainder(&sent, "Hello"), "Hello");
        sent.turn = "Hel".into();
        sent.any = true;
        assert_eq!(remainder(&sent, "Hello"), "lo");
        // Text of a turn that then called tools, then a final turn not streamed.
        sent.turn = "Let me look.".into();
        assert_eq!(remainder(&sent, "Found it."), "\n\nFound it.");
        sent.turn.clear();
        assert_eq!(remainder(&sent, "Found it."), "\n\nFound it.");
    }
}
