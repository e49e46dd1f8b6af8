//! One session's conversation from its JSONL trail, live or archived (SPEC §7)
//! (`agent-send --history`, `GET /api/v1/sessions/{id}/history`). The target must look like a
//! session key or id: no path or glob characters, so it can never name a file outside the
//! sessions directory.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::ReportError;
use crate::session::event::{Event, TrailLine};
use crate::session::{ARCHIVE_DIR, index, trail};

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

/// Find `target` by key or id in `sessions.json`, else as the id of a trail in the sessions
/// directory or in `.archive/`.
pub fn locate(sessions_dir: &Path, target: &str) -> Result<Located, ReportError> {
    if !is_valid_target(target) {
        return Err(ReportError::InvalidTarget(format!(
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
        // A live trail the index does not name yet (the daemon writes the index in the
        // background, a moment after a session's first intake), then the archive.
        for (dir, archived) in [(sessions_dir, false), (archive.as_path(), true)] {
            let files = trail::trail_files(dir, target)
                .map_err(|e| ReportError::io(format!("list {}", dir.display()), e))?;
            if !files.is_empty() {
                return Ok(Located {
                    session_id: target.to_string(),
                    dir: dir.to_path_buf(),
                    archived,
                });
            }
        }
    }
    Err(ReportError::NotFound(format!(
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
pub fn history(sessions_dir: &Path, target: &str) -> Result<History, ReportError> {
    let loc = locate(sessions_dir, target)?;
    let events = trail::read_trail(&loc.dir, &loc.session_id).map_err(|e| {
        ReportError::io(
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

/// Shorten `s` to at most `max` characters, saying how much was left out.
pub fn abbreviate(s: &str, max: usize) -> String {
    let total = s.chars().count();
    if total <= max {
        return s.to_string();
    }
    let kept: String = s.chars().take(max).collect();
    format!("{kept}… [{} more chars]", total - max)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::message::{Message, ToolCall, ToolResult};
    use crate::session::SessionStore;
    use crate::session::event::{Intake, MessageEvent};
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
        assert!(matches!(err, ReportError::InvalidTarget(_)));
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

    #[test]
    fn abbreviate_counts_characters() {
        assert_eq!(abbreviate("short", 10), "short");
        assert_eq!(abbreviate("ééééé", 2), "éé… [3 more chars]");
        assert_eq!(abbreviate("", 0), "");
    }

    /// A session `key` with an intake, a tool call with a 500-character result and a final
    /// answer (six trail lines); returns its id.
    pub(crate) fn sample(store: &SessionStore, key: &str) -> String {
        let h = store.get_or_create(key, "primary").unwrap();
        h.append(Event::Intake(Intake {
            id: "i1".into(),
            source: crate::control::Source::User,
            from: key.into(),
            text: "read it".into(),
            tier: None,
            attachments: vec![],
            route: None,
            notify_meta: None,
            relayed_from: None,
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
                images: Vec::new(),
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
    fn history_by_key_and_id_and_json() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), crate::zone::Zone::utc()).unwrap();
        let id = sample(&store, "alice");
        // Found by id while the index (written in the background) may not name it yet.
        assert_eq!(locate(d.path(), &id).unwrap().session_id, id);
        store.flush_index();
        let by_key = history(d.path(), "alice").unwrap();
        let by_id = history(d.path(), &id).unwrap();
        assert_eq!(by_key, by_id);
        assert!(!by_key.archived);
        assert_eq!(by_key.events.len(), 6);

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
        let store = SessionStore::open(d.path(), crate::zone::Zone::utc()).unwrap();
        let id = sample(&store, "bob");
        store.archive("bob", "reset").unwrap();
        let h = history(d.path(), &id).unwrap();
        assert!(h.archived);
        assert!(matches!(
            h.events.last().unwrap().event,
            Event::Reset { .. }
        ));
        let err = history(d.path(), "bob").unwrap_err();
        assert!(matches!(err, ReportError::NotFound(_)), "{err}");
    }
}
