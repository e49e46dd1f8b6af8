//! End-to-end tests of `load` and `render_effective` on files in a temporary directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use proptest::prelude::*;
use secrecy::ExposeSecret;

use super::*;

pub(crate) const ANTHROPIC: &str = r#"
type = "anthropic"
api_key_env = "AGENTD_ANTHROPIC_KEY"
[models.primary]
model = "claude-sonnet-4-5"
"#;

/// A checkout-like layout: `<tmp>/config/agentd.toml`, `<tmp>/providers.d/*.toml`,
/// `<tmp>/home` as HOME.
pub(crate) struct Fixture {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) env: BTreeMap<String, String>,
}

impl Fixture {
    pub(crate) fn new(config: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("config")).unwrap();
        std::fs::create_dir_all(dir.path().join("providers.d")).unwrap();
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        let f = Fixture {
            env: BTreeMap::from([(
                "HOME".to_string(),
                dir.path().join("home").display().to_string(),
            )]),
            dir,
        };
        f.write("config/agentd.toml", config);
        f
    }

    pub(crate) fn root(&self) -> PathBuf {
        std::fs::canonicalize(self.dir.path()).unwrap()
    }

    pub(crate) fn write(&self, rel: &str, text: &str) {
        std::fs::write(self.dir.path().join(rel), text).unwrap();
    }

    pub(crate) fn provider(&self, name: &str, text: &str) {
        self.write(&format!("providers.d/{name}.toml"), text);
    }

    pub(crate) fn set(&mut self, k: &str, v: &str) {
        self.env.insert(k.to_string(), v.to_string());
    }

    pub(crate) fn config_path(&self) -> PathBuf {
        self.dir.path().join("config/agentd.toml")
    }

    pub(crate) fn load(&self) -> Result<Config, ConfigError> {
        load_with_env(&self.config_path(), self.env.clone())
    }

    pub(crate) fn ok(&self) -> Config {
        match self.load() {
            Ok(c) => c,
            Err(e) => panic!("expected a valid config, got:\n{e}"),
        }
    }

    /// Problems as `key: message` lines (file names stripped).
    pub(crate) fn problems(&self) -> Vec<String> {
        match self.load() {
            Ok(_) => panic!("expected problems, config was valid"),
            Err(ConfigError::Invalid { problems, .. }) => problems
                .iter()
                .map(|p| format!("{}: {}", p.key, p.message))
                .collect(),
            Err(e) => panic!("expected Invalid, got {e}"),
        }
    }
}

pub(crate) const MINIMAL: &str = r#"
[agent]
name = "test"
workspace = "../workspace"
[providers]
dir = "../providers.d"
"#;

pub(crate) fn minimal_with_key() -> Fixture {
    let mut f = Fixture::new(MINIMAL);
    f.provider("anthropic", ANTHROPIC);
    f.set("AGENTD_ANTHROPIC_KEY", "sk-test-SECRET");
    f
}

fn has(problems: &[String], needle: &str) -> bool {
    problems.iter().any(|p| p.contains(needle))
}

#[test]
fn minimal_config_gets_every_default() {
    let f = minimal_with_key();
    let c = f.ok();
    let root = f.root();
    let home = root.join("home");

    assert_eq!(c.config_path, root.join("config/agentd.toml"));
    assert_eq!(c.config_dir, root.join("config"));
    assert_eq!(c.agent.name, "test");
    assert_eq!(c.agent.workspace, root.join("workspace"));
    assert_eq!(c.agent.timezone, system_timezone());
    assert_eq!(
        c.agent.context.stable,
        ["SOUL.md", "AGENTS.md", "USER.md", "IDENTITY.md", "TOOLS.md"]
    );
    assert_eq!(c.agent.context.semi_stable, ["MEMORY.md"]);
    assert!(c.agent.context.tiers.is_empty());
    assert_eq!(c.agent.skills.dir, root.join("workspace/skills"));
    assert!(c.agent.skills.always_on.is_empty());
    assert_eq!(c.providers.load, ["anthropic"]);
    assert_eq!(c.providers.dir, root.join("providers.d"));
    assert!(c.routing.is_empty());

    assert_eq!(c.paths.state_dir, home.join(".agentd"));
    assert!(c.fifo.enabled);
    assert_eq!(c.fifo.path, home.join(".agentd/control.pipe"));
    assert_eq!(c.fifo.max_line_bytes, 4096);

    assert!(!c.http.enabled);
    assert_eq!(c.http.host, "127.0.0.1");
    assert_eq!(c.http.port, 8100);
    assert_eq!(c.http.token_env, "AGENTD_HTTP_TOKEN");
    assert!(c.http.token.is_none());
    assert_eq!(c.http.max_body_bytes, 10 * 1024 * 1024);
    assert_eq!((c.http.rate_limit, c.http.status_rate_limit), (30, 60));
    assert_eq!(c.http.rate_window, Duration::from_secs(60));
    assert_eq!(c.http.callback_url, "");
    assert!(c.http.callback_token.is_none());
    assert_eq!(c.http.callback_timeout, Duration::from_secs(10));

    let t = &c.telegram;
    assert!(!t.enabled);
    assert_eq!(t.token_env, "AGENTD_TELEGRAM_TOKEN");
    assert_eq!(t.api_url, "https://api.telegram.org");
    assert!(t.allow_from.is_empty() && t.contacts.is_empty());
    assert_eq!(t.text_chunk_limit, 4096);
    assert_eq!(t.poll_timeout, Duration::from_secs(30));
    assert_eq!(t.max_download_bytes, 20 * 1024 * 1024);
    assert_eq!(t.format, TelegramFormat::Html);

    let b = &c.behavior;
    assert_eq!(b.debounce, Duration::from_millis(500));
    assert_eq!(b.max_concurrent_sessions, 4);
    assert_eq!(b.max_queued_per_session, 64);
    assert_eq!(b.max_queued_total, 1024);
    assert_eq!(b.silent_tokens, ["HEARTBEAT_OK", "NO_REPLY"]);
    assert!(b.typing_indicators);
    assert!(b.show_fallback);
    assert!(!b.error_message.is_empty());
    assert_eq!(b.max_turns_per_message, 50);
    assert_eq!(b.call_timeout, Duration::from_secs(600));
    assert_eq!(b.call_deadline, Duration::from_secs(900));
    assert_eq!((b.api_retries, b.message_retries), (2, 1));
    assert_eq!(b.api_retry_base_delay, Duration::from_secs(2));
    assert_eq!(b.output_truncation, 30_000);
    assert_eq!(b.compaction.threshold_tokens, 150_000);
    assert_eq!(b.compaction.model, "compaction");
    assert!(!b.compaction.prompt.is_empty());

    assert_eq!(c.budget, BudgetConfig::default());

    let tl = &c.tools;
    assert!(tl.enabled.is_none());
    assert_eq!(tl.exec_timeout, Duration::from_secs(120));
    assert_eq!(tl.exec_max_timeout, Duration::from_secs(600));
    assert_eq!(tl.exec_sandbox, ExecSandbox::Landlock);
    assert!(!tl.exec_network);
    // SPEC §16.8: the workspace and a per-uid scratch directory, no longer all of /tmp.
    let scratch = std::env::temp_dir().join(format!("agentd-scratch-{}", nix::unistd::geteuid()));
    assert_eq!(tl.scratch_dir, scratch);
    assert_eq!(tl.allowed_paths, [root.join("workspace"), scratch]);
    assert_eq!(
        tl.subagent_deny,
        ["sessions_spawn", "schedule_message", "react"]
    );
    assert_eq!(tl.subagent_model, "subagent");
    assert_eq!(tl.web_search_provider, "brave");
    assert!(tl.web_search_base_url.starts_with("https://"));
    assert_eq!(tl.web_fetch_max_bytes, 2 * 1024 * 1024);
    assert!(tl.web_fetch_allow_hosts.is_empty());
    assert_eq!(tl.max_scheduled, 50);
    assert_eq!(tl.max_delay, Duration::from_secs(30 * 86_400));
    assert_eq!(tl.max_parallel_calls, 8);
    assert_eq!(tl.writable_context, ["MEMORY.md"]);
    assert!(tl.web_search_key.is_none());

    let m = &c.memory;
    assert!(m.enabled);
    assert_eq!(m.search_top_k, 10);
    assert_eq!(m.indexer_include, ["MEMORY.md", "memory/*.md"]);
    assert_eq!((m.chunk_chars, m.overlap_chars), (1600, 320));
    assert_eq!(m.recall_max_tokens, 1500);
    assert!(!m.consolidation_enabled);
    assert_eq!(m.consolidation_min_messages, 4);
    assert_eq!(m.consolidation_confidence_threshold, 0.6);

    assert_eq!(c.logging.level, "info");
    assert!(c.logging.file);
    assert_eq!(c.logging.keep_files, 7);
    assert_eq!(
        c.retention,
        RetentionConfig {
            inbox_max_age: Some(Duration::from_secs(30 * 86_400)),
            idle_session_after: None,
            archive_max_age: None,
        }
    );
    assert!(c.mcp_servers.is_empty() && c.schedules.is_empty());

    let p = c.models.get("primary").expect("primary loaded");
    assert_eq!(p.provider, "anthropic");
    assert_eq!(p.kind, ProviderKind::Anthropic);
    assert_eq!(p.model, "claude-sonnet-4-5");
    assert_eq!(p.base_url, ANTHROPIC_BASE_URL);
    assert_eq!(
        p.api_key.as_ref().map(|k| k.expose_secret().to_string()),
        Some("sk-test-SECRET".to_string())
    );
    assert_eq!((p.max_tokens, p.context_window), (4096, 200_000));
    assert!(p.cache);
    assert_eq!(p.cache_ttl, CacheTtl::FiveMinutes);
    assert_eq!(p.thinking, Thinking::Off);
    assert_eq!(p.thinking_budget, 10_000);
    assert!(!p.supports_vision && !p.prompt_cache_key);
    assert!(p.fallback.is_empty() && p.thinking_effort.is_none());
    assert_eq!(p.pricing, Pricing::default());
    assert!(c.models.skipped.is_empty());
}

