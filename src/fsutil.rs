//! Durable file writes (DESIGN §2.7): append + fsync, or temp + fsync + rename + dir fsync.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

/// Atomically replace `path` with `bytes`: write a temp file in the same directory, fsync it,
/// rename it over `path`, fsync the directory. Readers see the old or the new file, never a mix.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_replace(path, bytes, true)
}

/// Like `atomic_write` but without fsync: for live files (the monitor) where only atomicity
/// matters, not durability.
pub fn atomic_write_nosync(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_replace(path, bytes, false)
}

fn write_replace(path: &Path, bytes: &[u8], durable: bool) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(temp_name(&name));
    let written = (|| {
        let mut f = create_temp(&tmp)?;
        f.write_all(bytes)?;
        if durable {
            f.sync_all()?;
        }
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        // Also after a failed write (a full disk): a partial temp file would hold on to the
        // space and stay behind forever.
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if durable {
        fsync_dir(dir)?;
    }
    Ok(())
}

/// A temp name for `name` in the same directory, `.<name>.tmp.<pid>.<16 hex digits>`: fresh
/// and random, and what [`remove_stale_temps`] removes once its process is gone.
pub fn temp_name(name: &str) -> String {
    format!(
        ".{name}.tmp.{}.{:016x}",
        std::process::id(),
        rand::random::<u64>()
    )
}

/// Create `tmp` (a [`temp_name`]) exclusively, mode 0600, without following symlinks: a link
/// planted at a predictable temp name cannot redirect the write.
pub fn create_temp(tmp: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .mode_0600()
        .open(tmp)
}

/// Make a temp file written to completion the file at `path`: fsync it, rename it over `path`,
/// fsync the directory. Readers see `path` only once it is whole. On an error the temp file is
/// removed.
pub fn persist_temp(file: File, tmp: &Path, path: &Path) -> io::Result<()> {
    let done = file.sync_all().and_then(|()| {
        drop(file);
        fs::rename(tmp, path)
    });
    if let Err(e) = done {
        let _ = fs::remove_file(tmp);
        return Err(e);
    }
    fsync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// fsync a directory so a rename or create inside it is durable.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Append one line (a `\n` is added) with a single write, then fsync the data. When the write
/// or the fsync fails, the file is cut back to its length before the write (best effort): a
/// short write on a full disk must not leave half a line that the next append would glue onto,
/// and a line whose fsync failed was never durable, so nobody may act on it.
pub fn append_line_fsync(file: &mut File, line: &[u8]) -> io::Result<()> {
    let before = file.metadata()?.len();
    let mut buf = Vec::with_capacity(line.len() + 1);
    buf.extend_from_slice(line);
    buf.push(b'\n');
    let result = file.write_all(&buf).and_then(|()| file.sync_data());
    if result.is_err() {
        let _ = file.set_len(before);
    }
    result
}

/// If `file` does not end with a newline, cut it back to just after its last one and fsync it:
/// that tail is an append a crash (or a power cut, which can leave NUL bytes) interrupted, never
/// acknowledged. Returns how many bytes were cut (0: the file was whole). Lines appended
/// afterwards start on a fresh line instead of being glued onto the torn one.
pub fn cut_torn_tail(file: &mut File) -> io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(0);
    }
    file.seek(SeekFrom::Start(len - 1))?;
    let mut last = [0u8; 1];
    file.read_exact(&mut last)?;
    if last[0] == b'\n' {
        return Ok(0);
    }
    let mut buf = Vec::new();
    file.seek(SeekFrom::Start(0))?;
    file.read_to_end(&mut buf)?;
    let keep = buf.iter().rposition(|&c| c == b'\n').map_or(0, |p| p + 1) as u64;
    file.set_len(keep)?;
    file.sync_all()?;
    Ok(len - keep)
}

