//! What reading request bodies may cost, over all connections: memory (`--max-buffered-body-bytes`)
//! and time (`--min-body-bytes-per-second` after [`BODY_RATE_GRACE`]).
//!
//! A body that arrives in one part is passed on as it came: its bytes are the connection's own
//! read buffer (HTTP/1.1, at most 8 KiB) or one DATA frame within the stream's flow-control
//! window (HTTP/2), which the per-connection memory already bounds. A body that arrives in parts
//! is copied into one buffer, and that buffer's capacity is taken from the [`BodyBudget`] before
//! it is allocated, and given back when the request's decision is made.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;

pub use super::limits::BODY_RATE_GRACE;

/// The bytes that bodies read in parts may hold at once.
#[derive(Debug)]
pub struct BodyBudget {
    limit: u64,
    used: AtomicU64,
    /// `modelgate_buffered_body_bytes`.
    gauge: Gauge,
}

impl BodyBudget {
    pub fn new(limit: u64, gauge: Gauge) -> Self {
        BodyBudget {
            limit,
            used: AtomicU64::new(0),
            gauge,
        }
    }

    /// Takes `bytes` if they fit under the limit with what is held already.
    fn take(&self, bytes: u64) -> bool {
        let taken = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.limit)
            })
            .is_ok();
        if taken {
            self.gauge.inc_by(bytes as i64);
        }
        taken
    }

    fn give_back(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        self.gauge.dec_by(bytes as i64);
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
}

/// What one body holds of the budget; given back when dropped.
#[derive(Debug)]
pub struct Held<'b> {
    budget: &'b BodyBudget,
    bytes: u64,
}

impl<'b> Held<'b> {
    pub fn none(budget: &'b BodyBudget) -> Self {
        Held { budget, bytes: 0 }
    }

    /// Holds `more` bytes besides those held, if the budget has them.
    pub fn grow(&mut self, more: u64) -> bool {
        let ok = self.budget.take(more);
        if ok {
            self.bytes += more;
        }
        ok
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.give_back(self.bytes);
        }
    }
}

/// The capacity to give a buffer that holds `capacity` bytes and must now hold `needed`:
/// doubling (so that copying stays linear in the body), but never more than `needed` or
/// `expected` (the declared length, else the body limit), whichever is larger. Growing with
/// what arrived, rather than with what the client declared, makes a client that declares a
/// large body and sends little of it hold little.
pub fn grown_capacity(capacity: usize, needed: usize, expected: usize) -> usize {
    needed.max(capacity.saturating_mul(2).min(expected))
}

/// The minimum transfer rate of a body: once [`BODY_RATE_GRACE`] after the request's arrival
/// is over, the bytes received must be at least `bytes_per_second` × the time since then.
#[derive(Clone, Copy, Debug)]
pub struct MinRate {
    pub arrived: Instant,
    pub bytes_per_second: u64,
}

impl MinRate {
    /// When a body that has received `received` bytes and gets no more falls behind the rate;
    /// at most `cap` (the request's deadline, so that the sum cannot overflow).
    pub fn behind_at(&self, received: u64, cap: Instant) -> Instant {
        let start = self.arrived + BODY_RATE_GRACE;
        let nanos = u128::from(received) * 1_000_000_000 / u128::from(self.bytes_per_second.max(1));
        let allowed = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        match cap.checked_duration_since(start) {
            Some(room) if allowed < room => start + allowed,
            Some(_) => cap,
            None => start.min(cap),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_holds_what_fits_and_gets_it_back_when_dropped() {
        let gauge = Gauge::default();
        let budget = BodyBudget::new(100, gauge.clone());
        let mut a = Held::none(&budget);
        assert!(a.grow(60));
        let mut b = Held::none(&budget);
        assert!(!b.grow(41), "60 + 41 is over 100");
        assert!(b.grow(40));
        assert_eq!((budget.used(), gauge.get()), (100, 100));
        assert!(!a.grow(1));
        drop(a);
        assert_eq!((budget.used(), gauge.get()), (40, 40));
        assert!(b.grow(60));
        assert_eq!(b.bytes(), 100);
        drop(b);
        assert_eq!((budget.used(), gauge.get()), (0, 0));
        assert!(!Held::none(&budget).grow(u64::MAX), "no overflow");
    }

    #[test]
    fn buffers_grow_with_what_arrived_not_with_what_was_declared() {
        const MIB: usize = 1 << 20;
        // A client that declared 7 MiB and sent 8 KiB and a byte holds 16 KiB, not 7 MiB.
        assert_eq!(grown_capacity(0, 8193, 7 * MIB), 8193);
        assert_eq!(grown_capacity(8193, 8194, 7 * MIB), 16386);
        // Never past the declared length unless the body itself is larger.
        assert_eq!(grown_capacity(6 * MIB, 6 * MIB + 1, 7 * MIB), 7 * MIB);
        assert_eq!(grown_capacity(7 * MIB, 7 * MIB + 1, 7 * MIB), 7 * MIB + 1);
        // A body that arrives in parts of 8 KiB is copied O(log n) times.
        let (mut cap, mut grows) = (0, 0);
        for needed in (1..=3 * MIB / 8192).map(|i| i * 8192) {
            if needed > cap {
                cap = grown_capacity(cap, needed, 3 * MIB);
                grows += 1;
            }
        }
        assert!(grows <= 10, "{grows}");
        assert_eq!(cap, 3 * MIB);
    }

    #[test]
    fn a_body_falls_behind_once_the_grace_second_is_over() {
        let arrived = Instant::now();
        let rate = MinRate {
            arrived,
            bytes_per_second: 1000,
        };
        let far = arrived + Duration::from_secs(30);
        assert_eq!(rate.behind_at(0, far), arrived + BODY_RATE_GRACE);
        assert_eq!(
            rate.behind_at(500, far),
            arrived + BODY_RATE_GRACE + Duration::from_millis(500)
        );
        // Capped by the request's deadline, whatever was received.
        assert_eq!(rate.behind_at(u64::MAX, far), far);
        let soon = arrived + Duration::from_millis(300);
        assert_eq!(rate.behind_at(0, soon), soon);
    }
}
