//! The plain sections of agentd.toml (SPEC §3): agent, paths, behavior, budget, memory,
//! logging. One line per key; defaults live here.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::paths::{expand_tilde, resolve};
use super::types::{
    AgentConfig, BehaviorConfig, BudgetConfig, CompactionConfig, ContextConfig, DeliveryConfig,
    LoggingConfig, MemoryConfig, RetentionConfig, SkillsConfig, TierFiles,
};
use super::walker::Section;

/// Default `behavior.error_message`.
pub const DEFAULT_ERROR_MESSAGE: &str =
    "Sorry, something went wrong on my side. Please try again in a moment.";

/// Default `behavior.compaction.prompt`.
pub const DEFAULT_COMPACTION_PROMPT: &str = "Summarise the conversation so far for your own future reference. Keep decisions, facts about the user, open tasks and commitments, names, numbers, file paths and anything else needed to continue the work; drop small talk. Write in the language of the conversation.";

/// Read a path value: `${VAR}`-expanded and `~`-expanded, not yet resolved.
pub fn path_value(s: &mut Section<'_>, key: &'static str) -> Option<PathBuf> {
    let raw = s.non_empty(key)?;
    tilde(s, key, &raw)
}

/// `~`-expand `raw` found at `key`; a problem when HOME is unset.
pub fn tilde(s: &Section<'_>, key: &str, raw: &str) -> Option<PathBuf> {
    let p = expand_tilde(raw, s.walker().env());
    if p.is_none() {
        s.problem(
            key,
            "uses ~ but HOME is not set; write an absolute path or set HOME",
        );
    }
    p
}

/// Strings as owned list (for defaults).
pub fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// `[agent]`. `workspace` is resolved against `config_dir`; `skills.dir` against the workspace.
pub fn agent(root: &mut Section<'_>, config_dir: &Path) -> AgentConfig {
    let mut s = root.section("agent");
    let name: String = s.required("name", "\"agentd\"").unwrap_or_default();
    let workspace = if s.has("workspace") {
        path_value(&mut s, "workspace")
    } else {
        s.required::<String>("workspace", "\"../workspace\"");
        None
    };
    let workspace = resolve(&workspace.unwrap_or_else(|| PathBuf::from(".")), config_dir);
    let mut timezone_fallback = None;
    let timezone = match s.get::<String>("timezone") {
        Some(tz) => crate::zone::Zone::get(&tz).unwrap_or_else(|e| {
            s.problem("timezone", e.to_string());
            crate::zone::Zone::utc()
        }),
        None => {
            let (zone, why) = system_timezone_or_why();
            timezone_fallback = why;
            zone
        }
    };

    let mut c = s.section("context");
    let mut context = ContextConfig {
        stable: c.get("stable").unwrap_or_else(|| {
            strings(&["SOUL.md", "AGENTS.md", "USER.md", "IDENTITY.md", "TOOLS.md"])
        }),
        semi_stable: c
            .get("semi_stable")
            .unwrap_or_else(|| strings(&["MEMORY.md"])),
        tiers: Default::default(),
    };
    let mut tiers = c.section("tiers");
    for (tier, value) in tiers.rest() {
        if tier == "full" {
            tiers.problem(
                &tier,
                "tier \"full\" uses [agent.context] itself; set stable and semi_stable there",
            );
            continue;
        }
        if let Some(mut t) = tiers.child(&tier, value) {
            let files = TierFiles {
                stable: t.get("stable").unwrap_or_default(),
                semi_stable: t.get("semi_stable").unwrap_or_default(),
            };
            context.tiers.insert(tier, files);
        }
    }
    drop(tiers);
    drop(c);

    let mut k = s.section("skills");
    let skills_dir = path_value(&mut k, "dir").unwrap_or_else(|| PathBuf::from("skills"));
    let skills = SkillsConfig {
        dir: resolve(&skills_dir, &workspace),
        always_on: k.get("always_on").unwrap_or_default(),
    };
    AgentConfig {
        name,
        workspace,
        timezone,
        timezone_fallback,
        context,
        skills,
    }
}

/// The system's time zone: its name from iana-time-zone and its rules from the system's
/// database, else the rules in `/etc/localtime` itself (a copied file, without the database),
/// else UTC.
pub fn system_timezone() -> crate::zone::Zone {
    system_timezone_or_why().0
}

/// [`system_timezone`], and why it is UTC when it fell back to UTC (the daemon logs it once
/// logging has started: the config is read before).
pub fn system_timezone_or_why() -> (crate::zone::Zone, Option<String>) {
    use crate::zone::Zone;
    let name = iana_time_zone::get_timezone().ok();
    if let Some(zone) = name.as_deref().and_then(|n| Zone::get(n).ok()) {
        return (zone, None);
    }
    match Zone::local_file(name.as_deref().unwrap_or("localtime")) {
        Ok(zone) => (zone, None),
        Err(e) => (Zone::utc(), Some(e.to_string())),
    }
}

