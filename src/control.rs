//! The control FIFO line protocol (SPEC §10.1), shared by the daemon and `agent-send`.
//!
//! One JSON object per line. Writers keep each line within `PIPE_BUF` (4096 bytes) so one
//! `write` is atomic and concurrent writers never interleave; longer texts go to a file under
//! `state_dir/inbox/` and travel as `text_file`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Linux `PIPE_BUF`: writes up to this size into a FIFO are atomic.
pub const PIPE_BUF: usize = 4096;

/// The longest client `id` a control line may carry.
pub const MAX_ID_LEN: usize = 128;

/// Whether `id` is a valid client id (SPEC §16.9): 1 to [`MAX_ID_LEN`] characters of
/// `A-Z a-z 0-9 . _ : -`. `agent-send`'s UUIDs and the daemon's own ids (`tg-<bot>-<update>`)
/// all are; anything else could forge log lines or file names, so it is refused.
pub fn valid_id(id: &str) -> bool {
    (1..=MAX_ID_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// At most 40 characters of an outside string, with control characters (and quotes and
/// backslashes) escaped: safe to put in a log line or an error message.
pub fn escaped_preview(s: &str) -> String {
    let mut out: String = s.chars().take(40).flat_map(char::escape_debug).collect();
    if s.chars().nth(40).is_some() {
        out.push('…');
    }
    out
}

/// Where a message came from (SPEC §5.1). Recorded in each intake under its lowercase name
/// (`"telegram"`, `"user"`, …), which is also the `[routing]` key and the metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// A user message from the control FIFO (`agent-send`).
    User,
    /// A system event: `agent-send --system`, a notification, a `[[schedule]]` system entry.
    System,
    Telegram,
    /// A Matrix room message (SPEC §21).
    Matrix,
    /// `POST /api/v1/chat`.
    Http,
    /// The OpenAI- and Anthropic-compatible endpoints (SPEC §17).
    Api,
    /// `agentd chat`'s stdin.
    Terminal,
    /// A scheduled message (`schedule_message`, `[[schedule]]` with `to`): delivered as
    /// written, not sent to the model.
    Scheduler,
}

impl Source {
    /// The recorded name.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::User => "user",
            Source::System => "system",
            Source::Telegram => "telegram",
            Source::Matrix => "matrix",
            Source::Http => "http",
            Source::Api => "api",
            Source::Terminal => "terminal",
            Source::Scheduler => "scheduler",
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One control line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ControlLine {
    /// A user message (source `user`), session keyed by `sender` (default `cli`).
    User {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text_file: Option<PathBuf>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sender: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tier: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        attachments: Vec<PathBuf>,
        /// A JSON list of more attachment paths, in `state_dir/inbox/`: an attachment list too
        /// long for one line (SPEC §10.1); appended to `attachments`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attachments_file: Option<PathBuf>,
    },
    /// A system event (source `system`, session `system`).
    System {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text_file: Option<PathBuf>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tier: Option<String>,
    },
    /// A notification from another program, processed as a system event.
    Notify {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text_file: Option<PathBuf>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<String>,
        #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
        reference: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<serde_json::Value>,
    },
    /// Reset sessions: `all`, a session key or a session id.
    Reset {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        #[serde(default = "all")]
        target: String,
    },
    /// Decide a pending approval (SPEC §18.1): `approve`, `always` or `deny`.
    Approval {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        approval: String,
        decision: String,
    },
    /// Pin session `key`'s model; `null` or `"default"` returns to routing (SPEC §18.2).
    SessionModel {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        key: String,
        #[serde(default)]
        model: Option<String>,
    },
    /// Turn skill `name` on or off for session `key` (SPEC §18.2).
    SessionSkill {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        key: String,
        name: String,
        enabled: bool,
    },
    /// Stop the message session `key` is running, as the chat command `/stop` does (SPEC
    /// §23: an MCP client's cancellation over `agentd mcp`).
    Stop {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        key: String,
    },
}

fn all() -> String {
    "all".to_string()
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ControlError {
    #[error("line is {len} bytes, over the limit of {max}")]
    TooLong { len: usize, max: usize },
    #[error("line is not UTF-8")]
    NotUtf8,
    #[error("invalid control line: {0}")]
    Invalid(String),
    #[error(
        "invalid `id` \"{0}\": use 1-128 characters of A-Z a-z 0-9 . _ : - (agent-send uses a UUID)"
    )]
    InvalidId(String),
    #[error("{kind} line needs a non-empty `text` or `text_file`")]
    NoText { kind: &'static str },
    #[error("`text_file` {0} is outside the state directory's inbox/")]
    TextFileOutside(PathBuf),
    #[error("cannot read `text_file` {path}: {error}")]
    TextFile { path: PathBuf, error: String },
    #[error(
        "`text_file` {path} is a {kind}, not a regular file; write the text to a regular file under inbox/"
    )]
    TextFileNotRegular { path: PathBuf, kind: &'static str },
    #[error(
        "`text_file` {path} is {len} bytes, over the limit of {max} ([http] max_body_bytes); send a shorter text"
    )]
    TextFileTooLarge { path: PathBuf, len: u64, max: u64 },
}

