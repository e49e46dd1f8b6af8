//! The embeddings model client: an OpenAI-compatible `POST {base_url}/embeddings` (SPEC §13).
//! (Placeholder shape; the indexer work fills it in.)

use std::sync::Arc;

use crate::config::ModelSpec;

/// Client for the `embeddings` model.
#[derive(Debug)]
pub struct Embedder {
    pub spec: Arc<ModelSpec>,
}
