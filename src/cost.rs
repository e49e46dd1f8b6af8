//! Pricing and budgets (SPEC §8). The arithmetic and the budget decision are pure functions;
//! [`budget_gate`] only adds the two ledger sums it needs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::zone::Zone;
use chrono::{DateTime, Datelike, Duration, NaiveDate, NaiveDateTime, TimeZone, Utc};

pub mod alarm;
pub mod spool;

use crate::config::{BudgetConfig, Config, ModelSpec, Pricing};
use crate::message::Usage;
use crate::store::{CallType, CostRow, Db, StoreError};

/// Cost in USD of one call: input·r_in + output·r_out + cache_read·r_cache_read +
/// cache_write·r_cache_write, with rates in USD per million tokens.
pub fn cost_usd(p: &Pricing, u: &Usage) -> f64 {
    let long = u.cache_write_1h_tokens.min(u.cache_write_tokens);
    let short = u.cache_write_tokens - long;
    (u.input_tokens as f64 * p.input
        + u.output_tokens as f64 * p.output
        + u.cache_read_tokens as f64 * p.cache_read
        + short as f64 * p.cache_write
        + long as f64 * p.cache_write_1h)
        / 1_000_000.0
}

/// A reporting period of `--cost` and `GET /api/v1/cost`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Period {
    /// Since local midnight.
    Today,
    /// The last 7 × 24 h.
    Week,
    /// Since the first of the local month, 00:00.
    Month,
    /// Everything recorded.
    All,
}

/// A period name that is not one of `today`, `week`, `month`, `all`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown period {0:?}: expected one of today, week, month, all")]
pub struct ParsePeriodError(String);

impl std::str::FromStr for Period {
    type Err = ParsePeriodError;

    /// Case-insensitive; surrounding whitespace is ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "today" => Ok(Period::Today),
            "week" => Ok(Period::Week),
            "month" => Ok(Period::Month),
            "all" => Ok(Period::All),
            _ => Err(ParsePeriodError(s.chars().take(40).collect())),
        }
    }
}

impl std::fmt::Display for Period {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Period {
    /// `"today"`, `"week"`, `"month"` or `"all"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Period::Today => "today",
            Period::Week => "week",
            Period::Month => "month",
            Period::All => "all",
        }
    }

    /// Unix seconds of the period's start in `tz`: today = local midnight; week = now − 7×24 h;
    /// month = the first of the local month, 00:00; all = `None`. When local midnight does not
    /// exist (a DST gap at 00:00) the first valid local time after it is used; when it exists
    /// twice, the earlier one.
    pub fn start(&self, tz: &Zone, now: DateTime<Utc>) -> Option<i64> {
        let local_today = now.with_timezone(tz).date_naive();
        match self {
            Period::Today => Some(local_start_of_day(tz, local_today)),
            Period::Week => Some((now - Duration::days(7)).timestamp()),
            Period::Month => {
                let first = local_today.with_day(1).unwrap_or(local_today);
                Some(local_start_of_day(tz, first))
            }
            Period::All => None,
        }
    }
}

/// The earliest instant whose local date in `tz` is `day`: midnight if it exists, otherwise the
/// end of the DST gap that swallowed it.
fn local_start_of_day(tz: &Zone, day: NaiveDate) -> i64 {
    let midnight: NaiveDateTime = day.and_time(chrono::NaiveTime::MIN);
    // Gaps are at most a couple of hours and transitions fall on whole minutes; a day is the
    // hard upper bound of the search.
    for minutes in 0..(24 * 60) {
        let local = midnight + Duration::minutes(minutes);
        if let Some(t) = tz.from_local_datetime(&local).earliest() {
            return t.timestamp();
        }
    }
    // Unreachable with real zone data; fall back to midnight read as UTC.
    midnight.and_utc().timestamp()
}

/// An audio call to price (SPEC §19): see [`Ledger::record_audio`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AudioCall {
    /// Seconds of audio transcribed.
    Transcription { seconds: f64 },
    /// Characters synthesised.
    Speech { chars: usize },
}

/// Format dollars for messages: two decimals, more for sub-dollar amounts that need them
/// (`$5.00`, `$0.0123`).
fn usd(v: f64) -> String {
    let mut s = format!("{v:.4}");
    while s.ends_with('0') && s.len() - s.find('.').unwrap_or(s.len()) > 3 {
        s.pop();
    }
    format!("${s}")
}

/// Whether a limit is on (0, negative or NaN means off) and reached.
fn reached(limit: f64, spent: f64) -> bool {
    limit > 0.0 && spent >= limit
}

/// The budget decision before each LLM call (SPEC §8). `Err` is a user-facing message naming
/// the limit, the spend and the config key, e.g. "daily budget of $5.00 reached ($5.02 spent
/// today); raise [budget] daily_usd or wait until tomorrow". Limits of 0 are off.
pub fn check_budget(
    cfg: &BudgetConfig,
    spent_today: f64,
    spent_month: f64,
    spent_message: f64,
) -> Result<(), String> {
    if reached(cfg.per_message_usd, spent_message) {
        return Err(format!(
            "per-message budget of {} reached ({} spent on this message); raise [budget] \
             per_message_usd or split the request into smaller messages",
            usd(cfg.per_message_usd),
            usd(spent_message)
        ));
    }
    if reached(cfg.daily_usd, spent_today) {
        return Err(format!(
            "daily budget of {} reached ({} spent today); raise [budget] daily_usd or wait \
             until tomorrow",
            usd(cfg.daily_usd),
            usd(spent_today)
        ));
    }
    if reached(cfg.monthly_usd, spent_month) {
        return Err(format!(
            "monthly budget of {} reached ({} spent this month); raise [budget] monthly_usd or \
             wait until next month",
            usd(cfg.monthly_usd),
            usd(spent_month)
        ));
    }
    Ok(())
}

