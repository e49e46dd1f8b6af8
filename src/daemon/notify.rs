//! systemd readiness and watchdog notifications (SPEC §10.4): `READY=1`, `STATUS=`,
//! `WATCHDOG=1`, `RELOADING=1`, `STOPPING=1`.
//!
//! A thin layer over the `sd-notify` crate: the crate formats the assignments
//! ([`NotifyState`]) and reads `WATCHDOG_USEC`/`WATCHDOG_PID`; this module reads
//! `NOTIFY_SOCKET` once, at [`Notifier::from_env`], and sends the datagrams itself. That keeps
//! the target explicit (tests point a [`Notifier`] at their own socket instead of changing the
//! process environment), supports abstract sockets (`@name`), which `sd_notify::notify` does
//! not, and never blocks: the socket is non-blocking and a full queue drops the message.
//!
//! Outside systemd (`NOTIFY_SOCKET` unset) every call is a no-op. Errors are logged at debug
//! level and never fatal: a daemon must not stop because its supervisor is not listening.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::time::Duration;

use sd_notify::NotifyState;

/// Where notifications go: a socket path, or a name in the abstract namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Path(PathBuf),
    Abstract(Vec<u8>),
}

impl Target {
    /// Parse `NOTIFY_SOCKET` as systemd does: an absolute path, or `@name` for an abstract
    /// socket. Anything else (empty, relative, `vsock:` of newer managers) is unsupported.
    fn parse(value: &OsStr) -> Option<Target> {
        let bytes = value.as_bytes();
        match bytes.first() {
            Some(b'/') => Some(Target::Path(PathBuf::from(value))),
            Some(b'@') if bytes.len() > 1 => Some(Target::Abstract(bytes[1..].to_vec())),
            _ => None,
        }
    }

    fn send(&self, msg: &[u8]) -> io::Result<()> {
        let sock = UnixDatagram::unbound()?;
        // A full receive queue must not stall the caller (it may be a tokio worker).
        sock.set_nonblocking(true)?;
        let sent = match self {
            Target::Path(p) => sock.send_to(msg, p)?,
            Target::Abstract(name) => {
                sock.send_to_addr(msg, &SocketAddr::from_abstract_name(name)?)?
            }
        };
        if sent == msg.len() {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "incomplete datagram",
            ))
        }
    }
}

/// Sends service-manager notifications; a no-op outside systemd.
#[derive(Debug, Clone)]
pub struct Notifier {
    target: Option<Target>,
    /// `WatchdogSec=` of the unit, when the watchdog is on for this process.
    watchdog: Option<Duration>,
}

impl Notifier {
    /// Read `NOTIFY_SOCKET`, and `WATCHDOG_USEC`/`WATCHDOG_PID` through
    /// `sd_notify::watchdog_enabled`. Call once at start-up; later changes to the environment
    /// are not seen.
    pub fn from_env() -> Notifier {
        Notifier::from_parts(
            std::env::var_os("NOTIFY_SOCKET"),
            sd_notify::watchdog_enabled(),
        )
    }

    /// A notifier that sends nothing (not under systemd).
    pub fn disabled() -> Notifier {
        Notifier {
            target: None,
            watchdog: None,
        }
    }

    /// A notifier for an explicit socket: `/path` or `@abstract-name`, as in `NOTIFY_SOCKET`.
    /// `watchdog` is the unit's `WatchdogSec=`. Used by tests with a fake socket.
    pub fn with_socket(socket: impl Into<OsString>, watchdog: Option<Duration>) -> Notifier {
        Notifier::from_parts(Some(socket.into()), watchdog)
    }

    fn from_parts(socket: Option<OsString>, watchdog: Option<Duration>) -> Notifier {
        let target = socket.as_deref().and_then(|s| {
            let t = Target::parse(s);
            if t.is_none() && !s.is_empty() {
                tracing::debug!(
                    notify_socket = %s.to_string_lossy(),
                    "NOTIFY_SOCKET is neither an absolute path nor @abstract; not notifying"
                );
            }
            t
        });
        // Without a socket there is nobody to ping; a zero interval means "off".
        let watchdog = watchdog.filter(|d| target.is_some() && !d.is_zero());
        Notifier { target, watchdog }
    }

