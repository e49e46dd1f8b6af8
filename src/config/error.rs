//! Errors of configuration loading: an I/O failure on the config file itself, or the complete
//! list of validation problems.

use std::fmt;
use std::path::{Path, PathBuf};

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {}: {source}", display_path(path))]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The config (or a file it pulls in) has problems; all of them are listed.
    #[error("{}", render_problems(problems))]
    Invalid {
        /// The agentd.toml that was loaded.
        path: PathBuf,
        problems: Vec<Problem>,
    },
}

fn render_problems(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(Problem::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// One thing wrong with the configuration, pinned to a file and a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file the problem is in (agentd.toml, a provider file or `.env`).
    pub file: PathBuf,
    /// Dotted key path, e.g. `behavior.max_turns_per_message`; empty for file-level problems.
    pub key: String,
    /// What is wrong and how to fix it. Never contains a secret value.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: {}", display_path(&self.file), self.message)
        } else {
            write!(
                f,
                "{}: {}: {}",
                display_path(&self.file),
                self.key,
                self.message
            )
        }
    }
}

/// A path as the operator would type it: relative to the current directory when it lies below
/// it, absolute otherwise.
pub fn display_path(path: &Path) -> String {
    if let Ok(cwd) = std::env::current_dir()
        && let Ok(rel) = path.strip_prefix(&cwd)
        && !rel.as_os_str().is_empty()
    {
        return rel.display().to_string();
    }
    path.display().to_string()
}

impl ConfigError {
    /// `check-config --json` (and `doctor --json`) when the config does not load: one document,
    /// `{"ok": false, "config": path, "problems": [{"file", "key", "message"}]}`; a file that
    /// cannot be read is one problem with an empty key.
    pub fn to_json(&self) -> serde_json::Value {
        let problem = |file: &std::path::Path, key: &str, message: String| serde_json::json!({"file": file.display().to_string(), "key": key, "message": message});
        let (path, problems) = match self {
            ConfigError::Io { path, source } => (
                path,
                vec![problem(
                    path,
                    "",
                    format!("cannot read the config file: {source}"),
                )],
            ),
            ConfigError::Invalid { path, problems } => (
                path,
                problems
                    .iter()
                    .map(|p| problem(&p.file, &p.key, p.message.clone()))
                    .collect(),
            ),
        };
        serde_json::json!({
            "ok": false,
            "config": path.display().to_string(),
            "problems": problems,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_lists_every_problem_on_its_own_line() {
        let err = ConfigError::Invalid {
            path: PathBuf::from("/x/agentd.toml"),
            problems: vec![
                Problem {
                    file: PathBuf::from("/x/agentd.toml"),
                    key: "agent.name".into(),
                    message: "required".into(),
                },
                Problem {
                    file: PathBuf::from("/x/agentd.toml"),
                    key: String::new(),
                    message: "line 1, column 2: bad".into(),
                },
            ],
        };
        let text = err.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "/x/agentd.toml: agent.name: required",
                "/x/agentd.toml: line 1, column 2: bad"
            ]
        );
    }
}
