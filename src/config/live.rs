//! The running configuration, replaceable on SIGHUP (SPEC §16.5). Readers that honour live
//! changes (the scheduler, the Telegram poller's `allow_from`, contact lookups, the budget)
//! take [`Live::get`] per operation; everything else keeps the `Arc<Config>` it started with.
//!
//! What is swapped in is never the new file as such, but the running config with only the
//! live parts taken from it ([`Config::with_live_parts_of`]): a reader never sees a value that
//! needs a restart before the restart.

use std::sync::Arc;

use tokio::sync::watch;

use super::Config;

/// A cheap, clonable handle on the current configuration.
#[derive(Clone)]
pub struct Live {
    tx: Arc<watch::Sender<Arc<Config>>>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

impl Live {
    pub fn new(cfg: Arc<Config>) -> Live {
        Live {
            tx: Arc::new(watch::Sender::new(cfg)),
        }
    }

    /// The configuration now.
    pub fn get(&self) -> Arc<Config> {
        self.tx.borrow().clone()
    }

    /// Replace it; waiters of [`Live::subscribe`] wake.
    pub fn set(&self, cfg: Arc<Config>) {
        self.tx.send_replace(cfg);
    }

    /// A receiver that sees each replacement (`changed().await`).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Config>> {
        self.tx.subscribe()
    }
}

impl Config {
    /// This (running) config with the keys a SIGHUP applies taken from `new`: exactly those
    /// the key table declares live (`keys::copy_live`; today `[[schedule]]`, Telegram
    /// `allow_from` and `contacts`, `[budget]`, `[approvals]` and MCP servers), the same
    /// declaration `diff::applies_live` reads.
    pub fn with_live_parts_of(&self, new: &Config) -> Config {
        let mut cfg = self.clone();
        super::keys::copy_live(&mut cfg, new);
        cfg
    }
}
