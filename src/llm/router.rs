//! One logical LLM call: resolve the model, retry retryable failures with backoff, then walk
//! the model's `fallback` list (SPEC §6).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::{ChatRequest, ChatResponse, LlmError, Provider, provider_for};
use crate::backoff::Backoff;
use crate::config::{BehaviorConfig, ModelSet, ModelSpec};

/// No single wait between retries of one model is longer than this, whatever the server
/// asks for (`Retry-After`).
pub const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);
/// How long establishing a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

fn build_http_client() -> Result<reqwest::Client, String> {
    crate::net::tls::client_builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
        .map_err(crate::net::scrub::reqwest_error_text)
}

/// The providers' client. One that cannot be built as configured falls back to reqwest's
/// defaults, with an error in the log. Cheap: the root certificates are read at the first
/// HTTPS handshake (`net::tls`).
fn http_client() -> reqwest::Client {
    build_http_client().unwrap_or_else(|e| {
        tracing::error!(error = %e, "could not build the configured HTTP client; using defaults");
        reqwest::Client::new()
    })
}

/// Something the caller may want to show or log while a call is in progress.
#[derive(Debug, Clone, PartialEq)]
pub enum LlmEvent {
    /// Model `model` failed with a retryable `error`; retry number `attempt` follows after
    /// `delay`.
    RetryWait {
        model: String,
        attempt: u32,
        delay: Duration,
        error: String,
    },
    /// Model `from` failed for good with `error`; model `to` is tried next.
    Fallback {
        from: String,
        to: String,
        error: String,
    },
}

/// The answer of a logical call and the model that gave it.
#[derive(Debug, Clone)]
pub struct ChatOutcome {
    pub response: ChatResponse,
    /// The model that answered (maybe a fallback).
    pub model: Arc<ModelSpec>,
    /// Set when a fallback model answered (SPEC §18.3).
    pub fell_back: Option<FellBack>,
}

/// A model of the `fallback` list answered: the model asked for, and why it did not.
#[derive(Debug, Clone, PartialEq)]
pub struct FellBack {
    /// The config name of the model asked for.
    pub from: String,
    /// The config name of the model that answered.
    pub to: String,
    /// Its error, at most [`MAX_FALLBACK_REASON`] characters.
    pub reason: String,
}

/// The longest fallback reason kept (the trail, the Telegram line).
pub const MAX_FALLBACK_REASON: usize = 200;

impl FellBack {
    fn new(from: &str, to: &str, error: &str) -> FellBack {
        let text = error;
        let mut reason: String = text.chars().take(MAX_FALLBACK_REASON).collect();
        if text.chars().nth(MAX_FALLBACK_REASON).is_some() {
            reason.push('…');
        }
        FellBack {
            from: from.to_string(),
            to: to.to_string(),
            reason,
        }
    }
}

/// An embeddings answer and the model that gave it.
#[derive(Debug)]
pub struct EmbedOutcome {
    pub embeddings: super::Embeddings,
    pub model: Arc<ModelSpec>,
}

/// All loaded models with their clients, plus the retry policy.
pub struct Llm {
    models: ModelSet,
    providers: BTreeMap<String, Arc<dyn Provider>>,
    retries: u32,
    base_delay: Duration,
    /// The shared client and the call bounds, for the audio endpoints ([`super::audio`]).
    http: reqwest::Client,
    limits: super::CallLimits,
}

impl Llm {
    /// The providers' reqwest client (connect timeout 10 s; no timeout of its own: each call
    /// is bounded by `behavior.call_timeout` for inactivity and `behavior.call_deadline` in
    /// total, see [`super::CallLimits`]).
    pub fn new(models: ModelSet, behavior: &BehaviorConfig) -> Llm {
        let http = http_client();
        let providers = models
            .loaded
            .iter()
            .map(|(name, spec)| {
                (
                    name.clone(),
                    provider_for(
                        spec.clone(),
                        http.clone(),
                        super::CallLimits::from_behavior(behavior),
                    ),
                )
            })
            .collect();
        Llm {
            models,
            providers,
            retries: behavior.api_retries,
            base_delay: behavior.api_retry_base_delay,
            http,
            limits: super::CallLimits::from_behavior(behavior),
        }
    }

