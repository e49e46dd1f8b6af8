//! A small walker over a parsed `toml::Table` that extracts typed values and records every
//! problem instead of stopping at the first one (serde would).
//!
//! Each [`Section`] takes the keys it knows out of its table; whatever is left when the section
//! is dropped is reported as an unknown key, with the closest known key suggested. Keys are
//! declared in the key table (`keys`) and read with `Section::read(&KEY)` (defined there), which
//! converts and checks the value with the key's codec.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

use super::env::{self, Env};
use super::error::Problem;

/// Problem collector for one file, plus the environment used for `${VAR}` expansion.
pub struct Walker<'e> {
    file: PathBuf,
    env: &'e Env,
    problems: RefCell<Vec<Problem>>,
    /// Warnings: the file loads, but says something in an old way (a renamed key).
    warnings: RefCell<Vec<Problem>>,
}

impl<'e> Walker<'e> {
    pub fn new(file: &Path, env: &'e Env) -> Self {
        Walker {
            file: file.to_path_buf(),
            env,
            problems: RefCell::new(Vec::new()),
            warnings: RefCell::new(Vec::new()),
        }
    }

    /// The file this walker reports problems against.
    pub fn file(&self) -> &Path {
        &self.file
    }

    pub fn env(&self) -> &'e Env {
        self.env
    }

    /// Record a problem at `key` (a full dotted path).
    pub fn problem(&self, key: impl Into<String>, message: impl Into<String>) {
        self.problems.borrow_mut().push(Problem {
            file: self.file.clone(),
            key: key.into(),
            message: message.into(),
        });
    }

    /// Record a warning at `key` (a full dotted path): the file still loads.
    pub fn warn(&self, key: impl Into<String>, message: impl Into<String>) {
        self.warnings.borrow_mut().push(Problem {
            file: self.file.clone(),
            key: key.into(),
            message: message.into(),
        });
    }

    /// The warnings recorded so far.
    pub fn warnings(&self) -> Vec<Problem> {
        self.warnings.borrow().clone()
    }

    /// Number of problems recorded so far.
    pub fn problem_count(&self) -> usize {
        self.problems.borrow().len()
    }

    pub fn into_problems(self) -> Vec<Problem> {
        self.problems.into_inner()
    }

    /// The root section of a parsed file.
    pub fn root(&self, table: Table) -> Section<'_> {
        Section {
            w: self,
            path: String::new(),
            table,
            known: Vec::new(),
        }
    }

    /// Expand `${VAR}` in a string found at `key`; records a problem on failure.
    pub fn expand(&self, key: &str, s: &str) -> Option<String> {
        match env::expand(s, self.env) {
            Ok(v) => Some(v),
            Err(e) => {
                self.problem(key, e.message());
                None
            }
        }
    }
}

/// Integer types the walker can range-check into.
pub trait Int: Copy + TryFrom<i64> {
    const MAX: i64;
}

macro_rules! int_max {
    ($($t:ty => $max:expr),*) => { $(impl Int for $t { const MAX: i64 = $max; })* };
}
int_max!(u16 => u16::MAX as i64, u32 => u32::MAX as i64, u64 => i64::MAX, usize => i64::MAX, i64 => i64::MAX);

/// A table being walked. Keys are taken out as they are read; leftovers are reported as unknown
/// keys when the section is dropped.
pub struct Section<'w> {
    w: &'w Walker<'w>,
    path: String,
    table: Table,
    known: Vec<&'static str>,
}

impl<'w> Section<'w> {
    /// A section over `table` at `path` (used for sub-tables found under dynamic keys).
    pub fn new(w: &'w Walker<'w>, path: String, table: Table) -> Self {
        Section {
            w,
            path,
            table,
            known: Vec::new(),
        }
    }

    pub fn walker(&self) -> &'w Walker<'w> {
        self.w
    }

    /// The dotted path of this section (empty at the top level).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Full dotted path of `key` in this section.
    pub fn key_path(&self, key: &str) -> String {
        join_key(&self.path, key)
    }

    /// Record a problem at `key` of this section.
    pub fn problem(&self, key: &str, message: impl Into<String>) {
        self.w.problem(self.key_path(key), message);
    }

    /// Whether `key` is present (without taking it).
    pub fn has(&self, key: &str) -> bool {
        self.table.contains_key(key)
    }

    /// Take the raw value of a known key.
    pub fn take(&mut self, key: &'static str) -> Option<Value> {
        self.known.push(key);
        self.table.remove(key)
    }

