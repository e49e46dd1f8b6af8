//! Renamed keys, `check-config --migrate`, and the config the previous release shipped.

use std::path::{Path, PathBuf};

use toml::{Table, Value};

use super::*;
use crate::config::tests::{Fixture, MINIMAL, minimal_with_key};
use crate::config::{load_with_env, render_effective};

/// A user's file of the time before [routing] named sources (commit 3b34cbe), with comments.
const OLD_ROUTING: &str = "
# routes, tuned by hand
[routing]
# cron jobs on the cheap model
scheduler = \"primary\"   # keep
chat = \"primary\"
";

fn fixture(extra: &str) -> Fixture {
    let f = minimal_with_key();
    f.write("config/agentd.toml", &format!("{MINIMAL}{extra}"));
    f
}

fn migrate_fixture(f: &Fixture) -> Result<Migrated, MigrateError> {
    let env = f.env.clone();
    migrate(&f.config_path(), move |p| load_with_env(p, env.clone()))
}

#[test]
fn a_renamed_key_is_read_under_its_new_name_with_a_warning() {
    let c = fixture(OLD_ROUTING).ok();
    assert_eq!(c.routing.get("system").map(String::as_str), Some("primary"));
    assert_eq!(
        c.routing.get("terminal").map(String::as_str),
        Some("primary")
    );
    let warnings: Vec<String> = c.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].contains("routing.scheduler: renamed to routing.system"),
        "{warnings:?}"
    );
    assert!(
        warnings[0].contains("check-config --migrate"),
        "{warnings:?}"
    );
}

#[test]
fn migrate_keeps_values_and_comments_and_the_effective_config() {
    let f = fixture(OLD_ROUTING);
    let before = f.ok();
    let old_text = std::fs::read_to_string(f.config_path()).unwrap();
    let m = migrate_fixture(&f).unwrap();
    assert_eq!(
        m.changes,
        [
            "routing.scheduler -> routing.system (= \"primary\")",
            "routing.chat -> routing.terminal (= \"primary\")"
        ]
    );
    let text = std::fs::read_to_string(f.config_path()).unwrap();
    for kept in [
        "# routes, tuned by hand",
        "# cron jobs on the cheap model\nsystem = \"primary\"   # keep",
        "terminal = \"primary\"",
    ] {
        assert!(text.contains(kept), "{kept:?} lost:\n{text}");
    }
    assert!(!text.contains("scheduler"), "{text}");
    let backup = m.backup.expect("a copy of the old file");
    assert_eq!(std::fs::read_to_string(&backup).unwrap(), old_text);
    assert_eq!(backup.parent(), f.config_path().parent());
    let after = f.ok();
    assert!(after.warnings.is_empty(), "{:?}", after.warnings);
    assert_eq!(render_effective(&after), render_effective(&before));
    // Once migrated, a second run changes nothing and writes no copy.
    let again = migrate_fixture(&f).unwrap();
    assert!(again.changes.is_empty() && again.backup.is_none());
}

#[test]
fn migrate_drops_an_old_key_whose_new_name_is_set_and_keeps_its_comments() {
    let f = fixture("[routing]\n# old way\nscheduler = \"primary\"\nsystem = \"primary\"\n");
    let m = migrate_fixture(&f).unwrap();
    assert!(
        m.changes[0].starts_with("routing.scheduler removed"),
        "{m:?}"
    );
    let text = std::fs::read_to_string(f.config_path()).unwrap();
    assert!(
        text.contains("# old way\n# scheduler = \"primary\" removed"),
        "{text}"
    );
    assert!(text.contains("\nsystem = \"primary\""), "{text}");
}

#[test]
fn migrate_leaves_a_current_file_alone() {
    let f = fixture("[routing]\nsystem = \"primary\"\n");
    let text = std::fs::read_to_string(f.config_path()).unwrap();
    let m = migrate_fixture(&f).unwrap();
    assert!(m.changes.is_empty() && m.backup.is_none());
    assert_eq!(std::fs::read_to_string(f.config_path()).unwrap(), text);
    let files = std::fs::read_dir(f.dir.path().join("config"))
        .unwrap()
        .count();
    assert_eq!(files, 1, "no copy beside an unchanged file");
}

/// `tests/fixtures/config/previous-release`: `config/agentd.toml` and `providers.d/` as shipped
/// at commit a799c05 (2026-11-28), in a temporary checkout.
fn previous_release() -> Fixture {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config/previous-release");
    let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
    let mut f = Fixture::new(&read(dir.join("config/agentd.toml")));
    for name in ["anthropic", "openai", "ollama"] {
        f.provider(name, &read(dir.join(format!("providers.d/{name}.toml"))));
    }
    std::fs::create_dir_all(f.dir.path().join("workspace")).unwrap();
    f.set("AGENTD_ANTHROPIC_KEY", "sk-test");
    f
}

/// Every value set in `old` (a parsed file), with its dotted path, renames applied.
fn leaves(prefix: &str, t: &Table, out: &mut Vec<(String, Value)>) {
    for (k, v) in t {
        let mut path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if let Some(r) = RENAMES.iter().find(|r| r.old_path() == path) {
            path = r.new_path().unwrap_or(path);
        }
        match v {
            Value::Table(sub) => leaves(&path, sub, out),
            v => out.push((path, v.clone())),
        }
    }
}

fn lookup<'t>(t: &'t Table, path: &str) -> Option<&'t Value> {
    let (head, rest) = match path.split_once('.') {
        Some((h, r)) => (h, Some(r)),
        None => (path, None),
    };
    match (t.get(head)?, rest) {
        (Value::Table(sub), Some(rest)) => lookup(sub, rest),
        (v, None) => Some(v),
        _ => None,
    }
}

#[test]
fn the_previous_release_config_keeps_every_value_it_sets() {
    let f = previous_release();
    let c = f.ok();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let old: Table = std::fs::read_to_string(f.config_path())
        .unwrap()
        .parse()
        .unwrap();
    let effective: Table = render_effective(&c).parse().unwrap();
    let mut set = Vec::new();
    leaves("", &old, &mut set);
    assert!(set.len() >= 8, "{set:?}");
    let config_dir = f.root().join("config");
    for (path, value) in set {
        let now = lookup(&effective, &path)
            .unwrap_or_else(|| panic!("{path} is set in the old file but not in force"));
        let same = now == &value
            || matches!((&value, now), (Value::String(a), Value::String(b))
                if config_dir.join(a).canonicalize().ok() == Path::new(b).canonicalize().ok());
        assert!(
            same,
            "{path}: the old file says {value}, today's reading {now}"
        );
    }
    // Nothing to migrate in it, and the file is left as it was.
    let m = migrate_fixture(&f).unwrap();
    assert!(m.changes.is_empty() && m.backup.is_none(), "{m:?}");
}
