//! The workspace indexer (`agentd index`, the scheduler's `job = "index"`; SPEC §13).
//!
//! 1. Take the run lock (`state_dir/memory.index.lock`, `flock`): two runs never overlap, a
//!    second one fails at once with [`MemoryError::Busy`].
//! 2. Find the files: `[memory] indexer.include` globs relative to the workspace; regular files
//!    only (no symlinks), inside the workspace, at most [`MAX_FILE_BYTES`].
//! 3. For each file, compare the sha256 of its content with the stored one; only a changed file
//!    is chunked and stored (`store::memory::MemoryDb::replace_file` keeps unchanged chunks).
//!    Files gone from the workspace leave the index.
//! 4. With an embeddings model: embed every chunk text that has no vector yet, in batches of
//!    [`super::embed::BATCH`]. A chunk longer than the model reads is embedded in windows
//!    (`chunk::embed_windows`) and gets the normalised mean of their vectors. An unchanged text
//!    is never embedded twice (the cache is keyed by the text's hash). A failed batch stops
//!    this phase; the next run goes on from there.

use std::collections::{BTreeMap, HashSet};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::Serialize;

use super::chunk::{chunk_lines, embed_text, embed_windows, sha256_hex};
use super::rank::normalize;
use super::{Memory, MemoryError};
use crate::store::memory::{FileMeta, NewChunk};

/// Larger files are skipped (with a warning): notes, not datasets.
pub const MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;
/// The lock file in the state directory.
pub const LOCK_FILE: &str = "memory.index.lock";
/// Cached embeddings that no chunk uses are dropped after this long (old query embeddings).
const CACHE_KEEP_SECONDS: i64 = 30 * 24 * 3600;

/// The two phases of a run, for progress reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Files,
    Embeddings,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Phase::Files => "files",
            Phase::Embeddings => "embeddings",
        }
    }
}

/// Where a run reports its progress: a bar on a terminal, plain lines otherwise, the log in
/// the daemon.
pub trait Progress: Send {
    fn begin(&mut self, phase: Phase, total: u64);
    fn advance(&mut self, n: u64);
    fn end(&mut self);
}

/// Progress nobody watches.
pub struct NoProgress;

impl Progress for NoProgress {
    fn begin(&mut self, _: Phase, _: u64) {}
    fn advance(&mut self, _: u64) {}
    fn end(&mut self) {}
}

/// Progress as log lines (the daemon's scheduled runs): one line per phase start and end.
#[derive(Default)]
pub struct LogProgress {
    phase: Option<Phase>,
    done: u64,
}

impl Progress for LogProgress {
    fn begin(&mut self, phase: Phase, total: u64) {
        self.phase = Some(phase);
        self.done = 0;
        tracing::info!(phase = phase.label(), total, "index run: phase started");
    }
    fn advance(&mut self, n: u64) {
        self.done += n;
    }
    fn end(&mut self) {
        if let Some(phase) = self.phase.take() {
            tracing::info!(
                phase = phase.label(),
                done = self.done,
                "index run: phase finished"
            );
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IndexReport {
    pub files_seen: usize,
    pub files_changed: usize,
    pub files_unchanged: usize,
    pub files_removed: usize,
    /// Files skipped (too large, unreadable, outside the workspace), with the reason.
    pub skipped: Vec<String>,
    pub chunks_added: usize,
    pub chunks_removed: usize,
    pub chunks_kept: usize,
    /// Chunk texts embedded by this run.
    pub embedded: usize,
    /// The embeddings model's API id, when one is configured.
    pub embeddings_model: Option<String>,
    /// Why embedding stopped early (the index itself is complete).
    pub embed_error: Option<String>,
    pub elapsed_ms: u64,
}

/// The held run lock; released on drop.
pub struct IndexLock {
    _lock: Flock<File>,
}

impl IndexLock {
    /// Take the lock in `state_dir` without waiting.
    pub fn acquire(state_dir: &Path) -> Result<IndexLock, MemoryError> {
        let path = state_dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| MemoryError::Io(format!("cannot open {}: {e}", path.display())))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(IndexLock { _lock: lock }),
            Err((_, Errno::EWOULDBLOCK)) => Err(MemoryError::Busy(format!(
                "another index run is in progress (lock held on {}); wait for it to finish",
                path.display()
            ))),
            Err((_, e)) => Err(MemoryError::Io(format!(
                "cannot lock {}: {e}",
                path.display()
            ))),
        }
    }
}

/// A file the include globs matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Relative to the workspace, `/`-separated.
    pub rel: String,
    pub abs: PathBuf,
}

