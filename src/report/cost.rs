//! Spend per model over a period, from `agentd.db` (`agent-send --cost`, `GET /api/v1/cost`).

use std::path::Path;

use crate::zone::Zone;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::ReportError;
use crate::cost::Period;
use crate::store::{CostSummary, DayCost, Db, GroupBy, GroupCost};

/// The cost database in the state directory.
pub const DB_FILE: &str = "agentd.db";

/// `{period, total_cost, models:[…], skipped:{runs, saved_usd}}`, with `by` and `groups`
/// when asked for a grouping.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostReport {
    pub period: &'static str,
    #[serde(flatten)]
    pub summary: CostSummary,
    /// Scheduled runs a precheck skipped, and their estimated saving (SPEC §20).
    pub skipped: Skipped,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<GroupBy>,
    /// Totals and the cache hit ratio per group, with `by`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<GroupCost>>,
}

/// Skipped runs over the period: how many, and the sum of their jobs' last costs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Skipped {
    pub runs: u64,
    pub saved_usd: f64,
}

/// Spend over `period` (calendar periods in `tz`). A missing or empty database is zero spend.
/// Blocking.
pub fn cost_report(
    state_dir: &Path,
    period: Period,
    by: Option<GroupBy>,
    tz: &Zone,
    now: DateTime<Utc>,
) -> Result<CostReport, ReportError> {
    let since = period.start(tz, now);
    let Some(db) = Db::open_read_only(&state_dir.join(DB_FILE))? else {
        return Ok(CostReport {
            period: period.as_str(),
            summary: CostSummary {
                total_cost: 0.0,
                models: Vec::new(),
            },
            skipped: Skipped::default(),
            by,
            groups: by.map(|_| Vec::new()),
        });
    };
    let summary = futures::executor::block_on(db.cost_summary(since))?;
    // A database from before the cost autopilot (no `skipped_runs`) has none.
    let skipped = futures::executor::block_on(db.skipped_since(since))
        .map(|(runs, saved_usd)| Skipped { runs, saved_usd })
        .unwrap_or_default();
    let groups = match by {
        Some(by) => Some(futures::executor::block_on(db.cost_groups(since, by))?),
        None => None,
    };
    Ok(CostReport {
        period: period.as_str(),
        summary,
        skipped,
        by,
        groups,
    })
}

/// Spend since local midnight in `tz` (for `--status` and `GET /api/v1/status`). Blocking.
pub fn today_cost(state_dir: &Path, tz: &Zone, now: DateTime<Utc>) -> Result<f64, ReportError> {
    Ok(cost_report(state_dir, Period::Today, None, tz, now)?
        .summary
        .total_cost)
}

