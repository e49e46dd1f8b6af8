//! The line-based chunker (SPEC §13 `indexer.chunk_chars` / `overlap_chars`).
//!
//! A chunk is a run of whole lines of at most `chunk_chars` characters (a longer single line is
//! a chunk of its own). The next chunk starts with the last lines of the previous one, as many
//! as fit in `overlap_chars`, so a sentence cut at a boundary is still found whole in one of
//! the two. Every line is covered; outside the overlaps each line belongs to exactly one chunk.
//! Sizes count characters, with one more for each line break.

use sha2::{Digest, Sha256};

/// One chunk of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// 1-based, inclusive.
    pub start_line: u32,
    pub end_line: u32,
    /// The lines, joined with `\n`.
    pub text: String,
}

/// Split `text` into line-based chunks. Empty text has no chunks.
pub fn chunk_lines(text: &str, chunk_chars: usize, overlap_chars: usize) -> Vec<Chunk> {
    let lines: Vec<&str> = text.lines().collect();
    let cost: Vec<usize> = lines.iter().map(|l| l.chars().count() + 1).collect();
    let n = lines.len();
    let chunk_chars = chunk_chars.max(1);
    let mut out = Vec::new();
    let mut start = 0;
    // First line of the current chunk that the previous chunk did not hold: only these may be
    // carried over, so no line is ever in more than two chunks.
    let mut fresh = 0;
    while start < n {
        // At least one line, then as many as fit.
        let mut end = start + 1;
        let mut size = cost[start];
        while end < n && size + cost[end] <= chunk_chars {
            size += cost[end];
            end += 1;
        }
        out.push(Chunk {
            start_line: start as u32 + 1,
            end_line: end as u32,
            text: lines[start..end].join("\n"),
        });
        if end == n {
            break;
        }
        // Carry trailing lines over, but never so many that the next new line would not fit
        // beside them, never the whole chunk (the next one must start later), and never a
        // line this chunk itself carried over.
        let budget = overlap_chars.min(chunk_chars.saturating_sub(cost[end]));
        let floor = (start + 1).max(fresh);
        let mut next = end;
        let mut carried = 0;
        while next > floor && carried + cost[next - 1] <= budget {
            next -= 1;
            carried += cost[next];
        }
        start = next;
        fresh = end;
    }
    out
}

/// The text sent to the embeddings model for a chunk: its file path (without `.md`) as a title
/// line, then the chunk. The title gives short chunks their context ("people/anna").
pub fn embed_text(path: &str, text: &str) -> String {
    let title = path.strip_suffix(".md").unwrap_or(path);
    format!("{title}\n{text}")
}

/// Longest text (characters) sent to the embeddings model as one input. Small sentence models
/// such as all-MiniLM-L6-v2 read 256 word pieces and drop the rest: about 1,000 characters of
/// English prose, fewer of numbers, codes or German compounds; 800 leaves room for those.
/// `migrations/0002_embedding_windows.sql` uses this figure: change both together.
pub const WINDOW_CHARS: usize = 800;

/// The texts embedded for a chunk: its [`embed_text`] when that fits in [`WINDOW_CHARS`],
/// otherwise windows of whole lines (a longer line is a window of its own), each with the title
/// line, that together hold every line of the chunk once. The chunk's vector is the normalised
/// mean of the windows' vectors, so all of a long chunk counts, not only its first 256 tokens.
pub fn embed_windows(path: &str, text: &str) -> Vec<String> {
    let whole = embed_text(path, text);
    if whole.chars().count() <= WINDOW_CHARS {
        return vec![whole];
    }
    let title_chars = whole.chars().count() - text.chars().count();
    let room = WINDOW_CHARS.saturating_sub(title_chars).max(1);
    chunk_lines(text, room, 0)
        .into_iter()
        .filter(|w| !w.text.trim().is_empty())
        .map(|w| embed_text(path, &w.text))
        .collect()
}

