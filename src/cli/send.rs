//! One send, end to end: open the FIFO, write the line, wait for the intake record, and with
//! `--wait` for the outcome (SPEC §5.2, §10.1).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use super::context::Context;
use super::line::{Outgoing, prepare};
use super::output::Output;
use super::{CliError, fifo, wait};
use crate::session::Outcome;

/// How long to wait for what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendOptions {
    /// For the intake record (`--timeout`, default 10 s); also bounds retries on a full pipe.
    pub intake_timeout: Duration,
    /// `--wait`: for the reply (or for a reset to show in the index).
    pub wait: Option<Duration>,
}

/// What came of a send.
#[derive(Debug, Clone, PartialEq)]
pub enum SendResult {
    /// The daemon recorded the message.
    Accepted { id: String, session_id: String },
    /// The message was recorded and then answered (or failed).
    Finished {
        id: String,
        session_id: String,
        outcome: Outcome,
    },
    /// A reset was written; `done` when `--wait` saw it take effect.
    Reset {
        id: String,
        target: String,
        done: bool,
    },
}

/// Send `out` through the daemon of `ctx` and wait as `opts` says. Blocking.
pub fn send(ctx: &Context, out: &Outgoing, opts: SendOptions) -> Result<SendResult, CliError> {
    send_with_id(ctx, out, opts, uuid::Uuid::new_v4().to_string())
}

/// [`send`] with the intake id `id` (a client's idempotency key: a duplicate is recorded
/// once).
pub fn send_with_id(
    ctx: &Context,
    out: &Outgoing,
    opts: SendOptions,
    id: String,
) -> Result<SendResult, CliError> {
    let sessions_dir = ctx.sessions_dir();
    check_setting(ctx, out)?;
    let reset_before = match (out, opts.wait) {
        (Outgoing::Reset { target }, Some(_)) => {
            Some(wait::sessions_before_reset(&sessions_dir, target)?)
        }
        _ => None,
    };
    // Open first: when the daemon is down, nothing is written to the inbox.
    let mut pipe = fifo::open(&ctx.fifo)?;
    let prepared = prepare(out, &id, &ctx.state_dir)?;
    if let Err(e) = fifo::write_line(&mut pipe, &ctx.fifo, &prepared.bytes, opts.intake_timeout) {
        prepared.discard();
        return Err(e);
    }
    drop(pipe);

    let Some(key) = out.session_key() else {
        let Outgoing::Reset { target } = out else {
            unreachable!("only resets have no session key")
        };
        let done = match (reset_before, opts.wait) {
            (Some(ids), Some(t)) => {
                wait::wait_reset(&sessions_dir, target, &ids, t)?;
                true
            }
            _ => false,
        };
        return Ok(SendResult::Reset {
            id,
            target: target.clone(),
            done,
        });
    };
    let session_id = match out {
        Outgoing::SessionModel { .. } | Outgoing::SessionSkill { .. } => {
            wait::wait_setting(&ctx.state_dir, &sessions_dir, key, &id, opts.intake_timeout)?
        }
        _ => wait::wait_intake(&sessions_dir, key, &id, opts.intake_timeout)?,
    };
    match opts.wait {
        None => Ok(SendResult::Accepted { id, session_id }),
        Some(t) => {
            let outcome = wait::wait_outcome(&sessions_dir, &session_id, &id, t)?;
            Ok(SendResult::Finished {
                id,
                session_id,
                outcome,
            })
        }
    }
}

