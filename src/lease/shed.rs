//! How long a shed session is asked to wait before it comes back.
//!
//! A node sheds a new session when it has its most sessions setting up
//! (the claimer's gate), and the `1013` close names a wait
//! (`retry_after_ms`) that the clients honour, plus as much again at random.
//! A fixed wait is wrong in a big storm: 3,000 devices waiting for a node
//! that lets in 35 a second come back 2,000 times a second with a 1 s wait,
//! and each of those attempts is a TCP and WebSocket handshake that the
//! node, already the bottleneck, pays for and then refuses. (In
//! `presence-bench storm` at 100,000 devices that was 4,000 refused
//! attempts a second, and after 105 s nearly half the killed node's
//! devices were still not back.)
//!
//! So the wait follows the ratio of sessions shed to sessions let in, over
//! windows of a second: a client shed with wait `w` comes back within `w`
//! to `2w`, so `S` sheds in a window mean about `1.5 w S` clients waiting,
//! coming back at about `S` a window. To bring them back at about
//! [`SHED_PER_ADMIT`] attempts for each of the `A` a window lets in, the
//! next wait is `w S / (4 A)`. Each window moves the wait by at most a
//! factor of two either way (the clients answer a change only one wait
//! later), and it stays between the base wait and its cap ([`max_wait_ms`]).
//! A node that keeps up sheds few, and its wait falls back to the base.
//!
//! Why four, not one: the sheds a window counts came from waits given
//! earlier, shorter ones, so a wait aimed at one shed per admission
//! overshoots, and the last clients of a storm sit out a long wait after
//! the node has room. A simulation of the gate (`bench/scripts/shed-sim.py`:
//! `n` clients at once, a node letting in `A` a second) gave, against a
//! fixed 1 s wait: at 1,666 clients and 185 a second, all in after 11.9 s
//! instead of 10.6 s, with 3,962 sheds instead of 4,978 (aiming at one:
//! 23.0 s); at 3,333 clients and 35 a second, 97.1 s instead of 96.7 s with
//! 18,261 sheds instead of 101,471. On a real node each of those sheds is a
//! handshake paid for by the node that is already the bottleneck, so fewer
//! of them let it in more.

use std::time::{Duration, Instant};

use crate::protocol::SHED_RETRY_AFTER_MS;

/// How often the wait is adapted.
const WINDOW: Duration = Duration::from_secs(1);

/// Sessions shed for each one let in that the wait aims at.
pub const SHED_PER_ADMIT: u64 = 4;

/// The longest wait whatever the TTL: the JS client's own longest backoff.
pub const MAX_WAIT_MS: u64 = 15_000;

/// The cap on the wait for leases of `ttl_ms`: a third of the TTL, at most
/// [`MAX_WAIT_MS`] (15 s at the default 45 s TTL), never below the base. A
/// client waits the wait plus up to as much again, so up to two thirds of
/// the TTL, and the lease the node it lost held was refreshed within a
/// heartbeat (a third of the TTL by default) before it went: a device shed
/// once with the longest wait comes back about when that lease could lapse
/// at the earliest, not long after. One shed again and again may not come
/// back in time, and then its watchers see it offline: a node shedding that
/// much could not have let it in sooner.
pub fn max_wait_ms(ttl_ms: u64) -> u64 {
    (ttl_ms / 3).clamp(SHED_RETRY_AFTER_MS, MAX_WAIT_MS)
}

/// The sessions let in and shed in the current window, and the wait.
#[derive(Debug)]
pub struct ShedWait {
    wait_ms: u64,
    max_ms: u64,
    since: Instant,
    admitted: u64,
    shed: u64,
}

impl ShedWait {
    /// The base wait, at most `max_ms` ([`max_wait_ms`]), with a window
    /// starting at `now`.
    pub fn new(now: Instant, max_ms: u64) -> Self {
        Self {
            wait_ms: SHED_RETRY_AFTER_MS,
            max_ms: max_ms.max(SHED_RETRY_AFTER_MS),
            since: now,
            admitted: 0,
            shed: 0,
        }
    }

    /// A session was let in at `now`.
    pub fn admitted(&mut self, now: Instant) {
        self.roll(now);
        self.admitted += 1;
    }

    /// A session was shed at `now`: the wait its close names.
    pub fn shed(&mut self, now: Instant) -> u64 {
        self.roll(now);
        self.shed += 1;
        self.wait_ms
    }

    /// The current wait, in ms.
    pub fn wait_ms(&self) -> u64 {
        self.wait_ms
    }

