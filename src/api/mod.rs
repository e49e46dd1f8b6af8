//! The HTTP API (SPEC §10.2). Only this module names `axum`.
//!
//! - [`backend`]: the fixed contract with the daemon ([`ApiBackend`](backend::ApiBackend)).
//! - `server`: [`router`], [`bind`], [`serve`] and the shared [`ApiState`].
//! - `handlers`: one function per endpoint, plus the pure input checks they use.
//! - `auth`, `ratelimit`: the bearer check and the per-IP windows, as route layers.
//! - `compat`: the OpenAI- and Anthropic-compatible endpoints (SPEC §17); their wire
//!   formats are `llm::openai::server` and `llm::anthropic::server`.
//! - `approvals`: the approvals endpoints (SPEC §18.1).
//! - [`a2a`]: the A2A agent card and JSON-RPC endpoint (SPEC §23).
//! - `console`: the web console at `/console/` (SPEC §22).
//! - `reply`: JSON bodies; the outermost layer adds `agent` and `X-Agentd-Agent` to every answer.
//! - [`webhook`]: the callback POSTed after every processed message.
//! - [`mcp`]: agentd as an MCP server (SPEC §23): `/mcp` here, and `agentd mcp` on stdio.

pub mod a2a;
pub mod backend;

mod approvals;
mod auth;
mod compat;
mod console;
mod error;
mod handlers;
pub mod mcp;
mod ratelimit;
mod reply;
mod server;
pub mod webhook;

pub use error::ApiError;
pub use server::{
    ApiState, HEADER_READ_TIMEOUT, SHUTDOWN_GRACE, bind, connection_cap, raise_fd_limit, router,
    router_with_mcp, serve,
};
pub use webhook::{TokenCounts, Webhook, WebhookError, WebhookPayload};

#[cfg(test)]
mod tests;
