//! Chunk search over the workspace index (SPEC §13). (Placeholder shape; the search work
//! replaces the body: FTS5 with a sanitiser, vectors, reciprocal-rank fusion.)

use super::{Memory, MemoryError};

/// One chunk found by search.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ChunkHit {
    pub chunk_id: i64,
    /// Path relative to the workspace.
    pub path: String,
    pub start_line: u32,
    pub end_line: u32,
    pub text: String,
    /// Fused score (higher is better).
    pub score: f64,
}

impl Memory {
    /// The best `k` chunks for `query`: hybrid (FTS5 + vectors, reciprocal-rank fusion) when an
    /// embeddings model is configured, FTS5 only otherwise. Any user text is a valid query.
    pub async fn search_chunks(&self, query: &str, k: usize) -> Result<Vec<ChunkHit>, MemoryError> {
        let _ = (query, k);
        Ok(Vec::new())
    }
}
