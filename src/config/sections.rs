//! The plain sections of agentd.toml (SPEC §3): agent, paths, behavior, budget, memory,
//! logging. One line per key; defaults live here.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::keys::agent::{self as ka, TIER_SEMI_STABLE, TIER_STABLE};
use super::keys::behavior as kb;
use super::keys::state as ks;
use super::paths::{expand_tilde, resolve};
use super::types::{
    AgentConfig, BehaviorConfig, BudgetConfig, CompactionConfig, ContextConfig, DeliveryConfig,
    LoggingConfig, McpServeConfig, MemoryConfig, RetentionConfig, SkillsConfig, TierFiles,
};
use super::walker::Section;

/// `[agent]`. `workspace` is resolved against `config_dir`; `skills.dir` against the workspace.
pub fn agent(root: &mut Section<'_>, config_dir: &Path) -> AgentConfig {
    let mut s = root.section("agent");
    let name = s.read_required(&ka::NAME).unwrap_or_default();
    let workspace = s.read_required(&ka::WORKSPACE);
    let workspace = resolve(&workspace.unwrap_or_else(|| PathBuf::from(".")), config_dir);
    let mut timezone_fallback = None;
    let given = s.has("timezone");
    let timezone = match s.read_opt(&ka::TIMEZONE) {
        Some(zone) => zone,
        // Invalid (the problem is recorded): the config is refused anyway.
        None if given => crate::zone::Zone::utc(),
        None => {
            let (zone, why) = system_timezone_or_why();
            timezone_fallback = why;
            zone
        }
    };

    let mut c = s.section("context");
    let mut context = ContextConfig {
        stable: c.read(&ka::CONTEXT_STABLE),
        semi_stable: c.read(&ka::CONTEXT_SEMI_STABLE),
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
                stable: t.read(&TIER_STABLE),
                semi_stable: t.read(&TIER_SEMI_STABLE),
            };
            context.tiers.insert(tier, files);
        }
    }
    drop(tiers);
    drop(c);

    let mut k = s.section("skills");
    let skills = SkillsConfig {
        dir: resolve(&k.read(&ka::SKILLS_DIR), &workspace),
        always_on: k.read(&ka::SKILLS_ALWAYS_ON),
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

/// `[behavior]`.
pub fn behavior(root: &mut Section<'_>) -> BehaviorConfig {
    let mut s = root.section("behavior");
    let mut c = s.section("compaction");
    let compaction = CompactionConfig {
        threshold_tokens: c.read(&kb::COMPACTION_THRESHOLD),
        model: c.read(&kb::COMPACTION_MODEL),
        prompt: c.read(&kb::COMPACTION_PROMPT),
    };
    drop(c);
    BehaviorConfig {
        debounce: s.read(&kb::DEBOUNCE_MS),
        max_concurrent_sessions: s.read(&kb::MAX_CONCURRENT_SESSIONS),
        max_queued_per_session: s.read(&kb::MAX_QUEUED_PER_SESSION),
        max_queued_total: s.read(&kb::MAX_QUEUED_TOTAL),
        idle_session_cache_bytes: s.read(&kb::IDLE_SESSION_CACHE_BYTES),
        silent_tokens: s.read(&kb::SILENT_TOKENS),
        typing_indicators: s.read(&kb::TYPING_INDICATORS),
        show_fallback: s.read(&kb::SHOW_FALLBACK),
        error_message: s.read(&kb::ERROR_MESSAGE),
        max_turns_per_message: s.read(&kb::MAX_TURNS_PER_MESSAGE),
        call_timeout: s.read(&kb::CALL_TIMEOUT),
        call_deadline: s.read(&kb::CALL_DEADLINE),
        max_reply_bytes: s.read(&kb::MAX_REPLY_BYTES),
        api_retries: s.read(&kb::API_RETRIES),
        api_retry_base_delay: s.read(&kb::API_RETRY_BASE_DELAY),
        message_retries: s.read(&kb::MESSAGE_RETRIES),
        output_truncation: s.read(&kb::OUTPUT_TRUNCATION),
        compaction,
    }
}

/// `[budget]`.
pub fn budget(root: &mut Section<'_>) -> BudgetConfig {
    let mut s = root.section("budget");
    BudgetConfig {
        per_message_usd: s.read(&kb::BUDGET_PER_MESSAGE),
        daily_usd: s.read(&kb::BUDGET_DAILY),
        monthly_usd: s.read(&kb::BUDGET_MONTHLY),
    }
}

/// `[delivery]`.
pub fn delivery(root: &mut Section<'_>) -> DeliveryConfig {
    let mut s = root.section("delivery");
    DeliveryConfig {
        retry: s.read(&kb::RETRY_MINUTES),
    }
}

/// `[mcp_server]`.
pub fn mcp_server(root: &mut Section<'_>) -> McpServeConfig {
    let mut s = root.section("mcp_server");
    McpServeConfig {
        allow_approvals: s.read(&super::keys::channels::MCP_SERVE_ALLOW_APPROVALS),
    }
}

/// `[memory]`.
pub fn memory(root: &mut Section<'_>) -> MemoryConfig {
    let mut s = root.section("memory");
    let enabled = s.read(&ks::MEMORY_ENABLED);
    let search_top_k = s.read(&ks::SEARCH_TOP_K);
    let mut i = s.section("indexer");
    let indexer_include = i.read(&ks::INDEXER_INCLUDE);
    for pattern in &indexer_include {
        if let Some(why) = include_glob_problem(pattern) {
            i.problem("include", format!("{pattern:?}: {why}"));
        }
    }
    let chunk_chars = i.read(&ks::CHUNK_CHARS);
    let overlap_chars = i.read(&ks::OVERLAP_CHARS);
    if overlap_chars >= chunk_chars {
        i.problem(
            "overlap_chars",
            format!("must be below chunk_chars ({chunk_chars})"),
        );
    }
    drop(i);
    let mut r = s.section("recall");
    let recall_max_tokens = r.read(&ks::RECALL_MAX_TOKENS);
    drop(r);
    let mut c = s.section("consolidation");
    MemoryConfig {
        enabled,
        search_top_k,
        indexer_include,
        chunk_chars,
        overlap_chars,
        recall_max_tokens,
        consolidation_enabled: c.read(&ks::CONSOLIDATION_ENABLED),
        consolidation_min_messages: c.read(&ks::CONSOLIDATION_MIN_MESSAGES),
        consolidation_confidence_threshold: c.read(&ks::CONSOLIDATION_CONFIDENCE),
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
        level: s.read(&ks::LOG_LEVEL),
        file: s.read(&ks::LOG_FILE),
        keep_files: s.read(&ks::LOG_KEEP_FILES),
        max_total_bytes: s.read(&ks::LOG_MAX_TOTAL),
    }
}

/// `[retention]` (SPEC §16.3). Each key is an age such as `"30d"`, `"12h"` or `"2s"`, or
/// `"0"` for never.
pub fn retention(root: &mut Section<'_>) -> RetentionConfig {
    let mut s = root.section("retention");
    RetentionConfig {
        inbox_max_age: s.read(&ks::INBOX_MAX_AGE),
        idle_session_after: s.read(&ks::IDLE_SESSION_AFTER),
        archive_max_age: s.read(&ks::ARCHIVE_MAX_AGE),
    }
}

/// `[backup]` (SPEC §24).
pub fn backup(root: &mut Section<'_>, config_dir: &std::path::Path) -> super::types::BackupConfig {
    let mut s = root.section("backup");
    super::types::BackupConfig {
        dir: s
            .read_opt(&ks::BACKUP_DIR)
            .flatten()
            .map(|p| super::paths::resolve(&p, config_dir)),
        every: s.read(&ks::BACKUP_EVERY),
        keep: s.read(&ks::BACKUP_KEEP),
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
    let from_file = s.read_opt(&ks::STATE_DIR);
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
