//! Consolidation bookkeeping: what an extraction writes, and the watermarks that make sure no
//! trail line and no file version is consolidated twice. The writes and the watermark move in
//! one transaction, so a crash leaves either both or neither.

use rusqlite::{OptionalExtension, Transaction, params};
use serde::Serialize;

use super::facts::{add_alias_tx, add_commitment_tx, add_episode_tx, write_fact_tx};
use super::{AliasWrite, FactWrite, MemoryDb, NewCommitment, NewEpisode, NewFact, now};
use crate::store::StoreError;

/// What one consolidation call extracted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Extraction {
    /// `(alias, entity)`: applied first, so the facts below resolve through them.
    pub aliases: Vec<(String, String)>,
    /// Aliases of the answer left out before they reached the store (over the cap of one
    /// answer); counted as refused.
    pub aliases_dropped: usize,
    pub facts: Vec<NewFact>,
    pub episodes: Vec<NewEpisode>,
    pub commitments: Vec<NewCommitment>,
}

/// Refusal reasons kept in an [`Applied`] (the count goes on).
const MAX_REFUSALS_KEPT: usize = 5;

/// What applying an extraction wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Applied {
    pub aliases: usize,
    /// Aliases not stored: over the cap of one answer, over the total, too long, or the name
    /// of another entity with facts (issue "Security, third round", item 9).
    pub aliases_refused: usize,
    /// Why, for the first few of them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub alias_refusals: Vec<String>,
    pub facts_new: usize,
    pub facts_superseded: usize,
    pub facts_unchanged: usize,
    pub episodes: usize,
    pub commitments: usize,
    /// The watermark was already there (another run did it): nothing was written.
    pub skipped: bool,
}

fn apply_tx(tx: &Transaction<'_>, x: &Extraction) -> rusqlite::Result<Applied> {
    let mut a = Applied {
        aliases_refused: x.aliases_dropped,
        ..Applied::default()
    };
    if x.aliases_dropped > 0 {
        a.alias_refusals.push(format!(
            "{} alias(es) over the cap of one answer were left out",
            x.aliases_dropped
        ));
    }
    for (alias, entity) in &x.aliases {
        match add_alias_tx(tx, alias, entity)? {
            AliasWrite::Added { .. } => a.aliases += 1,
            AliasWrite::Unchanged => {}
            AliasWrite::Refused(why) => {
                a.aliases_refused += 1;
                if a.alias_refusals.len() < MAX_REFUSALS_KEPT {
                    a.alias_refusals.push(why);
                }
            }
        }
    }
    for f in &x.facts {
        match write_fact_tx(tx, f)? {
            FactWrite::Inserted { .. } => a.facts_new += 1,
            FactWrite::Superseded { .. } => a.facts_superseded += 1,
            FactWrite::Unchanged { .. } => a.facts_unchanged += 1,
        }
    }
    for e in &x.episodes {
        a.episodes += usize::from(add_episode_tx(tx, e)?.is_some());
    }
    for c in &x.commitments {
        a.commitments += usize::from(add_commitment_tx(tx, c)?.is_some());
    }
    Ok(a)
}

impl MemoryDb {
    /// The last trail `seq` of `session_id` already consolidated (0 = none).
    pub async fn watermark(&self, session_id: &str) -> Result<i64, StoreError> {
        let id = session_id.to_owned();
        self.actor
            .call(move |c| {
                Ok(c.prepare_cached(
                    "SELECT last_seq FROM consolidation_state WHERE session_id = ?1",
                )?
                .query_row([&id], |r| r.get(0))
                .optional()?
                .unwrap_or(0))
            })
            .await
    }

    /// Apply `x`, extracted from the trail lines of `session_id` up to `up_to_seq`, and move the
    /// watermark there, in one transaction. When the watermark already reached `up_to_seq`
    /// nothing is written (`skipped`).
    pub async fn apply_session_consolidation(
        &self,
        session_id: &str,
        up_to_seq: i64,
        x: Extraction,
    ) -> Result<Applied, StoreError> {
        let id = session_id.to_owned();
        self.actor
            .call(move |c| {
                let tx = c.transaction()?;
                let mark: i64 = tx
                    .query_row(
                        "SELECT last_seq FROM consolidation_state WHERE session_id = ?1",
                        [&id],
                        |r| r.get(0),
                    )
                    .optional()?
                    .unwrap_or(0);
                if mark >= up_to_seq {
                    return Ok(Applied {
                        skipped: true,
                        ..Applied::default()
                    });
                }
                let a = apply_tx(&tx, &x)?;
                tx.execute(
                    "INSERT INTO consolidation_state (session_id, last_seq, updated_at) \
                     VALUES (?1, ?2, ?3) ON CONFLICT (session_id) DO UPDATE SET \
                     last_seq = excluded.last_seq, updated_at = excluded.updated_at",
                    params![id, up_to_seq, now()],
                )?;
                tx.commit()?;
                Ok(a)
            })
            .await
    }