    /// Closes the window if it is over, adapting the wait to it; windows
    /// that passed with nothing in them each halve it.
    fn roll(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed < WINDOW {
            return;
        }
        let per_window =
            self.wait_ms.saturating_mul(self.shed) / (SHED_PER_ADMIT * self.admitted.max(1));
        let mut wait = per_window.clamp(self.wait_ms / 2, self.wait_ms.saturating_mul(2));
        let idle = (elapsed.as_millis() / WINDOW.as_millis()).saturating_sub(1);
        wait >>= idle.min(16);
        self.wait_ms = wait.clamp(SHED_RETRY_AFTER_MS, self.max_ms);
        self.since = now;
        self.admitted = 0;
        self.shed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window at `t0 + n` seconds with `admitted` let in and `shed` shed;
    /// returns the wait the last shed was given (or the current one).
    fn window(w: &mut ShedWait, t0: Instant, n: u64, admitted: u64, shed: u64) -> u64 {
        let at = t0 + Duration::from_secs(n) + Duration::from_millis(1);
        for _ in 0..admitted {
            w.admitted(at);
        }
        (0..shed).map(|_| w.shed(at)).last().unwrap_or(w.wait_ms())
    }

    #[test]
    fn four_shed_for_each_let_in_keep_the_base_wait() {
        let t0 = Instant::now();
        let mut w = ShedWait::new(t0, MAX_WAIT_MS);
        for n in 0..10 {
            // Up to four shed for each one let in is keeping up.
            assert_eq!(window(&mut w, t0, n, 100, 400), SHED_RETRY_AFTER_MS);
        }
    }

    #[test]
    fn many_shed_for_each_let_in_double_the_wait_up_to_its_cap() {
        let t0 = Instant::now();
        let mut w = ShedWait::new(t0, MAX_WAIT_MS);
        let waits: Vec<u64> = (0..8).map(|n| window(&mut w, t0, n, 30, 1_000)).collect();
        assert_eq!(
            waits,
            [1_000, 2_000, 4_000, 8_000, 15_000, 15_000, 15_000, 15_000]
        );
    }

    #[test]
    fn the_wait_settles_where_shed_and_let_in_match() {
        let t0 = Instant::now();
        let mut w = ShedWait::new(t0, MAX_WAIT_MS);
        window(&mut w, t0, 0, 40, 480); // 12 shed per one let in
        assert_eq!(window(&mut w, t0, 1, 40, 160), 2_000);
        // Four shed for each let in: the wait holds.
        assert_eq!(window(&mut w, t0, 2, 40, 160), 2_000);
        assert_eq!(window(&mut w, t0, 3, 40, 160), 2_000);
        // Six: it grows by half.
        assert_eq!(window(&mut w, t0, 4, 40, 240), 2_000);
        assert_eq!(window(&mut w, t0, 5, 40, 240), 3_000);
    }

    #[test]
    fn the_wait_falls_back_once_the_storm_is_over() {
        let t0 = Instant::now();
        let mut w = ShedWait::new(t0, MAX_WAIT_MS);
        for n in 0..6 {
            window(&mut w, t0, n, 10, 1_000);
        }
        assert_eq!(w.wait_ms(), 15_000);
        // Fewer shed than let in: halved each window (a window's counts
        // set the next one's wait), down to the base.
        assert_eq!(window(&mut w, t0, 6, 100, 1), 15_000);
        assert_eq!(window(&mut w, t0, 7, 100, 1), 7_500);
        assert_eq!(window(&mut w, t0, 8, 100, 1), 3_750);
        // Nothing at all for a minute: back to the base at once.
        assert_eq!(window(&mut w, t0, 70, 0, 1), SHED_RETRY_AFTER_MS);
    }

    #[test]
    fn each_window_that_passed_empty_halves_the_wait() {
        let t0 = Instant::now();
        for (idle, expected) in [(0, 8_000), (1, 4_000), (2, 2_000), (3, 1_000)] {
            let mut w = ShedWait::new(t0, MAX_WAIT_MS);
            for n in 0..3 {
                window(&mut w, t0, n, 10, 1_000);
            }
            // Window 3 counts four shed for each let in: the wait holds.
            assert_eq!(window(&mut w, t0, 3, 10, 40), 8_000);
            // The next comes after `idle` windows with nothing in them.
            assert_eq!(window(&mut w, t0, 4 + idle, 0, 1), expected, "{idle} idle");
        }
    }

    #[test]
    fn the_cap_is_a_third_of_the_ttl() {
        assert_eq!(max_wait_ms(45_000), 15_000);
        assert_eq!(max_wait_ms(9_000), 3_000);
        assert_eq!(max_wait_ms(600_000), MAX_WAIT_MS);
        assert_eq!(max_wait_ms(900), SHED_RETRY_AFTER_MS);
        let t0 = Instant::now();
        let mut w = ShedWait::new(t0, max_wait_ms(9_000));
        let waits: Vec<u64> = (0..5).map(|n| window(&mut w, t0, n, 1, 1_000)).collect();
        assert_eq!(waits, [1_000, 2_000, 3_000, 3_000, 3_000]);
    }

    #[test]
    fn a_window_with_nobody_let_in_counts_as_one() {
        let t0 = Instant::now();
        let mut w = ShedWait::new(t0, MAX_WAIT_MS);
        window(&mut w, t0, 0, 0, 6);
        assert_eq!(window(&mut w, t0, 1, 0, 1), 1_500);
    }
}