#[test]
fn delivery_retry_minutes_defaults_to_10_and_must_be_positive() {
    assert_eq!(
        minimal_with_key().ok().delivery.retry,
        Duration::from_secs(600)
    );
    let mut f = Fixture::new(&format!("{MINIMAL}[delivery]\nretry_minutes = 2\n"));
    f.provider("anthropic", ANTHROPIC);
    f.set("AGENTD_ANTHROPIC_KEY", "sk-test-SECRET");
    assert_eq!(f.ok().delivery.retry, Duration::from_secs(120));
    let mut f = Fixture::new(&format!("{MINIMAL}[delivery]\nretry_minutes = 0\n"));
    f.provider("anthropic", ANTHROPIC);
    f.set("AGENTD_ANTHROPIC_KEY", "sk-test-SECRET");
    assert!(
        has(
            &f.problems(),
            "delivery.retry_minutes: expected an integer ≥ 1"
        ),
        "{:?}",
        f.problems()
    );
}

#[test]
fn three_mistakes_are_reported_together_with_key_paths() {
    let f = Fixture::new(
        r#"
[agent]
name = "test"
workspace = "../workspace"
[providers]
dir = "../providers.d"
[behavior]
max_turns_per_message = "x"
[http]
port = 0
[channel.telegram]
format = "markdown"
"#,
    );
    f.provider("anthropic", ANTHROPIC);
    let problems = f.problems();
    assert_eq!(
        problems,
        [
            "channel.telegram.format: expected one of \"html\", \"plain\", got \"markdown\"",
            "http.port: expected an integer ≥ 1, got 0",
            "behavior.max_turns_per_message: expected an integer ≥ 1, got \"x\"",
        ]
    );
    // Display: one problem per line, each naming the file.
    let text = f.load().unwrap_err().to_string();
    assert_eq!(text.lines().count(), 3);
    assert!(text.lines().all(|l| l.contains("agentd.toml: ")));
}

#[test]
fn unknown_keys_are_errors_with_a_suggestion() {
    let f = Fixture::new(
        r#"
[agent]
nmae = "test"
name = "test"
workspace = "../workspace"
[providers]
dir = "../providers.d"
[behaviour]
debounce_ms = 1
"#,
    );
    f.provider("anthropic", &format!("{ANTHROPIC}max_tokns = 5\n"));
    let problems = f.problems();
    assert!(
        has(
            &problems,
            "agent.nmae: unknown key (did you mean \"name\"?)"
        ),
        "{problems:?}"
    );
    assert!(
        has(
            &problems,
            "behaviour: unknown key (did you mean \"behavior\"?)"
        ),
        "{problems:?}"
    );
    assert!(
        has(
            &problems,
            "models.primary.max_tokns: unknown key (did you mean \"max_tokens\"?)"
        ),
        "{problems:?}"
    );
}

#[test]
fn toml_syntax_errors_carry_line_and_column() {
    let f = Fixture::new("[agent]\nname = \"x\"\nworkspace = \n");
    let problems = f.problems();
    assert_eq!(problems.len(), 1);
    assert!(problems[0].contains("line 3"), "{problems:?}");
    assert!(problems[0].contains("column"), "{problems:?}");
}

#[test]
fn dotenv_beside_config_is_read_and_the_environment_wins() {
    let mut f = Fixture::new(MINIMAL);
    f.provider("anthropic", ANTHROPIC);
    f.provider(
        "openai",
        "type = \"openai\"\napi_key_env = \"AGENTD_OPENAI_KEY\"\n[models.subagent]\nmodel = \"gpt-4.1-mini\"\n",
    );
    f.write(
        "config/agentd.toml",
        &MINIMAL.replace(
            "[providers]",
            "[providers]\nload = [\"anthropic\", \"openai\"]",
        ),
    );
    f.write(
        "config/.env",
        "# secrets\nexport AGENTD_ANTHROPIC_KEY=\"from-file\"\nAGENTD_OPENAI_KEY='file-openai'\n",
    );
    f.set("AGENTD_ANTHROPIC_KEY", "from-process");
    let c = f.ok();
    let key = |name: &str| {
        c.models
            .get(name)
            .unwrap()
            .api_key
            .as_ref()
            .unwrap()
            .expose_secret()
            .to_string()
    };
    assert_eq!(key("primary"), "from-process");
    assert_eq!(key("subagent"), "file-openai");
}

#[test]
fn malformed_dotenv_lines_are_problems() {
    let f = minimal_with_key();
    f.write("config/.env", "GOOD=1\nthis is not an assignment\n");
    let problems = f.problems();
    assert_eq!(problems, ["line 2: expected KEY=VALUE"]);
}

#[test]
fn variables_expand_and_undefined_ones_are_named() {
    let mut f = minimal_with_key();
    f.write(
        "config/agentd.toml",
        &format!("{MINIMAL}[http]\nhost = \"${{BIND_HOST}}\"\ncallback_url = \"https://${{HOOK_HOST}}/hook\"\n"),
    );
    f.write("config/.env", "HOOK_HOST=hooks.example.org\n");
    f.set("BIND_HOST", "0.0.0.0");
    let c = f.ok();
    assert_eq!(c.http.host, "0.0.0.0");
    assert_eq!(c.http.callback_url, "https://hooks.example.org/hook");

    f.env.remove("BIND_HOST");
    let problems = f.problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].starts_with("http.host: environment variable BIND_HOST"));
}

#[test]
fn provider_keys_are_inherited_and_model_values_win() {
    let mut f = Fixture::new(&MINIMAL.replace(
        "[providers]",
        "[providers]\nload = [\"anthropic\", \"local\"]",
    ));
    f.provider("anthropic", ANTHROPIC);
    f.provider(
        "local",
        r#"
type = "openai"
base_url = "http://127.0.0.1:11434/v1/"
max_tokens = 2048
cost_per_mtok = { input = 1.0, output = 2.0 }
[models.subagent]
model = "small"
[models.big]
model = "large"
max_tokens = 16000
base_url = "http://10.0.0.2:8000/v1"
cost_per_mtok = { output = 9.0 }
prompt_cache_key = true
fallback = ["subagent", "primary"]
"#,
    );
    f.set("AGENTD_ANTHROPIC_KEY", "k");
    let c = f.ok();
    let small = c.models.get("subagent").unwrap();
    assert_eq!(small.provider, "local");
    assert_eq!(small.kind, ProviderKind::OpenAi);
    assert_eq!(small.base_url, "http://127.0.0.1:11434/v1");
    assert_eq!(small.max_tokens, 2048);
    assert!(small.api_key.is_none() && small.api_key_env.is_none());
    assert!(!small.cache, "openai models default to cache = false");
    assert_eq!(small.pricing.input, 1.0);
    let big = c.models.get("big").unwrap();
    assert_eq!(big.max_tokens, 16000);
    assert_eq!(big.base_url, "http://10.0.0.2:8000/v1");
    assert_eq!(big.pricing.output, 9.0);
    assert_eq!(big.pricing.input, 1.0, "unset price fields still inherit");
    assert!(big.prompt_cache_key);
    assert_eq!(big.fallback, ["subagent", "primary"]);
    assert_eq!(big.context_window, 200_000);
}

