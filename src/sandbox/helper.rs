//! The `agentd sandbox-exec` helper: a single-threaded, synchronous process the daemon spawns
//! for every `exec` call. It isolates itself (user + PID + mount [+ network] namespaces, or a
//! child subreaper when namespaces are unavailable), confines the command (Landlock, rlimits,
//! no_new_privs), runs it, enforces the wall-clock timeout and kills the whole process tree.
//!
//! Exit status: the command's exit code, `128 + signal` when it was killed by a signal,
//! [`EXIT_TIMED_OUT`] on timeout and [`EXIT_SETUP_FAILED`] (with a message on stderr starting
//! with [`ERROR_PREFIX`]) when the sandbox could not be set up — the command never runs then.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use nix::sys::prctl;
use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getgid, getpid, getuid, pipe2};

use self::ruleset::apply_landlock;
use super::policy::{Policy, SandboxMode};

mod ruleset;

/// Exit status of the helper when the command ran out of time (as `timeout(1)`).
pub const EXIT_TIMED_OUT: i32 = 124;
/// Exit status of the helper when the sandbox could not be set up (as `env(1)`).
pub const EXIT_SETUP_FAILED: i32 = 125;
/// Start of every message the helper itself writes to stderr.
pub const ERROR_PREFIX: &str = "agentd sandbox-exec: ";

/// Write one line to the helper's stderr. That stream is the protocol channel to the daemon
/// (which reads it with the command's stderr and recognises [`ERROR_PREFIX`]); the helper has
/// no tracing subscriber, and this is not logging.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// How the process tree is held together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// New user + PID + mount (+ network) namespaces: killing the namespace's init kills all.
    Namespaces,
    /// No namespaces: the helper is a child subreaper and kills every descendant itself.
    Subreaper,
}

/// Entry point of the hidden `sandbox-exec` subcommand. `argv` is the command to run
/// (`/bin/sh -c ...`). Returns the exit status for the helper process.
pub fn helper_main(policy_json: &str, argv: &[OsString]) -> i32 {
    let policy = match serde_json::from_str::<Policy>(policy_json) {
        Ok(p) => p,
        Err(e) => {
            say!("{ERROR_PREFIX}invalid --policy JSON: {e}");
            return EXIT_SETUP_FAILED;
        }
    };
    if argv.is_empty() {
        say!("{ERROR_PREFIX}no command given after `--`");
        return EXIT_SETUP_FAILED;
    }
    match run(&policy, argv) {
        Ok(code) => code,
        Err(msg) => {
            say!("{ERROR_PREFIX}{msg}");
            EXIT_SETUP_FAILED
        }
    }
}

fn run(policy: &Policy, argv: &[OsString]) -> Result<i32, String> {
    let (isolation, mount_ns) = if policy.no_namespaces {
        (Isolation::Subreaper, false)
    } else {
        enter_namespaces(policy.network, !policy.no_mount_namespace)?
    };
    // The user-namespace maps are written: from here on the helper's environment (which
    // holds an MCP server's configured secrets) is not readable by other same-uid processes.
    let _ = prctl::set_dumpable(false);
    if isolation == Isolation::Subreaper {
        prctl::set_child_subreaper(true)
            .map_err(|e| format!("cannot become a child subreaper: {e}"))?;
    }
    // The child notices through this pipe (EOF) that the helper died before its
    // PR_SET_PDEATHSIG took effect.
    let (alive_rd, alive_wr) =
        pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("cannot create a pipe: {e}"))?;
    // SAFETY: the helper is single-threaded (nothing has spawned a thread), so the child may
    // run arbitrary code after fork.
    match unsafe { fork() } {
        Err(e) => Err(format!("cannot fork: {e}")),
        Ok(ForkResult::Child) => {
            drop(alive_wr);
            let code = child_main(policy, argv, isolation, mount_ns, alive_rd);
            std::process::exit(code)
        }
        Ok(ForkResult::Parent { child }) => {
            drop(alive_rd);
            let code = supervise(policy, child, isolation);
            drop(alive_wr);
            code
        }
    }
}

