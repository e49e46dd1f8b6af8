//! Architecture invariants that a grep can check (docs/ARCHITECTURE.md "Invariants", DESIGN §2).
//!
//! Every `.rs` file under `src/` is read and reduced to the code that ships:
//! - comments (`//`, `///`, `//!`, `/* */`) are dropped, so prose may name anything;
//! - `#[cfg(test)]` items are dropped, and so are files declared by `#[cfg(test)] mod x;`
//!   (`config/tests.rs`, `llm/testutil.rs`): test code may use dev-dependencies (an axum fake
//!   server in `llm/router.rs`) and quote wire JSON it checks;
//! - string literals are kept: `"anthropic-version"` in a string is exactly what must not leak.
//!
//! Each check names where a word may appear and fails listing every offending `file:line`.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One line of shipped code (comments removed, test items skipped).
#[derive(Debug, Clone)]
struct CodeLine {
    /// Path relative to the package root, with `/` separators, e.g. `src/llm/router.rs`.
    file: String,
    /// 1-based.
    line: usize,
    text: String,
}

/// A rule: lines matching `matches` may only appear in files under one of `allowed` (path
/// prefixes relative to the package root; empty = nowhere).
struct Rule<'a> {
    what: &'a str,
    why: &'a str,
    allowed: &'a [&'a str],
    matches: &'a dyn Fn(&str) -> bool,
}

/// The shipped code of `src/`, read once per test binary.
fn src_lines() -> &'static [CodeLine] {
    static LINES: OnceLock<Vec<CodeLine>> = OnceLock::new();
    LINES.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        collect_rs_files(&root.join("src"), &mut files);
        files.sort();
        let sources: Vec<(String, String)> = files
            .iter()
            .map(|p| {
                let rel = p
                    .strip_prefix(root)
                    .expect("walked below the package root")
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                let text = std::fs::read_to_string(p)
                    .unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
                (rel, text)
            })
            .collect();
        shipped_lines(&sources)
    })
}

fn collect_rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
        let path = entry.path();
        let kind = entry
            .file_type()
            .unwrap_or_else(|e| panic!("cannot stat {}: {e}", path.display()));
        if kind.is_dir() {
            collect_rs_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The shipped lines of all `sources` (`(relative path, text)`), minus test-only files.
fn shipped_lines(sources: &[(String, String)]) -> Vec<CodeLine> {
    let mut test_files = BTreeSet::new();
    let mut per_file = Vec::new();
    for (file, text) in sources {
        let (lines, test_mods) = strip_file(text);
        let dir = module_dir(file);
        for name in test_mods {
            test_files.insert(format!("{dir}{name}.rs"));
            test_files.insert(format!("{dir}{name}/mod.rs"));
        }
        per_file.push((file, lines));
    }
    per_file
        .into_iter()
        .filter(|(file, _)| !test_files.contains(file.as_str()))
        .flat_map(|(file, lines)| {
            lines.into_iter().map(move |(line, text)| CodeLine {
                file: file.clone(),
                line,
                text,
            })
        })
        .collect()
}

/// Where the child modules of `file` live: `src/a/` for `src/a/mod.rs` and `src/a.rs`.
fn module_dir(file: &str) -> String {
    let (parent, name) = file.rsplit_once('/').unwrap_or(("", file));
    let stem = name.trim_end_matches(".rs");
    let prefix = if parent.is_empty() {
        String::new()
    } else {
        format!("{parent}/")
    };
    if matches!(stem, "mod" | "lib" | "main") {
        prefix
    } else {
        format!("{prefix}{stem}/")
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Code,
    Comment,
    Literal,
}

/// Classify every char of a Rust source as code, comment or literal (string, raw string, char).
fn classify(chars: &[char]) -> Vec<Class> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut class = vec![Class::Code; chars.len()];
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let start = i;
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            class[start..i].fill(Class::Comment);
            continue;
        }
        if c == '/' && next == Some('*') {
            let mut depth = 0usize;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            class[start..i.min(chars.len())].fill(Class::Comment);
            continue;
        }
        // Raw strings: r"…", r#"…"#, br#"…"# (the `r` must start a token).
        let token_start = |at: usize| at == 0 || !ident(chars[at - 1]);
        let raw_prefix =
            c == 'r' && (token_start(i) || (i >= 1 && chars[i - 1] == 'b' && token_start(i - 1)));
        if raw_prefix {
            let mut j = i + 1;
            while chars.get(j) == Some(&'#') {
                j += 1;
            }
            if chars.get(j) == Some(&'"') {
                let hashes = j - i - 1;
                j += 1;
                loop {
                    match chars.get(j) {
                        None => break,
                        Some('"') if (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) => {
                            j += 1 + hashes;
                            break;
                        }
                        Some(_) => j += 1,
                    }
                }
                class[i..j.min(chars.len())].fill(Class::Literal);
                i = j;
                continue;
            }
        }
        if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i = (i + 1).min(chars.len());
            class[start..i].fill(Class::Literal);
            continue;
        }
        if c == '\'' {
            // A char literal ('x', '\n', '\u{7f}') or a lifetime / label ('a, 'static).
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i = (i + 1).min(chars.len());
                class[start..i].fill(Class::Literal);
                continue;
            }
            if chars.get(i + 2) == Some(&'\'') {
                class[i..i + 3].fill(Class::Literal);
                i += 3;
                continue;
            }
        }
        i += 1;
    }
    class
}

