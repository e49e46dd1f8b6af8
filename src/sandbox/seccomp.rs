//! The seccomp filter the `sandbox-exec` helper installs right before it `exec`s the command
//! (issue 12 #1 and #6; the reasoning is in docs/security.md, "Sockets").
//!
//! Landlock (as far as the running kernel has it) cannot stop `connect()` to a pathname Unix
//! socket before `LANDLOCK_ACCESS_FS_RESOLVE_UNIX` (Landlock ABI 9), and a network namespace
//! does not isolate pathname sockets at all. seccomp cannot see a `connect()` path, but it can
//! refuse to create the socket in the first place, on every isolation path and under any unit.
//! The filter (default: allow) refuses, with `EPERM`:
//! - `socket(AF_UNIX, …)`, whatever the type flags, so no pathname or abstract socket outside
//!   can be reached, whatever `exec_network` says;
//! - `socketpair(AF_UNIX, SOCK_DGRAM | SOCK_RAW, …)`: a datagram pair can be re-aimed at any
//!   pathname datagram socket with `sendto()`/`connect()`. Stream and seqpacket pairs stay
//!   allowed (they are connected for good: `connect()` on them fails with `EISCONN`);
//!
//!   neither of these two for a command given Unix sockets (an MCP server's `unix_sockets`):
//!   it may create Unix sockets of every type, and Landlock is what narrows where they reach
//!   (`helper.rs`; on a kernel without `ResolveUnix` nothing does, which the daemon says);
//! - `io_uring_setup`/`_enter`/`_register`: io_uring creates sockets (`IORING_OP_SOCKET`)
//!   without the `socket` system call;
//! - `pidfd_getfd`: copying a socket out of another process;
//! - `mount`, `umount2`, `pivot_root` and the new mount API (`open_tree`, `move_mount`,
//!   `fsopen`, `fsconfig`, `fsmount`, `fspick`, `mount_setattr`): the mounts the helper made
//!   (private `/proc` and `/tmp`, the read-only files of the system prompt) cannot be undone,
//!   also without Landlock;
//! - when the network is off: `socket()` of every family but `AF_NETLINK` (so UDP and raw
//!   sockets too, also on the fallback path without a network namespace, where Landlock's
//!   network rules cover TCP only; issue 12 #6);
//! - any system call of a non-native ABI: seccompiler kills a process calling through another
//!   audit architecture (32-bit `int 0x80` on x86_64, where `socketcall` would bypass the
//!   `socket` rule), and an extra check refuses x32 calls (same audit architecture, numbers
//!   with bit 30 set).
//!
//! The filter is installed with `prctl(PR_SET_SECCOMP)`, not the `seccomp` system call: the
//! shipped systemd units' `SystemCallFilter=@system-service` does not contain `seccomp`, but it
//! does contain `prctl`.

use nix::libc;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

/// The errno every refused call fails with.
const REFUSED_ERRNO: u32 = libc::EPERM as u32;

/// Bits of `socket()`'s type argument that hold the type (the rest are `SOCK_NONBLOCK` and
/// `SOCK_CLOEXEC`); the kernel's `SOCK_TYPE_MASK`.
const SOCK_TYPE_MASK: u64 = 0xf;