/// Try to unshare user, PID and mount namespaces (and network unless allowed); without the
/// mount namespace when that is refused (systemd's `RestrictNamespaces=user pid net`). Returns
/// the isolation in effect and whether a mount namespace was entered; an error only when the
/// namespaces were entered but could not be set up.
pub(super) fn enter_namespaces(
    network: bool,
    want_mount: bool,
) -> Result<(Isolation, bool), String> {
    let (uid, gid) = (getuid(), getgid());
    let mut flags = CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWPID;
    if !network {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    let mount_ns = if want_mount && unshare(flags | CloneFlags::CLONE_NEWNS).is_ok() {
        true
    } else if unshare(flags).is_ok() {
        false
    } else {
        return Ok((Isolation::Subreaper, false));
    };
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/self/{file}"), text)
            .map_err(|e| format!("cannot write /proc/self/{file} in the new user namespace: {e}"))
    };
    write("setgroups", "deny".into())?;
    write("uid_map", format!("{uid} {uid} 1"))?;
    write("gid_map", format!("{gid} {gid} 1"))?;
    Ok((Isolation::Namespaces, mount_ns))
}

/// The forked child: with namespaces it is PID 1 of the new PID namespace (a tiny init that
/// runs the command as its child); without, it becomes the command itself.
fn child_main(
    policy: &Policy,
    argv: &[OsString],
    isolation: Isolation,
    mount_ns: bool,
    alive: OwnedFd,
) -> i32 {
    if let Err(e) = prctl::set_pdeathsig(Signal::SIGKILL) {
        say!("{ERROR_PREFIX}cannot set the parent-death signal: {e}");
        return EXIT_SETUP_FAILED;
    }
    if parent_gone(alive) {
        return EXIT_SETUP_FAILED;
    }
    match isolation {
        Isolation::Subreaper => {
            let policy = keep_read_only(policy, false);
            confine_and_exec(&policy, argv, isolation, false)
        }
        Isolation::Namespaces => {
            // Without a private /proc, Landlock grants no /proc at all; without Landlock
            // (mode none) the host /proc stays visible — a documented limit.
            let remounted = if mount_ns {
                remount_proc()
            } else {
                Err("no mount namespace for a private /proc".to_string())
            };
            let private_proc = match remounted {
                Ok(()) => true,
                Err(msg) => {
                    proc_note(policy, &msg);
                    false
                }
            };
            // A private, empty /tmp (SPEC §16.8), writable by the command.
            let with_tmp;
            let policy = match private_proc.then(|| private_tmp(policy)) {
                Some(Ok(true)) => {
                    let mut p = policy.clone();
                    p.read_write.push(std::path::PathBuf::from(TMP));
                    with_tmp = p;
                    &with_tmp
                }
                Some(Err(msg)) => {
                    say!("{ERROR_PREFIX}note: {msg}; /tmp is the host's (Landlock rules only)");
                    policy
                }
                _ => policy,
            };
            // The prompt's files (issue "Security, third round", item 10), after the private
            // /tmp so the read-only mounts are on the tree the command sees.
            // Only where the mounts were made private (never seen outside).
            let policy = keep_read_only(policy, mount_ns && private_proc);
            let policy = &*policy;
            // SAFETY: still single-threaded.
            match unsafe { fork() } {
                Err(e) => {
                    say!("{ERROR_PREFIX}cannot fork: {e}");
                    EXIT_SETUP_FAILED
                }
                Ok(ForkResult::Child) => confine_and_exec(policy, argv, isolation, private_proc),
                Ok(ForkResult::Parent { child }) => init_loop(child),
            }
        }
    }
}

/// The policy under which `policy.read_only` stays unchanged: itself when every path is on a
/// read-only mount (the operator's, or one bound here in the command's mount namespace:
/// `mount_ns`), else [`Policy::with_fallback`] (Landlock alone; noted on the command's
/// stderr when a mount namespace existed, since then a missing or symlinked path is why).
fn keep_read_only(policy: &Policy, mount_ns: bool) -> std::borrow::Cow<'_, Policy> {
    use std::borrow::Cow;
    if policy.read_only.is_empty() {
        return Cow::Borrowed(policy);
    }
    match mount_read_only(policy, mount_ns) {
        Ok(()) => Cow::Borrowed(policy),
        Err(msg) => {
            if mount_ns && policy.mode == SandboxMode::Landlock {
                say!(
                    "{ERROR_PREFIX}note: {msg}; the prompt's files are kept read-only by \
                     Landlock instead: no entry can be created, removed or renamed directly in \
                     their directories"
                );
            }
            Cow::Owned(policy.with_fallback())
        }
    }
}