#[test]
fn later_definitions_replace_earlier_ones_and_inline_models_need_type() {
    let mut f = Fixture::new(&format!(
        "{MINIMAL}[models.primary]\ntype = \"openai\"\nmodel = \"inline-model\"\n[models.untyped]\nmodel = \"x\"\n"
    ));
    f.provider("anthropic", ANTHROPIC);
    f.set("AGENTD_ANTHROPIC_KEY", "k");
    let problems = f.problems();
    assert_eq!(
        problems,
        ["models.untyped.type: required for inline models; add type = \"anthropic\" or \"openai\""]
    );
    f.write(
        "config/agentd.toml",
        &format!("{MINIMAL}[models.primary]\ntype = \"openai\"\nmodel = \"inline-model\"\n"),
    );
    let c = f.ok();
    let p = c.models.get("primary").unwrap();
    assert_eq!(p.provider, "inline");
    assert_eq!(p.model, "inline-model");
    assert_eq!(p.base_url, OPENAI_BASE_URL);
}

#[test]
fn missing_key_skips_the_model_with_a_reason() {
    let mut f = Fixture::new(MINIMAL);
    f.provider(
        "anthropic",
        &format!(
            "{ANTHROPIC}[models.local]\nmodel = \"m\"\ntype = \"openai\"\napi_key_env = \"\"\n"
        ),
    );
    // An empty api_key_env is a mistake, not "no key".
    assert!(has(
        &f.problems(),
        "models.local.api_key_env: must not be empty"
    ));

    f.provider(
        "anthropic",
        &format!("{ANTHROPIC}[models.other]\nmodel = \"m\"\n"),
    );
    f.set("AGENTD_ANTHROPIC_KEY", "   ");
    let c = f.ok();
    assert!(c.models.loaded.is_empty());
    let reason = &c.models.skipped["primary"];
    assert!(
        reason.contains("environment variable AGENTD_ANTHROPIC_KEY is not set"),
        "{reason}"
    );
    assert!(reason.contains("anthropic.toml"), "{reason}");
    assert!(reason.contains(".env or the environment"), "{reason}");
    assert!(c.models.skipped.contains_key("other"));
}

#[test]
fn model_validation_problems() {
    let f = Fixture::new(&MINIMAL.replace(
        "[providers]",
        "[providers]\nload = [\"anthropic\", \"oai\", \"nope\"]",
    ));
    f.provider(
        "anthropic",
        &format!(
            "{ANTHROPIC}fallback = [\"ghost\"]\nthinking = \"budgeted\"\n[models.nomodel]\nmax_tokens = 10\n"
        ),
    );
    f.provider(
        "oai",
        "type = \"openai\"\n[models.x]\nmodel = \"m\"\ncache_ttl = \"1h\"\n[models.y]\nmodel = \"m\"\ntype = \"claude\"\n",
    );
    let problems = f.problems();
    for expected in [
        "models.primary.thinking_budget: must be below max_tokens (4096)",
        "models.nomodel.model: required",
        "models.x.cache_ttl: only valid for type = \"anthropic\"",
        "models.y.type: expected one of \"anthropic\", \"openai\", \"elevenlabs\", got \"claude\"",
        "providers.load[2]: provider file",
        // An invalid model's fallback list is still checked.
        "models.primary.fallback[0]: no model named \"ghost\" is defined",
    ] {
        assert!(
            has(&problems, expected),
            "missing {expected:?} in {problems:?}"
        );
    }
}

#[test]
fn fallback_and_routing_must_name_defined_models() {
    let mut f = Fixture::new(&format!(
        "{MINIMAL}[routing]\ntelegram = \"primary\"\nuser = \"nowhere\"\ntelegarm = \"primary\"\n"
    ));
    f.provider(
        "anthropic",
        &format!("{ANTHROPIC}fallback = [\"backup\"]\n"),
    );
    f.set("AGENTD_ANTHROPIC_KEY", "k");
    let problems = f.problems();
    assert!(
        has(
            &problems,
            "models.primary.fallback[0]: no model named \"backup\" is defined"
        ),
        "{problems:?}"
    );
    assert!(
        has(&problems, "routing.user: no model named \"nowhere\""),
        "{problems:?}"
    );
    assert!(
        has(
            &problems,
            "routing.telegarm: unknown message source (did you mean \"telegram\"?)"
        ),
        "{problems:?}"
    );
    assert_eq!(problems.len(), 3, "{problems:?}");
}

#[test]
fn relative_paths_resolve_against_config_dir_and_workspace() {
    let mut f = minimal_with_key();
    std::fs::create_dir_all(f.dir.path().join("workspace")).unwrap();
    f.write(
        "config/agentd.toml",
        &format!(
            "{MINIMAL}[agent.skills]\ndir = \"my-skills\"\n[paths]\nstate_dir = \"state\"\n[fifo]\npath = \"~/pipe\"\n[tools]\nscratch_dir = \"./scratch/../../tmp-work\"\n[tools.filesystem]\nallowed_paths = [\"data\", \"/srv\"]\n"
        ),
    );
    let root = f.root();
    let c = f.ok();
    assert_eq!(c.agent.workspace, root.join("workspace"));
    assert_eq!(c.agent.skills.dir, root.join("workspace/my-skills"));
    assert_eq!(c.paths.state_dir, root.join("config/state"));
    assert_eq!(c.fifo.path, root.join("home/pipe"));
    assert_eq!(
        c.tools.allowed_paths,
        [root.join("config/data"), PathBuf::from("/srv")]
    );
    // Relative to the config directory, lexical; an explicit allowed_paths is kept as given.
    assert_eq!(c.tools.scratch_dir, root.join("tmp-work"));

    // AGENTD_STATE_DIR wins over [paths] state_dir.
    f.set("AGENTD_STATE_DIR", "/var/lib/agentd-test");
    let c = f.ok();
    assert_eq!(c.paths.state_dir, Path::new("/var/lib/agentd-test"));
}

