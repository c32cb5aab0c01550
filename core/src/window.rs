//! The serving window as two atomics, so any number of processes can take timestamps at
//! once without a lock: the hot path of `tso_next()`. The worker opens it after the fence,
//! extends it after each durable window extension and closes it when it steps down;
//! [`Allocator`](crate::allocator::Allocator) stays the worker's bookkeeping (epoch, floor,
//! committed high-water). Grants land exactly where `Allocator::try_grant` puts them
//! (both use [`place_grant`]).
//!
//! Why it is safe: every grant moves `next` forward with a compare-and-swap from the value
//! it computed from, so granted ranges are disjoint and increase in the order the swaps
//! happen (and a call that returned before another began swapped first). `high_water_ms`
//! only ever holds a value already durable, and durable values never go down, so a grant
//! computed from a stale one is still at or below the durable high-water. `open` raises
//! `next` to the floor before it publishes the new high-water, so a grant computed from an
//! older `next` fails its swap instead of landing below the floor.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::allocator::place_grant;
use crate::error::CoreError;
use crate::timestamp::pack;

#[derive(Debug, Default)]
#[repr(C)]
pub struct AtomicWindow {
    /// One past the last issued timestamp (0 = nothing issued yet). Never goes down.
    next: AtomicU64,
    /// Highest physical_ms that may be issued; 0 = closed (not serving).
    high_water_ms: AtomicU64,
}

impl AtomicWindow {
    pub const fn new() -> Self {
        Self { next: AtomicU64::new(0), high_water_ms: AtomicU64::new(0) }
    }

    /// Grant `count` consecutive timestamps in one millisecond; returns the first.
    /// `NotLeader` when closed, `WindowExhausted` when the window does not reach far enough.
    pub fn try_grant(&self, now_ms: u64, count: u32) -> Result<u64, CoreError> {
        let mut current = self.next.load(Ordering::Acquire);
        loop {
            let high_water_ms = self.high_water_ms.load(Ordering::Acquire);
            if high_water_ms == 0 {
                return Err(CoreError::NotLeader);
            }
            let first = place_grant(current, 0, high_water_ms, now_ms, count)?;
            let end = first + u64::from(count);
            match self.next.compare_exchange_weak(current, end, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(first),
                Err(actual) => current = actual,
            }
        }
    }

    /// After the fence: serve from `floor_ms` up to `high_water_ms` (both already durable).
    pub fn open(&self, floor_ms: u64, high_water_ms: u64) -> Result<(), CoreError> {
        if floor_ms == 0 || floor_ms > high_water_ms {
            return Err(CoreError::InvalidSeed { floor_ms, high_water_ms });
        }
        self.next.fetch_max(pack(floor_ms, 0)?, Ordering::AcqRel);
        self.high_water_ms.store(high_water_ms, Ordering::Release);
        Ok(())
    }

    /// A higher high-water became durable. Ignored while closed; never lowers.
    pub fn extend(&self, high_water_ms: u64) {
        let _ = self.high_water_ms.fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
            (current != 0 && high_water_ms > current).then_some(high_water_ms)
        });
    }

    /// Stop serving (before a fence).
    pub fn close(&self) {
        self.high_water_ms.store(0, Ordering::Release);
    }

    /// One past the last issued timestamp (0 = none).
    pub fn next_ts(&self) -> u64 {
        self.next.load(Ordering::Acquire)
    }

    pub fn last_issued(&self) -> Option<u64> {
        self.next_ts().checked_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timestamp::{logical, physical_ms};

    #[test]
    fn closed_until_opened_and_after_close() {
        let w = AtomicWindow::new();
        assert_eq!(w.try_grant(1_000, 1), Err(CoreError::NotLeader));
        w.open(1_000, 2_000).unwrap();
        assert_eq!(w.try_grant(900, 1), Ok(pack(1_000, 0).unwrap()), "never below the floor");
        w.close();
        assert_eq!(w.try_grant(1_500, 1), Err(CoreError::NotLeader));
    }

    #[test]
    fn exhausted_above_the_high_water_and_extend_widens() {
        let w = AtomicWindow::new();
        w.open(1_000, 1_001).unwrap();
        assert!(matches!(w.try_grant(1_002, 1), Err(CoreError::WindowExhausted { .. })));
        w.extend(1_005);
        let ts = w.try_grant(1_002, 1).unwrap();
        assert_eq!(physical_ms(ts), 1_002);
        w.extend(1_003);
        assert!(w.try_grant(1_004, 1).is_ok(), "extend never lowers");
    }

    #[test]
    fn a_batch_that_does_not_fit_moves_to_the_next_millisecond() {
        let w = AtomicWindow::new();
        w.open(10, 20).unwrap();
        w.try_grant(10, 200_000).unwrap();
        let ts = w.try_grant(10, 100_000).unwrap();
        assert_eq!((physical_ms(ts), logical(ts)), (11, 0));
    }

    #[test]
    fn reopening_never_goes_back() {
        let w = AtomicWindow::new();
        w.open(100, 200).unwrap();
        let a = w.try_grant(150, 1).unwrap();
        w.close();
        w.open(120, 300).unwrap(); // a (hypothetically) lower floor cannot move next back
        assert!(w.try_grant(110, 1).unwrap() > a);
    }

    #[test]
    fn threads_never_share_a_timestamp() {
        let w = std::sync::Arc::new(AtomicWindow::new());
        w.open(1_000, 1_000_000).unwrap();
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let w = w.clone();
                std::thread::spawn(move || {
                    (0..20_000u64)
                        .map(|i| {
                            let count = 1 + ((i * 7 + t) % 50) as u32;
                            let first = w.try_grant(1_000 + i / 1_000, count).unwrap();
                            (first, u64::from(count))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut ranges: Vec<(u64, u64)> =
            handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
        ranges.sort_unstable();
        for pair in ranges.windows(2) {
            assert!(pair[0].0 + pair[0].1 <= pair[1].0, "overlap: {pair:?}");
        }
        for (first, count) in ranges {
            assert_eq!(
                physical_ms(first),
                physical_ms(first + count - 1),
                "a batch stays in one ms"
            );
        }
    }
}