    /// Whether notifications go anywhere (a usable `NOTIFY_SOCKET` was set).
    pub fn is_enabled(&self) -> bool {
        self.target.is_some()
    }

    /// `READY=1` with a status line: start-up is complete (state dir, databases, FIFO and
    /// listeners are up).
    pub fn ready(&self, status: &str) {
        let status = one_line(status);
        self.send(&[NotifyState::Ready, NotifyState::Status(&status)]);
    }

    /// `READY=1` again after a reload ([`Notifier::reloading`]).
    pub fn ready_again(&self, status: &str) {
        self.ready(status);
    }

    /// `STATUS=`: a one-line, human-readable state shown by `systemctl status`.
    pub fn status(&self, status: &str) {
        let status = one_line(status);
        self.send(&[NotifyState::Status(&status)]);
    }

    /// How often to call [`Notifier::watchdog`]: half of `WatchdogSec=`, as sd_watchdog_enabled(3)
    /// recommends. `None` when the watchdog is off.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog.map(|d| d / 2)
    }

    /// `WATCHDOG=1`. Call it from the main loop after it has checked that the daemon is making
    /// progress, never from an independent timer: a wedged daemon must stop pinging.
    pub fn watchdog(&self) {
        if self.watchdog.is_some() {
            self.send(&[NotifyState::Watchdog]);
        }
    }

    /// `EXTEND_TIMEOUT_USEC=`: ask for more time during a long start-up or stop step (e.g.
    /// recovering many unfinished messages), so `TimeoutStartSec=` does not kill the daemon.
    pub fn extend_timeout(&self, by: Duration) {
        let usec = u32::try_from(by.as_micros()).unwrap_or(u32::MAX);
        self.send(&[NotifyState::ExtendTimeoutUsec(usec)]);
    }

    /// `RELOADING=1` with `MONOTONIC_USEC=` (required by systemd ≥ 253 for
    /// `Type=notify-reload`, harmless before) and a status line. Follow with
    /// [`Notifier::ready_again`] when the reload is done.
    pub fn reloading(&self, status: &str) {
        if self.target.is_none() {
            return;
        }
        let status = one_line(status);
        match NotifyState::monotonic_usec_now() {
            Ok(now) => self.send(&[NotifyState::Reloading, now, NotifyState::Status(&status)]),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read CLOCK_MONOTONIC for RELOADING=1");
                self.send(&[NotifyState::Reloading, NotifyState::Status(&status)]);
            }
        }
    }

    /// `STOPPING=1` with a status line: shutdown has begun.
    pub fn stopping(&self, status: &str) {
        let status = one_line(status);
        self.send(&[NotifyState::Stopping, NotifyState::Status(&status)]);
    }

    fn send(&self, states: &[NotifyState<'_>]) {
        let Some(target) = &self.target else {
            return;
        };
        let msg: String = states.iter().map(|s| format!("{s}\n")).collect();
        if let Err(e) = target.send(msg.as_bytes()) {
            tracing::debug!(error = %e, message = %msg.trim_end(), "sd_notify message not delivered");
        }
    }
}

