//! The outbound seam and the outbox (SPEC §16.1): what tools and the daemon's reply delivery
//! may do towards people — send text, a file or a voice note, react, show "typing…" — without
//! knowing the channel, and the one retry and recording rule every send follows. Everything
//! is addressed with a neutral [`Address`]; the [`Router`] hands each call to the channel the
//! address names, and [`Contacts`] turns a contact's name into its address. The daemon wires
//! the channels in (`daemon::chat`); tools never import `channels`.
//! Asking a person for an approval is one more action of the seam (`ask_approval`,
//! `settle_approval`; the broker is `tools::approval`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::config::{Config, Live};
pub use crate::message::Address;
use crate::session::{DeliveryStatus, Event, SessionHandle};

/// How a file is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// Shown inline as a photo.
    Photo,
    /// A voice note (`.ogg` Opus).
    Voice,
    /// Sent as a file, unchanged.
    Document,
}

impl FileKind {
    /// The kind a file is sent as, from its extension.
    pub fn for_path(path: &Path) -> FileKind {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("jpg" | "jpeg" | "png" | "webp") => FileKind::Photo,
            Some("ogg" | "oga" | "opus") => FileKind::Voice,
            _ => FileKind::Document,
        }
    }
}

/// Why one part of a reply was not delivered (SPEC §16.1). Texts are one line, no secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartError {
    /// Nothing was delivered; sending again is safe (not before `after`, when given).
    Retry {
        after: Option<std::time::Duration>,
        error: String,
    },
    /// The request was written and its answer lost: the channel may have delivered it.
    Unknown(String),
    /// Refused for good.
    Failed(String),
}

/// Outbound actions on a channel. Every send is one try: the outbox ([`send_with_retry`],
/// [`Outbox`]) decides about retries. Errors are one line, safe to show (no secrets). Message
/// ids are the channel's own, as text (a Telegram message id, a Matrix event id).
pub trait Outbound: Send + Sync {
    /// The parts `text` is sent as (formatted and split as the channel needs), in order.
    fn parts(&self, to: &Address, text: &str) -> Vec<String>;
    /// Send one part of [`Self::parts`] once.
    fn send_part<'a>(
        &'a self,
        to: &'a Address,
        part: &'a str,
    ) -> BoxFuture<'a, Result<(), PartError>>;
    /// Send the file at `path` once.
    fn send_file<'a>(
        &'a self,
        to: &'a Address,
        path: &'a Path,
        kind: FileKind,
    ) -> BoxFuture<'a, Result<(), PartError>>;
    /// React with `emoji` to message `message` of that chat, once.
    fn react<'a>(
        &'a self,
        to: &'a Address,
        message: &'a str,
        emoji: &'a str,
    ) -> BoxFuture<'a, Result<(), PartError>>;
    /// Show "typing…" once (the caller refreshes it); failures are only logged.
    fn typing<'a>(&'a self, to: &'a Address) -> BoxFuture<'a, ()>;
    /// The longest one send may take before the channel gives up on it (its HTTP timeout): a
    /// tool that sends bounds its own timeout by its retry window plus this.
    fn attempt_timeout(&self) -> Duration;
    /// Whether addresses on `channel` can be reached here (the [`Router`]: whether that
    /// channel runs). A single channel's seam reaches its own.
    fn serves(&self, _channel: &str) -> bool {
        true
    }
    /// Whether a repeated send of the same part to `to` with the same [`send_key`] cannot post
    /// twice (the channel derives an idempotency key from it, as Matrix's transaction ids).
    /// Then a part a restart left `attempt`ed without `sent` is sent again; otherwise it never
    /// is (at most once, SPEC §5.2).
    fn idempotent_sends(&self, _to: &Address) -> bool {
        false
    }
    /// Ask for approval `id` (SPEC §18.1) once: `text` with the choices *Approve* / *Always in
    /// this session* / *Deny*. Returns the prompt's message id, which
    /// [`Outbound::settle_approval`] edits. A channel that cannot ask refuses.
    fn ask_approval<'a>(
        &'a self,
        _to: &'a Address,
        _text: &'a str,
        _id: &'a str,
    ) -> BoxFuture<'a, Result<String, PartError>> {
        Box::pin(async {
            Err(PartError::Failed(
                "this channel cannot ask for approvals".into(),
            ))
        })
    }
    /// Replace prompt `message` by `text` (the decision), without its choices; failures are
    /// only logged.
    fn settle_approval<'a>(
        &'a self,
        _to: &'a Address,
        _message: &'a str,
        _text: &'a str,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// The outbound router: one [`Outbound`] per chat channel, keyed by the channel's name. Every
