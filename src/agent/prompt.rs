//! Prompt building (SPEC §6): the stable and semi_stable system blocks from workspace files,
//! the dynamic context attached to the newest user turn, the time prefix, silent tokens.
//!
//! Everything here is pure or reads files only; the order and bytes it produces are part of the
//! prompt-cache contract: the same inputs must always render the same text.

use std::path::Path;

use crate::zone::Zone;
use chrono::{DateTime, Utc};

use crate::config::TierFiles;
use crate::llm::{SystemBlock, SystemTier};

/// System blocks for a tier: one stable block and one semi_stable block, each the tier's files
/// as `--- NAME ---` + content, in the configured order. Missing files are skipped (logged at
/// debug); an empty tier gives no block.
/// `extra_stable` (the silence rule of sources where silence is an answer, [`silence_rule`])
/// ends the stable block; `extra_semi` (the skills index and `always_on` skill bodies) the
/// semi_stable block.
pub fn system_blocks(
    workspace: &Path,
    files: &TierFiles,
    extra_stable: &str,
    extra_semi: &str,
) -> Vec<SystemBlock> {
    let mut out = Vec::new();
    for (tier, names) in [
        (SystemTier::Stable, &files.stable),
        (SystemTier::SemiStable, &files.semi_stable),
    ] {
        let mut text = render_files(workspace, names);
        let extra = match tier {
            SystemTier::Stable => extra_stable,
            SystemTier::SemiStable => extra_semi,
        };
        if !extra.is_empty() {
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str(extra);
        }
        if !text.is_empty() {
            out.push(SystemBlock { tier, text });
        }
    }
    out
}

fn render_files(workspace: &Path, names: &[String]) -> String {
    let mut parts = Vec::new();
    for name in names {
        match std::fs::read_to_string(workspace.join(name)) {
            Ok(content) => parts.push(format!("--- {name} ---\n{}", content.trim_end())),
            Err(e) => tracing::debug!(file = %name, error = %e, "workspace file not loaded"),
        }
    }
    parts.join("\n\n")
}

/// `[Mon, 03. Nov 2026 - 14:05 CET]`
pub fn time_prefix(now: DateTime<Utc>, tz: &Zone) -> String {
    format!(
        "[{}]",
        now.with_timezone(tz).format("%a, %d. %b %Y - %H:%M %Z")
    )
}

/// What the model is told about the message it is answering. Attached to the newest user turn
/// (never to the system prompt) so that everything before it stays byte-identical.
pub struct DynamicContext<'a> {
    pub now: DateTime<Utc>,
    pub tz: &'a Zone,
    pub source: &'a str,
    pub from: &'a str,
    pub max_turns: u32,
    /// Bodies of skills whose trigger appears in this message.
    pub skills: &'a [crate::skills::Skill],
    /// The conversation is near its compaction threshold: tell the agent once (SPEC §15).
    pub compaction_near: bool,
    /// What long-term memory recalls for this message (SPEC §13), already within
    /// `recall.max_tokens`.
    pub recall: Option<&'a str>,
    /// The system text of an OpenAI- or Anthropic-compatible client (SPEC §17).
    pub instructions: Option<&'a str>,
}

impl DynamicContext<'_> {
    pub fn render(&self) -> String {
        let framing = match self.source {
            "telegram" => "a Telegram chat message; your reply is sent to that chat.",
            "matrix" => "a Matrix room message; your reply is sent to that room.",
            "user" => {
                "a message sent with agent-send; your reply is recorded in the session trail (and sent by Telegram if the sender is a contact)."
            }
            "system" => {
                "a system event (agent-send --system, a notification or a schedule); your reply is not delivered to anyone — use tools to act or message people."
            }
            "http" => "a request over the HTTP API; your reply is the HTTP response.",
            "api" => {
                "a request from an OpenAI- or Anthropic-compatible client (a chat app, an editor, an SDK); your reply is the HTTP response."
            }
            "terminal" => {
                "a message typed in the terminal (agentd chat); your reply is printed there."
            }
            _ => "a message from an unknown source.",
        };
        let mut skills = String::new();
        for s in self.skills {
            skills.push_str(&format!(
                "\nSkill triggered by this message:\n--- SKILL {} ---\n{}\n",
                s.name, s.body
            ));
        }
        let recall = match self.recall {
            Some(r) => format!(
                "Recalled from long-term memory (may be incomplete; memory_search for more):\n<memory-recall>\n{r}\n</memory-recall>\n"
            ),
            None => String::new(),
        };
        let instructions = match self.instructions {
            Some(i) => format!(
                "Client instructions (the system prompt of the API client; follow them where they do not conflict with your own instructions):\n<client-instructions>\n{i}\n</client-instructions>\n"
            ),
            None => String::new(),
        };
        let near = if self.compaction_near {
            format!("{}\n", super::compaction::NEAR_NOTICE)
        } else {
            String::new()
        };
        format!(
            "<agentd-context>\nCurrent time: {} ({})\nSource: {} — {}\nSender: {}\nLimits: at most {} model calls for this message.\n{instructions}{near}{recall}{skills}</agentd-context>",
            self.now
                .with_timezone(self.tz)
                .format("%a, %d. %b %Y - %H:%M %Z"),
            self.tz.name(),
            self.source,
            framing,
            self.from,
            self.max_turns,
        )
    }
}

