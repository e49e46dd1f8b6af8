//! The HTTP edge shared by both clients: send with an inactivity timeout and a total deadline,
//! turn non-2xx answers into `LlmError::Http` (provider message, `Retry-After`), stream the
//! body through a parser (reply size capped).
//! No error built here contains a URL or the API key.

use std::time::{Duration, SystemTime};

use futures::TryStreamExt;
use reqwest::header::{HeaderMap, HeaderValue};
use secrecy::{ExposeSecret, SecretString};

use super::sse::{self, SseHandler};
use super::{CallLimits, LlmError};
use crate::config::ModelSpec;
use crate::net::scrub::{self, reqwest_error_text};

/// Most bytes of an error body we read.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// Most characters of a non-JSON error body quoted in an error.
const MAX_ERROR_TEXT: usize = 300;

/// One streamed call's fixed parts.
pub(crate) struct CallCtx<'a> {
    /// Name used in errors, e.g. "anthropic (claude-sonnet-4-5)".
    pub label: &'a str,
    pub limits: CallLimits,
    /// Redacted from any provider message that echoes it.
    pub secret: Option<&'a SecretString>,
    /// Extracts the provider's message from an error body.
    pub parse_error: fn(&str) -> Option<String>,
}

/// Label for errors: provider file and API model id.
pub(crate) fn label(spec: &ModelSpec) -> String {
    format!("{} ({})", spec.provider, spec.model)
}

/// A header value carrying the API key (`prefix` + key), marked sensitive so it never shows in
/// debug output. A key with characters HTTP forbids is a configuration error naming the fix.
pub(crate) fn secret_header(
    spec: &ModelSpec,
    prefix: &str,
    key: &SecretString,
) -> Result<HeaderValue, LlmError> {
    let mut value =
        HeaderValue::from_str(&format!("{prefix}{}", key.expose_secret())).map_err(|_| {
            LlmError::NotLoaded {
                model: spec.name.clone(),
                reason: format!(
                    "the API key in {} contains characters not allowed in an HTTP header \
                     (a stray newline or quote?); fix the value",
                    spec.api_key_env
                        .as_deref()
                        .unwrap_or("its api_key_env variable")
                ),
            }
        })?;
    value.set_sensitive(true);
    Ok(value)
}

/// Send `request` and stream the answer through `handler`, all within the call's deadline
/// (`LlmError::Deadline`, retryable only if no content had streamed).
pub(crate) async fn stream_call<H: SseHandler>(
    request: reqwest::RequestBuilder,
    ctx: &CallCtx<'_>,
    handler: &mut H,
) -> Result<(), LlmError> {
    let deadline = ctx.limits.deadline;
    let result = tokio::time::timeout(deadline, send_and_stream(request, ctx, handler)).await;
    result.unwrap_or_else(|_| {
        Err(LlmError::Deadline {
            provider: ctx.label.to_string(),
            seconds: deadline.as_secs(),
            after_content: handler.saw_content(),
        })
    })
}

async fn send_and_stream<H: SseHandler>(
    request: reqwest::RequestBuilder,
    ctx: &CallCtx<'_>,
    handler: &mut H,
) -> Result<(), LlmError> {
    let inactivity = ctx.limits.inactivity;
    let response = tokio::time::timeout(inactivity, request.send())
        .await
        .map_err(|_| LlmError::Timeout {
            provider: ctx.label.to_string(),
            seconds: inactivity.as_secs(),
            after_content: false,
        })?
        .map_err(|e| LlmError::Connect {
            provider: ctx.label.to_string(),
            message: redact(reqwest_error_text(e), ctx.secret),
        })?;

    if !response.status().is_success() {
        return Err(error_response(response, ctx).await);
    }

    let bytes = response.bytes_stream().map_err(reqwest_error_text);
    sse::drive(bytes, handler, ctx.label, ctx.limits)
        .await
        .map_err(|e| redact_error(e, ctx.secret))
}

