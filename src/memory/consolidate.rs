//! Consolidation (SPEC §13): an LLM reads what was said and extracts durable facts, episodes,
//! commitments and aliases into structured memory.
//!
//! * **Sessions.** The trail lines after the session's watermark (`consolidation_state`) are
//!   rendered as a transcript (`llm::transcript`, without the dynamic context) and sent to the
//!   consolidation model; the extraction and the new watermark are written in one transaction,
//!   so nothing is processed twice, even across a crash or a concurrent `agentd consolidate`.
//!   Runs before compaction and on session close when `consolidation.enabled`, and from
//!   `agentd consolidate` / the scheduler's `job = "consolidate"`. A session with fewer than
//!   `consolidation.min_messages` new messages waits for more.
//! * **Workspace notes.** Files of `indexer.include` whose content hash differs from the one
//!   last consolidated (`consolidation_file_hashes`) are read the same way
//!   (`agentd consolidate` and the scheduled job only).
//!
//! The model is `consolidation` when defined and loaded, else the compaction model, else
//! `primary`. Facts below `consolidation.confidence_threshold` are dropped. Every call is
//! checked against the budget first and recorded in `costs` as `consolidation`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::zone::Zone;
use chrono::{NaiveDate, TimeZone};
use serde::{Deserialize, Serialize};

use super::chunk::{chunk_lines, sha256_hex};
use super::{Memory, MemoryError};
use crate::config::Config;
use crate::gateway::{Bill, CallError, ChatCall, Gateway};
use crate::llm::transcript::transcript;
use crate::llm::{ChatRequest, LlmEvent, SystemBlock, SystemTier, ToolChoice};
use crate::message::Message;
use crate::session::{Event, TrailLine};
use crate::store::CallType;
use crate::store::memory::{Applied, Extraction, NewCommitment, NewEpisode, NewFact};

/// The conventional name of the consolidation model.
pub const MODEL_NAME: &str = "consolidation";
/// Most transcript characters sent in one call; a longer backlog takes several calls.
const WINDOW_CHARS: usize = 48_000;
/// Longest single transcript item.
const ITEM_CHARS: usize = 4_000;
/// Known entity names listed in the request (so the model reuses their spelling).
const MAX_KNOWN_ENTITIES: usize = 60;
/// Caps on one extraction (a runaway answer cannot flood memory).
const MAX_FACTS: usize = 60;
const MAX_EPISODES: usize = 20;
const MAX_COMMITMENTS: usize = 20;
/// Aliases of one answer at most (issue "Security, third round", item 9); the rest are
/// counted as refused. The store caps the total (`store::memory::MAX_ALIASES`).
pub const MAX_ALIASES_PER_ANSWER: usize = 20;
const MAX_FIELD_CHARS: usize = 1_000;

/// The instructions of every consolidation call.
pub const PROMPT: &str = r#"You maintain the long-term memory of a personal AI agent. You read part of a conversation between the user and the agent (or one of the user's notes) and extract what is worth remembering for weeks or months.

Reply with ONE JSON object and nothing else, in this shape:
{"facts": [{"entity": "Anna Schmidt", "attribute": "birthday", "value": "3 May", "confidence": 0.9}],
 "aliases": [{"alias": "Mum", "entity": "Anna Schmidt"}],
 "episodes": [{"summary": "The user and the agent planned Anna's 60th birthday party.", "date": "2026-11-03"}],
 "commitments": [{"description": "Remind the user to order the cake", "owner": "agent", "due": "2026-11-28"}]}

