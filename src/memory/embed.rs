//! The `embeddings` model (SPEC §13): an OpenAI-compatible `/embeddings` endpoint reached
//! through the provider gateway (`Gateway::embed`: retries, never a fallback). Vectors are normalised to unit length
//! so that a dot product is the cosine. Every request writes an `embedding` cost row; query
//! embeddings are cached in `embedding_cache` by the text's sha256.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::MemoryError;
use super::chunk::sha256_hex;
use super::rank::normalize;
use crate::config::{ModelSpec, ProviderKind};
use crate::gateway::{Bill, CallError, Gateway};
use crate::llm::LlmEvent;
use crate::store::memory::MemoryDb;

/// The conventional model name (SPEC §4).
pub const MODEL_NAME: &str = "embeddings";

/// Texts per embeddings request.
pub const BATCH: usize = 64;
/// Longest wait for a query's vector: a message's recall must not hang on a slow server.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// After a failed query embedding, queries skip vectors (full text only) for this long, so a
/// server that is down costs one failed request, not one per message.
pub const QUERY_BACKOFF: Duration = Duration::from_secs(60);

/// Client for the `embeddings` model.
#[derive(Clone)]
pub struct Embedder {
    gateway: Arc<Gateway>,
    spec: Arc<ModelSpec>,
    /// When the last query embedding failed (shared by clones).
    query_failed_at: Arc<Mutex<Option<Instant>>>,
}

impl Embedder {
    /// The embedder of the model named `embeddings`, when it is loaded and OpenAI-compatible.
    /// Otherwise `None` (search is FTS-only), with one log line saying why when it is defined.
    /// Every request passes the gateway's budget check and writes an `embedding` row.
    pub fn from_config(gateway: Arc<Gateway>) -> Option<Embedder> {
        let spec = match gateway.models().get(MODEL_NAME) {
            Some(spec) => spec.clone(),
            None => {
                if let Some(reason) = gateway.models().skipped.get(MODEL_NAME) {
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
        Some(Embedder {
            gateway,
            spec,
            query_failed_at: Arc::new(Mutex::new(None)),
        })
    }

    /// The API model id: the key of cached embeddings (vectors of different models never mix).
    pub fn model_id(&self) -> &str {
        &self.spec.model
    }

    /// Embed `texts` in one request (with retries); unit-length vectors in input order.
    /// `session_id` goes into the cost row (`""` for the indexer).
    pub async fn embed(
        &self,
        texts: &[String],
        session_id: &str,
    ) -> Result<Vec<Vec<f32>>, MemoryError> {
        self.request(texts, session_id, true).await
    }

    async fn request(
        &self,
        texts: &[String],
        session_id: &str,
        retry: bool,
    ) -> Result<Vec<Vec<f32>>, MemoryError> {
        let on_event = |e: LlmEvent| {
            if let LlmEvent::RetryWait { attempt, error, .. } = e {
                tracing::debug!(attempt, %error, "embeddings call retrying");
            }
        };
        // Against the spend of the session's message in flight, under its call gate (held
        // until the cost is recorded).
        let bill = Bill::message(session_id);
        let outcome = match self
            .gateway
            .embed(bill, MODEL_NAME, texts, retry, &on_event)
            .await
        {
            Ok(paid) => paid.out,
            Err(CallError::Budget(e)) => {
                return Err(MemoryError::Embed(format!("call not made: {e}")));
            }
            Err(e) => return Err(MemoryError::Embed(e.to_string())),
        };
        let mut vectors = outcome.embeddings.vectors;
        vectors.iter_mut().for_each(|v| normalize(v));
        Ok(vectors)
    }

    /// The embedding of a query, from the cache when this text was embedded before. One
    /// attempt of at most [`QUERY_TIMEOUT`]; within [`QUERY_BACKOFF`] of a failure no request
    /// is made at all (the caller searches full text only).
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
        let failed_at = *self
            .query_failed_at
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(at) = failed_at
            && at.elapsed() < QUERY_BACKOFF
        {
            return Err(MemoryError::Embed(format!(
                "skipped: a query embedding failed {} s ago; vectors are used again after {} s",
                at.elapsed().as_secs(),
                QUERY_BACKOFF.as_secs()
            )));
        }
        let texts = [text.to_string()];
        let result = match tokio::time::timeout(
            QUERY_TIMEOUT,
            self.request(&texts, session_id, false),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(MemoryError::Embed(format!(
                "no answer within {} s",
                QUERY_TIMEOUT.as_secs()
            ))),
        };
        let result = result.and_then(|mut v| {
            v.pop()
                .ok_or_else(|| MemoryError::Embed("the server returned no vector".into()))
        });
        *self
            .query_failed_at
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = result.is_err().then(Instant::now);
        let v = result?;
        db.put_embeddings(self.model_id(), vec![(hash, v.clone())], false)
            .await?;
        Ok(v)
    }
}
