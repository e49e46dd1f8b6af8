//! Our own long-polling loop (SPEC §10.3, §5.2). teloxide's `Polling` keeps its offset in
//! memory; this loop resumes from the persisted offset and advances it only over updates the
//! sink has durably accepted, so nothing acknowledged to Telegram is ever lost.
//!
//! Each chat is a lane ([`Lanes`]): its messages reach the sink one at a time, in order, while
//! other chats' messages run beside them (at most [`MAX_LANES`] chats at once) and button
//! presses are taken at once, so a slow download or transcription holds only its own chat.
//! The offset moves over the finished updates in front only; while updates are in hand, polls
//! are [`BUSY_POLL_GAP`] apart (Telegram lists the unconfirmed ones again at once).
//!
//! Failures never end the loop: 409 conflicts, 5xx, network errors and broken answers back off
//! exponentially with jitter; a poll that does not answer within the poll timeout plus a slack
//! is abandoned and restarted; a rejected token is logged and retried at the longest interval.
//! Only cancellation ends it. Its state is published as [`PollHealth`] for the monitor.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::client::{TelegramClient, TgError};
use super::inbound::{TgCallback, TgInbound, allowed, callback_from_update, from_update};
pub use super::lanes::MAX_LANES;
use super::lanes::{Finished, Lanes};
use crate::backoff::Backoff;
use crate::config::TelegramConfig;

/// Where the poller keeps its offset (the next update id to ask for).
pub trait OffsetStore: Send + Sync {
    /// The stored offset, `None` if none was ever saved.
    fn load(&self) -> BoxFuture<'_, Option<i64>>;
    /// Persists `offset`; called after every accepted or skipped update.
    fn save(&self, offset: i64) -> BoxFuture<'_, ()>;
}

/// Receives inbound messages.
pub trait TgSink: Send + Sync {
    /// Durable intake of one update; Ok only after it is recorded. Called for one update of
    /// a chat at a time, in order, while other chats' updates may be in flight. The poller
    /// moves the offset past an update only after its Ok (and every earlier update's); on Err
    /// the chat's later updates wait, the chat is held for a backoff, and the update is
    /// delivered again.
    fn accept(&self, msg: TgInbound) -> BoxFuture<'_, Result<(), String>>;
    /// A button press (an approval, SPEC §18.1; a `/model` or `/skills` button, §18.2), taken
    /// in the poll loop itself, never behind a chat's messages: keep it short. Not durable: a
    /// press lost to a crash is pressed again (an approval is asked again after a restart
    /// anyway). The sink checks who may press, so that a refused user is told.
    fn callback(&self, cb: TgCallback) -> BoxFuture<'_, ()> {
        let _ = cb;
        Box::pin(async {})
    }
}

/// Where the poller stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PollState {
    /// No poll answered yet.
    #[default]
    Starting,
    /// The last poll succeeded.
    Ok,
    /// The last poll failed; retrying with backoff.
    Retrying,
    /// Telegram refused the token (401): red until a poll succeeds again (SPEC §16.7).
    Unauthorized,
}

/// The poller's health, for the monitor (SPEC §9, §10.3).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PollHealth {
    /// See [`PollState`].
    pub state: PollState,
    /// False while the token is refused or polls fail ("red"); true after a successful poll.
    pub healthy: bool,
    /// What an operator must do, while it applies (a refused token).
    pub alert: Option<String>,
    /// When a getUpdates last succeeded.
    pub last_poll_ok_at: Option<DateTime<Utc>>,
    /// Failed polls since the last success (reset to 0 by a success).
    pub consecutive_errors: u32,
    /// Polls abandoned because no answer came in time.
    pub restarts: u32,
    /// The last failure, scrubbed of the token.
    pub last_error: Option<String>,
}

/// A health channel: the poller writes, the monitor reads.
pub fn health_channel() -> (watch::Sender<PollHealth>, watch::Receiver<PollHealth>) {
    watch::channel(PollHealth::default())
}

