//! Process metrics for `GET /metrics` (SPEC §10.2), on `prometheus-client` (the Prometheus
//! project's Rust client), rendered as OpenMetrics text ([`CONTENT_TYPE`]).
//!
//! Create one [`Metrics`] and share it through an `Arc`. Counter families are registered
//! without their `_total` suffix, which the encoder adds to each sample (`agentd_messages` is
//! sampled as `agentd_messages_total`). A labelled family appears once it has a series: the
//! known label values (token kinds, delivery statuses) are there from the start at zero, the
//! free-form ones (`agentd_errors_total`, ...) from their first count. Label sets stay small: outcomes are an enum, and every
//! free-form label (source, model, tool, error kind) keeps at most [`MAX_LABEL_VALUES`]
//! distinct values — later ones are counted as `"other"`.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::message::Usage;

mod classic;
pub use classic::{CLASSIC_CONTENT_TYPE, to_classic};

/// The `Content-Type` of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Distinct values one label keeps before new ones become `"other"`.
pub const MAX_LABEL_VALUES: usize = 200;
/// Label values are cut to this many characters.
const MAX_LABEL_CHARS: usize = 64;
/// Bucket upper bounds (seconds) of the latency histograms.
const DURATION_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
/// The kinds of `agentd_tokens_total`, in [`Usage`] order.
const TOKEN_KINDS: [&str; 4] = ["input", "output", "cache_read", "cache_write"];

/// The outcomes of `agentd_webhooks_total`.
pub const WEBHOOK_OUTCOMES: [&str; 3] = ["delivered", "failed", "dropped"];

/// How a message ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A reply was delivered (or returned over HTTP).
    Reply,
    /// The reply was a silent token and not delivered.
    Silent,
    /// The loop failed after its retries.
    Failed,
    /// Shutdown or a reset stopped the message.
    Cancelled,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Reply => "reply",
            Outcome::Silent => "silent",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// A label set: `(name, value)` pairs in the order the family declares its names.
