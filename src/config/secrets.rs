//! The secrets one config holds, for the log layers to scrub (`redact::register`): the keys and
//! tokens, and the parts of every URL-valued key that may be credentials (docs/security.md).

use secrecy::ExposeSecret;

use super::types::{Config, McpTransport};

impl Config {
    /// Every URL-valued key's value: Telegram's `api_url`, `[http] callback_url`, the web
    /// search endpoint, each loaded model's `base_url` and each MCP server's `url`.
    pub fn url_values(&self) -> Vec<&str> {
        let mut urls = vec![
            self.telegram.api_url.as_str(),
            self.matrix.homeserver.as_str(),
            self.http.callback_url.as_str(),
            self.tools.web_search_base_url.as_str(),
        ];
        urls.extend(self.models.loaded.values().map(|m| m.base_url.as_str()));
        urls.extend(
            self.mcp_servers
                .values()
                .filter_map(|s| match &s.transport {
                    McpTransport::Http { url, .. } => Some(url.as_str()),
                    McpTransport::Stdio { .. } => None,
                }),
        );
        urls.retain(|u| !u.is_empty());
        urls
    }

    /// The keys, tokens and header values of this config, and the secret parts of its URLs
    /// (`redact::url_secrets`).
    pub fn secrets_to_scrub(&self) -> Vec<String> {
        let mut out: Vec<String> = [
            &self.telegram.token,
            &self.matrix.token,
            &self.matrix.password,
            &self.matrix.recovery_key,
            &self.http.token,
            &self.http.callback_token,
            &self.tools.web_search_key,
        ]
        .into_iter()
        .flatten()
        .map(|s| s.expose_secret().to_string())
        .collect();
        out.extend(
            self.models
                .loaded
                .values()
                .filter_map(|m| m.api_key.as_ref())
                .map(|k| k.expose_secret().to_string()),
        );
        for server in self.mcp_servers.values() {
            if let McpTransport::Http { headers, .. } = &server.transport {
                out.extend(headers.values().map(|v| {
                    let v = v.expose_secret();
                    v.strip_prefix("Bearer ").unwrap_or(v).to_string()
                }));
            }
        }
        for url in self.url_values() {
            out.extend(crate::redact::url_secrets(url));
        }
        out.retain(|s| !s.is_empty());
        out
    }
}