/// A status must stay one assignment: a newline would start another (`READY=1`, `MAINPID=`…).
fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    /// A fake `NOTIFY_SOCKET`: a datagram socket bound in a temp dir.
    fn fake_socket() -> (tempfile::TempDir, UnixDatagram, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind notify socket");
        sock.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("read timeout");
        (dir, sock, path)
    }

    fn recv(sock: &UnixDatagram) -> String {
        let mut buf = [0u8; 4096];
        let n = sock.recv(&mut buf).expect("a notification datagram");
        String::from_utf8(buf[..n].to_vec()).expect("utf-8 datagram")
    }

    fn nothing_pending(sock: &UnixDatagram) -> bool {
        sock.set_nonblocking(true).expect("nonblocking");
        let mut buf = [0u8; 64];
        let r = sock.recv(&mut buf);
        sock.set_nonblocking(false).expect("blocking");
        matches!(r, Err(ref e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    #[test]
    fn sends_each_notification_as_one_datagram() {
        let (_dir, sock, path) = fake_socket();
        let n = Notifier::with_socket(&path, Some(Duration::from_secs(60)));
        assert!(n.is_enabled());

        n.ready("ready: 1 model");
        assert_eq!(recv(&sock), "READY=1\nSTATUS=ready: 1 model\n");
        n.status("telegram: reconnecting");
        assert_eq!(recv(&sock), "STATUS=telegram: reconnecting\n");
        n.watchdog();
        assert_eq!(recv(&sock), "WATCHDOG=1\n");
        n.extend_timeout(Duration::from_secs(30));
        assert_eq!(recv(&sock), "EXTEND_TIMEOUT_USEC=30000000\n");
        n.stopping("stopping: 2 messages in flight");
        assert_eq!(
            recv(&sock),
            "STOPPING=1\nSTATUS=stopping: 2 messages in flight\n"
        );
        assert!(nothing_pending(&sock));
    }

    #[test]
    fn reloading_carries_a_monotonic_timestamp_then_ready_again() {
        let (_dir, sock, path) = fake_socket();
        let n = Notifier::with_socket(&path, None);
        n.reloading("reloading workspace");
        let msg = recv(&sock);
        let lines: Vec<&str> = msg.lines().collect();
        assert_eq!(lines.len(), 3, "{msg:?}");
        assert_eq!(lines[0], "RELOADING=1");
        let usec: u64 = lines[1]
            .strip_prefix("MONOTONIC_USEC=")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("MONOTONIC_USEC line: {msg:?}"));
        assert!(usec > 0);
        assert_eq!(lines[2], "STATUS=reloading workspace");
        n.ready_again("ready");
        assert_eq!(recv(&sock), "READY=1\nSTATUS=ready\n");
    }

    #[test]
    fn a_status_cannot_inject_other_assignments() {
        let (_dir, sock, path) = fake_socket();
        let n = Notifier::with_socket(&path, None);
        n.status("bad\nREADY=1\rMAINPID=1");
        assert_eq!(recv(&sock), "STATUS=bad READY=1 MAINPID=1\n");
    }

    #[test]
    fn watchdog_interval_is_half_of_watchdog_sec_and_off_without_it() {
        let (_dir, sock, path) = fake_socket();
        let on = Notifier::with_socket(&path, Some(Duration::from_secs(60)));
        assert_eq!(on.watchdog_interval(), Some(Duration::from_secs(30)));

        let off = Notifier::with_socket(&path, None);
        assert_eq!(off.watchdog_interval(), None);
        off.watchdog(); // no WATCHDOG=1 when the unit has no WatchdogSec=
        assert!(nothing_pending(&sock));

        let zero = Notifier::with_socket(&path, Some(Duration::ZERO));
        assert_eq!(zero.watchdog_interval(), None);

        // A watchdog without a socket is useless: nobody would hear the pings.
        let no_socket = Notifier::from_parts(None, Some(Duration::from_secs(60)));
        assert_eq!(no_socket.watchdog_interval(), None);
    }

    #[test]
    fn abstract_sockets_are_supported() {
        let name = format!("agentd-test-notify-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract name");
        let sock = UnixDatagram::bind_addr(&addr).expect("bind abstract socket");
        sock.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("read timeout");
        let n = Notifier::with_socket(format!("@{name}"), None);
        n.ready("ok");
        assert_eq!(recv(&sock), "READY=1\nSTATUS=ok\n");
    }

    #[test]
    fn unusable_sockets_are_ignored_without_error() {
        for value in ["", "relative/path", "@", "vsock:2:1234"] {
            let n = Notifier::with_socket(value, Some(Duration::from_secs(10)));
            assert!(!n.is_enabled(), "{value:?}");
            assert_eq!(n.watchdog_interval(), None, "{value:?}");
            n.ready("x");
        }
        assert_eq!(
            Target::parse(OsStr::new("/run/systemd/notify")),
            Some(Target::Path(PathBuf::from("/run/systemd/notify")))
        );

        // A socket that does not exist (manager gone): logged, never a panic or an error.
        let dir = tempfile::tempdir().expect("tempdir");
        let n = Notifier::with_socket(dir.path().join("missing.sock"), None);
        assert!(n.is_enabled());
        n.ready("x");
        n.stopping("y");

        let d = Notifier::disabled();
        assert!(!d.is_enabled());
        d.ready("x");
        d.watchdog();
    }
}