/// The files `include` matches under `workspace`, sorted by relative path, and the ones
/// skipped with the reason. Blocking.
pub fn scan(
    workspace: &Path,
    include: &[String],
) -> Result<(Vec<Found>, Vec<String>), MemoryError> {
    let root = workspace
        .canonicalize()
        .map_err(|e| MemoryError::Io(format!("workspace {}: {e}", workspace.display())))?;
    let mut found = BTreeMap::new();
    let mut skipped = Vec::new();
    for pattern in include {
        if Path::new(pattern).is_absolute() || pattern.split('/').any(|p| p == "..") {
            return Err(MemoryError::Invalid(format!(
                "memory.indexer.include: {pattern:?} must be a glob relative to the workspace, without '..'"
            )));
        }
        let full = root.join(pattern);
        let full = full.to_str().ok_or_else(|| {
            MemoryError::Invalid(format!("memory.indexer.include: {pattern:?} is not UTF-8"))
        })?;
        let paths = glob::glob(full).map_err(|e| {
            MemoryError::Invalid(format!(
                "memory.indexer.include: {pattern:?} is not a valid glob: {e}"
            ))
        })?;
        for entry in paths {
            let path = match entry {
                Ok(p) => p,
                Err(e) => {
                    skipped.push(format!("{}: {}", e.path().display(), e.error()));
                    continue;
                }
            };
            match check_file(&root, &path) {
                Ok(Some(rel)) => {
                    found.insert(rel.clone(), Found { rel, abs: path });
                }
                Ok(None) => {}
                Err(reason) => skipped.push(format!("{}: {reason}", path.display())),
            }
        }
    }
    Ok((found.into_values().collect(), skipped))
}

/// The relative path of an indexable file; `None` for a directory; `Err` with the reason for
/// a file that is skipped.
fn check_file(root: &Path, path: &Path) -> Result<Option<String>, String> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    if meta.is_dir() {
        return Ok(None);
    }
    if !meta.file_type().is_file() {
        return Err("not a regular file (symlinks are not indexed)".into());
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!(
            "{} bytes, larger than the {MAX_FILE_BYTES}-byte limit",
            meta.len()
        ));
    }
    let real = path.canonicalize().map_err(|e| e.to_string())?;
    let rel = real
        .strip_prefix(root)
        .map_err(|_| "outside the workspace".to_string())?;
    rel.to_str()
        .map(|s| Some(s.to_string()))
        .ok_or_else(|| "path is not UTF-8".to_string())
}

/// A file read and, when changed, chunked.
struct Prepared {
    meta: FileMeta,
    chunks: Vec<NewChunk>,
}

/// Read `found` and chunk it, unless its hash equals `known`. Blocking.
fn prepare(
    found: &Found,
    known: Option<&str>,
    chunk_chars: usize,
    overlap_chars: usize,
) -> Result<Option<Prepared>, String> {
    let bytes = std::fs::read(&found.abs).map_err(|e| e.to_string())?;
    let hash = sha256_hex(&bytes);
    if known == Some(hash.as_str()) {
        return Ok(None);
    }
    let mtime = std::fs::metadata(&found.abs)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs() as i64);
    let text = String::from_utf8_lossy(&bytes);
    let chunks = chunk_lines(&text, chunk_chars, overlap_chars)
        .into_iter()
        .filter(|c| !c.text.trim().is_empty())
        .map(|c| NewChunk {
            start_line: c.start_line,
            end_line: c.end_line,
            hash: sha256_hex(embed_text(&found.rel, &c.text).as_bytes()),
            text: c.text,
        })
        .collect();
    Ok(Some(Prepared {
        meta: FileMeta {
            path: found.rel.clone(),
            hash,
            size: bytes.len() as u64,
            mtime,
        },
        chunks,
    }))
}

