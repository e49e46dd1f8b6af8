//! The sync loop (SPEC §21, §5.2): `sync_once` with OUR persisted `next_batch` token, which is
//! saved only after every event of that response was handed to the sink and accepted (durably
//! recorded), so a restart neither replays acknowledged events nor skips new ones (an event
//! offered twice after a crash is dropped by intake, by its id). Invites are joined only when
//! the inviter is allowed, declined otherwise; events of strangers and of rooms outside
//! `rooms` are neither answered nor recorded. Members are lazy-loaded, and a room with more
//! joined members than `max_room_members` is left, not answered in.
//!
//! Failures never end the loop: 5xx, 429 (waiting `retry_after_ms`) and dropped connections
//! back off with jitter; a refused token turns the health red with one ERROR naming the
//! variable and is retried at the longest interval. Only cancellation ends it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use matrix_sdk::config::{SyncSettings, SyncToken};
use matrix_sdk::deserialized_responses::TimelineEventKind;
use matrix_sdk::ruma::api::client::filter::{FilterDefinition, RoomEventFilter, RoomFilter};
use matrix_sdk::ruma::api::client::sync::sync_events::v3::Filter;
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::address::{allowed, room_allowed};
use super::client::{MxClient, MxError};
use super::inbound::{Kind, MxEvent, read};
use crate::backoff::Backoff;
use crate::config::Live;

/// How long a sync waits on the server for news.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// Timeline events asked per room and sync (more arrive as a `limited` timeline: logged).
const TIMELINE_LIMIT: u32 = 50;
/// Invites handled per sync; the rest wait for a later one (a flood costs bounded work).
pub const MAX_INVITES_PER_SYNC: usize = 20;

/// Where the loop keeps its sync token.
pub trait TokenStore: Send + Sync {
    fn load(&self) -> BoxFuture<'_, Option<String>>;
    fn save(&self, token: &str) -> BoxFuture<'_, ()>;
}

/// Receives the events of allowed users in allowed rooms.
pub trait MxSink: Send + Sync {
    /// Handle one event of room `room_id` (a message is recorded durably before Ok). On Err
    /// the token is not saved and the same response's events are offered again after a
    /// backoff.
    fn event<'a>(&'a self, room_id: &'a str, ev: MxEvent) -> BoxFuture<'a, Result<(), String>>;
}

/// Where the loop stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncState {
    #[default]
    Starting,
    Ok,
    Retrying,
    /// The homeserver refused the token: red until a sync succeeds again.
    Unauthorized,
}

/// The loop's health, for the monitor (SPEC §9), shaped like Telegram's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SyncHealth {
    pub state: SyncState,
    pub healthy: bool,
    pub alert: Option<String>,
    pub last_sync_ok_at: Option<DateTime<Utc>>,
    pub consecutive_errors: u32,
    pub last_error: Option<String>,
    /// Whether this device is verified (cross-signed by its owner), once logged in.
    pub device_verified: Option<bool>,
}

pub fn health_channel() -> (watch::Sender<SyncHealth>, watch::Receiver<SyncHealth>) {
    watch::channel(SyncHealth::default())
}

