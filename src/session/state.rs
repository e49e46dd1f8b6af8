//! The session snapshot `<id>.state.json` and how it is derived from the trail. The trail is
//! the source of truth: `SessionState::apply` folds one trail line into the state, so a
//! snapshot plus the trail lines after its `last_seq` always equals a full replay. A missing or
//! corrupt snapshot is rebuilt from the trail, tool results included (SPEC §7).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::event::{Event, TrailLine};
use crate::message::rendered::RenderCache;
use crate::message::{Message, Usage, UserBlock};

/// Format version of state files.
pub const STATE_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionState {
    pub version: u32,
    pub id: String,
    pub key: String,
    /// Model name the session was created with (routing may pick another per message).
    pub model: String,
    pub messages: Vec<Message>,
    /// Unix seconds.
    pub created_at: i64,
    pub updated_at: i64,
    /// Token totals over every call of the session.
    pub usage: Usage,
    pub cost_usd: f64,
    pub compaction_count: u32,
    /// Sequence number of the last trail line folded into this state.
    pub last_seq: u64,
    /// Messages sent by the previous LLM call (cache breakpoint position, SPEC §6).
    #[serde(default)]
    pub previous_messages: Option<usize>,
    /// Prompt + output tokens of the last call: the context size.
    #[serde(default)]
    pub context_tokens: u64,
    #[serde(default)]
    pub flags: Flags,
    /// Approvals: tools approved for the session, calls waiting (SPEC §18.1).
    #[serde(default, skip_serializing_if = "is_default_approvals")]
    pub approvals: super::approval::ApprovalState,
    /// The model pinned for this session (`session_model`, SPEC §18.2); none = routing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_model: Option<String>,
    /// Skills turned off for this session (`session_skill`, SPEC §18.2), sorted.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub skills_off: std::collections::BTreeSet<String>,
    /// The last `[[schedule]]` precheck that ran for this session, with its time (Unix
    /// seconds) (SPEC §20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_precheck: Option<(i64, super::event::PrecheckEvent)>,
    /// The cost of each schedule entry's last run (USD): the estimated saving of a skip.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub job_costs: std::collections::BTreeMap<String, f64>,
    /// The schedule entry whose run the current turn is, with its cost so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_running: Option<(String, f64)>,
    /// Unix seconds of the last few user turns (newest last, at most [`RECENT_TURNS`]): the
    /// session's cadence, which picks the cache TTL (SPEC §20).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_turns: Vec<i64>,
    /// The calls of a compatible endpoint's client tools the last turn ended on that have no
    /// result yet (SPEC §17): the only calls the client's next results may answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub open_client_calls: Vec<String>,
    /// The messages as the provider's wire format last rendered them, reused by the next call
    /// (SPEC §16.6). Memory only; compaction, the image swap and a repair of stored calls
    /// invalidate it here; a clone starts empty (`message::rendered`).
    #[serde(skip, default = "RenderCache::new")]
    pub rendered: RenderCache,
    /// The `last_seq` of this state's newest snapshot, written (queued) or read. Memory only,
    /// and not part of what a state is (equal whatever it holds): see [`SnapshotMark`].
    #[serde(skip)]
    pub snapshot: SnapshotMark,
    /// The first message `replace_message` swapped since the last `strip_images`: the only way
    /// an image block enters the history (lines folded by `apply` are stripped as they come),
    /// so `strip_images` looks from there on, not at the whole history for every message.
    #[serde(skip)]
    images_from: ImagesFrom,
}

/// Where [`SessionState::strip_images`] must look. Memory only and, like [`SnapshotMark`], not
/// part of what a state is (always equal).
#[derive(Debug, Clone, Copy, Default)]
struct ImagesFrom(Option<usize>);

impl ImagesFrom {
    /// The history was rewritten (compaction, repair): a swapped message may have moved, so
    /// the next strip looks at every message.
    fn rewritten(&mut self) {
        if self.0.is_some() {
            self.0 = Some(0);
        }
    }
}

