//! Process metrics for `GET /metrics` (SPEC §10.2): counters, gauges and histograms kept in
//! atomics and small locked maps, rendered as Prometheus text format 0.0.4.
//!
//! Create one [`Metrics`] and share it through an `Arc`. Label sets stay small: outcomes are an
//! enum, and every free-form label (source, model, tool, error kind) keeps at most
//! [`MAX_LABEL_VALUES`] distinct values — later ones are counted as `"other"`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::message::Usage;

/// Distinct values one label keeps before new ones become `"other"`.
pub const MAX_LABEL_VALUES: usize = 200;
/// Label values are cut to this many characters.
const MAX_LABEL_CHARS: usize = 64;
/// Bucket upper bounds (seconds) of both latency histograms.
const DURATION_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

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

/// All metrics of the daemon. `Send + Sync`; every method takes `&self`.
#[derive(Debug)]
pub struct Metrics {
    messages: Family,
    llm_calls: Family,
    /// input, output, cache_read, cache_write
    tokens: [AtomicU64; 4],
    cost_usd: AtomicF64,
    tool_calls: Family,
    errors: Family,
    queue_depth: AtomicU64,
    active_sessions: AtomicU64,
    session_workers: AtomicU64,
    open_sessions: AtomicU64,
    /// Closed deliveries (SPEC §16.1), by status: done, failed, unknown.
    deliveries: Family,
    deliveries_pending: AtomicU64,
    /// Tool calls waiting for a person's yes (SPEC §18.1).
    approvals_pending: AtomicU64,
    message_duration: Histogram,
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
    /// Everything at zero.
    pub fn new() -> Metrics {
        Metrics {
            messages: Family::new(&["source", "outcome"]),
            llm_calls: Family::new(&["model"]),
            tokens: Default::default(),
            cost_usd: AtomicF64::default(),
            tool_calls: Family::new(&["tool", "outcome"]),
            errors: Family::new(&["kind"]),
            queue_depth: AtomicU64::new(0),
            active_sessions: AtomicU64::new(0),
            session_workers: AtomicU64::new(0),
            open_sessions: AtomicU64::new(0),
            deliveries: Family::new(&["status"]),
            deliveries_pending: AtomicU64::new(0),
            approvals_pending: AtomicU64::new(0),
            message_duration: Histogram::new(DURATION_BUCKETS),
            llm_call_duration: Histogram::new(DURATION_BUCKETS),
            slot_wait: Histogram::new(DURATION_BUCKETS),
        }
    }

    /// One message of `source` finished with `outcome` after `duration`.
    pub fn message_done(&self, source: &str, outcome: Outcome, duration: Duration) {
        self.messages.inc(&[source, outcome.as_str()]);
        self.message_duration.observe(duration);
    }

    /// A message waited `wait` for a session slot (`[behavior] max_concurrent_sessions`).
    pub fn slot_wait(&self, wait: Duration) {
        self.slot_wait.observe(wait);
    }

