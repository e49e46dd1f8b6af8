//! The live monitor (SPEC §9): `state_dir/monitor.json`, replaced atomically (temp + rename,
//! no fsync: it is a live view, not data) on every loop event.
//!
//! The top level describes the most recently updated message in flight, or the last finished
//! one when nothing is in flight (`state: "idle"`); `active` lists every message in flight,
//! since sessions run concurrently. Writing never fails the daemon: errors are logged once per
//! failure streak.
//!
//! Updates take a `std::sync::Mutex` (never held across an `.await`), change the state and
//! tell a [`LatestWriter`] (thread `agentd-monitor`) that it changed; that thread takes the
//! lock, renders the newest state and writes it. No async worker renders JSON or waits on the
//! filesystem (a rename on a busy ext4 journal can take milliseconds: docs/BENCHMARKS.md,
//! overhead; rendering was 7% of the daemon's instructions per message), a burst of events
//! costs one rendering and one write, and the file is only ever written by that thread, each
//! write newer than the last. `flush` waits until the state of every update made so far is
//! on disk; dropping the monitor flushes and stops the thread.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::fsutil::atomic_write_nosync;
use crate::latest_writer::LatestWriter;
use crate::message::Usage;

mod format;
pub use format::format_monitor;

/// Format version of `monitor.json`.
pub const MONITOR_VERSION: u32 = 1;

/// Turns kept per message (the most recent ones).
const MAX_TURNS: usize = 50;

/// Messages in flight are bounded by the session concurrency; this cap only protects against
/// a caller that forgets `end` (the oldest entry is dropped).
const MAX_ACTIVE: usize = 1024;

/// Refused FIFO control lines kept in `refused` (the most recent ones): enough for the
/// `agent-send` runs waiting at one time, bounded whatever a FIFO writer sends.
pub const MAX_REFUSED: usize = 32;

/// What the loop of one message is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoopState {
    Idle,
    /// Waiting for the model.
    Thinking,
    /// Running tool calls.
    Tools,
    /// Waiting before retrying a failed provider call.
    RetryWait,
    /// Tool calls wait for a person's yes (SPEC §18.1).
    WaitingApproval,
}

impl LoopState {
    /// `"idle"`, `"thinking"`, `"tools"`, `"retry_wait"` or `"waiting_approval"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            LoopState::Idle => "idle",
            LoopState::Thinking => "thinking",
            LoopState::Tools => "tools",
            LoopState::RetryWait => "retry_wait",
            LoopState::WaitingApproval => "waiting_approval",
        }
    }
}

/// One finished LLM call of a message. Serialized flat: `duration_ms`, the four token counts,
/// `stop_reason`, `tools`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnRecord {
    pub duration_ms: u64,
    #[serde(flatten)]
    pub usage: Usage,
    pub stop_reason: String,
    /// Names of the tools the model called in this turn.
    pub tools: Vec<String>,
}

/// One message in flight (or the last finished one).
#[derive(Debug, Clone)]
struct Msg {
    session_id: String,
    contact: String,
    model: String,
    state: LoopState,
    turn: u32,
    message_started_at: DateTime<Utc>,
    turn_started_at: Option<DateTime<Utc>>,
    tools_in_flight: Vec<String>,
    turns: VecDeque<TurnRecord>,
    updated_at: DateTime<Utc>,
    /// Update counter value of the last change: orders updates within the same instant.
    seq: u64,
    /// The model asked for and its error, when a fallback model answers (SPEC §18.3).
    fallback: Option<(String, String)>,
}

#[derive(Debug)]
struct Inner {
    next_handle: u64,
    seq: u64,
    active: BTreeMap<u64, Msg>,
    last_finished: Option<Msg>,
    queue_depth: usize,
    channels: BTreeMap<String, Value>,
    deliveries: DeliveryCounts,
    webhook: Option<WebhookCounts>,
    /// The last SIGHUP reload: `{"at", "ok", "applied", "needs_restart", "error"}`.
    reload: Option<Value>,
    /// The last precheck of each `[[schedule]]` entry (SPEC §20): `{at, outcome, exit_code,
    /// ms, saved_usd}`.
    prechecks: BTreeMap<String, Value>,
    /// The prompt cache's hit ratio (SPEC §20): `{hit_ratio_recent, hit_ratio_baseline}`.
    cache: Option<Value>,
    /// The last scheduled backup (SPEC §24): `{at, ok, path, bytes, error}`.
    backup: Option<Value>,
    /// Open alert episodes, e.g. the cache alarm (SPEC §20).
    alerts: Vec<Value>,
    /// The last refused FIFO control lines with an id, oldest first: `{id, at, error}`.
    refused: VecDeque<Value>,
    /// When the monitor started: the `updated_at` of the idle state before any message.
    created_at: DateTime<Utc>,
}

