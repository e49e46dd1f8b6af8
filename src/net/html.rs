//! HTML to readable plain text, without an HTML parser crate: good enough for the model to read
//! a page, not a renderer. Drops `script`/`style`/`noscript`/`head`/`template`/`svg` content and
//! comments, turns block tags into line breaks, decodes common entities and collapses
//! whitespace.

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

    proptest! {
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
