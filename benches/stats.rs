//! Percentiles and formatting.

use std::time::Duration;

/// Nearest-rank percentile of sorted values (`p` in 0..=100).
pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

/// "min a / p50 b / p90 c / p99 d / max e ms (n)".
pub fn summary(values: &mut [Duration]) -> String {
    values.sort();
    if values.is_empty() {
        return "no samples".into();
    }
    format!(
        "min {} / p50 {} / p90 {} / p99 {} / max {} ms (n = {})",
        ms(values[0]),
        ms(pct(values, 50.0)),
        ms(pct(values, 90.0)),
        ms(pct(values, 99.0)),
        ms(*values.last().expect("not empty")),
        values.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(pct(&v, 50.0), Duration::from_millis(50));
        assert_eq!(pct(&v, 99.0), Duration::from_millis(99));
        assert_eq!(pct(&v, 100.0), Duration::from_millis(100));
        assert_eq!(pct(&v, 0.0), Duration::from_millis(1));
    }
}
