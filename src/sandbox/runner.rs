//! The daemon side: spawn the `sandbox-exec` helper with a clean environment, collect capped
//! output, and back the helper's own timeout with a kill.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt};

use super::helper::{ERROR_PREFIX, EXIT_SETUP_FAILED, EXIT_TIMED_OUT};
use super::policy::Policy;

/// Subcommand of the `agentd` binary that runs the helper.
pub const HELPER_SUBCOMMAND: &str = "sandbox-exec";

/// Extra time the helper gets beyond the policy timeout before the daemon kills it.
const BACKSTOP_GRACE: Duration = Duration::from_secs(5);

/// `PATH` inside the sandbox.
pub const SANDBOX_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Why a command could not be run (its own failures are an `ExecOutput` with a non-zero code).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot start the sandbox helper {exe}: {source}")]
    Spawn {
        exe: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the sandbox could not be set up, the command did not run: {0}")]
    Setup(String),
    #[error("reading the command's output failed: {0}")]
    Io(#[from] std::io::Error),
}

/// What a sandboxed command did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exit code (`128 + n` when killed by signal n); `None` when it timed out.
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    /// Bytes that were discarded beyond the cap.
    pub stdout_dropped: u64,
    pub stderr_dropped: u64,
}

/// The environment the command gets — nothing of the daemon's.
pub fn sandbox_env(workspace: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("PATH", SANDBOX_PATH.to_string()),
        ("HOME", workspace.display().to_string()),
        ("LANG", "C.UTF-8".to_string()),
        ("TERM", "dumb".to_string()),
        ("TMPDIR", "/tmp".to_string()),
    ]
}

/// Run `/bin/sh -c command` in `workspace` through the helper `helper_exe` (the `agentd`
/// binary) under `policy`. Each of stdout and stderr keeps at most `output_cap` bytes.
pub async fn run_sandboxed(
    helper_exe: &Path,
    policy: &Policy,
    workspace: &Path,
    command: &str,
    output_cap: usize,
) -> Result<ExecOutput, SandboxError> {
    let policy_json = serde_json::to_string(policy)
        .map_err(|e| SandboxError::Setup(format!("cannot encode the policy: {e}")))?;
    let started = Instant::now();
    let mut child = tokio::process::Command::new(helper_exe)
        .arg(HELPER_SUBCOMMAND)
        .arg("--policy")
        .arg(policy_json)
        .arg("--")
        .arg("/bin/sh")
        .arg("-c")
        .arg(command)
        .env_clear()
        .envs(sandbox_env(workspace))
        .envs(policy.tmpdir.iter().map(|dir| ("TMPDIR", dir)))
        .current_dir(workspace)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| SandboxError::Spawn {
            exe: helper_exe.display().to_string(),
            source,
        })?;
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let collect = async {
        let (out, err, status) = tokio::join!(
            read_capped(stdout, output_cap),
            read_capped(stderr, output_cap),
            child.wait()
        );
        Ok::<_, std::io::Error>((out?, err?, status?))
    };
    let limit = policy.timeout().saturating_add(BACKSTOP_GRACE);
    let ((stdout, stdout_dropped), (stderr, stderr_dropped), status) =
        match tokio::time::timeout(limit, collect).await {
            Ok(result) => result?,
            Err(_) => {
                // The helper did not honour its own deadline; kill it (with namespaces its
                // death takes the whole tree along through PR_SET_PDEATHSIG).
                let _ = child.kill().await;
                return Ok(ExecOutput {
                    exit_code: None,
                    timed_out: true,
                    stdout: String::new(),
                    stderr: String::new(),
                    stdout_dropped: 0,
                    stderr_dropped: 0,
                });
            }
        };
    let code = status.code();
    if code == Some(EXIT_SETUP_FAILED)
        && let Some(msg) = stderr.lines().find_map(|l| l.strip_prefix(ERROR_PREFIX))
    {
        return Err(SandboxError::Setup(msg.to_string()));
    }
    let timed_out = code == Some(EXIT_TIMED_OUT) && started.elapsed() >= policy.timeout();
    Ok(ExecOutput {
        exit_code: if timed_out { None } else { code },
        timed_out,
        stdout,
        stderr,
        stdout_dropped,
        stderr_dropped,
    })
}

/// Read a pipe to EOF, keeping at most `cap` bytes (lossy UTF-8) and counting the rest.
async fn read_capped<R: AsyncRead + Unpin>(
    pipe: Option<R>,
    cap: usize,
) -> std::io::Result<(String, u64)> {
    let Some(mut pipe) = pipe else {
        return Ok((String::new(), 0));
    };
    let mut kept = Vec::new();
    let mut dropped = 0u64;
    let mut buf = [0u8; 8192];
    loop {
        let n = pipe.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        let room = cap.saturating_sub(kept.len()).min(n);
        kept.extend_from_slice(&buf[..room]);
        dropped += (n - room) as u64;
    }
    Ok((String::from_utf8_lossy(&kept).into_owned(), dropped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_is_the_allow_list_only() {
        let env = sandbox_env(Path::new("/ws"));
        let keys: Vec<&str> = env.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, ["PATH", "HOME", "LANG", "TERM", "TMPDIR"]);
        assert!(env.contains(&("HOME", "/ws".to_string())));
    }

    #[tokio::test]
    async fn output_is_capped() {
        let data: &[u8] = &[b'x'; 20_000];
        let (kept, dropped) = read_capped(Some(data), 100).await.unwrap();
        assert_eq!(kept.len(), 100);
        assert_eq!(dropped, 19_900);
    }
}
