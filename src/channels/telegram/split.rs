//! The reply splitter (SPEC §10.3): cuts a Markdown reply into chunks of at most `limit` UTF-16
//! code units, never inside a character and never inside a fenced code block without repairing
//! it. Splitting happens *before* formatting; [`super::format`] renders each chunk on its own.
//!
//! # Where a chunk ends
//!
//! Every cut keeps the separator at the end of the earlier chunk, so plain concatenation gives
//! back the text. Among the cut points that fit, the splitter prefers, in order: a paragraph
//! break (after a blank line), a line break, a sentence end, other whitespace, and last a hard
//! cut between characters (avoiding the middle of an emoji sequence, a combining mark or a
//! flag pair where it can). A higher kind wins when it fills at least half of the chunk;
//! otherwise the farthest non-hard cut wins, then the farthest hard cut.
//!
//! # Code blocks
//!
//! A cut inside a ```` ``` ```` block closes the block at the end of the chunk and reopens it,
//! with the same opening line (or just its backticks when that line is long), at the start of
//! the next chunk; those added lines count towards the limit. The added closing fence is
//! ```` ``` ```` when the cut falls at a line start, and ```` ``` ```` followed by a single
//! space (on a line of its own) when the cut falls inside a line: that space is how [`rejoin`]
//! knows it must also drop the line break in front of the fence. A cut never falls inside a
//! fence line, right after an opening fence, or right before a closing one, and never leaves a
//! fragment of a line that would read as a fence in its chunk. A fence line that cannot fit
//! with its repair lines in half a chunk (only with tiny limits or absurd lines) is treated as
//! ordinary text and deliberately cut within its first backticks, so that every chunk still
//! reads the way the splitter read the whole text. Inline markup (`**`, `` ` ``) may be cut
//! apart; the formatter leaves such unmatched markers literal.
//!
//! # The rejoin contract
//!
//! [`rejoin`] walks the chunks in order. When the previous chunk ended with an added fence, it
//! drops this chunk's first line (through its line break). When this chunk is not the last and
//! its last line (after its last line break, with no line break of its own) starts like a
//! fence (optional spaces or tabs, then ```` ``` ````), it drops that line, and also the line
//! break before it when the line ends with a space. Then it concatenates. This is sound because
//! the splitter never ends a chunk other than the last with a fence-like fragment of the text.
//!
//! `rejoin(&split_message(text, limit)) == text` for every text with a visible character whose
//! whitespace runs are at most a quarter of the limit (property-tested). Beyond that, one rule
//! can cost whitespace: a chunk must contain a visible character, so whitespace that cannot
//! travel with one within a chunk is dropped (a run longer than a chunk, leading whitespace
//! that would leave no room for a fence and its repair lines). In every case `rejoin` gives the
//! input with some whitespace characters removed and nothing else changed, and whitespace-only
//! input gives no chunks. The separators kept at chunk ends are invisible in Telegram, which
//! trims messages.

/// The smallest limit the splitter honours; smaller limits are raised to this.
pub const MIN_LIMIT: usize = 16;

/// Split `text` into chunks that each fit `limit` UTF-16 code units (see the module docs for
/// where cuts fall and how code blocks are repaired). Text that fits is returned as one chunk,
/// unchanged; whitespace-only text gives no chunks. `limit` below [`MIN_LIMIT`] counts as
/// [`MIN_LIMIT`].
pub fn split_message(text: &str, limit: usize) -> Vec<String> {
    let limit = limit.max(MIN_LIMIT);
    if text.chars().all(char::is_whitespace) {
        return Vec::new();
    }
    if utf16_len(text) <= limit {
        return vec![text.to_owned()];
    }
    let doc = Doc::new(text, limit);
    let pieces = doc.plan();
    doc.render(&pieces)
}

/// Undo [`split_message`]: drop the fence lines the splitter added (a closing fence ending a
/// chunk without a line break, the matching reopening line that starts the next chunk) and
/// concatenate. `rejoin(&split_message(text, limit))` equals `text` except for the whitespace
/// the module docs describe.
pub fn rejoin(chunks: &[String]) -> String {
    let mut out = String::new();
    let mut strip_reopen = false;
    for (i, chunk) in chunks.iter().enumerate() {
        let mut s = chunk.as_str();
        if strip_reopen {
            s = s.find('\n').map_or("", |k| &s[k + 1..]);
        }
        strip_reopen = false;
        if i + 1 < chunks.len() {
            // Original text never leaves a chunk (other than the last) ending in a fence-like
            // line without its line break, so such a line is an added closing fence.
            let last_start = s.rfind('\n').map_or(0, |k| k + 1);
            let last = &s[last_start..];
            if is_fence_like(last) {
                strip_reopen = true;
                s = if last.ends_with(' ') && last_start > 0 {
                    &s[..last_start - 1]
                } else {
                    &s[..last_start]
                };
            }
        }
        out.push_str(s);
    }
    out
}

