//! The steps after a message (SPEC §5.2, §5.5, §10.2): deliver the reply through the outbox
//! (§16.1: intent, attempt/sent per part, retries, done/failed/unknown), count it, send the webhook, tell whoever waits for it. (The compaction check and
//! the snapshot follow, in the worker, once all of this is out.)

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::delivery::{Outbound, Progress, Target};
use crate::agent::{Finish, Work};
use crate::channels::intake::{Completion, reply_text};
use crate::metrics::{Metrics, Outcome};
use crate::session::{DeliveryStatus, Event, SessionHandle};

/// Who waits for which intake id (HTTP `/chat`, `agentd chat`).
#[derive(Default)]
pub struct Waiters(std::sync::Mutex<HashMap<String, oneshot::Sender<Completion>>>);

impl Waiters {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<Completion>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Be told when intake `id` is done. Register before submitting.
    pub fn wait_for(&self, id: &str) -> oneshot::Receiver<Completion> {
        let (tx, rx) = oneshot::channel();
        self.map().insert(id.to_string(), tx);
        rx
    }

    /// Drop a waiter whose message was never accepted.
    pub fn forget(&self, id: &str) {
        self.map().remove(id);
    }

    /// Tell whoever waits for these intake ids (also on `Cancelled`, so they stop waiting).
    pub fn complete(&self, ids: &[String], c: Completion) {
        let mut waiters = self.map();
        for id in ids {
            if let Some(tx) = waiters.remove(id) {
                let _ = tx.send(c.clone());
            }
        }
    }
}

/// The reply's way out.
pub struct AfterMessage {
    /// Where replies go (Telegram), when a channel is configured.
    pub outbound: Option<Arc<dyn Outbound>>,
    pub webhook: Option<crate::api::webhook::Webhook>,
    pub metrics: Arc<Metrics>,
    pub waiters: Waiters,
    /// The outbox's retry rule (SPEC §16.1).
    pub retry: RetryPolicy,
    /// Deliveries run as tasks of this tracker (shutdown waits for them; the abort token ends
    /// their retry waits).
    pub tracker: TaskTracker,
    pub lanes: Arc<Lanes>,
    pub stats: Arc<DeliveryStats>,
}

/// Outbox counts in the monitor and `/metrics` (SPEC §16.1): pending now, failed and unknown
/// since the start.
pub struct DeliveryStats {
    pub metrics: Arc<Metrics>,
    pub monitor: Arc<crate::monitor::Monitor>,
    pub counts: std::sync::Mutex<crate::monitor::DeliveryCounts>,
}

impl DeliveryStats {
    fn update(&self, f: impl FnOnce(&mut crate::monitor::DeliveryCounts)) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut c);
        self.monitor.set_deliveries(*c);
    }

    fn queued(&self) {
        self.metrics.delivery_queued();
        self.update(|c| c.pending += 1);
    }

    fn over(&self, status: Option<DeliveryStatus>) {
        let name = status.map(|s| match s {
            DeliveryStatus::Failed => "failed",
            DeliveryStatus::Unknown => "unknown",
            _ => "done",
        });
        self.metrics.delivery_over(name);
        self.update(|c| {
            c.pending = c.pending.saturating_sub(1);
            match status {
                Some(DeliveryStatus::Failed) => c.failed += 1,
                Some(DeliveryStatus::Unknown) => c.unknown += 1,
                _ => {}
            }
        });
    }
}

/// One delivery lane per session: a session's deliveries run one after the other, in the
/// order their replies were made, outside the session's worker — a delivery that retries for
/// minutes does not hold the session's next message. Entries go when their lane runs dry.
#[derive(Default)]
pub struct Lanes {
    map: std::sync::Mutex<HashMap<String, (u64, oneshot::Receiver<()>)>>,
    next: std::sync::atomic::AtomicU64,
}

