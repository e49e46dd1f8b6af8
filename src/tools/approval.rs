//! Approvals (SPEC §18.1): tool calls that wait for a person's yes. One more action of the
//! outbound seam: the prompt goes to a chat through [`Outbound::ask_approval`], the decision
//! comes back from whichever front end a person used (a chat's buttons, the HTTP API,
//! `agent-send`) through [`Approvals::decide`].
//!
//! [`Approvals`] is the daemon's one broker: the agent loop opens an approval ([`Approvals::open`])
//! and waits on its [`Ticket`]; the front ends list and decide. The trail records are the
//! agent's (it owns the session's trail while a message runs): an approval here is memory only,
//! so after a crash the resumed message asks again. `state_dir/approvals.json` mirrors the
//! pending ones (and the last decided ids) for `agent-send --approvals`, a live view like
//! `monitor.json`, not data.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde::Serialize;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::outbound::{Address, Contacts, Outbound, PartEnd, send_with_retry};
use crate::config::{ApprovalsConfig, Live};
use crate::latest_writer::LatestWriter;
use crate::session::approval::Decision;

/// At most this many approvals wait at once; one more is denied at once (a model that calls a
/// gated tool in a loop cannot grow the daemon's memory).
pub const MAX_PENDING: usize = 256;

/// Decided ids remembered to tell "already decided" (409) from "unknown" (404).
const MAX_DECIDED: usize = 1024;

/// Longest summary line, in characters.
const MAX_SUMMARY_CHARS: usize = 200;

/// The file name of the live view in the state directory.
pub const APPROVALS_FILE: &str = "approvals.json";

/// One pending approval as the API shows it (SPEC §18.1).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct ApprovalInfo {
    pub id: String,
    pub session_id: String,
    pub key: String,
    pub tool: String,
    pub summary: String,
    pub input: serde_json::Value,
    /// RFC 3339.
    pub created_at: String,
    pub expires_at: String,
}

/// A decision as given: what, by whom, through which channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub decision: Decision,
    pub by: String,
    pub channel: String,
}

/// Why a decision was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    #[error(
        "no approval with id {0:?} is waiting; list them with GET /api/v1/approvals or agent-send --approvals"
    )]
    Unknown(String),
    #[error("approval {id:?} was already decided: {decision}")]
    AlreadyDecided { id: String, decision: &'static str },
}

/// The live view `agent-send --approvals` reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct ApprovalsView {
    pub approvals: Vec<ApprovalInfo>,
    /// Recently decided ids and their decision, newest last.
    #[serde(default)]
    pub decided: Vec<(String, String)>,
}

struct Pending {
    info: ApprovalInfo,
    tx: oneshot::Sender<Verdict>,
    /// The prompt, once sent (its chat and message): edited to show the decision.
    prompt: Option<(Address, String)>,
    /// The chat the prompt is offered in: a press from another chat decides nothing (unless
    /// the presser is one of `[approvals] approvers`).
    chat: Option<Address>,
}

/// A decided approval remembered: its id, the decision, the chat it was offered in.
struct Decided {
    id: String,
    decision: Decision,
    chat: Option<Address>,
}

#[derive(Default)]
struct Inner {
    pending: BTreeMap<String, Pending>,
    decided: VecDeque<Decided>,
}

impl Inner {
    fn decided(&self, id: &str) -> Option<&Decided> {
        self.decided.iter().rev().find(|d| d.id == id)
    }
}

/// The approvals broker. Cheap to share (`Arc`).
pub struct Approvals {
    /// `None` in unit tests: the default `[approvals]`.
    live: Option<Live>,
    inner: Mutex<Inner>,
    /// Where prompts go (the router over the chat channels; none without one).
    outbound: Option<Arc<dyn Outbound>>,
    /// The chat prompts of messages without one of their own go to
    /// ([`Contacts::approvals_chat`]).
    contacts: Option<Contacts>,
    /// Ends prompt retries at shutdown.
    abort: CancellationToken,
    view: Option<(PathBuf, LatestWriter<Vec<u8>>)>,
}

/// An open approval: wait on it with [`Ticket::wait`]; dropping it withdraws the approval.
pub struct Ticket {
    pub id: String,
    rx: oneshot::Receiver<Verdict>,
    broker: Arc<Approvals>,
    done: bool,
}

