//! How stdio MCP servers are confined: [`McpSandbox`] builds the exec sandbox helper's
//! command for a server, with the server's private directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use secrecy::ExposeSecret;
use tokio::process::Command;

use crate::config::{Config, ExecSandbox, McpServerConfig, McpTransport};
use crate::sandbox::probe::{ABSTRACT_SCOPE_ABI, RESOLVE_UNIX_ABI, landlock_abi};
use crate::sandbox::runner::SANDBOX_PATH;
use crate::sandbox::{HELPER_SUBCOMMAND, Policy, SandboxMode};

/// How stdio servers are confined (SPEC §16.9 "Processes"): each runs through the exec
/// sandbox helper (`agentd sandbox-exec`) under [`Policy::for_mcp_server`] — no read of the
/// state or config directory (nor `.env`), a private directory as HOME and TMPDIR, network per
/// server, the Unix sockets of its `unix_sockets` — with only the configured `env` plus
/// `PATH`, `HOME` and `TMPDIR`; a server with `sandbox = false` runs directly, with that
/// environment only. A reload with a different sandbox restarts every stdio server.
#[derive(Debug, Clone, PartialEq)]
pub struct McpSandbox {
    /// `[tools] exec_sandbox`: `landlock` refuses to start a server the kernel cannot confine.
    pub mode: SandboxMode,
    /// `filesystem.allowed_paths`: what a server may write besides its private directory.
    pub allowed_paths: Vec<PathBuf>,
    /// Never readable by a server: the state and config directories.
    pub protected: Vec<PathBuf>,
    /// The system prompt's files: read-only to a server, as to `exec`.
    pub prompt: crate::tools::paths::PromptFiles,
    /// Each server's private directory is `<private_root>/<name>` (created 0700).
    pub private_root: PathBuf,
    /// Working directory of a server without `cwd` (the workspace).
    pub default_cwd: PathBuf,
    /// The `agentd` binary that provides `sandbox-exec`; `None` = the running executable.
    pub helper_exe: Option<PathBuf>,
    /// Force the subreaper fallback (tests of that path; see [`Policy::no_namespaces`]).
    pub no_namespaces: bool,
    /// Skip the mount namespace, as under the shipped units (tests of that path).
    pub no_mount_namespace: bool,
}

impl McpSandbox {
    /// From the whole config; private directories under `agentd-mcp-<uid>` in the system
    /// temporary directory.
    pub fn from_config(cfg: &Config) -> McpSandbox {
        McpSandbox {
            mode: match cfg.tools.exec_sandbox {
                ExecSandbox::Landlock => SandboxMode::Landlock,
                ExecSandbox::None => SandboxMode::None,
            },
            allowed_paths: cfg.tools.allowed_paths.clone(),
            protected: vec![cfg.paths.state_dir.clone(), cfg.config_dir.clone()],
            prompt: crate::tools::paths::PromptFiles::from_config(cfg),
            private_root: std::env::temp_dir()
                .join(format!("agentd-mcp-{}", nix::unistd::geteuid())),
            default_cwd: cfg.agent.workspace.clone(),
            helper_exe: None,
            no_namespaces: false,
            no_mount_namespace: false,
        }
    }

    /// The command that runs `command args…` for server `cfg`, its environment set: through
    /// the sandbox helper, or directly for `sandbox = false`.
    pub(super) fn command(
        &self,
        cfg: &McpServerConfig,
        command: &str,
        args: &[String],
        env: &BTreeMap<String, secrecy::SecretString>,
        cwd: Option<&PathBuf>,
    ) -> Result<Command, String> {
        let private = private_dir(&self.private_root, &cfg.name)?;
        let mut cmd = if cfg.sandbox {
            let policy = serde_json::to_string(&self.policy(cfg, &private)?)
                .map_err(|e| format!("cannot encode the sandbox policy: {e}"))?;
            let exe = match &self.helper_exe {
                Some(exe) => exe.clone(),
                None => std::env::current_exe()
                    .map_err(|e| format!("cannot find the agentd executable: {e}"))?,
            };
            let mut helper = Command::new(exe);
            helper
                .arg(HELPER_SUBCOMMAND)
                .arg("--policy")
                .arg(policy)
                .arg("--")
                .arg(command);
            helper
        } else {
            Command::new(command)
        };
        let private = private.display().to_string();
        let defaults = [
            ("PATH", SANDBOX_PATH.to_string()),
            ("HOME", private.clone()),
            ("TMPDIR", private),
        ];
        cmd.args(args)
            .env_clear()
            .envs(
                defaults
                    .iter()
                    .filter(|(k, _)| !env.contains_key(*k))
                    .cloned(),
            )
            .envs(env.iter().map(|(k, v)| (k, v.expose_secret())))
            .current_dir(cwd.unwrap_or(&self.default_cwd));
        Ok(cmd)
    }

