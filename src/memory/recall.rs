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

    fn memory_in(dir: &std::path::Path) -> Memory {
        let db = crate::store::memory::MemoryDb::open(&dir.join("memory.db")).unwrap();
        let cfg = crate::config::MemoryConfig {
            enabled: true,
            search_top_k: 10,
            indexer_include: vec![],
            chunk_chars: 1000,
            overlap_chars: 0,
            recall_max_tokens: 500,
            consolidation_enabled: false,
            consolidation_min_messages: 1,
            consolidation_confidence_threshold: 0.5,
        };
        Memory::new(
            db,
            cfg,
            dir.to_path_buf(),
            dir.to_path_buf(),
            crate::zone::Zone::utc(),
            None,
        )
    }

    async fn with_facts(dir: &std::path::Path) -> Memory {
        let m = memory_in(dir);
        for (entity, attribute, value) in [
            ("Anna Schmidt", "birthday", "3 May"),
            ("Anna Schmidt", "phone", "0151 2345"),
            ("Bob", "employer", "ACME"),
        ] {
            m.db()
                .write_fact(crate::store::memory::NewFact {
                    entity: entity.into(),
                    attribute: attribute.into(),
                    value: value.into(),
                    confidence: 1.0,
                    source: "tool".into(),
                    session_id: None,
                })
                .await
                .unwrap();
        }
        m.db().add_alias("Mum", "Anna Schmidt").await.unwrap();
        m
    }

    /// Issue "Security, third round", item 9: the recall of a message (the daemon's memory
    /// work per message) costs about the same with 200,000 aliases as with none. The two
    /// databases are measured in turn, many times, and the medians compared, so a busy
    /// machine slows both alike.
    #[tokio::test]
    async fn recall_time_does_not_grow_with_the_aliases() {
        const ALIASES: usize = 200_000;
        const RUNS: usize = 60;
        let (d0, d1) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let none = with_facts(d0.path()).await;
        let many = with_facts(d1.path()).await;
        many.db().seed_aliases("nick", ALIASES, "Bob").await;
        let message = "Did Mum call about the party? Bob said nick-123 might come along, \
                       and I still need Anna Schmidt's phone number for the invitation.";
        // Both find the same facts (the seeded alias names Bob as well).
        let a = none.recall(message, "s").await.unwrap();
        let b = many.recall(message, "s").await.unwrap();
        assert!(a.contains("0151 2345") && a.contains("ACME"), "{a}");
        assert!(b.contains("0151 2345") && b.contains("ACME"), "{b}");
        let mut t_none = Vec::with_capacity(RUNS);
        let mut t_many = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            for (m, times) in [(&none, &mut t_none), (&many, &mut t_many)] {
                let start = std::time::Instant::now();
                let r = m.recall(message, "s").await;
                times.push(start.elapsed());
                assert!(r.is_some());
            }
        }
        let median = |t: &mut Vec<std::time::Duration>| {
            t.sort();
            t[t.len() / 2]
        };
        let (m0, m1) = (median(&mut t_none), median(&mut t_many));
        eprintln!(
            "recall per message, median of {RUNS}: {m0:?} with no aliases, {m1:?} with {ALIASES}"
        );
        assert!(
            m1 <= m0 * 2,
            "{m1:?} with {ALIASES} aliases is more than twice {m0:?} with none"
        );
    }

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
