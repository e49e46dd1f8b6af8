//! Search (SPEC §13): chunks by FTS5 and by vector similarity, merged as [`super::Fusion`]
//! says: by default a convex combination of min-max scaled scores in which each full-text hit
//! counts in proportion to the share of the query's terms it contains (FTS5 only without an
//! embeddings model, or when the query cannot be embedded right now; then in bm25 order, as
//! before issue 20); current facts (of the entities the query names, through aliases, and by FTS5); live
//! episodes by FTS5.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use super::{Fusion, FusionMethod, Memory, MemoryError, fts, rank};
use crate::store::memory::{ChunkRow, Episode, Fact, MAX_ALIAS_WORDS};

/// Candidates taken from each ranked list before fusion (at least; more for a large `k`).
const MIN_CANDIDATES: usize = 50;
/// Below this many vectors the scan runs inline; above it on the blocking pool.
const INLINE_SCAN: usize = 4096;
/// Names are spotted in this many characters at the start of a message (a pasted document is
/// not searched for every alias).
const MENTION_CHARS: usize = 8_000;
/// Punctuation characters a name may start or end with (`C++`, `.NET`), at most.
const NAME_PUNCT: usize = 4;

/// How chunks were ranked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchMode {
    /// FTS5 and vectors, fused.
    Hybrid,
    /// FTS5 only.
    FullText,
}

/// One chunk found by search.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChunkHit {
    pub chunk_id: i64,
    /// Path relative to the workspace.
    pub path: String,
    pub start_line: u32,
    pub end_line: u32,
    pub text: String,
    /// Fused score (higher is better).
    pub score: f64,
    /// 1-based rank in the full-text list, if it was there.
    pub fts_rank: Option<usize>,
    /// 1-based rank in the vector list, if it was there.
    pub vector_rank: Option<usize>,
}

/// Everything `memory_search` found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchResults {
    pub mode: SearchMode,
    pub chunks: Vec<ChunkHit>,
    pub facts: Vec<Fact>,
    pub episodes: Vec<Episode>,
    /// Why a hybrid search fell back to full text, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// Ranked chunks and how they were ranked.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkResults {
    pub mode: SearchMode,
    pub hits: Vec<ChunkHit>,
    pub warning: Option<String>,
}

impl Memory {
    /// Chunks, facts and episodes for `query` (any text is a valid query). `session_id` is
    /// recorded on the cost row of a query embedding.
    pub async fn search(
        &self,
        query: &str,
        k: usize,
        session_id: &str,
    ) -> Result<SearchResults, MemoryError> {
        let mode = if self.embedder().is_some() {
            SearchMode::Hybrid
        } else {
            SearchMode::FullText
        };
        let chunks = self.search_chunks(query, k, mode, session_id).await?;
        let facts = self.search_facts(query, k).await?;
        let episodes = match fts::sanitize(query) {
            Some(expr) => self.db().fts_episodes(expr, k.div_ceil(2)).await?,
            None => Vec::new(),
        };
        Ok(SearchResults {
            mode: chunks.mode,
            chunks: chunks.hits,
            facts,
            episodes,
            warning: chunks.warning,
        })
    }