/// The length of `s` in UTF-16 code units, the unit Telegram counts message length in.
pub fn utf16_len(s: &str) -> usize {
    s.chars().map(char::len_utf16).sum()
}

// ---- Fence lines, shared with the formatter so both read a chunk the same way. ----

/// The indentation (bytes of spaces/tabs) and backtick count of a line that starts with at
/// least three backticks after optional spaces or tabs.
fn fence_ticks(line: &str) -> Option<(usize, usize)> {
    let rest = line.trim_start_matches([' ', '\t']);
    let indent = line.len() - rest.len();
    let ticks = rest.bytes().take_while(|&b| b == b'`').count();
    (ticks >= 3).then_some((indent, ticks))
}

/// Whether `line` (no line break) starts like a fence: optional spaces/tabs, then ```` ``` ````.
pub(crate) fn is_fence_like(line: &str) -> bool {
    fence_ticks(line).is_some()
}

/// An opening fence line: its indentation in bytes, its backtick count and its info string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FenceOpen<'a> {
    pub indent: usize,
    pub ticks: usize,
    pub info: &'a str,
}

/// Parse `line` (no line break) as an opening fence: ≥ 3 backticks after optional spaces or
/// tabs (any indentation, more lenient than CommonMark), and an info string without backticks.
pub(crate) fn fence_opener(line: &str) -> Option<FenceOpen<'_>> {
    let (indent, ticks) = fence_ticks(line)?;
    let info = &line[indent + ticks..];
    if info.contains('`') {
        return None;
    }
    Some(FenceOpen {
        indent,
        ticks,
        info: info.trim(),
    })
}

/// Whether `line` (no line break) closes a block opened with `ticks` backticks: at least as
/// many backticks and nothing but whitespace after them.
pub(crate) fn fence_closes(line: &str, ticks: usize) -> bool {
    fence_ticks(line).is_some_and(|(indent, n)| n >= ticks && line[indent + n..].trim().is_empty())
}

// ---- The splitter proper. Positions are char indices into the text. ----

/// What a line is, read with the splitter's fence rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Text,
    Open(usize),
    Content(usize),
    Close(usize),
}

#[derive(Debug)]
struct Line {
    start: usize,
    /// Index of the line break, or the text's end.
    content_end: usize,
    /// Index after the line break.
    end: usize,
    role: Role,
    /// A fence line too long to keep whole: read as text/content and cut inside its backticks.
    demoted: bool,
    blank: bool,
}

#[derive(Debug)]
struct Block {
    ticks: usize,
    open_line: usize,
    /// The opening line, trimmed, used to reopen the block in a later chunk.
    reopen: String,
}

/// One planned chunk: `text[start..end]`, after an optional reopening line.
#[derive(Debug)]
struct Piece {
    start: usize,
    end: usize,
    prefix: Option<String>,
}

/// Cut-point kinds, worst first.
const HARD_BAD: usize = 0;
const HARD: usize = 1;
const SPACE: usize = 2;
const SENTENCE: usize = 3;
const LINE: usize = 4;
const PARA: usize = 5;
const LEVELS: usize = 6;

/// Candidates found by one scan: the farthest cut of each kind, per tier.
#[derive(Default)]
struct Candidates {
    /// Valid and leaving a good start for the next chunk.
    best: [Option<usize>; LEVELS],
    /// Valid, but the next chunk starts with fence-like text or whitespace that may be lost.
    ok: [Option<usize>; LEVELS],
    /// Last resort: fits, has content and does not end with a fence-like fragment.
    any: Option<usize>,
}

struct Doc<'a> {
    text: &'a str,
    limit: usize,
    chars: Vec<char>,
    /// Byte offset of each char, plus the text length.
    byte: Vec<usize>,
    /// UTF-16 units before each char, plus the total.
    units: Vec<usize>,
    /// First index ≥ i holding a non-whitespace char (or n).
    next_nonws: Vec<usize>,
    /// First index ≥ i holding neither a space nor a tab (or n).
    next_nonsp: Vec<usize>,
    /// Number of consecutive backticks starting at i.
    tick_run: Vec<usize>,
    line_of: Vec<usize>,
    lines: Vec<Line>,
    blocks: Vec<Block>,
    /// For each line, the first demoted line at or after it.
    next_demoted: Vec<Option<usize>>,
}

