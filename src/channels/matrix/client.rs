//! The Matrix client: log in (an access token, or a password whose device and token are kept
//! in `state_dir/matrix/session.json`, 0600, so a restart does not make a new device), the
//! SDK's SQLite stores in `state_dir/matrix/` (0700), and the calls the channel makes. HTTP
//! goes through our own reqwest client (`net::tls::client_builder`: the process's ring
//! provider and shared verifier), and the SDK never retries by itself: the sync loop and the
//! outbox decide about retries.

use std::path::{Path, PathBuf};
use std::time::Duration;

use matrix_sdk::config::RequestConfig;
use matrix_sdk::encryption::{BackupDownloadStrategy, EncryptionSettings};
use matrix_sdk::ruma::api::error::{ErrorKind, RetryAfter};
use matrix_sdk::ruma::{OwnedDeviceId, OwnedUserId, RoomId, UserId};
use matrix_sdk::{Client, Room};
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};

use crate::config::MatrixConfig;

/// How long one request may take (a sync's long-poll timeout is added to it).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a Matrix call failed. Texts are one line, without secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MxError {
    /// The homeserver refused the token (`M_UNKNOWN_TOKEN`, `M_MISSING_TOKEN`): nothing works
    /// until the operator sets a new one.
    Unauthorized(String),
    /// Worth another try (a connection error, a timeout, 5xx, 429), not before `after` when
    /// the server said so (`retry_after_ms`).
    Retry {
        after: Option<Duration>,
        error: String,
    },
    /// Refused for good (4xx, a bad id, a broken store).
    Fatal(String),
}

impl std::fmt::Display for MxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MxError::Unauthorized(e) | MxError::Fatal(e) => f.write_str(e),
            MxError::Retry { error, .. } => f.write_str(error),
        }
    }
}

impl From<matrix_sdk::Error> for MxError {
    fn from(e: matrix_sdk::Error) -> MxError {
        let text = one_line(&e.to_string());
        match &e {
            matrix_sdk::Error::Http(h) => classify_http(h, text),
            _ => MxError::Fatal(text),
        }
    }
}

impl From<matrix_sdk::HttpError> for MxError {
    fn from(e: matrix_sdk::HttpError) -> MxError {
        let text = one_line(&e.to_string());
        classify_http(&e, text)
    }
}

pub(super) fn one_line(s: &str) -> String {
    let s = s.replace(['\n', '\r'], " ");
    s.chars().take(300).collect()
}

/// What an HTTP failure means: the errcode first, then the status, then the transport.
fn classify_http(e: &matrix_sdk::HttpError, text: String) -> MxError {
    if let Some(api) = e.as_client_api_error() {
        match api.error_kind() {
            Some(ErrorKind::UnknownToken(_) | ErrorKind::MissingToken) => {
                return MxError::Unauthorized(text);
            }
            Some(ErrorKind::LimitExceeded(data)) => {
                let after = match &data.retry_after {
                    Some(RetryAfter::Delay(d)) => Some(*d),
                    Some(RetryAfter::DateTime(t)) => {
                        t.duration_since(std::time::SystemTime::now()).ok()
                    }
                    None => None,
                };
                return MxError::Retry { after, error: text };
            }
            _ => {}
        }
        let status = api.status_code.as_u16();
        return match status {
            429 | 500..=599 => MxError::Retry {
                after: None,
                error: text,
            },
            401 => MxError::Unauthorized(text),
            _ => MxError::Fatal(text),
        };
    }
    match e {
        matrix_sdk::HttpError::Reqwest(_) => MxError::Retry {
            after: None,
            error: text,
        },
        matrix_sdk::HttpError::Cached(inner) => classify_http(inner, text),
        // An answer that is not the API's (a proxy's error page): tried again.
        matrix_sdk::HttpError::Api(_) => MxError::Retry {
            after: None,
            error: text,
        },
        _ => MxError::Fatal(text),
    }
}

/// The login kept after a password login (`session.json`, 0600).
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    homeserver: String,
    user_id: String,
    device_id: String,
    access_token: String,
}

