//! The memory tools (SPEC §11, §13): `memory_search`, `memory_get`, `memory_write`,
//! `memory_forget`, `commitment_update`. Thin: arguments in, `memory::Memory` /
//! `store::memory` calls, readable text out.

use std::fmt::Write as _;
use std::io::Read;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::paths::open_read_beneath;
use super::{Tool, ToolContext, ToolError};
use crate::llm::ToolSpec;
use crate::memory::{Memory, MemoryError};
use crate::store::memory::{AliasWrite, CommitmentStatus, Fact, FactWrite, NewCommitment, NewFact};

/// Largest `k` of one search.
const MAX_K: u64 = 50;
/// Characters of a chunk shown in search results.
const HIT_CHARS: usize = 1_200;
/// Lines `memory_get` returns when `lines` is not given.
const DEFAULT_LINES: usize = 200;

/// All five tools over one memory service.
pub fn tools(memory: &Memory) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(MemorySearch(memory.clone())),
        Arc::new(MemoryGet(memory.clone())),
        Arc::new(MemoryWrite(memory.clone())),
        Arc::new(MemoryForget(memory.clone())),
        Arc::new(CommitmentUpdate(memory.clone())),
    ]
}

fn failed(e: MemoryError) -> ToolError {
    match e {
        MemoryError::Invalid(m) => ToolError::Invalid(m),
        other => ToolError::Failed(format!("memory: {other}")),
    }
}

fn store_failed(e: crate::store::StoreError) -> ToolError {
    ToolError::Failed(format!("memory: {e}"))
}

fn date(ts: i64, memory: &Memory) -> String {
    chrono::DateTime::from_timestamp(ts, 0)
        .map(|d| d.with_timezone(&memory.tz()).format("%Y-%m-%d").to_string())
        .unwrap_or_default()
}

fn fact_line(f: &Fact, memory: &Memory) -> String {
    let mut line = format!(
        "#{} {} · {}: {} (confidence {:.2}, {}, {})",
        f.id,
        f.entity,
        f.attribute,
        f.value,
        f.confidence,
        f.source,
        date(f.created_at, memory)
    );
    match (f.invalidated_at, f.superseded_by) {
        (Some(_), Some(by)) => {
            let _ = write!(line, " — superseded by #{by}");
        }
        (Some(at), None) => {
            let _ = write!(line, " — forgotten {}", date(at, memory));
        }
        _ => {}
    }
    line
}

fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{} […]", &text[..at]),
        None => text.to_string(),
    }
}

fn str_arg<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// A `YYYY-MM-DD` date as the end of that day in the agent's time zone.
fn due_date(s: &str, memory: &Memory) -> Result<i64, ToolError> {
    use chrono::TimeZone;
    let day = chrono::NaiveDate::parse_from_str(s.trim(), "%Y-%m-%d")
        .map_err(|_| ToolError::Invalid(format!("due: {s:?} is not a date like 2026-11-28")))?;
    let end = day
        .and_hms_opt(23, 59, 59)
        .ok_or_else(|| ToolError::Invalid(format!("due: {s:?} is not a valid date")))?;
    memory
        .tz()
        .from_local_datetime(&end)
        .earliest()
        .map(|t| t.timestamp())
        .ok_or_else(|| ToolError::Invalid(format!("due: {s:?} does not exist in this time zone")))
}

pub struct MemorySearch(Memory);
pub struct MemoryGet(Memory);
pub struct MemoryWrite(Memory);
pub struct MemoryForget(Memory);
pub struct CommitmentUpdate(Memory);

