//! The cost autopilot's sections (SPEC §20): `[caching]` (the cache TTL per session) and
//! `[alerts]` (where alert notices go).

use super::keys::behavior::{ALERTS_TELEGRAM_CHAT, CACHING_TTL};
use super::types::{AlertsConfig, CachingConfig};
use super::walker::Section;

/// `[caching]`: `ttl = "5m" | "1h" | "auto"` (default `auto`).
pub fn caching(root: &mut Section<'_>) -> CachingConfig {
    let mut s = root.section("caching");
    CachingConfig {
        ttl: s.read(&CACHING_TTL),
    }
}

/// `[alerts]`: `telegram_chat` (a chat id, not 0; default none).
pub fn alerts(root: &mut Section<'_>) -> AlertsConfig {
    let mut s = root.section("alerts");
    let telegram_chat = s.read(&ALERTS_TELEGRAM_CHAT);
    if telegram_chat == Some(0) {
        s.problem(
            "telegram_chat",
            "0 is not a chat id; give the chat's id (e.g. -1001234567890) or remove the key",
        );
    }
    AlertsConfig {
        telegram_chat: telegram_chat.filter(|c| *c != 0),
    }
}