    /// The best `k` chunks for `query`, ranked as `mode` asks (`Hybrid` falls back to
    /// `FullText` without an embeddings model or when the query cannot be embedded; the
    /// result says so). A chunk overlapping a better one of the same file is skipped.
    pub async fn search_chunks(
        &self,
        query: &str,
        k: usize,
        mode: SearchMode,
        session_id: &str,
    ) -> Result<ChunkResults, MemoryError> {
        let candidates = MIN_CANDIDATES.max(k * 4);
        let fts_scored: Vec<(ChunkRow, f64)> = match fts::sanitize(query) {
            Some(expr) => self.db().fts_chunks(expr, candidates).await?,
            None => Vec::new(),
        };
        let fts_ids: Vec<i64> = fts_scored.iter().map(|(r, _)| r.id).collect();

        let (vector_hits, used, warning) = match (mode, self.embedder()) {
            (SearchMode::FullText, _) => (Vec::new(), SearchMode::FullText, None),
            (SearchMode::Hybrid, None) => (
                Vec::new(),
                SearchMode::FullText,
                Some("no embeddings model is configured".to_string()),
            ),
            (SearchMode::Hybrid, Some(embedder)) => {
                match self
                    .vector_candidates(embedder, query, candidates, session_id)
                    .await
                {
                    Ok(hits) => (hits, SearchMode::Hybrid, None),
                    Err(e) => {
                        tracing::warn!(error = %e, "query embedding failed; searching full text only");
                        (Vec::new(), SearchMode::FullText, Some(e.to_string()))
                    }
                }
            }
        };
        let vector_ids: Vec<i64> = vector_hits.iter().map(|(id, _)| *id).collect();

        let fused = if used == SearchMode::FullText {
            // Full text alone keeps its own (bm25) order, as before hybrid search existed.
            rank::rrf(&[(&fts_ids, 1.0)])
        } else {
            fuse(self.fusion(), query, &fts_scored, &vector_hits)
        };
        let mut rows: Vec<ChunkRow> = fts_scored.into_iter().map(|(row, _)| row).collect();
        let known: HashSet<i64> = fts_ids.iter().copied().collect();
        let missing: Vec<i64> = fused
            .iter()
            .map(|(id, _)| *id)
            .filter(|id| !known.contains(id))
            .take(candidates)
            .collect();
        rows.extend(self.db().chunks_by_id(missing).await?);

        let mut hits: Vec<ChunkHit> = Vec::with_capacity(k);
        for (id, score) in fused {
            if hits.len() >= k {
                break;
            }
            let Some(row) = rows.iter().find(|r| r.id == id) else {
                continue; // deleted since the vectors were loaded
            };
            let overlaps = hits.iter().any(|h| {
                h.path == row.path && h.start_line <= row.end_line && row.start_line <= h.end_line
            });
            if overlaps {
                continue;
            }
            hits.push(ChunkHit {
                chunk_id: id,
                path: row.path.clone(),
                start_line: row.start_line,
                end_line: row.end_line,
                text: row.text.clone(),
                score,
                fts_rank: fts_ids.iter().position(|x| *x == id).map(|p| p + 1),
                vector_rank: vector_ids.iter().position(|x| *x == id).map(|p| p + 1),
            });
        }
        Ok(ChunkResults {
            mode: used,
            hits,
            warning,
        })
    }

    /// Chunk ids by vector similarity to the query, with their cosine, best first.
    async fn vector_candidates(
        &self,
        embedder: &super::Embedder,
        query: &str,
        n: usize,
        session_id: &str,
    ) -> Result<Vec<(i64, f32)>, MemoryError> {
        let q = embedder.embed_query(self.db(), query, session_id).await?;
        let set = self.vectors(embedder.model_id()).await?;
        let top = if set.len() <= INLINE_SCAN {
            rank::top_k(&set, &q, n)
        } else {
            tokio::task::spawn_blocking(move || rank::top_k(&set, &q, n))
                .await
                .map_err(|e| MemoryError::Io(format!("vector scan failed: {e}")))?
        };
        Ok(top)
    }

    /// Current facts: every fact of each entity `text` names (by name or alias), then facts
    /// matching its words; at most `k`, no duplicates.
    pub async fn search_facts(&self, text: &str, k: usize) -> Result<Vec<Fact>, MemoryError> {
        let mut out: Vec<Fact> = Vec::new();
        for entity in self.mentioned_entities(text).await? {
            out.extend(self.db().facts_of(&entity, false).await?);
        }
        if let Some(expr) = fts::sanitize(text) {
            out.extend(self.db().fts_facts(expr, k).await?);
        }
        let mut seen = HashSet::new();
        out.retain(|f| seen.insert(f.id));
        out.truncate(k);
        Ok(out)
    }