/// call goes to the channel its [`Address`] names; an address on a channel that does not run
/// here fails for good (nothing is sent).
#[derive(Default, Clone)]
pub struct Router {
    channels: BTreeMap<String, Arc<dyn Outbound>>,
}

impl Router {
    /// Route `channel`'s addresses to `out`.
    pub fn add(&mut self, channel: &str, out: Arc<dyn Outbound>) {
        self.channels.insert(channel.to_string(), out);
    }

    /// Whether no channel runs.
    pub fn is_empty(&self) -> bool {
        self.channels.is_empty()
    }

    fn to(&self, to: &Address) -> Result<&Arc<dyn Outbound>, PartError> {
        self.channels.get(&to.channel).ok_or_else(|| {
            PartError::Failed(format!(
                "the {} channel is not running (not enabled in the config)",
                to.channel
            ))
        })
    }
}

impl Outbound for Router {
    fn parts(&self, to: &Address, text: &str) -> Vec<String> {
        match self.to(to) {
            Ok(out) => out.parts(to, text),
            Err(_) => vec![text.to_string()],
        }
    }

    fn send_part<'a>(
        &'a self,
        to: &'a Address,
        part: &'a str,
    ) -> BoxFuture<'a, Result<(), PartError>> {
        match self.to(to) {
            Ok(out) => out.send_part(to, part),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    fn send_file<'a>(
        &'a self,
        to: &'a Address,
        path: &'a Path,
        kind: FileKind,
    ) -> BoxFuture<'a, Result<(), PartError>> {
        match self.to(to) {
            Ok(out) => out.send_file(to, path, kind),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    fn react<'a>(
        &'a self,
        to: &'a Address,
        message: &'a str,
        emoji: &'a str,
    ) -> BoxFuture<'a, Result<(), PartError>> {
        match self.to(to) {
            Ok(out) => out.react(to, message, emoji),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    fn typing<'a>(&'a self, to: &'a Address) -> BoxFuture<'a, ()> {
        match self.to(to) {
            Ok(out) => out.typing(to),
            Err(_) => Box::pin(async {}),
        }
    }

    /// The longest of the channels'.
    fn attempt_timeout(&self) -> Duration {
        let each = self.channels.values().map(|o| o.attempt_timeout());
        each.max().unwrap_or(Duration::ZERO)
    }

    fn serves(&self, channel: &str) -> bool {
        self.channels.contains_key(channel)
    }

    fn idempotent_sends(&self, to: &Address) -> bool {
        self.to(to).is_ok_and(|out| out.idempotent_sends(to))
    }

    fn ask_approval<'a>(
        &'a self,
        to: &'a Address,
        text: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<String, PartError>> {
        match self.to(to) {
            Ok(out) => out.ask_approval(to, text, id),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    fn settle_approval<'a>(
        &'a self,
        to: &'a Address,
        message: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, ()> {
        match self.to(to) {
            Ok(out) => out.settle_approval(to, message, text),
            Err(_) => Box::pin(async {}),
        }
    }
}

/// How one chat channel's config names people and chats, as neutral addresses. The channel's
/// own module provides it (the config keeps each channel's ids in its own form); the daemon
/// lists every channel's once (`daemon::chat`).
#[derive(Clone, Copy)]
pub struct Book {
    /// The address of contact `name` on this channel, if it is one of its contacts.
    pub contact: fn(&Config, &str) -> Option<Address>,
    /// This channel's contact names.
    pub names: fn(&Config) -> Vec<String>,
    /// Where approvals of a message with no chat of its own are offered (SPEC §18.1), if the
    /// config names such a chat on this channel.
    pub approvals: fn(&Config) -> Option<Address>,
    /// Where the cache alarm's notice goes (SPEC §20), if the config names a chat here.
    pub alerts: fn(&Config) -> Option<Address>,
}

/// The contacts of every chat channel (SPEC §5.6): a contact name is a session key and reaches
/// that person on the first channel (in the daemon's list) that knows the name. Read from the
/// running config, so a SIGHUP changes them.
#[derive(Clone)]
pub struct Contacts {
    live: Live,
    books: Arc<[Book]>,
}

impl Contacts {
    pub fn new(live: Live, books: Vec<Book>) -> Contacts {
        Contacts {
            live,
            books: books.into(),
        }
    }

    /// The address of contact `name`.
    pub fn address_of(&self, name: &str) -> Option<Address> {
        let cfg = self.live.get();
        self.books.iter().find_map(|b| (b.contact)(&cfg, name))
    }

    /// Every contact name, sorted, once.
    pub fn names(&self) -> Vec<String> {
        let cfg = self.live.get();
        let all = self.books.iter().flat_map(|b| (b.names)(&cfg));
        all.collect::<BTreeSet<_>>().into_iter().collect()
    }

    /// The chat approvals of messages without one of their own are offered in.
    pub fn approvals_chat(&self) -> Option<Address> {
        let cfg = self.live.get();
        self.books.iter().find_map(|b| (b.approvals)(&cfg))
    }

    /// The chat the cache alarm's notice goes to.
    pub fn alerts_chat(&self) -> Option<Address> {
        let cfg = self.live.get();
        self.books.iter().find_map(|b| (b.alerts)(&cfg))
    }
}

/// One thing the outbox sends: a part of a text, a file, a reaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    File { path: PathBuf, kind: FileKind },
    Reaction { message: String, emoji: String },
}

impl Piece {
    /// One try.
    pub fn send<'a>(
        &'a self,
        d: &'a dyn Outbound,
        to: &'a Address,
    ) -> BoxFuture<'a, Result<(), PartError>> {
        match self {
            Piece::Text(t) => d.send_part(to, t),
            Piece::File { path, kind } => d.send_file(to, path, *kind),
            Piece::Reaction { message, emoji } => d.react(to, message, emoji),
        }
    }
}

