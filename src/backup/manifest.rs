//! `manifest.json`, the last entry of a backup: every other file with its size and SHA-256, the
//! agentd version, the schema versions of both databases, the time, and the messages that were
//! in flight. [`Manifest::check`] is the pure part of `agentd backup verify`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The manifest's name in the archive.
pub const MANIFEST: &str = "manifest.json";
/// The format of this manifest; a reader accepts every older one.
pub const FORMAT: u32 = 1;

/// One file of the archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Path in the archive (`state/…`, `workspace/…`, `config/…`).
    pub path: String,
    pub size: u64,
    /// Lowercase hex.
    pub sha256: String,
}

/// A message acknowledged (its intake line is in the backup) but not finished when the
/// trails were copied: its reply, if any came, is not in the backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlight {
    pub session_id: String,
    pub intake_id: String,
}

/// The schema versions (`PRAGMA user_version`) of the databases copied; `None`: not there.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schemas {
    pub agentd_db: Option<i64>,
    pub memory_db: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub agentd_version: String,
    /// RFC 3339, when the backup started.
    pub created_at: String,
    pub schemas: Schemas,
    /// Whether `config/.env` (the secrets) is in the archive.
    pub with_secrets: bool,
    pub files: Vec<FileEntry>,
    #[serde(default)]
    pub in_flight: Vec<InFlight>,
}

/// One problem `verify` found; `path` names the file when there is one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub path: Option<String>,
    pub problem: String,
}

impl Problem {
    pub fn of(path: &str, problem: impl Into<String>) -> Problem {
        Problem {
            path: Some(path.to_owned()),
            problem: problem.into(),
        }
    }
    pub fn general(problem: impl Into<String>) -> Problem {
        Problem {
            path: None,
            problem: problem.into(),
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{p}: {}", self.problem),
            None => f.write_str(&self.problem),
        }
    }
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

pub(crate) fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

impl Manifest {
    /// Compare the files found in the archive (path → size and SHA-256) with the manifest:
    /// each missing, changed or unlisted file is one problem naming it, and so is a schema
    /// newer than this release reads (`latest`: agentd.db, memory.db).
    pub fn check(
        &self,
        found: &BTreeMap<String, (u64, String)>,
        latest: (i64, i64),
    ) -> Vec<Problem> {
        let mut out = Vec::new();
        if self.format > FORMAT {
            out.push(Problem::general(format!(
                "the manifest's format {} is newer than this agentd reads ({FORMAT}): use a newer agentd",
                self.format
            )));
        }
        for (name, version, latest) in [
            ("state/agentd.db", self.schemas.agentd_db, latest.0),
            ("state/memory.db", self.schemas.memory_db, latest.1),
        ] {
            if let Some(v) = version.filter(|v| *v > latest) {
                out.push(Problem::of(
                    name,
                    format!("schema version {v} is newer than this agentd reads ({latest}): restore it with agentd {} or newer", self.agentd_version),
                ));
            }
        }
        for f in &self.files {
            match found.get(&f.path) {
                None => out.push(Problem::of(&f.path, "missing from the archive")),
                Some((size, _)) if *size != f.size => out.push(Problem::of(
                    &f.path,
                    format!("size {size} bytes, the manifest says {}", f.size),
                )),
                Some((_, sha)) if *sha != f.sha256 => out.push(Problem::of(
                    &f.path,
                    "SHA-256 differs from the manifest's: the file was changed or damaged",
                )),
                Some(_) => {}
            }
        }
        let listed: std::collections::HashSet<&str> =
            self.files.iter().map(|f| f.path.as_str()).collect();
        for path in found.keys().filter(|p| !listed.contains(p.as_str())) {
            out.push(Problem::of(path, "in the archive but not in the manifest"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(files: &[(&str, &[u8])]) -> Manifest {
        Manifest {
            format: FORMAT,
            agentd_version: "0.1.0".into(),
            created_at: "2026-12-07T00:00:00Z".into(),
            schemas: Schemas {
                agentd_db: Some(5),
                memory_db: Some(3),
            },
            with_secrets: false,
            files: files
                .iter()
                .map(|(p, b)| FileEntry {
                    path: (*p).into(),
                    size: b.len() as u64,
                    sha256: sha256_hex(b),
                })
                .collect(),
            in_flight: vec![],
        }
    }

    fn found(files: &[(&str, &[u8])]) -> BTreeMap<String, (u64, String)> {
        files
            .iter()
            .map(|(p, b)| ((*p).to_owned(), (b.len() as u64, sha256_hex(b))))
            .collect()
    }

    #[test]
    fn a_whole_archive_has_no_problem() {
        let files: &[(&str, &[u8])] = &[("state/a.jsonl", b"{}\n"), ("workspace/m.md", b"x")];
        assert!(manifest(files).check(&found(files), (5, 3)).is_empty());
    }

    #[test]
    fn each_missing_changed_resized_or_unlisted_file_is_named() {
        let m = manifest(&[
            ("state/a.jsonl", b"{}\n"),
            ("state/b.jsonl", b"{}\n"),
            ("state/agentd.db", b"12345678"),
        ]);
        let got = found(&[
            ("state/a.jsonl", b"{]\n"),
            ("state/agentd.db", b"1234"),
            ("state/extra", b""),
        ]);
        let problems = m.check(&got, (5, 3));
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(problems.len(), 4, "{text:?}");
        assert!(
            text[0].starts_with("state/a.jsonl: SHA-256 differs"),
            "{text:?}"
        );
        assert!(text[1].starts_with("state/b.jsonl: missing"), "{text:?}");
        assert!(
            text[2].starts_with("state/agentd.db: size 4 bytes"),
            "{text:?}"
        );
        assert!(
            text[3].starts_with("state/extra: in the archive but not"),
            "{text:?}"
        );
    }

    #[test]
    fn a_schema_newer_than_this_release_is_a_problem() {
        let m = manifest(&[]);
        let problems = m.check(&BTreeMap::new(), (4, 3));
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].path.as_deref(), Some("state/agentd.db"));
        assert!(problems[0].problem.contains("newer than this agentd"));
    }

    #[test]
    fn the_manifest_round_trips_and_reads_without_in_flight() {
        let m = manifest(&[("state/x", b"1")]);
        let text = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<Manifest>(&text).unwrap(), m);
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v.as_object_mut().unwrap().remove("in_flight");
        assert!(serde_json::from_value::<Manifest>(v).is_ok());
    }
}
