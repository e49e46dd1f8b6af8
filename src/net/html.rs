//! HTML to readable plain text, without an HTML parser crate: good enough for the model to read
//! a page, not a renderer. Drops `script`/`style`/`noscript`/`head`/`template`/`svg` content and
//! comments, turns block tags into line breaks, decodes common entities and collapses
//! whitespace. Kept over `html2text` and `htmd` by measurement (`benches/compare/`, docs/BENCHMARKS.md).
//!
//! [`decode_body`] turns a fetched body into text first, in its declared character set
//! (`encoding_rs`, the WHATWG Encoding Standard's decoders).

use encoding_rs::{Encoding, UTF_8, WINDOWS_1252};

/// How far into a page a `<meta charset>` is looked for (the HTML standard's prescan window).
const META_PRESCAN: usize = 1024;

/// A fetched body as text: decoded with the charset of the `Content-Type` header, else (for
/// HTML) of a `<meta charset>` or `<meta http-equiv="Content-Type">` in its first 1024 bytes,
/// else as UTF-8. A byte-order mark wins over both, as in browsers. Bytes invalid in the
/// charset become U+FFFD; an unknown charset label is read as UTF-8.
pub fn decode_body(body: &[u8], content_type: Option<&str>, html: bool) -> String {
    let declared = content_type
        .and_then(charset_param)
        .and_then(|label| Encoding::for_label(label.as_bytes()))
        .or_else(|| html.then(|| meta_charset(body)).flatten())
        .unwrap_or(UTF_8);
    let (text, _, _) = declared.decode(body);
    text.into_owned()
}

/// The `charset` parameter of a `Content-Type` value, without quotes.
fn charset_param(content_type: &str) -> Option<&str> {
    content_type.split(';').skip(1).find_map(|param| {
        let (key, value) = param.split_once('=')?;
        key.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| value.trim().trim_matches(['"', '\'']))
    })
}

/// The encoding a `<meta>` in the first [`META_PRESCAN`] bytes declares (`charset=` in a
/// `<meta charset>` or in an `http-equiv` content), as the HTML standard maps it: a UTF-16
/// label means UTF-8 (the bytes were read as ASCII to find it), `x-user-defined` windows-1252.
fn meta_charset(body: &[u8]) -> Option<&'static Encoding> {
    let head = &body[..body.len().min(META_PRESCAN)];
    let lower: Vec<u8> = head.iter().map(u8::to_ascii_lowercase).collect();
    let mut from = 0;
    while let Some(at) = find(&lower[from..], b"<meta") {
        let tag_start = from + at;
        let tag_end = find(&lower[tag_start..], b">").map_or(lower.len(), |e| tag_start + e);
        let tag = &lower[tag_start..tag_end];
        if let Some(c) = find(tag, b"charset") {
            let rest = &tag[c + b"charset".len()..];
            let rest = rest.trim_ascii_start().strip_prefix(b"=").unwrap_or(&[]);
            let rest = rest.trim_ascii_start();
            let rest = rest
                .strip_prefix(b"\"")
                .or(rest.strip_prefix(b"'"))
                .unwrap_or(rest);
            let end = rest
                .iter()
                .position(|b| matches!(b, b'"' | b'\'' | b';' | b'/') || b.is_ascii_whitespace())
                .unwrap_or(rest.len());
            if let Some(enc) = Encoding::for_label(&rest[..end]) {
                return Some(
                    if enc == encoding_rs::UTF_16LE || enc == encoding_rs::UTF_16BE {
                        UTF_8
                    } else if enc == encoding_rs::X_USER_DEFINED {
                        WINDOWS_1252
                    } else {
                        enc
                    },
                );
            }
        }
        from = tag_end;
    }
    None
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Elements whose whole content is dropped.
const SKIPPED: [&str; 7] = [
    "script", "style", "noscript", "head", "template", "svg", "iframe",
];

/// Tags that start a new line.
const BLOCKS: [&str; 33] = [
    "p",
    "div",
    "br",
    "hr",
    "li",
    "ul",
    "ol",
    "tr",
    "table",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "section",
    "article",
    "header",
    "footer",
    "nav",
    "aside",
    "main",
    "blockquote",
    "pre",
    "title",
    "dd",
    "dt",
    "dl",
    "form",
    "figure",
    "figcaption",
    "body",
    "html",
];

