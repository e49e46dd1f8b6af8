//! Structured memory: facts (entity / attribute / value, superseded and never overwritten),
//! entity aliases, episodes and commitments.

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use super::{MemoryDb, now};
use crate::store::StoreError;

/// One fact row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fact {
    pub id: i64,
    pub entity: String,
    pub attribute: String,
    pub value: String,
    pub confidence: f64,
    /// `tool` (memory_write), `consolidation`, ...
    pub source: String,
    pub session_id: Option<String>,
    pub created_at: i64,
    pub invalidated_at: Option<i64>,
    pub superseded_by: Option<i64>,
}

/// A fact to write.
#[derive(Debug, Clone, PartialEq)]
pub struct NewFact {
    pub entity: String,
    pub attribute: String,
    pub value: String,
    pub confidence: f64,
    pub source: String,
    pub session_id: Option<String>,
}

/// What writing a fact did.
#[derive(Debug, Clone, PartialEq)]
pub enum FactWrite {
    /// No current value existed.
    Inserted { id: i64, entity: String },
    /// The old value was invalidated and points to the new row.
    Superseded { id: i64, entity: String, old: Fact },
    /// The current value is already this one; nothing was written.
    Unchanged { id: i64, entity: String },
}

/// Aliases memory holds at most (issue "Security, third round", item 9): a runaway or hostile
/// consolidation cannot fill it without bound. An alias beyond it is refused.
pub const MAX_ALIASES: usize = 10_000;
/// Longest alias, in words (runs of letters and digits): a message is searched for names of
/// up to this many words.
pub const MAX_ALIAS_WORDS: usize = 6;
/// Longest alias, in characters.
pub const MAX_ALIAS_CHARS: usize = 200;

/// What adding an alias did.
#[derive(Debug, Clone, PartialEq)]
pub enum AliasWrite {
    /// The alias now names `entity`.
    Added { entity: String },
    /// Nothing to do: empty, the entity's own name, or already this mapping.
    Unchanged,
    /// Not added; the reason is for the model.
    Refused(String),
}

/// The lookup key of a name: trimmed and lower-cased (Unicode), as a message is searched.
pub fn alias_key(name: &str) -> String {
    name.trim().to_lowercase()
}

/// Words (runs of letters and digits) in `name`.
fn words(name: &str) -> usize {
    name.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .count()
}

/// The hook of migration 3: the lookup key of every alias that exists.
pub(super) fn fill_alias_keys(tx: &rusqlite::Transaction<'_>) -> rusqlite_migration::HookResult {
    let aliases: Vec<String> = tx
        .prepare("SELECT alias FROM entity_aliases")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut update = tx.prepare("UPDATE entity_aliases SET name_key = ?2 WHERE alias = ?1")?;
    for alias in aliases {
        update.execute(params![alias, alias_key(&alias)])?;
    }
    Ok(())
}

/// One episode: something that happened, summarised.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Episode {
    pub id: i64,
    pub session_id: Option<String>,
    pub summary: String,
    pub occurred_at: Option<i64>,
    pub created_at: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NewEpisode {
    pub session_id: Option<String>,
    pub summary: String,
    pub occurred_at: Option<i64>,
}

/// Status of a commitment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitmentStatus {
    Open,
    Done,
    Expired,
    Cancelled,
}

