//! Path handling for config values: `~` expansion, resolution against a base directory, and
//! making paths absolute (canonical when they exist).

use std::path::{Component, Path, PathBuf};

use super::env::Env;

/// Expand a leading `~` (alone or followed by `/`) to `$HOME`. `~user` is left alone. Returns
/// `None` when `~` is used and HOME is unset.
pub fn expand_tilde(raw: &str, env: &Env) -> Option<PathBuf> {
    if raw == "~" || raw.starts_with("~/") {
        let home = env.get_non_empty("HOME")?;
        let rest = raw.trim_start_matches('~').trim_start_matches('/');
        let home = PathBuf::from(home);
        return Some(if rest.is_empty() {
            home
        } else {
            home.join(rest)
        });
    }
    Some(PathBuf::from(raw))
}

/// `path` if absolute, otherwise `base.join(path)`; then [`absolutize`].
pub fn resolve(path: &Path, base: &Path) -> PathBuf {
    if path.is_absolute() {
        absolutize(path)
    } else {
        absolutize(&base.join(path))
    }
}

/// Canonical form when the path exists (symlinks resolved), otherwise lexically normalised
/// (`.` dropped, `..` applied).
pub fn absolutize(path: &Path) -> PathBuf {
    if let Ok(canon) = std::fs::canonicalize(path) {
        return canon;
    }
    normalize(path)
}

/// Lexical normalisation: drops `.`, applies `..` (never above the root).
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for comp in path.components() {
        match comp {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() && !path.is_absolute() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn env_with_home(home: &str) -> Env {
        Env::with_process_map(
            BTreeMap::from([("HOME".to_string(), home.to_string())]),
            BTreeMap::new(),
        )
    }

    #[test]
    fn tilde_expands_to_home() {
        let env = env_with_home("/home/u");
        assert_eq!(expand_tilde("~", &env), Some(PathBuf::from("/home/u")));
        assert_eq!(
            expand_tilde("~/.agentd", &env),
            Some(PathBuf::from("/home/u/.agentd"))
        );
        assert_eq!(
            expand_tilde("~other/x", &env),
            Some(PathBuf::from("~other/x"))
        );
        assert_eq!(expand_tilde("rel/x", &env), Some(PathBuf::from("rel/x")));
        let no_home = Env::with_process_map(BTreeMap::new(), BTreeMap::new());
        assert_eq!(expand_tilde("~/x", &no_home), None);
    }

    #[test]
    fn relative_paths_resolve_against_the_base() {
        assert_eq!(
            resolve(
                Path::new("../workspace"),
                Path::new("/nonexistent-agentd/config")
            ),
            PathBuf::from("/nonexistent-agentd/workspace")
        );
        assert_eq!(
            resolve(Path::new("/abs/./x"), Path::new("/ignored")),
            PathBuf::from("/abs/x")
        );
    }

    #[test]
    fn existing_paths_are_canonicalised() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("link")).unwrap();
        let canon_real = std::fs::canonicalize(dir.path().join("real")).unwrap();
        assert_eq!(resolve(Path::new("link"), dir.path()), canon_real);
    }
}
