//! JSON answers. Handlers and route layers return a [`Reply`]; its body travels as a response
//! extension until [`finish`], the outermost layer, adds `"agent"` and serialises it. `finish`
//! also gives every answer the `X-Agentd-Agent` header and turns error answers that did not come
//! from us (413 from the body limit, 405 from the router, 500 from a caught panic) into JSON.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::backend::BackendError;
use super::server::ApiState;

/// The header naming the agent on every answer.
pub(crate) const AGENT_HEADER: HeaderName = HeaderName::from_static("x-agentd-agent");

/// A JSON body waiting for its `agent` field (a response extension, consumed by [`finish`]).
#[derive(Debug, Clone)]
struct PendingJson(Value);

/// Marks a response whose body is final (the compatible endpoints speak the OpenAI and
/// Anthropic shapes, which have no `agent` field): [`finish`] only adds the header.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawBody;

/// A JSON answer: status, body (without `agent`) and extra headers.
#[derive(Debug)]
pub(crate) struct Reply {
    status: StatusCode,
    body: Value,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Reply {
    /// An answer with `status` and `body`.
    pub(crate) fn new(status: StatusCode, body: Value) -> Reply {
        Reply {
            status,
            body,
            headers: Vec::new(),
        }
    }

    /// 200 with `body`.
    pub(crate) fn ok(body: Value) -> Reply {
        Reply::new(StatusCode::OK, body)
    }

    /// `{"error": message}` with `status`.
    pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Reply {
        Reply::new(status, json!({ "error": message.into() }))
    }

    /// Adds a header to the answer.
    pub(crate) fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Reply {
        self.headers.push((name, value));
        self
    }

    #[cfg(test)]
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let mut response = self.status.into_response();
        for (name, value) in self.headers {
            response.headers_mut().append(name, value);
        }
        response.extensions_mut().insert(PendingJson(self.body));
        response
    }
}

impl From<BackendError> for Reply {
    fn from(e: BackendError) -> Reply {
        let status = match &e {
            BackendError::BadRequest(_) | BackendError::BadField { .. } => StatusCode::BAD_REQUEST,
            BackendError::NotFound(_) => StatusCode::NOT_FOUND,
            BackendError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            BackendError::Busy(_) => StatusCode::TOO_MANY_REQUESTS,
            BackendError::Conflict(_) => StatusCode::CONFLICT,
            BackendError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), error = %e, "HTTP API backend error");
        }
        Reply::error(status, e.to_string())
    }
}

/// The error text for a body over `max_body_bytes`.
pub(crate) fn too_large_message(limit: usize) -> String {
    format!("request body is larger than [http] max_body_bytes ({limit} bytes)")
}

/// The outermost layer: adds `agent` to JSON bodies and `X-Agentd-Agent` to every answer.
pub(crate) async fn finish(
    State(state): State<Arc<ApiState>>,
    req: Request,
    next: Next,
) -> Response {
    let compat = super::compat::api_of(req.uri().path());
    let mut response = next.run(req).await;
    if response.extensions_mut().remove::<RawBody>().is_some() {
        response
            .headers_mut()
            .insert(AGENT_HEADER, state.agent_header().clone());
        return response;
    }
    if let Some(api) = compat {
        // Auth, rate limits, the body limit, unknown paths: in the API's own envelope.
        let status = response.status();
        if status.is_client_error() || status.is_server_error() {
            let message = match response.extensions_mut().remove::<PendingJson>() {
                Some(PendingJson(body)) => body["error"]
                    .as_str()
                    .map_or_else(|| body.to_string(), str::to_string),
                None => foreign_error_message(status, state.max_body_bytes()),
            };
            let kind = crate::llm::compat::ErrorKind::of_status(status.as_u16());
            let mut answer = super::compat::error_response(api, kind, &message, None);
            *answer.status_mut() = status;
            for (name, value) in response.headers() {
                if name != CONTENT_LENGTH && name != CONTENT_TYPE {
                    answer.headers_mut().append(name, value.clone());
                }
            }
            answer.extensions_mut().remove::<RawBody>();
            answer
                .headers_mut()
                .insert(AGENT_HEADER, state.agent_header().clone());
            return answer;
        }
    }
    let body = match response.extensions_mut().remove::<PendingJson>() {
        Some(PendingJson(body)) => Some(body),
        None if response.status().is_client_error() || response.status().is_server_error() => Some(
            json!({ "error": foreign_error_message(response.status(), state.max_body_bytes()) }),
        ),
        None => None,
    };
    if let Some(body) = body {
        let bytes = with_agent(body, state.agent_name());
        let headers = response.headers_mut();
        headers.remove(CONTENT_LENGTH);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        *response.body_mut() = Body::from(bytes);
    }
    response
        .headers_mut()
        .insert(AGENT_HEADER, state.agent_header().clone());
    response
}