/// Why [`budget_gate`] or [`Ledger::check`] refused a call.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    /// A limit is reached; the message is meant for the user (see [`check_budget`]).
    #[error("{0}")]
    Exceeded(String),
    /// The ledger could not be read. The caller decides whether to fail open or closed.
    #[error("cannot check the budget: {0}")]
    Store(#[from] StoreError),
    /// Cost rows of earlier calls could not be written and still cannot (SPEC §16.4): no new
    /// call is made until they are. The message is meant for the user.
    #[error(
        "{pending} cost row(s) could not be written to agentd.db ({error}); no model call is made until they are: check the disk (space, permissions) of the state directory"
    )]
    Unrecorded {
        pending: usize,
        error: spool::SpoolError,
    },
}

/// Check the budget before an LLM call: reads today's and this month's spend from the ledger
/// (only for the limits that are on) and applies [`check_budget`]. Touches no database when
/// the daily and monthly limits are both off.
pub async fn budget_gate(
    db: &Db,
    cfg: &BudgetConfig,
    tz: &Zone,
    now: DateTime<Utc>,
    spent_message: f64,
) -> Result<(), BudgetError> {
    let spent_since = |period: Period, limit: f64| async move {
        match period.start(tz, now) {
            Some(since) if limit > 0.0 => db.spend_since(since).await,
            _ => Ok(0.0),
        }
    };
    let spent_today = spent_since(Period::Today, cfg.daily_usd).await?;
    let spent_month = spent_since(Period::Month, cfg.monthly_usd).await?;
    check_budget(cfg, spent_today, spent_month, spent_message).map_err(BudgetError::Exceeded)
}

/// The cost ledger with the budget: every provider call of every kind is checked here before
/// it is made ([`Ledger::check`]) and recorded here after ([`Ledger::record_call`],
/// [`Ledger::record_audio`]), one row per call (SPEC §8), by `gateway::Gateway`, the one
/// caller of a provider. Cheap to clone; clones share the rows still waiting to be written.
///
/// A row that cannot be written is kept and written before the next budget check; while that
/// fails, the check refuses every call (SPEC §16.4). It is kept in the cost spool
/// (`cost::spool`, fsynced before the call's answer is used, replayed at the next start), so a
/// stop or a crash does not lose it; in memory only when the spool cannot take it either.
///
/// The per-message budget counts every call made for the message (SPEC §16.4): while a
/// message is in flight ([`Ledger::begin_message`]), every row billed to its session adds to
/// its spend and tokens — its own chat calls, its sub-agents, compaction and recall embeddings
/// alike — and those totals are what the message reports ([`Ledger::message_totals`]). With a
/// per-message limit set, the calls of a message pass their check one at a time
/// ([`Ledger::check_call`]: the permit is held until the call is recorded), so parallel
/// sub-agents cannot all pass at once: a message stops within one call of its limit.
#[derive(Clone, Debug)]
pub struct Ledger {
    db: Db,
    /// `[budget]`, shared by every clone and replaced by a SIGHUP reload ([`Ledger::set_budget`]).
    budget: Arc<Mutex<BudgetConfig>>,
    tz: Zone,
    /// Rows whose insert failed and that the spool could not take either, oldest first.
    pending: Arc<Mutex<Vec<CostRow>>>,
    /// Where rows whose insert failed are kept (`None`: in memory only, unit tests).
    spool: Option<Arc<spool::Spool>>,
    /// Session id → the message in flight in that session.
    messages: Arc<Mutex<HashMap<String, InFlight>>>,
    /// Session id → the source of its latest message, for the rows' `source` column (at most
    /// `MAX_SOURCES` sessions).
    sources: Arc<Mutex<HashMap<String, String>>>,
    /// The cache alarm, checked after each recorded model call (SPEC §20); none in tools
    /// outside the daemon.
    cache_watch: Option<Arc<alarm::CacheWatch>>,
}

/// Sessions whose source the ledger remembers (it starts over beyond this).
const MAX_SOURCES: usize = 4096;

/// A message in flight: its number, what its rows cost and counted so far, and the gate its
/// calls pass their budget check through.
#[derive(Debug)]
struct InFlight {
    number: u64,
    spent: f64,
    usage: Usage,
    calls: Arc<tokio::sync::Mutex<()>>,
}

/// A budget check passed for one provider call ([`Ledger::check_call`]). With a per-message
/// limit set, it holds the message's call gate: no other call of the message passes its check
/// until this one is recorded and the permit dropped.
#[derive(Debug)]
pub struct CallPermit {
    _gate: Option<tokio::sync::OwnedMutexGuard<()>>,
}

/// The spend of one message in flight; the message ends when this is dropped.
#[derive(Debug)]
pub struct MessageSpend {
    ledger: Ledger,
    session_id: String,
    number: u64,
}

