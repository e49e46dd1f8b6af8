//! Writing one line into the control FIFO without ever blocking on a missing daemon.
//!
//! The FIFO is opened `O_WRONLY | O_NONBLOCK`: with no reader the open fails with `ENXIO`,
//! which means the daemon is not running. The line is written with one `write` call (at most
//! `PIPE_BUF` bytes, so it is atomic); a full pipe (`EAGAIN`) is retried with short sleeps.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;

use super::CliError;
use crate::control::PIPE_BUF;

/// Pause between attempts while the pipe is full.
const FULL_PIPE_RETRY: Duration = Duration::from_millis(20);

/// Open the control FIFO for writing. A missing path or a FIFO without a reader is
/// [`CliError::NotRunning`]; anything else at the path is [`CliError::NotFifo`].
pub fn open(path: &Path) -> Result<File, CliError> {
    let not_running = || CliError::NotRunning {
        path: path.to_path_buf(),
    };
    match std::fs::metadata(path) {
        Ok(md) if !md.file_type().is_fifo() => {
            return Err(CliError::NotFifo {
                path: path.to_path_buf(),
            });
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(not_running()),
        Err(e) => return Err(CliError::io(format!("stat {}", path.display()), e)),
    }
    let file = OpenOptions::new()
        .write(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(code) if code == Errno::ENXIO as i32 => not_running(),
            _ if e.kind() == io::ErrorKind::NotFound => not_running(),
            _ => CliError::io(format!("open {}", path.display()), e),
        })?;
    // The path may have been swapped between the check and the open.
    let is_fifo = file
        .metadata()
        .map_err(|e| CliError::io(format!("stat {}", path.display()), e))?
        .file_type()
        .is_fifo();
    if !is_fifo {
        return Err(CliError::NotFifo {
            path: path.to_path_buf(),
        });
    }
    Ok(file)
}

/// Write `line` with a single `write` call, retrying while the pipe is full for up to
/// `timeout`. A short write, a line over `PIPE_BUF` or a vanished reader is an error.
pub fn write_line(
    file: &mut File,
    path: &Path,
    line: &[u8],
    timeout: Duration,
) -> Result<(), CliError> {
    if line.len() > PIPE_BUF {
        return Err(CliError::LineTooLong {
            len: line.len(),
            max: PIPE_BUF,
        });
    }
    let start = Instant::now();
    loop {
        match file.write(line) {
            Ok(n) if n == line.len() => return Ok(()),
            Ok(n) => {
                return Err(CliError::io(
                    format!("write to {}", path.display()),
                    io::Error::other(format!(
                        "short write: {n} of {} bytes (the daemon may see a torn line)",
                        line.len()
                    )),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if start.elapsed() >= timeout {
                    return Err(CliError::io(
                        format!("write to {}", path.display()),
                        io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!(
                                "the pipe stayed full for {} s (is the daemon stuck?)",
                                timeout.as_secs()
                            ),
                        ),
                    ));
                }
                std::thread::sleep(FULL_PIPE_RETRY);
            }
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                return Err(CliError::NotRunning {
                    path: path.to_path_buf(),
                });
            }
            Err(e) => return Err(CliError::io(format!("write to {}", path.display()), e)),
        }
    }
}

/// Open the FIFO and write one line.
pub fn send_line(path: &Path, line: &[u8], timeout: Duration) -> Result<(), CliError> {
    let mut f = open(path)?;
    write_line(&mut f, path, line, timeout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::stat::Mode;
    use std::io::Read;

    fn fifo_in(dir: &Path) -> std::path::PathBuf {
        let p = dir.join("control.pipe");
        nix::unistd::mkfifo(&p, Mode::from_bits_truncate(0o600)).unwrap();
        p
    }

    #[test]
    fn no_reader_means_not_running() {
        let d = tempfile::tempdir().unwrap();
        let p = fifo_in(d.path());
        let err = open(&p).unwrap_err();
        assert!(matches!(err, CliError::NotRunning { .. }), "{err}");
        assert_eq!(err.exit_code(), 1);
        assert_eq!(
            err.to_string(),
            format!("agentd is not running (no reader on {})", p.display())
        );
    }

    #[test]
    fn missing_fifo_means_not_running() {
        let d = tempfile::tempdir().unwrap();
        let err = open(&d.path().join("control.pipe")).unwrap_err();
        assert!(matches!(err, CliError::NotRunning { .. }), "{err}");
    }

    #[test]
    fn a_regular_file_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("control.pipe");
        std::fs::write(&p, "").unwrap();
        let err = open(&p).unwrap_err();
        assert!(matches!(err, CliError::NotFifo { .. }), "{err}");
        assert!(err.to_string().contains("not a FIFO"));
        assert_eq!(std::fs::read(&p).unwrap(), b"", "nothing written");
    }

    #[test]
    fn with_a_reader_the_line_arrives_whole() {
        let d = tempfile::tempdir().unwrap();
        let p = fifo_in(d.path());
        // The daemon opens its end read-write (so it never sees EOF); do the same.
        let mut reader = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(&p)
            .unwrap();
        let line = b"{\"id\":\"x\",\"type\":\"user\",\"text\":\"hi\"}\n";
        send_line(&p, line, Duration::from_secs(1)).unwrap();
        let mut buf = vec![0u8; 256];
        let n = reader.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], line);
    }

    #[test]
    fn a_full_pipe_times_out_instead_of_blocking() {
        let d = tempfile::tempdir().unwrap();
        let p = fifo_in(d.path());
        let _reader = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(&p)
            .unwrap();
        let mut w = open(&p).unwrap();
        let chunk = vec![b'x'; PIPE_BUF];
        // Fill the pipe (64 KiB by default) until a write would block.
        let mut filled = false;
        for _ in 0..1024 {
            if let Err(e) = w.write(&chunk) {
                assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
                filled = true;
                break;
            }
        }
        assert!(filled);
        let start = Instant::now();
        let err = write_line(&mut w, &p, b"line\n", Duration::from_millis(100)).unwrap_err();
        assert!(start.elapsed() >= Duration::from_millis(100));
        assert!(err.to_string().contains("stayed full"), "{err}");
    }

    #[test]
    fn over_pipe_buf_is_refused_before_writing() {
        let d = tempfile::tempdir().unwrap();
        let p = fifo_in(d.path());
        let _reader = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        let mut w = open(&p).unwrap();
        let err = write_line(&mut w, &p, &vec![b'x'; PIPE_BUF + 1], Duration::ZERO).unwrap_err();
        assert!(matches!(err, CliError::LineTooLong { .. }));
    }
}