/// Send `request` (not streamed) and read its whole answer: the head and each chunk within
/// the inactivity timeout, at most `max` bytes (`too_large(max)` is the error's message);
/// an error status becomes the provider's error. The embeddings and audio endpoints.
pub(crate) async fn read_whole(
    request: reqwest::RequestBuilder,
    ctx: &CallCtx<'_>,
    max: usize,
    too_large: &(dyn Fn(usize) -> String + Sync),
) -> Result<Vec<u8>, LlmError> {
    let inactivity = ctx.limits.inactivity;
    let timeout = || LlmError::Timeout {
        provider: ctx.label.to_string(),
        seconds: inactivity.as_secs(),
        after_content: false,
    };
    let connect = |e| LlmError::Connect {
        provider: ctx.label.to_string(),
        message: reqwest_error_text(e),
    };
    let mut response = tokio::time::timeout(inactivity, request.send())
        .await
        .map_err(|_| timeout())?
        .map_err(connect)?;
    if !response.status().is_success() {
        return Err(error_response(response, ctx).await);
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = tokio::time::timeout(inactivity, response.chunk())
        .await
        .map_err(|_| timeout())?
        .map_err(connect)?
    {
        if bytes.len().saturating_add(chunk.len()) > max {
            return Err(LlmError::Decode {
                provider: ctx.label.to_string(),
                message: too_large(max),
            });
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// Build `LlmError::Http` from a non-2xx response.
pub(crate) async fn error_response(mut response: reqwest::Response, ctx: &CallCtx<'_>) -> LlmError {
    let status = response.status();
    let retry_after = retry_after(response.headers(), SystemTime::now());
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY {
        match tokio::time::timeout(ctx.limits.inactivity, response.chunk()).await {
            Ok(Ok(Some(chunk))) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    let body = String::from_utf8_lossy(&body);
    let message = (ctx.parse_error)(&body).unwrap_or_else(|| {
        let text = body.trim();
        if text.is_empty() {
            status
                .canonical_reason()
                .unwrap_or("no details")
                .to_string()
        } else {
            truncate_chars(text, MAX_ERROR_TEXT)
        }
    });
    LlmError::Http {
        provider: ctx.label.to_string(),
        status: status.as_u16(),
        message: redact(message, ctx.secret),
        retry_after,
    }
}

/// The wait a server asks for: `retry-after-ms` (milliseconds, OpenAI) wins over `retry-after`
/// (seconds or an HTTP date). `None` when absent or unreadable.
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(seconds(ms / 1000.0));
    }
    header("retry-after").and_then(|v| parse_retry_after(v, now))
}

/// Parse a `Retry-After` value: delay seconds (`"120"`, also `"1.5"`) or an HTTP date, relative
/// to `now` (a date in the past means no wait).
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| seconds(secs));
    }
    let date = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let at = SystemTime::from(date.with_timezone(&chrono::Utc));
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// `secs` (finite, not negative) as a `Duration`; a value too large for one (a server asking
/// for `1e30` seconds) is the longest duration, which the retry policy caps anyway.
/// `Duration::from_secs_f64` would panic there, killing the task that read the header.
fn seconds(secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
}

/// `text` without the call's API key (a server may echo it).
fn redact(text: String, secret: Option<&SecretString>) -> String {
    match secret {
        Some(key) => scrub::redact(&text, &[key.expose_secret()]),
        None => text,
    }
}

fn redact_error(e: LlmError, secret: Option<&SecretString>) -> LlmError {
    match e {
        LlmError::Stream {
            provider,
            message,
            after_content,
            retryable,
        } => LlmError::Stream {
            provider,
            message: redact(message, secret),
            after_content,
            retryable,
        },
        LlmError::Decode { provider, message } => LlmError::Decode {
            provider,
            message: redact(message, secret),
        },
        other => other,
    }
}

/// At most `max` characters of `text`, with an ellipsis when cut.
pub(crate) fn truncate_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_470); // 07:27:50 GMT
        assert_eq!(parse_retry_after("0", now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("1.5", now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
            Some(Duration::from_secs(10))
        );
        // A date in the past: no wait.
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("-3", now), None);
        // Too large for a Duration: the longest wait (capped by the retry policy), no panic.
        assert_eq!(
            parse_retry_after("20000000000000000000", now),
            Some(Duration::MAX)
        );
        assert_eq!(parse_retry_after("1e300", now), Some(Duration::MAX));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("", now), None);
    }

    #[test]
    fn retry_after_ms_header_wins() {
        let now = SystemTime::now();
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h, now), None);
        h.insert("retry-after", HeaderValue::from_static("7"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(7)));
        h.insert("retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(250)));
    }

    #[test]
    fn redaction_and_truncation() {
        let key = SecretString::from("sk-secret-123");
        assert_eq!(
            redact("bad key sk-secret-123 given".into(), Some(&key)),
            "bad key [redacted] given"
        );
        assert_eq!(redact("fine".into(), None), "fine");
        assert_eq!(truncate_chars("äöü", 2), "äö…");
        assert_eq!(truncate_chars("äöü", 3), "äöü");
    }
}

/// Property tests: `Retry-After` is a header a provider (or a proxy) writes.
#[cfg(test)]
mod prop_tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Any header value: a wait or none, never a panic, never a negative or non-finite wait.
        #[test]
        fn any_value_is_a_wait_or_none(
            value in prop_oneof![
                "\\PC{0,40}",
                // Numbers as servers write them, up to absurd ones.
                "-?[0-9]{0,25}(\\.[0-9]{0,6})?([eE][-+]?[0-9]{1,3})?",
                Just("inf".to_string()),
                Just("NaN".to_string()),
            ],
            now in 0u64..4_000_000_000,
        ) {
            let now = SystemTime::UNIX_EPOCH + Duration::from_secs(now);
            let _ = parse_retry_after(&value, now);
            let mut h = HeaderMap::new();
            if let Ok(v) = reqwest::header::HeaderValue::from_str(&value) {
                h.insert("retry-after-ms", v.clone());
                h.insert("retry-after", v);
                let _ = retry_after(&h, now);
            }
        }

        /// Round trips of both forms: delay seconds, and an HTTP date that many seconds ahead.
        #[test]
        fn seconds_and_dates_round_trip(secs in 0u64..1_000_000, now in 1_000_000_000u64..3_000_000_000) {
            let at = SystemTime::UNIX_EPOCH + Duration::from_secs(now);
            prop_assert_eq!(parse_retry_after(&format!(" {secs} "), at), Some(Duration::from_secs(secs)));
            let date = chrono::DateTime::from_timestamp((now + secs) as i64, 0).unwrap().to_rfc2822();
            prop_assert_eq!(parse_retry_after(&date, at), Some(Duration::from_secs(secs)), "{}", date);
        }
    }
}
