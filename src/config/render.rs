//! `render_effective`: the effective configuration as TOML-like text for `agentd check-config`.
//! Secrets appear only as `"[redacted]"` or `"[not set]"`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use secrecy::SecretString;

use super::types::{
    CacheTtl, Config, ExecSandbox, McpTransport, ModelSpec, ScheduleAction, ScheduleWhen,
    TelegramFormat, Thinking,
};

/// Render `cfg` as readable TOML-like text, secrets redacted, followed by the `[models]`
/// section listing loaded models (provider, API id, base_url, …) and skipped ones with reasons.
pub fn render_effective(cfg: &Config) -> String {
    let mut r = Renderer::default();
    r.comment(&format!(
        "effective configuration of {}",
        cfg.config_path.display()
    ));

    let a = &cfg.agent;
    r.table("agent");
    r.kv("name", q(&a.name));
    r.kv("workspace", path(&a.workspace));
    r.kv("timezone", q(a.timezone.name()));
    r.table("agent.context");
    r.kv("stable", list(&a.context.stable));
    r.kv("semi_stable", list(&a.context.semi_stable));
    for (tier, files) in &a.context.tiers {
        r.table(&format!("agent.context.tiers.{}", key(tier)));
        r.kv("stable", list(&files.stable));
        r.kv("semi_stable", list(&files.semi_stable));
    }
    r.table("agent.skills");
    r.kv("dir", path(&a.skills.dir));
    r.kv("always_on", list(&a.skills.always_on));

    r.table("providers");
    r.kv("load", list(&cfg.providers.load));
    r.kv("dir", path(&cfg.providers.dir));

    r.table("routing");
    for (source, model) in &cfg.routing {
        r.kv(&key(source), q(model));
    }

    let t = &cfg.telegram;
    r.table("channel.telegram");
    r.kv("enabled", t.enabled.to_string());
    r.kv("token_env", q(&t.token_env));
    r.kv("token", secret(&t.token));
    r.kv("api_url", url(&t.api_url));
    r.kv(
        "allow_from",
        format!(
            "[{}]",
            t.allow_from
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    r.kv(
        "contacts",
        inline_table(
            t.contacts
                .iter()
                .map(|(n, id)| format!("{} = {id}", key(n))),
        ),
    );
    r.kv("text_chunk_limit", t.text_chunk_limit.to_string());
    r.kv("poll_timeout_seconds", secs(t.poll_timeout));
    r.kv("max_download_bytes", t.max_download_bytes.to_string());
    r.kv(
        "format",
        q(match t.format {
            TelegramFormat::Html => "html",
            TelegramFormat::Plain => "plain",
        }),
    );

    r.table("fifo");
    r.kv("enabled", cfg.fifo.enabled.to_string());
    r.kv("path", path(&cfg.fifo.path));
    r.kv("max_line_bytes", cfg.fifo.max_line_bytes.to_string());

    let h = &cfg.http;
    r.table("http");
    r.kv("enabled", h.enabled.to_string());
    r.kv("host", q(&h.host));
    r.kv("port", h.port.to_string());
    r.kv("token_env", q(&h.token_env));
    r.kv("token", secret(&h.token));
    r.kv("max_body_bytes", h.max_body_bytes.to_string());
    r.kv("max_connections", h.max_connections.to_string());
    r.kv("rate_limit", h.rate_limit.to_string());
    r.kv("status_rate_limit", h.status_rate_limit.to_string());
    r.kv("rate_window_seconds", secs(h.rate_window));
    r.kv("callback_url", url(&h.callback_url));
    r.kv("callback_token_env", q(&h.callback_token_env));
    r.kv("callback_token", secret(&h.callback_token));
    r.kv("callback_timeout_seconds", secs(h.callback_timeout));

    let b = &cfg.behavior;
    r.table("behavior");
    r.kv("debounce_ms", b.debounce.as_millis().to_string());
    r.kv(
        "max_concurrent_sessions",
        b.max_concurrent_sessions.to_string(),
    );
    r.kv(
        "max_queued_per_session",
        b.max_queued_per_session.to_string(),
    );
    r.kv("max_queued_total", b.max_queued_total.to_string());
    r.kv("silent_tokens", list(&b.silent_tokens));
    r.kv("typing_indicators", b.typing_indicators.to_string());
    r.kv("show_fallback", b.show_fallback.to_string());
    r.kv("error_message", q(&b.error_message));
    r.kv("max_turns_per_message", b.max_turns_per_message.to_string());
    r.kv("call_timeout_seconds", secs(b.call_timeout));
    r.kv("call_deadline_seconds", secs(b.call_deadline));
    r.kv("max_reply_bytes", b.max_reply_bytes.to_string());
    r.kv("api_retries", b.api_retries.to_string());
    r.kv(
        "api_retry_base_delay_seconds",
        format!("{:?}", b.api_retry_base_delay.as_secs_f64()),
    );
    r.kv("message_retries", b.message_retries.to_string());
    r.kv("output_truncation", b.output_truncation.to_string());
    r.table("behavior.compaction");
    r.kv(
        "threshold_tokens",
        b.compaction.threshold_tokens.to_string(),
    );
    r.kv("model", q(&b.compaction.model));
    r.kv("prompt", q(&b.compaction.prompt));

    r.table("budget");
    r.kv("per_message_usd", num(cfg.budget.per_message_usd));
    r.kv("daily_usd", num(cfg.budget.daily_usd));
    r.kv("monthly_usd", num(cfg.budget.monthly_usd));

    let ap = &cfg.approvals;
    r.table("approvals");
    r.kv("require", list(&ap.require));
    r.kv("over_usd", num(ap.over_usd));
    r.kv("timeout_seconds", secs(ap.timeout));
    match ap.telegram_chat {
        Some(c) => r.kv("telegram_chat", c.to_string()),
        None => r.comment("telegram_chat = (not set: approvals of non-Telegram sessions are not offered in Telegram)"),
    }
    r.kv("system_allow", list(&ap.system_allow));
    let approvers: Vec<String> = ap.approvers.iter().map(i64::to_string).collect();
    r.kv("approvers", format!("[{}]", approvers.join(", ")));

    r.table("delivery");
    r.kv(
        "retry_minutes",
        (cfg.delivery.retry.as_secs() / 60).to_string(),
    );

    let tl = &cfg.tools;
    r.table("tools");
    match &tl.enabled {
        Some(list_) => r.kv("enabled", list(list_)),
        None => {
            r.comment("enabled = (default: every built-in tool whose dependencies are configured)")
        }
    }
    r.kv("exec_timeout_seconds", secs(tl.exec_timeout));
    r.kv("exec_max_timeout_seconds", secs(tl.exec_max_timeout));
    r.kv(
        "exec_sandbox",
        q(match tl.exec_sandbox {
            ExecSandbox::Landlock => "landlock",
            ExecSandbox::None => "none",
        }),
    );
    r.kv("exec_network", tl.exec_network.to_string());
    r.kv("subagent_deny", list(&tl.subagent_deny));
    r.kv("subagent_model", q(&tl.subagent_model));
    r.kv("scratch_dir", path(&tl.scratch_dir));
    r.kv("filesystem.allowed_paths", paths(&tl.allowed_paths));
    r.kv("web_search.provider", q(&tl.web_search_provider));
    r.kv("web_search.base_url", url(&tl.web_search_base_url));
    r.kv("web_search.key", secret(&tl.web_search_key));
    r.kv("web_fetch.max_bytes", tl.web_fetch_max_bytes.to_string());
    r.kv("web_fetch.allow_hosts", list(&tl.web_fetch_allow_hosts));
    r.kv("scheduling.max_scheduled", tl.max_scheduled.to_string());
    r.kv("scheduling.max_delay_seconds", secs(tl.max_delay));
    r.kv("max_parallel_calls", tl.max_parallel_calls.to_string());
    r.kv("writable_context", list(&tl.writable_context));

    for (name, s) in &cfg.mcp_servers {
        r.table(&format!("mcp.servers.{}", key(name)));
        match &s.transport {
            McpTransport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                r.kv("command", q(command));
                r.kv("args", list(args));
                r.kv("env", redacted_map(env.keys()));
                if let Some(cwd) = cwd {
                    r.kv("cwd", path(cwd));
                }
                r.kv("network", s.network.to_string());
            }
            McpTransport::Http { url, headers } => {
                r.kv("url", self::url(url));
                r.kv("headers", redacted_map(headers.keys()));
            }
        }
        r.kv("enabled", s.enabled.to_string());
        match &s.tools {
            Some(t) => r.kv("tools", list(t)),
            None => r.comment("tools = (all)"),
        }
        r.kv("timeout_seconds", secs(s.timeout));
    }

    for s in &cfg.schedules {
        r.array_table("schedule");
        r.kv("name", q(&s.name));
        match &s.when {
            ScheduleWhen::Cron(c) => r.kv("cron", q(c)),
            ScheduleWhen::Every(d) => r.kv("every", q(&format!("{}s", d.as_secs()))),
        }
        match &s.action {
            ScheduleAction::System(t) => r.kv("system", q(t)),
            ScheduleAction::Message { text, to } => {
                r.kv("message", q(text));
                r.kv("to", q(to));
            }
            ScheduleAction::Job(j) => r.kv("job", q(j.as_str())),
        }
        if let Some(p) = &s.precheck {
            r.kv("precheck", q(&p.command));
            r.kv("precheck_timeout", q(&format!("{}s", p.timeout.as_secs())));
        }
    }

    r.table("caching");
    r.kv("ttl", q(cfg.caching.ttl.as_str()));
    r.table("alerts");
    match cfg.alerts.telegram_chat {
        Some(c) => r.kv("telegram_chat", c.to_string()),
        None => r.comment("telegram_chat = (none)"),
    }

    let m = &cfg.memory;
    r.table("memory");
    r.kv("enabled", m.enabled.to_string());
    r.kv("search_top_k", m.search_top_k.to_string());
    r.kv("indexer.include", list(&m.indexer_include));
    r.kv("indexer.chunk_chars", m.chunk_chars.to_string());
    r.kv("indexer.overlap_chars", m.overlap_chars.to_string());
    r.kv("recall.max_tokens", m.recall_max_tokens.to_string());
    r.kv("consolidation.enabled", m.consolidation_enabled.to_string());
    r.kv(
        "consolidation.min_messages",
        m.consolidation_min_messages.to_string(),
    );
    r.kv(
        "consolidation.confidence_threshold",
        num(m.consolidation_confidence_threshold),
    );

    r.table("paths");
    r.kv("state_dir", path(&cfg.paths.state_dir));

    r.table("logging");
    r.kv("level", q(&cfg.logging.level));
    r.kv("file", cfg.logging.file.to_string());
    r.kv("keep_files", cfg.logging.keep_files.to_string());
    r.kv(
        "max_total_mb",
        (cfg.logging.max_total_bytes >> 20).to_string(),
    );

    r.table("retention");
    let rt = &cfg.retention;
    r.kv("inbox_max_age", age(rt.inbox_max_age));
    r.kv("idle_session_after", age(rt.idle_session_after));
    r.kv("archive_max_age", age(rt.archive_max_age));

    let v = &cfg.voice;
    r.table("voice");
    match &v.stt_model {
        Some(m) => r.kv("stt_model", q(m)),
        None => r.comment("stt_model = (none: audio is not transcribed)"),
    }
    match &v.tts_model {
        Some(m) => r.kv("tts_model", q(m)),
        None => r.comment("tts_model = (none: no speech)"),
    }
    r.kv("reply", q(v.reply.as_str()));
    r.kv("echo_transcript", v.echo_transcript.to_string());
    r.kv("voice", q(&v.voice));
    r.kv("max_audio_bytes", v.max_audio_bytes.to_string());
    r.kv("max_audio_seconds", v.max_audio_seconds.to_string());
    r.kv("max_tts_chars", v.max_tts_chars.to_string());

    r.table("models");
    r.comment("loaded");
    for spec in cfg.models.loaded.values() {
        r.kv(&key(&spec.name), model_line(spec));
    }
    if !cfg.models.skipped.is_empty() {
        r.comment("skipped (not usable until fixed)");
    }
    for (name, reason) in &cfg.models.skipped {
        r.kv(&key(name), format!("{{ skipped = {} }}", q(reason)));
    }
    r.out
}

fn model_line(m: &ModelSpec) -> String {
    let mut parts = vec![
        format!("provider = {}", q(&m.provider)),
        format!("type = {}", q(m.kind.as_str())),
        format!("model = {}", q(&m.model)),
        format!("base_url = {}", url(&m.base_url)),
    ];
    if let Some(var) = &m.api_key_env {
        parts.push(format!("api_key_env = {}", q(var)));
        parts.push(format!("api_key = {}", secret(&m.api_key)));
    }
    parts.push(format!("max_tokens = {}", m.max_tokens));
    parts.push(format!("context_window = {}", m.context_window));
    if let Some(k) = &m.tool_schema.keywords {
        parts.push(format!("schema_keywords = {}", list(k)));
    }
    if let Some(n) = m.tool_schema.max_length {
        parts.push(format!("schema_max_length = {n}"));
    }
    if m.tool_calls_in_text {
        parts.push("tool_calls_in_text = true".to_string());
    }
    parts.push(format!(
        "cost_per_mtok = {{ input = {}, output = {}, cache_read = {}, cache_write = {} }}",
        num(m.pricing.input),
        num(m.pricing.output),
        num(m.pricing.cache_read),
        num(m.pricing.cache_write)
    ));
    if m.pricing.per_minute > 0.0 {
        parts.push(format!("cost_per_minute = {}", num(m.pricing.per_minute)));
    }
    if m.pricing.per_1k_chars > 0.0 {
        parts.push(format!(
            "cost_per_1k_chars = {}",
            num(m.pricing.per_1k_chars)
        ));
    }
    parts.push(format!("cache = {}", m.cache));
    if m.kind == super::types::ProviderKind::Anthropic {
        parts.push(format!(
            "cache_ttl = {}",
            q(match m.cache_ttl {
                CacheTtl::FiveMinutes => "5m",
                CacheTtl::OneHour => "1h",
            })
        ));
    }
    parts.push(format!(
        "thinking = {}",
        q(match m.thinking {
            Thinking::Off => "off",
            Thinking::Adaptive => "adaptive",
            Thinking::Budgeted => "budgeted",
        })
    ));
    parts.push(format!("thinking_budget = {}", m.thinking_budget));
    if let Some(e) = &m.thinking_effort {
        parts.push(format!("thinking_effort = {}", q(e)));
    }
    parts.push(format!("supports_vision = {}", m.supports_vision));
    parts.push(format!("fallback = {}", list(&m.fallback)));
    if m.kind == super::types::ProviderKind::OpenAi {
        parts.push(format!("prompt_cache_key = {}", m.prompt_cache_key));
    }
    format!("{{ {} }}", parts.join(", "))
}

#[derive(Default)]
struct Renderer {
    out: String,
}

impl Renderer {
    fn table(&mut self, name: &str) {
        let _ = write!(self.out, "\n[{name}]\n");
    }
    fn array_table(&mut self, name: &str) {
        let _ = write!(self.out, "\n[[{name}]]\n");
    }
    fn kv(&mut self, k: &str, v: String) {
        let _ = writeln!(self.out, "{k} = {v}");
    }
    fn comment(&mut self, text: &str) {
        let _ = writeln!(self.out, "# {text}");
    }
}

/// A TOML basic string.
fn q(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

fn key(k: &str) -> String {
    super::walker::join_key("", k)
}

fn path(p: &Path) -> String {
    q(&p.display().to_string())
}

fn paths(ps: &[PathBuf]) -> String {
    format!(
        "[{}]",
        ps.iter().map(|p| path(p)).collect::<Vec<_>>().join(", ")
    )
}

fn list(items: &[String]) -> String {
    format!(
        "[{}]",
        items.iter().map(|s| q(s)).collect::<Vec<_>>().join(", ")
    )
}

fn secs(d: Duration) -> String {
    d.as_secs().to_string()
}

/// A `[retention]` age as the file takes it: `"<n>s"`, or `"0"` for never.
fn age(d: Option<Duration>) -> String {
    q(&d.map_or_else(|| "0".to_string(), |d| format!("{}s", d.as_secs())))
}

fn num(f: f64) -> String {
    format!("{f:?}")
}

/// A URL without the parts that may be credentials (`redact::display_url`).
fn url(u: &str) -> String {
    q(&crate::redact::display_url(u))
}

fn secret(s: &Option<SecretString>) -> String {
    q(if s.is_some() {
        "[redacted]"
    } else {
        "[not set]"
    })
}

fn redacted_map<'a>(keys: impl Iterator<Item = &'a String>) -> String {
    inline_table(keys.map(|k| format!("{} = \"[redacted]\"", key(k))))
}

fn inline_table(parts: impl Iterator<Item = String>) -> String {
    let parts: Vec<String> = parts.collect();
    if parts.is_empty() {
        "{}".to_string()
    } else {
        format!("{{ {} }}", parts.join(", "))
    }
}