impl Ticket {
    /// The decision, or `None` when the approval timed out (`until`) or was withdrawn. The
    /// timeout is recorded as decided (`timeout`), so a late answer gets "already decided".
    pub async fn wait(mut self, until: tokio::time::Instant) -> Option<Verdict> {
        let rx = &mut self.rx;
        let got = tokio::time::timeout_at(until, rx).await;
        self.done = true;
        match got {
            Ok(Ok(v)) => Some(v),
            Ok(Err(_)) => None,
            Err(_) => {
                self.broker.close(&self.id, Some(Decision::Timeout));
                None
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            // Cancelled (shutdown, /stop): withdrawn without a decision, asked again later.
            self.broker.close(&self.id, None);
        }
    }
}

impl Approvals {
    /// A broker reading `[approvals]` from `live` per call; `outbound` offers prompts in chats
    /// (a message's own, else the one `contacts` name for approvals); `state_dir` gets the
    /// live view (none in unit tests).
    pub fn new(
        live: Option<Live>,
        outbound: Option<Arc<dyn Outbound>>,
        contacts: Option<Contacts>,
        state_dir: Option<PathBuf>,
        abort: CancellationToken,
    ) -> Arc<Approvals> {
        let view = state_dir.map(|d| {
            let w = LatestWriter::new("agentd-approvals", |path, bytes: &Vec<u8>| {
                if let Err(e) = crate::fsutil::atomic_write_nosync(path, bytes) {
                    tracing::warn!(error = %e, "cannot write approvals.json");
                }
            });
            (d.join(APPROVALS_FILE), w)
        });
        let a = Arc::new(Approvals {
            live,
            inner: Mutex::new(Inner::default()),
            outbound,
            contacts,
            abort,
            view,
        });
        a.publish(&a.lock());
        a
    }

