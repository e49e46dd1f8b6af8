//! The cost ledger (SPEC §8): one row per provider call, and the sums budgets, `--cost`,
//! `GET /api/v1/cost` and `session_status` read.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::{Db, StoreError};
use crate::message::Usage;

/// What kind of provider call a cost row records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallType {
    Chat,
    Subagent,
    Compaction,
    Consolidation,
    Embedding,
    /// Speech to text of an inbound audio file (SPEC §19), priced per minute.
    Transcription,
    /// Text to speech (SPEC §19), priced per 1000 characters.
    Tts,
}

impl CallType {
    /// The `call_type` column value: `"chat"`, `"subagent"`, `"compaction"`,
    /// `"consolidation"`, `"embedding"`, `"transcription"` or `"tts"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            CallType::Chat => "chat",
            CallType::Subagent => "subagent",
            CallType::Compaction => "compaction",
            CallType::Consolidation => "consolidation",
            CallType::Embedding => "embedding",
            CallType::Transcription => "transcription",
            CallType::Tts => "tts",
        }
    }
}

impl std::fmt::Display for CallType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One provider call to record.
#[derive(Debug, Clone, PartialEq)]
pub struct CostRow {
    /// Unix seconds.
    pub timestamp: i64,
    pub session_id: String,
    /// API model id.
    pub model: String,
    /// Provider name (`anthropic`, `openai`, ...).
    pub provider: String,
    pub call_type: CallType,
    pub usage: Usage,
    pub cost_usd: f64,
    /// The config name of the model asked for, when a fallback model answered (SPEC §18.3).
    pub fallback_from: Option<String>,
    /// Where the message that made the call came from (`control::Source`), when known.
    pub source: Option<String>,
}

/// Spend over a period: the total and one entry per model, most expensive first. This is the
/// body of `GET /api/v1/cost` (plus `period`) and of `agent-send --cost`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostSummary {
    pub total_cost: f64,
    pub models: Vec<ModelCost>,
}

/// Token and cost totals of one model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelCost {
    pub model: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    pub cost_usd: f64,
}

/// What `--cost --by` groups rows by (SPEC §20).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    Session,
    Source,
    Model,
}

impl GroupBy {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupBy::Session => "session",
            GroupBy::Source => "source",
            GroupBy::Model => "model",
        }
    }

    /// The column: a fixed name, never text from outside.
    fn column(self) -> &'static str {
        match self {
            GroupBy::Session => "session_id",
            GroupBy::Source => "source",
            GroupBy::Model => "model",
        }
    }
}

impl std::str::FromStr for GroupBy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "session" => Ok(GroupBy::Session),
            "source" => Ok(GroupBy::Source),
            "model" => Ok(GroupBy::Model),
            _ => Err(format!(
                "unknown grouping {:?}: expected session, source or model",
                crate::control::escaped_preview(s)
            )),
        }
    }
}

/// Token and cost totals of one group, with its cache hit ratio.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupCost {
    /// The session id, source or model; `"(unknown)"` for rows without one.
    pub key: String,
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    pub cache_write_1h_tokens: u64,
    pub cost_usd: f64,
    /// Cache reads / all prompt tokens (input + cache reads + cache writes); `None` without
    /// prompt tokens.
    pub hit_ratio: Option<f64>,
}

/// One day's spend of one model from one source ([`Db::cost_daily`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DayCost {
    /// Days since 1970-01-01 in the asked offset.
    pub day: i64,
    pub model: String,
    pub source: String,
    pub input_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    pub cost_usd: f64,
}

/// Cache reads / all prompt tokens; `None` when there were none.
pub fn hit_ratio(input: u64, cache_read: u64, cache_write: u64) -> Option<f64> {
    let all = input.saturating_add(cache_read).saturating_add(cache_write);
    (all > 0).then(|| cache_read as f64 / all as f64)
}

/// The prompt cache's hit ratio (SPEC §20): over the last `RECENT_CALLS` calls with prompt
/// tokens, and over the baseline period; each `None` without such calls.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CacheRatios {
    pub recent_calls: u64,
    pub hit_ratio_recent: Option<f64>,
    pub hit_ratio_baseline: Option<f64>,
}

/// The calls the recent hit ratio is taken over (SPEC §20).
pub const RECENT_CALLS: u32 = 20;

/// Running sums for [`Db::spend_since`], one per period start asked for (the budget asks for
/// today's and this month's): the total of the rows with `timestamp >= since` among those with
/// `id <= last_id`. The ledger is append-only (rows are never deleted or updated) and an
/// `INTEGER PRIMARY KEY` gives each new row a larger id, so the rows added since are exactly
/// those with `id > last_id`, also when another process (`agentd index`, `agentd consolidate`)
/// wrote them.
#[derive(Clone, Debug, Default)]
pub(crate) struct SpendMarks(Arc<Mutex<Vec<SpendMark>>>);