/// The loop's parts.
pub struct SyncLoop {
    pub client: MxClient,
    pub live: Live,
    pub tokens: Arc<dyn TokenStore>,
    pub sink: Arc<dyn MxSink>,
    pub health: watch::Sender<SyncHealth>,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

/// Members are lazy-loaded: a room brings the member events of the senders in the response,
/// not every member's (a room of 10,000 would bring 10,000 into the first sync and the store).
fn filter() -> Filter {
    let mut timeline = RoomEventFilter::with_lazy_loading();
    timeline.limit = Some(TIMELINE_LIMIT.into());
    let mut room = RoomFilter::default();
    room.timeline = timeline;
    room.state = RoomEventFilter::with_lazy_loading();
    let mut def = FilterDefinition::default();
    def.room = room;
    Filter::FilterDefinition(def)
}

impl SyncLoop {
    /// Run until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let mut token = self.tokens.load().await;
        let mut too_big = HashSet::new();
        let mut backoff =
            Backoff::exponential(self.backoff_min, self.backoff_max).honouring_retry_after();
        loop {
            let settings = SyncSettings::new().timeout(SYNC_TIMEOUT).filter(filter());
            let settings = match &token {
                Some(t) => settings.token(SyncToken::Specific(t.clone())),
                None => settings.token(SyncToken::NoToken),
            };
            let synced = tokio::select! {
                _ = stop.cancelled() => return,
                r = self.client.sdk.sync_once(settings) => r,
            };
            let wait = match synced {
                Ok(resp) => {
                    self.synced_ok();
                    backoff.reset();
                    // The first sync (no token yet) brings history: only invites are taken.
                    let history = token.is_none();
                    match self.handle(&resp, history, &mut too_big).await {
                        Ok(()) => {
                            self.tokens.save(&resp.next_batch).await;
                            token = Some(resp.next_batch);
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "matrix: an event was not taken; syncing again from the saved token");
                            backoff.next_delay()
                        }
                    }
                }
                Err(e) => self.failed(MxError::from(e), &mut backoff),
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    fn synced_ok(&self) {
        let was = self.health.borrow().state;
        if was == SyncState::Unauthorized {
            tracing::info!("matrix: the homeserver accepts the token again");
        }
        self.health.send_modify(|h| {
            h.state = SyncState::Ok;
            h.healthy = true;
            h.alert = None;
            h.last_sync_ok_at = Some(Utc::now());
            h.consecutive_errors = 0;
        });
    }

    /// A failed sync: logged and in the health; how long to wait.
    fn failed(&self, e: MxError, backoff: &mut Backoff) -> Duration {
        let token_env = self.live.get().matrix.token_env.clone();
        let wait = match &e {
            MxError::Unauthorized(_) => {
                if self.health.borrow().state != SyncState::Unauthorized {
                    tracing::error!(
                        token_env = %token_env,
                        "ALERT: the Matrix homeserver refused the access token (M_UNKNOWN_TOKEN); set a valid token in {token_env} and restart; syncing keeps retrying"
                    );
                }
                self.backoff_max
            }
            MxError::Retry { after, error } => {
                let d = backoff.next_delay_after(*after);
                tracing::warn!(error = %error, retry_in_ms = d.as_millis() as u64, "matrix: sync failed; backing off");
                d
            }
            MxError::Fatal(error) => {
                let d = backoff.next_delay();
                tracing::warn!(error = %error, retry_in_ms = d.as_millis() as u64, "matrix: sync refused; backing off");
                d
            }
        };
        let unauthorized = matches!(e, MxError::Unauthorized(_));
        self.health.send_modify(|h| {
            h.healthy = false;
            h.state = if unauthorized { SyncState::Unauthorized } else { SyncState::Retrying };
            h.alert = unauthorized.then(|| {
                format!("the Matrix homeserver refused the access token: set a valid token in {token_env} and restart")
            });
            h.consecutive_errors = h.consecutive_errors.saturating_add(1);
            h.last_error = Some(e.to_string());
        });
        wait
    }

    /// Invites, rooms over `max_room_members` left, then every other room's events in order.
    /// `too_big` holds the rooms already logged as too big.
    async fn handle(
        &self,
        resp: &matrix_sdk::sync::SyncResponse,
        history: bool,
        too_big: &mut HashSet<String>,
    ) -> Result<(), String> {
        let cfg = self.live.get();
        // Every pending invite of the store, not only this response's: an invite left over
        // from a flood does not come again in a later response.
        let invites = self.client.sdk.invited_rooms();
        for room in invites.iter().take(MAX_INVITES_PER_SYNC) {
            self.invite(room.room_id().as_str()).await;
        }
        if invites.len() > MAX_INVITES_PER_SYNC {
            tracing::warn!(
                invites = invites.len(),
                "matrix: more invites than handled per sync; the rest wait for the next"
            );
        }
        let mut left = HashSet::new();
        for room_id in resp.rooms.joined.keys() {
            if self
                .leave_if_too_big(room_id.as_str(), cfg.matrix.max_room_members, too_big)
                .await
            {
                left.insert(room_id.as_str());
            }
        }
        if history {
            return Ok(());
        }
        let me = self.client.user_id.as_str();
        for (room_id, update) in &resp.rooms.joined {
            let room_id = room_id.as_str();
            if left.contains(room_id) {
                continue;
            }
            if update.timeline.limited {
                tracing::warn!(room = %room_id, "matrix: more events than one sync holds; older ones of this gap are not read");
            }
            let mut events = Vec::new();
            for te in &update.timeline.events {
                let undecryptable = matches!(te.kind, TimelineEventKind::UnableToDecrypt { .. });
                let Ok(json) = te
                    .kind
                    .raw()
                    .deserialize_as_unchecked::<serde_json::Value>()
                else {
                    continue;
                };
                let Some(ev) = read(&json, undecryptable) else {
                    continue;
                };
                if ev.sender == me {
                    continue;
                }
                if !allowed(&ev.sender, &cfg.matrix) || !room_allowed(room_id, &cfg.matrix) {
                    tracing::info!(sender = %ev.sender, room = %room_id, "matrix: event of a user not in allow_from (or a room not in rooms) ignored");
                    continue;
                }
                events.push(ev);
            }
            for ev in fold_edits(events) {
                self.sink.event(room_id, ev).await?;
            }
        }
        Ok(())
    }

    /// Leave `room_id` when it has more joined members than `max` (logged once per room, in
    /// `logged`); whether it was too big.
    async fn leave_if_too_big(
        &self,
        room_id: &str,
        max: usize,
        logged: &mut HashSet<String>,
    ) -> bool {
        let Ok(room) = self.client.room(room_id) else {
            return false;
        };
        let members = room.joined_members_count();
        if !room_too_big(members, max) {
            return false;
        }
        if logged.insert(room_id.to_string()) {
            tracing::warn!(
                room = %room_id,
                members,
                max_room_members = max,
                "matrix: a room with {members} joined members, over [matrix] max_room_members = {max}, is left and not answered in (every member's devices would get its keys); raise max_room_members to {members} to stay in rooms this size"
            );
        }
        if let Err(e) = room.leave().await {
            tracing::warn!(room = %room_id, error = %e, "matrix: cannot leave a room");
        }
        true
    }

    /// Join an allowed user's invite; decline anyone else's.
    async fn invite(&self, room_id: &str) {
        let Ok(room) = self.client.room(room_id) else {
            return;
        };
        let inviter = match room.invite_details().await {
            Ok(d) => Some(d.inviter_id.to_string()),
            Err(e) => {
                tracing::warn!(room = %room_id, error = %e, "matrix: cannot read an invite");
                return;
            }
        };
        let cfg = self.live.get();
        let ok = inviter.as_deref().is_some_and(|u| allowed(u, &cfg.matrix))
            && room_allowed(room_id, &cfg.matrix);
        let inviter = inviter.unwrap_or_else(|| "an unknown user".into());
        if ok {
            match room.join().await {
                Ok(()) => {
                    tracing::info!(room = %room_id, inviter = %inviter, "matrix: joined on an invite")
                }
                Err(e) => tracing::warn!(room = %room_id, error = %e, "matrix: cannot join"),
            }
        } else {
            tracing::warn!(room = %room_id, inviter = %inviter, "matrix: invite from a user not in allow_from (or a room not in rooms) declined");
            if let Err(e) = room.leave().await {
                tracing::warn!(room = %room_id, error = %e, "matrix: cannot decline an invite");
            }
        }
    }
}

/// Whether a room of `joined` members is over the bound `max` (`[matrix] max_room_members`):
/// then the bot leaves it. An unknown count (0) is not.
pub fn room_too_big(joined: u64, max: usize) -> bool {
    joined > max as u64
}

/// Edits of a message of the same batch replace its text before it is handed on (it is not
/// processed yet); other edits stay, to be taken as new messages.
pub fn fold_edits(events: Vec<MxEvent>) -> Vec<MxEvent> {
    let mut out: Vec<MxEvent> = Vec::with_capacity(events.len());
    for ev in events {
        if let Kind::Text {
            edit_of: Some(orig),
            text: new,
            ..
        } = &ev.kind
            && let Some(Kind::Text { text, .. }) = out
                .iter_mut()
                .find(|e| &e.event_id == orig && e.sender == ev.sender)
                .map(|e| &mut e.kind)
        {
            *text = new.clone();
            continue;
        }
        out.push(ev);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(id: &str, t: &str, edit_of: Option<&str>) -> MxEvent {
        MxEvent {
            event_id: id.into(),
            sender: "@a:x".into(),
            kind: Kind::Text {
                text: t.into(),
                edit_of: edit_of.map(str::to_string),
                reply_to: None,
                quoted: None,
            },
        }
    }

    #[test]
    fn rooms_over_the_member_bound_are_left() {
        assert!(!room_too_big(2, 2), "a direct chat at the smallest bound");
        assert!(room_too_big(3, 2));
        assert!(!room_too_big(100, 100));
        assert!(room_too_big(10_000, 100));
        assert!(!room_too_big(0, 2), "an unknown count leaves nothing");
    }

    #[test]
    fn members_are_lazy_loaded() {
        let Filter::FilterDefinition(def) = filter() else {
            panic!("a filter definition");
        };
        assert!(!def.room.state.lazy_load_options.is_disabled());
        assert!(!def.room.timeline.lazy_load_options.is_disabled());
    }

    #[test]
    fn an_edit_replaces_an_unprocessed_message_else_stays_new() {
        let out = fold_edits(vec![
            text("$1", "helo", None),
            text("$2", "hello", Some("$1")),
        ]);
        assert_eq!(out, vec![text("$1", "hello", None)]);
        let out = fold_edits(vec![text("$2", "hello", Some("$0"))]);
        assert_eq!(out.len(), 1, "an edit of an earlier batch is a new message");
        let mut other = text("$3", "hijack", Some("$1"));
        other.sender = "@b:x".into();
        let out = fold_edits(vec![text("$1", "mine", None), other]);
        assert_eq!(out.len(), 2, "only the sender edits its own message");
    }
}
