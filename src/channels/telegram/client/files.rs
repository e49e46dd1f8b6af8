//! Files over the Bot API: uploads (`sendPhoto`, `sendDocument`, … as one multipart request,
//! refused over [`MAX_UPLOAD_BYTES`] before anything is read) and downloads (`getFile`, then
//! streamed into a new 0600 file of a 0700 directory, bounded by size: `net::download`).

use std::path::{Path, PathBuf};

use secrecy::ExposeSecret;

use crate::net::download::StreamError;

use super::{FileKind, RawBody, TelegramClient, TgError, message_id};

/// The largest file a bot may upload (the Bot API's limit); larger ones are refused before
/// anything is read into memory.
pub const MAX_UPLOAD_BYTES: u64 = 50 * 1024 * 1024;

/// `<unix ts>-<file_unique_id>.<ext>`, with the extension taken from Telegram's file path
/// (`voice/file_3.oga` → `oga`; none → `bin`) and both parts reduced to safe characters.
pub fn download_file_name(unix_ts: i64, unique_id: &str, file_path: &str) -> String {
    let uid = match safe_part(unique_id, 64) {
        s if s.is_empty() => "file".to_string(),
        s => s,
    };
    let last = file_path.rsplit('/').next().unwrap_or("");
    let ext = last
        .rsplit_once('.')
        .map(|(_, e)| safe_part(e, 10).to_ascii_lowercase())
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| "bin".to_string());
    format!("{unix_ts}-{uid}.{ext}")
}

/// Keeps `[A-Za-z0-9_-]` of `s` (at most `max` characters).
fn safe_part(s: &str, max: usize) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(max)
        .collect()
}

impl TelegramClient {
    /// Sends the file at `path` as `kind`, with an optional caption, in one multipart request
    /// of our own (see [`Self::call_raw`]; no retry, no sleep after a 5xx); returns the message
    /// id. Files over [`MAX_UPLOAD_BYTES`] are refused before anything is sent.
    pub async fn send_file(
        &self,
        chat_id: i64,
        path: &Path,
        kind: FileKind,
        caption: Option<&str>,
    ) -> Result<i32, TgError> {
        let bytes = read_upload(path).await?;
        let (method, field) = match kind {
            FileKind::Photo => ("sendPhoto", "photo"),
            FileKind::Document => ("sendDocument", "document"),
            FileKind::Voice => ("sendVoice", "voice"),
            FileKind::Audio => ("sendAudio", "audio"),
        };
        let chat = chat_id.to_string();
        let mut fields = vec![("chat_id", chat.as_str())];
        if let Some(c) = caption {
            fields.push(("caption", c));
        }
        let name = upload_file_name(path);
        let body = RawBody::multipart(&fields, field, &name, &bytes);
        let sent = self.call_raw(method, body).await?;
        message_id(&sent, method)
    }

    /// Downloads the file `file_id` into `dest_dir` (created with mode 0700 if missing) as
    /// `<unix ts>-<file_unique_id>.<ext>`, mode 0600. Refused with [`TgError::TooLarge`] when
    /// `getFile` reports more than `max_bytes`, and stopped (the partial file removed) if more
    /// arrive while streaming.
    pub async fn download(
        &self,
        file_id: &str,
        dest_dir: &Path,
        max_bytes: u64,
    ) -> Result<PathBuf, TgError> {
        let body = serde_json::json!({ "file_id": file_id });
        let file = self.call_raw("getFile", RawBody::json(&body)).await?;
        let field = |k: &str| file.get(k).and_then(serde_json::Value::as_str);
        let (Some(unique_id), Some(file_path)) = (field("file_unique_id"), field("file_path"))
        else {
            return Err(TgError::InvalidResponse(
                "getFile answered without file_unique_id and file_path".into(),
            ));
        };
        if let Some(size) = file.get("file_size").and_then(serde_json::Value::as_u64)
            && size > max_bytes
        {
            return Err(TgError::TooLarge {
                size,
                max: max_bytes,
            });
        }
        let response = self.fetch_file(file_path).await?;
        create_dir_0700(dest_dir).await?;
        let name = download_file_name(chrono::Utc::now().timestamp(), unique_id, file_path);
        let (path, out) = create_new_0600(dest_dir, &name).await?;
        match crate::net::download::stream_capped(response, out, &path, max_bytes).await {
            Ok(_) => Ok(path),
            Err(StreamError::TooLarge { got, max }) => Err(TgError::TooLarge { size: got, max }),
            Err(StreamError::Network(e)) => Err(self.network_error(e.without_url(), None)),
            Err(StreamError::Io(e)) => {
                Err(TgError::Io(format!("cannot write {}: {e}", path.display())))
            }
        }
    }