impl ControlLine {
    /// The client id, if any.
    pub fn id(&self) -> Option<&str> {
        match self {
            ControlLine::User { id, .. }
            | ControlLine::System { id, .. }
            | ControlLine::Notify { id, .. }
            | ControlLine::Reset { id, .. }
            | ControlLine::Approval { id, .. }
            | ControlLine::SessionModel { id, .. }
            | ControlLine::SessionSkill { id, .. }
            | ControlLine::Stop { id, .. } => id.as_deref(),
        }
    }

    pub fn set_id(&mut self, new: String) {
        match self {
            ControlLine::User { id, .. }
            | ControlLine::System { id, .. }
            | ControlLine::Notify { id, .. }
            | ControlLine::Reset { id, .. }
            | ControlLine::Approval { id, .. }
            | ControlLine::SessionModel { id, .. }
            | ControlLine::SessionSkill { id, .. }
            | ControlLine::Stop { id, .. } => *id = Some(new),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            ControlLine::User { .. } => "user",
            ControlLine::System { .. } => "system",
            ControlLine::Notify { .. } => "notify",
            ControlLine::Reset { .. } => "reset",
            ControlLine::Approval { .. } => "approval",
            ControlLine::SessionModel { .. } => "session_model",
            ControlLine::SessionSkill { .. } => "session_skill",
            ControlLine::Stop { .. } => "stop",
        }
    }

    /// Serialize as one line including the trailing newline.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("control lines always serialize");
        v.push(b'\n');
        v
    }
}

/// Parse one line (without its newline). Checks size, UTF-8, JSON shape and that message
/// lines carry text.
pub fn parse_line(line: &[u8], max_bytes: usize) -> Result<ControlLine, ControlError> {
    if line.len() > max_bytes {
        return Err(ControlError::TooLong {
            len: line.len(),
            max: max_bytes,
        });
    }
    let s = std::str::from_utf8(line).map_err(|_| ControlError::NotUtf8)?;
    let parsed: ControlLine =
        serde_json::from_str(s.trim()).map_err(|e| ControlError::Invalid(e.to_string()))?;
    if let Some(id) = parsed.id()
        && !valid_id(id)
    {
        return Err(ControlError::InvalidId(escaped_preview(id)));
    }
    let has_text = |text: &Option<String>, file: &Option<PathBuf>| {
        text.as_deref().is_some_and(|t| !t.trim().is_empty()) || file.is_some()
    };
    match &parsed {
        ControlLine::User {
            text, text_file, ..
        }
        | ControlLine::System {
            text, text_file, ..
        }
        | ControlLine::Notify {
            text, text_file, ..
        } if !has_text(text, text_file) => Err(ControlError::NoText {
            kind: parsed.kind(),
        }),
        _ => Ok(parsed),
    }
}

