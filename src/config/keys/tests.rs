//! Tests of the key table (issue 31): load → render → load gives back the same config (the
//! shipped one and one with every key set to a non-default value); every key is in the shipped
//! `config/agentd.toml`; the reference in `docs/configuration.md` is the generated one; a
//! reload applies exactly the keys declared live.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use toml::Value;

use super::*;
use crate::config::diff::diff_rendered;
use crate::config::tests::{Fixture, minimal_with_key, shipped_fixture};
use crate::config::{Config, load_with_env, render_effective};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `tests/fixtures/config/every-key` in a temporary checkout, with the variables it names.
fn every_key() -> Fixture {
    let dir = repo().join("tests/fixtures/config/every-key");
    let mut f = Fixture::new(&read(dir.join("config/agentd.toml")));
    f.provider("every", &read(dir.join("providers.d/every.toml")));
    std::fs::create_dir_all(f.dir.path().join("workspace")).unwrap();
    for (k, v) in [
        ("EVERY_KEY", "sk-every"),
        ("EVERY_TG", "1:tg"),
        ("EVERY_MX", "syt-every"),
        ("EVERY_HTTP", "http-token"),
        ("EVERY_CB", "cb-token"),
    ] {
        f.set(k, v);
    }
    f
}

/// The config as far as it can be compared: `Debug` (secrets show as redacted, so they are
/// compared by presence: the render never holds them), without the file it came from and the
/// note on why the time zone fell back to UTC (the render names the zone in force).
fn comparable(c: &Config) -> String {
    let mut c = c.clone();
    c.config_path = PathBuf::new();
    c.agent.timezone_fallback = None;
    format!("{c:#?}")
}

/// Load `f`, render it, load the render (beside the config, with the same environment) and
/// compare both configs and both renders.
fn assert_round_trip(f: &Fixture) {
    let first = f.ok();
    let text = render_effective(&first);
    let path = f.config_path().with_file_name("rendered.toml");
    std::fs::write(&path, &text).unwrap();
    let second = match load_with_env(&path, f.env.clone()) {
        Ok(c) => c,
        Err(e) => panic!("the render does not load:\n{e}\n\n{text}"),
    };
    // A skipped inline model's reason names the file it was read from.
    let same_file = |t: String| {
        t.replace(
            &path.display().to_string(),
            &f.config_path().display().to_string(),
        )
    };
    assert_eq!(
        comparable(&first),
        same_file(comparable(&second)),
        "render:\n{text}"
    );
    let body = |t: &str| t.split_once('\n').map(|(_, b)| b.to_string());
    assert_eq!(
        body(&text),
        body(&same_file(render_effective(&second))),
        "render:\n{text}"
    );
}

#[test]
fn load_render_load_gives_back_the_shipped_config() {
    assert_round_trip(&shipped_fixture());
    let mut f = shipped_fixture();
    f.set("AGENTD_ANTHROPIC_KEY", "sk-test");
    assert_round_trip(&f);
}

#[test]
fn load_render_load_gives_back_a_config_with_every_key_set() {
    assert_round_trip(&every_key());
    // An inline model whose key is missing is skipped, and still comes back.
    let mut f = every_key();
    f.env.remove("EVERY_KEY");
    let text = read(f.config_path()).replace(
        "prompt_cache_key = true",
        "prompt_cache_key = true\napi_key_env = \"UNSET_KEY\"",
    );
    f.write("config/agentd.toml", &text);
    let c = f.ok();
    assert!(c.models.skipped.contains_key("local"), "{:?}", c.models);
    assert_round_trip(&f);
}

/// Keys that cannot be set to anything but their default.
const ONE_VALUE: &[&str] = &["tools.web_search.provider"];