Rules:
- facts: durable facts about people, places, things, preferences, plans and the user (use the user's name as the entity when known, else "user"). One value per entity and attribute; a short lower-case attribute ("birthday", "phone", "favourite restaurant"). confidence from 0 to 1: how sure the text makes it.
- Use the full canonical name of an entity; put nicknames and relations ("Mum", "my boss") in aliases. Reuse the spelling of the known entities listed below. At most 20 aliases, each a short name that is not the name of another known entity.
- episodes: notable events or decisions, one sentence each, with the date (YYYY-MM-DD) when known.
- commitments: promises someone made (owner "agent", "user" or a name), with a due date (YYYY-MM-DD) when one was given.
- Leave out small talk, greetings, tool mechanics, and anything only true for a moment. Never invent. Empty arrays when there is nothing."#;

/// What the model answers, leniently read.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Raw {
    facts: Vec<RawFact>,
    aliases: Vec<RawAlias>,
    episodes: Vec<RawEpisode>,
    commitments: Vec<RawCommitment>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawFact {
    entity: String,
    attribute: String,
    value: serde_json::Value,
    confidence: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawAlias {
    alias: String,
    entity: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawEpisode {
    summary: String,
    date: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawCommitment {
    description: String,
    owner: Option<String>,
    due: Option<String>,
}

/// Where an extraction comes from (for `source` and `session_id` of the rows).
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    pub session_id: Option<&'a str>,
}

fn field(s: &str) -> Option<String> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    Some(match s.char_indices().nth(MAX_FIELD_CHARS) {
        Some((at, _)) => s[..at].to_string(),
        None => s.to_string(),
    })
}

/// A date (`YYYY-MM-DD`, or the date part of a longer timestamp) at `hour`:00 in `tz`, as Unix
/// seconds.
fn date_at(s: &str, tz: &Zone, hour: u32) -> Option<i64> {
    let day = NaiveDate::parse_from_str(s.trim().get(..10)?, "%Y-%m-%d").ok()?;
    let local = day.and_hms_opt(hour, 0, 0)?;
    tz.from_local_datetime(&local)
        .earliest()
        .map(|t| t.timestamp())
}

/// Parse the model's answer into an extraction: the first `{` to the last `}` (code fences and
/// chatter around it are ignored); unknown fields are ignored; empty items and facts below
/// `threshold` are dropped; long fields are cut; counts are capped.
pub fn parse_extraction(
    answer: &str,
    threshold: f64,
    origin: Origin<'_>,
    tz: Zone,
) -> Result<Extraction, MemoryError> {
    let (start, end) = match (answer.find('{'), answer.rfind('}')) {
        (Some(s), Some(e)) if s < e => (s, e),
        _ => {
            return Err(MemoryError::Consolidation(
                "the model's answer holds no JSON object".into(),
            ));
        }
    };
    let raw: Raw = serde_json::from_str(&answer[start..=end]).map_err(|e| {
        MemoryError::Consolidation(format!("the model's answer is not the expected JSON: {e}"))
    })?;
    let session_id = origin.session_id.map(str::to_string);
    let mut x = Extraction::default();
    for a in raw.aliases {
        if let (Some(alias), Some(entity)) = (field(&a.alias), field(&a.entity)) {
            if x.aliases.len() < MAX_ALIASES_PER_ANSWER {
                x.aliases.push((alias, entity));
            } else {
                x.aliases_dropped += 1;
            }
        }
    }
    for f in raw.facts.into_iter().take(MAX_FACTS) {
        let value = match &f.value {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => continue,
            other => other.to_string(),
        };
        let confidence = f.confidence.unwrap_or(1.0).clamp(0.0, 1.0);
        if confidence < threshold {
            continue;
        }
        if let (Some(entity), Some(attribute), Some(value)) =
            (field(&f.entity), field(&f.attribute), field(&value))
        {
            x.facts.push(NewFact {
                entity,
                attribute,
                value,
                confidence,
                source: "consolidation".into(),
                session_id: session_id.clone(),
            });
        }
    }
    for e in raw.episodes.into_iter().take(MAX_EPISODES) {
        if let Some(summary) = field(&e.summary) {
            x.episodes.push(NewEpisode {
                session_id: session_id.clone(),
                summary,
                occurred_at: e.date.as_deref().and_then(|d| date_at(d, &tz, 12)),
            });
        }
    }
    for c in raw.commitments.into_iter().take(MAX_COMMITMENTS) {
        if let Some(description) = field(&c.description) {
            x.commitments.push(NewCommitment {
                description,
                owner: c.owner.as_deref().and_then(field),
                due_at: c.due.as_deref().and_then(|d| date_at(d, &tz, 23)),
                session_id: session_id.clone(),
            });
        }
    }
    Ok(x)
}

/// How a session's consolidation ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum SessionOutcome {
    /// Nothing was sent to the model (the reason says why: too few new messages, ...).
    Waiting { reason: String },
    /// Extracted and written; the watermark is now `up_to_seq`.
    Done {
        applied: Applied,
        up_to_seq: u64,
        calls: usize,
    },
}

/// What `agentd consolidate` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ConsolidateReport {
    pub sessions: Vec<(String, SessionOutcome)>,
    /// The notes of each call and what it wrote.
    pub files: Vec<(Vec<String>, Applied)>,
    pub errors: Vec<String>,
}

impl ConsolidateReport {
    /// Notes sent to the model, over all calls.
    pub fn notes(&self) -> usize {
        self.files.iter().map(|(paths, _)| paths.len()).sum()
    }
}

/// The consolidation service: memory, and the model through the provider gateway.
#[derive(Clone)]
pub struct Consolidator {
    memory: Memory,
    gateway: Arc<Gateway>,
    model: String,
    min_messages: usize,
    threshold: f64,
    /// One consolidation at a time in this process (the watermark guards across processes).
    running: Arc<tokio::sync::Mutex<()>>,
}