impl CommitmentStatus {
    pub const ALL: [&'static str; 4] = ["open", "done", "expired", "cancelled"];

    pub fn as_str(self) -> &'static str {
        match self {
            CommitmentStatus::Open => "open",
            CommitmentStatus::Done => "done",
            CommitmentStatus::Expired => "expired",
            CommitmentStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<CommitmentStatus> {
        match s {
            "open" => Some(CommitmentStatus::Open),
            "done" => Some(CommitmentStatus::Done),
            "expired" => Some(CommitmentStatus::Expired),
            "cancelled" => Some(CommitmentStatus::Cancelled),
            _ => None,
        }
    }
}

/// One commitment: a promise with a status.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Commitment {
    pub id: i64,
    pub description: String,
    pub owner: Option<String>,
    pub due_at: Option<i64>,
    pub status: CommitmentStatus,
    pub session_id: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NewCommitment {
    pub description: String,
    pub owner: Option<String>,
    pub due_at: Option<i64>,
    pub session_id: Option<String>,
}

pub(super) const FACT_COLS: &str = "facts.id, facts.entity, facts.attribute, facts.value, \
     facts.confidence, facts.source, facts.session_id, facts.created_at, facts.invalidated_at, \
     facts.superseded_by";

pub(super) fn fact_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Fact> {
    Ok(Fact {
        id: r.get(0)?,
        entity: r.get(1)?,
        attribute: r.get(2)?,
        value: r.get(3)?,
        confidence: r.get(4)?,
        source: r.get(5)?,
        session_id: r.get(6)?,
        created_at: r.get(7)?,
        invalidated_at: r.get(8)?,
        superseded_by: r.get(9)?,
    })
}

pub(super) const EPISODE_COLS: &str = "episodes.id, episodes.session_id, episodes.summary, \
     episodes.occurred_at, episodes.created_at";

pub(super) fn episode_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Episode> {
    Ok(Episode {
        id: r.get(0)?,
        session_id: r.get(1)?,
        summary: r.get(2)?,
        occurred_at: r.get(3)?,
        created_at: r.get(4)?,
    })
}

const COMMITMENT_COLS: &str =
    "id, description, owner, due_at, status, session_id, created_at, updated_at";

fn commitment_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Commitment> {
    let status: String = r.get(4)?;
    Ok(Commitment {
        id: r.get(0)?,
        description: r.get(1)?,
        owner: r.get(2)?,
        due_at: r.get(3)?,
        // The table's CHECK constraint admits only the four values.
        status: CommitmentStatus::parse(&status).unwrap_or(CommitmentStatus::Open),
        session_id: r.get(5)?,
        created_at: r.get(6)?,
        updated_at: r.get(7)?,
    })
}

/// The spelling of an entity with current facts whose name is `name` ignoring case.
fn entity_with_facts(c: &Connection, name: &str) -> rusqlite::Result<Option<String>> {
    c.prepare_cached(
        "SELECT entity FROM facts WHERE entity = ?1 COLLATE NOCASE AND invalidated_at IS NULL \
         ORDER BY id DESC LIMIT 1",
    )?
    .query_row([name], |r| r.get(0))
    .optional()
}

/// The canonical name for `name`: an entity with current facts of that name (ignoring case),
/// else an alias's entity, else the spelling of an existing entity that matches ignoring case,
/// else `name` trimmed. An entity with facts comes first, so an alias that took its name (in
/// a database from before aliases were checked) cannot hide its facts.
pub(super) fn resolve_entity(c: &Connection, name: &str) -> rusqlite::Result<String> {
    let name = name.trim();
    if let Some(e) = entity_with_facts(c, name)? {
        return Ok(e);
    }
    if let Some(e) = c
        .prepare_cached("SELECT entity FROM entity_aliases WHERE alias = ?1")?
        .query_row([name], |r| r.get(0))
        .optional()?
    {
        return Ok(e);
    }
    Ok(c.prepare_cached(
        "SELECT entity FROM facts WHERE entity = ?1 COLLATE NOCASE ORDER BY id DESC LIMIT 1",
    )?
    .query_row([name], |r| r.get(0))
    .optional()?
    .unwrap_or_else(|| name.to_string()))
}

/// Write one fact inside a transaction (see [`MemoryDb::write_fact`]).
pub(super) fn write_fact_tx(c: &Connection, f: &NewFact) -> rusqlite::Result<FactWrite> {
    let entity = resolve_entity(c, &f.entity)?;
    let attribute = f.attribute.trim();
    let value = f.value.trim();
    let current: Vec<Fact> = c
        .prepare_cached(&format!(
            "SELECT {FACT_COLS} FROM facts WHERE entity = ?1 COLLATE NOCASE \
             AND attribute = ?2 COLLATE NOCASE AND invalidated_at IS NULL ORDER BY id DESC"
        ))?
        .query_map([&entity, attribute], fact_row)?
        .collect::<rusqlite::Result<_>>()?;
    if let Some(cur) = current.first()
        && cur.value.trim() == value
    {
        return Ok(FactWrite::Unchanged { id: cur.id, entity });
    }
    let ts = now();
    c.prepare_cached(
        "INSERT INTO facts (entity, attribute, value, confidence, source, session_id, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        entity,
        attribute,
        value,
        f.confidence,
        f.source,
        f.session_id,
        ts
    ])?;
    let id = c.last_insert_rowid();
    for old in &current {
        c.prepare_cached("UPDATE facts SET invalidated_at = ?2, superseded_by = ?3 WHERE id = ?1")?
            .execute(params![old.id, ts, id])?;
    }
    Ok(match current.into_iter().next() {
        Some(old) => FactWrite::Superseded { id, entity, old },
        None => FactWrite::Inserted { id, entity },
    })
}

/// See [`MemoryDb::add_alias`].
pub(super) fn add_alias_tx(
    c: &Connection,
    alias: &str,
    entity: &str,
) -> rusqlite::Result<AliasWrite> {
    let alias = alias.trim();
    let entity = resolve_entity(c, entity)?;
    if alias.is_empty() || alias.eq_ignore_ascii_case(&entity) {
        return Ok(AliasWrite::Unchanged);
    }
    if alias.chars().count() > MAX_ALIAS_CHARS || words(alias) > MAX_ALIAS_WORDS {
        return Ok(AliasWrite::Refused(format!(
            "alias {alias:?} is longer than {MAX_ALIAS_WORDS} words or {MAX_ALIAS_CHARS} \
             characters; use a short name"
        )));
    }
    if let Some(other) = entity_with_facts(c, alias)? {
        return Ok(AliasWrite::Refused(format!(
            "alias {alias:?} is the name of the entity {other:?}, which has facts of its own; \
             an alias may not hide them"
        )));
    }
    let before: Option<String> = c
        .prepare_cached("SELECT entity FROM entity_aliases WHERE alias = ?1")?
        .query_row([alias], |r| r.get(0))
        .optional()?;
    if before.as_deref() == Some(entity.as_str()) {
        return Ok(AliasWrite::Unchanged);
    }
    if before.is_none() {
        let held: i64 = c
            .prepare_cached("SELECT COUNT(*) FROM entity_aliases")?
            .query_row([], |r| r.get(0))?;
        if usize::try_from(held).unwrap_or(usize::MAX) >= MAX_ALIASES {
            return Ok(AliasWrite::Refused(format!(
                "memory holds {held} aliases, the most it keeps ({MAX_ALIASES}); alias \
                 {alias:?} was not added"
            )));
        }
    }
    c.prepare_cached(
        "INSERT INTO entity_aliases (alias, entity, created_at, name_key) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (alias) DO UPDATE SET entity = excluded.entity, name_key = excluded.name_key",
    )?
    .execute(params![alias, entity, now(), alias_key(alias)])?;
    Ok(AliasWrite::Added { entity })
}

pub(super) fn add_episode_tx(c: &Connection, e: &NewEpisode) -> rusqlite::Result<Option<i64>> {
    let summary = e.summary.trim();
    let dup: Option<i64> = c
        .prepare_cached(
            "SELECT id FROM episodes WHERE summary = ?1 COLLATE NOCASE AND invalidated_at IS NULL",
        )?
        .query_row([summary], |r| r.get(0))
        .optional()?;
    if dup.is_some() {
        return Ok(None);
    }
    c.prepare_cached(
        "INSERT INTO episodes (session_id, summary, occurred_at, created_at) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![e.session_id, summary, e.occurred_at, now()])?;
    Ok(Some(c.last_insert_rowid()))
}

pub(super) fn add_commitment_tx(
    c: &Connection,
    n: &NewCommitment,
) -> rusqlite::Result<Option<i64>> {
    let description = n.description.trim();
    let dup: Option<i64> = c
        .prepare_cached(
            "SELECT id FROM commitments WHERE description = ?1 COLLATE NOCASE AND status = 'open'",
        )?
        .query_row([description], |r| r.get(0))
        .optional()?;
    if dup.is_some() {
        return Ok(None);
    }
    let ts = now();
    c.prepare_cached(
        "INSERT INTO commitments (description, owner, due_at, status, session_id, created_at, updated_at) \
         VALUES (?1, ?2, ?3, 'open', ?4, ?5, ?5)",
    )?
    .execute(params![description, n.owner, n.due_at, n.session_id, ts])?;
    Ok(Some(c.last_insert_rowid()))
}

impl MemoryDb {
    /// Write a fact. The entity goes through alias resolution; when a current fact with the
    /// same entity and attribute (ignoring case) has another value, it is invalidated and
    /// points to the new row (`superseded_by`). Nothing is ever overwritten.
    pub async fn write_fact(&self, f: NewFact) -> Result<FactWrite, StoreError> {
        self.actor
            .call(move |c| {
                let tx = c.transaction()?;
                let w = write_fact_tx(&tx, &f)?;
                tx.commit()?;
                Ok(w)
            })
            .await
    }

    /// Soft-delete the fact `id` (`invalidated_at`, no successor). `None` when there is no such
    /// current fact.
    pub async fn forget_fact(&self, id: i64) -> Result<Option<Fact>, StoreError> {
        self.actor
            .call(move |c| {
                let tx = c.transaction()?;
                let fact = tx
                    .query_row(
                        &format!(
                            "SELECT {FACT_COLS} FROM facts WHERE id = ?1 AND invalidated_at IS NULL"
                        ),
                        [id],
                        fact_row,
                    )
                    .optional()?;
                if fact.is_some() {
                    tx.execute(
                        "UPDATE facts SET invalidated_at = ?2 WHERE id = ?1",
                        params![id, now()],
                    )?;
                }
                tx.commit()?;
                Ok(fact)
            })
            .await
    }

    /// Soft-delete the current facts of `entity` (aliases resolved) with `attribute`, or all of
    /// its current facts when `attribute` is `None`.
    pub async fn forget_facts_of(
        &self,
        entity: &str,
        attribute: Option<&str>,
    ) -> Result<Vec<Fact>, StoreError> {
        let (entity, attribute) = (entity.to_owned(), attribute.map(str::to_owned));
        self.actor
            .call(move |c| {
                let tx = c.transaction()?;
                let entity = resolve_entity(&tx, &entity)?;
                let facts: Vec<Fact> = tx
                    .prepare(&format!(
                        "SELECT {FACT_COLS} FROM facts WHERE entity = ?1 COLLATE NOCASE \
                         AND (?2 IS NULL OR attribute = ?2 COLLATE NOCASE) \
                         AND invalidated_at IS NULL"
                    ))?
                    .query_map(params![entity, attribute], fact_row)?
                    .collect::<rusqlite::Result<_>>()?;
                let ts = now();
                for f in &facts {
                    tx.execute(
                        "UPDATE facts SET invalidated_at = ?2 WHERE id = ?1",
                        params![f.id, ts],
                    )?;
                }
                tx.commit()?;
                Ok(facts)
            })
            .await
    }

    /// Facts of `entity` (aliases resolved): the current ones, or with `history` every row
    /// including superseded and forgotten ones. Ordered by attribute, oldest first.
    pub async fn facts_of(&self, entity: &str, history: bool) -> Result<Vec<Fact>, StoreError> {
        let entity = entity.to_owned();
        self.actor
            .call(move |c| {
                let entity = resolve_entity(c, &entity)?;
                c.prepare_cached(&format!(
                    "SELECT {FACT_COLS} FROM facts WHERE entity = ?1 COLLATE NOCASE \
                     AND (?2 OR invalidated_at IS NULL) ORDER BY attribute COLLATE NOCASE, id"
                ))?
                .query_map(params![entity, history], fact_row)?
                .collect()
            })
            .await
    }

    /// The canonical entity for `name` (alias resolution).
    pub async fn resolve_entity(&self, name: &str) -> Result<String, StoreError> {
        let name = name.to_owned();
        self.actor.call(move |c| resolve_entity(c, &name)).await
    }

    /// Make `alias` another name of `entity` (itself resolved first, so aliases never chain).
    /// Refused (with the reason) when the alias is the name of another entity with current
    /// facts, is longer than [`MAX_ALIAS_WORDS`] words or [`MAX_ALIAS_CHARS`] characters, or
    /// memory already holds [`MAX_ALIASES`].
    pub async fn add_alias(&self, alias: &str, entity: &str) -> Result<AliasWrite, StoreError> {
        let (alias, entity) = (alias.to_owned(), entity.to_owned());
        self.actor
            .call(move |c| {
                let tx = c.transaction()?;
                let changed = add_alias_tx(&tx, &alias, &entity)?;
                tx.commit()?;
                Ok(changed)
            })
            .await
    }

    /// The entities with current facts. For spotting entities mentioned in a message, and
    /// the known names a consolidation call is shown.
    pub async fn entities_with_facts(&self) -> Result<Vec<String>, StoreError> {
        self.actor
            .call(|c| {
                c.prepare_cached(
                    "SELECT DISTINCT entity FROM facts WHERE invalidated_at IS NULL ORDER BY entity",
                )?
                .query_map([], |r| r.get(0))?
                .collect()
            })
            .await
    }

    /// The aliases whose lookup key ([`alias_key`]) is one of `keys`, as `(key, entity)`: one
    /// indexed lookup per key, so the cost follows the number of keys, not of aliases.
    pub async fn aliases_named(
        &self,
        keys: Vec<String>,
    ) -> Result<Vec<(String, String)>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let keys = serde_json::Value::from(keys).to_string();
        self.actor
            .call(move |c| {
                c.prepare_cached(
                    "SELECT name_key, entity FROM entity_aliases \
                     WHERE name_key IN (SELECT value FROM json_each(?1))",
                )?
                .query_map([keys], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
            })
            .await
    }

    /// Record an episode. `None` when a live episode with the same summary exists.
    pub async fn add_episode(&self, e: NewEpisode) -> Result<Option<i64>, StoreError> {
        self.actor.call(move |c| add_episode_tx(c, &e)).await
    }

    /// Soft-delete an episode. `false` when there is no such live episode.
    pub async fn forget_episode(&self, id: i64) -> Result<bool, StoreError> {
        self.actor
            .call(move |c| {
                Ok(c.execute(
                    "UPDATE episodes SET invalidated_at = ?2 WHERE id = ?1 AND invalidated_at IS NULL",
                    params![id, now()],
                )? == 1)
            })
            .await
    }

    /// Record an open commitment. `None` when an open one with the same description exists.
    pub async fn add_commitment(&self, n: NewCommitment) -> Result<Option<i64>, StoreError> {
        self.actor.call(move |c| add_commitment_tx(c, &n)).await
    }

    /// Change a commitment's status. Returns the commitment as it was before, `None` when
    /// there is no such commitment.
    pub async fn set_commitment_status(
        &self,
        id: i64,
        status: CommitmentStatus,
    ) -> Result<Option<Commitment>, StoreError> {
        self.actor
            .call(move |c| {
                let tx = c.transaction()?;
                let before = tx
                    .query_row(
                        &format!("SELECT {COMMITMENT_COLS} FROM commitments WHERE id = ?1"),
                        [id],
                        commitment_row,
                    )
                    .optional()?;
                if before.is_some() {
                    tx.execute(
                        "UPDATE commitments SET status = ?2, updated_at = ?3 WHERE id = ?1",
                        params![id, status.as_str(), now()],
                    )?;
                }
                tx.commit()?;
                Ok(before)
            })
            .await
    }

    /// Open commitments, soonest due first (undated last), at most `limit`.
    pub async fn open_commitments(&self, limit: usize) -> Result<Vec<Commitment>, StoreError> {
        self.actor
            .call(move |c| {
                c.prepare_cached(&format!(
                    "SELECT {COMMITMENT_COLS} FROM commitments WHERE status = 'open' \
                     ORDER BY due_at IS NULL, due_at, id LIMIT ?1"
                ))?
                .query_map([limit as i64], commitment_row)?
                .collect()
            })
            .await
    }

    /// Mark open commitments due before `before` (Unix seconds) as expired. Returns how many.
    pub async fn expire_commitments(&self, before: i64) -> Result<usize, StoreError> {
        self.actor
            .call(move |c| {
                c.execute(
                    "UPDATE commitments SET status = 'expired', updated_at = ?2 \
                     WHERE status = 'open' AND due_at IS NOT NULL AND due_at < ?1",
                    params![before, now()],
                )
            })
            .await
    }
}

#[cfg(test)]
impl MemoryDb {
    /// Insert `n` aliases `<prefix>-<i>` → `entity` directly, bypassing the caps (a database
    /// an older version filled, or the attack of a runaway consolidation).
    pub(crate) async fn seed_aliases(&self, prefix: &str, n: usize, entity: &str) {
        let (prefix, entity) = (prefix.to_owned(), entity.to_owned());
        self.actor
            .call(move |c| {
                let tx = c.transaction()?;
                for i in 0..n {
                    tx.prepare_cached(
                        "INSERT INTO entity_aliases (alias, entity, created_at, name_key) \
                         VALUES (?1, ?2, 0, ?3)",
                    )?
                    .execute(params![
                        format!("{prefix}-{i}"),
                        entity,
                        alias_key(&format!("{prefix}-{i}"))
                    ])?;
                }
                tx.commit()
            })
            .await
            .expect("seed aliases");
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::temp_db;
    use super::*;

    fn fact(entity: &str, attribute: &str, value: &str) -> NewFact {
        NewFact {
            entity: entity.into(),
            attribute: attribute.into(),
            value: value.into(),
            confidence: 1.0,
            source: "tool".into(),
            session_id: None,
        }
    }

    #[tokio::test]
    async fn a_new_value_supersedes_and_keeps_the_old_row() {
        let (_d, db) = temp_db();
        let FactWrite::Inserted { id: first, .. } = db
            .write_fact(fact("Anna", "birthday", "3 May"))
            .await
            .unwrap()
        else {
            panic!("expected an insert")
        };
        assert!(matches!(
            db.write_fact(fact("anna", "Birthday", " 3 May ")).await.unwrap(),
            FactWrite::Unchanged { id, .. } if id == first
        ));
        let FactWrite::Superseded {
            id: second,
            entity,
            old,
        } = db
            .write_fact(fact("ANNA", "birthday", "4 May"))
            .await
            .unwrap()
        else {
            panic!("expected a supersede")
        };
        assert_eq!(entity, "Anna", "the existing spelling is kept");
        assert_eq!(old.id, first);
        let current = db.facts_of("anna", false).await.unwrap();
        assert_eq!(current.len(), 1);
        assert_eq!(current[0].value, "4 May");
        let all = db.facts_of("Anna", true).await.unwrap();
        assert_eq!(all.len(), 2);
        let old = all.iter().find(|f| f.id == first).unwrap();
        assert_eq!(old.superseded_by, Some(second));
        assert!(old.invalidated_at.is_some());
        assert_eq!(old.value, "3 May", "never overwritten");
    }

    /// Issue "Security, third round", item 9: an alias may not take over the name of an
    /// entity that has current facts (its facts would disappear behind the alias).
    #[tokio::test]
    async fn an_alias_cannot_shadow_an_entity_with_facts() {
        let (_d, db) = temp_db();
        db.write_fact(fact("Bob", "employer", "ACME"))
            .await
            .unwrap();
        db.write_fact(fact("Anna", "birthday", "3 May"))
            .await
            .unwrap();
        let refused = db.add_alias("bob", "Anna").await.unwrap();
        assert!(
            matches!(&refused, AliasWrite::Refused(r) if r.contains("\"Bob\"")),
            "{refused:?}"
        );
        // An alias that took the name in an older version does not hide the facts either.
        db.actor
            .call(|c| {
                c.execute(
                    "INSERT INTO entity_aliases (alias, entity, created_at, name_key) \
                     VALUES ('Bob', 'Anna', 0, 'bob')",
                    [],
                )
            })
            .await
            .unwrap();
        let bob = db.facts_of("Bob", false).await.unwrap();
        assert_eq!(bob.len(), 1, "{bob:?}");
        assert_eq!(bob[0].value, "ACME");
        assert_eq!(db.resolve_entity("BOB").await.unwrap(), "Bob");
    }

    #[tokio::test]
    async fn aliases_resolve_and_never_chain() {
        let (_d, db) = temp_db();
        db.write_fact(fact("Anna Schmidt", "city", "Berlin"))
            .await
            .unwrap();
        let added = |e: &str| AliasWrite::Added { entity: e.into() };
        assert_eq!(
            db.add_alias("Mum", "anna schmidt").await.unwrap(),
            added("Anna Schmidt")
        );
        assert_eq!(
            db.add_alias("mum", "Anna Schmidt").await.unwrap(),
            AliasWrite::Unchanged,
            "same again"
        );
        assert_eq!(
            db.add_alias("Mother", "mum").await.unwrap(),
            added("Anna Schmidt"),
            "resolved, never chained"
        );
        assert_eq!(db.resolve_entity("MOTHER").await.unwrap(), "Anna Schmidt");
        let w = db.write_fact(fact("mum", "city", "Hamburg")).await.unwrap();
        assert!(matches!(w, FactWrite::Superseded { ref entity, .. } if entity == "Anna Schmidt"));
        assert_eq!(
            db.entities_with_facts().await.unwrap(),
            vec!["Anna Schmidt".to_string()]
        );
        // Looked up by key, as a message's words are.
        let found = db
            .aliases_named(vec!["mum".into(), "mother".into(), "dad".into()])
            .await
            .unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(|(_, e)| e == "Anna Schmidt"));
    }

    #[tokio::test]
    async fn aliases_are_bounded_in_length_and_number() {
        let (_d, db) = temp_db();
        let long = "one two three four five six seven";
        assert!(matches!(
            db.add_alias(long, "Anna").await.unwrap(),
            AliasWrite::Refused(r) if r.contains("words")
        ));
        db.seed_aliases("nick", MAX_ALIASES - 1, "Bob").await;
        assert!(matches!(
            db.add_alias("Mum", "Anna").await.unwrap(),
            AliasWrite::Added { .. }
        ));
        let refused = db.add_alias("Dad", "Carl").await.unwrap();
        assert!(
            matches!(&refused, AliasWrite::Refused(r) if r.contains("10000")),
            "{refused:?}"
        );
        // Moving an existing alias adds no row: still allowed at the limit.
        assert!(matches!(
            db.add_alias("Mum", "Carl").await.unwrap(),
            AliasWrite::Added { .. }
        ));
    }

    #[tokio::test]
    async fn forget_is_soft() {
        let (_d, db) = temp_db();
        let FactWrite::Inserted { id, .. } =
            db.write_fact(fact("Bob", "phone", "123")).await.unwrap()
        else {
            panic!()
        };
        db.write_fact(fact("Bob", "city", "Rome")).await.unwrap();
        assert_eq!(db.forget_fact(id).await.unwrap().unwrap().value, "123");
        assert_eq!(db.forget_fact(id).await.unwrap(), None, "already forgotten");
        assert_eq!(db.facts_of("Bob", false).await.unwrap().len(), 1);
        assert_eq!(db.facts_of("Bob", true).await.unwrap().len(), 2);
        assert_eq!(db.forget_facts_of("bob", None).await.unwrap().len(), 1);
        assert!(db.facts_of("Bob", false).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn episodes_and_commitments() {
        let (_d, db) = temp_db();
        let e = NewEpisode {
            session_id: Some("s".into()),
            summary: "Fixed the boiler with the plumber".into(),
            occurred_at: None,
        };
        let id = db.add_episode(e.clone()).await.unwrap().unwrap();
        assert_eq!(db.add_episode(e).await.unwrap(), None, "deduplicated");
        assert!(db.forget_episode(id).await.unwrap());
        assert!(!db.forget_episode(id).await.unwrap());

        let c = |d: &str, due: Option<i64>| NewCommitment {
            description: d.into(),
            owner: Some("agent".into()),
            due_at: due,
            session_id: None,
        };
        let late = db
            .add_commitment(c("call Bob", Some(100)))
            .await
            .unwrap()
            .unwrap();
        let undated = db
            .add_commitment(c("water plants", None))
            .await
            .unwrap()
            .unwrap();
        let soon = db
            .add_commitment(c("pay rent", Some(50)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(db.add_commitment(c("Call Bob", None)).await.unwrap(), None);
        let open: Vec<i64> = db
            .open_commitments(10)
            .await
            .unwrap()
            .iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(open, vec![soon, late, undated]);
        let before = db
            .set_commitment_status(soon, CommitmentStatus::Done)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(before.status, CommitmentStatus::Open);
        assert_eq!(db.expire_commitments(101).await.unwrap(), 1);
        let open: Vec<i64> = db
            .open_commitments(10)
            .await
            .unwrap()
            .iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(open, vec![undated]);
        assert_eq!(
            db.set_commitment_status(9999, CommitmentStatus::Done)
                .await
                .unwrap(),
            None
        );
    }
}
