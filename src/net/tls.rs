//! The one TLS crypto provider (issue 14: one provider linked into the binary). reqwest 0.13
//! is built with `rustls-no-provider` and rmcp with `reqwest-tls-no-provider`, so the binary
//! does not carry aws-lc-rs beside the ring that teloxide's reqwest 0.12 needs; ring is
//! installed as rustls's process-wide default instead. Every entry point that may build an
//! HTTPS client calls [`install`] first (`bin/agentd.rs`, `bin/bench.rs`); building a reqwest
//! client before it panics, which no test can miss.

use std::sync::Once;

/// Install ring as the process's rustls provider (once; later calls do nothing).
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Err only when a provider is installed already, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
