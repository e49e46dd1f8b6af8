//! Bearer auth for the protected endpoints (everything but `GET /api/v1/status`).
//!
//! Attached with `route_layer`, so unknown paths stay 404 instead of 401. The token is compared
//! in constant time; no configured token means 503 (the operator must set one), never "open".

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use secrecy::ExposeSecret;
use subtle::ConstantTimeEq;

use super::reply::Reply;
use super::server::ApiState;

/// Lets the request through only with `Authorization: Bearer <the configured token>`.
pub(crate) async fn require_bearer(
    State(state): State<Arc<ApiState>>,
    req: Request,
    next: Next,
) -> Response {
    check(&state, req, next, false).await
}

/// [`require_bearer`], or the token as `x-api-key` (how Anthropic clients send it; SPEC §17,
/// `POST /v1/messages`), compared the same way.
pub(crate) async fn require_bearer_or_api_key(
    State(state): State<Arc<ApiState>>,
    req: Request,
    next: Next,
) -> Response {
    check(&state, req, next, true).await
}

async fn check(state: &ApiState, req: Request, next: Next, api_key: bool) -> Response {
    let expected = state
        .config()
        .token
        .as_ref()
        .map(|t| t.expose_secret())
        .filter(|t| !t.is_empty());
    let Some(expected) = expected else {
        return Reply::error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "HTTP API token not configured: set {}",
                state.config().token_env
            ),
        )
        .into_response();
    };
    if bearer_matches(req.headers(), expected)
        || (api_key && api_key_matches(req.headers(), expected))
    {
        next.run(req).await
    } else {
        state.backend().auth_failed();
        Reply::error(
            StatusCode::UNAUTHORIZED,
            if api_key {
                "missing or wrong API token: send Authorization: Bearer <token> or x-api-key: <token>"
            } else {
                "missing or wrong bearer token: send Authorization: Bearer <token>"
            },
        )
        .with_header(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))
        .into_response()
    }
}

/// True when the first `Authorization` header is `Bearer <expected>` (scheme case-insensitive,
/// token compared in constant time).
pub(crate) fn bearer_matches(headers: &HeaderMap, expected: &str) -> bool {
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .is_some_and(|given| bool::from(given.as_bytes().ct_eq(expected.as_bytes())))
}

/// True when the first `x-api-key` header is `expected` (compared in constant time).
pub(crate) fn api_key_matches(headers: &HeaderMap, expected: &str) -> bool {
    headers
        .get(crate::llm::anthropic::server::API_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .is_some_and(|given| bool::from(given.as_bytes().ct_eq(expected.as_bytes())))
}

/// The credentials of a `Bearer` authorization value.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn api_key_header_is_compared_like_the_bearer() {
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("s3cret"));
        assert!(api_key_matches(&h, "s3cret"));
        assert!(!api_key_matches(&h, "s3cre"));
        assert!(!api_key_matches(&HeaderMap::new(), "s3cret"));
        h.insert("x-api-key", HeaderValue::from_static(""));
        assert!(!api_key_matches(&h, ""));
    }

    #[test]
    fn accepts_only_the_exact_token() {
        assert!(bearer_matches(&headers("Bearer s3cret"), "s3cret"));
        assert!(bearer_matches(&headers("bearer s3cret"), "s3cret"));
        assert!(!bearer_matches(&headers("Bearer s3cre"), "s3cret"));
        assert!(!bearer_matches(&headers("Bearer s3cret2"), "s3cret"));
        assert!(!bearer_matches(&headers("Basic s3cret"), "s3cret"));
        assert!(!bearer_matches(&headers("s3cret"), "s3cret"));
        assert!(!bearer_matches(&headers("Bearer "), ""));
        assert!(!bearer_matches(&HeaderMap::new(), "s3cret"));
    }

    proptest! {
        #[test]
        fn a_token_matches_iff_it_is_equal(given in "[!-~]{1,40}", expected in "[!-~]{1,40}") {
            let h = headers(&format!("Bearer {given}"));
            prop_assert_eq!(bearer_matches(&h, &expected), given == expected);
        }

        #[test]
        fn arbitrary_header_values_never_panic(value in "[ -~]{0,80}") {
            let _ = bearer_matches(&headers(&value), "token");
        }
    }
}
