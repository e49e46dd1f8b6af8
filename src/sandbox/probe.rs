//! What the exec sandbox can do on this machine, as the helper will find it (issue 12 #6):
//! which isolation path it takes (namespaces, with or without a mount namespace, or the
//! subreaper fallback), the Landlock ABI and whether the seccomp filter is enforced. The
//! daemon logs it once at start and `agentd doctor` prints it.
//!
//! The probe runs in a fresh `agentd sandbox-probe` process (hidden subcommand), never in the
//! multi-threaded daemon: it forks a child per test, and each child tries exactly what the
//! helper does (the same `enter_namespaces`, the same seccomp filter) and exits.

use std::io::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use nix::libc;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, fork};
use serde::{Deserialize, Serialize};

use super::helper::{Isolation, enter_namespaces};
use super::policy::SandboxMode;

/// Hidden subcommand of the `agentd` binary that runs [`probe_main`].
pub const PROBE_SUBCOMMAND: &str = "sandbox-probe";

/// Test switch: `AGENTD_SANDBOX_FALLBACK=1` in the daemon's environment makes exec (and this
/// probe) take the subreaper fallback even where namespaces work, as on a machine without
/// user namespaces. It only ever removes namespaces; every other layer stays.
pub const FORCE_FALLBACK_ENV: &str = "AGENTD_SANDBOX_FALLBACK";

/// Whether [`FORCE_FALLBACK_ENV`] is set to `1` in this process's environment.
pub fn fallback_forced() -> bool {
    std::env::var_os(FORCE_FALLBACK_ENV).is_some_and(|v| v == "1")
}

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// The fallback was forced by [`FORCE_FALLBACK_ENV`].
    pub forced_fallback: bool,
    /// User + PID (+ network) namespaces can be entered.
    pub namespaces: bool,
    /// A mount namespace as well (private /proc and /tmp).
    pub mount_namespace: bool,
    /// The kernel's Landlock ABI version; 0 when Landlock is unavailable.
    pub landlock_abi: i32,
    /// Why the seccomp filter is not enforced; `None` when it is.
    pub seccomp_error: Option<String>,
}

/// How usable the sandbox is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// The preferred path.
    Good,
    /// Works, with weaker isolation (worth a warning).
    Degraded,
    /// exec refuses every command.
    Broken,
}

impl Capabilities {
    /// The isolation path the helper takes.
    pub fn isolation(&self) -> Isolation {
        if self.namespaces {
            Isolation::Namespaces
        } else {
            Isolation::Subreaper
        }
    }

    /// One line for the log and `doctor`, and how good it is, for a config with `mode` and
    /// `network` (`[tools] exec_sandbox`, `exec_network`).
    pub fn describe(&self, mode: SandboxMode, network: bool) -> (Health, String) {
        let mut health = Health::Good;
        let net = if network {
            "network allowed (exec_network = true)".to_string()
        } else if self.namespaces {
            "network off: own network namespace and seccomp".to_string()
        } else {
            "network off: seccomp (TCP and UDP) and Landlock TCP rules".to_string()
        };
        let path = if self.namespaces {
            let mount = if self.mount_namespace {
                "mount namespace: private /proc and /tmp"
            } else {
                health = Health::Degraded;
                "no mount namespace: no private /proc or /tmp, Landlock rules only"
            };
            let kinds = if network {
                "user, PID"
            } else {
                "user, PID, network"
            };
            format!("namespaces ({kinds}; {mount}); {net}")
        } else {
            health = Health::Degraded;
            let why = if self.forced_fallback {
                format!("forced by {FORCE_FALLBACK_ENV}=1")
            } else {
                "no user namespaces".to_string()
            };
            format!("subreaper fallback ({why}): no PID namespace, no private /proc or /tmp; {net}")
        };
        let landlock = match self.landlock_abi {
            0 => "Landlock unavailable".to_string(),
            abi => format!("Landlock ABI {abi}"),
        };
        let seccomp = match &self.seccomp_error {
            None => "seccomp filter enforced".to_string(),
            Some(e) => format!("seccomp filter NOT enforced ({e})"),
        };
        let mut problems = Vec::new();
        if self.seccomp_error.is_some() {
            problems.push("every exec call is refused: the seccomp filter cannot be installed");
        }
        if mode == SandboxMode::Landlock && self.landlock_abi == 0 {
            problems.push(
                "every exec call is refused: exec_sandbox = \"landlock\" needs a kernel with \
                 Landlock (5.13+, `landlock` in the lsm= list); or set exec_sandbox = \"none\"",
            );
        }
        if !network && !self.namespaces && self.landlock_abi < 4 {
            problems.push(
                "every exec call is refused: without a network namespace the network is held \
                 off by Landlock network rules too, which need Linux 6.7+; or set \
                 exec_network = true",
            );
        }
        if !problems.is_empty() {
            health = Health::Broken;
        }
        let mut text = format!("{path}; {landlock}; {seccomp}");
        for p in problems {
            text.push_str("; ");
            text.push_str(p);
        }
        (health, text)
    }
}

