//! The cost autopilot's sections (SPEC §20): `[caching]` (the cache TTL per session) and
//! `[alerts]` (where alert notices go).

use super::types::{AlertsConfig, CachingConfig, CachingTtl};
use super::walker::Section;

/// `[caching]`: `ttl = "5m" | "1h" | "auto"` (default `auto`).
pub fn caching(root: &mut Section<'_>) -> CachingConfig {
    let mut s = root.section("caching");
    let ttl = s
        .choice(
            "ttl",
            &[
                ("5m", CachingTtl::FiveMinutes),
                ("1h", CachingTtl::OneHour),
                ("auto", CachingTtl::Auto),
            ],
        )
        .unwrap_or(CachingTtl::Auto);
    CachingConfig { ttl }
}

/// `[alerts]`: `telegram_chat` (a chat id, not 0; default none).
pub fn alerts(root: &mut Section<'_>) -> AlertsConfig {
    let mut s = root.section("alerts");
    let telegram_chat = s.get::<i64>("telegram_chat");
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