/// `[behavior] call_deadline_seconds` default: ten minutes for one model call, from the request
/// to the last event. Well above a long answer at the default `max_tokens` (4096 tokens take
/// a few minutes even on a slow model), so it only ends calls that are stuck; raise it for
/// very long outputs or large thinking budgets.
pub const DEFAULT_CALL_DEADLINE_SECONDS: u64 = 600;

/// `[behavior] max_reply_bytes` default: 1 MiB of text, thinking and tool-call input per
/// model reply, about 250,000 tokens, more than any model's output limit today.
pub const DEFAULT_MAX_REPLY_BYTES: usize = 1024 * 1024;

/// `[behavior]`.
pub fn behavior(root: &mut Section<'_>) -> BehaviorConfig {
    let mut s = root.section("behavior");
    let mut c = s.section("compaction");
    let compaction = CompactionConfig {
        threshold_tokens: c.int("threshold_tokens", 1).unwrap_or(150_000),
        model: c.non_empty("model").unwrap_or_else(|| "compaction".into()),
        prompt: c
            .non_empty("prompt")
            .unwrap_or_else(|| DEFAULT_COMPACTION_PROMPT.into()),
    };
    drop(c);
    BehaviorConfig {
        debounce: Duration::from_millis(s.int("debounce_ms", 0).unwrap_or(500)),
        max_concurrent_sessions: s.int("max_concurrent_sessions", 1).unwrap_or(4),
        max_queued_per_session: s.int("max_queued_per_session", 1).unwrap_or(64),
        max_queued_total: s.int("max_queued_total", 1).unwrap_or(1024),
        silent_tokens: s
            .get("silent_tokens")
            .unwrap_or_else(|| strings(&["HEARTBEAT_OK", "NO_REPLY"])),
        typing_indicators: s.get("typing_indicators").unwrap_or(true),
        show_fallback: s.get("show_fallback").unwrap_or(true),
        error_message: s
            .non_empty("error_message")
            .unwrap_or_else(|| DEFAULT_ERROR_MESSAGE.into()),
        max_turns_per_message: s.int("max_turns_per_message", 1).unwrap_or(50),
        call_timeout: Duration::from_secs(s.int("call_timeout_seconds", 1).unwrap_or(600)),
        call_deadline: Duration::from_secs(
            s.int("call_deadline_seconds", 1)
                .unwrap_or(DEFAULT_CALL_DEADLINE_SECONDS),
        ),
        max_reply_bytes: s
            .int("max_reply_bytes", 1024)
            .unwrap_or(DEFAULT_MAX_REPLY_BYTES),
        api_retries: s.int("api_retries", 0).unwrap_or(2),
        api_retry_base_delay: Duration::from_secs_f64(
            s.number("api_retry_base_delay_seconds", 0.0, 3600.0)
                .unwrap_or(2.0),
        ),
        message_retries: s.int("message_retries", 0).unwrap_or(1),
        output_truncation: s.int("output_truncation", 1).unwrap_or(30_000),
        compaction,
    }
}

/// `[budget]`.
pub fn budget(root: &mut Section<'_>) -> BudgetConfig {
    let mut s = root.section("budget");
    BudgetConfig {
        per_message_usd: s.number("per_message_usd", 0.0, f64::MAX).unwrap_or(0.0),
        daily_usd: s.number("daily_usd", 0.0, f64::MAX).unwrap_or(0.0),
        monthly_usd: s.number("monthly_usd", 0.0, f64::MAX).unwrap_or(0.0),
    }
}

/// `[delivery]`.
pub fn delivery(root: &mut Section<'_>) -> DeliveryConfig {
    let mut s = root.section("delivery");
    let minutes: u64 = s.int("retry_minutes", 1).unwrap_or(10);
    DeliveryConfig {
        retry: Duration::from_secs(minutes.saturating_mul(60)),
    }
}

/// `[memory]`.
pub fn memory(root: &mut Section<'_>) -> MemoryConfig {
    let mut s = root.section("memory");
    let enabled = s.get("enabled").unwrap_or(true);
    let search_top_k = s.int("search_top_k", 1).unwrap_or(10);
    let mut i = s.section("indexer");
    let indexer_include: Vec<String> = i
        .get("include")
        .unwrap_or_else(|| strings(&["MEMORY.md", "memory/*.md"]));
    for pattern in &indexer_include {
        if let Some(why) = include_glob_problem(pattern) {
            i.problem("include", format!("{pattern:?}: {why}"));
        }
    }
    let chunk_chars: usize = i.int("chunk_chars", 1).unwrap_or(1600);
    let overlap_chars: usize = i.int("overlap_chars", 0).unwrap_or(320);
    if overlap_chars >= chunk_chars {
        i.problem(
            "overlap_chars",
            format!("must be below chunk_chars ({chunk_chars})"),
        );
    }
    drop(i);
    let mut r = s.section("recall");
    let recall_max_tokens = r.int("max_tokens", 0).unwrap_or(1500);
    drop(r);
    let mut c = s.section("consolidation");
    MemoryConfig {
        enabled,
        search_top_k,
        indexer_include,
        chunk_chars,
        overlap_chars,
        recall_max_tokens,
        consolidation_enabled: c.get("enabled").unwrap_or(false),
        consolidation_min_messages: c.int("min_messages", 1).unwrap_or(4),
        consolidation_confidence_threshold: c
            .number("confidence_threshold", 0.0, 1.0)
            .unwrap_or(0.6),
    }
}

