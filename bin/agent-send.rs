//! `agent-send`: send a message, system event or reset to a running agentd through its control
//! FIFO, or query its state files (SPEC §10.1). The logic lives in `agentd::cli`.
//!
//! Exit codes: [`EXIT_CODES`], also in `--help`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use agentd::cli::{self, Action, CliError, Outgoing, SendOptions};
use agentd::cost::Period;
use agentd::session::approval::Decision;
use agentd::store::GroupBy;
use clap::{ArgGroup, Parser};

/// The exit codes, as `--help` lists them (docs/usage.md).
const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  agentd is not running or its FIFO is missing; the message failed; agentd refused a
     --session setting (the reason on stderr); a config or I/O error
  2  usage error (also an unknown --model or --skill name in the config read)
  3  timed out waiting for the intake, the reply or the reset";

#[derive(Parser, Debug)]
#[command(
    name = "agent-send",
    version = agentd::VERSION,
    after_help = EXIT_CODES,
    about = "Send a message to agentd through its control FIFO, or query its state",
    group(ArgGroup::new("action").required(true).multiple(false)
        .args(["message", "system", "reset", "cost", "sessions", "monitor", "history", "status",
               "approvals", "approve", "deny", "model", "skill"])),
    group(ArgGroup::new("text_action").multiple(false).args(["message", "system"])),
    // `requires` naming a single arg of the required "action" group is not enforced by clap;
    // naming a group is.
    group(ArgGroup::new("message_action").args(["message"])),
    group(ArgGroup::new("history_action").args(["history"])),
    group(ArgGroup::new("cost_action").args(["cost"])),
    group(ArgGroup::new("approve_action").args(["approve"])),
    group(ArgGroup::new("setting_action").args(["model", "skill"])),
    group(ArgGroup::new("waitable").multiple(false).args(["message", "system", "reset"])),
)]
struct Args {
    /// Send TEXT as a user message (`-` reads it from stdin).
    #[arg(short = 'm', long, value_name = "TEXT", allow_hyphen_values = true)]
    message: Option<String>,
    /// Send TEXT as a system event (`-` reads it from stdin).
    #[arg(short = 's', long, value_name = "TEXT", allow_hyphen_values = true)]
    system: Option<String>,
    /// Sender name for -m; also the session key.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "cli",
        requires = "message_action"
    )]
    from: String,
    /// Context tier for -m or -s (e.g. full, operational).
    #[arg(long, value_name = "TIER", requires = "text_action")]
    tier: Option<String>,
    /// Attach FILE to -m (repeatable).
    #[arg(
        short = 'a',
        long = "attach",
        value_name = "FILE",
        requires = "message_action"
    )]
    attach: Vec<PathBuf>,
    /// Reset a session by key or id; without TARGET, all sessions.
    #[arg(long, value_name = "TARGET", num_args = 0..=1, default_missing_value = "all")]
    reset: Option<String>,
    /// The session key whose settings --model or --skill change (SPEC §18.2).
    #[arg(long, value_name = "KEY", requires = "setting_action")]
    session: Option<String>,
    /// Pin the session's model (a loaded model's name), or `default` for routing.
    #[arg(long, value_name = "NAME|default", requires = "session")]
    model: Option<String>,
    /// Turn a skill on or off for the session: --skill NAME on|off.
    #[arg(long, num_args = 2, value_names = ["NAME", "on|off"], requires = "session")]
    skill: Option<Vec<String>>,
    /// After intake, wait up to SECONDS (default 60) for the reply and print it.
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "60",
          requires = "waitable")]
    wait: Option<u64>,
    /// Seconds to wait for the daemon to record the message.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    timeout: u64,
    /// Spend per model: today (default), week, month or all.
    #[arg(long, value_name = "PERIOD", num_args = 0..=1, default_missing_value = "today",
          value_parser = parse_period)]
    cost: Option<Period>,
    /// With --cost: totals and the cache hit ratio per session, source or model.
    #[arg(long, value_name = "GROUP", requires = "cost_action", value_parser = parse_by)]
    by: Option<GroupBy>,
    /// List the open sessions.
    #[arg(long)]
    sessions: bool,
    /// Show the live monitor.
    #[arg(long)]
    monitor: bool,
    /// Show the conversation of a session (key or id, live or archived).
    #[arg(long, value_name = "KEY_OR_ID")]
    history: Option<String>,
    /// With --history: do not abbreviate tool results and arguments.
    #[arg(long, requires = "history_action")]
    full: bool,
    /// Whether the daemon runs, its FIFO, monitor state and today's cost.
    #[arg(long)]
    status: bool,
    /// List the tool calls waiting for approval.
    #[arg(long)]
    approvals: bool,
    /// Approve the waiting tool call ID.
    #[arg(long, value_name = "ID")]
    approve: Option<String>,
    /// With --approve: also let later calls of the same tool in that session run without asking.
    #[arg(long, requires = "approve_action")]
    always: bool,
    /// Deny the waiting tool call ID.
    #[arg(long, value_name = "ID")]
    deny: Option<String>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
    /// State directory (overrides AGENTD_STATE_DIR and the config).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Config file (default: $AGENTD_CONFIG, else ./config/agentd.toml).
    #[arg(short = 'c', long, value_name = "PATH")]
    config: Option<PathBuf>,
}

