//! Message sources: `[fifo]`, `[http]`, `[channel.telegram]` (SPEC §3, §10).

use std::path::Path;
use std::time::Duration;

use secrecy::SecretString;

use super::env::is_var_name;
use super::paths::resolve;
use super::sections::path_value;
use super::types::{FifoConfig, HttpConfig, TelegramConfig, TelegramFormat};
use super::walker::Section;

const MIB: u64 = 1024 * 1024;

/// `[fifo]`; the default path is `state_dir/control.pipe`.
pub fn fifo(root: &mut Section<'_>, config_dir: &Path, state_dir: &Path) -> FifoConfig {
    let mut s = root.section("fifo");
    FifoConfig {
        enabled: s.get("enabled").unwrap_or(true),
        path: path_value(&mut s, "path")
            .map(|p| resolve(&p, config_dir))
            .unwrap_or_else(|| state_dir.join("control.pipe")),
        max_line_bytes: s.int("max_line_bytes", 1).unwrap_or(4096),
    }
}

/// `[http]`.
pub fn http(root: &mut Section<'_>) -> HttpConfig {
    let mut s = root.section("http");
    let token_env = s
        .non_empty("token_env")
        .unwrap_or_else(|| "AGENTD_HTTP_TOKEN".into());
    let callback_url: String = s.get("callback_url").unwrap_or_default();
    let callback_token_env: String = s.get("callback_token_env").unwrap_or_default();
    let token = secret(&s, "token_env", &token_env);
    let callback_token = if callback_token_env.is_empty() {
        None
    } else {
        secret(&s, "callback_token_env", &callback_token_env)
    };
    if !callback_url.is_empty() {
        check_url(&s, "callback_url", &callback_url);
        if !callback_token_env.is_empty() && callback_token.is_none() {
            s.problem(
                "callback_token_env",
                format!(
                    "environment variable {callback_token_env} is not set; put it in the .env beside the config or the environment, or set callback_token_env = \"\" for an unauthenticated webhook"
                ),
            );
        }
    }
    HttpConfig {
        enabled: s.get("enabled").unwrap_or(false),
        host: s.non_empty("host").unwrap_or_else(|| "127.0.0.1".into()),
        port: s.int("port", 1).unwrap_or(8100),
        token_env,
        token,
        max_body_bytes: s.int("max_body_bytes", 1).unwrap_or(10 * MIB as usize),
        max_connections: s.int("max_connections", 1).unwrap_or(256),
        rate_limit: s.int("rate_limit", 1).unwrap_or(30),
        status_rate_limit: s.int("status_rate_limit", 1).unwrap_or(60),
        rate_window: Duration::from_secs(s.int("rate_window_seconds", 1).unwrap_or(60)),
        callback_url,
        callback_token_env,
        callback_token,
        callback_timeout: Duration::from_secs(s.int("callback_timeout_seconds", 1).unwrap_or(10)),
    }
}

/// `[channel.telegram]`. Enabled without a token is a problem.
pub fn telegram(root: &mut Section<'_>) -> TelegramConfig {
    let mut channel = root.section("channel");
    let mut s = channel.section("telegram");
    let enabled = s.get("enabled").unwrap_or(false);
    let token_env = s
        .non_empty("token_env")
        .unwrap_or_else(|| "AGENTD_TELEGRAM_TOKEN".into());
    let token = secret(&s, "token_env", &token_env);
    if enabled && token.is_none() && is_var_name(&token_env) {
        s.problem(
            "token_env",
            format!(
                "environment variable {token_env} is not set but the Telegram channel is enabled; put the bot token in the .env beside the config or the environment, or set enabled = false"
            ),
        );
    }
    let api_url = s
        .non_empty("api_url")
        .unwrap_or_else(|| "https://api.telegram.org".into())
        .trim_end_matches('/')
        .to_string();
    check_url(&s, "api_url", &api_url);
    let text_chunk_limit: usize = s.int("text_chunk_limit", 1).unwrap_or(4096);
    if text_chunk_limit > 4096 {
        s.problem(
            "text_chunk_limit",
            format!("Telegram accepts at most 4096 characters per message, got {text_chunk_limit}"),
        );
    }
    let mut c = s.section("contacts");
    let contacts = c.entries::<i64>().into_iter().collect();
    drop(c);
    TelegramConfig {
        enabled,
        token_env,
        token,
        api_url,
        allow_from: s.get("allow_from").unwrap_or_default(),
        contacts,
        text_chunk_limit: text_chunk_limit.min(4096),
        poll_timeout: Duration::from_secs(s.int("poll_timeout_seconds", 0).unwrap_or(30)),
        max_download_bytes: s.int("max_download_bytes", 1).unwrap_or(20 * MIB),
        format: s
            .choice(
                "format",
                &[
                    ("html", TelegramFormat::Html),
                    ("plain", TelegramFormat::Plain),
                ],
            )
            .unwrap_or(TelegramFormat::Html),
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

/// An http(s) URL.
pub fn check_url(s: &Section<'_>, key: &str, url: &str) {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        s.problem(
            key,
            format!(
                "expected an http:// or https:// URL, got {}",
                crate::redact::describe_url_value(url)
            ),
        );
    }
}
