//! Telegram (SPEC §10.3). Only this module names `teloxide`.

pub mod address;
pub mod client;
pub mod format;
pub mod inbound;
mod lanes;
pub mod poll;
pub mod split;