#[derive(Clone, Copy, Debug, PartialEq)]
struct SpendMark {
    since: i64,
    total: f64,
    last_id: i64,
}

/// Period starts remembered at most (today and this month, with room for a change of day).
const MAX_MARKS: usize = 4;

impl SpendMarks {
    fn get(&self, since: i64) -> Option<SpendMark> {
        let marks = self.0.lock().unwrap_or_else(|p| p.into_inner());
        marks.iter().find(|m| m.since == since).copied()
    }

    fn put(&self, mark: SpendMark) {
        let mut marks = self.0.lock().unwrap_or_else(|p| p.into_inner());
        marks.retain(|m| m.since != mark.since);
        if marks.len() >= MAX_MARKS {
            marks.remove(0);
        }
        marks.push(mark);
    }
}

/// Token counts are `u64` in Rust and `INTEGER` (i64) in SQLite. A count beyond `i64::MAX` is
/// stored as `i64::MAX` rather than failing the insert: a cost row that cannot be written
/// stops every later call (SPEC §16.4). The parsers refuse such figures before they get here
/// (`message::MAX_TOKENS_PER_CALL`), and the sums read such a row as no spend ([`plausible!`]).
fn to_sql_count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A sum read back (SQLite `TOTAL`, a float): NaN or negative is 0, beyond `u64::MAX` is
/// `u64::MAX`.
fn from_sql_total(n: f64) -> u64 {
    if n.is_nan() || n <= 0.0 {
        0
    } else {
        // `as` saturates.
        n as u64
    }
}

/// The SQL condition a cost row must meet to count in any sum: every token count between 0
/// and `message::MAX_TOKENS_PER_CALL` (NULL reads as 0), and a cost that is not negative and
/// finite (NULL, e.g. a NaN written by SQLite, reads as 0). No build writes anything else
/// today; a row beyond this was left by a build that did not validate usage (issue #12: a
/// provider answered `input_tokens = u64::MAX`, stored as `i64::MAX` at 5.5e13 USD). Its
/// figures are known to be false and the real charge is unknown, so it counts as nothing:
/// `/status`, `/cost` and the budget stay sane, and the row stays in the file for inspection.
///
/// Sums use `TOTAL` (a float that never overflows) rather than `SUM` (which fails the whole
/// query with "integer overflow").
macro_rules! plausible {
    () => {
        "(COALESCE(input_tokens, 0) BETWEEN 0 AND 10000000 \
          AND COALESCE(output_tokens, 0) BETWEEN 0 AND 10000000 \
          AND COALESCE(cache_read_tokens, 0) BETWEEN 0 AND 10000000 \
          AND COALESCE(cache_write_tokens, 0) BETWEEN 0 AND 10000000 \
          AND COALESCE(cost_usd, 0) BETWEEN 0 AND 1.7976931348623157e308)"
    };
}

/// The period's total and the largest id, read in one statement (one snapshot of the table).
fn scan_spend(conn: &rusqlite::Connection, since: i64) -> rusqlite::Result<SpendMark> {
    conn.prepare_cached(concat!(
        "SELECT (SELECT TOTAL(cost_usd) FROM costs WHERE timestamp >= ?1 AND ",
        plausible!(),
        "), (SELECT MAX(id) FROM costs)"
    ))?
    .query_row([since], |r| {
        Ok(SpendMark {
            since,
            total: r.get(0)?,
            last_id: r.get::<_, Option<i64>>(1)?.unwrap_or(0),
        })
    })
}

/// Insert `row` into `costs` (on the connection or transaction the caller holds).
fn insert_row(conn: &rusqlite::Connection, row: &CostRow) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO costs (timestamp, session_id, model, provider, call_type, \
         input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd, \
         fallback_from, cache_write_1h_tokens, source) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )?
    .execute(rusqlite::params![
        row.timestamp,
        row.session_id,
        row.model,
        row.provider,
        row.call_type.as_str(),
        to_sql_count(row.usage.input_tokens),
        to_sql_count(row.usage.output_tokens),
        to_sql_count(row.usage.cache_read_tokens),
        to_sql_count(row.usage.cache_write_tokens),
        row.cost_usd,
        row.fallback_from,
        to_sql_count(row.usage.cache_write_1h_tokens),
        row.source,
    ])?;
    Ok(())
}

impl Db {
    /// Record one provider call.
    pub async fn insert_cost(&self, row: CostRow) -> Result<(), StoreError> {
        self.actor.call(move |conn| insert_row(conn, &row)).await
    }