impl Tool for MemorySearch {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "memory_search".into(),
            description: "Search long-term memory: the indexed workspace notes (MEMORY.md, memory/*.md), current facts and past episodes. Works with keywords or a natural question. Returns facts (with ids), episodes and note excerpts with their path and lines (read more with memory_get).".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 1, "maxLength": 2000},
                    "k": {"type": "integer", "minimum": 1, "maximum": MAX_K, "description": "How many note excerpts (default [memory] search_top_k)."}
                },
                "required": ["query"],
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let m = &self.0;
            let query = str_arg(&args, "query")
                .ok_or_else(|| ToolError::Invalid("query: give some words to search for".into()))?;
            let k = args
                .get("k")
                .and_then(Value::as_u64)
                .unwrap_or(u64::from(m.cfg().search_top_k))
                .clamp(1, MAX_K) as usize;
            let r = m.search(query, k, &ctx.session_id).await.map_err(failed)?;
            let mode = match r.mode {
                crate::memory::SearchMode::Hybrid => "hybrid: full text + vectors",
                crate::memory::SearchMode::FullText => "full text",
            };
            let mut out = format!("Memory search ({mode}) for {query:?}:\n");
            if let Some(w) = &r.warning {
                let _ = writeln!(out, "(vectors unavailable: {w})");
            }
            if r.facts.is_empty() && r.episodes.is_empty() && r.chunks.is_empty() {
                out.push_str("Nothing found.\n");
                return Ok(out);
            }
            if !r.facts.is_empty() {
                out.push_str("\nFacts:\n");
                for f in &r.facts {
                    let _ = writeln!(out, "- {}", fact_line(f, m));
                }
            }
            if !r.episodes.is_empty() {
                out.push_str("\nEpisodes:\n");
                for e in &r.episodes {
                    let when = e.occurred_at.unwrap_or(e.created_at);
                    let _ = writeln!(out, "- #{} ({}) {}", e.id, date(when, m), e.summary);
                }
            }
            if !r.chunks.is_empty() {
                out.push_str("\nNotes:\n");
                for (i, h) in r.chunks.iter().enumerate() {
                    let _ = writeln!(
                        out,
                        "{}. {}:{}-{}\n{}\n",
                        i + 1,
                        h.path,
                        h.start_line,
                        h.end_line,
                        cut(h.text.trim_end(), HIT_CHARS)
                    );
                }
            }
            Ok(out)
        })
    }
}

impl Tool for MemoryGet {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "memory_get".into(),
            description: "Read long-term memory exactly. With path: lines of an indexed workspace note (as memory_search names it), from line `from`. With entity: every current fact about that entity or alias (history=true adds superseded and forgotten values).".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "minLength": 1, "maxLength": 500},
                    "from": {"type": "integer", "minimum": 1},
                    "lines": {"type": "integer", "minimum": 1, "maximum": 2000},
                    "entity": {"type": "string", "minLength": 1, "maxLength": 200},
                    "history": {"type": "boolean"}
                },
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(
        &'a self,
        args: Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let m = &self.0;
            match (str_arg(&args, "path"), str_arg(&args, "entity")) {
                (Some(path), None) => {
                    let from =
                        args.get("from").and_then(Value::as_u64).unwrap_or(1).max(1) as usize;
                    let lines = args
                        .get("lines")
                        .and_then(Value::as_u64)
                        .map_or(DEFAULT_LINES, |n| n as usize);
                    read_note(m, path, from, lines).await
                }
                (None, Some(entity)) => {
                    let history = args
                        .get("history")
                        .and_then(Value::as_bool)
                        .unwrap_or(false);
                    let canonical = m.db().resolve_entity(entity).await.map_err(store_failed)?;
                    let facts = m
                        .db()
                        .facts_of(entity, history)
                        .await
                        .map_err(store_failed)?;
                    if facts.is_empty() {
                        return Ok(format!(
                            "No {}facts about {canonical}.",
                            if history { "" } else { "current " }
                        ));
                    }
                    let mut out = format!("Facts about {canonical}:\n");
                    for f in &facts {
                        let _ = writeln!(out, "- {}", fact_line(f, m));
                    }
                    Ok(out)
                }
                _ => Err(ToolError::Invalid(
                    "give exactly one of path (a note) or entity (its facts)".into(),
                )),
            }
        })
    }
}

