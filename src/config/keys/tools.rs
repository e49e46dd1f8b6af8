//! `[tools]` (and its sub-tables), `[mcp.servers.<name>]` and `[[schedule]]`.

use std::path::PathBuf;
use std::time::Duration;

use super::agent::strings;
use super::codec::{
    AbsPaths, Bool, Cron, Dur, Every, Int, List, Map, OneOf, Opt, Path, Secret, Str, TEXT, Url,
    WORD, Words,
};
use super::{Apply, Entries};
use crate::config::types::{
    Config, ExecSandbox, McpServerConfig, McpTransport, Precheck, ScheduleAction, ScheduleEntry,
    ScheduleJob, ScheduleWhen,
};

/// Default `web_search.base_url` for the Brave provider.
pub const BRAVE_SEARCH_URL: &str = "https://api.search.brave.com/res/v1/web/search";

const MIB: u64 = 1024 * 1024;

/// The most entries `[mcp.servers.<name>] unix_sockets` takes.
pub const MAX_UNIX_SOCKETS: usize = 32;

config_keys! {
    TOOLS = [
        ENABLED: "tools" "enabled", Opt<List<Str>> = Opt(List(TEXT)),
            default(None), restart, tools.enabled,
            "the built-in tools to offer (not set: every built-in tool whose dependencies are configured). Names must be from the built-in list (SPEC §11), and a typo gets a suggestion. Built today: `read`, `list`, `glob`, `write`, `edit`, `exec`, `web_fetch`, `session_status`, `load_skill`, `schedule_message`, `list_scheduled`, `cancel_scheduled`, `sessions_spawn`, `web_search` (with `AGENTD_BRAVE_KEY`), `memory_search`, `memory_get`, `memory_write`, `memory_forget`, `commitment_update` (with `[memory] enabled`), with Telegram enabled `message` and `react`, and with `[voice] tts_model` `tts`";
        EXEC_TIMEOUT: "tools" "exec_timeout_seconds", Dur = Dur::secs(1),
            default(Duration::from_secs(120)), restart, tools.exec_timeout,
            "`exec` timeout; today also the default per-call timeout of every tool. Must not exceed `exec_max_timeout_seconds`";
        EXEC_MAX_TIMEOUT: "tools" "exec_max_timeout_seconds", Dur = Dur::secs(1),
            default(Duration::from_secs(600)), restart, tools.exec_max_timeout,
            "upper bound for `exec`'s `timeout_seconds`";
        EXEC_SANDBOX: "tools" "exec_sandbox", OneOf<ExecSandbox> = OneOf(&[("landlock", ExecSandbox::Landlock), ("none", ExecSandbox::None)]),
            default(ExecSandbox::Landlock), restart, tools.exec_sandbox,
            "`\"landlock\"` (refused if the kernel cannot enforce it) or `\"none\"` (clean environment and tree kill, no Landlock); see docs/security.md";
        EXEC_NETWORK: "tools" "exec_network", Bool = Bool,
            default(false), restart, tools.exec_network,
            "network for `exec` (off: a private network namespace where available, and always a seccomp filter that refuses every socket family but netlink, so TCP and UDP also on the fallback; Landlock TCP rules on top). Unix sockets stay refused either way (docs/security.md)";
        SUBAGENT_DENY: "tools" "subagent_deny", List<Str> = List(TEXT),
            default(strings(&["sessions_spawn", "schedule_message", "react"])), restart, tools.subagent_deny,
            "tools a sub-agent may not use: hidden from its tool list and refused when called. `sessions_spawn` is always denied to sub-agents";
        SUBAGENT_MODEL: "tools" "subagent_model", Str = WORD,
            default("subagent".to_string()), restart, tools.subagent_model,
            "default model for `sessions_spawn`. The default falls back to `primary`; another name must be defined";
        SCRATCH_DIR: "tools" "scratch_dir", Path = Path,
            derived("`agentd-scratch-<uid>` under the system temp directory (`$TMPDIR`, else `/tmp`)"), restart, tools.scratch_dir,
            "the tools' scratch space, at the same path for every tool; `exec`'s `TMPDIR`. Created with mode 0700 at start; the daemon refuses to start when it exists as a symlink, as a non-directory or owned by another uid. Relative to the config directory; must not be inside the state or config directory";
        MAX_PARALLEL_CALLS: "tools" "max_parallel_calls", Int<usize> = Int::at_least(1),
            default(8), restart, tools.max_parallel_calls,
            "at most this many tool calls of one model answer run at once; the others wait their turn (their timeout starts when they run) and the results keep the order of the calls. Each running session has its own limit";
        WRITABLE_CONTEXT: "tools" "writable_context", List<Str> = List(TEXT),
            default(strings(&["MEMORY.md"])), restart, tools.writable_context,
            "the files of the system prompt that `write`, `edit` and `exec` (and MCP stdio servers) may change: paths relative to the workspace, naming context files of `[agent.context]` (any tier) or files under `[agent.skills] dir`. Every other context file and everything under the skills directory is read-only to them, whatever `allowed_paths` says (docs/security.md, \"The system prompt's files\"). The default keeps `MEMORY.md`, the notes the agent maintains, writable; `[]` makes the whole prompt read-only. Relative, without `..`";
        ALLOWED_PATHS: "tools" "filesystem.allowed_paths", List<Path> = List(Path),
            derived("`[workspace, scratch_dir]`"), restart, tools.allowed_paths,
            "where `read`, `write`, `edit`, `exec` and `message` attachments may go; relative to the config directory. Symlinks are resolved and containment is checked per path component. Whatever it contains, the file tools never read or write the config directory nor a `.env`, never write the state directory, and read only its `inbox/`; for `exec` an entry containing the state or config directory is split around them (docs/security.md)";
        WEB_SEARCH_PROVIDER: "tools" "web_search.provider", Words = Words(&["brave"]),
            default("brave".to_string()), restart, tools.web_search_provider,
            "the only provider; key from `AGENTD_BRAVE_KEY`";
        WEB_SEARCH_BASE_URL: "tools" "web_search.base_url", Url = Url { empty_ok: false },
            default(BRAVE_SEARCH_URL.to_string()), restart, tools.web_search_base_url,
            "for tests or proxies";
        WEB_FETCH_MAX_BYTES: "tools" "web_fetch.max_bytes", Int<u64> = Int::at_least(1),
            default(2 * MIB), restart, tools.web_fetch_max_bytes,
            "response body cap (the default is 2 MiB)";
        WEB_FETCH_ALLOW_HOSTS: "tools" "web_fetch.allow_hosts", List<Str> = List(TEXT),
            default(Vec::new()), restart, tools.web_fetch_allow_hosts,
            "hosts exempt from the SSRF block list (e.g. a service on the LAN)";
        MAX_SCHEDULED: "tools" "scheduling.max_scheduled", Int<u32> = Int::at_least(0),
            default(50), restart, tools.max_scheduled,
            "pending `schedule_message` messages at most";
        MAX_DELAY: "tools" "scheduling.max_delay_seconds", Dur = Dur::secs(1),
            default(Duration::from_secs(30 * 86_400)), restart, tools.max_delay,
            "how far ahead `schedule_message` may schedule (the default is 30 days)";
    ]
}

