//! Exponential backoff with "equal jitter" between attempts: half the delay is fixed, half
//! random. The fixed half is what lets `RETRY_COUNT` promise a minimum outage ridden out
//! (README); full jitter (`[0, d]`) would not.

use std::time::Duration;

/// Delay before attempt `attempt + 1` (attempt counts from 1): uniformly random in
/// `[d/2, d]` with `d = base * 2^(attempt-1)`, capped at `max`.
pub fn backoff(attempt: u32, base: Duration, max: Duration) -> Duration {
    let exp = base
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
        .min(max);
    let half = exp / 2;
    half + half.mul_f64(fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_stays_within_bounds() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(1);
        for attempt in 1..10 {
            let d = backoff(attempt, base, max);
            let full = (base * 2u32.pow(attempt - 1)).min(max);
            assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d:?}");
        }
    }
}
