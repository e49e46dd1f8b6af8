//! Message sources: `[fifo]`, `[http]`, `[channel.telegram]` (SPEC §3, §10).

use std::path::Path;

use secrecy::SecretString;

use super::env::is_var_name;
use super::keys::channels as kc;
use super::paths::resolve;
use super::types::{FifoConfig, HttpConfig, TelegramConfig};
use super::walker::Section;

/// `[fifo]`; the default path is `state_dir/control.pipe`.
pub fn fifo(root: &mut Section<'_>, config_dir: &Path, state_dir: &Path) -> FifoConfig {
    let mut s = root.section("fifo");
    FifoConfig {
        enabled: s.read(&kc::FIFO_ENABLED),
        path: s
            .read_opt(&kc::FIFO_PATH)
            .map(|p| resolve(&p, config_dir))
            .unwrap_or_else(|| state_dir.join("control.pipe")),
        max_line_bytes: s.read(&kc::FIFO_MAX_LINE_BYTES),
    }
}

/// `[http]`.
pub fn http(root: &mut Section<'_>) -> HttpConfig {
    let mut s = root.section("http");
    let token_env = s.read(&kc::HTTP_TOKEN_ENV);
    let callback_url = s.read(&kc::HTTP_CALLBACK_URL);
    let callback_token_env = s.read(&kc::HTTP_CALLBACK_TOKEN_ENV);
    let token = secret(&s, "token_env", &token_env);
    let callback_token = if callback_token_env.is_empty() {
        None
    } else {
        secret(&s, "callback_token_env", &callback_token_env)
    };
    if !callback_url.is_empty() && !callback_token_env.is_empty() && callback_token.is_none() {
        s.problem(
            "callback_token_env",
            format!(
                "environment variable {callback_token_env} is not set; put it in the .env beside the config or the environment, or set callback_token_env = \"\" for an unauthenticated webhook"
            ),
        );
    }
    HttpConfig {
        enabled: s.read(&kc::HTTP_ENABLED),
        host: s.read(&kc::HTTP_HOST),
        port: s.read(&kc::HTTP_PORT),
        token_env,
        token,
        max_body_bytes: s.read(&kc::HTTP_MAX_BODY_BYTES),
        max_connections: s.read(&kc::HTTP_MAX_CONNECTIONS),
        rate_limit: s.read(&kc::HTTP_RATE_LIMIT),
        status_rate_limit: s.read(&kc::HTTP_STATUS_RATE_LIMIT),
        rate_window: s.read(&kc::HTTP_RATE_WINDOW),
        callback_url,
        callback_token_env,
        callback_token,
        callback_timeout: s.read(&kc::HTTP_CALLBACK_TIMEOUT),
        cors_origins: s.read(&kc::HTTP_CORS_ORIGINS),
        console: s.read(&kc::HTTP_CONSOLE),
        console_secure_cookie: s.read(&kc::HTTP_CONSOLE_SECURE_COOKIE),
    }
}

/// `[channel.telegram]`. Enabled without a token is a problem.
pub fn telegram(root: &mut Section<'_>) -> TelegramConfig {
    let mut channel = root.section("channel");
    let mut s = channel.section("telegram");
    let enabled = s.read(&kc::TG_ENABLED);
    let token_env = s.read(&kc::TG_TOKEN_ENV);
    let token = secret(&s, "token_env", &token_env);
    if enabled && token.is_none() && is_var_name(&token_env) {
        s.problem(
            "token_env",
            format!(
                "environment variable {token_env} is not set but the Telegram channel is enabled; put the bot token in the .env beside the config or the environment, or set enabled = false"
            ),
        );
    }
    TelegramConfig {
        enabled,
        token_env,
        token,
        api_url: s.read(&kc::TG_API_URL).trim_end_matches('/').to_string(),
        allow_from: s.read(&kc::TG_ALLOW_FROM),
        contacts: s.read(&kc::TG_CONTACTS),
        text_chunk_limit: s.read(&kc::TG_TEXT_CHUNK_LIMIT),
        poll_timeout: s.read(&kc::TG_POLL_TIMEOUT),
        max_download_bytes: s.read(&kc::TG_MAX_DOWNLOAD_BYTES),
        format: s.read(&kc::TG_FORMAT),
    }
}

/// Resolve the secret named by the variable `var` (found at `key`); `None` when unset or empty.
/// A value that is not a variable name is a problem (likely the secret itself was pasted).
pub fn secret(s: &Section<'_>, key: &str, var: &str) -> Option<SecretString> {
    if !is_var_name(var) {
        s.problem(
            key,
            "is not an environment variable name; give the variable's name (e.g. \"AGENTD_HTTP_TOKEN\"), never the secret itself",
        );
        return None;
    }
    s.walker().env().get_non_empty(var).map(SecretString::from)
}
