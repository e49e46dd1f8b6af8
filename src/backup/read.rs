//! Reading a backup: every entry unpacked into a directory while it is hashed, then the checks
//! of `agentd backup verify` (SPEC §24): the manifest, every hash and size, `PRAGMA
//! integrity_check` on both databases, every trail line parses, schema versions this release
//! reads. Each problem names its file.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use super::manifest::{self, Manifest, Problem};
use super::{BackupError, Progress, io_err};
use crate::fsutil;
use crate::session::TrailLine;
use crate::store::backup::{DbKind, check_copy};

/// What `verify` found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Verified {
    /// `None` when the archive has no readable manifest.
    pub manifest: Option<Manifest>,
    pub problems: Vec<Problem>,
}

impl Verified {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Verify the backup `file`. Its entries are unpacked into a temp directory beside it (removed
/// after); a problem of the archive itself (not zstd, not tar) is reported like the others.
pub fn verify(file: &Path, progress: &mut dyn Progress) -> Result<Verified, BackupError> {
    let dir = file.parent().unwrap_or(Path::new("."));
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let scratch = dir.join(fsutil::temp_name(&format!("{name}.verify")));
    fsutil::create_private_dir(&scratch).map_err(io_err("create", &scratch))?;
    let result = unpack_and_check(file, &scratch, progress);
    let _ = fs::remove_dir_all(&scratch);
    result
}

/// Unpack `file` into `into` (which must exist) and check it.
pub(crate) fn unpack_and_check(
    file: &Path,
    into: &Path,
    progress: &mut dyn Progress,
) -> Result<Verified, BackupError> {
    let reader = File::open(file).map_err(io_err("read", file))?;
    let mut found = BTreeMap::new();
    let mut problems = Vec::new();
    let manifest = match unpack(reader, into, &mut found, progress) {
        Ok(m) => m,
        Err(e) => {
            problems.push(Problem::general(format!(
                "the archive cannot be read to its end ({e}): it is truncated or damaged"
            )));
            None
        }
    };
    let Some(manifest) = manifest else {
        problems.push(Problem::of(
            manifest::MANIFEST,
            "missing: not a complete agentd backup",
        ));
        return Ok(Verified {
            manifest: None,
            problems,
        });
    };
    let latest = (
        DbKind::Agentd.latest_version(),
        DbKind::Memory.latest_version(),
    );
    problems.extend(manifest.check(&found, latest));
    for kind in DbKind::ALL {
        let name = format!("state/{}", kind.file_name());
        if found.contains_key(&name) {
            problems.extend(check_db(&into.join(&name), &name));
        }
    }
    for name in found
        .keys()
        .filter(|n| n.starts_with("state/") && n.ends_with(".jsonl"))
    {
        problems.extend(check_trail(&into.join(name), name));
    }
    progress.end();
    Ok(Verified {
        manifest: Some(manifest),
        problems,
    })
}

/// Unpack every entry under `into`, recording (size, SHA-256) per path; the manifest is
/// parsed, not written. An entry whose path leaves `into` is refused.
fn unpack(
    reader: File,
    into: &Path,
    found: &mut BTreeMap<String, (u64, String)>,
    progress: &mut dyn Progress,
) -> io::Result<Option<Manifest>> {
    let decoder = zstd::Decoder::new(reader)?;
    let mut archive = tar::Archive::new(decoder);
    let mut manifest = None;
    progress.begin(0);
    for entry in archive.entries()? {
        let mut entry = entry?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let name = entry.path()?.to_string_lossy().into_owned();
        if name == manifest::MANIFEST {
            let mut text = Vec::new();
            entry.read_to_end(&mut text)?;
            manifest = Some(serde_json::from_slice::<Manifest>(&text).map_err(io::Error::other)?);
            continue;
        }
        let Some(dest) = safe_join(into, &name) else {
            return Err(io::Error::other(format!(
                "entry {name:?} leaves the archive's directories"
            )));
        };
        if let Some(parent) = dest.parent() {
            fsutil::create_private_dir(parent)?;
        }
        let mut out = fsutil::create_temp(&dest)?;
        let mut hash = Sha256::new();
        let mut size = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = entry.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            io::Write::write_all(&mut out, &buf[..n])?;
            size += n as u64;
        }
        out.sync_all()?;
        found.insert(name.clone(), (size, manifest::hex(&hash.finalize())));
        progress.file(&name);
    }
    Ok(manifest)
}

/// `into/name` when `name` is relative, without `..`, under `state/`, `workspace/` or
/// `config/`.
fn safe_join(into: &Path, name: &str) -> Option<PathBuf> {
    let rel = Path::new(name);
    let normal = rel.components().all(|c| matches!(c, Component::Normal(_)));
    let top = ["state/", "workspace/", "config/"]
        .iter()
        .any(|t| name.starts_with(t));
    (normal && top).then(|| into.join(rel))
}

fn check_db(path: &Path, name: &str) -> Vec<Problem> {
    match check_copy(path) {
        Ok(c) => c
            .problems
            .into_iter()
            .take(5)
            .map(|p| Problem::of(name, format!("integrity check: {p}")))
            .collect(),
        Err(e) => vec![Problem::of(
            name,
            format!(
                "not a readable database: {}",
                crate::telemetry::error_chain(&e)
            ),
        )],
    }
}

fn check_trail(path: &Path, name: &str) -> Vec<Problem> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) => return vec![Problem::of(name, format!("cannot read: {e}"))],
    };
    let mut out = Vec::new();
    for (n, line) in BufReader::new(file).split(b'\n').enumerate() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                out.push(Problem::of(name, format!("cannot read: {e}")));
                break;
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if let Err(e) = serde_json::from_slice::<TrailLine>(&line) {
            out.push(Problem::of(
                name,
                format!("line {} does not parse: {e}", n + 1),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_relative_paths_under_the_three_directories_are_unpacked() {
        let d = Path::new("/x");
        assert_eq!(safe_join(d, "state/a"), Some(PathBuf::from("/x/state/a")));
        assert_eq!(safe_join(d, "state/../../etc/passwd"), None);
        assert_eq!(safe_join(d, "/etc/passwd"), None);
        assert_eq!(safe_join(d, "other/a"), None);
    }
}