/// The `sandbox-probe` subcommand: probe (taking the fallback when `no_namespaces`) and print
/// the [`Capabilities`] as one JSON line. Must run single-threaded (it forks).
pub fn probe_main(network: bool, no_namespaces: bool) -> i32 {
    let (namespaces, mount_namespace) = if no_namespaces {
        (false, false)
    } else {
        probe_namespaces(network)
    };
    let caps = Capabilities {
        forced_fallback: no_namespaces,
        namespaces,
        mount_namespace,
        landlock_abi: landlock_abi(),
        seccomp_error: in_child(|| seccomp_check(network)).err(),
    };
    // stdout is the protocol channel to the daemon (read by `probe`), not logging.
    let json = serde_json::to_string(&caps).unwrap_or_default();
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{json}").and_then(|()| out.flush()) {
        Ok(()) if !json.is_empty() => 0,
        _ => 1,
    }
}

/// (namespaces, mount namespace) as the helper's own `enter_namespaces` finds them, tried in
/// a child that exits with 0 (none), 1 (no mount namespace) or 2 (all).
fn probe_namespaces(network: bool) -> (bool, bool) {
    let code = in_child_code(|| match enter_namespaces(network, true) {
        Ok((Isolation::Namespaces, true)) => 2,
        Ok((Isolation::Namespaces, false)) => 1,
        _ => 0,
    });
    (matches!(code, Some(1 | 2)), code == Some(2))
}

/// The Landlock ABI from which `connect()` to a pathname Unix socket is a filesystem right
/// (`LANDLOCK_ACCESS_FS_RESOLVE_UNIX`): an MCP server's `unix_sockets` is enforced from it on.
pub const RESOLVE_UNIX_ABI: i32 = 9;

/// The Landlock ABI from which abstract Unix sockets created outside a sandbox are out of
/// its reach (`LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`).
pub const ABSTRACT_SCOPE_ABI: i32 = 6;

/// The running kernel's Landlock ABI version, 0 without Landlock:
/// `landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`, a query that changes
/// nothing (safe in the daemon too).
pub fn landlock_abi() -> i32 {
    // SAFETY: with a null attribute pointer and size 0 the call only returns the version.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    i32::try_from(v).unwrap_or(0).max(0)
}

/// In the child: install the filter and check that `socket(AF_UNIX)` is refused.
fn seccomp_check(network: bool) -> Result<(), String> {
    super::seccomp::install(network, false)?;
    // SAFETY: a plain system call; a descriptor it returns is closed.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
    if fd >= 0 {
        unsafe { libc::close(fd) };
        return Err("installed, but socket(AF_UNIX) still works".into());
    }
    Ok(())
}

/// Run `f` in a forked child; `Ok` when it succeeded. Its error goes to stderr (the daemon
/// side reads it from there), the result travels as the exit code.
fn in_child(f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    let code = in_child_code(|| match f() {
        Ok(()) => 0,
        Err(e) => {
            // The reason for the daemon side (`probe` reads the child's stderr).
            let _ = writeln!(std::io::stderr(), "{e}");
            1
        }
    });
    match code {
        Some(0) => Ok(()),
        Some(1) => Err("cannot be installed".into()),
        Some(c) => Err(format!("the probe child exited with {c}")),
        None => Err("the probe child was killed".into()),
    }
}

/// Run `f` in a forked child and return its exit code (`None` when it was killed).
fn in_child_code(f: impl FnOnce() -> i32) -> Option<i32> {
    // SAFETY: the probe process is single-threaded; the child only runs `f` and exits.
    match unsafe { fork() } {
        Err(_) => None,
        Ok(ForkResult::Child) => {
            let code = f();
            // SAFETY: leave the child without running the parent's exit handlers twice.
            unsafe { libc::_exit(code) }
        }
        Ok(ForkResult::Parent { child }) => match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, code)) => Some(code),
            _ => None,
        },
    }
}

