//! The open sessions from `sessions.json`, their snapshots and trail files
//! (`agent-send --sessions`, `GET /api/v1/sessions`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::ReportError;
use crate::session::{self, index, trail};

/// One open session.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionInfo {
    pub session_id: String,
    pub key: String,
    /// Unix seconds (from `sessions.json`).
    pub created_at: i64,
    /// Model config name; `None` when neither snapshot nor trail names one.
    pub model: Option<String>,
    pub message_count: usize,
    pub compaction_count: u32,
    /// Prompt + output tokens of the last call.
    pub context_tokens: u64,
    /// `context_tokens` as a percentage of the model's context window; `None` when the window is
    /// unknown (no config, or a model the config does not define).
    pub context_pct: Option<f64>,
    pub cost_usd: f64,
    /// Trail files (`<id>.<date>.jsonl`) and their total size.
    pub log_files: usize,
    pub log_bytes: u64,
    /// The last `[[schedule]]` precheck run for this session (SPEC §20).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_precheck: Option<PrecheckInfo>,
}

/// A precheck's time and outcome, for `--sessions`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrecheckInfo {
    /// Unix seconds.
    pub at: i64,
    #[serde(flatten)]
    pub event: crate::session::event::PrecheckEvent,
}

/// `{sessions:[…]}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionsReport {
    pub sessions: Vec<SessionInfo>,
}

/// Every session of the index in `sessions_dir`, in key order. The state is the snapshot
/// `<id>.state.json` plus the trail lines it lacks (`session::current_state`), rebuilt from the
/// trail when the snapshot is missing or unreadable. `context_windows` maps
/// model config names to their context window. Blocking.
pub fn sessions_report(
    sessions_dir: &Path,
    context_windows: &BTreeMap<String, u32>,
) -> Result<SessionsReport, ReportError> {
    let idx = super::read_index(sessions_dir)?;
    let mut sessions = Vec::with_capacity(idx.len());
    for (key, entry) in &idx {
        sessions.push(session_info(sessions_dir, key, entry, context_windows)?);
    }
    Ok(SessionsReport { sessions })
}

fn session_info(
    dir: &Path,
    key: &str,
    entry: &index::IndexEntry,
    context_windows: &BTreeMap<String, u32>,
) -> Result<SessionInfo, ReportError> {
    let id = &entry.session_id;
    let io = |e| {
        ReportError::io(
            format!("read the files of session {id} in {}", dir.display()),
            e,
        )
    };
    // The snapshot is a cache written on a cadence: fold the newer trail lines, as the
    // daemon does when it loads the session.
    let st = session::current_state(dir, id, key).map_err(io)?;
    let files = trail::trail_files(dir, id).map_err(io)?;
    let mut log_bytes = 0;
    for f in &files {
        log_bytes += std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
    }
    let model = (!st.model.is_empty()).then(|| st.model.clone());
    let context_pct = model
        .as_ref()
        .and_then(|m| context_windows.get(m))
        .filter(|w| **w > 0)
        .map(|w| (st.context_tokens as f64 * 1000.0 / f64::from(*w)).round() / 10.0);
    Ok(SessionInfo {
        session_id: id.clone(),
        key: key.to_string(),
        created_at: entry.created_at,
        model,
        message_count: st.messages.len(),
        compaction_count: st.compaction_count,
        context_tokens: st.context_tokens,
        context_pct,
        cost_usd: st.cost_usd,
        log_files: files.len(),
        log_bytes,
        last_precheck: st
            .last_precheck
            .map(|(at, event)| PrecheckInfo { at, event }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, Usage};
    use crate::session::SessionStore;
    use crate::session::event::{Event, MessageEvent};
    use crate::zone::Zone;

    fn assistant(input: u64, output: u64, cost: f64) -> Event {
        let mut m = MessageEvent::new(Message::Assistant {
            text: "ok".into(),
            tool_calls: vec![],
            thinking: vec![],
            usage: Some(Usage {
                input_tokens: input,
                output_tokens: output,
                cache_read_tokens: 0,
                cache_write_tokens: 0,
                cache_write_1h_tokens: 0,
            }),
        });
        m.cost_usd = Some(cost);
        m.is_final = true;
        Event::Message(m)
    }

    #[test]
    fn report_from_snapshot_and_from_trail() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        // alice: a snapshot exists ...
        let a = store.get_or_create("alice", "primary").unwrap();
        a.append(Event::Message(MessageEvent::new(Message::user_text("hi"))))
            .unwrap();
        a.append(assistant(1900, 100, 0.25)).unwrap();
        let st = a.load_state("primary").unwrap();
        a.queue_snapshot(st);
        store.flush_snapshots();
        // ... which lags the trail: a message and its reply came after it.
        a.append(Event::Message(MessageEvent::new(Message::user_text(
            "more",
        ))))
        .unwrap();
        a.append(assistant(2900, 100, 0.5)).unwrap();
        // bob: trail only (snapshot missing), on a model the config does not know.
        let b = store.get_or_create("bob", "cheap").unwrap();
        b.append(Event::Message(MessageEvent::new(Message::user_text("yo"))))
            .unwrap();

        // The report reads `sessions.json`, which the store writes in the background.
        store.flush_index();
        let windows = BTreeMap::from([("primary".to_string(), 200_000u32)]);
        let r = sessions_report(d.path(), &windows).unwrap();
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        let list = v["sessions"].as_array().unwrap();
        assert_eq!(list.len(), 2);
        let alice = &list[0];
        assert_eq!(alice["key"], "alice");
        assert_eq!(alice["session_id"], a.id.as_str());
        assert_eq!(alice["model"], "primary");
        assert_eq!(alice["message_count"], 4);
        assert_eq!(alice["compaction_count"], 0);
        assert_eq!(alice["context_tokens"], 3000);
        assert_eq!(alice["context_pct"], 1.5);
        assert_eq!(alice["cost_usd"], 0.75);
        assert_eq!(alice["log_files"], 1);
        let trail_len = std::fs::metadata(&trail::trail_files(d.path(), &a.id).unwrap()[0])
            .unwrap()
            .len();
        assert_eq!(alice["log_bytes"], trail_len);
        assert!(alice["created_at"].as_i64().unwrap() > 0);
        let mut keys: Vec<_> = alice.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "compaction_count",
                "context_pct",
                "context_tokens",
                "cost_usd",
                "created_at",
                "key",
                "log_bytes",
                "log_files",
                "message_count",
                "model",
                "session_id"
            ]
        );
        let bob = &list[1];
        assert_eq!(bob["model"], "cheap");
        assert_eq!(bob["message_count"], 1);
        assert!(bob["context_pct"].is_null());
    }

    #[test]
    fn no_index_means_no_sessions() {
        let d = tempfile::tempdir().unwrap();
        let r = sessions_report(&d.path().join("sessions"), &BTreeMap::new()).unwrap();
        assert!(r.sessions.is_empty());
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::json!({"sessions": []})
        );
    }

    #[test]
    fn corrupt_index_is_an_error_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("sessions.json"), "{oops").unwrap();
        let err = sessions_report(d.path(), &BTreeMap::new()).unwrap_err();
        assert!(err.to_string().contains("sessions.json"), "{err}");
    }
}
