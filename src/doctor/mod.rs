//! `agentd doctor` (SPEC §10.4): checks the configuration, provider reachability, Telegram,
//! Matrix, the MCP servers, the databases, disk space and the exec sandbox's path, and prints a
//! pass/fail table.
//! Read-only apart from creating the state directory if it is missing.

use std::fmt::Write as _;
use std::time::Duration;

use crate::config::Config;

mod mcp;
mod tool_probe;

/// One line of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Pass,
    Warn,
    Fail,
}

impl Status {
    /// `"pass"`, `"warn"` or `"fail"`: the `status` of `doctor --json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

fn check(name: impl Into<String>, status: Status, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        status,
        detail: detail.into(),
    }
}

/// Said at start and by `doctor` when the daemon runs as root (issue #12, finding 16).
pub use crate::daemon::ROOT_WARNING;

/// Free space under which the state directory is flagged.
const MIN_FREE_BYTES: u64 = 100 * 1024 * 1024;

/// Run every check. Network checks use short timeouts.
pub async fn run(cfg: &Config) -> Vec<Check> {
    let mut out = vec![check(
        "config",
        Status::Pass,
        format!("{} loaded", cfg.config_path.display()),
    )];
    out.push(user());
    for (name, reason) in &cfg.models.skipped {
        out.push(check(format!("model {name}"), Status::Warn, reason.clone()));
    }
    out.extend(no_model(&cfg.models));
    for (name, spec) in &cfg.models.loaded {
        out.push(reachable(&format!("model {name}"), &spec.base_url).await);
    }
    out.extend(voice(cfg).await);
    if cfg.telegram.enabled {
        out.push(telegram(cfg).await);
    }
    if cfg.matrix.enabled {
        out.extend(matrix(cfg).await);
    }
    if !cfg.mcp_servers.is_empty() {
        out.extend(mcp::servers(cfg).await);
    }
    out.push(state_dir(cfg));
    out.push(database(cfg).await);
    out.push(cost_spool(&cfg.paths.state_dir.join("agentd.db")));
    if cfg.memory.enabled {
        out.push(memory_database(cfg).await);
    }
    out.push(disk(cfg));
    out.push(sandbox(cfg).await);
    out.push(scratch_dir(cfg));
    out.extend(tool_probe::run(cfg).await);
    if cfg.tools.is_enabled("exec") && cfg.agent.workspace.is_dir() {
        out.push(exec_tmp(cfg).await);
    }
    let ws = &cfg.agent.workspace;
    out.push(if ws.is_dir() {
        check("workspace", Status::Pass, ws.display().to_string())
    } else {
        check(
            "workspace",
            Status::Fail,
            format!("{} is not a directory; fix [agent] workspace", ws.display()),
        )
    });
    out
}

/// `[voice]` (SPEC §19): the speech-to-text and text-to-speech endpoints accept a connection
/// (no request: it would need audio, the key, and cost money).
async fn voice(cfg: &Config) -> Vec<Check> {
    let mut out = Vec::new();
    let v = &cfg.voice;
    for (what, model, path) in [
        ("voice stt", &v.stt_model, "audio/transcriptions"),
        ("voice tts", &v.tts_model, "audio/speech"),
    ] {
        let Some(name) = model else { continue };
        let label = format!("{what} ({name})");
        match cfg.models.get(name) {
            Some(spec) => {
                let url = format!("{}/{path}", spec.base_url);
                let mut c = reachable(&label, &url).await;
                c.detail = format!("{}; {}", c.detail, crate::redact::display_url(&url));
                out.push(c);
            }
            None => {
                let reason = cfg.models.skipped.get(name).cloned().unwrap_or_else(|| {
                    format!("model {name:?} is not defined; define [models.{name}]")
                });
                out.push(check(label, Status::Fail, reason));
            }
        }
    }
    out
}