/// The live monitor. `Send + Sync`; share it in an `Arc`. Every update rewrites the file (through
/// the writer thread).
#[derive(Debug)]
pub struct Monitor {
    path: PathBuf,
    inner: Arc<Mutex<Inner>>,
    /// Told "the state changed"; renders it on its own thread.
    writer: LatestWriter<()>,
    /// Counts the published changes, for live views ([`Monitor::subscribe`]).
    changed: tokio::sync::watch::Sender<u64>,
}

/// The writer's rest after each write: the events of a message (begin, each state, each turn,
/// end) come within a few milliseconds of each other, and each write is a create, a write and
/// a rename on the file system that also carries the trail's syncs. Everything that changed
/// meanwhile is in the next write; a reader sees a state at most this much older.
const WRITE_PAUSE: Duration = Duration::from_millis(25);

/// How long `flush` waits for the writer.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// One atomic replace; errors are logged once per failure streak.
fn write_file(path: &std::path::Path, bytes: &[u8], failing: &AtomicBool) {
    match atomic_write_nosync(path, bytes) {
        Ok(()) if failing.swap(false, Ordering::Relaxed) => {
            tracing::info!(path = %path.display(), "monitor file writable again");
        }
        Ok(()) => {}
        Err(e) if !failing.swap(true, Ordering::Relaxed) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the monitor file");
        }
        Err(_) => {}
    }
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[derive(Serialize)]
struct MsgView<'a> {
    state: LoopState,
    session_id: Option<&'a str>,
    contact: Option<&'a str>,
    model: Option<&'a str>,
    turn: u32,
    message_started_at: Option<String>,
    turn_started_at: Option<String>,
    tools_in_flight: &'a [String],
    turns: &'a VecDeque<TurnRecord>,
    updated_at: String,
    /// The model asked for, when `model` answers as its fallback (SPEC §18.3).
    #[serde(skip_serializing_if = "Option::is_none")]
    fallback_from: Option<&'a str>,
    /// Why the model asked for did not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    fallback_reason: Option<&'a str>,
}

impl<'a> MsgView<'a> {
    fn of(m: &'a Msg, state: LoopState) -> Self {
        MsgView {
            state,
            session_id: Some(&m.session_id),
            contact: Some(&m.contact),
            model: Some(&m.model),
            turn: m.turn,
            message_started_at: Some(rfc3339(m.message_started_at)),
            turn_started_at: m.turn_started_at.map(rfc3339),
            tools_in_flight: &m.tools_in_flight,
            turns: &m.turns,
            updated_at: rfc3339(m.updated_at),
            fallback_from: m.fallback.as_ref().map(|(from, _)| from.as_str()),
            fallback_reason: m.fallback.as_ref().map(|(_, why)| why.as_str()),
        }
    }
}

#[derive(Serialize)]
struct View<'a> {
    version: u32,
    #[serde(flatten)]
    current: MsgView<'a>,
    active: Vec<MsgView<'a>>,
    queue_depth: usize,
    channels: &'a BTreeMap<String, Value>,
    deliveries: DeliveryCounts,
    /// Webhook callbacks not delivered, when a callback URL is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    webhook: Option<WebhookCounts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reload: Option<&'a Value>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    prechecks: &'a BTreeMap<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    backup: Option<&'a Value>,
    alerts: &'a [Value],
    #[serde(skip_serializing_if = "VecDeque::is_empty")]
    refused: &'a VecDeque<Value>,
}

/// Outbox deliveries (SPEC §16.1): queued or retrying now, and closed unsuccessfully since
/// the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DeliveryCounts {
    pub pending: u64,
    pub failed: u64,
    pub unknown: u64,
}

/// Webhook callbacks (SPEC §10.2) since the start: delivered, failed (after their attempts,
/// or refused by the receiver), dropped (the deliveries in flight were at their bound).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WebhookCounts {
    pub delivered: u64,
    pub failed: u64,
    pub dropped: u64,
}

