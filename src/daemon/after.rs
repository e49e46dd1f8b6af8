//! The steps after a message (SPEC §5.2, §5.5, §10.2): deliver the reply through the outbox
//! (§16.1: intent, attempt/sent per part, retries, done/failed/unknown), count it, send the webhook, tell whoever waits for it. (The compaction check and
//! the snapshot follow, in the worker, once all of this is out.)

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::delivery::{Address, Outbound, Progress};
use crate::agent::{Finish, Work};
use crate::channels::intake::{Completion, reply_text};
use crate::metrics::{Metrics, Outcome};
use crate::session::{DeliveryStatus, SessionHandle};

/// Who waits for which intake id (HTTP `/chat`, the compatible endpoints, `agentd chat`).
/// Several may wait for one id: a client's retry with the same `Idempotency-Key` (SPEC §17)
/// waits beside the first request. A waiter or stream may be bound to a session key: it is
/// then told only about that session's message, so the same id used in another session (a
/// client reusing an `Idempotency-Key`) never hands it another session's answer.
#[derive(Default)]
pub struct Waiters(
    std::sync::Mutex<HashMap<String, Vec<Waiter>>>,
    /// Streamed answers (SPEC §17) by intake id, with their session key: the worker hands the
    /// sink to the agent.
    std::sync::Mutex<HashMap<String, (String, crate::llm::DeltaSink)>>,
);

/// One waiter: the session it waits in (`None`: any), and where to tell it.
struct Waiter {
    key: Option<String>,
    tx: oneshot::Sender<Completion>,
}

impl Waiter {
    fn of(&self, key: &str) -> bool {
        self.key.as_deref().is_none_or(|k| k == key)
    }
}

impl Waiters {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Waiter>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Be told when intake `id` is done, in session `key` only when given. Register before
    /// submitting. Waiters that gave up (their receiver dropped) are swept here, so the map
    /// stays bounded by the waiting ones.
    pub fn wait_for(&self, key: Option<&str>, id: &str) -> oneshot::Receiver<Completion> {
        let (tx, rx) = oneshot::channel();
        let mut map = self.map();
        let list = map.entry(id.to_string()).or_default();
        list.retain(|w| !w.tx.is_closed());
        list.push(Waiter {
            key: key.map(str::to_string),
            tx,
        });
        rx
    }

    /// Drop the waiters of `id` in session `key` (and the unbound ones) whose message was
    /// never accepted, or was answered already.
    pub fn forget(&self, key: &str, id: &str) {
        let mut map = self.map();
        if let Some(list) = map.get_mut(id) {
            list.retain(|w| !w.of(key));
            if list.is_empty() {
                map.remove(id);
            }
        }
        drop(map);
        let mut streams = self.streams();
        if streams.get(id).is_some_and(|(k, _)| k == key) {
            streams.remove(id);
        }
    }

