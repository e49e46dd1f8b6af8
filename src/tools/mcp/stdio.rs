//! A stdio MCP server's process tree and its pipes. The tree is ours alone: the sandbox helper
//! (or, with `sandbox = false`, the server itself) starts in a process group of its own and
//! gets SIGKILL when the daemon's thread that started it ends (`PR_SET_PDEATHSIG`; the helper
//! passes it on to the command, and a PID namespace ends with its init), so no server outlives
//! the daemon, killed or stopped (without the sandbox, a descendant that left the group can).
//! A connection's end kills the group and reaps the helper before a restart, so a server never
//! runs twice.
//!
//! Between the server and rmcp sits [`pump_stdout`]: it caps what the server writes (line
//! length, bytes per second) and prunes JSON nested too deep for the parser
//! ([`limits::prune_deep`]), so one bad tool cannot drop the whole tool list, and shows tool
//! lists to [`TaskOnly`] (tools that run only as tasks, which rmcp does not tell). Stderr is logged
//! within a byte budget per minute ([`log_stderr`]) and read no faster than a fixed rate.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout, Command};

use super::limits::{self, Bucket};
use super::tasks::TaskOnly;
use crate::sandbox::helper::ERROR_PREFIX as HELPER_ERROR_PREFIX;

/// Longest line taken from a server's stdout (one JSON-RPC message); longer ones are dropped.
const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// Longest stderr line logged; the rest of it is cut.
const MAX_STDERR_LINE: usize = 2048;
/// What a logged line adds to its text (time, level, target, the server's name), counted
/// against the log budget.
const LOG_LINE_OVERHEAD: usize = 100;
/// How long a stop waits for the helper to be reaped after SIGKILL.
const REAP_WAIT: Duration = Duration::from_secs(5);

/// A started server process: its helper, the group, and the pipes rmcp talks through.
pub(super) struct Spawned {
    pub process: ServerProcess,
    pub stdin: ChildStdin,
    /// The server's stdout after [`pump_stdout`].
    pub stdout: DuplexStream,
    /// The helper's complaint about its setup, if it made one (read from stderr).
    pub setup_error: Arc<Mutex<Option<String>>>,
}

/// The helper process and its group; dropping it kills the whole group.
pub(super) struct ServerProcess {
    child: Option<tokio::process::Child>,
    group: Pid,
}

impl ServerProcess {
    /// Kill the group and wait (bounded) until the helper is reaped: after this, no process of
    /// this tree runs (but daemonised ones outside the group, which a PID namespace also ends).
    pub async fn end(mut self) {
        self.kill_group();
        if let Some(mut child) = self.child.take() {
            let _ = tokio::time::timeout(REAP_WAIT, child.wait()).await;
        }
    }

    /// SIGKILL to the group. Only while the helper is not reaped: until then its pid, which is
    /// the group's id, cannot be given to another process.
    fn kill_group(&self) {
        if self.child.is_some() {
            let _ = killpg(self.group, Signal::SIGKILL);
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill_group();
        // `kill_on_drop` lets tokio reap the helper in the background.
    }
}

/// Spawn `cmd` (the sandbox helper, or the server itself) with piped stdio in a process group of its own, with
/// SIGKILL as its parent-death signal; start the stdout pump and the stderr logger.
pub(super) fn spawn(
    mut cmd: Command,
    server: &str,
    task_only: Arc<TaskOnly>,
) -> Result<Spawned, String> {
    let parent = std::process::id();
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    // SAFETY: the closure runs in the forked child before exec and calls only prctl and
    // getppid, both async-signal-safe system calls.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            // The daemon died between the fork and the prctl: the signal will never come.
            if nix::unistd::getppid().as_raw() as u32 != parent {
                return Err(std::io::Error::other("the daemon is gone"));
            }
            Ok(())
        });
    }
    let program = cmd.as_std().get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {program}: {e}"))?;
    let group = child
        .id()
        .map(|id| Pid::from_raw(id as i32))
        .ok_or_else(|| format!("{program} exited at once"))?;
    let (stdin, stdout, stderr) =
        match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
            (Some(i), Some(o), Some(e)) => (i, o, e),
            _ => return Err(format!("{program} has no pipes")),
        };
    let process = ServerProcess {
        child: Some(child),
        group,
    };
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    tokio::spawn(pump_stdout(stdout, ours, server.to_string(), task_only));
    let setup_error = Arc::new(Mutex::new(None));
    tokio::spawn(log_stderr(stderr, server.to_string(), setup_error.clone()));
    Ok(Spawned {
        process,
        stdin,
        stdout: theirs,
        setup_error,
    })
}