impl Memory {
    /// One index run (see the module docs). Fails with `Busy` while another run holds the lock.
    pub async fn index(&self, progress: &mut dyn Progress) -> Result<IndexReport, MemoryError> {
        let started = Instant::now();
        let _lock = IndexLock::acquire(self.state_dir())?;
        let cfg = self.cfg().clone();
        let workspace = self.workspace().to_path_buf();
        let include = cfg.indexer_include.clone();
        let (files, skipped) = tokio::task::spawn_blocking(move || scan(&workspace, &include))
            .await
            .map_err(|e| MemoryError::Io(format!("workspace scan failed: {e}")))??;
        let mut report = IndexReport {
            files_seen: files.len(),
            skipped,
            embeddings_model: self.embedder().map(|e| e.model_id().to_string()),
            ..IndexReport::default()
        };

        let mut known = self.db().file_hashes().await?;
        let seen: HashSet<&str> = files.iter().map(|f| f.rel.as_str()).collect();
        let gone: Vec<String> = known
            .keys()
            .filter(|p| !seen.contains(p.as_str()))
            .cloned()
            .collect();

        progress.begin(Phase::Files, files.len() as u64);
        for found in &files {
            let known_hash = known.remove(&found.rel);
            let f = found.clone();
            let (chunk_chars, overlap) = (cfg.chunk_chars, cfg.overlap_chars);
            let prepared = tokio::task::spawn_blocking(move || {
                prepare(&f, known_hash.as_deref(), chunk_chars, overlap)
            })
            .await
            .map_err(|e| MemoryError::Io(format!("reading {} failed: {e}", found.rel)))?;
            match prepared {
                Ok(None) => report.files_unchanged += 1,
                Ok(Some(p)) => {
                    let change = self.db().replace_file(p.meta, p.chunks).await?;
                    report.files_changed += 1;
                    report.chunks_added += change.added;
                    report.chunks_removed += change.removed;
                    report.chunks_kept += change.kept;
                }
                Err(reason) => report.skipped.push(format!("{}: {reason}", found.rel)),
            }
            progress.advance(1);
        }
        progress.end();
        report.files_removed = gone.len();
        report.chunks_removed += self.db().remove_files(gone).await?;

        if let Some(embedder) = self.embedder() {
            let model = embedder.model_id().to_string();
            let total = self.db().count_unembedded(&model).await?;
            if total > 0 {
                progress.begin(Phase::Embeddings, total);
                loop {
                    let todo = self
                        .db()
                        .unembedded_chunks(&model, super::embed::BATCH)
                        .await?;
                    if todo.is_empty() {
                        break;
                    }
                    let windows: Vec<Vec<String>> = todo
                        .iter()
                        .map(|c| embed_windows(&c.path, &c.text))
                        .collect();
                    match embed_chunks(embedder, &windows).await {
                        Ok(vectors) => {
                            let n = vectors.len();
                            let rows = todo.into_iter().map(|c| c.hash).zip(vectors).collect();
                            self.db().put_embeddings(&model, rows, true).await?;
                            report.embedded += n;
                            progress.advance(n as u64);
                        }
                        Err(e) => {
                            report.embed_error = Some(e.to_string());
                            break;
                        }
                    }
                }
                progress.end();
            }
            let keep_after = chrono::Utc::now().timestamp() - CACHE_KEEP_SECONDS;
            let pruned = self.db().prune_embeddings(&model, keep_after).await?;
            if pruned > 0 {
                tracing::debug!(pruned, "old cached embeddings dropped");
            }
        }
        report.elapsed_ms = started.elapsed().as_millis() as u64;
        Ok(report)
    }
}

/// One vector per chunk from its windows ([`embed_windows`]): the windows of all chunks go in
/// requests of at most [`super::embed::BATCH`] texts, and a chunk's vector is the normalised
/// mean of its windows' vectors.
async fn embed_chunks(
    embedder: &super::Embedder,
    windows: &[Vec<String>],
) -> Result<Vec<Vec<f32>>, MemoryError> {
    let flat: Vec<String> = windows.iter().flatten().cloned().collect();
    let mut vectors: Vec<Vec<f32>> = Vec::with_capacity(flat.len());
    for batch in flat.chunks(super::embed::BATCH) {
        let got = embedder.embed(batch, "").await?;
        if got.len() != batch.len() {
            return Err(MemoryError::Embed(format!(
                "the server returned {} vectors for {} texts",
                got.len(),
                batch.len()
            )));
        }
        vectors.extend(got);
    }
    let mut it = vectors.into_iter();
    Ok(windows
        .iter()
        .map(|w| mean(it.by_ref().take(w.len()).collect()))
        .collect())
}

