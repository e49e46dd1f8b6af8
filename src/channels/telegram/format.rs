//! Markdown → Telegram HTML (SPEC §10.3 `format = "html"`), and the plain-text fallback used
//! for `format = "plain"` and when Telegram rejects a chunk's HTML.
//!
//! Both run on one chunk at a time, after [`super::split`] has cut the reply, so a chunk is
//! read on its own: its fences are balanced by the splitter, and an unclosed block (only in a
//! reply whose Markdown is itself unclosed) is closed at the chunk's end. Fence lines are read
//! with the splitter's own rules, so the two always agree on what is code.
//!
//! What is rendered (everything else is escaped text):
//!
//! | Markdown | HTML |
//! |---|---|
//! | ```` ```lang ```` … ```` ``` ```` | `<pre><code class="language-lang">…</code></pre>` (`<pre>` without a language) |
//! | `` `code` `` | `<code>code</code>` (nothing rendered inside) |
//! | `**b**`, `__b__` / `*i*`, `_i_` / `***bi***` / `~~s~~` | `<b>` / `<i>` / `<b><i>` / `<s>` |
//! | `[text](url)`, `![alt](url)`, `<url>` | `<a href="url">text</a>`, or the url as text; only `http`, `https`, `tg` and `mailto` URLs, anything else stays literal text |
//! | `# heading` (1–6 `#`) | `<b>heading</b>` |
//! | `> quote` lines | one `<blockquote>` |
//! | `- item`, `* item`, `+ item` | `• item` |
//!
//! Emphasis markers open only when not preceded by a letter or digit and followed by a
//! non-space, and close only when preceded by a non-space and not followed by a letter or
//! digit, so `snake_case_name`, `2*3*4` and `a * b * c` stay literal. Opening and closing runs
//! must have the same length; unmatched markers are literal. Inline formatting does not span
//! lines. Telegram forbids `code` inside other entities, so formatting around an inline code
//! span is closed before it and reopened after it; inside a link or a quote the span's text is
//! kept without `<code>`. The output is always well formed: every tag is one of the allowed
//! ones and is closed, properly nested; `&`, `<`, `>` (and `"` in `href`) are escaped
//! everywhere else. Text never gets longer: the visible text of the HTML (and the plain
//! rendering) has at most as many UTF-16 units as the input, so a chunk that fits the limit
//! still fits after rendering.

use super::split::{fence_closes, fence_opener};

/// Deepest nesting of inline formatting that is rendered; deeper markers stay literal.
const MAX_DEPTH: usize = 16;

/// Render Markdown as the HTML subset Telegram accepts (`parse_mode = HTML`).
pub fn markdown_to_html(md: &str) -> String {
    Renderer::new(Mode::Html).render(md)
}

/// Render Markdown as plain text: fence lines, emphasis and code markers and heading `#`s are
/// removed, code keeps its content, links become `text (url)`, bullets become `•`, quote
/// markers stay. Used for `format = "plain"` and when Telegram rejects a chunk's HTML.
pub fn strip_to_plain(md: &str) -> String {
    Renderer::new(Mode::Plain).render(md)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Html,
    Plain,
}

struct CodeBlock {
    ticks: usize,
    indent: usize,
    close: &'static str,
    first_line: bool,
}

/// The line-level pass: code blocks, quotes, headings, bullets; inline text goes to [`Inline`].
struct Renderer {
    mode: Mode,
    out: String,
    items: usize,
    code: Option<CodeBlock>,
    quote: bool,
}

impl Renderer {
    fn new(mode: Mode) -> Self {
        Renderer {
            mode,
            out: String::new(),
            items: 0,
            code: None,
            quote: false,
        }
    }

    fn render(mut self, md: &str) -> String {
        self.out.reserve(md.len() + md.len() / 8);
        for line in md.split('\n') {
            self.line(line);
        }
        self.end_code();
        self.end_quote();
        self.out
    }

    /// Start an output item (a line, a code block or a quote), separated by a line break.
    fn begin_item(&mut self) {
        if self.items > 0 {
            self.out.push('\n');
        }
        self.items += 1;
    }