/// `body` with `"agent": agent` set, serialised. A body that is not an object is wrapped as
/// `{"data": body}` (the contract only has objects; this keeps `agent` on the answer anyway).
fn with_agent(body: Value, agent: &str) -> Vec<u8> {
    let mut object = match body {
        Value::Object(map) => map,
        other => {
            tracing::warn!("HTTP API answer is not a JSON object; wrapped in {{\"data\": …}}");
            let mut map = Map::new();
            map.insert("data".into(), other);
            map
        }
    };
    object.insert("agent".into(), Value::String(agent.to_owned()));
    serde_json::to_vec(&Value::Object(object))
        .unwrap_or_else(|_| br#"{"error":"could not serialise the answer"}"#.to_vec())
}

/// The message for an error answer produced outside our handlers.
fn foreign_error_message(status: StatusCode, max_body_bytes: usize) -> String {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => too_large_message(max_body_bytes),
        StatusCode::METHOD_NOT_ALLOWED => "method not allowed on this endpoint".into(),
        StatusCode::NOT_FOUND => "no such endpoint".into(),
        StatusCode::INTERNAL_SERVER_ERROR => "internal error (logged)".into(),
        other => other
            .canonical_reason()
            .map(|r| r.to_ascii_lowercase())
            .unwrap_or_else(|| format!("HTTP {}", other.as_u16())),
    }
}

/// The header value for `agent`: visible ASCII kept, anything else replaced by `?`.
pub(crate) fn agent_header_value(agent: &str) -> HeaderValue {
    let visible: String = agent
        .chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .collect();
    HeaderValue::from_str(visible.trim()).unwrap_or_else(|_| HeaderValue::from_static("agentd"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_is_merged_into_objects_and_overrides_a_backend_value() {
        let bytes = with_agent(json!({"a": 1, "agent": "spoof"}), "kira");
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v, json!({"a": 1, "agent": "kira"}));
    }

    #[test]
    fn non_objects_are_wrapped() {
        let bytes = with_agent(json!([1, 2]), "kira");
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v, json!({"data": [1, 2], "agent": "kira"}));
    }

    #[test]
    fn agent_header_keeps_ascii_and_replaces_the_rest() {
        assert_eq!(agent_header_value("kira"), "kira");
        assert_eq!(agent_header_value("Kira Ö\n"), "Kira ??");
    }

    #[test]
    fn backend_errors_map_to_statuses() {
        let cases = [
            (BackendError::BadRequest("x".into()), 400),
            (BackendError::NotFound("x".into()), 404),
            (BackendError::Unavailable("x".into()), 503),
            (BackendError::Busy("x".into()), 429),
            (BackendError::Conflict("x".into()), 409),
            (BackendError::Internal("x".into()), 500),
        ];
        for (e, code) in cases {
            assert_eq!(Reply::from(e).status().as_u16(), code);
        }
    }

    #[test]
    fn foreign_413_names_the_limit() {
        let m = foreign_error_message(StatusCode::PAYLOAD_TOO_LARGE, 123);
        assert!(m.contains("max_body_bytes") && m.contains("123"), "{m}");
    }
}