#[test]
fn telegram_mcp_and_schedules_are_typed_and_validated() {
    let mut f = minimal_with_key();
    f.write(
        "config/agentd.toml",
        &format!(
            r#"{MINIMAL}
[channel.telegram]
enabled = true
allow_from = [12345, 678]
contacts = {{ Alice = 12345 }}
[mcp.servers.time]
command = "uvx"
args = ["mcp-server-time"]
env = {{ TZ = "UTC", TOKEN = "${{MCP_TOKEN}}" }}
tools = ["get_current_time"]
network = false
[mcp.servers.local]
command = "local-server"
[mcp.servers.web]
url = "https://mcp.example.org/mcp"
headers = {{ Authorization = "Bearer x" }}
timeout_seconds = 5
[[schedule]]
name = "heartbeat"
every = "30m"
system = "Execute HEARTBEAT.md"
[[schedule]]
name = "greet"
cron = "0 9 * * 1-5"
message = "Good morning"
to = "Alice"
[[schedule]]
name = "index"
cron = "15 3 * * *"
job = "index"
"#
        ),
    );
    f.set("AGENTD_TELEGRAM_TOKEN", "123:abc");
    f.set("MCP_TOKEN", "mcp-secret");
    let c = f.ok();
    assert_eq!(c.telegram.allow_from, [12345, 678]);
    assert_eq!(c.telegram.contacts["Alice"], 12345);
    assert!(c.telegram.token.is_some());
    let time = &c.mcp_servers["time"];
    match &time.transport {
        McpTransport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            assert_eq!(command, "uvx");
            assert_eq!(args, &["mcp-server-time"]);
            assert_eq!(env["TOKEN"].expose_secret(), "mcp-secret");
            assert!(cwd.is_none());
        }
        other => panic!("expected stdio, got {other:?}"),
    }
    assert_eq!(
        time.tools.as_deref(),
        Some(&["get_current_time".to_string()][..])
    );
    assert_eq!(time.timeout, Duration::from_secs(60));
    assert!(!time.network);
    assert!(c.mcp_servers["local"].network, "network defaults to on");
    assert!(matches!(
        c.mcp_servers["web"].transport,
        McpTransport::Http { .. }
    ));
    assert_eq!(c.mcp_servers["web"].timeout, Duration::from_secs(5));
    assert_eq!(c.schedules.len(), 3);
    assert_eq!(
        c.schedules[0].when,
        ScheduleWhen::Every(Duration::from_secs(1800))
    );
    assert_eq!(
        c.schedules[1].action,
        ScheduleAction::Message {
            text: "Good morning".into(),
            to: "Alice".into()
        }
    );
    assert_eq!(
        c.schedules[2].action,
        ScheduleAction::Job(ScheduleJob::Index)
    );

    f.env.remove("AGENTD_TELEGRAM_TOKEN");
    f.write(
        "config/agentd.toml",
        &format!(
            r#"{MINIMAL}
[channel.telegram]
enabled = true
allow_from = ["me"]
[mcp.servers."bad name"]
command = "x"
[mcp.servers.both]
command = "x"
url = "https://x"
[mcp.servers.neither]
enabled = true
[mcp.servers.remote]
url = "https://x"
network = false
[mcp.servers.netstr]
command = "x"
network = "no"
[[schedule]]
name = "a"
cron = "0 9 * *"
system = "x"
[[schedule]]
name = "a"
every = "soon"
system = "x"
job = "index"
[[schedule]]
name = "c"
every = "1h"
message = "hi"
to = "Bob"
"#
        ),
    );
    let problems = f.problems();
    for expected in [
        "channel.telegram.token_env: environment variable AGENTD_TELEGRAM_TOKEN is not set",
        "channel.telegram.allow_from[0]: expected an integer, got \"me\"",
        "mcp.servers.\"bad name\": invalid server name",
        "mcp.servers.both.url: server \"both\" has both command and url",
        "mcp.servers.neither.command: server \"neither\" needs command",
        "mcp.servers.remote.network: only valid with command",
        "mcp.servers.netstr.network: expected",
        "schedule[0].cron: expected 5 fields",
        "schedule[1].name: duplicate schedule name \"a\"",
        "schedule[1].every: expected an interval",
        "schedule[1].system: give exactly one of",
        "schedule[2].to: unknown contact \"Bob\"",
    ] {
        assert!(
            has(&problems, expected),
            "missing {expected:?} in {problems:?}"
        );
    }
}

/// `sandbox` and `unix_sockets` of a stdio server: defaults, values (`${VAR}`-expanded), and
/// the problems where they do not fit.
#[test]
fn mcp_sandbox_keys_are_typed_and_validated() {
    let mut f = minimal_with_key();
    f.write(
        "config/agentd.toml",
        &format!(
            r#"{MINIMAL}
[mcp.servers.plain]
command = "srv"
[mcp.servers.agent]
command = "srv"
unix_sockets = ["${{SOCK_DIR}}/S.gpg-agent", "/run/docker.sock"]
[mcp.servers.bare]
command = "srv"
sandbox = false
"#
        ),
    );
    f.set("SOCK_DIR", "/run/user/1000/gnupg");
    let c = f.ok();
    let plain = &c.mcp_servers["plain"];
    assert!(plain.sandbox && plain.unix_sockets.is_empty());
    assert_eq!(
        c.mcp_servers["agent"].unix_sockets,
        [
            PathBuf::from("/run/user/1000/gnupg/S.gpg-agent"),
            PathBuf::from("/run/docker.sock")
        ]
    );
    assert!(!c.mcp_servers["bare"].sandbox);

    let many: Vec<String> = (0..33).map(|i| format!("\"/s{i}\"")).collect();
    f.write(
        "config/agentd.toml",
        &format!(
            r#"{MINIMAL}
[mcp.servers.rel]
command = "srv"
unix_sockets = ["/ok.sock", "run/x.sock", "/a/../b.sock"]
[mcp.servers.many]
command = "srv"
unix_sockets = [{}]
[mcp.servers.both]
command = "srv"
sandbox = false
unix_sockets = ["/ok.sock"]
network = false
[mcp.servers.web]
url = "https://mcp.example.org/mcp"
sandbox = true
unix_sockets = []
[mcp.servers.typo]
command = "srv"
sandbox = "no"
"#,
            many.join(", ")
        ),
    );
    let problems = f.problems();
    for expected in [
        "mcp.servers.rel.unix_sockets[1]: \"run/x.sock\" must be an absolute path without `..`",
        "mcp.servers.rel.unix_sockets[2]: \"/a/../b.sock\" must be an absolute path",
        "mcp.servers.many.unix_sockets: 33 paths, over the limit of 32",
        "mcp.servers.both.unix_sockets: has no effect with sandbox = false",
        "mcp.servers.both.network: false has no effect with sandbox = false",
        "mcp.servers.web.sandbox: only valid with command",
        "mcp.servers.web.unix_sockets: only valid with command",
        "mcp.servers.typo.sandbox: expected true or false",
    ] {
        assert!(
            has(&problems, expected),
            "missing {expected:?} in {problems:?}"
        );
    }
}

#[test]
fn schedule_precheck_is_typed_and_validated() {
    let f = minimal_with_key();
    f.write(
        "config/agentd.toml",
        &format!(
            r#"{MINIMAL}
[[schedule]]
name = "heartbeat"
every = "30m"
system = "Execute HEARTBEAT.md"
precheck = "test -s inbox/todo.txt"
[[schedule]]
name = "slow"
every = "1h"
system = "x"
precheck = "true"
precheck_timeout = "2m"
[[schedule]]
name = "plain"
every = "1h"
system = "x"
"#
        ),
    );
    let c = f.ok();
    assert_eq!(
        c.schedules[0].precheck,
        Some(Precheck {
            command: "test -s inbox/todo.txt".into(),
            timeout: Precheck::DEFAULT_TIMEOUT
        })
    );
    assert_eq!(
        c.schedules[1].precheck.as_ref().map(|p| p.timeout),
        Some(Duration::from_secs(120))
    );
    assert_eq!(c.schedules[2].precheck, None);
    let rendered = crate::config::render_effective(&c);
    assert!(
        rendered.contains("precheck = \"test -s inbox/todo.txt\""),
        "{rendered}"
    );

    f.write(
        "config/agentd.toml",
        &format!(
            r#"{MINIMAL}
[[schedule]]
name = "a"
every = "1h"
job = "index"
precheck = "true"
[[schedule]]
name = "b"
every = "1h"
system = "x"
precheck = "  "
[[schedule]]
name = "c"
every = "1h"
system = "x"
precheck = "true"
precheck_timeout = "1h"
[[schedule]]
name = "d"
every = "1h"
system = "x"
precheck_timeout = "10s"
"#
        ),
    );
    let problems = f.problems();
    for expected in [
        "schedule[0].precheck: only valid with system",
        "schedule[1].precheck: must not be empty",
        "schedule[2].precheck_timeout: \"1h\" is too long: at most 300s",
        "schedule[3].precheck_timeout: only valid with precheck",
    ] {
        assert!(
            has(&problems, expected),
            "missing {expected:?} in {problems:?}"
        );
    }
}

#[test]
fn unknown_tool_names_are_rejected() {
    let f = minimal_with_key();
    f.write(
        "config/agentd.toml",
        &format!("{MINIMAL}[tools]\nenabled = [\"read\", \"exce\"]\nexec_timeout_seconds = 900\n"),
    );
    let problems = f.problems();
    assert_eq!(
        problems,
        [
            "tools.enabled[1]: unknown tool \"exce\" (did you mean \"exec\"?)",
            "tools.exec_timeout_seconds: must not exceed exec_max_timeout_seconds (600)",
        ]
    );
}

/// SPEC §16.8: scratch space inside the state or config directory would be unusable (the tools
/// never write there).
#[test]
fn retention_ages_take_units_and_zero_means_never() {
    let f = minimal_with_key();
    f.write(
        "config/agentd.toml",
        &format!(
            "{MINIMAL}[retention]\ninbox_max_age = \"12h\"\nidle_session_after = \"2s\"\narchive_max_age = \"0\"\n"
        ),
    );
    let r = f.ok().retention;
    assert_eq!(r.inbox_max_age, Some(Duration::from_secs(12 * 3600)));
    assert_eq!(r.idle_session_after, Some(Duration::from_secs(2)));
    assert_eq!(r.archive_max_age, None);

    f.write(
        "config/agentd.toml",
        &format!("{MINIMAL}[retention]\ninbox_max_age = 0\narchive_max_age = \"90d\"\n"),
    );
    let r = f.ok().retention;
    assert_eq!(r.inbox_max_age, None);
    assert_eq!(r.archive_max_age, Some(Duration::from_secs(90 * 86_400)));
}