/// One file's shipped lines `(number, text without comments)` and the names of modules it
/// declares as `#[cfg(test)] mod name;`.
fn strip_file(text: &str) -> (Vec<(usize, String)>, Vec<String>) {
    let chars: Vec<char> = text.chars().collect();
    let class = classify(&chars);
    let line_of: Vec<usize> = {
        let mut n = 1;
        chars
            .iter()
            .map(|&c| {
                let this = n;
                if c == '\n' {
                    n += 1;
                }
                this
            })
            .collect()
    };

    // The skeleton keeps code only (literals and comments become spaces) for structure.
    let skeleton: Vec<char> = chars
        .iter()
        .zip(&class)
        .map(|(&c, &k)| if k == Class::Code { c } else { ' ' })
        .collect();
    let mut test_lines = BTreeSet::new();
    let mut test_mods = Vec::new();
    let attr: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut i = 0;
    while i + attr.len() <= skeleton.len() {
        if skeleton[i..i + attr.len()] != attr[..] {
            i += 1;
            continue;
        }
        let first = line_of[i];
        let mut j = i + attr.len();
        let mut depth = 0usize;
        let mut end = skeleton.len().saturating_sub(1);
        while j < skeleton.len() {
            match skeleton[j] {
                ';' if depth == 0 => {
                    end = j;
                    let item: String = skeleton[i + attr.len()..j].iter().collect();
                    if let Some(name) = declared_mod(&item) {
                        test_mods.push(name);
                    }
                    break;
                }
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = j;
                        break;
                    }
                }
                _ => {}
            }
            j += 1;
        }
        let last = line_of.get(end).copied().unwrap_or(first);
        test_lines.extend(first..=last);
        i = end + 1;
    }

    let mut lines: Vec<(usize, String)> = Vec::new();
    let mut current = String::new();
    let mut number = 1;
    for (idx, &c) in chars.iter().enumerate() {
        if c == '\n' {
            lines.push((number, std::mem::take(&mut current)));
            number += 1;
        } else if class[idx] != Class::Comment {
            current.push(c);
        }
    }
    lines.push((number, current));
    let lines = lines
        .into_iter()
        .filter(|(n, t)| !test_lines.contains(n) && !t.trim().is_empty())
        .collect();
    (lines, test_mods)
}

/// `name` of an item `[pub(…)] mod name` (the text between the attribute and its `;`).
fn declared_mod(item: &str) -> Option<String> {
    let mut words = item.split_whitespace().skip_while(|w| w.starts_with("pub"));
    (words.next()? == "mod")
        .then(|| words.next().map(str::to_string))
        .flatten()
}

/// `pat` occurs in `text` as a whole token: an identifier character may not extend it on a side
/// where `pat` itself starts or ends with one.
fn contains_token(text: &str, pat: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let starts_ident = pat.chars().next().is_some_and(ident);
    let ends_ident = pat.chars().next_back().is_some_and(ident);
    text.match_indices(pat).any(|(at, _)| {
        let before_ok = !starts_ident || !text[..at].chars().next_back().is_some_and(ident);
        let after_ok = !ends_ident || !text[at + pat.len()..].chars().next().is_some_and(ident);
        before_ok && after_ok
    })
}