/// A `--by` grouping; the error lists the valid values (clap exits 2).
fn parse_by(s: &str) -> Result<GroupBy, String> {
    s.parse::<GroupBy>()
}

/// A `--cost` period; the error lists the valid values (clap exits 2).
fn parse_period(s: &str) -> Result<Period, String> {
    s.parse::<Period>().map_err(|e| e.to_string())
}

fn action(args: &Args) -> Result<Action, CliError> {
    let opts = SendOptions {
        intake_timeout: Duration::from_secs(args.timeout),
        wait: args.wait.map(Duration::from_secs),
    };
    if let Some(m) = &args.message {
        let out = Outgoing::User {
            text: cli::send::message_text(m, std::io::stdin().lock())?,
            sender: args.from.clone(),
            tier: args.tier.clone(),
            attachments: cli::send::attachments(&args.attach)?,
        };
        return Ok(Action::Send { out, opts });
    }
    if let Some(s) = &args.system {
        let out = Outgoing::System {
            text: cli::send::message_text(s, std::io::stdin().lock())?,
            tier: args.tier.clone(),
        };
        return Ok(Action::Send { out, opts });
    }
    if let Some(target) = &args.reset {
        let out = Outgoing::Reset {
            target: target.clone(),
        };
        return Ok(Action::Send { out, opts });
    }
    if let (Some(key), Some(model)) = (&args.session, &args.model) {
        let model = Some(model.trim().to_string()).filter(|m| !m.eq_ignore_ascii_case("default"));
        let out = Outgoing::SessionModel {
            key: key.clone(),
            model,
        };
        return Ok(Action::Send { out, opts });
    }
    if let (Some(key), Some(skill)) = (&args.session, &args.skill) {
        let enabled = match skill.get(1).map(|s| s.to_ascii_lowercase()).as_deref() {
            Some("on") => true,
            Some("off") => false,
            _ => {
                return Err(CliError::Usage(
                    "--skill takes a name and on or off: --skill NAME on|off".into(),
                ));
            }
        };
        let out = Outgoing::SessionSkill {
            key: key.clone(),
            name: skill[0].clone(),
            enabled,
        };
        return Ok(Action::Send { out, opts });
    }
    if let Some(period) = args.cost {
        return Ok(Action::Cost(period, args.by));
    }
    if let Some(target) = &args.history {
        return Ok(Action::History {
            target: target.clone(),
            full: args.full,
        });
    }
    if args.sessions {
        return Ok(Action::Sessions);
    }
    if args.approvals {
        return Ok(Action::Approvals);
    }
    if let Some(id) = &args.approve {
        return Ok(Action::Decide {
            id: id.clone(),
            decision: if args.always {
                Decision::Always
            } else {
                Decision::Approve
            },
            timeout: Duration::from_secs(args.timeout),
        });
    }
    if let Some(id) = &args.deny {
        return Ok(Action::Decide {
            id: id.clone(),
            decision: Decision::Deny,
            timeout: Duration::from_secs(args.timeout),
        });
    }
    if args.monitor {
        return Ok(Action::Monitor);
    }
    Ok(Action::Status)
}

