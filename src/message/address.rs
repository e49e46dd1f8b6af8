//! Where a person is reached on a chat channel, in a form every layer can hold without knowing
//! the channel (SPEC §5.6): reply targets, the routes recorded with an intake, contacts,
//! approval prompts and the `message`, `react` and `tts` tools all name an [`Address`]. Only the
//! channel's own module reads `chat` and `thread`.

use serde::{Deserialize, Serialize};

/// A chat on one channel: the channel's name (`telegram`, `matrix`), the chat there as the
/// channel spells it (a Telegram chat id such as `1001` or `-100200`, a Matrix room id such as
/// `!abc:example.org`), and the thread within that chat where the channel has one (a forum
/// topic, a thread root). Persisted in trails: keep the serde shape backward compatible.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Address {
    pub channel: String,
    pub chat: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
}

impl Address {
    /// The chat `chat` of `channel`, not in a thread.
    pub fn new(channel: impl Into<String>, chat: impl Into<String>) -> Address {
        Address {
            channel: channel.into(),
            chat: chat.into(),
            thread: None,
        }
    }

    /// This chat's thread `thread`.
    pub fn in_thread(mut self, thread: impl Into<String>) -> Address {
        self.thread = Some(thread.into());
        self
    }
}

/// `channel:chat`, and `/thread` when there is one: for logs and the model's tool results.
impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.channel, self.chat)?;
        match &self.thread {
            Some(t) => write!(f, "/{t}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_channel_chat_and_thread() {
        assert_eq!(
            Address::new("telegram", "-100").to_string(),
            "telegram:-100"
        );
        let room = Address::new("matrix", "!abc:example.org").in_thread("$root");
        assert_eq!(room.to_string(), "matrix:!abc:example.org/$root");
        let v = serde_json::to_value(&room).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"channel": "matrix", "chat": "!abc:example.org", "thread": "$root"})
        );
        assert_eq!(serde_json::from_value::<Address>(v).unwrap(), room);
    }
}