fn any_token<'a>(pats: &'a [&'a str]) -> impl Fn(&str) -> bool + 'a {
    move |line| pats.iter().any(|p| contains_token(line, p))
}

/// Lines that break `rule`, formatted `file:line: code`.
fn violations(lines: &[CodeLine], rule: &Rule<'_>) -> Vec<String> {
    lines
        .iter()
        .filter(|l| !rule.allowed.iter().any(|a| l.file.starts_with(a)))
        .filter(|l| (rule.matches)(&l.text))
        .map(|l| format!("{}:{}: {}", l.file, l.line, l.text.trim()))
        .collect()
}

fn check(rule: Rule<'_>) {
    let found = violations(src_lines(), &rule);
    if found.is_empty() {
        return;
    }
    let place = if rule.allowed.is_empty() {
        "nowhere in src/".to_string()
    } else {
        format!("only under {}", rule.allowed.join(", "))
    };
    let mut msg = format!(
        "{} may appear {place} ({}); found {}:\n",
        rule.what,
        rule.why,
        found.len()
    );
    for f in &found {
        let _ = writeln!(msg, "  {f}");
    }
    panic!("{msg}");
}

#[test]
fn the_walk_sees_the_source_tree() {
    let lines = src_lines();
    let files: BTreeSet<&str> = lines.iter().map(|l| l.file.as_str()).collect();
    for f in ["src/lib.rs", "src/store/mod.rs", "src/llm/router.rs"] {
        assert!(files.contains(f), "{f} not walked; walked: {files:?}");
    }
    assert!(
        !files.contains("src/config/tests.rs"),
        "files declared `#[cfg(test)] mod tests;` are test code"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.file == "src/store/mod.rs" && l.text.contains("Connection::open")),
        "the store's own connection must be seen, or the SQLite check proves nothing"
    );
}

#[test]
fn only_store_owns_a_sqlite_connection() {
    check(Rule {
        what: "`rusqlite::Connection` / `Connection::open`",
        why: "DESIGN §2.1: the DB actor in store/ owns every connection",
        allowed: &["src/store/"],
        matches: &|l: &str| {
            contains_token(l, "rusqlite::Connection")
                || contains_token(l, "Connection::open")
                || contains_token(l, "Connection::open_with_flags")
                || (contains_token(l, "rusqlite") && contains_token(l, "Connection"))
        },
    });
}

#[test]
fn only_channels_telegram_names_teloxide() {
    check(Rule {
        what: "`teloxide`",
        why: "DESIGN §2.1",
        allowed: &["src/channels/telegram/"],
        matches: &any_token(&["teloxide"]),
    });
}

#[test]
fn only_tools_mcp_names_rmcp() {
    check(Rule {
        what: "`rmcp`",
        why: "DESIGN §2.1",
        allowed: &["src/tools/mcp"],
        matches: &any_token(&["rmcp"]),
    });
}

#[test]
fn only_api_names_axum() {
    check(Rule {
        what: "`axum`",
        why: "DESIGN §2.1",
        allowed: &["src/api/"],
        matches: &any_token(&["axum"]),
    });
}

#[test]
fn only_llm_anthropic_knows_anthropic_json() {
    check(Rule {
        what: "`anthropic-version` / `cache_control`",
        why: "DESIGN §2.1-2.2: only llm/anthropic/ knows the Messages API wire format",
        allowed: &["src/llm/anthropic/"],
        matches: &any_token(&["anthropic-version", "cache_control"]),
    });
}

#[test]
fn only_llm_openai_knows_openai_json() {
    check(Rule {
        what: "`chat/completions` / `prompt_tokens_details`",
        why: "DESIGN §2.1-2.2: only llm/openai/ knows the chat-completions wire format",
        allowed: &["src/llm/openai/"],
        matches: &any_token(&["chat/completions", "prompt_tokens_details"]),
    });
}

#[test]
fn only_config_knows_toml() {
    check(Rule {
        what: "`toml::`",
        why: "DESIGN §2.3: everything else receives the validated, typed Config",
        allowed: &["src/config/"],
        matches: &any_token(&["toml::", "use toml"]),
    });
}

