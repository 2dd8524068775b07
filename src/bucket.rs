//! A token bucket: a rate with a burst, for work a client may cause.

use std::time::Instant;

/// Up to `burst` units at once, refilled at `rate` units per second.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    /// Units available now.
    tokens: f64,
    /// When `tokens` was last refilled.
    refilled: Instant,
    /// Units per second.
    rate: u32,
    /// Most units held at once (the bucket starts full).
    burst: u32,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(rate: u32, burst: u32) -> Self {
        Self::new_at(rate, burst, Instant::now())
    }

    /// A full bucket as of `now`.
    pub fn new_at(rate: u32, burst: u32, now: Instant) -> Self {
        Self {
            tokens: f64::from(burst),
            refilled: now,
            rate,
            burst,
        }
    }

    /// Units per second.
    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// Takes `n` units if all are there; otherwise takes none and returns
    /// how long until they will be.
    pub fn take(&mut self, n: u32) -> Result<(), std::time::Duration> {
        self.take_at(n, Instant::now())
    }

    /// [`Self::take`] as of `now`.
    pub fn take_at(&mut self, n: u32, now: Instant) -> Result<(), std::time::Duration> {
        let (rate, burst) = (f64::from(self.rate), f64::from(self.burst));
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        let n = f64::from(n);
        if self.tokens >= n {
            self.tokens -= n;
            return Ok(());
        }
        let wait = if n > burst {
            f64::INFINITY
        } else {
            (n - self.tokens) / rate
        };
        Err(std::time::Duration::try_from_secs_f64(wait).unwrap_or(std::time::Duration::MAX))
    }
}

impl TokenBucket {
    /// How long until `n` units would be there as of `now` (zero: now).
    pub fn wait_at(&self, n: u32, now: Instant) -> std::time::Duration {
        let mut probe = self.clone();
        probe.take_at(n, now).err().unwrap_or_default()
    }

    /// Takes `n` units as of `now` even when they are not all there: the
    /// bucket goes below zero and the next takes wait until it refills. For
    /// work whose cost is known only once it is done.
    pub fn debit_at(&mut self, n: u32, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens = (self.tokens + elapsed * f64::from(self.rate)).min(f64::from(self.burst));
        self.tokens -= f64::from(n);
    }

    /// True when the bucket has refilled to its burst by `now` (it then
    /// holds nothing a fresh bucket would not).
    pub fn full_at(&self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens + elapsed * f64::from(self.rate) >= f64::from(self.burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_a_burst_then_refuses() {
        let mut b = TokenBucket::new(10, 100);
        assert!(b.take(100).is_ok());
        let wait = b.take(50).unwrap_err();
        assert!(wait.as_secs_f64() > 4.0, "{wait:?}");
        assert!(b.take(101).is_err());
    }
}
