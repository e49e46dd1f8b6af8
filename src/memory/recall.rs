//! Recall (SPEC §13): what memory has to say about a new message, within
//! `[memory] recall.max_tokens`, for the dynamic context of that message's user turn (never the
//! system prompt, so the cached prefix stays valid). In order: current facts about what the
//! message names, open commitments, matching episodes, then the best chunks.

use std::fmt::Write as _;

use super::search::SearchMode;
use super::{Memory, MemoryError, estimate_tokens, fts};

/// Open commitments shown at most.
const MAX_COMMITMENTS: usize = 5;
/// Longest excerpt of one chunk.
const CHUNK_CHARS: usize = 600;
/// Longest part of a message used as the search query (a pasted document is not a query).
const QUERY_CHARS: usize = 1000;

/// Budgeted lines: a line is added only if the whole text stays within `max_tokens`.
struct Budget {
    out: String,
    max_tokens: usize,
}

impl Budget {
    fn try_push(&mut self, line: &str) -> bool {
        if estimate_tokens(&self.out) + estimate_tokens(line) + 1 > self.max_tokens {
            return false;
        }
        self.out.push_str(line);
        self.out.push('\n');
        true
    }
}

fn excerpt(text: &str, max_chars: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(max_chars) {
        Some((at, _)) => format!("{}…", &flat[..at]),
        None => flat,
    }
}

impl Memory {
    /// The recall text for `message`, or `None` when memory has nothing that matches it (or the
    /// budget is zero). Never fails the message: errors are logged and give `None`.
    pub async fn recall(&self, message: &str, session_id: &str) -> Option<String> {
        let max_tokens = self.cfg().recall_max_tokens as usize;
        if max_tokens == 0 || message.trim().is_empty() {
            return None;
        }
        match self.build_recall(message, session_id, max_tokens).await {
            Ok(text) => text,
            Err(e) => {
                tracing::warn!(error = %e, "memory recall failed; the message goes on without it");
                None
            }
        }
    }

    async fn build_recall(
        &self,
        message: &str,
        session_id: &str,
        max_tokens: usize,
    ) -> Result<Option<String>, MemoryError> {
        let k = self.cfg().search_top_k.max(1) as usize;
        let mut b = Budget {
            out: String::new(),
            max_tokens,
        };
        let facts = self.search_facts(message, k).await?;
        if !facts.is_empty() && b.try_push("Known facts:") {
            for f in &facts {
                if !b.try_push(&format!(
                    "- {} · {}: {} (fact #{})",
                    f.entity, f.attribute, f.value, f.id
                )) {
                    break;
                }
            }
        }
        let commitments = self.db().open_commitments(MAX_COMMITMENTS).await?;
        if !commitments.is_empty() && b.try_push("Open commitments:") {
            for c in &commitments {
                let mut line = format!("- #{} {}", c.id, c.description);
                if let Some(due) = c
                    .due_at
                    .and_then(|d| chrono::DateTime::from_timestamp(d, 0))
                {
                    let _ = write!(
                        line,
                        " (due {})",
                        due.with_timezone(&self.tz()).format("%Y-%m-%d")
                    );
                }
                if let Some(owner) = &c.owner {
                    let _ = write!(line, " [{owner}]");
                }
                if !b.try_push(&line) {
                    break;
                }
            }
        }
        // Episodes and chunks only for messages with a real keyword: "ok thanks" recalls
        // nothing rather than whatever shares a stop word.
        if fts::keywords(message).next().is_some() {
            if let Some(expr) = fts::sanitize(message) {
                let episodes = self.db().fts_episodes(expr, 3).await?;
                if !episodes.is_empty() && b.try_push("Episodes:") {
                    for e in &episodes {
                        if !b.try_push(&format!(
                            "- {} (episode #{})",
                            excerpt(&e.summary, 300),
                            e.id
                        )) {
                            break;
                        }
                    }
                }
            }
            let mode = if self.embedder().is_some() {
                SearchMode::Hybrid
            } else {
                SearchMode::FullText
            };
            let query = match message.char_indices().nth(QUERY_CHARS) {
                Some((at, _)) => &message[..at],
                None => message,
            };
            let chunks = self.search_chunks(query, k, mode, session_id).await?;
            if !chunks.hits.is_empty() && b.try_push("From the workspace notes:") {
                for h in &chunks.hits {
                    let line = format!(
                        "- [{}:{}-{}] {}",
                        h.path,
                        h.start_line,
                        h.end_line,
                        excerpt(&h.text, CHUNK_CHARS)
                    );
                    if !b.try_push(&line) {
                        break;
                    }
                }
            }
        }
        let text = b.out.trim_end();
        Ok((!text.is_empty()).then(|| text.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_stops_before_overflowing() {
        let mut b = Budget {
            out: String::new(),
            max_tokens: 5,
        };
        assert!(b.try_push("12345678"));
        assert!(!b.try_push("123456789012"));
        assert_eq!(b.out, "12345678\n");
    }

    #[test]
    fn excerpts_flatten_and_cut() {
        assert_eq!(excerpt("a\n  b\tc", 10), "a b c");
        assert_eq!(excerpt("abcdef", 3), "abc…");
    }
}
