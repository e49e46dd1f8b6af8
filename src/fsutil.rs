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
    // A fresh random name, created exclusively and without following symlinks: a link planted
    // at a predictable temp name cannot redirect the write.
    let tmp = dir.join(format!(
        ".{name}.tmp.{}.{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .mode_0600()
            .open(&tmp)?;
        f.write_all(bytes)?;
        if durable {
            f.sync_all()?;
        }
    }
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if durable {
        fsync_dir(dir)?;
    }
    Ok(())
}

/// fsync a directory so a rename or create inside it is durable.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Append one line (a `\n` is added) with a single write, then fsync the data.
pub fn append_line_fsync(file: &mut File, line: &[u8]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(line.len() + 1);
    buf.extend_from_slice(line);
    buf.push(b'\n');
    file.write_all(&buf)?;
    file.sync_data()
}

/// Create a directory (and parents) with mode 0700.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
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
mod tests {
    use super::*;

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
