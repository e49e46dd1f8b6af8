//! The control FIFO (SPEC §10.1): created with mode 0600 at start, read without ever blocking
//! shutdown, removed on exit. Malformed lines are logged and skipped; they never stop the
//! reader.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::sys::stat::Mode;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::control::{ControlLine, parse_line};

#[derive(Debug, thiserror::Error)]
pub enum FifoError {
    #[error("{path} exists and is not a FIFO owned by this user; move it away or set [fifo] path")]
    NotOurFifo { path: PathBuf },
    #[error("cannot create FIFO {path}: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error("cannot open FIFO {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
}

/// Create the FIFO at `path` (mode 0600). An existing FIFO owned by us (left by a crash) is
/// replaced; anything else at that path is refused.
pub fn create(path: &Path) -> Result<(), FifoError> {
    match std::fs::symlink_metadata(path) {
        Ok(md) => {
            let ours = md.file_type().is_fifo() && md.uid() == nix::unistd::getuid().as_raw();
            if !ours {
                return Err(FifoError::NotOurFifo {
                    path: path.to_path_buf(),
                });
            }
            std::fs::remove_file(path).map_err(|source| FifoError::Create {
                path: path.to_path_buf(),
                source,
            })?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(FifoError::Create {
                path: path.to_path_buf(),
                source,
            });
        }
    }
    nix::unistd::mkfifo(path, Mode::from_bits_truncate(0o600)).map_err(|e| FifoError::Create {
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    Ok(())
}

/// Remove the FIFO if it is still ours.
pub fn remove(path: &Path) {
    if let Ok(md) = std::fs::symlink_metadata(path)
        && md.file_type().is_fifo()
    {
        let _ = std::fs::remove_file(path);
    }
}

/// How long an unterminated fragment may wait for more bytes before it is discarded (SPEC
/// §16.9). `agent-send` writes each line with one atomic `write`, so a complete line never
/// waits; a fragment (`echo -n`, a writer killed mid-line) would otherwise be glued to the next
/// writer's line and lose it. The wait restarts with every byte that arrives, so a slow writer
/// still writing its line is not cut off.
pub const FRAGMENT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// At most this many characters of a discarded fragment are logged (escaped).
const FRAGMENT_PREVIEW: usize = 80;

/// Read lines until `cancel` fires, sending each valid line (with an id assigned when it had
/// none) to `out`. Opening read-write keeps a writer end inside the daemon, so the reader never
/// sees EOF when a client disconnects.
pub async fn run(
    path: PathBuf,
    max_line_bytes: usize,
    out: mpsc::Sender<ControlLine>,
    cancel: CancellationToken,
) -> Result<(), FifoError> {
    let mut rx = tokio::net::unix::pipe::OpenOptions::new()
        .read_write(true)
        .open_receiver(&path)
        .map_err(|source| FifoError::Open {
            path: path.clone(),
            source,
        })?;
    let mut splitter = LineSplitter::new(max_line_bytes);
    let mut buf = vec![0u8; 8192];
    // When the pending fragment is discarded, unless a newline arrives first.
    let mut fragment_deadline: Option<tokio::time::Instant> = None;
    loop {
        let n = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = async {
                match fragment_deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => {
                fragment_deadline = None;
                let (bytes, preview) = splitter.discard_fragment();
                tracing::warn!(
                    bytes,
                    fragment = %preview,
                    wait_seconds = FRAGMENT_WAIT.as_secs(),
                    "FIFO fragment without a newline discarded; every line must end with a newline"
                );
                continue;
            }
            r = rx.read(&mut buf) => match r {
                Ok(0) => continue,
                Ok(n) => n,
                Err(e) => {
                    tracing::error!(error = %e, "FIFO read failed");
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    continue;
                }
            },
        };
        let items = splitter.push_marked(&buf[..n]);
        fragment_deadline = splitter
            .has_fragment()
            .then(|| tokio::time::Instant::now() + FRAGMENT_WAIT);
        for (item, marks) in items {
            let line = match item {
                Ok(l) => l,
                Err(len) => {
                    tracing::warn!(
                        bytes = len,
                        max = max_line_bytes,
                        "FIFO line over max_line_bytes skipped; send long texts as text_file"
                    );
                    continue;
                }
            };
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match parse_line(&line, max_line_bytes).or_else(|e| unglue(&line, &marks, e)) {
                Ok(mut l) => {
                    if l.id().is_none() {
                        l.set_id(uuid::Uuid::now_v7().to_string());
                    }
                    tokio::select! {
                        _ = cancel.cancelled() => return Ok(()),
                        r = out.send(l) => if r.is_err() { return Ok(()) },
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "malformed FIFO line skipped");
                }
            }
        }
    }
}

/// A line that does not parse may be a fragment (a writer that stopped mid-line less than
/// [`FRAGMENT_WAIT`] ago) with the next writer's whole line glued to it. Try the parts that
/// begin where a later read continued it; if one parses, the fragment before it is discarded
/// (logged) and that line accepted. Otherwise the original error stands.
fn unglue(
    line: &[u8],
    marks: &[usize],
    err: crate::control::ControlError,
) -> Result<ControlLine, crate::control::ControlError> {
    for &m in marks {
        let Some(rest) = line.get(m..) else { continue };
        if let Ok(l) = parse_line(rest, usize::MAX) {
            let mut s = LineSplitter::new(usize::MAX);
            s.push(&line[..m]);
            let (bytes, preview) = s.discard_fragment();
            tracing::warn!(
                bytes,
                fragment = %preview,
                "FIFO fragment without a newline discarded; every line must end with a newline"
            );
            return Ok(l);
        }
    }
    Err(err)
}

/// Splits a byte stream into lines, enforcing a maximum length: an oversize line is reported
/// once (as `Err(bytes_seen)`) and discarded up to its newline.
#[derive(Debug)]
pub struct LineSplitter {
    buf: Vec<u8>,
    max: usize,
    /// Bytes of an oversize line discarded so far (None = not discarding).
    discarding: Option<usize>,
    /// Offsets in `buf` where a later read continued an unfinished line: where another
    /// writer's line may begin if the bytes before it were a fragment (at most
    /// [`MAX_MARKS`], the latest kept).
    marks: Vec<usize>,
}

/// Read boundaries remembered inside one unfinished line.
const MAX_MARKS: usize = 16;

/// A complete line (or the length of an oversize one), with the offsets where a later read
/// continued it: if the line does not parse, the part from one of them may be another
/// writer's whole line glued to a fragment.
pub type MarkedLine = (Result<Vec<u8>, usize>, Vec<usize>);

impl LineSplitter {
    pub fn new(max: usize) -> Self {
        LineSplitter {
            buf: Vec::new(),
            max,
            discarding: None,
            marks: Vec::new(),
        }
    }

    /// Whether bytes of an unfinished line are pending (kept or being discarded).
    pub fn has_fragment(&self) -> bool {
        !self.buf.is_empty() || self.discarding.is_some()
    }

    /// Drop the unfinished line: `(bytes dropped, an escaped preview of its start)`. The next
    /// bytes start a new line.
    pub fn discard_fragment(&mut self) -> (usize, String) {
        let bytes = self.buf.len() + self.discarding.take().unwrap_or(0);
        let text = String::from_utf8_lossy(&self.buf);
        let mut preview: String = text
            .chars()
            .take(FRAGMENT_PREVIEW)
            .flat_map(char::escape_debug)
            .collect();
        if text.chars().count() > FRAGMENT_PREVIEW {
            preview.push('…');
        }
        self.buf.clear();
        self.marks.clear();
        (bytes, preview)
    }

    pub fn push(&mut self, data: &[u8]) -> Vec<Result<Vec<u8>, usize>> {
        self.push_marked(data).into_iter().map(|(l, _)| l).collect()
    }

    /// [`LineSplitter::push`], with the read boundaries inside each line.
    pub fn push_marked(&mut self, mut data: &[u8]) -> Vec<MarkedLine> {
        let mut out = Vec::new();
        if !self.buf.is_empty() && !data.is_empty() {
            if self.marks.len() == MAX_MARKS {
                self.marks.remove(0);
            }
            self.marks.push(self.buf.len());
        }
        while !data.is_empty() {
            let nl = data.iter().position(|&b| b == b'\n');
            let (chunk, rest, complete) = match nl {
                Some(p) => (&data[..p], &data[p + 1..], true),
                None => (data, &data[data.len()..], false),
            };
            data = rest;
            if let Some(seen) = self.discarding.as_mut() {
                *seen += chunk.len();
                if complete {
                    out.push((Err(*seen), Vec::new()));
                    self.discarding = None;
                }
                continue;
            }
            if self.buf.len() + chunk.len() > self.max {
                let seen = self.buf.len() + chunk.len();
                self.buf.clear();
                self.marks.clear();
                if complete {
                    out.push((Err(seen), Vec::new()));
                } else {
                    self.discarding = Some(seen);
                }
                continue;
            }
            self.buf.extend_from_slice(chunk);
            if complete {
                out.push((
                    Ok(std::mem::take(&mut self.buf)),
                    std::mem::take(&mut self.marks),
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn splits_and_discards_oversize() {
        let mut s = LineSplitter::new(5);
        let r = s.push(b"ab\ncdefghij\nxy");
        assert_eq!(r, vec![Ok(b"ab".to_vec()), Err(8)]);
        assert_eq!(s.push(b"z\n"), vec![Ok(b"xyz".to_vec())]);
        // Oversize across chunks.
        assert_eq!(s.push(b"123456"), vec![]);
        assert_eq!(s.push(b"78\nok\n"), vec![Err(8), Ok(b"ok".to_vec())]);
    }

    #[test]
    fn a_discarded_fragment_is_not_glued_to_the_next_line() {
        let mut s = LineSplitter::new(64);
        assert!(s.push(b"{\"half\x07\x1b").is_empty());
        assert!(s.has_fragment());
        let (bytes, preview) = s.discard_fragment();
        assert_eq!(bytes, 8);
        assert_eq!(preview, r#"{\"half\u{7}\u{1b}"#, "escaped, never raw");
        assert!(!s.has_fragment());
        assert_eq!(s.push(b"ok\n"), vec![Ok(b"ok".to_vec())]);
        // An oversize fragment being discarded is dropped too.
        assert!(s.push(&[b'x'; 100]).is_empty());
        assert!(s.has_fragment());
        assert_eq!(s.discard_fragment().0, 100);
        assert_eq!(s.push(b"next\n"), vec![Ok(b"next".to_vec())]);
    }

    #[test]
    fn a_line_glued_to_a_fragment_is_recovered() {
        let mut s = LineSplitter::new(4096);
        assert!(s.push_marked(br#"{"id":"frag","type":"us"#).is_empty());
        let good = br#"{"id":"k2","type":"user","text":"hi"}"#;
        let mut next = good.to_vec();
        next.push(b'\n');
        let out = s.push_marked(&next);
        assert_eq!(out.len(), 1);
        let (Ok(line), marks) = &out[0] else {
            panic!("{out:?}")
        };
        let err = parse_line(line, 4096).unwrap_err();
        let l = unglue(line, marks, err).expect("the second writer's line is recovered");
        assert_eq!(l.id(), Some("k2"));
        // A slow writer's own line (cut across reads) parses whole; nothing to recover.
        let mut s = LineSplitter::new(4096);
        s.push_marked(&good[..10]);
        let out = s.push_marked(&next[10..]);
        assert_eq!(out[0].1, vec![10]);
        assert!(parse_line(out[0].0.as_ref().unwrap(), 4096).is_ok());
        // Garbage stays garbage.
        let mut s = LineSplitter::new(4096);
        s.push_marked(b"abc");
        let out = s.push_marked(b"def\n");
        let line = out[0].0.as_ref().unwrap();
        let err = parse_line(line, 4096).unwrap_err();
        assert!(unglue(line, &out[0].1, err).is_err());
    }

    proptest! {
        /// Any bytes a writer sends (NUL, invalid UTF-8, no newline at all), however the reads
        /// cut them: every complete line comes out whole and in order, or — over the limit — as
        /// its length only (logged and skipped by the reader); an unfinished line is kept.
        #[test]
        fn any_bytes_split_into_bounded_lines(bytes in proptest::collection::vec(any::<u8>(), 0..600),
                                              cuts in proptest::collection::vec(0usize..600, 0..10),
                                              max in 1usize..64) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.sort();
            let mut s = LineSplitter::new(max);
            let mut got = Vec::new();
            let mut prev = 0;
            for c in cuts.into_iter().chain([bytes.len()]) {
                got.extend(s.push(&bytes[prev..c]));
                prev = c;
            }
            let mut segments: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
            segments.pop(); // the part after the last newline is not a line yet
            let want: Vec<Result<Vec<u8>, usize>> = segments
                .into_iter()
                .map(|l| if l.len() > max { Err(l.len()) } else { Ok(l.to_vec()) })
                .collect();
            prop_assert_eq!(got, want);
        }

        #[test]
        fn chunking_does_not_change_lines(lines in proptest::collection::vec("[a-z]{0,12}", 0..20),
                                          cuts in proptest::collection::vec(0usize..400, 0..10)) {
            let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
            let bytes = text.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.sort();
            let mut s = LineSplitter::new(8);
            let mut got = Vec::new();
            let mut prev = 0;
            for c in cuts.into_iter().chain([bytes.len()]) {
                got.extend(s.push(&bytes[prev..c]));
                prev = c;
            }
            let want: Vec<Result<Vec<u8>, usize>> = lines.iter()
                .map(|l| if l.len() > 8 { Err(l.len()) } else { Ok(l.as_bytes().to_vec()) })
                .collect();
            prop_assert_eq!(got, want);
        }
    }

    #[tokio::test]
    async fn reader_skips_malformed_and_delivers_valid() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("control.pipe");
        create(&p).unwrap();
        let (tx, mut rx) = mpsc::channel(8);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(p.clone(), 64, tx, cancel.clone()));
        // Write like agent-send: one write per line. (O_RDWR so the open never blocks on a
        // reader that this single-threaded test has not polled yet.)
        let mut w = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        use std::io::Write;
        w.write_all(b"garbage\n").unwrap();
        w.write_all(br#"{"type":"explode"}"#).unwrap();
        w.write_all(b"\n").unwrap();
        w.write_all(&[b'x'; 100]).unwrap();
        w.write_all(b"\n").unwrap();
        w.write_all(br#"{"type":"user","text":"hi","id":"k1"}"#)
            .unwrap();
        w.write_all(b"\n").unwrap();
        w.write_all(br#"{"type":"system","text":"no id"}"#).unwrap();
        w.write_all(b"\n").unwrap();
        let first = rx.recv().await.unwrap();
        assert_eq!(first.id(), Some("k1"));
        let second = rx.recv().await.unwrap();
        assert!(second.id().is_some(), "an id is assigned");
        drop(w);
        cancel.cancel();
        task.await.unwrap().unwrap();
        remove(&p);
        assert!(!p.exists());
    }

    #[test]
    fn refuses_a_regular_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("control.pipe");
        std::fs::write(&p, "x").unwrap();
        assert!(matches!(create(&p), Err(FifoError::NotOurFifo { .. })));
    }
}
