//! Today's HTML-to-text converter (src/net/html.rs) against `html2text` and `htmd` on the real
//! pages in tests/fixtures/html, each decoded first by the daemon's `decode_body` (the charset
//! of its `<meta>`). Prints per page and converter: the hand-picked key phrases found, the noise
//! left (script/style/navigation residue, tags and entities left as text), Markdown syntax
//! added, output size and time per page. Build with `--release` for the times.
#![allow(dead_code)]

#[path = "../../../../src/net/html.rs"]
mod html;

use std::time::Instant;

/// Runs per page and converter for the time.
const RUNS: u32 = 20;

struct Page {
    file: &'static str,
    /// Text a reader of the page needs: prose, table cells, `<pre>` code, an accented name.
    key: &'static [&'static str],
    /// Text that only script, style or navigation carry.
    noise: &'static [&'static str],
}

const PAGES: &[Page] = &[
    Page {
        file: "libxslt-python-latin1.html",
        key: &[
            "Python and bindings",
            "St\u{e9}phane Bidoul maintains a Windows port of the Python bindings",
            "The libxslt Python module depends on the libxml2 Python module",
            "python setup.py build install",
            "Matt Sergeant developped XML::LibXML and XML::LibXSLT",
            "python/generator.py",
            "import libxml2",
            "styledoc = libxml2.parseFile",
        ],
        noise: &[
            "font-family",
            "margin-top",
            "Main Menu",
            "Related links",
            "Windows binaries",
            "API Indexes",
        ],
    },
    Page {
        file: "zlib-how-unclosed.html",
        key: &[
            "zlib Usage Example",
            "We often get questions about how the deflate() and inflate() functions should be used",
            "#define CHUNK 16384",
            "if (ret != Z_OK)",
            "strm.avail_in",
            "Z_STREAM_END",
            "Copyright (c) 2004, 2005 by Mark Adler",
        ],
        noise: &[],
    },
    Page {
        file: "bs4-doc-sphinx.html",
        key: &[
            "Beautiful Soup Documentation",
            "pip install beautifulsoup4",
            "soup.find_all('a')",
            "print(soup.prettify())",
            "NavigableString",
            "Kinds of objects",
            "html.parser",
            "Python\u{2019}s html.parser",
        ],
        noise: &[
            "getElementById",
            "style.display",
            "Quick search",
            "Show Source",
            "Navigation",
            "Table of Contents",
        ],
    },
];

type Convert = fn(&str) -> String;

fn today(html: &str) -> String {
    html::html_to_text(html)
}

fn html2text(html: &str) -> String {
    html2text::from_read(html.as_bytes(), 120).unwrap_or_default()
}

fn htmd(html: &str) -> String {
    htmd::convert(html).unwrap_or_default()
}

fn main() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/html");
    let converters: [(&str, Convert); 3] = [
        ("today", today),
        ("html2text 0.17", html2text),
        ("htmd 0.5", htmd),
    ];
    println!(
        "| page | converter | key phrases found | script/style/nav residue | tags, entities left | Markdown syntax | output chars | ms per page |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let mut missing = Vec::new();
    for page in PAGES {
        let bytes = std::fs::read(dir.join(page.file)).unwrap();
        let decoded = html::decode_body(&bytes, Some("text/html"), true);
        for (name, convert) in converters {
            let out = convert(&decoded);
            let start = Instant::now();
            for _ in 0..RUNS {
                std::hint::black_box(convert(std::hint::black_box(&decoded)));
            }
            let ms = start.elapsed().as_secs_f64() * 1000.0 / f64::from(RUNS);
            let flat = collapse(&out);
            let found: Vec<&&str> = page
                .key
                .iter()
                .filter(|k| flat.contains(&collapse(k)))
                .collect();
            for k in page.key.iter().filter(|k| !found.contains(k)) {
                missing.push(format!("{} / {name}: {k:?}", page.file));
            }
            let residue = page.noise.iter().filter(|n| flat.contains(*n)).count();
            println!(
                "| {} | {name} | {}/{} | {}/{} | {} | {} | {} | {ms:.2} |",
                page.file,
                found.len(),
                page.key.len(),
                residue,
                page.noise.len(),
                leftovers(&out),
                markdown_syntax(&out),
                out.chars().count(),
            );
        }
    }
    println!("\nKey phrases not found:");
    for m in missing {
        println!("- {m}");
    }
}

/// The text a reader sees: link syntax (`](url)`, `][12]`) and `[`, `]`, `*`, `` ` ``, `\`
/// removed, whitespace runs as one space; so a phrase is found whatever the wrapping and
/// whether the converter writes links as Markdown or footnotes.
fn collapse(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(']') {
        out.push_str(&rest[..i]);
        rest = &rest[i + 1..];
        let close = match rest.chars().next() {
            Some('(') => ')',
            Some('[') => ']',
            _ => continue,
        };
        match rest.find(close) {
            Some(end) if !rest[..end].contains(char::is_whitespace) => rest = &rest[end + 1..],
            _ => {}
        }
    }
    out.push_str(rest);
    out.replace(['[', '*', '`', '\\'], "")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// HTML tags and entities left in the text: `<tag`, `</tag`, `&name;`, `&#n;`.
fn leftovers(s: &str) -> usize {
    const TAGS: &[&str] = &[
        "a", "b", "i", "p", "br", "div", "span", "td", "tr", "th", "table", "pre", "code", "tt",
        "font", "img", "meta", "li", "ul", "ol", "h1", "h2", "h3", "script", "style", "link",
    ];
    let mut n = 0;
    for (i, _) in s.match_indices('<') {
        let rest = s[i + 1..].trim_start_matches('/');
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect::<String>()
            .to_ascii_lowercase();
        if TAGS.contains(&name.as_str()) && rest[name.len()..].starts_with([' ', '>', '/']) {
            n += 1;
        }
    }
    for (i, _) in s.match_indices('&') {
        let rest = &s[i + 1..];
        let body: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '#')
            .collect();
        if !body.is_empty() && rest[body.len()..].starts_with(';') {
            n += 1;
        }
    }
    n
}

/// Markdown syntax a converter adds: `**`, `](`, code fences, `#` headings, table rules.
fn markdown_syntax(s: &str) -> usize {
    s.matches("**").count()
        + s.matches("](").count()
        + s.matches("```").count()
        + s.lines()
            .filter(|l| l.starts_with('#') && l.contains("# "))
            .count()
        + s.lines()
            .filter(|l| l.contains("---|") || l.contains("|---"))
            .count()
}