impl Lanes {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, oneshot::Receiver<()>)>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Join `session`'s lane: the delivery before this one (to wait for), this one's number,
    /// and the sender that tells the next one this one is over.
    fn join(&self, session: &str) -> (Option<oneshot::Receiver<()>>, u64, oneshot::Sender<()>) {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let prev = self
            .map()
            .insert(session.to_string(), (n, rx))
            .map(|(_, rx)| rx);
        (prev, n, tx)
    }

    /// Delivery `n` of `session` is over; the lane goes if no later one joined.
    fn leave(&self, session: &str, n: u64) {
        let mut map = self.map();
        if map.get(session).is_some_and(|(m, _)| *m == n) {
            map.remove(session);
        }
    }

    /// Sessions with a delivery queued or in flight.
    pub fn busy(&self) -> usize {
        self.map().len()
    }
}

impl AfterMessage {
    /// Deliver, count, call the webhook, complete the waiters — in that order.
    pub async fn reply_out(
        &self,
        session: &Arc<SessionHandle>,
        work: &Work,
        target: Option<&Target>,
        finish: Finish,
        started: Instant,
    ) {
        if let (Some(target), Some(text)) = (target, reply_text(&finish)) {
            self.deliver(session, target, work.ids(), text.to_string(), None);
        }
        let source = work.intakes.first().map_or("", |i| i.source.as_str());
        self.metrics
            .message_done(source, outcome(&finish), started.elapsed());
        if let Some(w) = &self.webhook
            && finish != Finish::Cancelled
        {
            w.send(webhook_payload(work, &session.id, &finish));
        }
        self.waiters.complete(
            &work.ids(),
            Completion {
                session_id: session.id.clone(),
                finish,
            },
        );
    }

    /// Queue a delivery (a new reply, or with `resume` one a restart left open) on the
    /// session's lane; it runs in the background (see [`Lanes`]).
    pub fn deliver(
        &self,
        session: &Arc<SessionHandle>,
        target: &Target,
        ids: Vec<String>,
        text: String,
        resume: Option<Progress>,
    ) {
        let Some(d) = self.outbound.clone() else {
            return;
        };
        let (prev, n, done) = self.lanes.join(&session.id);
        let (session, target, retry) = (session.clone(), target.clone(), self.retry.clone());
        let (lanes, stats) = (self.lanes.clone(), self.stats.clone());
        stats.queued();
        self.tracker.spawn(async move {
            if let Some(prev) = prev {
                let _ = prev.await;
            }
            let status = deliver_recorded(
                &session,
                d.as_ref(),
                &target,
                &ids,
                &text,
                &retry,
                resume.as_ref(),
            )
            .await;
            stats.over(status);
            lanes.leave(&session.id, n);
            let _ = done.send(());
        });
    }

    /// "typing…" on `target` until the returned token is cancelled (when enabled).
    pub fn typing(&self, target: Option<&Target>, enabled: bool) -> Option<CancellationToken> {
        match (target, &self.outbound) {
            (Some(t), Some(d)) if enabled => Some(spawn_typing(d.clone(), t.clone())),
            _ => None,
        }
    }
}

fn outcome(finish: &Finish) -> Outcome {
    match finish {
        Finish::Reply { silent: true, .. } => Outcome::Silent,
        Finish::Reply { .. } => Outcome::Reply,
        Finish::Failed { .. } => Outcome::Failed,
        Finish::Cancelled => Outcome::Cancelled,
    }
}

/// Log how a message ended.
pub fn log_finish(session_id: &str, finish: &Finish) {
    match finish {
        Finish::Reply {
            silent,
            usage,
            cost_usd,
            ..
        } => tracing::info!(
            session = %session_id, silent, input = usage.input_tokens, output = usage.output_tokens,
            cache_read = usage.cache_read_tokens, cache_write = usage.cache_write_tokens, cost_usd,
            "message answered"
        ),
        Finish::Failed { error, .. } => {
            tracing::warn!(session = %session_id, %error, "message failed")
        }
        Finish::Cancelled => {
            tracing::info!(session = %session_id, "message interrupted; it resumes after restart")
        }
    }
}

/// How long the outbox keeps retrying a part, and what stops it early (shutdown: the
/// delivery stays open and resumes after the restart).
#[derive(Clone)]
pub struct RetryPolicy {
    pub within: Duration,
    pub abort: CancellationToken,
}

