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
//!
//! The layering check reads the same lines: every `crate::<module>` path leaving its top-level
//! module must point to the same layer or a lower one (`LAYERS`, docs/ARCHITECTURE.md
//! "Layers"), and the top-level modules must form no cycle.

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
    /// `text` with string and char literals blanked: the code alone, for path checks.
    code: String,
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
    &src().0
}

/// Each shipped file of `src/` and its size in lines without test items.
fn src_sizes() -> &'static [(String, usize)] {
    &src().1
}

#[allow(clippy::type_complexity)]
fn src() -> &'static (Vec<CodeLine>, Vec<(String, usize)>) {
    static SRC: OnceLock<(Vec<CodeLine>, Vec<(String, usize)>)> = OnceLock::new();
    SRC.get_or_init(|| {
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

/// The shipped lines of all `sources` (`(relative path, text)`), minus test-only files, and
/// each shipped file's size in lines (its test items left out).
fn shipped_lines(sources: &[(String, String)]) -> (Vec<CodeLine>, Vec<(String, usize)>) {
    let mut test_files = BTreeSet::new();
    let mut per_file = Vec::new();
    for (file, text) in sources {
        let (lines, test_mods, size) = strip_file(text);
        let dir = module_dir(file);
        for name in test_mods {
            test_files.insert(format!("{dir}{name}.rs"));
            test_files.insert(format!("{dir}{name}/mod.rs"));
        }
        per_file.push((file, lines, size));
    }
    let shipped: Vec<_> = per_file
        .into_iter()
        .filter(|(file, ..)| !test_files.contains(file.as_str()))
        .collect();
    let sizes = shipped
        .iter()
        .map(|(file, _, size)| ((*file).clone(), *size))
        .collect();
    let lines = shipped
        .into_iter()
        .flat_map(|(file, lines, _)| {
            lines.into_iter().map(move |(line, text, code)| CodeLine {
                file: file.clone(),
                line,
                text,
                code,
            })
        })
        .collect();
    (lines, sizes)
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

/// One file's shipped lines `(number, text without comments, code without literals)`, the
/// names of modules it declares as `#[cfg(test)] mod name;`, and its size without test items.
#[allow(clippy::type_complexity)]
fn strip_file(text: &str) -> (Vec<(usize, String, String)>, Vec<String>, usize) {
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

    let mut lines: Vec<(usize, String, String)> = Vec::new();
    let mut current = String::new();
    let mut code = String::new();
    let mut number = 1;
    for (idx, &c) in chars.iter().enumerate() {
        if c == '\n' {
            lines.push((
                number,
                std::mem::take(&mut current),
                std::mem::take(&mut code),
            ));
            number += 1;
        } else if class[idx] != Class::Comment {
            current.push(c);
            code.push(skeleton[idx]);
        }
    }
    lines.push((number, current, code));
    let size = text.lines().count().saturating_sub(test_lines.len());
    let lines = lines
        .into_iter()
        .filter(|(n, t, _)| !test_lines.contains(n) && !t.trim().is_empty())
        .collect();
    (lines, test_mods, size)
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
fn only_channels_matrix_names_matrix_sdk() {
    check(Rule {
        what: "`matrix_sdk` / `matrix_sdk_crypto` / `ruma`",
        why: "one module knows the Matrix client (docs/ARCHITECTURE.md invariant 6)",
        allowed: &["src/channels/matrix/"],
        matches: &any_token(&["matrix_sdk", "matrix_sdk_crypto", "ruma"]),
    });
}

#[test]
fn only_tools_mcp_and_api_mcp_name_rmcp() {
    check(Rule {
        what: "`rmcp`",
        why: "DESIGN §2.1: the MCP client is tools/mcp/, the MCP server api/mcp/",
        allowed: &["src/tools/mcp/", "src/api/mcp/"],
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

/// What reaches a model provider: the clients of `llm` (`Llm`, the `Provider` trait and
/// `provider_for`, the client types) and the audio endpoints' calls.
const PROVIDER_ACCESS: &[&str] = &[
    "Llm",
    "Provider",
    "provider_for",
    "AnthropicClient",
    "OpenAiClient",
    "audio::transcribe",
    "audio::speak",
];

fn names_provider_access(line: &str) -> bool {
    PROVIDER_ACCESS.iter().any(|p| contains_token(line, p))
}

/// Issue 31 item 1: one provider gateway. Code that names a client can call a provider
/// without the budget check, the cost row or the metrics; only `llm/` (the clients) and the
/// gateway that owns them may.
fn provider_rule() -> Rule<'static> {
    Rule {
        what: "a provider client (`Llm`, `Provider`, `provider_for`, `AnthropicClient`, \
               `OpenAiClient`, `llm::audio::transcribe` / `speak`)",
        why: "every provider call goes through gateway::Gateway: budget check, call with the \
              SPEC §6 retries, cost row, metrics; call Gateway::chat / embed / transcribe / \
              speak, or add a method there for a new kind",
        allowed: &["src/llm/", "src/gateway.rs"],
        matches: &names_provider_access,
    }
}

#[test]
fn only_the_gateway_calls_a_provider() {
    check(provider_rule());
}

/// The gateway writes the cost row of the call it made: a row written elsewhere would be a
/// cost `/metrics` does not count, or a call billed twice.
#[test]
fn only_the_gateway_writes_a_cost_row() {
    check(Rule {
        what: "a cost row (`Ledger::record_call`, `Ledger::record_audio`)",
        why: "the gateway writes the row of each provider call it makes and counts it in the \
              metrics; make the call through gateway::Gateway",
        allowed: &["src/cost.rs", "src/cost/", "src/gateway.rs"],
        matches: &|line| {
            contains_token(line, "record_call") || contains_token(line, "record_audio")
        },
    });
}

// ---------------------------------------------------------------------------------------------
// Layers: which top-level module of src/ may use which.

/// The layer of every top-level module of `src/`, lowest first. A module may `use crate::x`
/// only for an `x` in its own layer or a lower one; sub-modules of one top-level module use each
/// other freely, and tests may use anything. Keep this table and docs/ARCHITECTURE.md's
/// layering section ("Layers") the same.
const LAYERS: &[&[&str]] = &[
    // 0: foundations
    &[
        "backoff",
        "config",
        "control",
        "fsutil",
        "latest_writer",
        "telemetry",
        "proptest_json",
        "message",
        "redact",
        "zone",
    ],
    // 1
    &["store", "session"],
    // 2
    &["net", "sandbox", "llm"],
    // 3
    &["cost", "metrics", "monitor", "gateway"],
    // 4
    &["memory"],
    // 5
    &["report", "tools", "skills"],
    // 6
    &["agent"],
    // 7
    &["channels", "scheduler", "api"],
    // 8
    &["daemon", "doctor", "cli", "backup"],
];

const LAYER_RULE: &str = "a module may use only modules of its own layer or a lower one \
                          (tests/it/architecture.rs LAYERS, docs/ARCHITECTURE.md \"Layers\")";

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The top-level module a file of `src/` belongs to: `src/agent/x.rs` → `agent`,
/// `src/cost.rs` → `cost`; `None` for `src/lib.rs`, the crate root.
fn top_module(file: &str) -> Option<&str> {
    let rest = file.strip_prefix("src/")?;
    match rest.split_once('/') {
        Some((dir, _)) => Some(dir),
        None => rest.strip_suffix(".rs").filter(|m| *m != "lib"),
    }
}

/// One use of another top-level module: `file:line` of `from` names `crate::to`.
#[derive(Debug, Clone)]
struct Use {
    file: String,
    line: usize,
    from: String,
    to: String,
}

/// Every `crate::<module>` path in shipped code that leaves its own top-level module.
fn module_uses(lines: &[CodeLine]) -> Vec<Use> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for l in lines {
        let Some(from) = top_module(&l.file) else {
            continue;
        };
        for (at, pat) in l.code.match_indices("crate::") {
            if l.code[..at].chars().next_back().is_some_and(ident) {
                continue; // `my_crate::`
            }
            let to: String = l.code[at + pat.len()..]
                .chars()
                .take_while(|&c| ident(c))
                .collect();
            if !to.is_empty() && to != from {
                out.push(Use {
                    file: l.file.clone(),
                    line: l.line,
                    from: from.to_string(),
                    to,
                });
            }
        }
    }
    out
}

/// Everything wrong with the layering of `lines` (no upward use is tolerated).
fn layer_violations(lines: &[CodeLine]) -> Vec<String> {
    let mut found = Vec::new();
    let mut modules = BTreeSet::new();
    for l in lines {
        if let Some(m) = top_module(&l.file) {
            modules.insert(m.to_string());
        }
        if l.code.contains("crate::{") {
            found.push(format!(
                "{}:{}: `crate::{{…}}` hides which modules are used; write one `use crate::<module>::…` per module",
                l.file, l.line
            ));
        }
    }
    for m in &modules {
        if layer_of(m).is_none() {
            found.push(format!(
                "src/{m}: top-level module `{m}` has no layer; add it to LAYERS in tests/it/architecture.rs and to docs/ARCHITECTURE.md \"Layers\""
            ));
        }
    }
    for u in &module_uses(lines) {
        let (Some(lf), Some(lt)) = (layer_of(&u.from), layer_of(&u.to)) else {
            continue; // reported above, or not a module (`crate::SomeItem`)
        };
        if lt <= lf {
            continue;
        }
        found.push(format!(
            "{}:{}: `{}` (layer {lf}) uses `{}` (layer {lt}): {LAYER_RULE}",
            u.file, u.line, u.from, u.to
        ));
    }
    found
}

/// A cycle among top-level modules, as the chain of uses that closes it
/// (`file:line: from → to`); `None` when the graph is a DAG.
fn module_cycle(lines: &[CodeLine]) -> Option<Vec<String>> {
    use std::collections::BTreeMap;
    let mut edges: BTreeMap<String, BTreeMap<String, Use>> = BTreeMap::new();
    for u in module_uses(lines) {
        if layer_of(&u.to).is_none() {
            continue;
        }
        edges
            .entry(u.from.clone())
            .or_default()
            .entry(u.to.clone())
            .or_insert(u);
    }
    // Depth-first search; `path` is the current chain of modules.
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeMap<String, Use>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|p| p == m) {
            let mut cycle = path[start..].to_vec();
            cycle.push(m.to_string());
            return Some(
                cycle
                    .windows(2)
                    .map(|w| {
                        let u = &edges[&w[0]][&w[1]];
                        format!("{}:{}: {} → {}", u.file, u.line, u.from, u.to)
                    })
                    .collect(),
            );
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for next in edges.get(m).into_iter().flat_map(|e| e.keys()) {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for m in edges.keys() {
        if let Some(c) = visit(m, &edges, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn modules_use_only_their_own_layer_or_lower_ones() {
    let found = layer_violations(src_lines());
    let mut msg = format!("the module layering is broken; found {}:\n", found.len());
    for f in &found {
        let _ = writeln!(msg, "  {f}");
    }
    assert!(found.is_empty(), "{msg}");
}

#[test]
fn the_top_level_modules_form_no_cycle() {
    // Follows from the layering (same-layer uses could still close one), stated on its own.
    if let Some(cycle) = module_cycle(src_lines()) {
        panic!(
            "the top-level modules of src/ form a cycle; break it with a trait in the lower \
             module that the daemon wires in (DESIGN §1):\n  {}",
            cycle.join("\n  ")
        );
    }
}

#[test]
fn every_layer_module_exists() {
    let modules: BTreeSet<&str> = src_lines()
        .iter()
        .filter_map(|l| top_module(&l.file))
        .collect();
    for m in LAYERS.iter().flat_map(|l| l.iter()) {
        // proptest_json is test-only code (`#[cfg(test)] mod proptest_json;`), so never walked.
        assert!(
            *m == "proptest_json" || modules.contains(m),
            "LAYERS names `{m}`, which is not a module of src/"
        );
    }
}

// The checker checks itself: each case below must be caught or must pass.

fn synthetic(files: &[(&str, &str)]) -> Vec<CodeLine> {
    let sources: Vec<(String, String)> = files
        .iter()
        .map(|(f, t)| (f.to_string(), t.to_string()))
        .collect();
    shipped_lines(&sources).0
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
fn provider_rule_catches_a_direct_call_outside_the_gateway() {
    let tts = "use crate::gateway::Gateway;\n\
               pub async fn f(llm: &crate::llm::Llm) {\n\
                   let _ = llm.speak(\"speech\", \"hi\", \"alloy\", 1).await;\n\
               }\n\
               fn g() { crate::llm::audio::transcribe(&http, spec, limits, &file); }\n\
               fn h(p: std::sync::Arc<dyn crate::llm::Provider>) {}\n\
               fn i() { let e: LlmError; let k = ProviderKind::OpenAi; }\n";
    let lines = synthetic(&[
        ("src/tools/tts.rs", tts),
        ("src/gateway.rs", "use crate::llm::{Llm, LlmError};\n"),
        ("src/llm/router.rs", "pub struct Llm;\n"),
    ]);
    assert_eq!(
        violations(&lines, &provider_rule()),
        [
            "src/tools/tts.rs:2: pub async fn f(llm: &crate::llm::Llm) {",
            "src/tools/tts.rs:5: fn g() { crate::llm::audio::transcribe(&http, spec, limits, &file); }",
            "src/tools/tts.rs:6: fn h(p: std::sync::Arc<dyn crate::llm::Provider>) {}",
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

#[test]
fn layer_check_names_file_line_modules_layers_and_rule() {
    let lines = synthetic(&[
        ("src/store/kv.rs", "use std::fmt;\nuse crate::daemon;\n"),
        ("src/daemon/mod.rs", "use crate::store::Store;\n"),
    ]);
    let found = layer_violations(&lines);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("src/store/kv.rs:2: `store` (layer 1) uses `daemon` (layer 8): "),
        "{found:?}"
    );
    assert!(found[0].contains(LAYER_RULE), "{found:?}");
}

#[test]
fn layer_check_skips_tests_comments_literals_and_other_crates() {
    let kv = "// crate::daemon in a comment\n\
              pub fn f() { let _ = \"crate::daemon\"; let _ = my_crate::daemon::X; }\n\
              #[cfg(test)]\n\
              mod tests {\n\
                  use crate::daemon;\n\
              }\n";
    let lines = synthetic(&[
        ("src/store/mod.rs", "#[cfg(test)]\nmod testutil;\n"),
        ("src/store/kv.rs", kv),
        ("src/store/testutil.rs", "use crate::daemon;\n"),
    ]);
    assert_eq!(layer_violations(&lines), Vec::<String>::new());
}

#[test]
fn layer_check_rejects_grouped_crate_paths_and_unknown_modules() {
    let lines = synthetic(&[
        (
            "src/agent/mod.rs",
            "use crate::{llm::Message, tools::Tool};\n",
        ),
        ("src/newthing.rs", "pub fn f() {}\n"),
    ]);
    let found = layer_violations(&lines);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].starts_with("src/agent/mod.rs:1: `crate::{…}`"),
        "{found:?}"
    );
    assert!(found[1].contains("`newthing` has no layer"), "{found:?}");
}

#[test]
fn cycle_check_finds_same_layer_cycles_and_names_the_uses() {
    let lines = synthetic(&[
        ("src/daemon/mod.rs", "use crate::cli::report;\n"),
        ("src/cli/mod.rs", "fn a() {}\nuse crate::daemon::run;\n"),
        ("src/store/mod.rs", "pub struct Store;\n"),
    ]);
    assert!(layer_violations(&lines).is_empty());
    let cycle = module_cycle(&lines).expect("daemon ⇄ cli is a cycle");
    assert_eq!(
        cycle,
        [
            "src/cli/mod.rs:2: cli → daemon",
            "src/daemon/mod.rs:1: daemon → cli"
        ]
    );
    let dag = synthetic(&[
        (
            "src/daemon/mod.rs",
            "use crate::cli::report;\nuse crate::store::Store;\n",
        ),
        ("src/cli/mod.rs", "use crate::store::Store;\n"),
    ]);
    assert_eq!(module_cycle(&dag), None);
}

#[test]
fn top_modules() {
    assert_eq!(top_module("src/agent/loop.rs"), Some("agent"));
    assert_eq!(top_module("src/cost.rs"), Some("cost"));
    assert_eq!(top_module("src/lib.rs"), None);
}

// ---------------------------------------------------------------------------------------------
// Size: functions, files and the architecture doc stay small enough to read.

/// The longest function of shipped code, in lines from `fn` to its closing brace.
const MAX_FN_LINES: usize = 120;
/// The longest shipped file, in lines without its `#[cfg(test)]` items.
const MAX_FILE_LINES: usize = 800;
/// The largest `docs/ARCHITECTURE.md`, in bytes.
const MAX_ARCHITECTURE_BYTES: usize = 35 * 1024;

/// Functions with a body in `lines` longer than `max` lines: `file:line: fn name is N lines`.
fn long_functions(lines: &[CodeLine], max: usize) -> Vec<String> {
    let mut found = Vec::new();
    let mut start = 0;
    while start < lines.len() {
        let file = &lines[start].file;
        let end = start
            + lines[start..]
                .iter()
                .take_while(|l| &l.file == file)
                .count();
        // The file's code as one char stream, each char with its line.
        let mut chars = Vec::new();
        for l in &lines[start..end] {
            chars.extend(l.code.chars().map(|c| (c, l.line)));
            chars.push(('\n', l.line));
        }
        for (name, first, last) in functions(&chars) {
            let len = last - first + 1;
            if len > max {
                found.push(format!("{file}:{first}: fn {name} is {len} lines"));
            }
        }
        start = end;
    }
    found
}

/// Every `fn name … { … }` of a code stream: (name, line of `fn`, line of its closing brace).
fn functions(chars: &[(char, usize)]) -> Vec<(String, usize, usize)> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for i in 0..chars.len().saturating_sub(2) {
        let at_fn = chars[i].0 == 'f'
            && chars[i + 1].0 == 'n'
            && chars[i + 2].0.is_whitespace()
            && (i == 0 || !ident(chars[i - 1].0));
        if !at_fn {
            continue;
        }
        let rest = &chars[i + 2..];
        let name: String = rest
            .iter()
            .map(|&(c, _)| c)
            .skip_while(|c| c.is_whitespace())
            .take_while(|&c| ident(c))
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body starts at the first `{` before any `;` (a declaration without body).
        let Some(open) = rest.iter().position(|&(c, _)| c == '{' || c == ';') else {
            continue;
        };
        if rest[open].0 == ';' {
            continue;
        }
        let mut depth = 0usize;
        for &(c, line) in &rest[open..] {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        out.push((name.clone(), chars[i].1, line));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

fn check_sizes(what: &str, found: &[String]) {
    if found.is_empty() {
        return;
    }
    let mut msg = format!("{what}; found {}:\n", found.len());
    for f in found {
        let _ = writeln!(msg, "  {f}");
    }
    panic!("{msg}");
}

#[test]
fn no_function_is_over_120_lines() {
    check_sizes(
        &format!(
            "no function of shipped code may be over {MAX_FN_LINES} lines \
             (tests/it/architecture.rs MAX_FN_LINES): split it into functions with one concern"
        ),
        &long_functions(src_lines(), MAX_FN_LINES),
    );
}

/// Shipped files over `max` lines: `file: N lines`.
fn long_files(sizes: &[(String, usize)], max: usize) -> Vec<String> {
    sizes
        .iter()
        .filter(|(_, n)| *n > max)
        .map(|(f, n)| format!("{f}: {n} lines"))
        .collect()
}

#[test]
fn no_file_is_over_800_lines() {
    check_sizes(
        &format!(
            "no shipped file may be over {MAX_FILE_LINES} lines without its test items \
             (tests/it/architecture.rs MAX_FILE_LINES): move a cohesive part into a sub-module"
        ),
        &long_files(src_sizes(), MAX_FILE_LINES),
    );
}

#[test]
fn size_checks_catch_a_121_line_function_and_an_801_line_file() {
    let body = "    let x = 1;\n".repeat(119);
    let long = format!("fn long() {{\n{body}}}\n");
    let ok = format!("fn fits() {{\n{}}}\n", "    let x = 1;\n".repeat(118));
    let tests = format!("#[cfg(test)]\nmod tests {{\n{long}}}\n");
    let lines = synthetic(&[("src/a.rs", &format!("{ok}{long}{tests}"))]);
    assert_eq!(
        long_functions(&lines, MAX_FN_LINES),
        ["src/a.rs:121: fn long is 121 lines"]
    );
    let file = "const A: u8 = 0;\n".repeat(801);
    let sources = [
        ("src/b.rs".to_string(), file),
        ("src/c.rs".to_string(), "fn c() {}\n".repeat(800)),
    ];
    assert_eq!(
        long_files(&shipped_lines(&sources).1, MAX_FILE_LINES),
        ["src/b.rs: 801 lines"]
    );
}

/// What `docs/ARCHITECTURE.md` breaks: its size over the limit, and every backticked name
/// that does not exist — a path (with `/`, or a file name with an extension) that is not a
/// file or folder of the repository (from its root, `src/` or `docs/`), or a `CamelCase`
/// identifier or `a::b` path whose last segment is no identifier of `src/`.
fn architecture_doc_problems(
    doc: &str,
    exists: &dyn Fn(&str) -> bool,
    idents: &BTreeSet<String>,
) -> Vec<String> {
    let mut found = Vec::new();
    if doc.len() > MAX_ARCHITECTURE_BYTES {
        found.push(format!(
            "docs/ARCHITECTURE.md is {} bytes, over {MAX_ARCHITECTURE_BYTES}: say what is, briefly",
            doc.len()
        ));
    }
    let mut in_fence = false;
    for (n, line) in doc.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        for (k, name) in line.split('`').enumerate() {
            if k % 2 == 0 || name.is_empty() || name.contains(char::is_whitespace) {
                continue;
            }
            if let Some(problem) = missing_name(name, exists, idents) {
                found.push(format!(
                    "docs/ARCHITECTURE.md:{}: `{name}` {problem}",
                    n + 1
                ));
            }
        }
    }
    found
}

/// Why `name` (one backticked word of the doc) names nothing, if it does not.
fn missing_name(
    name: &str,
    exists: &dyn Fn(&str) -> bool,
    idents: &BTreeSet<String>,
) -> Option<&'static str> {
    let pathish = name
        .chars()
        .all(|c| c.is_alphanumeric() || "_-./<>*".contains(c));
    let has_ext = [".rs", ".md", ".toml", ".sh", ".py"]
        .iter()
        .any(|x| name.ends_with(x));
    if pathish
        && (name.contains('/') || has_ext)
        && !name.contains(['<', '*'])
        && !name.starts_with('/')
    {
        return (!exists(name.trim_end_matches('/')))
            .then_some("is no file or folder of the repository");
    }
    let rust_path = name.contains("::") || {
        let mut cs = name.chars();
        cs.next().is_some_and(|c| c.is_ascii_uppercase())
            && name.chars().any(|c| c.is_ascii_lowercase())
            && name.chars().all(|c| c.is_ascii_alphanumeric())
    };
    if !rust_path
        || !name
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == ':')
    {
        return None;
    }
    let last = name.rsplit("::").find(|s| !s.is_empty())?;
    (!idents.contains(last)).then_some("is no identifier of src/")
}

/// Every identifier of `src/` (code and comments alike: a name the doc quotes exists there).
fn src_identifiers() -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    collect_rs_files(&root.join("src"), &mut files);
    let mut idents = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        idents.extend(
            text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .filter(|w| !w.is_empty())
                .map(str::to_string),
        );
    }
    idents
}

#[test]
fn architecture_doc_is_short_and_names_what_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc =
        std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md");
    let exists = |p: &str| {
        ["", "src/", "docs/"]
            .iter()
            .any(|base| root.join(format!("{base}{p}")).exists())
    };
    check_sizes(
        "docs/ARCHITECTURE.md must stay under its size and name only what exists \
         (tests/it/architecture.rs MAX_ARCHITECTURE_BYTES)",
        &architecture_doc_problems(&doc, &exists, &src_identifiers()),
    );
}

#[test]
fn architecture_doc_check_catches_size_and_names() {
    let idents: BTreeSet<String> = ["Gateway", "outcome_of"].map(String::from).into();
    let exists = |p: &str| p == "src/gateway.rs" || p == "gateway.rs";
    let doc = "`gateway.rs` holds `Gateway`; `session::outcome_of`.\n\
               `src/nowhere.rs` and `Nothing` and `session::gone` are not.\n\
               ```\n`Fenced` is an example\n```\n`SIGHUP`, `[http] port`, `Retry-After`\n";
    assert_eq!(
        architecture_doc_problems(doc, &exists, &idents),
        [
            "docs/ARCHITECTURE.md:2: `src/nowhere.rs` is no file or folder of the repository",
            "docs/ARCHITECTURE.md:2: `Nothing` is no identifier of src/",
            "docs/ARCHITECTURE.md:2: `session::gone` is no identifier of src/",
        ]
    );
    let big = "x".repeat(MAX_ARCHITECTURE_BYTES + 1);
    assert_eq!(architecture_doc_problems(&big, &exists, &idents).len(), 1);
}
