//! Validated, typed configuration. Everything outside `config/` receives these types:
//! durations are `Duration`, paths are absolute, secrets are `SecretString`.
//! The TOML layout is known only to `config/`: `walker.rs` reads it and the section readers
//! (`sections.rs`, `channels.rs`, `tools.rs`, …) build these types from it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use secrecy::SecretString;

/// The whole validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Absolute path of the agentd.toml that was loaded.
    pub config_path: PathBuf,
    /// Directory of the config file (relative paths resolve against it).
    pub config_dir: PathBuf,
    pub agent: AgentConfig,
    pub providers: ProvidersConfig,
    /// Every model that was defined (providers.d files in load order, then inline `[models.*]`),
    /// loaded or not. See `ModelSet` for which ones can be used.
    pub models: ModelSet,
    /// `[routing]`: source name → model name. `primary` is used for unmapped sources.
    pub routing: BTreeMap<String, String>,
    pub fifo: FifoConfig,
    pub http: HttpConfig,
    pub telegram: TelegramConfig,
    /// `[matrix]` (SPEC §21).
    pub matrix: super::matrix::MatrixConfig,
    pub behavior: BehaviorConfig,
    pub budget: BudgetConfig,
    /// `[approvals]` (SPEC §18.1).
    pub approvals: ApprovalsConfig,
    pub delivery: DeliveryConfig,
    /// `[mcp_server]`: agentd as an MCP server (SPEC §23).
    pub mcp_server: McpServeConfig,
    pub tools: ToolsConfig,
    pub memory: MemoryConfig,
    pub paths: PathsConfig,
    pub logging: LoggingConfig,
    /// `[retention]` (SPEC §16.3).
    pub retention: RetentionConfig,
    /// `[backup]` (SPEC §24).
    pub backup: BackupConfig,
    /// `[mcp.servers.<name>]` by server name (§12).
    pub mcp_servers: BTreeMap<String, McpServerConfig>,
    /// `[[schedule]]` entries in file order (§14).
    pub schedules: Vec<ScheduleEntry>,
    /// `[voice]` (SPEC §19).
    pub voice: VoiceConfig,
    /// `[caching]` (SPEC §20).
    pub caching: CachingConfig,
    /// `[alerts]` (SPEC §20).
    pub alerts: AlertsConfig,
    /// What loaded with a warning (a renamed or retired key, `keys::renames`): logged at start
    /// and printed by `check-config`.
    pub warnings: Vec<super::error::Problem>,
}

/// `[caching]` (SPEC §20).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachingConfig {
    pub ttl: CachingTtl,
}

/// `[caching] ttl`: the TTL of the stable and semi_stable breakpoints of Anthropic models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CachingTtl {
    /// Always 5 minutes (or the model's `cache_ttl`).
    FiveMinutes,
    /// Always 1 hour.
    OneHour,
    /// By the session's cadence: 1 hour when its recent messages arrive more than 5 minutes
    /// but less than an hour apart, else 5 minutes.
    Auto,
}

impl CachingTtl {
    pub fn as_str(self) -> &'static str {
        match self {
            CachingTtl::FiveMinutes => "5m",
            CachingTtl::OneHour => "1h",
            CachingTtl::Auto => "auto",
        }
    }
}

/// `[alerts]` (SPEC §20).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AlertsConfig {
    /// The Telegram chat alert notices go to (one per episode); none: log and monitor only.
    pub telegram_chat: Option<i64>,
}

/// `[voice]` (SPEC §19): speech to text for inbound audio, text to speech for replies and the
/// `tts` tool.
#[derive(Debug, Clone, PartialEq)]
pub struct VoiceConfig {
    /// A model of an OpenAI-compatible provider serving `/audio/transcriptions`; `None`: audio
    /// is not transcribed (the placeholder names the saved file).
    pub stt_model: Option<String>,
    /// A model serving `/audio/speech` (OpenAI-compatible); `None`: no `tts` tool, no spoken
    /// replies.
    pub tts_model: Option<String>,
    pub reply: VoiceReply,
    /// Quote the transcript back in Telegram (default true).
    pub echo_transcript: bool,
    /// The voice the `tts` tool and spoken replies use unless the model names one.
    pub voice: String,
    /// Largest audio file sent for transcription (and largest speech answer accepted).
    pub max_audio_bytes: u64,
    /// Longest audio transcribed, when its duration can be read from the file.
    pub max_audio_seconds: u64,
    /// Most characters synthesised in one request (longer text is refused by the tool, cut
    /// at a sentence for a spoken reply).
    pub max_tts_chars: usize,
}