/// First backoff wait; it doubles per try up to [`MAX_BACKOFF`], jittered ±50 %.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

fn jittered(d: Duration) -> Duration {
    d.mul_f64(rand::random_range(0.5..1.5))
}

/// How one part ended.
enum PartEnd {
    Sent,
    /// Closing status and why.
    Closed(DeliveryStatus, String),
    /// Shutdown while waiting to retry: nothing more is recorded.
    Aborted,
}

/// Send one part, retrying what may be retried (SPEC §16.1) until `policy.within` has passed.
async fn send_with_retry(
    d: &dyn Outbound,
    target: &Target,
    part: &str,
    policy: &RetryPolicy,
    session_id: &str,
) -> PartEnd {
    use crate::tools::outbound::PartError;
    let deadline = Instant::now() + policy.within;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let sent = tokio::select! {
            biased;
            // The shutdown deadline: the part stays `attempt`ed without `sent` (never resent).
            _ = policy.abort.cancelled() => return PartEnd::Aborted,
            r = d.send_part(target, part) => r,
        };
        let (after, error) = match sent {
            Ok(()) => return PartEnd::Sent,
            Err(PartError::Unknown(e)) => return PartEnd::Closed(DeliveryStatus::Unknown, e),
            Err(PartError::Failed(e)) => return PartEnd::Closed(DeliveryStatus::Failed, e),
            Err(PartError::Retry { after, error }) => (after, error),
        };
        let wait = match after {
            Some(a) => a.saturating_add(jittered(Duration::from_millis(200))),
            None => jittered(backoff),
        };
        backoff = (backoff * 2).min(MAX_BACKOFF);
        if Instant::now()
            .checked_add(wait)
            .is_none_or(|at| at > deadline)
        {
            return PartEnd::Closed(
                DeliveryStatus::Failed,
                format!(
                    "{error} (gave up after {} s of retries)",
                    policy.within.as_secs()
                ),
            );
        }
        tracing::warn!(session = %session_id, channel = target.channel(), %error,
            retry_in_ms = wait.as_millis() as u64, "delivery failed; retrying");
        tokio::select! {
            _ = policy.abort.cancelled() => return PartEnd::Aborted,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Deliver `text` through the outbox (SPEC §16.1): an `intent` with the number of parts, per
/// part an `attempt` before it is sent and `sent` after the channel accepted it, then `done` —
/// or `failed`/`unknown` at the first part that could not be delivered (later parts are not
/// sent, so the order holds). With `resume`, parts already `sent` or `attempt`ed are skipped
/// and no new intent is written.
pub async fn deliver_recorded(
    session: &Arc<SessionHandle>,
    d: &dyn Outbound,
    target: &Target,
    ids: &[String],
    text: &str,
    policy: &RetryPolicy,
    resume: Option<&Progress>,
) -> Option<DeliveryStatus> {
    let record = |status, detail, parts, part| Event::Delivery {
        reply_to: ids.to_vec(),
        channel: target.channel().to_string(),
        status,
        detail,
        parts,
        part,
    };
    let parts = d.parts(target, text);
    if resume.is_none()
        && let Err(e) = crate::agent::append(
            session,
            record(DeliveryStatus::Intent, None, Some(parts.len()), None),
        )
        .await
    {
        tracing::error!(session = %session.id, error = %e, "cannot record delivery intent; not sending");
        return None;
    }
    if let Some(p) = resume
        && p.parts.is_some_and(|n| n != parts.len())
        && !(p.sent.is_empty() && p.attempted.is_empty())
    {
        // The text splits differently now (`text_chunk_limit` or the format changed since the
        // intent): part i is not the part i that was sent, so resuming could repeat or skip text.
        let detail = format!(
            "the reply splits into {} part(s) now, {} when it was begun; not resumed",
            parts.len(),
            p.parts.unwrap_or_default()
        );
        tracing::warn!(session = %session.id, ?ids, "{detail}");
        let ev = record(DeliveryStatus::Unknown, Some(detail), None, None);
        if let Err(e) = crate::agent::append(session, ev).await {
            tracing::error!(session = %session.id, error = %e, "cannot record the delivery outcome");
        }
        return Some(DeliveryStatus::Unknown);
    }
    let mut close = (DeliveryStatus::Done, None, None);
    for (i, part) in parts.iter().enumerate() {
        if let Some(p) = resume
            && !p.todo(i)
        {
            if !p.sent.contains(&i) {
                tracing::warn!(session = %session.id, part = i, ?ids,
                    "a part was being sent when agentd stopped; not sending it again");
                close = (
                    DeliveryStatus::Unknown,
                    Some(format!("part {i} was being sent when agentd stopped")),
                    Some(i),
                );
            }
            continue;
        }
        if policy.abort.is_cancelled() {
            // Past the shutdown deadline: left open, resumed after the restart.
            return None;
        }
        if let Err(e) = crate::agent::append(
            session,
            record(DeliveryStatus::Attempt, None, None, Some(i)),
        )
        .await
        {
            tracing::error!(session = %session.id, error = %e, "cannot record a delivery attempt; not sending");
            return None;
        }
        match send_with_retry(d, target, part, policy, &session.id).await {
            PartEnd::Sent => {
                if let Err(e) =
                    crate::agent::append(session, record(DeliveryStatus::Sent, None, None, Some(i)))
                        .await
                {
                    tracing::error!(session = %session.id, error = %e, "cannot record a sent part");
                }
            }
            PartEnd::Aborted => return None,
            PartEnd::Closed(status, e) => {
                tracing::warn!(session = %session.id, channel = target.channel(), part = i, error = %e, ?status, "delivery failed");
                close = (status, Some(e), Some(i));
                break;
            }
        }
    }
    let (status, detail, part) = close;
    if let Err(e) = crate::agent::append(session, record(status, detail, None, part)).await {
        tracing::error!(session = %session.id, error = %e, "cannot record delivery outcome");
    }
    Some(status)
}

/// "typing…" every 4 s until the returned token is cancelled.
fn spawn_typing(d: Arc<dyn Outbound>, target: Target) -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        loop {
            d.typing(&target).await;
            tokio::select! {
                _ = t.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(4)) => {}
            }
        }
    });
    token
}