/// Why an `indexer.include` glob is unusable, if it is: it must stay inside the workspace and
/// be valid glob syntax.
fn include_glob_problem(pattern: &str) -> Option<String> {
    if pattern.trim().is_empty() {
        return Some("an empty pattern matches nothing; remove it".into());
    }
    if pattern.starts_with('/') || pattern.starts_with('~') {
        return Some("must be relative to the workspace (e.g. \"memory/*.md\")".into());
    }
    if pattern.split('/').any(|part| part == "..") {
        return Some("must not leave the workspace ('..')".into());
    }
    glob::Pattern::new(pattern)
        .err()
        .map(|e| format!("is not a valid glob: {e}"))
}

/// `[logging]`.
pub fn logging(root: &mut Section<'_>) -> LoggingConfig {
    let mut s = root.section("logging");
    LoggingConfig {
        level: s.non_empty("level").unwrap_or_else(|| "info".into()),
        file: s.get("file").unwrap_or(true),
        keep_files: s.int("keep_files", 1).unwrap_or(7),
        max_total_bytes: s
            .int::<u64>("max_total_mb", 1)
            .unwrap_or(256)
            .saturating_mul(1 << 20),
    }
}

/// `[retention]` (SPEC §16.3). Each key is an age such as `"30d"`, `"12h"` or `"2s"`, or
/// `"0"` for never.
pub fn retention(root: &mut Section<'_>) -> RetentionConfig {
    let mut s = root.section("retention");
    let mut age = |key: &'static str, default: Option<Duration>| {
        let parsed = match s.take(key) {
            None => return default,
            Some(toml::Value::String(v)) => parse_age(&v),
            // `0` written as a number still means never.
            Some(toml::Value::Integer(0)) => Ok(None),
            Some(other) => Err(format!(
                "expected a string such as \"30d\", or \"0\" for never; got {}",
                super::walker::describe(&other)
            )),
        };
        parsed.unwrap_or_else(|msg| {
            s.problem(key, msg);
            default
        })
    };
    RetentionConfig {
        inbox_max_age: age("inbox_max_age", Some(Duration::from_secs(30 * 86_400))),
        idle_session_after: age("idle_session_after", None),
        archive_max_age: age("archive_max_age", None),
    }
}

/// An age of `[retention]`: `"0"` (never, `None`) or an interval as `[[schedule]] every`
/// takes it (`"30d"`, `"12h"`, `"2s"`, `"1h30m"`).
pub fn parse_age(v: &str) -> Result<Option<Duration>, String> {
    if v.trim() == "0" {
        return Ok(None);
    }
    super::schedule::parse_every(v).map(Some).map_err(|_| {
        format!(
            "expected an age such as \"30d\", \"12h\" or \"2s\" (units s, m, h, d), or \"0\" for never; got {v:?}"
        )
    })
}

/// `[paths]` → the absolute state directory. `AGENTD_STATE_DIR` (process env or .env) wins
/// over `state_dir`; a relative value of the variable resolves against the current directory,
/// a relative `state_dir` against the config directory. Default `~/.agentd`.
pub fn state_dir(root: &mut Section<'_>, config_dir: &Path) -> PathBuf {
    let mut s = root.section("paths");
    let from_file = path_value(&mut s, "state_dir");
    let env = s.walker().env();
    if let Some(raw) = env.get_non_empty("AGENTD_STATE_DIR") {
        if let Some(p) = expand_tilde(&raw, env) {
            let cwd = std::env::current_dir().unwrap_or_else(|_| config_dir.to_path_buf());
            return resolve(&p, &cwd);
        }
        s.walker().problem(
            "",
            "AGENTD_STATE_DIR uses ~ but HOME is not set; give an absolute path",
        );
    }
    let path = from_file.or_else(|| {
        let p = expand_tilde("~/.agentd", env);
        if p.is_none() {
            s.problem(
                "state_dir",
                "the default ~/.agentd needs HOME, which is not set; set state_dir or AGENTD_STATE_DIR",
            );
        }
        p
    });
    resolve(
        &path.unwrap_or_else(|| PathBuf::from(".agentd")),
        config_dir,
    )
}