type Labels = Vec<(&'static str, String)>;
/// A gauge read as a count (never negative).
type Count = Gauge<u64, AtomicU64>;

/// All metrics of the daemon. `Send + Sync`; every method takes `&self`.
#[derive(Debug)]
pub struct Metrics {
    /// Holds a handle to every metric below (they share their state with it).
    registry: Registry,
    messages: Bounded,
    llm_calls: Bounded,
    tokens: [Counter; 4],
    cost_usd: Counter<f64, AtomicU64>,
    tool_calls: Bounded,
    errors: Bounded,
    queue_depth: Count,
    active_sessions: Count,
    session_workers: Count,
    open_sessions: Count,
    /// Closed deliveries (SPEC §16.1), by status: done, failed, unknown.
    deliveries: Bounded,
    deliveries_pending: Count,
    /// Webhook callbacks (SPEC §10.2), by outcome: delivered, failed, dropped.
    webhooks: Bounded,
    /// Tool calls waiting for a person's yes (SPEC §18.1).
    approvals_pending: Count,
    /// Scheduled backups (SPEC §24), by result: ok, failed.
    backups: Bounded,
    message_duration: Histogram,
    /// The count of `message_duration` (the client keeps its histograms' counts to itself).
    messages_finished: AtomicU64,
    llm_call_duration: Histogram,
    /// How long a message waited for one of `max_concurrent_sessions` slots.
    slot_wait: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Everything at zero, registered under the `agentd_` prefix.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("agentd");
        let r = &mut registry;
        // The fields are built in registration order (the order of the exposition); `registry`
        // moves in last, when `r` is no longer used.
        Metrics {
            messages: bounded(
                r,
                "messages",
                "Messages processed, by source and outcome",
                &["source", "outcome"],
                &[],
            ),
            llm_calls: bounded(
                r,
                "llm_calls",
                "Model provider calls of every kind (chat, embeddings, transcription, speech), by model",
                &["model"],
                &[],
            ),
            tokens: tokens(r),
            cost_usd: {
                let c = Counter::<f64, AtomicU64>::default();
                r.register(
                    "cost_usd",
                    "Cost of the provider calls of every kind in US dollars (the cost ledger's rows)",
                    c.clone(),
                );
                c
            },
            tool_calls: bounded(
                r,
                "tool_calls",
                "Tool calls, by tool and outcome",
                &["tool", "outcome"],
                &[],
            ),
            errors: bounded(r, "errors", "Errors, by kind", &["kind"], &[]),
            approvals_pending: gauge(
                r,
                "approvals_pending",
                "Tool calls waiting for a person's approval",
            ),
            queue_depth: gauge(r, "queue_depth", "Items waiting in the intake queue"),
            active_sessions: gauge(r, "active_sessions", "Sessions processing a message"),
            session_workers: gauge(
                r,
                "session_workers",
                "Per-session worker tasks alive (they exit when their queue is empty)",
            ),
            open_sessions: gauge(
                r,
                "open_sessions",
                "Session handles holding their trail file open",
            ),
            deliveries_pending: gauge(
                r,
                "deliveries_pending",
                "Outbox deliveries queued, in flight or waiting to retry",
            ),
            // The statuses are known: each is sampled from the start, at zero until it happens.
            deliveries: bounded(
                r,
                "deliveries",
                "Outbox deliveries closed, by status (done, failed, unknown)",
                &["status"],
                &["done", "failed", "unknown"],
            ),
            webhooks: bounded(
                r,
                "webhooks",
                "Webhook callbacks, by outcome (delivered; failed after its attempts or refused; dropped because the deliveries in flight were at their bound)",
                &["outcome"],
                &WEBHOOK_OUTCOMES,
            ),
            backups: bounded(
                r,
                "backups",
                "Scheduled backups, by result (ok, failed)",
                &["result"],
                &["ok", "failed"],
            ),
            message_duration: histogram(
                r,
                "message_duration",
                "Time from intake to the end of a message",
            ),
            slot_wait: histogram(
                r,
                "session_slot_wait",
                "Time a message waited for one of [behavior] max_concurrent_sessions slots",
            ),
            llm_call_duration: histogram(r, "llm_call_duration", "Duration of one provider call"),
            messages_finished: AtomicU64::new(0),
            registry,
        }
    }

    /// One message of `source` finished with `outcome` after `duration`.
    pub fn message_done(&self, source: &str, outcome: Outcome, duration: Duration) {
        self.messages.inc(&[source, outcome.as_str()]);
        self.message_duration.observe(duration.as_secs_f64());
        self.messages_finished.fetch_add(1, Ordering::Relaxed);
    }

    /// A message waited `wait` for a session slot (`[behavior] max_concurrent_sessions`).
    pub fn slot_wait(&self, wait: Duration) {
        self.slot_wait.observe(wait.as_secs_f64());
    }

    /// Messages finished since the start (every outcome).
    pub fn messages_finished(&self) -> u64 {
        self.messages_finished.load(Ordering::Relaxed)
    }

    /// One provider call to `model`, of any kind (`gateway::Gateway` counts each): its usage
    /// (zero for audio), the cost of its ledger row and how long it took.
    pub fn llm_call(&self, model: &str, usage: &Usage, cost_usd: f64, duration: Duration) {
        self.llm_calls.inc(&[model]);
        let kinds = [
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
        ];
        for (counter, n) in self.tokens.iter().zip(kinds) {
            counter.inc_by(n);
        }
        // A cost never goes down: NaN, infinities and negatives are not counted.
        if cost_usd.is_finite() && cost_usd > 0.0 {
            self.cost_usd.inc_by(cost_usd);
        }
        self.llm_call_duration.observe(duration.as_secs_f64());
    }

    /// One tool call of `name`; `ok` = no error.
    pub fn tool_call(&self, name: &str, ok: bool) {
        self.tool_calls
            .inc(&[name, if ok { "ok" } else { "error" }]);
    }

    /// One error of `kind` (e.g. `llm`, `delivery`, `telegram_poll`).
    pub fn error(&self, kind: &str) {
        self.errors.inc(&[kind]);
    }

    /// Tool calls waiting for approval.
    pub fn set_approvals_pending(&self, n: usize) {
        self.approvals_pending.set(n as u64);
    }

    /// Items waiting in the intake queue.
    pub fn set_queue_depth(&self, n: usize) {
        self.queue_depth.set(n as u64);
    }

    /// Sessions processing a message right now.
    pub fn set_active(&self, n: usize) {
        self.active_sessions.set(n as u64);
    }

    /// Per-session workers alive, and session handles (trail files) held open: both bounded
    /// however many sessions were ever seen.
    pub fn set_session_resources(&self, workers: usize, open: usize) {
        self.session_workers.set(workers as u64);
        self.open_sessions.set(open as u64);
    }

    /// A delivery was queued in the outbox.
    pub fn delivery_queued(&self) {
        self.deliveries_pending.inc();
    }

    /// A queued delivery is over: closed with `status` (`done`, `failed`, `unknown`), or left
    /// open by a shutdown (`None`).
    pub fn delivery_over(&self, status: Option<&str>) {
        let _ = self.deliveries_pending.inner().fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |n| Some(n.saturating_sub(1)),
        );
        if let Some(s) = status {
            self.deliveries.inc(&[s]);
        }
    }

    /// A webhook callback ended with `outcome` (`delivered`, `failed`, `dropped`).
    pub fn webhook(&self, outcome: &str) {
        self.webhooks.inc(&[outcome]);
    }

    /// A scheduled backup ended (SPEC §24).
    pub fn backup(&self, ok: bool) {
        self.backups.inc(&[if ok { "ok" } else { "failed" }]);
    }

    /// Deliveries queued or in flight.
    pub fn deliveries_pending(&self) -> u64 {
        self.deliveries_pending.get()
    }

    /// OpenMetrics text (serve it as [`CONTENT_TYPE`]), every name prefixed `agentd_`, ending
    /// with `# EOF`.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        // Writing to a String cannot fail; the encoder's only errors are the writer's.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// A counter family whose free-form labels are bounded: each label keeps at most