/// Numbered lines `from..from+lines` of the indexed note `path`.
async fn read_note(m: &Memory, path: &str, from: usize, lines: usize) -> Result<String, ToolError> {
    let rel = path.trim_start_matches("./");
    if m.db().file_meta(rel).await.map_err(store_failed)?.is_none() {
        return Err(ToolError::Invalid(format!(
            "{path:?} is not an indexed note; use a path that memory_search returned (relative to the workspace)"
        )));
    }
    let workspace = m.workspace().to_path_buf();
    let full = workspace.join(rel);
    let text = tokio::task::spawn_blocking(move || -> Result<String, ToolError> {
        let mut f = open_read_beneath(&full, &[workspace])?;
        let mut s = String::new();
        f.by_ref()
            .take(crate::memory::index::MAX_FILE_BYTES)
            .read_to_string(&mut s)
            .map_err(|e| ToolError::Failed(format!("cannot read the note: {e}")))?;
        Ok(s)
    })
    .await
    .map_err(|e| ToolError::Failed(format!("reading the note failed: {e}")))??;
    let total = text.lines().count();
    if from > total.max(1) {
        return Err(ToolError::Invalid(format!(
            "from = {from} is past the end ({path} has {total} lines)"
        )));
    }
    let mut out = String::new();
    for (i, line) in text.lines().enumerate().skip(from - 1).take(lines) {
        let _ = writeln!(out, "{:>6}\t{line}", i + 1);
    }
    let shown_to = (from - 1 + lines).min(total);
    if shown_to < total {
        let _ = writeln!(
            out,
            "({path}: lines {from}-{shown_to} of {total}; use from={} for more)",
            shown_to + 1
        );
    }
    Ok(out)
}

impl Tool for MemoryWrite {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "memory_write".into(),
            description: "Remember a fact: entity, attribute, value (e.g. Anna Schmidt · birthday · 3 May). A new value for the same entity and attribute supersedes the old one (kept in history, never overwritten). aliases adds other names for the entity (\"Mum\"); an alias can be used as entity later.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "entity": {"type": "string", "minLength": 1, "maxLength": 200},
                    "attribute": {"type": "string", "minLength": 1, "maxLength": 200},
                    "value": {"type": "string", "minLength": 1, "maxLength": 2000},
                    "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                    "aliases": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 200}, "maxItems": 20}
                },
                "required": ["entity", "attribute", "value"],
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let m = &self.0;
            let need = |k: &str| {
                str_arg(&args, k)
                    .map(str::to_string)
                    .ok_or_else(|| ToolError::Invalid(format!("{k}: must not be empty")))
            };
            let (entity, attribute, value) = (need("entity")?, need("attribute")?, need("value")?);
            let fact = NewFact {
                entity,
                attribute,
                value,
                confidence: args
                    .get("confidence")
                    .and_then(Value::as_f64)
                    .unwrap_or(1.0),
                source: "tool".into(),
                session_id: Some(ctx.session_id.clone()),
            };
            let written = m
                .db()
                .write_fact(fact.clone())
                .await
                .map_err(store_failed)?;
            let (id, entity) = match &written {
                FactWrite::Inserted { id, entity }
                | FactWrite::Superseded { id, entity, .. }
                | FactWrite::Unchanged { id, entity } => (*id, entity.clone()),
            };
            let mut out = match &written {
                FactWrite::Inserted { .. } => format!(
                    "Saved fact #{id}: {entity} · {}: {}",
                    fact.attribute, fact.value
                ),
                FactWrite::Superseded { old, .. } => format!(
                    "Saved fact #{id}: {entity} · {}: {} (supersedes #{}: {})",
                    fact.attribute, fact.value, old.id, old.value
                ),
                FactWrite::Unchanged { .. } => {
                    format!(
                        "Already known as fact #{id}: {entity} · {}: {}",
                        fact.attribute, fact.value
                    )
                }
            };
            if let Some(aliases) = args.get("aliases").and_then(Value::as_array) {
                for a in aliases.iter().filter_map(Value::as_str) {
                    match m.db().add_alias(a, &entity).await.map_err(store_failed)? {
                        AliasWrite::Added { .. } => {
                            let _ = write!(out, "\nAlias {a:?} → {entity}");
                        }
                        AliasWrite::Unchanged => {}
                        AliasWrite::Refused(why) => {
                            let _ = write!(out, "\nAlias refused: {why}");
                        }
                    }
                }
            }
            Ok(out)
        })
    }
}