/// Telegram `getMe` with the configured token (errors never contain the token).
async fn telegram(cfg: &Config) -> Check {
    let client = match crate::channels::telegram::client::TelegramClient::new(&cfg.telegram) {
        Ok(c) => c,
        Err(e) => return check("telegram getMe", Status::Fail, e.to_string()),
    };
    match tokio::time::timeout(Duration::from_secs(10), client.get_me()).await {
        Ok(Ok(me)) => check(
            "telegram getMe",
            Status::Pass,
            format!("bot @{} (id {})", me.username.unwrap_or_default(), me.id),
        ),
        Ok(Err(e)) => check("telegram getMe", Status::Fail, e.to_string()),
        Err(_) => check("telegram getMe", Status::Fail, "no answer in 10 s"),
    }
}

/// Matrix (SPEC §21): the homeserver answers and the token is valid (`whoami`); the device is
/// verified (cross-signed) or not, a warning.
async fn matrix(cfg: &Config) -> Vec<Check> {
    let probe = crate::channels::matrix::client::probe(&cfg.matrix, &cfg.paths.state_dir);
    match tokio::time::timeout(Duration::from_secs(10), probe).await {
        Ok(Ok(p)) => {
            let mut out = vec![check("matrix whoami", Status::Pass, p.account)];
            if let Some((verified, detail)) = p.device {
                let status = if verified { Status::Pass } else { Status::Warn };
                out.push(check("matrix device", status, detail));
            }
            out
        }
        Ok(Err(e)) => vec![check("matrix whoami", Status::Fail, e)],
        Err(_) => vec![check("matrix whoami", Status::Fail, "no answer in 10 s")],
    }
}

/// Can we open a TCP connection to the URL's host? (No request is made: that would need the
/// key and cost money.)
async fn reachable(name: &str, url: &str) -> Check {
    let Some((host, port)) = host_port(url) else {
        return check(
            name,
            Status::Fail,
            format!("cannot parse URL {}", crate::redact::display_url(url)),
        );
    };
    match tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    {
        Ok(Ok(_)) => check(name, Status::Pass, format!("{host}:{port} reachable")),
        Ok(Err(e)) => check(name, Status::Fail, format!("{host}:{port}: {e}")),
        Err(_) => check(
            name,
            Status::Fail,
            format!("{host}:{port}: no answer in 5 s"),
        ),
    }
}