    /// Canonical entities that `text` names, by entity name or alias, as whole words ignoring
    /// case; in order of first mention. Entities with current facts are matched by scanning
    /// their names; aliases by looking up the message's runs of up to [`MAX_ALIAS_WORDS`]
    /// words in the alias index, so the work does not grow with the number of aliases.
    pub async fn mentioned_entities(&self, text: &str) -> Result<Vec<String>, MemoryError> {
        let text = match text.char_indices().nth(MENTION_CHARS) {
            Some((at, _)) => &text[..at],
            None => text,
        };
        let hay = text.to_lowercase();
        let mut found: Vec<(usize, String)> = Vec::new();
        for entity in self.db().entities_with_facts().await? {
            if let Some(at) = find_word(&hay, &entity.to_lowercase()) {
                found.push((at, entity));
            }
        }
        let spans = name_spans(&hay);
        let mut first: HashMap<&str, usize> = HashMap::new();
        for (at, span) in &spans {
            first.entry(span).or_insert(*at);
        }
        let keys: Vec<String> = first.keys().map(|k| k.to_string()).collect();
        for (key, entity) in self.db().aliases_named(keys).await? {
            if let Some(at) = first.get(key.as_str()) {
                found.push((*at, entity));
            }
        }
        found.sort();
        let mut seen = HashSet::new();
        Ok(found
            .into_iter()
            .map(|(_, e)| e)
            .filter(|e| seen.insert(e.to_lowercase()))
            .collect())
    }
}

