//! Retrieval quality (issue #5): recall@k of a query set with expected notes, per query class,
//! for a search mode. Used by the CI test on `tests/fixtures/retrieval` (full text, and hybrid
//! with a deterministic fake) and by `cargo bench --bench retrieval` (hybrid with a real model).
//!
//! A query counts as a hit when one of its expected notes is among the first `k` distinct
//! notes of the ranked chunks.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::search::SearchMode;
use super::{Memory, MemoryError};

/// One query of the set (`queries.json`).
#[derive(Debug, Clone, Deserialize)]
pub struct Query {
    pub id: String,
    /// `exact`, `paraphrase` or `question`.
    pub class: String,
    pub query: String,
    /// Paths relative to the workspace.
    pub expected: Vec<String>,
}

/// Hits of one class.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ClassScore {
    pub hits: usize,
    pub total: usize,
}

impl ClassScore {
    pub fn recall(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.hits as f64 / self.total as f64
        }
    }
}

/// The scores of one run.
#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    /// The mode asked for.
    pub mode: SearchMode,
    /// Queries that fell back to full text (a hybrid run whose query embedding failed).
    pub fell_back: usize,
    pub k: usize,
    pub classes: BTreeMap<String, ClassScore>,
    pub overall: ClassScore,
    /// `(query id, the first k notes found)` of each miss.
    pub misses: Vec<(String, Vec<String>)>,
}

/// Read a query set.
pub fn load_queries(path: &Path) -> Result<Vec<Query>, MemoryError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| MemoryError::Io(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| MemoryError::Invalid(format!("{} is not a query set: {e}", path.display())))
}

/// The first `k` distinct paths, in order.
pub fn top_notes<'a>(paths: impl IntoIterator<Item = &'a str>, k: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(k);
    for p in paths {
        if out.len() == k {
            break;
        }
        if !out.iter().any(|o| o == p) {
            out.push(p.to_string());
        }
    }
    out
}

impl Memory {
    /// recall@`k` of `queries` in `mode`, per class and overall.
    pub async fn evaluate(
        &self,
        queries: &[Query],
        k: usize,
        mode: SearchMode,
    ) -> Result<EvalReport, MemoryError> {
        let mut report = EvalReport {
            mode,
            fell_back: 0,
            k,
            classes: BTreeMap::new(),
            overall: ClassScore::default(),
            misses: Vec::new(),
        };
        for q in queries {
            // Several chunks of one note may rank high: ask for enough to fill k notes.
            let found = self.search_chunks(&q.query, k * 4, mode, "eval").await?;
            if found.mode != mode {
                report.fell_back += 1;
            }
            let notes = top_notes(found.hits.iter().map(|h| h.path.as_str()), k);
            let hit = notes.iter().any(|n| q.expected.contains(n));
            for score in [
                report.classes.entry(q.class.clone()).or_default(),
                &mut report.overall,
            ] {
                score.total += 1;
                score.hits += usize::from(hit);
            }
            if !hit {
                report.misses.push((q.id.clone(), notes));
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_notes_are_distinct_and_ordered() {
        let got = top_notes(["a", "b", "a", "c", "d"], 3);
        assert_eq!(got, vec!["a", "b", "c"]);
        assert!(top_notes([], 5).is_empty());
        assert_eq!(ClassScore { hits: 1, total: 4 }.recall(), 0.25);
        assert_eq!(ClassScore::default().recall(), 0.0);
    }
}