    fn text(&mut self, s: &str) {
        push_text(&mut self.out, self.mode, s);
    }

    fn end_code(&mut self) {
        if let Some(code) = self.code.take() {
            self.out.push_str(code.close);
        }
    }

    fn end_quote(&mut self) {
        if self.quote {
            self.quote = false;
            if self.mode == Mode::Html {
                self.out.push_str("</blockquote>");
            }
        }
    }

    fn inline(&mut self, s: &str, base: Option<&'static str>, in_quote: bool) {
        let mut inline = Inline::new(s, self.mode, &mut self.out, in_quote);
        if let Some(tag) = base {
            inline.open(tag);
        }
        inline.run(0, s.len());
        if base.is_some() {
            inline.close();
        }
    }

    fn line(&mut self, line: &str) {
        if let Some(code) = &mut self.code {
            if fence_closes(line, code.ticks) {
                self.end_code();
                return;
            }
            if !code.first_line {
                self.out.push('\n');
            }
            code.first_line = false;
            let body = strip_indent(line, code.indent);
            self.text(body);
            return;
        }
        if let Some(fence) = fence_opener(line) {
            self.end_quote();
            self.begin_item();
            let close = match (self.mode, language(fence.info)) {
                (Mode::Plain, _) => "",
                (Mode::Html, Some(lang)) => {
                    self.out.push_str("<pre><code class=\"language-");
                    self.out.push_str(lang);
                    self.out.push_str("\">");
                    "</code></pre>"
                }
                (Mode::Html, None) => {
                    self.out.push_str("<pre>");
                    "</pre>"
                }
            };
            self.code = Some(CodeBlock {
                ticks: fence.ticks,
                indent: fence.indent,
                close,
                first_line: true,
            });
            return;
        }
        if let Some((marker, body)) = quote_line(line) {
            if self.quote {
                self.out.push('\n');
            } else {
                self.begin_item();
                self.quote = true;
                if self.mode == Mode::Html {
                    self.out.push_str("<blockquote>");
                }
            }
            if self.mode == Mode::Plain {
                self.out.push_str(marker);
            }
            self.inline(body, None, true);
            return;
        }
        self.end_quote();
        self.begin_item();
        if let Some(body) = heading(line) {
            self.inline(body, Some("b"), false);
        } else if is_rule(line) {
            self.text(line);
        } else if let Some((indent, body)) = bullet(line) {
            self.text(indent);
            self.out.push_str("• ");
            self.inline(body, None, false);
        } else {
            self.inline(line, None, false);
        }
    }
}

/// Append `s`, escaped for HTML text in [`Mode::Html`].
fn push_text(out: &mut String, mode: Mode, s: &str) {
    if mode == Mode::Plain {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            _ => out.push(c),
        }
    }
}

/// Escape a URL for a double-quoted `href`.
fn push_attr(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            _ => out.push(c),
        }
    }
}

/// Remove up to `n` leading spaces or tabs (a code block's content is indented like its fence).
fn strip_indent(line: &str, n: usize) -> &str {
    let k = line
        .bytes()
        .take(n)
        .take_while(|&b| b == b' ' || b == b'\t')
        .count();
    &line[k..]
}

/// The language of a fence's info string, if its first word is a plausible language name.
fn language(info: &str) -> Option<&str> {
    let word = info.split_whitespace().next()?;
    let ok = word.len() <= 32
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b'#' | b'-' | b'.'));
    ok.then_some(word)
}

/// Up to three spaces of indentation.
fn small_indent(line: &str) -> Option<&str> {
    let rest = line.trim_start_matches(' ');
    (line.len() - rest.len() <= 3).then_some(rest)
}

/// A `> quote` line: the marker (indent, `>` and one optional space) and the body.
fn quote_line(line: &str) -> Option<(&str, &str)> {
    let rest = small_indent(line)?.strip_prefix('>')?;
    let body = rest.strip_prefix(' ').unwrap_or(rest);
    Some((&line[..line.len() - body.len()], body))
}

