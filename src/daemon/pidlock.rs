//! Single instance (SPEC §10.4): an exclusive `flock` on `state_dir/agentd.pid`, held for the
//! daemon's lifetime; the file holds the pid. A second instance gets a clear error.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

#[derive(Debug, thiserror::Error)]
pub enum PidLockError {
    #[error("agentd is already running{} (lock held on {path}); stop it first or use another state_dir", pid.map(|p| format!(" as pid {p}")).unwrap_or_default())]
    Running { path: PathBuf, pid: Option<u32> },
    #[error("cannot use PID file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// The held lock. Dropping it (or calling `release`) unlocks; `release` also removes the file.
pub struct PidLock {
    path: PathBuf,
    lock: Option<Flock<File>>,
}

impl PidLock {
    pub fn acquire(path: &Path) -> Result<PidLock, PidLockError> {
        let io_err = |source| PidLockError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(io_err)?;
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((mut f, Errno::EWOULDBLOCK)) => {
                let mut s = String::new();
                let _ = f.read_to_string(&mut s);
                return Err(PidLockError::Running {
                    path: path.to_path_buf(),
                    pid: s.trim().parse().ok(),
                });
            }
            Err((_, e)) => return Err(io_err(e.into())),
        };
        lock.set_len(0).map_err(io_err)?;
        lock.rewind().map_err(io_err)?;
        writeln!(lock, "{}", std::process::id()).map_err(io_err)?;
        lock.sync_all().map_err(io_err)?;
        Ok(PidLock {
            path: path.to_path_buf(),
            lock: Some(lock),
        })
    }

    /// Remove the file while still holding the lock, then unlock.
    pub fn release(mut self) {
        let _ = std::fs::remove_file(&self.path);
        self.lock.take();
    }
}

/// For queries: is a daemon holding the lock on `path`? Returns its pid when it is.
pub fn running_pid(path: &Path) -> Option<u32> {
    let mut f = File::open(path).ok()?;
    let mut s = String::new();
    f.read_to_string(&mut s).ok()?;
    match Flock::lock(f, FlockArg::LockSharedNonblock) {
        Ok(_) => None,
        Err((_, Errno::EWOULDBLOCK)) => s.trim().parse().ok(),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_fails_with_pid_and_release_removes_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("agentd.pid");
        let l = PidLock::acquire(&p).unwrap();
        assert_eq!(running_pid(&p), Some(std::process::id()));
        match PidLock::acquire(&p) {
            Err(PidLockError::Running { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("expected Running, got {:?}", other.err()),
        }
        l.release();
        assert!(!p.exists());
        assert_eq!(running_pid(&p), None);
        // A stale file from a crash (no lock held) is taken over.
        std::fs::write(&p, "999999\n").unwrap();
        let l = PidLock::acquire(&p).unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap().trim(),
            std::process::id().to_string()
        );
        drop(l);
    }
}
