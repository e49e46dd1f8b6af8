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
    if report.skipped.runs > 0 {
        let _ = writeln!(
            out,
            "skipped by prechecks: {} run(s), saved ~{}",
            report.skipped.runs,
            usd(report.skipped.saved_usd)
        );
    }
    if let (Some(by), Some(groups)) = (report.by, &report.groups) {
        render_groups(&mut out, by.as_str(), groups);
    }
    Output::stdout(out)
}

/// `by <group>`: one line per group with its calls, cost and cache hit ratio.
fn render_groups(out: &mut String, by: &str, groups: &[crate::store::GroupCost]) {
    let _ = writeln!(out, "\nby {by}");
    if groups.is_empty() {
        let _ = writeln!(out, "no provider calls recorded");
        return;
    }
    let width = groups
        .iter()
        .map(|g| g.key.chars().count())
        .max()
        .unwrap_or(5)
        .max(by.len());
    let _ = writeln!(
        out,
        "{by:<width$}  {:>7}  {:>12}  {:>12}  {:>12}  {:>10}  {:>9}",
        "calls", "input", "cache read", "cache write", "cost", "cache hit"
    );
    for g in groups {
        let ratio = g
            .hit_ratio
            .map_or("-".to_string(), |r| format!("{:.1}%", r * 100.0));
        let _ = writeln!(
            out,
            "{:<width$}  {:>7}  {:>12}  {:>12}  {:>12}  {:>10}  {:>9}",
            g.key,
            g.calls,
            g.input_tokens,
            g.cache_read_tokens,
            g.cache_write_tokens,
            usd(g.cost_usd),
            ratio
        );
    }
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
            skipped: crate::report::cost::Skipped {
                runs: 3,
                saved_usd: 0.06,
            },
            by: Some(crate::store::GroupBy::Source),
            groups: Some(vec![crate::store::GroupCost {
                key: "system".into(),
                calls: 2,
                input_tokens: 300,
                output_tokens: 4,
                cache_read_tokens: 700,
                cache_write_tokens: 0,
                cache_write_1h_tokens: 0,
                cost_usd: 9.76,
                hit_ratio: Some(0.7),
            }]),
        };
        let text = render(&r, false).stdout;
        assert!(text.contains("cost (all)"), "{text}");
        assert!(text.contains("gpt-mini"), "{text}");
        assert!(text.contains("total: $9.7600"), "{text}");
        assert!(
            text.contains("skipped by prechecks: 3 run(s), saved ~$0.0600"),
            "{text}"
        );
        assert!(text.contains("by source"), "{text}");
        assert!(text.contains("70.0%"), "{text}");
        let v: serde_json::Value = serde_json::from_str(&render(&r, true).stdout).unwrap();
        assert_eq!(v, serde_json::to_value(&r).unwrap());
        let empty = CostReport {
            period: "today",
            summary: CostSummary {
                total_cost: 0.0,
                models: vec![],
            },
            skipped: Default::default(),
            by: None,
            groups: None,
        };
        assert!(
            render(&empty, false)
                .stdout
                .contains("no provider calls recorded")
        );
    }
}