    /// The helper's policy for server `cfg` with its `private` directory.
    fn policy(&self, cfg: &McpServerConfig, private: &Path) -> Result<Policy, String> {
        let mut policy = Policy::for_mcp_server(
            self.mode,
            cfg.network,
            &self.allowed_paths,
            &self.protected,
            private,
        )?;
        let (read_only, writable) = self.prompt.sandbox_paths();
        policy.keep_read_only(&read_only, &writable, &self.protected);
        policy.no_namespaces = self.no_namespaces;
        policy.no_mount_namespace = self.no_mount_namespace;
        policy.unix_sockets = cfg.unix_sockets.clone();
        Ok(policy)
    }
}

/// What `sandbox = false` gives server `name`: said as a warning when it starts, and by
/// `doctor`.
pub fn unsandboxed_note(name: &str) -> String {
    format!(
        "MCP server {name} runs without the sandbox (sandbox = false): it can read the state \
         and config directories (the keys in .env too), write wherever the daemon can and \
         reach every socket; only its environment is cleared"
    )
}

/// What `unix_sockets` gives server `name` on a kernel with Landlock ABI `abi`: whether the
/// list is enforced, and the line that says so (logged when the server starts, a warning when
/// not enforced; shown by `doctor`).
pub fn unix_sockets_note(name: &str, abi: i32) -> (bool, String) {
    let abstract_sockets = if abi >= ABSTRACT_SCOPE_ABI {
        "abstract sockets created outside its sandbox stay unreachable"
    } else {
        "abstract ones too"
    };
    if abi >= RESOLVE_UNIX_ABI {
        let text = format!(
            "unix_sockets is enforced (Landlock ABI {abi}): server {name} can connect to the \
             listed sockets and to those beneath the paths it may write; {abstract_sockets}"
        );
        (true, text)
    } else {
        let text = format!(
            "unix_sockets is not enforced on this kernel (Landlock ABI {abi} < \
             {RESOLVE_UNIX_ABI}): server {name} can reach any Unix socket it can name; \
             {abstract_sockets}"
        );
        (false, text)
    }
}

/// Log what a stdio server's sandbox settings leave open, once per start of the server by the
/// manager (at the daemon's start, on a reload that adds or changes it): `sandbox = false`
/// and a `unix_sockets` list the kernel does not enforce are warnings.
pub(super) fn log_exposure(cfg: &McpServerConfig) {
    if !cfg.enabled || !matches!(cfg.transport, McpTransport::Stdio { .. }) {
        return;
    }
    let name = &cfg.name;
    if !cfg.sandbox {
        tracing::warn!(server = %name, "{}", unsandboxed_note(name));
    } else if !cfg.unix_sockets.is_empty() {
        match unix_sockets_note(name, landlock_abi()) {
            (true, text) => tracing::info!(server = %name, "{text}"),
            (false, text) => tracing::warn!(server = %name, "{text}"),
        }
    }
}

/// `<root>/<name>`, created 0700 (with `root`), refused unless both are real directories of
/// ours that nobody else can enter: a name in the shared temporary directory could have been
/// planted by another user.
fn private_dir(root: &Path, name: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let dir = root.join(name);
    for d in [root, dir.as_path()] {
        match std::fs::DirBuilder::new().mode(0o700).create(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", d.display())),
        }
        let meta = std::fs::symlink_metadata(d)
            .map_err(|e| format!("cannot stat {}: {e}", d.display()))?;
        let uid = nix::unistd::geteuid().as_raw();
        if !meta.is_dir() || meta.uid() != uid {
            return Err(format!(
                "{} is not a directory owned by uid {uid}; remove it so the MCP server's \
                 private directory can be created",
                d.display()
            ));
        }
        if meta.mode() & 0o077 != 0 {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("cannot make {} private (0700): {e}", d.display()))?;
        }
    }
    Ok(dir)
}
