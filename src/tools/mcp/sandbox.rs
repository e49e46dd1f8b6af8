//! How stdio MCP servers are confined: [`McpSandbox`] builds the exec sandbox helper's
//! command for a server, with the server's private directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rmcp::transport::ConfigureCommandExt;
use secrecy::ExposeSecret;
use tokio::process::Command;

use crate::config::{Config, ExecSandbox, McpServerConfig};
use crate::sandbox::runner::SANDBOX_PATH;
use crate::sandbox::{HELPER_SUBCOMMAND, Policy, SandboxMode};

/// How stdio servers are confined (SPEC §16.9 "Processes"): each runs through the exec
/// sandbox helper (`agentd sandbox-exec`) under [`Policy::for_mcp_server`] — no read of the
/// state or config directory (nor `.env`), a private directory as HOME and TMPDIR, network per
/// server — with only the configured `env` plus `PATH`, `HOME` and `TMPDIR`. A reload with a
/// different sandbox restarts every stdio server.
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

    /// The helper command that runs `command args…` for server `cfg`, its environment set.
    pub(super) fn command(
        &self,
        cfg: &McpServerConfig,
        command: &str,
        args: &[String],
        env: &BTreeMap<String, secrecy::SecretString>,
        cwd: Option<&PathBuf>,
    ) -> Result<Command, String> {
        let private = private_dir(&self.private_root, &cfg.name)?;
        let mut policy = Policy::for_mcp_server(
            self.mode,
            cfg.network,
            &self.allowed_paths,
            &self.protected,
            &private,
        )?;
        let (read_only, writable) = self.prompt.sandbox_paths();
        policy.keep_read_only(&read_only, &writable, &self.protected);
        policy.no_namespaces = self.no_namespaces;
        policy.no_mount_namespace = self.no_mount_namespace;
        let policy = serde_json::to_string(&policy)
            .map_err(|e| format!("cannot encode the sandbox policy: {e}"))?;
        let exe = match &self.helper_exe {
            Some(exe) => exe.clone(),
            None => std::env::current_exe()
                .map_err(|e| format!("cannot find the agentd executable: {e}"))?,
        };
        let private = private.display().to_string();
        let defaults = [
            ("PATH", SANDBOX_PATH.to_string()),
            ("HOME", private.clone()),
            ("TMPDIR", private),
        ];
        let cwd = cwd.unwrap_or(&self.default_cwd).clone();
        Ok(Command::new(exe).configure(|c| {
            c.arg(HELPER_SUBCOMMAND)
                .arg("--policy")
                .arg(policy)
                .arg("--")
                .arg(command)
                .args(args)
                .env_clear()
                .envs(
                    defaults
                        .iter()
                        .filter(|(k, _)| !env.contains_key(*k))
                        .cloned(),
                )
                .envs(env.iter().map(|(k, v)| (k, v.expose_secret())))
                .current_dir(cwd);
        }))
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
