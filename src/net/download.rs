//! Downloads with a size cap (SPEC §19, §21): the body of an HTTP response streamed into a file
//! chunk by chunk, never held whole, stopped as soon as the bytes pass the cap. Used by every
//! channel that takes files (Telegram's `getFile`, Matrix media), whatever size the sender or
//! server declared.

use std::path::Path;

use futures::StreamExt;
use tokio::io::AsyncWriteExt;

/// Why a capped download stopped.
#[derive(Debug)]
pub enum StreamError {
    /// More than `max` bytes arrived (`got` so far).
    TooLarge { got: u64, max: u64 },
    /// The body could not be read (a dropped connection, a timeout).
    Network(reqwest::Error),
    /// The file could not be written.
    Io(std::io::Error),
}

/// Stream `response`'s body into `out` (the file at `path`), at most `max_bytes` bytes, then
/// flush and sync it; the number of bytes written. On any failure the partial file is removed
/// (a failed removal is logged).
pub async fn stream_capped(
    response: reqwest::Response,
    mut out: tokio::fs::File,
    path: &Path,
    max_bytes: u64,
) -> Result<u64, StreamError> {
    let written = copy_capped(response, &mut out, max_bytes).await;
    drop(out);
    if written.is_err()
        && let Err(e) = tokio::fs::remove_file(path).await
    {
        tracing::warn!(path = %path.display(), error = %e, "cannot remove a partial download");
    }
    written
}

async fn copy_capped(
    response: reqwest::Response,
    out: &mut tokio::fs::File,
    max_bytes: u64,
) -> Result<u64, StreamError> {
    let mut stream = response.bytes_stream();
    let mut total: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(StreamError::Network)?;
        total += chunk.len() as u64;
        if total > max_bytes {
            return Err(StreamError::TooLarge {
                got: total,
                max: max_bytes,
            });
        }
        out.write_all(&chunk).await.map_err(StreamError::Io)?;
    }
    out.flush().await.map_err(StreamError::Io)?;
    out.sync_all().await.map_err(StreamError::Io)?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// A one-shot HTTP server answering `body` in chunks, without a declared length.
    async fn serve(body: Vec<u8>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_string();
            let _ = s.write_all(head.as_bytes()).await;
            for part in body.chunks(4096) {
                let _ = s
                    .write_all(format!("{:x}\r\n", part.len()).as_bytes())
                    .await;
                let _ = s.write_all(part).await;
                let _ = s.write_all(b"\r\n").await;
            }
            let _ = s.write_all(b"0\r\n\r\n").await;
        });
        format!("http://{addr}/f")
    }

    async fn fetch(
        body: Vec<u8>,
        max: u64,
    ) -> (
        Result<u64, StreamError>,
        std::path::PathBuf,
        tempfile::TempDir,
    ) {
        let url = serve(body).await;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let out = tokio::fs::File::create(&path).await.unwrap();
        let http = crate::net::tls::client_builder().build().unwrap();
        let resp = http.get(&url).send().await.unwrap();
        (stream_capped(resp, out, &path, max).await, path, dir)
    }

    #[tokio::test]
    async fn a_body_under_the_cap_is_written_whole() {
        let body: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
        let (r, path, _dir) = fetch(body.clone(), 20_000).await;
        assert_eq!(r.unwrap(), 20_000);
        assert_eq!(std::fs::read(&path).unwrap(), body);
    }

    #[tokio::test]
    async fn a_body_over_the_cap_stops_and_leaves_no_file() {
        let (r, path, _dir) = fetch(vec![7u8; 50_000], 10_000).await;
        match r {
            Err(StreamError::TooLarge { got, max }) => {
                assert_eq!(max, 10_000);
                assert!(got > 10_000 && got < 50_000, "stopped early: {got}");
            }
            other => panic!("{other:?}"),
        }
        assert!(!path.exists(), "the partial file is removed");
    }
}
