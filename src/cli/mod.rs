//! `agent-send`'s logic (SPEC §10.1): build and write one control line and confirm its intake,
//! or answer one query from the state files. `bin/agent-send.rs` only parses arguments and
//! prints the [`Output`].
//!
//! - `context`: state directory, FIFO path, time zone, context windows.
//! - `line`: the control line, spilling long texts to `state_dir/inbox/`.
//! - `fifo`: non-blocking open (ENXIO = daemon not running) and the single atomic write.
//! - `wait`: polling the session index and trails for intake, outcome and reset.
//! - `send`: a send end to end and its output.
//! - `cost`, `sessions`, `history`, `status`: the queries; they never need the daemon. The
//!   first three print the reports of `crate::report`, which the HTTP API serves too.
//!
//! Everything here is blocking; it is meant for the CLI process, not for a tokio worker.
//!
//! `mcp` is `agentd mcp`: the MCP server of `api::mcp` on stdio, over the FIFO and the state
//! files.
//!
//! `memory` is the other command-line front end here: `agentd index` and `agentd consolidate`
//! (async, run by `bin/agentd.rs` on a current-thread runtime), kept here because only `cli/`
//! prints, and so are `config_diff` (`agentd check-config --diff`) and `import` (`agentd import
//! openclaw`).

pub mod approvals;
pub mod backup;
pub mod config_diff;
pub mod context;
pub mod cost;
mod error;
pub mod fifo;
pub mod history;
pub mod import;
pub mod line;
pub mod mcp;
pub mod memory;
pub mod output;
pub mod send;
pub mod sessions;
pub mod status;
pub mod wait;

pub use context::Context;
pub use error::{CliError, EXIT_FAILURE, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE};
pub use line::Outgoing;
pub use output::Output;
pub use send::{SendOptions, SendResult};

use crate::cost::Period;
use crate::report;

/// The one thing an `agent-send` run does.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// `-m`, `-s` or `--reset`.
    Send { out: Outgoing, opts: SendOptions },
    /// `--cost [period]`.
    /// `--cost PERIOD [--by GROUP]`.
    Cost(Period, Option<crate::store::GroupBy>),
    /// `--sessions`.
    Sessions,
    /// `--monitor`.
    Monitor,
    /// `--history KEY_OR_ID [--full]`.
    History { target: String, full: bool },
    /// `--status`.
    Status,
    /// `--approvals`.
    Approvals,
    /// `--approve ID [--always]`, `--deny ID`.
    Decide {
        id: String,
        decision: crate::session::approval::Decision,
        timeout: std::time::Duration,
    },
}

/// Run `action` against the daemon's files in `ctx`; `as_json` selects machine-readable
/// output. Blocking.
pub fn run(ctx: &Context, action: &Action, as_json: bool) -> Result<Output, CliError> {
    let now = chrono::Utc::now();
    match action {
        Action::Send { out, opts } => Ok(send::render(&send::send(ctx, out, *opts)?, as_json)),
        Action::Cost(period, by) => Ok(cost::render(
            &report::cost::cost_report(&ctx.state_dir, *period, *by, &ctx.timezone, now)?,
            as_json,
        )),
        Action::Sessions => Ok(sessions::render(
            &report::sessions::sessions_report(&ctx.sessions_dir(), &ctx.context_windows)?,
            &ctx.timezone,
            as_json,
        )),
        Action::Monitor => status::monitor(&ctx.state_dir, now, as_json),
        Action::History { target, full } => Ok(history::render(
            &report::history::history(&ctx.sessions_dir(), target)?,
            *full,
            as_json,
        )),
        Action::Status => Ok(status::render(&status::status(ctx, now)?, as_json)),
        Action::Approvals => approvals::list(ctx, as_json),
        Action::Decide {
            id,
            decision,
            timeout,
        } => approvals::decide(ctx, id, *decision, *timeout, as_json),
    }
}
