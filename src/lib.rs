//! agentd — an always-on AI agent daemon.
//!
//! Codemap: see `docs/ARCHITECTURE.md`. In short: `config/` turns TOML into typed config,
//! `llm/` talks to providers, `agent/` runs one message end to end, `session/` persists
//! conversations, `store/` owns SQLite, `daemon/` wires everything and owns the lifecycle,
//! `channels/` are the message sources, `control` is the FIFO line protocol shared with
//! `agent-send`.

/// What `--version` prints after the program's name: the package version, the git commit it
/// was built from (`unknown` when built without git) and the build's cargo features (set by
/// `build.rs`).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("AGENTD_GIT_COMMIT"),
    ", features: ",
    env!("AGENTD_BUILD_FEATURES"),
    ")"
);

pub mod agent;
pub mod api;
pub mod backoff;
pub mod backup;
pub mod channels;
pub mod cli;
pub mod config;
pub mod control;
pub mod cost;
pub mod daemon;
pub mod doctor;
pub mod fsutil;
pub mod gateway;
pub mod latest_writer;
pub mod llm;
pub mod memory;
pub mod message;
pub mod metrics;
pub mod monitor;
pub mod net;
pub mod redact;
pub mod report;
pub mod sandbox;
pub mod scheduler;
pub mod session;
pub mod skills;
pub mod store;
pub mod telemetry;
pub mod tools;
pub mod zone;

#[cfg(test)]
pub(crate) mod proptest_json;
