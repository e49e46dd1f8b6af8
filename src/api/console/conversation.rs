//! One session's trail as a person reads it: user and assistant turns, tool calls and their
//! results folded, thinking folded, attachments, fallbacks, approvals, failures, cost per
//! turn. Everything from the trail is text ([`Html::text`]).

use std::collections::HashMap;

use super::html::{Html, usd};
use crate::message::{Message, ThinkingBlock, ToolCall, UserBlock};
use crate::session::event::{DeliveryStatus, Event, MessageEvent, TrailLine};

/// Renders `lines` as articles of class `turn` (the search box filters them).
pub(crate) fn render(h: &mut Html, lines: &[TrailLine]) {
    let mut tool_names: HashMap<&str, &str> = HashMap::new();
    h.raw(r#"<div class="conversation">"#);
    for l in lines {
        match &l.event {
            Event::Message(m) => match &m.message {
                Message::User { content } => {
                    open(h, "user", "User", &l.ts, m.from.as_deref());
                    for b in content {
                        match b {
                            UserBlock::Text { text } => user_text(h, text),
                            UserBlock::Image { placeholder, .. } => {
                                h.el("p class=\"meta\"", placeholder)
                            }
                        };
                    }
                    h.raw("</article>");
                }
                Message::Assistant {
                    text,
                    tool_calls,
                    thinking,
                    ..
                } => {
                    for c in tool_calls {
                        tool_names.insert(&c.id, &c.name);
                    }
                    assistant(h, &l.ts, m, text, tool_calls, thinking);
                }
                Message::ToolResults { results, .. } => {
                    results_block(h, &l.ts, results, &tool_names)
                }
            },
            Event::ToolResult { results, .. } => results_block(h, &l.ts, results, &tool_names),
            Event::Intake(i) if !i.attachments.is_empty() => {
                open(h, "event", "Attachments", &l.ts, Some(&i.from));
                h.raw("<ul>");
                for a in &i.attachments {
                    h.el("li", a);
                }
                h.raw("</ul></article>");
            }
            Event::Failure { error, reply, .. } => {
                note(h, &l.ts, "Failure", &format!("{reply} ({error})"));
            }
            Event::Approval(a) => note(
                h,
                &l.ts,
                "Approval asked",
                &format!("{}: {}", a.tool, a.summary),
            ),
            Event::ApprovalDecision(d) => note(
                h,
                &l.ts,
                "Approval decided",
                &format!(
                    "{}: {} by {} via {}",
                    d.tool,
                    d.decision.as_str(),
                    d.by,
                    d.channel
                ),
            ),
            Event::Delivery {
                status: status @ (DeliveryStatus::Failed | DeliveryStatus::Unknown),
                channel,
                detail,
                ..
            } => note(
                h,
                &l.ts,
                "Delivery",
                &format!(
                    "{status:?} on {channel}: {}",
                    detail.as_deref().unwrap_or("")
                )
                .to_lowercase(),
            ),
            Event::Compaction { removed, .. } => note(
                h,
                &l.ts,
                "Compaction",
                &format!("{removed} older messages summarised"),
            ),
            Event::Reset { reason } => note(h, &l.ts, "Reset", reason),
            Event::Skipped(p) => note(h, &l.ts, "Skipped by precheck", &p.schedule),
            Event::SessionModel(m) => note(
                h,
                &l.ts,
                "Model",
                &format!(
                    "{} (via {})",
                    m.model.as_deref().unwrap_or("default"),
                    m.channel
                ),
            ),
            _ => {}
        }
    }
    h.raw("</div>");
}

/// A user turn's text; the context block the daemon adds in front is folded.
fn user_text<'h>(h: &'h mut Html, text: &str) -> &'h mut Html {
    const END: &str = "</agentd-context>";
    match text.find(END) {
        Some(at) if text.starts_with("<agentd-context>") => {
            let (context, rest) = text.split_at(at + END.len());
            h.raw("<details class=\"context\"><summary>Context the daemon added</summary><pre>")
                .text(context)
                .raw("</pre></details>")
                .el("p class=\"text\"", rest.trim_start())
        }
        _ => h.el("p class=\"text\"", text),
    }
}

fn assistant(
    h: &mut Html,
    ts: &str,
    m: &MessageEvent,
    text: &str,
    tool_calls: &[ToolCall],
    thinking: &[ThinkingBlock],
) {
    open(h, "assistant", "Assistant", ts, m.model.as_deref());
    for t in thinking {
        if let Some(t) = &t.thinking {
            h.raw("<details class=\"thinking\"><summary>Thinking</summary><pre>")
                .text(t)
                .raw("</pre></details>");
        }
    }
    if !text.is_empty() {
        h.el("p class=\"text\"", text);
    }
    for c in tool_calls {
        h.raw("<details class=\"tool-call\"><summary>Tool call: ")
            .text(&c.name)
            .raw("</summary><pre>")
            .text(&serde_json::to_string_pretty(&c.arguments).unwrap_or_default())
            .raw("</pre></details>");
    }
    if let Some(from) = &m.fallback_from {
        h.el(
            "p class=\"event\"",
            &format!(
                "Fallback: {} answered for {from} ({})",
                m.model.as_deref().unwrap_or("another model"),
                m.fallback_reason.as_deref().unwrap_or("no reason recorded")
            ),
        );
    }
    if let Some(c) = m.message_cost_usd.or(m.cost_usd) {
        let what = if m.message_cost_usd.is_some() {
            "message cost"
        } else {
            "turn cost"
        };
        h.el("p class=\"meta\"", &format!("{what}: {}", usd(c)));
    }
    h.raw("</article>");
}

fn open(h: &mut Html, class: &str, who: &str, ts: &str, detail: Option<&str>) {
    h.raw("<article class=\"turn ")
        .raw(class)
        .raw("\"><header><strong>")
        .text(who)
        .raw("</strong>");
    if let Some(d) = detail {
        h.raw(" · ").text(d);
    }
    h.raw(" <time>").text(ts).raw("</time></header>");
}

fn note(h: &mut Html, ts: &str, what: &str, text: &str) {
    open(h, "event", what, ts, None);
    h.el("p", text).raw("</article>");
}

fn results_block(
    h: &mut Html,
    ts: &str,
    results: &[crate::message::ToolResult],
    names: &HashMap<&str, &str>,
) {
    open(h, "tool", "Tool results", ts, None);
    for r in results {
        let name = names
            .get(r.tool_call_id.as_str())
            .copied()
            .unwrap_or("tool");
        let label = if r.is_error {
            format!("Result of {name} (error)")
        } else {
            format!("Result of {name}")
        };
        h.raw("<details class=\"tool-result\"><summary>")
            .text(&label)
            .raw("</summary><pre>")
            .text(&r.content)
            .raw("</pre></details>");
    }
    h.raw("</article>");
}
