//! `--sessions`: prints `report::sessions` (the open sessions, their snapshots and trails).

use std::fmt::Write;

use crate::zone::Zone;
use chrono::TimeZone;

use super::output::Output;
use crate::report::sessions::SessionsReport;

/// Text table (or JSON) for `--sessions`; times in `tz`.
pub fn render(report: &SessionsReport, tz: &Zone, as_json: bool) -> Output {
    if as_json {
        return Output::json(&serde_json::to_value(report).unwrap_or_default());
    }
    if report.sessions.is_empty() {
        return Output::stdout("no sessions");
    }
    let mut out = String::new();
    for s in &report.sessions {
        let created = tz
            .timestamp_opt(s.created_at, 0)
            .single()
            .map(|t| t.format("%Y-%m-%d %H:%M %Z").to_string())
            .unwrap_or_else(|| s.created_at.to_string());
        let context = match s.context_pct {
            Some(p) => format!("{} tokens ({p:.1}%)", s.context_tokens),
            None => format!("{} tokens", s.context_tokens),
        };
        let _ = writeln!(out, "{}  {}", s.key, s.session_id);
        let _ = writeln!(
            out,
            "  created {created}, model {}, {} messages, {} compactions",
            s.model.as_deref().unwrap_or("?"),
            s.message_count,
            s.compaction_count
        );
        let _ = writeln!(
            out,
            "  context {context}, cost {}, {} log file(s), {} bytes",
            super::cost::usd(s.cost_usd),
            s.log_files,
            s.log_bytes
        );
        if let Some(p) = &s.last_precheck {
            let at = tz
                .timestamp_opt(p.at, 0)
                .single()
                .map(|t| t.format("%Y-%m-%d %H:%M:%S %Z").to_string())
                .unwrap_or_else(|| p.at.to_string());
            let code = p
                .event
                .exit_code
                .map_or("no exit code".to_string(), |c| format!("exit {c}"));
            let _ = writeln!(
                out,
                "  precheck {} at {at}: {} ({code}, {} ms)",
                p.event.schedule,
                p.event.outcome.as_str(),
                p.event.ms
            );
        }
    }
    Output::stdout(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::sessions::SessionInfo;

    #[test]
    fn text_and_json() {
        let r = SessionsReport {
            sessions: vec![SessionInfo {
                session_id: "0192f0c4-aaaa-7bbb".into(),
                key: "alice".into(),
                created_at: 1_764_000_000,
                model: Some("primary".into()),
                message_count: 2,
                compaction_count: 0,
                context_tokens: 2000,
                context_pct: Some(1.0),
                cost_usd: 0.25,
                log_files: 1,
                log_bytes: 321,
                last_precheck: Some(crate::report::sessions::PrecheckInfo {
                    at: 1_764_000_060,
                    event: crate::session::event::PrecheckEvent {
                        schedule: "heartbeat".into(),
                        outcome: crate::session::event::PrecheckOutcome::Skip,
                        exit_code: Some(1),
                        ms: 12,
                        saved_usd: Some(0.01),
                    },
                }),
            }],
        };
        let text = render(&r, &Zone::utc(), false).stdout;
        assert!(text.contains("alice  0192f0c4-aaaa-7bbb"), "{text}");
        assert!(text.contains("2000 tokens (1.0%)"), "{text}");
        assert!(text.contains("UTC"), "{text}");
        assert!(
            text.contains("precheck heartbeat at 2025-11-24 16:01:00 UTC: skip (exit 1, 12 ms)"),
            "{text}"
        );
        assert!(
            text.contains("cost $0.2500, 1 log file(s), 321 bytes"),
            "{text}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&render(&r, &Zone::utc(), true).stdout).unwrap();
        assert_eq!(v, serde_json::to_value(&r).unwrap());
        let none = SessionsReport { sessions: vec![] };
        assert_eq!(render(&none, &Zone::utc(), false).stdout, "no sessions\n");
    }
}