/// Spend per local day in `tz`, model and source over the last `days` days (today
/// included), oldest first: the web console's charts (SPEC §22). A missing database is none.
/// Blocking.
pub fn daily(
    state_dir: &Path,
    days: u32,
    tz: &Zone,
    now: DateTime<Utc>,
) -> Result<Vec<DayCost>, ReportError> {
    use chrono::Offset;
    let Some(db) = Db::open_read_only(&state_dir.join(DB_FILE))? else {
        return Ok(Vec::new());
    };
    let offset = i64::from(now.with_timezone(tz).offset().fix().local_minus_utc());
    let today = (now.timestamp() + offset).div_euclid(86_400);
    let since = (today - i64::from(days.saturating_sub(1))) * 86_400 - offset;
    Ok(futures::executor::block_on(db.cost_daily(since, offset))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Usage;
    use crate::store::{CallType, CostRow};

    fn row(ts: i64, model: &str, input: u64, cost: f64) -> CostRow {
        CostRow {
            timestamp: ts,
            session_id: "s".into(),
            model: model.into(),
            provider: "anthropic".into(),
            call_type: CallType::Chat,
            usage: Usage {
                input_tokens: input,
                output_tokens: 2,
                cache_read_tokens: 3,
                cache_write_tokens: 4,
                cache_write_1h_tokens: 0,
            },
            cost_usd: cost,
            fallback_from: None,
            source: None,
        }
    }

    #[test]
    fn missing_db_is_zero() {
        let d = tempfile::tempdir().unwrap();
        let r = cost_report(d.path(), Period::Today, None, &Zone::utc(), Utc::now()).unwrap();
        assert_eq!(r.summary.total_cost, 0.0);
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"period": "today", "total_cost": 0.0, "models": [],
                               "skipped": {"runs": 0, "saved_usd": 0.0}})
        );
        assert!(!d.path().join(DB_FILE).exists());
    }

    #[test]
    fn sums_per_model_within_the_period() {
        let d = tempfile::tempdir().unwrap();
        let now: DateTime<Utc> = "2026-11-03T12:00:00Z".parse().unwrap();
        let today = now.timestamp() - 3600;
        let last_month = now.timestamp() - 40 * 86_400;
        {
            let db = Db::open(&d.path().join(DB_FILE)).unwrap();
            futures::executor::block_on(async {
                db.insert_cost(row(today, "claude-sonnet", 100, 0.5))
                    .await
                    .unwrap();
                db.insert_cost(row(today, "claude-sonnet", 50, 0.25))
                    .await
                    .unwrap();
                db.insert_cost(row(today, "gpt-mini", 10, 0.01))
                    .await
                    .unwrap();
                db.insert_cost(row(last_month, "gpt-mini", 1000, 9.0))
                    .await
                    .unwrap();
            });
        }
        let r = cost_report(d.path(), Period::Today, None, &Zone::utc(), now).unwrap();
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["period"], "today");
        assert!((v["total_cost"].as_f64().unwrap() - 0.76).abs() < 1e-9);
        let models = v["models"].as_array().unwrap();
        assert_eq!(models.len(), 2);
        assert_eq!(
            models[0],
            serde_json::json!({
                "model": "claude-sonnet", "input_tokens": 150, "output_tokens": 4,
                "cache_read_tokens": 6, "cache_write_tokens": 8, "cost_usd": 0.75
            })
        );
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(
            keys.len(),
            4,
            "exactly period, total_cost, models, skipped: {keys:?}"
        );

        let all = cost_report(d.path(), Period::All, None, &Zone::utc(), now).unwrap();
        assert!((all.summary.total_cost - 9.76).abs() < 1e-9);
        assert!((today_cost(d.path(), &Zone::utc(), now).unwrap() - 0.76).abs() < 1e-9);
    }

    /// SPEC §20: `by` adds totals and the cache hit ratio (reads / all prompt tokens) per
    /// group; skipped runs and their saving are counted within the period.
    #[test]
    fn groups_carry_hit_ratios_and_skipped_runs_their_saving() {
        let d = tempfile::tempdir().unwrap();
        let now: DateTime<Utc> = "2026-11-03T12:00:00Z".parse().unwrap();
        let t = now.timestamp() - 60;
        {
            let db = Db::open(&d.path().join(DB_FILE)).unwrap();
            futures::executor::block_on(async {
                let mut a = row(t, "sonnet", 100, 0.5);
                a.source = Some("telegram".into());
                a.usage.cache_read_tokens = 700;
                a.usage.cache_write_tokens = 200;
                let mut b = row(t, "sonnet", 1000, 0.25);
                b.source = Some("system".into());
                b.usage.cache_read_tokens = 0;
                b.usage.cache_write_tokens = 0;
                db.insert_cost(a).await.unwrap();
                db.insert_cost(b).await.unwrap();
                let mut c = row(t, "haiku", 0, 0.0);
                c.usage = Usage::default();
                db.insert_cost(c).await.unwrap();
                db.insert_skipped_run(t, "beat", "s1", Some(0.02))
                    .await
                    .unwrap();
                db.insert_skipped_run(t, "beat", "s1", None).await.unwrap();
                db.insert_skipped_run(t - 30 * 86_400, "beat", "s1", Some(9.0))
                    .await
                    .unwrap();
            });
        }
        let r = cost_report(
            d.path(),
            Period::Today,
            Some(GroupBy::Source),
            &Zone::utc(),
            now,
        )
        .unwrap();
        assert_eq!(r.skipped.runs, 2);
        assert!((r.skipped.saved_usd - 0.02).abs() < 1e-12);
        let groups = r.groups.unwrap();
        let by_key = |k: &str| groups.iter().find(|g| g.key == k).unwrap().clone();
        assert_eq!(by_key("telegram").hit_ratio, Some(0.7));
        assert_eq!(by_key("system").hit_ratio, Some(0.0));
        assert_eq!(by_key("(unknown)").hit_ratio, None, "no prompt tokens");
        assert_eq!(groups[0].key, "telegram", "most expensive first");
        let v = serde_json::to_value(
            cost_report(
                d.path(),
                Period::Today,
                Some(GroupBy::Model),
                &Zone::utc(),
                now,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(v["by"], "model");
        assert_eq!(v["groups"][0]["key"], "sonnet");
        assert_eq!(v["groups"][0]["calls"], 2);
        let ratio = v["groups"][0]["hit_ratio"].as_f64().unwrap();
        assert!((ratio - 700.0 / 2000.0).abs() < 1e-12, "{ratio}");
    }
}
