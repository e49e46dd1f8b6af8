//! `--history KEY_OR_ID [--full]`: the conversation of one session from its JSONL trail, live or
//! archived (SPEC §7). The target must look like a session key or id: no path or glob
//! characters, so it can never name a file outside the sessions directory.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::CliError;
use super::output::{Output, abbreviate};
use super::wait::ARCHIVE_DIR;
use crate::llm::{Message, UserBlock};
use crate::session::event::{Event, TrailLine};
use crate::session::{index, trail};

/// Tool results and arguments are cut to this many characters unless `--full`.
pub const ABBREVIATE_CHARS: usize = 200;

/// Longest accepted key or id.
const MAX_TARGET_LEN: usize = 256;

/// Whether `s` may name a session: non-empty, at most 256 bytes, no control characters, no
/// `/` or `\`, no `..`, no glob characters (`*?[]{}`).
pub fn is_valid_target(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_TARGET_LEN
        && !s.contains("..")
        && !s
            .chars()
            .any(|c| c.is_control() || matches!(c, '/' | '\\' | '*' | '?' | '[' | ']' | '{' | '}'))
}

/// Where a session's trail is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub session_id: String,
    /// The sessions directory, or its `.archive/`.
    pub dir: PathBuf,
    pub archived: bool,
}

/// Find `target` by key or id in `sessions.json`, else as an id in `.archive/`.
pub fn locate(sessions_dir: &Path, target: &str) -> Result<Located, CliError> {
    if !is_valid_target(target) {
        return Err(CliError::Usage(format!(
            "{target:?} is not a valid session key or id (no '/', '\\', '..', glob characters \
             or control characters)"
        )));
    }
    let idx = super::read_index(sessions_dir)?;
    if let Some((_, entry)) = index::lookup(&idx, target) {
        return Ok(Located {
            session_id: entry.session_id.clone(),
            dir: sessions_dir.to_path_buf(),
            archived: false,
        });
    }
    let archive = sessions_dir.join(ARCHIVE_DIR);
    if index::is_valid_session_id(target) {
        let files = trail::trail_files(&archive, target)
            .map_err(|e| CliError::io(format!("list {}", archive.display()), e))?;
        if !files.is_empty() {
            return Ok(Located {
                session_id: target.to_string(),
                dir: archive,
                archived: true,
            });
        }
    }
    Err(CliError::NotFound(format!(
        "no session with key or id {target:?} (looked in {} and {}/)",
        sessions_dir.join(index::INDEX_FILE).display(),
        archive.display()
    )))
}

/// A session's trail.
#[derive(Debug, Clone, PartialEq)]
pub struct History {
    pub session_id: String,
    pub archived: bool,
    pub events: Vec<TrailLine>,
}

/// Read the trail of `target`. Blocking.
pub fn history(sessions_dir: &Path, target: &str) -> Result<History, CliError> {
    let loc = locate(sessions_dir, target)?;
    let events = trail::read_trail(&loc.dir, &loc.session_id).map_err(|e| {
        CliError::io(
            format!(
                "read the trail of session {} in {}",
                loc.session_id,
                loc.dir.display()
            ),
            e,
        )
    })?;
    Ok(History {
        session_id: loc.session_id,
        archived: loc.archived,
        events,
    })
}

/// `{session_id, events:[…]}`; without `full`, tool result contents are abbreviated.
pub fn to_json(h: &History, full: bool) -> serde_json::Value {
    let events: Vec<serde_json::Value> = h
        .events
        .iter()
        .map(|l| {
            let mut l = l.clone();
            if !full && let Event::ToolResult { results, .. } = &mut l.event {
                for r in results {
                    r.content = abbreviate(&r.content, ABBREVIATE_CHARS);
                }
            }
            serde_json::to_value(&l).unwrap_or_default()
        })
        .collect();
    json!({"session_id": h.session_id, "events": events})
}

/// Text (or JSON) for `--history`.
pub fn render(h: &History, full: bool, as_json: bool) -> Output {
    if as_json {
        return Output::json(&to_json(h, full));
    }
    let mut out = String::new();
    let state = if h.archived { " (archived)" } else { "" };
    let _ = writeln!(out, "session {}{state}", h.session_id);
    for l in &h.events {
        render_line(&mut out, l, full);
    }
    Output::stdout(out)
}

/// Label column width.
const LABEL: usize = 10;

