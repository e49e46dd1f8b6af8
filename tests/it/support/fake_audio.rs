//! A fake OpenAI-compatible audio server (SPEC §19) on 127.0.0.1 that validates like the real
//! API: `POST /v1/audio/transcriptions` needs a multipart body with a `file` part (with a file
//! name) and a `model` field (400 `invalid_request_error` naming the missing one otherwise);
//! `POST /v1/audio/speech` needs JSON `model`, `input` and `voice` and answers real OGG/Opus
//! bytes (the committed fixture); ElevenLabs' `POST /v1/text-to-speech/{voice id}` (key in
//! `xi-api-key`, JSON `text`, 422 without) answers the same. With a key set, any other bearer token is a 401 in OpenAI's
//! error shape. Tests script failures ([`FakeAudio::fail_next`]) and hold requests
//! ([`FakeAudio::hang_next`]), and slow it down ([`FakeAudio::set_delay`]); every request is
//! recorded.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::fake_telegram::parse_multipart;

/// The committed speech fixture: "Hello agent, what is the weather tomorrow?" as OGG/Opus
/// (how it was made: tests/fixtures/README.md).
pub const FIXTURE: &[u8] = include_bytes!("../../fixtures/voice-hello.ogg");

/// One transcription request as received.
#[derive(Clone, Debug)]
pub struct Transcription {
    pub model: String,
    pub file_name: String,
    pub bytes: Vec<u8>,
    pub authorization: Option<String>,
}

/// One speech request as received (its JSON body).
#[derive(Clone, Debug)]
pub struct SpeechRequest {
    pub body: Value,
}

#[derive(Default)]
struct Inner {
    key: Option<String>,
    transcript: String,
    duration: Option<f64>,
    transcriptions: Vec<Transcription>,
    speeches: Vec<SpeechRequest>,
    /// Per endpoint (`transcriptions`, `speech`): statuses the next requests answer with.
    failures: std::collections::HashMap<&'static str, Vec<u16>>,
    /// Per endpoint: how many of the next requests hang (never answered).
    hangs: std::collections::HashMap<&'static str, usize>,
    /// Rejected requests (400/401), with their message.
    rejected: Vec<(u16, String)>,
    /// How long each valid transcription request waits before it is answered (a slow server).
    delay: Option<std::time::Duration>,
}

struct StopOnDrop(CancellationToken);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

#[derive(Clone)]
pub struct FakeAudio {
    inner: Arc<Mutex<Inner>>,
    addr: SocketAddr,
    _stop: Arc<StopOnDrop>,
}

impl FakeAudio {
    /// Serves on a free port; `key`: the bearer token it accepts (`None`: any, as a local
    /// whisper server). Transcriptions answer `transcript`.
    pub fn spawn(key: Option<&str>, transcript: &str) -> FakeAudio {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("fake audio: bind");
        listener
            .set_nonblocking(true)
            .expect("fake audio: non-blocking");
        let addr = listener.local_addr().expect("fake audio: address");
        let inner = Arc::new(Mutex::new(Inner {
            key: key.map(str::to_string),
            transcript: transcript.to_string(),
            ..Default::default()
        }));
        let token = CancellationToken::new();
        let (state, stop) = (inner.clone(), token.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("fake audio: runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let app = Router::new().fallback(handle).with_state(state);
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = axum::serve(listener, app).into_future() => {}
                }
            });
            rt.shutdown_background();
        });
        FakeAudio {
            inner,
            addr,
            _stop: Arc::new(StopOnDrop(token)),
        }
    }

    /// `http://127.0.0.1:PORT/v1`, for a provider file.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The duration (seconds) transcriptions report (`None`: left out, as `json` answers do).
    pub fn set_duration(&self, seconds: Option<f64>) {
        self.lock().duration = seconds;
    }

    /// Every valid transcription request is recorded at once and answered `delay` later, as a
    /// slow server would (requests in flight together wait side by side).
    pub fn set_delay(&self, delay: std::time::Duration) {
        self.lock().delay = Some(delay);
    }

    /// The next requests to `endpoint` (`"transcriptions"` or `"speech"`) answer these
    /// statuses, in order, after validation (OpenAI's error shape; 429 with `retry-after: 0`).
    pub fn fail_next(&self, endpoint: &'static str, statuses: &[u16]) {
        let mut i = self.lock();
        i.failures
            .entry(endpoint)
            .or_default()
            .extend_from_slice(statuses);
    }

    /// The next `n` valid requests to `endpoint` are recorded and never answered.
    pub fn hang_next(&self, endpoint: &'static str, n: usize) {
        *self.lock().hangs.entry(endpoint).or_default() += n;
    }

    pub fn transcriptions(&self) -> Vec<Transcription> {
        self.lock().transcriptions.clone()
    }

    pub fn speeches(&self) -> Vec<SpeechRequest> {
        self.lock().speeches.clone()
    }

    /// Requests refused for their shape or key: `(status, message)`.
    pub fn rejected(&self) -> Vec<(u16, String)> {
        self.lock().rejected.clone()
    }
}