/// Bit 30 of the system call number marks the x32 ABI on x86_64 (`__X32_SYSCALL_BIT`).
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Compile the filter for a command whose network is allowed (`network`) or not, and which
/// may create Unix sockets (`unix`) or not.
pub fn filter(network: bool, unix: bool) -> Result<BpfProgram, String> {
    let err = |e: seccompiler::BackendError| format!("cannot build the seccomp filter: {e}");
    let arg = |index: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(index, SeccompCmpArgLen::Dword, op, value).map_err(err)
    };
    let rule = |conditions: Vec<SeccompCondition>| SeccompRule::new(conditions).map_err(err);

    let af_unix = libc::AF_UNIX as u64;
    // An empty rule list would refuse the call whatever its arguments: a call with nothing to
    // refuse is left out instead.
    let mut rules = Vec::new();
    match (network, unix) {
        (true, true) => {}
        (true, false) => rules.push((
            libc::SYS_socket,
            vec![rule(vec![arg(0, SeccompCmpOp::Eq, af_unix)?])?],
        )),
        // Every family but netlink (interface queries; no traffic leaves through it), so UDP
        // and raw sockets where no network namespace isolates them, and AF_UNIX unless allowed.
        (false, _) => {
            let mut refused = vec![arg(0, SeccompCmpOp::Ne, libc::AF_NETLINK as u64)?];
            if unix {
                refused.push(arg(0, SeccompCmpOp::Ne, af_unix)?);
            }
            rules.push((libc::SYS_socket, vec![rule(refused)?]));
        }
    }
    if !unix {
        let mut socketpair_rules = Vec::new();
        for kind in [libc::SOCK_DGRAM, libc::SOCK_RAW] {
            socketpair_rules.push(rule(vec![
                arg(0, SeccompCmpOp::Eq, af_unix)?,
                arg(1, SeccompCmpOp::MaskedEq(SOCK_TYPE_MASK), kind as u64)?,
            ])?);
        }
        rules.push((libc::SYS_socketpair, socketpair_rules));
    }
    for always in [
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_pidfd_getfd,
        // The mount table the helper set up (private /proc and /tmp, the read-only prompt
        // files) stays as it is, also where Landlock is off (exec_sandbox = "none").
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_open_tree,
        libc::SYS_move_mount,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
    ] {
        rules.push((always, Vec::new()));
    }
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| {
        format!(
            "no seccomp filter for this architecture ({e}); the exec sandbox supports x86_64, \
             aarch64 and riscv64"
        )
    })?;
    let program: BpfProgram = SeccompFilter::new(
        rules.into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(REFUSED_ERRNO),
        arch,
    )
    .and_then(TryInto::try_into)
    .map_err(err)?;
    refuse_x32(program)
}

/// On x86_64, insert `if nr & X32_SYSCALL_BIT: refuse` right after seccompiler's architecture
/// check (x32 calls pass it: they share `AUDIT_ARCH_X86_64`). seccompiler's program starts with
/// `ld arch; jeq ARCH, +1, +0; ret KILL` and then loads the call number itself, so the three
/// instructions fit in between without moving any jump target.
#[cfg(target_arch = "x86_64")]
fn refuse_x32(mut program: BpfProgram) -> Result<BpfProgram, String> {
    const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
    const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    const ARCH_OFFSET: u32 = 4; // offsetof(struct seccomp_data, arch)
    let load_nr = sock_filter {
        code: LD_W_ABS,
        jt: 0,
        jf: 0,
        k: 0,
    };
    let layout_ok = program.len() > 3
        && program[0].code == LD_W_ABS
        && program[0].k == ARCH_OFFSET
        && (program[1].jt, program[1].jf) == (1, 0)
        && program[2].code == RET_K
        && program[3] == load_nr;
    if !layout_ok {
        return Err(
            "the seccomp filter does not have the expected layout (seccompiler \
                    changed?); cannot add the x32 check"
                .into(),
        );
    }
    let guard = [
        load_nr,
        sock_filter {
            code: JSET_K,
            jt: 0,
            jf: 1,
            k: X32_SYSCALL_BIT,
        },
        sock_filter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | REFUSED_ERRNO,
        },
    ];
    program.splice(3..3, guard);
    Ok(program)
}

#[cfg(not(target_arch = "x86_64"))]
fn refuse_x32(program: BpfProgram) -> Result<BpfProgram, String> {
    Ok(program)
}

/// Install the filter on the calling thread (the helper is single-threaded; the command
/// inherits it across `exec`). Sets `PR_SET_NO_NEW_PRIVS`, which an unprivileged filter needs.
pub fn install(network: bool, unix: bool) -> Result<(), String> {
    let program = filter(network, unix)?;
    install_program(&program)
}

