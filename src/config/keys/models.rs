//! The keys of a model: `[models.<name>]` in a provider file (where top-level keys are
//! inherited by every model of the file) or inline in `agentd.toml`.

use super::codec::{
    Bool, Int, Keywords, List, NON_NEGATIVE, Num, OneOf, Str, TEXT, Url, WORD, Words,
};
use super::{Apply, Entries};
use crate::config::types::{CacheTtl, ModelSpec, ProviderKind, Thinking};

/// Values the Anthropic API accepts for `output_config.effort`.
pub const THINKING_EFFORTS: &[&str] = &["low", "medium", "high", "xhigh", "max"];

entry_keys! {
    ModelSpec; MODEL_KEYS = [
        TYPE: "models.<name>" "type", OneOf<ProviderKind> = OneOf(&[("anthropic", ProviderKind::Anthropic), ("openai", ProviderKind::OpenAi), ("elevenlabs", ProviderKind::ElevenLabs)]),
            required("\"anthropic\""), |m| Some(&m.kind),
            "`\"anthropic\"` (Messages API), `\"openai\"` (any OpenAI-compatible chat-completions server) or `\"elevenlabs\"` (speech only: usable as `[voice] tts_model`, refused as `primary` or `stt_model`, and a message routed to it fails naming this). Required at the top of the provider file or on the model; inline models set it themselves";
        API_KEY_ENV: "models.<name>" "api_key_env", Str = WORD,
            derived("none: no key is sent (local servers)"), |m| m.api_key_env.as_ref(),
            "the variable holding the key. When it is unset or empty the model is skipped, not rejected (see below)";
        BASE_URL: "models.<name>" "base_url", Url = Url { empty_ok: false },
            derived("`https://api.anthropic.com` / `https://api.openai.com/v1` / `https://api.elevenlabs.io/v1`"), |m| Some(&m.base_url),
            "Anthropic: the origin, and the client appends `/v1/messages`. OpenAI: the API root (ending in `/v1`), to which the client appends the chat-completions path";
        MODEL: "models.<name>" "model", Str = WORD,
            required("\"claude-sonnet-4-5\""), |m| Some(&m.model),
            "the provider's model id";
        MAX_TOKENS: "models.<name>" "max_tokens", Int<u32> = Int::at_least(1),
            default(4096), |m| Some(&m.max_tokens),
            "output limit. It is sent as `max_completion_tokens` to api.openai.com and as `max_tokens` everywhere else";
        CONTEXT_WINDOW: "models.<name>" "context_window", Int<u32> = Int::at_least(1),
            default(200_000), |m| Some(&m.context_window),
            "tokens; shown by `session_status`";
        COST_INPUT: "models.<name>" "cost_per_mtok.input", Num = NON_NEGATIVE,
            default(0.0), |m| Some(&m.pricing.input),
            "USD per million input tokens";
        COST_OUTPUT: "models.<name>" "cost_per_mtok.output", Num = NON_NEGATIVE,
            default(0.0), |m| Some(&m.pricing.output),
            "USD per million output tokens";
        COST_CACHE_READ: "models.<name>" "cost_per_mtok.cache_read", Num = NON_NEGATIVE,
            default(0.0), |m| Some(&m.pricing.cache_read),
            "USD per million tokens read from the cache";
        COST_CACHE_WRITE: "models.<name>" "cost_per_mtok.cache_write", Num = NON_NEGATIVE,
            default(0.0), |m| Some(&m.pricing.cache_write),
            "USD per million tokens of 5-minute cache writes";
        COST_CACHE_WRITE_1H: "models.<name>" "cost_per_mtok.cache_write_1h", Num = NON_NEGATIVE,
            derived("twice `cost_per_mtok.input` (Anthropic's published rate)"), |m| Some(&m.pricing.cache_write_1h),
            "USD per million tokens of 1-hour cache writes";
        COST_PER_MINUTE: "models.<name>" "cost_per_minute", Num = NON_NEGATIVE,
            default(0.0), |m| Some(&m.pricing.per_minute),
            "USD per minute of audio transcribed (a `[voice] stt_model`)";
        COST_PER_1K_CHARS: "models.<name>" "cost_per_1k_chars", Num = NON_NEGATIVE,
            default(0.0), |m| Some(&m.pricing.per_1k_chars),
            "USD per 1000 characters spoken (a `[voice] tts_model`)";
        CACHE: "models.<name>" "cache", Bool = Bool,
            derived("`true` for anthropic, `false` for openai"), |m| Some(&m.cache),
            "Anthropic cache breakpoints (see ARCHITECTURE \"Prompt caching\")";
        CACHE_TTL: "models.<name>" "cache_ttl", OneOf<CacheTtl> = OneOf(&[("5m", CacheTtl::FiveMinutes), ("1h", CacheTtl::OneHour)]),
            default(CacheTtl::FiveMinutes), |m| (m.kind == ProviderKind::Anthropic).then_some(&m.cache_ttl),
            "anthropic only: the TTL of the message breakpoints";
        THINKING: "models.<name>" "thinking", OneOf<Thinking> = OneOf(&[("off", Thinking::Off), ("adaptive", Thinking::Adaptive), ("budgeted", Thinking::Budgeted)]),
            default(Thinking::Off), |m| Some(&m.thinking),
            "`\"adaptive\"` sends `thinking_effort` as `output_config.effort`; `\"budgeted\"` gives `thinking_budget` tokens";
        THINKING_BUDGET: "models.<name>" "thinking_budget", Int<u32> = Int::at_least(1),
            default(10_000), |m| Some(&m.thinking_budget),
            "thinking tokens when `budgeted`: at least 1024 and below `max_tokens`";
        THINKING_EFFORT: "models.<name>" "thinking_effort", Words = Words(THINKING_EFFORTS),
            derived("none"), |m| m.thinking_effort.as_ref(),
            "for `adaptive`";
        SUPPORTS_VISION: "models.<name>" "supports_vision", Bool = Bool,
            default(false), |m| Some(&m.supports_vision),
            "the model takes images (image blocks are sent only to such a model)";
        FALLBACK: "models.<name>" "fallback", List<Str> = List(TEXT),
            default(Vec::new()), |m| Some(&m.fallback),
            "model names tried in order after this model fails for good. A name must be defined and may not be the model itself. 400/413/422 errors and budget stops do not fall back";
        PROMPT_CACHE_KEY: "models.<name>" "prompt_cache_key", Bool = Bool,
            default(false), |m| (m.kind == ProviderKind::OpenAi).then_some(&m.prompt_cache_key),
            "openai only: send the session id as `prompt_cache_key`";
        SCHEMA_KEYWORDS: "models.<name>" "schema_keywords", Keywords = Keywords,
            derived("all"), |m| m.tool_schema.keywords.as_ref(),
            "the JSON Schema keywords the provider's tool grammar accepts; the others are left out of every tool schema sent to it (at every level; local `$ref`s inlined when `$ref` is not listed). agentd still checks each call against the full schema";
        SCHEMA_MAX_LENGTH: "models.<name>" "schema_max_length", Int<u64> = Int::at_least(1),
            derived("none"), |m| m.tool_schema.max_length.as_ref(),
            "`minLength`/`maxLength` above it, and patterns repeating more, are left out of the schemas sent (llama.cpp refuses 2000 and more)";
        TOOL_CALLS_IN_TEXT: "models.<name>" "tool_calls_in_text", Bool = Bool,
            default(false), |m| Some(&m.tool_calls_in_text),
            "the model may write a tool call as text — a bare `{\"name\": …, \"arguments\": {…}}` (or a list of them), `<tool_call>…</tool_call>`, fenced JSON — naming one of the request's tools with object arguments: it is taken as a tool call, with the same checks. Streamed text is held back while it may still be one";
        STRUCTURED_OUTPUT: "models.<name>" "structured_output", Bool = Bool,
            derived("`true` for anthropic and openai"), |m| Some(&m.structured_output),
            "the provider takes a structured-output format (OpenAI `response_format`, Anthropic `output_config.format`). A compatible-endpoint request that asks for one is refused (400) when its model has `false`, and such a model is skipped as its fallback";
    ]
}

/// `[models.<name>]`: a changed model needs a restart.
pub static MODELS: Entries<ModelSpec> =
    Entries::new("models.<name>", "models.", Apply::Restart, MODEL_KEYS);