    /// Given providers instead of HTTP clients (unit tests of the layers above), no retries.
    #[cfg(test)]
    pub(crate) fn with_providers(
        models: ModelSet,
        providers: BTreeMap<String, Arc<dyn Provider>>,
    ) -> Llm {
        Llm {
            models,
            providers,
            retries: 0,
            base_delay: Duration::from_millis(1),
            http: reqwest::Client::new(),
            limits: super::CallLimits {
                inactivity: Duration::from_secs(30),
                deadline: Duration::from_secs(60),
                max_reply_bytes: 1 << 20,
            },
        }
    }

    /// Every defined model, loaded or skipped.
    pub fn models(&self) -> &ModelSet {
        &self.models
    }

    /// One logical call: retries with jittered exponential backoff (base
    /// `api_retry_base_delay`, `api_retries` retries, honouring Retry-After, each wait capped at
    /// 60 s) on retryable errors, then each model of the `fallback` list in order (skipping
    /// unloaded ones, and for a structured-output request those without `structured_output`,
    /// which are logged). Unknown / unloaded model → `UnknownModel` /
    /// `NotLoaded`. On total failure the error of the last model tried is returned.
    pub async fn chat(
        &self,
        model: &str,
        req: &ChatRequest,
        on_event: &(dyn Fn(LlmEvent) + Send + Sync),
    ) -> Result<ChatOutcome, LlmError> {
        let (spec, provider) = self.resolve(model)?;
        let mut error = match self
            .with_retries(spec, || provider.chat(req), on_event)
            .await
        {
            Ok(response) => {
                return Ok(ChatOutcome {
                    response,
                    model: spec.clone(),
                    fell_back: None,
                });
            }
            Err(e) => e,
        };
        let asked_for_failed = error.to_string();

        let mut tried = vec![spec.name.as_str()];
        let mut from = spec.name.clone();
        for next in &spec.fallback {
            if !error.allows_fallback() {
                break;
            }
            if tried.contains(&next.as_str()) {
                continue;
            }
            let (next_spec, next_provider) = match self.resolve(next) {
                Ok(found) => found,
                Err(e) => {
                    tracing::warn!(model = %model, fallback = %next, reason = %e, "skipping fallback model");
                    continue;
                }
            };
            // A structured-output request only goes to a model that takes its format.
            if req.options.format.is_some() && !next_spec.structured_output {
                tracing::warn!(model = %model, fallback = %next, "skipping fallback model: structured_output = false");
                continue;
            }
            tracing::warn!(from = %from, to = %next, error = %error, "falling back to the next model");
            on_event(LlmEvent::Fallback {
                from: from.clone(),
                to: next.clone(),
                error: error.to_string(),
            });
            tried.push(next.as_str());
            match self
                .with_retries(next_spec, || next_provider.chat(req), on_event)
                .await
            {
                Ok(response) => {
                    return Ok(ChatOutcome {
                        response,
                        model: next_spec.clone(),
                        fell_back: Some(FellBack::new(&spec.name, next, &asked_for_failed)),
                    });
                }
                Err(e) => {
                    error = e;
                    from = next.clone();
                }
            }
        }
        Err(error)
    }

    fn resolve(&self, name: &str) -> Result<(&Arc<ModelSpec>, &Arc<dyn Provider>), LlmError> {
        if let (Some(spec), Some(provider)) = (self.models.get(name), self.providers.get(name)) {
            return Ok((spec, provider));
        }
        match self.models.skipped.get(name) {
            Some(reason) => Err(LlmError::NotLoaded {
                model: name.to_string(),
                reason: reason.clone(),
            }),
            None => Err(LlmError::UnknownModel(name.to_string())),
        }
    }