/// The outbox's retry rule (SPEC §16.1): `[delivery] retry_minutes`, and what ends retry
/// waits early (the shutdown deadline: the delivery stays open and resumes after a restart).
#[derive(Clone)]
pub struct RetryPolicy {
    pub within: Duration,
    pub abort: CancellationToken,
}

impl RetryPolicy {
    /// The window of a delivery recorded at `recorded`: retries end `within` after the reply
    /// was made, not after its lane reached it (a reply queued behind a retrying one, or
    /// resumed after a restart, does not get a fresh window). Every part still gets a first try.
    pub fn window_from(&self, recorded: Instant) -> Window {
        Window {
            until: recorded.checked_add(self.within).unwrap_or(recorded),
            strict: false,
        }
    }

    /// The window of a delivery recorded `age` ago (a trail line's time after a restart).
    pub fn window_aged(&self, age: Duration) -> Window {
        let now = Instant::now();
        Window {
            until: now
                .checked_add(self.within.saturating_sub(age))
                .unwrap_or(now),
            strict: false,
        }
    }
}

/// Until when a delivery is tried.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// No retry wait ends after this.
    pub until: Instant,
    /// No first try of a part after `until` either (a tool, whose own timeout bounds it).
    pub strict: bool,
}

tokio::task_local! {
    static SEND_KEY: String;
}

/// The key of the delivery part being sent by [`Outbox::deliver`] (its session, intake ids and
/// part number), the same on every try of that part: a channel whose sends are idempotent by a
/// key of the caller's derives it from this (Matrix's transaction ids). `None` outside it.
pub fn send_key() -> Option<String> {
    SEND_KEY.try_with(Clone::clone).ok()
}

/// First backoff wait; it doubles per try up to [`MAX_BACKOFF`], jittered.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// How one part ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartEnd {
    Sent,
    /// Closing status (`failed` or `unknown`) and why.
    Closed(DeliveryStatus, String),
    /// Shutdown while waiting to retry.
    Aborted,
}

