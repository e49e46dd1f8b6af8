//! Errors of setting up the HTTP API (request errors are JSON answers, see `reply`).

/// Starting the HTTP API or its webhook failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The listening socket could not be bound.
    #[error(
        "cannot bind the HTTP API to {addr}: {source}; choose a free address with [http] host and port, or stop the process that holds it"
    )]
    Bind {
        /// `host:port` as configured.
        addr: String,
        source: std::io::Error,
    },
    /// The webhook's HTTP client could not be built.
    #[error("cannot build the webhook HTTP client: {0}")]
    WebhookClient(String),
}
