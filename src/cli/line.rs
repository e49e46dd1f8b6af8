//! Building the control line for a send (SPEC §10.1): one JSON line of at most `PIPE_BUF`
//! bytes, so a single `write` is atomic. A text that makes the line longer is written to
//! `state_dir/inbox/<id>.txt` first and sent as `text_file`; an attachment list that still does
//! not fit goes to `state_dir/inbox/<id>.attachments.json`, sent as `attachments_file`.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::CliError;
use crate::control::{ControlLine, PIPE_BUF};
use crate::fsutil;

/// What to send: a message for a session, or a reset.
#[derive(Debug, Clone, PartialEq)]
pub enum Outgoing {
    /// `-m`: a user message; the session key is `sender`.
    User {
        text: String,
        sender: String,
        tier: Option<String>,
        /// Absolute paths.
        attachments: Vec<PathBuf>,
    },
    /// `-s`: a system event for the `system` session.
    System { text: String, tier: Option<String> },
    /// `--reset`: `all`, a session key or a session id.
    Reset { target: String },
    /// `--session KEY --model NAME|default` (SPEC §18.2); `None` = `default`.
    SessionModel { key: String, model: Option<String> },
    /// `--session KEY --skill NAME on|off` (SPEC §18.2).
    SessionSkill {
        key: String,
        name: String,
        enabled: bool,
    },
}

impl Outgoing {
    /// The session key whose trail will hold the intake record; `None` for a reset.
    pub fn session_key(&self) -> Option<&str> {
        match self {
            Outgoing::User { sender, .. } => Some(sender),
            Outgoing::System { .. } => Some("system"),
            Outgoing::Reset { .. } => None,
            Outgoing::SessionModel { key, .. } | Outgoing::SessionSkill { key, .. } => Some(key),
        }
    }

    fn text(&self) -> Option<&str> {
        match self {
            Outgoing::User { text, .. } | Outgoing::System { text, .. } => Some(text),
            Outgoing::Reset { .. }
            | Outgoing::SessionModel { .. }
            | Outgoing::SessionSkill { .. } => None,
        }
    }
}

/// A control line ready to write.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    /// The client id carried by the line.
    pub id: String,
    /// The encoded line, newline included, at most `PIPE_BUF` bytes.
    pub bytes: Vec<u8>,
    /// The inbox file holding the text, when the text did not fit in the line.
    pub text_file: Option<PathBuf>,
    /// The inbox file listing the attachments, when they did not fit in the line.
    pub attachments_file: Option<PathBuf>,
}

