//! A session's messages as a provider's wire format last rendered them (SPEC §16.6), so a
//! call escapes only what is new: each earlier message's bytes are kept and copied into the
//! next request instead of being serialised again. The bytes are opaque here (only
//! `llm/<provider>/` knows what they say); this module knows which message they belong to.
//!
//! **Validity.** Entry `i` holds the rendering of message `i`; the entries always cover a prefix
//! of the history (`0..k`). Whoever changes a message other than by appending drops the entries
//! from that message on: compaction (`clear`), the image placeholder swap and a repair of
//! stored tool calls (`invalidate_from`); `SessionState` does it where it makes those changes.
//! As a second line, every entry keeps a fingerprint of the message's shape (kinds, lengths
//! and a few bytes of every string, [`shape`]): at each call the last few entries and a few
//! more in turn are checked before the bytes are reused, so a change that forgot to invalidate
//! and alters any length or either end of a string is caught at once near the end of the
//! history and within a bounded number of calls elsewhere, at a constant cost per call.
//! Debug builds compare every cached render with a full one.
//!
//! **Breakpoints.** The bytes are those of the message *without* a cache breakpoint; the
//! renderer writes the marked block fresh for the (at most two) messages that carry one, so a
//! marker never outlives the call it was for, and a message never lacks one it needs.
//!
//! **Memory.** At most one entry per message of the history, per wire format used (a second
//! format only when a fallback crossed providers), so bounded by the history; it lives in the
//! session's state and is freed with it (archive, eviction from the idle states). A clone of
//! the state (the snapshot's) starts empty.

use std::sync::{Mutex, MutexGuard};

use super::{Message, UserBlock};

/// The wire formats a cache holds renderings for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireFormat {
    Anthropic,
    OpenAi,
}

impl WireFormat {
    fn index(self) -> usize {
        match self {
            WireFormat::Anthropic => 0,
            WireFormat::OpenAi => 1,
        }
    }
}

/// One message rendered in one wire format, without breakpoint.
#[derive(Debug, Default)]
pub struct Rendered {
    /// [`shape`] of the message the bytes were rendered from.
    pub shape: u64,
    /// The message's elements (content blocks, or wire messages), comma-separated.
    pub bytes: Vec<u8>,
    /// Where the last element starts in `bytes`.
    pub last: usize,
}

/// The entries per format, and where the next rotating shape check starts.
#[derive(Default)]
struct Formats {
    entries: [Vec<Rendered>; 2],
    cursor: usize,
}

/// Entries whose shape is checked at every call: the last ones (where appends, the image swap
/// and repairs happen) ...
const CHECK_TAIL: usize = 8;
/// ... and this many more, taken in turn from the rest, so every entry is checked again within
/// `len / CHECK_TURN` calls at a constant cost per call (checking all of them was 3% of the
/// daemon's instructions at 1,000 messages, and grew with the history).
const CHECK_TURN: usize = 8;

/// The index of the first entry found to disagree with its message's shape among those checked
/// this call (the tail and the next window of the rotation), or `entries.len()`.
fn first_changed(entries: &[Rendered], messages: &[Message], cursor: &mut usize) -> usize {
    let n = entries.len();
    let tail = n.saturating_sub(CHECK_TAIL);
    let start = if tail == 0 { 0 } else { *cursor % tail };
    *cursor = start + CHECK_TURN;
    let turn = start..(start + CHECK_TURN).min(tail);
    turn.chain(tail..n)
        .find(|&i| entries[i].shape != shape(&messages[i]))
        .unwrap_or(n)
}

/// The per-session cache. `RenderCache::default()` is disabled (renderers neither read nor
/// fill it): for one-off requests such as a compaction summary.
#[derive(Default)]
pub struct RenderCache {
    enabled: bool,
    formats: Mutex<Formats>,
}

impl RenderCache {
    /// An empty cache that renderers fill.
    pub fn new() -> RenderCache {
        RenderCache {
            enabled: true,
            formats: Mutex::default(),
        }
    }