/// How long past `poll_timeout` a getUpdates may stay unanswered before it counts as hung.
pub const HANG_SLACK: Duration = Duration::from_secs(20);

/// Tunables of [`run_with`]; [`run`] uses the defaults.
#[derive(Debug, Clone)]
pub struct PollOptions {
    /// See [`HANG_SLACK`].
    pub hang_slack: Duration,
    /// The first backoff after a failure.
    pub backoff_min: Duration,
    /// The longest backoff, also the wait after a rejected token.
    pub backoff_max: Duration,
    /// The running config: when set, `allow_from` and `contacts` are taken from it for each
    /// batch of updates, so a SIGHUP reload applies to the next message (SPEC §16.5).
    pub live: Option<crate::config::Live>,
}

impl Default for PollOptions {
    fn default() -> Self {
        PollOptions {
            hang_slack: HANG_SLACK,
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            live: None,
        }
    }
}

/// [`run_with`] with [`PollOptions::default`].
pub async fn run(
    client: TelegramClient,
    cfg: TelegramConfig,
    offsets: Arc<dyn OffsetStore>,
    sink: Arc<dyn TgSink>,
    health: watch::Sender<PollHealth>,
    cancel: CancellationToken,
) -> Result<(), TgError> {
    run_with(
        client,
        cfg,
        offsets,
        sink,
        health,
        cancel,
        PollOptions::default(),
    )
    .await
}

/// Polls until `cancel` fires (then returns `Ok(())`). Never returns an error today; the
/// `Result` leaves room for unrecoverable conditions.
pub async fn run_with(
    client: TelegramClient,
    cfg: TelegramConfig,
    offsets: Arc<dyn OffsetStore>,
    sink: Arc<dyn TgSink>,
    health: watch::Sender<PollHealth>,
    cancel: CancellationToken,
    opts: PollOptions,
) -> Result<(), TgError> {
    let offset = tokio::select! {
        _ = cancel.cancelled() => return Ok(()),
        o = offsets.load() => o.unwrap_or(0),
    };
    tracing::info!(offset, "telegram: polling for updates");
    let mut poller = Poller {
        lanes: Lanes::new(sink.clone(), opts.backoff_min, opts.backoff_max),
        backoff: Backoff::exponential(opts.backoff_min, opts.backoff_max),
        hang_after: cfg.poll_timeout + opts.hang_slack,
        client,
        cfg,
        offsets,
        sink,
        health,
        cancel,
        opts,
        offset,
    };
    poller.run().await;
    Ok(())
}

/// While updates are in hand, every getUpdates answers at once (the unconfirmed ones come
/// back), so polls are this far apart: a new update of another chat waits at most this long.
pub const BUSY_POLL_GAP: Duration = Duration::from_millis(250);

/// What woke the poll loop.
enum Woke {
    Cancelled,
    Polled(Result<Vec<teloxide::types::Update>, TgError>),
    Finished(Finished),
    Waited,
}

/// The poll loop's state (see [`run_with`]).
struct Poller {
    client: TelegramClient,
    cfg: TelegramConfig,
    offsets: Arc<dyn OffsetStore>,
    sink: Arc<dyn TgSink>,
    health: watch::Sender<PollHealth>,
    cancel: CancellationToken,
    opts: PollOptions,
    lanes: Lanes,
    backoff: Backoff,
    hang_after: Duration,
    /// The offset asked for, and saved: every update below it is finished.
    offset: i64,
}

/// How one getUpdates ended.
enum Polled {
    Cancelled,
    /// Given up: the offset moved while it waited.
    Again,
    Answer(Result<Vec<teloxide::types::Update>, TgError>),
}