/// Convert an HTML document to text. Pure; never panics on any input.
pub fn html_to_text(html: &str) -> String {
    let mut raw = String::with_capacity(html.len() / 2);
    let mut rest = html;
    while let Some(lt) = rest.find('<') {
        raw.push_str(&rest[..lt]);
        rest = &rest[lt..];
        if let Some(after) = rest.strip_prefix("<!--") {
            rest = match after.find("-->") {
                Some(end) => &after[end + 3..],
                None => "",
            };
            continue;
        }
        let Some(gt) = rest.find('>') else {
            // An unclosed '<' is text.
            raw.push_str(rest);
            rest = "";
            break;
        };
        let inner = &rest[1..gt];
        rest = &rest[gt + 1..];
        let closing = inner.starts_with('/');
        let name: String = inner
            .trim_start_matches('/')
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect::<String>()
            .to_ascii_lowercase();
        if name.is_empty() {
            // `<!DOCTYPE>`, `<?xml?>`, or a stray `<`: drop declarations, keep "a < b" text.
            if !(inner.starts_with('!') || inner.starts_with('?')) {
                raw.push('<');
                raw.push_str(inner);
                raw.push('>');
            }
            continue;
        }
        if !closing && SKIPPED.contains(&name.as_str()) && !inner.ends_with('/') {
            rest = skip_element(rest, &name);
            continue;
        }
        if BLOCKS.contains(&name.as_str()) {
            raw.push('\n');
        } else if name == "td" || name == "th" {
            raw.push('\t');
        }
    }
    raw.push_str(rest);
    collapse(&decode_entities(&raw))
}

/// Skip to after `</name>` (case-insensitive); the rest of the document if it never closes.
fn skip_element<'a>(rest: &'a str, name: &str) -> &'a str {
    let needle = format!("</{name}");
    let lower = rest.to_ascii_lowercase();
    match lower.find(&needle) {
        Some(at) => {
            let after = &rest[at..];
            match after.find('>') {
                Some(gt) => &after[gt + 1..],
                None => "",
            }
        }
        None => "",
    }
}

