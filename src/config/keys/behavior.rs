//! `[behavior]`, `[behavior.compaction]`, `[budget]`, `[approvals]`, `[delivery]`,
//! `[caching]` and `[alerts]`.

use std::time::Duration;

use super::agent::strings;
use super::codec::{Dur, Int, List, NON_NEGATIVE, Num, OneOf, Opt, SecsF, Str, TEXT, WORD};
use crate::config::types::CachingTtl;

/// Default `behavior.error_message`.
pub const DEFAULT_ERROR_MESSAGE: &str =
    "Sorry, something went wrong on my side. Please try again in a moment.";

/// Default `behavior.compaction.prompt`.
pub const DEFAULT_COMPACTION_PROMPT: &str = "Summarise the conversation so far for your own future reference. Keep decisions, facts about the user, open tasks and commitments, names, numbers, file paths and anything else needed to continue the work; drop small talk. Write in the language of the conversation.";

/// `[behavior] call_deadline_seconds` default (SPEC §6): fifteen minutes for one model call,
/// from the request to the last event. Long outputs and large thinking budgets take many
/// minutes on a slow model, so it only ends calls that are stuck; raise it for more.
pub const DEFAULT_CALL_DEADLINE_SECONDS: u64 = 900;

/// `[behavior] max_reply_bytes` default: 1 MiB of text, thinking and tool-call input per
/// model reply, about 250,000 tokens, more than any model's output limit today.
pub const DEFAULT_MAX_REPLY_BYTES: usize = 1024 * 1024;

/// `[behavior] idle_session_cache_bytes` default: 8 MiB for the conversations of recently
/// idle sessions (SPEC §16.3), room for several long ones (a history at the compaction
/// threshold, with its rendered request bytes, is one to two MiB).
pub const DEFAULT_IDLE_SESSION_CACHE_BYTES: usize = 8 << 20;

/// Default `approvals.timeout_seconds`.
pub const DEFAULT_APPROVAL_TIMEOUT_SECONDS: u64 = 300;

/// The longest `approvals.timeout_seconds` (a day): a call never waits longer for a yes.
pub const MAX_APPROVAL_TIMEOUT_SECONDS: i64 = 86_400;