static NO_TURNS: VecDeque<TurnRecord> = VecDeque::new();

impl Inner {
    fn view(&self) -> View<'_> {
        let latest_active = self.active.values().max_by_key(|m| m.seq);
        let current = match (latest_active, &self.last_finished) {
            (Some(m), _) => MsgView::of(m, m.state),
            (None, Some(m)) => MsgView::of(m, LoopState::Idle),
            (None, None) => MsgView {
                state: LoopState::Idle,
                session_id: None,
                contact: None,
                model: None,
                turn: 0,
                message_started_at: None,
                turn_started_at: None,
                tools_in_flight: &[],
                turns: &NO_TURNS,
                updated_at: rfc3339(self.created_at),
                fallback_from: None,
                fallback_reason: None,
            },
        };
        View {
            version: MONITOR_VERSION,
            current,
            active: self
                .active
                .values()
                .map(|m| MsgView::of(m, m.state))
                .collect(),
            queue_depth: self.queue_depth,
            channels: &self.channels,
            deliveries: self.deliveries,
            webhook: self.webhook,
            reload: self.reload.as_ref(),
            prechecks: &self.prechecks,
            cache: self.cache.as_ref(),
            backup: self.backup.as_ref(),
            alerts: &self.alerts,
            refused: &self.refused,
        }
    }

    fn snapshot(&self) -> Value {
        serde_json::to_value(self.view()).unwrap_or(Value::Null)
    }

    /// What the file holds: the view, pretty-printed, with a final newline.
    fn render(&self) -> Option<Vec<u8>> {
        let mut bytes = serde_json::to_vec_pretty(&self.view()).ok()?;
        bytes.push(b'\n');
        Some(bytes)
    }

    /// Apply `f` to the message `h` and stamp it; `false` for an unknown (ended) handle.
    fn touch(&mut self, h: u64, f: impl FnOnce(&mut Msg)) -> bool {
        self.seq += 1;
        let seq = self.seq;
        match self.active.get_mut(&h) {
            Some(m) => {
                f(m);
                m.updated_at = Utc::now();
                m.seq = seq;
                true
            }
            None => {
                tracing::debug!(
                    handle = h,
                    "monitor update for a message no longer in flight"
                );
                false
            }
        }
    }
}

fn lock(inner: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    inner.lock().unwrap_or_else(|e| e.into_inner())
}

