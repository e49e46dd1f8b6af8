//! Backoff between retries of one model: jittered exponential, honouring `Retry-After`,
//! every wait capped. Pure, so the policy is tested without sleeping.

use std::time::Duration;

/// No single wait is longer than this, whatever the server asks for.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// The wait before retry number `attempt` (1 for the first retry).
///
/// Without a server hint it is `base · 2^(attempt−1)` scaled by a factor in `[0.5, 1.0]`
/// chosen by `jitter` (a number in `[0, 1]`, random in production) so that clients failing
/// together do not retry together. A `Retry-After` hint is used as given. Both are capped at
/// `MAX_WAIT`.
pub fn backoff_delay(
    base: Duration,
    attempt: u32,
    retry_after: Option<Duration>,
    jitter: f64,
) -> Duration {
    if let Some(hint) = retry_after {
        return hint.min(MAX_WAIT);
    }
    let factor = 2u32.saturating_pow(attempt.saturating_sub(1));
    let exponential = base.saturating_mul(factor).min(MAX_WAIT);
    let jitter = if jitter.is_finite() {
        jitter.clamp(0.0, 1.0)
    } else {
        1.0
    };
    exponential.mul_f64(0.5 + 0.5 * jitter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn exponential_growth_with_jitter_bounds() {
        let base = Duration::from_secs(1);
        assert_eq!(backoff_delay(base, 1, None, 1.0), Duration::from_secs(1));
        assert_eq!(backoff_delay(base, 2, None, 1.0), Duration::from_secs(2));
        assert_eq!(backoff_delay(base, 3, None, 1.0), Duration::from_secs(4));
        assert_eq!(backoff_delay(base, 3, None, 0.0), Duration::from_secs(2));
        assert_eq!(backoff_delay(base, 40, None, 1.0), MAX_WAIT);
    }

    #[test]
    fn retry_after_is_honoured_and_capped() {
        let base = Duration::from_secs(1);
        assert_eq!(
            backoff_delay(base, 1, Some(Duration::ZERO), 0.7),
            Duration::ZERO
        );
        assert_eq!(
            backoff_delay(base, 1, Some(Duration::from_secs(9)), 0.7),
            Duration::from_secs(9)
        );
        assert_eq!(
            backoff_delay(base, 1, Some(Duration::from_secs(3600)), 0.7),
            MAX_WAIT
        );
    }

    proptest! {
        #[test]
        fn never_above_cap(base_ms in 0u64..100_000, attempt in 0u32..100, jitter in any::<f64>()) {
            let d = backoff_delay(Duration::from_millis(base_ms), attempt, None, jitter);
            prop_assert!(d <= MAX_WAIT);
        }
    }
}
