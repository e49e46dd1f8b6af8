//! The Telegram Bot API client (SPEC §10.3): every method is one request of our own reqwest
//! client to `api_url` (`call_raw`), whose timeout outlasts a long poll; teloxide gives the
//! types (`Update`). Teloxide's own request code is not used: it sleeps 10 s after every 5xx,
//! and its reqwest 0.12 client would link a second HTTP stack (issue 14).
//!
//! Every error that leaves this module is a [`TgError`] whose text has been scrubbed of the bot
//! token and of request URLs (`net::scrub::redact`): reqwest errors carry the request URL, and
//! the URL carries the token (`/bot<token>/<method>`).

use std::future::Future;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use teloxide::types::Update;

use super::format::{markdown_to_html, strip_to_plain};
use super::inbound::bot_id_from_token;
use super::split::split_message;
use crate::config::{TelegramConfig, TelegramFormat};
use crate::net::scrub::redact;
use crate::telemetry::error_chain;

mod files;

pub use self::files::{MAX_UPLOAD_BYTES, download_file_name};

/// How long establishing a connection to the Bot API may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How much longer than the long-poll timeout the HTTP client waits for an answer.
pub const HTTP_TIMEOUT_SLACK: Duration = Duration::from_secs(15);

/// Flood-control waits (`retry_after`) up to this long are slept through and the call retried;
/// longer ones are returned as [`TgError::RetryAfter`].
pub const MAX_FLOOD_WAIT: Duration = Duration::from_secs(60);

/// The longest `retry_after` taken from an answer as given (a day); a larger one, from a broken
/// or hostile API endpoint, is read as this, so no wait arithmetic can overflow.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(86_400);

/// How many flood-control waits one call sleeps through before giving up.
pub const MAX_FLOOD_RETRIES: u32 = 3;

/// What goes wrong talking to Telegram. Texts never contain the bot token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TgError {
    /// 401: the token is wrong or revoked.
    #[error(
        "telegram token rejected (401 Unauthorized); put the bot's current token in the variable named by [channel.telegram] token_env"
    )]
    Unauthorized,
    /// 409: another process polls with this token (or a webhook is set).
    #[error(
        "telegram: 409 Conflict: another getUpdates consumer uses this bot token; stop the other instance"
    )]
    Conflict,
    /// 429: flood control; retry after this long.
    #[error("telegram: flood control (429), retry after {} s", .0.as_secs())]
    RetryAfter(Duration),
    /// 400 "can't parse entities": the HTML was rejected.
    #[error("telegram rejected the formatted text: {0}")]
    ParseEntities(String),
    /// 400 "message is too long".
    #[error("telegram: message is too long")]
    TooLong,
    /// Any other Bot API error, with Telegram's description.
    #[error("telegram API error: {0}")]
    Api(String),
    /// The request did not reach Telegram or the answer broke off.
    #[error("telegram: network error: {0}")]
    Network(String),
    /// The HTTP client gave up waiting for an answer.
    #[error("telegram: request timed out")]
    Timeout,
    /// The request was written but the answer broke off: Telegram may have acted on it.
    #[error("telegram: the connection broke after the request was sent: {0}")]
    Broken(String),
    /// A 5xx answer (Telegram's front end or a proxy).
    #[error("telegram: server error {0}")]
    Server(u16),
    /// The answer was not the Bot API's JSON (e.g. a proxy's HTML error page).
    #[error("telegram: unexpected response: {0}")]
    InvalidResponse(String),
    /// A download is larger than allowed.
    #[error(
        "telegram: file of {size} bytes exceeds max_download_bytes = {max}; raise [channel.telegram] max_download_bytes to accept it"
    )]
    TooLarge { size: u64, max: u64 },
    /// A local file could not be read or written.
    #[error("telegram: {0}")]
    Io(String),
    /// The channel is not usable as configured.
    #[error("[channel.telegram]: {0}")]
    Config(String),
}

/// What a failed send means for the outbox (SPEC §16.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendFault {
    /// Nothing was delivered; sending again is safe (after this long, when Telegram said so).
    Retry(Option<Duration>),
    /// Telegram may have delivered it; never sent again.
    Unknown,
    /// Refused; sending again would fail the same way.
    Fatal,
}

