//! Configuration: `agentd.toml` + `providers.d/*.toml` + `.env` → validated `Config`
//! (SPEC §2, §3, §4). Only this module knows the TOML layout.
//!
//! Layout:
//! - `walker`: typed extraction from a `toml::Table` that collects every problem and reports
//!   unknown keys (with a "did you mean") — no serde, so one mistake never hides the next.
//! - `env`: `.env` parsing, the process-env-first lookup, `${VAR}` expansion.
//! - `paths`: `~` expansion and resolution against a base directory.
//! - `keys`: the key table — every key declared once (table, name, type and bounds, default,
//!   live or restart, doc); parsing, rendering, the diff, the SIGHUP merge and the reference in
//!   `docs/configuration.md` come from it.
//! - `sections`, `channels`, `tools`, `mcp`, `schedule`: one function per TOML section, reading
//!   the keys of the table and checking what spans keys.
//! - `providers`: provider files, inheritance, model defaults and validation → `ModelSet`.
//! - `load`: the orchestration; `render`: `render_effective` for `agentd check-config`.
//! - `migrate`: `check-config --migrate`, the file rewritten with the renames of
//!   `keys::renames` (old keys still load, with a warning).
//! - `live`: the running config, replaced on SIGHUP; `diff`: what changed and what a reload
//!   applies (`agentd check-config --diff`).

mod approvals;
mod autopilot;
mod channels;
pub mod diff;
mod env;
mod error;
pub mod keys;
mod live;
mod load;
mod matrix;
mod mcp;
pub mod migrate;
mod paths;
mod providers;
mod render;
mod schedule;
mod secrets;
mod sections;
mod tools;
mod types;
mod voice;
mod walker;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use approvals::glob_matches;
pub use error::{ConfigError, Problem};
pub use live::Live;
pub use load::ROUTING_SOURCES;
pub use matrix::MatrixConfig;
pub use providers::{ANTHROPIC_BASE_URL, INLINE_PROVIDER, OPENAI_BASE_URL};
pub use render::{render_effective, render_effective_json};
pub use schedule::parse_every;
pub use sections::system_timezone;
pub use tools::{BRAVE_KEY_ENV, BUILTIN_TOOLS};
pub use types::*;

/// The config file to load: `-c PATH` > `$AGENTD_CONFIG` > `./config/agentd.toml`.
pub fn resolve_config_path(cli: Option<&Path>) -> PathBuf {
    if let Some(p) = cli {
        return p.to_path_buf();
    }
    match std::env::var_os("AGENTD_CONFIG") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from("./config/agentd.toml"),
    }
}

/// Load agentd.toml (+ the `.env` beside it, + the providers.d files it names), validate
/// everything, and resolve secrets. Every problem is reported at once in
/// [`ConfigError::Invalid`].
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load::load(path, load::ProcessSource::Real)
}

/// Like [`load`], but `process_env` stands in for the process environment (tests and tools
/// that must not depend on the caller's environment). The `.env` file is still read.
pub fn load_with_env(
    path: &Path,
    process_env: BTreeMap<String, String>,
) -> Result<Config, ConfigError> {
    load::load(path, load::ProcessSource::Fixed(process_env))
}

/// Parse TOML text into a table; a syntax error becomes one line with line and column.
fn parse_toml(text: &str) -> Result<toml::Table, String> {
    text.parse::<toml::Table>().map_err(|e| {
        let message = e.message().trim().to_string();
        match e.span() {
            Some(span) => {
                let (line, col) = line_col(text, span.start);
                format!("TOML syntax error at line {line}, column {col}: {message}")
            }
            None => format!("TOML syntax error: {message}"),
        }
    })
}

/// 1-based line and column (in characters) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rsplit('\n')
        .next()
        .map(|l| l.chars().count())
        .unwrap_or(0)
        + 1;
    (line, col)
}
