//! Markdown → Telegram HTML (SPEC §10.3 `format = "html"`).
//! (Placeholder body: the real renderer replaces it.)

/// Render Markdown as the HTML subset Telegram accepts (`parse_mode = HTML`).
pub fn markdown_to_html(md: &str) -> String {
    md.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
