//! Keys that were renamed or retired: the one table of them ([`RENAMES`]). Loading still reads
//! an old key under its new name and warns, naming the new form ([`apply`], run on the parsed
//! file before the sections are walked); `agentd check-config --migrate` rewrites the file with
//! the same table (`config::migrate`). No release drops a value silently: a key leaves the key
//! table only through an entry here.

use toml::{Table, Value};

use super::super::walker::{Walker, join_key};

/// One renamed or retired key.
pub struct Rename {
    /// The table holding the key (`"routing"`; dotted for a sub-table, `""` for the top
    /// level).
    pub table: &'static str,
    /// The old key.
    pub old: &'static str,
    /// The new key in the same table; `None`: retired (read, ignored, and warned about).
    pub new: Option<&'static str>,
    /// What to tell the user beyond the new name (empty: nothing).
    pub note: &'static str,
}

impl Rename {
    /// The old key's dotted path.
    pub fn old_path(&self) -> String {
        join_key(self.table, self.old)
    }

    /// The new key's dotted path (`None`: retired).
    pub fn new_path(&self) -> Option<String> {
        self.new.map(|n| join_key(self.table, n))
    }

    /// The warning for a file that still has the old key.
    pub fn warning(&self, both: bool) -> String {
        let mut s = match (self.new_path(), both) {
            (Some(new), false) => format!("renamed to {new}; read as {new} (run `agentd check-config --migrate` to rewrite the file)"),
            (Some(new), true) => format!("renamed to {new}, which is set too: this old key is ignored; remove it"),
            (None, _) => "retired: it no longer has any effect; remove it (`agentd check-config --migrate` does)".to_string(),
        };
        if !self.note.is_empty() {
            s.push_str("; ");
            s.push_str(self.note);
        }
        s
    }
}

/// Every rename and retirement, oldest first.
pub static RENAMES: &[Rename] = &[
    // Commit 3b34cbe: `[routing]` names the SPEC §5 sources instead of transports.
    Rename {
        table: "routing",
        old: "scheduler",
        new: Some("system"),
        note: "",
    },
    Rename {
        table: "routing",
        old: "chat",
        new: Some("terminal"),
        note: "",
    },
    Rename {
        table: "routing",
        old: "fifo",
        new: Some("user"),
        note: "FIFO `-s` system messages route through `system` since then; set it too if they should use this model",
    },
];

/// Move every old key of `table` (the parsed file) to its new name, warning about each; a
/// retired key is removed with a warning. An old key whose new key is also set is dropped
/// (the new one wins) with a warning that says so.
pub fn apply(w: &Walker<'_>, root: &mut Table, renames: &[Rename]) {
    for r in renames {
        let Some(t) = table_mut(root, r.table) else {
            continue;
        };
        let Some(v) = t.remove(r.old) else {
            continue;
        };
        let both = r.new.is_some_and(|n| t.contains_key(n));
        w.warn(r.old_path(), r.warning(both));
        if let (Some(new), false) = (r.new, both) {
            t.insert(new.to_string(), v);
        }
    }
}

/// The table at dotted `path` (`""`: the root), if it exists and is a table.
fn table_mut<'t>(root: &'t mut Table, path: &str) -> Option<&'t mut Table> {
    if path.is_empty() {
        return Some(root);
    }
    let mut t = root;
    for part in path.split('.') {
        match t.get_mut(part) {
            Some(Value::Table(next)) => t = next,
            _ => return None,
        }
    }
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::env::Env;
    use std::collections::BTreeMap;
    use std::path::Path;

    const TEST_TABLE: &[Rename] = &[
        Rename {
            table: "a.b",
            old: "old_name",
            new: Some("new_name"),
            note: "",
        },
        Rename {
            table: "",
            old: "gone",
            new: None,
            note: "it was never read",
        },
    ];

    fn run(text: &str, renames: &[Rename]) -> (Table, Vec<String>) {
        let env = Env::with_process_map(BTreeMap::new(), BTreeMap::new());
        let w = Walker::new(Path::new("/c/agentd.toml"), &env);
        let mut t: Table = text.parse().unwrap();
        apply(&w, &mut t, renames);
        let warnings = w
            .warnings()
            .into_iter()
            .map(|p| format!("{}: {}", p.key, p.message));
        (t, warnings.collect())
    }

    #[test]
    fn an_old_key_is_read_under_its_new_name_with_a_warning() {
        let (t, warnings) = run("gone = 1\n[a.b]\nold_name = 7\n", TEST_TABLE);
        assert_eq!(t["a"]["b"]["new_name"].as_integer(), Some(7));
        assert!(t["a"]["b"].get("old_name").is_none());
        assert!(t.get("gone").is_none());
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].starts_with("a.b.old_name: renamed to a.b.new_name"));
        assert!(warnings[1].starts_with("gone: retired"), "{warnings:?}");
        assert!(warnings[1].ends_with("it was never read"), "{warnings:?}");
    }

    #[test]
    fn the_new_key_wins_when_both_are_set() {
        let (t, warnings) = run("[a.b]\nold_name = 7\nnew_name = 8\n", TEST_TABLE);
        assert_eq!(t["a"]["b"]["new_name"].as_integer(), Some(8));
        assert!(warnings[0].contains("is set too"), "{warnings:?}");
    }

    #[test]
    fn the_shipped_renames_name_keys_of_the_key_table() {
        for r in RENAMES {
            let Some(new) = r.new else { continue };
            let routing = r.table == "routing" && crate::config::ROUTING_SOURCES.contains(&new);
            let known =
                routing || (super::super::all().iter()).any(|k| k.path() == join_key(r.table, new));
            assert!(known, "{} -> {new}: no such key", r.old_path());
        }
    }
}
