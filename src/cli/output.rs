//! What an action prints and how the process exits, kept apart from the printing itself so it
//! can be tested.

use super::error::{EXIT_FAILURE, EXIT_OK};

/// Text for stdout and stderr plus the exit code of one `agent-send` run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
}

impl Output {
    /// Success with `text` on stdout (a newline is added when missing).
    pub fn stdout(text: impl Into<String>) -> Output {
        Output {
            stdout: with_newline(text.into()),
            ..Output::default()
        }
    }

    /// Success with `value` pretty-printed on stdout.
    pub fn json(value: &serde_json::Value) -> Output {
        Output::stdout(serde_json::to_string_pretty(value).unwrap_or_else(|_| "null".into()))
    }

    /// Success with nothing printed.
    pub fn silent() -> Output {
        Output::default()
    }

    /// Add a note for stderr (a newline is added when missing).
    pub fn with_stderr(mut self, text: impl Into<String>) -> Output {
        self.stderr.push_str(&with_newline(text.into()));
        self
    }

    /// Set the exit code to failure (1).
    pub fn failed(mut self) -> Output {
        self.code = EXIT_FAILURE;
        self
    }

    /// Whether the exit code is 0.
    pub fn is_ok(&self) -> bool {
        self.code == EXIT_OK
    }
}

fn with_newline(mut s: String) -> String {
    if !s.is_empty() && !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs() {
        let o = Output::stdout("x").with_stderr("note").failed();
        assert_eq!(o.stdout, "x\n");
        assert_eq!(o.stderr, "note\n");
        assert!(!o.is_ok());
        assert_eq!(Output::stdout("").stdout, "");
        assert!(Output::silent().is_ok());
    }
}