    fn streams(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, (String, crate::llm::DeltaSink)>> {
        self.1.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stream the answer to intake `id` of session `key` into `sink` while it is made (a
    /// later sink for the same id replaces it). Removed when the message is done.
    pub fn stream_to(&self, key: &str, id: &str, sink: crate::llm::DeltaSink) {
        let mut streams = self.streams();
        streams.retain(|_, (_, s)| !s.is_closed());
        streams.insert(id.to_string(), (key.to_string(), sink));
    }

    /// The sink of a streamed answer to any of `ids` of session `key`.
    pub fn stream_of(&self, key: &str, ids: &[String]) -> Option<crate::llm::DeltaSink> {
        let streams = self.streams();
        ids.iter().find_map(|id| {
            streams
                .get(id)
                .filter(|(k, _)| k == key)
                .map(|(_, s)| s.clone())
        })
    }

    /// Tell whoever waits for these intake ids of session `key` (also on `Cancelled`, so they
    /// stop waiting). Waiters bound to another session stay.
    pub fn complete(&self, key: &str, ids: &[String], c: Completion) {
        let mut streams = self.streams();
        for id in ids {
            if streams.get(id).is_some_and(|(k, _)| k == key) {
                streams.remove(id);
            }
        }
        drop(streams);
        let mut waiters = self.map();
        for id in ids {
            let Some(list) = waiters.remove(id) else {
                continue;
            };
            let (ours, others): (Vec<Waiter>, Vec<Waiter>) =
                list.into_iter().partition(|w| w.of(key));
            for w in ours {
                let _ = w.tx.send(c.clone());
            }
            if !others.is_empty() {
                waiters.insert(id.clone(), others);
            }
        }
    }
}

/// The reply's way out.
pub struct AfterMessage {
    /// Where replies go (the router over the chat channels), when one runs.
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
    /// Spoken replies (SPEC §19, `[voice] reply`): the speaker, when `tts_model` is set.
    pub speaker: Option<Arc<crate::tools::tts::Speaker>>,
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
    /// Woken whenever a lane runs dry ([`Lanes::drained`]).
    dry: tokio::sync::Notify,
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
            drop(map);
            self.dry.notify_waiters();
        }
    }

    /// Sessions with a delivery queued or in flight.
    pub fn busy(&self) -> usize {
        self.map().len()
    }

    /// Whether `session` has a delivery queued or in flight.
    pub fn is_busy(&self, session: &str) -> bool {
        self.map().contains_key(session)
    }

    /// Returns once `session` has no delivery queued or in flight. (Its worker calls this
    /// before archiving it, and only that worker makes its replies, so none joins meanwhile.)
    pub async fn drained(&self, session: &str) {
        loop {
            let dry = self.dry.notified();
            tokio::pin!(dry);
            // Registered before the check, so a lane running dry in between is not missed.
            dry.as_mut().enable();
            if !self.is_busy(session) {
                return;
            }
            dry.await;
        }
    }
}

impl AfterMessage {
    /// Deliver, count, call the webhook, complete the waiters — in that order.
    /// `show_fallback` (`[behavior] show_fallback`): a reply a fallback model gave ends with
    /// [`fallback_line`] (SPEC §18.3).
    pub async fn reply_out(
        &self,
        session: &Arc<SessionHandle>,
        work: &Work,
        target: Option<&Address>,
        finish: Finish,
        started: Instant,
        show_fallback: bool,
    ) {
        if let (Some(target), Some(text)) = (target, reply_text(&finish)) {
            let window = self.retry.window_from(Instant::now());
            let text = match fallback_line(&finish).filter(|_| show_fallback) {
                Some(line) => format!("{text}\n\n{line}"),
                None => text.to_string(),
            };
            self.deliver(session, target, work.ids(), text, None, window, None);
        }
        if let (
            Some(target),
            Finish::Reply {
                text,
                silent: false,
                ..
            },
        ) = (target, &finish)
            && self.speaks(work)
        {
            let window = self.retry.window_from(Instant::now());
            self.deliver_voice(session, target, work.ids(), text.clone(), window);
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
            &session.key,
            &work.ids(),
            Completion {
                session_id: session.id.clone(),
                finish,
            },
        );
    }

    /// Queue a delivery (a new reply, or with `resume` one a restart left open) on the
    /// session's lane; it runs in the background (see [`Lanes`]). `window`: until when it is
    /// retried, counted from when the reply was recorded ([`RetryPolicy::window_from`]). With a
    /// `gate` it takes its place on the lane now but starts only once the gate is cancelled
    /// (deliveries a restart left open: queued before any new reply, sent after READY).
    #[allow(clippy::too_many_arguments)]
    pub fn deliver(
        &self,
        session: &Arc<SessionHandle>,
        target: &Address,
        ids: Vec<String>,
        text: String,
        resume: Option<Progress>,
        window: Window,
        gate: Option<CancellationToken>,
    ) {
        let Some(d) = self.outbound.clone() else {
            return;
        };
        let (prev, n, done) = self.lanes.join(&session.id);
        let (session, target, retry) = (session.clone(), target.clone(), self.retry.clone());
        let (lanes, stats) = (self.lanes.clone(), self.stats.clone());
        stats.queued();
        self.tracker.spawn(async move {
            let opened = match gate {
                None => true,
                Some(g) => tokio::select! {
                    _ = g.cancelled() => true,
                    _ = retry.abort.cancelled() => false,
                },
            };
            if let Some(prev) = prev {
                let _ = prev.await;
            }
            let status = match opened {
                true => {
                    deliver_recorded(
                        &session,
                        d.as_ref(),
                        &target,
                        &ids,
                        &text,
                        &retry,
                        window,
                        resume.as_ref(),
                    )
                    .await
                }
                false => None,
            };
            stats.over(status);
            lanes.leave(&session.id, n);
            let _ = done.send(());
        });
    }