config_keys! {
    BEHAVIOR = [
        DEBOUNCE_MS: "behavior" "debounce_ms", Dur = Dur::millis(0),
            default(Duration::from_millis(500)), restart, behavior.debounce,
            "messages of one session, one source and one sender (for Telegram: one chat) arriving within this window become one turn, for the sources `telegram` and `user` (FIFO `-m`); each new message restarts the window, up to 5 windows in all. `0` turns it off. HTTP, `system` and terminal messages are not debounced";
        MAX_CONCURRENT_SESSIONS: "behavior" "max_concurrent_sessions", Int<usize> = Int::at_least(1),
            default(4), restart, behavior.max_concurrent_sessions,
            "sessions processing a message at the same time; one session is always serial";
        MAX_QUEUED_PER_SESSION: "behavior" "max_queued_per_session", Int<usize> = Int::at_least(1),
            default(64), restart, behavior.max_queued_per_session,
            "messages one session may have waiting to start; one more is refused before it is recorded: HTTP 429, a \"busy\" answer on Telegram, a logged refusal on the FIFO. Messages recovered after a restart are never refused";
        MAX_QUEUED_TOTAL: "behavior" "max_queued_total", Int<usize> = Int::at_least(1),
            default(1024), restart, behavior.max_queued_total,
            "messages all sessions together may have waiting to start, refused the same way";
        IDLE_SESSION_CACHE_BYTES: "behavior" "idle_session_cache_bytes", Int<usize> = Int::at_least(0),
            default(DEFAULT_IDLE_SESSION_CACHE_BYTES), restart, behavior.idle_session_cache_bytes,
            "memory for the conversations of sessions between messages, as estimated from their messages and the request bytes kept for them; at most 8 sessions are kept, the least recently used leave first (saved to their snapshot), and a session larger than this alone is not kept. A session not kept is read from its snapshot at its next message. `0` keeps none";
        SILENT_TOKENS: "behavior" "silent_tokens", List<Str> = List(TEXT),
            default(strings(&["HEARTBEAT_OK", "NO_REPLY"])), restart, behavior.silent_tokens,
            "a reply that starts or ends with one of these as a whole word — also wrapped in quotes, a fence, `<json>…</json>` or a one-key JSON object — is silent (`silent: true` in the trail, not delivered). Only the system prompt of system events (`system` source: heartbeats, notifications, schedules) tells the model about them";
        TYPING_INDICATORS: "behavior" "typing_indicators", super::codec::Bool = super::codec::Bool,
            default(true), restart, behavior.typing_indicators,
            "Telegram \"typing…\" every 4 s while a message whose reply goes to Telegram is processed";
        SHOW_FALLBACK: "behavior" "show_fallback", super::codec::Bool = super::codec::Bool,
            default(true), restart, behavior.show_fallback,
            "a Telegram reply that a fallback model answered (the chosen model failed) ends with one short line naming both models (SPEC §18.3); the trail, the `costs` row and the monitor record it either way";
        ERROR_MESSAGE: "behavior" "error_message", Str = WORD,
            default(DEFAULT_ERROR_MESSAGE.to_string()), restart, behavior.error_message,
            "what the sender is told (in Telegram, HTTP, the terminal, the trail) when a message fails. Configuration failures (model not loaded or unknown, budget reached) use their precise message instead";
        MAX_TURNS_PER_MESSAGE: "behavior" "max_turns_per_message", Int<u32> = Int::at_least(1),
            default(50), restart, behavior.max_turns_per_message,
            "LLM calls per message; at 2 remaining the model is told to wrap up, and the last call has tools disabled";
        CALL_TIMEOUT: "behavior" "call_timeout_seconds", Dur = Dur::secs(1),
            default(Duration::from_secs(600)), restart, behavior.call_timeout,
            "inactivity timeout: for the response head and for every streamed chunk. Also how long HTTP `/chat` waits for the reply (then 408) and the read endpoints wait for an answer (then 503)";
        CALL_DEADLINE: "behavior" "call_deadline_seconds", Dur = Dur::secs(1),
            default(Duration::from_secs(DEFAULT_CALL_DEADLINE_SECONDS)), restart, behavior.call_deadline,
            "total time one model call may take, from sending the request to the last event, whatever keep-alives (`ping` events) arrive meanwhile. Before any content has streamed, running out is a retryable failure (retries, then `fallback`); after content, the call fails. Raise it for very long outputs or large thinking budgets";
        MAX_REPLY_BYTES: "behavior" "max_reply_bytes", Int<usize> = Int::at_least(1024),
            default(DEFAULT_MAX_REPLY_BYTES), restart, behavior.max_reply_bytes,
            "most bytes of one model reply: text, thinking and tool-call inputs together. A larger reply is refused as a malformed answer (not retried; `fallback` is tried), and nothing of it is stored. The raw event stream of one call, and an embeddings answer, are capped at 64 times this";
        API_RETRIES: "behavior" "api_retries", Int<u32> = Int::at_least(0),
            default(2), restart, behavior.api_retries,
            "retries per model for retryable errors (429, 5xx, 529, 408, 409, connection errors, timeouts before any content)";
        API_RETRY_BASE_DELAY: "behavior" "api_retry_base_delay_seconds", SecsF = SecsF(Num { min: 0.0, max: 3600.0 }),
            default(Duration::from_secs(2)), restart, behavior.api_retry_base_delay,
            "backoff base: `base·2^(n−1)` scaled by a random 0.5–1, `Retry-After` honoured, each wait ≤ 60 s";
        MESSAGE_RETRIES: "behavior" "message_retries", Int<u32> = Int::at_least(0),
            default(1), restart, behavior.message_retries,
            "after retries and `fallback` models all failed with a retryable error, the whole call is tried again this many times (after `2 × base`)";
        OUTPUT_TRUNCATION: "behavior" "output_truncation", Int<usize> = Int::at_least(1),
            default(30_000), restart, behavior.output_truncation,
            "characters of one tool result kept, with a marker";
        COMPACTION_THRESHOLD: "behavior.compaction" "threshold_tokens", Int<u64> = Int::at_least(1),
            default(150_000), restart, behavior.compaction.threshold_tokens,
            "context size that triggers compaction";
        COMPACTION_MODEL: "behavior.compaction" "model", Str = WORD,
            default("compaction".to_string()), restart, behavior.compaction.model,
            "summarising model. The default falls back to `primary` when no `compaction` model is loaded; any other name must be defined";
        COMPACTION_PROMPT: "behavior.compaction" "prompt", Str = WORD,
            default(DEFAULT_COMPACTION_PROMPT.to_string()), restart, behavior.compaction.prompt,
            "the summarising instructions (sent as the summary call's system prompt)";
    ]
}

