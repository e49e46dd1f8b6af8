//! `--cost [today|week|month|all]`: prints `report::cost` (spend per model from `agentd.db`).

use std::fmt::Write;

use super::output::Output;
use crate::report::cost::CostReport;

/// Text table (or JSON) for `--cost`.
pub fn render(report: &CostReport, as_json: bool) -> Output {
    if as_json {
        return Output::json(&serde_json::to_value(report).unwrap_or_default());
    }
    let mut out = String::new();
    let _ = writeln!(out, "cost ({})", report.period);
    if report.summary.models.is_empty() {
        let _ = writeln!(out, "no provider calls recorded");
    } else {
        let width = report
            .summary
            .models
            .iter()
            .map(|m| m.model.chars().count())
            .max()
            .unwrap_or(5)
            .max(5);
        let _ = writeln!(
            out,
            "{:<width$}  {:>12}  {:>12}  {:>12}  {:>12}  {:>10}",
            "model", "input", "output", "cache read", "cache write", "cost"
        );
        for m in &report.summary.models {
            let _ = writeln!(
                out,
                "{:<width$}  {:>12}  {:>12}  {:>12}  {:>12}  {:>10}",
                m.model,
                m.input_tokens,
                m.output_tokens,
                m.cache_read_tokens,
                m.cache_write_tokens,
                usd(m.cost_usd)
            );
        }
    }
    let _ = writeln!(out, "total: {}", usd(report.summary.total_cost));
    Output::stdout(out)
}

/// Dollars with four decimals (`$0.0123`).
pub fn usd(v: f64) -> String {
    format!("${v:.4}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{CostSummary, ModelCost};

    #[test]
    fn text_and_json() {
        let r = CostReport {
            period: "all",
            summary: CostSummary {
                total_cost: 9.76,
                models: vec![ModelCost {
                    model: "gpt-mini".into(),
                    input_tokens: 1010,
                    output_tokens: 4,
                    cache_read_tokens: 6,
                    cache_write_tokens: 8,
                    cost_usd: 9.76,
                }],
            },
        };
        let text = render(&r, false).stdout;
        assert!(text.contains("cost (all)"), "{text}");
        assert!(text.contains("gpt-mini"), "{text}");
        assert!(text.contains("total: $9.7600"), "{text}");
        let v: serde_json::Value = serde_json::from_str(&render(&r, true).stdout).unwrap();
        assert_eq!(v, serde_json::to_value(&r).unwrap());
        let empty = CostReport {
            period: "today",
            summary: CostSummary {
                total_cost: 0.0,
                models: vec![],
            },
        };
        assert!(
            render(&empty, false)
                .stdout
                .contains("no provider calls recorded")
        );
    }
}