    fn formats_mut(&mut self) -> &mut [Vec<Rendered>; 2] {
        &mut self
            .formats
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .entries
    }

    /// Drop every entry (the history was replaced, e.g. compacted).
    pub fn clear(&mut self) {
        for f in self.formats_mut() {
            *f = Vec::new();
        }
    }

    /// Drop the entries of message `index` and after (that message changed).
    pub fn invalidate_from(&mut self, index: usize) {
        for f in self.formats_mut() {
            f.truncate(index);
        }
    }

    /// Messages with an entry in `format`.
    pub fn len(&self, format: WireFormat) -> usize {
        self.lock().entries[format.index()].len()
    }

    /// Whether no format holds an entry.
    pub fn is_empty(&self) -> bool {
        self.lock().entries.iter().all(Vec::is_empty)
    }

    /// Bytes held, over every format.
    pub fn bytes(&self) -> usize {
        self.lock()
            .entries
            .iter()
            .flatten()
            .map(|r| r.bytes.capacity())
            .sum()
    }

    fn lock(&self) -> MutexGuard<'_, Formats> {
        // A render that panicked leaves at worst a missing entry: the entries stay a prefix.
        self.formats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The renderings of `messages` in `format`: the valid entries are kept, the others (from
    /// the first message whose shape changed, and every message without one) rendered by
    /// `render` and stored. `None` when the cache is disabled.
    pub fn sync<E>(
        &self,
        format: WireFormat,
        messages: &[Message],
        mut render: impl FnMut(&Message, &mut Rendered) -> Result<(), E>,
    ) -> Option<Result<Synced<'_>, E>> {
        if !self.enabled {
            return None;
        }
        let mut guard = self.lock();
        let formats = &mut *guard;
        let entries = &mut formats.entries[format.index()];
        entries.truncate(messages.len());
        let valid = first_changed(entries, messages, &mut formats.cursor);
        entries.truncate(valid);
        for message in &messages[valid..] {
            let mut r = Rendered {
                shape: shape(message),
                ..Rendered::default()
            };
            if let Err(e) = render(message, &mut r) {
                return Some(Err(e));
            }
            r.bytes.shrink_to_fit();
            entries.push(r);
        }
        Some(Ok(Synced {
            guard,
            format: format.index(),
        }))
    }
}

/// The entries of one format, one per message, locked while the request is written.
pub struct Synced<'a> {
    guard: MutexGuard<'a, Formats>,
    format: usize,
}

impl std::ops::Deref for Synced<'_> {
    type Target = [Rendered];

    fn deref(&self) -> &[Rendered] {
        &self.guard.entries[self.format]
    }
}

impl Clone for RenderCache {
    /// An empty cache, enabled as this one: a copy of the state (the snapshot's) has no use for
    /// the bytes, and copying them would cost what the cache saves.
    fn clone(&self) -> RenderCache {
        RenderCache {
            enabled: self.enabled,
            formats: Mutex::default(),
        }
    }
}

impl PartialEq for RenderCache {
    /// Always equal: a cache is not part of what a state is.
    fn eq(&self, _: &RenderCache) -> bool {
        true
    }
}

impl std::fmt::Debug for RenderCache {
    /// The number of entries per format; never waits for the lock (a request may be formatted
    /// while its body is being written).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("RenderCache");
        d.field("enabled", &self.enabled);
        match self.formats.try_lock() {
            Ok(formats) => d
                .field("anthropic", &formats.entries[0].len())
                .field("openai", &formats.entries[1].len()),
            Err(_) => d.field("entries", &"(in use)"),
        };
        d.finish()
    }
}