/// `scheme://host[:port]/…` → (host, port).
fn host_port(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split('/').next()?;
    let authority = authority.rsplit('@').next()?;
    let default = match scheme {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    if let Some(v6) = authority.strip_prefix('[') {
        let (h, rest) = v6.split_once(']')?;
        let port = rest
            .strip_prefix(':')
            .map_or(Some(default), |p| p.parse().ok())?;
        return Some((h.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((authority.to_string(), default)),
    }
}

/// The uid the daemon would run as: root is warned about.
fn user() -> Check {
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        check("user", Status::Warn, ROOT_WARNING)
    } else {
        check("user", Status::Pass, format!("uid {uid}"))
    }
}

fn state_dir(cfg: &Config) -> Check {
    let dir = &cfg.paths.state_dir;
    match crate::fsutil::create_private_dir(dir) {
        Ok(()) => {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir)
                .map(|m| m.permissions().mode() & 0o777)
                .unwrap_or(0);
            if mode & 0o077 != 0 {
                check(
                    "state dir",
                    Status::Warn,
                    format!("{} has mode {mode:o}; run chmod 700 on it", dir.display()),
                )
            } else {
                check("state dir", Status::Pass, dir.display().to_string())
            }
        }
        Err(e) => check("state dir", Status::Fail, format!("{}: {e}", dir.display())),
    }
}

/// `[tools] scratch_dir` (SPEC §16.8): created 0700, ours, not a symlink.
fn scratch_dir(cfg: &Config) -> Check {
    let dir = &cfg.tools.scratch_dir;
    match crate::tools::paths::ensure_scratch_dir(dir) {
        Ok(()) => check("scratch dir", Status::Pass, dir.display().to_string()),
        Err(e) => check("scratch dir", Status::Fail, e),
    }
}

/// Which `/tmp` exec's commands get (SPEC §16.8), probed by running one sandboxed command
/// from this process (a systemd unit may allow less than this shell): a private tmpfs where a
/// mount namespace is available, else the host's `/tmp` through the Landlock rules alone.
async fn exec_tmp(cfg: &Config) -> Check {
    use crate::sandbox::{Policy, SandboxMode, run_sandboxed};
    let name = "exec /tmp";
    let mode = match cfg.tools.exec_sandbox {
        crate::config::ExecSandbox::Landlock => SandboxMode::Landlock,
        crate::config::ExecSandbox::None => SandboxMode::None,
    };
    let protected = [cfg.paths.state_dir.clone(), cfg.config_dir.clone()];
    let policy = match Policy::build(
        mode,
        false,
        &cfg.tools.allowed_paths,
        &protected,
        Duration::from_secs(10),
    ) {
        Ok(p) => p,
        Err(e) => return check(name, Status::Fail, e),
    };
    let Ok(exe) = std::env::current_exe() else {
        return check(
            name,
            Status::Warn,
            "cannot find the agentd executable to probe",
        );
    };
    let probe = std::path::Path::new("/tmp").join(format!(".agentd-doctor-{}", std::process::id()));
    let cmd = format!("echo probe > '{}' && echo WROTE", probe.display());
    let out = run_sandboxed(&exe, &policy, &cfg.agent.workspace, &cmd, 4096).await;
    let on_host = probe.exists();
    let _ = std::fs::remove_file(&probe);
    match out {
        Ok(out) if out.stdout.contains("WROTE") && !on_host => check(
            name,
            Status::Pass,
            "private and empty (mount namespace available here)",
        ),
        Ok(out) if out.stdout.contains("WROTE") => check(
            name,
            Status::Warn,
            "the host's /tmp, shared: /tmp is an allowed path, or there is no mount namespace \
             and no Landlock",
        ),
        Ok(_) => check(
            name,
            Status::Pass,
            "the host's /tmp, not granted (no mount namespace here; Landlock rules alone); \
             commands use TMPDIR = scratch_dir",
        ),
        Err(e) => check(name, Status::Warn, format!("cannot probe: {e}")),
    }
}

/// The cost spool beside `db` (SPEC §16.4): rows there are spent money the database does not
/// count yet, so budgets undercount until the daemon writes them in.
fn cost_spool(db: &std::path::Path) -> Check {
    use crate::cost::spool::{MAX_BYTES, Spool};
    let spool = Spool::beside(db);
    let (name, path) = ("cost spool", spool.path());
    // The daemon's own reader refuses a symlink and a file over MAX_BYTES: so does this one.
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return check(name, Status::Pass, "empty");
        }
        Err(e) => return check(name, Status::Fail, format!("{}: {e}", path.display())),
        Ok(m) => m,
    };
    if !meta.is_file() || meta.len() > MAX_BYTES {
        return check(
            name,
            Status::Fail,
            format!(
                "{} is not a regular file of at most {MAX_BYTES} bytes: agentd never writes \
                 such a file there; move it away",
                path.display()
            ),
        );
    }
    match std::fs::read(path) {
        Err(e) => check(name, Status::Fail, format!("{}: {e}", path.display())),
        Ok(bytes) if bytes.is_empty() => check(name, Status::Pass, "empty"),
        Ok(bytes) => {
            let rows = bytes
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .count();
            check(
                name,
                Status::Warn,
                format!(
                    "{rows} cost row(s) in {} are not in agentd.db yet (the database could not be \
                     written); the daemon writes them at its next start or model call once it \
                     can (docs/operations.md)",
                    path.display()
                ),
            )
        }
    }
}

