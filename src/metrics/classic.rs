//! The classic Prometheus text format (0.0.4) of the OpenMetrics text `Metrics::render`
//! writes, for clients that ask for `text/plain` (`promtool check metrics` lints only this
//! format). `prometheus-client` encodes OpenMetrics only, and the two differ in three lines of
//! metadata, so this rewrites them instead of keeping a second encoder: no `# EOF` and no
//! `# UNIT`; a counter's `# HELP` and `# TYPE` name its samples' name (`…_total`); type
//! `unknown` is `untyped`. Samples are the same in both.

use std::collections::BTreeSet;

/// The `Content-Type` of [`to_classic`]'s text.
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `openmetrics` (as `Metrics::render` writes it) in the classic text format.
pub fn to_classic(openmetrics: &str) -> String {
    let counters: BTreeSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(prefix);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                out.push(' ');
                out.push_str(if tail == "unknown" { "untyped" } else { tail });
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_rewritten_and_samples_kept() {
        let om = "# HELP agentd_messages Messages processed.\n# TYPE agentd_messages counter\n\
                  agentd_messages_total{outcome=\"ok\"} 3\n\
                  # HELP agentd_llm_call_duration_seconds Call time.\n\
                  # TYPE agentd_llm_call_duration_seconds histogram\n\
                  # UNIT agentd_llm_call_duration_seconds seconds\n\
                  agentd_llm_call_duration_seconds_bucket{le=\"+Inf\"} 1\n\
                  # HELP agentd_x X.\n# TYPE agentd_x unknown\nagentd_x 1\n# EOF\n";
        assert_eq!(
            to_classic(om),
            "# HELP agentd_messages_total Messages processed.\n\
             # TYPE agentd_messages_total counter\n\
             agentd_messages_total{outcome=\"ok\"} 3\n\
             # HELP agentd_llm_call_duration_seconds Call time.\n\
             # TYPE agentd_llm_call_duration_seconds histogram\n\
             agentd_llm_call_duration_seconds_bucket{le=\"+Inf\"} 1\n\
             # HELP agentd_x X.\n# TYPE agentd_x untyped\nagentd_x 1\n"
        );
    }
}