/// An ATX heading's text: `#`…`######`, a space, the text, an optional closing `#` run.
fn heading(line: &str) -> Option<&str> {
    let rest = small_indent(line)?;
    let level = rest.bytes().take_while(|&b| b == b'#').count();
    if !(1..=6).contains(&level) {
        return None;
    }
    let rest = &rest[level..];
    if !(rest.is_empty() || rest.starts_with([' ', '\t'])) {
        return None;
    }
    let body = rest.trim();
    let without_hashes = body.trim_end_matches('#');
    if without_hashes.is_empty() {
        return Some("");
    }
    if without_hashes.ends_with([' ', '\t']) {
        return Some(without_hashes.trim_end());
    }
    Some(body)
}

/// A thematic break (`---`, `***`, `___`, spaces allowed).
fn is_rule(line: &str) -> bool {
    let Some(rest) = small_indent(line) else {
        return false;
    };
    let mut marks = rest.chars().filter(|c| !matches!(c, ' ' | '\t'));
    let Some(first) = marks.next() else {
        return false;
    };
    matches!(first, '-' | '*' | '_') && marks.clone().all(|c| c == first) && marks.count() >= 2
}

/// A bullet list item: its indentation and its text.
fn bullet(line: &str) -> Option<(&str, &str)> {
    let rest = line.trim_start_matches([' ', '\t']);
    let indent = &line[..line.len() - rest.len()];
    let mut chars = rest.chars();
    let marker = chars.next()?;
    let space = chars.next()?;
    (matches!(marker, '-' | '*' | '+') && matches!(space, ' ' | '\t')).then(|| (indent, &rest[2..]))
}