/// Copy the server's stdout to rmcp line by line: lines over [`MAX_LINE_BYTES`] are dropped,
/// JSON nested deeper than [`limits::MAX_MESSAGE_DEPTH`] is pruned, and a server that writes
/// more than its byte bucket allows is cut off (rmcp sees the end of the stream, the
/// supervisor restarts the server with backoff). A tool list is shown to `task_only` first.
async fn pump_stdout(
    stdout: ChildStdout,
    mut to_rmcp: DuplexStream,
    server: String,
    task_only: Arc<TaskOnly>,
) {
    let mut bucket = Bucket::new(
        limits::STDOUT_BURST,
        limits::STDOUT_PER_SECOND,
        Instant::now(),
    );
    let mut lines = LineReader::new(stdout, MAX_LINE_BYTES);
    loop {
        let line = match lines.next().await {
            Ok(Some(Line::Whole(line))) => line,
            Ok(Some(Line::TooLong(n))) => {
                tracing::warn!(server = %server, bytes = n, "MCP server sent a message longer than {MAX_LINE_BYTES} bytes; dropped");
                continue;
            }
            Ok(None) | Err(_) => return,
        };
        if !bucket.take(line.len() as u64 + 1, Instant::now()) {
            tracing::warn!(
                server = %server,
                "MCP server writes more than {} MiB a second to its stdout; restarting it",
                limits::STDOUT_PER_SECOND >> 20
            );
            return;
        }
        let line = limits::prune_deep(&line, limits::MAX_MESSAGE_DEPTH);
        task_only.observe(&line);
        if to_rmcp.write_all(&line).await.is_err() || to_rmcp.write_all(b"\n").await.is_err() {
            return;
        }
    }
}