/// Send with `send`, retrying what [`PartError::Retry`] allows (connection errors before the
/// request was written, 5xx, 429 after its `retry_after`) with jittered backoff, as long as the
/// wait ends within `until`. `Unknown` (written, answer lost) and `Failed` end it at once. The
/// one retry loop of every outbound send: replies, the `message`/`react` tools, command answers.
pub async fn send_with_retry<'a>(
    mut send: impl FnMut() -> BoxFuture<'a, Result<(), PartError>>,
    until: Instant,
    abort: &CancellationToken,
    what: &str,
) -> PartEnd {
    // A channel's `retry_after` is a minimum: waited in full, bounded by `until` below.
    let mut backoff = Backoff::exponential(FIRST_BACKOFF, MAX_BACKOFF).honouring_retry_after();
    loop {
        let sent = tokio::select! {
            biased;
            _ = abort.cancelled() => return PartEnd::Aborted,
            r = send() => r,
        };
        let (after, error) = match sent {
            Ok(()) => return PartEnd::Sent,
            Err(PartError::Unknown(e)) => return PartEnd::Closed(DeliveryStatus::Unknown, e),
            Err(PartError::Failed(e)) => return PartEnd::Closed(DeliveryStatus::Failed, e),
            Err(PartError::Retry { after, error }) => (after, error),
        };
        let wait = backoff.next_delay_after(after);
        if Instant::now().checked_add(wait).is_none_or(|at| at > until) {
            return PartEnd::Closed(
                DeliveryStatus::Failed,
                format!("{error} (still failing when the retry window ended)"),
            );
        }
        tracing::warn!(%what, %error, retry_in_ms = wait.as_millis() as u64, "send failed; retrying");
        tokio::select! {
            _ = abort.cancelled() => return PartEnd::Aborted,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Send `text` (split as the channel needs) with retries, unrecorded: for answers that need
/// no durability (chat command answers). Returns how many parts went out, or why the
/// first one that did not failed.
pub async fn send_text_with_retry(
    d: &dyn Outbound,
    to: &Address,
    text: &str,
    policy: &RetryPolicy,
) -> Result<usize, String> {
    let window = policy.window_from(Instant::now());
    let mut n = 0;
    for part in d.parts(to, text) {
        match send_with_retry(
            || d.send_part(to, &part),
            window.until,
            &policy.abort,
            "answer",
        )
        .await
        {
            PartEnd::Sent => n += 1,
            PartEnd::Closed(_, e) => return Err(e),
            PartEnd::Aborted => return Err("shutting down".into()),
        }
    }
    Ok(n)
}

/// How far a delivery got, by its `delivery` records (SPEC §16.1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Parts accepted by the channel: skipped on resume.
    pub sent: BTreeSet<usize>,
    /// Parts attempted without a `sent` record: never sent again (at most once, §5.2), unless
    /// the channel's sends are idempotent ([`Outbound::idempotent_sends`]).
    pub attempted: BTreeSet<usize>,
    /// The number of parts the `intent` announced (`None` for a legacy intent).
    pub parts: Option<usize>,
}

impl Progress {
    /// Whether part `i` still needs a send: not `sent`, and not `attempted` unless the
    /// channel's sends are `idempotent` (a repeat with the same send key cannot post twice).
    pub fn todo(&self, i: usize, idempotent: bool) -> bool {
        !self.sent.contains(&i) && (idempotent || !self.attempted.contains(&i))
    }

    /// Fold one `attempt`/`sent` record in.
    pub fn record(&mut self, status: DeliveryStatus, part: Option<usize>) {
        let Some(p) = part else { return };
        match status {
            DeliveryStatus::Attempt => {
                self.attempted.insert(p);
            }
            DeliveryStatus::Sent => {
                self.attempted.remove(&p);
                self.sent.insert(p);
            }
            _ => {}
        }
    }
}

/// How a recorded delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    /// The closing record; `None` when it was left open (shutdown, or a record could not be
    /// written, so nothing more was sent).
    pub status: Option<DeliveryStatus>,
    /// Why it closed `failed`/`unknown`, and at which part.
    pub detail: Option<String>,
    pub at: Option<usize>,
    /// Parts this run delivered.
    pub sent: usize,
    /// Parts an earlier run attempted without a `sent` record: skipped, possibly missing.
    pub uncertain: Vec<usize>,
}

/// One durable delivery (SPEC §16.1) to `target`, recorded in `session`'s trail under `ids`
/// (the reply's intake ids, or a tool send's key).
pub struct Outbox<'a> {
    pub session: &'a Arc<SessionHandle>,
    pub out: &'a dyn Outbound,
    pub target: &'a Address,
    pub ids: &'a [String],
    pub window: Window,
    pub abort: &'a CancellationToken,
}

async fn append(session: &Arc<SessionHandle>, event: Event) -> std::io::Result<()> {
    let s = session.clone();
    tokio::task::spawn_blocking(move || s.append(event))
        .await
        .map_err(std::io::Error::other)?
        .map(|_| ())
}

