//! Matrix rooms as neutral addresses (SPEC §5.6, §21): the channel's name, a room id as the
//! address's `chat` (a user id for a contact: the direct chat with that user), an event id as
//! the channel's message reference. Also who is allowed (`allow_from` with server globs), the
//! session key of a room, and the transaction id of a send.

use sha2::{Digest, Sha256};

use crate::config::{Config, MatrixConfig};
use crate::message::Address;
use crate::tools::outbound::Book;

/// The channel's name in addresses, routes and `delivery` records.
pub const CHANNEL: &str = "matrix";

/// Matrix's contacts for `tools::outbound::Contacts`.
pub const BOOK: Book = Book {
    contact,
    names,
    approvals: |_| None,
    alerts: |_| None,
};

/// The address of room (or, for a contact, user) `id`.
pub fn address(id: &str) -> Address {
    Address::new(CHANNEL, id)
}

/// The room or user id of `to`; an address of another channel is refused naming it.
pub fn target(to: &Address) -> Result<&str, String> {
    if to.channel != CHANNEL {
        return Err(format!("{to} is not a Matrix room"));
    }
    // Room ids of room version 12 have no server part (`!opaque`); user ids always do.
    let ok = match to.chat.chars().next() {
        Some('!') => to.chat.len() > 1,
        Some('@') => to.chat.contains(':'),
        _ => false,
    };
    if !ok {
        return Err(format!(
            "{to} is not a Matrix room (a room id is \"!opaque\" or \"!opaque:server\")"
        ));
    }
    Ok(&to.chat)
}

/// The session key of room `room_id`.
pub fn session_key(room_id: &str) -> String {
    format!("mx:{room_id}")
}

/// The intake id of event `event_id` (intake drops repeats by id).
pub fn intake_id(event_id: &str) -> String {
    format!("mx-{event_id}")
}

/// Whether `user_id` matches one of `patterns` (`@name:server`, or `@name:*` for any server).
pub fn allowed_by(user_id: &str, patterns: &[String]) -> bool {
    let Some((local, _)) = user_id.split_once(':') else {
        return false;
    };
    patterns.iter().any(|p| match p.strip_suffix(":*") {
        Some(plocal) => plocal == local,
        None => p == user_id,
    })
}

/// Whether `user_id` may talk to the bot and invite it.
pub fn allowed(user_id: &str, cfg: &MatrixConfig) -> bool {
    allowed_by(user_id, &cfg.allow_from)
}

/// Whether the bot answers in `room_id` (`rooms` empty: any room it joined).
pub fn room_allowed(room_id: &str, cfg: &MatrixConfig) -> bool {
    cfg.rooms.is_empty() || cfg.rooms.iter().any(|r| r == room_id)
}

/// The transaction id of a send with key `key` (the outbox's delivery part,
/// `tools::outbound::send_key`): the same on every try, so a resend after a lost answer or a
/// crash is the same transaction and the homeserver posts it once (`PUT /send/{type}/{txnId}`
/// is idempotent per device). `kind` keeps a text part and a reaction of one key apart.
pub fn txn_id(kind: &str, key: &str) -> String {
    let digest = Sha256::digest(format!("{kind}\n{key}").as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("agentd-{hex}")
}

fn contact(cfg: &Config, name: &str) -> Option<Address> {
    cfg.matrix.contacts.get(name).map(|id| address(id))
}

fn names(cfg: &Config) -> Vec<String> {
    cfg.matrix.contacts.keys().cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_from_globs_only_the_server_part() {
        let p = vec!["@alice:*".to_string(), "@bob:example.org".to_string()];
        assert!(allowed_by("@alice:example.org", &p));
        assert!(allowed_by("@alice:localhost:8008", &p));
        assert!(allowed_by("@bob:example.org", &p));
        assert!(!allowed_by("@bob:evil.org", &p));
        assert!(!allowed_by("@alicex:example.org", &p));
        assert!(!allowed_by("@mallory:example.org", &p));
        assert!(!allowed_by("alice", &p));
        assert!(!allowed_by("@alice:example.org", &[]));
    }

    #[test]
    fn rooms_round_trip_through_addresses() {
        let room = address("!abc:example.org");
        assert_eq!(room, Address::new("matrix", "!abc:example.org"));
        assert_eq!(target(&room), Ok("!abc:example.org"));
        assert_eq!(
            target(&address("!v12opaque")),
            Ok("!v12opaque"),
            "room version 12"
        );
        assert!(
            target(&Address::new("telegram", "1"))
                .unwrap_err()
                .contains("not a Matrix")
        );
        assert!(target(&Address::new("matrix", "x")).is_err());
        assert_eq!(session_key("!abc:x"), "mx:!abc:x");
        assert_eq!(intake_id("$ev"), "mx-$ev");
    }

    #[test]
    fn transaction_ids_are_stable_per_key_and_kind() {
        let a = txn_id("text", "s1/mx-$e#0");
        assert_eq!(
            a,
            txn_id("text", "s1/mx-$e#0"),
            "a retry is the same transaction"
        );
        assert_ne!(a, txn_id("text", "s1/mx-$e#1"), "the next part is another");
        assert_ne!(a, txn_id("react", "s1/mx-$e#0"));
        assert!(a.starts_with("agentd-") && a.len() == 39);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    }
}