config_keys! {
    BUDGET = [
        BUDGET_PER_MESSAGE: "budget" "per_message_usd", Num = NON_NEGATIVE,
            default(0.0), live, budget.per_message_usd,
            "USD; spend of the current message; 0 = off";
        BUDGET_DAILY: "budget" "daily_usd", Num = NON_NEGATIVE,
            default(0.0), live, budget.daily_usd,
            "USD; spend since local midnight (`agent.timezone`); 0 = off";
        BUDGET_MONTHLY: "budget" "monthly_usd", Num = NON_NEGATIVE,
            default(0.0), live, budget.monthly_usd,
            "USD; spend since the 1st of the local month; 0 = off";
    ]
}

config_keys! {
    APPROVALS = [
        APPROVALS_REQUIRE: "approvals" "require", List<Str> = List(TEXT),
            default(Vec::new()), live, approvals.require,
            "tool-name globs whose calls wait for a yes: `\"exec\"`, `\"write\"`, `\"github__*\"` (`*` any run of characters, `?` one; tool-name characters only; at most 256)";
        APPROVALS_OVER_USD: "approvals" "over_usd", Num = NON_NEGATIVE,
            default(0.0), live, approvals.over_usd,
            "once the current message has spent this much (USD, every call billed to it), its next tool calls wait for a yes; one yes lets the rest of the message go on. `0` = off";
        APPROVALS_TIMEOUT: "approvals" "timeout_seconds", Dur = Dur::secs_capped(1, MAX_APPROVAL_TIMEOUT_SECONDS, " (a day); a call never waits longer for a yes"),
            default(Duration::from_secs(DEFAULT_APPROVAL_TIMEOUT_SECONDS)), live, approvals.timeout,
            "how long a call waits; then it is denied (`approval timed out`). An approval already waiting keeps the timeout it got";
        APPROVALS_TELEGRAM_CHAT: "approvals" "telegram_chat", Opt<Int<i64>> = Opt(Int::any()),
            default(None), live, approvals.telegram_chat,
            "the Telegram chat id (not 0) where approvals of non-Telegram sessions (FIFO, HTTP, `api`) are offered with buttons; a Telegram session's approvals go to its own chat";
        APPROVALS_SYSTEM_ALLOW: "approvals" "system_allow", List<Str> = List(TEXT),
            default(Vec::new()), live, approvals.system_allow,
            "tool-name globs a `system`-source message (heartbeats, notifications, `[[schedule]]` system entries) may run without a yes; its other gated calls are denied at once, since nobody waits for them";
        APPROVALS_APPROVERS: "approvals" "approvers", List<Int<i64>> = List(Int::any()),
            default(Vec::new()), live, approvals.approvers,
            "Telegram user ids (positive numbers, at most 256) who may press the buttons of any approval, in any chat. Anyone else decides only in the chat the prompt was asked in, and only when listed in `allow_from`";
    ]
}

config_keys! {
    DELIVERY = [
        RETRY_MINUTES: "delivery" "retry_minutes", Dur = Dur::minutes(1),
            default(Duration::from_secs(600)), restart, delivery.retry,
            "how long a reply is retried, counted from when it was made (a reply queued behind another or left by a restart gets no fresh window; every part gets at least one try), before it is recorded `failed`";
    ]
}

config_keys! {
    AUTOPILOT = [
        CACHING_TTL: "caching" "ttl", OneOf<CachingTtl> = OneOf(&[("5m", CachingTtl::FiveMinutes), ("1h", CachingTtl::OneHour), ("auto", CachingTtl::Auto)]),
            default(CachingTtl::Auto), restart, caching.ttl,
            "the cache lifetime of the stable and semi_stable system breakpoints of Anthropic models (SPEC §20): `\"5m\"`, `\"1h\"`, or `\"auto\"`: 1 hour for a session whose recent user turns (the median gap of its last four) are more than 5 minutes and less than an hour apart, else 5 minutes. Message breakpoints keep the model's `cache_ttl`, so 1-hour breakpoints always come before 5-minute ones. 1-hour writes are priced at `cost_per_mtok.cache_write_1h`. OpenAI models are unaffected";
        ALERTS_TELEGRAM_CHAT: "alerts" "telegram_chat", Opt<Int<i64>> = Opt(Int::any()),
            default(None), restart, alerts.telegram_chat,
            "the chat (not 0) that gets one notice per alert episode (the cache alarm, SPEC §20), through the outbox; needs `[channel.telegram]`. Without it, alerts go to the log and `monitor.json` only";
    ]
}
