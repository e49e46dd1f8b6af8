//! `--history KEY_OR_ID [--full]`: prints `report::history` (one session's conversation).

use std::fmt::Write;

use super::output::Output;
use crate::message::{Message, UserBlock};
use crate::report::history::{ABBREVIATE_CHARS, History, abbreviate, to_json};
use crate::session::event::{DeliveryStatus, Event, MessageEvent, TrailLine};

/// Text (or JSON) for `--history`.
pub fn render(h: &History, full: bool, as_json: bool) -> Output {
    if as_json {
        return Output::json(&to_json(h, full));
    }
    let mut out = String::new();
    let state = if h.archived { " (archived)" } else { "" };
    let _ = writeln!(out, "session {}{state}", h.session_id);
    for l in &h.events {
        render_line(&mut out, l, full);
    }
    Output::stdout(out)
}

/// Label column width.
const LABEL: usize = 10;

fn entry(out: &mut String, time: &str, label: &str, text: &str) {
    let indent = " ".repeat(time.len() + 2 + LABEL + 1);
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("");
    let _ = writeln!(out, "{time}  {label:<LABEL$} {first}");
    for l in lines {
        let _ = writeln!(out, "{indent}{l}");
    }
}

fn time_of(ts: &str) -> String {
    chrono::DateTime::parse_from_rfc3339(ts)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|_| ts.to_string())
}

fn cut(s: &str, full: bool) -> String {
    if full {
        s.to_string()
    } else {
        abbreviate(s, ABBREVIATE_CHARS)
    }
}

fn render_line(out: &mut String, l: &TrailLine, full: bool) {
    let t = time_of(&l.ts);
    match &l.event {
        Event::Session { key, model, .. } => entry(
            out,
            &t,
            "session",
            &format!("started (key {key}, model {model})"),
        ),
        Event::Intake(i) if full => entry(
            out,
            &t,
            "intake",
            &format!("[{} from {}, id {}] {}", i.source, i.from, i.id, i.text),
        ),
        Event::Intake(_) => {}
        Event::Message(m) => message(out, &t, m, full),
        Event::ToolResult { results, notice } => {
            tool_results(out, &t, results, notice.as_deref(), full)
        }
        Event::Delivery {
            channel,
            status,
            detail,
            ..
        } if full => entry(out, &t, "delivery", &delivery_text(channel, status, detail)),
        Event::Delivery { .. } => {}
        Event::Failure { error, reply, .. } => entry(
            out,
            &t,
            "failure",
            &format!("{error}\nthe sender was told: {reply}"),
        ),
        Event::Compaction { summary, removed } => entry(
            out,
            &t,
            "compaction",
            &format!("{removed} message(s) summarised: {}", cut(summary, full)),
        ),
        Event::Reset { reason } => entry(out, &t, "reset", reason),
        Event::Approval(a) => entry(
            out,
            &t,
            "approval",
            &format!("{} asked for {}: {}", a.id, a.tool, cut(&a.summary, full)),
        ),
        Event::ApprovalDecision(d) => entry(
            out,
            &t,
            "approval",
            &format!(
                "{} {}: {} by {} ({})",
                d.id,
                d.tool,
                d.decision.as_str(),
                d.by,
                d.channel
            ),
        ),
        Event::SessionModel(m) => entry(
            out,
            &t,
            "model",
            &format!(
                "{} (through {})",
                m.model.as_deref().unwrap_or("default (routing)"),
                m.channel
            ),
        ),
        Event::SessionSkill(k) => entry(
            out,
            &t,
            "skill",
            &format!(
                "{} {} (through {})",
                k.name,
                if k.enabled { "on" } else { "off" },
                k.channel
            ),
        ),
        Event::Skipped(p) | Event::Precheck(p) => entry(
            out,
            &t,
            if matches!(l.event, Event::Skipped(_)) {
                "skipped"
            } else {
                "precheck"
            },
            &precheck_text(p),
        ),
    }
}

/// A conversation message: what the user wrote, the assistant's answer and calls, or the
/// results of the calls.
fn message(out: &mut String, t: &str, m: &MessageEvent, full: bool) {
    match &m.message {
        Message::User { content } => {
            let from = m
                .from
                .as_deref()
                .map(|f| format!("[{f}] "))
                .unwrap_or_default();
            entry(
                out,
                t,
                "user",
                &format!("{from}{}", user_text(content, full)),
            );
        }
        Message::Assistant {
            text,
            tool_calls,
            thinking,
            ..
        } => {
            let mut body = String::new();
            if full {
                for th in thinking {
                    if let Some(x) = &th.thinking {
                        let _ = writeln!(body, "(thinking) {x}");
                    }
                }
            }
            if m.silent {
                body.push_str("(silent) ");
            }
            body.push_str(text);
            for c in tool_calls {
                let args = serde_json::to_string(&c.arguments).unwrap_or_default();
                if !body.is_empty() && !body.ends_with('\n') {
                    body.push('\n');
                }
                let _ = write!(body, "→ {}({})", c.name, cut(&args, full));
            }
            entry(out, t, "assistant", &body);
        }
        Message::ToolResults { results, notice } => {
            tool_results(out, t, results, notice.as_deref(), full)
        }
    }
}