/// The channel's client: the SDK's, logged in, with its stores open.
#[derive(Clone)]
pub struct MxClient {
    pub sdk: Client,
    pub http: reqwest::Client,
    pub user_id: OwnedUserId,
    pub device_id: OwnedDeviceId,
}

/// The directory of the SDK's stores and the saved login.
pub fn store_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("matrix")
}

/// Our reqwest client for the SDK and our own calls.
pub fn http_client() -> Result<reqwest::Client, MxError> {
    crate::net::tls::client_builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| MxError::Fatal(format!("cannot build the HTTP client: {e}")))
}

/// `GET /account/whoami` with `token`: the token's user and device.
pub async fn whoami(
    http: &reqwest::Client,
    homeserver: &str,
    token: &str,
) -> Result<(String, Option<String>), MxError> {
    let url = format!("{homeserver}/_matrix/client/v3/account/whoami");
    let resp = http
        .get(&url)
        .bearer_auth(token)
        .timeout(REQUEST_TIMEOUT)
        .send()
        .await
        .map_err(|e| MxError::Retry {
            after: None,
            error: format!(
                "cannot reach the homeserver {homeserver}: {}",
                one_line(&e.without_url().to_string())
            ),
        })?;
    let status = resp.status().as_u16();
    let body: serde_json::Value = resp.json().await.unwrap_or_default();
    if status != 200 {
        return Err(status_error(status, &body, "whoami"));
    }
    let user = body.get("user_id").and_then(|v| v.as_str()).unwrap_or("");
    let device = body.get("device_id").and_then(|v| v.as_str());
    Ok((user.to_string(), device.map(str::to_string)))
}

/// What a non-200 answer of our own requests means (`body` the error JSON, if any): a refused
/// token is `Unauthorized`, 429 (with its `retry_after_ms`) and 5xx are worth a retry, the
/// rest is refused for good.
pub fn status_error(status: u16, body: &serde_json::Value, what: &str) -> MxError {
    let errcode = body.get("errcode").and_then(|v| v.as_str()).unwrap_or("");
    match status {
        401 | 403
            if errcode == "M_UNKNOWN_TOKEN" || errcode == "M_MISSING_TOKEN" || status == 401 =>
        {
            MxError::Unauthorized(format!(
                "the homeserver refused the access token ({errcode})"
            ))
        }
        429 | 500..=599 => MxError::Retry {
            after: body
                .get("retry_after_ms")
                .and_then(|v| v.as_u64())
                .map(Duration::from_millis),
            error: format!("{what} answered HTTP {status}"),
        },
        _ => MxError::Fatal(one_line(&format!(
            "{what} answered HTTP {status} {errcode}"
        ))),
    }
}

impl MxClient {
    /// Open the stores and log in (SPEC §21): with the access token, the device is the
    /// token's (whoami); with the password, the saved login is restored, or the first login
    /// made and saved.
    pub async fn connect(cfg: &MatrixConfig, state_dir: &Path) -> Result<MxClient, MxError> {
        let dir = store_dir(state_dir);
        crate::fsutil::create_private_dir(&dir)
            .map_err(|e| MxError::Fatal(format!("cannot create {}: {e}", dir.display())))?;
        let _ = crate::fsutil::tighten_private_dir(&dir);
        let http = http_client()?;
        let sdk = Client::builder()
            .homeserver_url(&cfg.homeserver)
            .http_client(http.clone())
            .sqlite_store(&dir, None)
            .request_config(
                RequestConfig::new()
                    .disable_retry()
                    .timeout(REQUEST_TIMEOUT),
            )
            .with_encryption_settings(EncryptionSettings {
                auto_enable_cross_signing: false,
                backup_download_strategy: BackupDownloadStrategy::AfterDecryptionFailure,
                auto_enable_backups: false,
            })
            .build()
            .await
            .map_err(|e| {
                MxError::Fatal(format!(
                    "cannot open the Matrix client: {}",
                    one_line(&e.to_string())
                ))
            })?;
        if let Some(session) = login(cfg, &sdk, &http, &dir).await? {
            let device_id = session.meta.device_id.clone();
            sdk.matrix_auth()
                .restore_session(session, matrix_sdk::store::RoomLoadSettings::default())
                .await
                .map_err(|e| {
                    MxError::Fatal(format!(
                        "cannot restore the Matrix session of device {device_id}: {} (a store of another device is in {}: move it away to start afresh)",
                        one_line(&e.to_string()),
                        dir.display()
                    ))
                })?;
        }
        let (Some(user_id), Some(device_id)) = (sdk.user_id(), sdk.device_id()) else {
            return Err(MxError::Fatal("the Matrix login left no session".into()));
        };
        let (user_id, device_id) = (user_id.to_owned(), device_id.to_owned());
        Ok(MxClient {
            sdk,
            http,
            user_id,
            device_id,
        })
    }