/// sha256 hex of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    let digest = Sha256::digest(data);
    let mut s = String::with_capacity(64);
    for b in digest {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lines_of(c: &Chunk) -> std::ops::RangeInclusive<u32> {
        c.start_line..=c.end_line
    }

    #[test]
    fn small_text_is_one_chunk() {
        let c = chunk_lines("a\nb\nc\n", 100, 20);
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].start_line, c[0].end_line), (1, 3));
        assert_eq!(c[0].text, "a\nb\nc");
        assert!(chunk_lines("", 100, 20).is_empty());
    }

    #[test]
    fn chunks_overlap_by_trailing_lines() {
        // Ten lines of 9 chars + newline = 10 each; 30 per chunk, 10 overlap.
        let text: String = (0..10).map(|i| format!("line {i:04}\n")).collect();
        let c = chunk_lines(&text, 30, 10);
        let spans: Vec<(u32, u32)> = c.iter().map(|c| (c.start_line, c.end_line)).collect();
        assert_eq!(spans, vec![(1, 3), (3, 5), (5, 7), (7, 9), (9, 10)]);
    }

    #[test]
    fn a_long_line_is_its_own_chunk_without_overlap() {
        let long = "x".repeat(50);
        let text = format!("a\nb\n{long}\nc\n");
        let c = chunk_lines(&text, 10, 4);
        let spans: Vec<(u32, u32)> = c.iter().map(|c| (c.start_line, c.end_line)).collect();
        assert_eq!(spans, vec![(1, 2), (3, 3), (4, 4)]);
    }

    #[test]
    fn hashes_are_sha256_hex() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(embed_text("people/anna.md", "x"), "people/anna\nx");
    }

    #[test]
    fn a_long_chunk_is_embedded_in_windows_with_its_title() {
        assert_eq!(embed_windows("a.md", "short"), vec!["a\nshort".to_string()]);
        let line = "word ".repeat(30); // 150 characters
        let text = [line.trim_end(); 12].join("\n"); // 12 lines, 1,799 characters
        let windows = embed_windows("notes/long.md", &text);
        assert_eq!(windows.len(), 3, "{windows:?}");
        for w in &windows {
            assert!(w.starts_with("notes/long\n"));
            assert!(w.chars().count() <= WINDOW_CHARS, "{}", w.chars().count());
        }
        let lines: usize = windows.iter().map(|w| w.lines().count() - 1).sum();
        assert_eq!(lines, 12, "every line once");
    }

    proptest! {
        /// Windows hold every non-blank line of the chunk exactly once, in order.
        #[test]
        fn windows_cover_the_chunk(
            lines in proptest::collection::vec("[a-z ]{0,300}", 1..30),
        ) {
            let text = lines.join("\n");
            let windows = embed_windows("p.md", &text);
            let mut got: Vec<String> = Vec::new();
            for w in &windows {
                let mut it = w.lines();
                prop_assert_eq!(it.next(), Some("p"));
                got.extend(it.map(str::to_string));
            }
            let got: Vec<&str> =
                got.iter().map(String::as_str).filter(|l| !l.trim().is_empty()).collect();
            let want: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            prop_assert_eq!(got, want);
            for w in &windows {
                // Only a single line longer than the room may exceed the limit.
                prop_assert!(w.chars().count() <= WINDOW_CHARS || w.lines().count() <= 2);
            }
        }

        /// Must-show (issue #5): every line is covered, and outside the overlaps exactly once.
        #[test]
        fn every_line_is_covered_once_outside_overlaps(
            lines in proptest::collection::vec("[a-zé ]{0,40}", 0..80),
            chunk_chars in 1usize..200,
            overlap_chars in 0usize..120,
        ) {
            let text = lines.join("\n");
            let n = text.lines().count() as u32;
            let chunks = chunk_lines(&text, chunk_chars, overlap_chars);
            if n == 0 {
                prop_assert!(chunks.is_empty());
                return Ok(());
            }
            prop_assert_eq!(chunks[0].start_line, 1);
            prop_assert_eq!(chunks.last().unwrap().end_line, n);
            let all: Vec<&str> = text.lines().collect();
            for (i, c) in chunks.iter().enumerate() {
                prop_assert!(c.start_line <= c.end_line);
                // The text is exactly those lines.
                let want = all[c.start_line as usize - 1..c.end_line as usize].join("\n");
                prop_assert_eq!(&c.text, &want);
                if i > 0 {
                    let p = &chunks[i - 1];
                    // No gap, and progress.
                    prop_assert!(c.start_line <= p.end_line + 1);
                    prop_assert!(c.start_line > p.start_line);
                    prop_assert!(c.end_line > p.end_line);
                    // The overlap is within overlap_chars.
                    if c.start_line <= p.end_line {
                        let overlap: usize = all[c.start_line as usize - 1..p.end_line as usize]
                            .iter().map(|l| l.chars().count() + 1).sum();
                        prop_assert!(overlap <= overlap_chars);
                    }
                    // Chunks that are not neighbours never share a line.
                    if i > 1 {
                        prop_assert!(c.start_line > chunks[i - 2].end_line);
                    }
                }
            }
            // Outside overlaps exactly once: each line's "owner" is the first chunk holding it,
            // and the owned ranges partition 1..=n.
            let mut owned = 0u32;
            let mut prev_end = 0u32;
            for c in &chunks {
                let from = c.start_line.max(prev_end + 1);
                owned += c.end_line + 1 - from;
                prev_end = c.end_line;
            }
            prop_assert_eq!(owned, n);
            for line in 1..=n {
                let holders = chunks.iter().filter(|c| lines_of(c).contains(&line)).count();
                prop_assert!((1..=2).contains(&holders), "line {} in {} chunks", line, holders);
            }
        }

        /// Chunks other than single long lines respect chunk_chars.
        #[test]
        fn chunks_fit_unless_a_line_is_too_long(
            lines in proptest::collection::vec("[a-z]{0,30}", 1..60),
            chunk_chars in 1usize..120,
            overlap_chars in 0usize..60,
        ) {
            let text = lines.join("\n");
            for c in chunk_lines(&text, chunk_chars, overlap_chars) {
                let size = c.text.chars().count() + 1;
                prop_assert!(size <= chunk_chars || c.start_line == c.end_line,
                    "{:?} is {} chars", c, size);
            }
        }
    }
}