/// Remove the temp files of `atomic_write` that a killed process left in `dir` (names
/// `.<name>.tmp.<pid>.<16 hex digits>` whose pid is not a running process). Returns how many
/// were removed. Run at start, before anything writes there.
pub fn remove_stale_temps(dir: &Path) -> io::Result<usize> {
    let mut removed = 0;
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    for entry in rd {
        let entry = entry?;
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(stale_temp_pid) else {
            continue;
        };
        let alive = pid == std::process::id()
            || i32::try_from(pid).is_ok_and(|p| {
                !matches!(
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None),
                    Err(nix::errno::Errno::ESRCH)
                )
            });
        if alive || !entry.file_type()?.is_file() {
            continue;
        }
        fs::remove_file(entry.path())?;
        removed += 1;
    }
    Ok(removed)
}

/// The pid in an `atomic_write` temp name `.<name>.tmp.<pid>.<16 hex digits>`.
fn stale_temp_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?;
    let (head, random) = rest.rsplit_once('.')?;
    let (head, pid) = head.rsplit_once('.')?;
    let valid = random.len() == 16
        && random.bytes().all(|b| b.is_ascii_hexdigit())
        && head.ends_with(".tmp")
        && head.len() > ".tmp".len();
    valid.then(|| pid.parse().ok()).flatten()
}

/// Create a directory (and parents) with mode 0700.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// What [`tighten_private_dir`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tightened {
    /// Already 0700 or narrower.
    AlreadyPrivate,
    /// Ours and wider than 0700: now 0700; the old permission bits.
    From(u32),
    /// Wider than 0700 but owned by another uid: left alone; its owner and permission bits.
    NotOurs { uid: u32, mode: u32 },
}

/// Make an existing directory 0700 when it is ours and group or others may use it (a state
/// directory made by hand with the default umask is 0755).
pub fn tighten_private_dir(dir: &Path) -> io::Result<Tightened> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = fs::metadata(dir)?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(Tightened::AlreadyPrivate);
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Ok(Tightened::NotOurs {
            uid: meta.uid(),
            mode,
        });
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    Ok(Tightened::From(mode))
}

trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}