#[test]
fn bad_retention_ages_name_the_key_the_value_and_the_fix() {
    let f = minimal_with_key();
    f.write(
        "config/agentd.toml",
        &format!(
            "{MINIMAL}[retention]\ninbox_max_age = \"30 days\"\nidle_session_after = 5\narchive_max_age = \"-1d\"\nkeep = 1\n"
        ),
    );
    let problems = f.problems();
    assert_eq!(problems.len(), 4, "{problems:?}");
    assert!(
        has(
            &problems,
            "retention.inbox_max_age: expected an age such as \"30d\""
        ) && has(&problems, "got \"30 days\""),
        "{problems:?}"
    );
    assert!(
        has(&problems, "retention.idle_session_after: expected a string"),
        "{problems:?}"
    );
    assert!(
        has(&problems, "retention.archive_max_age: ")
            && has(&problems, "\"0\" for never; got \"-1d\""),
        "{problems:?}"
    );
    assert!(has(&problems, "retention.keep"), "{problems:?}");
}

#[test]
fn scratch_dir_inside_the_state_or_config_directory_is_refused() {
    let f = minimal_with_key();
    f.write(
        "config/agentd.toml",
        &format!("{MINIMAL}[paths]\nstate_dir = \"state\"\n[tools]\nscratch_dir = \"state/tmp\"\n"),
    );
    let problems = f.problems();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems
            .iter()
            .all(|p| p.starts_with("tools.scratch_dir: ")),
        "{problems:?}"
    );
    assert!(
        problems[0].contains("inside the state directory"),
        "{problems:?}"
    );
    assert!(
        problems[1].contains("inside the config directory"),
        "{problems:?}"
    );
}

#[test]
fn missing_required_keys_name_the_fix() {
    let f = Fixture::new("[providers]\ndir = \"../providers.d\"\n");
    f.provider("anthropic", ANTHROPIC);
    let problems = f.problems();
    assert_eq!(
        problems,
        [
            "agent.name: required; add name = \"agentd\" to [agent]",
            "agent.workspace: required; add workspace = \"../workspace\" to [agent]",
        ]
    );
}

#[test]
fn a_config_without_primary_is_a_problem() {
    let f = Fixture::new(&MINIMAL.replace("[providers]", "[providers]\nload = []"));
    assert!(has(
        &f.problems(),
        "models: no model named \"primary\" is defined"
    ));
}

#[test]
fn missing_config_file_is_an_io_error() {
    let err = load_with_env(Path::new("/nonexistent/agentd.toml"), BTreeMap::new()).unwrap_err();
    assert!(matches!(err, ConfigError::Io { .. }));
    assert!(err.to_string().contains("/nonexistent/agentd.toml"));
}

#[test]
fn render_effective_never_shows_secrets() {
    let mut f = minimal_with_key();
    f.write(
        "config/agentd.toml",
        &format!(
            "{MINIMAL}[http]\ncallback_url = \"https://h/x\"\ncallback_token_env = \"CB\"\n[mcp.servers.s]\nurl = \"https://m\"\nheaders = {{ Authorization = \"Bearer ${{CB}}\" }}\n"
        ),
    );
    f.set("AGENTD_HTTP_TOKEN", "sk-test-SECRET-http");
    f.set("AGENTD_TELEGRAM_TOKEN", "sk-test-SECRET-tg");
    f.set("AGENTD_BRAVE_KEY", "sk-test-SECRET-brave");
    f.set("CB", "sk-test-SECRET-cb");
    let c = f.ok();
    let text = render_effective(&c);
    assert!(!text.contains("sk-test-SECRET"), "{text}");
    assert!(text.contains("[redacted]"));
    assert!(text.contains("[agent]") && text.contains("[models]"));
    assert!(text.contains("claude-sonnet-4-5"));
    assert!(text.contains(ANTHROPIC_BASE_URL));
    // Debug output of the whole config is also free of secrets.
    assert!(!format!("{c:?}").contains("sk-test-SECRET"));

    // Skipped models are listed with their reason; unset secrets say so.
    f.env.clear();
    f.set("HOME", &f.root().join("home").display().to_string());
    f.write("config/agentd.toml", MINIMAL);
    let text = render_effective(&f.ok());
    assert!(text.contains("# [models.primary]\n"), "{text}");
    assert!(text.contains("\n# skipped = \""), "{text}");
    assert!(text.contains("AGENTD_ANTHROPIC_KEY is not set"), "{text}");
    assert!(text.contains("[not set]"), "{text}");
}

#[test]
fn rendered_config_is_valid_toml() {
    let f = minimal_with_key();
    let text = render_effective(&f.ok());
    if let Err(e) = text.parse::<toml::Table>() {
        panic!("render_effective output is not TOML: {e}\n{text}");
    }
}

#[test]
fn shipped_config_loads_without_keys() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/agentd.toml");
    let home = tempfile::tempdir().unwrap();
    let env = BTreeMap::from([("HOME".to_string(), home.path().display().to_string())]);
    let c = match load_with_env(&path, env) {
        Ok(c) => c,
        Err(e) => panic!("shipped config/agentd.toml is invalid:\n{e}"),
    };
    assert_eq!(c.agent.name, "agentd");
    assert!(c.fifo.enabled && !c.http.enabled && !c.telegram.enabled);
    assert!(c.agent.workspace.ends_with("workspace"));
    // A developer's config/.env may hold a real key; only a clean checkout must skip primary.
    if !path.with_file_name(".env").exists() {
        assert!(c.models.loaded.is_empty());
        assert!(c.models.skipped.contains_key("primary"));
        assert!(c.models.skipped.contains_key("subagent"));
        assert!(c.models.skipped.contains_key("compaction"));
    }
}

#[test]
fn shipped_provider_files_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[agent]\nname = \"t\"\nworkspace = \"{}\"\n[providers]\ndir = \"{}\"\nload = [\"anthropic\", \"openai\", \"ollama\"]\n",
        dir.path().display(),
        root.join("providers.d").display()
    );
    let path = dir.path().join("agentd.toml");
    std::fs::write(&path, config).unwrap();
    let env = BTreeMap::from([
        ("HOME".to_string(), dir.path().display().to_string()),
        ("AGENTD_OPENAI_KEY".to_string(), "k".to_string()),
    ]);
    let c = match load_with_env(&path, env) {
        Ok(c) => c,
        Err(e) => panic!("shipped providers.d is invalid:\n{e}"),
    };
    // ollama (loaded last) replaces primary; it needs no key.
    let p = c.models.get("primary").unwrap();
    assert_eq!(p.provider, "ollama");
    assert_eq!(p.base_url, "http://127.0.0.1:11434/v1");
    assert!(p.api_key.is_none());
    let e = c.models.get("embeddings").unwrap();
    assert_eq!(
        (e.model.as_str(), e.pricing.input),
        ("text-embedding-3-small", 0.02)
    );
    let sub = c.models.get("subagent").unwrap();
    assert_eq!(sub.model, "gpt-4.1-mini");
    assert!(c.models.skipped.contains_key("compaction"));
}

/// SPEC §20: the shipped Anthropic prices carry the published cache rates: a 5-minute write
/// is 1.25× the input rate, a 1-hour write 2×.
#[test]
fn shipped_anthropic_prices_have_both_cache_write_rates() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("providers.d/anthropic.toml")).unwrap();
    let file: toml::Table = text.parse().unwrap();
    let models = file["models"].as_table().unwrap();
    assert!(!models.is_empty());
    for (name, m) in models {
        let cost = m["cost_per_mtok"].as_table().unwrap();
        let rate = |k: &str| cost[k].as_float().unwrap();
        assert!(
            (rate("cache_write") - 1.25 * rate("input")).abs() < 1e-9,
            "{name}"
        );
        assert!(
            (rate("cache_write_1h") - 2.0 * rate("input")).abs() < 1e-9,
            "{name}"
        );
    }
}

