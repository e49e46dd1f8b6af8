//! The signals the daemon reacts to (SPEC §10.4), as an async stream:
//!
//! | Signal | Meaning |
//! |---|---|
//! | SIGTERM, SIGINT | graceful stop |
//! | SIGHUP | reload: rescan skills (workspace files are re-read per message anyway; `agentd.toml` and its `[[schedule]]` entries need a restart) |
//! | SIGUSR1 | rescan skills |
//!
//! Built on signal-hook-tokio. Like all Unix signals, several deliveries of the same signal
//! before [`Signals::next`] is polled merge into one, and signals pending together are not
//! returned in arrival order.

use std::io;

use futures::StreamExt;
use signal_hook::consts::signal::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use signal_hook_tokio::Handle;

/// A signal the daemon handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// SIGTERM: graceful stop (systemd's stop signal).
    Terminate,
    /// SIGINT: graceful stop (Ctrl-C).
    Interrupt,
    /// SIGHUP: reload (skills are rescanned; `agentd.toml` is not re-read).
    Hangup,
    /// SIGUSR1: rescan skills.
    User1,
}

impl Signal {
    /// Every handled signal, in the order listed in SPEC §10.4.
    pub const ALL: [Signal; 4] = [
        Signal::Terminate,
        Signal::Interrupt,
        Signal::Hangup,
        Signal::User1,
    ];

    /// The conventional name, e.g. `"SIGTERM"`.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Terminate => "SIGTERM",
            Signal::Interrupt => "SIGINT",
            Signal::Hangup => "SIGHUP",
            Signal::User1 => "SIGUSR1",
        }
    }

    /// Whether the signal asks the daemon to stop.
    pub fn is_shutdown(self) -> bool {
        matches!(self, Signal::Terminate | Signal::Interrupt)
    }

    /// The signal number.
    pub fn number(self) -> i32 {
        match self {
            Signal::Terminate => SIGTERM,
            Signal::Interrupt => SIGINT,
            Signal::Hangup => SIGHUP,
            Signal::User1 => SIGUSR1,
        }
    }

    fn from_number(n: i32) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.number() == n)
    }
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The installed handlers and the stream of arriving signals.
///
/// From [`Signals::install`] on, SIGTERM, SIGINT, SIGHUP and SIGUSR1 no longer have their
/// default action (terminate): they are only reported here. That stays so after
/// [`Signals::close`] and drop, so install once, early, and keep it for the daemon's life.
pub struct Signals {
    stream: signal_hook_tokio::Signals,
    handle: Handle,
}

impl Signals {
    /// Install handlers for SIGTERM, SIGINT, SIGHUP and SIGUSR1. Must run inside a Tokio
    /// runtime (the stream is driven by its reactor); outside one it returns an error.
    pub fn install() -> io::Result<Signals> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(io::Error::other(
                "signal handlers need a Tokio runtime; call Signals::install from async code",
            ));
        }
        let stream = signal_hook_tokio::Signals::new(Signal::ALL.map(Signal::number))?;
        let handle = stream.handle();
        Ok(Signals { stream, handle })
    }

    /// The next signal, or `None` once [`Signals::close`] was called. Cancel-safe: a signal
    /// is never lost when this future is dropped in a `select!`.
    pub async fn next(&mut self) -> Option<Signal> {
        loop {
            let n = self.stream.next().await?;
            match Signal::from_number(n) {
                Some(s) => return Some(s),
                // Only the signals above are registered; anything else is a bug upstream.
                None => tracing::debug!(signal = n, "ignoring an unexpected signal number"),
            }
        }
    }

    /// End the stream: a pending or later [`Signals::next`] returns `None`.
    pub fn close(&self) {
        self.handle.close();
    }

    /// A handle that can close the stream from another task.
    pub fn closer(&self) -> SignalsCloser {
        SignalsCloser(self.handle.clone())
    }
}

/// Closes a [`Signals`] stream from elsewhere (see [`Signals::closer`]).
#[derive(Clone)]
pub struct SignalsCloser(Handle);

impl SignalsCloser {
    /// Same as [`Signals::close`].
    pub fn close(&self) {
        self.0.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use nix::sys::signal::{Signal as NixSignal, raise};

    async fn next_within(signals: &mut Signals, secs: u64) -> Option<Signal> {
        tokio::time::timeout(Duration::from_secs(secs), signals.next())
            .await
            .expect("a signal within the timeout")
    }

    // The only test that raises signals in this process: SIGHUP and SIGUSR1 would terminate
    // the test binary if nothing handled them, so they are raised only while `Signals` lives.
    #[tokio::test]
    async fn raised_signals_arrive_in_order_and_close_ends_the_stream() {
        let mut signals = Signals::install().expect("install handlers");

        raise(NixSignal::SIGUSR1).expect("raise SIGUSR1");
        assert_eq!(next_within(&mut signals, 5).await, Some(Signal::User1));
        raise(NixSignal::SIGHUP).expect("raise SIGHUP");
        assert_eq!(next_within(&mut signals, 5).await, Some(Signal::Hangup));

        // Nothing else is pending.
        assert!(
            tokio::time::timeout(Duration::from_millis(100), signals.next())
                .await
                .is_err()
        );

        // Closing from another task ends a waiting `next`.
        let closer = signals.closer();
        let waiter = tokio::spawn(async move { signals.next().await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        closer.close();
        let ended = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("next returns after close")
            .expect("task");
        assert_eq!(ended, None);
    }

    #[test]
    fn install_outside_a_runtime_is_an_error_not_a_panic() {
        let err = match Signals::install() {
            Err(e) => e,
            Ok(_) => panic!("install succeeded outside a runtime"),
        };
        assert!(err.to_string().contains("Tokio runtime"), "{err}");
    }

    #[test]
    fn names_numbers_and_shutdown_classes() {
        for s in Signal::ALL {
            assert_eq!(Signal::from_number(s.number()), Some(s));
            assert_eq!(s.to_string(), s.name());
        }
        assert_eq!(Signal::Terminate.number(), NixSignal::SIGTERM as i32);
        assert!(Signal::Terminate.is_shutdown());
        assert!(Signal::Interrupt.is_shutdown());
        assert!(!Signal::Hangup.is_shutdown());
        assert!(!Signal::User1.is_shutdown());
        assert_eq!(Signal::from_number(NixSignal::SIGUSR2 as i32), None);
    }
}
