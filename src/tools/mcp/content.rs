//! What an MCP tool result (`CallToolResult`, as JSON) becomes for the model: text parts as
//! they are, an embedded text resource as its text under a line naming its URI, a resource link
//! as one line, and a placeholder line for everything the model cannot read as text (blobs,
//! audio, unknown kinds). An image becomes a placeholder line too and, for a model that sees
//! images, a [`ToolImage`] beside the text: checked base64 of a PNG, JPEG, GIF or WebP image
//! within [`MAX_IMAGE_BYTES`]; any other stays a placeholder that says why.

use base64::Engine;
use serde_json::Value;

use crate::message::{IMAGE_MEDIA_TYPES, MAX_IMAGE_BYTES, ToolImage};
use crate::tools::ToolOutput;

/// The longest URI, name, title or media type taken into a line, in bytes.
const MAX_FIELD_BYTES: usize = 512;
/// A resource link's description is shown when it is at most this long, in bytes.
const MAX_LINK_DESCRIPTION: usize = 200;

/// The text (and, when `sees_images`, the images) of `result`, the answer of the tool
/// offered as `tool`. Without any part, the structured content as JSON text.
pub(super) fn render(result: &Value, tool: &str, sees_images: bool) -> ToolOutput {
    let mut out = ToolOutput::default();
    let mut parts = Vec::new();
    if let Some(items) = result.get("content").and_then(Value::as_array) {
        for item in items {
            parts.push(part(item, tool, sees_images, &mut out.images));
        }
    }
    if parts.is_empty()
        && let Some(structured) = result.get("structuredContent")
    {
        out.text = structured.to_string();
        return out;
    }
    out.text = parts.join("\n");
    out
}

/// The text of one content item; an image the model is sent goes to `images`.
fn part(item: &Value, tool: &str, sees_images: bool, images: &mut Vec<ToolImage>) -> String {
    let field = |name: &str| item.get(name).and_then(Value::as_str);
    let kind = field("type").unwrap_or("unknown");
    match kind {
        "text" => field("text").unwrap_or("").to_string(),
        "image" => image(item, tool, sees_images, images),
        "audio" => {
            let data = field("data").unwrap_or("");
            format!(
                "[audio from MCP tool {tool}: {}, {}]",
                cut(field("mimeType").unwrap_or("unknown type"), 100),
                human_size(decoded_len(data))
            )
        }
        "resource" => resource(item.get("resource").unwrap_or(&Value::Null)),
        "resource_link" => link(item),
        other => format!("[{} content]", cut(other, 100)),
    }
}

/// An embedded resource: its text under a line naming its URI, or a placeholder for a blob.
fn resource(res: &Value) -> String {
    let field = |name: &str| res.get(name).and_then(Value::as_str);
    let uri = cut(field("uri").unwrap_or("(no uri)"), MAX_FIELD_BYTES);
    match (field("text"), field("blob")) {
        (Some(text), _) => format!("[resource {uri}]\n{text}"),
        (None, Some(blob)) => format!(
            "[resource {uri}: {}, {}; binary, not shown]",
            cut(field("mimeType").unwrap_or("unknown type"), 100),
            human_size(decoded_len(blob))
        ),
        (None, None) => format!("[resource {uri}]"),
    }
}

/// A resource link as one line: its URI, its title (else its name) and a short description.
fn link(item: &Value) -> String {
    let field = |name: &str| {
        item.get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let mut line = format!(
        "[resource link {}",
        cut(field("uri").unwrap_or("(no uri)"), MAX_FIELD_BYTES)
    );
    if let Some(title) = field("title").or_else(|| field("name")) {
        line.push_str(": ");
        line.push_str(&cut(title, MAX_FIELD_BYTES));
    }
    if let Some(d) = field("description").filter(|d| d.len() <= MAX_LINK_DESCRIPTION) {
        line.push_str(" — ");
        line.push_str(d);
    }
    line.push(']');
    line
}

/// An image item: its placeholder line, and the image itself in `images` when the model sees
/// images and the image is one it can be sent.
fn image(item: &Value, tool: &str, sees_images: bool, images: &mut Vec<ToolImage>) -> String {
    let declared = cut(
        item.get("mimeType")
            .and_then(Value::as_str)
            .unwrap_or("unknown type"),
        100,
    );
    let data = item.get("data").and_then(Value::as_str).unwrap_or("");
    let head = format!("[image from MCP tool {tool}: {declared}");
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(data) else {
        return format!("{head}; not shown: its data is not valid base64]");
    };
    let head = format!("{head}, {}", human_size(bytes.len() as u64));
    if !sees_images {
        return format!("{head}; this model cannot see images]");
    }
    let Some(media_type) = sniff(&bytes) else {
        return format!("{head}; not shown: not a PNG, JPEG, GIF or WebP image]");
    };
    if bytes.len() as u64 > MAX_IMAGE_BYTES {
        return format!(
            "{head}; not shown: an image may have at most {}]",
            human_size(MAX_IMAGE_BYTES)
        );
    }
    let placeholder = format!("{head}]");
    images.push(ToolImage {
        media_type: media_type.to_string(),
        data: data.to_string(),
        placeholder: placeholder.clone(),
    });
    placeholder
}

/// The type of an image by its first bytes (what the providers check), one of
/// [`IMAGE_MEDIA_TYPES`].
fn sniff(bytes: &[u8]) -> Option<&'static str> {
    let [png, jpeg, gif, webp] = IMAGE_MEDIA_TYPES;
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some(png)
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some(jpeg)
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some(gif)
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some(webp)
    } else {
        None
    }
}