    /// Room `id` if the bot is in it (or invited).
    pub fn room(&self, id: &str) -> Result<Room, MxError> {
        let room_id =
            RoomId::parse(id).map_err(|_| MxError::Fatal(format!("{id:?} is not a room id")))?;
        self.sdk
            .get_room(&room_id)
            .ok_or_else(|| MxError::Fatal(format!("the bot is not in room {id}")))
    }

    /// The room of address chat `target`: a room id, or a user id whose direct chat is used
    /// (made when there is none).
    pub async fn room_for(&self, target: &str) -> Result<Room, MxError> {
        if !target.starts_with('@') {
            return self.room(target);
        }
        let user = UserId::parse(target)
            .map_err(|_| MxError::Fatal(format!("{target:?} is not a user id")))?;
        if let Some(room) = self.sdk.get_dm_room(&user) {
            return Ok(room);
        }
        Ok(self.sdk.create_dm(&user).await?)
    }
}

impl MxClient {
    /// Mark `event_id` of `room_id` read (failures are only logged).
    pub async fn read_receipt(&self, room_id: &str, event_id: &str) {
        use matrix_sdk::ruma::api::client::receipt::create_receipt::v3::ReceiptType;
        use matrix_sdk::ruma::events::receipt::ReceiptThread;
        let (Ok(room), Ok(event)) = (
            self.room(room_id),
            matrix_sdk::ruma::EventId::parse(event_id),
        ) else {
            return;
        };
        if let Err(e) = room
            .send_single_receipt(ReceiptType::Read, ReceiptThread::Unthreaded, event)
            .await
        {
            tracing::debug!(error = %e, "matrix: read receipt failed");
        }
    }

    /// Whether this device is verified (cross-signed by its owner); `None` when unknown.
    pub async fn device_verified(&self) -> Option<bool> {
        let device = self.sdk.encryption().get_own_device().await.ok()??;
        Some(device.is_cross_signed_by_owner())
    }

    /// Recover the cross-signing and backup keys with the account's recovery key, which
    /// verifies this device (docs/matrix.md).
    pub async fn recover(&self, key: &str) -> Result<(), String> {
        self.sdk
            .encryption()
            .recovery()
            .recover(key)
            .await
            .map_err(|e| one_line(&e.to_string()))
    }
}

/// What `doctor` learns of the Matrix account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The account, its device and the homeserver, or why the check was skipped.
    pub account: String,
    /// Whether the device is verified (cross-signed), with the line to show; `None` when
    /// there is no device yet.
    pub device: Option<(bool, String)>,
}