    /// One embeddings request to `model` (SPEC §13), with the same retries as a chat call when
    /// `retry` (indexing), or a single attempt (a query, which falls back to full text
    /// rather than keep a message waiting); never a fallback model: another model's vectors
    /// would not be comparable with the stored ones.
    pub async fn embed(
        &self,
        model: &str,
        texts: &[String],
        retry: bool,
        on_event: &(dyn Fn(LlmEvent) + Send + Sync),
    ) -> Result<EmbedOutcome, LlmError> {
        let (spec, provider) = self.resolve(model)?;
        let embeddings = if retry {
            self.with_retries(spec, || provider.embed(texts), on_event)
                .await?
        } else {
            provider.embed(texts).await?
        };
        Ok(EmbedOutcome {
            embeddings,
            model: spec.clone(),
        })
    }

    /// A defined model's spec, for calls that need no chat client (audio).
    fn spec_of(&self, name: &str) -> Result<&Arc<ModelSpec>, LlmError> {
        if let Some(spec) = self.models.get(name) {
            return Ok(spec);
        }
        match self.models.skipped.get(name) {
            Some(reason) => Err(LlmError::NotLoaded {
                model: name.to_string(),
                reason: reason.clone(),
            }),
            None => Err(LlmError::UnknownModel(name.to_string())),
        }
    }

    /// Transcribe `audio` with `model` (SPEC §19), retried like a chat call (SPEC §6: 429,
    /// 5xx, 529 and connection errors with backoff; other 4xx never), no fallback.
    pub async fn transcribe(
        &self,
        model: &str,
        audio: &super::audio::AudioFile,
    ) -> Result<(super::audio::Transcript, Arc<ModelSpec>), LlmError> {
        let spec = self.spec_of(model)?;
        let call = || super::audio::transcribe(&self.http, spec, self.limits, audio);
        let t = self.with_retries(spec, call, &|_| {}).await?;
        Ok((t, spec.clone()))
    }

    /// Synthesise `text` in `voice` with `model` as OGG/Opus of at most `max_bytes`, retried
    /// like [`Self::transcribe`].
    pub async fn speak(
        &self,
        model: &str,
        text: &str,
        voice: &str,
        max_bytes: usize,
    ) -> Result<(super::audio::Speech, Arc<ModelSpec>), LlmError> {
        let spec = self.spec_of(model)?;
        let call = || super::audio::speak(&self.http, spec, self.limits, text, voice, max_bytes);
        let s = self.with_retries(spec, call, &|_| {}).await?;
        Ok((s, spec.clone()))
    }