/// `cache_write_1h` is read, inherited, and defaults to twice the input rate.
#[test]
fn cache_write_1h_is_read_and_defaults_to_twice_input() {
    let f = minimal_with_key();
    f.provider(
        "anthropic",
        "type = \"anthropic\"\napi_key_env = \"AGENTD_ANTHROPIC_KEY\"\n[models.primary]\nmodel = \"m\"\ncost_per_mtok = { input = 3.0, cache_write_1h = 5.5 }\n[models.subagent]\nmodel = \"s\"\ncost_per_mtok = { input = 1.0 }\n",
    );
    let c = f.ok();
    assert_eq!(c.models.get("primary").unwrap().pricing.cache_write_1h, 5.5);
    assert_eq!(
        c.models.get("subagent").unwrap().pricing.cache_write_1h,
        2.0
    );
}

#[test]
fn explicit_helper_models_must_exist_and_full_tier_is_not_redefined() {
    let f = minimal_with_key();
    f.write(
        "config/agentd.toml",
        &format!(
            "{MINIMAL}[behavior.compaction]\nmodel = \"cheap\"\n[tools]\nsubagent_model = \"primary\"\n[agent.context.tiers.full]\nstable = []\n"
        ),
    );
    let problems = f.problems();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(has(
        &problems,
        "agent.context.tiers.full: tier \"full\" uses [agent.context]"
    ));
    assert!(has(
        &problems,
        "behavior.compaction.model: no model named \"cheap\""
    ));
}

#[test]
fn cli_path_wins_in_config_resolution() {
    assert_eq!(
        resolve_config_path(Some(Path::new("/etc/agentd.toml"))),
        PathBuf::from("/etc/agentd.toml")
    );
    if std::env::var_os("AGENTD_CONFIG").is_none() {
        assert_eq!(
            resolve_config_path(None),
            PathBuf::from("./config/agentd.toml")
        );
    }
}

