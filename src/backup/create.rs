//! Writing a backup. The order makes it consistent while the daemon runs: the sessions'
//! snapshots and index first, then their trails (append-only, cut at the last whole line), then
//! the databases in one read transaction each. A snapshot is therefore never ahead of its
//! trail, and every reply in a copied trail has its cost row in the copied `agentd.db` (the
//! row is written before the reply is recorded). Messages whose intake is copied but whose
//! ending is not are named in the manifest as in flight.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::manifest::{self, FileEntry, InFlight, Manifest, Schemas};
use super::{BackupError, Options, Progress, Sources, io_err};
use crate::fsutil;
use crate::session::TrailLine;
use crate::store::backup::{DbKind, copy_online};

/// zstd level: the default, fast enough to run beside the daemon.
const ZSTD_LEVEL: i32 = 3;

/// Files and directories of the state directory a backup leaves out: the live process's
/// (pid file, FIFO, monitor, the running config, logs), downloads, and what is copied otherwise (the databases
/// and their journals) or is a backup itself.
const LEFT_OUT: &[&str] = &[
    "agentd.pid",
    "control.pipe",
    "monitor.json",
    "running-config.toml",
    "logs",
    "inbox",
    "backups",
    "agentd.db",
    "agentd.db-wal",
    "agentd.db-shm",
    "agentd.db-journal",
    "memory.db",
    "memory.db-wal",
    "memory.db-shm",
    "memory.db-journal",
];

/// What a backup wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub path: PathBuf,
    /// The archive's size in bytes.
    pub bytes: u64,
    /// Files in the archive besides the manifest.
    pub files: usize,
    pub created_at: String,
    pub schemas: Schemas,
    pub with_secrets: bool,
    /// Messages acknowledged but not finished when the trails were copied.
    pub in_flight: Vec<InFlight>,
}

/// Write a backup of `src` to `opts.to` (see the module's comment for the order). The archive
/// is written under a temp name beside it, fsynced and renamed only when complete: a killed or
/// failed backup leaves no file under the final name. Mode 0600.
pub fn create(
    src: &Sources,
    opts: &Options,
    progress: &mut dyn Progress,
) -> Result<Report, BackupError> {
    let started = chrono::Utc::now();
    let dir = opts.to.parent().unwrap_or(Path::new(".")).to_path_buf();
    let name = opts
        .to
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| {
            BackupError::Refused(format!("--to {}: not a file name", opts.to.display()))
        })?;
    let tmp = dir.join(fsutil::temp_name(&name));
    let file = fsutil::create_temp(&tmp).map_err(io_err("create", &tmp))?;
    let staged = Staging {
        dir: &dir,
        name: &name,
        files: Vec::new(),
    };
    let result = write_all(src, opts, &started, file, &tmp, staged, progress);
    match result {
        Ok((file, report)) => {
            fsutil::persist_temp(file, &tmp, &opts.to).map_err(io_err("write", &opts.to))?;
            Ok(report)
        }
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Temp files of the database copies, beside the archive, removed when dropped.
struct Staging<'a> {
    dir: &'a Path,
    name: &'a str,
    files: Vec<PathBuf>,
}

impl Staging<'_> {
    fn next(&mut self, what: &str) -> PathBuf {
        let p = self
            .dir
            .join(fsutil::temp_name(&format!("{}.{what}", self.name)));
        self.files.push(p.clone());
        p
    }
}

impl Drop for Staging<'_> {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = fs::remove_file(f);
        }
    }
}