    /// Write rows of the cost spool (`cost::spool`), each `(spool id, row)`, in one
    /// transaction that also records each id in `cost_spool_applied`. A row whose id is
    /// already there was written by an earlier replay that stopped (a crash) after its commit
    /// and before the spool was emptied: it is skipped, so no row counts twice. Returns how
    /// many rows were written; on an error none was.
    pub async fn insert_spooled_costs(
        &self,
        rows: Vec<(String, CostRow)>,
    ) -> Result<usize, StoreError> {
        self.actor
            .call(move |conn| {
                let tx = conn.transaction()?;
                let mut written = 0;
                for (id, row) in &rows {
                    let new = tx
                        .prepare_cached(
                            "INSERT OR IGNORE INTO cost_spool_applied (id) VALUES (?1)",
                        )?
                        .execute([id])?;
                    if new == 1 {
                        insert_row(&tx, row)?;
                        written += 1;
                    }
                }
                tx.commit()?;
                Ok(written)
            })
            .await
    }

    /// Forget the spool ids of [`Db::insert_spooled_costs`]. Only once the spool is empty:
    /// an id forgotten while its row is still in the spool would let a replay write it again.
    pub async fn clear_spool_applied(&self) -> Result<(), StoreError> {
        self.actor
            .call(|conn| {
                conn.execute("DELETE FROM cost_spool_applied", [])?;
                Ok(())
            })
            .await
    }