/// Whether a link target may become an `href`.
fn allowed_url(url: &str) -> bool {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    let scheme_len = ["http://", "https://", "tg://", "mailto:"]
        .iter()
        .find(|s| lower.starts_with(*s))
        .map(|s| s.len());
    scheme_len.is_some_and(|n| url.len() > n)
        && !url.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// A matched `[label](destination)`, as byte ranges into the line.
#[derive(Debug, Clone, Copy)]
struct Link {
    label_start: usize,
    label_end: usize,
    dest_start: usize,
    dest_end: usize,
    end: usize,
}

/// The inline pass over one line. Code spans, links and escapes are matched once up front so
/// that emphasis matching stays quadratic at worst.
struct Inline<'a> {
    s: &'a str,
    mode: Mode,
    out: &'a mut String,
    /// Open inline tags, outermost first: (name, opening tag).
    stack: Vec<(&'static str, String)>,
    in_link: bool,
    in_quote: bool,
    /// The byte is escaped by a preceding backslash.
    escaped: Vec<bool>,
    /// At the start of a code span's opening run: the end of the span (after its closing run).
    code_end: Vec<Option<usize>>,
    /// At a `[` starting a well-formed link.
    links: Vec<Option<Link>>,
}

impl<'a> Inline<'a> {
    fn new(s: &'a str, mode: Mode, out: &'a mut String, in_quote: bool) -> Self {
        let b = s.as_bytes();
        let n = b.len();
        let mut escaped = vec![false; n + 1];
        let mut in_code = vec![false; n + 1];
        let mut code_end = vec![None; n + 1];

        // Backtick runs (unescaped), then pair each opening run with the next run of the same
        // length, as CommonMark does.
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let mut i = 0;
        while i < n {
            if b[i] == b'\\' && i + 1 < n && b[i + 1].is_ascii_punctuation() {
                escaped[i + 1] = true;
                i += 2;
            } else if b[i] == b'`' {
                let k = run_len(b, i, b'`');
                runs.push((i, k));
                i += k;
            } else {
                i += 1;
            }
        }
        let mut next_same = vec![None; runs.len()];
        let mut last_of_len: std::collections::HashMap<usize, usize> = Default::default();
        for r in (0..runs.len()).rev() {
            next_same[r] = last_of_len.get(&runs[r].1).copied();
            last_of_len.insert(runs[r].1, r);
        }
        let mut r = 0;
        while r < runs.len() {
            if let Some(m) = next_same[r] {
                let (start, _) = runs[r];
                let end = runs[m].0 + runs[m].1;
                code_end[start] = Some(end);
                in_code[start..end].fill(true);
                r = m + 1;
            } else {
                r += 1;
            }
        }

        // Brackets and parentheses outside code spans, matched with stacks.
        let live = |i: usize| !escaped[i] && !in_code[i];
        let mut bracket_match = vec![None; n + 1];
        let mut paren_match = vec![None; n + 1];
        let (mut brackets, mut parens) = (Vec::new(), Vec::new());
        for (i, &c) in b.iter().enumerate() {
            if !live(i) {
                continue;
            }
            match c {
                b'[' => brackets.push(i),
                b']' => {
                    if let Some(o) = brackets.pop() {
                        bracket_match[o] = Some(i);
                    }
                }
                b'(' => parens.push(i),
                b')' => {
                    if let Some(o) = parens.pop() {
                        paren_match[o] = Some(i);
                    }
                }
                _ => {}
            }
        }
        let mut links = vec![None; n + 1];
        for i in 0..n {
            if let Some(close) = bracket_match[i]
                && b.get(close + 1) == Some(&b'(')
                && let Some(paren) = paren_match[close + 1]
            {
                links[i] = Some(Link {
                    label_start: i + 1,
                    label_end: close,
                    dest_start: close + 2,
                    dest_end: paren,
                    end: paren + 1,
                });
            }
        }

        Inline {
            s,
            mode,
            out,
            stack: Vec::new(),
            in_link: false,
            in_quote,
            escaped,
            code_end,
            links,
        }
    }

    fn html(&self) -> bool {
        self.mode == Mode::Html
    }

    fn text(&mut self, s: &str) {
        push_text(self.out, self.mode, s);
    }

    /// Open `name`, or only record it when it is already open (Telegram gains nothing from
    /// bold inside bold).
    fn open(&mut self, name: &'static str) {
        let tag = if self.stack.iter().any(|(n, _)| *n == name) {
            String::new()
        } else {
            format!("<{name}>")
        };
        self.open_with(name, tag);
    }

    fn open_with(&mut self, name: &'static str, tag: String) {
        if self.html() {
            self.out.push_str(&tag);
        }
        self.stack.push((name, tag));
    }

    /// Close the innermost tag; an element left empty is removed instead.
    fn close(&mut self) {
        if let Some((name, tag)) = self.stack.pop() {
            self.close_tag(name, &tag);
        }
    }

    fn close_tag(&mut self, name: &str, tag: &str) {
        if !self.html() || tag.is_empty() {
            return;
        }
        if self.out.ends_with(tag) {
            self.out.truncate(self.out.len() - tag.len());
        } else {
            self.out.push_str("</");
            self.out.push_str(name);
            self.out.push('>');
        }
    }

    fn code_span(&mut self, content: &str) {
        // CommonMark: one space is stripped from each side when both are there.
        let content = match content.strip_prefix(' ').and_then(|c| c.strip_suffix(' ')) {
            Some(inner) if !content.trim().is_empty() => inner,
            _ => content,
        };
        if !self.html() || self.in_link || self.in_quote {
            self.text(content);
            return;
        }
        let stack = std::mem::take(&mut self.stack);
        for (name, tag) in stack.iter().rev() {
            self.close_tag(name, tag);
        }
        self.out.push_str("<code>");
        self.text(content);
        self.out.push_str("</code>");
        for (_, tag) in &stack {
            self.out.push_str(tag);
        }
        self.stack = stack;
    }

    /// Render `s[from..to]`.
    fn run(&mut self, from: usize, to: usize) {
        let s = self.s;
        let b = s.as_bytes();
        let mut i = from;
        while i < to {
            let c = b[i];
            if c == b'\\' && i + 1 < to && b[i + 1].is_ascii_punctuation() {
                self.text(&s[i + 1..i + 2]);
                i += 2;
                continue;
            }
            match c {
                b'`' => {
                    let k = run_len(b, i, b'`');
                    match self.code_end[i] {
                        Some(end) if end <= to => {
                            self.code_span(&s[i + k..end - k]);
                            i = end;
                        }
                        _ => {
                            self.text(&s[i..i + k]);
                            i += k;
                        }
                    }
                }
                b'!' if i + 1 < to && b[i + 1] == b'[' => match self.link_at(i + 1, to) {
                    Some(link) => i = self.link(i, link),
                    None => {
                        self.text("!");
                        i += 1;
                    }
                },
                b'[' => match self.link_at(i, to) {
                    Some(link) => i = self.link(i, link),
                    None => {
                        self.text("[");
                        i += 1;
                    }
                },
                b'<' => i = self.autolink(i, to),
                b'*' | b'_' | b'~' => i = self.emphasis(i, to),
                _ => {
                    let len = s[i..].chars().next().map_or(1, char::len_utf8);
                    self.text(&s[i..i + len]);
                    i += len;
                }
            }
        }
    }

    fn link_at(&self, i: usize, to: usize) -> Option<Link> {
        self.links[i].filter(|l| l.end <= to)
    }

    /// Render a link starting at `start` (its `[` or the `!` of an image); returns its end.
    fn link(&mut self, start: usize, link: Link) -> usize {
        let s = self.s;
        let dest = s[link.dest_start..link.dest_end].trim();
        let url = match dest.strip_prefix('<').and_then(|d| d.strip_suffix('>')) {
            Some(inner) => inner,
            None => dest.split_whitespace().next().unwrap_or(""),
        };
        if self.in_link || !allowed_url(url) || self.stack.len() >= MAX_DEPTH {
            self.text(&s[start..link.end]);
            return link.end;
        }
        let label = &s[link.label_start..link.label_end];
        self.in_link = true;
        let mut tag = String::from("<a href=\"");
        push_attr(&mut tag, url);
        tag.push_str("\">");
        self.open_with("a", tag);
        if label.trim().is_empty() {
            self.text(url);
        } else {
            self.run(link.label_start, link.label_end);
        }
        self.close();
        self.in_link = false;
        if !self.html() && !label.trim().is_empty() && label.trim() != url {
            self.out.push_str(" (");
            self.out.push_str(url);
            self.out.push(')');
        }
        link.end
    }

    /// `<url>`: the URL as text (Telegram links it); any other `<` is escaped text.
    fn autolink(&mut self, i: usize, to: usize) -> usize {
        let s = self.s;
        let rest = &s[i + 1..to];
        if let Some(k) = rest.find(['>', '<', ' ', '\t'])
            && rest.as_bytes()[k] == b'>'
            && allowed_url(&rest[..k])
        {
            self.text(&rest[..k]);
            return i + 1 + k + 1;
        }
        self.text("<");
        i + 1
    }

    /// A run of `*`, `_` or `~` at `i`: formatting if it opens and a matching run closes it
    /// before `to`, else literal. Returns where rendering continues.
    fn emphasis(&mut self, i: usize, to: usize) -> usize {
        let s = self.s;
        let b = s.as_bytes();
        let c = b[i];
        let l = run_len(&b[..to], i, c);
        let tags: &[&'static str] = match (c, l) {
            (b'~', 2) => &["s"],
            (b'~', _) => &[],
            (_, 1) => &["i"],
            (_, 2) => &["b"],
            (_, 3) => &["b", "i"],
            _ => &[],
        };
        if tags.is_empty() || self.stack.len() + tags.len() > MAX_DEPTH || !self.can_open(i, l, to)
        {
            self.text(&s[i..i + l]);
            return i + l;
        }
        let Some(j) = self.find_closer(i + l, to, c, l) else {
            self.text(&s[i..i + l]);
            return i + l;
        };
        for tag in tags {
            self.open(tag);
        }
        self.run(i + l, j);
        for _ in tags {
            self.close();
        }
        j + l
    }

    fn can_open(&self, i: usize, l: usize, to: usize) -> bool {
        let prev = self.s[..i].chars().next_back();
        let next = self.s[i + l..to].chars().next();
        prev.is_none_or(|p| !p.is_alphanumeric()) && next.is_some_and(|n| !n.is_whitespace())
    }

    fn can_close(&self, j: usize, l: usize) -> bool {
        let prev = self.s[..j].chars().next_back();
        let next = self.s[j + l..].chars().next();
        prev.is_some_and(|p| !p.is_whitespace()) && next.is_none_or(|n| !n.is_alphanumeric())
    }

    /// The next run of exactly `l` unescaped `c` that can close, outside code spans and links.
    fn find_closer(&self, from: usize, to: usize, c: u8, l: usize) -> Option<usize> {
        let b = self.s.as_bytes();
        let mut j = from;
        while j < to {
            if let Some(end) = self.code_end[j].filter(|&e| e <= to) {
                j = end;
            } else if let Some(link) = self.link_at(j, to) {
                j = link.end;
            } else if b[j] == c && !self.escaped[j] {
                let m = run_len(&b[..to], j, c);
                if m == l && self.can_close(j, m) {
                    return Some(j);
                }
                j += m;
            } else {
                j += 1;
            }
        }
        None
    }
}

/// Length of the run of byte `c` starting at `i`.
fn run_len(b: &[u8], i: usize, c: u8) -> usize {
    b[i..].iter().take_while(|&&x| x == c).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn html(md: &str) -> String {
        markdown_to_html(md)
    }

    /// Check that `out` is well-formed Telegram HTML: only allowed tags, properly nested,
    /// entities only as `&amp;` `&lt;` `&gt;` `&quot;`, no raw `<` or `>` outside tags, no
    /// entity nesting Telegram rejects. Returns the visible text.
    fn check_html(out: &str) -> Result<String, String> {
        let mut stack: Vec<String> = Vec::new();
        let mut visible = String::new();
        let mut rest = out;
        while let Some(c) = rest.chars().next() {
            match c {
                '<' => {
                    let end = rest
                        .find('>')
                        .ok_or_else(|| format!("unclosed tag in {out:?}"))?;
                    let tag = &rest[1..end];
                    rest = &rest[end + 1..];
                    if let Some(name) = tag.strip_prefix('/') {
                        let open = stack
                            .pop()
                            .ok_or_else(|| format!("stray </{name}> in {out:?}"))?;
                        if open != name {
                            return Err(format!("</{name}> closes <{open}> in {out:?}"));
                        }
                        continue;
                    }
                    let name = tag.split(' ').next().unwrap_or("");
                    let attrs_ok = match name {
                        "a" => {
                            tag.starts_with("a href=\"")
                                && tag.ends_with('"')
                                && !tag["a href=\"".len()..tag.len() - 1].contains(['"', '<', '>'])
                        }
                        "code" => {
                            tag == "code"
                                || tag.strip_prefix("code class=\"language-").is_some_and(|l| {
                                    l.strip_suffix('"').is_some_and(|l| {
                                        !l.is_empty()
                                            && l.bytes().all(|b| {
                                                b.is_ascii_alphanumeric() || b"_+#-.".contains(&b)
                                            })
                                    })
                                })
                        }
                        "b" | "i" | "s" | "pre" | "blockquote" => tag == name,
                        _ => false,
                    };
                    if !attrs_ok {
                        return Err(format!("bad tag <{tag}> in {out:?}"));
                    }
                    // Telegram's nesting rules.
                    let inside = |n: &str| stack.iter().any(|s| s == n);
                    let ok = match name {
                        // Inline code stands alone; a language class only right inside <pre>.
                        "code" if tag == "code" => stack.is_empty(),
                        "code" => stack == ["pre"],
                        "pre" => stack.is_empty(),
                        "blockquote" => stack.is_empty(),
                        "a" => !inside("a") && !inside("code") && !inside("pre"),
                        _ => !inside("code") && !inside("pre"),
                    };
                    if !ok {
                        return Err(format!("<{tag}> inside {stack:?} in {out:?}"));
                    }
                    stack.push(name.to_owned());
                }
                '>' => return Err(format!("raw > in {out:?}")),
                '&' => {
                    let (ent, ch) = [
                        ("&amp;", '&'),
                        ("&lt;", '<'),
                        ("&gt;", '>'),
                        ("&quot;", '"'),
                    ]
                    .into_iter()
                    .find(|(e, _)| rest.starts_with(e))
                    .ok_or_else(|| format!("bare & in {out:?}"))?;
                    visible.push(ch);
                    rest = &rest[ent.len()..];
                }
                _ => {
                    visible.push(c);
                    rest = &rest[c.len_utf8()..];
                }
            }
        }
        if !stack.is_empty() {
            return Err(format!("unclosed {stack:?} in {out:?}"));
        }
        Ok(visible)
    }

    #[test]
    fn emphasis_and_escaping() {
        assert_eq!(html("**bold** and __bold__"), "<b>bold</b> and <b>bold</b>");
        assert_eq!(html("*it* and _it_"), "<i>it</i> and <i>it</i>");
        assert_eq!(
            html("***both*** ~~gone~~"),
            "<b><i>both</i></b> <s>gone</s>"
        );
        assert_eq!(html("a < b && c > d"), "a &lt; b &amp;&amp; c &gt; d");
        assert_eq!(
            html("**bold *italic* bold**"),
            "<b>bold <i>italic</i> bold</b>"
        );
        assert_eq!(html(r"\*not italic\*"), "*not italic*");
    }

    #[test]
    fn intraword_markers_stay_literal() {
        assert_eq!(html("snake_case_name"), "snake_case_name");
        assert_eq!(html("2*3*4 = 24"), "2*3*4 = 24");
        assert_eq!(html("a * b * c"), "a * b * c");
        assert_eq!(html("**unclosed"), "**unclosed");
        assert_eq!(html("*a **b"), "*a **b");
        assert_eq!(html("my_var and _x_"), "my_var and <i>x</i>");
    }

    #[test]
    fn inline_code_is_verbatim_and_outside_other_entities() {
        assert_eq!(
            html("use `a*b*c <x>` now"),
            "use <code>a*b*c &lt;x&gt;</code> now"
        );
        assert_eq!(html("``a ` b``"), "<code>a ` b</code>");
        assert_eq!(
            html("**see `x` here**"),
            "<b>see </b><code>x</code><b> here</b>"
        );
        assert_eq!(html("**`x`**"), "<code>x</code>");
        assert_eq!(html("`unclosed"), "`unclosed");
    }

    #[test]
    fn code_blocks() {
        assert_eq!(
            html("Run:\n```rust\nfn main() { a < b }\n```\nDone."),
            "Run:\n<pre><code class=\"language-rust\">fn main() { a &lt; b }</code></pre>\nDone."
        );
        assert_eq!(html("```\n**x**\n```"), "<pre>**x**</pre>");
        // Unclosed at the end of a chunk: closed anyway.
        assert_eq!(
            html("```py\nx = 1"),
            "<pre><code class=\"language-py\">x = 1</code></pre>"
        );
        // A fence with a strange info string gets no class.
        assert_eq!(html("```a\"b\nx\n```"), "<pre>x</pre>");
        assert_eq!(html("  ```\n  indented\n  ```"), "<pre>indented</pre>");
    }

    #[test]
    fn links() {
        assert_eq!(
            html("[docs](https://example.com/a?b=1&c=\"2\")"),
            "<a href=\"https://example.com/a?b=1&amp;c=&quot;2&quot;\">docs</a>"
        );
        assert_eq!(
            html("[**b**](http://x.y)"),
            "<a href=\"http://x.y\"><b>b</b></a>"
        );
        assert_eq!(html("[x](javascript:alert(1))"), "[x](javascript:alert(1))");
        assert_eq!(html("[x](./rel.md)"), "[x](./rel.md)");
        assert_eq!(
            html("[`c`](tg://user?id=1)"),
            "<a href=\"tg://user?id=1\">c</a>"
        );
        assert_eq!(html("<https://a.b/c>"), "https://a.b/c");
        assert_eq!(
            html("![alt](https://i.png)"),
            "<a href=\"https://i.png\">alt</a>"
        );
        assert_eq!(
            html("[f(x)](https://w.org/f_(x))"),
            "<a href=\"https://w.org/f_(x)\">f(x)</a>"
        );
    }

    #[test]
    fn headings_quotes_bullets() {
        assert_eq!(html("# Title\n## Sub ##"), "<b>Title</b>\n<b>Sub</b>");
        assert_eq!(html("#hashtag"), "#hashtag");
        assert_eq!(html("# `code` title"), "<code>code</code><b> title</b>");
        assert_eq!(
            html("> one\n> **two** `c`\nafter"),
            "<blockquote>one\n<b>two</b> c</blockquote>\nafter"
        );
        assert_eq!(html("- a\n  * b\n+ c"), "• a\n  • b\n• c");
        assert_eq!(html("---\n***"), "---\n***");
    }

    #[test]
    fn plain_fallback() {
        let md =
            "# Title\n**bold** _it_ `code`\n```rust\nlet x = 1;\n```\n- [site](https://a.b)\n> q";
        assert_eq!(
            strip_to_plain(md),
            "Title\nbold it code\nlet x = 1;\n• site (https://a.b)\n> q"
        );
        assert_eq!(
            strip_to_plain("snake_case 2*3*4 a < b"),
            "snake_case 2*3*4 a < b"
        );
        assert_eq!(strip_to_plain("[x](ftp://y)"), "[x](ftp://y)");
    }

    #[test]
    fn chunks_from_the_splitter_render_well_formed() {
        let code: String = (0..40)
            .map(|i| format!("let v{i} = \"<{i}>\";\n"))
            .collect();
        let md = format!("Some **intro** text.\n\n```rust\n{code}```\nAnd _after_.");
        let chunks = super::super::split::split_message(&md, 200);
        assert!(chunks.len() > 2);
        for (i, chunk) in chunks.iter().enumerate() {
            let out = html(chunk);
            check_html(&out).unwrap();
            if i > 0 && i + 1 < chunks.len() {
                // A reopened block keeps its language.
                assert!(
                    out.starts_with("<pre><code class=\"language-rust\">let v"),
                    "{out}"
                );
            }
        }
    }

    fn md_text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            4 => "[a-z0-9]{1,6}",
            3 => prop_oneof![Just(" "), Just("\n"), Just("\n\n")].prop_map(str::to_owned),
            6 => prop::sample::select(vec![
                "*", "**", "***", "_", "__", "~~", "`", "``", "```", "```rust\n", "\n```\n", "[", "]",
                "(", ")", "](", "](https://x.y/?a=1&b=\"2\")", "](ftp://z)", "<", ">", "&", "\"",
                "\\", "\\*", "!", "# ", "## ", "> ", "- ", "* ", "+ ", "---", "<https://a.b>",
                "tg://u", "mailto:x@y", "é", "😀", "日本", "\t", "  ",
            ])
            .prop_map(str::to_owned),
            1 => any::<char>().prop_map(String::from),
        ];
        prop::collection::vec(piece, 0..80).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn html_is_always_well_formed(md in md_text()) {
            let out = markdown_to_html(&md);
            let visible = check_html(&out).map_err(TestCaseError::fail)?;
            let (v, m) = (super::super::split::utf16_len(&visible), super::super::split::utf16_len(&md));
            prop_assert!(v <= m, "visible text grew: {} > {}\n{:?}\n{:?}", v, m, md, out);
        }

        #[test]
        fn plain_is_never_longer(md in md_text()) {
            let out = strip_to_plain(&md);
            let (o, m) = (super::super::split::utf16_len(&out), super::super::split::utf16_len(&md));
            prop_assert!(o <= m, "plain text grew: {} > {}\n{:?}\n{:?}", o, m, md, out);
        }

        #[test]
        fn arbitrary_strings_are_well_formed(md in any::<String>()) {
            check_html(&markdown_to_html(&md)).map_err(TestCaseError::fail)?;
        }
    }
}