/// A fingerprint of what a message holds that costs a few operations per block, not per byte:
/// the kind of every block, the length of every string and up to eight bytes from each end of
/// it. Reusing bytes needs an equal shape; an explicit invalidation is what makes it safe.
pub fn shape(message: &Message) -> u64 {
    let mut h = Shape::new();
    match message {
        Message::User { content } => {
            h.word(1);
            for b in content {
                match b {
                    UserBlock::Text { text } => {
                        h.word(2);
                        h.text(text);
                    }
                    UserBlock::Image {
                        media_type,
                        data,
                        placeholder,
                    } => {
                        h.word(3);
                        h.text(media_type);
                        h.text(data);
                        h.text(placeholder);
                    }
                }
            }
        }
        Message::Assistant {
            text,
            tool_calls,
            thinking,
            ..
        } => {
            h.word(4);
            h.text(text);
            for t in thinking {
                h.word(5);
                for s in [&t.thinking, &t.signature, &t.redacted_data] {
                    match s {
                        Some(s) => h.text(s),
                        None => h.word(6),
                    }
                }
            }
            for c in tool_calls {
                h.word(7);
                h.text(&c.id);
                h.text(&c.name);
                h.value(&c.arguments);
            }
        }
        Message::ToolResults { results, notice } => {
            h.word(8);
            for r in results {
                h.word(9 + u64::from(r.is_error));
                h.text(&r.tool_call_id);
                h.text(&r.content);
            }
            match notice {
                Some(n) => h.text(n),
                None => h.word(11),
            }
        }
    }
    h.0
}

/// FNV-1a over 64-bit words.
struct Shape(u64);

impl Shape {
    fn new() -> Shape {
        Shape(0xcbf2_9ce4_8422_2325)
    }

    fn word(&mut self, w: u64) {
        self.0 = (self.0 ^ w).wrapping_mul(0x0000_0100_0000_01b3);
    }

    fn text(&mut self, s: &str) {
        let b = s.as_bytes();
        self.word(b.len() as u64);
        let n = b.len().min(8);
        let mut head = [0u8; 8];
        head[..n].copy_from_slice(&b[..n]);
        self.word(u64::from_le_bytes(head));
        let mut tail = [0u8; 8];
        tail[..n].copy_from_slice(&b[b.len() - n..]);
        self.word(u64::from_le_bytes(tail));
    }

