//! The `session_status` tool (SPEC §11): context size and share of the window, messages,
//! compactions, uptime, today's cost and tokens, model — a short summary for reading, then the
//! full `SessionStatus` as JSON.

use std::fmt::Write as _;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{SessionStatus, Tool, ToolContext, ToolError};
use crate::llm::ToolSpec;

/// The `session_status` tool. It takes no arguments.
#[derive(Debug, Clone, Default)]
pub struct SessionStatusTool;

impl SessionStatusTool {
    pub fn new() -> SessionStatusTool {
        SessionStatusTool
    }
}

impl Tool for SessionStatusTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "session_status".into(),
            description: "Show this session's status: context size and share of the context \
                          window, message count, compactions, daemon uptime, today's cost and \
                          tokens, and the model in use."
                .into(),
            input_schema: json!({
                "type": "object",
                "properties": {},
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(
        &'a self,
        _args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let status =
                ctx.status.session_status().await.map_err(|e| {
                    ToolError::Failed(format!("session status is unavailable: {e}"))
                })?;
            let json = serde_json::to_string_pretty(&status)
                .map_err(|e| ToolError::Failed(format!("cannot serialise session status: {e}")))?;
            Ok(format!("{}\n\n{json}", summary(&status)))
        })
    }
}

/// The human-readable part of the answer.
pub fn summary(s: &SessionStatus) -> String {
    let mut out = String::new();
    let share = if s.context_window > 0 {
        format!(
            " ({:.1}% of {})",
            s.context_tokens as f64 * 100.0 / s.context_window as f64,
            group(s.context_window)
        )
    } else {
        String::new()
    };
    let t = &s.today_tokens;
    let today_total = t.prompt_tokens().saturating_add(t.output_tokens);
    let _ = writeln!(out, "Session: {} ({})", s.session_key, s.session_id);
    let _ = writeln!(out, "Model: {}", s.model);
    let _ = writeln!(out, "Context: {} tokens{share}", group(s.context_tokens));
    let _ = writeln!(
        out,
        "Messages: {}, compactions: {}",
        s.messages, s.compactions
    );
    let _ = writeln!(out, "Uptime: {}", human_duration(s.uptime_seconds));
    let _ = write!(
        out,
        "Today: ${:.4}, {} tokens (input {}, output {}, cache read {}, cache write {})",
        s.today_cost_usd,
        group(today_total),
        group(t.input_tokens),
        group(t.output_tokens),
        group(t.cache_read_tokens),
        group(t.cache_write_tokens)
    );
    out
}

/// `1234567` → `1,234,567`.
fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `93784` → `1d 2h 3m 4s`; zero units are left out (but `0s` for zero).
fn human_duration(secs: u64) -> String {
    let parts = [
        (secs / 86_400, "d"),
        (secs % 86_400 / 3600, "h"),
        (secs % 3600 / 60, "m"),
        (secs % 60, "s"),
    ];
    let text: Vec<String> = parts
        .iter()
        .filter(|(v, _)| *v > 0)
        .map(|(v, unit)| format!("{v}{unit}"))
        .collect();
    if text.is_empty() {
        "0s".into()
    } else {
        text.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Usage;
    use crate::tools::StatusSource;
    use std::path::PathBuf;
    use std::sync::Arc;

    struct Stub(Result<SessionStatus, String>);
    impl StatusSource for Stub {
        fn session_status(&self) -> BoxFuture<'_, Result<SessionStatus, String>> {
            let r = self.0.clone();
            Box::pin(async move { r })
        }
    }

    fn status() -> SessionStatus {
        SessionStatus {
            session_id: "0192-abc".into(),
            session_key: "telegram:42".into(),
            model: "claude-sonnet-4-5".into(),
            context_tokens: 50_000,
            context_window: 200_000,
            messages: 37,
            compactions: 2,
            uptime_seconds: 93_784,
            today_cost_usd: 1.23456,
            today_tokens: Usage {
                input_tokens: 1_000,
                output_tokens: 2_000,
                cache_read_tokens: 300_000,
                cache_write_tokens: 40_000,
                cache_write_1h_tokens: 0,
            },
        }
    }

    fn ctx(source: Stub) -> ToolContext {
        ToolContext {
            session_id: "0192-abc".into(),
            session_key: "telegram:42".into(),
            workspace: PathBuf::from("/nonexistent"),
            allowed_paths: vec![],
            protected: Default::default(),
            reply_to: None,
            status: Arc::new(source),
            sees_images: false,
        }
    }

    #[tokio::test]
    async fn reports_summary_then_json() {
        let out = SessionStatusTool
            .call(json!({}), &ctx(Stub(Ok(status()))))
            .await
            .unwrap();
        let (text, json) = out.split_once("\n\n").expect("summary, blank line, json");
        assert_eq!(
            text,
            "Session: telegram:42 (0192-abc)\n\
             Model: claude-sonnet-4-5\n\
             Context: 50,000 tokens (25.0% of 200,000)\n\
             Messages: 37, compactions: 2\n\
             Uptime: 1d 2h 3m 4s\n\
             Today: $1.2346, 343,000 tokens (input 1,000, output 2,000, cache read 300,000, \
             cache write 40,000)"
        );
        let parsed: Value = serde_json::from_str(json).unwrap();
        assert_eq!(parsed["messages"], 37);
        assert_eq!(parsed["today_tokens"]["cache_read_tokens"], 300_000);
        assert_eq!(parsed["model"], "claude-sonnet-4-5");
    }

    #[tokio::test]
    async fn unknown_window_omits_the_share() {
        let mut s = status();
        s.context_window = 0;
        let text = summary(&s);
        assert!(text.contains("Context: 50,000 tokens\n"), "{text}");
    }

    #[tokio::test]
    async fn source_failure_is_an_error_result() {
        let err = SessionStatusTool
            .call(json!({}), &ctx(Stub(Err("agent loop gone".into()))))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("agent loop gone"), "{err}");
    }

    #[test]
    fn schema_takes_no_arguments() {
        let spec = SessionStatusTool.spec();
        let v = crate::tools::arg_schema::ArgSchema::compile(&spec.input_schema).unwrap();
        assert!(v.is_valid(&json!({})));
        assert!(!v.is_valid(&json!({"x": 1})));
    }

    #[test]
    fn helpers() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(1_234_567), "1,234,567");
        assert_eq!(human_duration(0), "0s");
        assert_eq!(human_duration(59), "59s");
        assert_eq!(human_duration(3600), "1h");
        assert_eq!(human_duration(3661), "1h 1m 1s");
    }
}
