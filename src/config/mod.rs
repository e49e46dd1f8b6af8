//! Configuration: `agentd.toml` + `providers.d/*.toml` + `.env` → validated `Config`.
//! Only this module knows the TOML layout.

mod types;
pub use types::*;
