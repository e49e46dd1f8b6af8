//! `exec`: run a shell command in the workspace through the sandbox helper (SPEC §11; the
//! sandbox itself is `crate::sandbox`, documented in docs/security.md).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError};
use crate::config::{Config, ExecSandbox, ToolsConfig};
use crate::llm::ToolSpec;
use crate::sandbox::{ExecOutput, Policy, SandboxError, SandboxMode, run_sandboxed};

/// Bytes kept of each of stdout and stderr (the registry truncates the answer further).
pub const OUTPUT_CAP_BYTES: usize = 256 * 1024;

/// The helper's mode for `[tools] exec_sandbox`.
pub fn sandbox_mode(setting: ExecSandbox) -> SandboxMode {
    match setting {
        ExecSandbox::Landlock => SandboxMode::Landlock,
        ExecSandbox::None => SandboxMode::None,
    }
}

/// The `exec` tool.
#[derive(Debug, Clone)]
pub struct ExecTool {
    mode: SandboxMode,
    network: bool,
    default_timeout: Duration,
    max_timeout: Duration,
    /// Directories the command must never read (state and config directories).
    protected: Vec<PathBuf>,
    /// The system prompt's files: read-only to the command (`[tools] writable_context` aside).
    prompt: super::paths::PromptFiles,
    /// `[tools] scratch_dir`: the command's `TMPDIR` when an allowed path holds it.
    scratch_dir: PathBuf,
    /// The `agentd` binary that provides `sandbox-exec`; `None` = the running executable.
    helper_exe: Option<PathBuf>,
    /// Take the subreaper fallback (`AGENTD_SANDBOX_FALLBACK=1`, a test switch).
    force_fallback: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecArgs {
    command: String,
    timeout_seconds: Option<u64>,
}

impl ExecTool {
    /// From `[tools]`; `protected` are the directories the command must never read.
    pub fn new(cfg: &ToolsConfig, protected: Vec<PathBuf>) -> ExecTool {
        ExecTool {
            mode: sandbox_mode(cfg.exec_sandbox),
            network: cfg.exec_network,
            default_timeout: cfg.exec_timeout,
            max_timeout: cfg.exec_max_timeout.max(cfg.exec_timeout),
            protected,
            prompt: Default::default(),
            scratch_dir: cfg.scratch_dir.clone(),
            helper_exe: None,
            force_fallback: crate::sandbox::probe::fallback_forced(),
        }
    }

    /// From the whole config: the state and config directories are protected, the system
    /// prompt's files read-only.
    pub fn from_config(cfg: &Config) -> ExecTool {
        ExecTool::new(
            &cfg.tools,
            vec![cfg.paths.state_dir.clone(), cfg.config_dir.clone()],
        )
        .with_prompt_files(super::paths::PromptFiles::from_config(cfg))
    }

    /// Keep `prompt`'s files read-only to the command.
    pub fn with_prompt_files(mut self, prompt: super::paths::PromptFiles) -> ExecTool {
        self.prompt = prompt;
        self
    }

    /// Use this binary as the helper instead of the running executable (tests).
    pub fn with_helper(mut self, exe: PathBuf) -> ExecTool {
        self.helper_exe = Some(exe);
        self
    }

    /// The wall-clock limit of one call.
    fn timeout_for(&self, requested: Option<u64>) -> Duration {
        requested
            .map(Duration::from_secs)
            .unwrap_or(self.default_timeout)
            .min(self.max_timeout)
            .max(Duration::from_secs(1))
    }

    async fn run(&self, args: ExecArgs, ctx: &ToolContext) -> Result<String, ToolError> {
        let timeout = self.timeout_for(args.timeout_seconds);
        let out = self
            .run_command(
                &args.command,
                timeout,
                &ctx.allowed_paths,
                &ctx.workspace,
                OUTPUT_CAP_BYTES,
            )
            .await?;
        let text = render(&out, timeout);
        if out.timed_out {
            Err(ToolError::Failed(text))
        } else {
            Ok(text)
        }
    }