impl Mode0600 for OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn wide_private_dirs_are_tightened() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("state");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(tighten_private_dir(&dir).unwrap(), Tightened::From(0o755));
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert_eq!(
            tighten_private_dir(&dir).unwrap(),
            Tightened::AlreadyPrivate
        );
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o500)).unwrap();
        assert_eq!(
            tighten_private_dir(&dir).unwrap(),
            Tightened::AlreadyPrivate
        );
        assert!(tighten_private_dir(&d.path().join("missing")).is_err());
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.json");
        atomic_write(&p, b"one").unwrap();
        atomic_write(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "temp file left behind");
    }

    #[test]
    fn a_failed_replace_leaves_no_temp_file() {
        let d = tempfile::tempdir().unwrap();
        // Renaming a file over a non-empty directory fails after the temp file was written.
        let p = d.path().join("x.json");
        fs::create_dir(&p).unwrap();
        fs::write(p.join("inside"), "keep").unwrap();
        atomic_write(&p, b"data").unwrap_err();
        let names: Vec<_> = fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "temp file left behind");
    }

    #[test]
    fn appends_whole_lines_and_a_refused_write_leaves_the_file_alone() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.jsonl");
        fs::write(&p, "{\"a\":1}\n").unwrap();
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        append_line_fsync(&mut f, b"{\"a\":2}").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "{\"a\":1}\n{\"a\":2}\n");
        // A file opened read-only: the write fails, nothing is left behind.
        let mut ro = File::open(&p).unwrap();
        append_line_fsync(&mut ro, b"{\"a\":3}").unwrap_err();
        assert_eq!(fs::read_to_string(&p).unwrap(), "{\"a\":1}\n{\"a\":2}\n");
    }

    /// Set by [`a_short_write_is_cut_back`] for the child it runs.
    const SHORT_WRITE_FILE: &str = "AGENTD_TEST_SHORT_WRITE_FILE";

    /// A write the file size limit stops halfway (as a full disk does: some bytes written,
    /// then an error) leaves no half line: the file is cut back to its last whole line. The
    /// limit applies to the whole process, so the append runs in a child: this test binary
    /// again, running only [`short_write_child`].
    #[test]
    fn a_short_write_is_cut_back() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.jsonl");
        fs::write(&p, "{\"a\":1}\n").unwrap();
        run_in_child("fsutil::tests::short_write_child", SHORT_WRITE_FILE, &p);
        assert_eq!(fs::read_to_string(&p).unwrap(), "{\"a\":1}\n");
    }

    /// Runs the test `name` of this test binary in a child process with `var` set to `path`,
    /// and fails unless it ran and passed. For tests that change process-wide limits.
    pub(crate) fn run_in_child(name: &str, var: &str, path: &Path) {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture"])
            .env(var, path)
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{log}");
        assert!(log.contains("1 passed"), "the child ran: {log}");
    }

    /// In a child of [`run_in_child`]: file sizes limited to `bytes`, and a write past the
    /// limit fails with `EFBIG` (as a full disk fails with `ENOSPC`) instead of a signal.
    pub(crate) fn limit_file_size(bytes: u64) {
        use nix::sys::resource::{Resource, setrlimit};
        use nix::sys::signal::{SigHandler, Signal, signal};
        // SAFETY: ignoring SIGXFSZ installs no handler code.
        unsafe { signal(Signal::SIGXFSZ, SigHandler::SigIgn) }.unwrap();
        setrlimit(Resource::RLIMIT_FSIZE, bytes, bytes).unwrap();
    }

    /// The child of [`a_short_write_is_cut_back`] (does nothing when run on its own): limits
    /// file sizes to 12 bytes, then appends a 20-byte line to the 8-byte file.
    #[test]
    fn short_write_child() {
        let Some(path) = std::env::var_os(SHORT_WRITE_FILE) else {
            return;
        };
        limit_file_size(12);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        let e = append_line_fsync(&mut f, b"{\"b\":\"0123456789\"}").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::libc::EFBIG), "{e}");
        assert_eq!(
            fs::metadata(&path).unwrap().len(),
            8,
            "cut back to the whole line"
        );
    }

    #[test]
    fn stale_temps_of_dead_processes_are_removed() {
        let d = tempfile::tempdir().unwrap();
        // A pid above the kernel's maximum (4194304) never runs.
        let dead = d.path().join(".s.state.json.tmp.99999999.0123456789abcdef");
        let mine = d.path().join(format!(
            ".m.json.tmp.{}.0123456789abcdef",
            std::process::id()
        ));
        let other = d.path().join(".notes.tmp.99999999.xyz");
        for p in [&dead, &mine, &other] {
            fs::write(p, "x").unwrap();
        }
        fs::write(d.path().join("s.state.json"), "{}").unwrap();
        assert_eq!(remove_stale_temps(d.path()).unwrap(), 1);
        assert!(!dead.exists());
        assert!(mine.exists() && other.exists());
        assert!(d.path().join("s.state.json").exists());
        assert_eq!(remove_stale_temps(&d.path().join("missing")).unwrap(), 0);
        assert_eq!(stale_temp_pid(".a.tmp.12.0123456789ABCDEF"), Some(12));
        assert_eq!(stale_temp_pid(".tmp.12.0123456789abcdef"), None);
        assert_eq!(stale_temp_pid("a.tmp.12.0123456789abcdef"), None);
    }

    #[test]
    fn a_planted_symlink_at_the_old_temp_name_is_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let outside = d.path().join("outside");
        fs::write(&outside, "untouched").unwrap();
        let p = d.path().join("x.json");
        let old_name = d.path().join(format!(".x.json.tmp.{}", std::process::id()));
        std::os::unix::fs::symlink(&outside, &old_name).unwrap();
        atomic_write(&p, b"data").unwrap();
        assert_eq!(fs::read_to_string(&outside).unwrap(), "untouched");
        assert_eq!(fs::read(&p).unwrap(), b"data");
    }
}
