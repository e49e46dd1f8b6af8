//! Issue #12 finding 2 (SPEC §16.9 "Processes"): the daemon's secrets are not readable by other
//! processes of its own uid. The daemon runs as uid 65534, as a real deployment runs under a
//! dedicated user (CI runs as root, which could read anything).

use std::process::Command;

use crate::daemon_e2e::{agentd_toml, provider_toml};
use crate::support::daemon::{TestDaemon, unprivileged_wrapper};
use crate::support::fake_llm::{FakeLlm, Wire};

/// A value that must never leave the daemon.
const ENV_SECRET: &str = "env-secret-5f1c0a77";

/// `program args…` run as uid/gid 65534 (the daemon's uid in these tests).
fn as_daemon_uid(program: &str, args: &[&str]) -> std::process::Output {
    let wrapper = unprivileged_wrapper();
    Command::new(&wrapper[0])
        .args(&wrapper[1..])
        .arg(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} through setpriv: {e}"))
}

/// The daemon is non-dumpable from the start: another process of the same uid cannot read its
/// environment (`/proc/<pid>/environ` belongs to root then), though it sees the process.
#[test]
fn same_uid_process_cannot_read_the_daemon_environ() {
    let fake = FakeLlm::spawn(Wire::Anthropic);
    let mut d = TestDaemon::new(
        &agentd_toml("fake"),
        &[("fake", &provider_toml("anthropic", &fake.base_url()))],
    );
    d.as_unprivileged_user();
    d.set_env("AGENTD_TEST_SECRET", ENV_SECRET);
    d.start();
    let pid = d.pid().expect("the daemon runs").to_string();

    // The probe is really a process of the daemon's uid: it can read the daemon's status.
    let status = as_daemon_uid("/bin/cat", &[&format!("/proc/{pid}/status")]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{status:?}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("65534")),
        "the daemon runs as uid 65534: {text}"
    );

    let environ = as_daemon_uid("/bin/cat", &[&format!("/proc/{pid}/environ")]);
    let out = String::from_utf8_lossy(&environ.stdout);
    let err = String::from_utf8_lossy(&environ.stderr);
    assert!(
        !out.contains(ENV_SECRET),
        "a same-uid process read the daemon's environment: {out:?}"
    );
    assert!(
        !environ.status.success() && err.contains("Permission denied"),
        "reading /proc/{pid}/environ must be refused: {environ:?}"
    );
    // Nor may it attach to the daemon's memory.
    let mem = as_daemon_uid(
        "/bin/sh",
        &["-c", &format!("head -c 1 /proc/{pid}/mem >/dev/null")],
    );
    assert!(!mem.status.success(), "{mem:?}");
    d.sigterm();
}