/// The every-key fixture sets every key of the table to a value other than its default, and
/// `check-config --diff` against the defaults names every key of `Config`.
#[test]
fn the_every_key_config_changes_every_key() {
    let every = every_key().ok();
    let default = minimal_with_key().ok();
    let changed: BTreeSet<String> =
        diff_rendered(&render_effective(&default), &render_effective(&every))
            .into_iter()
            .map(|c| c.key)
            .collect();
    let mut same = Vec::new();
    for table in TABLES {
        match table {
            Table::Keys(keys) => {
                for k in *keys {
                    let path = k.path();
                    if ONE_VALUE.contains(&path.as_str()) {
                        continue;
                    }
                    if k.show(&every) == k.show(&default) || !changed.contains(&path) {
                        same.push(path);
                    }
                }
            }
            Table::Tiers(e) => same.extend(unchanged(e, every.agent.context.tiers.values())),
            Table::Routing(e) => same.extend(unchanged(e, every.routing.values())),
            Table::Mcp(e) => same.extend(unchanged(e, every.mcp_servers.values())),
            Table::Schedule(e) => same.extend(unchanged(e, every.schedules.iter())),
            Table::Models(e) => {
                same.extend(unchanged(e, every.models.loaded.values().map(|m| &**m)))
            }
        }
    }
    assert!(
        same.is_empty(),
        "keys at their default in tests/fixtures/config/every-key: {same:?}"
    );
}

/// The keys of `e` that no record shows with a value other than the default.
fn unchanged<'r, R: 'r>(e: &Entries<R>, records: impl Iterator<Item = &'r R>) -> Vec<String> {
    let records: Vec<&R> = records.collect();
    e.keys
        .iter()
        .filter(|k| {
            !records.iter().any(|r| match k.show(r) {
                Shown::Value(v) => Some(v) != k.default_shown(),
                _ => false,
            })
        })
        .map(|k| k.path())
        .collect()
}

/// A reload takes exactly the keys declared live: with every key changed, what the merge
/// took differs from the running config only in live keys, and what it left differs from the
/// new file only in restart keys; every key declared live is taken.
#[test]
fn a_reload_applies_exactly_the_keys_declared_live() {
    let old = minimal_with_key().ok();
    let new = every_key().ok();
    let merged = old.with_live_parts_of(&new);
    let (r_old, r_new, r_merged) = (
        render_effective(&old),
        render_effective(&new),
        render_effective(&merged),
    );
    let applied = diff_rendered(&r_old, &r_merged);
    for c in &applied {
        assert!(c.applies_live(), "taken but not live: {}", c.key);
    }
    for c in diff_rendered(&r_merged, &r_new) {
        assert!(!c.applies_live(), "live but not taken: {}", c.key);
    }
    let live: Vec<String> = all()
        .into_iter()
        .filter(|k| k.live() == Some(true))
        .map(|k| k.path())
        .collect();
    assert!(!live.is_empty());
    for key in live {
        assert!(
            applied.iter().any(|c| c.key == key),
            "{key} is declared live but a reload did not take it"
        );
    }
    for prefix in ["mcp.servers.", "schedule."] {
        assert!(
            applied.iter().any(|c| c.key.starts_with(prefix)),
            "{prefix}"
        );
    }
}

#[test]
fn every_key_is_declared_once() {
    let mut seen = BTreeSet::new();
    for k in all() {
        assert!(seen.insert(k.path()), "{} is declared twice", k.path());
        assert!(!k.doc().is_empty(), "{} has no doc", k.path());
    }
    assert!(seen.len() > 150, "{}", seen.len());
}

/// Every key path written in a TOML text, commented out or not: `(path, commented)`. A table
/// header (`[x]`, `[[x]]`, or `# [x]`) sets the table of the lines after it; a line is taken
/// when it (without its `#`) is TOML, inline tables and dotted keys flattened.
fn written_keys(text: &str) -> Vec<(Vec<String>, bool)> {
    let mut table: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim_start();
        let (body, commented) = match line.strip_prefix('#') {
            Some(rest) => (rest.trim_start(), true),
            None => (line, false),
        };
        if body.starts_with('[') {
            if let Some(path) = header_path(body) {
                table = path;
            }
            continue;
        }
        let Ok(parsed) = body.parse::<toml::Table>() else {
            continue;
        };
        for key in leaves(&parsed) {
            out.push(([table.clone(), key].concat(), commented));
        }
    }
    out
}

fn header_path(line: &str) -> Option<Vec<String>> {
    let probe: toml::Table = format!("{line}\n__probe = 0\n").parse().ok()?;
    find_probe(&Value::Table(probe))
}

fn find_probe(v: &Value) -> Option<Vec<String>> {
    match v {
        Value::Table(t) if t.contains_key("__probe") => Some(Vec::new()),
        Value::Table(t) => t.iter().find_map(|(k, v)| {
            let mut rest = find_probe(v)?;
            rest.insert(0, k.clone());
            Some(rest)
        }),
        Value::Array(items) => items.iter().find_map(find_probe),
        _ => None,
    }
}

