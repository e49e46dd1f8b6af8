//! Telegram chats as neutral addresses (SPEC §5.6): the channel's name, a chat id as the
//! address's `chat`, a message id as the channel's message reference, and the chats the config
//! names by number (`contacts`, `[approvals] telegram_chat`, `[alerts] telegram_chat`) as
//! addresses. The rest of the daemon holds only the [`Address`].

use crate::config::Config;
use crate::message::Address;
use crate::tools::outbound::Book;

/// The channel's name in addresses, routes and `delivery` records.
pub const CHANNEL: &str = "telegram";

/// Telegram's contacts and configured chats for `tools::outbound::Contacts`.
pub const BOOK: Book = Book {
    contact,
    names,
    approvals,
    alerts,
};

/// The address of Telegram chat `chat_id`.
pub fn address(chat_id: i64) -> Address {
    Address::new(CHANNEL, chat_id.to_string())
}

/// The chat id of `to`; an address of another channel, or one whose chat is not a number, is
/// refused naming it.
pub fn chat_id(to: &Address) -> Result<i64, String> {
    if to.channel != CHANNEL {
        return Err(format!("{to} is not a Telegram chat"));
    }
    to.chat
        .parse()
        .map_err(|_| format!("{to} is not a Telegram chat (a chat id is a number)"))
}

/// The message reference of Telegram message `id`.
pub fn message_ref(id: i32) -> String {
    id.to_string()
}

/// The Telegram message id of reference `message`.
pub fn message_id(message: &str) -> Result<i32, String> {
    message
        .parse()
        .map_err(|_| format!("{message:?} is not a Telegram message id"))
}

fn contact(cfg: &Config, name: &str) -> Option<Address> {
    cfg.telegram.contacts.get(name).map(|id| address(*id))
}

fn names(cfg: &Config) -> Vec<String> {
    cfg.telegram.contacts.keys().cloned().collect()
}

fn approvals(cfg: &Config) -> Option<Address> {
    cfg.approvals.telegram_chat.map(address)
}

fn alerts(cfg: &Config) -> Option<Address> {
    cfg.alerts.telegram_chat.map(address)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chats_and_messages_round_trip_through_addresses() {
        let group = address(-100200);
        assert_eq!(group, Address::new("telegram", "-100200"));
        assert_eq!(chat_id(&group), Ok(-100200));
        let room = Address::new("matrix", "!abc:example.org");
        assert!(chat_id(&room).unwrap_err().contains("not a Telegram chat"));
        assert!(chat_id(&Address::new("telegram", "x")).is_err());
        assert_eq!(message_id(&message_ref(42)), Ok(42));
        assert!(message_id("$event").is_err());
    }
}
