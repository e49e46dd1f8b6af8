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

/// Whether `text` reads as a sentence (it has a stop word: "what did we decide about the
/// roof") rather than a list of search terms ("E18 drain pump", "Vanillekipferl").
pub fn is_natural_language(text: &str) -> bool {
    words(text).any(|w| STOPWORDS.contains(&w.as_str()))
}

/// The terms of a query as [`sanitize`] searches them (keywords, or every word when there are
/// none), reduced to their Snowball English stems, so that a chunk can be asked how many of
/// them it contains ([`QueryTerms::coverage`]).
#[derive(Debug, Clone, PartialEq)]
pub struct QueryTerms {
    stems: Vec<String>,
    /// The first two letters of each term and of each stem: a word of a chunk that starts with
    /// none of them cannot share a stem with the query, and is not stemmed.
    heads: Vec<String>,
}

/// Words longer than this (bytes) are neither query terms of the coverage nor matched.
const MAX_STEM_WORD: usize = 64;

fn stemmer() -> rust_stemmers::Stemmer {
    rust_stemmers::Stemmer::create(rust_stemmers::Algorithm::English)
}

/// The first two characters of `s` (a cheap filter before stemming a word of a chunk).
fn head2(s: &str) -> &str {
    let end = s.char_indices().nth(2).map_or(s.len(), |(i, _)| i);
    &s[..end]
}

impl QueryTerms {
    pub fn new(query: &str) -> QueryTerms {
        let mut terms: Vec<String> = keywords(query).take(MAX_TERMS).collect();
        if terms.is_empty() {
            terms = words(query).take(MAX_TERMS).collect();
        }
        let stemmer = stemmer();
        let mut stems: Vec<String> = Vec::with_capacity(terms.len());
        let mut heads: Vec<String> = Vec::with_capacity(terms.len());
        for t in terms.iter().filter(|t| t.len() <= MAX_STEM_WORD) {
            let s = stemmer.stem(t).into_owned();
            for h in [head2(t), head2(&s)] {
                if !heads.iter().any(|x| x == h) {
                    heads.push(h.to_string());
                }
            }
            if !stems.contains(&s) {
                stems.push(s);
            }
        }
        QueryTerms { stems, heads }
    }

    pub fn is_empty(&self) -> bool {
        self.stems.is_empty()
    }

    /// The share (0–1) of the query's terms that occur in `texts` (a chunk's path and text),
    /// compared as stems, the way FTS5's `porter` tokenizer compares them (Snowball English is
    /// Porter's own successor; they differ on a few irregular words). 0 for an empty query.
    pub fn coverage(&self, texts: &[&str]) -> f64 {
        if self.stems.is_empty() {
            return 0.0;
        }
        let stemmer = stemmer();
        let mut found = vec![false; self.stems.len()];
        let mut left = self.stems.len();
        'texts: for text in texts {
            for word in text.split(|c: char| !c.is_alphanumeric()) {
                if word.is_empty() || word.len() > MAX_STEM_WORD {
                    continue;
                }
                let lower = word.to_lowercase();
                // Stems are prefixes of their words, but for a final y -> i and a few
                // irregular words ("dying" -> "die"): the heads of both cover these.
                if !self.heads.iter().any(|h| lower.starts_with(h.as_str())) {
                    continue;
                }
                let stem = stemmer.stem(&lower);
                for (i, s) in self.stems.iter().enumerate() {
                    if !found[i] && *s == stem {
                        found[i] = true;
                        left -= 1;
                        if left == 0 {
                            break 'texts;
                        }
                    }
                }
            }
        }
        (self.stems.len() - left) as f64 / self.stems.len() as f64
    }
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
    fn coverage_counts_query_terms_by_stem() {
        let q = QueryTerms::new("purchased a used bicycle");
        assert!(!q.is_empty());
        assert_eq!(q.coverage(&["Bought a second-hand road bike."]), 0.0);
        let c = q.coverage(&["purchases/bike.md", "We purchase bicycles we have used."]);
        assert_eq!(c, 1.0);
        let c = q.coverage(&["", "Someone used the lift."]);
        assert!((c - 1.0 / 3.0).abs() < 1e-9, "{c}");
        // Paths count (FTS5 indexes them too), case does not, a repeated term counts once.
        let q = QueryTerms::new("Anna ANNA birthday");
        assert_eq!(q.coverage(&["people/anna.md", "born 3 May"]), 0.5);
        // Irregular stems: the word's own first letters still let it through.
        assert_eq!(
            QueryTerms::new("dying").coverage(&["the plant is dying"]),
            1.0
        );
        assert_eq!(QueryTerms::new("dying").coverage(&["plants die"]), 1.0);
        // Only stop words: they are the terms, as in `sanitize`.
        assert_eq!(
            QueryTerms::new("what is it").coverage(&["it is"]),
            2.0 / 3.0
        );
        assert!(QueryTerms::new("?!").is_empty());
        assert_eq!(QueryTerms::new("?!").coverage(&["anything"]), 0.0);
    }

    #[test]
    fn natural_language_has_stop_words() {
        assert!(is_natural_language("what did we decide about the roof?"));
        assert!(is_natural_language("purchased a used bicycle"));
        assert!(!is_natural_language("E18 error drain pump blocked"));
        assert!(!is_natural_language("Vanillekipferl"));
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

        /// Coverage is a share, whatever the text.
        #[test]
        fn coverage_is_a_share(q in "\\PC{0,60}", t in "\\PC{0,200}") {
            let c = QueryTerms::new(&q).coverage(&[&t]);
            prop_assert!((0.0..=1.0).contains(&c), "{}", c);
            let terms = QueryTerms::new(&q);
            if !terms.is_empty() {
                prop_assert_eq!(terms.coverage(&[&q]), 1.0);
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