fn leaves(t: &toml::Table) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (k, v) in t {
        match v {
            Value::Table(inner) if !inner.is_empty() => {
                for mut rest in leaves(inner) {
                    rest.insert(0, k.clone());
                    out.push(rest);
                }
            }
            _ => out.push(vec![k.clone()]),
        }
    }
    out
}

/// Whether the written `path` is the key `k` (a `<name>` part matches any name; below a key
/// whose value is a table of names, any name).
fn is_key(k: &dyn Spec, path: &[String]) -> bool {
    let pattern: Vec<&str> = k.table().split('.').chain(k.name().split('.')).collect();
    let table_valued = k.kind().starts_with('{');
    (path.len() == pattern.len() || (table_valued && path.len() > pattern.len()))
        && pattern
            .iter()
            .zip(path)
            .all(|(p, w)| p.starts_with('<') || *p == w)
}

/// `config/agentd.toml` documents every key of the table — commented out where it is
/// optional, set where it is required (a required key of a named entry, such as
/// `[[schedule]] name`, may be in a commented-out example) — and nothing that is not a key.
#[test]
fn every_key_is_in_the_shipped_config() {
    let text = read(repo().join("config/agentd.toml"));
    let written = written_keys(&text);
    let mut missing = Vec::new();
    for k in all() {
        let found: Vec<bool> = written
            .iter()
            .filter(|(path, _)| is_key(k, path))
            .map(|(_, commented)| *commented)
            .collect();
        // A required key of a named entry is required in each entry, and the entries are
        // optional: an example may be commented out whole.
        let required_here = k.is_required() && k.live().is_some();
        if found.is_empty() || (required_here && found.iter().all(|c| *c)) {
            missing.push(k.path());
        }
    }
    assert!(
        missing.is_empty(),
        "config/agentd.toml lacks these keys (add them, commented out with their default where they are optional): {missing:?}"
    );
    let keys = all();
    let unknown: Vec<String> = written
        .iter()
        .filter(|(path, _)| !keys.iter().any(|k| is_key(*k, path)))
        .map(|(path, _)| path.join("."))
        .collect();
    assert!(
        unknown.is_empty(),
        "config/agentd.toml writes keys the table does not have: {unknown:?}"
    );
}

#[test]
fn the_shipped_key_check_reads_commented_tables_and_inline_tables() {
    let written = written_keys(
        "[a]\nx = 1\n# y = [\"p\"]   # note\n# [m.\"n.o\"]\n# c = { d = 1, e = 2 }\n[[s]]\nname = \"x\"\n# A sentence, not = a key.\n",
    );
    let shown: Vec<(String, bool)> = written.iter().map(|(p, c)| (p.join("|"), *c)).collect();
    assert_eq!(
        shown,
        [
            ("a|x".to_string(), false),
            ("a|y".to_string(), true),
            ("m|n.o|c|d".to_string(), true),
            ("m|n.o|c|e".to_string(), true),
            ("s|name".to_string(), false),
        ]
    );
}

/// The key reference in `docs/configuration.md` is the one the table produces.
#[test]
fn the_reference_in_the_docs_is_the_generated_one() {
    let path = repo().join("docs/configuration.md");
    let doc = read(path.clone());
    let generated = match reference::regenerate(&doc) {
        Ok(text) => text,
        Err(problems) => panic!("docs/configuration.md: {}", problems.join("\n")),
    };
    if std::env::var_os("AGENTD_REGEN_DOCS").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    if doc != generated {
        let first = doc
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map_or(0, |i| i + 1);
        panic!(
            "the key reference in docs/configuration.md differs from the key table (src/config/keys), first at line {first}; regenerate it with\n  {}",
            reference::REGENERATE
        );
    }
}

/// The tool list in the doc of `[tools] enabled` (and so in docs/configuration.md) names every
/// built-in tool: it left out `tts` once.
#[test]
fn the_enabled_doc_names_every_built_in_tool() {
    let doc = tools::ENABLED.doc;
    let missing: Vec<&str> = crate::config::tools::BUILTIN_TOOLS
        .iter()
        .copied()
        .filter(|name| !doc.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "the doc of tools.enabled (src/config/keys/tools.rs) does not name {missing:?}"
    );
}