impl PartialEq for ImagesFrom {
    fn eq(&self, _: &ImagesFrom) -> bool {
        true
    }
}

/// Trail lines a state may run ahead of its snapshot before the worker queues a new one
/// (SPEC §7: the snapshot is a cache of the trail's fold). Counted in lines, not messages,
/// because lines are what a start must fold after the snapshot: a plain message writes three
/// (intake, user turn, reply), each tool round two more. 64 lines is about twenty plain
/// messages, so serialising and syncing a long history happens on one message in twenty
/// instead of every one (docs/BENCHMARKS.md, overhead), while a start after a kill -9 reads
/// and folds at most these lines plus the message in flight. A graceful stop writes every
/// state that lags at all.
///
/// A long history waits longer: a snapshot is due after `max(64, messages / 2)` lines, so
/// its cost (serialising and syncing every message) is spread over as many lines as it
/// grows with, and the cost per message stays flat over a session's life (SPEC §16.6;
/// a 2,000-message snapshot was written and synced about every twenty messages, beside the
/// trail's own syncs). A start folds at most that many lines after it, about a third of what
/// the snapshot itself holds.
pub const SNAPSHOT_EVERY_LINES: u64 = 64;

/// User turns remembered in `recent_turns`.
pub const RECENT_TURNS: usize = 4;

/// Schedule entries whose last cost a session remembers.
const MAX_JOB_COSTS: usize = 64;

/// The `last_seq` of a state's newest snapshot (0: none known). Kept in memory only; equal to
/// every other mark, so two states compare by what they fold, not by what was saved of them.
#[derive(Debug, Clone, Copy, Default)]
pub struct SnapshotMark(pub u64);

impl PartialEq for SnapshotMark {
    /// Always equal: what was saved of a state is not part of what it is.
    fn eq(&self, _: &SnapshotMark) -> bool {
        true
    }
}

