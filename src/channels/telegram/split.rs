//! The reply splitter (SPEC §10.3): chunks of at most `limit` UTF-16 units, never inside a
//! multi-byte character or a code block.
//! (Placeholder body: the real splitter replaces it.)

/// Split `text` into chunks that each fit `limit` UTF-16 code units.
pub fn split_message(text: &str, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut units = 0;
    for c in text.chars() {
        let n = c.len_utf16();
        if units + n > limit && !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
            units = 0;
        }
        cur.push(c);
        units += n;
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}
