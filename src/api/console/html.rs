//! The one escaping function and the page frame. Every text that is not a literal of this
//! module's callers goes through [`esc`] (or [`Html::text`]): trail content, tool results, MCP
//! output and web pages stay text (SPEC §22).

use std::fmt::Write as _;

/// `s` with `& < > " '` replaced by entities: safe inside element content and quoted
/// attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// An HTML buffer: literal markup with [`Html::raw`], data with [`Html::text`].
#[derive(Default)]
pub(crate) struct Html(String);

impl Html {
    pub(crate) fn raw(&mut self, markup: &str) -> &mut Self {
        self.0.push_str(markup);
        self
    }

    /// `text`, escaped.
    pub(crate) fn text(&mut self, text: &str) -> &mut Self {
        self.0.push_str(&esc(text));
        self
    }

    /// `<tag>text</tag>` with `text` escaped (`tag` is a literal of the caller).
    pub(crate) fn el(&mut self, tag: &str, text: &str) -> &mut Self {
        let name = tag.split(' ').next().unwrap_or(tag);
        let _ = write!(self.0, "<{tag}>{}</{name}>", esc(text));
        self
    }

    /// A hidden CSRF field for a form.
    pub(crate) fn csrf(&mut self, token: &str) -> &mut Self {
        let _ = write!(
            self.0,
            r#"<input type="hidden" name="csrf" value="{}">"#,
            esc(token)
        );
        self
    }

    pub(crate) fn into_string(self) -> String {
        self.0
    }
}

/// Literal markup written with `write!` (never data: that goes through [`Html::text`]).
impl std::fmt::Write for Html {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.push_str(s);
        Ok(())
    }
}

/// The navigation: path, label.
pub(crate) const PAGES: [(&str, &str); 7] = [
    ("/console/", "Overview"),
    ("/console/sessions", "Sessions"),
    ("/console/costs", "Costs"),
    ("/console/approvals", "Approvals"),
    ("/console/schedules", "Schedules"),
    ("/console/memory", "Memory"),
    ("/console/chat", "Chat"),
];

/// A whole page: `title`, the agent's name, the navigation with `current` marked, a logout
/// form carrying `csrf` (`None`: the login page, no navigation), then `body`.
pub(crate) fn page(
    title: &str,
    agent: &str,
    current: &str,
    csrf: Option<&str>,
    body: &str,
) -> String {
    let mut h = Html::default();
    h.raw(r#"<!doctype html><html lang="en"><head><meta charset="utf-8">"#)
        .raw(r#"<meta name="viewport" content="width=device-width, initial-scale=1">"#);
    if let Some(t) = csrf {
        h.raw(r#"<meta name="csrf" content=""#).text(t).raw(r#"">"#);
    }
    h.raw("<title>")
        .text(&format!("{title} · {agent}"))
        .raw(r#"</title><link rel="stylesheet" href="/console/assets/console.css">"#)
        .raw(r#"<script src="/console/assets/console.js" defer></script></head><body>"#)
        .raw(r##"<a class="skip" href="#main">Skip to content</a><header><span class="brand">"##)
        .text(agent)
        .raw("</span>");
    if let Some(t) = csrf {
        h.raw(r#"<nav aria-label="Pages"><ul>"#);
        for (path, label) in PAGES {
            let mark = if path == current {
                r#" aria-current="page""#
            } else {
                ""
            };
            let _ = write!(h.0, r#"<li><a href="{path}"{mark}>{label}</a></li>"#);
        }
        h.raw(r#"</ul></nav><form class="logout" method="post" action="/console/logout">"#)
            .csrf(t)
            .raw(r#"<button type="submit">Log out</button></form>"#);
    }
    h.raw(r#"</header><main id="main" tabindex="-1">"#)
        .el("h1", title)
        .raw(body)
        .raw("</main></body></html>");
    h.into_string()
}

/// A money amount.
pub(crate) fn usd(v: f64) -> String {
    format!("${v:.4}")
}

/// Unix seconds as `YYYY-MM-DD HH:MM UTC`.
pub(crate) fn when(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_data_is_escaped() {
        assert_eq!(
            esc(r#"<img src=x onerror="alert('1')">&"#),
            "&lt;img src=x onerror=&quot;alert(&#39;1&#39;)&quot;&gt;&amp;"
        );
        let mut h = Html::default();
        h.el("p class=\"x\"", "<script>alert(1)</script>");
        assert_eq!(
            h.into_string(),
            "<p class=\"x\">&lt;script&gt;alert(1)&lt;/script&gt;</p>"
        );
    }
}