/// Whether silence is an answer to a message from `source`: a system event (a heartbeat, a
/// notification, a schedule) may need no reply; a person or a client asking does.
pub fn silence_allowed(source: &str) -> bool {
    source == "system"
}

/// The rule the stable prompt of a session where silence is an answer ends with: stated once
/// there, not in every user turn (small models took a per-turn reminder as an invitation to
/// stay silent).
pub fn silence_rule(tokens: &[String]) -> String {
    let tokens: Vec<&str> = tokens
        .iter()
        .map(String::as_str)
        .filter(|t| !t.is_empty())
        .collect();
    match tokens.as_slice() {
        [] => String::new(),
        [one] => format!(
            "--- Silence ---\nMessages here are system events. When one needs no answer and no \
             action, reply with exactly {one} (such replies are not delivered)."
        ),
        many => format!(
            "--- Silence ---\nMessages here are system events. When one needs no answer and no \
             action, reply with exactly one of: {} (such replies are not delivered).",
            many.join(", ")
        ),
    }
}

/// A reply that starts or ends with a silent token as a whole word is not delivered (SPEC §5.7),
/// also when a model wrapped it (`<json>{"name": "NO_REPLY"}</json>`, a code fence, quotes,
/// emphasis).
pub fn is_silent(text: &str, tokens: &[String]) -> bool {
    let unwrapped = unwrap_token(text);
    let t = unwrapped.trim();
    tokens.iter().filter(|tok| !tok.is_empty()).any(|tok| {
        let starts = t
            .strip_prefix(tok.as_str())
            .is_some_and(|rest| !rest.chars().next().is_some_and(is_word_char));
        let ends = t
            .strip_suffix(tok.as_str())
            .is_some_and(|rest| !rest.chars().next_back().is_some_and(is_word_char));
        starts || ends
    })
}