impl TgError {
    /// How the outbox treats this error of a send: connection errors before the request was
    /// written, 5xx and 429 are retried; a timeout or a broken answer is unknown; the rest fail.
    pub fn send_fault(&self) -> SendFault {
        match self {
            TgError::Network(_) | TgError::Server(_) => SendFault::Retry(None),
            TgError::RetryAfter(d) => SendFault::Retry(Some(*d)),
            TgError::Timeout | TgError::Broken(_) => SendFault::Unknown,
            _ => SendFault::Fatal,
        }
    }
}

/// The Bot API's answer envelope, as far as a raw `sendMessage` needs it.
#[derive(serde::Deserialize)]
struct RawAnswer {
    ok: bool,
    #[serde(default)]
    result: Option<serde_json::Value>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    error_code: Option<u16>,
    #[serde(default)]
    parameters: Option<RawParameters>,
}

#[derive(serde::Deserialize)]
struct RawParameters {
    #[serde(default)]
    retry_after: Option<u64>,
}

/// What kind of file [`TelegramClient::send_file`] sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// Shown inline as a photo (compressed by Telegram; max 10 MB).
    Photo,
    /// Sent as a file, unchanged.
    Document,
    /// A voice note (OGG/Opus).
    Voice,
    /// A music file.
    Audio,
}

/// Who the bot is (`getMe`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BotInfo {
    pub id: i64,
    pub username: Option<String>,
    pub first_name: String,
}

/// A Bot API client. Cheap to clone (the HTTP client is shared).
#[derive(Clone)]
pub struct TelegramClient {
    http: reqwest::Client,
    /// `api_url`, a base URL (checked by `new`).
    api_url: reqwest::Url,
    token: SecretString,
    bot_id: Option<i64>,
}

impl std::fmt::Debug for TelegramClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelegramClient")
            .field("api_url", &self.api_url.as_str())
            .field("bot_id", &self.bot_id)
            .finish_non_exhaustive()
    }
}

/// `s` without the bot token in any of its forms (verbatim, percent-encoded, and the secret
/// part after the colon on its own), each replaced by `net::scrub::REDACTED`.
pub fn scrub_token(s: &str, token: &str) -> String {
    let encoded = token.replace(':', "%3A");
    let secret = token
        .split_once(':')
        .map(|(_, secret)| secret)
        .filter(|secret| secret.len() >= 8)
        .unwrap_or_default();
    redact(s, &[token, &encoded, secret])
}

