//! What the calls of one answer do to files, and which must wait for which (SPEC §6: calls of
//! one answer run concurrently). A model that writes a file and reads it back in one answer
//! expects the read to see the write; run side by side, the read found no file. So a call
//! waits for every earlier call of its answer that writes a path it reads or writes, or reads
//! a path it writes; calls that share nothing still run side by side. Paths are compared after
//! resolving them against the workspace lexically (no file system access), a directory
//! overlapping everything under it.

use std::path::{Component, Path, PathBuf};

/// What one call reads and writes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Effects {
    pub reads: Reads,
    pub writes: Vec<PathBuf>,
}

/// What a call reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Reads {
    /// Nothing on disk (memory, the web, MCP servers, messages).
    #[default]
    Nothing,
    /// These paths (a directory: everything under it).
    Paths(Vec<PathBuf>),
    /// Anything (`exec`): it waits for every earlier write of its answer, and a later write
    /// waits for it.
    All,
}

impl Effects {
    /// A call that reads `paths`.
    pub fn reading(paths: Vec<PathBuf>) -> Effects {
        Effects {
            reads: Reads::Paths(paths),
            writes: Vec::new(),
        }
    }

    /// A call that reads and writes `path` (`edit`, `write`: a write replaces what was read).
    pub fn writing(path: PathBuf) -> Effects {
        Effects {
            reads: Reads::Paths(vec![path.clone()]),
            writes: vec![path],
        }
    }

    fn reads_any(&self, paths: &[PathBuf]) -> bool {
        match &self.reads {
            Reads::All => !paths.is_empty(),
            Reads::Nothing => false,
            Reads::Paths(mine) => mine.iter().any(|m| paths.iter().any(|p| overlap(m, p))),
        }
    }

    fn writes_any(&self, paths: &[PathBuf]) -> bool {
        self.writes
            .iter()
            .any(|m| paths.iter().any(|p| overlap(m, p)))
    }

    /// Whether a later call with `later` effects must wait for this one.
    fn orders(&self, later: &Effects) -> bool {
        later.reads_any(&self.writes)
            || later.writes_any(&self.writes)
            || self.reads_any(&later.writes)
    }
}

/// For each call, the earlier calls it waits for (only the nearest of a chain is needed, but
/// all are listed: the lists are short).
pub fn waits_for(effects: &[Effects]) -> Vec<Vec<usize>> {
    effects
        .iter()
        .enumerate()
        .map(|(j, later)| {
            (0..j)
                .filter(|&i| effects[i].orders(later))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `path` (relative to `workspace` unless absolute) with `.` and `..` resolved lexically.
pub fn resolve(workspace: &Path, path: &str) -> PathBuf {
    let joined = workspace.join(path);
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn overlap(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        resolve(Path::new("/ws"), s)
    }

    #[test]
    fn a_read_after_a_write_of_the_same_file_waits() {
        let e = [
            Effects::writing(p("notes.txt")),
            Effects::reading(vec![p("./notes.txt")]),
            Effects::reading(vec![p("other.txt")]),
        ];
        assert_eq!(waits_for(&e), [vec![], vec![0], vec![]]);
    }

    #[test]
    fn directories_exec_and_writes_after_reads_are_ordered() {
        let e = [
            Effects::reading(vec![p("a/b.txt")]),
            Effects::writing(p("a/b.txt")),
            Effects::reading(vec![p("a")]),
            Effects {
                reads: Reads::All,
                writes: vec![],
            },
            Effects::default(),
            Effects::writing(p("/elsewhere/x")),
        ];
        let w = waits_for(&e);
        // The write waits for the read before it; the listing of `a` for the write; exec
        // for the write; the call that touches nothing for none; the unrelated write for the
        // exec (which may read it).
        assert_eq!(w[1], [0]);
        assert_eq!(w[2], [1]);
        assert_eq!(w[3], [1]);
        assert!(w[4].is_empty());
        assert_eq!(w[5], [3]);
    }

    #[test]
    fn paths_resolve_lexically() {
        assert_eq!(p("a/../b/./c"), PathBuf::from("/ws/b/c"));
        assert_eq!(p("/abs/x"), PathBuf::from("/abs/x"));
    }
}
