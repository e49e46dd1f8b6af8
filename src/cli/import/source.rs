//! Reading another agent's state directory as hostile input: only plain relative paths below
//! the directory, no symlink anywhere on the way (the last component is opened with
//! `O_NOFOLLOW`), regular files only, every read bounded.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use super::ImportError;

/// The state directory being imported.
pub struct Source {
    root: PathBuf,
}

/// What a directory holds: names that are valid UTF-8, with whether each is a real directory.
pub struct Entry {
    pub name: String,
    pub is_dir: bool,
    pub is_file: bool,
    pub is_symlink: bool,
}

impl Source {
    /// `path` must be a directory itself, not a symlink to one.
    pub fn open(path: &Path) -> Result<Source, ImportError> {
        let refused = |why: &str| ImportError::Refused(format!("{}: {why}", path.display()));
        let meta = std::fs::symlink_metadata(path).map_err(|e| refused(&e.to_string()))?;
        if meta.file_type().is_symlink() {
            return Err(refused(
                "is a symlink; give the directory it points to instead",
            ));
        }
        if !meta.is_dir() {
            return Err(refused("not a directory"));
        }
        let root = std::fs::canonicalize(path).map_err(|e| refused(&e.to_string()))?;
        Ok(Source { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Check `rel` (plain names only) and that no component below the root is a symlink;
    /// the full path.
    fn resolve(&self, rel: &Path) -> Result<PathBuf, String> {
        let mut path = self.root.clone();
        for c in rel.components() {
            match c {
                Component::Normal(name) => path.push(name),
                _ => return Err("not a plain path below the directory (`..` or absolute)".into()),
            }
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err("a symlink (refused: it could point outside the directory)".into());
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(path)
    }

    /// The regular file at `rel`, at most `max` bytes; `Ok(None)` when it does not exist;
    /// `Err(reason)` when it is refused.
    pub fn read(&self, rel: &Path, max: u64) -> Result<Option<Vec<u8>>, String> {
        let path = self.resolve(rel)?;
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(&path);
        let file: File = match file {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let meta = file.metadata().map_err(|e| e.to_string())?;
        if !meta.is_file() {
            return Err("not a regular file".into());
        }
        if meta.len() > max {
            return Err(format!("{} bytes, over the limit of {max}", meta.len()));
        }
        let mut bytes = Vec::new();
        file.take(max + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| e.to_string())?;
        if bytes.len() as u64 > max {
            return Err(format!("over the limit of {max} bytes"));
        }
        Ok(Some(bytes))
    }

    /// `read` as UTF-8 text.
    pub fn read_text(&self, rel: &Path, max: u64) -> Result<Option<String>, String> {
        match self.read(rel, max)? {
            None => Ok(None),
            Some(b) => String::from_utf8(b)
                .map(Some)
                .map_err(|_| "not UTF-8 text".to_string()),
        }
    }

    /// The entries of the directory at `rel`, sorted by name, at most `max` (more: refused);
    /// `Ok(empty)` when it does not exist. Names that are not UTF-8 are left out.
    pub fn list(&self, rel: &Path, max: usize) -> Result<Vec<Entry>, String> {
        let path = self.resolve(rel)?;
        let rd = match std::fs::read_dir(&path) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e.to_string()),
        };
        let mut out = Vec::new();
        for e in rd {
            let e = e.map_err(|e| e.to_string())?;
            if out.len() == max {
                return Err(format!("more than {max} entries"));
            }
            let Ok(name) = e.file_name().into_string() else {
                continue;
            };
            let t = e.file_type().map_err(|e| e.to_string())?;
            out.push(Entry {
                name,
                is_dir: t.is_dir(),
                is_file: t.is_file(),
                is_symlink: t.is_symlink(),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}