fn run(args: &Args) -> Result<cli::Output, CliError> {
    let ctx = cli::context::resolve_from_env(args.state_dir.as_deref(), args.config.as_deref())?;
    cli::run(&ctx, &action(args)?, args.json)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (stdout, stderr, code) = match run(&args) {
        Ok(out) => (out.stdout, out.stderr, out.code),
        Err(e) => (String::new(), format!("agent-send: {e}\n"), e.exit_code()),
    };
    // A closed stdout (`| head`) is not worth a panic.
    let _ = std::io::stdout().lock().write_all(stdout.as_bytes());
    let _ = std::io::stderr().lock().write_all(stderr.as_bytes());
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("agent-send").chain(args.iter().copied()))
    }

    #[test]
    fn usage_errors_exit_2() {
        for bad in [
            &[][..],
            &["-m", "a", "-s", "b"],
            &["--sessions", "--status"],
            &["--cost", "yesterday"],
            &["--full", "--status"],
            &["--from", "bob", "--cost"],
            &["--attach", "f", "-s", "x"],
            &["--tier", "full", "--reset"],
            &["--wait", "--sessions"],
            &["--always", "--deny", "ap-x"],
            &["--approve", "ap-x", "--deny", "ap-y"],
        ] {
            let err = parse(bad).expect_err(&format!("{bad:?} must be refused"));
            assert_eq!(err.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn optional_values_have_their_defaults() {
        let a = parse(&["-m", "hi", "--wait"]).unwrap();
        assert_eq!(a.wait, Some(60));
        assert_eq!(a.from, "cli");
        assert_eq!(a.timeout, 10);
        assert_eq!(parse(&["-m", "hi", "--wait", "5"]).unwrap().wait, Some(5));
        assert_eq!(parse(&["--cost"]).unwrap().cost, Some(Period::Today));
        assert_eq!(
            parse(&["--cost", "Month"]).unwrap().cost,
            Some(Period::Month)
        );
        assert_eq!(parse(&["--reset"]).unwrap().reset.as_deref(), Some("all"));
        assert_eq!(
            parse(&["--reset", "alice", "--wait"])
                .unwrap()
                .reset
                .as_deref(),
            Some("alice")
        );
        let a = parse(&["-m", "-", "-a", "x", "-a", "y", "--from", "bob"]).unwrap();
        assert_eq!(a.message.as_deref(), Some("-"));
        assert_eq!(a.attach.len(), 2);
        assert!(
            parse(&["--history", "alice", "--full", "--json"])
                .unwrap()
                .full
        );
    }

    #[test]
    fn the_action_follows_the_flag() {
        let a = parse(&["--reset"]).unwrap();
        assert!(matches!(
            action(&a).unwrap(),
            Action::Send { out: Outgoing::Reset { ref target }, .. } if target == "all"
        ));
        let a = parse(&["-s", "beat", "--tier", "operational", "--wait", "3"]).unwrap();
        let Action::Send { out, opts } = action(&a).unwrap() else {
            panic!()
        };
        assert_eq!(
            out,
            Outgoing::System {
                text: "beat".into(),
                tier: Some("operational".into())
            }
        );
        assert_eq!(opts.wait, Some(Duration::from_secs(3)));
        assert_eq!(
            action(&parse(&["--status"]).unwrap()).unwrap(),
            Action::Status
        );
        assert_eq!(
            action(&parse(&["--monitor"]).unwrap()).unwrap(),
            Action::Monitor
        );
    }
}