/// Secret values by name (`env`, `headers`).
type Secrets = std::collections::BTreeMap<String, secrecy::SecretString>;

/// `command`, `args`, `env` and `cwd` of a stdio server.
type StdioParts<'a> = (
    &'a String,
    &'a Vec<String>,
    &'a Secrets,
    &'a Option<PathBuf>,
);

fn stdio(s: &McpServerConfig) -> Option<StdioParts<'_>> {
    match &s.transport {
        McpTransport::Stdio {
            command,
            args,
            env,
            cwd,
        } => Some((command, args, env, cwd)),
        McpTransport::Http { .. } => None,
    }
}

fn http(s: &McpServerConfig) -> Option<(&String, &Secrets)> {
    match &s.transport {
        McpTransport::Http { url, headers } => Some((url, headers)),
        McpTransport::Stdio { .. } => None,
    }
}

entry_keys! {
    McpServerConfig; MCP_KEYS = [
        MCP_COMMAND: "mcp.servers.<name>" "command", Str = WORD,
            derived("one of `command` and `url`"), |s| stdio(s).map(|t| t.0),
            "a child process speaking stdio, run in the `exec` sandbox";
        MCP_ARGS: "mcp.servers.<name>" "args", List<Str> = List(TEXT),
            default(Vec::new()), |s| stdio(s).map(|t| t.1),
            "its arguments (`command` only)";
        MCP_ENV: "mcp.servers.<name>" "env", Map<Secret> = Map(Secret),
            default(Default::default()), |s| stdio(s).map(|t| t.2),
            "the only variables that reach the child, besides `PATH`, `HOME` and `TMPDIR` (`command` only); keys must be variable names; values are secrets";
        MCP_CWD: "mcp.servers.<name>" "cwd", Opt<Path> = Opt(Path),
            derived("the workspace"), |s| stdio(s).map(|t| t.3),
            "its working directory, relative to the config directory (`command` only)";
        MCP_NETWORK: "mcp.servers.<name>" "network", Bool = Bool,
            default(true), |s| stdio(s).map(|_| &s.network),
            "`false` puts the server in its own network namespace (no connection in or out; where namespaces are unavailable, Landlock blocks TCP as for `exec`). Most servers need the network (APIs, package downloads), hence the default (`command` only)";
        MCP_SANDBOX: "mcp.servers.<name>" "sandbox", Bool = Bool,
            default(true), |s| stdio(s).map(|_| &s.sandbox),
            "`false` runs the server without the sandbox helper: only its environment is still cleared (its `env` plus `PATH`, `HOME` and `TMPDIR`, its private directory as HOME and TMPDIR). It can then read the state and config directories (`.env` with the keys), write wherever the daemon can and reach every socket. Logged as a warning at start and shown by `doctor`. `network = false` and `unix_sockets` are refused with it: nothing would enforce them (`command` only)";
        MCP_UNIX_SOCKETS: "mcp.servers.<name>" "unix_sockets", AbsPaths = AbsPaths { max: MAX_UNIX_SOCKETS, example: "/run/user/1000/gnupg/S.gpg-agent" },
            default(Vec::new()), |s| stdio(s).map(|_| &s.unix_sockets),
            "Unix sockets a sandboxed server may connect to (docker, an ssh or gpg agent, D-Bus, a database): its sandbox lets it create Unix sockets, and where the kernel has Landlock ABI 9 only these (and sockets under the paths it may write) can be reached; on an older kernel the list is not enforced, which the log and `doctor` say. Abstract sockets outside the sandbox stay unreachable from Landlock ABI 6 on (docs/security.md). Not with `sandbox = false` (`command` only)";
        MCP_URL: "mcp.servers.<name>" "url", Url = Url { empty_ok: false },
            derived("one of `command` and `url`"), |s| http(s).map(|t| t.0),
            "a streamable HTTP server";
        MCP_HEADERS: "mcp.servers.<name>" "headers", Map<Secret> = Map(Secret),
            default(Default::default()), |s| http(s).map(|t| t.1),
            "request headers (`url` only); `Authorization` is sent as the bearer token; values are secrets";
        MCP_ENABLED: "mcp.servers.<name>" "enabled", Bool = Bool,
            default(true), |s| Some(&s.enabled),
            "start the server";
        MCP_TOOLS: "mcp.servers.<name>" "tools", Opt<List<Str>> = Opt(List(TEXT)),
            default(None), |s| Some(&s.tools),
            "an allow-list of the server's tools; not set: all";
        MCP_TIMEOUT: "mcp.servers.<name>" "timeout_seconds", Dur = Dur::secs(1),
            default(Duration::from_secs(60)), |s| Some(&s.timeout),
            "per handshake and per tool call, not the server's life";
    ]
}

