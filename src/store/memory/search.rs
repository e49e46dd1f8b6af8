//! Full-text queries (FTS5, `bm25` order) over chunks, current facts and live episodes. The
//! `MATCH` expression comes from `memory::fts::sanitize`, which only yields quoted words.

use rusqlite::params;

use super::MemoryDb;
use super::facts::{EPISODE_COLS, FACT_COLS, episode_row, fact_row};
use super::index::{ChunkRow, chunk_row};
use super::{Episode, Fact};
use crate::store::StoreError;

impl MemoryDb {
    /// Chunks matching `expr`, best first, with their bm25 score (lower is better).
    pub async fn fts_chunks(
        &self,
        expr: String,
        limit: usize,
    ) -> Result<Vec<(ChunkRow, f64)>, StoreError> {
        self.actor
            .call(move |c| {
                // The best rowids first, from FTS5 alone (`ORDER BY rank LIMIT` is its fast
                // path), then the rows: joining before the sort would read every match's text.
                let mut st = c.prepare_cached(
                    "SELECT c.id, c.path, c.start_line, c.end_line, c.text, f.score \
                     FROM (SELECT rowid, rank AS score FROM chunks_fts \
                           WHERE chunks_fts MATCH ?1 ORDER BY rank LIMIT ?2) f \
                     JOIN chunks c ON c.id = f.rowid ORDER BY f.score",
                )?;
                st.query_map(params![expr, limit as i64], |r| {
                    Ok((chunk_row(r)?, r.get(5)?))
                })?
                .collect()
            })
            .await
    }

    /// Current facts matching `expr` (entity, attribute or value), best first.
    pub async fn fts_facts(&self, expr: String, limit: usize) -> Result<Vec<Fact>, StoreError> {
        self.actor
            .call(move |c| {
                // Superseded and forgotten facts stay in the index, so filter while ranking.
                let sql = format!(
                    "SELECT {FACT_COLS} FROM facts_fts JOIN facts ON facts.id = facts_fts.rowid \
                     WHERE facts_fts MATCH ?1 AND facts.invalidated_at IS NULL \
                     ORDER BY facts_fts.rank LIMIT ?2"
                );
                let mut st = c.prepare_cached(&sql)?;
                st.query_map(params![expr, limit as i64], fact_row)?
                    .collect()
            })
            .await
    }

    /// Live episodes matching `expr`, best first.
    pub async fn fts_episodes(
        &self,
        expr: String,
        limit: usize,
    ) -> Result<Vec<Episode>, StoreError> {
        self.actor
            .call(move |c| {
                let sql = format!(
                    "SELECT {EPISODE_COLS} FROM episodes_fts \
                     JOIN episodes ON episodes.id = episodes_fts.rowid \
                     WHERE episodes_fts MATCH ?1 AND episodes.invalidated_at IS NULL \
                     ORDER BY episodes_fts.rank LIMIT ?2"
                );
                let mut st = c.prepare_cached(&sql)?;
                st.query_map(params![expr, limit as i64], episode_row)?
                    .collect()
            })
            .await
    }
}