impl TelegramClient {
    /// A client for `cfg.api_url` with the token from `cfg.token`; its HTTP timeout is
    /// `cfg.poll_timeout` + [`HTTP_TIMEOUT_SLACK`].
    pub fn new(cfg: &TelegramConfig) -> Result<TelegramClient, TgError> {
        let token = cfg.token.clone().ok_or_else(|| {
            TgError::Config(format!(
                "no bot token: set the environment variable {} (token_env)",
                cfg.token_env
            ))
        })?;
        let raw = token.expose_secret();
        let http = crate::net::tls::client_builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(cfg.poll_timeout + HTTP_TIMEOUT_SLACK)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| {
                TgError::Config(scrub_token(
                    &format!("cannot build the HTTP client: {}", error_chain(&e)),
                    raw,
                ))
            })?;
        let base = cfg.api_url.trim_end_matches('/');
        let url = reqwest::Url::parse(base).map_err(|e| {
            TgError::Config(format!(
                "api_url {base:?} is not a URL ({e}); e.g. https://api.telegram.org"
            ))
        })?;
        if url.cannot_be_a_base() {
            return Err(TgError::Config(format!(
                "api_url {base:?} cannot be a base URL; e.g. https://api.telegram.org"
            )));
        }
        Ok(TelegramClient {
            http,
            api_url: url,
            bot_id: bot_id_from_token(raw),
            token,
        })
    }

    /// The bot's user id as read from the token (the number before the colon).
    pub fn bot_id(&self) -> Option<i64> {
        self.bot_id
    }

    /// `s` without the bot token.
    pub fn scrub(&self, s: &str) -> String {
        scrub_token(s, self.token.expose_secret())
    }

    /// An error of teloxide's HTTP client and its causes, without its request `url` (which
    /// holds the token) and the token. Teloxide has a reqwest of its own, so
    /// `net::scrub::reqwest_error_text` cannot take its errors.
    fn scrub_error(&self, e: &(dyn std::error::Error + 'static), url: Option<&str>) -> String {
        self.scrub(&redact(&error_chain(e), &[url.unwrap_or_default()]))
    }

    /// `getMe`: checks the token and names the bot.
    pub async fn get_me(&self) -> Result<BotInfo, TgError> {
        let me = self
            .call_raw("getMe", RawBody::json(&serde_json::json!({})))
            .await?;
        let id = me.get("id").and_then(serde_json::Value::as_i64);
        let first_name = me.get("first_name").and_then(serde_json::Value::as_str);
        match (id, first_name) {
            (Some(id), Some(first_name)) => Ok(BotInfo {
                id,
                username: me
                    .get("username")
                    .and_then(serde_json::Value::as_str)
                    .map(String::from),
                first_name: first_name.to_string(),
            }),
            _ => Err(TgError::InvalidResponse(
                "getMe answered without the bot's id and name".into(),
            )),
        }
    }

    /// One long poll: `getUpdates` with `offset` (confirming everything below it), `timeout`
    /// (whole seconds) and `allowed_updates = ["message", "callback_query"]` (the approval
    /// buttons, SPEC §18.1).
    pub async fn get_updates(
        &self,
        offset: i64,
        timeout: Duration,
    ) -> Result<Vec<Update>, TgError> {
        let body = serde_json::json!({
            "offset": offset.clamp(0, i64::from(i32::MAX)),
            "timeout": timeout.as_secs().min(u64::from(u32::MAX)),
            "allowed_updates": ["message", "callback_query"],
        });
        let result = self.call_raw("getUpdates", RawBody::json(&body)).await?;
        // From text, not from the `Value`: teloxide's `Update` reads a message only from a
        // string deserializer (from a `Value` every update became `UpdateKind::Error`).
        serde_json::from_str(&result.to_string())
            .map_err(|e| TgError::InvalidResponse(self.scrub(&format!("getUpdates: {e}"))))
    }

    /// Runs `call` again after flood-control waits up to [`MAX_FLOOD_WAIT`], at most
    /// [`MAX_FLOOD_RETRIES`] times.
    async fn with_flood_retry<T, F, Fut>(&self, what: &str, mut call: F) -> Result<T, TgError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, TgError>>,
    {
        let mut waits = 0;
        loop {
            match call().await {
                Err(TgError::RetryAfter(d)) if waits < MAX_FLOOD_RETRIES && d <= MAX_FLOOD_WAIT => {
                    waits += 1;
                    tracing::warn!(
                        call = what,
                        retry_after_seconds = d.as_secs(),
                        "telegram: flood control; waiting before retrying"
                    );
                    tokio::time::sleep(d).await;
                }
                r => return r,
            }
        }
    }

    /// One `sendMessage`; returns the message id.
    async fn send_text(&self, chat_id: i64, text: &str, html: bool) -> Result<i32, TgError> {
        self.with_flood_retry("sendMessage", || self.send_message_raw(chat_id, text, html))
            .await
    }

    /// One `sendMessage` (see [`Self::call_raw`]); returns the message id.
    /// One plain-text message with one row of inline buttons per `(label, data)` (SPEC §18).
    pub async fn send_with_buttons(
        &self,
        chat_id: i64,
        text: &str,
        buttons: &[(String, String)],
    ) -> Result<i32, TgError> {
        let rows: Vec<serde_json::Value> = buttons
            .iter()
            .map(|(label, data)| serde_json::json!([{"text": label, "callback_data": data}]))
            .collect();
        let body = serde_json::json!({
            "chat_id": chat_id,
            "text": text,
            "reply_markup": {"inline_keyboard": rows},
        });
        let sent = self.call_raw("sendMessage", RawBody::json(&body)).await?;
        message_id(&sent, "sendMessage")
    }

    /// `answerCallbackQuery`: stops the button's spinner, with a short notice.
    pub async fn answer_callback(&self, query_id: &str, text: &str) -> Result<(), TgError> {
        let notice: String = text.chars().take(200).collect();
        let body = serde_json::json!({"callback_query_id": query_id, "text": notice});
        self.call_raw("answerCallbackQuery", RawBody::json(&body))
            .await
            .map(|_| ())
    }

    async fn send_message_raw(&self, chat_id: i64, text: &str, html: bool) -> Result<i32, TgError> {
        let mut body = serde_json::json!({ "chat_id": chat_id, "text": text });
        if html {
            body["parse_mode"] = "HTML".into();
        }
        let sent = self.call_raw("sendMessage", RawBody::json(&body)).await?;
        message_id(&sent, "sendMessage")
    }

    /// One Bot API call over teloxide's HTTP client but not through its request code, which
    /// sleeps 10 s after every 5xx before it returns (`DELAY_ON_SERVER_ERROR`): the outbox's
    /// own backoff sets the pace (SPEC §16.1). Returns the answer's `result`. Errors say
    /// whether the request was written ([`TgError::send_fault`]).
    async fn call_raw(&self, method: &str, body: RawBody) -> Result<serde_json::Value, TgError> {
        let mut url = self.api_url.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty();
            segments.push(&format!("bot{}", self.token.expose_secret()));
            segments.push(method);
        }
        let sent = self
            .http
            .post(url.as_str())
            .header("content-type", body.content_type)
            .body(body.bytes)
            .send()
            .await;
        let url_text = url.as_str().to_string();
        let response = match sent {
            Ok(r) => r,
            Err(e) if e.is_connect() => {
                return Err(TgError::Network(self.scrub_error(&e, Some(&url_text))));
            }
            Err(e) if e.is_timeout() => return Err(TgError::Timeout),
            Err(e) => return Err(TgError::Broken(self.scrub_error(&e, Some(&url_text)))),
        };
        let status = response.status().as_u16();
        let text = match response.text().await {
            Ok(t) => t,
            Err(_) if status >= 500 => return Err(TgError::Server(status)),
            Err(e) if e.is_timeout() => return Err(TgError::Timeout),
            Err(e) => return Err(TgError::Broken(self.scrub_error(&e, Some(&url_text)))),
        };
        let answer: RawAnswer = match serde_json::from_str(&text) {
            Ok(a) => a,
            Err(_) if status >= 500 => return Err(TgError::Server(status)),
            Err(e) => {
                let head: String = text.chars().take(200).collect();
                return Err(TgError::InvalidResponse(
                    self.scrub(&format!("{e}; body starts {head:?}")),
                ));
            }
        };
        if answer.ok {
            return answer.result.ok_or_else(|| {
                TgError::InvalidResponse(format!("{method} answered without a result"))
            });
        }
        let code = answer.error_code.unwrap_or(status);
        let description = self.scrub(answer.description.as_deref().unwrap_or("no description"));
        let lower = description.to_ascii_lowercase();
        Err(match code {
            429 => TgError::RetryAfter(
                Duration::from_secs(answer.parameters.and_then(|p| p.retry_after).unwrap_or(1))
                    .min(MAX_RETRY_AFTER),
            ),
            401 => TgError::Unauthorized,
            409 => TgError::Conflict,
            500..=599 => TgError::Server(code),
            _ if lower.contains("can't parse entities") => TgError::ParseEntities(description),
            _ if lower.contains("message is too long") => TgError::TooLong,
            _ => TgError::Api(format!("{code}: {description}")),
        })
    }

    /// The parts `text` is sent as: the splitter's chunks of at most `limit` UTF-16 units, in
    /// order, blank ones left out.
    pub fn parts(text: &str, limit: usize) -> Vec<String> {
        split_message(text, limit)
            .into_iter()
            .filter(|c| !c.trim().is_empty())
            .map(|c| c.to_string())
            .collect()
    }

    /// Sends one part (see [`Self::parts`]) once, without any retry: with `TelegramFormat::Html`
    /// rendered to Telegram HTML, and resent as plain text when Telegram rejects the HTML.
    /// Returns the message id.
    pub async fn send_part(
        &self,
        chat_id: i64,
        chunk: &str,
        format: TelegramFormat,
    ) -> Result<i32, TgError> {
        match format {
            TelegramFormat::Plain => {
                self.send_message_raw(chat_id, &strip_to_plain(chunk), false)
                    .await
            }
            TelegramFormat::Html => {
                match self
                    .send_message_raw(chat_id, &markdown_to_html(chunk), true)
                    .await
                {
                    Err(e @ (TgError::ParseEntities(_) | TgError::TooLong)) => {
                        tracing::warn!(
                            chat_id,
                            error = %e,
                            "telegram: formatted reply rejected; resending this part as plain text"
                        );
                        self.send_message_raw(chat_id, &strip_to_plain(chunk), false)
                            .await
                    }
                    r => r,
                }
            }
        }
    }

    /// Sends `text` to `chat_id` as one or more messages of at most `limit` UTF-16 units (the
    /// splitter's chunks, in order). With `TelegramFormat::Html` each chunk is rendered to
    /// Telegram HTML; a chunk Telegram rejects ("can't parse entities", "too long") is resent
    /// as plain text. Flood control is waited out. Returns the message ids; a blank `text`
    /// sends nothing. On an error, chunks before it have been delivered.
    pub async fn send_reply(
        &self,
        chat_id: i64,
        text: &str,
        format: TelegramFormat,
        limit: usize,
    ) -> Result<Vec<i32>, TgError> {
        let mut ids = Vec::new();
        for chunk in split_message(text, limit) {
            if chunk.trim().is_empty() {
                continue;
            }
            let id = match format {
                TelegramFormat::Plain => {
                    self.send_text(chat_id, &strip_to_plain(&chunk), false)
                        .await?
                }
                TelegramFormat::Html => {
                    match self
                        .send_text(chat_id, &markdown_to_html(&chunk), true)
                        .await
                    {
                        Ok(id) => id,
                        Err(e @ (TgError::ParseEntities(_) | TgError::TooLong)) => {
                            tracing::warn!(
                                chat_id,
                                error = %e,
                                "telegram: formatted reply rejected; resending this part as plain text"
                            );
                            self.send_text(chat_id, &strip_to_plain(&chunk), false)
                                .await?
                        }
                        Err(e) => return Err(e),
                    }
                }
            };
            ids.push(id);
        }
        Ok(ids)
    }

    /// Shows "typing…" in `chat_id` (Telegram clears it after ~5 s or at the next message).
    pub async fn send_typing(&self, chat_id: i64) -> Result<(), TgError> {
        let body = serde_json::json!({ "chat_id": chat_id, "action": "typing" });
        self.call_raw("sendChatAction", RawBody::json(&body))
            .await
            .map(|_| ())
    }

    /// Sets the bot's reaction on a message to `emoji` (one of Telegram's reaction emoji).
    /// One raw call (see [`Self::call_raw`]), no retry.
    pub async fn react(&self, chat_id: i64, message_id: i32, emoji: &str) -> Result<(), TgError> {
        let body = serde_json::json!({
            "chat_id": chat_id,
            "message_id": message_id,
            "reaction": [{ "type": "emoji", "emoji": emoji }],
        });
        self.call_raw("setMessageReaction", RawBody::json(&body))
            .await
            .map(|_| ())
    }

    /// Sends an approval prompt (SPEC §18.1): plain `text` with an inline keyboard of
    /// *Approve* / *Always in this session* / *Deny*, whose callback data is `ap:<id>:a|s|d`
    /// (at most 64 bytes, as Telegram allows). Once, no retry; returns the message id.
    pub async fn send_approval_prompt(
        &self,
        chat_id: i64,
        text: &str,
        id: &str,
    ) -> Result<i32, TgError> {
        use super::inbound::APPROVAL_BUTTON;
        let buttons = [
            ("Approve", 'a'),
            ("Always in this session", 's'),
            ("Deny", 'd'),
        ]
        .map(|(label, what)| (label.to_string(), format!("{APPROVAL_BUTTON}{id}:{what}")));
        self.send_with_buttons(chat_id, text, &buttons).await
    }

    /// Replaces the text of message `message_id` and removes its inline keyboard (an
    /// approval prompt once decided). Once, no retry.
    pub async fn edit_text(
        &self,
        chat_id: i64,
        message_id: i32,
        text: &str,
    ) -> Result<(), TgError> {
        let body = serde_json::json!({
            "chat_id": chat_id,
            "message_id": message_id,
            "text": text,
            "reply_markup": { "inline_keyboard": [] },
        });
        self.call_raw("editMessageText", RawBody::json(&body))
            .await
            .map(|_| ())
    }
}

