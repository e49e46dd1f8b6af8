//! Room events read into messages (SPEC §21): `m.text`, `m.notice` and `m.emote`, edits,
//! replies (the quoted text as context), images, files and audio, reactions, and events that
//! could not be decrypted. Events are read as their JSON, so every rule here is a pure
//! function of the event.

use serde_json::Value;

/// The longest body taken; longer ones are cut and say so.
pub const MAX_BODY_BYTES: usize = 32 * 1024;

/// The longest quoted text of a reply kept as context.
const MAX_QUOTE_CHARS: usize = 500;

/// One event of a room's timeline, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MxEvent {
    pub event_id: String,
    pub sender: String,
    pub kind: Kind,
}

/// What an event says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A text (`m.text`, `m.notice`, `m.emote`).
    Text {
        text: String,
        /// The event this one replaces (`m.replace`): its new text is `text`.
        edit_of: Option<String>,
        /// The event this one answers (`m.in_reply_to`) and the quoted text, when the body
        /// carries the fallback quote.
        reply_to: Option<String>,
        quoted: Option<String>,
    },
    /// An image, a file or audio: `source` is the content's `url` or encrypted `file`.
    Media {
        kind: MediaKind,
        /// The file name or caption the sender gave.
        body: String,
        size: Option<u64>,
        mimetype: Option<String>,
        source: Value,
    },
    /// A reaction `key` to event `to`.
    Reaction { to: String, key: String },
    /// A message type this channel does not read.
    Unsupported { msgtype: String },
    /// An encrypted event that could not be decrypted.
    Undecryptable,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaKind {
    Image,
    File,
    Audio,
}

impl MediaKind {
    /// The extension a download gets when the sender's name has none.
    pub fn default_ext(self, mimetype: Option<&str>) -> &'static str {
        match (self, mimetype.unwrap_or("")) {
            (_, "image/png") => "png",
            (_, "image/webp") => "webp",
            (_, "image/gif") => "gif",
            (MediaKind::Image, _) => "jpg",
            (_, "audio/ogg" | "audio/opus") => "ogg",
            (_, "audio/mpeg") => "mp3",
            (_, "audio/mp4" | "audio/x-m4a") => "m4a",
            (_, "audio/wav" | "audio/x-wav") => "wav",
            (MediaKind::Audio, _) => "ogg",
            (_, "application/pdf") => "pdf",
            (_, "text/plain") => "txt",
            _ => "bin",
        }
    }
}

/// Read timeline event `ev`; `None` for events that are not messages or reactions (state,
/// redactions, calls, …). `undecryptable`: the SDK could not decrypt it.
pub fn read(ev: &Value, undecryptable: bool) -> Option<MxEvent> {
    let event_id = ev.get("event_id")?.as_str()?.to_string();
    let sender = ev.get("sender")?.as_str()?.to_string();
    let content = ev.get("content")?;
    let kind = match ev.get("type")?.as_str()? {
        "m.room.encrypted" if undecryptable => Kind::Undecryptable,
        "m.room.message" => message(content)?,
        "m.reaction" => {
            let rel = content.get("m.relates_to")?;
            (rel.get("rel_type")?.as_str()? == "m.annotation").then_some(())?;
            Kind::Reaction {
                to: rel.get("event_id")?.as_str()?.to_string(),
                key: rel.get("key")?.as_str()?.to_string(),
            }
        }
        _ => return None,
    };
    Some(MxEvent {
        event_id,
        sender,
        kind,
    })
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// An `m.room.message`'s content.
fn message(content: &Value) -> Option<Kind> {
    let rel = content.get("m.relates_to");
    let edit_of = rel
        .filter(|r| str_of(r, "rel_type") == Some("m.replace"))
        .and_then(|r| str_of(r, "event_id"))
        .map(str::to_string);
    // An edit's new text is in `m.new_content` (its `body` is a "* " fallback).
    let content = match (&edit_of, content.get("m.new_content")) {
        (Some(_), Some(new)) => new,
        _ => content,
    };
    let msgtype = str_of(content, "msgtype")?;
    let body = str_of(content, "body").unwrap_or("");
    let media = |kind| Kind::Media {
        kind,
        body: bounded(body),
        size: content.pointer("/info/size").and_then(Value::as_u64),
        mimetype: str_of(content.get("info").unwrap_or(&Value::Null), "mimetype")
            .map(str::to_string),
        source: content
            .get("file")
            .or_else(|| content.get("url"))
            .cloned()
            .unwrap_or(Value::Null),
    };
    Some(match msgtype {
        "m.text" | "m.notice" | "m.emote" => {
            let reply_to = rel
                .and_then(|r| r.pointer("/m.in_reply_to/event_id"))
                .and_then(Value::as_str)
                .map(str::to_string);
            let (quoted, text) = match reply_to {
                Some(_) => strip_reply_fallback(body),
                None => (None, body.to_string()),
            };
            Kind::Text {
                text: bounded(&text),
                edit_of,
                reply_to,
                quoted,
            }
        }
        "m.image" => media(MediaKind::Image),
        "m.file" | "m.video" => media(MediaKind::File),
        "m.audio" => media(MediaKind::Audio),
        other => Kind::Unsupported {
            msgtype: other.chars().take(64).collect(),
        },
    })
}

/// `body` cut at [`MAX_BODY_BYTES`] (on a character boundary), saying so.
pub fn bounded(body: &str) -> String {
    if body.len() <= MAX_BODY_BYTES {
        return body.to_string();
    }
    let mut end = MAX_BODY_BYTES;
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[message cut: it had {} bytes, at most {MAX_BODY_BYTES} are read]",
        &body[..end],
        body.len()
    )
}