/// Values of every TOML type, to put under keys the loader may or may not know.
fn any_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("\"x\"".to_string()),
        Just("\"${UNSET_VAR}\"".to_string()),
        Just("\"~/p\"".to_string()),
        any::<i64>().prop_map(|i| i.to_string()),
        Just("-1".to_string()),
        Just("0".to_string()),
        Just("1.5".to_string()),
        Just("true".to_string()),
        Just("[]".to_string()),
        Just("[1, \"a\"]".to_string()),
        Just("{ a = 1 }".to_string()),
        Just("1979-05-27".to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever is put under whatever key, loading never panics, and an invalid config always
    /// carries at least one problem naming a key or the file.
    #[test]
    fn loading_arbitrary_keys_never_panics(
        section in prop::sample::select(vec![
            "agent", "agent.context", "agent.skills", "providers", "routing", "channel.telegram",
            "fifo", "http", "behavior", "behavior.compaction", "budget", "tools",
            "tools.filesystem", "tools.web_fetch", "memory", "memory.indexer", "paths",
            "logging", "mcp.servers.s", "models.primary", "agent.context.tiers.t",
        ]),
        key in prop::sample::select(vec![
            "enabled", "name", "port", "path", "model", "type", "dir", "load", "stable",
            "threshold_tokens", "allowed_paths", "max_bytes", "state_dir", "level", "command",
            "url", "telegram", "fallback", "thinking_budget", "cost_per_mtok", "zzz",
        ]),
        value in any_value(),
    ) {
        let f = minimal_with_key();
        let mut table: toml::Table = MINIMAL.parse().unwrap();
        let v = format!("v = {value}").parse::<toml::Table>().unwrap().remove("v").unwrap();
        let mut t = &mut table;
        for part in section.split('.') {
            let entry = t
                .entry(part.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            t = entry.as_table_mut().unwrap();
        }
        t.insert(key.to_string(), v);
        f.write("config/agentd.toml", &toml::to_string(&table).unwrap());
        match f.load() {
            Ok(_) => {}
            Err(ConfigError::Invalid { problems, .. }) => {
                prop_assert!(!problems.is_empty());
                prop_assert!(problems.iter().all(|p| !p.message.is_empty()));
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }
}

#[test]
fn default_state_dir_without_home_is_a_problem() {
    let mut f = minimal_with_key();
    f.env.remove("HOME");
    assert_eq!(
        f.problems(),
        [
            "paths.state_dir: the default ~/.agentd needs HOME, which is not set; set state_dir or AGENTD_STATE_DIR"
        ]
    );
    f.set("AGENTD_STATE_DIR", "/srv/agentd-state");
    assert_eq!(f.ok().paths.state_dir, Path::new("/srv/agentd-state"));
}

#[test]
fn thinking_values_follow_the_api_ranges() {
    let f = minimal_with_key();
    f.provider(
        "anthropic",
        "type = \"anthropic\"\napi_key_env = \"AGENTD_ANTHROPIC_KEY\"\n[models.primary]\nmodel = \"m\"\nmax_tokens = 8192\nthinking = \"budgeted\"\nthinking_budget = 512\nthinking_effort = \"extreme\"\n",
    );
    let problems = f.problems();
    assert!(
        has(&problems, "thinking_budget: must be at least 1024"),
        "{problems:?}"
    );
    assert!(
        has(&problems, "thinking_effort: expected one of"),
        "{problems:?}"
    );
}

/// One text edit of a config file, the way hand-edited files go wrong.
#[derive(Debug, Clone)]
enum TextEdit {
    /// Delete line n.
    DeleteLine(usize),
    /// Repeat line n (a duplicate key or table).
    DuplicateLine(usize),
    /// Replace what follows `=` on line n.
    Revalue(usize, String),
    /// Cut the file at char n (a half-written file).
    Truncate(usize),
    /// Insert text at char n.
    Insert(usize, String),
}

fn text_edit() -> impl Strategy<Value = TextEdit> {
    prop_oneof![
        any::<usize>().prop_map(TextEdit::DeleteLine),
        any::<usize>().prop_map(TextEdit::DuplicateLine),
        (any::<usize>(), prop_oneof![any_value(), "\\PC{0,12}"])
            .prop_map(|(n, v)| TextEdit::Revalue(n, v)),
        any::<usize>().prop_map(TextEdit::Truncate),
        (any::<usize>(), "\\PC{0,16}").prop_map(|(n, s)| TextEdit::Insert(n, s)),
    ]
}

fn apply_text_edits(text: &str, edits: &[TextEdit]) -> String {
    let mut t = text.to_string();
    for e in edits {
        let mut lines: Vec<String> = t.lines().map(str::to_string).collect();
        let n_lines = lines.len().max(1);
        let chars = t.chars().count() + 1;
        let at = |n: usize| t.char_indices().nth(n % chars).map_or(t.len(), |(i, _)| i);
        t = match e {
            TextEdit::DeleteLine(n) if !lines.is_empty() => {
                lines.remove(n % n_lines);
                lines.join("\n")
            }
            TextEdit::DuplicateLine(n) if !lines.is_empty() => {
                let l = lines[n % n_lines].clone();
                lines.insert(n % n_lines, l);
                lines.join("\n")
            }
            TextEdit::Revalue(n, v) if !lines.is_empty() => {
                let l = &mut lines[n % n_lines];
                if let Some((k, _)) = l.split_once('=') {
                    *l = format!("{k}= {v}");
                }
                lines.join("\n")
            }
            TextEdit::Truncate(n) => t[..at(*n)].to_string(),
            TextEdit::Insert(n, s) => {
                let i = at(*n);
                format!("{}{s}{}", &t[..i], &t[i..])
            }
            _ => t.clone(),
        };
    }
    t
}

/// SPEC §6: one model call may take 900 s in all (long outputs, large thinking budgets). The
/// shipped config's commented line shows the same default.
#[test]
fn call_deadline_defaults_to_900_seconds_in_the_code_and_the_shipped_config() {
    assert_eq!(
        minimal_with_key().ok().behavior.call_deadline,
        Duration::from_secs(900)
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shipped = std::fs::read_to_string(root.join("config/agentd.toml")).unwrap();
    let line = shipped
        .lines()
        .find(|l| {
            l.trim_start_matches(['#', ' '])
                .starts_with("call_deadline_seconds")
        })
        .expect("config/agentd.toml documents call_deadline_seconds");
    assert!(line.contains("= 900 "), "{line}");
}

/// The shipped config and provider files in a checkout-like fixture (workspace included).
pub(crate) fn shipped_fixture() -> Fixture {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let f = Fixture::new(&std::fs::read_to_string(root.join("config/agentd.toml")).unwrap());
    std::fs::create_dir_all(f.dir.path().join("workspace")).unwrap();
    for name in ["anthropic", "openai", "ollama"] {
        f.provider(
            name,
            &std::fs::read_to_string(root.join(format!("providers.d/{name}.toml"))).unwrap(),
        );
    }
    f
}

/// Telegram user ids written anywhere in `text`.
fn numbers_in(text: &str) -> Vec<i64> {
    text.split(|c: char| !c.is_ascii_digit() && c != '-')
        .filter_map(|s| s.parse().ok())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Hand-edited files go wrong in every way (a line lost or repeated, a value of the wrong
    /// type, a file cut short, stray characters). Loading the shipped config or a provider
    /// file edited like that never panics: it is valid, or every problem is listed with a
    /// message (and, for a TOML syntax error, the file). A config that loads never opens up
    /// more than it says: Telegram admits only ids written in the file (an empty or missing
    /// `allow_from` admits nobody).
    #[test]
    fn edited_shipped_files_load_or_list_their_problems(
        config_edits in proptest::collection::vec(text_edit(), 0..4),
        provider_edits in proptest::collection::vec(text_edit(), 0..3),
        telegram in proptest::option::of(proptest::collection::vec(1i64..1_000_000, 0..3)),
    ) {
        let f = shipped_fixture();
        let mut config = std::fs::read_to_string(f.config_path()).unwrap();
        if let Some(ids) = &telegram {
            config.push_str(&format!("\n[channel.telegram]\nenabled = true\nallow_from = {ids:?}\n"));
        }
        let config = apply_text_edits(&config, &config_edits);
        f.write("config/agentd.toml", &config);
        let anthropic = std::fs::read_to_string(f.dir.path().join("providers.d/anthropic.toml")).unwrap();
        f.provider("anthropic", &apply_text_edits(&anthropic, &provider_edits));
        let mut f = f;
        f.set("AGENTD_TELEGRAM_TOKEN", "1:x");
        match f.load() {
            Ok(c) => {
                let written = numbers_in(&config);
                prop_assert!(
                    c.telegram.allow_from.iter().all(|id| written.contains(id)),
                    "allow_from {:?} holds ids not in the file", c.telegram.allow_from
                );
            }
            Err(ConfigError::Invalid { problems, .. }) => {
                prop_assert!(!problems.is_empty());
                for p in &problems {
                    prop_assert!(!p.message.is_empty(), "{p:?}");
                    prop_assert!(!p.file.as_os_str().is_empty(), "{p:?}");
                }
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    /// Arbitrary bytes as agentd.toml: a list of problems (or, for bytes that are not UTF-8,
    /// the read error saying so), never a panic or a loaded config without an `[agent]` name.
    #[test]
    fn arbitrary_config_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let f = Fixture::new("");
        std::fs::write(f.config_path(), &bytes).unwrap();
        match f.load() {
            Ok(c) => prop_assert!(!c.agent.name.is_empty()),
            Err(ConfigError::Invalid { problems, .. }) => prop_assert!(!problems.is_empty()),
            Err(e @ ConfigError::Io { .. }) => {
                prop_assert!(std::str::from_utf8(&bytes).is_err(), "{e}");
                prop_assert!(e.to_string().contains("UTF-8"), "{e}");
            }
        }
    }
}

#[test]
fn indexer_globs_must_stay_in_the_workspace_and_parse() {
    let mut f = Fixture::new(&format!(
        "{MINIMAL}\n[memory.indexer]\ninclude = [\"memory/**/*.md\", \"../secrets/*.md\", \"/etc/*.md\", \"notes/[.md\", \" \"]\n"
    ));
    f.provider("anthropic", ANTHROPIC);
    f.set("AGENTD_ANTHROPIC_KEY", "sk-test-SECRET");
    let problems = f.problems();
    for expected in [
        "memory.indexer.include: \"../secrets/*.md\": must not leave the workspace",
        "memory.indexer.include: \"/etc/*.md\": must be relative to the workspace",
        "memory.indexer.include: \"notes/[.md\": is not a valid glob",
        "memory.indexer.include: \" \": an empty pattern matches nothing",
    ] {
        assert!(
            has(&problems, expected),
            "missing {expected:?} in {problems:#?}"
        );
    }
    assert!(!has(&problems, "memory/**/*.md"), "{problems:#?}");
}

/// A reload swaps in exactly what `diff::applies_live` calls live: the merged config differs
/// from the running one only in live keys, and from the new file only in restart keys.
#[test]
fn live_parts_and_the_diff_classification_agree() {
    let f = minimal_with_key();
    let old = f.ok();
    f.write(
        "config/agentd.toml",
        &format!(
            "{MINIMAL}
[channel.telegram]
allow_from = [5]
contacts = {{ Ann = 5 }}
[budget]
daily_usd = 3.0
[approvals]
require = [\"exec\"]
timeout_seconds = 60
[http]
port = 9999
[behavior]
debounce_ms = 7
[tools]
max_parallel_calls = 3
[mcp.servers.t]
command = \"true\"
[[schedule]]
name = \"n\"
every = \"5m\"
system = \"hi\"
"
        ),
    );
    let new = f.ok();
    let merged = old.with_live_parts_of(&new);
    let (r_old, r_new, r_merged) = (
        render_effective(&old),
        render_effective(&new),
        render_effective(&merged),
    );
    let applied = diff::diff_rendered(&r_old, &r_merged);
    let left = diff::diff_rendered(&r_merged, &r_new);
    assert!(!applied.is_empty() && !left.is_empty());
    for c in &applied {
        assert!(c.applies_live(), "swapped in but not live: {}", c.key);
    }
    for c in &left {
        assert!(!c.applies_live(), "live but not swapped in: {}", c.key);
    }
    let keys: Vec<&str> = applied.iter().map(|c| c.key.as_str()).collect();
    for k in [
        "budget.daily_usd",
        "approvals.require",
        "approvals.timeout_seconds",
        "channel.telegram.allow_from",
        "channel.telegram.contacts",
        "mcp.servers.t.command",
        "schedule.n",
    ] {
        assert!(keys.contains(&k), "{k} not applied: {keys:?}");
    }
}

#[test]
fn approvals_defaults_and_problems() {
    let c = minimal_with_key().ok();
    assert_eq!(c.approvals, ApprovalsConfig::default());
    assert_eq!(c.approvals.timeout, Duration::from_secs(300));
    assert!(c.approvals.require.is_empty() && c.approvals.telegram_chat.is_none());

    let mut f = Fixture::new(&format!(
        "{MINIMAL}\n[approvals]\nrequire = [\"exec\", \"github__*\"]\nover_usd = 0.5\ntimeout_seconds = 30\ntelegram_chat = -100123\nsystem_allow = [\"web_*\"]\napprovers = [1001, 2002]\n"
    ));
    f.provider("anthropic", ANTHROPIC);
    f.set("AGENTD_ANTHROPIC_KEY", "k");
    let c = f.ok();
    assert!(c.approvals.is_approver(2002) && !c.approvals.is_approver(3003));
    assert!(render_effective(&c).contains("approvers = [1001, 2002]"));
    assert!(c.approvals.requires("github__merge_pr") && !c.approvals.requires("read"));
    assert!(c.approvals.system_allows("web_fetch"));
    assert_eq!(c.approvals.timeout, Duration::from_secs(30));
    assert_eq!(c.approvals.telegram_chat, Some(-100123));
    assert!(render_effective(&c).contains("require = [\"exec\", \"github__*\"]"));

    let mut f = Fixture::new(&format!(
        "{MINIMAL}\n[approvals]\nrequire = [\"ex ec\"]\nover_usd = -1\ntimeout_seconds = 0\ntelegram_chat = 0\nsystem_alow = []\napprovers = [5, -100123, 0]\n"
    ));
    f.provider("anthropic", ANTHROPIC);
    f.set("AGENTD_ANTHROPIC_KEY", "k");
    let p = f.problems();
    assert!(has(&p, "approvals.require[0]: \"ex ec\""), "{p:#?}");
    assert!(has(&p, "approvals.over_usd"), "{p:#?}");
    assert!(has(&p, "approvals.timeout_seconds"), "{p:#?}");
    assert!(has(&p, "approvals.telegram_chat"), "{p:#?}");
    assert!(has(&p, "did you mean \"system_allow\""), "{p:#?}");
    assert!(
        has(
            &p,
            "approvals.approvers[1]: -100123 is not a Telegram user id"
        ),
        "{p:#?}"
    );
    assert!(has(&p, "approvals.approvers[2]: 0 is not"), "{p:#?}");
    assert!(!has(&p, "approvals.approvers[0]"), "{p:#?}");
}

/// `[voice]` (SPEC §19): defaults, the audio prices of a model, and every validation message
/// naming the key, the value and the fix.
#[test]
fn voice_section_defaults_prices_and_problems() {
    let f = minimal_with_key();
    let v = f.ok().voice;
    assert_eq!(v, VoiceConfig::default());
    assert_eq!(
        (v.reply, v.echo_transcript, v.voice.as_str()),
        (VoiceReply::Off, true, "alloy")
    );

    let mut f = Fixture::new(&format!(
        "{MINIMAL}load = [\"anthropic\", \"audio\"]\n[voice]\nstt_model = \"whisper\"\ntts_model = \"speech\"\nreply = \"mirror\"\necho_transcript = false\nvoice = \"nova\"\nmax_audio_seconds = 120\n"
    ));
    f.provider("anthropic", ANTHROPIC);
    f.set("AGENTD_ANTHROPIC_KEY", "k");
    f.provider(
        "audio",
        "type = \"openai\"\nbase_url = \"http://127.0.0.1:8080/v1\"\n[models.whisper]\nmodel = \"whisper-1\"\ncost_per_minute = 0.006\n[models.speech]\nmodel = \"tts-1\"\ncost_per_1k_chars = 0.015\n",
    );
    let c = f.ok();
    assert_eq!(c.voice.stt_model.as_deref(), Some("whisper"));
    assert_eq!(c.voice.reply, VoiceReply::Mirror);
    assert!(!c.voice.echo_transcript);
    assert_eq!(
        (c.voice.voice.as_str(), c.voice.max_audio_seconds),
        ("nova", 120)
    );
    assert_eq!(c.models.get("whisper").unwrap().pricing.per_minute, 0.006);
    assert_eq!(c.models.get("speech").unwrap().pricing.per_1k_chars, 0.015);
    let shown = render_effective(&c);
    assert!(
        shown.contains("[voice]\nstt_model = \"whisper\""),
        "{shown}"
    );
    assert!(shown.contains("cost_per_minute = 0.006"), "{shown}");

    let mut f = Fixture::new(&format!(
        "{MINIMAL}[voice]\nstt_model = \"whispr\"\nreply = \"always\"\nmax_audio_bytes = 1000000000\nmax_tts_chars = 0\nrepy = \"off\"\n"
    ));
    f.provider("anthropic", ANTHROPIC);
    f.set("AGENTD_ANTHROPIC_KEY", "k");
    let p = f.problems();
    assert!(
        has(
            &p,
            "voice.stt_model: no model named \"whispr\" is defined; define [models.whispr]"
        ),
        "{p:?}"
    );
    assert!(
        has(
            &p,
            "voice.reply: \"always\" needs tts_model; set [voice] tts_model"
        ),
        "{p:?}"
    );
    assert!(
        has(
            &p,
            "voice.max_audio_bytes: 1000000000 is over the limit of 104857600; lower it"
        ),
        "{p:?}"
    );
    assert!(has(&p, "voice.max_tts_chars"), "{p:?}");
    assert!(has(&p, "voice.repy"), "{p:?}");
    let mut f = Fixture::new(&format!("{MINIMAL}[voice]\nreply = \"loud\"\n"));
    f.provider("anthropic", ANTHROPIC);
    f.set("AGENTD_ANTHROPIC_KEY", "k");
    let p = f.problems();
    assert!(
        has(
            &p,
            "voice.reply: expected one of \"off\", \"mirror\", \"always\", got \"loud\""
        ),
        "{p:?}"
    );
}

/// An ElevenLabs provider file with the model `eleven` (key `EL_KEY`).
const ELEVENLABS: &str = "type = \"elevenlabs\"\napi_key_env = \"EL_KEY\"\n[models.eleven]\nmodel = \"eleven_multilingual_v2\"\n";

/// A config loading Anthropic and ElevenLabs (both keys set) with `voice` as its `[voice]` table.
fn with_elevenlabs(voice: &str) -> Fixture {
    let mut f = Fixture::new(&format!(
        "{MINIMAL}load = [\"anthropic\", \"eleven\"]\n[voice]\n{voice}"
    ));
    f.provider("anthropic", ANTHROPIC);
    f.provider("eleven", ELEVENLABS);
    f.set("AGENTD_ANTHROPIC_KEY", "k");
    f.set("EL_KEY", "e");
    f
}

/// SPEC §19: "alloy" is the default voice only for OpenAI-compatible speech; an ElevenLabs
/// `tts_model` without a voice id is a problem naming the key, the model and the fix.
#[test]
fn an_elevenlabs_tts_model_needs_a_voice_id() {
    let f = with_elevenlabs("tts_model = \"eleven\"\n");
    let p = f.problems();
    assert!(
        has(
            &p,
            "voice.voice: not set, and tts_model \"eleven\" is an ElevenLabs model, which needs a voice id; set [voice] voice = \"<voice id>\""
        ),
        "{p:?}"
    );
    let f = with_elevenlabs("tts_model = \"eleven\"\nvoice = \"JBFqnCBsd6RMkjVDRZzb\"\n");
    assert_eq!(f.ok().voice.voice, "JBFqnCBsd6RMkjVDRZzb");
}

/// ElevenLabs (SPEC §19) is a speech-only provider type: a `tts_model`, never `primary` or an
/// `stt_model`.
#[test]
fn elevenlabs_is_for_speech_only() {
    let f = with_elevenlabs("tts_model = \"eleven\"\nvoice = \"JBFqnCBsd6RMkjVDRZzb\"\n");
    let c = f.ok();
    let spec = c.models.get("eleven").unwrap();
    assert_eq!(spec.kind, ProviderKind::ElevenLabs);
    assert_eq!(spec.base_url, "https://api.elevenlabs.io/v1");
    assert!(render_effective(&c).contains("type = \"elevenlabs\""));

    let f = with_elevenlabs("stt_model = \"eleven\"\n");
    let p = f.problems();
    assert!(
        has(&p, "voice.stt_model: \"eleven\" is an ElevenLabs model"),
        "{p:?}"
    );

    let mut f = Fixture::new(&format!("{MINIMAL}load = [\"eleven\"]\n"));
    f.provider(
        "eleven",
        &ELEVENLABS.replace("[models.eleven]", "[models.primary]"),
    );
    f.set("EL_KEY", "e");
    let p = f.problems();
    assert!(
        has(
            &p,
            "models: model \"primary\" has type = \"elevenlabs\", a speech-only provider"
        ),
        "{p:?}"
    );
}

/// Issue 31: a change of `cost_per_mtok.cache_write_1h` in a provider file is seen by
/// `check-config --diff` and by the reload (both compare renders), as a change that needs a
/// restart.
#[test]
fn a_changed_cache_write_1h_shows_in_the_diff() {
    let f = minimal_with_key();
    let model = |rate: &str| {
        format!("{ANTHROPIC}cost_per_mtok = {{ input = 3.0, cache_write_1h = {rate} }}\n")
    };
    f.provider("anthropic", &model("6.0"));
    let old = render_effective(&f.ok());
    f.provider("anthropic", &model("7.5"));
    let new = render_effective(&f.ok());
    let changes = diff::diff_rendered(&old, &new);
    assert!(
        changes
            .iter()
            .any(|c| c.key.starts_with("models.primary") && !c.applies_live()),
        "no restart change for models.primary: {changes:?}"
    );
    let text = diff::describe(&changes);
    assert!(text.contains("cache_write_1h"), "{text}");
    assert!(text.contains("7.5"), "{text}");
}

#[test]
fn cors_origins_take_exact_origins_only() {
    let ok = minimal_with_key();
    ok.write(
        "config/agentd.toml",
        &format!("{MINIMAL}[http]\ncors_origins = [\"http://localhost:3000\", \"https://chat.example.org\"]\n"),
    );
    assert_eq!(
        ok.ok().http.cors_origins,
        ["http://localhost:3000", "https://chat.example.org"]
    );
    for bad in [
        "*",
        "https://chat.example.org/",
        "chat.example.org",
        "https://a b",
        "http://:80",
        "https://",
    ] {
        let f = minimal_with_key();
        f.write(
            "config/agentd.toml",
            &format!("{MINIMAL}[http]\ncors_origins = [\"{bad}\"]\n"),
        );
        let problems = f.problems();
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("http.cors_origins[0]: expected an origin like")),
            "{bad}: {problems:?}"
        );
    }
}