/// Resolve the text of a line: `text`, or the content of `text_file`, which must lie inside
/// `state_dir/inbox/` (resolved, so symlinks cannot escape), be a regular file and hold at most
/// `max_bytes` bytes of UTF-8 (SPEC §16.9). The file is opened non-blocking and without
/// following a symlink, and checked on the open descriptor, so a FIFO or device named as
/// `text_file` is refused at once instead of stalling intake.
pub fn resolve_text(
    text: &Option<String>,
    text_file: &Option<PathBuf>,
    state_dir: &Path,
    max_bytes: u64,
) -> Result<String, ControlError> {
    if let Some(t) = text
        && !t.trim().is_empty()
    {
        return Ok(t.clone());
    }
    let Some(file) = text_file else {
        return Err(ControlError::NoText { kind: "message" });
    };
    let inbox = state_dir
        .join("inbox")
        .canonicalize()
        .map_err(|e| ControlError::TextFile {
            path: file.clone(),
            error: e.to_string(),
        })?;
    let real = file.canonicalize().map_err(|e| ControlError::TextFile {
        path: file.clone(),
        error: e.to_string(),
    })?;
    if !real.starts_with(&inbox) {
        return Err(ControlError::TextFileOutside(file.clone()));
    }
    read_regular(&real, max_bytes).map_err(|e| match e {
        ReadError::Io(e) => ControlError::TextFile {
            path: file.clone(),
            error: e.to_string(),
        },
        ReadError::NotRegular(kind) => ControlError::TextFileNotRegular {
            path: file.clone(),
            kind,
        },
        ReadError::TooLarge(len) => ControlError::TextFileTooLarge {
            path: file.clone(),
            len,
            max: max_bytes,
        },
    })
}

/// The attachments of a user line: `attachments`, then the paths listed in `attachments_file`
/// (a JSON array of strings), which is checked like `text_file` (inside `state_dir/inbox/`, a
/// regular file of at most `max_bytes`).
pub fn resolve_attachments(
    attachments: &[PathBuf],
    attachments_file: &Option<PathBuf>,
    state_dir: &Path,
    max_bytes: u64,
) -> Result<Vec<PathBuf>, ControlError> {
    let mut all = attachments.to_vec();
    let Some(file) = attachments_file else {
        return Ok(all);
    };
    let listed = resolve_text(&None, &Some(file.clone()), state_dir, max_bytes)?;
    let more: Vec<PathBuf> = serde_json::from_str(&listed).map_err(|e| ControlError::TextFile {
        path: file.clone(),
        error: format!("not a JSON list of attachment paths: {e}"),
    })?;
    all.extend(more);
    Ok(all)
}