/// `text` without the wrappers models put around a lone token: `<json>`/`<response>` tags, a
/// code fence, quotes, backticks, asterisks, and a JSON object or string holding only it
/// (`{"name": "NO_REPLY"}`, `{"reply": "NO_REPLY"}`); other text as it is.
fn unwrap_token(text: &str) -> std::borrow::Cow<'_, str> {
    let mut t = text.trim();
    for _ in 0..4 {
        let before = t;
        for (open, close) in [("<json>", "</json>"), ("<response>", "</response>")] {
            if let Some(inner) = t.strip_prefix(open).and_then(|r| r.strip_suffix(close)) {
                t = inner.trim();
            }
        }
        if let Some(inner) = t.strip_prefix("```").and_then(|r| r.strip_suffix("```")) {
            let inner = inner.trim_start_matches(|c: char| c.is_ascii_alphanumeric());
            t = inner.trim();
        }
        t = t
            .trim_matches(|c| matches!(c, '"' | '\'' | '`' | '*' | '_'))
            .trim();
        if t == before {
            break;
        }
    }
    if t.starts_with('{')
        && let Ok(serde_json::Value::Object(o)) = serde_json::from_str::<serde_json::Value>(t)
        && o.len() <= 2
    {
        let strings: Vec<&str> = o.values().filter_map(|v| v.as_str()).collect();
        if let [only] = strings.as_slice() {
            return std::borrow::Cow::Owned(only.to_string());
        }
    }
    std::borrow::Cow::Borrowed(t)
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks() -> Vec<String> {
        vec!["HEARTBEAT_OK".into(), "NO_REPLY".into()]
    }

    #[test]
    fn wrapped_tokens_are_silent_and_prose_is_not() {
        for text in [
            "<json>{\"name\": \"NO_REPLY\"}</json>",
            "{\"reply\": \"HEARTBEAT_OK\"}",
            "```\nNO_REPLY\n```",
            "**NO_REPLY**",
            "\"NO_REPLY\"",
            "`HEARTBEAT_OK`",
        ] {
            assert!(is_silent(text, &toks()), "{text}");
        }
        for text in [
            "{\"name\": \"NO_REPLY\", \"why\": \"x\", \"extra\": 1}",
            "{\"a\": \"NO_REPLY\", \"b\": \"other\"}",
            "The token NO_REPLY means silence, as configured here.",
        ] {
            assert!(!is_silent(text, &toks()), "{text}");
        }
    }

    #[test]
    fn the_silence_rule_names_the_tokens() {
        assert!(silence_rule(&toks()).contains("HEARTBEAT_OK, NO_REPLY"));
        assert_eq!(silence_rule(&[]), "");
        assert!(silence_allowed("system") && !silence_allowed("telegram"));
    }

    #[test]
    fn silent_tokens_match_whole_words_at_either_end() {
        assert!(is_silent("NO_REPLY", &toks()));
        assert!(is_silent("  HEARTBEAT_OK\n", &toks()));
        assert!(is_silent("NO_REPLY - nothing to do", &toks()));
        assert!(is_silent("All quiet. HEARTBEAT_OK", &toks()));
        assert!(!is_silent("NO_REPLYING", &toks()));
        assert!(!is_silent("say NO_REPLY_X", &toks()));
        assert!(!is_silent("I will not NO_REPLY you here.", &toks()));
        assert!(!is_silent("hello", &toks()));
        assert!(!is_silent("", &toks()));
    }

    #[test]
    fn time_prefix_uses_zone_abbreviation() {
        let t: DateTime<Utc> = "2026-11-03T13:05:00Z".parse().unwrap();
        let tz = Zone::get("Europe/Berlin").unwrap();
        assert_eq!(time_prefix(t, &tz), "[Tue, 03. Nov 2026 - 14:05 CET]");
    }

    #[test]
    fn system_blocks_render_files_in_order_and_skip_missing() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("SOUL.md"), "soul\n").unwrap();
        std::fs::write(d.path().join("USER.md"), "user").unwrap();
        std::fs::write(d.path().join("MEMORY.md"), "mem").unwrap();
        let files = TierFiles {
            stable: vec!["SOUL.md".into(), "MISSING.md".into(), "USER.md".into()],
            semi_stable: vec!["MEMORY.md".into()],
        };
        let b = system_blocks(d.path(), &files, "", "");
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].tier, SystemTier::Stable);
        assert_eq!(b[0].text, "--- SOUL.md ---\nsoul\n\n--- USER.md ---\nuser");
        assert_eq!(b[1].text, "--- MEMORY.md ---\nmem");
        assert!(system_blocks(d.path(), &TierFiles::default(), "", "").is_empty());
        let with_skills = system_blocks(d.path(), &files, "", "--- SKILLS ---\n- x: y");
        assert_eq!(
            with_skills[1].text,
            "--- MEMORY.md ---\nmem\n\n--- SKILLS ---\n- x: y"
        );
    }

    #[test]
    fn dynamic_context_names_source_sender_and_limits() {
        let c = DynamicContext {
            now: "2026-11-03T13:05:00Z".parse().unwrap(),
            tz: &Zone::utc(),
            source: "user",
            from: "alice",
            max_turns: 50,
            skills: &[],
            compaction_near: false,
            recall: None,
            instructions: None,
        }
        .render();
        assert!(c.contains("Sender: alice"));
        assert!(!c.contains("memory-recall"));
        assert!(!c.contains("compaction threshold"));
        assert!(c.contains("at most 50 model calls"));
        // Silence is stated in the stable prompt of system sessions only, never per turn.
        assert!(!c.contains("NO_REPLY"));
    }

    #[test]
    fn client_instructions_are_marked_as_the_clients() {
        let c = DynamicContext {
            now: "2026-11-03T13:05:00Z".parse().unwrap(),
            tz: &Zone::utc(),
            source: "api",
            from: "sdk",
            max_turns: 50,
            skills: &[],
            compaction_near: false,
            recall: None,
            instructions: Some("Answer in French."),
        }
        .render();
        assert!(
            c.contains("Source: api — a request from an OpenAI- or Anthropic-compatible client"),
            "{c}"
        );
        assert!(
            c.contains("<client-instructions>\nAnswer in French.\n</client-instructions>"),
            "{c}"
        );
    }

    #[test]
    fn dynamic_context_carries_the_compaction_notice_when_near() {
        let c = DynamicContext {
            now: "2026-11-03T13:05:00Z".parse().unwrap(),
            tz: &Zone::utc(),
            source: "user",
            from: "alice",
            max_turns: 50,
            skills: &[],
            compaction_near: true,
            recall: Some("Known facts:\n- Anna · birthday: 3 May (fact #1)"),
            instructions: None,
        }
        .render();
        assert!(c.contains("<memory-recall>\nKnown facts:\n- Anna · birthday: 3 May (fact #1)\n</memory-recall>"), "{c}");
        assert!(c.contains(crate::agent::compaction::NEAR_NOTICE), "{c}");
        assert!(c.ends_with("</agentd-context>"));
    }
}

