//! The single integration-test binary (one link instead of one per file). Test modules are
//! declared here; shared fakes and the daemon launcher live in `support/`.
// Test code: an unwrap that fails is the test failing, with its message (Cargo.toml [lints]).
#![allow(clippy::unwrap_used)]

mod support;

mod a2a;
mod addresses;
mod approvals;
mod architecture;
mod autopilot;
mod backup;
mod battery;
mod cli;
mod clients;
mod compaction;
mod compat;
mod compat_tools;
mod concurrency;
mod console;
mod daemon_e2e;
mod daemon_inprocess;
mod exec_sandbox;
mod fake_llm_selftest;
mod fake_telegram_selftest;
mod file_tools;
mod gateway;
mod http_api;
mod http_daemon;
mod import;
mod intake_limits;
mod local_behaviour;
mod local_model;
mod local_replay;
mod markdown_corpus;
mod matrix;
mod mcp;
mod mcp_hostile;
mod mcp_live;
mod mcp_rich;
mod mcp_server;
mod mcp_sockets;
mod memory;
mod metrics;
mod outbox;
mod process_hardening;
mod prompt_files;
mod provider_limits;
mod reload;
mod responses;
mod retention;
mod schedule_entries;
mod schedule_isolation;
mod session_control;
mod session_index;
mod snapshots;
mod ssrf;
mod structured_output;
mod systemd;
mod telegram_approvals;
mod telegram_e2e;
mod tool_schemas;
mod toolcalls;
mod untested;
mod untrusted;
mod upgrade;
mod voice;