impl<'a> Doc<'a> {
    fn new(text: &'a str, limit: usize) -> Self {
        let chars: Vec<char> = text.chars().collect();
        let n = chars.len();
        let mut byte = Vec::with_capacity(n + 1);
        let mut units = Vec::with_capacity(n + 1);
        let (mut b, mut u) = (0, 0);
        for c in &chars {
            byte.push(b);
            units.push(u);
            b += c.len_utf8();
            u += c.len_utf16();
        }
        byte.push(b);
        units.push(u);

        let mut next_nonws = vec![n; n + 1];
        let mut next_nonsp = vec![n; n + 1];
        let mut tick_run = vec![0; n + 1];
        for i in (0..n).rev() {
            next_nonws[i] = if chars[i].is_whitespace() {
                next_nonws[i + 1]
            } else {
                i
            };
            next_nonsp[i] = if matches!(chars[i], ' ' | '\t') {
                next_nonsp[i + 1]
            } else {
                i
            };
            tick_run[i] = if chars[i] == '`' {
                tick_run[i + 1] + 1
            } else {
                0
            };
        }

        let mut doc = Doc {
            text,
            limit,
            chars,
            byte,
            units,
            next_nonws,
            next_nonsp,
            tick_run,
            line_of: vec![0; n + 1],
            lines: Vec::new(),
            blocks: Vec::new(),
            next_demoted: Vec::new(),
        };
        doc.read_lines();
        doc
    }