fn is_default_approvals(a: &super::approval::ApprovalState) -> bool {
    *a == super::approval::ApprovalState::default()
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Flags {
    /// The "compaction is near" notice was given (SPEC §15).
    #[serde(default)]
    pub compaction_warned: bool,
}

impl SessionState {
    pub fn new(id: &str, key: &str, model: &str, created_at: i64) -> Self {
        SessionState {
            version: STATE_VERSION,
            id: id.to_string(),
            key: key.to_string(),
            model: model.to_string(),
            messages: Vec::new(),
            created_at,
            updated_at: created_at,
            usage: Usage::default(),
            cost_usd: 0.0,
            compaction_count: 0,
            last_seq: 0,
            previous_messages: None,
            context_tokens: 0,
            flags: Flags::default(),
            approvals: Default::default(),
            pinned_model: None,
            skills_off: Default::default(),
            last_precheck: None,
            job_costs: Default::default(),
            job_running: None,
            recent_turns: Vec::new(),
            open_client_calls: Vec::new(),
            rendered: RenderCache::new(),
            snapshot: SnapshotMark::default(),
            images_from: ImagesFrom::default(),
        }
    }

    /// Trail lines folded into this state that its newest snapshot lacks.
    pub fn unsaved_lines(&self) -> u64 {
        self.last_seq.saturating_sub(self.snapshot.0)
    }

    /// Whether the snapshot lacks any line of this state (a graceful stop writes it then).
    pub fn is_dirty(&self) -> bool {
        self.unsaved_lines() > 0
    }

    /// Whether the worker should queue a snapshot now: [`SNAPSHOT_EVERY_LINES`] or more lines
    /// folded since the last one, and at least half as many as the history has messages.
    pub fn snapshot_due(&self) -> bool {
        let spread = u64::try_from(self.messages.len() / 2).unwrap_or(u64::MAX);
        self.unsaved_lines() >= SNAPSHOT_EVERY_LINES.max(spread)
    }

    /// An estimate of the heap memory the state holds: its messages
    /// ([`Message::heap_bytes`]) and the request bytes rendered for them
    /// ([`RenderCache::bytes`]); the few small fields are left out. What bounds the idle
    /// session cache by size (SPEC §16.3); a walk over the history, without allocating.
    pub fn heap_bytes(&self) -> usize {
        self.messages.capacity() * std::mem::size_of::<Message>()
            + self.messages.iter().map(Message::heap_bytes).sum::<usize>()
            + self.rendered.bytes()
    }

    /// Record that a snapshot of the state as it is now was written or queued.
    pub fn mark_saved(&mut self) {
        self.snapshot = SnapshotMark(self.last_seq);
    }

    /// Fold one trail line into the state. Lines at or below `last_seq` are ignored, so
    /// applying a line twice is harmless.
    pub fn apply(&mut self, line: &TrailLine) {
        if line.seq <= self.last_seq {
            return;
        }
        self.last_seq = line.seq;
        if let Ok(t) = chrono::DateTime::parse_from_rfc3339(&line.ts) {
            self.updated_at = t.timestamp();
        }
        match &line.event {
            Event::Session { model, .. } => {
                if self.model.is_empty() {
                    self.model = model.clone();
                }
                if self.messages.is_empty()
                    && let Ok(t) = chrono::DateTime::parse_from_rfc3339(&line.ts)
                {
                    self.created_at = t.timestamp();
                }
            }
            Event::Message(m) => {
                self.track_job(m);
                if matches!(m.message, Message::User { .. }) {
                    let ts = chrono::DateTime::parse_from_rfc3339(&line.ts)
                        .map(|t| t.timestamp())
                        .unwrap_or(self.updated_at);
                    if self.recent_turns.len() >= RECENT_TURNS {
                        self.recent_turns.remove(0);
                    }
                    self.recent_turns.push(ts);
                }
                let mut msg = m.message.clone();
                strip_images(&mut msg);
                if let Message::Assistant { usage: Some(u), .. } = &msg {
                    self.usage.add(u);
                    self.context_tokens = u.prompt_tokens().saturating_add(u.output_tokens);
                }
                if let Some(c) = m.cost_usd {
                    self.cost_usd += c;
                }
                if let Some(n) = m.sent_messages {
                    self.previous_messages = Some(n);
                }
                match &msg {
                    Message::Assistant { .. } => self.open_client_calls = m.client_calls.clone(),
                    Message::ToolResults { results, .. } => {
                        self.answered(results);
                        self.approvals.batch_done();
                    }
                    Message::User { .. } => {}
                }
                self.messages.push(msg);
            }
            Event::ToolResult { results, notice } => {
                self.answered(results);
                self.approvals.batch_done();
                let mut msg = Message::ToolResults {
                    results: results.clone(),
                    notice: notice.clone(),
                };
                strip_images(&mut msg);
                self.messages.push(msg)
            }
            Event::Approval(r) => self.approvals.asked(r),
            Event::ApprovalDecision(d) => self.approvals.decided(d),
            Event::Compaction { summary, removed } => {
                let n = (*removed).min(self.messages.len());
                self.messages.drain(..n);
                self.messages.insert(0, Message::user_text(summary.clone()));
                self.rendered.clear();
                self.images_from.rewritten();
                self.compaction_count += 1;
                self.previous_messages = None;
                self.flags.compaction_warned = false;
            }
            Event::SessionModel(m) => self.pinned_model = m.model.clone(),
            Event::SessionSkill(k) => {
                if k.enabled {
                    self.skills_off.remove(&k.name);
                } else {
                    self.skills_off.insert(k.name.clone());
                }
            }
            Event::Skipped(p) | Event::Precheck(p) => {
                self.last_precheck = Some((self.updated_at, p.clone()));
            }
            Event::Intake(_)
            | Event::Delivery { .. }
            | Event::Failure { .. }
            | Event::Reset { .. } => {}
        }
    }

    /// The effect of a `precheck` or `skipped` line at or below `last_seq`, which the scheduler
    /// appended beside this state's worker (`SessionHandle::queue_snapshot`): the session's
    /// last precheck, unless a later one is already folded.
    pub fn fold_precheck(&mut self, line: &TrailLine) {
        let (Event::Skipped(p) | Event::Precheck(p)) = &line.event else {
            return;
        };
        let at = chrono::DateTime::parse_from_rfc3339(&line.ts)
            .map(|t| t.timestamp())
            .unwrap_or(self.updated_at);
        if self.last_precheck.as_ref().is_none_or(|(t, _)| *t <= at) {
            self.last_precheck = Some((at, p.clone()));
        }
    }

    /// Follow the cost of a scheduled job's turn: a user turn answering `schedule-<name>-<slot>`
    /// starts it, each assistant message adds its cost, the final one records it in
    /// `job_costs`.
    /// Client calls answered by `results` are no longer open.
    fn answered(&mut self, results: &[crate::message::ToolResult]) {
        self.open_client_calls
            .retain(|id| !results.iter().any(|r| &r.tool_call_id == id));
    }

    fn track_job(&mut self, m: &super::event::MessageEvent) {
        match &m.message {
            Message::User { .. } => {
                self.job_running = m.reply_to.iter().find_map(|id| {
                    let rest = id.strip_prefix("schedule-")?;
                    let (name, _slot) = rest.rsplit_once('-')?;
                    Some((name.to_string(), 0.0))
                });
            }
            Message::Assistant { .. } => {
                if let Some((_, cost)) = &mut self.job_running {
                    *cost += m.cost_usd.unwrap_or(0.0);
                }
                if m.is_final
                    && let Some((name, cost)) = self.job_running.take()
                {
                    if self.job_costs.len() >= MAX_JOB_COSTS && !self.job_costs.contains_key(&name)
                    {
                        self.job_costs.pop_first();
                    }
                    self.job_costs.insert(name, cost);
                }
            }
            Message::ToolResults { .. } => {}
        }
    }

    /// Replace image blocks by their text placeholders (done when a message is finished: images
    /// are sent for every call of their own message only, SPEC §6).
    pub fn strip_images(&mut self) {
        let Some(from) = self.images_from.0.take() else {
            return;
        };
        let mut first = None;
        for (i, m) in self.messages.iter_mut().enumerate().skip(from) {
            if strip_images(m) {
                first.get_or_insert(i);
            }
        }
        if let Some(i) = first {
            self.rendered.invalidate_from(i);
        }
    }

    /// Replace message `index` (the one-time swap of a new user turn or of tool results for
    /// their copy with images, which only the calls of their own message see). Out of range:
    /// nothing.
    pub fn replace_message(&mut self, index: usize, message: Message) {
        if let Some(m) = self.messages.get_mut(index) {
            *m = message;
            self.rendered.invalidate_from(index);
            self.images_from = ImagesFrom(Some(self.images_from.0.map_or(index, |i| i.min(index))));
        }
    }

    /// Repair stored tool calls the providers would reject
    /// (`message::toolcalls::repair_history`); returns how many calls changed.
    pub fn repair_tool_calls(&mut self) -> usize {
        let repaired = crate::message::toolcalls::repair_history(&mut self.messages);
        if repaired > 0 {
            self.rendered.clear();
            self.images_from.rewritten();
        }
        repaired
    }
}

/// Whether an image was replaced (a user image by its placeholder) or dropped (a tool
/// result's, whose text holds its placeholder).
fn strip_images(m: &mut Message) -> bool {
    let mut stripped = false;
    match m {
        Message::User { content } => {
            for b in content.iter_mut() {
                if let UserBlock::Image { placeholder, .. } = b {
                    *b = UserBlock::Text {
                        text: std::mem::take(placeholder),
                    };
                    stripped = true;
                }
            }
        }
        Message::ToolResults { results, .. } => {
            for r in results.iter_mut().filter(|r| !r.images.is_empty()) {
                r.images = Vec::new();
                stripped = true;
            }
        }
        Message::Assistant { .. } => {}
    }
    stripped
}

/// Rebuild a state from trail lines alone (no snapshot).
pub fn rebuild(id: &str, key: &str, lines: &[TrailLine]) -> SessionState {
    let mut s = SessionState::new(id, key, "", 0);
    for l in lines {
        s.apply(l);
    }
    s
}

/// Read a snapshot. `Ok(None)` when missing; `Err` when unreadable (the caller rebuilds). The
/// state read is marked saved at its own `last_seq`.
pub fn read_snapshot(path: &Path) -> Result<Option<SessionState>, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice::<SessionState>(&bytes)
            .map(|mut s| {
                s.mark_saved();
                Some(s)
            })
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Write a snapshot durably (temp + fsync + rename + dir fsync). Compact JSON: the file is
/// rewritten often (every [`SNAPSHOT_EVERY_LINES`]), `agentd history` is the way to read it.
pub fn write_snapshot(path: &Path, state: &SessionState) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(state).map_err(std::io::Error::other)?;
    crate::fsutil::atomic_write(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{ToolCall, ToolResult};
    use crate::session::event::{Intake, MessageEvent};

    fn line(seq: u64, event: Event) -> TrailLine {
        TrailLine {
            v: 1,
            seq,
            ts: "2026-11-03T14:05:00+00:00".into(),
            event,
        }
    }

    fn sample() -> Vec<TrailLine> {
        let mut a1 = MessageEvent::new(Message::Assistant {
            text: String::new(),
            tool_calls: vec![ToolCall {
                id: "t1".into(),
                name: "read".into(),
                arguments: serde_json::json!({"path": "x"}),
            }],
            thinking: vec![],
            usage: Some(Usage {
                input_tokens: 10,
                output_tokens: 5,
                cache_read_tokens: 100,
                cache_write_tokens: 20,
                cache_write_1h_tokens: 0,
            }),
        });
        a1.sent_messages = Some(1);
        a1.cost_usd = Some(0.5);
        let mut a2 = MessageEvent::new(Message::Assistant {
            text: "done".into(),
            tool_calls: vec![],
            thinking: vec![],
            usage: Some(Usage {
                input_tokens: 1,
                output_tokens: 2,
                cache_read_tokens: 130,
                cache_write_tokens: 0,
                cache_write_1h_tokens: 0,
            }),
        });
        a2.sent_messages = Some(3);
        a2.is_final = true;
        vec![
            line(
                1,
                Event::Session {
                    session_id: "s".into(),
                    key: "alice".into(),
                    model: "primary".into(),
                },
            ),
            line(
                2,
                Event::Intake(Intake {
                    id: "i1".into(),
                    source: crate::control::Source::User,
                    from: "alice".into(),
                    text: "hi".into(),
                    tier: None,
                    attachments: vec![],
                    route: None,
                    notify_meta: None,
                    relayed_from: None,
                }),
            ),
            line(
                3,
                Event::Message(MessageEvent::new(Message::User {
                    content: vec![
                        UserBlock::Text { text: "hi".into() },
                        UserBlock::Image {
                            media_type: "image/png".into(),
                            data: "AAAA".into(),
                            placeholder: "[image: a.png]".into(),
                        },
                    ],
                })),
            ),
            line(4, Event::Message(a1)),
            line(
                5,
                Event::ToolResult {
                    results: vec![ToolResult {
                        tool_call_id: "t1".into(),
                        content: "file".into(),
                        is_error: false,
                        images: Vec::new(),
                    }],
                    notice: None,
                },
            ),
            line(6, Event::Message(a2)),
        ]
    }

    #[test]
    fn rebuild_includes_tool_results_and_totals() {
        let s = rebuild("s", "alice", &sample());
        assert_eq!(s.messages.len(), 4);
        assert!(matches!(s.messages[2], Message::ToolResults { .. }));
        assert_eq!(s.usage.input_tokens, 11);
        assert_eq!(s.usage.cache_read_tokens, 230);
        assert_eq!(s.previous_messages, Some(3));
        assert_eq!(s.context_tokens, 1 + 130 + 2);
        assert_eq!(s.model, "primary");
        assert_eq!(s.last_seq, 6);
        // Images are never persisted.
        let Message::User { content } = &s.messages[0] else {
            panic!()
        };
        assert_eq!(
            content[1],
            UserBlock::Text {
                text: "[image: a.png]".into()
            }
        );
    }

    #[test]
    fn snapshot_plus_tail_equals_full_replay() {
        let lines = sample();
        for cut in 0..lines.len() {
            let mut s = rebuild("s", "alice", &lines[..cut]);
            for l in &lines {
                s.apply(l); // lines <= last_seq are skipped
            }
            assert_eq!(s, rebuild("s", "alice", &lines), "cut at {cut}");
        }
    }

    /// `session_model` and `session_skill` fold into the state, and a snapshot taken at any
    /// line plus the lines after it gives the same settings (SPEC §18.2).
    #[test]
    fn session_settings_fold_at_every_cut() {
        use crate::session::event::{SessionModelEvent, SessionSkillEvent};
        let model = |m: Option<&str>| {
            Event::SessionModel(SessionModelEvent {
                model: m.map(str::to_string),
                channel: "telegram".into(),
                id: None,
            })
        };
        let skill = |n: &str, on: bool| {
            Event::SessionSkill(SessionSkillEvent {
                name: n.into(),
                enabled: on,
                channel: "http".into(),
                id: None,
            })
        };
        let lines: Vec<TrailLine> = [
            model(Some("cheap")),
            skill("a", false),
            skill("b", false),
            skill("a", true),
            model(None),
            model(Some("primary")),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, e)| line(i as u64 + 1, e))
        .collect();
        let full = rebuild("s", "alice", &lines);
        assert_eq!(full.pinned_model.as_deref(), Some("primary"));
        assert_eq!(full.skills_off, ["b".to_string()].into());
        for cut in 0..lines.len() {
            let json = serde_json::to_vec(&rebuild("s", "alice", &lines[..cut])).unwrap();
            let mut s: SessionState = serde_json::from_slice(&json).unwrap();
            for l in &lines {
                s.apply(l);
            }
            assert_eq!(s, full, "cut at {cut}");
        }
    }

    fn has_image(s: &SessionState) -> bool {
        s.messages.iter().any(|m| {
            matches!(m, Message::User { content } if content.iter().any(|b| matches!(b, UserBlock::Image { .. })))
        })
    }

    fn with_image(text: &str) -> Message {
        Message::User {
            content: vec![
                UserBlock::Text { text: text.into() },
                UserBlock::Image {
                    media_type: "image/png".into(),
                    data: "AAAA".into(),
                    placeholder: "[image: a.png]".into(),
                },
            ],
        }
    }

    /// `strip_images` looks only from the first swapped message, and finds it after the
    /// history was rewritten under it (a compaction inside the message moves it forward).
    #[test]
    fn strip_finds_the_swapped_message_after_a_compaction() {
        let mut s = rebuild("s", "alice", &sample());
        let last = s.messages.len() - 1;
        s.replace_message(last, with_image("look"));
        assert!(has_image(&s));
        s.strip_images();
        assert!(!has_image(&s));

        let last = s.messages.len() - 1;
        s.replace_message(last, with_image("again"));
        s.apply(&line(
            s.last_seq + 1,
            Event::Compaction {
                summary: "summary".into(),
                removed: 2,
            },
        ));
        assert!(has_image(&s), "the swapped message survived the compaction");
        s.strip_images();
        assert!(!has_image(&s));
        // Nothing swapped since: a strip changes nothing.
        let before = s.clone();
        s.strip_images();
        assert_eq!(s, before);
    }

    /// Tool results swapped for their copy with images lose the images at the strip, keep
    /// their text (the placeholders), and a trail line holding images is folded without them.
    #[test]
    fn tool_result_images_are_stripped_and_never_folded() {
        let image = crate::message::ToolImage {
            media_type: "image/png".into(),
            data: "AAAA".into(),
            placeholder: "[image from MCP tool s__t: image/png, 3 bytes]".into(),
        };
        let results = |images: Vec<crate::message::ToolImage>| {
            vec![ToolResult {
                tool_call_id: "c1".into(),
                content: "[image from MCP tool s__t: image/png, 3 bytes]".into(),
                is_error: false,
                images,
            }]
        };
        let tool_images = |s: &SessionState| {
            s.messages.iter().any(|m| {
                matches!(m, Message::ToolResults { results, .. } if results.iter().any(|r| !r.images.is_empty()))
            })
        };
        let mut s = rebuild("s", "alice", &sample());
        let seq = s.last_seq + 1;
        s.apply(&line(
            seq,
            Event::ToolResult {
                results: results(vec![image.clone()]),
                notice: None,
            },
        ));
        assert!(!tool_images(&s), "a folded line never brings images in");
        let last = s.messages.len() - 1;
        s.replace_message(
            last,
            Message::ToolResults {
                results: results(vec![image]),
                notice: None,
            },
        );
        assert!(tool_images(&s));
        s.strip_images();
        assert!(!tool_images(&s));
        assert_eq!(
            s.messages[last],
            Message::ToolResults {
                results: results(Vec::new()),
                notice: None,
            }
        );
    }

    #[test]
    fn compaction_replaces_oldest_messages() {
        let mut lines = sample();
        lines.push(line(
            7,
            Event::Compaction {
                summary: "summary".into(),
                removed: 3,
            },
        ));
        let s = rebuild("s", "alice", &lines);
        assert_eq!(s.messages.len(), 2);
        assert_eq!(s.messages[0], Message::user_text("summary"));
        assert_eq!(s.compaction_count, 1);
        assert_eq!(s.previous_messages, None);
    }

    #[test]
    fn a_snapshot_is_due_every_so_many_lines_and_a_read_one_is_saved() {
        let mut s = SessionState::new("s", "alice", "primary", 0);
        assert!(!s.is_dirty() && !s.snapshot_due());
        s.last_seq = SNAPSHOT_EVERY_LINES - 1;
        assert!(s.is_dirty() && !s.snapshot_due(), "dirty, not yet due");
        s.last_seq = SNAPSHOT_EVERY_LINES;
        assert!(s.snapshot_due());
        s.mark_saved();
        assert!(!s.is_dirty() && !s.snapshot_due());
        s.last_seq += 3;
        assert_eq!(s.unsaved_lines(), 3);
        // A long history: due after half as many lines as it has messages.
        let mut long = SessionState::new("s", "alice", "primary", 0);
        long.messages = vec![Message::user_text("m"); 1000];
        long.last_seq = 499;
        assert!(!long.snapshot_due());
        long.last_seq = 500;
        assert!(long.snapshot_due());
        // The mark is memory only, is not compared, and a read snapshot is saved as read.
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.state.json");
        write_snapshot(&p, &s).unwrap();
        assert!(!std::fs::read_to_string(&p).unwrap().contains("snapshot"));
        let read = read_snapshot(&p).unwrap().unwrap();
        assert_eq!(read, s);
        assert_eq!(read.snapshot.0, s.last_seq);
        assert!(!read.is_dirty());
    }

    #[test]
    fn snapshot_roundtrip() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.state.json");
        assert_eq!(read_snapshot(&p).unwrap(), None);
        let s = rebuild("s", "alice", &sample());
        write_snapshot(&p, &s).unwrap();
        assert_eq!(read_snapshot(&p).unwrap(), Some(s));
        std::fs::write(&p, "{broken").unwrap();
        assert!(read_snapshot(&p).is_err());
    }
}