/// The callback body of SPEC §10.2 for a finished message. (`reply` is the model's text even
/// for a silent reply; `silent` says so.)
fn webhook_payload(
    work: &Work,
    session_id: &str,
    finish: &Finish,
) -> crate::api::webhook::WebhookPayload {
    let first = work.intakes.first();
    let (reply, silent, usage) = match finish {
        Finish::Reply {
            text,
            silent,
            usage,
            ..
        } => (text.clone(), *silent, *usage),
        Finish::Failed { reply, .. } => (reply.clone(), false, Default::default()),
        Finish::Cancelled => (String::new(), false, Default::default()),
    };
    crate::api::webhook::WebhookPayload {
        reply,
        session_id: session_id.to_string(),
        sender: first.map(|i| i.from.clone()).unwrap_or_default(),
        source: first.map(|i| i.source.to_string()).unwrap_or_default(),
        silent,
        tokens: (&usage).into(),
        notify_meta: first.and_then(|i| i.notify_meta.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits text into parts of `size` characters and counts the parts it is asked to send.
    struct Chunks {
        size: usize,
        sent: std::sync::Mutex<Vec<String>>,
        /// Answer every send with a flood wait this long instead.
        flood: Option<Duration>,
    }

    impl Outbound for Chunks {
        fn parts(&self, _to: &Target, text: &str) -> Vec<String> {
            let chars: Vec<char> = text.chars().collect();
            chars
                .chunks(self.size)
                .map(|c| c.iter().collect())
                .collect()
        }
        fn send_part<'a>(
            &'a self,
            _to: &'a Target,
            part: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<(), crate::tools::outbound::PartError>> {
            if let Some(after) = self.flood {
                let error = "flood".to_string();
                let after = Some(after);
                return Box::pin(async move {
                    Err(crate::tools::outbound::PartError::Retry { after, error })
                });
            }
            self.sent.lock().unwrap().push(part.to_string());
            Box::pin(async { Ok(()) })
        }
        fn send_text<'a>(
            &'a self,
            _to: &'a Target,
            _text: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<usize, String>> {
            unreachable!()
        }
        fn send_file<'a>(
            &'a self,
            _to: &'a Target,
            _path: &'a std::path::Path,
            _kind: crate::tools::outbound::FileKind,
        ) -> futures::future::BoxFuture<'a, Result<(), String>> {
            unreachable!()
        }
        fn react<'a>(
            &'a self,
            _to: &'a Target,
            _message_id: i32,
            _emoji: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<(), String>> {
            unreachable!()
        }
        fn typing<'a>(&'a self, _to: &'a Target) -> futures::future::BoxFuture<'a, ()> {
            Box::pin(async {})
        }
    }

    /// A delivery begun as 3 parts whose text now splits into 2 (the chunk limit changed
    /// between the crash and the restart) is not resumed: part 2 of the new split is not the
    /// part 2 that was pending, so resuming could repeat or skip text. It closes `unknown`.
    #[tokio::test]
    async fn a_reply_that_splits_differently_now_is_not_resumed() {
        let d = tempfile::tempdir().unwrap();
        let store = crate::session::SessionStore::open(d.path(), chrono_tz::Tz::UTC).unwrap();
        let h = store.get_or_create("k", "primary").unwrap();
        let to = Target::Telegram { chat_id: 1 };
        let policy = RetryPolicy {
            within: Duration::from_secs(1),
            abort: CancellationToken::new(),
        };
        let begun = Progress {
            sent: [0].into(),
            attempted: Default::default(),
            parts: Some(3),
        };
        let now_two = Chunks {
            size: 3,
            sent: Default::default(),
            flood: None,
        };
        let ids = ["m1".to_string()];
        let status =
            deliver_recorded(&h, &now_two, &to, &ids, "abcdef", &policy, Some(&begun)).await;
        assert_eq!(status, Some(DeliveryStatus::Unknown));
        assert!(now_two.sent.lock().unwrap().is_empty(), "nothing resent");
        // The same split as at the intent resumes where it stopped.
        let same = Chunks {
            size: 2,
            sent: Default::default(),
            flood: None,
        };
        let status = deliver_recorded(&h, &same, &to, &ids, "abcdef", &policy, Some(&begun)).await;
        assert_eq!(status, Some(DeliveryStatus::Done));
        assert_eq!(*same.sent.lock().unwrap(), ["cd", "ef"]);
    }

    /// A channel that asks for an absurd wait (`retry_after` from a hostile endpoint) fails the
    /// delivery at once instead of overflowing the wait arithmetic.
    #[tokio::test]
    async fn an_absurd_retry_after_fails_the_delivery_without_panicking() {
        let d = tempfile::tempdir().unwrap();
        let store = crate::session::SessionStore::open(d.path(), chrono_tz::Tz::UTC).unwrap();
        let h = store.get_or_create("k", "primary").unwrap();
        let policy = RetryPolicy {
            within: Duration::from_secs(60),
            abort: CancellationToken::new(),
        };
        let flooded = Chunks {
            size: 10,
            sent: Default::default(),
            flood: Some(Duration::MAX),
        };
        let to = Target::Telegram { chat_id: 1 };
        let status =
            deliver_recorded(&h, &flooded, &to, &["m1".to_string()], "hi", &policy, None).await;
        assert_eq!(status, Some(DeliveryStatus::Failed));
    }

    #[tokio::test]
    async fn lanes_chain_per_session_and_go_when_dry() {
        let lanes = Lanes::default();
        let (p1, n1, done1) = lanes.join("s");
        assert!(p1.is_none());
        let (p2, n2, done2) = lanes.join("s");
        let p2 = p2.expect("the second waits for the first");
        let (p3, _, _) = lanes.join("t");
        assert!(p3.is_none(), "another session has its own lane");
        lanes.leave("s", n1);
        assert_eq!(lanes.busy(), 2, "s still has the second delivery");
        let _ = done1.send(());
        p2.await.expect("released by the first");
        lanes.leave("s", n2);
        let _ = done2.send(());
        assert_eq!(lanes.busy(), 1, "only t is left");
    }
}