fn write_all(
    src: &Sources,
    opts: &Options,
    started: &chrono::DateTime<chrono::Utc>,
    file: File,
    tmp: &Path,
    mut staging: Staging<'_>,
    progress: &mut dyn Progress,
) -> Result<(File, Report), BackupError> {
    let plan = Plan::of(src, opts, &staging.dir.to_path_buf())?;
    progress.begin(plan.total());
    let encoder =
        zstd::Encoder::new(BufWriter::new(file), ZSTD_LEVEL).map_err(io_err("write", tmp))?;
    let mut out = Archive {
        tar: tar::Builder::new(encoder),
        files: Vec::new(),
        tmp: tmp.to_path_buf(),
        mtime: u64::try_from(started.timestamp()).unwrap_or(0),
    };
    for (path, name) in &plan.before_trails {
        out.add_file(path, name)?;
        progress.file(name);
    }
    let mut in_flight = Vec::new();
    for (dir, prefix, id) in &plan.sessions {
        in_flight.extend(out.add_trails(dir, prefix, id)?);
        progress.file(id);
    }
    let mut schemas = Schemas::default();
    for kind in DbKind::ALL {
        let copy = staging.next(kind.file_name());
        let version = copy_online(&src.state_dir.join(kind.file_name()), &copy)?;
        if version.is_some() {
            out.add_file(&copy, &format!("state/{}", kind.file_name()))?;
        }
        match kind {
            DbKind::Agentd => schemas.agentd_db = version,
            DbKind::Memory => schemas.memory_db = version,
        }
        progress.file(kind.file_name());
    }
    for (path, name) in &plan.after {
        out.add_file(path, name)?;
        progress.file(name);
    }
    let manifest = Manifest {
        format: manifest::FORMAT,
        agentd_version: crate::VERSION.to_owned(),
        created_at: started.to_rfc3339(),
        schemas,
        with_secrets: opts.with_secrets,
        files: out.files.clone(),
        in_flight,
    };
    let bytes = serde_json::to_vec_pretty(&manifest).unwrap_or_default();
    out.add_bytes(manifest::MANIFEST, &bytes)?;
    let file = out.finish()?;
    progress.end();
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    Ok((
        file,
        Report {
            path: opts.to.clone(),
            bytes: size,
            files: manifest.files.len(),
            created_at: manifest.created_at,
            schemas: manifest.schemas,
            with_secrets: opts.with_secrets,
            in_flight: manifest.in_flight,
        },
    ))
}

/// The files to copy, listed before copying starts.
struct Plan {
    /// (file, name in the archive): session snapshots and index, other state files.
    before_trails: Vec<(PathBuf, String)>,
    /// (directory, archive prefix, session id): each session's trail files, listed again when
    /// copied (a new day's file may have started).
    sessions: Vec<(PathBuf, String, String)>,
    /// Workspace and config files.
    after: Vec<(PathBuf, String)>,
}

impl Plan {
    fn of(src: &Sources, opts: &Options, out_dir: &PathBuf) -> Result<Plan, BackupError> {
        let mut state = Vec::new();
        walk(&src.state_dir, "state", &mut state, &|rel: &Path| {
            let first = rel
                .components()
                .next()
                .map(|c| c.as_os_str().to_string_lossy());
            rel.components().count() == 1 && first.is_some_and(|f| LEFT_OUT.contains(&f.as_ref()))
        })?;
        // The backup's own directory when it is inside the state directory.
        if out_dir.starts_with(&src.state_dir) && out_dir != &src.state_dir {
            state.retain(|(p, _)| !p.starts_with(out_dir));
        }
        let mut before_trails = Vec::new();
        let mut sessions = Vec::new();
        for (path, name) in state {
            let file = name.rsplit('/').next().unwrap_or_default();
            match trail_session(file) {
                Some(id) => {
                    let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
                    let prefix = name[..name.len() - file.len()].to_owned();
                    let entry = (dir, prefix, id.to_owned());
                    if sessions.last() != Some(&entry) {
                        sessions.push(entry);
                    }
                }
                None => before_trails.push((path, name)),
            }
        }
        let mut after = Vec::new();
        walk(&src.workspace, "workspace", &mut after, &|_| false)?;
        let config_dir = src.config_path.parent().unwrap_or(Path::new("."));
        after.push((
            src.config_path.clone(),
            config_name(config_dir, &src.config_path),
        ));
        walk(
            &src.providers_dir,
            "config/providers.d",
            &mut after,
            &|_| false,
        )?;
        let env = src.env_file();
        if opts.with_secrets && env.is_file() {
            after.push((env, "config/.env".to_owned()));
        }
        Ok(Plan {
            before_trails,
            sessions,
            after,
        })
    }

    fn total(&self) -> u64 {
        (self.before_trails.len() + self.sessions.len() + DbKind::ALL.len() + self.after.len())
            as u64
    }
}

fn config_name(_dir: &Path, path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    format!("config/{}", name.unwrap_or_else(|| "agentd.toml".into()))
}

/// `<id>` of a trail file `<id>.<yyyy-mm-dd>.jsonl`.
fn trail_session(file: &str) -> Option<&str> {
    let stem = file.strip_suffix(".jsonl")?;
    let (id, date) = stem.rsplit_once('.')?;
    (date.len() == 10 && !id.is_empty()).then_some(id)
}

