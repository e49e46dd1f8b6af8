//! The one retry policy of the daemon: how long to wait before the next attempt of anything
//! that failed (a provider call, a Telegram poll, a delivery, a webhook callback, an MCP server
//! restart, a trail write on a full disk). Every retry loop holds a [`Backoff`] instead of its
//! own formula, so jitter, the cap and a server's `Retry-After` are decided here only.
//!
//! Two shapes: exponential from a first delay, doubling up to a cap; or a fixed sequence of
//! steps (the MCP restart sequence of SPEC §9), the last repeated. Jitter is "equal jitter":
//! a wait is drawn from `[d/2, d]`, so clients failing together do not retry together and a
//! wait is never less than half the policy's. `Retry-After` is used as given, capped.

use std::time::Duration;

use rand::Rng;

/// How the waits grow.
#[derive(Debug, Clone, PartialEq)]
enum Shape {
    /// `first · 2^n`, capped at `max`.
    Exponential { first: Duration, max: Duration },
    /// The n-th step; the last one repeats.
    Steps(&'static [Duration]),
}

/// A retry loop's waits. `next_delay` after each failure, `reset` after a success.
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    shape: Shape,
    jitter: bool,
    /// A `Retry-After` is waited in full, not capped (a chat API's flood wait is a minimum).
    full_hint: bool,
    failures: u32,
}

impl Backoff {
    /// Waits of `first`, `2·first`, `4·first`, … never above `max`, jittered.
    pub fn exponential(first: Duration, max: Duration) -> Backoff {
        Backoff {
            shape: Shape::Exponential {
                first,
                max: max.max(first),
            },
            jitter: true,
            full_hint: false,
            failures: 0,
        }
    }

    /// Waits of `steps[0]`, `steps[1]`, …, then the last step again; not jittered (a fixed
    /// sequence is a contract, e.g. SPEC §9's restart sequence). An empty list waits zero.
    pub const fn steps(steps: &'static [Duration]) -> Backoff {
        Backoff {
            shape: Shape::Steps(steps),
            jitter: false,
            full_hint: false,
            failures: 0,
        }
    }

    /// The same policy without jitter (waits exactly as the shape says).
    pub fn exact(mut self) -> Backoff {
        self.jitter = false;
        self
    }

    /// The same policy waiting a `Retry-After` in full, however long: for a peer that refuses
    /// any earlier attempt (Telegram's flood wait); the caller bounds the total wait.
    pub fn honouring_retry_after(mut self) -> Backoff {
        self.full_hint = true;
        self
    }

    /// The wait before the next attempt; counts one more failure.
    pub fn next_delay(&mut self) -> Duration {
        self.next_delay_after(None)
    }

    /// The wait before the next attempt when the peer asked for `retry_after` (its
    /// `Retry-After`): that, capped at the policy's largest wait unless
    /// [`Self::honouring_retry_after`]; else as [`Self::next_delay`].
    pub fn next_delay_after(&mut self, retry_after: Option<Duration>) -> Duration {
        let draw = if self.jitter {
            rand::rng().random::<f64>()
        } else {
            1.0
        };
        let d = self.delay(self.failures, retry_after, draw);
        self.failures = self.failures.saturating_add(1);
        d
    }

    /// Failures counted since the last [`Self::reset`].
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// After a success: the next failure waits the first delay again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// The largest wait this policy gives (and the cap of a `Retry-After`).
    pub fn cap(&self) -> Duration {
        match &self.shape {
            Shape::Exponential { max, .. } => *max,
            Shape::Steps(steps) => steps.iter().max().copied().unwrap_or_default(),
        }
    }

    /// The wait after `failures` earlier failures, `draw` in `[0, 1]` choosing within the
    /// jitter range (pure: the policy is tested without sleeping or randomness).
    fn delay(&self, failures: u32, retry_after: Option<Duration>, draw: f64) -> Duration {
        if let Some(hint) = retry_after {
            return if self.full_hint {
                hint
            } else {
                hint.min(self.cap())
            };
        }
        let full = match &self.shape {
            Shape::Exponential { first, max } => first
                .saturating_mul(2u32.saturating_pow(failures.min(31)))
                .min(*max),
            Shape::Steps(steps) => match steps.get(failures as usize).or(steps.last()) {
                Some(d) => *d,
                None => Duration::ZERO,
            },
        };
        if !self.jitter {
            return full;
        }
        let draw = if draw.is_finite() {
            draw.clamp(0.0, 1.0)
        } else {
            1.0
        };
        full.mul_f64(0.5 + 0.5 * draw)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn exponential_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::exponential(S(1), S(60)).exact();
        let waits: Vec<u64> = (0..8).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(b.failures(), 8);
        b.reset();
        assert_eq!(b.next_delay(), S(1));
    }

    #[test]
    fn steps_follow_the_sequence_then_repeat_the_last() {
        static SEQ: [Duration; 3] = [
            Duration::ZERO,
            Duration::from_secs(1),
            Duration::from_secs(5),
        ];
        let mut b = Backoff::steps(&SEQ);
        let waits: Vec<u64> = (0..5).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(waits, [0, 1, 5, 5, 5]);
        assert_eq!(Backoff::steps(&[]).next_delay(), Duration::ZERO);
    }

    #[test]
    fn retry_after_is_used_as_given_and_capped() {
        let mut b = Backoff::exponential(S(1), S(60));
        assert_eq!(b.next_delay_after(Some(S(9))), S(9));
        assert_eq!(b.next_delay_after(Some(S(3600))), S(60));
        assert_eq!(b.next_delay_after(Some(Duration::ZERO)), Duration::ZERO);
        let mut b = Backoff::exponential(S(1), S(60)).honouring_retry_after();
        assert_eq!(b.next_delay_after(Some(S(300))), S(300));
    }

    #[test]
    fn jitter_varies_the_wait() {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..20 {
            seen.insert(Backoff::exponential(S(8), S(60)).next_delay());
        }
        assert!(seen.len() > 1, "20 draws gave one value: no jitter");
    }

    proptest! {
        /// Any policy, any failure count, any draw: the wait lies in `[d/2, d]` of the
        /// unjittered wait `d`, never above the cap, and never shrinks as failures grow.
        #[test]
        fn jittered_waits_are_bounded_and_monotone(
            first_ms in 0u64..100_000,
            max_ms in 0u64..200_000,
            failures in 0u32..200,
            draw in any::<f64>(),
        ) {
            let b = Backoff::exponential(Duration::from_millis(first_ms), Duration::from_millis(max_ms));
            let exact = b.clone().exact();
            let full = exact.delay(failures, None, 0.0);
            let d = b.delay(failures, None, draw);
            prop_assert!(d <= full && d >= full / 2, "{d:?} outside [{:?}, {full:?}]", full / 2);
            prop_assert!(d <= b.cap());
            prop_assert!(exact.delay(failures + 1, None, 0.0) >= full);
        }

        /// A `Retry-After` hint of any size never makes a wait above the cap.
        #[test]
        fn retry_after_never_exceeds_the_cap(hint_s in 0u64..10_000_000, failures in 0u32..50) {
            let b = Backoff::exponential(S(1), S(60));
            prop_assert!(b.delay(failures, Some(S(hint_s)), 0.5) <= S(60));
        }
    }
}
