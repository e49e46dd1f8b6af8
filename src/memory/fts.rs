//! FTS5 query sanitiser: any user text becomes a query SQLite accepts (notes/crates.md: raw
//! `"`, `-`, `:`, `(`, `NEAR`, `*` raise syntax errors). Each word (letters and digits, any
//! script) is quoted as a string token; words are joined with `OR` so bm25 ranks notes by how
//! many query words they share, which suits natural questions better than implicit AND. Stop
//! words are dropped unless the text has nothing else.

/// Most words kept from one query (long pastes would make a slow query).
const MAX_TERMS: usize = 32;

/// The FTS5 `MATCH` expression for `text`, or `None` when it has no searchable word. Stop
/// words are left out when the text has other words: "when is Anna's birthday" searches
/// `"anna" OR "birthday"`, so a note is not found only for sharing "is" with the question
/// (which would also crowd out the vector hits in a hybrid search).
pub fn sanitize(text: &str) -> Option<String> {
    let mut terms: Vec<String> = keywords(text).take(MAX_TERMS).collect();
    if terms.is_empty() {
        terms = words(text).take(MAX_TERMS).collect();
    }
    let terms: Vec<String> = terms.into_iter().map(|w| format!("\"{w}\"")).collect();
    (!terms.is_empty()).then(|| terms.join(" OR "))
}

/// The words of `text`: maximal runs of alphanumeric characters, lowercased, deduplicated in
/// order of first appearance.
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    let mut seen = std::collections::HashSet::new();
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .filter(move |w| seen.insert(w.clone()))
}

/// Common English function words: alone they say nothing about what a message is about.
const STOPWORDS: &[&str] = &[
    "a", "about", "after", "again", "all", "am", "an", "and", "any", "are", "as", "at", "be",
    "been", "before", "but", "by", "can", "could", "did", "do", "does", "for", "from", "had",
    "has", "have", "he", "her", "here", "him", "his", "how", "i", "if", "in", "into", "is", "it",
    "its", "just", "me", "my", "no", "not", "now", "of", "ok", "okay", "on", "or", "our", "please",
    "s", "she", "so", "some", "than", "thank", "thanks", "that", "the", "their", "them", "then",
    "there", "these", "they", "this", "to", "too", "up", "us", "very", "was", "we", "were", "what",
    "when", "where", "which", "who", "why", "will", "with", "would", "yes", "you", "your",
];

/// The words of `text` that are not stop words (see [`words`]).
pub fn keywords(text: &str) -> impl Iterator<Item = String> + '_ {
    words(text).filter(|w| !STOPWORDS.contains(&w.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rusqlite::Connection;

    fn fts() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(
            "CREATE VIRTUAL TABLE t USING fts5(body, tokenize='porter unicode61');
             INSERT INTO t (body) VALUES ('Anna''s birthday is on 3 May'), ('NEAR the (river)');",
        )
        .unwrap();
        c
    }

    fn run(c: &Connection, q: &str) -> rusqlite::Result<Vec<String>> {
        let mut st = c.prepare("SELECT body FROM t WHERE t MATCH ?1 ORDER BY bm25(t)")?;
        st.query_map([q], |r| r.get(0))?.collect()
    }

    #[test]
    fn hostile_syntax_becomes_plain_words() {
        let c = fts();
        for q in [
            "\"unbalanced",
            "a AND (b",
            "NEAR(x y)",
            "col:value",
            "-minus *star ^caret",
            "when is Anna's birthday?",
        ] {
            let m = sanitize(q).unwrap();
            run(&c, &m).unwrap_or_else(|e| panic!("{q:?} -> {m:?}: {e}"));
        }
        let hits = run(&c, &sanitize("When is ANNA's birthday?").unwrap()).unwrap();
        assert_eq!(
            hits.first().map(String::as_str),
            Some("Anna's birthday is on 3 May")
        );
    }

    #[test]
    fn keywords_drop_stop_words() {
        let k: Vec<String> = keywords("OK, thanks! When is Anna's birthday?").collect();
        assert_eq!(k, vec!["anna", "birthday"]);
        assert_eq!(keywords("ok thank you").count(), 0);
    }

    #[test]
    fn stop_words_only_when_nothing_else() {
        assert_eq!(
            sanitize("when is Anna's birthday").unwrap(),
            "\"anna\" OR \"birthday\""
        );
        assert_eq!(
            sanitize("what is it").unwrap(),
            "\"what\" OR \"is\" OR \"it\""
        );
    }

    #[test]
    fn no_words_is_none() {
        assert_eq!(sanitize(""), None);
        assert_eq!(sanitize("?! -- ()"), None);
    }

    proptest! {
        /// Must-show (issue #5): whatever the text, SQLite accepts the sanitised query.
        #[test]
        fn sanitised_queries_never_fail(q in "\\PC{0,80}") {
            let c = fts();
            if let Some(m) = sanitize(&q) {
                prop_assert!(run(&c, &m).is_ok(), "{:?} -> {:?}", q, m);
            }
        }

        #[test]
        fn fts_syntax_soup_never_fails(q in "[a-zA-Z\"*():^+\\- ]{0,40}( NEAR| AND| OR| NOT)?") {
            let c = fts();
            if let Some(m) = sanitize(&q) {
                prop_assert!(run(&c, &m).is_ok(), "{:?} -> {:?}", q, m);
            }
        }
    }
}