/// Every span of `hay` that could be a whole-word name: from the start of a word to the end
/// of the same or one of the next `MAX_ALIAS_WORDS - 1` words (a word is a run of letters and
/// digits), also stretched over up to [`NAME_PUNCT`] punctuation characters before or after
/// it (not across white space, and only where the whole-word rule of [`find_word`] still
/// holds), at least two characters long; each with its byte offset.
fn name_spans(hay: &str) -> Vec<(usize, &str)> {
    let mut words: Vec<(usize, usize)> = Vec::new();
    let mut start = None;
    for (i, c) in hay.char_indices() {
        match (c.is_alphanumeric(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                words.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        words.push((s, hay.len()));
    }
    let is_punct = |c: char| !c.is_alphanumeric() && !c.is_whitespace();
    // Where a name may start before a word, and end after one.
    let starts = |at: usize| -> Vec<usize> {
        let mut out = vec![at];
        for (n, (i, c)) in hay[..at].char_indices().rev().enumerate() {
            if n >= NAME_PUNCT || !is_punct(c) {
                break;
            }
            if !hay[..i]
                .chars()
                .next_back()
                .is_some_and(char::is_alphanumeric)
            {
                out.push(i);
            }
        }
        out
    };
    let ends = |at: usize| -> Vec<usize> {
        let mut out = vec![at];
        for (n, (i, c)) in hay[at..].char_indices().enumerate() {
            if n >= NAME_PUNCT || !is_punct(c) {
                break;
            }
            let end = at + i + c.len_utf8();
            if !hay[end..].chars().next().is_some_and(char::is_alphanumeric) {
                out.push(end);
            }
        }
        out
    };
    let mut out = Vec::new();
    for (i, &(first, _)) in words.iter().enumerate() {
        let from = starts(first);
        for &(_, last) in words.iter().skip(i).take(MAX_ALIAS_WORDS) {
            for &s in &from {
                for e in ends(last) {
                    let span = &hay[s..e];
                    if span.chars().count() >= 2 {
                        out.push((s, span));
                    }
                }
            }
        }
    }
    out
}

/// Merge the full-text hits (with their bm25 score, lower is better) and the vector hits (with
/// their cosine) as `fusion` says; best first.
fn fuse(
    fusion: Fusion,
    query: &str,
    fts: &[(ChunkRow, f64)],
    vectors: &[(i64, f32)],
) -> Vec<(i64, f64)> {
    let mut fts_weight = fusion.fts_weight;
    if fusion.adaptive && fts::is_natural_language(query) {
        fts_weight /= 2.0;
    }
    let terms = fusion.coverage.then(|| fts::QueryTerms::new(query));
    let factor = |row: &ChunkRow| {
        terms
            .as_ref()
            .map_or(1.0, |t| t.coverage(&[&row.path, &row.text]))
    };
    match fusion.method {
        FusionMethod::Rrf => {
            let f: Vec<(i64, f64)> = fts.iter().map(|(r, _)| (r.id, factor(r))).collect();
            let v: Vec<(i64, f64)> = vectors.iter().map(|(id, _)| (*id, 1.0)).collect();
            rank::rrf_scaled(&[(&f, fts_weight), (&v, fusion.vector_weight)])
        }
        FusionMethod::Convex => {
            // bm25 is lower-is-better; the coverage scales the normalised score.
            let f: Vec<(i64, f64)> = fts.iter().map(|(r, s)| (r.id, -s)).collect();
            let f: Vec<(i64, f64)> = rank::min_max(&f)
                .into_iter()
                .zip(fts)
                .map(|((id, s), (row, _))| (id, s * factor(row)))
                .collect();
            let v: Vec<(i64, f64)> = vectors.iter().map(|(id, s)| (*id, f64::from(*s))).collect();
            let v = rank::min_max(&v);
            rank::weighted_sum(&[(&f, fts_weight), (&v, fusion.vector_weight)])
        }
    }
}

/// Byte offset of the first occurrence of `needle` in `hay` as whole words (not inside a longer
/// alphanumeric run). Needles shorter than two characters never match.
fn find_word(hay: &str, needle: &str) -> Option<usize> {
    if needle.chars().count() < 2 {
        return None;
    }
    let mut from = 0;
    while let Some(pos) = hay[from..].find(needle) {
        let at = from + pos;
        let end = at + needle.len();
        let before = hay[..at].chars().next_back();
        let after = hay[end..].chars().next();
        if !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric) {
            return Some(at);
        }
        from = at + needle.chars().next().map_or(1, char::len_utf8);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, text: &str) -> ChunkRow {
        ChunkRow {
            id,
            path: format!("notes/{id}.md"),
            start_line: 1,
            end_line: 1,
            text: text.into(),
        }
    }

    /// Issue 20: full-text hits that share a word or two with a paraphrase do not push the
    /// vectors' best hits down; a hit that holds every term of the query stays first.
    #[test]
    fn weak_full_text_hits_weigh_little() {
        let query = "purchased a used bicycle";
        let fts = vec![
            (row(1, "Someone used the lift."), -10.0),
            (row(2, "A used car."), -5.0),
        ];
        let vectors = vec![(3, 0.62), (4, 0.60), (1, 0.20)];
        let ids = |f: Vec<(i64, f64)>| f.into_iter().map(|(id, _)| id).collect::<Vec<_>>();

        let chosen = fuse(Fusion::default(), query, &fts, &vectors);
        assert_eq!(ids(chosen), vec![3, 4, 1, 2]);
        // Plain RRF puts the weak match found by both lists first.
        let rrf = Fusion {
            method: FusionMethod::Rrf,
            coverage: false,
            ..Fusion::default()
        };
        assert_eq!(ids(fuse(rrf, query, &fts, &vectors))[0], 1);

        let mut fts = fts;
        fts.insert(0, (row(5, "We purchased a used bicycle."), -12.0));
        let mut vectors = vectors;
        vectors.push((5, 0.5));
        let chosen = fuse(Fusion::default(), query, &fts, &vectors);
        assert_eq!(ids(chosen)[0], 5);
    }

    /// A name found by the spans is one `find_word` finds in the same text, and the other way
    /// round for names of up to `MAX_ALIAS_WORDS` words (without leading or trailing
    /// punctuation runs longer than `NAME_PUNCT`).
    #[test]
    fn spans_find_what_find_word_finds() {
        let hay = "did mum call? (c++ and .net) anna schmidt's party, hannah-lou, ok.";
        let spans: HashSet<&str> = name_spans(hay).into_iter().map(|(_, s)| s).collect();
        for name in [
            "mum",
            "c++",
            ".net",
            "anna schmidt",
            "anna",
            "schmidt",
            "hannah-lou",
            "lou",
            "mum call",
            "(c++",
            "did mum call? (c++ and",
        ] {
            assert!(find_word(hay, name).is_some(), "{name}");
            assert!(spans.contains(name), "{name} not among the spans");
        }
        for name in ["um", "ann", "all", "a"] {
            assert!(!spans.contains(name), "{name}");
        }
        // Offsets point at the span.
        for (at, span) in name_spans(hay) {
            assert_eq!(&hay[at..at + span.len()], span);
        }
    }

    #[test]
    fn whole_words_only() {
        assert_eq!(find_word("when is anna's birthday", "anna"), Some(8));
        assert_eq!(find_word("hannah called", "anna"), None);
        assert_eq!(find_word("annaanna anna", "anna"), Some(9));
        assert_eq!(find_word("mum and dad", "mum"), Some(0));
        assert_eq!(find_word("a b", "a"), None, "too short");
        assert_eq!(find_word("über mum", "mum"), Some(6));
    }
}
