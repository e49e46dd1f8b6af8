//! The `embeddings` model (SPEC §13): an OpenAI-compatible `/embeddings` endpoint reached
//! through `llm::Llm::embed` (retries, never a fallback). Vectors are normalised to unit length
//! so that a dot product is the cosine. Every request writes an `embedding` cost row; query
//! embeddings are cached in `embedding_cache` by the text's sha256.

use std::sync::Arc;

use super::MemoryError;
use super::chunk::sha256_hex;
use super::rank::normalize;
use crate::config::{ModelSpec, ProviderKind};
use crate::cost::Ledger;
use crate::llm::{Llm, LlmEvent, Usage};
use crate::store::CallType;
use crate::store::memory::MemoryDb;

/// The conventional model name (SPEC §4).
pub const MODEL_NAME: &str = "embeddings";

/// Texts per embeddings request.
pub const BATCH: usize = 64;

/// Client for the `embeddings` model.
#[derive(Clone)]
pub struct Embedder {
    llm: Arc<Llm>,
    spec: Arc<ModelSpec>,
    ledger: Option<Ledger>,
}

impl Embedder {
    /// The embedder of the model named `embeddings`, when it is loaded and OpenAI-compatible.
    /// Otherwise `None` (search is FTS-only), with one log line saying why when it is defined.
    /// `ledger`: the budget is checked before and a cost row written after every request
    /// (`None` only in tests).
    pub fn from_config(llm: Arc<Llm>, ledger: Option<Ledger>) -> Option<Embedder> {
        let spec = match llm.models().get(MODEL_NAME) {
            Some(spec) => spec.clone(),
            None => {
                if let Some(reason) = llm.models().skipped.get(MODEL_NAME) {
                    tracing::warn!(model = MODEL_NAME, %reason, "embeddings model not loaded; memory search is full-text only");
                }
                return None;
            }
        };
        if spec.kind != ProviderKind::OpenAi {
            tracing::warn!(
                model = MODEL_NAME,
                "the embeddings model must have type = \"openai\" (an OpenAI-compatible /embeddings endpoint); memory search is full-text only"
            );
            return None;
        }
        Some(Embedder { llm, spec, ledger })
    }

    /// The API model id: the key of cached embeddings (vectors of different models never mix).
    pub fn model_id(&self) -> &str {
        &self.spec.model
    }

    /// Embed `texts` in one request; unit-length vectors in input order. `session_id` goes into
    /// the cost row (`""` for the indexer).
    pub async fn embed(
        &self,
        texts: &[String],
        session_id: &str,
    ) -> Result<Vec<Vec<f32>>, MemoryError> {
        if let Some(ledger) = &self.ledger {
            ledger
                .gate()
                .await
                .map_err(|e| MemoryError::Embed(format!("call not made: {e}")))?;
        }
        let on_event = |e: LlmEvent| {
            if let LlmEvent::RetryWait { attempt, error, .. } = e {
                tracing::debug!(attempt, %error, "embeddings call retrying");
            }
        };
        let outcome = self
            .llm
            .embed(MODEL_NAME, texts, &on_event)
            .await
            .map_err(|e| MemoryError::Embed(e.to_string()))?;
        let usage = Usage {
            input_tokens: outcome.embeddings.prompt_tokens,
            ..Usage::default()
        };
        if let Some(ledger) = &self.ledger {
            ledger
                .record(session_id, &outcome.model, CallType::Embedding, usage)
                .await;
        }
        let mut vectors = outcome.embeddings.vectors;
        vectors.iter_mut().for_each(|v| normalize(v));
        Ok(vectors)
    }

    /// The embedding of a query, from the cache when this text was embedded before.
    pub async fn embed_query(
        &self,
        db: &MemoryDb,
        text: &str,
        session_id: &str,
    ) -> Result<Vec<f32>, MemoryError> {
        let hash = sha256_hex(text.as_bytes());
        if let Some(v) = db.cached_embedding(self.model_id(), &hash).await? {
            return Ok(v);
        }
        let v = self
            .embed(&[text.to_string()], session_id)
            .await?
            .pop()
            .ok_or_else(|| MemoryError::Embed("the server returned no vector".into()))?;
        db.put_embeddings(self.model_id(), vec![(hash, v.clone())], false)
            .await?;
        Ok(v)
    }
}
