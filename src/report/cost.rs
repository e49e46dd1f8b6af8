//! Spend per model over a period, from `agentd.db` (`agent-send --cost`, `GET /api/v1/cost`).

use std::path::Path;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde::Serialize;

use super::ReportError;
use crate::cost::Period;
use crate::store::{CostSummary, Db};

/// The cost database in the state directory.
pub const DB_FILE: &str = "agentd.db";

/// `{period, total_cost, models:[…]}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostReport {
    pub period: &'static str,
    #[serde(flatten)]
    pub summary: CostSummary,
}

/// Spend over `period` (calendar periods in `tz`). A missing or empty database is zero spend.
/// Blocking.
pub fn cost_report(
    state_dir: &Path,
    period: Period,
    tz: Tz,
    now: DateTime<Utc>,
) -> Result<CostReport, ReportError> {
    let summary = match Db::open_read_only(&state_dir.join(DB_FILE))? {
        None => CostSummary {
            total_cost: 0.0,
            models: Vec::new(),
        },
        Some(db) => futures::executor::block_on(db.cost_summary(period.start(tz, now)))?,
    };
    Ok(CostReport {
        period: period.as_str(),
        summary,
    })
}

/// Spend since local midnight in `tz` (for `--status` and `GET /api/v1/status`). Blocking.
pub fn today_cost(state_dir: &Path, tz: Tz, now: DateTime<Utc>) -> Result<f64, ReportError> {
    Ok(cost_report(state_dir, Period::Today, tz, now)?
        .summary
        .total_cost)
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
        }
    }

    #[test]
    fn missing_db_is_zero() {
        let d = tempfile::tempdir().unwrap();
        let r = cost_report(d.path(), Period::Today, Tz::UTC, Utc::now()).unwrap();
        assert_eq!(r.summary.total_cost, 0.0);
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"period": "today", "total_cost": 0.0, "models": []})
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
        let r = cost_report(d.path(), Period::Today, Tz::UTC, now).unwrap();
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
            3,
            "exactly period, total_cost, models: {keys:?}"
        );

        let all = cost_report(d.path(), Period::All, Tz::UTC, now).unwrap();
        assert!((all.summary.total_cost - 9.76).abs() < 1e-9);
        assert!((today_cost(d.path(), Tz::UTC, now).unwrap() - 0.76).abs() < 1e-9);
    }
}
