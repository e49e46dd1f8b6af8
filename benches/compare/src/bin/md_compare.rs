//! Today's Markdown parser (src/channels/telegram/format.rs) against a pulldown-cmark parser
//! feeding the same Telegram HTML rules (allowed tags, escaping, allowed link schemes), on the
//! corpus in tests/fixtures/markdown, cut by the daemon's splitter at Telegram's limit. Prints
//! per file: visible text kept, tags produced, markup left as literal text, well-formedness,
//! and the lines where the two differ. docs/BENCHMARKS.md has the table and the verdict.
#![allow(dead_code)]

#[path = "../../../../src/channels/telegram/split.rs"]
mod split;
// `format` reads fences with `super::split`, which is `crate::split` here.
#[path = "../../../../src/channels/telegram/format.rs"]
mod format;

use std::collections::BTreeMap;

use pulldown_cmark::{CodeBlockKind, Event, LinkType, Options, Parser, Tag, TagEnd};

const LIMIT: usize = 4096;

fn main() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/markdown");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md") && !p.ends_with("README.md"))
        .collect();
    files.sort();
    println!(
        "| file | input | visible today / pulldown | tags today | tags pulldown | literal markup today / pulldown | well formed, never longer: today / pulldown | lines differing |"
    );
    println!("|---|---:|---:|---|---|---:|---|---:|");
    let mut examples = Vec::new();
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let md = std::fs::read_to_string(path).unwrap();
        let chunks = split::split_message(&md, LIMIT);
        let today: Vec<String> = chunks.iter().map(|c| format::markdown_to_html(c)).collect();
        let pulled: Vec<String> = chunks.iter().map(|c| pulldown_html(c)).collect();
        let input = split::utf16_len(&md);
        let (vt, vp) = (visible_all(&today), visible_all(&pulled));
        let ok = |htmls: &[String]| {
            htmls
                .iter()
                .zip(&chunks)
                .all(|(h, c)| check(h).is_ok_and(|v| split::utf16_len(&v) <= split::utf16_len(c)))
        };
        let lines_t: Vec<&str> = vt
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let lines_p: Vec<&str> = vp
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let only_t: Vec<&&str> = lines_t.iter().filter(|l| !lines_p.contains(l)).collect();
        let only_p: Vec<&&str> = lines_p.iter().filter(|l| !lines_t.contains(l)).collect();
        println!(
            "| {name} | {input} | {} / {} | {} | {} | {} / {} | {} / {} | {} |",
            split::utf16_len(&vt),
            split::utf16_len(&vp),
            tags(&today),
            tags(&pulled),
            literal_markup(&vt),
            literal_markup(&vp),
            yes(ok(&today)),
            yes(ok(&pulled)),
            only_t.len().max(only_p.len()),
        );
        for (t, p) in only_t.iter().zip(&only_p).take(4) {
            examples.push(format!("{name}\n  today:    {t}\n  pulldown: {p}"));
        }
    }
    println!("\nThe deliberate rules (SPEC §10.3), HTML of each:\n");
    for probe in [
        "2*3*4 = 24 and a * b * c",
        "snake_case_name and __init__",
        "Steps:\n\n    indented continuation line",
        "see https://example.com/a_b for more",
        "[text](javascript:alert(1))",
    ] {
        println!(
            "{probe:?}\n  today:    {:?}\n  pulldown: {:?}",
            format::markdown_to_html(probe),
            pulldown_html(probe)
        );
    }
    println!("\nExamples of differing lines (visible text):\n");
    for e in examples {
        println!("{e}");
    }
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "NO" }
}

/// Opening tags by name, e.g. `a 3, b 12`.
fn tags(htmls: &[String]) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for h in htmls {
        for part in h.split('<').skip(1) {
            if part.starts_with('/') {
                continue;
            }
            let name: String = part
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            *counts.entry(name).or_default() += 1;
        }
    }
    counts
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Markdown syntax left as visible text outside code: `**`, `__`, `](`, `~~`, `` ` ``, `|---`.
fn literal_markup(visible: &str) -> usize {
    ["**", "__", "](", "~~", "`", "|---", "|:--", "---|"]
        .iter()
        .map(|m| visible.matches(m).count())
        .sum()
}