    /// Whether the reply to `work` is also spoken (SPEC §19): `reply = "always"`, or
    /// `"mirror"` and the message was a transcribed voice note.
    fn speaks(&self, work: &Work) -> bool {
        use crate::config::VoiceReply;
        let Some(speaker) = &self.speaker else {
            return false;
        };
        match speaker.cfg.reply {
            VoiceReply::Off => false,
            VoiceReply::Always => true,
            VoiceReply::Mirror => work.intakes.iter().any(|i| is_voice_note(&i.text)),
        }
    }

    /// Speak `text` and send it as a voice note to `target`, on the session's lane after the
    /// text (which has gone or is going out whatever happens here). Recorded in the outbox
    /// under `<first id>:voice`; a failed synthesis is logged and nothing more is sent.
    fn deliver_voice(
        &self,
        session: &Arc<SessionHandle>,
        target: &Address,
        ids: Vec<String>,
        text: String,
        window: Window,
    ) {
        let (Some(d), Some(speaker)) = (self.outbound.clone(), self.speaker.clone()) else {
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
            let spoken = speakable(&text, speaker.cfg.max_tts_chars);
            let made = tokio::select! {
                made = speaker.speak(&session.id, &spoken, None) => Some(made),
                _ = retry.abort.cancelled() => None,
            };
            let status = match made {
                Some(Ok(path)) => {
                    let ids = vec![format!("{}:voice", ids.first().map_or("", String::as_str))];
                    let outbox = Outbox {
                        session: &session,
                        out: d.as_ref(),
                        target: &target,
                        ids: &ids,
                        window,
                        abort: &retry.abort,
                    };
                    let piece = Piece::File {
                        path,
                        kind: crate::tools::outbound::FileKind::Voice,
                    };
                    outbox.deliver(&[piece], None, None).await.status
                }
                Some(Err(e)) => {
                    tracing::warn!(session = %session.id, error = %e, "the spoken reply was not made; the text was sent");
                    Some(DeliveryStatus::Failed)
                }
                None => None,
            };
            stats.over(status);
            lanes.leave(&session.id, n);
            let _ = done.send(());
        });
    }

    /// "typing…" on `target` until the returned token is cancelled (when enabled).
    pub fn typing(&self, target: Option<&Address>, enabled: bool) -> Option<CancellationToken> {
        match (target, &self.outbound) {
            (Some(t), Some(d)) if enabled => Some(spawn_typing(d.clone(), t.clone())),
            _ => None,
        }
    }
}

/// Whether a message text carries a transcribed voice note (`[voice note m:ss] …`, SPEC §19).
pub fn is_voice_note(text: &str) -> bool {
    text.lines().any(|l| {
        l.strip_prefix("[voice note ")
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
            || l.starts_with("[voice note] ")
    })
}