/// Bind-mount every `policy.read_only` path onto itself read-only (one already on a
/// read-only mount is left as it is), then bind the `writable_within` files back read-write.
/// The command cannot undo the mounts: Landlock and the seccomp filter refuse `umount` and
/// `mount`. An error when a path cannot be kept so (without a mount namespace, a path that
/// does not exist or is a symlink, a failed mount).
fn mount_read_only(policy: &Policy, mount_ns: bool) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    // The opted-in files, held before a read-only mount hides them.
    let mut writable = Vec::new();
    for p in &policy.writable_within {
        if let Ok(fd) = nix::fcntl::open(
            p,
            OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            nix::sys::stat::Mode::empty(),
        ) {
            writable.push((p, fd));
        }
    }
    // Checked before anything is mounted, so a fallback starts from the host's tree.
    let mut to_mount = Vec::new();
    for p in &policy.read_only {
        let meta =
            std::fs::symlink_metadata(p).map_err(|_| format!("{} does not exist", p.display()))?;
        if meta.file_type().is_symlink() {
            return Err(format!("{} is a symlink", p.display()));
        }
        if !on_read_only_mount(p) {
            to_mount.push(p);
        }
    }
    if !to_mount.is_empty() && !mount_ns {
        return Err("no mount namespace".into());
    }
    for p in to_mount {
        let fail = |e| format!("cannot mount {} read-only: {e}", p.display());
        mount(
            Some(p.as_path()),
            p,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(fail)?;
        mount(
            None::<&str>,
            p,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | locked_flags(p),
            None::<&str>,
        )
        .map_err(fail)?;
    }
    for (p, fd) in &writable {
        let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
        mount(
            Some(source.as_str()),
            p.as_path(),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("cannot keep {} writable: {e}", p.display()))?;
    }
    Ok(())
}

/// Whether `p` lies on a read-only mount.
fn on_read_only_mount(p: &std::path::Path) -> bool {
    nix::sys::statvfs::statvfs(p)
        .is_ok_and(|st| st.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
}

/// Mention (on the command's stderr) that /proc is hidden, only when a mount namespace was
/// expected but failed; the routine no-mount-namespace case stays quiet.
fn proc_note(policy: &Policy, msg: &str) {
    if policy.mode == SandboxMode::Landlock && !policy.no_mount_namespace && !msg.starts_with("no ")
    {
        say!("{ERROR_PREFIX}note: {msg}; /proc is hidden instead");
    }
}

/// Whether the write end of the liveness pipe is closed (the helper died).
fn parent_gone(alive: OwnedFd) -> bool {
    if fcntl(&alive, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).is_err() {
        return false;
    }
    let mut file = std::fs::File::from(alive);
    matches!(file.read(&mut [0u8; 1]), Ok(0))
}

/// Make mounts private and mount a fresh /proc that shows only this PID namespace.
fn remount_proc() -> Result<(), String> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("cannot make mounts private: {e}"))?;
    mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| format!("cannot mount a private /proc: {e}"))
}

const TMP: &str = "/tmp";