fn install_program(program: &[sock_filter]) -> Result<(), String> {
    #[repr(C)]
    struct SockFprog {
        len: libc::c_ushort,
        filter: *const sock_filter,
    }
    let fprog = SockFprog {
        len: libc::c_ushort::try_from(program.len())
            .map_err(|_| "the seccomp filter is too long".to_string())?,
        filter: program.as_ptr(),
    };
    // SAFETY: plain prctl calls; the kernel copies the program (which outlives the call) and
    // does not keep the pointer.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(format!(
                "cannot set no_new_privs: {}",
                std::io::Error::last_os_error()
            ));
        }
        if libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &fprog as *const SockFprog,
        ) != 0
        {
            return Err(format!(
                "cannot install the seccomp filter that keeps the command away from Unix \
                 sockets: {} (the kernel needs CONFIG_SECCOMP_FILTER; a service manager must \
                 allow prctl)",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run `f` on a fresh thread (a filter binds only the thread that installs it and what it
    /// starts, so the test process stays unfiltered).
    fn on_filtered_thread<T: Send + 'static>(
        network: bool,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        on_thread_filtered_with(network, false, f)
    }

    /// [`on_filtered_thread`] for a command that may create Unix sockets (`unix`) or not.
    fn on_thread_filtered_with<T: Send + 'static>(
        network: bool,
        unix: bool,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        std::thread::spawn(move || {
            install(network, unix).unwrap();
            f()
        })
        .join()
        .unwrap()
    }

    /// `Ok(fd)` (closed again) or `Err(errno)`.
    fn socket(domain: i32, kind: i32) -> Result<(), i32> {
        // SAFETY: plain system calls on fds this function owns.
        let fd = unsafe { libc::socket(domain, kind, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
        }
        unsafe { libc::close(fd) };
        Ok(())
    }

    fn socketpair(kind: i32) -> Result<(), i32> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors, which are closed again.
        let rc = unsafe { libc::socketpair(libc::AF_UNIX, kind, 0, fds.as_mut_ptr()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
        }
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        Ok(())
    }

    fn raw_syscall(nr: i64) -> Result<(), i32> {
        // SAFETY: the calls made here take no pointer (zero arguments are invalid, not unsafe).
        let rc = unsafe { libc::syscall(nr, 0, 0, 0) };
        if rc < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
        }
        Ok(())
    }

    const EPERM: i32 = libc::EPERM;
    const FLAGS: i32 = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;

    #[test]
    fn unix_sockets_and_io_uring_are_refused_with_the_network_on() {
        let got = on_filtered_thread(true, || {
            [
                socket(libc::AF_UNIX, libc::SOCK_STREAM),
                socket(libc::AF_UNIX, libc::SOCK_DGRAM | FLAGS),
                socket(libc::AF_UNIX, libc::SOCK_SEQPACKET),
                socketpair(libc::SOCK_DGRAM),
                socketpair(libc::SOCK_RAW | FLAGS),
                raw_syscall(libc::SYS_io_uring_setup),
                raw_syscall(libc::SYS_pidfd_getfd),
            ]
        });
        assert_eq!(got, [Err(EPERM); 7]);
        let allowed = on_filtered_thread(true, || {
            [
                socket(libc::AF_INET, libc::SOCK_STREAM),
                socket(libc::AF_INET, libc::SOCK_DGRAM | FLAGS),
                socket(libc::AF_INET6, libc::SOCK_DGRAM),
                socket(libc::AF_NETLINK, libc::SOCK_RAW),
                socketpair(libc::SOCK_STREAM),
                socketpair(libc::SOCK_SEQPACKET | FLAGS),
            ]
        });
        assert_eq!(allowed, [Ok(()); 6]);
    }

    #[test]
    fn every_family_but_netlink_is_refused_with_the_network_off() {
        let got = on_filtered_thread(false, || {
            [
                socket(libc::AF_INET, libc::SOCK_STREAM),
                socket(libc::AF_INET, libc::SOCK_DGRAM | FLAGS),
                socket(libc::AF_INET6, libc::SOCK_DGRAM),
                socket(libc::AF_UNIX, libc::SOCK_STREAM),
                socket(libc::AF_PACKET, libc::SOCK_DGRAM),
                socket(libc::AF_VSOCK, libc::SOCK_STREAM),
            ]
        });
        assert_eq!(got, [Err(EPERM); 6]);
        let allowed = on_filtered_thread(false, || {
            [
                socket(libc::AF_NETLINK, libc::SOCK_RAW),
                socketpair(libc::SOCK_STREAM),
            ]
        });
        assert_eq!(allowed, [Ok(()); 2]);
    }

    /// A command given Unix sockets (an MCP server's `unix_sockets`) may create them, of every
    /// type and as datagram pairs, with the network on or off; everything else stays as it was.
    #[test]
    fn unix_sockets_are_allowed_when_the_command_is_given_some() {
        for network in [true, false] {
            let got = on_thread_filtered_with(network, true, || {
                [
                    socket(libc::AF_UNIX, libc::SOCK_STREAM),
                    socket(libc::AF_UNIX, libc::SOCK_DGRAM | FLAGS),
                    socket(libc::AF_UNIX, libc::SOCK_SEQPACKET),
                    socketpair(libc::SOCK_DGRAM),
                    socket(libc::AF_NETLINK, libc::SOCK_RAW),
                ]
            });
            assert_eq!(got, [Ok(()); 5], "network {network}");
            let refused = on_thread_filtered_with(network, true, || {
                [
                    raw_syscall(libc::SYS_io_uring_setup),
                    raw_syscall(libc::SYS_pidfd_getfd),
                    raw_syscall(libc::SYS_umount2),
                ]
            });
            assert_eq!(refused, [Err(EPERM); 3], "network {network}");
        }
        let off = on_thread_filtered_with(false, true, || {
            [
                socket(libc::AF_INET, libc::SOCK_STREAM),
                socket(libc::AF_INET6, libc::SOCK_DGRAM),
                socket(libc::AF_PACKET, libc::SOCK_DGRAM),
            ]
        });
        assert_eq!(off, [Err(EPERM); 3]);
        let on = on_thread_filtered_with(true, true, || socket(libc::AF_INET, libc::SOCK_STREAM));
        assert_eq!(on, Ok(()));
    }

    /// x32 calls carry the native audit architecture; without the extra check
    /// `socket | X32_SYSCALL_BIT` would pass the `socket` rule untouched.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x32_system_calls_are_refused() {
        let x32 = |nr: i64| nr | i64::from(X32_SYSCALL_BIT);
        let got = on_filtered_thread(true, move || {
            [
                raw_syscall(x32(libc::SYS_getpid)),
                raw_syscall(x32(libc::SYS_socket)),
            ]
        });
        assert_eq!(got, [Err(EPERM); 2]);
        // Unfiltered, the kernel answers on its own (a pid, or ENOSYS without x32 support).
        let plain = std::thread::spawn(move || raw_syscall(x32(libc::SYS_getpid)))
            .join()
            .unwrap();
        assert_ne!(plain, Err(EPERM));
    }

    /// A 32-bit call (`int 0x80`, where `socketcall` would reach `socket` under another
    /// number) kills the process with SIGSYS. Runs in a forked child, which only makes system
    /// calls after the fork (the program is built before it).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_32_bit_system_call_kills_the_process() {
        use nix::sys::signal::Signal;
        use nix::sys::wait::{WaitStatus, waitpid};
        use nix::unistd::{ForkResult, fork};

        /// i386 `getpid` (20) through the 32-bit entry point; exits 0 when it returned.
        fn child(program: Option<&[sock_filter]>) -> ! {
            if let Some(program) = program
                && install_program(program).is_err()
            {
                unsafe { libc::_exit(3) }
            }
            let ret: i64;
            // SAFETY: `int 0x80` with eax = 20 (getpid) touches no memory.
            unsafe {
                std::arch::asm!("int 0x80", inlateout("rax") 20i64 => ret, options(nostack));
            }
            unsafe { libc::_exit(if ret > 0 { 0 } else { 4 }) }
        }
        let run = |program: Option<&[sock_filter]>| {
            // SAFETY: the child makes system calls only (no allocation, no locks) and exits.
            match unsafe { fork() }.unwrap() {
                ForkResult::Child => child(program),
                ForkResult::Parent { child } => waitpid(child, None).unwrap(),
            }
        };
        let program = filter(true, false).unwrap();
        let control = run(None);
        if !matches!(control, WaitStatus::Exited(_, 0)) {
            eprintln!("no 32-bit entry point on this kernel ({control:?}); nothing to check");
            return;
        }
        assert!(
            matches!(
                run(Some(&program)),
                WaitStatus::Signaled(_, Signal::SIGSYS, _)
            ),
            "a 32-bit call must kill the process"
        );
    }

    /// Under the shipped units `seccomp()` itself fails with EPERM
    /// (`SystemCallFilter=@system-service` lacks it); the filter still goes in via prctl.
    #[test]
    fn installs_when_the_seccomp_system_call_is_filtered() {
        let got = std::thread::spawn(|| {
            let unit_like: BpfProgram = SeccompFilter::new(
                [(libc::SYS_seccomp, Vec::new())].into_iter().collect(),
                SeccompAction::Allow,
                SeccompAction::Errno(libc::EPERM as u32),
                TargetArch::try_from(std::env::consts::ARCH).unwrap(),
            )
            .unwrap()
            .try_into()
            .unwrap();
            seccompiler::apply_filter(&unit_like).unwrap();
            assert!(seccompiler::apply_filter(&unit_like).is_err());
            install(true, false).unwrap();
            socket(libc::AF_UNIX, libc::SOCK_STREAM)
        })
        .join()
        .unwrap();
        assert_eq!(got, Err(EPERM));
    }
}
