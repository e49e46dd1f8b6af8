//! The chat channels of this build, listed once ([`CHANNELS`]). Each names its
//! `tools::outbound::Book` (how its config names people and chats as neutral addresses),
//! whether the config turns it on, and how it opens for a run. Everything else is
//! channel-neutral: the outbound [`Router`] that replies, tools and approval prompts go through,
//! the [`Contacts`], the chat commands (`channels::commands`), durable intake
//! (`channels::intake::IntakeSink`). Adding a chat channel is its own module, one line in
//! [`CHANNELS`], and its config section.

use std::sync::Arc;

use super::DaemonError;
use super::services::{Services, Tasks};
use super::sources::SourceTask;
use crate::config::{Config, Live};
use crate::tools::outbound::{Book, Contacts, Outbound, Router};

/// A chat channel of this build.
pub struct ChatChannel {
    /// Its name in addresses, routes, `delivery` records and the monitor.
    pub name: &'static str,
    pub book: Book,
    /// Whether the config turns it on.
    pub enabled: fn(&Config) -> bool,
    /// Opens it for this run (its client); an error stops the start, naming the channel.
    pub open: Open,
}

/// How a chat channel opens for a run.
pub type Open = fn(&Arc<Config>) -> Result<Arc<dyn OpenChannel>, String>;

/// A chat channel opened for this run.
pub trait OpenChannel: Send + Sync {
    /// Its outbound side, which the router reaches by the channel's name.
    fn outbound(&self) -> Arc<dyn Outbound>;
    /// Its source (the poller or sync loop), started with the other sources and watched like
    /// them (SPEC §16.7).
    fn start(&self, s: &Services, tasks: &Tasks) -> SourceTask;
}

/// Every chat channel, in the order a contact name is looked up.
pub const CHANNELS: &[ChatChannel] = &[super::telegram::CHANNEL, super::matrix::CHANNEL];

/// The channels turned on for this run, opened.
pub struct Opened {
    pub channels: Vec<(&'static str, Arc<dyn OpenChannel>)>,
}

impl Opened {
    /// Open every channel the config turns on.
    pub fn open(cfg: &Arc<Config>) -> Result<Opened, DaemonError> {
        let mut channels = Vec::new();
        for c in CHANNELS.iter().filter(|c| (c.enabled)(cfg)) {
            let opened = (c.open)(cfg).map_err(DaemonError::Startup)?;
            channels.push((c.name, opened));
        }
        Ok(Opened { channels })
    }

    /// The router over them; `None` when no chat channel runs.
    pub fn router(&self) -> Option<Arc<dyn Outbound>> {
        let mut router = Router::default();
        for (name, c) in &self.channels {
            router.add(name, c.outbound());
        }
        (!router.is_empty()).then(|| Arc::new(router) as Arc<dyn Outbound>)
    }
}

/// Every channel's contacts, read from the running config.
pub fn contacts(live: &Live) -> Contacts {
    Contacts::new(live.clone(), CHANNELS.iter().map(|c| c.book).collect())
}

/// Whether the config turns on a chat channel.
pub fn any_enabled(cfg: &Config) -> bool {
    CHANNELS.iter().any(|c| (c.enabled)(cfg))
}