/// Mount an empty tmpfs on `/tmp` in the command's mount namespace (SPEC §16.8), keeping at
/// their paths what the command may use that lies under `/tmp` — the allowed paths (already
/// split around the state and config directories), `TMPDIR`, the system read paths, the Unix
/// sockets it is given, and the working directory when one of those covers it — as bind
/// mounts of the originals, so every tool still sees them at the same path and nothing else
/// of the host's `/tmp` is visible.
///
/// The caller then grants the tmpfs read-write, and Landlock's rules are hierarchical across
/// mounts: whatever is bind-mounted under `/tmp` inherits that grant. So only what the policy
/// already lets the command reach comes back (an uncovered working directory does not), and
/// what it may only read comes back as a read-only bind mount, which no Landlock grant can
/// make writable. Skipped (`Ok(false)`) when `/tmp` is itself an allowed path (the command
/// then shares it, as configured) or is not a plain directory. On failure the tmpfs is removed
/// again and the host's `/tmp` stays.
fn private_tmp(policy: &Policy) -> Result<bool, String> {
    use std::os::fd::AsRawFd;
    use std::path::Path;
    let tmp = Path::new(TMP);
    if !std::fs::symlink_metadata(tmp).is_ok_and(|m| m.is_dir())
        || policy.read_write.iter().any(|p| p == tmp)
    {
        return Ok(false);
    }
    let cwd = std::env::current_dir().ok();
    let roots = tmp_mounts(policy, tmp);
    // Hold every original before the tmpfs hides it.
    let mut held = Vec::new();
    for (p, w) in roots {
        let fd = nix::fcntl::open(
            &p,
            OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| format!("cannot open {} for the private /tmp: {e}", p.display()))?;
        let is_dir = nix::sys::stat::fstat(&fd)
            .map(|st| {
                use nix::sys::stat::SFlag;
                SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
            })
            .map_err(|e| format!("cannot stat {}: {e}", p.display()))?;
        held.push((p, fd, is_dir, w));
    }
    mount(
        Some("tmpfs"),
        tmp,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777"),
    )
    .map_err(|e| format!("cannot mount a private /tmp: {e}"))?;
    let bind = |p: &Path, fd: &OwnedFd, is_dir: bool, writable: bool| -> Result<(), String> {
        if std::fs::symlink_metadata(p).is_err() {
            let made = if is_dir {
                std::fs::create_dir_all(p)
            } else {
                p.parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| std::fs::File::create(p).map(drop))
            };
            made.map_err(|e| format!("cannot create {} in the private /tmp: {e}", p.display()))?;
        }
        let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let keep_err = |e| format!("cannot keep {} in the private /tmp: {e}", p.display());
        mount(
            Some(source.as_str()),
            p,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(keep_err)?;
        if !writable {
            mount(
                None::<&str>,
                p,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | locked_flags(p),
                None::<&str>,
            )
            .map_err(keep_err)?;
        }
        Ok(())
    };
    for (p, fd, is_dir, writable) in &held {
        if let Err(msg) = bind(p, fd, *is_dir, *writable) {
            let _ = nix::mount::umount2(tmp, nix::mount::MntFlags::MNT_DETACH);
            return Err(msg);
        }
    }
    // Re-enter the working directory through the new mounts.
    if let Some(cwd) = cwd {
        let _ = std::env::set_current_dir(cwd);
    }
    Ok(true)
}

/// What [`private_tmp`] bind-mounts back under `tmp`: `(path, writable)`, each a canonical
/// path below `tmp`, parents first, none covered by an earlier one in the same mode.
fn tmp_mounts(policy: &Policy, tmp: &std::path::Path) -> Vec<(std::path::PathBuf, bool)> {
    use std::path::PathBuf;
    let canon = |p: &PathBuf| std::fs::canonicalize(p).ok();
    let writable: Vec<PathBuf> = policy
        .read_write
        .iter()
        .chain(&policy.tmpdir)
        .filter_map(canon)
        .collect();
    // The listed Unix sockets come back like readable paths (a read-only bind mount does not
    // stop a connect()).
    let readable: Vec<PathBuf> = policy
        .read_exec
        .iter()
        .chain(&policy.unix_sockets)
        .filter_map(canon)
        .collect();
    let cwd = std::env::current_dir().ok();
    let covered_cwd = cwd.as_ref().and_then(canon).filter(|c| {
        writable
            .iter()
            .chain(&readable)
            .any(|root| c.starts_with(root))
    });
    // (path, writable), sorted so a parent is mounted before what lies beneath it.
    let mut keep: Vec<(PathBuf, bool)> = writable
        .iter()
        .map(|p| (p.clone(), true))
        .chain(readable.iter().map(|p| (p.clone(), false)))
        .chain(covered_cwd.map(|c| {
            let w = writable.iter().any(|root| c.starts_with(root));
            (c, w)
        }))
        .filter(|(p, _)| p.starts_with(tmp) && p != tmp)
        .collect();
    keep.sort();
    keep.dedup_by(|later, earlier| {
        later.0 == earlier.0 && {
            earlier.1 |= later.1;
            true
        }
    });
    // A path needs its own mount unless an earlier one covers it in the same mode.
    let mut roots: Vec<(PathBuf, bool)> = Vec::new();
    for (p, w) in keep {
        let covering = roots.iter().rev().find(|(r, _)| p.starts_with(r));
        if covering.is_none_or(|(_, rw)| *rw != w) {
            roots.push((p, w));
        }
    }
    roots
}

