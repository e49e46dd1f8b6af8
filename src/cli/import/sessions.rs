//! OpenClaw sessions (`agents/<agent>/sessions/<id>.jsonl`, keys in `sessions.json`) as
//! archived agentd sessions: one trail in `sessions/.archive/` per session, with the user
//! turns, the answers, the tool calls and their results, at their original times. Archived
//! trails are what `agent-send --history` shows and what `agentd consolidate` reads into
//! long-term memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::source::Source;
use super::{Item, Report, SYMLINK, Section};
use crate::message::{Message, ToolCall, ToolResult};
use crate::session::event::{Event, MessageEvent};
use crate::session::trail::{TrailWriter, trail_files};
use crate::session::{ARCHIVE_DIR, index::is_valid_session_id};

/// Agents (`agents/<agent>/`) read at most.
const MAX_AGENTS: usize = 64;
/// Files of one agent's sessions directory read at most.
const MAX_SESSION_FILES: usize = 10_000;
/// A session file larger than this is skipped.
const MAX_SESSION_BYTES: u64 = 64 * 1024 * 1024;
/// `sessions.json` larger than this is not read (the sessions are imported without their keys).
const MAX_INDEX_BYTES: u64 = 16 * 1024 * 1024;

/// One session converted: its events with their times.
pub struct Converted {
    /// `openclaw:<model>` of the last answer (`openclaw` when none says).
    pub model: String,
    pub events: Vec<(DateTime<Utc>, Event)>,
    /// Lines that are not conversation (model changes, failed calls, metadata).
    pub left_out: usize,
}

/// Every session of every agent of `src`, imported into `sessions_dir/.archive/` when `apply`.
pub fn import(src: &Source, sessions_dir: &Path, cfg: &crate::config::Config, r: &mut Report) {
    let agents = match src.list(Path::new("agents"), MAX_AGENTS) {
        Ok(a) => a,
        Err(why) => return r.skip(Section::Sessions, "agents/", why),
    };
    for agent in agents {
        let dir = PathBuf::from("agents").join(&agent.name).join("sessions");
        if agent.is_symlink {
            r.skip(
                Section::Sessions,
                &format!("agents/{}", agent.name),
                SYMLINK,
            );
            continue;
        }
        if !agent.is_dir {
            continue;
        }
        let keys = session_keys(src, &dir, r);
        let files = match src.list(&dir, MAX_SESSION_FILES) {
            Ok(f) => f,
            Err(why) => {
                r.skip(Section::Sessions, &dir.display().to_string(), why);
                continue;
            }
        };
        for f in files {
            let Some(id) = f.name.strip_suffix(".jsonl") else {
                continue;
            };
            let rel = dir.join(&f.name);
            let shown = rel.display().to_string();
            if f.is_symlink {
                r.skip(Section::Sessions, &shown, SYMLINK);
                continue;
            }
            let key = keys.get(id).cloned();
            let key = key.unwrap_or_else(|| format!("agent:{}:{id}", agent.name));
            one(src, &rel, id, &key, sessions_dir, cfg, r);
        }
    }
}

/// `sessions.json`: session id → key. Entries whose id is not a plain id are reported.
fn session_keys(src: &Source, dir: &Path, r: &mut Report) -> BTreeMap<String, String> {
    let rel = dir.join("sessions.json");
    let text = match src.read_text(&rel, MAX_INDEX_BYTES) {
        Ok(Some(t)) => t,
        Ok(None) => return BTreeMap::new(),
        Err(why) => {
            r.skip(Section::Sessions, &rel.display().to_string(), why);
            return BTreeMap::new();
        }
    };
    let Ok(Value::Object(index)) = serde_json::from_str::<Value>(&text) else {
        r.skip(
            Section::Sessions,
            &rel.display().to_string(),
            "not a JSON object; sessions are imported without their keys",
        );
        return BTreeMap::new();
    };
    let mut out = BTreeMap::new();
    for (key, entry) in index {
        let Some(id) = entry.get("sessionId").and_then(Value::as_str) else {
            continue;
        };
        if is_valid_session_id(id) {
            out.insert(id.to_string(), key);
        } else {
            r.skip(
                Section::Sessions,
                &format!("{} {key:?}", rel.display()),
                format!("session id {id:?} is not a plain id (refused)"),
            );
        }
    }
    out
}