    async fn with_retries<T, F, Fut>(
        &self,
        spec: &ModelSpec,
        call: F,
        on_event: &(dyn Fn(LlmEvent) + Send + Sync),
    ) -> Result<T, LlmError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, LlmError>>,
    {
        let mut backoff = Backoff::exponential(self.base_delay, MAX_RETRY_WAIT);
        loop {
            match call().await {
                Ok(response) => return Ok(response),
                Err(e) if e.is_retryable() && backoff.failures() < self.retries => {
                    let delay = backoff.next_delay_after(e.retry_after());
                    let attempt = backoff.failures();
                    tracing::warn!(model = %spec.name, attempt, delay_ms = delay.as_millis() as u64, error = %e, "retrying LLM call");
                    on_event(LlmEvent::RetryWait {
                        model: spec.name.clone(),
                        attempt,
                        delay,
                        error: e.to_string(),
                    });
                    tokio::time::sleep(delay).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    use axum::Router;
    use axum::body::Body;
    use axum::extract::{Path, State};
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::Response;
    use axum::routing::post;
    use secrecy::SecretString;

    use crate::config::ProviderKind;
    use crate::llm::StopReason;
    use crate::llm::testutil::{behavior, model_spec, sample_request};
    use crate::message::Usage;

    const ANTHROPIC_OK: &str = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-e2e\",\"usage\":{\"input_tokens\":10,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":20,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi there\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":5}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );

    const OPENAI_OK: &str = concat!(
        "data: {\"model\":\"gpt-e2e\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"from fallback\"},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"model\":\"gpt-e2e\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n",
        "data: [DONE]\n\n",
    );

    #[derive(Default)]
    struct Seen {
        counts: BTreeMap<String, u32>,
        /// (scenario, header name, value) of interesting headers.
        headers: Vec<(String, String, String)>,
        bodies: Vec<serde_json::Value>,
    }

    type Shared = Arc<Mutex<Seen>>;

    fn record(seen: &Shared, scenario: &str, headers: &HeaderMap, body: &[u8]) -> u32 {
        let mut s = seen.lock().unwrap();
        for name in ["x-api-key", "anthropic-version", "authorization"] {
            if let Some(v) = headers.get(name) {
                s.headers.push((
                    scenario.to_string(),
                    name.to_string(),
                    v.to_str().unwrap_or("").to_string(),
                ));
            }
        }
        if let Ok(v) = serde_json::from_slice(body) {
            s.bodies.push(v);
        }
        let n = s.counts.entry(scenario.to_string()).or_default();
        *n += 1;
        *n
    }

    fn sse(body: &'static str) -> Response {
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from(body))
            .unwrap()
    }

    fn error(status: u16, retry_after: Option<&str>, kind: &str, message: &str) -> Response {
        let mut b = Response::builder().status(StatusCode::from_u16(status).unwrap());
        if let Some(ra) = retry_after {
            b = b.header("retry-after", ra);
        }
        b.header("content-type", "application/json")
            .body(Body::from(
                serde_json::json!({ "type": "error", "error": { "type": kind, "message": message } })
                    .to_string(),
            ))
            .unwrap()
    }

    async fn anthropic(
        State(seen): State<Shared>,
        Path(scenario): Path<String>,
        headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> Response {
        let n = record(&seen, &scenario, &headers, &body);
        match (scenario.as_str(), n) {
            ("flaky", 1) => error(529, Some("0"), "overloaded_error", "Overloaded"),
            ("flaky", _) => sse(ANTHROPIC_OK),
            ("bad", _) => error(400, None, "invalid_request_error", "max_tokens: too large"),
            ("down", _) => error(503, Some("0"), "api_error", "down for maintenance"),
            ("stall", _) => {
                let first = futures::stream::iter(vec![Ok::<_, std::io::Error>(
                    bytes::Bytes::from_static(
                        b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"partial\"}}\n\n",
                    ),
                )]);
                let body = futures::StreamExt::chain(first, futures::stream::pending());
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from_stream(body))
                    .unwrap()
            }
            // Keep-alives and nothing else, for ever; "pings_after" first streams a little
            // text. Only the call deadline ends these.
            ("pings" | "pings_after", _) => {
                let mut head = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n".to_string();
                if scenario == "pings_after" {
                    head.push_str("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"partial\"}}\n\n");
                }
                let pings = futures::stream::unfold((), |()| async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Some((
                        Ok::<_, std::io::Error>(bytes::Bytes::from_static(
                            b"event: ping\ndata: {\"type\":\"ping\"}\n\n",
                        )),
                        (),
                    ))
                });
                let first = futures::stream::once(async move {
                    Ok::<_, std::io::Error>(bytes::Bytes::from(head))
                });
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from_stream(futures::StreamExt::chain(first, pings)))
                    .unwrap()
            }
            // A complete answer whose text is 4 KiB.
            ("big", _) => {
                let delta = serde_json::json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": "x".repeat(4096)}});
                let body = format!(
                    "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"usage\":{{\"input_tokens\":3,\"output_tokens\":1}}}}}}\n\n\
                     event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n\
                     event: content_block_delta\ndata: {delta}\n\n\
                     event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
                );
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from(body))
                    .unwrap()
            }
            _ => error(404, None, "not_found_error", "no such scenario"),
        }
    }