/// Daemon side: run `<helper_exe> sandbox-probe` and read what it found. `force_fallback`
/// passes [`FORCE_FALLBACK_ENV`] on.
pub async fn probe(
    helper_exe: &Path,
    network: bool,
    force_fallback: bool,
) -> Result<Capabilities, String> {
    let mut cmd = tokio::process::Command::new(helper_exe);
    cmd.arg(PROBE_SUBCOMMAND);
    if network {
        cmd.arg("--network");
    }
    if force_fallback {
        cmd.arg("--no-namespaces");
    }
    cmd.env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(10), cmd.output())
        .await
        .map_err(|_| "the sandbox probe did not answer in 10 s".to_string())?
        .map_err(|e| format!("cannot run {}: {e}", helper_exe.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut caps: Capabilities = serde_json::from_str(stdout.trim()).map_err(|e| {
        format!(
            "the sandbox probe answered {:?} ({e}); stderr: {}",
            stdout.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })?;
    if let Some(err) = &mut caps.seccomp_error {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if let Some(line) = stderr.lines().find(|l| !l.trim().is_empty()) {
            *err = line.trim().to_string();
        }
    }
    Ok(caps)
}

/// How long after the start [`log_at_start`] probes.
const PROBE_AFTER_START: std::time::Duration = std::time::Duration::from_secs(2);

/// Probe in the background, [`PROBE_AFTER_START`] after the start, and log the result once
/// (info on the preferred path, a warning on a weaker one, an error when exec would refuse
/// every command).
pub fn log_at_start(mode: SandboxMode, network: bool) {
    let force = fallback_forced();
    tokio::spawn(async move {
        // Once the daemon serves: the probe runs the agentd executable again and creates
        // namespaces, a few milliseconds of CPU that competed with the start-up itself on 2
        // cores (docs/BENCHMARKS.md, start-up). Its line is a report, nothing waits for it.
        tokio::time::sleep(PROBE_AFTER_START).await;
        let exe = match std::env::current_exe() {
            Ok(exe) => exe,
            Err(e) => {
                tracing::warn!("exec sandbox: cannot find the agentd executable to probe: {e}");
                return;
            }
        };
        match probe(&exe, network, force).await {
            Ok(caps) => match caps.describe(mode, network) {
                (Health::Good, text) => tracing::info!("exec sandbox: {text}"),
                (Health::Degraded, text) => tracing::warn!("exec sandbox: {text}"),
                (Health::Broken, text) => tracing::error!("exec sandbox: {text}"),
            },
            Err(e) => tracing::warn!("exec sandbox: the probe failed: {e}"),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(namespaces: bool, mount: bool, abi: i32) -> Capabilities {
        Capabilities {
            forced_fallback: false,
            namespaces,
            mount_namespace: mount,
            landlock_abi: abi,
            seccomp_error: None,
        }
    }

    #[test]
    fn each_path_is_described() {
        let (h, t) = caps(true, true, 7).describe(SandboxMode::Landlock, false);
        assert_eq!(h, Health::Good, "{t}");
        assert!(
            t.starts_with("namespaces (user, PID, network; mount namespace"),
            "{t}"
        );
        assert!(t.contains("Landlock ABI 7; seccomp filter enforced"), "{t}");

        let (h, t) = caps(true, false, 7).describe(SandboxMode::Landlock, false);
        assert_eq!(h, Health::Degraded, "{t}");
        assert!(t.contains("no private /proc or /tmp"), "{t}");

        let (h, t) = caps(false, false, 7).describe(SandboxMode::Landlock, false);
        assert_eq!(h, Health::Degraded, "{t}");
        assert!(t.contains("subreaper fallback (no user namespaces)"), "{t}");
        assert!(t.contains("seccomp (TCP and UDP)"), "{t}");
    }

    #[test]
    fn refusals_are_broken_and_name_the_fix() {
        let (h, t) = caps(true, true, 0).describe(SandboxMode::Landlock, false);
        assert_eq!(h, Health::Broken);
        assert!(t.contains("exec_sandbox = \"none\""), "{t}");
        assert_eq!(
            caps(true, true, 0).describe(SandboxMode::None, false).0,
            Health::Good
        );
        let (h, t) = caps(false, false, 3).describe(SandboxMode::None, false);
        assert_eq!(h, Health::Broken);
        assert!(t.contains("exec_network = true"), "{t}");
        let mut c = caps(true, true, 7);
        c.seccomp_error = Some("EINVAL".into());
        let (h, t) = c.describe(SandboxMode::Landlock, true);
        assert_eq!(h, Health::Broken);
        assert!(t.contains("seccomp filter NOT enforced (EINVAL)"), "{t}");
    }
}