impl Poller {
    async fn run(&mut self) {
        let mut last_poll: Option<tokio::time::Instant> = None;
        loop {
            // Updates in hand come back at once: space the polls.
            if let Some(at) = last_poll.filter(|_| self.lanes.busy())
                && !self.wait_until(at + BUSY_POLL_GAP).await
            {
                return;
            }
            last_poll = Some(tokio::time::Instant::now());
            let result = match self.poll().await {
                Polled::Cancelled => return,
                // The offset moved while the poll waited: ask again with it, which confirms
                // the finished updates to Telegram at once (a stop would otherwise leave them
                // offered again, skipped by the saved offset).
                Polled::Again => continue,
                Polled::Answer(r) => r,
            };
            let updates = match result {
                Ok(u) => u,
                Err(e) => {
                    let wait = self.failed_poll(e);
                    if !self.wait_until(tokio::time::Instant::now() + wait).await {
                        return;
                    }
                    continue;
                }
            };
            self.backoff.reset();
            self.health.send_modify(|h| {
                h.last_poll_ok_at = Some(Utc::now());
                h.consecutive_errors = 0;
                h.state = PollState::Ok;
                h.healthy = true;
                h.alert = None;
            });
            if !self.batch(updates).await {
                return;
            }
        }
    }

    /// One getUpdates, while finished intakes are accounted; given up when one of them moves
    /// the offset.
    async fn poll(&mut self) -> Polled {
        let client = self.client.clone();
        let cancel = self.cancel.clone();
        let call = tokio::time::timeout(
            self.hang_after,
            client.get_updates(self.offset, self.cfg.poll_timeout),
        );
        tokio::pin!(call);
        loop {
            let woke = tokio::select! {
                _ = cancel.cancelled() => Woke::Cancelled,
                r = &mut call => Woke::Polled(r.unwrap_or(Err(TgError::Timeout))),
                f = self.lanes.next() => Woke::Finished(f),
            };
            match woke {
                Woke::Cancelled => return Polled::Cancelled,
                Woke::Polled(r) => return Polled::Answer(r),
                Woke::Finished(f) => {
                    let before = self.offset;
                    if !self.finished(f).await {
                        return Polled::Cancelled;
                    }
                    if self.offset != before {
                        return Polled::Again;
                    }
                }
                Woke::Waited => {}
            }
        }
    }

    /// Wait until `at`, accounting finished intakes meanwhile; false when cancelled.
    async fn wait_until(&mut self, at: tokio::time::Instant) -> bool {
        let cancel = self.cancel.clone();
        loop {
            let woke = tokio::select! {
                _ = cancel.cancelled() => Woke::Cancelled,
                _ = tokio::time::sleep_until(at) => Woke::Waited,
                f = self.lanes.next() => Woke::Finished(f),
            };
            match woke {
                Woke::Cancelled => return false,
                Woke::Waited | Woke::Polled(_) => return true,
                Woke::Finished(f) => {
                    if !self.finished(f).await {
                        return false;
                    }
                }
            }
        }
    }

    /// A finished intake: accounted, a failure logged, the offset moved on; false when
    /// cancelled while saving.
    async fn finished(&mut self, f: Finished) -> bool {
        if let Err(e) = &f.result {
            tracing::warn!(update_id = f.update_id, error = %e, "telegram: intake failed; the update will be fetched again");
            self.health.send_modify(|h| {
                h.last_error = Some(format!("intake failed: {e}"));
            });
        }
        self.lanes.finish(&f);
        self.advance().await
    }

    /// Move the offset on, saved when it passed a finished update; false when cancelled first.
    async fn advance(&mut self) -> bool {
        let (next, passed) = self.lanes.offset(self.offset);
        self.offset = next;
        if !passed {
            return true;
        }
        tokio::select! {
            _ = self.cancel.cancelled() => false,
            _ = self.offsets.save(next) => true,
        }
    }