    /// `[approvals]` now.
    pub fn config(&self) -> ApprovalsConfig {
        self.live
            .as_ref()
            .map(|l| l.get().approvals.clone())
            .unwrap_or_default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Open an approval; `None` when [`MAX_PENDING`] already wait (the call is then denied).
    /// What a person is shown of it (the summary, the input, the session key and tool) is
    /// kept with its unseen characters escaped ([`shown`]), for every front end alike.
    pub fn open(self: &Arc<Self>, mut info: ApprovalInfo) -> Option<Ticket> {
        info.summary = shown(&info.summary);
        info.key = shown(&info.key);
        info.tool = shown(&info.tool);
        info.input = shown_json(&info.input);
        let (tx, rx) = oneshot::channel();
        let id = info.id.clone();
        let mut inner = self.lock();
        if inner.pending.len() >= MAX_PENDING {
            return None;
        }
        inner.pending.insert(
            id.clone(),
            Pending {
                info,
                tx,
                prompt: None,
                chat: None,
            },
        );
        self.publish(&inner);
        drop(inner);
        Some(Ticket {
            id,
            rx,
            broker: self.clone(),
            done: false,
        })
    }

    /// Offer approval `id` in `chat` (the message's), else in the chat the config names for
    /// approvals (`[approvals] telegram_chat`), if either runs here; retried until it expires.
    /// The prompt is remembered so that a decision edits it. Runs in the background.
    pub fn offer(self: &Arc<Self>, id: &str, chat: Option<&Address>, until: Instant) {
        let Some(out) = self.outbound.clone() else {
            return;
        };
        let fallback = || self.contacts.as_ref().and_then(Contacts::approvals_chat);
        let Some(to) = chat.cloned().or_else(fallback) else {
            return;
        };
        if !out.serves(&to.channel) {
            return;
        }
        let Some(info) = self.lock().pending.get_mut(id).map(|p| {
            p.chat = Some(to.clone());
            p.info.clone()
        }) else {
            return;
        };
        let me = self.clone();
        tokio::spawn(async move {
            let text = prompt_text(&info);
            let got = Mutex::new(None);
            let end = send_with_retry(
                || {
                    Box::pin(async {
                        let mid = out.ask_approval(&to, &text, &info.id).await?;
                        *got.lock().unwrap_or_else(|e| e.into_inner()) = Some(mid);
                        Ok(())
                    })
                },
                until,
                &me.abort,
                "approval prompt",
            )
            .await;
            let mid = got.lock().unwrap_or_else(|e| e.into_inner()).take();
            match (end, mid) {
                (PartEnd::Sent, Some(mid)) => {
                    let decided = {
                        let mut inner = me.lock();
                        match inner.pending.get_mut(&info.id) {
                            Some(p) => {
                                p.prompt = Some((to.clone(), mid.clone()));
                                None
                            }
                            // Decided while the prompt was on its way: show the decision.
                            None => Some(inner.decided(&info.id).map(|d| d.decision)),
                        }
                    };
                    if let Some(decided) = decided {
                        let text = decided_text(&info, decided);
                        out.settle_approval(&to, &mid, &text).await;
                    }
                }
                (PartEnd::Closed(_, e), _) => {
                    tracing::warn!(approval = %info.id, chat = %to, error = %e, "cannot offer the approval in its chat");
                }
                _ => {}
            }
        });
    }

    /// Decide approval `id`. The waiting call gets the verdict; its prompt in a chat is
    /// edited to show it.
    pub fn decide(&self, id: &str, verdict: Verdict) -> Result<ApprovalInfo, DecideError> {
        let mut inner = self.lock();
        let Some(p) = inner.pending.remove(id) else {
            return Err(match inner.decided(id) {
                Some(d) => DecideError::AlreadyDecided {
                    id: id.to_string(),
                    decision: d.decision.as_str(),
                },
                None => DecideError::Unknown(id.to_string()),
            });
        };
        remember(&mut inner, id, verdict.decision, p.chat);
        self.publish(&inner);
        drop(inner);
        tracing::info!(approval = %id, tool = %p.info.tool, decision = verdict.decision.as_str(), by = %verdict.by, channel = %verdict.channel, "approval decided");
        let decision = verdict.decision;
        // The waiter may be gone (the message was stopped): nothing else to do.
        let _ = p.tx.send(verdict);
        self.settle_prompt(&p.info, p.prompt, Some(decision));
        Ok(p.info)
    }

    /// Whether approval `id` (waiting or decided) was offered in chat `chat`; `None` when the
    /// id is not known (never opened, or forgotten long ago).
    pub fn offered_in(&self, id: &str, chat: &Address) -> Option<bool> {
        let inner = self.lock();
        let offered = match inner.pending.get(id) {
            Some(p) => p.chat.as_ref(),
            None => inner.decided(id)?.chat.as_ref(),
        };
        Some(offered == Some(chat))
    }

    /// Withdraw `id`: decided by the daemon (`Some`: a timeout) or without a decision
    /// (cancelled: asked again after a restart).
    fn close(&self, id: &str, decision: Option<Decision>) {
        let mut inner = self.lock();
        let Some(p) = inner.pending.remove(id) else {
            return;
        };
        if let Some(d) = decision {
            remember(&mut inner, id, d, p.chat);
        }
        self.publish(&inner);
        drop(inner);
        if decision.is_some() || !self.abort.is_cancelled() {
            self.settle_prompt(&p.info, p.prompt, decision);
        }
    }

    fn settle_prompt(
        &self,
        info: &ApprovalInfo,
        prompt: Option<(Address, String)>,
        d: Option<Decision>,
    ) {
        let (Some(out), Some((to, mid))) = (self.outbound.clone(), prompt) else {
            return;
        };
        let text = decided_text(info, d);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { out.settle_approval(&to, &mid, &text).await });
        }
    }

    /// The pending approvals, oldest first.
    pub fn list(&self) -> Vec<ApprovalInfo> {
        let mut v: Vec<ApprovalInfo> = self
            .lock()
            .pending
            .values()
            .map(|p| p.info.clone())
            .collect();
        v.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        v
    }

    /// How many wait (for `/metrics` and the monitor).
    pub fn pending_count(&self) -> usize {
        self.lock().pending.len()
    }

    fn publish(&self, inner: &Inner) {
        let Some((path, writer)) = &self.view else {
            return;
        };
        let mut approvals: Vec<ApprovalInfo> =
            inner.pending.values().map(|p| p.info.clone()).collect();
        approvals.sort_by(|a, b| a.created_at.cmp(&b.created_at));
        let view = ApprovalsView {
            approvals,
            decided: inner
                .decided
                .iter()
                .map(|d| (d.id.clone(), d.decision.as_str().to_string()))
                .collect(),
        };
        if let Ok(bytes) = serde_json::to_vec_pretty(&view) {
            writer.submit(path.clone(), bytes);
        }
    }