impl MessageSpend {
    /// What the message has cost so far.
    pub fn spent(&self) -> f64 {
        self.ledger.message_spent(&self.session_id)
    }
}

impl Drop for MessageSpend {
    fn drop(&mut self) {
        let mut messages = self.ledger.lock_messages();
        if messages
            .get(&self.session_id)
            .is_some_and(|m| m.number == self.number)
        {
            messages.remove(&self.session_id);
        }
    }
}

impl Ledger {
    /// The ledger on `db`, with its cost spool beside the database file
    /// ([`spool::Spool::beside`]).
    pub fn new(db: Db, cfg: &Config) -> Ledger {
        let spool = Arc::new(spool::Spool::beside(db.path()));
        Ledger {
            db,
            budget: Arc::new(Mutex::new(cfg.budget)),
            tz: cfg.agent.timezone.clone(),
            pending: Arc::default(),
            spool: Some(spool),
            messages: Arc::default(),
            sources: Arc::default(),
            cache_watch: None,
        }
    }

    /// A ledger on `db` with `budget`, in UTC (unit tests of the layers above).
    #[cfg(test)]
    pub(crate) fn for_tests(db: Db, budget: BudgetConfig) -> Ledger {
        Ledger {
            db,
            budget: Arc::new(Mutex::new(budget)),
            tz: Zone::utc(),
            pending: Arc::default(),
            spool: None,
            messages: Arc::default(),
            sources: Arc::default(),
            cache_watch: None,
        }
    }

    /// Run the cache alarm after each recorded model call (SPEC §20).
    pub fn with_cache_watch(mut self, watch: alarm::CacheWatch) -> Ledger {
        self.cache_watch = Some(Arc::new(watch));
        self
    }

    /// The source of `session_id`'s latest message, if known.
    fn source_of(&self, session_id: &str) -> Option<String> {
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(session_id)
            .cloned()
    }

    /// The rows billed to `session_id` from now on come from a message of `source`
    /// (`control::Source` as a string), for `--cost --by source` (SPEC §20).
    pub fn set_source(&self, session_id: &str, source: &str) {
        let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        if sources.get(session_id).map(String::as_str) == Some(source) {
            return;
        }
        if sources.len() >= MAX_SOURCES {
            sources.clear();
        }
        sources.insert(session_id.to_string(), source.to_string());
    }

    /// A message of `session_id` starts: from now until the returned guard is dropped, every
    /// row billed to that session counts towards the message's spend. A session runs one
    /// message at a time; a new one replaces any earlier entry.
    pub fn begin_message(&self, session_id: &str) -> MessageSpend {
        static NUMBER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let number = NUMBER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.lock_messages().insert(
            session_id.to_string(),
            InFlight {
                number,
                spent: 0.0,
                usage: Usage::default(),
                calls: Arc::default(),
            },
        );
        MessageSpend {
            ledger: self.clone(),
            session_id: session_id.to_string(),
            number,
        }
    }

    /// The spend of the message in flight in `session_id` (0 when there is none).
    pub fn message_spent(&self, session_id: &str) -> f64 {
        self.lock_messages()
            .get(session_id)
            .map_or(0.0, |m| m.spent)
    }

    /// The cost and tokens of every row billed to the message in flight in `session_id` so
    /// far (zero when there is none): what the message reports as its cost.
    pub fn message_totals(&self, session_id: &str) -> (f64, Usage) {
        self.lock_messages()
            .get(session_id)
            .map_or((0.0, Usage::default()), |m| (m.spent, m.usage))
    }

    /// [`Ledger::check`] for a provider call billed to `session_id`, against the spend of its
    /// message in flight. With a per-message limit set, waits for the message's call gate
    /// first and returns holding it: keep the permit until the call is recorded, so calls of
    /// one message (parallel sub-agents) are checked and made one at a time and the message
    /// stops within one call of its limit. Never hold a permit while waiting for another.
    pub async fn check_call(&self, session_id: &str) -> Result<CallPermit, BudgetError> {
        let gate = (self.budget().per_message_usd > 0.0)
            .then(|| {
                self.lock_messages()
                    .get(session_id)
                    .map(|m| m.calls.clone())
            })
            .flatten();
        let permit = match gate {
            Some(g) => Some(g.lock_owned().await),
            None => None,
        };
        self.check(self.message_spent(session_id)).await?;
        Ok(CallPermit { _gate: permit })
    }

    /// The database the ledger writes to (for readers of the totals, e.g. `session_status`).
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Before a provider call: rows still pending are written first, then the daily, monthly
    /// and per-message limits apply (`spent_message`: what the current message has cost so
    /// far; 0 for calls outside a message). `Err` when a limit is reached (the message names
    /// it), when pending rows still cannot be written, or when the ledger cannot be read while
    /// a limit is set (fail closed).
    pub async fn check(&self, spent_message: f64) -> Result<(), BudgetError> {
        self.flush().await?;
        let budget = self.budget();
        budget_gate(&self.db, &budget, &self.tz, Utc::now(), spent_message).await
    }