impl Default for VoiceConfig {
    /// The defaults of the key table.
    fn default() -> Self {
        use super::keys::state as k;
        VoiceConfig {
            stt_model: k::STT_MODEL.default_value(),
            tts_model: k::TTS_MODEL.default_value(),
            reply: k::REPLY.default_value(),
            echo_transcript: k::ECHO_TRANSCRIPT.default_value(),
            voice: k::DEFAULT_OPENAI_VOICE.to_string(),
            max_audio_bytes: k::MAX_AUDIO_BYTES.default_value(),
            max_audio_seconds: k::MAX_AUDIO_SECONDS.default_value(),
            max_tts_chars: k::MAX_TTS_CHARS.default_value(),
        }
    }
}

/// `[voice] reply`: when a reply is also spoken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoiceReply {
    /// Never (the `tts` tool still works).
    Off,
    /// A voice note is answered with a voice note, and the text too.
    Mirror,
    /// Every Telegram reply is also spoken.
    Always,
}

impl VoiceReply {
    pub fn as_str(self) -> &'static str {
        match self {
            VoiceReply::Off => "off",
            VoiceReply::Mirror => "mirror",
            VoiceReply::Always => "always",
        }
    }
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub name: String,
    /// Absolute, canonical when it exists.
    pub workspace: PathBuf,
    pub timezone: crate::zone::Zone,
    /// Why `timezone` is UTC when it was not set and the system's zone could not be read
    /// (logged at start).
    pub timezone_fallback: Option<String>,
    pub context: ContextConfig,
    pub skills: SkillsConfig,
}