    /// A tool call's arguments: the kind, and for containers their size and (objects) keys,
    /// one level deep.
    fn value(&mut self, v: &serde_json::Value) {
        use serde_json::Value;
        match v {
            Value::Null => self.word(20),
            Value::Bool(b) => self.word(21 + u64::from(*b)),
            Value::Number(n) => {
                self.word(23);
                self.text(&n.to_string());
            }
            Value::String(s) => {
                self.word(24);
                self.text(s);
            }
            Value::Array(a) => {
                self.word(25);
                self.word(a.len() as u64);
            }
            Value::Object(o) => {
                self.word(26);
                self.word(o.len() as u64);
                for (k, v) in o {
                    self.text(k);
                    match v {
                        Value::String(s) => self.text(s),
                        Value::Array(a) => self.word(a.len() as u64),
                        Value::Object(o) => self.word(o.len() as u64),
                        _ => self.word(27),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(r: &mut Rendered, m: &Message) -> Result<(), ()> {
        r.bytes = format!("{m:?}").into_bytes();
        Ok(())
    }

    #[test]
    fn disabled_by_default_and_clones_empty() {
        let msgs = vec![Message::user_text("a")];
        assert!(
            RenderCache::default()
                .sync(WireFormat::Anthropic, &msgs, |m, r| push(r, m))
                .is_none()
        );
        let c = RenderCache::new();
        drop(c.sync(WireFormat::Anthropic, &msgs, |m, r| push(r, m)));
        assert_eq!(c.len(WireFormat::Anthropic), 1);
        assert_eq!(c.len(WireFormat::OpenAi), 0);
        let copy = c.clone();
        assert!(copy.is_empty());
        assert!(
            copy.sync(WireFormat::OpenAi, &msgs, |m, r| push(r, m))
                .is_some()
        );
    }

    #[test]
    fn reuses_a_valid_prefix_and_renders_the_rest() {
        let c = RenderCache::new();
        let rendered = std::cell::Cell::new(0);
        let count = |m: &Message, r: &mut Rendered| {
            rendered.set(rendered.get() + 1);
            push(r, m)
        };
        let mut msgs = vec![Message::user_text("a"), Message::user_text("b")];
        drop(c.sync(WireFormat::OpenAi, &msgs, count));
        msgs.push(Message::user_text("c"));
        drop(c.sync(WireFormat::OpenAi, &msgs, count));
        assert_eq!(rendered.get(), 3);
        // A changed shape renders from there on, even without an invalidation.
        msgs[1] = Message::user_text("B2");
        drop(c.sync(WireFormat::OpenAi, &msgs, count));
        assert_eq!(rendered.get(), 5);
        // Fewer messages: the extra entries go.
        msgs.truncate(1);
        let s = c.sync(WireFormat::OpenAi, &msgs, count).unwrap().unwrap();
        assert_eq!(s.len(), 1);
        drop(s);
        assert_eq!(rendered.get(), 5);
    }

    #[test]
    fn a_change_deep_in_a_long_history_is_caught_by_the_rotation() {
        let c = RenderCache::new();
        let mut msgs: Vec<Message> = (0..100)
            .map(|i| Message::user_text(format!("m{i}")))
            .collect();
        drop(c.sync(WireFormat::Anthropic, &msgs, |m, r| push(r, m)));
        // Message 40 changes without an invalidation: each later call checks the tail and
        // CHECK_TURN more entries, so within (100 - CHECK_TAIL) / CHECK_TURN + 1 calls the
        // entry is dropped and rendered again, and never before its message changed.
        msgs[40] = Message::user_text("changed, longer");
        let bound = (100 - CHECK_TAIL) / CHECK_TURN + 1;
        let rendered = std::cell::Cell::new(0);
        let count = |m: &Message, r: &mut Rendered| {
            rendered.set(rendered.get() + 1);
            push(r, m)
        };
        let mut calls = 0;
        while rendered.get() == 0 {
            calls += 1;
            assert!(calls <= bound, "not caught within {bound} calls");
            drop(c.sync(WireFormat::Anthropic, &msgs, count));
        }
        assert_eq!(rendered.get(), 60, "rendered again from message 40 on");
        let s = c
            .sync(WireFormat::Anthropic, &msgs, count)
            .unwrap()
            .unwrap();
        assert_eq!(s[40].bytes, format!("{:?}", msgs[40]).into_bytes());
        assert_eq!(s.len(), 100);
    }

    #[test]
    fn invalidation_drops_from_the_index() {
        let mut c = RenderCache::new();
        let msgs = vec![Message::user_text("a"), Message::user_text("b")];
        drop(c.sync(WireFormat::Anthropic, &msgs, |m, r| push(r, m)));
        drop(c.sync(WireFormat::OpenAi, &msgs, |m, r| push(r, m)));
        c.invalidate_from(1);
        assert_eq!(c.len(WireFormat::Anthropic), 1);
        assert_eq!(c.len(WireFormat::OpenAi), 1);
        assert!(c.bytes() > 0);
        c.clear();
        assert!(c.is_empty());
        assert_eq!(c.bytes(), 0);
    }

    #[test]
    fn shape_sees_kinds_lengths_and_ends() {
        let img = Message::User {
            content: vec![UserBlock::Image {
                media_type: "image/png".into(),
                data: "AAAA".into(),
                placeholder: "[image]".into(),
            }],
        };
        assert_ne!(shape(&img), shape(&img.without_images()));
        assert_ne!(
            shape(&Message::user_text("abc")),
            shape(&Message::user_text("abd"))
        );
        assert_ne!(
            shape(&Message::user_text("x".repeat(40))),
            shape(&Message::user_text("x".repeat(41)))
        );
        assert_eq!(
            shape(&Message::user_text("same")),
            shape(&Message::user_text("same"))
        );
    }
}