#[test]
fn library_errors_are_not_anyhow() {
    check(Rule {
        what: "`anyhow`",
        why: "DESIGN §2.8: thiserror enums in the library, anyhow only in bin/ and tests",
        allowed: &[],
        matches: &any_token(&["anyhow"]),
    });
}

#[test]
fn the_process_environment_is_never_modified() {
    check(Rule {
        what: "`set_var` / `remove_var`",
        why: "unsound in a threaded program; config/ reads variables through its Env instead",
        allowed: &[],
        matches: &any_token(&["set_var", "remove_var"]),
    });
}

#[test]
fn only_the_cli_prints() {
    check(Rule {
        what: "`println!` / `print!` / `eprintln!` / `eprint!` / `dbg!`",
        why: "the library logs through tracing; only src/cli/ (agent-send, agentd index/consolidate) prints",
        allowed: &["src/cli/"],
        matches: &any_token(&["println!", "print!", "eprintln!", "eprint!", "dbg!"]),
    });
}

// The checker checks itself: each case below must be caught or must pass.

fn synthetic(files: &[(&str, &str)]) -> Vec<CodeLine> {
    let sources: Vec<(String, String)> = files
        .iter()
        .map(|(f, t)| (f.to_string(), t.to_string()))
        .collect();
    shipped_lines(&sources)
}

fn names_axum(line: &str) -> bool {
    contains_token(line, "axum")
}

fn axum_rule() -> Rule<'static> {
    Rule {
        what: "axum",
        why: "test",
        allowed: &["src/api/"],
        matches: &names_axum,
    }
}

#[test]
fn checker_reports_file_and_line_and_honours_allowed_dirs() {
    let lines = synthetic(&[
        ("src/api/mod.rs", "use axum::Router;\n"),
        ("src/agent/mod.rs", "fn a() {}\n\nuse axum::Json;\n"),
    ]);
    assert_eq!(
        violations(&lines, &axum_rule()),
        ["src/agent/mod.rs:3: use axum::Json;"]
    );
}

#[test]
fn checker_ignores_comments_but_not_strings() {
    let src = "// axum in a line comment\n\
               /// axum in a doc comment\n\
               let x = 1; // axum after code\n\
               /* axum in a block /* nested axum */ comment */\n\
               let h = \"axum\";\n\
               let r = r#\"axum \"quoted\" \"#;\n";
    let lines = synthetic(&[("src/x.rs", src)]);
    let found = violations(&lines, &axum_rule());
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("src/x.rs:5:"), "{found:?}");
    assert!(found[1].starts_with("src/x.rs:6:"), "{found:?}");
}

#[test]
fn checker_skips_cfg_test_items_and_test_only_files() {
    let lib = "pub fn shipped() { let _ = '{'; }\n\
               #[cfg(test)]\n\
               mod testutil;\n\
               pub mod real;\n\
               #[cfg(test)]\n\
               mod tests {\n\
                   const S: &str = \"}}} {\";\n\
                   use axum::Router;\n\
               }\n\
               pub fn after() { axum_like(); }\n\
               use axum::Json;\n";
    let lines = synthetic(&[
        ("src/llm/mod.rs", lib),
        ("src/llm/testutil.rs", "use axum::Router;\n"),
        ("src/llm/real.rs", "use axum::Real;\n"),
    ]);
    assert_eq!(
        violations(&lines, &axum_rule()),
        [
            "src/llm/mod.rs:11: use axum::Json;",
            "src/llm/real.rs:1: use axum::Real;"
        ]
    );
}

#[test]
fn tokens_need_boundaries() {
    assert!(contains_token("use toml::Table;", "toml::"));
    assert!(!contains_token("use my_toml::Table;", "toml::"));
    assert!(contains_token("println!(\"x\")", "println!"));
    assert!(!contains_token("eprintln!(\"x\")", "println!"));
    assert!(!contains_token("eprint!(\"x\")", "print!"));
    assert!(!contains_token("let axum_like = 1;", "axum"));
    assert!(contains_token("\"anthropic-version\"", "anthropic-version"));
}

#[test]
fn module_dirs() {
    assert_eq!(module_dir("src/lib.rs"), "src/");
    assert_eq!(module_dir("src/llm/mod.rs"), "src/llm/");
    assert_eq!(module_dir("src/cost.rs"), "src/cost/");
}