/// A raw request body and its content type.
struct RawBody {
    content_type: String,
    bytes: Vec<u8>,
}

impl RawBody {
    fn json(v: &serde_json::Value) -> RawBody {
        RawBody {
            content_type: "application/json".into(),
            bytes: serde_json::to_vec(v).unwrap_or_default(),
        }
    }

    /// `multipart/form-data` (RFC 7578): the text `fields`, then the file as part `file_field`
    /// named `file_name`. The boundary is random and, checked, absent from the content.
    fn multipart(
        fields: &[(&str, &str)],
        file_field: &str,
        file_name: &str,
        file: &[u8],
    ) -> RawBody {
        let mut boundary = format!("agentd-{}", uuid::Uuid::new_v4().simple());
        while contains(file, boundary.as_bytes())
            || fields.iter().any(|(_, v)| v.contains(&boundary))
        {
            boundary = format!("agentd-{}", uuid::Uuid::new_v4().simple());
        }
        let mut body = Vec::with_capacity(file.len() + 512);
        for (name, value) in fields {
            body.extend_from_slice(
                format!(
                    "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
                )
                .as_bytes(),
            );
        }
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{file_field}\"; filename=\"{file_name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(file);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        RawBody {
            content_type: format!("multipart/form-data; boundary={boundary}"),
            bytes: body,
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// The `message_id` of a sent message (`result` of sendMessage, sendPhoto, …).
fn message_id(result: &serde_json::Value, method: &str) -> Result<i32, TgError> {
    result
        .get("message_id")
        .and_then(serde_json::Value::as_i64)
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| TgError::InvalidResponse(format!("{method} answered without a message")))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const TOKEN: &str = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw";

    fn cfg(api_url: &str) -> TelegramConfig {
        TelegramConfig {
            enabled: true,
            token_env: "AGENTD_TELEGRAM_TOKEN".into(),
            token: Some(SecretString::from(TOKEN)),
            api_url: api_url.into(),
            allow_from: vec![],
            contacts: BTreeMap::new(),
            text_chunk_limit: 4096,
            poll_timeout: Duration::from_secs(1),
            max_download_bytes: 1024,
            format: TelegramFormat::Html,
        }
    }

    #[test]
    fn scrub_removes_every_form_of_the_token() {
        let s = format!(
            "error sending request for url (http://h/bot{TOKEN}/GetUpdates) / bot{} / secret {}",
            TOKEN.replace(':', "%3A"),
            TOKEN.split_once(':').unwrap().1
        );
        let out = scrub_token(&s, TOKEN);
        assert!(!out.contains("AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"), "{out}");
        assert_eq!(out.matches("[redacted]").count(), 3, "{out}");
        assert!(out.contains("http://h/bot[redacted]/GetUpdates"), "{out}");
        assert_eq!(scrub_token("nothing here", TOKEN), "nothing here");
        assert_eq!(scrub_token("x", ""), "x");
    }

    #[test]
    fn file_names_are_safe_and_keep_the_extension() {
        assert_eq!(
            download_file_name(1700000000, "AgADxyz", "voice/file_3.oga"),
            "1700000000-AgADxyz.oga"
        );
        assert_eq!(
            download_file_name(1, "../../etc/passwd", "documents/file_9"),
            "1-etcpasswd.bin"
        );
        assert_eq!(download_file_name(1, "", "photos/a.JPG"), "1-file.jpg");
        assert_eq!(download_file_name(1, "u", "x.t/ar"), "1-u.bin");
    }

    proptest::proptest! {
        #[test]
        fn download_names_stay_inside_the_directory(uid in ".{0,80}", path in ".{0,80}") {
            let name = download_file_name(1_700_000_000, &uid, &path);
            proptest::prop_assert!(name.starts_with("1700000000-"));
            proptest::prop_assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)), "{}", name);
            proptest::prop_assert_eq!(name.matches('.').count(), 1);
            proptest::prop_assert!(!name.ends_with('.'));
        }

        #[test]
        fn scrubbed_text_never_holds_the_token(prefix in ".{0,40}", suffix in ".{0,40}") {
            let s = format!("{prefix}{TOKEN}{suffix}");
            proptest::prop_assert!(!scrub_token(&s, TOKEN).contains(TOKEN));
        }
    }

    #[test]
    fn missing_token_and_bad_url_are_config_errors() {
        let mut c = cfg("http://127.0.0.1:1");
        c.token = None;
        let e = TelegramClient::new(&c).unwrap_err();
        assert!(e.to_string().contains("AGENTD_TELEGRAM_TOKEN"), "{e}");
        let e = TelegramClient::new(&cfg("not a url")).unwrap_err();
        assert!(matches!(e, TgError::Config(_)), "{e:?}");
        assert!(!e.to_string().contains(TOKEN));
    }

    #[tokio::test]
    async fn network_errors_never_carry_the_token() {
        // Port 1 on loopback: connection refused, and reqwest's error names the URL.
        let client = TelegramClient::new(&cfg("http://127.0.0.1:1")).unwrap();
        assert_eq!(client.bot_id(), Some(123456789));
        let e = client
            .get_updates(0, Duration::from_secs(0))
            .await
            .unwrap_err();
        let text = format!("{e} {e:?}");
        assert!(matches!(e, TgError::Network(_)), "{text}");
        assert!(text.contains("Connection refused"), "{text}");
        assert!(!text.contains(TOKEN.split_once(':').unwrap().1), "{text}");
        assert!(!text.contains("127.0.0.1:1/bot"), "no URL: {text}");
        let e = client.send_typing(1).await.unwrap_err();
        assert!(!format!("{e:?}").contains(TOKEN), "{e:?}");
        let dir = tempfile::tempdir().unwrap();
        let e = client.download("f", dir.path(), 10).await.unwrap_err();
        assert!(!format!("{e:?}").contains(TOKEN), "{e:?}");
        assert!(!format!("{client:?}").contains(TOKEN));
    }

    /// Telegram's answer to `getUpdates` reaches the poller as messages (teloxide's `Update`
    /// only reads them from text).
    #[test]
    fn updates_parse_as_messages() {
        let text = r#"[{"update_id":5,"message":{"message_id":1,"date":1700000000,"chat":{"id":42,"type":"private","first_name":"A"},"from":{"id":42,"is_bot":false,"first_name":"A"},"text":"hi"}}]"#;
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        let updates: Vec<Update> = serde_json::from_str(&v.to_string()).unwrap();
        assert!(
            matches!(updates[0].kind, teloxide::types::UpdateKind::Message(_)),
            "{:?}",
            updates[0].kind
        );
    }

    #[tokio::test]
    async fn request_errors_that_name_the_url_are_scrubbed() {
        // A real reqwest error of the client's own HTTP client: its Debug form names the URL with
        // the token; whatever reaches TgError must not.
        let client = TelegramClient::new(&cfg("http://127.0.0.1:1")).unwrap();
        let url = format!("http://127.0.0.1:1/bot{TOKEN}/getMe");
        let raw = client.http.get(&url).send().await.unwrap_err();
        assert!(format!("{raw:?}").contains(TOKEN), "precondition: {raw:?}");
        assert!(!client.scrub(&format!("{raw:?}")).contains(TOKEN));
        let text = client.scrub_error(&raw, Some(&url));
        assert!(!text.contains(TOKEN), "{text}");
        assert!(!text.contains("/bot"), "no URL: {text}");
    }
}