/// The flags of the mount holding `p` that a remount in a user namespace must keep: the kernel
/// locks `nosuid`, `nodev`, `noexec` and the atime flags of mounts inherited from the parent
/// namespace, and refuses a remount that would clear them.
fn locked_flags(p: &std::path::Path) -> MsFlags {
    use nix::sys::statvfs::FsFlags;
    let Ok(st) = nix::sys::statvfs::statvfs(p) else {
        return MsFlags::empty();
    };
    let f = st.flags();
    [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ]
    .into_iter()
    .filter(|(st, _)| f.contains(*st))
    .fold(MsFlags::empty(), |acc, (_, ms)| acc | ms)
}

/// PID 1 of the namespace: reap every orphan until the command exits, then exit with its
/// status (which makes the kernel kill whatever else is left in the namespace).
fn init_loop(command: Pid) -> i32 {
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == command => return code,
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == command => return 128 + sig as i32,
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return EXIT_SETUP_FAILED,
        }
    }
}

/// Apply rlimits, Landlock, no_new_privs and the seccomp filter, then exec the command.
/// Returns only on failure.
fn confine_and_exec(
    policy: &Policy,
    argv: &[OsString],
    isolation: Isolation,
    private_proc: bool,
) -> i32 {
    if let Err(msg) = set_rlimits(policy) {
        say!("{ERROR_PREFIX}{msg}");
        return EXIT_SETUP_FAILED;
    }
    let _ = prctl::set_dumpable(false);
    if let Err(msg) = apply_landlock(policy, isolation, private_proc) {
        say!("{ERROR_PREFIX}{msg}");
        return EXIT_SETUP_FAILED;
    }
    if let Err(e) = prctl::set_no_new_privs() {
        say!("{ERROR_PREFIX}cannot set no_new_privs: {e}");
        return EXIT_SETUP_FAILED;
    }
    // Last before exec: no Unix socket outside unless given some, no socket at all without
    // network but those (seccomp.rs).
    let unix = !policy.unix_sockets.is_empty();
    if let Err(msg) = super::seccomp::install(policy.network, unix) {
        say!("{ERROR_PREFIX}{msg}");
        return EXIT_SETUP_FAILED;
    }
    let err = std::process::Command::new(&argv[0]).args(&argv[1..]).exec();
    say!(
        "{ERROR_PREFIX}cannot run {:?}: {err}",
        argv[0].to_string_lossy()
    );
    if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

fn set_rlimits(policy: &Policy) -> Result<(), String> {
    const GIB: u64 = 1024 * 1024 * 1024;
    // No deadline (an MCP server) means no CPU limit: a huge one would overflow the kernel's
    // nanosecond conversion and fire SIGXCPU at once.
    let cpu = match policy.deadline_from(Instant::now()) {
        None => nix::libc::RLIM_INFINITY,
        Some(_) => policy.timeout().as_secs().saturating_add(1),
    };
    let limits = [
        (Resource::RLIMIT_CPU, cpu, cpu.saturating_add(5)),
        (Resource::RLIMIT_FSIZE, GIB, GIB),
        (Resource::RLIMIT_NOFILE, 1024, 1024),
        (Resource::RLIMIT_CORE, 0, 0),
        (Resource::RLIMIT_AS, 16 * GIB, 16 * GIB),
    ];
    for (resource, soft, hard) in limits {
        setrlimit(resource, soft, hard)
            .map_err(|e| format!("cannot set {resource:?} to {soft}: {e}"))?;
    }
    Ok(())
}

/// Wait for the child until the deadline; on expiry kill the whole tree. Returns the
/// helper's exit status.
fn supervise(policy: &Policy, child: Pid, isolation: Isolation) -> Result<i32, String> {
    let Some(deadline) = policy.deadline_from(Instant::now()) else {
        // No deadline (an MCP server): block until the command ends.
        return wait_without_deadline(child, isolation);
    };
    loop {
        let finished = match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => Some(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => Some(128 + sig as i32),
            Ok(_) | Err(Errno::EINTR) => None,
            Err(e) => return Err(format!("waiting for the command failed: {e}")),
        };
        if let Some(code) = finished {
            if isolation == Isolation::Subreaper {
                kill_descendants();
            }
            return Ok(code);
        }
        if Instant::now() >= deadline {
            match isolation {
                // Killing the namespace's init makes the kernel kill every process in it.
                Isolation::Namespaces => {
                    let _ = kill(child, Signal::SIGKILL);
                    let _ = waitpid(child, None);
                }
                Isolation::Subreaper => kill_descendants(),
            }
            say!(
                "{ERROR_PREFIX}timed out after {} s; the whole process tree was killed",
                policy.timeout().as_secs_f64()
            );
            return Ok(EXIT_TIMED_OUT);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `supervise` without a deadline: wait for the child, then sweep what is left.
fn wait_without_deadline(child: Pid, isolation: Isolation) -> Result<i32, String> {
    loop {
        let code = match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, code)) => code,
            Ok(WaitStatus::Signaled(_, sig, _)) => 128 + sig as i32,
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(e) => return Err(format!("waiting for the command failed: {e}")),
        };
        if isolation == Isolation::Subreaper {
            kill_descendants();
        }
        return Ok(code);
    }
}

/// SIGKILL every (non-zombie) descendant of this process until none is left, reaping them.
/// Orphans — also `setsid` ones — are re-parented to us as the child subreaper.
pub fn kill_descendants() {
    for _ in 0..200 {
        let alive = descendants(getpid(), &process_table());
        for pid in &alive {
            let _ = kill(*pid, Signal::SIGKILL);
        }
        while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            if status == WaitStatus::StillAlive {
                break;
            }
        }
        if alive.is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `pid -> (parent pid, is zombie)` for every process in /proc.
fn process_table() -> HashMap<i32, (i32, bool)> {
    let mut table = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return table;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(entry.path().join("stat"))
            && let Some((ppid, zombie)) = parse_stat(&stat)
        {
            table.insert(pid, (ppid, zombie));
        }
    }
    table
}

/// Parent pid and zombie state from a `/proc/<pid>/stat` line (the command name may contain
/// spaces and parentheses, so parse after the last `)`).
fn parse_stat(stat: &str) -> Option<(i32, bool)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state == "Z" || state == "X"))
}

