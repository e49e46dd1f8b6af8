//! `web_search` (SPEC §11): the Brave Search API. Registered only when a key is configured
//! (`AGENTD_BRAVE_KEY`). The endpoint is configuration, not model input, so the query never
//! chooses the host; results are marked as untrusted content.

use std::time::Duration;

use futures::future::BoxFuture;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError};
use crate::llm::ToolSpec;
use crate::net::scrub::reqwest_error_text;

pub struct WebSearchTool {
    pub base_url: String,
    pub key: SecretString,
    pub http: reqwest::Client,
}

impl WebSearchTool {
    pub fn new(base_url: &str, key: SecretString) -> WebSearchTool {
        let http = crate::net::tls::client_builder()
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap_or_default();
        WebSearchTool {
            base_url: base_url.to_string(),
            key,
            http,
        }
    }
}

/// `web.results[]` of a Brave answer as `title — url\n  description` lines.
pub fn render_results(v: &Value) -> String {
    let mut out = Vec::new();
    for (n, r) in v["web"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        out.push(format!(
            "{}. {} — {}\n   {}",
            n + 1,
            r["title"].as_str().unwrap_or(""),
            r["url"].as_str().unwrap_or(""),
            r["description"].as_str().unwrap_or("")
        ));
    }
    if out.is_empty() {
        "no results".to_string()
    } else {
        out.join("\n")
    }
}

impl Tool for WebSearchTool {
    /// Search results are web data: marked untrusted by the registry.
    fn untrusted_output(&self) -> bool {
        true
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "web_search".into(),
            description: "Search the web (Brave Search). Returns titles, URLs and snippets; fetch a page with web_fetch.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 1, "maxLength": 400},
                    "count": {"type": "integer", "minimum": 1, "maximum": 20}
                },
                "required": ["query"],
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(
        &'a self,
        args: Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let query = args["query"].as_str().unwrap_or_default();
            let count = args["count"].as_u64().unwrap_or(5).to_string();
            let mut url = reqwest::Url::parse(&self.base_url).map_err(|e| {
                ToolError::Failed(format!("[tools] web_search.base_url is not a URL: {e}"))
            })?;
            url.query_pairs_mut()
                .append_pair("q", query)
                .append_pair("count", &count);
            let resp = self
                .http
                .get(url)
                .header("Accept", "application/json")
                .header("X-Subscription-Token", self.key.expose_secret())
                .send()
                .await
                // Without the URL: it carries the query, and errors reach the model and logs.
                .map_err(|e| {
                    ToolError::Failed(format!("search request failed: {}", reqwest_error_text(e)))
                })?;
            let status = resp.status();
            if !status.is_success() {
                return Err(ToolError::Failed(format!(
                    "search API answered HTTP {}",
                    status.as_u16()
                )));
            }
            let v: Value = resp.json().await.map_err(|e| {
                ToolError::Failed(format!(
                    "search API answer unreadable: {}",
                    reqwest_error_text(e)
                ))
            })?;
            // Marked untrusted by the registry (`untrusted_output`).
            Ok(render_results(&v))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_brave_results() {
        let v = json!({"web": {"results": [
            {"title": "Rust", "url": "https://www.rust-lang.org/", "description": "A language"},
            {"title": "Tokio", "url": "https://tokio.rs/", "description": "Async runtime"}
        ]}});
        let t = render_results(&v);
        assert_eq!(
            t,
            "1. Rust — https://www.rust-lang.org/\n   A language\n2. Tokio — https://tokio.rs/\n   Async runtime"
        );
        assert_eq!(render_results(&json!({})), "no results");
    }
}
