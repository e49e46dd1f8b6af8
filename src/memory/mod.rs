//! Long-term memory (SPEC §13): the workspace index (line-based chunks, FTS5, embeddings),
//! hybrid search, structured memory (facts, episodes, commitments, aliases), consolidation and
//! recall. The SQL lives in `store::memory`; this module is the logic around it. The commands
//! `agentd index` and `agentd consolidate` are in `cli::memory`.
//!
//! | File | What |
//! |---|---|
//! | `chunk.rs` | the line-based chunker and content hashes (pure) |
//! | `fts.rs` | the FTS5 query sanitiser (pure) |
//! | `rank.rs` | cosine top-k and reciprocal-rank fusion (pure) |
//! | `embed.rs` | the `embeddings` model: batches, normalisation, cost rows, the query cache |
//! | `index.rs` | `agentd index`: scan, hash, chunk, store, embed; the run lock; progress |
//! | `search.rs` | hybrid search over chunks, facts and episodes |
//! | `recall.rs` | the recall block of the dynamic context |
//! | `consolidate.rs` | facts, episodes and commitments extracted by an LLM, watermarked |
//! | `eval.rs` | recall@k of a query set per class (the retrieval test set and benchmark) |

pub mod chunk;
pub mod consolidate;
pub mod embed;
pub mod eval;
pub mod fts;
pub mod index;
pub mod rank;
pub mod recall;
pub mod search;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::zone::Zone;

use crate::config::{Config, MemoryConfig};
use crate::gateway::Gateway;
use crate::store::StoreError;
use crate::store::memory::{MemoryDb, VectorSet};

pub use embed::Embedder;
pub use search::{ChunkHit, SearchMode, SearchResults};

/// The memory database's file name in the state directory.
pub const DB_FILE: &str = "memory.db";

/// Errors of the memory subsystem. Each message says what failed and, where there is one, the
/// fix.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The embeddings endpoint failed (the message names the model and the cause).
    #[error("embeddings: {0}")]
    Embed(String),
    /// Workspace or lock-file I/O (the message names the path).
    #[error("{0}")]
    Io(String),
    /// Another `agentd index` run holds the lock.
    #[error("{0}")]
    Busy(String),
    /// Bad input from a tool call or the CLI (the message says what to fix).
    #[error("{0}")]
    Invalid(String),
    /// The consolidation model failed or answered something unusable.
    #[error("consolidation: {0}")]
    Consolidation(String),
}

/// The memory service: database, config, workspace and (when configured) the embeddings
/// model. Cheap to clone; clones share the cached vectors.
#[derive(Clone)]
pub struct Memory {
    inner: Arc<Inner>,
    fusion: Fusion,
}

struct Inner {
    db: MemoryDb,
    cfg: MemoryConfig,
    workspace: PathBuf,
    state_dir: PathBuf,
    tz: Zone,
    embedder: Option<Embedder>,
    /// Chunk vectors of the embeddings model, reloaded when `meta.index_generation` moves.
    vectors: tokio::sync::Mutex<Option<Arc<VectorSet>>>,
}

/// How hybrid search merges the full-text and the vector list. The default was chosen on the
/// retrieval test set and checked on a held-out one (docs/memory.md, "Retrieval quality");
/// the other settings exist to measure them (`cargo bench --bench retrieval -- --fusion ...`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fusion {
    pub method: FusionMethod,
    pub fts_weight: f64,
    pub vector_weight: f64,
    /// Scale each full-text hit by the share of the query's terms it contains: a chunk that
    /// shares one word of four with the query is weak evidence, whatever its rank.
    pub coverage: bool,
    /// Halve the full-text weight for a query that reads as a sentence (it has a stop word).
    pub adaptive: bool,
}

/// The fusion function of [`Fusion`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusionMethod {
    /// Weighted reciprocal-rank fusion (`rank::rrf_scaled`).
    Rrf,
    /// Convex combination of min-max normalised scores (`rank::convex`): bm25 and cosine.
    Convex,
}

impl Default for Fusion {
    fn default() -> Self {
        Fusion {
            method: FusionMethod::Convex,
            fts_weight: 1.0,
            vector_weight: 1.0,
            coverage: true,
            adaptive: false,
        }
    }
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory")
            .field("db", &self.inner.db)
            .field(
                "embeddings",
                &self.inner.embedder.as_ref().map(|e| e.model_id()),
            )
            .finish()
    }
}

