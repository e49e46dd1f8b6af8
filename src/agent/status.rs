//! `StatusSource` for the `session_status` tool: figures of the running message plus today's
//! spend from the ledger.

use std::time::Instant;

use crate::zone::Zone;
use futures::future::BoxFuture;

use crate::cost::Period;
use crate::store::Db;
use crate::tools::{SessionStatus, StatusSource};

pub(crate) struct LoopStatus {
    pub db: Db,
    pub tz: Zone,
    pub started: Instant,
    pub session_id: String,
    pub session_key: String,
    pub model: String,
    pub context_tokens: u64,
    pub context_window: u64,
    pub messages: usize,
    pub compactions: u32,
}

impl StatusSource for LoopStatus {
    fn session_status(&self) -> BoxFuture<'_, Result<SessionStatus, String>> {
        Box::pin(async move {
            let since = Period::Today
                .start(&self.tz, chrono::Utc::now())
                .unwrap_or(0);
            let (today_tokens, today_cost_usd) = self
                .db
                .usage_since(since)
                .await
                .map_err(|e| e.to_string())?;
            Ok(SessionStatus {
                session_id: self.session_id.clone(),
                session_key: self.session_key.clone(),
                model: self.model.clone(),
                context_tokens: self.context_tokens,
                context_window: self.context_window,
                messages: self.messages,
                compactions: self.compactions,
                uptime_seconds: self.started.elapsed().as_secs(),
                today_cost_usd,
                today_tokens,
            })
        })
    }
}
