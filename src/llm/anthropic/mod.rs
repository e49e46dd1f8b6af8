//! Anthropic Messages API client (`POST {base_url}/v1/messages`, streamed). `render` turns the
//! neutral request into wire JSON (with cache breakpoints), `stream` parses the SSE answer.

mod render;
pub mod server;
mod stream;

pub use render::render_body;
#[cfg(test)]
pub use render::render_request;

use std::sync::Arc;

use futures::future::BoxFuture;
use reqwest::header::{ACCEPT, CONTENT_TYPE};

use super::http::{self, CallCtx};
use super::{CallLimits, ChatRequest, ChatResponse, LlmError, Provider};
use crate::config::ModelSpec;

/// The API version header value this client speaks.
pub const API_VERSION: &str = "2023-06-01";

/// A client bound to one Anthropic model definition.
pub struct AnthropicClient {
    spec: Arc<ModelSpec>,
    http: reqwest::Client,
    limits: CallLimits,
    label: String,
}

impl AnthropicClient {
    /// `limits` bound every call: inactivity, total deadline, reply size.
    pub fn new(spec: Arc<ModelSpec>, http: reqwest::Client, limits: CallLimits) -> Self {
        let label = http::label(&spec);
        AnthropicClient {
            spec,
            http,
            limits,
            label,
        }
    }

    async fn call(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let body = render_body(&self.spec, req).map_err(|e| LlmError::Decode {
            provider: self.label.clone(),
            message: format!("could not serialise the request: {e}"),
        })?;
        let mut request = self
            .http
            .post(format!("{}/v1/messages", self.spec.base_url))
            .header("anthropic-version", API_VERSION)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "text/event-stream")
            .body(crate::llm::body_pool::into_body(body));
        if let Some(key) = &self.spec.api_key {
            request = request.header("x-api-key", http::secret_header(&self.spec, "", key)?);
        }
        let ctx = CallCtx {
            label: &self.label,
            limits: self.limits,
            secret: self.spec.api_key.as_ref(),
            parse_error: stream::parse_error_body,
        };
        let mut parser = stream::StreamParser::new(&self.label, &self.spec.model)
            .with_deltas(req.deltas.clone());
        http::stream_call(request, &ctx, &mut parser).await?;
        Ok(parser.finish())
    }
}

impl Provider for AnthropicClient {
    fn chat<'a>(&'a self, req: &'a ChatRequest) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(self.call(req))
    }
}