/// `telegram: sent (detail)`.
fn delivery_text(channel: &str, status: &DeliveryStatus, detail: &Option<String>) -> String {
    let status = serde_json::to_value(status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let detail = detail
        .as_deref()
        .map(|d| format!(" ({d})"))
        .unwrap_or_default();
    format!("{channel}: {status}{detail}")
}

/// What the sender wrote first; the context block the daemon attached to the turn
/// (`<agentd-context>`: time, source, recall, skills) after it, folded to its size unless
/// `full`.
fn user_text(content: &[UserBlock], full: bool) -> String {
    let is_context = |t: &str| t.starts_with("<agentd-context>");
    let mut words = Vec::new();
    let mut context = Vec::new();
    for b in content {
        match b {
            UserBlock::Text { text } if is_context(text) => context.push(text.as_str()),
            UserBlock::Text { text } => words.push(text.as_str()),
            UserBlock::Image { placeholder, .. } => words.push(placeholder.as_str()),
        }
    }
    let mut text = words.join("\n");
    for c in context {
        if full {
            text.push('\n');
            text.push_str(c);
        } else {
            let chars = c.chars().count();
            text.push_str(&format!("\n(context: {chars} characters; --full shows it)"));
        }
    }
    text
}

/// `heartbeat: skip (exit 1, 12 ms, saved ~$0.0123)`.
fn precheck_text(p: &crate::session::event::PrecheckEvent) -> String {
    let code = p
        .exit_code
        .map_or("no exit code".to_string(), |c| format!("exit {c}"));
    let saved = p
        .saved_usd
        .map(|s| format!(", saved ~${s:.4}"))
        .unwrap_or_default();
    format!(
        "{}: {} ({code}, {} ms{saved})",
        p.schedule,
        p.outcome.as_str(),
        p.ms
    )
}

fn tool_results(
    out: &mut String,
    t: &str,
    results: &[crate::message::ToolResult],
    notice: Option<&str>,
    full: bool,
) {
    for r in results {
        let err = if r.is_error { " error" } else { "" };
        entry(
            out,
            t,
            "tool",
            &format!("[{}{err}] {}", r.tool_call_id, cut(&r.content, full)),
        );
    }
    if let Some(n) = notice {
        entry(out, t, "notice", n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::history::history;
    use crate::report::history::tests::sample;
    use crate::session::SessionStore;
    use crate::zone::Zone;

    #[test]
    fn the_senders_words_come_first_and_the_context_is_folded() {
        let content = vec![
            UserBlock::Text {
                text: "<agentd-context>\nCurrent time: …\n</agentd-context>".into(),
            },
            UserBlock::Text {
                text: "[Mon] remember my cat is Tom".into(),
            },
        ];
        let short = user_text(&content, false);
        assert!(
            short.starts_with("[Mon] remember my cat is Tom\n(context: "),
            "{short}"
        );
        assert!(!short.contains("Current time"));
        let full = user_text(&content, true);
        assert!(
            full.starts_with("[Mon] remember") && full.contains("Current time"),
            "{full}"
        );
    }

    #[test]
    fn text_abbreviated_and_full() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        sample(&store, "alice");
        store.flush_index();
        let h = history(d.path(), "alice").unwrap();
        let text = render(&h, false, false).stdout;
        assert!(text.contains("[alice] read it"), "{text}");
        assert!(text.contains("→ read({\"path\":\"notes.md\"})"), "{text}");
        assert!(text.contains("[300 more chars]"), "{text}");
        assert!(text.contains("It says zzz."), "{text}");
        assert!(!text.contains("intake"), "intake only with --full: {text}");
        let full = render(&h, true, false).stdout;
        assert!(full.contains(&"z".repeat(500)));
        assert!(full.contains("intake"));
        let v: serde_json::Value = serde_json::from_str(&render(&h, false, true).stdout).unwrap();
        assert_eq!(v, to_json(&h, false));
    }

    #[test]
    fn archived_sessions_say_so() {
        let d = tempfile::tempdir().unwrap();
        let store = SessionStore::open(d.path(), Zone::utc()).unwrap();
        let id = sample(&store, "bob");
        store.archive("bob", "reset").unwrap();
        let h = history(d.path(), &id).unwrap();
        assert!(render(&h, false, false).stdout.contains("(archived)"));
    }
}
