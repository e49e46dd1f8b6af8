//! `agentd check-config --migrate`: rewrite `agentd.toml` with every renamed key under its new
//! name and every retired one removed (`keys::renames::RENAMES`), keeping every value, every
//! comment and the layout (`toml_edit`). The file is replaced only when the rewritten text loads
//! to the same effective configuration (`render_effective`); the old file is kept beside it.

use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, Item, Key, RawString, Table};

use super::keys::renames::{RENAMES, Rename};

/// The rewritten text and one line per change.
#[derive(Debug)]
pub struct Rewrite {
    pub text: String,
    pub changes: Vec<String>,
}

/// What `migrate` did.
#[derive(Debug)]
pub struct Migrated {
    /// One line per change (empty: the file was already current and was left alone).
    pub changes: Vec<String>,
    /// The copy of the old file (`None` when nothing changed).
    pub backup: Option<PathBuf>,
}

/// Why the file was not rewritten.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("cannot read or write {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not rewritten: {message}", path.display())]
    Refused { path: PathBuf, message: String },
    #[error(transparent)]
    Config(#[from] super::ConfigError),
}

/// Rewrite `text` with `renames`. A key that cannot be rewritten (inside an inline table) is
/// named in `changes` as left for the user.
pub fn rewrite(text: &str, renames: &[Rename]) -> Result<Rewrite, String> {
    let mut doc: DocumentMut = text
        .parse()
        .map_err(|e: toml_edit::TomlError| e.message().to_string())?;
    let mut changes = Vec::new();
    for r in renames {
        match table_mut(doc.as_table_mut(), r.table) {
            Some(Found::Table(t)) if t.contains_key(r.old) => {
                changes.push(rename_in(t, r));
            }
            Some(Found::Inline) => changes.push(format!(
                "{}: inside an inline table; not rewritten, edit it by hand",
                r.old_path()
            )),
            _ => {}
        }
    }
    Ok(Rewrite {
        text: doc.to_string(),
        changes,
    })
}

enum Found<'t> {
    Table(&'t mut Table),
    /// The key's table is an inline table whose entries this rewrite leaves alone.
    Inline,
}

fn table_mut<'t>(root: &'t mut Table, path: &str) -> Option<Found<'t>> {
    if path.is_empty() {
        return Some(Found::Table(root));
    }
    let mut t = root;
    for part in path.split('.') {
        match t.get_mut(part)? {
            Item::Table(next) => t = next,
            Item::Value(v) if v.is_inline_table() => return Some(Found::Inline),
            _ => return None,
        }
    }
    Some(Found::Table(t))
}

/// Rename (or remove) `r.old` in `t`, keeping the order of the entries and every comment: the
/// comment lines above a removed key move to the entry after it.
fn rename_in(t: &mut Table, r: &Rename) -> String {
    let both = r.new.is_some_and(|n| t.contains_key(n));
    let names: Vec<String> = t.iter().map(|(k, _)| k.to_string()).collect();
    let entries: Vec<(Key, Item)> = names.iter().filter_map(|k| t.remove_entry(k)).collect();
    let mut carried = String::new();
    let mut change = String::new();
    for (key, item) in entries {
        let mut key = key;
        if key.get() == r.old {
            let shown = item.as_value().map(|v| {
                let mut v = v.clone();
                v.decor_mut().clear();
                v.to_string()
            });
            let shown = shown.unwrap_or_else(|| "(a table)".into());
            match (r.new, both) {
                (Some(new), false) => {
                    let decor = key.leaf_decor().clone();
                    key = Key::new(new).with_leaf_decor(decor);
                    change = format!("{} -> {} (= {shown})", r.old_path(), join(r.table, new));
                }
                _ => {
                    carried.push_str(&prefix_of(&key));
                    let why = if both {
                        "its new name is set too"
                    } else {
                        "retired"
                    };
                    carried.push_str(&format!("# {} = {shown} removed ({why})\n", r.old));
                    change = format!("{} removed ({why}; it was {shown})", r.old_path());
                    continue;
                }
            }
        }
        if !carried.is_empty() {
            let prefix = format!("{carried}{}", prefix_of(&key));
            key.leaf_decor_mut().set_prefix(prefix);
            carried.clear();
        }
        t.insert_formatted(&key, item);
    }
    if !carried.is_empty() {
        let suffix = t.decor().suffix().and_then(RawString::as_str).unwrap_or("");
        let suffix = format!("\n{}{suffix}", carried.trim_end());
        t.decor_mut().set_suffix(suffix);
    }
    change
}

fn prefix_of(key: &Key) -> String {
    (key.leaf_decor().prefix())
        .and_then(RawString::as_str)
        .unwrap_or("")
        .to_string()
}

fn join(table: &str, key: &str) -> String {
    super::walker::join_key(table, key)
}

/// `check-config --migrate` on the file at `path`: rewrite it when a renamed or retired key is
/// in it, only if the result loads to the same effective configuration, atomically, with a
/// copy of the old file beside it (`<name>.before-migrate-<unix seconds>`).
pub fn migrate(
    path: &Path,
    load: impl Fn(&Path) -> Result<super::Config, super::ConfigError>,
) -> Result<Migrated, MigrateError> {
    let io = |source| MigrateError::Io {
        path: path.to_path_buf(),
        source,
    };
    let refused = |message: String| MigrateError::Refused {
        path: path.to_path_buf(),
        message,
    };
    let before = load(path)?;
    let text = std::fs::read_to_string(path).map_err(io)?;
    let new = rewrite(&text, RENAMES).map_err(refused)?;
    if new.text == text {
        return Ok(Migrated {
            changes: new.changes,
            backup: None,
        });
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let backup = path.with_file_name(format!(
        "{}.before-migrate-{secs}",
        name.as_deref().unwrap_or("agentd.toml")
    ));
    crate::fsutil::atomic_write(&backup, text.as_bytes()).map_err(io)?;
    crate::fsutil::atomic_write(path, new.text.as_bytes()).map_err(io)?;
    let same =
        load(path).map(|after| super::render_effective(&after) == super::render_effective(&before));
    if !matches!(same, Ok(true)) {
        crate::fsutil::atomic_write(path, text.as_bytes()).map_err(io)?;
        return Err(refused(format!(
            "the rewritten file would not load to the same configuration; the file is unchanged (copy in {})",
            backup.display()
        )));
    }
    Ok(Migrated {
        changes: new.changes,
        backup: Some(backup),
    })
}

#[cfg(test)]
mod tests;
