//! Time: the wall clock in epoch ms ([`now_ms`]), and noticing that this
//! process was frozen (SIGSTOP, a paused VM, a long stall): its periodic
//! timers then fire far later than due, and everything they measure
//! includes time in which the node could not hear anybody.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Now, in epoch ms (the unit of every timestamp in Redis and on the wire).
/// A clock set before 1970 reads as 0 rather than failing every caller.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The ticks of one periodic timer.
#[derive(Debug, Clone, Copy)]
pub struct Ticks {
    /// When the timer last fired.
    last: Instant,
    /// Its period.
    period: Duration,
}

impl Ticks {
    /// Ticks of a timer firing every `period`, starting now.
    pub fn new(period: Duration) -> Self {
        Self {
            last: Instant::now(),
            period,
        }
    }

    /// Records a tick; true when it came more than one period late, i.e.
    /// the node's clock jumped ahead of what it could observe.
    pub fn jumped(&mut self) -> bool {
        let now = Instant::now();
        let late = now.duration_since(self.last).saturating_sub(self.period);
        self.last = now;
        late > self.period
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_tick_is_a_jump() {
        let mut t = Ticks::new(Duration::from_millis(10));
        assert!(!t.jumped());
        std::thread::sleep(Duration::from_millis(40));
        assert!(t.jumped());
        assert!(!t.jumped());
    }
}
