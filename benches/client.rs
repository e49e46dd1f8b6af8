//! The HTTP side of the benchmarks: `POST /api/v1/chat` with keep-alive connections, timed
//! from before the request is written until the whole answer has been read.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::launch::HTTP_TOKEN;

#[derive(Clone)]
pub struct Chat {
    client: reqwest::Client,
    url: String,
}

impl Chat {
    pub fn new(base: &str) -> Result<Chat> {
        Ok(Chat {
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(64)
                .timeout(Duration::from_secs(120))
                .build()?,
            url: format!("{base}/api/v1/chat"),
        })
    }

    /// Sends one message from `sender` (session `http-<sender>`); returns the round trip and
    /// the answer.
    pub async fn send(&self, sender: &str, text: &str) -> Result<(Duration, Value)> {
        let body = json!({"message": text, "sender": sender});
        let t0 = Instant::now();
        let resp = self
            .client
            .post(&self.url)
            .bearer_auth(HTTP_TOKEN)
            .json(&body)
            .send()
            .await
            .context("POST /api/v1/chat")?;
        let status = resp.status();
        let bytes = resp.bytes().await?;
        let took = t0.elapsed();
        if !status.is_success() {
            bail!(
                "/api/v1/chat answered {status}: {}",
                String::from_utf8_lossy(&bytes)
            );
        }
        let v: Value = serde_json::from_slice(&bytes)?;
        if v.get("reply").is_none() {
            bail!("/api/v1/chat answered without a reply: {v}");
        }
        Ok((took, v))
    }

    pub async fn get(&self, path: &str) -> Result<Value> {
        let base = self.url.trim_end_matches("/api/v1/chat");
        let resp = self
            .client
            .get(format!("{base}{path}"))
            .bearer_auth(HTTP_TOKEN)
            .send()
            .await?;
        Ok(resp.json().await?)
    }

    /// `GET path` as text (e.g. `/metrics`). Tried twice: after seconds of quiet the server
    /// may close a pooled keep-alive connection just as the client reuses it.
    pub async fn get_text(&self, path: &str) -> Result<String> {
        let base = self.url.trim_end_matches("/api/v1/chat");
        let url = format!("{base}{path}");
        let resp = match self.client.get(&url).bearer_auth(HTTP_TOKEN).send().await {
            Ok(r) => r,
            Err(_) => self.client.get(&url).bearer_auth(HTTP_TOKEN).send().await?,
        };
        Ok(resp.text().await?)
    }
}

/// A current-thread runtime for the client side (the daemon gets the other core).
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