    /// The content hash of `path` when it was last consolidated.
    pub async fn consolidated_file_hash(&self, path: &str) -> Result<Option<String>, StoreError> {
        let path = path.to_owned();
        self.actor
            .call(move |c| {
                c.prepare_cached("SELECT hash FROM consolidation_file_hashes WHERE path = ?1")?
                    .query_row([&path], |r| r.get(0))
                    .optional()
            })
            .await
    }

    /// Apply `x`, extracted from the notes `files` (`(path, content hash)`), and record their
    /// hashes, in one transaction. When every one of those hashes is already recorded nothing
    /// is written (`skipped`).
    pub async fn apply_files_consolidation(
        &self,
        files: Vec<(String, String)>,
        x: Extraction,
    ) -> Result<Applied, StoreError> {
        self.actor
            .call(move |c| {
                let tx = c.transaction()?;
                let mut all_known = true;
                {
                    let mut known = tx.prepare_cached(
                        "SELECT hash FROM consolidation_file_hashes WHERE path = ?1",
                    )?;
                    for (path, hash) in &files {
                        let hash_now: Option<String> =
                            known.query_row([path], |r| r.get(0)).optional()?;
                        all_known &= hash_now.as_deref() == Some(hash.as_str());
                    }
                }
                if all_known {
                    return Ok(Applied {
                        skipped: true,
                        ..Applied::default()
                    });
                }
                let a = apply_tx(&tx, &x)?;
                let ts = now();
                {
                    let mut record = tx.prepare_cached(
                        "INSERT INTO consolidation_file_hashes (path, hash, updated_at) \
                         VALUES (?1, ?2, ?3) ON CONFLICT (path) DO UPDATE SET \
                         hash = excluded.hash, updated_at = excluded.updated_at",
                    )?;
                    for (path, hash) in &files {
                        record.execute(params![path, hash, ts])?;
                    }
                }
                tx.commit()?;
                Ok(a)
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::temp_db;
    use super::*;

    fn extraction() -> Extraction {
        Extraction {
            aliases: vec![("Mum".into(), "Anna".into())],
            facts: vec![NewFact {
                entity: "Anna".into(),
                attribute: "birthday".into(),
                value: "3 May".into(),
                confidence: 0.9,
                source: "consolidation".into(),
                session_id: Some("s1".into()),
            }],
            episodes: vec![NewEpisode {
                session_id: Some("s1".into()),
                summary: "Planned Anna's party".into(),
                occurred_at: None,
            }],
            commitments: vec![NewCommitment {
                description: "Order the cake".into(),
                owner: Some("agent".into()),
                due_at: None,
                session_id: Some("s1".into()),
            }],
            aliases_dropped: 0,
        }
    }

    #[tokio::test]
    async fn session_watermark_moves_with_the_writes_and_blocks_a_replay() {
        let (_d, db) = temp_db();
        assert_eq!(db.watermark("s1").await.unwrap(), 0);
        let a = db
            .apply_session_consolidation("s1", 10, extraction())
            .await
            .unwrap();
        assert_eq!(
            (a.aliases, a.facts_new, a.episodes, a.commitments, a.skipped),
            (1, 1, 1, 1, false)
        );
        assert_eq!(db.resolve_entity("mum").await.unwrap(), "Anna");
        assert_eq!(db.watermark("s1").await.unwrap(), 10);
        let again = db
            .apply_session_consolidation("s1", 10, extraction())
            .await
            .unwrap();
        assert!(again.skipped);
        assert_eq!(db.facts_of("Anna", true).await.unwrap().len(), 1);
        let later = db
            .apply_session_consolidation("s1", 12, extraction())
            .await
            .unwrap();
        assert_eq!(
            (later.facts_unchanged, later.episodes, later.commitments),
            (1, 0, 0),
            "duplicates are not written again"
        );
    }

    #[tokio::test]
    async fn file_hashes_guard_note_consolidation() {
        let (_d, db) = temp_db();
        assert_eq!(db.consolidated_file_hash("MEMORY.md").await.unwrap(), None);
        let files = || {
            vec![
                ("MEMORY.md".to_string(), "h1".to_string()),
                ("b.md".to_string(), "h2".to_string()),
            ]
        };
        let a = db
            .apply_files_consolidation(files(), extraction())
            .await
            .unwrap();
        assert!(!a.skipped);
        let again = db
            .apply_files_consolidation(files(), extraction())
            .await
            .unwrap();
        assert!(again.skipped);
        let b = db.consolidated_file_hash("b.md").await.unwrap();
        assert_eq!(b.as_deref(), Some("h2"));
    }
}