/// `text` cut to at most `max` characters for speech, at the last sentence end within the
/// limit when there is one.
fn speakable(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let cut: String = text.chars().take(max).collect();
    match cut.rfind(['.', '!', '?', '\n']) {
        Some(at) if at > 0 => cut[..=at].to_string(),
        _ => cut,
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

pub use crate::tools::outbound::RetryPolicy;
use crate::tools::outbound::{Outbox, Piece, Window};

/// Deliver the reply `text` through the outbox (SPEC §16.1; `tools::outbound::Outbox`): split
/// into the channel's parts, recorded under the reply's intake ids. With `resume`, parts
/// already `sent` or `attempt`ed are skipped and no new intent is written; when a part was
/// attempted without `sent`, the person is told after the rest that it may be missing.
#[allow(clippy::too_many_arguments)]
pub async fn deliver_recorded(
    session: &Arc<SessionHandle>,
    d: &dyn Outbound,
    target: &Address,
    ids: &[String],
    text: &str,
    policy: &RetryPolicy,
    window: Window,
    resume: Option<&Progress>,
) -> Option<DeliveryStatus> {
    let parts = d.parts(target, text);
    let outbox = Outbox {
        session,
        out: d,
        target,
        ids,
        window,
        abort: &policy.abort,
    };
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
        outbox
            .write(DeliveryStatus::Unknown, Some(detail), None, None)
            .await;
        return Some(DeliveryStatus::Unknown);
    }
    let notice = resume.and_then(|p| missing_notice(p, parts.len()));
    let pieces: Vec<Piece> = parts.into_iter().map(Piece::Text).collect();
    outbox
        .deliver(&pieces, resume, notice.as_deref())
        .await
        .status
}

/// What the person is told when a restart left parts of a reply attempted without `sent`:
/// those are never sent again (at most once), so they may be missing.
fn missing_notice(p: &Progress, parts: usize) -> Option<String> {
    let lost: Vec<String> = (p.attempted.iter())
        .filter(|i| **i < parts)
        .map(|i| (i + 1).to_string())
        .collect();
    match lost.len() {
        0 => None,
        1 => Some(format!(
            "(agentd restarted while sending the reply above: part {} of {parts} may be missing.)",
            lost[0]
        )),
        _ => Some(format!(
            "(agentd restarted while sending the reply above: parts {} of {parts} may be missing.)",
            lost.join(", ")
        )),
    }
}

/// "typing…" every 4 s until the returned token is cancelled.
fn spawn_typing(d: Arc<dyn Outbound>, target: Address) -> CancellationToken {
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

/// The one short line that ends a channel reply a fallback model gave (SPEC §18.3): which
/// model answered, and for which.
pub fn fallback_line(finish: &Finish) -> Option<String> {
    match finish {
        Finish::Reply {
            fallback: Some(f),
            silent: false,
            ..
        } => Some(format!(
            "— answered by {} ({} was unavailable)",
            f.to, f.from
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Telegram line of a fallback answer names both models; a silent reply, a failure or
    /// an answer by the model asked for has none (SPEC §18.3).
    #[test]
    fn only_a_fallback_reply_gets_the_line() {
        let reply = |fallback| Finish::Reply {
            text: "hi".into(),
            silent: false,
            usage: Default::default(),
            cost_usd: 0.0,
            truncated: false,
            fallback,
            client_calls: vec![],
        };
        let fell = crate::llm::FellBack {
            from: "primary".into(),
            to: "backup".into(),
            reason: "provider returned 529".into(),
        };
        assert_eq!(
            fallback_line(&reply(Some(fell.clone()))).as_deref(),
            Some("— answered by backup (primary was unavailable)")
        );
        assert_eq!(fallback_line(&reply(None)), None);
        let mut silent = reply(Some(fell));
        if let Finish::Reply { silent: s, .. } = &mut silent {
            *s = true;
        }
        assert_eq!(fallback_line(&silent), None);
    }

    fn w(policy: &RetryPolicy) -> Window {
        policy.window_from(Instant::now())
    }

    /// Splits text into parts of `size` characters and counts the parts it is asked to send.
    struct Chunks {
        size: usize,
        sent: std::sync::Mutex<Vec<String>>,
        /// Answer every send with a flood wait this long instead.
        flood: Option<Duration>,
        /// Answer this many sends with a retryable error first.
        fail: std::sync::atomic::AtomicUsize,
        /// Every try, failed ones included.
        tries: std::sync::atomic::AtomicUsize,
        /// Whether its sends are idempotent by the send key (as Matrix's), and the keys seen.
        idempotent: bool,
        keys: std::sync::Mutex<Vec<Option<String>>>,
    }

    fn chunks(size: usize) -> Chunks {
        Chunks {
            size,
            sent: Default::default(),
            flood: None,
            fail: Default::default(),
            tries: Default::default(),
            idempotent: false,
            keys: Default::default(),
        }
    }

    impl Outbound for Chunks {
        fn parts(&self, _to: &Address, text: &str) -> Vec<String> {
            let chars: Vec<char> = text.chars().collect();
            chars
                .chunks(self.size)
                .map(|c| c.iter().collect())
                .collect()
        }
        fn send_part<'a>(
            &'a self,
            _to: &'a Address,
            part: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<(), crate::tools::outbound::PartError>> {
            use std::sync::atomic::Ordering::SeqCst;
            self.tries.fetch_add(1, SeqCst);
            if self
                .fail
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let error = "502".to_string();
                return Box::pin(async move {
                    Err(crate::tools::outbound::PartError::Retry { after: None, error })
                });
            }
            if let Some(after) = self.flood {
                let error = "flood".to_string();
                let after = Some(after);
                return Box::pin(async move {
                    Err(crate::tools::outbound::PartError::Retry { after, error })
                });
            }
            self.sent.lock().unwrap().push(part.to_string());
            Box::pin(async {
                // Inside the future: the key is scoped around its polling.
                let key = crate::tools::outbound::send_key();
                self.keys.lock().unwrap().push(key);
                Ok(())
            })
        }
        fn send_file<'a>(
            &'a self,
            _to: &'a Address,
            _path: &'a std::path::Path,
            _kind: crate::tools::outbound::FileKind,
        ) -> futures::future::BoxFuture<'a, Result<(), crate::tools::outbound::PartError>> {
            unreachable!()
        }
        fn react<'a>(
            &'a self,
            _to: &'a Address,
            _message: &'a str,
            _emoji: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<(), crate::tools::outbound::PartError>> {
            unreachable!()
        }
        fn attempt_timeout(&self) -> Duration {
            Duration::from_secs(1)
        }
        fn idempotent_sends(&self, _to: &Address) -> bool {
            self.idempotent
        }
        fn typing<'a>(&'a self, _to: &'a Address) -> futures::future::BoxFuture<'a, ()> {
            Box::pin(async {})
        }
    }

    /// A delivery begun as 3 parts whose text now splits into 2 (the chunk limit changed
    /// between the crash and the restart) is not resumed: part 2 of the new split is not the
    /// part 2 that was pending, so resuming could repeat or skip text. It closes `unknown`.
    #[tokio::test]
    async fn a_reply_that_splits_differently_now_is_not_resumed() {
        let d = tempfile::tempdir().unwrap();
        let store = crate::session::SessionStore::open(d.path(), crate::zone::Zone::utc()).unwrap();
        let h = store.get_or_create("k", "primary").unwrap();
        let to = Address::new("telegram", "1");
        let policy = RetryPolicy {
            within: Duration::from_secs(1),
            abort: CancellationToken::new(),
        };
        let begun = Progress {
            sent: [0].into(),
            attempted: Default::default(),
            parts: Some(3),
        };
        let now_two = chunks(3);
        let ids = ["m1".to_string()];
        let status = deliver_recorded(
            &h,
            &now_two,
            &to,
            &ids,
            "abcdef",
            &policy,
            w(&policy),
            Some(&begun),
        )
        .await;
        assert_eq!(status, Some(DeliveryStatus::Unknown));
        assert!(now_two.sent.lock().unwrap().is_empty(), "nothing resent");
        // The same split as at the intent resumes where it stopped.
        let same = chunks(2);
        let status = deliver_recorded(
            &h,
            &same,
            &to,
            &ids,
            "abcdef",
            &policy,
            w(&policy),
            Some(&begun),
        )
        .await;
        assert_eq!(status, Some(DeliveryStatus::Done));
        assert_eq!(*same.sent.lock().unwrap(), ["cd", "ef"]);
    }

    /// A channel that asks for an absurd wait (`retry_after` from a hostile endpoint) fails the
    /// delivery at once instead of overflowing the wait arithmetic.
    #[tokio::test]
    async fn an_absurd_retry_after_fails_the_delivery_without_panicking() {
        let d = tempfile::tempdir().unwrap();
        let store = crate::session::SessionStore::open(d.path(), crate::zone::Zone::utc()).unwrap();
        let h = store.get_or_create("k", "primary").unwrap();
        let policy = RetryPolicy {
            within: Duration::from_secs(60),
            abort: CancellationToken::new(),
        };
        let flooded = Chunks {
            flood: Some(Duration::MAX),
            ..chunks(10)
        };
        let to = Address::new("telegram", "1");
        let status = deliver_recorded(
            &h,
            &flooded,
            &to,
            &["m1".to_string()],
            "hi",
            &policy,
            w(&policy),
            None,
        )
        .await;
        assert_eq!(status, Some(DeliveryStatus::Failed));
    }

    fn session(d: &tempfile::TempDir) -> Arc<SessionHandle> {
        let store = crate::session::SessionStore::open(d.path(), crate::zone::Zone::utc()).unwrap();
        store.get_or_create("k", "primary").unwrap()
    }

    fn statuses(h: &SessionHandle) -> Vec<(DeliveryStatus, Option<usize>)> {
        h.read_trail()
            .unwrap()
            .into_iter()
            .filter_map(|l| match l.event {
                crate::session::Event::Delivery { status, part, .. } => Some((status, part)),
                _ => None,
            })
            .collect()
    }

    /// SPEC §16.1 on restart: a part `attempt`ed without `sent` is skipped (at most once), the
    /// later parts are sent, the person is told a part may be missing, and the delivery closes
    /// `unknown`, naming the part.
    #[tokio::test]
    async fn a_part_attempted_before_a_restart_is_skipped_the_rest_sent_and_the_person_told() {
        let d = tempfile::tempdir().unwrap();
        let h = session(&d);
        let to = Address::new("telegram", "1");
        let policy = RetryPolicy {
            within: Duration::from_secs(1),
            abort: CancellationToken::new(),
        };
        let begun = Progress {
            sent: [0].into(),
            attempted: [1].into(),
            parts: Some(3),
        };
        let out = chunks(2);
        let ids = ["m1".to_string()];
        let status = deliver_recorded(
            &h,
            &out,
            &to,
            &ids,
            "abcdef",
            &policy,
            w(&policy),
            Some(&begun),
        )
        .await;
        assert_eq!(status, Some(DeliveryStatus::Unknown));
        let sent = out.sent.lock().unwrap().clone();
        assert_eq!(sent.len(), 2, "{sent:?}");
        assert_eq!(sent[0], "ef", "part 1 is not sent again, part 2 is");
        assert!(sent[1].contains("part 2 of 3 may be missing"), "{sent:?}");
        use DeliveryStatus::*;
        assert_eq!(
            statuses(&h),
            [
                (Attempt, Some(2)),
                (Sent, Some(2)),
                (Attempt, Some(3)),
                (Sent, Some(3)),
                (Unknown, Some(1))
            ]
        );
        // A second restart after the notice went out sends nothing more.
        let again = Progress {
            sent: [0, 2, 3].into(),
            attempted: [1].into(),
            parts: Some(3),
        };
        let out = chunks(2);
        deliver_recorded(
            &h,
            &out,
            &to,
            &ids,
            "abcdef",
            &policy,
            w(&policy),
            Some(&again),
        )
        .await;
        assert!(out.sent.lock().unwrap().is_empty());
    }

    /// On a channel whose sends are idempotent by the send key (Matrix), a part `attempt`ed
    /// before a restart is sent again with the key it had, so the delivery completes `done`
    /// with no notice; on any other channel (Telegram) it is skipped, at most once.
    #[tokio::test]
    async fn an_attempted_part_is_sent_again_only_where_sends_are_idempotent() {
        let d = tempfile::tempdir().unwrap();
        let h = session(&d);
        let policy = RetryPolicy {
            within: Duration::from_secs(1),
            abort: CancellationToken::new(),
        };
        let begun = Progress {
            sent: [0].into(),
            attempted: [1].into(),
            parts: Some(3),
        };
        let ids = ["m1".to_string()];
        let resume = async |out: &Chunks, channel: &str| {
            let to = Address::new(channel, "1");
            let p = Some(&begun);
            deliver_recorded(&h, out, &to, &ids, "abcdef", &policy, w(&policy), p).await
        };
        let telegram = chunks(2);
        assert_eq!(
            resume(&telegram, "telegram").await,
            Some(DeliveryStatus::Unknown)
        );
        assert_eq!(telegram.sent.lock().unwrap()[0], "ef", "part 1 skipped");
        let matrix = Chunks {
            idempotent: true,
            ..chunks(2)
        };
        assert_eq!(resume(&matrix, "matrix").await, Some(DeliveryStatus::Done));
        assert_eq!(*matrix.sent.lock().unwrap(), ["cd", "ef"], "no notice");
        let key = |i: usize| Some(format!("{}/m1#{i}", h.id));
        assert_eq!(
            *matrix.keys.lock().unwrap(),
            [key(1), key(2)],
            "the same keys"
        );
    }

    /// The retry window counts from when the reply was recorded, not from when its lane
    /// reached it: a reply whose window has passed (queued behind a long retry, or left by a
    /// restart) gets one try, not a fresh window; one inside its window is retried.
    #[tokio::test]
    async fn the_retry_window_counts_from_the_recording() {
        let d = tempfile::tempdir().unwrap();
        let h = session(&d);
        let to = Address::new("telegram", "1");
        let policy = RetryPolicy {
            within: Duration::from_secs(30),
            abort: CancellationToken::new(),
        };
        let ids = ["m1".to_string()];
        let late = chunks(10);
        late.fail.store(1, std::sync::atomic::Ordering::SeqCst);
        let expired = policy.window_aged(Duration::from_secs(31));
        let status = deliver_recorded(&h, &late, &to, &ids, "hi", &policy, expired, None).await;
        assert_eq!(status, Some(DeliveryStatus::Failed));
        assert_eq!(
            late.tries.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one try"
        );
        let fresh = chunks(10);
        fresh.fail.store(1, std::sync::atomic::Ordering::SeqCst);
        let recorded_now = policy.window_aged(Duration::ZERO);
        let ids = ["m2".to_string()];
        let status =
            deliver_recorded(&h, &fresh, &to, &ids, "hi", &policy, recorded_now, None).await;
        assert_eq!(status, Some(DeliveryStatus::Done));
        assert_eq!(
            fresh.tries.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "retried"
        );
    }

    #[tokio::test]
    async fn drained_waits_until_the_sessions_lane_is_dry() {
        let lanes = Arc::new(Lanes::default());
        lanes.drained("s").await;
        let (_, n1, _d1) = lanes.join("s");
        let (_, n2, _d2) = lanes.join("s");
        let waiter = tokio::spawn({
            let lanes = lanes.clone();
            async move { lanes.drained("s").await }
        });
        tokio::task::yield_now().await;
        lanes.leave("s", n1);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "the second delivery is still queued");
        assert!(lanes.is_busy("s"));
        lanes.leave("s", n2);
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("released when the lane ran dry")
            .unwrap();
    }

    /// A delivery queued with a gate (one a restart left open) keeps its place on the lane:
    /// a reply made before the gate opens goes after it.
    #[tokio::test]
    async fn a_gated_delivery_goes_before_a_reply_made_while_it_waits() {
        let d = tempfile::tempdir().unwrap();
        let h = session(&d);
        let out = Arc::new(chunks(100));
        let metrics = Arc::new(Metrics::new());
        let after = AfterMessage {
            outbound: Some(out.clone() as Arc<dyn Outbound>),
            webhook: None,
            metrics: metrics.clone(),
            waiters: Waiters::default(),
            retry: RetryPolicy {
                within: Duration::from_secs(5),
                abort: CancellationToken::new(),
            },
            tracker: TaskTracker::new(),
            lanes: Default::default(),
            stats: Arc::new(DeliveryStats {
                metrics,
                monitor: Arc::new(crate::monitor::Monitor::new(d.path().join("monitor.json"))),
                counts: Default::default(),
            }),
            speaker: None,
        };
        let to = Address::new("telegram", "1");
        let gate = CancellationToken::new();
        let w = after.retry.window_from(Instant::now());
        let resumed = Progress {
            parts: Some(1),
            ..Default::default()
        };
        after.deliver(
            &h,
            &to,
            vec!["old".into()],
            "old reply".into(),
            Some(resumed),
            w,
            Some(gate.clone()),
        );
        after.deliver(
            &h,
            &to,
            vec!["new".into()],
            "new reply".into(),
            None,
            w,
            None,
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            out.sent.lock().unwrap().is_empty(),
            "the new reply waits its turn"
        );
        gate.cancel();
        after.tracker.close();
        tokio::time::timeout(Duration::from_secs(10), after.tracker.wait())
            .await
            .unwrap();
        assert_eq!(*out.sent.lock().unwrap(), ["old reply", "new reply"]);
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