    /// The limits in force.
    pub fn budget(&self) -> BudgetConfig {
        *self.budget.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// New limits (a SIGHUP reload, SPEC §16.5): the next check applies them, for every clone.
    pub fn set_budget(&self, budget: BudgetConfig) {
        *self.budget.lock().unwrap_or_else(|p| p.into_inner()) = budget;
    }

    /// [`Ledger::check`] for a call outside a message (consolidation, a transcription at
    /// intake, `doctor`'s probe).
    pub async fn gate(&self) -> Result<(), BudgetError> {
        self.check(0.0).await
    }

    /// [`Ledger::record_call`] of a call answered by the model asked for (the unit tests here).
    #[cfg(test)]
    pub(crate) async fn record(
        &self,
        session_id: &str,
        spec: &ModelSpec,
        call_type: CallType,
        usage: Usage,
    ) -> f64 {
        self.record_call(session_id, spec, call_type, usage, None)
            .await
    }

    /// Record one call of `spec` and return its cost; `fallback_from` names the model asked
    /// for when `spec` answered as its fallback (SPEC §18.3, the row's `fallback_from`). A row
    /// that cannot be written is kept for the next [`Ledger::check`] (in the spool, fsynced
    /// before this returns) and logged, not returned: the call already happened. Only
    /// `gateway::Gateway` calls it (and `record_audio`).
    pub async fn record_call(
        &self,
        session_id: &str,
        spec: &ModelSpec,
        call_type: CallType,
        usage: Usage,
        fallback_from: Option<&str>,
    ) -> f64 {
        let row = CostRow {
            timestamp: Utc::now().timestamp(),
            session_id: session_id.to_string(),
            model: spec.model.clone(),
            provider: spec.provider.clone(),
            call_type,
            usage,
            cost_usd: cost_usd(&spec.pricing, &usage),
            fallback_from: fallback_from.map(str::to_string),
            source: self.source_of(session_id),
        };
        let (cost, timestamp) = (row.cost_usd, row.timestamp);
        if self.write_row(row).await
            && call_type != CallType::Embedding
            && let Some(watch) = &self.cache_watch
        {
            watch.check(&self.db, timestamp).await;
        }
        cost
    }

    /// Record an audio call of `spec` (SPEC §19) whose price is not in tokens: a
    /// transcription of `seconds` of audio at `cost_per_minute`, or a synthesis of `chars`
    /// characters at `cost_per_1k_chars`. Returns its cost.
    pub async fn record_audio(&self, session_id: &str, spec: &ModelSpec, call: AudioCall) -> f64 {
        let (call_type, cost) = match call {
            AudioCall::Transcription { seconds } => (
                CallType::Transcription,
                spec.pricing.per_minute * seconds.max(0.0) / 60.0,
            ),
            AudioCall::Speech { chars } => (
                CallType::Tts,
                spec.pricing.per_1k_chars * chars as f64 / 1000.0,
            ),
        };
        let cost = if cost.is_finite() { cost } else { 0.0 };
        let source = self.source_of(session_id);
        let row = CostRow {
            timestamp: Utc::now().timestamp(),
            session_id: session_id.to_string(),
            model: spec.model.clone(),
            provider: spec.provider.clone(),
            call_type,
            usage: Usage::default(),
            cost_usd: cost,
            fallback_from: None,
            source,
        };
        self.write_row(row).await;
        cost
    }

    /// Count `row` towards its session's message in flight and insert it; `false` when the
    /// insert failed and the row is kept for later ([`Ledger::keep`]).
    async fn write_row(&self, row: CostRow) -> bool {
        if let Some(m) = self.lock_messages().get_mut(&row.session_id) {
            m.spent += row.cost_usd;
            m.usage.add(&row.usage);
        }
        match self.db.insert_cost(row.clone()).await {
            Ok(()) => true,
            Err(e) => {
                self.keep(row, &e).await;
                false
            }
        }
    }

    /// Keep a row whose insert failed until it can be written: in the spool, durably, before
    /// this returns (so before the call's answer is used); in memory when the spool cannot
    /// take it (the spool logs why), where a stop loses it.
    async fn keep(&self, row: CostRow, error: &StoreError) {
        let call_type = row.call_type.as_str();
        if let Some(spool) = &self.spool
            && spool.append(&row).await.is_ok()
        {
            tracing::error!(error = %error, call_type, spool = %spool.path().display(), "cannot record cost row; kept in the spool until it can be written");
            return;
        }
        tracing::error!(error = %error, call_type, "cannot record cost row; kept in memory until it can be written");
        self.lock_pending().push(row);
    }

    /// Write the rows an earlier run left in the cost spool (it stopped or crashed while the
    /// database could not be written): the daemon calls it at start, before the first budget
    /// check. A failure is logged; the next check tries again and refuses the call meanwhile.
    pub async fn replay_spool(&self) {
        if let Err(e) = self.flush().await {
            tracing::error!(error = %e, "cannot write the cost rows of the spool");
        }
    }

    /// Replay the spool when it may hold rows, then write the rows kept in memory, oldest
    /// first; the first failure stops and keeps the rest.
    async fn flush(&self) -> Result<(), BudgetError> {
        if let Some(spool) = self.spool.as_ref().filter(|s| s.unreplayed()) {
            spool
                .replay(&self.db)
                .await
                .map_err(|e| BudgetError::Unrecorded {
                    pending: e.left + self.lock_pending().len(),
                    error: e.error,
                })?;
        }
        let rows = std::mem::take(&mut *self.lock_pending());
        let mut rows = rows.into_iter();
        while let Some(row) = rows.next() {
            if let Err(error) = self.db.insert_cost(row.clone()).await {
                let mut pending = self.lock_pending();
                // Rows recorded meanwhile stay behind the older ones.
                let newer = std::mem::take(&mut *pending);
                pending.push(row);
                pending.extend(rows);
                pending.extend(newer);
                return Err(BudgetError::Unrecorded {
                    pending: pending.len(),
                    error: error.into(),
                });
            }
        }
        Ok(())
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, Vec<CostRow>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_messages(&self) -> std::sync::MutexGuard<'_, HashMap<String, InFlight>> {
        self.messages.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{CallType, CostRow};
    use proptest::prelude::*;

    const SONNET: Pricing = Pricing {
        input: 3.0,
        output: 15.0,
        cache_read: 0.30,
        cache_write: 3.75,
        cache_write_1h: 6.0,
        per_minute: 0.0,
        per_1k_chars: 0.0,
    };

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn ts(s: &str) -> i64 {
        utc(s).timestamp()
    }

    #[test]
    fn pricing_arithmetic_is_exact() {
        let u = Usage {
            input_tokens: 1000,
            output_tokens: 500,
            cache_read_tokens: 2000,
            cache_write_tokens: 100,
            cache_write_1h_tokens: 0,
        };
        // 1000·3 + 500·15 + 2000·0.30 + 100·3.75 = 3000 + 7500 + 600 + 375 = 11475 per million.
        assert!((cost_usd(&SONNET, &u) - 0.011475).abs() < 1e-12);
        // SPEC §20: of the 100 written, 40 with the 1-hour TTL at 6.0: 60·3.75 + 40·6 = 465.
        let long = Usage {
            cache_write_1h_tokens: 40,
            ..u
        };
        assert!((cost_usd(&SONNET, &long) - 0.011565).abs() < 1e-12);
        // A figure above the writes (a malformed answer) never prices more than the writes.
        let over = Usage {
            cache_write_1h_tokens: 1000,
            ..u
        };
        assert!((cost_usd(&SONNET, &over) - (0.011475 - 0.000375 + 0.0006)).abs() < 1e-12);
        // Each rate applies to its own count only.
        let only = |i, o, cr, cw| Usage {
            input_tokens: i,
            output_tokens: o,
            cache_read_tokens: cr,
            cache_write_tokens: cw,
            cache_write_1h_tokens: 0,
        };
        assert_eq!(cost_usd(&SONNET, &only(1_000_000, 0, 0, 0)), 3.0);
        assert_eq!(cost_usd(&SONNET, &only(0, 1_000_000, 0, 0)), 15.0);
        assert!((cost_usd(&SONNET, &only(0, 0, 1_000_000, 0)) - 0.30).abs() < 1e-12);
        assert_eq!(cost_usd(&SONNET, &only(0, 0, 0, 1_000_000)), 3.75);
        assert_eq!(cost_usd(&Pricing::default(), &u), 0.0);
    }

    #[test]
    fn period_parsing() {
        for (s, p) in [
            ("today", Period::Today),
            ("week", Period::Week),
            ("month", Period::Month),
            ("all", Period::All),
            (" Month ", Period::Month),
        ] {
            assert_eq!(s.parse::<Period>().unwrap(), p);
        }
        for p in [Period::Today, Period::Week, Period::Month, Period::All] {
            assert_eq!(p.as_str().parse::<Period>().unwrap(), p);
        }
        let err = "yesterday".parse::<Period>().unwrap_err().to_string();
        assert_eq!(
            err,
            "unknown period \"yesterday\": expected one of today, week, month, all"
        );
        assert!("".parse::<Period>().is_err());
        // Outside input is echoed bounded.
        let long = "x"
            .repeat(10_000)
            .parse::<Period>()
            .unwrap_err()
            .to_string();
        assert!(long.len() < 120, "{long}");
    }

    proptest! {
        #[test]
        fn period_parser_never_panics_and_only_accepts_names(s in ".{0,64}") {
            match s.parse::<Period>() {
                Ok(p) => prop_assert_eq!(p.as_str(), s.trim().to_ascii_lowercase()),
                Err(e) => prop_assert!(e.to_string().contains("today, week, month, all")),
            }
        }
    }

    #[test]
    fn period_starts_in_berlin_on_spring_forward_day() {
        let tz = crate::zone::Zone::get("Europe/Berlin").unwrap();
        // 2026-03-29: clocks jump 02:00 CET → 03:00 CEST. Noon UTC is 14:00 CEST.
        let now = utc("2026-03-29T12:00:00Z");
        // Midnight was still CET (+01:00).
        assert_eq!(
            Period::Today.start(&tz, now),
            Some(ts("2026-03-28T23:00:00Z"))
        );
        assert_eq!(
            Period::Week.start(&tz, now),
            Some(ts("2026-03-22T12:00:00Z"))
        );
        assert_eq!(
            Period::Month.start(&tz, now),
            Some(ts("2026-02-28T23:00:00Z"))
        );
        assert_eq!(Period::All.start(&tz, now), None);
        // 23:30 UTC on the 28th is already the 29th in Berlin.
        assert_eq!(
            Period::Today.start(&tz, utc("2026-03-28T23:30:00Z")),
            Some(ts("2026-03-28T23:00:00Z"))
        );
        // And 22:59 UTC is still the 28th.
        assert_eq!(
            Period::Today.start(&tz, utc("2026-03-28T22:59:59Z")),
            Some(ts("2026-03-27T23:00:00Z"))
        );
    }

    #[test]
    fn period_starts_in_berlin_after_dst_changes() {
        let tz = crate::zone::Zone::get("Europe/Berlin").unwrap();
        // April: the month began in CEST (+02:00) although March 1 was CET.
        let april = utc("2026-04-10T08:00:00Z");
        assert_eq!(
            Period::Month.start(&tz, april),
            Some(ts("2026-03-31T22:00:00Z"))
        );
        // 2026-10-25: clocks fall back 03:00 CEST → 02:00 CET; midnight was CEST.
        let fall = utc("2026-10-25T12:00:00Z");
        assert_eq!(
            Period::Today.start(&tz, fall),
            Some(ts("2026-10-24T22:00:00Z"))
        );
        // The local day is 25 h long, "week" stays exactly 7×24 h.
        assert_eq!(
            Period::Week.start(&tz, fall),
            Some(ts("2026-10-18T12:00:00Z"))
        );
        assert_eq!(
            Period::Month.start(&tz, fall),
            Some(ts("2026-09-30T22:00:00Z"))
        );
    }

    #[test]
    fn missing_local_midnight_uses_the_first_valid_time() {
        // Chile springs forward at 24:00 → 01:00: 2024-09-08 00:00 never happened in Santiago.
        let tz = crate::zone::Zone::get("America/Santiago").unwrap();
        let now = utc("2024-09-08T15:00:00Z"); // 12:00 -03
        assert_eq!(
            Period::Today.start(&tz, now),
            Some(ts("2024-09-08T04:00:00Z")) // 01:00 -03
        );
    }

    fn budget(per_message: f64, daily: f64, monthly: f64) -> BudgetConfig {
        BudgetConfig {
            per_message_usd: per_message,
            daily_usd: daily,
            monthly_usd: monthly,
        }
    }

    #[test]
    fn zero_limits_are_off() {
        assert!(check_budget(&budget(0.0, 0.0, 0.0), 1e9, 1e9, 1e9).is_ok());
    }

    #[test]
    fn daily_limit() {
        let cfg = budget(0.0, 5.0, 0.0);
        assert!(check_budget(&cfg, 4.99, 1e6, 1e6).is_ok());
        assert_eq!(
            check_budget(&cfg, 5.02, 0.0, 0.0).unwrap_err(),
            "daily budget of $5.00 reached ($5.02 spent today); raise [budget] daily_usd or \
             wait until tomorrow"
        );
        // Reaching the limit exactly stops the next call.
        assert!(check_budget(&cfg, 5.0, 0.0, 0.0).is_err());
    }

    #[test]
    fn monthly_limit() {
        let cfg = budget(0.0, 0.0, 50.0);
        assert!(check_budget(&cfg, 1e6, 49.5, 1e6).is_ok());
        let err = check_budget(&cfg, 0.0, 50.0, 0.0).unwrap_err();
        assert!(err.starts_with("monthly budget of $50.00 reached ($50.00 spent this month)"));
        assert!(err.contains("[budget] monthly_usd"), "{err}");
    }

    #[test]
    fn per_message_limit() {
        let cfg = budget(0.05, 0.0, 0.0);
        assert!(check_budget(&cfg, 1e6, 1e6, 0.0499).is_ok());
        let err = check_budget(&cfg, 0.0, 0.0, 0.0512).unwrap_err();
        assert!(
            err.starts_with("per-message budget of $0.05 reached ($0.0512 spent on this message)"),
            "{err}"
        );
        assert!(err.contains("[budget] per_message_usd"), "{err}");
    }

    #[test]
    fn usd_formatting() {
        assert_eq!(usd(5.0), "$5.00");
        assert_eq!(usd(5.02), "$5.02");
        assert_eq!(usd(0.0123), "$0.0123");
        assert_eq!(usd(0.5), "$0.50");
        assert_eq!(usd(1234.5), "$1234.50");
    }

    async fn ledger() -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("agentd.db")).unwrap();
        (dir, db)
    }

