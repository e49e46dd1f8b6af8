//! OpenAI-compatible chat-completions client (`POST {base_url}/chat/completions`, streamed):
//! OpenAI, OpenRouter, Ollama, vLLM, llama.cpp, LM Studio and others. `render` builds the wire
//! JSON, `stream` parses the SSE answer.

mod chat_tools;
mod embeddings;
mod render;
pub mod responses;
pub mod server;
mod stream;

pub use render::render_body;
#[cfg(test)]
pub use render::render_request;
pub(crate) use stream::parse_error_body;

use std::sync::Arc;

use futures::future::BoxFuture;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};

use super::http::{self, CallCtx};
use super::{CallLimits, ChatRequest, ChatResponse, Embeddings, LlmError, Provider};
use crate::config::ModelSpec;

/// A client bound to one OpenAI-compatible model definition.
pub struct OpenAiClient {
    spec: Arc<ModelSpec>,
    http: reqwest::Client,
    limits: CallLimits,
    label: String,
}

impl OpenAiClient {
    /// `limits` bound every call: inactivity, total deadline, reply size.
    pub fn new(spec: Arc<ModelSpec>, http: reqwest::Client, limits: CallLimits) -> Self {
        let label = http::label(&spec);
        OpenAiClient {
            spec,
            http,
            limits,
            label,
        }
    }

    /// `POST {base_url}/{path}` with the JSON `body`, the key as a bearer token, and the call
    /// context for errors.
    fn post(
        &self,
        path: &str,
        body: serde_json::Result<Vec<u8>>,
        accept: &'static str,
    ) -> Result<(reqwest::RequestBuilder, CallCtx<'_>), LlmError> {
        let body = body.map_err(|e| LlmError::Decode {
            provider: self.label.clone(),
            message: format!("could not serialise the request: {e}"),
        })?;
        let mut request = self
            .http
            .post(format!("{}/{path}", self.spec.base_url))
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, accept)
            .body(crate::llm::body_pool::into_body(body));
        if let Some(key) = &self.spec.api_key {
            request = request.header(
                AUTHORIZATION,
                http::secret_header(&self.spec, "Bearer ", key)?,
            );
        }
        let ctx = CallCtx {
            label: &self.label,
            limits: self.limits,
            secret: self.spec.api_key.as_ref(),
            parse_error: stream::parse_error_body,
        };
        Ok((request, ctx))
    }

    async fn call(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let (request, ctx) = self.post(
            "chat/completions",
            render_body(&self.spec, req),
            "text/event-stream",
        )?;
        let in_text = self.spec.tool_calls_in_text && !req.tools.is_empty();
        let mut parser = stream::StreamParser::new(&self.label, &self.spec.model)
            .with_deltas(req.deltas.clone())
            .holding_back(in_text);
        http::stream_call(request, &ctx, &mut parser).await?;
        Ok(if in_text {
            parser.finish_text_calls(&req.tools)
        } else {
            parser.finish()
        })
    }

    /// `POST {base_url}/embeddings` for `texts`, within the call deadline: the head and each
    /// chunk of the answer within the inactivity timeout, the answer at most
    /// `RAW_STREAM_FACTOR × max_reply_bytes` long (vectors are long JSON, but not unbounded).
    async fn embed_call(&self, texts: &[String]) -> Result<Embeddings, LlmError> {
        let deadline = self.limits.deadline;
        tokio::time::timeout(deadline, self.embed_request(texts))
            .await
            .unwrap_or_else(|_| {
                Err(LlmError::Deadline {
                    provider: self.label.clone(),
                    seconds: deadline.as_secs(),
                    after_content: false,
                })
            })
    }

    async fn embed_request(&self, texts: &[String]) -> Result<Embeddings, LlmError> {
        let (request, ctx) = self.post(
            "embeddings",
            serde_json::to_vec(&embeddings::render(&self.spec.model, texts)),
            "application/json",
        )?;
        let max = self.limits.max_reply_bytes;
        let cap = max.saturating_mul(super::sse::RAW_STREAM_FACTOR);
        let too_large = |cap| {
            format!(
                "the embeddings answer is larger than {cap} bytes; raise [behavior] \
                 max_reply_bytes ({max}) if such answers are expected"
            )
        };
        let bytes = http::read_whole(request, &ctx, cap, &too_large).await?;
        embeddings::parse(&bytes, texts.len(), &self.label)
    }
}

impl Provider for OpenAiClient {
    fn chat<'a>(&'a self, req: &'a ChatRequest) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(self.call(req))
    }

    fn embed<'a>(&'a self, texts: &'a [String]) -> BoxFuture<'a, Result<Embeddings, LlmError>> {
        Box::pin(self.embed_call(texts))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::Router;
    use axum::routing::post;

    use super::*;
    use crate::config::ProviderKind;
    use crate::llm::testutil::model_spec;

    /// Serves `body` (with status 200) for every embeddings request.
    async fn server(body: String) -> String {
        let app = Router::new().route("/embeddings", post(move || async move { body.clone() }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}")
    }

    fn client(base: &str, max_reply_bytes: usize) -> OpenAiClient {
        let spec = model_spec("embed", ProviderKind::OpenAi, base);
        OpenAiClient::new(
            Arc::new(spec),
            reqwest::Client::new(),
            CallLimits {
                inactivity: Duration::from_secs(5),
                deadline: Duration::from_secs(30),
                max_reply_bytes,
            },
        )
    }

    /// An embeddings answer is read up to the raw cap (64 × `max_reply_bytes`), not whole.
    #[tokio::test]
    async fn embeddings_answer_beyond_the_cap_is_refused() {
        let answer = r#"{"data":[{"embedding":[0.5]}]}"#;
        let base = server(format!("{answer}{}", " ".repeat(200 * 1024))).await;
        let err = client(&base, 1024)
            .embed_call(&["x".to_string()])
            .await
            .unwrap_err();
        assert!(
            matches!(&err, LlmError::Decode { message, .. } if message.contains("max_reply_bytes")),
            "{err:?}"
        );
        // Under the cap the same answer is read.
        let e = client(&base, 4096)
            .embed_call(&["x".to_string()])
            .await
            .unwrap();
        assert_eq!(e.vectors, vec![vec![0.5]]);
    }
}
