//! `agentd mcp`: the MCP server on stdio (SPEC §23), for an MCP host that starts it. It talks
//! to the running daemon as `agent-send` does: messages through the control FIFO, answers
//! and reports from the state files. The server itself is `api::mcp`, over [`FifoBackend`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;

use super::context::Context;
use super::line::Outgoing;
use super::send::{SendOptions, SendResult, send_with_id};
use super::wait::OutcomeWatch;
use super::{CliError, fifo};
use crate::api::backend::{
    ApiBackend, BackendError, ChatIn, ChatOutcome, MessageTicket, NotifyAccepted, NotifyIn,
    SessionMessageIn,
};
use crate::config::Config;
use crate::cost::Period;

/// How long a message may take to show in its trail after the FIFO write.
const INTAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a wait for an answer reads the trail.
const OUTCOME_POLL: Duration = Duration::from_millis(250);
/// How long `decide` waits for the daemon to record a decision.
const DECIDE_TIMEOUT: Duration = Duration::from_secs(10);

/// The daemon as the stdio MCP server sees it: the FIFO and the state files.
pub struct FifoBackend {
    ctx: Context,
    cfg: Arc<Config>,
}

fn internal(e: impl std::fmt::Display) -> BackendError {
    BackendError::Internal(e.to_string())
}

fn cli_error(e: CliError) -> BackendError {
    match e {
        CliError::NotRunning { .. } => BackendError::Unavailable(e.to_string()),
        CliError::Usage(m) => BackendError::BadRequest(m),
        CliError::NotFound(m) => BackendError::NotFound(m),
        other => BackendError::Internal(other.to_string()),
    }
}

fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BackendError> + Send + 'static,
) -> BoxFuture<'static, Result<T, BackendError>> {
    async move { tokio::task::spawn_blocking(f).await.map_err(internal)? }.boxed()
}

/// A command's JSON output as a value (its text when it is not JSON).
fn output_json(out: super::Output) -> Result<Value, BackendError> {
    if out.code != 0 {
        return Err(BackendError::BadRequest(out.stderr.trim().to_string()));
    }
    Ok(serde_json::from_str(&out.stdout).unwrap_or(Value::String(out.stdout)))
}

impl FifoBackend {
    fn unavailable<T: Send + 'static>(what: &str) -> BoxFuture<'static, Result<T, BackendError>> {
        let msg = format!("{what} is not served by `agentd mcp`; use the HTTP API");
        async move { Err(BackendError::Unavailable(msg)) }.boxed()
    }
}