/// Every regular file under `root` (sorted, recursive; symlinks, FIFOs and temp files left
/// out) as (path, `prefix/relative`), except those `skip` names by their relative path.
fn walk(
    root: &Path,
    prefix: &str,
    out: &mut Vec<(PathBuf, String)>,
    skip: &dyn Fn(&Path) -> bool,
) -> Result<(), BackupError> {
    let mut stack = vec![root.to_path_buf()];
    let mut found = Vec::new();
    while let Some(dir) = stack.pop() {
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("read the directory", &dir)(e)),
        };
        for entry in rd {
            let entry = entry.map_err(io_err("read the directory", &dir))?;
            let path = entry.path();
            let Ok(rel) = path.strip_prefix(root) else {
                continue;
            };
            let name = entry.file_name().to_string_lossy().into_owned();
            if skip(rel) || (name.starts_with('.') && name.contains(".tmp.")) {
                continue;
            }
            let kind = entry.file_type().map_err(io_err("read", &path))?;
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                found.push((path.clone(), format!("{prefix}/{}", rel.to_string_lossy())));
            }
        }
    }
    found.sort_by(|a, b| a.1.cmp(&b.1));
    out.extend(found);
    Ok(())
}

/// The tar + zstd stream being written, and the manifest's entries so far.
struct Archive {
    tar: tar::Builder<zstd::Encoder<'static, BufWriter<File>>>,
    files: Vec<FileEntry>,
    tmp: PathBuf,
    mtime: u64,
}

impl Archive {
    fn header(&self, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_size(size);
        h.set_mode(0o600);
        h.set_mtime(self.mtime);
        h.set_entry_type(tar::EntryType::Regular);
        h
    }

    /// Add the file at `path` as `name`, as long as it was when opened (a file replaced
    /// meanwhile keeps its old content open). A file gone since the listing is left out.
    fn add_file(&mut self, path: &Path, name: &str) -> Result<(), BackupError> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err("read", path)(e)),
        };
        let size = file.metadata().map_err(io_err("read", path))?.len();
        let mut reader = Hashing {
            inner: file.take(size),
            hash: Sha256::new(),
            n: 0,
        };
        let mut header = self.header(size);
        self.tar
            .append_data(&mut header, name, &mut reader)
            .map_err(io_err("write", &self.tmp))?;
        if reader.n != size {
            return Err(BackupError::Refused(format!(
                "{} shrank while it was copied; run the backup again",
                path.display()
            )));
        }
        self.files.push(FileEntry {
            path: name.to_owned(),
            size,
            sha256: manifest::hex(&reader.hash.finalize()),
        });
        Ok(())
    }

    fn add_bytes(&mut self, name: &str, bytes: &[u8]) -> Result<(), BackupError> {
        let mut header = self.header(bytes.len() as u64);
        self.tar
            .append_data(&mut header, name, bytes)
            .map_err(io_err("write", &self.tmp))
    }

    /// Add session `id`'s trail files of `dir`, each cut after its last whole line (a line
    /// being appended is left out), and return the intakes without an ending in them.
    fn add_trails(
        &mut self,
        dir: &Path,
        prefix: &str,
        id: &str,
    ) -> Result<Vec<InFlight>, BackupError> {
        let mut lines: Vec<TrailLine> = Vec::new();
        let files = crate::session::trail::trail_files(dir, id).map_err(io_err("read", dir))?;
        for path in files {
            let mut bytes = match fs::read(&path) {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err("read", &path)(e)),
            };
            bytes.truncate(bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1));
            lines.extend(
                bytes
                    .split(|b| *b == b'\n')
                    .filter_map(|l| serde_json::from_slice(l).ok()),
            );
            let file = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let name = format!("{prefix}{file}");
            self.add_bytes(&name, &bytes)?;
            self.files.push(FileEntry {
                path: name,
                size: bytes.len() as u64,
                sha256: manifest::sha256_hex(&bytes),
            });
        }
        Ok(crate::session::pending_intakes(&lines)
            .into_iter()
            .map(|p| InFlight {
                session_id: id.to_owned(),
                intake_id: p.intake.id,
            })
            .collect())
    }

    fn finish(self) -> Result<File, BackupError> {
        let tmp = self.tmp.clone();
        let encoder = self.tar.into_inner().map_err(io_err("write", &tmp))?;
        let mut writer = encoder.finish().map_err(io_err("write", &tmp))?;
        writer.flush().map_err(io_err("write", &tmp))?;
        writer
            .into_inner()
            .map_err(|e| io_err("write", &tmp)(e.into_error()))
    }
}

/// A reader that hashes and counts what passes through.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
    n: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.n += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trail_files_are_told_from_others() {
        assert_eq!(trail_session("abc.2026-12-07.jsonl"), Some("abc"));
        assert_eq!(trail_session("abc.state.json"), None);
        assert_eq!(trail_session("sessions.json"), None);
    }
}
