//! The exec sandbox (SPEC §11 `exec`): the daemon spawns `agentd sandbox-exec --policy <json>
//! -- /bin/sh -c <command>` with a clean environment; the helper isolates the process tree
//! (namespaces or subreaper), confines it (Landlock, rlimits, no_new_privs, a seccomp filter
//! against Unix sockets and, without network, every other socket family but netlink) and
//! kills it whole on timeout. `probe` tells which path the helper takes here (log, doctor).
//! See docs/security.md.

pub mod helper;
pub mod policy;
pub mod probe;
pub mod runner;
pub mod seccomp;

pub use helper::{EXIT_SETUP_FAILED, EXIT_TIMED_OUT, Isolation, helper_main};
pub use policy::{NO_DEADLINE_MS, Policy, SandboxMode};
pub use runner::{ExecOutput, HELPER_SUBCOMMAND, SandboxError, run_sandboxed, sandbox_env};