    /// Messages finished since the start (every outcome).
    pub fn messages_finished(&self) -> u64 {
        self.message_duration
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// One LLM call to `model`: its usage, its cost and how long it took.
    pub fn llm_call(&self, model: &str, usage: &Usage, cost_usd: f64, duration: Duration) {
        self.llm_calls.inc(&[model]);
        let kinds = [
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
        ];
        for (counter, n) in self.tokens.iter().zip(kinds) {
            counter.fetch_add(n, Ordering::Relaxed);
        }
        self.cost_usd.add(cost_usd);
        self.llm_call_duration.observe(duration);
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
        self.approvals_pending.store(n as u64, Ordering::Relaxed);
    }

    /// Items waiting in the intake queue.
    pub fn set_queue_depth(&self, n: usize) {
        self.queue_depth.store(n as u64, Ordering::Relaxed);
    }

    /// Sessions processing a message right now.
    pub fn set_active(&self, n: usize) {
        self.active_sessions.store(n as u64, Ordering::Relaxed);
    }

    /// Per-session workers alive, and session handles (trail files) held open: both bounded
    /// however many sessions were ever seen.
    pub fn set_session_resources(&self, workers: usize, open: usize) {
        self.session_workers
            .store(workers as u64, Ordering::Relaxed);
        self.open_sessions.store(open as u64, Ordering::Relaxed);
    }

    /// A delivery was queued in the outbox.
    pub fn delivery_queued(&self) {
        self.deliveries_pending.fetch_add(1, Ordering::Relaxed);
    }

    /// A queued delivery is over: closed with `status` (`done`, `failed`, `unknown`), or left
    /// open by a shutdown (`None`).
    pub fn delivery_over(&self, status: Option<&str>) {
        let _ = self
            .deliveries_pending
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
        if let Some(s) = status {
            self.deliveries.inc(&[s]);
        }
    }

    /// Deliveries queued or in flight.
    pub fn deliveries_pending(&self) -> u64 {
        self.deliveries_pending.load(Ordering::Relaxed)
    }

    /// Prometheus text format 0.0.4, every name prefixed `agentd_`.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        header(
            &mut out,
            "agentd_messages_total",
            "counter",
            "Messages processed, by source and outcome.",
        );
        self.messages.render(&mut out, "agentd_messages_total");
        header(
            &mut out,
            "agentd_llm_calls_total",
            "counter",
            "LLM calls, by model.",
        );
        self.llm_calls.render(&mut out, "agentd_llm_calls_total");
        header(
            &mut out,
            "agentd_tokens_total",
            "counter",
            "Tokens of LLM calls, by kind.",
        );
        for (kind, counter) in ["input", "output", "cache_read", "cache_write"]
            .iter()
            .zip(&self.tokens)
        {
            let _ = writeln!(
                out,
                "agentd_tokens_total{{kind=\"{kind}\"}} {}",
                counter.load(Ordering::Relaxed)
            );
        }
        header(
            &mut out,
            "agentd_cost_usd_total",
            "counter",
            "Cost of LLM calls in US dollars.",
        );
        let _ = writeln!(out, "agentd_cost_usd_total {}", float(self.cost_usd.get()));
        header(
            &mut out,
            "agentd_tool_calls_total",
            "counter",
            "Tool calls, by tool and outcome.",
        );
        self.tool_calls.render(&mut out, "agentd_tool_calls_total");
        header(
            &mut out,
            "agentd_errors_total",
            "counter",
            "Errors, by kind.",
        );
        self.errors.render(&mut out, "agentd_errors_total");
        gauge(
            &mut out,
            "agentd_approvals_pending",
            "Tool calls waiting for a person's approval.",
            self.approvals_pending.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "agentd_queue_depth",
            "Items waiting in the intake queue.",
            self.queue_depth.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "agentd_active_sessions",
            "Sessions processing a message.",
            self.active_sessions.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "agentd_session_workers",
            "Per-session worker tasks alive (they exit when their queue is empty).",
            self.session_workers.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "agentd_open_sessions",
            "Session handles holding their trail file open.",
            self.open_sessions.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "agentd_deliveries_pending",
            "Outbox deliveries queued, in flight or waiting to retry.",
            self.deliveries_pending.load(Ordering::Relaxed),
        );
        header(
            &mut out,
            "agentd_deliveries_total",
            "counter",
            "Outbox deliveries closed, by status (done, failed, unknown).",
        );
        self.deliveries.render(&mut out, "agentd_deliveries_total");
        header(
            &mut out,
            "agentd_message_duration_seconds",
            "histogram",
            "Time from intake to the end of a message.",
        );
        self.message_duration
            .render(&mut out, "agentd_message_duration_seconds");
        header(
            &mut out,
            "agentd_session_slot_wait_seconds",
            "histogram",
            "Time a message waited for one of [behavior] max_concurrent_sessions slots.",
        );
        self.slot_wait
            .render(&mut out, "agentd_session_slot_wait_seconds");
        header(
            &mut out,
            "agentd_llm_call_duration_seconds",
            "histogram",
            "Duration of one LLM call.",
        );
        self.llm_call_duration
            .render(&mut out, "agentd_llm_call_duration_seconds");
        out
    }
}