/// [`MAX_LABEL_VALUES`] distinct values of at most `MAX_LABEL_CHARS` characters, an empty or
/// missing value is `"unknown"`, and a value beyond the bound is counted as `"other"`.
#[derive(Debug)]
struct Bounded {
    names: &'static [&'static str],
    family: Family<Labels, Counter>,
    /// Distinct values seen, per label position.
    seen: Mutex<Vec<BTreeSet<String>>>,
}

/// A [`Bounded`] family with label `names`, registered; each of `known` (values of a one-label
/// family) is sampled from the start, at zero.
fn bounded(
    r: &mut Registry,
    name: &str,
    help: &str,
    names: &'static [&'static str],
    known: &[&str],
) -> Bounded {
    let b = Bounded::new(names);
    for value in known {
        b.add(&[value], 0);
    }
    r.register(name, help, b.family.clone());
    b
}

/// `agentd_tokens_total`, registered, with a series per kind of [`TOKEN_KINDS`].
fn tokens(r: &mut Registry) -> [Counter; 4] {
    let family = Family::<Labels, Counter>::default();
    let tokens = TOKEN_KINDS.map(|kind| {
        family
            .get_or_create(&vec![("kind", kind.to_owned())])
            .clone()
    });
    r.register("tokens", "Tokens of provider calls, by kind", family);
    tokens
}

/// A count gauge, registered.
fn gauge(r: &mut Registry, name: &str, help: &str) -> Count {
    let g = Count::default();
    r.register(name, help, g.clone());
    g
}

/// A latency histogram in seconds ([`DURATION_BUCKETS`]), registered.
fn histogram(r: &mut Registry, name: &str, help: &str) -> Histogram {
    let h = Histogram::new(DURATION_BUCKETS.iter().copied());
    r.register_with_unit(name, help, Unit::Seconds, h.clone());
    h
}