async fn database(cfg: &Config) -> Check {
    let path = cfg.paths.state_dir.join("agentd.db");
    match crate::store::Db::open_read_only(&path) {
        Ok(None) => check("agentd.db", Status::Pass, "not created yet"),
        Ok(Some(db)) => match db.integrity_ok().await {
            Ok(true) => check("agentd.db", Status::Pass, "integrity ok"),
            Ok(false) => check(
                "agentd.db",
                Status::Fail,
                "integrity check failed; restore from a backup",
            ),
            Err(e) => check("agentd.db", Status::Fail, e.to_string()),
        },
        Err(e) => check("agentd.db", Status::Fail, e.to_string()),
    }
}

async fn memory_database(cfg: &Config) -> Check {
    let path = cfg.paths.state_dir.join(crate::memory::DB_FILE);
    let model = cfg
        .models
        .get(crate::memory::embed::MODEL_NAME)
        .map(|s| s.model.clone());
    match crate::store::memory::MemoryDb::open_read_only(&path) {
        Ok(None) => check(
            "memory.db",
            Status::Pass,
            "not created yet (run `agentd index`)",
        ),
        Ok(Some(db)) => match (
            db.integrity_ok().await,
            db.index_status(model.as_deref()).await,
        ) {
            (Ok(true), Ok(st)) => check(
                "memory.db",
                Status::Pass,
                format!(
                    "integrity ok; {} file(s), {} chunk(s), {} embedded, {} fact(s)",
                    st.files, st.chunks, st.embedded_chunks, st.facts
                ),
            ),
            (Ok(false), _) => check(
                "memory.db",
                Status::Fail,
                "integrity check failed; move it away and run `agentd index` (facts and episodes are in it too: restore from a backup if you have one)",
            ),
            (Err(e), _) | (_, Err(e)) => check("memory.db", Status::Fail, e.to_string()),
        },
        Err(e) => check("memory.db", Status::Fail, e.to_string()),
    }
}

fn disk(cfg: &Config) -> Check {
    match nix::sys::statvfs::statvfs(&cfg.paths.state_dir) {
        Ok(s) => {
            let free = s.blocks_available().saturating_mul(s.fragment_size());
            let mib = free / (1024 * 1024);
            if free < MIN_FREE_BYTES {
                check(
                    "disk space",
                    Status::Fail,
                    format!("{mib} MiB free under the state dir"),
                )
            } else {
                check("disk space", Status::Pass, format!("{mib} MiB free"))
            }
        }
        Err(e) => check("disk space", Status::Warn, e.to_string()),
    }
}

/// Which path the exec sandbox takes here (issue 12 #6): a probe through the helper.
async fn sandbox(cfg: &Config) -> Check {
    use crate::sandbox::probe::{Health, fallback_forced, probe};
    let mode = crate::tools::exec::sandbox_mode(cfg.tools.exec_sandbox);
    let network = cfg.tools.exec_network;
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return check("sandbox", Status::Fail, format!("cannot find agentd: {e}")),
    };
    match probe(&exe, network, fallback_forced()).await {
        Ok(caps) => {
            let (health, text) = caps.describe(mode, network);
            let status = match health {
                Health::Good => Status::Pass,
                Health::Degraded => Status::Warn,
                Health::Broken => Status::Fail,
            };
            check("sandbox", status, text)
        }
        Err(e) => check("sandbox", Status::Fail, e),
    }
}