    /// Write the live view now (tests, shutdown).
    pub fn flush(&self) {
        if let Some((_, w)) = &self.view {
            w.flush(std::time::Duration::from_secs(2));
        }
    }
}

fn remember(inner: &mut Inner, id: &str, decision: Decision, chat: Option<Address>) {
    if inner.decided.len() >= MAX_DECIDED {
        inner.decided.pop_front();
    }
    inner.decided.push_back(Decided {
        id: id.to_string(),
        decision,
        chat,
    });
}

/// A new approval id: `ap-` and 10 random characters of a small alphabet, easy to type.
pub fn new_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijkmnpqrstuvwxyz23456789";
    let mut s = String::from("ap-");
    for _ in 0..10 {
        s.push(ALPHABET[rand::random_range(0..ALPHABET.len())] as char);
    }
    s
}

/// Whether `id` has the shape of an approval id (checked before a lookup, and in the
/// Telegram callback data, which comes from outside).
pub fn is_valid_id(id: &str) -> bool {
    id.len() <= 32
        && id.starts_with("ap-")
        && id[3..]
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && id.len() > 3
}

/// One line saying what a call does: `exec`'s command, a file tool's path, else the arguments
/// as JSON; unseen characters escaped ([`shown`]), at most [`MAX_SUMMARY_CHARS`] characters,
/// and a cut one ends with `… (cut)`, so a person knows there is more than they read.
pub fn summary(tool: &str, input: &serde_json::Value) -> String {
    let pick = |k: &str| input.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let body = match tool {
        "exec" => pick("command"),
        "write" | "edit" | "read" => pick("path"),
        "web_fetch" => pick("url"),
        _ => None,
    }
    .unwrap_or_else(|| serde_json::to_string(input).unwrap_or_default());
    let line = shown(&format!("{tool}: {body}"));
    if line.chars().count() > MAX_SUMMARY_CHARS {
        let cut: String = line.chars().take(MAX_SUMMARY_CHARS).collect();
        format!("{cut}… (cut)")
    } else {
        line
    }
}

