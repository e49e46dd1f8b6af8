//! Environment lookup for the config: the process environment first, then the `.env` file
//! beside the config. The process environment is never modified (`set_var` is unsafe in a
//! threaded program); everything that needs a variable asks an [`Env`].

use std::collections::BTreeMap;

/// Where variables come from: the process environment (or a fixed stand-in for tests), then
/// the `.env` map.
#[derive(Debug, Clone, Default)]
pub struct Env {
    process: ProcessEnv,
    dotenv: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default)]
enum ProcessEnv {
    /// `std::env::var`.
    #[default]
    Real,
    /// A fixed map standing in for the process environment.
    Fixed(BTreeMap<String, String>),
}

impl Env {
    /// The real process environment plus the given `.env` variables.
    pub fn new(dotenv: BTreeMap<String, String>) -> Self {
        Env {
            process: ProcessEnv::Real,
            dotenv,
        }
    }

    /// A fixed map in place of the process environment (tests, embedding).
    pub fn with_process_map(
        process: BTreeMap<String, String>,
        dotenv: BTreeMap<String, String>,
    ) -> Self {
        Env {
            process: ProcessEnv::Fixed(process),
            dotenv,
        }
    }

    /// The value of `name`: process environment first, then `.env`. Non-UTF-8 process values
    /// count as unset.
    pub fn get(&self, name: &str) -> Option<String> {
        let from_process = match &self.process {
            ProcessEnv::Real => std::env::var(name).ok(),
            ProcessEnv::Fixed(map) => map.get(name).cloned(),
        };
        from_process.or_else(|| self.dotenv.get(name).cloned())
    }

    /// Like [`Env::get`] but treats an empty or all-whitespace value as unset (for secrets).
    /// An empty process variable does not hide a value in `.env`.
    pub fn get_non_empty(&self, name: &str) -> Option<String> {
        let non_empty =
            |v: Option<String>| v.map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let from_process = match &self.process {
            ProcessEnv::Real => std::env::var(name).ok(),
            ProcessEnv::Fixed(map) => map.get(name).cloned(),
        };
        non_empty(from_process).or_else(|| non_empty(self.dotenv.get(name).cloned()))
    }
}

/// A malformed `.env` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DotenvProblem {
    /// 1-based line number.
    pub line: usize,
    pub message: String,
}

/// Parse a `.env` file: `KEY=VALUE` lines, `#` comments, blank lines, an optional `export `
/// prefix, matching single or double quotes around the value stripped. In an unquoted value a
/// ` #` starts a comment. A later line for the same key wins.
pub fn parse_dotenv(text: &str) -> (BTreeMap<String, String>, Vec<DotenvProblem>) {
    let mut vars = BTreeMap::new();
    let mut problems = Vec::new();
    for (idx, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line
            .strip_prefix("export ")
            .map(str::trim_start)
            .unwrap_or(line);
        let Some((key, value)) = line.split_once('=') else {
            problems.push(DotenvProblem {
                line: idx + 1,
                message: "expected KEY=VALUE".into(),
            });
            continue;
        };
        let key = key.trim();
        if !is_var_name(key) {
            problems.push(DotenvProblem {
                line: idx + 1,
                message: format!(
                    "invalid variable name {key:?}; use letters, digits and _ (not starting with a digit)"
                ),
            });
            continue;
        }
        vars.insert(key.to_string(), unquote(value.trim()));
    }
    (vars, problems)
}

fn unquote(value: &str) -> String {
    for q in ['"', '\''] {
        if value.len() >= 2 && value.starts_with(q) && value.ends_with(q) {
            return value[1..value.len() - 1].to_string();
        }
    }
    // Unquoted: " #" starts a comment.
    match value.find(" #").or_else(|| value.find("\t#")) {
        Some(pos) => value[..pos].trim_end().to_string(),
        None => value.to_string(),
    }
}

/// `[A-Za-z_][A-Za-z0-9_]*`
pub fn is_var_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Why `${VAR}` expansion failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpandError {
    /// `${NAME}` names a variable that is not set.
    Undefined(String),
    /// `${` without a closing `}` or with an invalid name inside.
    Malformed(String),
}

impl ExpandError {
    /// A message naming the fix.
    pub fn message(&self) -> String {
        match self {
            ExpandError::Undefined(name) => format!(
                "environment variable {name} (used as ${{{name}}}) is not set; put it in the .env beside the config or the environment"
            ),
            ExpandError::Malformed(what) => format!(
                "malformed variable reference {what:?}; write ${{NAME}} with NAME of letters, digits and _ (or $${{ for a literal ${{)"
            ),
        }
    }
}