/// FAIL when no model can answer at all (every one skipped), naming the variables to set; one
/// skipped model among loaded ones stays a warning.
fn no_model(models: &crate::config::ModelSet) -> Option<Check> {
    if !models.loaded.is_empty() {
        return None;
    }
    if models.skipped.is_empty() {
        return Some(check("models", Status::Fail, "no model is defined"));
    }
    let mut vars: Vec<&str> = models
        .skipped
        .values()
        .filter_map(|r| r.split("environment variable ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    vars.sort_unstable();
    vars.dedup();
    let detail = match vars.as_slice() {
        [] => "no model can answer: every model is skipped (see the reasons above)".to_string(),
        vars => format!(
            "no model can answer: every model is skipped; set {} in .env or the environment",
            vars.join(" or ")
        ),
    };
    Some(check("models", Status::Fail, detail))
}

/// The table, and whether everything passed (warnings pass).
pub fn render(checks: &[Check]) -> (String, bool) {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut s = String::new();
    for c in checks {
        let _ = writeln!(
            s,
            "{:<4}  {:<width$}  {}",
            c.status.label(),
            c.name,
            c.detail
        );
    }
    let ok = checks.iter().all(|c| c.status != Status::Fail);
    (s, ok)
}

/// `doctor --json`: `{"ok": bool, "checks": [{"name", "status": "pass"|"warn"|"fail",
/// "detail"}]}`, and whether every check passed (no `fail`).
pub fn render_json(checks: &[Check]) -> (serde_json::Value, bool) {
    let ok = checks.iter().all(|c| c.status != Status::Fail);
    let checks: Vec<serde_json::Value> = checks
        .iter()
        .map(|c| serde_json::json!({"name": c.name, "status": c.status.as_str(), "detail": c.detail}))
        .collect();
    (serde_json::json!({"ok": ok, "checks": checks}), ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cost_spool_with_rows_is_a_warning_naming_how_many() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("agentd.db");
        let spool = dir.path().join("agentd.db.spool");
        assert_eq!(cost_spool(&db).status, Status::Pass, "no file");
        std::fs::write(&spool, "").unwrap();
        assert_eq!(cost_spool(&db).status, Status::Pass, "empty");
        std::fs::write(&spool, "{\"id\":\"a\"}\n{\"id\":\"b\"}\n").unwrap();
        let c = cost_spool(&db);
        assert_eq!(c.status, Status::Warn);
        assert!(c.detail.starts_with("2 cost row(s) in "), "{}", c.detail);
        assert!(c.detail.contains("agentd.db.spool"), "{}", c.detail);
        std::fs::remove_file(&spool).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &spool).unwrap();
        assert_eq!(
            cost_spool(&db).status,
            Status::Fail,
            "a symlink is not followed"
        );
    }

    #[test]
    fn host_port_parses_common_urls() {
        assert_eq!(
            host_port("https://api.anthropic.com"),
            Some(("api.anthropic.com".into(), 443))
        );
        assert_eq!(
            host_port("http://127.0.0.1:11434/v1"),
            Some(("127.0.0.1".into(), 11434))
        );
        assert_eq!(host_port("http://[::1]:8080/x"), Some(("::1".into(), 8080)));
        assert_eq!(host_port("ftp://x"), None);
    }

    #[test]
    fn every_model_skipped_is_a_fail_naming_the_variable() {
        let mut models = crate::config::ModelSet::default();
        models.skipped.insert(
            "primary".into(),
            "environment variable AGENTD_ANTHROPIC_KEY is not set (providers.d/anthropic.toml); \
             put it in .env or the environment"
                .into(),
        );
        models.skipped.insert(
            "cheap".into(),
            "environment variable AGENTD_ANTHROPIC_KEY is not set (x)".into(),
        );
        let c = no_model(&models).expect("a check");
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("no model can answer"), "{}", c.detail);
        assert!(
            c.detail.contains("set AGENTD_ANTHROPIC_KEY in .env"),
            "{}",
            c.detail
        );
        let (_, ok) = render(&[c]);
        assert!(!ok, "doctor exits non-zero");

        let none = crate::config::ModelSet::default();
        assert_eq!(no_model(&none).expect("a check").status, Status::Fail);
    }

    #[test]
    fn render_fails_only_on_fail() {
        let (t, ok) = render(&[
            check("a", Status::Pass, "fine"),
            check("bb", Status::Warn, "hmm"),
        ]);
        assert!(ok);
        assert!(t.contains("WARN  bb  hmm"));
        let (_, ok) = render(&[check("a", Status::Fail, "no")]);
        assert!(!ok);
    }
}