    /// A sub-table (absent = empty). A non-table value is a problem and yields an empty section.
    pub fn section(&mut self, key: &'static str) -> Section<'w> {
        let path = self.key_path(key);
        let table = match self.take(key) {
            None => Table::new(),
            Some(Value::Table(t)) => t,
            Some(other) => {
                self.w.problem(
                    path.clone(),
                    format!("expected a table, got {}", describe(&other)),
                );
                Table::new()
            }
        };
        Section::new(self.w, path, table)
    }

    /// A sub-table under a dynamic key (a name chosen by the user), or `None` with a problem.
    pub fn child(&self, key: &str, v: Value) -> Option<Section<'w>> {
        let path = self.key_path(key);
        match v {
            Value::Table(t) => Some(Section::new(self.w, path, t)),
            other => {
                self.w
                    .problem(path, format!("expected a table, got {}", describe(&other)));
                None
            }
        }
    }

    /// An array of tables (`[[key]]`), each as a section at `key[i]`.
    pub fn tables(&mut self, key: &'static str) -> Vec<Section<'w>> {
        let path = self.key_path(key);
        match self.take(key) {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .into_iter()
                .enumerate()
                .filter_map(|(i, item)| {
                    let item_path = format!("{path}[{i}]");
                    match item {
                        Value::Table(t) => Some(Section::new(self.w, item_path, t)),
                        other => {
                            self.w.problem(
                                item_path,
                                format!("expected a table, got {}", describe(&other)),
                            );
                            None
                        }
                    }
                })
                .collect(),
            Some(other) => {
                self.w.problem(
                    path,
                    format!(
                        "expected an array of tables ([[{key}]]), got {}",
                        describe(&other)
                    ),
                );
                Vec::new()
            }
        }
    }

    /// Take every remaining entry (for tables whose keys are names chosen by the user).
    pub fn rest(&mut self) -> Vec<(String, Value)> {
        std::mem::take(&mut self.table).into_iter().collect()
    }
}

impl Drop for Section<'_> {
    fn drop(&mut self) {
        for key in std::mem::take(&mut self.table).keys() {
            let message = match closest(key, &self.known) {
                Some(near) => format!("unknown key (did you mean {near:?}?)"),
                None if self.known.is_empty() => "unknown key".to_string(),
                None => {
                    let mut known = self.known.clone();
                    known.sort_unstable();
                    known.dedup();
                    format!("unknown key; known keys here: {}", known.join(", "))
                }
            };
            self.w.problem(join_key(&self.path, key), message);
        }
    }
}

/// `path.key`, quoting `key` when it is not a bare TOML key. A list index suffix (`key[3]`) is
/// kept as is.
pub fn join_key(path: &str, key: &str) -> String {
    let name = match key.split_once('[') {
        Some((name, idx))
            if idx.len() > 1
                && idx.ends_with(']')
                && idx[..idx.len() - 1].chars().all(|c| c.is_ascii_digit()) =>
        {
            name
        }
        _ => key,
    };
    let bare = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let key = if bare {
        key.to_string()
    } else {
        format!("{key:?}")
    };
    if path.is_empty() {
        key
    } else {
        format!("{path}.{key}")
    }
}

/// A short description of a value for "got …" messages.
pub fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => {
            if s.chars().count() > 40 {
                let short: String = s.chars().take(40).collect();
                format!("{short:?}…")
            } else {
                format!("{s:?}")
            }
        }
        Value::Integer(i) => i.to_string(),
        Value::Float(f) => format!("{f:?}"),
        Value::Boolean(b) => b.to_string(),
        Value::Datetime(d) => d.to_string(),
        Value::Array(_) => "a list".to_string(),
        Value::Table(_) => "a table".to_string(),
    }
}

