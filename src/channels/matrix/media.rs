//! Media downloads (SPEC §21): our own streaming `GET` of the authenticated media endpoint
//! (`/_matrix/client/v1/media/download/{server}/{media id}`), written chunk by chunk into a new
//! 0600 file and stopped as soon as the bytes pass the cap (`net::download`), whatever size the
//! event declared. An encrypted file's ciphertext is streamed the same way into a temporary
//! file, then decrypted file to file by the SDK's streaming `AttachmentDecryptor` (which checks
//! the hash at the end) on a blocking thread; the ciphertext is removed either way.

use std::path::{Path, PathBuf};
use std::time::Duration;

use matrix_sdk::ruma::MxcUri;
use matrix_sdk::ruma::events::room::EncryptedFile;

use super::client::{MxClient, MxError, one_line, status_error};
use crate::net::download::{StreamError, stream_capped};

/// How long one download may take in all.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// An event's media, for [`MxClient::download`].
pub struct Media<'a> {
    pub event_id: &'a str,
    /// The event's `url` (a string) or encrypted `file` (an object).
    pub source: &'a serde_json::Value,
    pub size: Option<u64>,
    /// The sender's file name (its extension is kept).
    pub body: &'a str,
    pub default_ext: &'static str,
}

impl Media<'_> {
    /// `<unix ts>-<event id's safe characters>.<ext>`: inside the directory whatever the sender
    /// named it.
    pub fn file_name(&self) -> String {
        let safe = |s: &str, max: usize| -> String {
            s.chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .take(max)
                .collect()
        };
        let ext = self
            .body
            .rsplit_once('.')
            .map(|(_, e)| safe(e, 10).to_ascii_lowercase())
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| self.default_ext.to_string());
        let id = match safe(self.event_id, 64) {
            s if s.is_empty() => "file".to_string(),
            s => s,
        };
        format!("{}-{id}.{ext}", chrono::Utc::now().timestamp())
    }
}

fn too_large(max: u64) -> String {
    format!("the file has more than {max} bytes; at most {max} are taken")
}

impl MxClient {
    /// Download the media of `media` (an event's `url`, or its encrypted `file`, decrypted)
    /// into `dest_dir` (0700) as a new 0600 file `<unix ts>-<event>.<ext>`. Refused when the
    /// declared size passes `max_bytes`, and stopped (nothing left behind) as soon as the bytes
    /// received do.
    pub async fn download(
        &self,
        media: &Media<'_>,
        dest_dir: &Path,
        max_bytes: u64,
    ) -> Result<PathBuf, String> {
        if let Some(size) = media.size
            && size > max_bytes
        {
            return Err(format!(
                "the file has {size} bytes; at most {max_bytes} are taken"
            ));
        }
        let (mxc, encrypted) = match media.source {
            serde_json::Value::String(url) => (url.clone(), None),
            other => {
                let file: EncryptedFile = serde_json::from_value(other.clone())
                    .map_err(|e| format!("unreadable encrypted file: {e}"))?;
                (file.url.to_string(), Some(file))
            }
        };
        let response = self.media_get(&mxc).await.map_err(|e| e.to_string())?;
        crate::fsutil::create_private_dir(dest_dir)
            .map_err(|e| format!("cannot create {}: {e}", dest_dir.display()))?;
        let name = media.file_name();
        let path = dest_dir.join(&name);
        let Some(file) = encrypted else {
            save(response, &path, max_bytes).await?;
            return Ok(path);
        };
        let cipher = dest_dir.join(format!(".{name}.encrypted"));
        save(response, &cipher, max_bytes).await?;
        let decrypt = {
            let (cipher, path) = (cipher.clone(), path.clone());
            move || decrypt_file(&cipher, &path, file)
        };
        let decrypted = tokio::task::spawn_blocking(decrypt)
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
        if let Err(e) = std::fs::remove_file(&cipher) {
            tracing::warn!(path = %cipher.display(), error = %e, "matrix: cannot remove a downloaded ciphertext");
        }
        decrypted.map(|()| path)
    }

    /// `GET` the media `mxc` (`mxc://server/id`) from the authenticated endpoint: the answer,
    /// once its status is 200.
    async fn media_get(&self, mxc: &str) -> Result<reqwest::Response, MxError> {
        let uri: &MxcUri = mxc.into();
        let (server, id) = uri
            .parts()
            .map_err(|_| MxError::Fatal(format!("{mxc:?} is not an mxc:// URI")))?;
        let mut url = self.sdk.homeserver();
        url.path_segments_mut()
            .map_err(|()| MxError::Fatal("the homeserver URL cannot take a path".into()))?
            .pop_if_empty()
            .extend(["_matrix", "client", "v1", "media", "download"])
            .push(server.as_str())
            .push(id);
        let token = self.sdk.access_token().unwrap_or_default();
        let resp = self
            .http
            .get(url)
            .bearer_auth(token)
            .timeout(DOWNLOAD_TIMEOUT)
            .send()
            .await
            .map_err(|e| MxError::Retry {
                after: None,
                error: format!(
                    "the media download failed: {}",
                    one_line(&crate::net::scrub::reqwest_error_text(e))
                ),
            })?;
        let status = resp.status().as_u16();
        if status == 200 {
            return Ok(resp);
        }
        let body: serde_json::Value = resp.json().await.unwrap_or_default();
        Err(status_error(status, &body, "the media download"))
    }
}

/// Stream `response` into the new 0600 file `path`, at most `max_bytes`.
async fn save(response: reqwest::Response, path: &Path, max_bytes: u64) -> Result<u64, String> {
    let out = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .await
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    stream_capped(response, out, path, max_bytes)
        .await
        .map_err(|e| match e {
            StreamError::TooLarge { max, .. } => too_large(max),
            StreamError::Network(e) => format!(
                "the media download failed: {}",
                one_line(&crate::net::scrub::reqwest_error_text(e))
            ),
            StreamError::Io(e) => format!("cannot write {}: {e}", path.display()),
        })
}

/// Decrypt the ciphertext at `cipher` into the new 0600 file `plain` (removed again when the
/// key or the hash does not match).
fn decrypt_file(cipher: &Path, plain: &Path, file: EncryptedFile) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut input = std::io::BufReader::new(
        std::fs::File::open(cipher)
            .map_err(|e| format!("cannot read {}: {e}", cipher.display()))?,
    );
    let mut decryptor = matrix_sdk_crypto::AttachmentDecryptor::new(&mut input, file.into())
        .map_err(|e| format!("cannot decrypt the file: {e}"))?;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(plain)
        .map_err(|e| format!("cannot create {}: {e}", plain.display()))?;
    let written = std::io::copy(&mut decryptor, &mut out)
        .and_then(|_| out.flush())
        .and_then(|()| out.sync_all());
    if let Err(e) = written {
        drop(out);
        let _ = std::fs::remove_file(plain);
        return Err(format!("cannot decrypt the file: {e}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn download_names_stay_inside_the_directory() {
        let v = serde_json::Value::Null;
        let m = Media {
            event_id: "$ab/../c:x",
            source: &v,
            size: None,
            body: "../../x.PNG",
            default_ext: "bin",
        };
        let name = m.file_name();
        assert!(name.ends_with("-abcx.png"), "{name}");
        assert!(!name.contains('/'));
        let m = Media {
            event_id: "$e",
            source: &v,
            size: None,
            body: "voice",
            default_ext: "ogg",
        };
        assert!(m.file_name().ends_with("-e.ogg"));
    }
}