    fn slice(&self, from: usize, to: usize) -> &'a str {
        &self.text[self.byte[from]..self.byte[to]]
    }

    fn span_units(&self, from: usize, to: usize) -> usize {
        self.units[to] - self.units[from]
    }

    fn is_line_start(&self, p: usize) -> bool {
        p == 0 || self.chars[p - 1] == '\n'
    }

    /// Whether `text[from..to]`, read as a line of its own, starts like a fence.
    fn fragment_fence_like(&self, from: usize, to: usize) -> bool {
        let k = self.next_nonsp[from];
        k + 3 <= to && self.tick_run[k] >= 3
    }

    /// Split into lines and give each its role, demoting fence lines that cannot be kept whole
    /// together with their repair lines.
    fn read_lines(&mut self) {
        let n = self.chars.len();
        let mut spans = Vec::new();
        let mut start = 0;
        for (i, &c) in self.chars.iter().enumerate() {
            if c == '\n' {
                spans.push((start, i, i + 1));
                start = i + 1;
            }
        }
        spans.push((start, n, n));

        // A fence line is kept only when it and its repair lines fit in half a chunk, which
        // leaves room for whatever precedes it in its chunk (leading whitespace included).
        let limit = self.limit / 2;
        let mut state: Option<(usize, usize)> = None; // (block, ticks)
        for (li, &(start, content_end, end)) in spans.iter().enumerate() {
            let line = self.slice(start, content_end);
            let line_units = self.span_units(start, end);
            let mut demoted = false;
            let role = match state {
                None => match fence_opener(line) {
                    Some(f) => {
                        let t = f.ticks;
                        let closes_next = spans.get(li + 1).map(|&(s, ce, e)| {
                            (fence_closes(self.slice(s, ce), t), self.span_units(s, e))
                        });
                        let fits = 2 * t + 5 <= limit
                            && match closes_next {
                                Some((true, next_units)) => line_units + next_units <= limit,
                                _ => line_units + t + 4 <= limit,
                            };
                        if fits {
                            let b = self.blocks.len();
                            self.blocks.push(Block {
                                ticks: t,
                                open_line: li,
                                reopen: line.trim_end().to_owned(),
                            });
                            state = Some((b, t));
                            Role::Open(b)
                        } else {
                            demoted = true;
                            Role::Text
                        }
                    }
                    None => Role::Text,
                },
                Some((b, t)) => {
                    if fence_closes(line, t) {
                        if t + 2 + line_units <= limit {
                            state = None;
                            Role::Close(b)
                        } else {
                            demoted = true;
                            Role::Content(b)
                        }
                    } else {
                        Role::Content(b)
                    }
                }
            };
            for i in start..end {
                self.line_of[i] = li;
            }
            self.lines.push(Line {
                start,
                content_end,
                end,
                role,
                demoted,
                blank: line.trim().is_empty(),
            });
        }
        self.line_of[n] = self.lines.len() - 1;

        let mut next = None;
        self.next_demoted = vec![None; self.lines.len()];
        for li in (0..self.lines.len()).rev() {
            if self.lines[li].demoted {
                next = Some(li);
            }
            self.next_demoted[li] = next;
        }
    }

    /// The code block position `p` lies in (content or closing line), if any.
    fn code_at(&self, p: usize) -> Option<usize> {
        if p >= self.chars.len() {
            return None;
        }
        match self.lines[self.line_of[p]].role {
            Role::Content(b) | Role::Close(b) => Some(b),
            Role::Text | Role::Open(_) => None,
        }
    }

    /// UTF-16 units of the closing fence a chunk ending at `p` needs.
    fn suffix_units(&self, p: usize) -> usize {
        match self.code_at(p) {
            Some(b) if self.is_line_start(p) => self.blocks[b].ticks,
            Some(b) => self.blocks[b].ticks + 2,
            None => 0,
        }
    }

    fn plan(&self) -> Vec<Piece> {
        let n = self.chars.len();
        let mut pieces: Vec<Piece> = Vec::new();
        let mut cs = 0;
        loop {
            let reopen = pieces.last().and_then(|pc| self.code_at(pc.end));
            let short = reopen.map_or(0, |b| self.blocks[b].ticks + 1);
            let Some(start) = self.chunk_start(cs, short) else {
                break;
            };
            let (mut start, (mut prefix, mut end, tier)) = (start, self.choose(start, reopen));
            if tier == 3 {
                // Only a last-resort cut fits, perhaps because leading whitespace takes the
                // room a fence line needs: drop that whitespace if it then fits properly.
                let mut alt = start;
                while let Some(next) = self.skip_leading_whitespace(alt) {
                    alt = next;
                    let (p2, e2, t2) = self.choose(alt, reopen);
                    if t2 < 3 {
                        (start, prefix, end) = (alt, p2, e2);
                        break;
                    }
                }
            }
            pieces.push(Piece { start, end, prefix });
            if end >= n {
                break;
            }
            cs = end;
        }
        pieces
    }

    /// Where the chunk beginning at `cs` really starts: whitespace that cannot reach a visible
    /// character within one chunk is dropped. `None` when only whitespace remains.
    fn chunk_start(&self, mut cs: usize, prefix_units: usize) -> Option<usize> {
        let n = self.chars.len();
        loop {
            let q = self.next_nonws[cs];
            if q >= n {
                return None;
            }
            let end = q + 1;
            let suffix = if end < n { self.suffix_units(end) } else { 0 };
            if prefix_units + self.span_units(cs, end) + suffix <= self.limit || cs == q {
                return Some(cs);
            }
            let line_start = self.lines[self.line_of[q]].start;
            cs = if line_start > cs { line_start } else { q };
        }
    }

    /// Where a chunk starting at `cs` starts after dropping its leading whitespace (up to the
    /// next visible character's line start if that is further on, else up to the character).
    fn skip_leading_whitespace(&self, cs: usize) -> Option<usize> {
        let q = self.next_nonws[cs];
        if q == cs || q >= self.chars.len() {
            return None;
        }
        let line_start = self.lines[self.line_of[q]].start;
        Some(if line_start > cs { line_start } else { q })
    }

    /// Pick the end of the chunk starting at `cs`, its reopening line and the tier of the cut
    /// (see [`Doc::scan`]).
    fn choose(&self, cs: usize, reopen: Option<usize>) -> (Option<String>, usize, u8) {
        let forced = (cs + 1, 3);
        let Some(b) = reopen else {
            let (p, tier) = self.scan(cs, 0).unwrap_or(forced);
            return (None, p, tier);
        };
        let block = &self.blocks[b];
        let long = utf16_len(&block.reopen) + 1;
        if long <= self.limit / 4
            && let Some((p, tier)) = self.scan(cs, long)
            && tier < 3
        {
            return (Some(format!("{}\n", block.reopen)), p, tier);
        }
        let (p, tier) = self.scan(cs, block.ticks + 1).unwrap_or(forced);
        (Some(format!("{}\n", "`".repeat(block.ticks))), p, tier)
    }

    /// Find the best end for a chunk starting at `cs` after `prefix` units of reopening line.
    /// Returns the end and its tier (0: the rest fits, 1: best, 2: valid, 3: last resort).
    fn scan(&self, cs: usize, prefix: usize) -> Option<(usize, u8)> {
        let n = self.chars.len();
        let avail = self.limit.checked_sub(prefix)?;
        if self.span_units(cs, n) <= avail && self.first_fragment_ok(cs, n) {
            return Some((n, 0));
        }
        let cs_line = self.line_of[cs];
        let first_demoted = if self.lines[cs_line].start == cs {
            self.next_demoted[cs_line]
        } else {
            self.next_demoted.get(cs_line + 1).copied().flatten()
        };
        let cap = first_demoted.map_or(n, |d| self.lines[d].end);
        let first_nonws = self.next_nonws[cs];

        let mut found = Candidates::default();
        let mut p = cs + 1;
        while p < n && self.span_units(cs, p) <= avail {
            if first_nonws < p
                && self.span_units(cs, p) + self.suffix_units(p) <= avail
                && self.last_fragment_ok(cs, p)
            {
                found.any = Some(p);
                if p < cap && self.first_fragment_ok(cs, p) && self.structure_ok(p) {
                    let level = self.level(p);
                    if self.next_start_ok(p) {
                        found.best[level] = Some(p);
                    } else {
                        found.ok[level] = Some(p);
                    }
                }
            }
            p += 1;
        }
        if let Some(p) = self.pick(&found.best, cs, avail) {
            return Some((p, 1));
        }
        if let Some(p) = self.pick(&found.ok, cs, avail) {
            return Some((p, 2));
        }
        found.any.map(|p| (p, 3))
    }

    fn pick(&self, by_level: &[Option<usize>; LEVELS], cs: usize, avail: usize) -> Option<usize> {
        for level in (SPACE..=PARA).rev() {
            if let Some(p) = by_level[level]
                && 2 * self.span_units(cs, p) >= avail
            {
                return Some(p);
            }
        }
        by_level[SPACE..=PARA]
            .iter()
            .flatten()
            .max()
            .copied()
            .or(by_level[HARD])
            .or(by_level[HARD_BAD])
    }

    /// A chunk ending inside a line must not end with a fragment that reads as a fence.
    fn last_fragment_ok(&self, cs: usize, p: usize) -> bool {
        let line = &self.lines[self.line_of[p]];
        p == line.start || !self.fragment_fence_like(line.start.max(cs), p)
    }

    /// A chunk starting inside a line must not start with a fragment that reads as a fence.
    fn first_fragment_ok(&self, cs: usize, p: usize) -> bool {
        let line = &self.lines[self.line_of[cs]];
        cs == line.start || !self.fragment_fence_like(cs, p.min(line.content_end))
    }

    /// Fence structure: no cut inside a fence line, right after an opening fence or right
    /// before a closing one.
    fn structure_ok(&self, p: usize) -> bool {
        let li = self.line_of[p];
        let line = &self.lines[li];
        if p != line.start {
            return !matches!(line.role, Role::Open(_) | Role::Close(_)) || line.demoted;
        }
        match line.role {
            Role::Close(_) => false,
            Role::Content(b) => li != self.blocks[b].open_line + 1,
            Role::Text | Role::Open(_) => true,
        }
    }

    /// Whether the next chunk, starting at `p`, starts well: something visible remains, it does
    /// not start with a fence-like fragment, and its leading whitespace fits.
    fn next_start_ok(&self, p: usize) -> bool {
        let n = self.chars.len();
        let q = self.next_nonws[p];
        if q >= n {
            return false;
        }
        let line = &self.lines[self.line_of[p]];
        if p != line.start && self.fragment_fence_like(p, line.content_end) {
            return false;
        }
        let prefix = self.code_at(p).map_or(0, |b| self.blocks[b].ticks + 1);
        let suffix = if q + 1 < n {
            self.suffix_units(q + 1)
        } else {
            0
        };
        prefix + self.span_units(p, q + 1) + suffix <= self.limit
    }

    /// The kind of cut at `p` (between chars `p - 1` and `p`).
    fn level(&self, p: usize) -> usize {
        if self.grapheme_inside(p) {
            return HARD_BAD;
        }
        let prev = self.chars[p - 1];
        if prev == '\n' {
            return if self.lines[self.line_of[p - 1]].blank {
                PARA
            } else {
                LINE
            };
        }
        if breaking_space(prev) {
            return if self.sentence_end_before(p) {
                SENTENCE
            } else {
                SPACE
            };
        }
        match prev {
            '。' | '！' | '？' => SENTENCE,
            '，' | '、' | '；' | '：' => SPACE,
            _ => HARD,
        }
    }

    /// Whether the whitespace ending at `p` follows a sentence end (`.`, `!`, `?`, `…`,
    /// possibly followed by closing quotes, brackets or emphasis markers).
    fn sentence_end_before(&self, p: usize) -> bool {
        let mut i = p;
        let mut steps = 0;
        while i > 0 && steps < 16 {
            let c = self.chars[i - 1];
            if breaking_space(c)
                || matches!(c, ')' | ']' | '"' | '\'' | '”' | '’' | '»' | '*' | '_')
            {
                i -= 1;
                steps += 1;
                continue;
            }
            return matches!(c, '.' | '!' | '?' | '…');
        }
        false
    }

    /// Whether a cut at `p` would separate parts of one user-perceived character: before a
    /// combining mark, variation selector, skin tone or tag, around a zero-width joiner, inside
    /// a regional-indicator pair or a CR LF pair.
    fn grapheme_inside(&self, p: usize) -> bool {
        let (prev, next) = (self.chars[p - 1], self.chars[p]);
        if extends_grapheme(next) || prev == '\u{200D}' || (prev == '\r' && next == '\n') {
            return true;
        }
        if is_regional_indicator(prev) && is_regional_indicator(next) {
            let run = self.chars[..p]
                .iter()
                .rev()
                .take(64)
                .take_while(|&&c| is_regional_indicator(c))
                .count();
            return run % 2 == 1;
        }
        false
    }

    fn render(&self, pieces: &[Piece]) -> Vec<String> {
        pieces
            .iter()
            .enumerate()
            .map(|(i, pc)| {
                let mut s = pc.prefix.clone().unwrap_or_default();
                s.push_str(self.slice(pc.start, pc.end));
                if i + 1 < pieces.len()
                    && let Some(b) = self.code_at(pc.end)
                {
                    let mid_line = !self.is_line_start(pc.end);
                    if mid_line {
                        s.push('\n');
                    }
                    s.push_str(&"`".repeat(self.blocks[b].ticks));
                    if mid_line {
                        s.push(' ');
                    }
                }
                s
            })
            .collect()
    }
}