    async fn spend(db: &Db, at: &str, usd: f64) {
        db.insert_cost(CostRow {
            timestamp: ts(at),
            session_id: "s".into(),
            model: "m".into(),
            provider: "p".into(),
            call_type: CallType::Chat,
            usage: Usage::default(),
            cost_usd: usd,
            fallback_from: None,
            source: None,
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn gate_reads_today_and_month_from_the_ledger() {
        let (_d, db) = ledger().await;
        let tz = crate::zone::Zone::get("Europe/Berlin").unwrap();
        let now = utc("2026-03-29T12:00:00Z");
        spend(&db, "2026-03-28T22:59:59Z", 3.0).await; // yesterday in Berlin, this month
        spend(&db, "2026-03-28T23:00:00Z", 2.0).await; // today (local midnight)
        spend(&db, "2026-02-28T22:00:00Z", 100.0).await; // last month

        // Today: $2 < $2.5 ok; the $3 of yesterday does not count.
        assert!(
            budget_gate(&db, &budget(0.0, 2.5, 0.0), &tz, now, 0.0)
                .await
                .is_ok()
        );
        let err = budget_gate(&db, &budget(0.0, 2.0, 0.0), &tz, now, 0.0)
            .await
            .unwrap_err();
        assert!(matches!(err, BudgetError::Exceeded(_)));
        assert!(err.to_string().contains("($2.00 spent today)"), "{err}");

        // Month: $5 this month, last month's $100 excluded.
        assert!(
            budget_gate(&db, &budget(0.0, 0.0, 5.01), &tz, now, 0.0)
                .await
                .is_ok()
        );
        let err = budget_gate(&db, &budget(0.0, 0.0, 5.0), &tz, now, 0.0)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("($5.00 spent this month)"),
            "{err}"
        );

        // Per message needs no ledger.
        let err = budget_gate(&db, &budget(1.0, 0.0, 0.0), &tz, now, 1.5)
            .await
            .unwrap_err();
        assert!(err.to_string().starts_with("per-message budget"), "{err}");
    }

    #[tokio::test]
    async fn gate_skips_the_database_when_limits_are_off() {
        // A handle on which every ledger query fails: reaching the DB would be an error.
        let db = Db::without_schema_for_test();
        let now = utc("2026-03-29T12:00:00Z");
        let tz = crate::zone::Zone::get("Europe/Berlin").unwrap();
        assert!(db.spend_since(0).await.is_err(), "precondition");
        assert!(
            budget_gate(&db, &budget(0.0, 0.0, 0.0), &tz, now, 123.0)
                .await
                .is_ok()
        );
        assert!(
            budget_gate(&db, &budget(200.0, 0.0, 0.0), &tz, now, 123.0)
                .await
                .is_ok()
        );
        for cfg in [budget(0.0, 1.0, 0.0), budget(0.0, 0.0, 1.0)] {
            let err = budget_gate(&db, &cfg, &tz, now, 0.0).await.unwrap_err();
            assert!(matches!(err, BudgetError::Store(_)), "{err}");
            assert!(err.to_string().contains("no such table"), "{err}");
        }
    }

    fn ledger_on(db: Db, cfg: BudgetConfig) -> Ledger {
        Ledger {
            db,
            budget: Arc::new(Mutex::new(cfg)),
            tz: crate::zone::Zone::utc(),
            pending: Arc::default(),
            spool: None,
            messages: Arc::default(),
            sources: Arc::default(),
            cache_watch: None,
        }
    }

    fn spec() -> ModelSpec {
        crate::llm::testutil::model_spec("primary", crate::config::ProviderKind::Anthropic, "x")
    }

    #[tokio::test]
    async fn new_limits_apply_to_every_clone_at_the_next_check() {
        let (_dir, db) = ledger().await;
        let ledger = ledger_on(db, budget(0.0, 0.0, 0.0));
        let clone = ledger.clone();
        assert!(clone.check(1.0).await.is_ok(), "no limit yet");
        ledger.set_budget(budget(0.5, 0.0, 0.0));
        let err = clone.check(1.0).await.unwrap_err();
        assert!(err.to_string().contains("per-message budget"), "{err}");
        ledger.set_budget(budget(0.0, 0.0, 0.0));
        assert!(clone.check(1.0).await.is_ok(), "limit lifted again");
    }

    #[tokio::test]
    async fn a_row_that_cannot_be_written_stops_every_later_call() {
        // Every insert fails on this handle; no limit is set.
        let ledger = ledger_on(Db::without_schema_for_test(), budget(0.0, 0.0, 0.0));
        assert!(ledger.check(0.0).await.is_ok(), "nothing pending yet");
        let mut s = spec();
        s.pricing = SONNET;
        let usage = Usage {
            input_tokens: 1000,
            ..Usage::default()
        };
        let cost = ledger.record("s", &s, CallType::Chat, usage).await;
        assert!((cost - 0.003).abs() < 1e-12, "the cost is returned anyway");
        let err = ledger.clone().gate().await.unwrap_err();
        assert!(
            matches!(err, BudgetError::Unrecorded { pending: 1, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("check the disk"), "{err}");
        // Still pending: the next check fails the same way.
        assert!(ledger.check(0.0).await.is_err());
        assert_eq!(ledger.lock_pending().len(), 1);
    }

    /// The ledger the daemon builds ([`Ledger::new`]: with its spool), on the database at
    /// `path`; no limit.
    fn daemon_ledger(path: &std::path::Path) -> Ledger {
        let ledger = ledger_on(Db::open(path).unwrap(), budget(0.0, 0.0, 0.0));
        Ledger {
            spool: Some(Arc::new(spool::Spool::beside(path))),
            ..ledger
        }
    }

    /// SPEC §16.4: a row the database refuses is in the spool, fsynced, when `record` returns
    /// (the answer is used after that); a stop loses nothing: the next run writes it before its
    /// first budget check.
    #[tokio::test]
    async fn a_row_the_database_refuses_survives_a_stop_in_the_spool() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agentd.db");
        let ledger = daemon_ledger(&path);
        ledger.replay_spool().await;
        spool::tests::fail_inserts(&path, true);
        let mut s = spec();
        s.pricing = SONNET;
        let usage = Usage {
            input_tokens: 1000,
            ..Usage::default()
        };
        ledger.record("s", &s, CallType::Chat, usage).await;
        let spooled = std::fs::read_to_string(dir.path().join("agentd.db.spool")).unwrap();
        assert_eq!(spooled.lines().count(), 1, "{spooled}");
        assert!(ledger.lock_pending().is_empty(), "not only in memory");
        let err = ledger.gate().await.unwrap_err();
        assert!(
            matches!(err, BudgetError::Unrecorded { pending: 1, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("disk is full"), "{err}");

        // Stopped (the memory is gone); the next run on a working database.
        drop(ledger);
        spool::tests::fail_inserts(&path, false);
        let ledger = daemon_ledger(&path);
        ledger.gate().await.unwrap();
        let summary = ledger.db().cost_summary(None).await.unwrap();
        assert!((summary.total_cost - 0.003).abs() < 1e-12, "{summary:?}");
        assert_eq!(summary.models[0].input_tokens, 1000);
    }

    #[tokio::test]
    async fn a_row_the_spool_cannot_take_either_stays_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger {
            spool: Some(Arc::new(spool::Spool::beside(
                &dir.path().join("missing/agentd.db"),
            ))),
            ..ledger_on(Db::without_schema_for_test(), budget(0.0, 0.0, 0.0))
        };
        let mut s = spec();
        s.pricing = SONNET;
        ledger
            .record("s", &s, CallType::Chat, Usage::default())
            .await;
        assert_eq!(ledger.lock_pending().len(), 1);
        let err = ledger.gate().await.unwrap_err();
        assert!(matches!(err, BudgetError::Unrecorded { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn pending_rows_are_written_before_the_budget_is_read() {
        let (_d, db) = ledger().await;
        let ledger = ledger_on(db.clone(), budget(0.0, 1.0, 0.0));
        let now = Utc::now().timestamp();
        for usd in [0.6, 0.5] {
            ledger.lock_pending().push(CostRow {
                timestamp: now,
                session_id: "s".into(),
                model: "m".into(),
                provider: "p".into(),
                call_type: CallType::Subagent,
                usage: Usage::default(),
                cost_usd: usd,
                fallback_from: None,
                source: None,
            });
        }
        // The two rows reach the daily limit once written.
        let err = ledger.check(0.0).await.unwrap_err();
        assert!(matches!(err, BudgetError::Exceeded(_)), "{err:?}");
        assert!(ledger.lock_pending().is_empty());
        let total = db.cost_summary(None).await.unwrap().total_cost;
        assert!((total - 1.1).abs() < 1e-9, "{total}");
    }

    #[tokio::test]
    async fn a_message_counts_every_row_billed_to_its_session_while_it_runs() {
        let (_d, db) = ledger().await;
        let ledger = ledger_on(db, budget(0.0, 0.0, 0.0));
        let mut s = spec();
        s.pricing = SONNET;
        let usage = Usage {
            input_tokens: 1000,
            ..Usage::default()
        };
        ledger.record("a", &s, CallType::Chat, usage).await;
        let message = ledger.begin_message("a");
        assert_eq!(message.spent(), 0.0, "rows before the message do not count");
        for kind in [CallType::Chat, CallType::Subagent, CallType::Compaction] {
            ledger.clone().record("a", &s, kind, usage).await;
        }
        ledger.record("b", &s, CallType::Chat, usage).await;
        assert!(
            (message.spent() - 0.009).abs() < 1e-12,
            "{}",
            message.spent()
        );
        assert_eq!(ledger.message_spent("b"), 0.0);
        drop(message);
        assert_eq!(ledger.message_spent("a"), 0.0);
        // A guard of an earlier message does not end a later one.
        let first = ledger.begin_message("a");
        let second = ledger.begin_message("a");
        drop(first);
        ledger.record("a", &s, CallType::Chat, usage).await;
        assert!((second.spent() - 0.003).abs() < 1e-12);
    }

    #[tokio::test]
    async fn a_messages_calls_pass_their_check_one_at_a_time_and_its_totals_are_its_rows() {
        let (_d, db) = ledger().await;
        let ledger = ledger_on(db, budget(0.005, 0.0, 0.0));
        let mut s = spec();
        s.pricing = SONNET;
        let usage = Usage {
            input_tokens: 1000,
            output_tokens: 10,
            ..Usage::default()
        };
        let _message = ledger.begin_message("a");
        let first = ledger.check_call("a").await.unwrap();
        // A second call of the message (a parallel sub-agent) waits for the first's record.
        let l2 = ledger.clone();
        let second = tokio::spawn(async move { l2.check_call("a").await.map(|_| ()) });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!second.is_finished(), "checked beside a call in flight");
        ledger.record("a", &s, CallType::Subagent, usage).await;
        ledger.record("a", &s, CallType::Subagent, usage).await;
        drop(first);
        let refused = second.await.unwrap();
        assert!(
            matches!(refused, Err(BudgetError::Exceeded(_))),
            "{refused:?}"
        );
        let (cost, totals) = ledger.message_totals("a");
        assert!((cost - 2.0 * cost_usd(&s.pricing, &usage)).abs() < 1e-12);
        assert_eq!((totals.input_tokens, totals.output_tokens), (2000, 20));
        // Another session's calls are not held.
        assert!(ledger.check_call("b").await.is_ok());
    }
}