impl Memory {
    /// Assemble the service. `embedder` = `None` for FTS-only search.
    pub fn new(
        db: MemoryDb,
        cfg: MemoryConfig,
        workspace: PathBuf,
        state_dir: PathBuf,
        tz: Zone,
        embedder: Option<Embedder>,
    ) -> Memory {
        Memory {
            inner: Arc::new(Inner {
                db,
                cfg,
                workspace,
                state_dir,
                tz,
                embedder,
                vectors: tokio::sync::Mutex::new(None),
            }),
            fusion: Fusion::default(),
        }
    }

    /// This service with other fusion weights (for measuring them: the retrieval benchmark).
    pub fn with_fusion(self, fusion: Fusion) -> Memory {
        Memory { fusion, ..self }
    }

    pub fn fusion(&self) -> Fusion {
        self.fusion
    }

    /// Open `state_dir/memory.db` and build the service from the config: the embeddings model
    /// is the model named `embeddings` when it is loaded (else search is FTS-only, logged once).
    /// The `embedding` calls go through `gateway`. Blocking (opens the database).
    pub fn open(cfg: &Config, gateway: Arc<Gateway>) -> Result<Memory, MemoryError> {
        let db = MemoryDb::open(&cfg.paths.state_dir.join(DB_FILE))?;
        let embedder = Embedder::from_config(gateway);
        Ok(Memory::new(
            db,
            cfg.memory.clone(),
            cfg.agent.workspace.clone(),
            cfg.paths.state_dir.clone(),
            cfg.agent.timezone.clone(),
            embedder,
        ))
    }

    pub fn db(&self) -> &MemoryDb {
        &self.inner.db
    }

    pub fn cfg(&self) -> &MemoryConfig {
        &self.inner.cfg
    }

    /// The absolute workspace directory (index globs resolve against it).
    pub fn workspace(&self) -> &Path {
        &self.inner.workspace
    }

    pub fn state_dir(&self) -> &Path {
        &self.inner.state_dir
    }

    pub fn tz(&self) -> Zone {
        self.inner.tz.clone()
    }

    /// The embeddings model, when one is configured and loaded.
    pub fn embedder(&self) -> Option<&Embedder> {
        self.inner.embedder.as_ref()
    }

    /// The chunk vectors of the embeddings model, loaded once and again only after the index
    /// changed (any process may change it: `agentd index` runs beside the daemon).
    pub(crate) async fn vectors(&self, model: &str) -> Result<Arc<VectorSet>, MemoryError> {
        let generation = self.inner.db.generation().await?;
        let mut cached = self.inner.vectors.lock().await;
        if let Some(set) = cached.as_ref()
            && set.generation == generation
        {
            return Ok(set.clone());
        }
        let set = Arc::new(self.inner.db.chunk_vectors(model).await?);
        tracing::debug!(
            chunks = set.len(),
            dims = set.dims,
            generation = set.generation,
            "memory vectors loaded"
        );
        *cached = Some(set.clone());
        Ok(set)
    }
}

/// The memory work the scheduler can run (`[[schedule]] job = "index" | "consolidate"`).
#[derive(Clone)]
pub struct MemoryJobs {
    pub memory: Memory,
    pub consolidator: consolidate::Consolidator,
    /// `state_dir/sessions`.
    pub sessions_dir: PathBuf,
}

impl MemoryJobs {
    /// Run `job` for the schedule entry `name`; the outcome goes to the log.
    pub async fn run(&self, job: crate::config::ScheduleJob, name: &str) {
        use crate::config::ScheduleJob;
        match job {
            ScheduleJob::Index => match self.memory.index(&mut index::LogProgress::default()).await
            {
                Ok(r) => tracing::info!(
                    schedule = %name,
                    files = r.files_seen,
                    changed = r.files_changed,
                    removed = r.files_removed,
                    embedded = r.embedded,
                    embed_error = r.embed_error.as_deref().unwrap_or(""),
                    elapsed_ms = r.elapsed_ms,
                    "scheduled index run finished"
                ),
                Err(e) => {
                    tracing::warn!(schedule = %name, error = %e, "scheduled index run failed")
                }
            },
            ScheduleJob::Consolidate => {
                let r = self
                    .consolidator
                    .all(&self.sessions_dir, &mut |_, _| {})
                    .await;
                let done = r
                    .sessions
                    .iter()
                    .filter(|(_, o)| matches!(o, consolidate::SessionOutcome::Done { .. }))
                    .count();
                tracing::info!(
                    schedule = %name,
                    sessions = done,
                    notes = r.notes(),
                    errors = r.errors.len(),
                    "scheduled consolidation finished"
                );
                for e in &r.errors {
                    tracing::warn!(schedule = %name, error = %e, "consolidation error");
                }
            }
        }
    }
}

/// Estimated tokens of a text (about four bytes per token, as the context estimates do).
pub(crate) fn estimate_tokens(text: &str) -> usize {
    text.len().div_ceil(4)
}