    /// Totals per group (most expensive first, then by key) over rows with `timestamp >=
    /// since` (`None`: all), with each group's cache hit ratio (SPEC §20).
    pub async fn cost_groups(
        &self,
        since: Option<i64>,
        by: GroupBy,
    ) -> Result<Vec<GroupCost>, StoreError> {
        let since = since.unwrap_or(i64::MIN);
        let sql = format!(
            concat!(
                "SELECT {col}, COUNT(*), TOTAL(input_tokens), TOTAL(output_tokens), \
                 TOTAL(cache_read_tokens), TOTAL(cache_write_tokens), \
                 TOTAL(cache_write_1h_tokens), TOTAL(cost_usd) AS cost \
                 FROM costs WHERE timestamp >= ?1 AND ",
                plausible!(),
                " GROUP BY {col} ORDER BY cost DESC, {col} ASC"
            ),
            col = by.column()
        );
        self.actor
            .call(move |conn| {
                let mut stmt = conn.prepare_cached(&sql)?;
                let rows = stmt
                    .query_map([since], |row| {
                        let (input, read, write) = (
                            from_sql_total(row.get(2)?),
                            from_sql_total(row.get(4)?),
                            from_sql_total(row.get(5)?),
                        );
                        Ok(GroupCost {
                            key: row
                                .get::<_, Option<String>>(0)?
                                .unwrap_or_else(|| "(unknown)".to_string()),
                            calls: row.get::<_, i64>(1)?.max(0) as u64,
                            input_tokens: input,
                            output_tokens: from_sql_total(row.get(3)?),
                            cache_read_tokens: read,
                            cache_write_tokens: write,
                            cache_write_1h_tokens: from_sql_total(row.get(6)?),
                            cost_usd: row.get(7)?,
                            hit_ratio: hit_ratio(input, read, write),
                        })
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                Ok(rows)
            })
            .await
    }

    /// Spend per local day (`offset_secs` east of UTC), model and source over rows with
    /// `timestamp >= since`, oldest day first: the web console's charts (SPEC §22). `day` is
    /// days since 1970-01-01 in that offset.
    pub async fn cost_daily(
        &self,
        since: i64,
        offset_secs: i64,
    ) -> Result<Vec<DayCost>, StoreError> {
        self.actor
            .call(move |conn| {
                let mut stmt = conn.prepare_cached(concat!(
                    "SELECT (timestamp + ?2) / 86400 AS day, model, source, TOTAL(input_tokens), \
                     TOTAL(cache_read_tokens), TOTAL(cache_write_tokens), TOTAL(cost_usd) \
                     FROM costs WHERE timestamp >= ?1 AND ",
                    plausible!(),
                    " GROUP BY day, model, source ORDER BY day ASC, model ASC"
                ))?;
                let rows = stmt
                    .query_map([since, offset_secs], |row| {
                        Ok(DayCost {
                            day: row.get(0)?,
                            model: row.get::<_, Option<String>>(1)?.unwrap_or_default(),
                            source: row
                                .get::<_, Option<String>>(2)?
                                .unwrap_or_else(|| "(unknown)".to_string()),
                            input_tokens: from_sql_total(row.get(3)?),
                            cache_read_tokens: from_sql_total(row.get(4)?),
                            cache_write_tokens: from_sql_total(row.get(5)?),
                            cost_usd: row.get(6)?,
                        })
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                Ok(rows)
            })
            .await
    }

    /// The cache hit ratio of the last [`RECENT_CALLS`] model calls with prompt tokens, and of
    /// those since `baseline_since` (SPEC §20; `None`: the baseline is not read and comes back
    /// `None`, for a caller that keeps it). Embeddings do not count.
    pub async fn cache_ratios(
        &self,
        baseline_since: Option<i64>,
    ) -> Result<CacheRatios, StoreError> {
        self.actor
            .call(move |conn| {
                let (calls, input, read, write): (i64, f64, f64, f64) = conn
                    .prepare_cached(concat!(
                        "SELECT COUNT(*), TOTAL(input_tokens), TOTAL(cache_read_tokens), \
                         TOTAL(cache_write_tokens) FROM (SELECT input_tokens, cache_read_tokens, \
                         cache_write_tokens FROM costs WHERE call_type != 'embedding' AND \
                         COALESCE(input_tokens, 0) + COALESCE(cache_read_tokens, 0) \
                         + COALESCE(cache_write_tokens, 0) > 0 AND ",
                        plausible!(),
                        " ORDER BY id DESC LIMIT ?1)"
                    ))?
                    .query_row([RECENT_CALLS], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                    })?;
                let recent = hit_ratio(
                    from_sql_total(input),
                    from_sql_total(read),
                    from_sql_total(write),
                );
                let baseline = match baseline_since {
                    Some(since) => {
                        let (b_input, b_read, b_write): (f64, f64, f64) = conn
                            .prepare_cached(concat!(
                                "SELECT TOTAL(input_tokens), TOTAL(cache_read_tokens), \
                                 TOTAL(cache_write_tokens) FROM costs WHERE call_type != 'embedding' \
                                 AND timestamp >= ?1 AND ",
                                plausible!()
                            ))?
                            .query_row([since], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
                        hit_ratio(
                            from_sql_total(b_input),
                            from_sql_total(b_read),
                            from_sql_total(b_write),
                        )
                    }
                    None => None,
                };
                Ok(CacheRatios {
                    recent_calls: calls.max(0) as u64,
                    hit_ratio_recent: recent,
                    hit_ratio_baseline: baseline,
                })
            })
            .await
    }

    /// Record a `[[schedule]]` run its precheck skipped (SPEC §20), with the estimated saving.
    pub async fn insert_skipped_run(
        &self,
        timestamp: i64,
        schedule: &str,
        session_id: &str,
        saved_usd: Option<f64>,
    ) -> Result<(), StoreError> {
        let (schedule, session_id) = (schedule.to_string(), session_id.to_string());
        let saved = saved_usd.filter(|s| s.is_finite() && *s >= 0.0);
        self.actor
            .call(move |conn| {
                conn.prepare_cached(
                    "INSERT INTO skipped_runs (timestamp, schedule, session_id, saved_usd) \
                     VALUES (?1, ?2, ?3, ?4)",
                )?
                .execute(rusqlite::params![timestamp, schedule, session_id, saved])?;
                Ok(())
            })
            .await
    }

    /// Skipped runs with `timestamp >= since` (`None`: all): how many, and their estimated
    /// saving in USD.
    pub async fn skipped_since(&self, since: Option<i64>) -> Result<(u64, f64), StoreError> {
        let since = since.unwrap_or(i64::MIN);
        self.actor
            .call(move |conn| {
                conn.prepare_cached(
                    "SELECT COUNT(*), TOTAL(saved_usd) FROM skipped_runs WHERE timestamp >= ?1",
                )?
                .query_row([since], |r| {
                    Ok((r.get::<_, i64>(0)?.max(0) as u64, r.get(1)?))
                })
            })
            .await
    }

    /// Sum of `cost_usd` over rows with `timestamp >= since` (Unix seconds); 0 when none.
    ///
    /// The first call for a `since` scans the period's rows; later calls add the rows written
    /// since the previous one (see [`SpendMarks`]), so a budget check costs the same on the
    /// last day of a busy month as on the first.
    pub async fn spend_since(&self, since: i64) -> Result<f64, StoreError> {
        let previous = self.spend.get(since);
        let mark = self
            .actor
            .call(move |conn| match previous {
                Some(m) => {
                    let (added, last_id): (f64, Option<i64>) = conn
                        .prepare_cached(concat!(
                            "SELECT TOTAL(CASE WHEN timestamp >= ?2 AND ",
                            plausible!(),
                            " THEN cost_usd END), MAX(id) FROM costs WHERE id > ?1"
                        ))?
                        .query_row([m.last_id, since], |r| Ok((r.get(0)?, r.get(1)?)))?;
                    Ok(SpendMark {
                        since,
                        total: m.total + added,
                        last_id: last_id.unwrap_or(m.last_id),
                    })
                }
                None => scan_spend(conn, since),
            })
            .await?;
        self.spend.put(mark);
        Ok(mark.total)
    }

    /// [`Db::spend_since`] without the running sum: a scan of the period's rows every time (for
    /// the benchmark and tests).
    pub async fn spend_since_scan(&self, since: i64) -> Result<f64, StoreError> {
        Ok(self
            .actor
            .call(move |conn| scan_spend(conn, since))
            .await?
            .total)
    }

    /// Per-model breakdown (most expensive first, then by name) and total over rows with
    /// `timestamp >= since`; `None` covers every row.
    pub async fn cost_summary(&self, since: Option<i64>) -> Result<CostSummary, StoreError> {
        let since = since.unwrap_or(i64::MIN);
        self.actor
            .call(move |conn| {
                let mut stmt = conn.prepare_cached(concat!(
                    "SELECT model, TOTAL(input_tokens), TOTAL(output_tokens), \
                     TOTAL(cache_read_tokens), TOTAL(cache_write_tokens), TOTAL(cost_usd) AS cost \
                     FROM costs WHERE timestamp >= ?1 AND ",
                    plausible!(),
                    " GROUP BY model ORDER BY cost DESC, model ASC"
                ))?;
                let models = stmt
                    .query_map([since], |row| {
                        Ok(ModelCost {
                            model: row.get::<_, Option<String>>(0)?.unwrap_or_default(),
                            input_tokens: from_sql_total(row.get(1)?),
                            output_tokens: from_sql_total(row.get(2)?),
                            cache_read_tokens: from_sql_total(row.get(3)?),
                            cache_write_tokens: from_sql_total(row.get(4)?),
                            cost_usd: row.get(5)?,
                        })
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                // Not `sum()`: an empty f64 sum is -0.0, which prints as "$-0.0000".
                let total_cost = models
                    .iter()
                    .map(|m| m.cost_usd)
                    .fold(0.0, |acc, c| acc + c);
                Ok(CostSummary { total_cost, models })
            })
            .await
    }

    /// Token totals and cost over rows with `timestamp >= since` (for `session_status`:
    /// "today's cost and tokens").
    pub async fn usage_since(&self, since: i64) -> Result<(Usage, f64), StoreError> {
        self.actor
            .call(move |conn| {
                conn.prepare_cached(concat!(
                    "SELECT TOTAL(input_tokens), TOTAL(output_tokens), TOTAL(cache_read_tokens), \
                     TOTAL(cache_write_tokens), TOTAL(cost_usd) FROM costs \
                     WHERE timestamp >= ?1 AND ",
                    plausible!()
                ))?
                .query_row([since], |row| {
                    let usage = Usage {
                        input_tokens: from_sql_total(row.get(0)?),
                        output_tokens: from_sql_total(row.get(1)?),
                        cache_read_tokens: from_sql_total(row.get(2)?),
                        cache_write_tokens: from_sql_total(row.get(3)?),
                        cache_write_1h_tokens: 0,
                    };
                    Ok((usage, row.get(4)?))
                })
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn usage(i: u64, o: u64, cr: u64, cw: u64) -> Usage {
        Usage {
            input_tokens: i,
            output_tokens: o,
            cache_read_tokens: cr,
            cache_write_tokens: cw,
            cache_write_1h_tokens: 0,
        }
    }

    fn row(timestamp: i64, model: &str, usage: Usage, cost_usd: f64) -> CostRow {
        CostRow {
            timestamp,
            session_id: "s1".into(),
            model: model.into(),
            provider: "anthropic".into(),
            call_type: CallType::Chat,
            usage,
            cost_usd,
            fallback_from: None,
            source: None,
        }
    }

    fn temp_db() -> (tempfile::TempDir, PathBuf, Db) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agentd.db");
        let db = Db::open(&path).unwrap();
        (dir, path, db)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn call_type_strings() {
        let all = [
            (CallType::Chat, "chat"),
            (CallType::Subagent, "subagent"),
            (CallType::Compaction, "compaction"),
            (CallType::Consolidation, "consolidation"),
            (CallType::Embedding, "embedding"),
        ];
        for (t, s) in all {
            assert_eq!(t.as_str(), s);
            assert_eq!(serde_json::to_value(t).unwrap(), s);
        }
    }

    #[tokio::test]
    async fn insert_stores_every_column() {
        let (_d, _p, db) = temp_db();
        let mut r = row(1_700_000_000, "claude-sonnet", usage(1, 2, 3, 4), 0.5);
        r.call_type = CallType::Consolidation;
        r.session_id = "tg-42".into();
        db.insert_cost(r).await.unwrap();
        let got: (i64, String, String, String, String, i64, i64, i64, i64, f64) = db
            .actor
            .call(|c| {
                c.query_row(
                    "SELECT timestamp, session_id, model, provider, call_type, input_tokens, \
                     output_tokens, cache_read_tokens, cache_write_tokens, cost_usd FROM costs",
                    [],
                    |r| {
                        Ok((
                            r.get(0)?,
                            r.get(1)?,
                            r.get(2)?,
                            r.get(3)?,
                            r.get(4)?,
                            r.get(5)?,
                            r.get(6)?,
                            r.get(7)?,
                            r.get(8)?,
                            r.get(9)?,
                        ))
                    },
                )
            })
            .await
            .unwrap();
        assert_eq!(
            got,
            (
                1_700_000_000,
                "tg-42".into(),
                "claude-sonnet".into(),
                "anthropic".into(),
                "consolidation".into(),
                1,
                2,
                3,
                4,
                0.5
            )
        );
    }

    #[tokio::test]
    async fn summary_groups_by_model_most_expensive_first() {
        let (_d, _p, db) = temp_db();
        db.insert_cost(row(100, "small", usage(10, 20, 30, 40), 0.25))
            .await
            .unwrap();
        db.insert_cost(row(200, "big", usage(1000, 500, 2000, 100), 1.0))
            .await
            .unwrap();
        db.insert_cost(row(300, "small", usage(1, 2, 3, 4), 0.5))
            .await
            .unwrap();

        let all = db.cost_summary(None).await.unwrap();
        assert!(close(all.total_cost, 1.75), "{all:?}");
        assert_eq!(all.models.len(), 2);
        assert_eq!(
            all.models[0],
            ModelCost {
                model: "big".into(),
                input_tokens: 1000,
                output_tokens: 500,
                cache_read_tokens: 2000,
                cache_write_tokens: 100,
                cost_usd: 1.0,
            }
        );
        let small = &all.models[1];
        assert_eq!(small.model, "small");
        assert_eq!(
            (
                small.input_tokens,
                small.output_tokens,
                small.cache_read_tokens,
                small.cache_write_tokens
            ),
            (11, 22, 33, 44)
        );
        assert!(close(small.cost_usd, 0.75));

        // `since` filters rows before the breakdown.
        let recent = db.cost_summary(Some(250)).await.unwrap();
        assert_eq!(recent.models.len(), 1);
        assert_eq!(recent.models[0].input_tokens, 1);
        assert!(close(recent.total_cost, 0.5));

        // The JSON shape of the HTTP/CLI answer.
        let json = serde_json::to_value(&recent).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"total_cost": 0.5, "models": [{"model": "small",
                "input_tokens": 1, "output_tokens": 2, "cache_read_tokens": 3,
                "cache_write_tokens": 4, "cost_usd": 0.5}]})
        );
    }

    #[tokio::test]
    async fn empty_ledger_sums_to_zero() {
        let (_d, _p, db) = temp_db();
        let s = db.cost_summary(None).await.unwrap();
        assert_eq!(s.total_cost, 0.0);
        assert!(s.total_cost.is_sign_positive(), "-0.0 prints as $-0.0000");
        assert!(s.models.is_empty());
        assert_eq!(db.spend_since(0).await.unwrap(), 0.0);
        let (u, c) = db.usage_since(0).await.unwrap();
        assert_eq!(u, Usage::default());
        assert_eq!(c, 0.0);
    }

    #[tokio::test]
    async fn running_sums_follow_new_rows_from_any_handle() {
        let (_d, path, db) = temp_db();
        // Another process (agentd index, agentd consolidate) writes through its own handle.
        let other = Db::open(&path).unwrap();
        assert_eq!(db.spend_since(100).await.unwrap(), 0.0);
        let mut rounds = vec![
            vec![(99, 0.5), (100, 0.25)],
            vec![(150, 1.0), (50, 2.0)],
            vec![],
            vec![(100, 0.125), (99, 4.0), (200, 0.0625)],
        ];
        for (i, rows) in rounds.drain(..).enumerate() {
            for (t, c) in rows {
                let writer = if i % 2 == 0 { &db } else { &other };
                writer
                    .insert_cost(row(t, "m", Usage::default(), c))
                    .await
                    .unwrap();
            }
            for since in [i64::MIN, 99, 100, 101, 201] {
                let scanned = db.spend_since_scan(since).await.unwrap();
                assert!(
                    close(db.spend_since(since).await.unwrap(), scanned),
                    "round {i}, since {since}"
                );
                assert!(close(other.spend_since(since).await.unwrap(), scanned));
            }
        }
        assert!(close(db.spend_since(100).await.unwrap(), 1.4375));
        // Many period starts: the oldest marks are dropped, the sums stay right.
        for since in 0..20 {
            assert!(close(
                db.spend_since(since).await.unwrap(),
                db.spend_since_scan(since).await.unwrap()
            ));
        }
    }

    #[tokio::test]
    async fn spend_since_includes_the_boundary_second() {
        let (_d, _p, db) = temp_db();
        for (t, c) in [(99, 0.01), (100, 0.1), (101, 1.0)] {
            db.insert_cost(row(t, "m", Usage::default(), c))
                .await
                .unwrap();
        }
        assert!(close(db.spend_since(i64::MIN).await.unwrap(), 1.11));
        assert!(close(db.spend_since(99).await.unwrap(), 1.11));
        assert!(close(db.spend_since(100).await.unwrap(), 1.1));
        assert!(close(db.spend_since(101).await.unwrap(), 1.0));
        assert_eq!(db.spend_since(102).await.unwrap(), 0.0);
    }

    #[tokio::test]
    async fn usage_since_sums_tokens_and_cost() {
        let (_d, _p, db) = temp_db();
        db.insert_cost(row(10, "a", usage(1, 2, 3, 4), 0.1))
            .await
            .unwrap();
        db.insert_cost(row(20, "b", usage(10, 20, 30, 40), 0.2))
            .await
            .unwrap();
        db.insert_cost(row(5, "a", usage(100, 100, 100, 100), 9.0))
            .await
            .unwrap();
        let (u, c) = db.usage_since(10).await.unwrap();
        assert_eq!(u, usage(11, 22, 33, 44));
        assert!(close(c, 0.3));
    }

    #[tokio::test]
    async fn reopen_keeps_data() {
        let (_d, path, db) = temp_db();
        db.insert_cost(row(1, "m", usage(5, 6, 7, 8), 0.125))
            .await
            .unwrap();
        db.kv_set("k", "v").await.unwrap();
        drop(db);
        let db = Db::open(&path).unwrap();
        let s = db.cost_summary(None).await.unwrap();
        assert_eq!(s.models.len(), 1);
        assert_eq!(s.models[0].cache_write_tokens, 8);
        assert_eq!(s.total_cost, 0.125);
        assert_eq!(db.kv_get("k").await.unwrap().as_deref(), Some("v"));
    }

    #[tokio::test]
    async fn read_only_handle_sees_rows_of_a_live_writer() {
        let (_d, path, writer) = temp_db();
        writer
            .insert_cost(row(1, "m", usage(1, 1, 1, 1), 0.5))
            .await
            .unwrap();
        let reader = Db::open_read_only(&path).unwrap().expect("file exists");
        assert_eq!(reader.spend_since(0).await.unwrap(), 0.5);
        // A row committed after the reader opened is visible to its next query.
        writer
            .insert_cost(row(2, "m", usage(1, 1, 1, 1), 0.25))
            .await
            .unwrap();
        assert_eq!(reader.spend_since(0).await.unwrap(), 0.75);
        assert_eq!(
            reader.cost_summary(None).await.unwrap().models[0].input_tokens,
            2
        );
        assert!(reader.integrity_ok().await.unwrap());
    }

    #[tokio::test]
    async fn read_only_handle_reads_after_the_writer_closed() {
        let (_d, path, writer) = temp_db();
        writer
            .insert_cost(row(1, "m", usage(1, 1, 1, 1), 0.5))
            .await
            .unwrap();
        drop(writer);
        // The writer thread closes the connection asynchronously; its last close checkpoints
        // and deletes the `-wal` file. Wait for that so the reader really opens a database
        // whose WAL and shared-memory files are gone (the daemon is not running).
        let wal = path.with_extension("db-wal");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while wal.exists() {
            assert!(std::time::Instant::now() < deadline, "writer never closed");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let reader = Db::open_read_only(&path).unwrap().expect("file exists");
        assert_eq!(reader.spend_since(0).await.unwrap(), 0.5);
    }

    /// Writes a row as an older build (or a hand edit) may have left it, bypassing
    /// `insert_cost`.
    async fn raw_row(db: &Db, t: i64, model: &str, tokens: [i64; 4], cost: Option<f64>) {
        let model = model.to_string();
        db.actor
            .call(move |c| {
                c.execute(
                    "INSERT INTO costs (timestamp, session_id, model, provider, call_type, \
                     input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd) \
                     VALUES (?1, 's1', ?2, 'anthropic', 'chat', ?3, ?4, ?5, ?6, ?7)",
                    rusqlite::params![t, model, tokens[0], tokens[1], tokens[2], tokens[3], cost],
                )?;
                Ok(())
            })
            .await
            .unwrap();
    }

    /// The incident of issue #12: a provider answered `input_tokens = u64::MAX`, the row was
    /// stored clamped to `i64::MAX` with a cost of 5.5e13 USD, and from then on every `SUM`
    /// failed with "integer overflow" and the budget was spent. Such rows (and negative or
    /// non-finite ones) read as no spend; every sum still answers.
    #[tokio::test]
    async fn implausible_rows_read_as_no_spend_and_sums_never_fail() {
        let (_d, _p, db) = temp_db();
        raw_row(&db, 100, "m", [1, 2, 3, 4], Some(0.5)).await;
        raw_row(&db, 100, "m", [i64::MAX, 5, 0, 0], Some(5.5e13)).await;
        raw_row(
            &db,
            101,
            "m",
            [i64::MAX, i64::MAX, i64::MAX, i64::MAX],
            Some(1.0),
        )
        .await;
        raw_row(&db, 102, "m", [-5, 0, 0, 0], Some(0.25)).await;
        raw_row(&db, 103, "m", [1, 1, 1, 1], Some(-3.0)).await;
        raw_row(&db, 104, "m", [1, 1, 1, 1], Some(f64::INFINITY)).await;
        // A NULL cost (SQLite's NaN) is no spend, but its plausible tokens count.
        raw_row(&db, 105, "m", [1, 1, 1, 1], None).await;
        raw_row(&db, 106, "m", [10_000_001, 0, 0, 0], Some(30.0)).await;

        let s = db.cost_summary(None).await.unwrap();
        assert!(close(s.total_cost, 0.5), "{s:?}");
        assert_eq!(s.models.len(), 1);
        assert_eq!(
            (
                s.models[0].input_tokens,
                s.models[0].output_tokens,
                s.models[0].cache_read_tokens,
                s.models[0].cache_write_tokens
            ),
            (2, 3, 4, 5)
        );
        let (u, c) = db.usage_since(0).await.unwrap();
        assert_eq!(u, usage(2, 3, 4, 5));
        assert!(close(c, 0.5));
        assert!(close(db.spend_since(0).await.unwrap(), 0.5));
        assert!(close(db.spend_since_scan(0).await.unwrap(), 0.5));

        // The running sum skips them too.
        raw_row(&db, 200, "m", [i64::MAX, 0, 0, 0], Some(9e18)).await;
        raw_row(&db, 200, "m", [10, 0, 0, 0], Some(0.125)).await;
        assert!(close(db.spend_since(0).await.unwrap(), 0.625));
        assert!(close(db.spend_since_scan(0).await.unwrap(), 0.625));
    }

    /// Many plausible rows whose integer sum would overflow `i64`: the sums are computed in
    /// floating point and clamped back, never an error.
    #[tokio::test]
    async fn sums_of_large_plausible_rows_do_not_overflow() {
        let (_d, _p, db) = temp_db();
        db.insert_cost(row(1, "m", usage(10_000_000, 10_000_000, 0, 0), 1.0))
            .await
            .unwrap();
        db.insert_cost(row(2, "m", usage(10_000_000, 0, 0, 0), 1.0))
            .await
            .unwrap();
        let s = db.cost_summary(None).await.unwrap();
        assert_eq!(s.models[0].input_tokens, 20_000_000);
        assert_eq!(s.models[0].output_tokens, 10_000_000);
        assert_eq!(from_sql_total(1e30), u64::MAX);
        assert_eq!(from_sql_total(f64::INFINITY), u64::MAX);
        assert_eq!(from_sql_total(f64::NAN), 0);
        assert_eq!(from_sql_total(-1.0), 0);
        assert_eq!(from_sql_total(12.0), 12);
    }

    /// The SQL condition uses the same cap as the parsers.
    #[test]
    fn plausible_condition_uses_the_parsers_cap() {
        let cap = format!("BETWEEN 0 AND {} ", crate::message::MAX_TOKENS_PER_CALL);
        assert_eq!(plausible!().matches(&cap).count(), 4, "{}", plausible!());
    }

    /// A usage that `insert_cost` is handed beyond what SQLite holds is stored clamped, never
    /// an error (a row that cannot be written blocks every later call, SPEC §16.4), and is then
    /// read as no spend.
    #[tokio::test]
    async fn insert_of_an_absurd_row_succeeds_and_reads_as_no_spend() {
        let (_d, _p, db) = temp_db();
        db.insert_cost(row(1, "m", usage(u64::MAX, 0, 0, 0), 5.5e13))
            .await
            .unwrap();
        db.insert_cost(row(1, "m", usage(1, 0, 0, 0), f64::NAN))
            .await
            .unwrap();
        db.insert_cost(row(1, "m", usage(1, 0, 0, 0), 0.5))
            .await
            .unwrap();
        assert!(close(db.spend_since(0).await.unwrap(), 0.5));
        assert!(close(db.cost_summary(None).await.unwrap().total_cost, 0.5));
    }
}