impl Outbox<'_> {
    fn record(
        &self,
        status: DeliveryStatus,
        detail: Option<String>,
        parts: Option<usize>,
        part: Option<usize>,
    ) -> Event {
        Event::Delivery {
            reply_to: self.ids.to_vec(),
            channel: self.target.channel.clone(),
            status,
            detail,
            parts,
            part,
        }
    }

    /// Write a record; `false` (logged) when it could not be.
    pub async fn write(
        &self,
        status: DeliveryStatus,
        detail: Option<String>,
        parts: Option<usize>,
        part: Option<usize>,
    ) -> bool {
        match append(self.session, self.record(status, detail, parts, part)).await {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(session = %self.session.id, error = %e, ?status, "cannot record a delivery");
                false
            }
        }
    }

    /// Deliver `pieces`: an `intent` with their number (unless resuming), per piece an
    /// `attempt` before it is sent and `sent` after the channel accepted it, then `done` — or
    /// `failed`/`unknown` at the first piece that could not be delivered (later ones are not
    /// sent, so the order holds). With `resume`, pieces already `sent` are skipped and pieces
    /// `attempt`ed without `sent` are never sent again (at most once); the later ones are sent
    /// and the delivery closes `unknown`, naming the skipped piece. On a channel whose sends
    /// are idempotent ([`Outbound::idempotent_sends`]) an `attempt`ed piece is sent again,
    /// with the same send key, so the channel keeps one. When `missing_notice` is
    /// given and a piece was skipped that way, it is sent after the rest (recorded as piece
    /// `pieces.len()`), so the person knows a part may be missing.
    pub async fn deliver(
        &self,
        pieces: &[Piece],
        resume: Option<&Progress>,
        missing_notice: Option<&str>,
    ) -> Delivered {
        let mut out = Delivered {
            status: None,
            detail: None,
            at: None,
            sent: 0,
            uncertain: Vec::new(),
        };
        if resume.is_none()
            && !self
                .write(DeliveryStatus::Intent, None, Some(pieces.len()), None)
                .await
        {
            return out;
        }
        let notice = missing_notice.map(|n| Piece::Text(n.to_string()));
        let idempotent = self.out.idempotent_sends(self.target);
        let mut close = (DeliveryStatus::Done, None, None);
        for i in 0..=pieces.len() {
            let piece = match (pieces.get(i), &notice) {
                (Some(p), _) => p,
                // The notice, only when a piece may be missing and the rest went out.
                (None, Some(n)) if !out.uncertain.is_empty() && close.0 == DeliveryStatus::Done => {
                    n
                }
                (None, _) => break,
            };
            if let Some(p) = resume
                && !p.todo(i, idempotent)
            {
                if !p.sent.contains(&i) && i < pieces.len() {
                    tracing::warn!(session = %self.session.id, part = i, ids = ?self.ids,
                        "a part was being sent when agentd stopped; not sending it again");
                    out.uncertain.push(i);
                    close = (
                        DeliveryStatus::Done,
                        Some(format!("part {i} was being sent when agentd stopped")),
                        Some(i),
                    );
                }
                continue;
            }
            if resume.is_some_and(|p| p.attempted.contains(&i)) {
                tracing::info!(session = %self.session.id, part = i, ids = ?self.ids,
                    "a part was being sent when agentd stopped; sending it again with the same key");
            }
            if self.abort.is_cancelled() {
                // Past the shutdown deadline: left open, resumed after the restart.
                return out;
            }
            if self.window.strict && Instant::now() >= self.window.until {
                close = (
                    DeliveryStatus::Failed,
                    Some("not tried: the time for this send ran out".into()),
                    Some(i),
                );
                break;
            }
            if !self
                .write(DeliveryStatus::Attempt, None, None, Some(i))
                .await
            {
                return out;
            }
            let what = format!("{} delivery to {}", self.session.id, self.target.channel);
            let key = format!("{}/{}#{i}", self.session.id, self.ids.join(","));
            match send_with_retry(
                || Box::pin(SEND_KEY.scope(key.clone(), piece.send(self.out, self.target))),
                self.window.until,
                self.abort,
                &what,
            )
            .await
            {
                PartEnd::Sent => {
                    out.sent += 1;
                    self.write(DeliveryStatus::Sent, None, None, Some(i)).await;
                }
                PartEnd::Aborted => return out,
                PartEnd::Closed(status, e) => {
                    tracing::warn!(session = %self.session.id, channel = %self.target.channel, part = i, error = %e, ?status, "delivery failed");
                    close = (status, Some(e), Some(i));
                    break;
                }
            }
        }
        let (mut status, detail, at) = close;
        if status == DeliveryStatus::Done && !out.uncertain.is_empty() {
            // Everything else went out; the skipped part may or may not have.
            status = DeliveryStatus::Unknown;
        }
        self.write(status, detail.clone(), None, at).await;
        out.status = Some(status);
        out.detail = detail;
        out.at = at;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_kinds_follow_the_extension() {
        assert_eq!(FileKind::for_path(Path::new("a/b.JPG")), FileKind::Photo);
        assert_eq!(FileKind::for_path(Path::new("v.ogg")), FileKind::Voice);
        assert_eq!(FileKind::for_path(Path::new("r.pdf")), FileKind::Document);
        assert_eq!(FileKind::for_path(Path::new("noext")), FileKind::Document);
    }
}
