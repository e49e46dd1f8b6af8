//! The outbound seam: what tools (and the daemon's reply delivery) may do towards people —
//! send text, a file or a voice note, react, show "typing…" — without knowing the channel.
//! The daemon wires it to Telegram (`daemon::telegram`); tools never import `channels`.
//! Next: asking a person for an approval.

use std::path::Path;

use futures::future::BoxFuture;

/// Where a message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Telegram { chat_id: i64 },
}

impl Target {
    /// The channel name recorded in `delivery` events.
    pub fn channel(&self) -> &'static str {
        match self {
            Target::Telegram { .. } => "telegram",
        }
    }
}

/// How a file is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// Shown inline as a photo.
    Photo,
    /// A voice note (`.ogg` Opus).
    Voice,
    /// Sent as a file, unchanged.
    Document,
}

impl FileKind {
    /// The kind a file is sent as, from its extension.
    pub fn for_path(path: &Path) -> FileKind {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("jpg" | "jpeg" | "png" | "webp") => FileKind::Photo,
            Some("ogg" | "oga" | "opus") => FileKind::Voice,
            _ => FileKind::Document,
        }
    }
}

/// Why one part of a reply was not delivered (SPEC §16.1). Texts are one line, no secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartError {
    /// Nothing was delivered; sending again is safe (not before `after`, when given).
    Retry {
        after: Option<std::time::Duration>,
        error: String,
    },
    /// The request was written and its answer lost: the channel may have delivered it.
    Unknown(String),
    /// Refused for good.
    Failed(String),
}

/// Outbound actions on a channel. Errors are one line, safe to show (no secrets).
pub trait Outbound: Send + Sync {
    /// The parts `text` is sent as (formatted and split as the channel needs), in order.
    fn parts(&self, to: &Target, text: &str) -> Vec<String>;
    /// Send one part of [`Self::parts`] once, without retrying.
    fn send_part<'a>(
        &'a self,
        to: &'a Target,
        part: &'a str,
    ) -> BoxFuture<'a, Result<(), PartError>>;
    /// Send `text` (formatted and split as the channel needs); returns how many messages it
    /// took. Blank text sends nothing.
    fn send_text<'a>(
        &'a self,
        to: &'a Target,
        text: &'a str,
    ) -> BoxFuture<'a, Result<usize, String>>;
    fn send_file<'a>(
        &'a self,
        to: &'a Target,
        path: &'a Path,
        kind: FileKind,
    ) -> BoxFuture<'a, Result<(), String>>;
    /// React with `emoji` to message `message_id` of that chat.
    fn react<'a>(
        &'a self,
        to: &'a Target,
        message_id: i32,
        emoji: &'a str,
    ) -> BoxFuture<'a, Result<(), String>>;
    /// Show "typing…" once (the caller refreshes it); failures are only logged.
    fn typing<'a>(&'a self, to: &'a Target) -> BoxFuture<'a, ()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_kinds_follow_the_extension() {
        assert_eq!(FileKind::for_path(Path::new("a/b.JPG")), FileKind::Photo);
        assert_eq!(FileKind::for_path(Path::new("v.ogg")), FileKind::Voice);
        assert_eq!(FileKind::for_path(Path::new("r.pdf")), FileKind::Document);
        assert_eq!(FileKind::for_path(Path::new("noext")), FileKind::Document);
    }
}