/// The known key closest to `key`, if it is close enough to be a likely typo.
pub fn closest<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    let limit = (key.chars().count() / 3).max(1);
    known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Optimal-string-alignment distance (Levenshtein plus adjacent transpositions).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::keys::codec::{Bool, Codec, Int, List, Num, OneOf, TEXT};
    use std::collections::BTreeMap;

    /// Take `key` and read it with `codec`, as `Section::read_opt` does for a declared key.
    fn get<C: Codec>(s: &mut Section<'_>, key: &'static str, codec: C) -> Option<C::T> {
        let v = s.take(key)?;
        codec.read(s.walker(), &s.key_path(key), v)
    }

    fn env() -> Env {
        Env::with_process_map(
            BTreeMap::from([("X".to_string(), "ex".to_string())]),
            BTreeMap::new(),
        )
    }

    fn walk(text: &str, f: impl FnOnce(&mut Section<'_>)) -> Vec<String> {
        let env = env();
        let w = Walker::new(Path::new("/c/agentd.toml"), &env);
        {
            let mut root = w.root(text.parse::<Table>().unwrap());
            f(&mut root);
        }
        w.into_problems()
            .into_iter()
            .map(|p| format!("{}: {}", p.key, p.message))
            .collect()
    }

    #[test]
    fn join_key_quotes_only_non_bare_keys() {
        assert_eq!(join_key("", "a"), "a");
        assert_eq!(join_key("t", "list[3]"), "t.list[3]");
        assert_eq!(join_key("t", "a b"), "t.\"a b\"");
        assert_eq!(join_key("t", "x[y]"), "t.\"x[y]\"");
        assert_eq!(join_key("t", "[1]"), "t.\"[1]\"");
    }

    #[test]
    fn edit_distance_counts_transpositions_once() {
        assert_eq!(edit_distance("nmae", "name"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(closest("nmae", &["name", "workspace"]), Some("name"));
        assert_eq!(closest("zzzz", &["name", "workspace"]), None);
    }

    #[test]
    fn typed_getters_report_key_paths() {
        let problems = walk(
            "[b]\nn = \"x\"\nf = true\ns = 3\nl = [\"a\", 2]\nok = \"${X}\"\nc = \"maybe\"\n",
            |root| {
                let mut b = root.section("b");
                assert_eq!(get(&mut b, "n", Int::<u32>::at_least(1)), None);
                let number = Num {
                    min: 0.0,
                    max: f64::MAX,
                };
                assert_eq!(get(&mut b, "f", number), None);
                assert_eq!(get(&mut b, "s", TEXT), None);
                assert_eq!(get(&mut b, "l", List(TEXT)), None);
                assert_eq!(get(&mut b, "ok", TEXT).as_deref(), Some("ex"));
                let on_off = OneOf(&[("on", true), ("off", false)]);
                assert_eq!(get(&mut b, "c", on_off), None);
                assert_eq!(get(&mut b, "missing", Bool), None);
            },
        );
        assert_eq!(
            problems,
            [
                "b.n: expected an integer ≥ 1, got \"x\"",
                "b.f: expected a number ≥ 0, got true",
                "b.s: expected a string, got 3",
                "b.l[1]: expected a string, got 2",
                "b.c: expected one of \"on\", \"off\", got \"maybe\"",
            ]
        );
    }

    #[test]
    fn integer_ranges_are_checked() {
        let problems = walk("a = 0\nb = 70000\nc = 5\n", |root| {
            assert_eq!(get(root, "a", Int::<u32>::at_least(1)), None);
            assert_eq!(get(root, "b", Int::<u16>::at_least(1)), None);
            assert_eq!(get(root, "c", Int::<u16>::at_least(1)), Some(5));
        });
        assert_eq!(
            problems,
            [
                "a: expected an integer ≥ 1, got 0",
                "b: expected an integer ≤ 65535, got 70000"
            ]
        );
    }

    #[test]
    fn leftover_keys_are_unknown_with_suggestion() {
        let problems = walk("[agent]\nnmae = \"a\"\nwhatever = 1\n", |root| {
            let mut a = root.section("agent");
            let _ = get(&mut a, "name", TEXT);
            let _ = get(&mut a, "workspace", TEXT);
        });
        assert_eq!(
            problems,
            [
                "agent.nmae: unknown key (did you mean \"name\"?)",
                "agent.whatever: unknown key; known keys here: name, workspace",
            ]
        );
    }

    #[test]
    fn nested_paths_are_quoted() {
        let problems = walk("[m.\"a.b\"]\nx = 1\n", |root| {
            let mut m = root.section("m");
            for (k, v) in m.rest() {
                let mut s = m.child(&k, v).unwrap();
                assert_eq!(s.key_path("x"), "m.\"a.b\".x");
                let _ = get(&mut s, "x", TEXT);
            }
        });
        assert_eq!(problems, ["m.\"a.b\".x: expected a string, got 1"]);
    }

    #[test]
    fn array_of_tables_gets_indexed_paths() {
        let problems = walk("[[s]]\nname = 1\n[[s]]\nname = \"ok\"\n", |root| {
            let items = root.tables("s");
            assert_eq!(items.len(), 2);
            for mut item in items {
                let _ = get(&mut item, "name", TEXT);
            }
        });
        assert_eq!(problems, ["s[0].name: expected a string, got 1"]);
    }
}