/// The normalised mean of `vectors` (one vector: itself).
fn mean(mut vectors: Vec<Vec<f32>>) -> Vec<f32> {
    if vectors.len() == 1 {
        return vectors.pop().unwrap_or_default();
    }
    let dims = vectors.first().map_or(0, Vec::len);
    let mut sum = vec![0f32; dims];
    for v in vectors.iter().filter(|v| v.len() == dims) {
        sum.iter_mut().zip(v).for_each(|(s, x)| *s += x);
    }
    normalize(&mut sum);
    sum
}

/// The query-embedding cache, pruned on the retention schedule (SPEC §16.3) as well as by
/// index runs: cached embeddings no chunk uses and older than `CACHE_KEEP_SECONDS`.
impl super::Memory {
    pub async fn prune_embedding_cache(&self) -> Result<usize, MemoryError> {
        let Some(embedder) = self.embedder() else {
            return Ok(0);
        };
        let keep_after = chrono::Utc::now().timestamp() - CACHE_KEEP_SECONDS;
        Ok(self
            .db()
            .prune_embeddings(embedder.model_id(), keep_after)
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_finds_regular_files_inside_and_skips_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("memory/sub")).unwrap();
        std::fs::write(ws.join("MEMORY.md"), "root").unwrap();
        std::fs::write(ws.join("memory/a.md"), "a").unwrap();
        std::fs::write(ws.join("memory/sub/b.md"), "b").unwrap();
        std::fs::write(ws.join("memory/c.txt"), "c").unwrap();
        std::fs::write(dir.path().join("secret.md"), "s").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret.md"), ws.join("memory/link.md"))
            .unwrap();
        let include = vec!["MEMORY.md".to_string(), "memory/**/*.md".to_string()];
        let (found, skipped) = scan(&ws, &include).unwrap();
        let rels: Vec<&str> = found.iter().map(|f| f.rel.as_str()).collect();
        assert_eq!(rels, vec!["MEMORY.md", "memory/a.md", "memory/sub/b.md"]);
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert!(skipped[0].contains("link.md") && skipped[0].contains("symlink"));
    }

    #[test]
    fn patterns_that_leave_the_workspace_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for p in ["../x/*.md", "/etc/*.md"] {
            let err = scan(dir.path(), &[p.to_string()]).unwrap_err().to_string();
            assert!(err.contains("memory.indexer.include"), "{err}");
        }
        let err = scan(dir.path(), &["[".to_string()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a valid glob"), "{err}");
    }

    #[test]
    fn the_lock_is_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let held = IndexLock::acquire(dir.path()).unwrap();
        let err = IndexLock::acquire(dir.path()).err().unwrap();
        assert!(matches!(err, MemoryError::Busy(_)), "{err}");
        drop(held);
        IndexLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn the_mean_of_window_vectors_is_normalised() {
        assert_eq!(mean(vec![vec![0.6, 0.8]]), vec![0.6, 0.8]);
        let m = mean(vec![vec![1.0, 0.0], vec![0.0, 1.0]]);
        let h = std::f32::consts::FRAC_1_SQRT_2;
        assert!(m.iter().all(|x| (x - h).abs() < 1e-6), "{m:?}");
        assert!(mean(Vec::new()).is_empty());
    }

    #[test]
    fn unchanged_content_is_not_prepared_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n.md");
        std::fs::write(&path, "one\ntwo\n\n\n").unwrap();
        let f = Found {
            rel: "n.md".into(),
            abs: path,
        };
        let p = prepare(&f, None, 100, 10).unwrap().unwrap();
        assert_eq!(p.chunks.len(), 1);
        assert_eq!(p.chunks[0].hash, sha256_hex(b"n\none\ntwo\n\n"));
        assert!(prepare(&f, Some(&p.meta.hash), 100, 10).unwrap().is_none());
    }
}