impl Prepared {
    /// Remove the inbox files again (the line could not be sent).
    pub fn discard(&self) {
        for f in [&self.text_file, &self.attachments_file]
            .into_iter()
            .flatten()
        {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// The control line for `out` with client id `id`; `text_file` replaces the inline text.
pub fn control_line(out: &Outgoing, id: &str, text_file: Option<PathBuf>) -> ControlLine {
    control_line_with(out, id, text_file, None)
}

/// [`control_line`], with `attachments_file` replacing the inline attachment list.
fn control_line_with(
    out: &Outgoing,
    id: &str,
    text_file: Option<PathBuf>,
    attachments_file: Option<PathBuf>,
) -> ControlLine {
    let id = Some(id.to_string());
    let split = |t: &str| match &text_file {
        Some(f) => (None, Some(f.clone())),
        None => (Some(t.to_string()), None),
    };
    match out {
        Outgoing::User {
            text,
            sender,
            tier,
            attachments,
        } => {
            let (text, text_file) = split(text);
            let attachments = match attachments_file {
                Some(_) => Vec::new(),
                None => attachments.clone(),
            };
            ControlLine::User {
                id,
                text,
                text_file,
                sender: Some(sender.clone()),
                tier: tier.clone(),
                attachments,
                attachments_file,
            }
        }
        Outgoing::System { text, tier } => {
            let (text, text_file) = split(text);
            ControlLine::System {
                id,
                text,
                text_file,
                tier: tier.clone(),
            }
        }
        Outgoing::Reset { target } => ControlLine::Reset {
            id,
            target: target.clone(),
        },
        Outgoing::SessionModel { key, model } => ControlLine::SessionModel {
            id,
            key: key.clone(),
            model: model.clone(),
        },
        Outgoing::SessionSkill { key, name, enabled } => ControlLine::SessionSkill {
            id,
            key: key.clone(),
            name: name.clone(),
            enabled: *enabled,
        },
    }
}

/// The inbox file for the text of message `id`.
pub fn inbox_path(state_dir: &Path, id: &str) -> PathBuf {
    state_dir.join("inbox").join(format!("{id}.txt"))
}

/// The inbox file for the attachment list of message `id`.
pub fn attachments_path(state_dir: &Path, id: &str) -> PathBuf {
    state_dir
        .join("inbox")
        .join(format!("{id}.attachments.json"))
}

/// Encode `out` with id `id`. If the line (newline included) is over `PIPE_BUF`, the text is
/// written to `state_dir/inbox/<id>.txt` (directory 0700, file 0600, fsynced) and the line
/// carries `text_file` instead; if that is still too long, the attachment list goes to
/// `state_dir/inbox/<id>.attachments.json` as well, as `attachments_file` (SPEC §10.1). A line
/// still too long is an error (and nothing is written).
pub fn prepare(out: &Outgoing, id: &str, state_dir: &Path) -> Result<Prepared, CliError> {
    let bytes = control_line(out, id, None).encode();
    if bytes.len() <= PIPE_BUF {
        return Ok(Prepared {
            id: id.to_string(),
            bytes,
            text_file: None,
            attachments_file: None,
        });
    }
    let too_long = |len| CliError::LineTooLong { len, max: PIPE_BUF };
    let Some(text) = out.text() else {
        return Err(too_long(bytes.len()));
    };
    let attachments = match out {
        Outgoing::User { attachments, .. } if !attachments.is_empty() => Some(attachments),
        _ => None,
    };
    let text_path = inbox_path(state_dir, id);
    let list_path = attachments_path(state_dir, id);
    // The fewest files that make the line fit: the text, the list, or both. The size is
    // checked first, so nothing is written for a line that cannot be sent anyway.
    let mut tries = vec![(Some(text_path.clone()), None)];
    if attachments.is_some() {
        tries.push((None, Some(list_path.clone())));
        tries.push((Some(text_path), Some(list_path)));
    }
    let mut len = bytes.len();
    for (text_file, list_file) in tries {
        let bytes = control_line_with(out, id, text_file.clone(), list_file.clone()).encode();
        if bytes.len() > PIPE_BUF {
            len = len.min(bytes.len());
            continue;
        }
        if let Some(path) = &text_file {
            write_private(path, text.as_bytes())?;
        }
        if let (Some(path), Some(list)) = (&list_file, attachments) {
            let json = serde_json::to_vec(list).expect("paths encode as JSON");
            if let Err(e) = write_private(path, &json) {
                if let Some(t) = &text_file {
                    let _ = std::fs::remove_file(t);
                }
                return Err(e);
            }
        }
        return Ok(Prepared {
            id: id.to_string(),
            bytes,
            text_file,
            attachments_file: list_file,
        });
    }
    Err(too_long(len))
}

/// Write `bytes` to a new file (mode 0600, in a 0700 directory created if needed) and fsync
/// the file and its directory.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fsutil::create_private_dir(dir)
        .map_err(|e| CliError::io(format!("create {}", dir.display()), e))?;
    let write = || -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fsutil::fsync_dir(dir)
    };
    write().map_err(|e| CliError::io(format!("write {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::parse_line;
    use std::os::unix::fs::PermissionsExt;

    const ID: &str = "0b6c1f9e-3c1d-4e57-9a51-1f7d3a5e2c10";

    fn user(text: &str) -> Outgoing {
        Outgoing::User {
            text: text.into(),
            sender: "cli".into(),
            tier: None,
            attachments: vec![],
        }
    }

    /// The length of the encoded line for a text of `n` ASCII bytes.
    fn encoded_len(n: usize) -> usize {
        control_line(&user(&"x".repeat(n)), ID, None).encode().len()
    }

    #[test]
    fn short_text_travels_inline() {
        let d = tempfile::tempdir().unwrap();
        let p = prepare(&user("hello"), ID, d.path()).unwrap();
        assert_eq!(p.text_file, None);
        let line = parse_line(&p.bytes[..p.bytes.len() - 1], PIPE_BUF).unwrap();
        assert_eq!(
            line,
            ControlLine::User {
                id: Some(ID.into()),
                text: Some("hello".into()),
                text_file: None,
                sender: Some("cli".into()),
                tier: None,
                attachments: vec![],
                attachments_file: None,
            }
        );
        assert!(!d.path().join("inbox").exists(), "no inbox for short lines");
    }

    #[test]
    fn pipe_buf_boundary() {
        // Find the text length whose line is exactly PIPE_BUF bytes (newline included).
        let overhead = encoded_len(0);
        let exact = PIPE_BUF - overhead;
        assert_eq!(encoded_len(exact), PIPE_BUF);

        let d = tempfile::tempdir().unwrap();
        let at = prepare(&user(&"x".repeat(exact)), ID, d.path()).unwrap();
        assert_eq!(at.bytes.len(), PIPE_BUF);
        assert_eq!(
            at.text_file, None,
            "a line of exactly PIPE_BUF bytes is inline"
        );

        let over = prepare(&user(&"x".repeat(exact + 1)), ID, d.path()).unwrap();
        let file = over
            .text_file
            .clone()
            .expect("one byte more goes to a file");
        assert!(over.bytes.len() <= PIPE_BUF);
        assert_eq!(file, d.path().join("inbox").join(format!("{ID}.txt")));
        assert_eq!(std::fs::read_to_string(&file).unwrap().len(), exact + 1);
    }

    #[test]
    fn long_text_goes_to_a_private_inbox_file_the_daemon_accepts() {
        let d = tempfile::tempdir().unwrap();
        let text = "é".repeat(10_000);
        let p = prepare(&user(&text), ID, d.path()).unwrap();
        let file = p.text_file.clone().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(&d.path().join("inbox")), 0o700);
        // The daemon side resolves it back to the same text.
        let line = parse_line(&p.bytes[..p.bytes.len() - 1], PIPE_BUF).unwrap();
        let ControlLine::User {
            text: None,
            text_file,
            ..
        } = line
        else {
            panic!("expected text_file, got {line:?}")
        };
        assert_eq!(
            crate::control::resolve_text(&None, &text_file, d.path(), u64::MAX).unwrap(),
            text
        );
        p.discard();
        assert!(!file.exists());
    }

    #[test]
    fn system_lines_spill_too() {
        let d = tempfile::tempdir().unwrap();
        let out = Outgoing::System {
            text: "y".repeat(5000),
            tier: Some("operational".into()),
        };
        let p = prepare(&out, ID, d.path()).unwrap();
        assert!(p.text_file.is_some());
        let line = parse_line(&p.bytes[..p.bytes.len() - 1], PIPE_BUF).unwrap();
        assert!(matches!(
            line,
            ControlLine::System {
                text: None,
                tier: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn a_long_attachment_list_spills_to_an_inbox_file() {
        let d = tempfile::tempdir().unwrap();
        let paths: Vec<PathBuf> = (0..100)
            .map(|i| PathBuf::from(format!("/a/rather/long/path/to/attachment-{i:03}.png")))
            .collect();
        let out = Outgoing::User {
            text: "see files".repeat(500),
            sender: "cli".into(),
            tier: None,
            attachments: paths.clone(),
        };
        let p = prepare(&out, ID, d.path()).unwrap();
        assert!(p.bytes.len() <= PIPE_BUF);
        let list = p.attachments_file.clone().expect("the list spilled");
        assert_eq!(list, attachments_path(d.path(), ID));
        let mode = std::fs::metadata(&list).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let line = parse_line(&p.bytes[..p.bytes.len() - 1], PIPE_BUF).unwrap();
        let ControlLine::User {
            attachments,
            attachments_file,
            text_file,
            ..
        } = line
        else {
            panic!("expected a user line, got {line:?}")
        };
        assert!(attachments.is_empty());
        assert!(text_file.is_some(), "the long text spilled too");
        // The daemon side reads the same list back.
        assert_eq!(
            crate::control::resolve_attachments(&attachments, &attachments_file, d.path(), 1 << 20)
                .unwrap(),
            paths
        );
        p.discard();
        assert!(!list.exists() && !inbox_path(d.path(), ID).exists());

        // A short text with a long list: only the list spills.
        let out = Outgoing::User {
            text: "see files".into(),
            sender: "cli".into(),
            tier: None,
            attachments: paths,
        };
        let p = prepare(&out, ID, d.path()).unwrap();
        assert!(
            p.attachments_file.is_some() && p.text_file.is_none(),
            "{p:?}"
        );
    }

    #[test]
    fn reset_line_and_session_keys() {
        let out = Outgoing::Reset {
            target: "all".into(),
        };
        assert_eq!(out.session_key(), None);
        let d = tempfile::tempdir().unwrap();
        let p = prepare(&out, ID, d.path()).unwrap();
        assert_eq!(
            parse_line(&p.bytes[..p.bytes.len() - 1], PIPE_BUF).unwrap(),
            ControlLine::Reset {
                id: Some(ID.into()),
                target: "all".into()
            }
        );
        assert_eq!(user("x").session_key(), Some("cli"));
        let sys = Outgoing::System {
            text: "x".into(),
            tier: None,
        };
        assert_eq!(sys.session_key(), Some("system"));
    }
}