/// Decode `&amp;` `&lt;` `&gt;` `&quot;` `&apos;` `&#39;` `&nbsp;` and numeric references; other
/// entities are left as they are.
pub fn decode_entities(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let end = rest[1..]
            .char_indices()
            .take(12)
            .find(|(_, c)| *c == ';')
            .map(|(i, _)| i + 1);
        let decoded = end.and_then(|end| decode_entity(&rest[1..end]).map(|c| (c, end)));
        match decoded {
            Some((c, end)) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The character a reference's body (`amp`, `#60`, `#x3c`: between `&` and `;`) stands for;
/// `None` when it is not one this module knows.
pub fn decode_entity(entity: &str) -> Option<char> {
    let named = match entity {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        "nbsp" => ' ',
        "mdash" => '—',
        "ndash" => '–',
        "hellip" => '…',
        "copy" => '©',
        _ => {
            let num = entity.strip_prefix('#')?;
            let code = match num.strip_prefix(['x', 'X']) {
                Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                None => num.parse::<u32>().ok()?,
            };
            return match char::from_u32(code) {
                Some('\0') | None => Some('\u{fffd}'),
                Some(c) => Some(c),
            };
        }
    };
    Some(named)
}

/// Collapse runs of whitespace inside lines to one space, trim lines, drop empty lines (nested
/// block tags would otherwise leave stacks of them).
fn collapse(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&words.join(" "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn drops_scripts_styles_and_head() {
        let html = "<html><head><title>T</title><style>p{}</style></head><body>\
                    <script>alert('x')</script><noscript>js off</noscript>\
                    <p>Hello <b>world</b></p><SCRIPT type=x>evil()</SCRIPT>end</body></html>";
        assert_eq!(html_to_text(html), "Hello world\nend");
    }

    #[test]
    fn block_tags_become_lines() {
        let html = "<h1>Title</h1><p>one</p><div>two<br>three</div><ul><li>a</li><li>b</li></ul>";
        assert_eq!(html_to_text(html), "Title\none\ntwo\nthree\na\nb");
    }

    #[test]
    fn entities_are_decoded() {
        assert_eq!(
            html_to_text(
                "<p>a &amp; b &lt;c&gt; &quot;d&quot; &#39;e&#39; f&nbsp;g &#x41;&#66; &bogus; & x</p>"
            ),
            "a & b <c> \"d\" 'e' f g AB &bogus; & x"
        );
        // Decoded markup is text, not a tag.
        assert_eq!(
            html_to_text("&lt;script&gt;x&lt;/script&gt;"),
            "<script>x</script>"
        );
    }

    #[test]
    fn whitespace_is_collapsed() {
        assert_eq!(html_to_text("  a \n\t  b   c \n\n\n\n d  "), "a\nb c\nd");
    }

    #[test]
    fn comments_doctype_and_stray_brackets() {
        assert_eq!(
            html_to_text("<!DOCTYPE html><!-- hidden <p>x</p> -->1 < 2 and 3 > 2"),
            "1 < 2 and 3 > 2"
        );
        assert_eq!(html_to_text("a <unclosed"), "a <unclosed");
        assert_eq!(html_to_text("<script>never closed"), "");
    }

    #[test]
    fn bodies_are_decoded_in_their_declared_charset() {
        let latin1 = b"<p>Caf\xe9 \xa9 2001</p>";
        // The header wins; then the page's own <meta>; else UTF-8 with U+FFFD.
        assert_eq!(
            decode_body(latin1, Some("text/html; charset=ISO-8859-1"), true),
            "<p>Caf\u{e9} \u{a9} 2001</p>"
        );
        assert_eq!(
            decode_body(latin1, Some("text/html; charset=\"latin1\""), true),
            "<p>Caf\u{e9} \u{a9} 2001</p>"
        );
        let meta = [
            b"<meta http-equiv=\"Content-Type\" content=\"text/html; charset=ISO-8859-1\">"
                .as_slice(),
            latin1,
        ]
        .concat();
        assert!(decode_body(&meta, Some("text/html"), true).ends_with("Caf\u{e9} \u{a9} 2001</p>"));
        let meta5 = [b"<META CHARSET='windows-1252'>".as_slice(), b"\x93q\x94"].concat();
        assert!(decode_body(&meta5, None, true).ends_with("\u{201c}q\u{201d}"));
        // A <meta> is not read in plain text, nor a bogus label anywhere.
        assert_eq!(
            decode_body(&meta5, Some("text/plain"), false)
                .matches('\u{fffd}')
                .count(),
            2
        );
        assert_eq!(
            decode_body(latin1, Some("text/html; charset=bogus"), true),
            "<p>Caf\u{fffd} \u{fffd} 2001</p>"
        );
        // A BOM wins over the header; a UTF-16 <meta> means UTF-8.
        assert_eq!(
            decode_body(
                b"\xef\xbb\xbfh\xc3\xa9",
                Some("text/html; charset=iso-8859-1"),
                true
            ),
            "h\u{e9}"
        );
        assert_eq!(
            decode_body(b"<meta charset=utf-16>h\xc3\xa9", None, true),
            "<meta charset=utf-16>h\u{e9}"
        );
    }

    /// The real pages in tests/fixtures/html (docs/BENCHMARKS.md): decoded, converted, and
    /// their key phrases found, the non-UTF-8 one included.
    #[test]
    fn the_fixture_pages_keep_their_key_phrases() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/html");
        let pages: [(&str, &[&str]); 3] = [
            (
                "libxslt-python-latin1.html",
                &[
                    "St\u{e9}phane Bidoul",
                    "libxml2 and libxslt",
                    "import libxml2",
                ],
            ),
            (
                "zlib-how-unclosed.html",
                &[
                    "zlib Usage Example",
                    "if (ret != Z_OK)",
                    "Copyright (c) 2004, 2005 by Mark Adler",
                ],
            ),
            (
                "bs4-doc-sphinx.html",
                &["Beautiful Soup Documentation", "soup.find_all('a')"],
            ),
        ];
        for (name, phrases) in pages {
            let bytes = std::fs::read(dir.join(name)).unwrap();
            let text = html_to_text(&decode_body(&bytes, Some("text/html"), true));
            for phrase in phrases {
                assert!(text.contains(phrase), "{name}: {phrase:?} missing");
            }
            // The Sphinx page carries four U+FFFD of its own; decoding adds none.
            let in_source = bytes.windows(3).filter(|w| w == b"\xef\xbf\xbd").count();
            assert!(
                text.matches('\u{fffd}').count() <= in_source,
                "{name}: undecoded bytes"
            );
        }
    }

    proptest! {
        #[test]
        fn decode_never_panics(body in proptest::collection::vec(any::<u8>(), 0..300), ct in "[a-z/;= \"-]{0,40}") {
            let _ = decode_body(&body, Some(&ct), true);
            let _ = decode_body(&body, None, true);
        }

        #[test]
        fn never_panics(s in "\\PC{0,200}") {
            let _ = html_to_text(&s);
        }

        #[test]
        fn never_panics_on_tag_soup(s in "[<>/&;#a-z!\\- ]{0,200}") {
            let out = html_to_text(&s);
            prop_assert!(!out.contains("  "));
        }
    }
}