fn error(status: u16, message: &str, param: Option<&str>) -> Response {
    let kind = match status {
        401 => "invalid_api_key",
        429 => "rate_limit_exceeded",
        s if s >= 500 => "server_error",
        _ => "invalid_request_error",
    };
    let body = json!({"error": {"message": message, "type": kind, "param": param, "code": null}});
    let mut r = Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json");
    if status == 429 {
        r = r.header("retry-after", "0");
    }
    r.body(Body::from(body.to_string())).unwrap()
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |k: &str| {
        headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let reject = |status: u16, message: String, param: Option<&str>| {
        inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .rejected
            .push((status, message.clone()));
        error(status, &message, param)
    };
    let endpoint = match uri.path() {
        "/v1/audio/transcriptions" => "transcriptions",
        "/v1/audio/speech" => "speech",
        p if p.starts_with("/v1/text-to-speech/") => "elevenlabs",
        other => return reject(404, format!("no route {other}"), None),
    };
    let key = inner.lock().unwrap_or_else(|p| p.into_inner()).key.clone();
    if let Some(key) = key {
        let ok = match endpoint {
            "elevenlabs" => header("xi-api-key") == Some(key),
            _ => header("authorization") == Some(format!("Bearer {key}")),
        };
        if !ok {
            return reject(401, "Incorrect API key provided".into(), None);
        }
    }
    let checked = match endpoint {
        "transcriptions" => transcription(&inner, &headers, &body),
        "elevenlabs" => elevenlabs(&inner, &uri, &body),
        _ => speech(&inner, &body),
    };
    if let Err((status, message, param)) = checked {
        return reject(status, message, param);
    }
    let (hang, fail, delay) = {
        let mut i = inner.lock().unwrap_or_else(|p| p.into_inner());
        let hang = i
            .hangs
            .get_mut(endpoint)
            .filter(|n| **n > 0)
            .map(|n| *n -= 1);
        let fail = i
            .failures
            .get_mut(endpoint)
            .filter(|f| !f.is_empty())
            .map(|f| f.remove(0));
        let delay = i.delay.filter(|_| endpoint == "transcriptions");
        (hang.is_some(), fail, delay)
    };
    if hang {
        std::future::pending::<()>().await;
    }
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    if let Some(status) = fail {
        return error(status, "scripted failure", None);
    }
    let i = inner.lock().unwrap_or_else(|p| p.into_inner());
    if uri.path() == "/v1/audio/transcriptions" {
        let mut answer = json!({"text": i.transcript});
        if let Some(d) = i.duration {
            answer["duration"] = json!(d);
        }
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(answer.to_string()))
            .unwrap();
    }
    Response::builder()
        .header("content-type", "audio/ogg")
        .body(Body::from(FIXTURE))
        .unwrap()
}

type Refusal = (u16, String, Option<&'static str>);

/// Validate and record a transcription request as OpenAI does.
fn transcription(inner: &Mutex<Inner>, headers: &HeaderMap, body: &[u8]) -> Result<(), Refusal> {
    let ct = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(boundary) = ct
        .strip_prefix("multipart/form-data")
        .and_then(|rest| rest.split("boundary=").nth(1))
    else {
        return Err((
            400,
            format!("Invalid Content-Type {ct:?}: expected multipart/form-data"),
            None,
        ));
    };
    let parts = parse_multipart(body, boundary.trim_matches('"'))
        .map_err(|e| (400, format!("Could not parse multipart form: {e}"), None))?;
    let file = parts
        .iter()
        .find(|p| p.name == "file" && p.file_name.is_some());
    let model = parts.iter().find(|p| p.name == "model");
    let Some(file) = file else {
        return Err((
            400,
            "Missing required parameter: 'file'.".into(),
            Some("file"),
        ));
    };
    let Some(model) = model.map(|m| String::from_utf8_lossy(&m.bytes).to_string()) else {
        return Err((
            400,
            "Missing required parameter: 'model'.".into(),
            Some("model"),
        ));
    };
    if file.bytes.is_empty() {
        return Err((400, "The audio file is empty.".into(), Some("file")));
    }
    let authorization = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    inner
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .transcriptions
        .push(Transcription {
            model,
            file_name: file.file_name.clone().unwrap_or_default(),
            bytes: file.bytes.clone(),
            authorization,
        });
    Ok(())
}

/// Validate and record an ElevenLabs text-to-speech request: the voice id in the path, the
/// `output_format` query, JSON `text` (422 without, as ElevenLabs answers). Recorded as a
/// speech request whose body also has `voice_id` and `output_format`.
fn elevenlabs(inner: &Mutex<Inner>, uri: &Uri, body: &[u8]) -> Result<(), Refusal> {
    let voice = uri
        .path()
        .trim_start_matches("/v1/text-to-speech/")
        .to_string();
    let format = uri
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("output_format="))
        .unwrap_or("mp3_44100_128")
        .to_string();
    let mut v: Value =
        serde_json::from_slice(body).map_err(|e| (422, format!("body is not JSON: {e}"), None))?;
    if v["text"].as_str().is_none_or(str::is_empty) {
        return Err((422, "field required: text".into(), Some("text")));
    }
    if voice.is_empty() || voice.contains('/') {
        return Err((404, format!("voice {voice:?} not found"), None));
    }
    v["voice_id"] = json!(voice);
    v["output_format"] = json!(format);
    inner
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .speeches
        .push(SpeechRequest { body: v });
    Ok(())
}

/// Validate and record a speech request as OpenAI does.
fn speech(inner: &Mutex<Inner>, body: &[u8]) -> Result<(), Refusal> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| (400, format!("We could not parse the JSON body: {e}"), None))?;
    for (key, param) in [("model", "model"), ("input", "input"), ("voice", "voice")] {
        if v[key].as_str().is_none_or(str::is_empty) {
            return Err((
                400,
                format!("Missing required parameter: '{key}'."),
                Some(param),
            ));
        }
    }
    inner
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .speeches
        .push(SpeechRequest { body: v });
    Ok(())
}
