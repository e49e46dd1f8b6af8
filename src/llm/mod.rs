//! The LLM layer: provider-neutral types (`types`), the `Provider` trait, hand-written wire
//! clients (`anthropic/`, `openai/`), SSE parsing, retries and the model `fallback` list
//! (`router`). Only `llm/<provider>/` knows a provider's JSON.

pub mod anthropic;
pub mod error;
pub mod openai;
pub mod router;
pub mod types;

pub use error::LlmError;

pub use types::*;

use futures::future::BoxFuture;

/// One provider client bound to one model definition. `chat` makes exactly one streamed call
/// (no retries: those live in `router`).
pub trait Provider: Send + Sync {
    fn chat<'a>(&'a self, req: &'a ChatRequest) -> BoxFuture<'a, Result<ChatResponse, LlmError>>;
}