enum ReadError {
    Io(std::io::Error),
    NotRegular(&'static str),
    TooLarge(u64),
}

/// Read a regular file of at most `max` bytes as UTF-8: opened with `O_NONBLOCK | O_NOFOLLOW`
/// (a FIFO's open cannot block, a symlink swapped in after resolving is refused), its type and
/// size checked with `fstat` on that descriptor, and never more than `max + 1` bytes read (a
/// file that grows after the check is refused too).
fn read_regular(path: &Path, max: u64) -> Result<String, ReadError> {
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let flags = nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_NOFOLLOW;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits())
        .open(path)
        .map_err(ReadError::Io)?;
    let md = f.metadata().map_err(ReadError::Io)?;
    let ft = md.file_type();
    if !ft.is_file() {
        let kind = if ft.is_fifo() {
            "FIFO"
        } else if ft.is_dir() {
            "directory"
        } else if ft.is_socket() {
            "socket"
        } else if ft.is_char_device() || ft.is_block_device() {
            "device"
        } else {
            "special file"
        };
        return Err(ReadError::NotRegular(kind));
    }
    if md.len() > max {
        return Err(ReadError::TooLarge(md.len()));
    }
    let mut bytes = Vec::with_capacity(md.len() as usize);
    f.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > max {
        return Err(ReadError::TooLarge(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|_| {
        ReadError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not UTF-8",
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recorded spelling of each source is its old string (trails stay readable).
    #[test]
    fn sources_keep_their_recorded_names() {
        for s in [
            Source::User,
            Source::System,
            Source::Telegram,
            Source::Matrix,
            Source::Http,
            Source::Terminal,
            Source::Scheduler,
        ] {
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()));
            assert_eq!(serde_json::from_str::<Source>(&json).unwrap(), s);
        }
    }
    use proptest::prelude::*;

    #[test]
    fn parses_each_type() {
        let l = parse_line(
            br#"{"id":"u1","type":"user","text":"hi","sender":"alice"}"#,
            4096,
        )
        .unwrap();
        assert_eq!(l.id(), Some("u1"));
        assert_eq!(l.kind(), "user");
        assert!(matches!(
            parse_line(br#"{"type":"system","text":"beat"}"#, 4096).unwrap(),
            ControlLine::System { .. }
        ));
        let n = parse_line(
            br#"{"type":"notify","text":"x","source":"ci","ref":"r1","data":{"a":1}}"#,
            4096,
        )
        .unwrap();
        assert!(matches!(n, ControlLine::Notify { reference: Some(ref r), .. } if r == "r1"));
        assert_eq!(
            parse_line(br#"{"type":"reset"}"#, 4096).unwrap(),
            ControlLine::Reset {
                id: None,
                target: "all".into()
            }
        );
        let stop = parse_line(br#"{"id":"s1","type":"stop","key":"mcp:x"}"#, 4096).unwrap();
        assert_eq!(stop.kind(), "stop");
        assert_eq!(
            stop,
            ControlLine::Stop {
                id: Some("s1".into()),
                key: "mcp:x".into()
            }
        );
    }

    #[test]
    fn rejects_bad_lines() {
        assert!(matches!(
            parse_line(b"not json", 4096),
            Err(ControlError::Invalid(_))
        ));
        assert!(matches!(
            parse_line(br#"{"type":"launch","text":"x"}"#, 4096),
            Err(ControlError::Invalid(_))
        ));
        assert!(matches!(
            parse_line(br#"{"type":"user","text":"x","bogus":1}"#, 4096),
            Err(ControlError::Invalid(_))
        ));
        assert!(matches!(
            parse_line(br#"{"type":"user","text":"  "}"#, 4096),
            Err(ControlError::NoText { .. })
        ));
        assert!(matches!(
            parse_line(&[b'x'; 5000], 4096),
            Err(ControlError::TooLong { .. })
        ));
        assert_eq!(parse_line(&[0xff, 0xfe], 4096), Err(ControlError::NotUtf8));
    }

    #[test]
    fn ids_have_a_short_safe_charset() {
        for ok in [
            "k1",
            "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
            "tg-123-456",
            "a.b_c:d",
        ] {
            assert!(valid_id(ok), "{ok}");
        }
        for bad in ["", "a b", "a\nb", "a/b", "é", &"x".repeat(129)] {
            assert!(!valid_id(bad), "{bad:?}");
        }
        let err = parse_line(
            br#"{"id":"x\n2026-11-27T00:00:00Z  INFO forged","type":"user","text":"hi"}"#,
            4096,
        )
        .unwrap_err();
        assert!(matches!(err, ControlError::InvalidId(_)), "{err}");
        let shown = err.to_string();
        assert!(!shown.contains('\n'), "{shown}");
        assert!(shown.contains(r"x\n2026"), "{shown}");
        assert!(matches!(
            parse_line(br#"{"id":"","type":"reset"}"#, 4096),
            Err(ControlError::InvalidId(_))
        ));
    }

    #[test]
    fn text_file_must_be_in_inbox() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("inbox")).unwrap();
        let inside = d.path().join("inbox/m.txt");
        std::fs::write(&inside, "long text").unwrap();
        let outside = d.path().join("secret.txt");
        std::fs::write(&outside, "no").unwrap();
        assert_eq!(
            resolve_text(&None, &Some(inside), d.path(), 1024).unwrap(),
            "long text"
        );
        assert!(matches!(
            resolve_text(&None, &Some(outside.clone()), d.path(), 1024),
            Err(ControlError::TextFileOutside(_))
        ));
        let sneaky = d.path().join("inbox/../secret.txt");
        assert!(resolve_text(&None, &Some(sneaky), d.path(), 1024).is_err());
        let link = d.path().join("inbox/link.txt");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        assert!(resolve_text(&None, &Some(link), d.path(), 1024).is_err());
    }

    /// A FIFO is refused at once (its open does not wait for a writer); so is a directory.
    #[test]
    fn text_file_must_be_a_regular_file() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("inbox")).unwrap();
        let fifo = d.path().join("inbox/pipe");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = resolve_text(&None, &Some(fifo), d.path(), 1024).unwrap_err();
        assert!(
            matches!(err, ControlError::TextFileNotRegular { kind: "FIFO", .. }),
            "{err}"
        );
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let dir = d.path().join("inbox/sub");
        std::fs::create_dir(&dir).unwrap();
        assert!(matches!(
            resolve_text(&None, &Some(dir), d.path(), 1024),
            Err(ControlError::TextFileNotRegular {
                kind: "directory",
                ..
            })
        ));
    }

    #[test]
    fn attachments_file_lists_more_paths_from_the_inbox() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("inbox")).unwrap();
        let list = d.path().join("inbox").join("x.attachments.json");
        std::fs::write(&list, r#"["/w/b.png","/w/c.png"]"#).unwrap();
        let got = resolve_attachments(
            &[PathBuf::from("/w/a.png")],
            &Some(list.clone()),
            d.path(),
            1 << 20,
        )
        .unwrap();
        assert_eq!(got, ["/w/a.png", "/w/b.png", "/w/c.png"].map(PathBuf::from));
        assert_eq!(
            resolve_attachments(&[], &None, d.path(), 1 << 20).unwrap(),
            Vec::<PathBuf>::new()
        );
        // Outside the inbox: refused, like text_file.
        let outside = d.path().join("list.json");
        std::fs::write(&outside, "[]").unwrap();
        assert_eq!(
            resolve_attachments(&[], &Some(outside.clone()), d.path(), 1 << 20),
            Err(ControlError::TextFileOutside(outside))
        );
        std::fs::write(&list, "not json").unwrap();
        assert!(resolve_attachments(&[], &Some(list), d.path(), 1 << 20).is_err());
    }

    #[test]
    fn text_file_is_size_capped() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("inbox")).unwrap();
        let big = d.path().join("inbox/big.txt");
        std::fs::write(&big, "x".repeat(2000)).unwrap();
        let err = resolve_text(&None, &Some(big.clone()), d.path(), 1000).unwrap_err();
        assert_eq!(
            err,
            ControlError::TextFileTooLarge {
                path: big.clone(),
                len: 2000,
                max: 1000
            }
        );
        assert!(err.to_string().contains("max_body_bytes"), "{err}");
        assert_eq!(
            resolve_text(&None, &Some(big), d.path(), 2000)
                .unwrap()
                .len(),
            2000
        );
    }

    /// Text a message line accepts: not blank.
    fn text() -> impl Strategy<Value = String> {
        "\\PC{1,60}".prop_filter("not blank", |t| !t.trim().is_empty())
    }

    fn opt(s: &'static str) -> impl Strategy<Value = Option<String>> {
        proptest::option::of(s)
    }

    /// Every kind of control line, with text inline or in a file.
    fn any_line() -> impl Strategy<Value = ControlLine> {
        let body = prop_oneof![
            text().prop_map(|t| (Some(t), None)),
            "/[a-z]{1,8}/inbox/[a-z]{1,8}".prop_map(|p| (None, Some(PathBuf::from(p)))),
        ];
        prop_oneof![
            (
                opt("[a-z0-9-]{1,36}"),
                body.clone(),
                opt("\\PC{1,20}"),
                opt("[a-z]{1,12}"),
                proptest::collection::vec("/[a-z]{1,8}/[a-z.]{1,12}", 0..3)
            )
                .prop_map(|(id, (text, text_file), sender, tier, attachments)| {
                    ControlLine::User {
                        id,
                        text,
                        text_file,
                        sender,
                        tier,
                        attachments: attachments.into_iter().map(PathBuf::from).collect(),
                        attachments_file: None,
                    }
                }),
            (opt("[a-z0-9-]{1,36}"), body.clone(), opt("[a-z]{1,12}")).prop_map(
                |(id, (text, text_file), tier)| ControlLine::System {
                    id,
                    text,
                    text_file,
                    tier
                }
            ),
            (
                opt("[a-z0-9-]{1,36}"),
                body,
                opt("\\PC{1,20}"),
                opt("\\PC{1,20}"),
                // `"data": null` reads as no data, so null is not generated.
                proptest::option::of(
                    crate::proptest_json::any_json().prop_filter("not null", |v| !v.is_null())
                )
            )
                .prop_map(|(id, (text, text_file), source, reference, data)| {
                    ControlLine::Notify {
                        id,
                        text,
                        text_file,
                        source,
                        reference,
                        data,
                    }
                }),
            (opt("[a-z0-9-]{1,36}"), "\\PC{1,40}")
                .prop_map(|(id, target)| ControlLine::Reset { id, target }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse_line(&bytes, 512);
        }

        /// Every line a writer can encode is read back as written (SPEC §10.1 line shapes).
        #[test]
        fn every_line_kind_round_trips(line in any_line()) {
            let enc = line.encode();
            prop_assert_eq!(enc.last(), Some(&b'\n'));
            prop_assert!(!enc[..enc.len() - 1].contains(&b'\n'), "one line");
            prop_assert_eq!(parse_line(&enc[..enc.len() - 1], 1 << 20), Ok(line));
        }

        /// A line a buggy writer broke (a field dropped, a wrong type, an unknown key) is either a
        /// line that re-encodes to itself, or refused with `Invalid` / `NoText` — never a panic,
        /// and never a message line without text.
        #[test]
        fn broken_lines_are_parsed_or_refused(line in any_line(), edits in crate::proptest_json::edits(3)) {
            let doc = crate::proptest_json::mutate(&serde_json::to_value(&line).unwrap(), &edits);
            let bytes = doc.to_string();
            match parse_line(bytes.as_bytes(), 1 << 20) {
                Ok(parsed) => {
                    if let ControlLine::User { text, text_file, .. }
                    | ControlLine::System { text, text_file, .. }
                    | ControlLine::Notify { text, text_file, .. } = &parsed
                    {
                        prop_assert!(text.as_deref().is_some_and(|t| !t.trim().is_empty()) || text_file.is_some());
                    }
                    let enc = parsed.encode();
                    prop_assert_eq!(parse_line(&enc[..enc.len() - 1], 1 << 20), Ok(parsed));
                }
                Err(e) => prop_assert!(
                    // An edit can also empty or garble the id (`InvalidId`, issue 12's charset).
                    matches!(e, ControlError::Invalid(_) | ControlError::NoText { .. } | ControlError::InvalidId(_)),
                    "{e:?}"
                ),
            }
        }

        /// The documented errors: over the limit → `TooLong` (checked first, whatever the bytes),
        /// not UTF-8 → `NotUtf8`.
        #[test]
        fn size_and_encoding_errors_are_the_documented_ones(
            bytes in proptest::collection::vec(any::<u8>(), 1..300),
            max in 0usize..300,
        ) {
            let got = parse_line(&bytes, max);
            if bytes.len() > max {
                prop_assert_eq!(got, Err(ControlError::TooLong { len: bytes.len(), max }));
            } else if std::str::from_utf8(&bytes).is_err() {
                prop_assert_eq!(got, Err(ControlError::NotUtf8));
            }
        }

        #[test]
        fn encode_parse_roundtrip(text in "[^\u{0}]{1,200}", sender in "[a-z]{1,10}") {
            prop_assume!(!text.trim().is_empty());
            let l = ControlLine::User { id: Some("x".into()), text: Some(text), text_file: None,
                sender: Some(sender), tier: None, attachments: vec![], attachments_file: None };
            let enc = l.encode();
            prop_assert_eq!(parse_line(&enc[..enc.len() - 1], 1 << 20).unwrap(), l);
        }
    }
}
