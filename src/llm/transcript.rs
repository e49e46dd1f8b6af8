//! Conversations as plain text (pure, on neutral types): what the summary model of compaction
//! and the consolidation model read. No tool blocks, so the request that carries a transcript
//! needs no tool definitions and is valid on every provider.

use crate::message::{Message, UserBlock};

/// `messages` as a plain-text transcript. Each item is cut to `item_chars` characters; images
/// appear as their placeholders; the dynamic-context block of a user turn
/// (`<agentd-context>…</agentd-context>`: time, source, recall) is left out, so recalled memory
/// is not read back as new conversation.
pub fn transcript(messages: &[Message], item_chars: usize) -> String {
    let mut names = std::collections::HashMap::new();
    let mut out = String::new();
    for m in messages {
        match m {
            Message::User { content } => {
                let text: Vec<&str> = content
                    .iter()
                    .map(|b| match b {
                        UserBlock::Text { text } => text.as_str(),
                        UserBlock::Image { placeholder, .. } => placeholder.as_str(),
                    })
                    .collect();
                let text = text.join("\n");
                push_item(&mut out, "user", without_context(&text).trim(), item_chars);
            }
            Message::Assistant {
                text, tool_calls, ..
            } => {
                if !text.is_empty() {
                    push_item(&mut out, "assistant", text, item_chars);
                }
                for c in tool_calls {
                    names.insert(c.id.as_str(), c.name.as_str());
                    let label = format!("assistant called tool {}", c.name);
                    push_item(&mut out, &label, &c.arguments.to_string(), item_chars);
                }
            }
            Message::ToolResults { results, notice } => {
                for r in results {
                    let name = names.get(r.tool_call_id.as_str()).copied().unwrap_or("?");
                    let label = if r.is_error {
                        format!("tool {name} failed")
                    } else {
                        format!("tool {name} returned")
                    };
                    push_item(&mut out, &label, &r.content, item_chars);
                }
                if let Some(n) = notice {
                    push_item(&mut out, "agentd", n, item_chars);
                }
            }
        }
    }
    out
}

fn push_item(out: &mut String, label: &str, text: &str, max_chars: usize) {
    out.push('[');
    out.push_str(label);
    out.push_str("]\n");
    let mut chars = text.char_indices();
    match chars.nth(max_chars) {
        Some((cut, _)) => {
            out.push_str(&text[..cut]);
            out.push_str(" […cut]");
        }
        None => out.push_str(text),
    }
    out.push_str("\n\n");
}

/// `text` without its `<agentd-context>` blocks.
fn without_context(text: &str) -> std::borrow::Cow<'_, str> {
    const OPEN: &str = "<agentd-context>";
    const CLOSE: &str = "</agentd-context>";
    if !text.contains(OPEN) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(OPEN) {
        out.push_str(&rest[..at]);
        match rest[at..].find(CLOSE) {
            Some(end) => rest = &rest[at + end + CLOSE.len()..],
            None => {
                rest = "";
                break;
            }
        }
    }
    out.push_str(rest);
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dynamic_context_is_left_out() {
        let m = Message::user_text(
            "<agentd-context>\nCurrent time: now\nRecall: Anna likes tea\n</agentd-context>\n[Mon] hello",
        );
        let t = transcript(&[m], 1000);
        assert_eq!(t, "[user]\n[Mon] hello\n\n");
        assert_eq!(without_context("a<agentd-context>x"), "a");
        assert_eq!(without_context("plain"), "plain");
    }
}