/// A `--model` or `--skill` name checked against what the config loads, before anything is
/// written (the daemon checks again: a refusal reaches [`wait::wait_setting`] through the
/// monitor). Without a config nothing is checked.
fn check_setting(ctx: &Context, out: &Outgoing) -> Result<(), CliError> {
    match out {
        Outgoing::SessionModel {
            model: Some(name), ..
        } if !ctx.context_windows.is_empty() && !ctx.context_windows.contains_key(name) => {
            Err(CliError::Usage(format!(
                "unknown model {name:?}: the loaded models are {}; or `default` to go back to routing",
                ctx.context_windows
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
        Outgoing::SessionSkill { name, .. } => {
            let Some(dir) = &ctx.skills_dir else {
                return Ok(());
            };
            let loaded: Vec<String> = crate::skills::scan(dir)
                .into_iter()
                .map(|s| s.name)
                .collect();
            if loaded.contains(name) {
                return Ok(());
            }
            Err(CliError::Usage(format!(
                "unknown skill {name:?}: the loaded skills are {} ({})",
                if loaded.is_empty() {
                    "(none)".to_string()
                } else {
                    loaded.join(", ")
                },
                dir.display()
            )))
        }
        _ => Ok(()),
    }
}

/// What to print for a send result. A failed message exits 1 with the sender's reply on
/// stdout and the error on stderr.
pub fn render(result: &SendResult, as_json: bool) -> Output {
    match result {
        SendResult::Accepted { id, session_id } => {
            if as_json {
                Output::json(&json!({"id": id, "session_id": session_id, "status": "accepted"}))
            } else {
                Output::silent()
            }
        }
        SendResult::Reset { id, target, done } => {
            let status = if *done { "done" } else { "sent" };
            if as_json {
                Output::json(&json!({"id": id, "target": target, "status": status}))
            } else {
                Output::silent()
            }
        }
        SendResult::Finished {
            id,
            session_id,
            outcome,
        } => match outcome {
            Outcome::Reply { text, silent } => {
                if as_json {
                    Output::json(&json!({
                        "id": id, "session_id": session_id, "reply": text, "silent": silent
                    }))
                } else if *silent {
                    Output::silent().with_stderr("(silent reply)")
                } else {
                    Output::stdout(text.clone())
                }
            }
            Outcome::Failed { reply, error } => {
                let out = if as_json {
                    Output::json(&json!({
                        "id": id, "session_id": session_id, "error": error, "reply": reply
                    }))
                } else {
                    Output::stdout(reply.clone())
                };
                out.with_stderr(format!("agentd: message failed: {error}"))
                    .failed()
            }
        },
    }
}

/// The message text of `-m`/`-s`: the argument, or all of `stdin` for `-`. One trailing newline
/// is dropped; an empty message is a usage error.
pub fn message_text(arg: &str, stdin: impl Read) -> Result<String, CliError> {
    let mut text = if arg == "-" {
        let mut s = String::new();
        let mut stdin = stdin;
        stdin.read_to_string(&mut s).map_err(|e| {
            if e.kind() == std::io::ErrorKind::InvalidData {
                CliError::Usage("the message on stdin is not UTF-8 text".into())
            } else {
                CliError::io("read the message from stdin", e)
            }
        })?;
        s
    } else {
        arg.to_string()
    };
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.trim().is_empty() {
        return Err(CliError::Usage("the message is empty".into()));
    }
    Ok(text)
}

/// Attachment paths made absolute (symlinks resolved); each must be a readable regular file.
pub fn attachments(paths: &[PathBuf]) -> Result<Vec<PathBuf>, CliError> {
    paths.iter().map(|p| attachment(p)).collect()
}

fn attachment(p: &Path) -> Result<PathBuf, CliError> {
    let what = || format!("attachment {}", p.display());
    let real = p.canonicalize().map_err(|e| CliError::io(what(), e))?;
    let md = std::fs::metadata(&real).map_err(|e| CliError::io(what(), e))?;
    if !md.is_file() {
        return Err(CliError::Usage(format!(
            "attachment {} is not a regular file",
            p.display()
        )));
    }
    std::fs::File::open(&real).map_err(|e| CliError::io(what(), e))?;
    Ok(real)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::SessionStore;
    use crate::session::event::{Event, Intake};
    use crate::zone::Zone;
    use nix::sys::stat::Mode;
    use std::fs::OpenOptions;
    use std::os::unix::fs::OpenOptionsExt;

    #[test]
    fn text_from_argument_and_stdin() {
        assert_eq!(message_text("hi", std::io::empty()).unwrap(), "hi");
        assert_eq!(
            message_text("-", "line 1\nline 2\n".as_bytes()).unwrap(),
            "line 1\nline 2"
        );
        assert!(matches!(
            message_text("-", "  \n".as_bytes()),
            Err(CliError::Usage(_))
        ));
        assert!(matches!(
            message_text("", std::io::empty()),
            Err(CliError::Usage(_))
        ));
        let bad: &[u8] = &[0xff, 0xfe, b'\n'];
        assert!(matches!(message_text("-", bad), Err(CliError::Usage(_))));
    }

    #[test]
    fn attachments_become_absolute_and_must_exist() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("a.txt");
        std::fs::write(&f, "x").unwrap();
        let got = attachments(std::slice::from_ref(&f)).unwrap();
        assert!(got[0].is_absolute());
        assert_eq!(got[0], f.canonicalize().unwrap());
        let err = attachments(&[d.path().join("missing.png")]).unwrap_err();
        assert!(err.to_string().contains("missing.png"), "{err}");
        assert!(matches!(
            attachments(&[d.path().to_path_buf()]),
            Err(CliError::Usage(_))
        ));
    }

    #[test]
    fn render_shapes() {
        let acc = SendResult::Accepted {
            id: "i".into(),
            session_id: "s".into(),
        };
        assert_eq!(render(&acc, false), Output::silent());
        let v: serde_json::Value = serde_json::from_str(&render(&acc, true).stdout).unwrap();
        assert_eq!(
            v,
            json!({"id": "i", "session_id": "s", "status": "accepted"})
        );

        let reply = |silent| SendResult::Finished {
            id: "i".into(),
            session_id: "s".into(),
            outcome: Outcome::Reply {
                text: "hello".into(),
                silent,
            },
        };
        assert_eq!(render(&reply(false), false).stdout, "hello\n");
        let s = render(&reply(true), false);
        assert_eq!(
            (s.stdout.as_str(), s.stderr.as_str()),
            ("", "(silent reply)\n")
        );
        let v: serde_json::Value =
            serde_json::from_str(&render(&reply(true), true).stdout).unwrap();
        assert_eq!(
            v,
            json!({"id": "i", "session_id": "s", "reply": "hello", "silent": true})
        );

        let failed = SendResult::Finished {
            id: "i".into(),
            session_id: "s".into(),
            outcome: Outcome::Failed {
                reply: "sorry".into(),
                error: "boom".into(),
            },
        };
        let o = render(&failed, false);
        assert_eq!(o.stdout, "sorry\n");
        assert_eq!(o.stderr, "agentd: message failed: boom\n");
        assert_eq!(o.code, 1);
        let o = render(&failed, true);
        let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
        assert_eq!(
            v,
            json!({"id": "i", "session_id": "s", "error": "boom", "reply": "sorry"})
        );
        assert_eq!(o.code, 1);
    }

    #[test]
    fn send_without_daemon_writes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let ctx = Context::for_state_dir(d.path());
        let out = Outgoing::User {
            text: "x".repeat(10_000),
            sender: "cli".into(),
            tier: None,
            attachments: vec![],
        };
        let opts = SendOptions {
            intake_timeout: Duration::from_millis(100),
            wait: None,
        };
        let err = send(&ctx, &out, opts).unwrap_err();
        assert!(matches!(err, CliError::NotRunning { .. }), "{err}");
        nix::unistd::mkfifo(&ctx.fifo, Mode::from_bits_truncate(0o600)).unwrap();
        let err = send(&ctx, &out, opts).unwrap_err();
        assert!(matches!(err, CliError::NotRunning { .. }), "{err}");
        assert!(
            !d.path().join("inbox").exists(),
            "no inbox file without a reader"
        );
    }

    /// A stand-in for the daemon's intake: read one line from the FIFO and record it.
    #[test]
    fn send_waits_for_the_intake_record() {
        let d = tempfile::tempdir().unwrap();
        let ctx = Context::for_state_dir(d.path());
        nix::unistd::mkfifo(&ctx.fifo, Mode::from_bits_truncate(0o600)).unwrap();
        let reader = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(&ctx.fifo)
            .unwrap();
        let sessions = ctx.sessions_dir();
        let daemon = std::thread::spawn(move || {
            let mut reader = reader;
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.ends_with(b"\n") {
                match reader.read(&mut chunk) {
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            let line = crate::control::parse_line(&buf[..buf.len() - 1], 4096).unwrap();
            let id = line.id().unwrap().to_string();
            let store = SessionStore::open(&sessions, Zone::utc()).unwrap();
            let h = store.get_or_create("alice", "primary").unwrap();
            h.append(Event::Intake(Intake {
                id,
                source: crate::control::Source::User,
                from: "alice".into(),
                text: "hi".into(),
                tier: None,
                attachments: vec![],
                route: None,
                notify_meta: None,
                relayed_from: None,
            }))
            .unwrap();
            h.id.clone()
        });
        let out = Outgoing::User {
            text: "hi".into(),
            sender: "alice".into(),
            tier: None,
            attachments: vec![],
        };
        let opts = SendOptions {
            intake_timeout: Duration::from_secs(5),
            wait: None,
        };
        let result = send(&ctx, &out, opts).unwrap();
        let sid = daemon.join().unwrap();
        let SendResult::Accepted { id, session_id } = result else {
            panic!("{result:?}")
        };
        assert_eq!(session_id, sid);
        assert!(uuid::Uuid::parse_str(&id).is_ok());
    }
}