/// A gauge without labels: its header and its one sample.
fn gauge(out: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    header(out, name, "gauge", help);
    let _ = writeln!(out, "{name} {value}");
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A float as Prometheus reads it (`+Inf`, `-Inf`, `NaN`, else decimal).
fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// A label value, escaped for the text format.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// An f64 accumulated in an `AtomicU64` (bit pattern).
#[derive(Debug, Default)]
struct AtomicF64(AtomicU64);

impl AtomicF64 {
    /// Adds `v` when it is finite and positive (a cost never goes down).
    fn add(&self, v: f64) {
        if !(v.is_finite() && v > 0.0) {
            return;
        }
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + v).to_bits())
            });
    }

    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// A counter with labels; each label keeps at most [`MAX_LABEL_VALUES`] distinct values.
#[derive(Debug)]
struct Family {
    labels: &'static [&'static str],
    inner: Mutex<FamilyInner>,
}

#[derive(Debug)]
struct FamilyInner {
    series: BTreeMap<Vec<String>, u64>,
    /// Distinct values seen, per label position.
    seen: Vec<BTreeSet<String>>,
}

impl Family {
    fn new(labels: &'static [&'static str]) -> Family {
        Family {
            labels,
            inner: Mutex::new(FamilyInner {
                series: BTreeMap::new(),
                seen: vec![BTreeSet::new(); labels.len()],
            }),
        }
    }

    fn inc(&self, values: &[&str]) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let key: Vec<String> = (0..self.labels.len())
            .map(|i| {
                let value: String = values
                    .get(i)
                    .copied()
                    .filter(|v| !v.is_empty())
                    .unwrap_or("unknown")
                    .chars()
                    .take(MAX_LABEL_CHARS)
                    .collect();
                let seen = &mut inner.seen[i];
                if seen.contains(&value) {
                    value
                } else if seen.len() < MAX_LABEL_VALUES {
                    seen.insert(value.clone());
                    value
                } else {
                    "other".to_owned()
                }
            })
            .collect();
        *inner.series.entry(key).or_default() += 1;
    }

    fn render(&self, out: &mut String, name: &str) {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for (values, count) in &inner.series {
            let labels: Vec<String> = self
                .labels
                .iter()
                .zip(values)
                .map(|(l, v)| format!("{l}=\"{}\"", escape(v)))
                .collect();
            let _ = writeln!(out, "{name}{{{}}} {count}", labels.join(","));
        }
    }
}

/// A histogram with fixed buckets.
#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative); the last one is above every bound.
    counts: Vec<AtomicU64>,
    sum: AtomicF64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicF64::default(),
        }
    }

    fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = self
            .bounds
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum.add(secs);
    }

    /// Cumulative buckets; `+Inf` and `_count` are the same total by construction.
    fn render(&self, out: &mut String, name: &str) {
        let mut total = 0u64;
        for (i, count) in self.counts.iter().enumerate() {
            total += count.load(Ordering::Relaxed);
            let le = self.bounds.get(i).map_or("+Inf".to_owned(), |b| float(*b));
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {total}");
        }
        let _ = writeln!(out, "{name}_sum {}", float(self.sum.get()));
        let _ = writeln!(out, "{name}_count {total}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// One sample line: name, labels, value.
    #[derive(Debug, Clone, PartialEq)]
    pub(crate) struct Sample {
        pub name: String,
        pub labels: BTreeMap<String, String>,
        pub value: f64,
    }

    /// A tiny text-format parser: every non-comment line is `name{labels} value` with a float
    /// value; every sample's family has HELP and TYPE lines before it. Panics naming the line.
    pub(crate) fn parse(text: &str) -> Vec<Sample> {
        let mut help = BTreeSet::new();
        let mut types: HashMap<String, String> = HashMap::new();
        let mut samples = Vec::new();
        for line in text.lines() {
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
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|f| types.get(*f).is_some_and(|t| t == "histogram"))
                })
                .unwrap_or(&name)
                .to_owned();
            assert!(help.contains(&family), "no HELP for {family}");
            assert!(types.contains_key(&family), "no TYPE for {family}");
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
        assert_eq!(le("1"), Some(4.0));
        assert_eq!(le("5"), Some(6.0));
        assert_eq!(le("600"), Some(6.0));
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