    /// Run `command` under the exec tool's rules (the sandbox, `allowed_paths`, the protected
    /// directories, a clean environment without secrets) for at most `timeout`, keeping at most
    /// `output_cap` bytes of each stream. The scheduler's prechecks (SPEC §20) run through this.
    pub async fn run_command(
        &self,
        command: &str,
        timeout: Duration,
        allowed_paths: &[PathBuf],
        workspace: &std::path::Path,
        output_cap: usize,
    ) -> Result<ExecOutput, ToolError> {
        let mut policy = Policy::build(
            self.mode,
            self.network,
            allowed_paths,
            &self.protected,
            timeout,
        )
        .map_err(ToolError::Denied)?;
        let (read_only, writable) = self.prompt.sandbox_paths();
        policy.keep_read_only(&read_only, &writable, &self.protected);
        // SPEC §16.8: temp files go to the scratch directory, at the path every tool sees.
        let real = std::fs::canonicalize(&self.scratch_dir).unwrap_or_default();
        if policy
            .read_write
            .iter()
            .any(|root| self.scratch_dir.starts_with(root) || real.starts_with(root))
        {
            policy.tmpdir = Some(self.scratch_dir.clone());
        }
        policy.no_namespaces |= self.force_fallback;
        let exe = match &self.helper_exe {
            Some(exe) => exe.clone(),
            None => std::env::current_exe().map_err(|e| {
                ToolError::Failed(format!("cannot find the agentd executable: {e}"))
            })?,
        };
        run_sandboxed(&exe, &policy, workspace, command, output_cap)
            .await
            .map_err(|e| match e {
                SandboxError::Setup(_) => ToolError::Denied(e.to_string()),
                other => ToolError::Failed(other.to_string()),
            })
    }
}

/// `exit code N`, then stdout and stderr (each only when not empty).
pub fn render(out: &ExecOutput, timeout: Duration) -> String {
    let mut text = match out.exit_code {
        Some(code) if !out.timed_out => format!("exit code {code}\n"),
        _ => format!(
            "timed out after {} s; the command and all its processes were killed\n",
            timeout.as_secs()
        ),
    };
    for (name, body, dropped) in [
        ("stdout", &out.stdout, out.stdout_dropped),
        ("stderr", &out.stderr, out.stderr_dropped),
    ] {
        if body.is_empty() && dropped == 0 {
            continue;
        }
        let _ = writeln!(text, "--- {name} ---\n{}", body.trim_end_matches('\n'));
        if dropped > 0 {
            let _ = writeln!(text, "[... {dropped} more bytes of {name} dropped]");
        }
    }
    text
}

impl Tool for ExecTool {
    /// A command may read anything: it waits for the writes before it in its answer.
    fn effects(&self, _args: &Value, _ctx: &ToolContext) -> super::effects::Effects {
        super::effects::Effects {
            reads: super::effects::Reads::All,
            writes: Vec::new(),
        }
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "exec".into(),
            description: format!(
                "Run a shell command with /bin/sh -c in the workspace and return its exit code, \
                 stdout and stderr. It runs sandboxed: writes only inside the allowed paths, \
                 {}a minimal environment, and all its processes are killed after \
                 timeout_seconds (default {}, at most {}).",
                if self.network { "" } else { "no network, " },
                self.default_timeout.as_secs(),
                self.max_timeout.as_secs()
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "command": {
                        "type": "string",
                        "minLength": 1,
                        "description": "The shell command."
                    },
                    "timeout_seconds": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "Wall-clock limit in seconds."
                    }
                },
                "required": ["command"],
                "additionalProperties": false
            }),
        }
    }

    /// The command's output is whatever the command printed: marked untrusted.
    fn untrusted_output(&self) -> bool {
        true
    }

    fn timeout(&self) -> Option<Duration> {
        // The helper enforces the real limit; this only backs it up.
        Some(self.max_timeout + Duration::from_secs(15))
    }

    fn call<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let args: ExecArgs = serde_json::from_value(args)
                .map_err(|e| ToolError::Invalid(format!("invalid arguments for exec: {e}")))?;
            self.run(args, ctx).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool() -> ExecTool {
        ExecTool {
            mode: SandboxMode::Landlock,
            network: false,
            default_timeout: Duration::from_secs(120),
            max_timeout: Duration::from_secs(600),
            protected: vec![],
            prompt: Default::default(),
            scratch_dir: PathBuf::from("/tmp/agentd-scratch-test"),
            helper_exe: None,
            force_fallback: false,
        }
    }

    #[test]
    fn timeout_defaults_and_is_capped() {
        // A command prints whatever it likes: its output is marked untrusted.
        assert!(tool().untrusted_output());
        let t = tool();
        assert_eq!(t.timeout_for(None), Duration::from_secs(120));
        assert_eq!(t.timeout_for(Some(5)), Duration::from_secs(5));
        assert_eq!(t.timeout_for(Some(100_000)), Duration::from_secs(600));
        assert_eq!(t.timeout_for(Some(0)), Duration::from_secs(1));
    }

    #[test]
    fn render_shows_code_and_streams() {
        let out = ExecOutput {
            exit_code: Some(3),
            timed_out: false,
            stdout: "hi\n".into(),
            stderr: String::new(),
            stdout_dropped: 7,
            stderr_dropped: 0,
        };
        let text = render(&out, Duration::from_secs(1));
        assert!(
            text.starts_with("exit code 3\n--- stdout ---\nhi\n"),
            "{text}"
        );
        assert!(text.contains("7 more bytes of stdout dropped"));
        assert!(!text.contains("stderr"));
        let timed = ExecOutput {
            exit_code: None,
            timed_out: true,
            ..out
        };
        assert!(render(&timed, Duration::from_secs(9)).starts_with("timed out after 9 s"));
    }

    #[test]
    fn spec_schema_compiles() {
        let spec = tool().spec();
        assert_eq!(spec.name, "exec");
        assert!(crate::tools::arg_schema::ArgSchema::compile(&spec.input_schema).is_ok());
        assert!(spec.description.contains("no network"));
    }
}