fn one(
    src: &Source,
    rel: &Path,
    id: &str,
    key: &str,
    sessions_dir: &Path,
    cfg: &crate::config::Config,
    r: &mut Report,
) {
    let shown = rel.display().to_string();
    if uuid::Uuid::parse_str(id).is_err() {
        return r.skip(
            Section::Sessions,
            &shown,
            "the file name is not a session id",
        );
    }
    let archive = sessions_dir.join(ARCHIVE_DIR);
    let taken = [sessions_dir, archive.as_path()]
        .iter()
        .any(|d| trail_files(d, id).is_ok_and(|f| !f.is_empty()));
    if taken {
        return r.skip(
            Section::Sessions,
            &shown,
            "already imported (agentd has a session with this id)",
        );
    }
    let text = match src.read_text(rel, MAX_SESSION_BYTES) {
        Ok(Some(t)) => t,
        Ok(None) => return,
        Err(why) => return r.skip(Section::Sessions, &shown, why),
    };
    let c = convert(id, key, &text);
    let messages = c.events.len() - 1;
    if messages == 0 {
        return r.skip(Section::Sessions, &shown, "no conversation in it");
    }
    let what = format!("{key} ({id})");
    let detail = format!(
        "{messages} message(s) ({}), {} line(s) left out -> {}",
        c.model,
        c.left_out,
        archive.display()
    );
    if !r.apply {
        return r.add(Item::would(Section::Sessions, what, detail));
    }
    match write(&archive, id, cfg.agent.timezone.clone(), c.events) {
        Ok(()) => r.add(Item::done(Section::Sessions, what, detail)),
        Err(e) => r.skip(Section::Sessions, &shown, format!("cannot write: {e}")),
    }
}

fn write(
    archive: &Path,
    id: &str,
    tz: crate::zone::Zone,
    events: Vec<(DateTime<Utc>, Event)>,
) -> std::io::Result<()> {
    crate::fsutil::create_private_dir(archive)?;
    let mut w = TrailWriter::open(archive, id, tz)?;
    for (at, e) in events {
        w.append_at(e, at)?;
    }
    Ok(())
}

/// Convert one OpenClaw session file (JSON lines: a `session` header, then `message` lines
/// whose `message.role` is `user`, `assistant` or `toolResult`, and metadata lines) into
/// trail events: `session`, then messages; consecutive tool results make one event. An
/// assistant message with neither text nor calls (a failed call) is left out, as is every
/// line that is not conversation.
pub fn convert(id: &str, key: &str, text: &str) -> Converted {
    let mut at = Utc::now();
    let mut start = None;
    let mut model = None;
    let mut events: Vec<(DateTime<Utc>, Event)> = Vec::new();
    let mut left_out = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            left_out += 1;
            continue;
        };
        if let Some(t) = v.get("timestamp").and_then(Value::as_str)
            && let Ok(t) = DateTime::parse_from_rfc3339(t)
        {
            at = t.with_timezone(&Utc);
        }
        start.get_or_insert(at);
        let msg = v.get("message").filter(|_| v["type"] == "message");
        let Some(event) = msg.and_then(|m| message(m, &mut model)) else {
            left_out += usize::from(v["type"] != "session");
            continue;
        };
        match (events.last_mut(), event) {
            (
                Some((_, Event::ToolResult { results, .. })),
                Event::ToolResult { results: more, .. },
            ) => {
                results.extend(more);
            }
            (_, event) => events.push((at, event)),
        }
    }
    let model = model.map_or_else(|| "openclaw".to_string(), |m| format!("openclaw:{m}"));
    let session = Event::Session {
        session_id: id.to_string(),
        key: format!("openclaw:{key}"),
        model: model.clone(),
    };
    events.insert(0, (start.unwrap_or(at), session));
    Converted {
        model,
        events,
        left_out,
    }
}