    /// `GET <api_url>/file/bot<token>/<file_path>` (Telegram's path pushed as its segments):
    /// the answer, once its status is 200.
    async fn fetch_file(&self, file_path: &str) -> Result<reqwest::Response, TgError> {
        let mut url = self.api_url.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty();
            segments.push("file");
            segments.push(&format!("bot{}", self.token.expose_secret()));
            segments.extend(file_path.split('/').filter(|s| !s.is_empty() && *s != ".."));
        }
        let response = self
            .http
            .get(url.as_str())
            .send()
            .await
            .map_err(|e| self.network_error(e, Some(url.as_str())))?;
        let status = response.status().as_u16();
        if status != 200 {
            return Err(match status {
                401 => TgError::Unauthorized,
                500..=599 => TgError::Server(status),
                _ => TgError::Network(format!("the file download answered HTTP {status}")),
            });
        }
        Ok(response)
    }

    fn network_error(&self, e: reqwest::Error, url: Option<&str>) -> TgError {
        if e.is_timeout() {
            TgError::Timeout
        } else {
            TgError::Network(self.scrub_error(&e, url))
        }
    }
}

/// The file name an upload is announced with: the path's last component reduced to
/// `[A-Za-z0-9._-]` (no quote or line break can reach the multipart header), else `file`.
fn upload_file_name(path: &Path) -> String {
    let name: String = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c))
        .take(128)
        .collect();
    match name.trim_matches('.') {
        "" => "file".to_string(),
        n => n.to_string(),
    }
}

/// The bytes of a regular file of at most [`MAX_UPLOAD_BYTES`].
async fn read_upload(path: &Path) -> Result<Vec<u8>, TgError> {
    use tokio::io::AsyncReadExt;
    let io = |e: std::io::Error| TgError::Io(format!("cannot read {}: {e}", path.display()));
    let md = tokio::fs::metadata(path).await.map_err(io)?;
    if !md.is_file() {
        return Err(TgError::Io(format!("{} is not a file", path.display())));
    }
    let too_large = |size: u64| {
        TgError::Io(format!(
            "{} has {size} bytes; Telegram takes files up to {MAX_UPLOAD_BYTES} bytes",
            path.display()
        ))
    };
    if md.len() > MAX_UPLOAD_BYTES {
        return Err(too_large(md.len()));
    }
    let mut bytes = Vec::with_capacity(md.len() as usize);
    let f = tokio::fs::File::open(path).await.map_err(io)?;
    // The file may grow after the size check: never read past the limit.
    f.take(MAX_UPLOAD_BYTES + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(io)?;
    if bytes.len() as u64 > MAX_UPLOAD_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

async fn create_dir_0700(dir: &Path) -> Result<(), TgError> {
    let mut b = tokio::fs::DirBuilder::new();
    b.recursive(true).mode(0o700);
    b.create(dir)
        .await
        .map_err(|e| TgError::Io(format!("cannot create {}: {e}", dir.display())))
}

/// Creates `dir/name` (or `dir/<stem>-<n>.<ext>` if taken) exclusively with mode 0600.
async fn create_new_0600(dir: &Path, name: &str) -> Result<(PathBuf, tokio::fs::File), TgError> {
    let (stem, ext) = name.rsplit_once('.').unwrap_or((name, "bin"));
    for n in 0..100u32 {
        let candidate = if n == 0 {
            dir.join(name)
        } else {
            dir.join(format!("{stem}-{n}.{ext}"))
        };
        let opened = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&candidate)
            .await;
        match opened {
            Ok(f) => return Ok((candidate, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(TgError::Io(format!(
                    "cannot create {}: {e}",
                    candidate.display()
                )));
            }
        }
    }
    Err(TgError::Io(format!(
        "cannot create a free file name for {name} in {}",
        dir.display()
    )))
}