/// Whitespace a line may wrap at (no-break spaces excluded).
fn breaking_space(c: char) -> bool {
    c.is_whitespace() && !matches!(c, '\u{00A0}' | '\u{2007}' | '\u{202F}')
}

fn extends_grapheme(c: char) -> bool {
    matches!(c,
        '\u{0300}'..='\u{036F}'
        | '\u{1AB0}'..='\u{1AFF}'
        | '\u{1DC0}'..='\u{1DFF}'
        | '\u{200C}'..='\u{200D}'
        | '\u{20D0}'..='\u{20FF}'
        | '\u{FE00}'..='\u{FE0F}'
        | '\u{FE20}'..='\u{FE2F}'
        | '\u{1F3FB}'..='\u{1F3FF}'
        | '\u{E0020}'..='\u{E007F}'
        | '\u{E0100}'..='\u{E01EF}')
}

fn is_regional_indicator(c: char) -> bool {
    ('\u{1F1E6}'..='\u{1F1FF}').contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Line roles of a chunk read the way the formatter reads it (no demotion).
    fn roles(chunk: &str) -> Vec<Role> {
        let mut state: Option<usize> = None;
        let mut out = Vec::new();
        for line in chunk.split('\n') {
            let role = match state {
                None => match fence_opener(line) {
                    Some(f) => {
                        state = Some(f.ticks);
                        Role::Open(0)
                    }
                    None => Role::Text,
                },
                Some(t) if fence_closes(line, t) => {
                    state = None;
                    Role::Close(0)
                }
                Some(_) => Role::Content(0),
            };
            out.push(role);
        }
        out
    }

    fn ends_in_code(chunk: &str) -> bool {
        matches!(roles(chunk).last(), Some(Role::Open(_) | Role::Content(_)))
    }

    fn same_kind(a: Role, b: Role) -> bool {
        std::mem::discriminant(&a) == std::mem::discriminant(&b)
    }

    /// Whether `got` is `orig` with only whitespace characters removed.
    fn is_whitespace_deletion(orig: &str, got: &str) -> bool {
        let mut g = got.chars().peekable();
        for c in orig.chars() {
            if g.peek() == Some(&c) {
                g.next();
            } else if !c.is_whitespace() {
                return false;
            }
        }
        g.next().is_none()
    }

    fn longest_whitespace_run(s: &str) -> usize {
        let (mut best, mut cur) = (0, 0);
        for c in s.chars() {
            if c.is_whitespace() {
                cur += c.len_utf16();
                best = best.max(cur);
            } else {
                cur = 0;
            }
        }
        best
    }

    /// Check every property of one split; returns the chunks.
    fn check(text: &str, limit: usize) -> Vec<String> {
        let chunks = split_message(text, limit);
        let limit = limit.max(MIN_LIMIT);
        for c in &chunks {
            assert!(utf16_len(c) <= limit, "chunk over {limit}: {c:?}");
            assert!(!c.trim().is_empty(), "blank chunk {c:?}");
        }
        let back = rejoin(&chunks);
        assert!(
            is_whitespace_deletion(text, &back),
            "rejoin changed more than whitespace:\n{text:?}\n{back:?}"
        );
        if longest_whitespace_run(text) * 4 <= limit && !text.trim().is_empty() {
            assert_eq!(back, text, "rejoin differs; chunks {chunks:#?}");
        }
        if utf16_len(text) <= limit && !text.trim().is_empty() {
            assert_eq!(chunks, vec![text.to_owned()]);
        }
        if chunks.len() > 1 {
            let doc = Doc::new(text, limit);
            let pieces = doc.plan();
            assert_eq!(pieces.len(), chunks.len());
            for (i, (pc, chunk)) in pieces.iter().zip(&chunks).enumerate() {
                let last = i + 1 == chunks.len();
                let got = roles(chunk);
                if !last {
                    assert!(
                        !ends_in_code(chunk),
                        "unbalanced fences in chunk {i}: {chunk:?}"
                    );
                }
                // Every original line fragment reads the same in its chunk as in the text.
                let has_demoted = (doc.line_of[pc.start]..=doc.line_of[pc.end])
                    .any(|li| doc.lines[li].demoted && doc.lines[li].start >= pc.start);
                if last && has_demoted {
                    continue;
                }
                let first_line = doc.line_of[pc.start];
                let skip = usize::from(pc.prefix.is_some());
                let body = &got[skip..];
                for (k, &role) in body.iter().enumerate() {
                    let li = first_line + k;
                    if li >= doc.lines.len() || doc.lines[li].start >= pc.end && k > 0 {
                        // After the original lines: the added closing fence, or the empty
                        // remainder of a chunk that ends with a line break.
                        let closed = !last && doc.code_at(pc.end).is_some();
                        assert!(
                            if closed {
                                matches!(role, Role::Close(_))
                            } else {
                                k + 1 == body.len()
                            },
                            "chunk {i}: {chunk:?}"
                        );
                        continue;
                    }
                    assert!(
                        same_kind(role, doc.lines[li].role),
                        "chunk {i} line {k} reads {role:?}, text line {li} is {:?}\n{chunk:?}",
                        doc.lines[li].role
                    );
                }
            }
        }
        chunks
    }

    #[test]
    fn short_text_is_one_unchanged_chunk() {
        assert_eq!(check("hello *world*\n", 4096), vec!["hello *world*\n"]);
        assert!(split_message("  \n\t ", 16).is_empty());
        assert!(split_message("", 16).is_empty());
    }

    #[test]
    fn prefers_paragraph_breaks() {
        let text = "First paragraph is here.\n\nSecond one, a bit longer than that.\nWith a line.";
        let chunks = check(text, 50);
        assert_eq!(chunks[0], "First paragraph is here.\n\n");
        assert!(chunks[1].starts_with("Second"));
    }

    #[test]
    fn prefers_line_then_sentence_then_space() {
        let chunks = check("aaaa bbbb. cccc dddd\neeee ffff gggg", 24);
        assert_eq!(chunks[0], "aaaa bbbb. cccc dddd\n");
        let chunks = check("aaaa bbbb cccc. dddd eeee ffff", 24);
        assert_eq!(chunks[0], "aaaa bbbb cccc. ");
        let chunks = check("aaaa bbbb cccc dddd eeee ffff", 24);
        assert_eq!(chunks[0], "aaaa bbbb cccc dddd ");
    }

    #[test]
    fn hard_split_counts_utf16_and_keeps_emoji_whole() {
        let text = "😀".repeat(20); // 40 UTF-16 units
        let chunks = check(&text, 16);
        assert_eq!(chunks.len(), 3);
        assert!(chunks.iter().all(|c| utf16_len(c) <= 16));
        // A family emoji (ZWJ sequence) and a thumbs-up with skin tone are not cut apart.
        let family = "👨\u{200D}👩\u{200D}👧";
        let text = format!("{}{family}{}", "x".repeat(10), "y".repeat(10));
        let chunks = check(&text, 16);
        assert!(chunks.iter().any(|c| c.contains(family)), "{chunks:?}");
        let text = format!("{}👍🏽{}", "x".repeat(13), "y".repeat(10));
        let chunks = check(&text, 16);
        assert!(chunks.iter().any(|c| c.contains("👍🏽")), "{chunks:?}");
    }

    #[test]
    fn code_block_is_closed_and_reopened_with_its_language() {
        let code: String = (0..12).map(|i| format!("let x{i} = {i};\n")).collect();
        let text = format!("Intro.\n\n```rust\n{code}```\nAfter.");
        let chunks = check(&text, 120);
        assert!(chunks.len() >= 2);
        assert!(chunks[0].ends_with("\n```"), "{:?}", chunks[0]);
        assert!(chunks[1].starts_with("```rust\nlet x"), "{:?}", chunks[1]);
        assert_eq!(rejoin(&chunks), text);
    }

    #[test]
    fn long_code_line_is_cut_mid_line_with_marker() {
        let text = format!("```\n{}\n```", "a".repeat(100));
        let chunks = check(&text, 40);
        assert!(chunks[0].ends_with("\n``` "), "{chunks:?}");
        assert!(chunks[1].starts_with("```\na"), "{chunks:?}");
        assert_eq!(rejoin(&chunks), text);
    }

    #[test]
    fn fence_inside_a_line_is_not_created_by_a_cut() {
        // A cut right before "```" would turn it into a fence line in the next chunk.
        let text = format!("{} ```not a fence``` and more words here", "w".repeat(12));
        let chunks = check(&text, 16);
        for c in &chunks {
            for line in c.split('\n') {
                assert!(
                    !is_fence_like(line) || text.lines().any(|l| l == line),
                    "{chunks:?}"
                );
            }
        }
    }

    #[test]
    fn overlong_fence_line_is_demoted_and_cut_in_its_backticks() {
        let text = format!("```{}\ncode\n```\n", "x".repeat(30));
        let chunks = check(&text, 16);
        assert!(chunks.iter().all(|c| !c.contains("``````")));
        assert_eq!(rejoin(&chunks), text);
    }

    #[test]
    fn overlong_whitespace_is_dropped_not_sent() {
        let text = format!("a{}b", " ".repeat(100));
        let chunks = check(&text, 16);
        assert_eq!(rejoin(&chunks).replace(' ', ""), "ab");
        // The cut moves back so that the trailing whitespace has a character to travel with.
        let text = format!("{}{}", "x".repeat(16), "\n".repeat(40));
        let chunks = check(&text, 16);
        assert_eq!(chunks.len(), 2);
        assert_eq!(rejoin(&chunks).trim_end(), "x".repeat(16));
    }

    #[test]
    fn rejoin_of_a_long_reply_is_the_reply() {
        let para = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. Sed do eiusmod \
                    tempor incididunt ut labore et dolore magna aliqua. ";
        let mut text = String::new();
        while text.len() < 9000 {
            text.push_str(para);
            text.push_str("\n\n");
        }
        let chunks = check(text.trim_end(), 4096);
        assert!(chunks.len() >= 3);
        assert_eq!(chunks.concat(), text.trim_end());
    }

    #[test]
    fn regressions_found_by_proptest() {
        // Leading whitespace before a fence at a tiny limit.
        check("  \n```rust\n \n```\n", 16);
        // A demoted 7-backtick line must not leave a fence-like fragment for the last chunk.
        let chunks = check("0\n```````\n \n\n```\n```\n0aaaa0AaaAAAaaA", 30);
        assert!(chunks.iter().all(|c| !c.starts_with("```\n")), "{chunks:?}");
    }

    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            6 => "[a-zA-Z0-9]{1,12}",
            4 => Just(" ".to_owned()),
            3 => Just("\n".to_owned()),
            2 => Just("\n\n".to_owned()),
            2 => prop_oneof![Just(". "), Just("! "), Just("? "), Just(", ")].prop_map(str::to_owned),
            2 => prop_oneof![
                Just("é"), Just("日本語の文章。"), Just("中文"), Just("😀"), Just("👍🏽"),
                Just("👨\u{200D}👩\u{200D}👧"), Just("🇩🇪🇫🇷"), Just("e\u{301}"), Just("❤\u{FE0F}"),
                Just("\t"), Just("\r\n"), Just("\u{a0}")
            ].prop_map(str::to_owned),
            2 => prop_oneof![
                Just("```\n"), Just("```rust\n"), Just("\n```\n"), Just("````\n"), Just("```python\n"),
                Just("  ```\n"), Just("```"), Just("`"), Just("`code`"), Just("**"), Just("_"),
                Just("> "), Just("- "), Just("# ")
            ].prop_map(str::to_owned),
            1 => "[a-z]{20,150}",
            1 => any::<char>().prop_map(String::from),
            1 => " {1,6}",
        ]
    }

    fn text() -> impl Strategy<Value = String> {
        prop::collection::vec(piece(), 0..120).prop_map(|v| v.concat())
    }

    fn limit() -> impl Strategy<Value = usize> {
        prop_oneof![4 => 16usize..64, 3 => 64usize..512, 1 => 512usize..=4096]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(600))]

        #[test]
        fn split_properties(text in text(), limit in limit()) {
            check(&text, limit);
        }

        #[test]
        fn split_properties_code_heavy(
            blocks in prop::collection::vec(
                ("[a-z ]{0,30}", prop_oneof![Just("```"), Just("```rust"), Just("````sh")],
                 prop::collection::vec("[ -~]{0,70}", 0..12)),
                1..6),
            limit in 16usize..300,
        ) {
            let mut text = String::new();
            for (prose, open, lines) in &blocks {
                text.push_str(prose);
                text.push('\n');
                text.push_str(open);
                text.push('\n');
                for l in lines {
                    text.push_str(l);
                    text.push('\n');
                }
                text.push_str(&"`".repeat(open.bytes().take_while(|&b| b == b'`').count()));
                text.push('\n');
            }
            check(&text, limit);
        }
    }
}