impl Bounded {
    fn new(names: &'static [&'static str]) -> Bounded {
        Bounded {
            names,
            family: Family::default(),
            seen: Mutex::new(vec![BTreeSet::new(); names.len()]),
        }
    }

    fn inc(&self, values: &[&str]) {
        self.add(values, 1);
    }

    /// Adds `n` to the series of `values` (0 only creates it).
    fn add(&self, values: &[&str], n: u64) {
        let labels: Labels = {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            self.names
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let value: String = values
                        .get(i)
                        .copied()
                        .filter(|v| !v.is_empty())
                        .unwrap_or("unknown")
                        .chars()
                        .take(MAX_LABEL_CHARS)
                        .collect();
                    let seen = &mut seen[i];
                    let value = if seen.contains(&value) {
                        value
                    } else if seen.len() < MAX_LABEL_VALUES {
                        seen.insert(value.clone());
                        value
                    } else {
                        "other".to_owned()
                    };
                    (*name, value)
                })
                .collect()
        };
        self.family.get_or_create(&labels).inc_by(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};

    /// One sample line: name, labels, value.
    #[derive(Debug, Clone, PartialEq)]
    pub(crate) struct Sample {
        pub name: String,
        pub labels: BTreeMap<String, String>,
        pub value: f64,
    }

    /// A tiny OpenMetrics parser: every non-comment line is `name{labels} value` with a float
    /// value; every sample's family has HELP and TYPE lines before it (counters are sampled as
    /// `<family>_total`, histograms as `_bucket`, `_sum`, `_count`); a `# UNIT` is a suffix of
    /// its family's name; the text ends with `# EOF`. Panics naming the line. (The suite also
    /// parses `/metrics` with the Prometheus project's Python parser: tests/it/metrics.rs.)
    pub(crate) fn parse(text: &str) -> Vec<Sample> {
        let mut help = BTreeSet::new();
        let mut types: HashMap<String, String> = HashMap::new();
        let mut samples = Vec::new();
        let body = text
            .strip_suffix("# EOF\n")
            .unwrap_or_else(|| panic!("no final # EOF in {text:?}"));
        for line in body.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, text) = rest.split_once(' ').expect("HELP has text");
                assert!(!text.is_empty(), "{line}");
                help.insert(name.to_owned());
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE has a kind");
                assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
                types.insert(name.to_owned(), kind.to_owned());
                continue;
            }
            if let Some(rest) = line.strip_prefix("# UNIT ") {
                let (name, unit) = rest.split_once(' ').expect("UNIT has a unit");
                assert!(name.ends_with(&format!("_{unit}")), "{line}");
                continue;
            }
            assert!(!line.starts_with('#'), "unknown comment {line:?}");
            let (series, value) = line.rsplit_once(' ').expect("sample has a value");
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v
                    .parse()
                    .unwrap_or_else(|_| panic!("bad value in {line:?}")),
            };
            let (name, labels) = match series.split_once('{') {
                None => (series.to_owned(), BTreeMap::new()),
                Some((name, rest)) => {
                    let body = rest.strip_suffix('}').expect("labels end with }");
                    (name.to_owned(), parse_labels(body, line))
                }
            };
            assert!(
                name.starts_with("agentd_")
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{line}"
            );
            let suffixes: &[(&str, &str)] = &[
                ("_total", "counter"),
                ("_bucket", "histogram"),
                ("_sum", "histogram"),
                ("_count", "histogram"),
            ];
            let family = suffixes
                .iter()
                .find_map(|(suffix, kind)| {
                    name.strip_suffix(suffix)
                        .filter(|f| types.get(*f).is_some_and(|t| t == kind))
                })
                .unwrap_or(&name)
                .to_owned();
            assert!(help.contains(&family), "no HELP for {family}");
            assert!(types.contains_key(&family), "no TYPE for {family}");
            if types[&family] == "counter" {
                assert_eq!(name, format!("{family}_total"), "{line}");
            }
            samples.push(Sample {
                name,
                labels,
                value,
            });
        }
        samples
    }

    fn parse_labels(body: &str, line: &str) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::new();
        let mut rest = body;
        while !rest.is_empty() {
            let (key, after) = rest.split_once("=\"").unwrap_or_else(|| panic!("{line}"));
            let mut value = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c)) => value.push(c),
                        None => panic!("{line}"),
                    },
                    Some((i, '"')) => break i,
                    Some((_, c)) => value.push(c),
                    None => panic!("unterminated label in {line}"),
                }
            };
            labels.insert(key.to_owned(), value);
            rest = after[end + 1..]
                .strip_prefix(',')
                .unwrap_or(&after[end + 1..]);
        }
        labels
    }

    fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        samples
            .iter()
            .find(|s| {
                s.name == name
                    && s.labels.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
    }

    fn usage(i: u64, o: u64, r: u64, w: u64) -> Usage {
        Usage {
            input_tokens: i,
            output_tokens: o,
            cache_read_tokens: r,
            cache_write_tokens: w,
            cache_write_1h_tokens: 0,
        }
    }

    #[test]
    fn an_empty_registry_renders_valid_text() {
        let samples = parse(&Metrics::new().render());
        assert_eq!(value(&samples, "agentd_queue_depth", &[]), Some(0.0));
        assert_eq!(
            value(
                &samples,
                "agentd_message_duration_seconds_bucket",
                &[("le", "+Inf")]
            ),
            Some(0.0)
        );
    }

    #[test]
    fn deliveries_pending_and_closed() {
        let m = Metrics::new();
        m.delivery_queued();
        m.delivery_queued();
        m.delivery_over(Some("failed"));
        let samples = parse(&m.render());
        assert_eq!(value(&samples, "agentd_deliveries_pending", &[]), Some(1.0));
        assert_eq!(
            value(&samples, "agentd_deliveries_total", &[("status", "failed")]),
            Some(1.0)
        );
        m.delivery_over(None);
        assert_eq!(m.deliveries_pending(), 0);
    }

    #[test]
    fn counters_add_up() {
        let m = Metrics::new();
        m.message_done("telegram", Outcome::Reply, Duration::from_millis(300));
        m.message_done("telegram", Outcome::Reply, Duration::from_secs(2));
        m.message_done("http", Outcome::Silent, Duration::from_secs(1));
        m.llm_call(
            "sonnet",
            &usage(10, 20, 30, 40),
            0.25,
            Duration::from_secs(1),
        );
        m.llm_call("sonnet", &usage(1, 2, 3, 4), 0.5, Duration::from_secs(3));
        m.llm_call("haiku", &usage(1, 1, 1, 1), 0.125, Duration::from_secs(3));
        m.tool_call("exec", true);
        m.tool_call("exec", false);
        m.tool_call("exec", true);
        m.error("llm");
        m.set_queue_depth(7);
        m.set_active(2);
        let s = parse(&m.render());
        let msg = |src, out| {
            value(
                &s,
                "agentd_messages_total",
                &[("source", src), ("outcome", out)],
            )
        };
        assert_eq!(msg("telegram", "reply"), Some(2.0));
        assert_eq!(msg("http", "silent"), Some(1.0));
        assert_eq!(msg("http", "reply"), None);
        assert_eq!(
            value(&s, "agentd_llm_calls_total", &[("model", "sonnet")]),
            Some(2.0)
        );
        assert_eq!(
            value(&s, "agentd_llm_calls_total", &[("model", "haiku")]),
            Some(1.0)
        );
        assert_eq!(
            value(&s, "agentd_tokens_total", &[("kind", "input")]),
            Some(12.0)
        );
        assert_eq!(
            value(&s, "agentd_tokens_total", &[("kind", "output")]),
            Some(23.0)
        );
        assert_eq!(
            value(&s, "agentd_tokens_total", &[("kind", "cache_read")]),
            Some(34.0)
        );
        assert_eq!(
            value(&s, "agentd_tokens_total", &[("kind", "cache_write")]),
            Some(45.0)
        );
        assert_eq!(value(&s, "agentd_cost_usd_total", &[]), Some(0.875));
        let tool = |o| {
            value(
                &s,
                "agentd_tool_calls_total",
                &[("tool", "exec"), ("outcome", o)],
            )
        };
        assert_eq!((tool("ok"), tool("error")), (Some(2.0), Some(1.0)));
        assert_eq!(
            value(&s, "agentd_errors_total", &[("kind", "llm")]),
            Some(1.0)
        );
        assert_eq!(value(&s, "agentd_queue_depth", &[]), Some(7.0));
        assert_eq!(value(&s, "agentd_active_sessions", &[]), Some(2.0));
        assert_eq!(
            value(&s, "agentd_message_duration_seconds_count", &[]),
            Some(3.0)
        );
        assert_eq!(
            value(&s, "agentd_message_duration_seconds_sum", &[]),
            Some(3.3)
        );
        assert_eq!(
            value(&s, "agentd_llm_call_duration_seconds_count", &[]),
            Some(3.0)
        );
    }

    #[test]
    fn session_slot_waits_are_a_histogram_of_their_own() {
        let m = Metrics::new();
        m.slot_wait(Duration::from_millis(20));
        m.slot_wait(Duration::from_millis(30));
        let s = parse(&m.render());
        assert_eq!(
            value(&s, "agentd_session_slot_wait_seconds_count", &[]),
            Some(2.0)
        );
        let sum = value(&s, "agentd_session_slot_wait_seconds_sum", &[]).unwrap();
        assert!((sum - 0.05).abs() < 1e-9, "{sum}");
        assert_eq!(m.messages_finished(), 0, "a wait is not a finished message");
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_with_count() {
        let m = Metrics::new();
        for ms in [50, 100, 101, 700, 4_000, 4_000, 900_000] {
            m.message_done("user", Outcome::Reply, Duration::from_millis(ms));
        }
        let s = parse(&m.render());
        let buckets: Vec<&Sample> = s
            .iter()
            .filter(|x| x.name == "agentd_message_duration_seconds_bucket")
            .collect();
        assert_eq!(buckets.len(), DURATION_BUCKETS.len() + 1);
        assert!(buckets.windows(2).all(|w| w[0].value <= w[1].value));
        let le = |b: &str| value(&s, "agentd_message_duration_seconds_bucket", &[("le", b)]);
        assert_eq!(le("0.1"), Some(2.0)); // 0.05 and the bound itself
        assert_eq!(le("0.25"), Some(3.0));
        assert_eq!(le("1.0"), Some(4.0));
        assert_eq!(le("5.0"), Some(6.0));
        assert_eq!(le("600.0"), Some(6.0));
        let last = buckets.last().unwrap();
        assert_eq!(last.labels["le"], "+Inf");
        assert_eq!(last.value, 7.0);
        assert_eq!(
            value(&s, "agentd_message_duration_seconds_count", &[]),
            Some(7.0)
        );
    }

    #[test]
    fn free_labels_are_bounded_and_escaped() {
        let m = Metrics::new();
        for i in 0..(MAX_LABEL_VALUES + 50) {
            m.tool_call(&format!("tool{i}"), true);
        }
        m.error("quote\"back\\slash\nline");
        m.error("");
        let s = parse(&m.render());
        let tools = s
            .iter()
            .filter(|x| x.name == "agentd_tool_calls_total")
            .count();
        assert_eq!(tools, MAX_LABEL_VALUES + 1);
        assert_eq!(
            value(
                &s,
                "agentd_tool_calls_total",
                &[("tool", "other"), ("outcome", "ok")]
            ),
            Some(50.0)
        );
        assert_eq!(
            value(
                &s,
                "agentd_errors_total",
                &[("kind", "quote\"back\\slash\nline")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(&s, "agentd_errors_total", &[("kind", "unknown")]),
            Some(1.0)
        );
    }

    #[test]
    fn cost_ignores_nonsense() {
        let m = Metrics::new();
        m.llm_call("x", &Usage::default(), f64::NAN, Duration::ZERO);
        m.llm_call("x", &Usage::default(), -1.0, Duration::ZERO);
        m.llm_call("x", &Usage::default(), 0.5, Duration::ZERO);
        let s = parse(&m.render());
        assert_eq!(value(&s, "agentd_cost_usd_total", &[]), Some(0.5));
    }

    #[test]
    fn metrics_are_shareable() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Metrics>();
        let m = std::sync::Arc::new(Metrics::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        m.error("x");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = parse(&m.render());
        assert_eq!(
            value(&s, "agentd_errors_total", &[("kind", "x")]),
            Some(4000.0)
        );
    }
}
