//! Matrix (SPEC §21), through `matrix-sdk`: end-to-end encryption, its SQLite stores in
//! `state_dir/matrix/`. Only this module names `matrix_sdk` and `ruma`. [`address`] maps rooms
//! to neutral addresses and derives transaction ids, [`inbound`] reads events (as JSON) into
//! messages, [`client`] logs in and sends, [`media`] downloads (streamed, capped), [`sync`] is the sync loop with our persisted token.

pub mod address;
pub mod client;
pub mod inbound;
pub mod media;
pub mod outbound;
pub mod sync;

/// Log targets (with their cap) kept at `warn` unless the log filter names them: matrix-sdk
/// and ruma log every sync and key share at `info` (prefixes: `matrix_sdk_crypto` too).
pub const QUIET_LOG_TARGETS: &[(&str, &str)] = &[("matrix_sdk", "warn"), ("ruma", "warn")];