/// The text of `content`: a string, or the `text` of its text blocks (an image is a
/// placeholder).
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => {
            let parts = blocks.iter().filter_map(|b| match b["type"].as_str() {
                Some("text") => b["text"].as_str().map(str::to_string),
                Some("image") => Some("[image]".to_string()),
                _ => None,
            });
            parts.collect::<Vec<_>>().join("\n")
        }
        _ => String::new(),
    }
}

fn message(m: &Value, model: &mut Option<String>) -> Option<Event> {
    let content = &m["content"];
    match m["role"].as_str()? {
        "user" => {
            let text = text_of(content);
            let mut e = MessageEvent::new(Message::user_text(text.clone()));
            e.source = Some("openclaw".into());
            (!text.trim().is_empty()).then_some(Event::Message(e))
        }
        "assistant" => {
            let calls: Vec<ToolCall> = (content.as_array().into_iter().flatten())
                .filter(|b| b["type"] == "toolCall")
                .map(|b| ToolCall {
                    id: b["id"].as_str().unwrap_or_default().to_string(),
                    name: b["name"].as_str().unwrap_or_default().to_string(),
                    arguments: b["arguments"].clone(),
                })
                .collect();
            let text = text_of(content);
            if text.trim().is_empty() && calls.is_empty() {
                return None;
            }
            let name = m["model"].as_str().map(|s| format!("openclaw:{s}"));
            if let Some(n) = &name {
                *model = Some(n.trim_start_matches("openclaw:").to_string());
            }
            let is_final = calls.is_empty();
            let mut e = MessageEvent::new(Message::Assistant {
                text,
                tool_calls: calls,
                thinking: Vec::new(),
                usage: None,
            });
            e.is_final = is_final;
            e.model = name;
            Some(Event::Message(e))
        }
        "toolResult" => Some(Event::ToolResult {
            results: vec![ToolResult {
                tool_call_id: m["toolCallId"].as_str().unwrap_or_default().to_string(),
                content: text_of(content),
                is_error: m["isError"].as_bool().unwrap_or(false),
                images: Vec::new(),
            }],
            notice: None,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = "tests/fixtures/openclaw/state/agents/main/sessions/8555a0a4-0b79-459d-939c-e17cdbbf4fe2.jsonl";

    #[test]
    fn a_real_openclaw_session_becomes_turns_calls_and_results() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE);
        let c = convert(
            "8555a0a4-0b79-459d-939c-e17cdbbf4fe2",
            "agent:main:main",
            &std::fs::read_to_string(path).unwrap(),
        );
        let kinds: Vec<String> = c
            .events
            .iter()
            .map(|(_, e)| match e {
                Event::Session { key, .. } => format!("session {key}"),
                Event::Message(m) => match &m.message {
                    Message::User { .. } => "user".into(),
                    Message::Assistant { tool_calls, .. } => {
                        format!("assistant {}", tool_calls.len())
                    }
                    Message::ToolResults { .. } => "results".into(),
                },
                Event::ToolResult { results, .. } => format!("results {}", results.len()),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "session openclaw:agent:main:main",
                "assistant 0",
                "user",
                "user",
                "assistant 5",
                "results 5",
                "assistant 0"
            ]
        );
        // The thinking level, two model snapshots and the failed call.
        assert_eq!(c.left_out, 4);
        assert_eq!(c.model, "openclaw:gpt-5.4");
        let (first, _) = c.events[0];
        assert_eq!(first.to_rfc3339(), "2026-03-08T12:15:35.580+00:00");
        let Event::Message(last) = &c.events[6].1 else {
            panic!()
        };
        assert!(last.is_final);
        let Message::Assistant { text, .. } = &last.message else {
            panic!()
        };
        assert!(text.contains("はくあ、いい名前だね"), "{text}");
    }
}