/// Whether `c` is a format character (Unicode general category Cf, Unicode 16): invisible,
/// yet it changes how the text around it is shown — bidi overrides, embeddings and isolates
/// (U+202A–U+202E, U+2066–U+2069), marks (U+200E/F, U+061C), zero-width characters
/// (U+200B–U+200D, U+2060–U+2064), the BOM (U+FEFF), the soft hyphen, tag characters. The
/// table is DerivedGeneralCategory.txt's Cf ranges; a unit test checks known members and
/// neighbours.
pub fn is_format_char(c: char) -> bool {
    const CF: &[(u32, u32)] = &[
        (0x00AD, 0x00AD),
        (0x0600, 0x0605),
        (0x061C, 0x061C),
        (0x06DD, 0x06DD),
        (0x070F, 0x070F),
        (0x0890, 0x0891),
        (0x08E2, 0x08E2),
        (0x180E, 0x180E),
        (0x200B, 0x200F),
        (0x202A, 0x202E),
        (0x2060, 0x2064),
        (0x2066, 0x206F),
        (0xFEFF, 0xFEFF),
        (0xFFF9, 0xFFFB),
        (0x110BD, 0x110BD),
        (0x110CD, 0x110CD),
        (0x13430, 0x1343F),
        (0x1BCA0, 0x1BCA3),
        (0x1D173, 0x1D17A),
        (0xE0001, 0xE0001),
        (0xE0020, 0xE007F),
    ];
    let c = u32::from(c);
    CF.binary_search_by(|&(lo, hi)| {
        if hi < c {
            std::cmp::Ordering::Less
        } else if lo > c {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    })
    .is_ok()
}

/// `text` as a person should see it in an approval: control characters as their escapes
/// (`\n`, `\u{1b}`) and format characters ([`is_format_char`]) as `\u{…}`, so nothing
/// invisible can make the text read otherwise than it runs.
pub fn shown(text: &str) -> String {
    escape_unseen(text, true)
}

/// Format characters of `text` escaped as `\u{…}`; control characters too when `control`.
fn escape_unseen(text: &str, control: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if control && c.is_control() {
            out.extend(c.escape_default());
        } else if is_format_char(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// `value` with the format characters of every string and object key escaped (control
/// characters stay: JSON escapes them already).
fn shown_json(value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(s) => Value::String(escape_unseen(s, false)),
        Value::Array(a) => Value::Array(a.iter().map(shown_json).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (escape_unseen(k, false), shown_json(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The text of a prompt.
pub fn prompt_text(info: &ApprovalInfo) -> String {
    format!(
        "Approval needed ({}) in session {}:\n{}\nExpires {}.",
        info.id, info.key, info.summary, info.expires_at
    )
}

/// The prompt's text once decided (`None`: withdrawn).
pub fn decided_text(info: &ApprovalInfo, d: Option<Decision>) -> String {
    let what = match d {
        Some(Decision::Approve) => "✅ Approved",
        Some(Decision::Always) => "✅ Approved (always in this session)",
        Some(Decision::Deny) => "❌ Denied",
        Some(Decision::Timeout) => "⌛ Timed out (denied)",
        None => "Withdrawn (the message stopped; it asks again when it resumes)",
    };
    format!("{}\n{}: {}", prompt_text(info), what, info.id)
}

/// The error result a denied call gives the model.
pub fn denied_result(tool: &str, d: Decision, why: &str) -> String {
    match d {
        Decision::Timeout => format!(
            "error: approval timed out: nobody approved this call of '{tool}' in time, so it was not run. Do not retry it on your own; tell the user what you wanted to do."
        ),
        _ => format!(
            "error: denied by the user: this call of '{tool}' was not run ({why}). Do not retry it; ask the user how to go on."
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str) -> ApprovalInfo {
        ApprovalInfo {
            id: id.into(),
            session_id: "s".into(),
            key: "k".into(),
            tool: "exec".into(),
            summary: "exec: ls".into(),
            input: serde_json::json!({"command": "ls"}),
            created_at: "2026-01-01T00:00:00Z".into(),
            expires_at: "2026-01-01T00:05:00Z".into(),
        }
    }

    fn broker() -> Arc<Approvals> {
        Approvals::new(None, None, None, None, CancellationToken::new())
    }

    fn verdict(d: Decision) -> Verdict {
        Verdict {
            decision: d,
            by: "t".into(),
            channel: "test".into(),
        }
    }

    #[tokio::test]
    async fn a_decision_reaches_the_waiter_once() {
        let b = broker();
        let t = b.open(info("ap-1")).unwrap();
        assert_eq!(b.list().len(), 1);
        b.decide("ap-1", verdict(Decision::Approve)).unwrap();
        let far = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        assert_eq!(t.wait(far).await.unwrap().decision, Decision::Approve);
        assert_eq!(
            b.decide("ap-1", verdict(Decision::Deny)),
            Err(DecideError::AlreadyDecided {
                id: "ap-1".into(),
                decision: "approve"
            })
        );
        assert!(matches!(
            b.decide("ap-2", verdict(Decision::Deny)),
            Err(DecideError::Unknown(_))
        ));
        assert!(b.list().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_is_recorded_as_decided() {
        let b = broker();
        let t = b.open(info("ap-1")).unwrap();
        let soon = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        assert_eq!(t.wait(soon).await, None);
        assert!(matches!(
            b.decide("ap-1", verdict(Decision::Approve)),
            Err(DecideError::AlreadyDecided {
                decision: "timeout",
                ..
            })
        ));
    }

    #[tokio::test]
    async fn a_dropped_ticket_withdraws_without_a_decision() {
        let b = broker();
        drop(b.open(info("ap-1")).unwrap());
        assert!(b.list().is_empty());
        assert!(matches!(
            b.decide("ap-1", verdict(Decision::Approve)),
            Err(DecideError::Unknown(_))
        ));
    }

    #[test]
    fn pending_approvals_are_bounded() {
        let b = broker();
        let tickets: Vec<_> = (0..MAX_PENDING)
            .map(|i| b.open(info(&format!("ap-{i}"))).unwrap())
            .collect();
        assert!(b.open(info("ap-x")).is_none());
        drop(tickets);
    }

    #[test]
    fn ids_and_summaries() {
        let id = new_id();
        assert!(is_valid_id(&id), "{id}");
        assert!(!is_valid_id("ap-"));
        assert!(!is_valid_id("ap-../x"));
        assert!(!is_valid_id("xx-abc"));
        assert_eq!(
            summary("exec", &serde_json::json!({"command": "rm -rf /tmp/x\nls"})),
            "exec: rm -rf /tmp/x\\nls"
        );
        assert!(summary("mcp__x", &serde_json::json!({"a": "b".repeat(500)})).ends_with("… (cut)"));
    }

    #[test]
    fn format_characters_are_known_and_their_neighbours_are_not() {
        for c in [
            '\u{AD}',
            '\u{600}',
            '\u{61C}',
            '\u{200B}',
            '\u{200D}',
            '\u{200E}',
            '\u{202A}',
            '\u{202E}',
            '\u{2060}',
            '\u{2066}',
            '\u{2069}',
            '\u{FEFF}',
            '\u{FFFB}',
            '\u{1D173}',
            '\u{E0001}',
            '\u{E007F}',
        ] {
            assert!(is_format_char(c), "{c:?} is Cf");
        }
        for c in [
            'a',
            ' ',
            '\u{AC}',
            '\u{AE}',
            '\u{200A}',
            '\u{2010}',
            '\u{2028}',
            '\u{2065}',
            '\u{2070}',
            '\u{FEFE}',
            '\u{FFFC}',
            '\u{E0000}',
            '\u{E0080}',
            '\u{1F600}',
        ] {
            assert!(!is_format_char(c), "{c:?} is not Cf");
        }
    }

    #[tokio::test]
    async fn what_a_person_is_shown_has_no_unseen_characters() {
        let b = broker();
        let mut i = info("ap-1");
        i.key = "Ali\u{202E}ce".into();
        i.input = serde_json::json!({"command": "ls\u{2067}", "k\u{200B}": ["\u{FEFF}x", 1]});
        let _t = b.open(i).unwrap();
        let listed = &b.list()[0];
        assert_eq!(listed.key, "Ali\\u{202e}ce");
        assert_eq!(
            listed.input,
            serde_json::json!({"command": "ls\\u{2067}", "k\\u{200b}": ["\\u{feff}x", 1]})
        );
        assert!(prompt_text(listed).contains("Ali\\u{202e}ce"));
    }

    #[tokio::test]
    async fn a_decision_knows_the_chat_it_was_offered_in() {
        let b = broker();
        let (seven, eight) = (Address::new("telegram", "7"), Address::new("telegram", "8"));
        // The same chat id on another channel is another chat.
        let room = Address::new("matrix", "7");
        let _t = b.open(info("ap-1")).unwrap();
        assert_eq!(
            b.offered_in("ap-1", &seven),
            Some(false),
            "not offered anywhere yet"
        );
        b.lock().pending.get_mut("ap-1").unwrap().chat = Some(seven.clone());
        assert_eq!(b.offered_in("ap-1", &seven), Some(true));
        assert_eq!(b.offered_in("ap-1", &eight), Some(false));
        assert_eq!(b.offered_in("ap-1", &room), Some(false));
        b.decide("ap-1", verdict(Decision::Deny)).unwrap();
        assert_eq!(
            b.offered_in("ap-1", &seven),
            Some(true),
            "remembered once decided"
        );
        assert_eq!(b.offered_in("ap-1", &eight), Some(false));
        assert_eq!(b.offered_in("ap-2", &seven), None);
    }

    /// Security round 3, item 14: format characters (bidi overrides and isolates, zero-width
    /// characters, the BOM, tag characters) are shown as visible escapes, so a model cannot
    /// make a person read something else than what runs; a cut summary says so.
    #[test]
    fn summaries_show_format_characters_and_say_when_cut() {
        let s = summary(
            "exec",
            &serde_json::json!({"command": "rm -rf ~/\u{202E}gpj.exe\u{200B}\u{2066}\u{FEFF}\u{E0041}"}),
        );
        assert_eq!(
            s,
            "exec: rm -rf ~/\\u{202e}gpj.exe\\u{200b}\\u{2066}\\u{feff}\\u{e0041}"
        );
        let long = summary("exec", &serde_json::json!({"command": "y".repeat(500)}));
        assert!(long.ends_with("… (cut)"), "{long}");
        assert!(long.chars().count() <= MAX_SUMMARY_CHARS + " (cut)".len() + 1);
        let short = summary("exec", &serde_json::json!({"command": "ls"}));
        assert!(!short.contains("(cut)"));
    }
}