/// The decoded length of base64 text, without decoding it.
fn decoded_len(data: &str) -> u64 {
    let data = data.trim_end_matches('=');
    (data.len() as u64 * 3) / 4
}

/// `n` bytes for a person: "512 bytes", "1.2 KB", "5.0 MB" (powers of 1024).
fn human_size(n: u64) -> String {
    const KB: u64 = 1024;
    match n {
        n if n < KB => format!("{n} bytes"),
        n if n < KB * KB => format!("{:.1} KB", n as f64 / KB as f64),
        n => format!("{:.1} MB", n as f64 / (KB * KB) as f64),
    }
}

/// At most `max` bytes of `s`, cut at a character boundary.
pub(super) fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A 1×1 PNG's first bytes, enough for the sniffing.
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    fn one(item: Value, sees_images: bool) -> ToolOutput {
        render(&json!({"content": [item]}), "s__t", sees_images)
    }

    #[test]
    fn text_parts_are_joined_and_structured_content_is_the_fallback() {
        let r = json!({"content": [
            {"type": "text", "text": "one"},
            {"type": "text", "text": "two"}
        ]});
        assert_eq!(render(&r, "s__t", true).text, "one\ntwo");
        let r = json!({"content": [], "structuredContent": {"a": 1}});
        assert_eq!(render(&r, "s__t", true).text, "{\"a\":1}");
    }

    #[test]
    fn an_embedded_text_resource_gives_its_text_under_its_uri() {
        let out = one(
            json!({"type": "resource", "resource": {
                "uri": "file:///x.txt", "mimeType": "text/plain", "text": "hello\nworld"
            }}),
            false,
        );
        assert_eq!(out.text, "[resource file:///x.txt]\nhello\nworld");
    }

    #[test]
    fn a_blob_resource_is_named_with_its_type_and_size() {
        let out = one(
            json!({"type": "resource", "resource": {
                "uri": "demo://blob/1", "mimeType": "application/pdf", "blob": b64(&[7; 2048])
            }}),
            true,
        );
        assert_eq!(
            out.text,
            "[resource demo://blob/1: application/pdf, 2.0 KB; binary, not shown]"
        );
        assert!(out.images.is_empty());
    }

    #[test]
    fn a_resource_link_is_one_line_with_title_and_short_description() {
        let out = one(
            json!({"type": "resource_link", "uri": "demo://text/2", "name": "Text Resource 2",
                   "description": "a plaintext resource", "mimeType": "text/plain"}),
            false,
        );
        assert_eq!(
            out.text,
            "[resource link demo://text/2: Text Resource 2 — a plaintext resource]"
        );
        // The title wins over the name; a long description is left out.
        let out = one(
            json!({"type": "resource_link", "uri": "u", "name": "n", "title": "T",
                   "description": "d".repeat(500)}),
            false,
        );
        assert_eq!(out.text, "[resource link u: T]");
    }

    #[test]
    fn an_image_reaches_a_vision_model_and_is_a_placeholder_otherwise() {
        let data = b64(PNG);
        let item = json!({"type": "image", "data": data, "mimeType": "image/png"});
        let seen = one(item.clone(), true);
        assert_eq!(seen.text, "[image from MCP tool s__t: image/png, 16 bytes]");
        assert_eq!(
            seen.images,
            [ToolImage {
                media_type: "image/png".into(),
                data: data.clone(),
                placeholder: seen.text.clone(),
            }]
        );
        let blind = one(item, false);
        assert_eq!(
            blind.text,
            "[image from MCP tool s__t: image/png, 16 bytes; this model cannot see images]"
        );
        assert!(blind.images.is_empty());
    }

    /// Only checked images are sent: valid base64 of a PNG, JPEG, GIF or WebP (the type taken
    /// from the bytes) within the size cap.
    #[test]
    fn images_outside_the_caps_stay_placeholders() {
        let out = one(
            json!({"type": "image", "data": "not base64!", "mimeType": "image/png"}),
            true,
        );
        assert_eq!(
            out.text,
            "[image from MCP tool s__t: image/png; not shown: its data is not valid base64]"
        );
        let out = one(
            json!({"type": "image", "data": b64(b"II*\0tiff"), "mimeType": "image/tiff"}),
            true,
        );
        assert!(
            out.text.ends_with("not a PNG, JPEG, GIF or WebP image]"),
            "{}",
            out.text
        );
        let mut big = PNG.to_vec();
        big.resize(MAX_IMAGE_BYTES as usize + 1, 0);
        let out = one(
            json!({"type": "image", "data": b64(&big), "mimeType": "image/png"}),
            true,
        );
        assert_eq!(
            out.text,
            "[image from MCP tool s__t: image/png, 5.0 MB; not shown: an image may have at most 5.0 MB]"
        );
        assert!(out.images.is_empty());
        // A JPEG declared as PNG is sent as what it is.
        let out = one(
            json!({"type": "image", "data": b64(&[0xFF, 0xD8, 0xFF, 0xE0]), "mimeType": "image/png"}),
            true,
        );
        assert_eq!(out.images[0].media_type, "image/jpeg");
    }

    #[test]
    fn audio_and_unknown_kinds_are_placeholders() {
        let out = one(
            json!({"type": "audio", "data": b64(&[0; 1500]), "mimeType": "audio/wav"}),
            true,
        );
        assert_eq!(out.text, "[audio from MCP tool s__t: audio/wav, 1.5 KB]");
        assert!(out.images.is_empty());
        assert_eq!(one(json!({"type": "video"}), true).text, "[video content]");
    }
}