    /// Take the updates of one poll: button presses at once, messages to their chats' lanes,
    /// the rest finished; the offset saved as it moves. False when cancelled.
    async fn batch(&mut self, updates: Vec<teloxide::types::Update>) -> bool {
        if let Some(live) = &self.opts.live {
            let now = live.get();
            self.cfg.allow_from.clone_from(&now.telegram.allow_from);
            self.cfg.contacts.clone_from(&now.telegram.contacts);
        }
        let bot_id = self.client.bot_id();
        let mut listed = std::collections::HashSet::new();
        for update in updates {
            let id = i64::from(update.id.0);
            if id < self.offset {
                continue; // already confirmed; a misbehaving server sent it again
            }
            listed.insert(id);
            self.lanes.seen(id);
            if self.lanes.known(id) {
                continue;
            }
            if let Some(cb) = callback_from_update(&update, bot_id, &self.cfg) {
                // Presses never wait behind a chat's messages (not durable: SPEC §18.1).
                tokio::select! {
                    _ = self.cancel.cancelled() => return false,
                    _ = self.sink.callback(cb) => {}
                }
                self.lanes.skip(id);
            } else {
                match from_update(&update, bot_id, &self.cfg) {
                    None => {
                        tracing::debug!(update_id = id, "telegram: update ignored");
                        self.lanes.skip(id);
                    }
                    Some(msg) if !allowed(msg.user_id, &self.cfg) => {
                        let user_id = msg.user_id;
                        tracing::info!(
                            user_id,
                            "telegram: message from user {user_id} rejected; add it to allow_from to allow"
                        );
                        self.lanes.skip(id);
                    }
                    Some(msg) => self.lanes.offer(msg),
                }
            }
            if !self.advance().await {
                return false;
            }
        }
        self.lanes.forget_unlisted(&listed);
        self.advance().await
    }

    /// A failed poll: logged and in the health; how long to wait before the next.
    fn failed_poll(&mut self, e: TgError) -> Duration {
        let (cfg, opts) = (&self.cfg, &self.opts);
        let wait = match &e {
            TgError::Timeout => {
                tracing::warn!(
                    waited_seconds = self.hang_after.as_secs(),
                    "telegram: getUpdates did not answer in time; restarting the poll"
                );
                // Restart at once: the connection was dropped, the next poll is fresh.
                Duration::ZERO
            }
            TgError::Unauthorized => {
                // A permanent refusal is an alert, not a death: the rest of the daemon runs on
                // and polling retries at the longest interval (SPEC §16.7).
                if self.health.borrow().state != PollState::Unauthorized {
                    tracing::error!(
                        token_env = %cfg.token_env,
                        retry_in_seconds = opts.backoff_max.as_secs(),
                        "ALERT: telegram token rejected (401 Unauthorized); set a valid bot token in {} and restart; polling keeps retrying",
                        cfg.token_env
                    );
                } else {
                    tracing::warn!(
                        retry_in_seconds = opts.backoff_max.as_secs(),
                        "telegram token still rejected (401 Unauthorized)"
                    );
                }
                opts.backoff_max
            }
            TgError::RetryAfter(d) => {
                tracing::warn!(
                    retry_after_seconds = d.as_secs(),
                    "telegram: flood control on getUpdates"
                );
                (*d).min(Duration::from_secs(600))
            }
            other => {
                let d = self.backoff.next_delay();
                tracing::warn!(error = %other, retry_in_ms = d.as_millis() as u64, "telegram: getUpdates failed; backing off");
                d
            }
        };
        let unauthorized = e == TgError::Unauthorized;
        let token_env = cfg.token_env.clone();
        self.health.send_modify(|h| {
            h.healthy = false;
            h.state = match unauthorized {
                true => PollState::Unauthorized,
                false => PollState::Retrying,
            };
            h.alert = unauthorized.then(|| {
                format!("telegram token rejected (401 Unauthorized): set a valid bot token in {token_env} and restart")
            });
            h.consecutive_errors = h.consecutive_errors.saturating_add(1);
            if e == TgError::Timeout {
                h.restarts = h.restarts.saturating_add(1);
            }
            h.last_error = Some(e.to_string());
        });
        wait
    }
}