#[derive(Debug, Clone)]
pub struct ContextConfig {
    /// Files of tier `full` (from `[agent.context]`).
    pub stable: Vec<String>,
    pub semi_stable: Vec<String>,
    /// Other tiers by name (`[agent.context.tiers.<tier>]`).
    pub tiers: BTreeMap<String, TierFiles>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierFiles {
    pub stable: Vec<String>,
    pub semi_stable: Vec<String>,
}

impl ContextConfig {
    /// File set for a tier: `full` uses `[agent.context]`, known tiers their own lists,
    /// unknown tiers have no files.
    pub fn files_for(&self, tier: &str) -> TierFiles {
        if tier == "full" {
            return TierFiles {
                stable: self.stable.clone(),
                semi_stable: self.semi_stable.clone(),
            };
        }
        self.tiers.get(tier).cloned().unwrap_or_default()
    }
}

#[derive(Debug, Clone)]
pub struct SkillsConfig {
    /// Absolute (resolved against the workspace).
    pub dir: PathBuf,
    pub always_on: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct ProvidersConfig {
    pub load: Vec<String>,
    /// Absolute.
    pub dir: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    Anthropic,
    OpenAi,
    /// ElevenLabs text to speech (SPEC §19): a `[voice] tts_model` only, never a chat model.
    ElevenLabs,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::OpenAi => "openai",
            ProviderKind::ElevenLabs => "elevenlabs",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Pricing {
    /// USD per million tokens.
    pub input: f64,
    pub output: f64,
    pub cache_read: f64,
    /// Cache writes with the 5-minute TTL.
    pub cache_write: f64,
    /// Cache writes with the 1-hour TTL (`cost_per_mtok.cache_write_1h`; default twice
    /// `input`, Anthropic's published rate) (SPEC §20).
    pub cache_write_1h: f64,
    /// USD per minute of audio transcribed (`cost_per_minute`, SPEC §19).
    pub per_minute: f64,
    /// USD per 1000 characters synthesised (`cost_per_1k_chars`, SPEC §19).
    pub per_1k_chars: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheTtl {
    FiveMinutes,
    OneHour,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thinking {
    Off,
    Adaptive,
    Budgeted,
}

/// One model definition, with provider-level keys already inherited.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// Config name (`primary`, `subagent`, ...).
    pub name: String,
    /// The provider file it came from (`anthropic`), or `inline` for `[models.*]` in agentd.toml.
    pub provider: String,
    pub kind: ProviderKind,
    /// API model id.
    pub model: String,
    /// Anthropic: origin (client appends `/v1/messages`); OpenAI: API root (client appends
    /// `/chat/completions`). No trailing slash.
    pub base_url: String,
    pub api_key_env: Option<String>,
    /// `None` when no key is needed (local servers) or when the key is missing (then the
    /// model is in `ModelSet::skipped`).
    pub api_key: Option<SecretString>,
    pub max_tokens: u32,
    pub context_window: u32,
    pub pricing: Pricing,
    /// Anthropic cache breakpoints on (default true for anthropic, false for openai).
    pub cache: bool,
    pub cache_ttl: CacheTtl,
    pub thinking: Thinking,
    pub thinking_budget: u32,
    pub thinking_effort: Option<String>,
    pub supports_vision: bool,
    pub fallback: Vec<String>,
    /// OpenAI only: send the session id as `prompt_cache_key`.
    pub prompt_cache_key: bool,
    /// What the provider's tool-call grammar accepts of JSON Schema (`schema_keywords`,
    /// `schema_max_length`): the tool schemas sent to it are reduced to that; agentd still
    /// checks every call against the full schema.
    pub tool_schema: ToolSchemaDialect,
    /// `tool_calls_in_text`: the model may write tool calls as text (a JSON object with `name`
    /// and `arguments`, `<tool_call>` tags, fenced JSON); they are taken as tool calls.
    pub tool_calls_in_text: bool,
    /// `structured_output`: the provider takes a structured-output format (SPEC §17).
    pub structured_output: bool,
}

/// The JSON Schema a provider accepts in tool definitions. `Default`: all of it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ToolSchemaDialect {
    /// The keywords kept (others are removed at every level); `None` = all.
    pub keywords: Option<Arc<[String]>>,
    /// `minLength`/`maxLength` above this, and patterns repeating more, are removed.
    pub max_length: Option<u64>,
}

impl ToolSchemaDialect {
    /// Whether schemas are sent as they are.
    pub fn is_full(&self) -> bool {
        self.keywords.is_none() && self.max_length.is_none()
    }
}

/// All defined models: the usable ones and the ones skipped with the reason.
#[derive(Debug, Clone, Default)]
pub struct ModelSet {
    pub loaded: BTreeMap<String, Arc<ModelSpec>>,
    /// model name → human-readable reason naming the fix, e.g.
    /// "environment variable AGENTD_ANTHROPIC_KEY is not set (providers.d/anthropic.toml, models.primary); set it in config/.env or the environment".
    pub skipped: BTreeMap<String, String>,
    /// The definitions of the skipped models (`check-config` shows them with the reason).
    pub skipped_specs: BTreeMap<String, Arc<ModelSpec>>,
}

impl ModelSet {
    pub fn get(&self, name: &str) -> Option<&Arc<ModelSpec>> {
        self.loaded.get(name)
    }
}

impl Config {
    /// The loaded models a message can be routed to: not ElevenLabs (speech only), not the
    /// memory's `embeddings` model (`memory::embed::MODEL_NAME`), not `[voice]`'s speech models.
    pub fn chat_models(&self) -> impl Iterator<Item = &Arc<ModelSpec>> {
        let speech = [&self.voice.stt_model, &self.voice.tts_model];
        self.models.loaded.values().filter(move |m| {
            m.kind != ProviderKind::ElevenLabs
                && m.name != "embeddings"
                && !speech.iter().any(|s| s.as_deref() == Some(m.name.as_str()))
        })
    }

    /// What the whole tool list may weigh: a quarter of the smallest chat model's context
    /// window, at 4 bytes a token (the estimate compaction uses), so that no tool list can
    /// leave a model without room for the conversation.
    pub fn tool_budget_bytes(&self) -> usize {
        const SHARE_OF_WINDOW: usize = 4;
        const BYTES_PER_TOKEN: usize = 4;
        self.chat_models()
            .map(|m| m.context_window as usize)
            .min()
            .map_or(usize::MAX, |window| {
                window / SHARE_OF_WINDOW * BYTES_PER_TOKEN
            })
    }
}

#[derive(Debug, Clone)]
pub struct FifoConfig {
    pub enabled: bool,
    /// Absolute (default `state_dir/control.pipe`).
    pub path: PathBuf,
    pub max_line_bytes: usize,
}

#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub enabled: bool,
    pub host: String,
    pub port: u16,
    pub token_env: String,
    pub token: Option<SecretString>,
    pub max_body_bytes: usize,
    /// Most HTTP connections open at once (further capped at a quarter of the fd limit).
    pub max_connections: usize,
    pub rate_limit: u32,
    pub status_rate_limit: u32,
    pub rate_window: Duration,
    pub callback_url: String,
    pub callback_token_env: String,
    pub callback_token: Option<SecretString>,
    pub callback_timeout: Duration,
    /// Browser origins allowed to call the API (CORS); empty = none.
    pub cors_origins: Vec<String>,
    /// Serve the web console at `/console/` (SPEC §22).
    pub console: bool,
    /// Always mark the console's cookie `Secure` (behind a TLS proxy).
    pub console_secure_cookie: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TelegramFormat {
    Html,
    Plain,
}

#[derive(Debug, Clone)]
pub struct TelegramConfig {
    pub enabled: bool,
    pub token_env: String,
    pub token: Option<SecretString>,
    pub api_url: String,
    /// Numeric user ids allowed to talk to the bot. Empty = nobody.
    pub allow_from: Vec<i64>,
    /// Contact name → Telegram user/chat id.
    pub contacts: BTreeMap<String, i64>,
    pub text_chunk_limit: usize,
    pub poll_timeout: Duration,
    pub max_download_bytes: u64,
    pub format: TelegramFormat,
}

#[derive(Debug, Clone)]
pub struct CompactionConfig {
    pub threshold_tokens: u64,
    pub model: String,
    pub prompt: String,
}

#[derive(Debug, Clone)]
pub struct BehaviorConfig {
    pub debounce: Duration,
    pub max_concurrent_sessions: usize,
    /// Messages one session may have waiting (not yet started); more are refused before
    /// intake (HTTP 429). At least 1.
    pub max_queued_per_session: usize,
    /// Messages all sessions together may have waiting. At least 1.
    pub max_queued_total: usize,
    /// Bytes the states of idle sessions may hold together in memory (SPEC §16.3); 0 = none.
    pub idle_session_cache_bytes: usize,
    pub silent_tokens: Vec<String>,
    pub typing_indicators: bool,
    /// Telegram replies that a fallback model answered carry one line saying so (SPEC §18.3).
    pub show_fallback: bool,
    pub error_message: String,
    pub max_turns_per_message: u32,
    /// Inactivity timeout while streaming.
    pub call_timeout: Duration,
    /// Total time one model call may take, from sending the request to the last event,
    /// whatever keep-alives arrive (SPEC §16.9).
    pub call_deadline: Duration,
    /// Most bytes of one model reply (text, thinking and tool-call inputs together).
    pub max_reply_bytes: usize,
    pub api_retries: u32,
    pub api_retry_base_delay: Duration,
    pub message_retries: u32,
    /// Characters.
    pub output_truncation: usize,
    pub compaction: CompactionConfig,
}

/// `[mcp_server]` (SPEC §23).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct McpServeConfig {
    /// `allow_approvals` (default false): the `approvals` and `decide` tools.
    pub allow_approvals: bool,
}

impl Default for McpServeConfig {
    /// The defaults of the key table.
    fn default() -> McpServeConfig {
        McpServeConfig {
            allow_approvals: super::keys::channels::MCP_SERVE_ALLOW_APPROVALS.default_value(),
        }
    }
}

/// `[delivery]` (SPEC §16.1): how long the outbox retries a part that failed retryably.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeliveryConfig {
    /// `retry_minutes` (default 10, at least 1).
    pub retry: Duration,
}

impl Default for DeliveryConfig {
    /// The defaults of the key table.
    fn default() -> DeliveryConfig {
        DeliveryConfig {
            retry: super::keys::behavior::RETRY_MINUTES.default_value(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BudgetConfig {
    /// USD; 0 = off.
    pub per_message_usd: f64,
    pub daily_usd: f64,
    pub monthly_usd: f64,
}

/// `[approvals]` (SPEC §18.1): tool calls that need a person's yes.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalsConfig {
    /// Tool-name globs whose calls need a yes.
    pub require: Vec<String>,
    /// USD; 0 = off. A message that has spent this much asks before its next tool call.
    pub over_usd: f64,
    /// How long a call waits for a decision; then it is denied.
    pub timeout: std::time::Duration,
    /// Where approvals of non-Telegram sessions are offered in Telegram.
    pub telegram_chat: Option<i64>,
    /// Tool-name globs a `system`-source message may call without a yes.
    pub system_allow: Vec<String>,
    /// Telegram user ids who may decide any approval from any chat; anyone else decides only
    /// in the chat the prompt was offered in (and must be in `allow_from`).
    pub approvers: Vec<i64>,
}

impl Default for ApprovalsConfig {
    /// The defaults of the key table.
    fn default() -> ApprovalsConfig {
        use super::keys::behavior as k;
        ApprovalsConfig {
            require: k::APPROVALS_REQUIRE.default_value(),
            over_usd: k::APPROVALS_OVER_USD.default_value(),
            timeout: k::APPROVALS_TIMEOUT.default_value(),
            telegram_chat: k::APPROVALS_TELEGRAM_CHAT.default_value(),
            system_allow: k::APPROVALS_SYSTEM_ALLOW.default_value(),
            approvers: k::APPROVALS_APPROVERS.default_value(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ToolsConfig {
    /// Explicit `[tools] enabled`, or `None` for the default (every tool whose dependencies are
    /// configured).
    pub enabled: Option<Vec<String>>,
    pub exec_timeout: Duration,
    pub exec_max_timeout: Duration,
    pub exec_sandbox: ExecSandbox,
    pub exec_network: bool,
    /// Absolute.
    pub allowed_paths: Vec<PathBuf>,
    /// `[tools] scratch_dir`: absolute, lexical (not canonicalized). Created 0700 at start;
    /// exec's `TMPDIR`; in the default `allowed_paths` (SPEC §16.8).
    pub scratch_dir: PathBuf,
    pub subagent_deny: Vec<String>,
    pub subagent_model: String,
    pub web_search_provider: String,
    pub web_search_base_url: String,
    pub web_fetch_max_bytes: u64,
    pub web_fetch_allow_hosts: Vec<String>,
    pub max_scheduled: u32,
    pub max_delay: Duration,
    /// `max_parallel_calls`: at most this many tool calls of one model answer run at once.
    pub max_parallel_calls: usize,
    /// `writable_context`: workspace-relative files of the system prompt (context files of
    /// any tier, files under the skills directory) that `write`, `edit` and `exec` may change
    /// all the same; every other one is read-only to them. Default `["MEMORY.md"]`.
    pub writable_context: Vec<String>,
    /// Search API key from `AGENTD_BRAVE_KEY`; `None` when unset (then `web_search` is not
    /// enabled by default).
    pub web_search_key: Option<SecretString>,
}

impl ToolsConfig {
    /// Whether the built-in tool `name` may be offered: listed in `[tools] enabled`, or any
    /// tool when that key is absent. (Dependencies, e.g. a search key, are checked by whoever
    /// builds the tool.)
    pub fn is_enabled(&self, name: &str) -> bool {
        self.enabled
            .as_ref()
            .is_none_or(|e| e.iter().any(|n| n == name))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecSandbox {
    Landlock,
    None,
}

#[derive(Debug, Clone)]
pub struct MemoryConfig {
    pub enabled: bool,
    pub search_top_k: u32,
    pub indexer_include: Vec<String>,
    pub chunk_chars: usize,
    pub overlap_chars: usize,
    pub recall_max_tokens: u32,
    pub consolidation_enabled: bool,
    pub consolidation_min_messages: u32,
    pub consolidation_confidence_threshold: f64,
}

#[derive(Debug, Clone)]
pub struct PathsConfig {
    /// Absolute.
    pub state_dir: PathBuf,
}

#[derive(Debug, Clone)]
pub struct LoggingConfig {
    pub level: String,
    pub file: bool,
    pub keep_files: usize,
    /// `max_total_mb`: the log files' total size at most (oldest deleted first, then lines
    /// dropped and counted until the next day).
    pub max_total_bytes: u64,
}

/// `[backup]` (SPEC §24): scheduled backups.
#[derive(Debug, Clone, PartialEq)]
pub struct BackupConfig {
    /// Absolute; `None`: `<state_dir>/backups`.
    pub dir: Option<PathBuf>,
    /// `None`: no scheduled backups (`"0"`).
    pub every: Option<Duration>,
    pub keep: usize,
}

/// `[retention]` (SPEC §16.3): how long state is kept. `None` = kept forever (`"0"`).
#[derive(Debug, Clone, PartialEq)]
pub struct RetentionConfig {
    /// Files in `state_dir/inbox/` older than this are deleted.
    pub inbox_max_age: Option<Duration>,
    /// Sessions idle this long are archived as by `/reset`.
    pub idle_session_after: Option<Duration>,
    /// Archived sessions older than this are deleted.
    pub archive_max_age: Option<Duration>,
}

/// One MCP server (`[mcp.servers.<name>]`, §12). Equal when every field is (secrets compared
/// by value): a reload restarts a server whose config is not equal to the running one.
#[derive(Debug, Clone, PartialEq)]
pub struct McpServerConfig {
    /// Matches `[A-Za-z0-9_-]+`; tools are exposed as `<name>__<tool>`.
    pub name: String,
    pub transport: McpTransport,
    pub enabled: bool,
    /// Allow-list of the server's tools; `None` = all.
    pub tools: Option<Vec<String>>,
    pub timeout: Duration,
    /// Whether a stdio server's sandbox lets it use the network (`network`, default true:
    /// most servers need it). Not used for `url` servers (the daemon makes those requests).
    pub network: bool,
    /// Whether a stdio server runs through the sandbox helper (`sandbox`, default true);
    /// `false` runs it directly with only its environment cleared. Not used for `url` servers.
    pub sandbox: bool,
    /// Unix sockets a sandboxed stdio server may connect to (`unix_sockets`, absolute paths;
    /// empty: none). Empty whenever `sandbox` is false or the server is a `url` one.
    pub unix_sockets: Vec<PathBuf>,
}

/// How to reach an MCP server. Values of `env` and `headers` are `${VAR}`-expanded and may hold
/// secrets, hence `SecretString`.
#[derive(Debug, Clone)]
pub enum McpTransport {
    /// A child process speaking stdio. Only `env` reaches the child.
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, SecretString>,
        /// Absolute; `None` = the daemon's choice (the workspace).
        cwd: Option<PathBuf>,
    },
    /// Streamable HTTP.
    Http {
        url: String,
        headers: BTreeMap<String, SecretString>,
    },
}

impl PartialEq for McpTransport {
    /// Field by field; `env` and `headers` values compared by their secret text.
    fn eq(&self, other: &McpTransport) -> bool {
        fn same(a: &BTreeMap<String, SecretString>, b: &BTreeMap<String, SecretString>) -> bool {
            use secrecy::ExposeSecret;
            a.len() == b.len()
                && a.iter().zip(b).all(|((ka, va), (kb, vb))| {
                    ka == kb && va.expose_secret() == vb.expose_secret()
                })
        }
        match (self, other) {
            (
                McpTransport::Stdio {
                    command,
                    args,
                    env,
                    cwd,
                },
                McpTransport::Stdio {
                    command: c2,
                    args: a2,
                    env: e2,
                    cwd: d2,
                },
            ) => command == c2 && args == a2 && cwd == d2 && same(env, e2),
            (
                McpTransport::Http { url, headers },
                McpTransport::Http {
                    url: u2,
                    headers: h2,
                },
            ) => url == u2 && same(headers, h2),
            _ => false,
        }
    }
}

/// One `[[schedule]]` entry (§14).
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleEntry {
    /// Unique among the entries.
    pub name: String,
    pub when: ScheduleWhen,
    pub action: ScheduleAction,
    /// `precheck = "command"` (SPEC §20): run in the exec sandbox before a `system` action.
    pub precheck: Option<Precheck>,
}

/// A schedule entry's zero-token precheck (SPEC §20): a shell command run in the exec sandbox
/// (the `exec` tool's rules, no secrets in its environment) before the job. Exit 0: the job
/// runs with its stdout appended; exit 1: skipped, no provider call; other: the job runs and a
/// warning is logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Precheck {
    pub command: String,
    /// Wall-clock limit (`precheck_timeout`, default [`Precheck::DEFAULT_TIMEOUT`]).
    pub timeout: Duration,
}

impl Precheck {
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
    /// The longest `precheck_timeout` accepted: a precheck holds up the scheduler.
    pub const MAX_TIMEOUT: Duration = Duration::from_secs(300);
    /// Bytes of stdout appended to the job's text.
    pub const MAX_STDOUT: usize = 2048;
    /// Longest command accepted.
    pub const MAX_COMMAND: usize = 4096;
}

/// When a schedule fires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleWhen {
    /// 5-field cron expression in `agent.timezone` (checked for field count and characters
    /// only; the scheduler parses it).
    Cron(String),
    /// Fixed interval.
    Every(Duration),
}

/// What a schedule does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleAction {
    /// A system event with this text.
    System(String),
    /// A message to a Telegram contact (a key of `channel.telegram.contacts`).
    Message { text: String, to: String },
    /// A built-in job.
    Job(ScheduleJob),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleJob {
    Index,
    Consolidate,
}

impl ScheduleJob {
    pub fn as_str(self) -> &'static str {
        match self {
            ScheduleJob::Index => "index",
            ScheduleJob::Consolidate => "consolidate",
        }
    }
}