/// Expand `${NAME}` in `s` using `env`. `$${` yields a literal `${`; any other `$` is kept.
pub fn expand(s: &str, env: &Env) -> Result<String, ExpandError> {
    if !s.contains('$') {
        return Ok(s.to_string());
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix("${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix('{') {
            let Some(end) = tail.find('}') else {
                return Err(ExpandError::Malformed(rest[pos..].to_string()));
            };
            let name = &tail[..end];
            if !is_var_name(name) {
                return Err(ExpandError::Malformed(format!("${{{name}}}")));
            }
            match env.get(name) {
                Some(v) => out.push_str(&v),
                None => return Err(ExpandError::Undefined(name.to_string())),
            }
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn dotenv_parses_comments_quotes_and_export() {
        let text = "# comment\n\nA=1\nexport B = \"two words\"\nC='single # not a comment'\nD=plain # trailing comment\nE=\nA=override\n";
        let (vars, problems) = parse_dotenv(text);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(vars["A"], "override");
        assert_eq!(vars["B"], "two words");
        assert_eq!(vars["C"], "single # not a comment");
        assert_eq!(vars["D"], "plain");
        assert_eq!(vars["E"], "");
        assert_eq!(vars.len(), 5);
    }

    #[test]
    fn dotenv_reports_bad_lines_with_numbers() {
        let (vars, problems) = parse_dotenv("GOOD=1\nno equals sign\n1BAD=x\n");
        assert_eq!(vars.len(), 1);
        assert_eq!(problems.len(), 2);
        assert_eq!(problems[0].line, 2);
        assert_eq!(problems[1].line, 3);
        assert!(problems[1].message.contains("1BAD"));
    }

    #[test]
    fn process_environment_wins_over_dotenv() {
        let env = Env::with_process_map(
            map(&[("K", "from-process")]),
            map(&[("K", "from-dotenv"), ("ONLY_FILE", "file")]),
        );
        assert_eq!(env.get("K").as_deref(), Some("from-process"));
        assert_eq!(env.get("ONLY_FILE").as_deref(), Some("file"));
        assert_eq!(env.get("MISSING"), None);
    }

    #[test]
    fn real_process_environment_is_consulted() {
        // PATH is set in every test environment; the dotenv value must lose.
        let env = Env::new(map(&[("PATH", "dotenv-path")]));
        let path = env.get("PATH");
        assert!(path.is_some());
        assert_ne!(path.as_deref(), Some("dotenv-path"));
    }

    #[test]
    fn empty_secret_counts_as_unset() {
        let env = Env::with_process_map(
            map(&[("EMPTY", "  "), ("SHADOW", "")]),
            map(&[("SHADOW", "from-file")]),
        );
        assert_eq!(env.get_non_empty("EMPTY"), None);
        assert_eq!(env.get("EMPTY").as_deref(), Some("  "));
        // An empty process variable does not hide the .env value of a secret.
        assert_eq!(env.get_non_empty("SHADOW").as_deref(), Some("from-file"));
    }

    #[test]
    fn expands_variables_and_escapes() {
        let env =
            Env::with_process_map(map(&[("HOST", "example.org"), ("P", "8")]), BTreeMap::new());
        assert_eq!(
            expand("https://${HOST}:80${P}/x", &env).unwrap(),
            "https://example.org:808/x"
        );
        assert_eq!(
            expand("cost $5 and $${HOST}", &env).unwrap(),
            "cost $5 and ${HOST}"
        );
        assert_eq!(expand("no vars", &env).unwrap(), "no vars");
    }

    #[test]
    fn undefined_and_malformed_references_are_errors() {
        let env = Env::with_process_map(BTreeMap::new(), BTreeMap::new());
        assert_eq!(
            expand("${NOPE}", &env),
            Err(ExpandError::Undefined("NOPE".into()))
        );
        assert!(
            ExpandError::Undefined("NOPE".into())
                .message()
                .contains("NOPE")
        );
        assert!(matches!(
            expand("${OPEN", &env),
            Err(ExpandError::Malformed(_))
        ));
        assert!(matches!(
            expand("${1X}", &env),
            Err(ExpandError::Malformed(_))
        ));
    }

    proptest! {
        #[test]
        fn dotenv_never_panics(text in "\\PC*") {
            let _ = parse_dotenv(&text);
        }

        #[test]
        fn expand_never_panics_and_is_identity_without_dollar(s in "\\PC*") {
            let env = Env::with_process_map(BTreeMap::new(), BTreeMap::new());
            let r = expand(&s, &env);
            if !s.contains('$') {
                prop_assert_eq!(r, Ok(s.clone()));
            }
        }

        #[test]
        fn dotenv_roundtrips_simple_pairs(key in "[A-Z_][A-Z0-9_]{0,10}", value in "[a-zA-Z0-9_./:-]{0,20}") {
            let (vars, problems) = parse_dotenv(&format!("{key}={value}\n"));
            prop_assert!(problems.is_empty());
            prop_assert_eq!(vars.get(&key), Some(&value));
        }
    }
}