impl Monitor {
    /// A monitor writing to `path` (normally `state_dir/monitor.json`). Writes the idle state
    /// immediately; a failed write is logged, never returned.
    /// Starts the writer thread and writes the idle state (waiting until it is on disk).
    pub fn new(path: PathBuf) -> Monitor {
        // Writes that a kill interrupted (the monitor is rewritten on every loop event).
        if let Some(dir) = path.parent()
            && let Err(e) = crate::fsutil::remove_stale_temps(dir)
        {
            tracing::warn!(error = %e, "cannot remove stale temp files");
        }
        let failing = AtomicBool::new(false);
        let inner = Arc::new(Mutex::new(Inner {
            next_handle: 1,
            seq: 0,
            active: BTreeMap::new(),
            last_finished: None,
            queue_depth: 0,
            channels: BTreeMap::new(),
            deliveries: DeliveryCounts::default(),
            webhook: None,
            reload: None,
            prechecks: BTreeMap::new(),
            cache: None,
            backup: None,
            alerts: Vec::new(),
            refused: VecDeque::new(),
            created_at: Utc::now(),
        }));
        let state = inner.clone();
        let writer = LatestWriter::new("agentd-monitor", move |path, _: &()| {
            // Rendered under the update lock (the newest state, whole), written without it:
            // a guard in the `if let` itself would be held across the write.
            let bytes = lock(&state).render();
            if let Some(bytes) = bytes {
                write_file(path, &bytes, &failing);
            }
        })
        .with_pause(WRITE_PAUSE);
        let monitor = Monitor {
            path,
            inner,
            writer,
            changed: tokio::sync::watch::Sender::new(0),
        };
        monitor.publish(monitor.lock());
        monitor.flush();
        monitor
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Releases the update lock and tells the writer the state changed: it renders the state
    /// it finds then (this update's or a later one's).
    fn publish(&self, inner: MutexGuard<'_, Inner>) {
        drop(inner);
        self.writer.submit(self.path.clone(), ());
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Told each time the state changes (the web console's live overview, SPEC §22): no
    /// polling, nothing read from disk.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Waits (up to 5 s) until everything published so far is on disk. For tests and for
    /// readers that need the file, not the in-memory view (`snapshot`).
    pub fn flush(&self) {
        self.writer.flush(FLUSH_TIMEOUT);
    }

    fn update(&self, h: u64, f: impl FnOnce(&mut Msg)) {
        let mut inner = self.lock();
        if inner.touch(h, f) {
            self.publish(inner);
        }
    }

    /// A message starts its loop (state `thinking`, turn 0). Returns the handle for the other
    /// calls about this message; pass it to [`Monitor::end`] when the message is done.
    pub fn begin(&self, session_id: &str, contact: &str, model: &str) -> u64 {
        let mut inner = self.lock();
        let h = inner.next_handle;
        inner.next_handle += 1;
        inner.seq += 1;
        let now = Utc::now();
        let msg = Msg {
            session_id: session_id.to_owned(),
            contact: contact.to_owned(),
            model: model.to_owned(),
            state: LoopState::Thinking,
            turn: 0,
            message_started_at: now,
            turn_started_at: None,
            tools_in_flight: Vec::new(),
            turns: VecDeque::new(),
            updated_at: now,
            seq: inner.seq,
            fallback: None,
        };
        if inner.active.len() >= MAX_ACTIVE
            && let Some((old, _)) = inner.active.pop_first()
        {
            tracing::warn!(handle = old, "monitor: dropped a message never ended");
        }
        inner.active.insert(h, msg);
        self.publish(inner);
        h
    }

    /// The loop of message `h` enters `state` in turn `turn` (1-based). A new turn number
    /// restarts `turn_started_at`; leaving `Tools` clears `tools_in_flight`.
    pub fn set_state(&self, h: u64, state: LoopState, turn: u32) {
        self.update(h, |m| {
            if turn != m.turn || m.turn_started_at.is_none() {
                m.turn_started_at = Some(Utc::now());
            }
            m.turn = turn;
            m.state = state;
            if state != LoopState::Tools {
                m.tools_in_flight.clear();
            }
        });
    }

    /// The tools message `h` is running right now.
    pub fn set_tools(&self, h: u64, tools_in_flight: Vec<String>) {
        self.update(h, |m| m.tools_in_flight = tools_in_flight);
    }

    /// Message `h` switched model (fallback).
    pub fn set_model(&self, h: u64, model: &str) {
        self.update(h, |m| model.clone_into(&mut m.model));
    }

    /// Message `h` is answered by model `model` as the fallback of `from`, which failed with
    /// `reason` (SPEC §18.3); shown until the message's next call on `from` answers itself.
    pub fn set_fallback(&self, h: u64, model: &str, fallback: Option<(&str, &str)>) {
        self.update(h, |m| {
            model.clone_into(&mut m.model);
            m.fallback = fallback.map(|(from, why)| (from.to_string(), why.to_string()));
        });
    }

    /// An LLM call of message `h` finished. Keeps the last 50 turns.
    pub fn turn_done(&self, h: u64, t: TurnRecord) {
        self.update(h, |m| {
            if m.turns.len() >= MAX_TURNS {
                m.turns.pop_front();
            }
            m.turns.push_back(t);
        });
    }

    /// Message `h` finished (delivered, failed or cancelled). It becomes the "last finished"
    /// message shown when nothing else is in flight. Unknown handles are ignored.
    pub fn end(&self, h: u64) {
        let mut inner = self.lock();
        inner.seq += 1;
        let seq = inner.seq;
        if let Some(mut m) = inner.active.remove(&h) {
            m.state = LoopState::Idle;
            m.tools_in_flight.clear();
            m.updated_at = Utc::now();
            m.seq = seq;
            inner.last_finished = Some(m);
            self.publish(inner);
        }
    }

    /// Messages waiting in the intake queue.
    pub fn set_queue_depth(&self, n: usize) {
        let mut inner = self.lock();
        if inner.queue_depth != n {
            inner.queue_depth = n;
            self.publish(inner);
        }
    }

    /// Outbox delivery counts.
    pub fn set_deliveries(&self, d: DeliveryCounts) {
        let mut inner = self.lock();
        if inner.deliveries != d {
            inner.deliveries = d;
            self.publish(inner);
        }
    }

    /// Webhook callback counts.
    pub fn set_webhook(&self, w: WebhookCounts) {
        let mut inner = self.lock();
        if inner.webhook != Some(w) {
            inner.webhook = Some(w);
            self.publish(inner);
        }
    }

    /// Health of a channel, e.g. `telegram` → `{"last_poll_ok_at": ..., "consecutive_errors": 0}`.
    pub fn set_channel(&self, name: &str, health: Value) {
        let mut inner = self.lock();
        if inner.channels.get(name) != Some(&health) {
            inner.channels.insert(name.to_owned(), health);
            self.publish(inner);
        }
    }

    /// The outcome of the last SIGHUP reload (SPEC §16.5).
    pub fn set_reload(&self, outcome: Value) {
        let mut inner = self.lock();
        inner.reload = Some(outcome);
        self.publish(inner);
    }

    /// The last precheck of `[[schedule]]` entry `name` (SPEC §20).
    pub fn set_precheck(&self, name: &str, outcome: Value) {
        let mut inner = self.lock();
        inner.prechecks.insert(name.to_owned(), outcome);
        self.publish(inner);
    }

    /// The prompt cache's hit ratios (SPEC §20), when they changed.
    pub fn set_cache(&self, cache: Value) {
        let mut inner = self.lock();
        if inner.cache.as_ref() != Some(&cache) {
            inner.cache = Some(cache);
            self.publish(inner);
        }
    }

    /// The open alert of `kind` replaced (`Some`) or ended (`None`); the others stay.
    pub fn set_alert(&self, kind: &str, alert: Option<Value>) {
        let mut inner = self.lock();
        let mut alerts: Vec<Value> = inner
            .alerts
            .iter()
            .filter(|a| a["kind"] != kind)
            .cloned()
            .collect();
        alerts.extend(alert);
        if inner.alerts != alerts {
            inner.alerts = alerts;
            self.publish(inner);
        }
    }

    /// The last scheduled backup (SPEC §24).
    pub fn set_backup(&self, backup: Value) {
        let mut inner = self.lock();
        inner.backup = Some(backup);
        self.publish(inner);
    }

    /// A FIFO control line `id` the daemon refused, and why (a session setting naming an
    /// unknown model or skill): `agent-send` waiting for it reads the reason here. Lines
    /// without an id are only logged; the list keeps the last [`MAX_REFUSED`].
    pub fn refused(&self, id: &str, error: &str) {
        if id.is_empty() {
            return;
        }
        let mut inner = self.lock();
        if inner.refused.len() >= MAX_REFUSED {
            inner.refused.pop_front();
        }
        let at = rfc3339(Utc::now());
        inner
            .refused
            .push_back(serde_json::json!({"id": id, "at": at, "error": error}));
        self.publish(inner);
    }

    /// The current monitor document (what the file holds), e.g. for `GET /api/v1/monitor`.
    pub fn snapshot(&self) -> Value {
        self.lock().snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::format::human_duration;
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn temp_monitor() -> (tempfile::TempDir, PathBuf, Monitor) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("monitor.json");
        let m = Monitor::new(path.clone());
        (dir, path, m)
    }

    fn read(m: &Monitor, path: &PathBuf) -> Value {
        m.flush();
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    /// A FIFO writer flooding refused lines: the list keeps the last `MAX_REFUSED`, newest
    /// last, and a line without an id is not listed.
    #[test]
    fn refused_lines_are_listed_with_their_reason_and_bounded() {
        let (_d, path, m) = temp_monitor();
        assert!(read(&m, &path).get("refused").is_none());
        m.refused("", "no id: only logged");
        for i in 0..(MAX_REFUSED + 8) {
            m.refused(&format!("id-{i}"), &format!("unknown model \"m{i}\""));
        }
        let v = read(&m, &path);
        let list = v["refused"].as_array().unwrap();
        eprintln!("{} refusals sent, {} kept", MAX_REFUSED + 9, list.len());
        assert_eq!(list.len(), MAX_REFUSED);
        assert_eq!(list[0]["id"], "id-8");
        let last = &list[MAX_REFUSED - 1];
        assert_eq!(last["id"], format!("id-{}", MAX_REFUSED + 7));
        assert_eq!(
            last["error"],
            format!("unknown model \"m{}\"", MAX_REFUSED + 7)
        );
        assert!(last["at"].as_str().is_some());
    }

    fn turn(ms: u64, stop: &str, tools: &[&str]) -> TurnRecord {
        TurnRecord {
            duration_ms: ms,
            usage: Usage {
                input_tokens: 10,
                output_tokens: 20,
                cache_read_tokens: 30,
                cache_write_tokens: 40,
                cache_write_1h_tokens: 0,
            },
            stop_reason: stop.into(),
            tools: tools.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn bursts_coalesce_and_drop_writes_the_newest_state() {
        let (_d, path, m) = temp_monitor();
        let h = m.begin("s1", "c", "model");
        for t in 1..=200 {
            m.set_state(h, LoopState::Thinking, t);
        }
        let want = m.snapshot();
        drop(m);
        let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(v["turn"], 200);
        assert_eq!(
            v, want,
            "the file is the newest state once the monitor is gone"
        );
    }

    #[test]
    fn new_writes_an_idle_monitor_immediately() {
        let (_d, path, m) = temp_monitor();
        let v = read(&m, &path);
        assert_eq!(v["state"], "idle");
        assert_eq!(v["version"], 1);
        assert_eq!(v["session_id"], Value::Null);
        assert_eq!(v["active"], json!([]));
        assert_eq!(v["queue_depth"], 0);
        assert_eq!(v["channels"], json!({}));
        assert!(DateTime::parse_from_rfc3339(v["updated_at"].as_str().unwrap()).is_ok());
    }

    #[test]
    fn unwritable_path_never_fails() {
        let dir = tempfile::tempdir().unwrap();
        let m = Monitor::new(dir.path().join("missing-dir").join("monitor.json"));
        let h = m.begin("s", "c", "model");
        m.end(h);
        assert_eq!(m.snapshot()["state"], "idle");
        assert_eq!(m.snapshot()["session_id"], "s");
    }

    #[test]
    fn loop_events_are_written_to_the_file() {
        let (_d, path, m) = temp_monitor();
        let h = m.begin("tg-42", "alice", "claude-sonnet");
        let v = read(&m, &path);
        assert_eq!(v["state"], "thinking");
        assert_eq!(v["session_id"], "tg-42");
        assert_eq!(v["contact"], "alice");
        assert_eq!(v["model"], "claude-sonnet");
        assert!(v["message_started_at"].as_str().unwrap().ends_with('Z'));
        assert_eq!(v["active"].as_array().unwrap().len(), 1);

        m.set_state(h, LoopState::Thinking, 1);
        let t1 = read(&m, &path)["turn_started_at"].clone();
        assert!(t1.is_string());
        m.turn_done(h, turn(1200, "tool_use", &["exec"]));
        m.set_state(h, LoopState::Tools, 1);
        m.set_tools(h, vec!["exec".into(), "read_file".into()]);
        let v = read(&m, &path);
        assert_eq!(v["state"], "tools");
        assert_eq!(v["turn"], 1);
        assert_eq!(v["tools_in_flight"], json!(["exec", "read_file"]));
        assert_eq!(v["turn_started_at"], t1, "same turn keeps its start");
        assert_eq!(
            v["turns"],
            json!([{"duration_ms": 1200, "input_tokens": 10, "output_tokens": 20,
                    "cache_read_tokens": 30, "cache_write_tokens": 40,
                    "stop_reason": "tool_use", "tools": ["exec"]}])
        );

        m.set_state(h, LoopState::RetryWait, 2);
        m.set_model(h, "gpt-fallback");
        let v = read(&m, &path);
        assert_eq!(v["state"], "retry_wait");
        assert_eq!(v["turn"], 2);
        assert_eq!(v["model"], "gpt-fallback");
        assert_eq!(v["tools_in_flight"], json!([]), "leaving tools clears them");
        assert_eq!(v["active"][0]["state"], "retry_wait");

        m.set_queue_depth(3);
        m.set_channel(
            "telegram",
            json!({"last_poll_ok_at": "2026-01-01T00:00:00Z", "consecutive_errors": 0}),
        );
        let v = read(&m, &path);
        assert_eq!(v["queue_depth"], 3);
        assert_eq!(v["channels"]["telegram"]["consecutive_errors"], 0);
        assert_eq!(v, m.snapshot(), "file and snapshot agree");
    }

    #[test]
    fn idle_after_end_keeps_the_last_message() {
        let (_d, path, m) = temp_monitor();
        let h = m.begin("http-1", "api", "m1");
        m.set_state(h, LoopState::Tools, 1);
        m.set_tools(h, vec!["exec".into()]);
        m.turn_done(h, turn(5, "end_turn", &[]));
        m.end(h);
        let v = read(&m, &path);
        assert_eq!(v["state"], "idle");
        assert_eq!(v["session_id"], "http-1");
        assert_eq!(v["contact"], "api");
        assert_eq!(v["turn"], 1);
        assert_eq!(v["turns"].as_array().unwrap().len(), 1);
        assert_eq!(v["tools_in_flight"], json!([]));
        assert_eq!(v["active"], json!([]));
        // Updates for an ended handle are ignored.
        m.set_state(h, LoopState::Thinking, 9);
        m.end(h);
        assert_eq!(read(&m, &path), v);
    }

    #[test]
    fn concurrent_messages_are_all_active() {
        let (_d, path, m) = temp_monitor();
        let a = m.begin("sess-a", "alice", "m");
        let b = m.begin("sess-b", "bob", "m");
        let v = read(&m, &path);
        let active = v["active"].as_array().unwrap();
        assert_eq!(active.len(), 2);
        assert_eq!(active[0]["session_id"], "sess-a");
        assert_eq!(active[1]["session_id"], "sess-b");
        // The top level follows the most recently updated message.
        assert_eq!(v["session_id"], "sess-b");
        m.set_state(a, LoopState::Tools, 2);
        let v = read(&m, &path);
        assert_eq!(v["session_id"], "sess-a");
        assert_eq!(v["state"], "tools");
        // Ending one leaves the other in flight, shown at the top level (not idle).
        m.end(a);
        let v = read(&m, &path);
        assert_eq!(v["state"], "thinking");
        assert_eq!(v["session_id"], "sess-b");
        assert_eq!(v["active"].as_array().unwrap().len(), 1);
        m.end(b);
        let v = read(&m, &path);
        assert_eq!(v["state"], "idle");
        assert_eq!(v["session_id"], "sess-b");
    }

    #[test]
    fn monitor_is_shared_across_threads() {
        let (_d, path, m) = temp_monitor();
        let m = std::sync::Arc::new(m);
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let m = std::sync::Arc::clone(&m);
                std::thread::spawn(move || {
                    let h = m.begin(&format!("s{i}"), "c", "m");
                    for t in 1..=20 {
                        m.set_state(h, LoopState::Thinking, t);
                        m.turn_done(h, turn(1, "tool_use", &["exec"]));
                    }
                    h
                })
            })
            .collect();
        let handles: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let v = read(&m, &path);
        assert_eq!(v["active"].as_array().unwrap().len(), 4);
        assert_eq!(v, m.snapshot(), "the last write is the latest state");
        for h in handles {
            m.end(h);
        }
        assert_eq!(read(&m, &path)["active"], json!([]));
    }

    #[test]
    fn turns_are_bounded() {
        let (_d, path, m) = temp_monitor();
        let h = m.begin("s", "c", "m");
        for i in 0..(MAX_TURNS as u64 + 7) {
            m.turn_done(h, turn(i, "tool_use", &[]));
        }
        let v = read(&m, &path);
        let turns = v["turns"].as_array().unwrap();
        assert_eq!(turns.len(), MAX_TURNS);
        assert_eq!(turns[0]["duration_ms"], 7, "the oldest turns are dropped");
        assert_eq!(turns[MAX_TURNS - 1]["duration_ms"], MAX_TURNS as u64 + 6);
    }

    #[test]
    fn loop_state_serializes_snake_case() {
        assert_eq!(json!(LoopState::RetryWait), json!("retry_wait"));
        for s in [
            LoopState::Idle,
            LoopState::Thinking,
            LoopState::Tools,
            LoopState::RetryWait,
        ] {
            assert_eq!(json!(s), json!(s.as_str()));
        }
    }

    fn sample(state: &str, updated_at: &str) -> Value {
        json!({
            "version": 1,
            "state": state,
            "session_id": "tg-42",
            "contact": "alice",
            "model": "claude-sonnet",
            "turn": 3,
            "message_started_at": "2026-05-01T11:58:00.000Z",
            "turn_started_at": "2026-05-01T11:59:00.000Z",
            "tools_in_flight": ["exec"],
            "turns": [{"duration_ms": 1234, "input_tokens": 1, "output_tokens": 2,
                       "cache_read_tokens": 3, "cache_write_tokens": 4,
                       "stop_reason": "tool_use", "tools": ["exec"]}],
            "updated_at": updated_at,
            "active": if state == "idle" { json!([]) } else {
                json!([{"state": state, "session_id": "tg-42", "contact": "alice",
                        "model": "claude-sonnet", "turn": 3, "updated_at": updated_at}])
            },
            "queue_depth": 2,
            "channels": {"telegram": {"consecutive_errors": 0,
                                       "last_poll_ok_at": "2026-05-01T11:59:59Z"}}
        })
    }

    fn noon() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-05-01T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn format_flags_a_stale_non_idle_state() {
        let out = format_monitor(&sample("tools", "2026-05-01T11:58:30.000Z"), noon());
        assert!(
            out.contains("state:      tools, turn 3 — POSSIBLY STUCK: no update for 1m 30s"),
            "{out}"
        );
        // The active entry is flagged too.
        assert_eq!(out.matches("POSSIBLY STUCK").count(), 2, "{out}");
        assert!(out.contains("tools:      exec"), "{out}");
        assert!(out.contains("1234 ms"), "{out}");
        assert!(out.contains("queue:      2"), "{out}");
        assert!(out.contains("telegram: consecutive_errors=0"), "{out}");
    }

    #[test]
    fn format_does_not_flag_fresh_or_idle_states() {
        // Exactly 60 s is not "older than 60 s".
        let fresh = format_monitor(&sample("thinking", "2026-05-01T11:59:00.000Z"), noon());
        assert!(!fresh.contains("STUCK"), "{fresh}");
        assert!(fresh.contains("updated:    1m 00s ago"), "{fresh}");
        let idle = format_monitor(&sample("idle", "2026-05-01T10:00:00.000Z"), noon());
        assert!(!idle.contains("STUCK"), "{idle}");
        assert!(idle.contains("state:      idle"), "{idle}");
        assert!(idle.contains("last:       tg-42 (contact alice)"), "{idle}");
        assert!(idle.contains("finished:   2h 00m ago"), "{idle}");
    }

    #[test]
    fn format_reads_what_the_monitor_writes() {
        let (_d, path, m) = temp_monitor();
        let out = format_monitor(&read(&m, &path), Utc::now());
        assert!(out.contains("no message handled since start"), "{out}");
        let h = m.begin("s1", "bob", "m");
        m.set_state(h, LoopState::Thinking, 1);
        let out = format_monitor(&read(&m, &path), Utc::now());
        assert!(out.starts_with("state:      thinking, turn 1\n"), "{out}");
        assert!(!out.contains("STUCK"));
        assert!(!out.contains("version"), "{out}");
        // Two minutes later without an update it would be flagged.
        let later = Utc::now() + chrono::Duration::seconds(120);
        assert!(format_monitor(&read(&m, &path), later).contains("POSSIBLY STUCK"));
    }

    #[test]
    fn format_tolerates_foreign_documents() {
        assert!(format_monitor(&json!([1, 2]), noon()).contains("not hold a JSON object"));
        let out = format_monitor(&json!({"state": 5, "turns": "x", "active": {}}), noon());
        assert!(out.contains("format version missing"), "{out}");
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let key = prop_oneof![
            Just("state".to_owned()),
            Just("updated_at".to_owned()),
            Just("turns".to_owned()),
            Just("active".to_owned()),
            Just("channels".to_owned()),
            Just("session_id".to_owned()),
            Just("tools_in_flight".to_owned()),
            Just("version".to_owned()),
            "[a-z_]{1,8}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            Just(json!("idle")),
            Just(json!("2026-05-01T11:00:00Z")),
            ".{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 32, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
                prop::collection::btree_map(key.clone(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn format_never_panics(v in arb_json()) {
            let _ = format_monitor(&v, noon());
        }
    }

    #[test]
    fn human_durations() {
        assert_eq!(human_duration(-3), "0s");
        assert_eq!(human_duration(59), "59s");
        assert_eq!(human_duration(125), "2m 05s");
        assert_eq!(human_duration(3720), "1h 02m");
        assert_eq!(human_duration(3 * 86400 + 4 * 3600), "3d 04h");
    }
}