/// `[mcp.servers.<name>]`: added servers start, removed ones stop, changed ones restart.
pub static MCP: Entries<McpServerConfig> = Entries::new(
    "mcp.servers.<name>",
    "mcp.servers.",
    Apply::Live(|to: &mut Config, from: &Config| to.mcp_servers = from.mcp_servers.clone()),
    MCP_KEYS,
);

entry_keys! {
    ScheduleEntry; SCHEDULE_KEYS = [
        SCHEDULE_NAME: "schedule" "name", Str = WORD,
            required("\"heartbeat\""), |e| Some(&e.name),
            "unique among the entries";
        SCHEDULE_CRON: "schedule" "cron", Cron = Cron,
            derived("one of `cron` and `every`"), |e| match &e.when { ScheduleWhen::Cron(c) => Some(c), ScheduleWhen::Every(_) => None },
            "5 fields, in `agent.timezone`";
        SCHEDULE_EVERY: "schedule" "every", Every = Every { max: 0 },
            derived("one of `cron` and `every`"), |e| match &e.when { ScheduleWhen::Every(d) => Some(d), ScheduleWhen::Cron(_) => None },
            "`\"30s\"`, `\"15m\"`, `\"1h\"`, `\"1d\"`, `\"1h30m\"`; at least 1 s";
        SCHEDULE_SYSTEM: "schedule" "system", Str = TEXT,
            derived("one of `system`, `message` and `job`"), |e| match &e.action { ScheduleAction::System(t) => Some(t), _ => None },
            "a `system` message to the agent";
        SCHEDULE_MESSAGE: "schedule" "message", Str = TEXT,
            derived("one of `system`, `message` and `job`"), |e| match &e.action { ScheduleAction::Message { text, .. } => Some(text), _ => None },
            "a text sent as written to `to` (the model is not called)";
        SCHEDULE_TO: "schedule" "to", Str = TEXT,
            derived("none; required with `message`"), |e| match &e.action { ScheduleAction::Message { to, .. } => Some(to), _ => None },
            "a key of `[channel.telegram] contacts`";
        SCHEDULE_JOB: "schedule" "job", OneOf<ScheduleJob> = OneOf(&[("index", ScheduleJob::Index), ("consolidate", ScheduleJob::Consolidate)]),
            derived("one of `system`, `message` and `job`"), |e| match &e.action { ScheduleAction::Job(j) => Some(j), _ => None },
            "runs `agentd index` or `agentd consolidate` inside the daemon, in the background; skipped with a warning when `[memory] enabled = false`";
        SCHEDULE_PRECHECK: "schedule" "precheck", Str = TEXT,
            derived("none"), |e| e.precheck.as_ref().map(|p| &p.command),
            "only with `system`: a zero-token check run before the job in the exec sandbox, under the `exec` tool's rules (`allowed_paths`, `exec_sandbox`, `exec_network`; the environment holds no secret). Exit 0 runs the job with the command's stdout (at most 2 KB) appended; exit 1 skips the run (no provider call, a `skipped` trail event); any other exit, a timeout or a sandbox that cannot start runs the job with a warning";
        SCHEDULE_PRECHECK_TIMEOUT: "schedule" "precheck_timeout", Every = Every { max: Precheck::MAX_TIMEOUT.as_secs() },
            default(Precheck::DEFAULT_TIMEOUT), |e| e.precheck.as_ref().map(|p| &p.timeout),
            "bounds the precheck (only with `precheck`)";
    ]
}

/// `[[schedule]]`: new entries run, removed ones stop.
pub static SCHEDULE: Entries<ScheduleEntry> = Entries::new(
    "schedule",
    "schedule.",
    Apply::Live(|to: &mut Config, from: &Config| to.schedules = from.schedules.clone()),
    SCHEDULE_KEYS,
);
