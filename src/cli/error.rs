//! The error type of `agent-send` and its mapping to exit codes (SPEC §10.1).

use std::io;
use std::path::PathBuf;

use crate::report::ReportError;
use crate::store::StoreError;

/// Exit code: success.
pub const EXIT_OK: i32 = 0;
/// Exit code: daemon not running, FIFO missing, message failed, setting refused by the daemon,
/// config or I/O error.
pub const EXIT_FAILURE: i32 = 1;
/// Exit code: usage error (also clap's own errors).
pub const EXIT_USAGE: i32 = 2;
/// Exit code: timed out waiting for intake, a reply or a reset.
pub const EXIT_TIMEOUT: i32 = 3;

/// Why an `agent-send` action failed. [`CliError::exit_code`] gives the process exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The command line or its input makes no sense (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The configuration could not be loaded and nothing else names the state directory.
    #[error(
        "cannot load the configuration, and no state directory was given:\n{0}\n\
         (fix the config, or pass --state-dir / set AGENTD_STATE_DIR)"
    )]
    Config(String),
    /// Nobody reads the control FIFO, or it does not exist.
    #[error("agentd is not running (no reader on {})", path.display())]
    NotRunning { path: PathBuf },
    /// Something that is not a FIFO sits where the control FIFO should be.
    #[error(
        "{} exists but is not a FIFO; is [fifo] path (or --state-dir) right? \
         agentd recreates the FIFO on start once the path is free",
        path.display()
    )]
    NotFifo { path: PathBuf },
    /// The control line (after moving the text to a file) is still over `PIPE_BUF`.
    #[error(
        "the control line is {len} bytes, over the {max}-byte atomic write limit even with the \
         text in a file; attach fewer files or use shorter paths"
    )]
    LineTooLong { len: usize, max: usize },
    /// The daemon did not record the message's intake in time.
    #[error("timed out after {seconds} s waiting for the daemon to record message {id}")]
    IntakeTimeout { id: String, seconds: u64 },
    /// The message was recorded but not answered in time.
    #[error(
        "timed out after {seconds} s waiting for the reply to message {id} (it was accepted \
         and is still being processed; see agent-send --history {session_id})"
    )]
    ReplyTimeout {
        id: String,
        session_id: String,
        seconds: u64,
    },
    /// The reset did not show in the session index in time.
    #[error("timed out after {seconds} s waiting for the daemon to reset {target}")]
    ResetTimeout { target: String, seconds: u64 },
    /// The daemon refused a session setting (`--session KEY --model|--skill`): the reason it
    /// gave, e.g. an unknown model with the list of its loaded ones (exit 1).
    #[error("agentd refused the setting: {0}")]
    Refused(String),
    /// A queried thing does not exist (a session, the monitor file).
    #[error("{0}")]
    NotFound(String),
    /// A file could not be read or written; `what` names the file and the operation.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// The cost database could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl CliError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => EXIT_USAGE,
            CliError::IntakeTimeout { .. }
            | CliError::ReplyTimeout { .. }
            | CliError::ResetTimeout { .. } => EXIT_TIMEOUT,
            _ => EXIT_FAILURE,
        }
    }

    /// An I/O error with a description of what was being done, e.g. `read /x/sessions.json`.
    pub fn io(what: impl Into<String>, source: io::Error) -> CliError {
        CliError::Io {
            what: what.into(),
            source,
        }
    }
}

impl From<ReportError> for CliError {
    fn from(e: ReportError) -> CliError {
        match e {
            ReportError::InvalidTarget(m) => CliError::Usage(m),
            ReportError::NotFound(m) => CliError::NotFound(m),
            ReportError::Io { what, source } => CliError::Io { what, source },
            ReportError::Store(e) => CliError::Store(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_spec() {
        assert_eq!(CliError::Usage("x".into()).exit_code(), 2);
        assert_eq!(CliError::NotRunning { path: "/p".into() }.exit_code(), 1);
        assert_eq!(
            CliError::IntakeTimeout {
                id: "i".into(),
                seconds: 10
            }
            .exit_code(),
            3
        );
        assert_eq!(
            CliError::ReplyTimeout {
                id: "i".into(),
                session_id: "s".into(),
                seconds: 10
            }
            .exit_code(),
            3
        );
        assert_eq!(CliError::Config("bad".into()).exit_code(), 1);
    }

    #[test]
    fn messages_name_the_path_and_id() {
        let e = CliError::NotRunning {
            path: "/s/control.pipe".into(),
        };
        assert_eq!(
            e.to_string(),
            "agentd is not running (no reader on /s/control.pipe)"
        );
        let e = CliError::IntakeTimeout {
            id: "abc".into(),
            seconds: 10,
        };
        assert_eq!(
            e.to_string(),
            "timed out after 10 s waiting for the daemon to record message abc"
        );
    }

    #[test]
    fn report_errors_keep_their_text_and_exit_code() {
        let cases = [
            (ReportError::InvalidTarget("bad target".into()), 2),
            (ReportError::NotFound("no session".into()), 1),
            (
                ReportError::io("read /s/sessions.json", io::Error::other("boom")),
                1,
            ),
        ];
        for (e, code) in cases {
            let text = e.to_string();
            let cli = CliError::from(e);
            assert_eq!(cli.to_string(), text);
            assert_eq!(cli.exit_code(), code, "{text}");
        }
    }
}