    async fn openai(
        State(seen): State<Shared>,
        Path(scenario): Path<String>,
        headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> Response {
        record(&seen, &scenario, &headers, &body);
        sse(OPENAI_OK)
    }

    async fn server() -> (String, Shared) {
        let seen: Shared = Arc::default();
        let app = Router::new()
            .route("/{scenario}/v1/messages", post(anthropic))
            .route("/{scenario}/chat/completions", post(openai))
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{addr}"), seen)
    }

    fn anthropic_model(name: &str, base: &str, scenario: &str) -> ModelSpec {
        let mut s = model_spec(name, ProviderKind::Anthropic, &format!("{base}/{scenario}"));
        s.api_key = Some(SecretString::from(format!("sk-{name}")));
        s.api_key_env = Some("TEST_KEY".into());
        s.cache = true;
        s
    }

    fn llm(specs: Vec<ModelSpec>, skipped: &[(&str, &str)], retries: u32) -> Llm {
        let mut set = ModelSet::default();
        for s in specs {
            set.loaded.insert(s.name.clone(), Arc::new(s));
        }
        for (name, reason) in skipped {
            set.skipped.insert(name.to_string(), reason.to_string());
        }
        Llm::new(set, &behavior(retries, Duration::from_secs(5)))
    }

    fn collector() -> (Arc<Mutex<Vec<LlmEvent>>>, impl Fn(LlmEvent) + Send + Sync) {
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        (events, move |e| sink.lock().unwrap().push(e))
    }

    fn count(seen: &Shared, scenario: &str) -> u32 {
        seen.lock()
            .unwrap()
            .counts
            .get(scenario)
            .copied()
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn retries_529_then_succeeds() {
        let (base, seen) = server().await;
        let llm = llm(vec![anthropic_model("primary", &base, "flaky")], &[], 3);
        let (events, sink) = collector();
        let out = llm.chat("primary", &sample_request(), &sink).await.unwrap();

        assert_eq!(count(&seen, "flaky"), 2);
        assert_eq!(out.model.name, "primary");
        assert!(
            out.fell_back.is_none(),
            "a retry of the same model is no fallback"
        );
        assert_eq!(out.response.text, "hi there");
        assert_eq!(out.response.stop_reason, StopReason::EndTurn);
        assert_eq!(out.response.model, "claude-e2e");
        assert_eq!(
            out.response.usage,
            Usage {
                input_tokens: 10,
                output_tokens: 5,
                cache_read_tokens: 20,
                cache_write_tokens: 0,
                cache_write_1h_tokens: 0,
            }
        );
        let events = events.lock().unwrap().clone();
        assert_eq!(events.len(), 1, "{events:?}");
        match &events[0] {
            LlmEvent::RetryWait {
                model,
                attempt,
                delay,
                error,
            } => {
                assert_eq!(model, "primary");
                assert_eq!(*attempt, 1);
                assert_eq!(*delay, Duration::ZERO, "retry-after: 0 is honoured");
                assert!(
                    error.contains("529") && error.contains("Overloaded"),
                    "{error}"
                );
            }
            other => panic!("unexpected {other:?}"),
        }

        // Wire details: headers and the exact rendered body.
        let s = seen.lock().unwrap();
        assert!(
            s.headers
                .contains(&("flaky".into(), "x-api-key".into(), "sk-primary".into()))
        );
        assert!(s.headers.contains(&(
            "flaky".into(),
            "anthropic-version".into(),
            "2023-06-01".into()
        )));
        let spec = llm.models().get("primary").unwrap();
        assert_eq!(
            s.bodies[1],
            crate::llm::anthropic::render_request(spec, &sample_request())
        );
    }

    #[tokio::test]
    async fn bad_request_is_not_retried_nor_falls_back() {
        let (base, seen) = server().await;
        let mut primary = anthropic_model("primary", &base, "bad");
        primary.fallback = vec!["backup".into()];
        let backup = anthropic_model("backup", &base, "flaky");
        let llm = llm(vec![primary, backup], &[], 3);
        let (events, sink) = collector();
        let err = llm
            .chat("primary", &sample_request(), &sink)
            .await
            .unwrap_err();
        assert_eq!(count(&seen, "bad"), 1);
        assert_eq!(count(&seen, "flaky"), 0);
        assert!(events.lock().unwrap().is_empty());
        match err {
            LlmError::Http {
                status, message, ..
            } => {
                assert_eq!(status, 400);
                assert!(message.contains("max_tokens: too large"));
                assert!(!message.contains("sk-primary"));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    /// A structured-output request skips a fallback model without `structured_output`
    /// (SPEC §17): the next one that takes the format answers; other requests use it.
    #[tokio::test]
    async fn a_structured_request_skips_a_fallback_without_structured_output() {
        let (base, seen) = server().await;
        let mut primary = anthropic_model("primary", &base, "down");
        primary.fallback = vec!["plain".into(), "local".into()];
        let mut plain = model_spec("plain", ProviderKind::OpenAi, &format!("{base}/ok"));
        plain.structured_output = false;
        let local = model_spec("local", ProviderKind::OpenAi, &format!("{base}/ok"));
        let llm = llm(vec![primary, plain, local], &[], 0);
        let (_, sink) = collector();
        let mut req = sample_request();
        req.options.format = Some(Box::new(crate::message::call::OutputFormat::JsonObject));
        let out = llm.chat("primary", &req, &sink).await.unwrap();
        assert_eq!(out.model.name, "local");
        let out = llm.chat("primary", &sample_request(), &sink).await.unwrap();
        assert_eq!(out.model.name, "plain");
        assert_eq!(count(&seen, "ok"), 2);
    }

    #[tokio::test]
    async fn exhausted_retries_fall_back_to_next_loaded_model() {
        let (base, seen) = server().await;
        let mut primary = anthropic_model("primary", &base, "down");
        primary.fallback = vec![
            "primary".into(),
            "missing-key".into(),
            "ghost".into(),
            "local".into(),
        ];
        let mut local = model_spec("local", ProviderKind::OpenAi, &format!("{base}/ok"));
        local.api_key = Some(SecretString::from("sk-local"));
        let llm = llm(
            vec![primary, local],
            &[("missing-key", "environment variable X is not set")],
            2,
        );
        let (events, sink) = collector();
        let out = llm.chat("primary", &sample_request(), &sink).await.unwrap();

        assert_eq!(count(&seen, "down"), 3, "1 try + 2 retries");
        assert_eq!(count(&seen, "ok"), 1);
        assert_eq!(out.model.name, "local");
        assert_eq!(out.response.text, "from fallback");
        assert_eq!(out.response.model, "gpt-e2e");
        assert_eq!(out.response.usage.input_tokens, 5);
        assert_eq!(out.response.usage.cache_read_tokens, 4);
        // The answer says which model was asked for and why it did not answer (SPEC §18.3).
        let fell = out.fell_back.expect("answered by a fallback");
        assert_eq!((fell.from.as_str(), fell.to.as_str()), ("primary", "local"));
        assert!(fell.reason.contains("503"), "{}", fell.reason);

        let events = events.lock().unwrap().clone();
        let retries = events
            .iter()
            .filter(|e| matches!(e, LlmEvent::RetryWait { model, .. } if model == "primary"))
            .count();
        assert_eq!(retries, 2);
        match events.last().unwrap() {
            LlmEvent::Fallback { from, to, error } => {
                assert_eq!(from, "primary");
                assert_eq!(to, "local");
                assert!(error.contains("503"), "{error}");
            }
            other => panic!("unexpected {other:?}"),
        }
        let s = seen.lock().unwrap();
        assert!(s.headers.contains(&(
            "ok".into(),
            "authorization".into(),
            "Bearer sk-local".into()
        )));
    }

    #[tokio::test]
    async fn stalled_stream_after_content_times_out_without_retry() {
        let (base, seen) = server().await;
        let mut set = ModelSet::default();
        let spec = anthropic_model("primary", &base, "stall");
        set.loaded.insert("primary".into(), Arc::new(spec));
        let llm = Llm::new(set, &behavior(3, Duration::from_millis(300)));
        let (_events, sink) = collector();
        let err = llm
            .chat("primary", &sample_request(), &sink)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                LlmError::Timeout {
                    after_content: true,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(count(&seen, "stall"), 1);
    }

    /// `behavior(retries, 5 s inactivity)` with a call deadline of 300 ms.
    fn llm_with_deadline(spec: ModelSpec, retries: u32) -> Llm {
        let mut set = ModelSet::default();
        set.loaded.insert(spec.name.clone(), Arc::new(spec));
        let mut b = behavior(retries, Duration::from_secs(5));
        b.call_deadline = Duration::from_millis(300);
        Llm::new(set, &b)
    }

    /// Issue #12 finding 8: keep-alives reset the inactivity timeout for ever; the deadline
    /// ends the call. Before any content it is retryable, so every retry is made.
    #[tokio::test]
    async fn call_deadline_ends_a_ping_only_stream_and_is_retried() {
        let (base, seen) = server().await;
        let llm = llm_with_deadline(anthropic_model("primary", &base, "pings"), 2);
        let (events, sink) = collector();
        let err = llm
            .chat("primary", &sample_request(), &sink)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                LlmError::Deadline {
                    after_content: false,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.is_retryable());
        assert!(err.to_string().contains("call_deadline_seconds"), "{err}");
        assert_eq!(count(&seen, "pings"), 3);
        assert_eq!(events.lock().unwrap().len(), 2);
    }

    /// After content the deadline is a failure that is not retried.
    #[tokio::test]
    async fn call_deadline_after_content_is_not_retried() {
        let (base, seen) = server().await;
        let llm = llm_with_deadline(anthropic_model("primary", &base, "pings_after"), 2);
        let (_events, sink) = collector();
        let err = llm
            .chat("primary", &sample_request(), &sink)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                LlmError::Deadline {
                    after_content: true,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(count(&seen, "pings_after"), 1);
    }

    /// Issue #12 finding 15: a reply beyond `max_reply_bytes` is a malformed answer, not
    /// retried.
    #[tokio::test]
    async fn reply_beyond_the_size_cap_is_refused() {
        let (base, seen) = server().await;
        let mut set = ModelSet::default();
        let spec = anthropic_model("primary", &base, "big");
        set.loaded.insert("primary".into(), Arc::new(spec));
        let mut b = behavior(2, Duration::from_secs(5));
        b.max_reply_bytes = 4000;
        let (_events, sink) = collector();
        let err = Llm::new(set.clone(), &b)
            .chat("primary", &sample_request(), &sink)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, LlmError::Decode { message, .. } if message.contains("max_reply_bytes")),
            "{err:?}"
        );
        assert_eq!(count(&seen, "big"), 1);
        // At a cap above it the same answer is accepted.
        b.max_reply_bytes = 5000;
        let out = Llm::new(set, &b)
            .chat("primary", &sample_request(), &sink)
            .await
            .unwrap();
        assert_eq!(out.response.text.len(), 4096);
    }

    #[tokio::test]
    async fn unknown_and_unloaded_models() {
        let llm = llm(
            vec![],
            &[("primary", "environment variable K is not set")],
            0,
        );
        let (_e, sink) = collector();
        match llm.chat("primary", &sample_request(), &sink).await {
            Err(LlmError::NotLoaded { model, reason }) => {
                assert_eq!(model, "primary");
                assert!(reason.contains("K is not set"));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            llm.chat("nope", &sample_request(), &sink).await,
            Err(LlmError::UnknownModel(name)) if name == "nope"
        ));
    }

    #[tokio::test]
    async fn connection_refused_is_a_connect_error_without_url() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let spec = anthropic_model("primary", &format!("http://{addr}"), "secret-path");
        let llm = llm(vec![spec], &[], 0);
        let (_e, sink) = collector();
        let err = llm
            .chat("primary", &sample_request(), &sink)
            .await
            .unwrap_err();
        assert!(matches!(err, LlmError::Connect { .. }), "{err:?}");
        assert!(err.is_retryable());
        assert!(!err.to_string().contains("secret-path"), "{err}");
    }

    #[test]
    fn retry_classification() {
        let http = |status| LlmError::Http {
            provider: "p".into(),
            status,
            message: String::new(),
            retry_after: None,
        };
        for s in [408, 409, 429, 500, 502, 503, 529] {
            assert!(http(s).is_retryable(), "{s}");
        }
        for s in [400, 401, 403, 404, 422] {
            assert!(!http(s).is_retryable(), "{s}");
        }
        assert!(!http(400).allows_fallback());
        assert!(http(401).allows_fallback());
    }

    #[test]
    fn chat_future_is_send() {
        fn assert_send<T: Send>(_: &T) {}
        let llm = llm(vec![], &[], 0);
        let req = sample_request();
        let sink = |_: LlmEvent| {};
        let fut = llm.chat("x", &req, &sink);
        assert_send(&fut);
    }
}
