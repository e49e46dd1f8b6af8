//! Telegram (SPEC §10.3). Only this module names `teloxide`.

pub mod format;
pub mod split;