impl ApiBackend for FifoBackend {
    fn chat(&self, _req: ChatIn) -> BoxFuture<'_, Result<ChatOutcome, BackendError>> {
        Self::unavailable("/chat")
    }

    fn notify(&self, _req: NotifyIn) -> BoxFuture<'_, Result<NotifyAccepted, BackendError>> {
        Self::unavailable("notify")
    }

    fn reset(&self, _target: String) -> BoxFuture<'_, Result<usize, BackendError>> {
        Self::unavailable("reset")
    }

    fn status(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        let ctx = self.ctx.clone();
        blocking(move || {
            let r = super::status::status(&ctx, chrono::Utc::now()).map_err(cli_error)?;
            serde_json::to_value(r).map_err(internal)
        })
    }

    fn sessions(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        let ctx = self.ctx.clone();
        blocking(move || {
            let r =
                crate::report::sessions::sessions_report(&ctx.sessions_dir(), &ctx.context_windows)
                    .map_err(internal)?;
            serde_json::to_value(r).map_err(internal)
        })
    }

    fn cost(
        &self,
        period: Period,
        by: Option<crate::store::GroupBy>,
    ) -> BoxFuture<'_, Result<Value, BackendError>> {
        let ctx = self.ctx.clone();
        blocking(move || {
            let r = crate::report::cost::cost_report(
                &ctx.state_dir,
                period,
                by,
                &ctx.timezone,
                chrono::Utc::now(),
            )
            .map_err(internal)?;
            serde_json::to_value(r).map_err(internal)
        })
    }

    fn monitor(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        let dir = self.ctx.state_dir.clone();
        blocking(move || {
            super::status::read_monitor(&dir)
                .map(|(_, v)| v)
                .map_err(cli_error)
        })
    }

    fn history(
        &self,
        session_id: String,
        full: bool,
    ) -> BoxFuture<'_, Result<Option<Value>, BackendError>> {
        let dir = self.ctx.sessions_dir();
        blocking(
            move || match crate::report::history::history(&dir, &session_id) {
                Ok(h) => Ok(Some(crate::report::history::to_json(&h, full))),
                Err(crate::report::ReportError::NotFound(_)) => Ok(None),
                Err(e) => Err(internal(e)),
            },
        )
    }

    fn metrics(&self) -> BoxFuture<'_, Result<String, BackendError>> {
        Self::unavailable("/metrics")
    }

    fn approvals(&self) -> BoxFuture<'_, Result<Value, BackendError>> {
        let ctx = self.ctx.clone();
        blocking(move || output_json(super::approvals::list(&ctx, true).map_err(cli_error)?))
    }

    fn decide_approval(
        &self,
        id: String,
        decision: crate::session::approval::Decision,
    ) -> BoxFuture<'_, Result<Value, BackendError>> {
        let ctx = self.ctx.clone();
        blocking(move || {
            output_json(
                super::approvals::decide(&ctx, &id, decision, DECIDE_TIMEOUT, true)
                    .map_err(cli_error)?,
            )
        })
    }

    fn message(&self, req: SessionMessageIn) -> BoxFuture<'_, Result<MessageTicket, BackendError>> {
        let ctx = self.ctx.clone();
        async move {
            let id = req.id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            let out = Outgoing::User {
                text: req.text,
                sender: req.key,
                tier: None,
                attachments: Vec::new(),
            };
            let opts = SendOptions {
                intake_timeout: INTAKE_TIMEOUT,
                wait: None,
            };
            let ctx2 = ctx.clone();
            let sent =
                blocking(move || send_with_id(&ctx2, &out, opts, id).map_err(cli_error)).await?;
            let SendResult::Accepted { id, session_id } = sent else {
                return Err(internal("unexpected answer to a message"));
            };
            let done = wait_outcome(ctx.sessions_dir(), session_id.clone(), id.clone());
            Ok(MessageTicket {
                id,
                session_id,
                done,
            })
        }
        .boxed()
    }

    /// A `stop` line through the FIFO; whether a message was running is the daemon's to log.
    fn stop(&self, key: String) -> BoxFuture<'_, Result<bool, BackendError>> {
        let fifo = self.ctx.fifo.clone();
        blocking(move || {
            let line = crate::control::ControlLine::Stop {
                id: Some(uuid::Uuid::new_v4().to_string()),
                key,
            };
            fifo::send_line(&fifo, &line.encode(), INTAKE_TIMEOUT).map_err(cli_error)?;
            Ok(true)
        })
    }

    fn memory_search(&self, query: String, k: usize) -> BoxFuture<'_, Result<Value, BackendError>> {
        let cfg = self.cfg.clone();
        async move {
            let found = super::memory::search(&cfg, &query, k)
                .await
                .map_err(|e| BackendError::Unavailable(e.to_string()))?;
            serde_json::to_value(found).map_err(internal)
        }
        .boxed()
    }
}

/// Poll the trail until intake `id` has an outcome; dropping the future stops the polling.
fn wait_outcome(
    sessions_dir: PathBuf,
    session_id: String,
    id: String,
) -> BoxFuture<'static, Result<crate::session::Outcome, BackendError>> {
    async move {
        let mut watch = OutcomeWatch::new(&sessions_dir, &session_id, &id);
        loop {
            let (w, found) = tokio::task::spawn_blocking(move || {
                let r = watch.check();
                (watch, r)
            })
            .await
            .map_err(internal)?;
            watch = w;
            if let Some(outcome) = found.map_err(cli_error)? {
                return Ok(outcome);
            }
            tokio::time::sleep(OUTCOME_POLL).await;
        }
    }
    .boxed()
}

/// `agentd mcp`: refuse at once when the daemon is not running (nobody reads the FIFO),
/// then serve one MCP session on stdin/stdout until the host closes it.
pub async fn serve(cfg: Config) -> Result<(), CliError> {
    let ctx = super::context::resolve(None, None, Ok(cfg.clone()))?;
    drop(fifo::open(&ctx.fifo)?);
    let opts = crate::api::mcp::McpOptions::from_config(&cfg);
    let backend = Arc::new(FifoBackend {
        ctx,
        cfg: Arc::new(cfg),
    });
    crate::api::mcp::serve_stdio(backend, opts, tokio_util::sync::CancellationToken::new())
        .await
        .map_err(|e| CliError::Usage(e.to_string()))
}