fn entry(out: &mut String, time: &str, label: &str, text: &str) {
    let indent = " ".repeat(time.len() + 2 + LABEL + 1);
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("");
    let _ = writeln!(out, "{time}  {label:<LABEL$} {first}");
    for l in lines {
        let _ = writeln!(out, "{indent}{l}");
    }
}

fn time_of(ts: &str) -> String {
    chrono::DateTime::parse_from_rfc3339(ts)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|_| ts.to_string())
}

fn cut(s: &str, full: bool) -> String {
    if full {
        s.to_string()
    } else {
        abbreviate(s, ABBREVIATE_CHARS)
    }
}

fn render_line(out: &mut String, l: &TrailLine, full: bool) {
    let t = time_of(&l.ts);
    match &l.event {
        Event::Session { key, model, .. } => entry(
            out,
            &t,
            "session",
            &format!("started (key {key}, model {model})"),
        ),
        Event::Intake(i) if full => entry(
            out,
            &t,
            "intake",
            &format!("[{} from {}, id {}] {}", i.source, i.from, i.id, i.text),
        ),
        Event::Intake(_) => {}
        Event::Message(m) => match &m.message {
            Message::User { content } => {
                let text = content
                    .iter()
                    .map(|b| match b {
                        UserBlock::Text { text } => text.as_str(),
                        UserBlock::Image { placeholder, .. } => placeholder.as_str(),
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                let from = m
                    .from
                    .as_deref()
                    .map(|f| format!("[{f}] "))
                    .unwrap_or_default();
                entry(out, &t, "user", &format!("{from}{text}"));
            }
            Message::Assistant {
                text,
                tool_calls,
                thinking,
                ..
            } => {
                let mut body = String::new();
                if full {
                    for th in thinking {
                        if let Some(x) = &th.thinking {
                            let _ = writeln!(body, "(thinking) {x}");
                        }
                    }
                }
                if m.silent {
                    body.push_str("(silent) ");
                }
                body.push_str(text);
                for c in tool_calls {
                    let args = serde_json::to_string(&c.arguments).unwrap_or_default();
                    if !body.is_empty() && !body.ends_with('\n') {
                        body.push('\n');
                    }
                    let _ = write!(body, "→ {}({})", c.name, cut(&args, full));
                }
                entry(out, &t, "assistant", &body);
            }
            Message::ToolResults { results, notice } => {
                tool_results(out, &t, results, notice.as_deref(), full)
            }
        },
        Event::ToolResult { results, notice } => {
            tool_results(out, &t, results, notice.as_deref(), full)
        }
        Event::Delivery {
            channel,
            status,
            detail,
            ..
        } if full => {
            let status = serde_json::to_value(status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let detail = detail
                .as_deref()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default();
            entry(out, &t, "delivery", &format!("{channel}: {status}{detail}"));
        }
        Event::Delivery { .. } => {}
        Event::Failure { error, reply, .. } => entry(
            out,
            &t,
            "failure",
            &format!("{error}\nthe sender was told: {reply}"),
        ),
        Event::Compaction { summary, removed } => entry(
            out,
            &t,
            "compaction",
            &format!("{removed} message(s) summarised: {}", cut(summary, full)),
        ),
        Event::Reset { reason } => entry(out, &t, "reset", reason),
    }
}

fn tool_results(
    out: &mut String,
    t: &str,
    results: &[crate::llm::ToolResult],
    notice: Option<&str>,
    full: bool,
) {
    for r in results {
        let err = if r.is_error { " error" } else { "" };
        entry(
            out,
            t,
            "tool",
            &format!("[{}{err}] {}", r.tool_call_id, cut(&r.content, full)),
        );
    }
    if let Some(n) = notice {
        entry(out, t, "notice", n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::{ToolCall, ToolResult};
    use crate::session::SessionStore;
    use crate::session::event::{Intake, MessageEvent};
    use chrono_tz::Tz;
    use proptest::prelude::*;

    #[test]
    fn target_validation() {
        for ok in [
            "cli",
            "alice",
            "tg:12345",
            "http-bob",
            "Jane Doe",
            "0192f0c4-aaaa-7bbb",
        ] {
            assert!(is_valid_target(ok), "{ok}");
        }
        for bad in [
            "", "../x", "a/b", "..", "a\\b", "*", "id*", "?", "[ab]", "{a,b}", "a\nb", "a\0b",
        ] {
            assert!(!is_valid_target(bad), "{bad:?}");
        }
        assert!(!is_valid_target(&"x".repeat(MAX_TARGET_LEN + 1)));
        let d = tempfile::tempdir().unwrap();
        let err = locate(d.path(), "../etc").unwrap_err();
        assert!(matches!(err, CliError::Usage(_)));
        assert_eq!(err.exit_code(), 2);
    }

    proptest! {
        #[test]
        fn valid_targets_never_leave_the_directory(s in "\\PC{0,40}") {
            if is_valid_target(&s) {
                let p = Path::new("/sessions").join(format!("{s}.2026-01-01.jsonl"));
                prop_assert_eq!(p.parent(), Some(Path::new("/sessions")));
                prop_assert!(!s.contains('*') && !s.contains('/'));
            }
        }
    }

    fn sample(store: &SessionStore, key: &str) -> String {
        let h = store.get_or_create(key, "primary").unwrap();
        h.append(Event::Intake(Intake {
            id: "i1".into(),
            source: crate::control::Source::User,
            from: key.into(),
            text: "read it".into(),
            tier: None,
            attachments: vec![],
            route: None,
        }))
        .unwrap();
        let mut u = MessageEvent::new(Message::user_text("read it"));
        u.from = Some(key.into());
        h.append(Event::Message(u)).unwrap();
        h.append(Event::Message(MessageEvent::new(Message::Assistant {
            text: "Reading.".into(),
            tool_calls: vec![ToolCall {
                id: "t1".into(),
                name: "read".into(),
                arguments: json!({"path": "notes.md"}),
            }],
            thinking: vec![],
            usage: None,
        })))
        .unwrap();
        h.append(Event::ToolResult {
            results: vec![ToolResult {
                tool_call_id: "t1".into(),
                content: "z".repeat(500),
                is_error: false,
            }],
            notice: None,
        })
        .unwrap();
        let mut fin = MessageEvent::new(Message::Assistant {
            text: "It says zzz.".into(),
            tool_calls: vec![],
            thinking: vec![],
            usage: None,
        });
        fin.is_final = true;
        fin.reply_to = vec!["i1".into()];
        h.append(Event::Message(fin)).unwrap();
        h.id.clone()
    }

    #[test]
    fn history_by_key_and_id_text_and_json() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Tz::UTC).unwrap();
        let id = sample(&store, "alice");
        let by_key = history(d.path(), "alice").unwrap();
        let by_id = history(d.path(), &id).unwrap();
        assert_eq!(by_key, by_id);
        assert!(!by_key.archived);
        assert_eq!(by_key.events.len(), 6);

        let text = render(&by_key, false, false).stdout;
        assert!(text.contains("[alice] read it"), "{text}");
        assert!(text.contains("→ read({\"path\":\"notes.md\"})"), "{text}");
        assert!(text.contains("[300 more chars]"), "{text}");
        assert!(text.contains("It says zzz."), "{text}");
        assert!(!text.contains("intake"), "intake only with --full: {text}");
        let full = render(&by_key, true, false).stdout;
        assert!(full.contains(&"z".repeat(500)));
        assert!(full.contains("intake"));

        let v = to_json(&by_key, false);
        assert_eq!(v["session_id"], id.as_str());
        let events = v["events"].as_array().unwrap();
        assert_eq!(events.len(), 6);
        assert_eq!(events[0]["type"], "session");
        let content = events[4]["results"][0]["content"].as_str().unwrap();
        assert!(content.len() < 300, "abbreviated without --full");
        let v = to_json(&by_key, true);
        assert_eq!(
            v["events"][4]["results"][0]["content"]
                .as_str()
                .unwrap()
                .len(),
            500
        );
    }

    #[test]
    fn archived_sessions_are_found_by_id_only() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Tz::UTC).unwrap();
        let id = sample(&store, "bob");
        store.archive("bob", "reset").unwrap();
        let h = history(d.path(), &id).unwrap();
        assert!(h.archived);
        assert!(matches!(
            h.events.last().unwrap().event,
            Event::Reset { .. }
        ));
        assert!(render(&h, false, false).stdout.contains("(archived)"));
        let err = history(d.path(), "bob").unwrap_err();
        assert!(matches!(err, CliError::NotFound(_)), "{err}");
        assert_eq!(err.exit_code(), 1);
    }
}