/// Gaps between turns that decide the cache TTL in `auto` (SPEC §20): more than this …
pub const AUTO_1H_ABOVE_SECS: i64 = 5 * 60;
/// … and less than this.
pub const AUTO_1H_BELOW_SECS: i64 = 60 * 60;

/// The TTL of a session's stable and semi_stable cache breakpoints (SPEC §20): `[caching] ttl`,
/// and in `auto` the session's cadence: 1 hour when the median gap between its last user turns
/// (`recent_turns`, Unix seconds, oldest first, the current turn last) is more than 5 minutes
/// and less than an hour; 5 minutes otherwise, and for a session's first turn.
pub fn stable_ttl(
    mode: crate::config::CachingTtl,
    recent_turns: &[i64],
) -> crate::config::CacheTtl {
    use crate::config::{CacheTtl, CachingTtl};
    match mode {
        CachingTtl::FiveMinutes => CacheTtl::FiveMinutes,
        CachingTtl::OneHour => CacheTtl::OneHour,
        CachingTtl::Auto => {
            let mut gaps: Vec<i64> = recent_turns
                .windows(2)
                .map(|w| w[1].saturating_sub(w[0]))
                .collect();
            if gaps.is_empty() {
                return CacheTtl::FiveMinutes;
            }
            gaps.sort_unstable();
            let median = gaps[gaps.len() / 2];
            if median > AUTO_1H_ABOVE_SECS && median < AUTO_1H_BELOW_SECS {
                CacheTtl::OneHour
            } else {
                CacheTtl::FiveMinutes
            }
        }
    }
}

#[cfg(test)]
mod ttl_tests {
    use super::*;
    use crate::config::{CacheTtl, CachingTtl};

    #[test]
    fn auto_follows_the_cadence() {
        let at = |gaps: &[i64]| {
            let mut t = vec![1_000_000];
            for g in gaps {
                t.push(t.last().unwrap() + g);
            }
            stable_ttl(CachingTtl::Auto, &t)
        };
        assert_eq!(stable_ttl(CachingTtl::Auto, &[]), CacheTtl::FiveMinutes);
        assert_eq!(at(&[]), CacheTtl::FiveMinutes, "first turn");
        assert_eq!(at(&[30, 30, 30]), CacheTtl::FiveMinutes, "a live chat");
        assert_eq!(at(&[600, 1200, 900]), CacheTtl::OneHour, "10-20 min apart");
        assert_eq!(at(&[1800, 1800]), CacheTtl::OneHour, "a 30-min heartbeat");
        assert_eq!(
            at(&[7200, 7200]),
            CacheTtl::FiveMinutes,
            "hours apart: nothing survives"
        );
        assert_eq!(
            at(&[300]),
            CacheTtl::FiveMinutes,
            "exactly 5 min is not more"
        );
        assert_eq!(
            at(&[3600]),
            CacheTtl::FiveMinutes,
            "exactly 1 h is not less"
        );
        assert_eq!(
            at(&[30, 900, 900]),
            CacheTtl::OneHour,
            "the median, not one gap"
        );
        assert_eq!(stable_ttl(CachingTtl::OneHour, &[]), CacheTtl::OneHour);
        assert_eq!(
            stable_ttl(CachingTtl::FiveMinutes, &[0, 900, 1800]),
            CacheTtl::FiveMinutes
        );
    }
}