/// Live (non-zombie) descendants of `root` in `table`.
fn descendants(root: Pid, table: &HashMap<i32, (i32, bool)>) -> Vec<Pid> {
    let mut out = Vec::new();
    let mut frontier = vec![root.as_raw()];
    while let Some(parent) = frontier.pop() {
        for (&pid, &(ppid, zombie)) in table {
            if ppid == parent && pid != root.as_raw() {
                frontier.push(pid);
                if !zombie {
                    out.push(Pid::from_raw(pid));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_after_the_last_paren() {
        assert_eq!(parse_stat("12 (sh) S 7 12 12 0"), Some((7, false)));
        assert_eq!(parse_stat("12 (a) b) (c) Z 3 1"), Some((3, true)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) R notanumber"), None);
    }

    #[test]
    fn descendants_walk_the_tree_and_skip_zombies() {
        let table: HashMap<i32, (i32, bool)> = [
            (10, (1, false)),
            (11, (10, false)),
            (12, (11, true)),
            (13, (12, false)),
            (20, (1, false)),
        ]
        .into_iter()
        .collect();
        let mut got: Vec<i32> = descendants(Pid::from_raw(10), &table)
            .into_iter()
            .map(Pid::as_raw)
            .collect();
        got.sort();
        assert_eq!(got, [11, 13]);
    }

    #[test]
    fn bad_policy_json_is_a_setup_failure() {
        assert_eq!(helper_main("{", &["true".into()]), EXIT_SETUP_FAILED);
        assert_eq!(helper_main("{}", &["true".into()]), EXIT_SETUP_FAILED);
    }
}