impl Consolidator {
    pub fn new(memory: Memory, gateway: Arc<Gateway>, cfg: &Config) -> Consolidator {
        let loaded = |name: &str| gateway.models().get(name).is_some();
        let model = if loaded(MODEL_NAME) {
            MODEL_NAME.to_string()
        } else if loaded(&cfg.behavior.compaction.model) {
            cfg.behavior.compaction.model.clone()
        } else {
            "primary".to_string()
        };
        Consolidator {
            min_messages: cfg.memory.consolidation_min_messages as usize,
            threshold: cfg.memory.consolidation_confidence_threshold,
            memory,
            gateway,
            model,
            running: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// The model consolidation calls.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Consolidate the trail of session `id` in `dir` (the sessions directory, or its
    /// `.archive/` for a closed session) past its watermark.
    pub async fn session(&self, dir: &Path, id: &str) -> Result<SessionOutcome, MemoryError> {
        let _one = self.running.lock().await;
        let mark = self.memory.db().watermark(id).await?;
        let (dir_owned, id_owned) = (dir.to_path_buf(), id.to_string());
        let lines = tokio::task::spawn_blocking(move || {
            crate::session::trail::read_trail_after(&dir_owned, &id_owned, mark.max(0) as u64)
        })
        .await
        .map_err(|e| MemoryError::Io(format!("reading the trail of {id} failed: {e}")))?
        .map_err(|e| MemoryError::Io(format!("cannot read the trail of session {id}: {e}")))?;
        let Some(last_seq) = lines.last().map(|l| l.seq) else {
            return Ok(SessionOutcome::Waiting {
                reason: "no new trail lines".into(),
            });
        };
        if is_one_off(&lines) {
            return Ok(SessionOutcome::Waiting {
                reason: ONE_OFF_REASON.into(),
            });
        }
        let messages = conversation(&lines);
        let said = messages
            .iter()
            .filter(|(_, m)| !matches!(m, Message::ToolResults { .. }))
            .count();
        if said < self.min_messages.max(1) {
            return Ok(SessionOutcome::Waiting {
                reason: format!(
                    "{said} new message(s), fewer than consolidation.min_messages = {}",
                    self.min_messages
                ),
            });
        }
        let mut total = Applied::default();
        let mut calls = 0;
        let windows = windows(&messages);
        let n = windows.len();
        for (i, (window_end, text)) in windows.into_iter().enumerate() {
            // The last window carries the watermark past trailing non-message lines too.
            let up_to = if i + 1 == n { last_seq } else { window_end };
            let x = self
                .extract(
                    &text,
                    Origin {
                        session_id: Some(id),
                    },
                )
                .await?;
            calls += 1;
            let a = self
                .memory
                .db()
                .apply_session_consolidation(id, up_to as i64, x)
                .await?;
            warn_refused(id, &a);
            add(&mut total, &a);
        }
        Ok(SessionOutcome::Done {
            applied: total,
            up_to_seq: last_seq,
            calls,
        })
    }

    /// Consolidate the workspace notes (`indexer.include`) whose content changed since their
    /// last consolidation. Small notes share a call (up to [`WINDOW_CHARS`] of text); a large
    /// one takes several. Returns the notes of each call and what it wrote.
    pub async fn files(&self) -> Result<Vec<(Vec<String>, Applied)>, MemoryError> {
        let _one = self.running.lock().await;
        let workspace = self.memory.workspace().to_path_buf();
        let include = self.memory.cfg().indexer_include.clone();
        let (found, _skipped) =
            tokio::task::spawn_blocking(move || super::index::scan(&workspace, &include))
                .await
                .map_err(|e| MemoryError::Io(format!("workspace scan failed: {e}")))??;
        // (path, hash, text) of every changed note.
        let mut changed = Vec::new();
        for f in found {
            let abs = f.abs.clone();
            let bytes = tokio::task::spawn_blocking(move || std::fs::read(abs))
                .await
                .map_err(|e| MemoryError::Io(format!("reading {} failed: {e}", f.rel)))?
                .map_err(|e| MemoryError::Io(format!("cannot read {}: {e}", f.rel)))?;
            let hash = sha256_hex(&bytes);
            if self
                .memory
                .db()
                .consolidated_file_hash(&f.rel)
                .await?
                .as_deref()
                != Some(&hash)
            {
                changed.push((f.rel, hash, String::from_utf8_lossy(&bytes).into_owned()));
            }
        }
        let mut out = Vec::new();
        for batch in note_batches(&changed) {
            let mut all = Extraction::default();
            for doc in &batch.docs {
                let x = self.extract(doc, Origin { session_id: None }).await?;
                all.aliases.extend(x.aliases);
                all.aliases_dropped += x.aliases_dropped;
                all.facts.extend(x.facts);
                all.episodes.extend(x.episodes);
                all.commitments.extend(x.commitments);
            }
            let paths: Vec<String> = batch.files.iter().map(|(p, _)| p.clone()).collect();
            let a = self
                .memory
                .db()
                .apply_files_consolidation(batch.files, all)
                .await?;
            warn_refused("workspace notes", &a);
            out.push((paths, a));
        }
        Ok(out)
    }

    /// Every live and archived session of `sessions_dir`, then the workspace notes. Errors of
    /// one session are collected and the others go on. `on_session` hears each outcome.
    pub async fn all(
        &self,
        sessions_dir: &Path,
        on_session: &mut (dyn FnMut(&str, &Result<SessionOutcome, MemoryError>) + Send),
    ) -> ConsolidateReport {
        let mut report = ConsolidateReport::default();
        for (dir, id) in session_ids(sessions_dir) {
            let r = self.session(&dir, &id).await;
            on_session(&id, &r);
            match r {
                Ok(o) => report.sessions.push((id, o)),
                Err(e) => report.errors.push(format!("session {id}: {e}")),
            }
        }
        match self.files().await {
            Ok(files) => report.files = files,
            Err(e) => report.errors.push(format!("workspace notes: {e}")),
        }
        report
    }

    /// One extraction call for `text`.
    async fn extract(&self, text: &str, origin: Origin<'_>) -> Result<Extraction, MemoryError> {
        let mut names = self.memory.db().entities_with_facts().await?;
        names.truncate(MAX_KNOWN_ENTITIES);
        let today = chrono::Utc::now()
            .with_timezone(&self.memory.tz())
            .format("%Y-%m-%d");
        let body = format!(
            "Today is {today}. Known entities: {}.\n\n<input>\n{text}\n</input>\n\nExtract the memory as instructed. Reply with the JSON object only.",
            if names.is_empty() {
                "none yet".to_string()
            } else {
                names.join(", ")
            }
        );
        let req = ChatRequest {
            options: Default::default(),
            deltas: None,
            stable_ttl: None,
            session_id: origin.session_id.unwrap_or_default().to_string(),
            system: vec![SystemBlock {
                tier: SystemTier::Stable,
                text: PROMPT.to_string(),
            }],
            messages: vec![Message::user_text(body)],
            tools: Arc::from([]),
            tool_choice: ToolChoice::None,
            previous_messages: None,
            rendered: Default::default(),
        };
        let on_event = |e: LlmEvent| {
            if let LlmEvent::RetryWait { attempt, error, .. } = e {
                tracing::debug!(attempt, %error, "consolidation call retrying");
            }
        };
        // Outside any message: the daily and monthly limits apply.
        let bill = Bill::outside(origin.session_id.unwrap_or_default());
        let call = ChatCall::new(&self.model, CallType::Consolidation, bill);
        let outcome = match self.gateway.chat(call, &req, &on_event).await {
            Ok(paid) => paid.out,
            Err(CallError::Budget(e)) => {
                return Err(MemoryError::Consolidation(format!("call not made: {e}")));
            }
            Err(e) => {
                return Err(MemoryError::Consolidation(format!(
                    "model '{}': {e}",
                    self.model
                )));
            }
        };
        parse_extraction(
            &outcome.response.text,
            self.threshold,
            origin,
            self.memory.tz(),
        )
    }
}

/// Notes consolidated together: their `(path, hash)` and the documents sent (one per call).
struct NoteBatch {
    files: Vec<(String, String)>,
    docs: Vec<String>,
}

/// Group changed notes `(path, hash, text)` into calls of at most about [`WINDOW_CHARS`]
/// characters: small notes together, a note larger than that alone in several documents.
/// Blank notes (and blank parts of large ones) are recorded without being sent.
fn note_batches(notes: &[(String, String, String)]) -> Vec<NoteBatch> {
    let mut out: Vec<NoteBatch> = Vec::new();
    // The batch of small notes being filled: its files, its one document and that
    // document's length in characters.
    let mut files: Vec<(String, String)> = Vec::new();
    let mut doc = String::new();
    let mut doc_chars = 0;
    for (path, hash, text) in notes {
        let file = (path.clone(), hash.clone());
        let parts: Vec<String> = chunk_lines(text, WINDOW_CHARS, 0)
            .into_iter()
            .filter(|c| !c.text.trim().is_empty())
            .map(|c| format!("<note path=\"{path}\">\n{}\n</note>\n", c.text))
            .collect();
        match parts.as_slice() {
            [] => files.push(file),
            [part] => {
                let chars = part.chars().count();
                if doc_chars > 0 && doc_chars + chars > WINDOW_CHARS {
                    out.push(NoteBatch {
                        files: std::mem::take(&mut files),
                        docs: vec![std::mem::take(&mut doc)],
                    });
                    doc_chars = 0;
                }
                doc.push_str(part);
                doc_chars += chars;
                files.push(file);
            }
            _ => out.push(NoteBatch {
                files: vec![file],
                docs: parts,
            }),
        }
    }
    if !files.is_empty() {
        let docs = if doc.is_empty() {
            Vec::new()
        } else {
            vec![doc]
        };
        out.push(NoteBatch { files, docs });
    }
    out
}

fn add(total: &mut Applied, a: &Applied) {
    total.aliases += a.aliases;
    total.aliases_refused += a.aliases_refused;
    for why in &a.alias_refusals {
        if total.alias_refusals.len() < MAX_ALIAS_REFUSALS_SHOWN {
            total.alias_refusals.push(why.clone());
        }
    }
    total.facts_new += a.facts_new;
    total.facts_superseded += a.facts_superseded;
    total.facts_unchanged += a.facts_unchanged;
    total.episodes += a.episodes;
    total.commitments += a.commitments;
}

/// Refusal reasons a consolidation result keeps over all its calls (the count goes on).
const MAX_ALIAS_REFUSALS_SHOWN: usize = 5;

/// Log the aliases an application refused (the result carries them too).
fn warn_refused(what: &str, a: &Applied) {
    if a.aliases_refused > 0 {
        tracing::warn!(
            what,
            refused = a.aliases_refused,
            reasons = %a.alias_refusals.join("; "),
            "consolidation: aliases refused"
        );
    }
}

/// The conversation messages of trail lines, each with its line's `seq`.
fn conversation(lines: &[TrailLine]) -> Vec<(u64, Message)> {
    lines
        .iter()
        .filter_map(|l| match &l.event {
            Event::Message(m) => Some((l.seq, m.message.clone())),
            Event::ToolResult { results, notice } => Some((
                l.seq,
                Message::ToolResults {
                    results: results.clone(),
                    notice: notice.clone(),
                },
            )),
            _ => None,
        })
        .collect()
}

/// Split the conversation into transcripts of at most about [`WINDOW_CHARS`], each with the
/// `seq` of its last message. Tool results stay with the call before them.
fn windows(messages: &[(u64, Message)]) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut size = 0;
    for (i, (_, m)) in messages.iter().enumerate() {
        let len = transcript(std::slice::from_ref(m), ITEM_CHARS).len();
        let starts_turn = !matches!(m, Message::ToolResults { .. });
        if size + len > WINDOW_CHARS && i > start && starts_turn {
            out.push(window(&messages[start..i]));
            start = i;
            size = 0;
        }
        size += len;
    }
    if start < messages.len() {
        out.push(window(&messages[start..]));
    }
    out
}

fn window(part: &[(u64, Message)]) -> (u64, String) {
    let msgs: Vec<Message> = part.iter().map(|(_, m)| m.clone()).collect();
    (
        part.last().map_or(0, |(s, _)| *s),
        transcript(&msgs, ITEM_CHARS),
    )
}

/// Why a one-off session of the compatible endpoints is never consolidated.
pub const ONE_OFF_REASON: &str =
    "a one-off API session (SPEC §17): its messages came from the client, not consolidated";

/// Whether `lines` (from the start of a trail; a one-off session is never consolidated, so its
/// watermark stays at the start) are a one-off session of the compatible endpoints (SPEC
/// §16.3: consolidation skips them).
fn is_one_off(lines: &[crate::session::TrailLine]) -> bool {
    lines.first().is_some_and(|l| {
        matches!(&l.event, crate::session::Event::Session { key, .. }
            if key.starts_with(crate::session::event::ONE_OFF_PREFIX))
    })
}

/// `(directory, session id)` of every trail in `sessions_dir` and its `.archive/`, sorted.
pub fn session_ids(sessions_dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = std::collections::BTreeSet::new();
    for dir in [sessions_dir.to_path_buf(), sessions_dir.join(".archive")] {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if let Some(rest) = name.strip_suffix(".jsonl")
                && let Some((id, date)) = rest.rsplit_once('.')
                && date.len() == 10
                && crate::session::index::is_valid_session_id(id)
            {
                out.insert((dir.clone(), id.to_string()));
            }
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue "Security, third round", item 9: one answer with 20,000 aliases stores a bounded
    /// number of them.
    #[test]
    fn aliases_of_one_answer_are_capped() {
        let aliases: Vec<String> = (0..20_000)
            .map(|i| format!("{{\"alias\": \"nick{i}\", \"entity\": \"Bob\"}}"))
            .collect();
        let answer = format!("{{\"aliases\": [{}]}}", aliases.join(","));
        let x = parse_extraction(&answer, 0.5, Origin { session_id: None }, Zone::utc()).unwrap();
        assert_eq!(x.aliases.len(), MAX_ALIASES_PER_ANSWER);
        assert_eq!(x.aliases_dropped, 20_000 - MAX_ALIASES_PER_ANSWER);
    }

    fn tz() -> Zone {
        crate::zone::Zone::get("Europe/Berlin").unwrap()
    }

    #[test]
    fn answers_are_read_leniently() {
        let answer = "Here you go:\n```json\n{\"facts\": [\
            {\"entity\": \"Anna\", \"attribute\": \"birthday\", \"value\": \"3 May\", \"confidence\": 0.9},\
            {\"entity\": \"Anna\", \"attribute\": \"mood\", \"value\": \"tired\", \"confidence\": 0.2},\
            {\"entity\": \"Bob\", \"attribute\": \"age\", \"value\": 41},\
            {\"entity\": \" \", \"attribute\": \"x\", \"value\": \"y\"}],\
            \"aliases\": [{\"alias\": \"Mum\", \"entity\": \"Anna\"}],\
            \"episodes\": [{\"summary\": \"Planned the party\", \"date\": \"2026-11-03\"}, {\"summary\": \"\"}],\
            \"commitments\": [{\"description\": \"Order cake\", \"owner\": \"agent\", \"due\": \"2026-11-28\"}],\
            \"extra\": true}\n```";
        let x = parse_extraction(
            answer,
            0.6,
            Origin {
                session_id: Some("s"),
            },
            tz(),
        )
        .unwrap();
        let facts: Vec<(&str, &str, &str)> = x
            .facts
            .iter()
            .map(|f| (f.entity.as_str(), f.attribute.as_str(), f.value.as_str()))
            .collect();
        assert_eq!(
            facts,
            vec![("Anna", "birthday", "3 May"), ("Bob", "age", "41")]
        );
        assert_eq!(x.facts[1].confidence, 1.0, "no confidence = certain");
        assert_eq!(x.aliases, vec![("Mum".to_string(), "Anna".to_string())]);
        assert_eq!(x.episodes.len(), 1);
        let noon = tz()
            .with_ymd_and_hms(2026, 11, 3, 12, 0, 0)
            .unwrap()
            .timestamp();
        assert_eq!(x.episodes[0].occurred_at, Some(noon));
        assert_eq!(x.commitments[0].owner.as_deref(), Some("agent"));
        assert!(x.commitments[0].due_at.is_some());
        assert_eq!(x.facts[0].session_id.as_deref(), Some("s"));
    }

    #[test]
    fn no_json_is_an_error_and_empty_is_fine() {
        assert!(parse_extraction("no idea", 0.5, Origin { session_id: None }, tz()).is_err());
        assert!(
            parse_extraction("{\"facts\": 3}", 0.5, Origin { session_id: None }, tz()).is_err()
        );
        let x = parse_extraction("{}", 0.5, Origin { session_id: None }, tz()).unwrap();
        assert_eq!(x, Extraction::default());
    }

    #[test]
    fn dates_and_fields() {
        assert!(date_at("2026-02-30", &tz(), 12).is_none());
        assert!(date_at("soon", &tz(), 12).is_none());
        assert_eq!(
            date_at("2026-11-03T08:00:00Z", &tz(), 12),
            date_at("2026-11-03", &tz(), 12)
        );
        assert_eq!(
            field(&"é".repeat(2000)).unwrap().chars().count(),
            MAX_FIELD_CHARS
        );
        assert_eq!(field("   "), None);
    }

    #[test]
    fn windows_split_at_turns_and_carry_the_last_seq() {
        // Items are cut to ITEM_CHARS, so 20 big messages make about 80,000 characters.
        let big = "x".repeat(30_000);
        let mut msgs: Vec<(u64, Message)> = (1..=20)
            .map(|i| (i, Message::user_text(big.clone())))
            .collect();
        msgs.push((21, Message::user_text("small")));
        let w = windows(&msgs);
        assert_eq!(w.len(), 2);
        assert!(w.iter().all(|(_, t)| t.len() <= WINDOW_CHARS + ITEM_CHARS));
        assert_eq!(w[1].0, 21);
        assert!(w[0].0 < 21 && w[0].0 > 1);
        assert!(windows(&[]).is_empty());
    }

    #[test]
    fn small_notes_share_a_call_and_large_ones_are_split() {
        let note =
            |p: &str, n: usize| (p.to_string(), format!("h-{p}"), "line of text\n".repeat(n));
        let notes = vec![
            note("a.md", 10),
            note("b.md", 10),
            note("empty.md", 0),
            note("big.md", 10_000),
            note("c.md", 10),
        ];
        let b = note_batches(&notes);
        assert_eq!(
            b.len(),
            2,
            "one batch for the small notes, one for the big one"
        );
        let big = b.iter().find(|x| x.files[0].0 == "big.md").unwrap();
        assert_eq!(big.files.len(), 1);
        assert!(big.docs.len() >= 3 && big.docs.iter().all(|d| d.len() <= WINDOW_CHARS + 100));
        let small = b.iter().find(|x| x.files[0].0 == "a.md").unwrap();
        let names: Vec<&str> = small.files.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(names, vec!["a.md", "b.md", "empty.md", "c.md"]);
        assert_eq!(small.docs.len(), 1);
        assert!(small.docs[0].contains("<note path=\"c.md\">"));
        assert!(note_batches(&[]).is_empty());
        // Only empty notes: recorded, no call.
        let e = note_batches(&[note("e.md", 0)]);
        assert_eq!((e.len(), e[0].docs.len()), (1, 0));
        // The window counts characters: two notes of two-byte characters that fit in
        // characters (not in bytes) share one call.
        let line = "é".repeat(99) + "\n";
        let wide = |p: &str| {
            let n = WINDOW_CHARS * 2 / 5 / 100;
            (p.to_string(), format!("h-{p}"), line.repeat(n))
        };
        let w = note_batches(&[wide("x.md"), wide("y.md")]);
        assert_eq!((w.len(), w[0].files.len(), w[0].docs.len()), (1, 2, 1));
        assert!(
            w[0].docs[0].len() > WINDOW_CHARS,
            "more bytes than the window"
        );
    }

    #[test]
    fn one_off_api_sessions_are_recognised() {
        let line = |key: &str| crate::session::TrailLine {
            v: 1,
            seq: 1,
            ts: "2026-01-01T00:00:00Z".into(),
            event: crate::session::Event::Session {
                session_id: "s".into(),
                key: key.into(),
                model: "primary".into(),
            },
        };
        assert!(is_one_off(&[line("api-once-0123")]));
        assert!(!is_one_off(&[line("api:laptop")]));
        assert!(!is_one_off(&[]));
    }

    #[test]
    fn session_ids_cover_live_and_archived_trails() {
        let dir = tempfile::tempdir().unwrap();
        let id1 = "0190a0b0-0000-7000-8000-000000000001";
        let id2 = "0190a0b0-0000-7000-8000-000000000002";
        std::fs::create_dir_all(dir.path().join(".archive")).unwrap();
        std::fs::write(dir.path().join(format!("{id1}.2026-11-01.jsonl")), "").unwrap();
        std::fs::write(dir.path().join(format!("{id1}.2026-11-02.jsonl")), "").unwrap();
        std::fs::write(dir.path().join(format!("{id1}.state.json")), "").unwrap();
        std::fs::write(
            dir.path()
                .join(".archive")
                .join(format!("{id2}.2026-10-01.jsonl")),
            "",
        )
        .unwrap();
        std::fs::write(dir.path().join("sessions.json"), "{}").unwrap();
        let ids = session_ids(dir.path());
        assert_eq!(ids.len(), 2);
        assert_eq!(ids[0], (dir.path().to_path_buf(), id1.to_string()));
        assert_eq!(ids[1].1, id2);
    }
}

/// Property tests of `parse_extraction`: the consolidation model's answer is outside input.
#[cfg(test)]
mod prop_tests {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;

    fn tz() -> Zone {
        crate::zone::Zone::get("Europe/Berlin").unwrap()
    }

    /// A field a model writes: not blank, no surrounding whitespace, possibly non-ASCII.
    fn text() -> impl Strategy<Value = String> {
        "[\\PC&&\\S]{1,3}( [\\PC&&\\S]{1,8}){0,3}"
    }

    fn fact() -> impl Strategy<Value = (String, String, String, f64)> {
        (text(), text(), text(), 0.0f64..=1.0)
    }

    fn date() -> impl Strategy<Value = String> {
        (2000i32..2100, 1u32..=12, 1u32..=28).prop_map(|(y, m, d)| format!("{y:04}-{m:02}-{d:02}"))
    }

    /// A well-formed answer and what it contains.
    #[allow(clippy::type_complexity)]
    fn answer() -> impl Strategy<
        Value = (
            Value,
            Vec<(String, String, String, f64)>,
            Vec<(String, Option<String>)>,
            Vec<(String, Option<String>, Option<String>)>,
        ),
    > {
        (
            proptest::collection::vec(fact(), 0..8),
            proptest::collection::vec((text(), proptest::option::of(date())), 0..4),
            proptest::collection::vec(
                (text(), proptest::option::of(text()), proptest::option::of(date())),
                0..4,
            ),
        )
            .prop_map(|(facts, episodes, commitments)| {
                let doc = json!({
                    "facts": facts.iter().map(|(e, a, v, c)| json!({"entity": e, "attribute": a, "value": v, "confidence": c})).collect::<Vec<_>>(),
                    "episodes": episodes.iter().map(|(s, d)| json!({"summary": s, "date": d})).collect::<Vec<_>>(),
                    "commitments": commitments.iter().map(|(d, o, due)| json!({"description": d, "owner": o, "due": due})).collect::<Vec<_>>(),
                });
                (doc, facts, episodes, commitments)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Round trip: an answer wrapped in chatter or a code fence gives back its facts (those
        /// at or above the threshold, in order), episodes and commitments, dates read in the
        /// agent's zone.
        #[test]
        fn answers_round_trip_through_chatter(
            (doc, facts, episodes, commitments) in answer(),
            threshold in 0.0f64..=1.0,
            before in "[^{}]{0,30}",
            after in "[^{}]{0,30}",
        ) {
            let text = format!("{before}\n```json\n{}\n```\n{after}", serde_json::to_string_pretty(&doc).unwrap());
            let x = parse_extraction(&text, threshold, Origin { session_id: Some("s") }, tz()).unwrap();
            let want: Vec<_> = facts.iter().filter(|f| f.3 >= threshold).collect();
            prop_assert_eq!(x.facts.len(), want.len());
            for (got, (e, a, v, c)) in x.facts.iter().zip(want) {
                prop_assert_eq!((&got.entity, &got.attribute, &got.value), (e, a, v));
                prop_assert!((got.confidence - c).abs() < 1e-12);
                prop_assert_eq!(got.session_id.as_deref(), Some("s"));
            }
            prop_assert_eq!(x.episodes.len(), episodes.len());
            for (got, (s, d)) in x.episodes.iter().zip(&episodes) {
                prop_assert_eq!(&got.summary, s);
                prop_assert_eq!(got.occurred_at.is_some(), d.is_some());
            }
            prop_assert_eq!(x.commitments.len(), commitments.len());
            for (got, (d, o, due)) in x.commitments.iter().zip(&commitments) {
                prop_assert_eq!(&got.description, d);
                prop_assert_eq!(&got.owner, o);
                prop_assert_eq!(got.due_at.is_some(), due.is_some());
            }
        }

        /// A broken answer (wrong types, missing or unknown fields) is read leniently or
        /// refused with `MemoryError::Consolidation` — never a panic — and what is read keeps
        /// the rules: no blank or over-long field, confidence within [threshold, 1], capped
        /// counts.
        #[test]
        fn broken_answers_keep_the_rules(
            (doc, ..) in answer(),
            edits in crate::proptest_json::edits(4),
            threshold in 0.0f64..=1.0,
        ) {
            let broken = crate::proptest_json::mutate(&doc, &edits);
            match parse_extraction(&broken.to_string(), threshold, Origin { session_id: None }, tz()) {
                Ok(x) => {
                    prop_assert!(x.facts.len() <= MAX_FACTS && x.episodes.len() <= MAX_EPISODES && x.commitments.len() <= MAX_COMMITMENTS);
                    let ok = |s: &str| !s.trim().is_empty() && s.chars().count() <= MAX_FIELD_CHARS;
                    for f in &x.facts {
                        prop_assert!(ok(&f.entity) && ok(&f.attribute) && ok(&f.value), "{f:?}");
                        prop_assert!(f.confidence >= threshold && f.confidence <= 1.0, "{f:?}");
                    }
                    prop_assert!(x.aliases.iter().all(|(a, e)| ok(a) && ok(e)));
                    prop_assert!(x.episodes.iter().all(|e| ok(&e.summary)));
                    prop_assert!(x.commitments.iter().all(|c| ok(&c.description)));
                }
                Err(e) => prop_assert!(matches!(e, MemoryError::Consolidation(_)), "{e:?}"),
            }
        }

        /// Any text at all: an extraction or `MemoryError::Consolidation`, never a panic.
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,200}", threshold in -1.0f64..2.0) {
            if let Err(e) = parse_extraction(&text, threshold, Origin { session_id: None }, tz()) {
                prop_assert!(matches!(e, MemoryError::Consolidation(_)), "{e:?}");
            }
        }
    }
}