/// Log the server's stderr lines (cut at [`MAX_STDERR_LINE`]) within
/// [`limits::LOG_BYTES_PER_WINDOW`] per [`limits::LOG_WINDOW`]; what is over is counted and
/// summarised once at the end of its window. Read at most
/// [`limits::STDERR_BYTES_PER_SECOND`] (a faster server blocks on its own stderr). The
/// helper's own setup error is kept for the start error.
async fn log_stderr(stderr: ChildStderr, server: String, setup_error: Arc<Mutex<Option<String>>>) {
    let mut budget = LogBudget::new(Instant::now());
    let mut pace = Bucket::new(
        limits::STDERR_BYTES_PER_SECOND,
        limits::STDERR_BYTES_PER_SECOND,
        Instant::now(),
    );
    let mut lines = LineReader::new(stderr, MAX_STDERR_LINE);
    loop {
        let flush = budget.window_end();
        let next = tokio::select! {
            r = lines.next() => r,
            _ = tokio::time::sleep_until(flush.into()) => {
                if let Some(n) = budget.roll(Instant::now()) {
                    tracing::warn!(server = %server, "mcp stderr: suppressed {n} lines over the log budget of {} KiB a minute", limits::LOG_BYTES_PER_WINDOW >> 10);
                }
                continue;
            }
        };
        let (text, len) = match next {
            Ok(Some(Line::Whole(l))) => {
                let len = l.len();
                (String::from_utf8_lossy(&l).into_owned(), len)
            }
            Ok(Some(Line::TooLong(n))) => (String::from("(a line too long to log)"), n),
            Ok(None) | Err(_) => break,
        };
        if let Some(msg) = text.strip_prefix(HELPER_ERROR_PREFIX) {
            let mut slot = setup_error.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert_with(|| msg.to_string());
        }
        let now = Instant::now();
        if let Some(n) = budget.roll(now) {
            tracing::warn!(server = %server, "mcp stderr: suppressed {n} lines over the log budget of {} KiB a minute", limits::LOG_BYTES_PER_WINDOW >> 10);
        }
        if budget.admit(text.len() + LOG_LINE_OVERHEAD) {
            tracing::info!(server = %server, "mcp stderr: {text}");
        }
        while !pace.take(len as u64 + 1, Instant::now()) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    if let Some(n) = budget.roll(Instant::now() + limits::LOG_WINDOW) {
        tracing::warn!(server = %server, "mcp stderr: suppressed {n} lines over the log budget of {} KiB a minute", limits::LOG_BYTES_PER_WINDOW >> 10);
    }
}

/// Log bytes per window: lines fit until the window's budget is spent, the rest is counted.
struct LogBudget {
    start: Instant,
    used: usize,
    suppressed: u64,
}

impl LogBudget {
    fn new(now: Instant) -> LogBudget {
        LogBudget {
            start: now,
            used: 0,
            suppressed: 0,
        }
    }

    fn window_end(&self) -> Instant {
        self.start + limits::LOG_WINDOW
    }

    /// Start a new window when this one is over; returns the lines suppressed in the old one,
    /// if any.
    fn roll(&mut self, now: Instant) -> Option<u64> {
        if now < self.window_end() {
            return None;
        }
        let n = std::mem::take(&mut self.suppressed);
        self.start = now;
        self.used = 0;
        (n > 0).then_some(n)
    }

    /// Whether a line of `len` bytes may be logged in this window.
    fn admit(&mut self, len: usize) -> bool {
        if self.used + len <= limits::LOG_BYTES_PER_WINDOW {
            self.used += len;
            true
        } else {
            self.suppressed += 1;
            false
        }
    }
}

enum Line {
    Whole(Vec<u8>),
    /// A line longer than the limit, dropped; its length.
    TooLong(usize),
}

/// Lines of at most `max` bytes from a reader, without ever buffering more than `max` (plus one
/// read) of a longer one.
struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    /// Read but not yet returned, from `start` on.
    pending: Vec<u8>,
    start: usize,
    /// `pending` holds no newline before this offset (a long line is scanned once).
    scanned: usize,
    max: usize,
    /// Bytes of an over-long line dropped so far.
    dropping: Option<usize>,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner,
            buf: vec![0; 64 * 1024],
            pending: Vec::new(),
            start: 0,
            scanned: 0,
            max,
            dropping: None,
        }
    }

    async fn next(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let from = self.start.max(self.scanned);
            if let Some(rel) = self.pending[from..].iter().position(|&b| b == b'\n') {
                let end = from + rel;
                let len = end - self.start;
                let line = (self.dropping.is_none() && len <= self.max)
                    .then(|| self.pending[self.start..end].to_vec());
                self.start = end + 1;
                return Ok(Some(match (line, self.dropping.take()) {
                    (Some(line), _) => Line::Whole(line),
                    (None, dropped) => Line::TooLong(dropped.unwrap_or(0) + len),
                }));
            }
            self.pending.drain(..self.start);
            self.start = 0;
            self.scanned = self.pending.len();
            if self.pending.len() > self.max || self.dropping.is_some() {
                *self.dropping.get_or_insert(0) += self.pending.len();
                self.pending.clear();
                self.scanned = 0;
            }
            let n = self.inner.read(&mut self.buf).await?;
            if n == 0 {
                return Ok(None);
            }
            self.pending.extend_from_slice(&self.buf[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_bounded_and_long_ones_dropped() {
        let text = format!("short\n{}\nafter\nno end", "x".repeat(100));
        let mut r = LineReader::new(text.as_bytes(), 10);
        r.buf = vec![0; 7];
        assert!(matches!(r.next().await.unwrap(), Some(Line::Whole(l)) if l == b"short"));
        assert!(matches!(r.next().await.unwrap(), Some(Line::TooLong(100))));
        assert!(matches!(r.next().await.unwrap(), Some(Line::Whole(l)) if l == b"after"));
        assert!(r.next().await.unwrap().is_none());
        assert!(r.pending.len() <= 10 + 7);
    }

    #[test]
    fn the_log_budget_admits_a_window_then_counts() {
        let t0 = Instant::now();
        let mut b = LogBudget::new(t0);
        let line = limits::LOG_BYTES_PER_WINDOW / 4;
        assert!((0..4).all(|_| b.admit(line)));
        assert!(!b.admit(line) && !b.admit(1));
        assert_eq!(b.roll(t0 + Duration::from_secs(1)), None);
        assert_eq!(b.roll(t0 + limits::LOG_WINDOW), Some(2));
        assert!(b.admit(line));
        assert_eq!(b.roll(t0 + limits::LOG_WINDOW * 3), None);
    }
}
