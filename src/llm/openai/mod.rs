//! OpenAI-compatible chat-completions client (`POST {base_url}/chat/completions`, streamed):
//! OpenAI, OpenRouter, Ollama, vLLM, llama.cpp, LM Studio and others. `render` builds the wire
//! JSON, `stream` parses the SSE answer.

mod embeddings;
mod render;
mod stream;

pub use render::render_body;
#[cfg(test)]
pub use render::render_request;

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
            .body(body);
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
        let mut parser = stream::StreamParser::new(&self.label, &self.spec.model);
        http::stream_call(request, &ctx, &mut parser).await?;
        Ok(parser.finish())
    }

    /// `POST {base_url}/embeddings` for `texts`; the whole answer must arrive within the
    /// inactivity timeout.
    async fn embed_call(&self, texts: &[String]) -> Result<Embeddings, LlmError> {
        let (request, ctx) = self.post(
            "embeddings",
            serde_json::to_vec(&embeddings::render(&self.spec.model, texts)),
            "application/json",
        )?;
        let timeout = || LlmError::Timeout {
            provider: self.label.clone(),
            seconds: self.limits.inactivity.as_secs(),
            after_content: false,
        };
        let response = tokio::time::timeout(self.limits.inactivity, request.send())
            .await
            .map_err(|_| timeout())?
            .map_err(|e| LlmError::Connect {
                provider: self.label.clone(),
                message: http::describe_reqwest_error(e),
            })?;
        if !response.status().is_success() {
            return Err(http::error_response(response, &ctx).await);
        }
        let bytes = tokio::time::timeout(self.limits.inactivity, response.bytes())
            .await
            .map_err(|_| timeout())?
            .map_err(|e| LlmError::Connect {
                provider: self.label.clone(),
                message: http::describe_reqwest_error(e),
            })?;
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