impl Tool for MemoryForget {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "memory_forget".into(),
            description: "Forget a fact or an episode (soft delete: it no longer shows up, but history keeps it). Give fact_id, or entity (+ attribute, else all its facts), or episode_id.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "fact_id": {"type": "integer", "minimum": 1},
                    "entity": {"type": "string", "minLength": 1, "maxLength": 200},
                    "attribute": {"type": "string", "minLength": 1, "maxLength": 200},
                    "episode_id": {"type": "integer", "minimum": 1}
                },
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(
        &'a self,
        args: Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let m = &self.0;
            let fact_id = args.get("fact_id").and_then(Value::as_i64);
            let episode_id = args.get("episode_id").and_then(Value::as_i64);
            let entity = str_arg(&args, "entity");
            match (fact_id, episode_id, entity) {
                (Some(id), None, None) => {
                    match m.db().forget_fact(id).await.map_err(store_failed)? {
                        Some(f) => Ok(format!(
                            "Forgot fact #{id}: {} · {}: {}",
                            f.entity, f.attribute, f.value
                        )),
                        None => Err(ToolError::Invalid(format!("no current fact #{id}"))),
                    }
                }
                (None, Some(id), None) => {
                    if m.db().forget_episode(id).await.map_err(store_failed)? {
                        Ok(format!("Forgot episode #{id}"))
                    } else {
                        Err(ToolError::Invalid(format!("no live episode #{id}")))
                    }
                }
                (None, None, Some(entity)) => {
                    let attribute = str_arg(&args, "attribute");
                    let gone = m
                        .db()
                        .forget_facts_of(entity, attribute)
                        .await
                        .map_err(store_failed)?;
                    if gone.is_empty() {
                        return Err(ToolError::Invalid(format!(
                            "no current facts about {entity}{}",
                            attribute.map(|a| format!(" · {a}")).unwrap_or_default()
                        )));
                    }
                    let mut out = format!("Forgot {} fact(s):", gone.len());
                    for f in &gone {
                        let _ = write!(
                            out,
                            "\n- #{} {} · {}: {}",
                            f.id, f.entity, f.attribute, f.value
                        );
                    }
                    Ok(out)
                }
                _ => Err(ToolError::Invalid(
                    "give exactly one of fact_id, entity (with optional attribute) or episode_id"
                        .into(),
                )),
            }
        })
    }
}

impl Tool for CommitmentUpdate {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "commitment_update".into(),
            description: "Track promises. With id and status: mark a commitment done, cancelled, expired or open again. Without id: record a new open commitment (description, optional owner and due date YYYY-MM-DD). Open commitments appear in memory recall.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1},
                    "status": {"type": "string", "enum": CommitmentStatus::ALL},
                    "description": {"type": "string", "minLength": 1, "maxLength": 1000},
                    "owner": {"type": "string", "minLength": 1, "maxLength": 200},
                    "due": {"type": "string", "description": "YYYY-MM-DD"}
                },
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let m = &self.0;
            let status = str_arg(&args, "status").and_then(CommitmentStatus::parse);
            match (args.get("id").and_then(Value::as_i64), status) {
                (Some(id), Some(status)) => {
                    match m
                        .db()
                        .set_commitment_status(id, status)
                        .await
                        .map_err(store_failed)?
                    {
                        Some(before) => Ok(format!(
                            "Commitment #{id} ({}) is now {} (was {})",
                            before.description,
                            status.as_str(),
                            before.status.as_str()
                        )),
                        None => Err(ToolError::Invalid(format!("no commitment #{id}"))),
                    }
                }
                (Some(_), None) => Err(ToolError::Invalid(
                    "status: give the new status (open, done, expired, cancelled)".into(),
                )),
                (None, _) => {
                    let description = str_arg(&args, "description").ok_or_else(|| {
                        ToolError::Invalid(
                            "give id and status to update a commitment, or description to record a new one".into(),
                        )
                    })?;
                    let due_at = str_arg(&args, "due").map(|d| due_date(d, m)).transpose()?;
                    let new = NewCommitment {
                        description: description.to_string(),
                        owner: str_arg(&args, "owner").map(str::to_string),
                        due_at,
                        session_id: Some(ctx.session_id.clone()),
                    };
                    match m.db().add_commitment(new).await.map_err(store_failed)? {
                        Some(id) => Ok(format!("Recorded commitment #{id}: {description}")),
                        None => Ok(format!("An open commitment {description:?} already exists")),
                    }
                }
            }
        })
    }
}