fn visible_all(htmls: &[String]) -> String {
    htmls
        .iter()
        .map(|h| check(h).unwrap_or_else(|e| format!("<<{e}>>")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Telegram's reading of the HTML: tags from its list, properly nested, entities `&lt; &gt;
/// &amp; &quot;`; the visible text, or why it would be rejected.
fn check(html: &str) -> Result<String, String> {
    const ALLOWED: &[&str] = &["b", "i", "s", "u", "a", "code", "pre", "blockquote"];
    let mut out = String::new();
    let mut stack: Vec<String> = Vec::new();
    let mut rest = html;
    while let Some(i) = rest.find(['<', '&']) {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        if let Some(after) = rest.strip_prefix('<') {
            let end = after.find('>').ok_or("unclosed tag")?;
            let tag = &after[..end];
            rest = &after[end + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                if stack.pop().as_deref() != Some(name) {
                    return Err(format!("unexpected </{name}>"));
                }
            } else {
                let name: String = tag
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric())
                    .collect();
                if !ALLOWED.contains(&name.as_str()) {
                    return Err(format!("tag <{name}> not allowed"));
                }
                stack.push(name);
            }
        } else {
            let end = rest.find(';').ok_or("bare &")?;
            out.push(match &rest[..=end] {
                "&lt;" => '<',
                "&gt;" => '>',
                "&amp;" => '&',
                "&quot;" => '"',
                e => return Err(format!("unknown entity {e}")),
            });
            rest = &rest[end + 1..];
        }
    }
    out.push_str(rest);
    match stack.last() {
        Some(open) => Err(format!("<{open}> never closed")),
        None => Ok(out),
    }
}

fn escape(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
}

/// The same link rule as format.rs: only http, https, tg and mailto, no whitespace.
fn allowed_url(url: &str) -> bool {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    ["http://", "https://", "tg://", "mailto:"]
        .iter()
        .find(|s| lower.starts_with(*s))
        .is_some_and(|s| url.len() > s.len())
        && !url.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// CommonMark + GFM tables and strikethrough (pulldown-cmark) to the same Telegram subset:
/// `**`→`<b>`, `*`→`<i>`, `~~`→`<s>`, code spans and blocks as today, headings bold, quotes
/// as `<blockquote>`, list items `• ` / `N. `, table rows as `a | b`, images as their alt text,
/// raw HTML as escaped text. Code inside another entity loses `<code>` (Telegram forbids it).
fn pulldown_html(md: &str) -> String {
    let opts = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH;
    let mut out = String::new();
    let mut inline: Vec<&'static str> = Vec::new();
    let mut lists: Vec<Option<u64>> = Vec::new();
    let mut in_code = false;
    let mut image = 0usize;
    let mut cell = 0usize;
    // Right after a list item's bullet: its first paragraph stays on the bullet's line.
    let mut item_start = false;
    let newline = |out: &mut String| {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
    };
    for event in Parser::new_ext(md, opts) {
        let was_item_start = std::mem::take(&mut item_start);
        match event {
            Event::Start(tag) => match tag {
                Tag::Paragraph => {
                    item_start = was_item_start;
                    if !was_item_start {
                        newline(&mut out);
                    }
                }
                Tag::Heading { .. } => {
                    newline(&mut out);
                    out.push_str("<b>");
                    inline.push("b");
                }
                Tag::BlockQuote(_) => {
                    newline(&mut out);
                    if !inline.contains(&"blockquote") {
                        out.push_str("<blockquote>");
                    }
                    inline.push("blockquote");
                }
                Tag::CodeBlock(kind) => {
                    newline(&mut out);
                    in_code = true;
                    match kind {
                        CodeBlockKind::Fenced(lang) if !lang.is_empty() => {
                            let lang: String = lang
                                .split_whitespace()
                                .next()
                                .unwrap_or("")
                                .chars()
                                .filter(|c| c.is_ascii_alphanumeric() || "+-#_.".contains(*c))
                                .collect();
                            out.push_str("<pre><code class=\"language-");
                            out.push_str(&lang);
                            out.push_str("\">");
                            inline.push("precode");
                        }
                        _ => {
                            out.push_str("<pre>");
                            inline.push("pre");
                        }
                    }
                }
                Tag::List(start) => {
                    newline(&mut out);
                    lists.push(start);
                }
                Tag::Item => {
                    newline(&mut out);
                    out.push_str(&"  ".repeat(lists.len().saturating_sub(1)));
                    match lists.last_mut() {
                        Some(Some(n)) => {
                            out.push_str(&format!("{n}. "));
                            *n += 1;
                        }
                        _ => out.push_str("• "),
                    }
                    item_start = true;
                }
                Tag::Table(_) | Tag::TableHead | Tag::TableRow => newline(&mut out),
                Tag::TableCell => {
                    if cell > 0 {
                        out.push_str(" | ");
                    }
                    cell += 1;
                }
                Tag::Emphasis => {
                    out.push_str("<i>");
                    inline.push("i");
                }
                Tag::Strong => {
                    out.push_str("<b>");
                    inline.push("b");
                }
                Tag::Strikethrough => {
                    out.push_str("<s>");
                    inline.push("s");
                }
                Tag::Link {
                    link_type,
                    dest_url,
                    ..
                } => {
                    if allowed_url(&dest_url)
                        && !inline.contains(&"a")
                        && link_type != LinkType::Email
                    {
                        out.push_str("<a href=\"");
                        escape(&mut out, &dest_url.replace('"', "&quot;"));
                        out.push_str("\">");
                        inline.push("a");
                    } else {
                        inline.push("");
                    }
                }
                Tag::Image { .. } => image += 1,
                _ => {}
            },
            Event::End(end) => match end {
                TagEnd::Paragraph => out.push('\n'),
                TagEnd::Heading(_)
                | TagEnd::Emphasis
                | TagEnd::Strong
                | TagEnd::Strikethrough
                | TagEnd::Link => {
                    if let Some(t) = inline.pop().filter(|t| !t.is_empty()) {
                        out.push_str(&format!("</{t}>"));
                    }
                    if matches!(end, TagEnd::Heading(_)) {
                        out.push('\n');
                    }
                }
                TagEnd::BlockQuote(_) => {
                    inline.pop();
                    if !inline.contains(&"blockquote") {
                        while out.ends_with('\n') {
                            out.pop();
                        }
                        out.push_str("</blockquote>\n");
                    }
                }
                TagEnd::CodeBlock => {
                    in_code = false;
                    while out.ends_with('\n') {
                        out.pop();
                    }
                    match inline.pop() {
                        Some("precode") => out.push_str("</code></pre>\n"),
                        _ => out.push_str("</pre>\n"),
                    }
                }
                TagEnd::List(_) => {
                    lists.pop();
                }
                TagEnd::TableHead | TagEnd::TableRow => cell = 0,
                TagEnd::Table => out.push('\n'),
                TagEnd::Image => image -= 1,
                _ => {}
            },
            Event::Text(t) => escape(&mut out, &t),
            Event::Code(c) => {
                if inline.iter().any(|t| !t.is_empty() && *t != "blockquote") || image > 0 {
                    escape(&mut out, &c);
                } else {
                    out.push_str("<code>");
                    escape(&mut out, &c);
                    out.push_str("</code>");
                }
            }
            Event::Html(h) | Event::InlineHtml(h) => escape(&mut out, &h),
            Event::SoftBreak | Event::HardBreak => out.push('\n'),
            Event::Rule => {
                newline(&mut out);
                out.push_str("———\n");
            }
            Event::TaskListMarker(done) => out.push_str(if done { "[x] " } else { "[ ] " }),
            _ => {}
        }
    }
    let _ = in_code;
    while out.ends_with('\n') {
        out.pop();
    }
    out
}
