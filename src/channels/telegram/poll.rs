//! Our own long-polling loop (SPEC §10.3, §5.2). teloxide's `Polling` keeps its offset in
//! memory; this loop resumes from the persisted offset and advances it only after the sink has
//! durably accepted an update, so nothing acknowledged to Telegram is ever lost.
//!
//! Failures never end the loop: 409 conflicts, 5xx, network errors and broken answers back off
//! exponentially with jitter; a poll that does not answer within the poll timeout plus a slack
//! is abandoned and restarted; a rejected token is logged and retried at the longest interval.
//! Only cancellation ends it. Its state is published as [`PollHealth`] for the monitor.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use rand::Rng;
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::client::{TelegramClient, TgError};
use super::inbound::{TgCallback, TgInbound, allowed, callback_from_update, from_update};
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
    /// Durable intake of one update; Ok only after it is recorded. The poller advances the
    /// offset only after Ok; on Err it stops the batch, backs off and asks again (the update is
    /// delivered again).
    fn accept(&self, msg: TgInbound) -> BoxFuture<'_, Result<(), String>>;
    /// A button press (an approval, SPEC §18.1; a `/model` or `/skills` button, §18.2). Not
    /// durable: a press lost to a crash is pressed again (an approval is asked again after a
    /// restart anyway). The sink checks `allow_from` itself, so that a refused user is told.
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

/// Exponential backoff with "equal jitter": the n-th delay is uniformly drawn from
/// `[d/2, d]` where `d = min * 2^n`, capped at `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    /// A backoff starting at `min`, never above `max`.
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max: max.max(min),
            failures: 0,
        }
    }

    /// The delay before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        let factor = 2u32.saturating_pow(self.failures.min(20));
        self.failures = self.failures.saturating_add(1);
        let d = self.min.saturating_mul(factor).min(self.max);
        let half = d / 2;
        half + rand::rng().random_range(Duration::ZERO..=d - half)
    }

    /// After a success.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// Sleeps `d`; false if cancelled first.
async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
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
    mut cfg: TelegramConfig,
    offsets: Arc<dyn OffsetStore>,
    sink: Arc<dyn TgSink>,
    health: watch::Sender<PollHealth>,
    cancel: CancellationToken,
    opts: PollOptions,
) -> Result<(), TgError> {
    let mut offset = tokio::select! {
        _ = cancel.cancelled() => return Ok(()),
        o = offsets.load() => o.unwrap_or(0),
    };
    let mut backoff = Backoff::new(opts.backoff_min, opts.backoff_max);
    let hang_after = cfg.poll_timeout + opts.hang_slack;
    tracing::info!(offset, "telegram: polling for updates");
    loop {
        let polled = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            r = tokio::time::timeout(hang_after, client.get_updates(offset, cfg.poll_timeout)) => r,
        };
        let result = match polled {
            Ok(r) => r,
            Err(_elapsed) => Err(TgError::Timeout),
        };
        let updates = match result {
            Ok(u) => u,
            Err(e) => {
                let wait = match &e {
                    TgError::Timeout => {
                        tracing::warn!(
                            waited_seconds = hang_after.as_secs(),
                            "telegram: getUpdates did not answer in time; restarting the poll"
                        );
                        // Restart at once: the connection was dropped, the next poll is fresh.
                        Duration::ZERO
                    }
                    TgError::Unauthorized => {
                        // A permanent refusal is an alert, not a death: the rest of the daemon
                        // runs on and polling retries at the longest interval (SPEC §16.7).
                        if health.borrow().state != PollState::Unauthorized {
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
                        let d = backoff.next_delay();
                        tracing::warn!(error = %other, retry_in_ms = d.as_millis() as u64, "telegram: getUpdates failed; backing off");
                        d
                    }
                };
                let unauthorized = e == TgError::Unauthorized;
                let token_env = cfg.token_env.clone();
                health.send_modify(|h| {
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
                if !sleep_or_cancel(wait, &cancel).await {
                    return Ok(());
                }
                continue;
            }
        };
        backoff.reset();
        health.send_modify(|h| {
            h.last_poll_ok_at = Some(Utc::now());
            h.consecutive_errors = 0;
            h.state = PollState::Ok;
            h.healthy = true;
            h.alert = None;
        });

        if let Some(live) = &opts.live {
            let now = live.get();
            cfg.allow_from.clone_from(&now.telegram.allow_from);
            cfg.contacts.clone_from(&now.telegram.contacts);
        }
        let mut sink_failed = false;
        for update in updates {
            let id = i64::from(update.id.0);
            if id < offset {
                continue; // already confirmed; a misbehaving server sent it again
            }
            if let Some(cb) = callback_from_update(&update, client.bot_id(), &cfg) {
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(()),
                    _ = sink.callback(cb) => {}
                }
                offset = id + 1;
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(()),
                    _ = offsets.save(offset) => {}
                }
                continue;
            }
            match from_update(&update, client.bot_id(), &cfg) {
                None => tracing::debug!(update_id = id, "telegram: update ignored"),
                Some(msg) if !allowed(msg.user_id, &cfg) => {
                    let user_id = msg.user_id;
                    tracing::info!(
                        user_id,
                        "telegram: message from user {user_id} rejected; add it to allow_from to allow"
                    );
                }
                Some(msg) => {
                    let accepted = tokio::select! {
                        _ = cancel.cancelled() => return Ok(()),
                        r = sink.accept(msg) => r,
                    };
                    if let Err(e) = accepted {
                        tracing::warn!(update_id = id, error = %e, "telegram: intake failed; the update will be fetched again");
                        health.send_modify(|h| {
                            h.last_error = Some(format!("intake failed: {e}"));
                        });
                        sink_failed = true;
                        break;
                    }
                }
            }
            offset = id + 1;
            tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                _ = offsets.save(offset) => {}
            }
        }
        if sink_failed && !sleep_or_cancel(backoff.next_delay(), &cancel).await {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_caps() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let delays: Vec<Duration> = (0..10).map(|_| b.next_delay()).collect();
        for (n, d) in delays.iter().enumerate() {
            let full = Duration::from_secs(1 << n.min(6)).min(Duration::from_secs(60));
            assert!(
                *d >= full / 2 && *d <= full,
                "delay {n} = {d:?}, expected in [{:?}, {full:?}]",
                full / 2
            );
        }
        assert!(delays[9] >= Duration::from_secs(30));
        b.reset();
        assert!(b.next_delay() <= Duration::from_secs(1));
    }

    #[test]
    fn backoff_jitters() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..20 {
            let mut b = Backoff::new(Duration::from_secs(8), Duration::from_secs(60));
            seen.insert(b.next_delay());
        }
        assert!(seen.len() > 1, "20 draws gave one value: no jitter");
    }
}