/// A reply's body without its fallback quote (`> <@user:server> quoted` lines, then a blank
/// line): the quoted text without the markers, and the reply itself.
pub fn strip_reply_fallback(body: &str) -> (Option<String>, String) {
    if !body.starts_with("> ") {
        return (None, body.to_string());
    }
    let mut quoted = Vec::new();
    let mut rest = "";
    let mut lines = body.split_inclusive('\n');
    let mut consumed = 0;
    for line in lines.by_ref() {
        let l = line.trim_end_matches('\n');
        match l.strip_prefix("> ").or_else(|| l.strip_prefix('>')) {
            Some(q) => {
                quoted.push(q);
                consumed += line.len();
            }
            None => {
                if l.is_empty() {
                    consumed += line.len();
                }
                rest = &body[consumed..];
                break;
            }
        }
    }
    let mut q = quoted.join("\n");
    // The first quoted line names the sender: `<@alice:example.org> text`.
    if q.starts_with('<')
        && let Some(end) = q.find("> ")
    {
        q = q[end + 2..].to_string();
    }
    (Some(q), rest.to_string())
}

/// The text a reply's message carries: the quoted text (shortened) as context, then the reply.
pub fn with_quote(text: &str, quoted: Option<&str>) -> String {
    match quoted.map(str::trim).filter(|q| !q.is_empty()) {
        None => text.to_string(),
        Some(q) => {
            let short: String = q.chars().take(MAX_QUOTE_CHARS).collect();
            let cut = if short.len() < q.len() { "…" } else { "" };
            format!("[in reply to: \"{short}{cut}\"]\n{text}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg(content: Value) -> Value {
        json!({"type": "m.room.message", "event_id": "$e", "sender": "@a:x", "content": content})
    }

    #[test]
    fn texts_notices_and_unknown_types() {
        let e = read(&msg(json!({"msgtype": "m.text", "body": "hi"})), false).unwrap();
        assert_eq!(e.sender, "@a:x");
        assert!(matches!(e.kind, Kind::Text { ref text, edit_of: None, .. } if text == "hi"));
        let n = read(&msg(json!({"msgtype": "m.notice", "body": "n"})), false).unwrap();
        assert!(matches!(n.kind, Kind::Text { .. }));
        let u = read(&msg(json!({"msgtype": "m.location", "body": "geo"})), false).unwrap();
        assert_eq!(
            u.kind,
            Kind::Unsupported {
                msgtype: "m.location".into()
            }
        );
        let state =
            json!({"type": "m.room.member", "event_id": "$m", "sender": "@a:x", "content": {}});
        assert_eq!(read(&state, false), None);
        let enc =
            json!({"type": "m.room.encrypted", "event_id": "$c", "sender": "@a:x", "content": {}});
        assert_eq!(read(&enc, true).unwrap().kind, Kind::Undecryptable);
    }

    #[test]
    fn edits_carry_the_new_text_and_the_original_id() {
        let e = msg(json!({
            "msgtype": "m.text", "body": "* fixed",
            "m.new_content": {"msgtype": "m.text", "body": "fixed"},
            "m.relates_to": {"rel_type": "m.replace", "event_id": "$orig"}
        }));
        match read(&e, false).unwrap().kind {
            Kind::Text { text, edit_of, .. } => {
                assert_eq!(text, "fixed");
                assert_eq!(edit_of.as_deref(), Some("$orig"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn replies_keep_the_quote_as_context() {
        let e = msg(json!({
            "msgtype": "m.text",
            "body": "> <@bot:x> the answer is 42\n> second line\n\nwhy?",
            "m.relates_to": {"m.in_reply_to": {"event_id": "$q"}}
        }));
        match read(&e, false).unwrap().kind {
            Kind::Text {
                text,
                reply_to,
                quoted,
                ..
            } => {
                assert_eq!(text, "why?");
                assert_eq!(reply_to.as_deref(), Some("$q"));
                assert_eq!(quoted.as_deref(), Some("the answer is 42\nsecond line"));
                let t = with_quote(&text, quoted.as_deref());
                assert!(t.starts_with("[in reply to: \"the answer is 42"), "{t}");
                assert!(t.ends_with("\nwhy?"));
            }
            other => panic!("{other:?}"),
        }
        // Without a fallback quote, the body is the reply.
        assert_eq!(strip_reply_fallback("plain"), (None, "plain".to_string()));
    }

    #[test]
    fn media_reactions_and_bounds() {
        let img = msg(
            json!({"msgtype": "m.image", "body": "cat.png", "url": "mxc://x/abc",
            "info": {"size": 1234, "mimetype": "image/png"}}),
        );
        match read(&img, false).unwrap().kind {
            Kind::Media {
                kind,
                size,
                mimetype,
                source,
                ..
            } => {
                assert_eq!(kind, MediaKind::Image);
                assert_eq!(size, Some(1234));
                assert_eq!(mimetype.as_deref(), Some("image/png"));
                assert_eq!(source, json!("mxc://x/abc"));
            }
            other => panic!("{other:?}"),
        }
        let r = json!({"type": "m.reaction", "event_id": "$r", "sender": "@a:x",
            "content": {"m.relates_to": {"rel_type": "m.annotation", "event_id": "$p", "key": "✅"}}});
        assert_eq!(
            read(&r, false).unwrap().kind,
            Kind::Reaction {
                to: "$p".into(),
                key: "✅".into()
            }
        );
        let huge = "é".repeat(MAX_BODY_BYTES);
        let b = bounded(&huge);
        assert!(b.len() < MAX_BODY_BYTES + 100 && b.contains("message cut"));
        assert_eq!(MediaKind::Audio.default_ext(None), "ogg");
    }
}
