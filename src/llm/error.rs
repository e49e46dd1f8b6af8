//! Errors of the LLM layer and the retry classification (SPEC §6).

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// The model is defined but was not loaded (e.g. its API key is missing). `reason` names the
    /// variable and the fix.
    #[error("model '{model}' is not available: {reason}")]
    NotLoaded { model: String, reason: String },
    /// No such model in the configuration at all.
    #[error("model '{0}' is not defined in providers.d or [models]")]
    UnknownModel(String),
    /// Non-2xx answer. `message` is the provider's error text (never contains our key).
    #[error("{provider} returned HTTP {status}: {message}")]
    Http {
        provider: String,
        status: u16,
        message: String,
        retry_after: Option<Duration>,
    },
    /// Could not connect / send the request (no content received).
    #[error("{provider}: connection failed: {message}")]
    Connect { provider: String, message: String },
    /// No bytes for the inactivity timeout.
    #[error("{provider}: no data for {seconds} s (inactivity timeout)")]
    Timeout {
        provider: String,
        seconds: u64,
        /// Whether any content had already streamed (then it is not retried).
        after_content: bool,
    },
    /// The call as a whole took longer than its deadline (`[behavior] call_deadline_seconds`),
    /// e.g. a provider that sends keep-alives and nothing else.
    #[error(
        "{provider}: no complete answer within {seconds} s (the call deadline, [behavior] \
         call_deadline_seconds)"
    )]
    Deadline {
        provider: String,
        seconds: u64,
        /// Whether any content had already streamed (then it is not retried).
        after_content: bool,
    },
    /// The stream broke or carried an `error` event.
    #[error("{provider}: stream failed: {message}")]
    Stream {
        provider: String,
        message: String,
        after_content: bool,
        /// e.g. an `overloaded_error` event before content counts as retryable.
        retryable: bool,
    },
    /// The response could not be understood.
    #[error("{provider}: malformed response: {message}")]
    Decode { provider: String, message: String },
    /// A budget limit was reached; the call was not made.
    #[error("{0}")]
    Budget(String),
    /// The message was cancelled (shutdown or /stop).
    #[error("cancelled")]
    Cancelled,
    /// The model's provider type cannot do what was asked (e.g. embeddings from an
    /// `anthropic` model). The message names the model and the fix.
    #[error("{0}")]
    Unsupported(String),
}

impl LlmError {
    /// Retry only what can succeed on a second try and only before content streamed:
    /// 408/409/429/5xx/529, connection errors, inactivity timeouts and call deadlines before
    /// content.
    /// Never 400, 401, 403, 404, 422.
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmError::Http { status, .. } => {
                matches!(status, 408 | 409 | 429 | 529) || (500..=599).contains(status)
            }
            LlmError::Connect { .. } => true,
            LlmError::Timeout { after_content, .. } | LlmError::Deadline { after_content, .. } => {
                !after_content
            }
            LlmError::Stream {
                after_content,
                retryable,
                ..
            } => *retryable && !after_content,
            _ => false,
        }
    }

    /// Whether the next model of the `fallback` list should be tried after this error
    /// (after the retries of this model were used up).
    pub fn allows_fallback(&self) -> bool {
        match self {
            LlmError::Budget(_) | LlmError::Cancelled => false,
            LlmError::Http { status, .. } => !matches!(status, 400 | 413 | 422),
            _ => true,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            LlmError::Http { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}