/// For `doctor`: the homeserver answers and the token (or the saved login's) is valid; which
/// device it is and whether it is cross-signed (`keys/query`).
pub async fn probe(cfg: &MatrixConfig, state_dir: &Path) -> Result<Probe, String> {
    let http = http_client().map_err(|e| e.to_string())?;
    let saved = std::fs::read(store_dir(state_dir).join("session.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Saved>(&b).ok());
    let (token, var) = match (&cfg.token, &saved) {
        (Some(t), _) => (t.expose_secret().to_string(), cfg.token_env.as_str()),
        (None, Some(s)) => (s.access_token.clone(), "the saved login"),
        (None, None) => {
            return Ok(Probe {
                account: format!(
                    "{} reachable check skipped: no token yet (the daemon logs in with {} at start)",
                    cfg.homeserver, cfg.password_env
                ),
                device: None,
            });
        }
    };
    let (user, device) = match whoami(&http, &cfg.homeserver, &token).await {
        Ok(found) => found,
        Err(MxError::Unauthorized(e)) => return Err(format!("{e}: set a valid token in {var}")),
        Err(e) => return Err(e.to_string()),
    };
    let account = format!(
        "{user}, device {} on {}",
        device.as_deref().unwrap_or("?"),
        cfg.homeserver
    );
    let Some(device) = device else {
        return Ok(Probe {
            account,
            device: None,
        });
    };
    let verified = match device_keys(&http, &cfg.homeserver, &token, &user, &device).await {
        Ok(keys) if cross_signed(&keys, &user, &device) => {
            (true, format!("device {device} verified (cross-signed)"))
        }
        Ok(_) => (
            false,
            format!("device {device} not verified: see docs/matrix.md (recovery key)"),
        ),
        Err(e) => (
            false,
            format!("device {device}: cannot tell whether it is verified: {e}"),
        ),
    };
    Ok(Probe {
        account,
        device: Some(verified),
    })
}

/// `POST /keys/query` for `device` of `user`: the answer's JSON.
async fn device_keys(
    http: &reqwest::Client,
    homeserver: &str,
    token: &str,
    user: &str,
    device: &str,
) -> Result<serde_json::Value, MxError> {
    let url = format!("{homeserver}/_matrix/client/v3/keys/query");
    let resp = http
        .post(&url)
        .bearer_auth(token)
        .timeout(REQUEST_TIMEOUT)
        .json(&serde_json::json!({ "device_keys": { user: [device] } }))
        .send()
        .await
        .map_err(|e| MxError::Retry {
            after: None,
            error: one_line(&crate::net::scrub::reqwest_error_text(e)),
        })?;
    let status = resp.status().as_u16();
    let body: serde_json::Value = resp.json().await.unwrap_or_default();
    if status != 200 {
        return Err(status_error(status, &body, "keys/query"));
    }
    Ok(body)
}

/// Whether a `keys/query` answer shows `device` of `user` cross-signed: its device keys carry
/// a signature by the user's self-signing key (`self_signing_keys[user].keys`' key id among
/// `device_keys[user][device].signatures[user]`).
pub fn cross_signed(keys: &serde_json::Value, user: &str, device: &str) -> bool {
    let Some(self_signing) = keys["self_signing_keys"][user]["keys"].as_object() else {
        return false;
    };
    let signatures = &keys["device_keys"][user][device]["signatures"][user];
    self_signing
        .keys()
        .any(|id| signatures.get(id).is_some_and(|sig| sig.is_string()))
}

/// The session to restore: from the token (whoami) or the saved login; `None` after a first
/// login, which set the SDK's session itself.
async fn login(
    cfg: &MatrixConfig,
    sdk: &Client,
    http: &reqwest::Client,
    dir: &Path,
) -> Result<Option<matrix_sdk::authentication::matrix::MatrixSession>, MxError> {
    use matrix_sdk::SessionMeta;
    use matrix_sdk::SessionTokens;
    use matrix_sdk::authentication::matrix::MatrixSession;
    let session = |user: &str, device: &str, token: String| -> Result<MatrixSession, MxError> {
        Ok(MatrixSession {
            meta: SessionMeta {
                user_id: UserId::parse(user)
                    .map_err(|_| MxError::Fatal(format!("{user:?} is not a user id")))?,
                device_id: device.into(),
            },
            tokens: SessionTokens {
                access_token: token,
                refresh_token: None,
            },
        })
    };
    if let Some(token) = &cfg.token {
        let (user, device) = whoami(http, &cfg.homeserver, token.expose_secret()).await?;
        if user != cfg.user_id {
            return Err(MxError::Fatal(format!(
                "the access token in {} belongs to {user}, not to [matrix] user_id {}; set user_id = \"{user}\" or give {}'s token",
                cfg.token_env, cfg.user_id, cfg.user_id
            )));
        }
        let Some(device) =
            device.or_else(|| (!cfg.device_id.is_empty()).then(|| cfg.device_id.clone()))
        else {
            return Err(MxError::Fatal(
                "the homeserver did not name the token's device; set [matrix] device_id".into(),
            ));
        };
        if !cfg.device_id.is_empty() && cfg.device_id != device {
            return Err(MxError::Fatal(format!(
                "[matrix] device_id is {} but the token in {} is of device {device}; set device_id = \"{device}\" or remove it",
                cfg.device_id, cfg.token_env
            )));
        }
        return session(&user, &device, token.expose_secret().to_string()).map(Some);
    }
    let Some(password) = &cfg.password else {
        return Err(MxError::Fatal(format!(
            "neither {} nor {} is set",
            cfg.token_env, cfg.password_env
        )));
    };
    let path = dir.join("session.json");
    if let Ok(bytes) = std::fs::read(&path)
        && let Ok(saved) = serde_json::from_slice::<Saved>(&bytes)
        && saved.user_id == cfg.user_id
        && saved.homeserver == cfg.homeserver
        && (cfg.device_id.is_empty() || cfg.device_id == saved.device_id)
    {
        return session(&saved.user_id, &saved.device_id, saved.access_token).map(Some);
    }
    let mut builder = sdk
        .matrix_auth()
        .login_username(&cfg.user_id, password.expose_secret())
        .initial_device_display_name("agentd");
    if !cfg.device_id.is_empty() {
        builder = builder.device_id(&cfg.device_id);
    }
    let resp = builder.send().await.map_err(|e| match MxError::from(e) {
        MxError::Fatal(e) => MxError::Fatal(format!(
            "password login of {} refused: {e}; check {}",
            cfg.user_id, cfg.password_env
        )),
        other => other,
    })?;
    let saved = Saved {
        homeserver: cfg.homeserver.clone(),
        user_id: resp.user_id.to_string(),
        device_id: resp.device_id.to_string(),
        access_token: resp.access_token.clone(),
    };
    let bytes = serde_json::to_vec(&saved).map_err(|e| MxError::Fatal(e.to_string()))?;
    crate::fsutil::atomic_write(&path, &bytes)
        .map_err(|e| MxError::Fatal(format!("cannot save the login in {}: {e}", path.display())))?;
    tracing::info!(device = %saved.device_id, "matrix: logged in with the password; the device is kept in {}", path.display());
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_is_cross_signed_when_the_self_signing_key_signed_it() {
        let (user, device, ssk) = ("@bot:x", "DEV", "ed25519:SSKPUB");
        let keys = |signed_by: &str| {
            serde_json::json!({
                "device_keys": { user: { device: { "signatures": { user: {
                    "ed25519:DEV": "self-signature",
                    signed_by: "sig",
                } } } } },
                "self_signing_keys": { user: { "keys": { ssk: "SSKPUB" }, "usage": ["self_signing"] } },
            })
        };
        assert!(cross_signed(&keys(ssk), user, device));
        assert!(
            !cross_signed(&keys("ed25519:OTHER"), user, device),
            "only its own signature"
        );
        let mut no_ssk = keys(ssk);
        no_ssk["self_signing_keys"] = serde_json::json!({});
        assert!(
            !cross_signed(&no_ssk, user, device),
            "no cross-signing set up"
        );
        assert!(!cross_signed(&keys(ssk), user, "OTHERDEV"));
        assert!(!cross_signed(&serde_json::json!({}), user, device));
    }

    #[test]
    fn errors_are_one_line() {
        assert_eq!(one_line("a\nb\rc"), "a b c");
        assert_eq!(one_line(&"x".repeat(1000)).len(), 300);
    }
}
