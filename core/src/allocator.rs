//! The window allocator (docs/allocator.md). It issues timestamps from the window
//! `[floor_ms, high_water_ms]`, where `high_water_ms` is durably committed before it is used.
//! Extending the window is split into prepare (compute the target) and commit (apply what
//! the store returned) so that the I/O in between happens outside any lock.
//!
//! The struct is plain data (no heap, no pointers, `repr(C)`) because the extension keeps it
//! in PostgreSQL shared memory under an LWLock.

use crate::error::CoreError;
use crate::timestamp::{
    logical, pack, physical_ms, LOGICAL_PER_MS, MAX_PHYSICAL_MS, MAX_SQL_PHYSICAL_MS,
};

/// A batch fits in one millisecond.
pub const MAX_BATCH: u32 = 262_144;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Allocator {
    epoch: u64,
    floor_ms: u64,
    high_water_ms: u64,
    /// One past the last issued timestamp; 0 = nothing issued in this epoch. An issued
    /// timestamp is at most i64::MAX, so this never overflows and is never 0 after a grant.
    next_ts: u64,
    /// A separate flag rather than "epoch 0 = none", so any epoch value is usable.
    serving: bool,
}

/// A batch must have 1 to `MAX_BATCH` timestamps.
pub fn check_count(count: u32) -> Result<(), CoreError> {
    if count == 0 || count > MAX_BATCH {
        return Err(CoreError::InvalidCount { got: i64::from(count), max: u64::from(MAX_BATCH) });
    }
    Ok(())
}

/// Where a grant of `count` timestamps lands: the first of them. `next_ts` is one past the
/// last issued (0 = none). first = max(next_ts, pack(now_ms, 0), pack(floor_ms, 0)); if the
/// batch does not fit in that millisecond's logical space it moves to the start of the next
/// one (never wraps). Fails with `WindowExhausted` above `high_water_ms`.
pub fn place_grant(
    next_ts: u64,
    floor_ms: u64,
    high_water_ms: u64,
    now_ms: u64,
    count: u32,
) -> Result<u64, CoreError> {
    check_count(count)?;
    let count = u64::from(count);
    // Compare in (physical, logical) form: now_ms is untrusted and may not pack.
    let lowest_ms = now_ms.max(floor_ms);
    let (mut phys, mut log) = if lowest_ms > physical_ms(next_ts) {
        (lowest_ms, 0)
    } else {
        (physical_ms(next_ts), logical(next_ts))
    };
    if log + count > LOGICAL_PER_MS {
        phys = phys.saturating_add(1);
        log = 0;
    }
    if phys > high_water_ms {
        return Err(CoreError::WindowExhausted { needed_ms: phys, high_water_ms });
    }
    // Keeps every issued timestamp a non-negative bigint.
    if phys > MAX_SQL_PHYSICAL_MS {
        return Err(CoreError::PhysicalOutOfRange(phys));
    }
    pack(phys, log)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowExtension {
    pub requested_ms: u64,
    pub epoch: u64,
}

impl Allocator {
    pub const fn new() -> Self {
        Self { epoch: 0, floor_ms: 0, high_water_ms: 0, next_ts: 0, serving: false }
    }

    /// Seed after the fence: will never issue physical_ms < floor_ms or > high_water_ms.
    /// Replaces any previous state (including last_issued: the floor is above anything
    /// issued before).
    pub fn become_leader(
        &mut self,
        floor_ms: u64,
        high_water_ms: u64,
        epoch: u64,
    ) -> Result<(), CoreError> {
        if floor_ms > MAX_PHYSICAL_MS {
            return Err(CoreError::PhysicalOutOfRange(floor_ms));
        }
        if floor_ms > high_water_ms {
            return Err(CoreError::InvalidSeed { floor_ms, high_water_ms });
        }
        *self = Self { epoch, floor_ms, high_water_ms, next_ts: 0, serving: true };
        Ok(())
    }

    /// Forget the window; the next `try_grant` returns `NotLeader`.
    pub fn step_down(&mut self) {
        *self = Self::new();
    }

    pub fn is_serving(&self) -> bool {
        self.serving
    }

    /// Grant `count` consecutive timestamps, all in one millisecond; returns the first.
    ///
    /// first = max(last_issued + 1, pack(now_ms, 0), pack(floor_ms, 0)); if the batch does
    /// not fit in that millisecond's logical space it moves to the start of the next one
    /// (never wraps). Fails with `WindowExhausted` if that is above the committed high-water;
    /// on any error the state is unchanged.
    pub fn try_grant(&mut self, now_ms: u64, count: u32) -> Result<u64, CoreError> {
        check_count(count)?;
        if !self.serving {
            return Err(CoreError::NotLeader);
        }
        let first = place_grant(self.next_ts, self.floor_ms, self.high_water_ms, now_ms, count)?;
        self.next_ts = first + u64::from(count);
        Ok(first)
    }

    /// The worker learns how far the lock-free window (`AtomicWindow`) has issued, so that
    /// `window_left_ms` and `needs_extension` account for bursts that ran ahead of the clock.
    pub fn observe_issued(&mut self, next_ts: u64) {
        if self.serving {
            self.next_ts = self.next_ts.max(next_ts);
        }
    }

    /// Would a grant of `count` at now_ms succeed? (no state change) Model only: the property
    /// tests predict grants with it; production grants from the lock-free window.
    pub fn would_grant(&self, now_ms: u64, count: u32) -> bool {
        let mut probe = *self;
        probe.try_grant(now_ms, count).is_ok()
    }

    /// requested_ms = max(high_water_ms + 1, now_ms) + window_ahead_ms, capped at
    /// MAX_PHYSICAL_MS. The caller persists it ("advance to at least") and commits the result.
    pub fn prepare_window_extension(
        &self,
        now_ms: u64,
        window_ahead_ms: u64,
    ) -> Result<WindowExtension, CoreError> {
        if !self.serving {
            return Err(CoreError::NotLeader);
        }
        let requested_ms = self
            .high_water_ms
            .saturating_add(1)
            .max(now_ms)
            .saturating_add(window_ahead_ms)
            .min(MAX_PHYSICAL_MS);
        Ok(WindowExtension { requested_ms, epoch: self.epoch })
    }

    /// The highest physical_ms that may be served: `max_lead_ms` above the reference clock
    /// ([`ReferenceClock`](crate::clock::ReferenceClock): the wall clock, or where that is
    /// behind — it stepped back, or the fence had to start above it — a clock that goes on at
    /// half the pace of real time), and never below the fence's floor plus `max_lead_ms`. No
    /// load moves the oracle further ahead, no step of the wall clock stops it, and nothing
    /// goes above the last millisecond a timestamp can be issued in.
    pub fn lead_cap_ms(&self, reference_ms: u64, max_lead_ms: u64) -> u64 {
        reference_ms.max(self.floor_ms).saturating_add(max_lead_ms).min(MAX_SQL_PHYSICAL_MS)
    }

    /// What callers may take from: the committed high-water, capped by
    /// [`lead_cap_ms`](Self::lead_cap_ms). Never above what is durable.
    pub fn serving_bound_ms(&self, reference_ms: u64, max_lead_ms: u64) -> u64 {
        self.high_water_ms.min(self.lead_cap_ms(reference_ms, max_lead_ms))
    }

    /// [`prepare_window_extension`](Self::prepare_window_extension) at `now_ms` (the wall
    /// clock) within the lead cap at `reference_ms`: `None` when the committed high-water
    /// already reaches the cap (callers then wait for the reference clock instead of moving
    /// the high-water further).
    pub fn prepare_capped_extension(
        &self,
        now_ms: u64,
        reference_ms: u64,
        window_ahead_ms: u64,
        max_lead_ms: u64,
    ) -> Result<Option<WindowExtension>, CoreError> {
        let extension = self.prepare_window_extension(now_ms, window_ahead_ms)?;
        let requested_ms = extension.requested_ms.min(self.lead_cap_ms(reference_ms, max_lead_ms));
        Ok((requested_ms > self.high_water_ms)
            .then_some(WindowExtension { requested_ms, ..extension }))
    }

    /// Less than half of `window_ahead_ms` left below the serving bound (see
    /// [`serving_bound_ms`](Self::serving_bound_ms)) above the lowest millisecond the next
    /// grant at `now_ms` could use; false when not serving.
    pub fn needs_capped_extension(
        &self,
        now_ms: u64,
        reference_ms: u64,
        window_ahead_ms: u64,
        max_lead_ms: u64,
    ) -> bool {
        if !self.serving {
            return false;
        }
        self.serving_bound_ms(reference_ms, max_lead_ms).saturating_sub(self.lowest_ms(now_ms))
            < window_ahead_ms / 2
    }

    /// Apply the durable value the store returned. A result for another epoch (or when not
    /// serving) is refused unchanged; a stale smaller value is absorbed (never lowers).
    pub fn commit_window_extension(&mut self, actual_ms: u64, epoch: u64) -> Result<(), CoreError> {
        if !self.serving || epoch != self.epoch {
            return Err(CoreError::EpochMismatch { current: self.epoch(), got: epoch });
        }
        self.high_water_ms = self.high_water_ms.max(actual_ms);
        Ok(())
    }

    /// True when less than half of window_ahead_ms remains (see `window_left_ms`);
    /// false when not serving. Model only (the property tests): the worker decides with
    /// [`needs_capped_extension`](Self::needs_capped_extension), which also applies the lead cap.
    pub fn needs_extension(&self, now_ms: u64, window_ahead_ms: u64) -> bool {
        self.serving && self.window_left_ms(now_ms) < window_ahead_ms / 2
    }

    /// Milliseconds of window left above the lowest physical_ms the next grant could use
    /// (now, the floor, or the last issued one, whichever is highest); 0 when not serving.
    pub fn window_left_ms(&self, now_ms: u64) -> u64 {
        if !self.serving {
            return 0;
        }
        self.high_water_ms.saturating_sub(self.lowest_ms(now_ms))
    }

    /// The lowest physical_ms the next grant could use: now, the floor, or the last issued
    /// one, whichever is highest.
    fn lowest_ms(&self, now_ms: u64) -> u64 {
        now_ms.max(self.floor_ms).max(physical_ms(self.next_ts))
    }

    pub fn epoch(&self) -> Option<u64> {
        self.serving.then_some(self.epoch)
    }

    pub fn floor_ms(&self) -> u64 {
        self.floor_ms
    }

    pub fn high_water_ms(&self) -> u64 {
        self.high_water_ms
    }

    pub fn last_issued(&self) -> Option<u64> {
        self.next_ts.checked_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timestamp::MAX_LOGICAL;

    const NOW: u64 = 1_700_000_000_000;

    fn leader(floor: u64, hw: u64) -> Allocator {
        let mut a = Allocator::new();
        a.become_leader(floor, hw, 7).unwrap();
        a
    }

    #[test]
    fn not_serving_until_seeded() {
        let mut a = Allocator::new();
        assert_eq!(a, Allocator::default());
        assert!(!a.is_serving());
        assert_eq!(a.epoch(), None);
        assert_eq!(a.try_grant(NOW, 1), Err(CoreError::NotLeader));
        assert_eq!(a.prepare_window_extension(NOW, 10), Err(CoreError::NotLeader));
        assert!(!a.needs_extension(NOW, 3000));
        assert_eq!(a.window_left_ms(NOW), 0);
        assert_eq!(
            a.commit_window_extension(NOW, 0),
            Err(CoreError::EpochMismatch { current: None, got: 0 })
        );
    }

    #[test]
    fn grants_are_consecutive_within_a_millisecond() {
        let mut a = leader(NOW, NOW + 1000);
        assert_eq!(a.try_grant(NOW, 1), Ok(pack(NOW, 0).unwrap()));
        assert_eq!(a.try_grant(NOW, 10), Ok(pack(NOW, 1).unwrap()));
        assert_eq!(a.try_grant(NOW, 1), Ok(pack(NOW, 11).unwrap()));
        assert_eq!(a.last_issued(), Some(pack(NOW, 11).unwrap()));
        // The clock moving on starts a fresh millisecond; going back does not.
        assert_eq!(a.try_grant(NOW + 5, 1), Ok(pack(NOW + 5, 0).unwrap()));
        assert_eq!(a.try_grant(NOW - 100, 1), Ok(pack(NOW + 5, 1).unwrap()));
    }

    #[test]
    fn floor_applies_when_clock_is_behind() {
        let mut a = leader(NOW + 50, NOW + 1000);
        assert_eq!(a.try_grant(NOW, 1), Ok(pack(NOW + 50, 0).unwrap()));
    }

    #[test]
    fn logical_overflow_moves_to_next_millisecond() {
        let mut a = leader(NOW, NOW + 1);
        assert_eq!(a.try_grant(NOW, 10), Ok(pack(NOW, 0).unwrap()));
        // Does not fit in what is left of NOW: skip to NOW + 1 instead of wrapping.
        assert_eq!(a.try_grant(NOW, MAX_BATCH), Ok(pack(NOW + 1, 0).unwrap()));
        assert_eq!(a.last_issued(), Some(pack(NOW + 1, MAX_LOGICAL).unwrap()));
        let before = a;
        assert_eq!(
            a.try_grant(NOW, 1),
            Err(CoreError::WindowExhausted { needed_ms: NOW + 2, high_water_ms: NOW + 1 })
        );
        assert_eq!(a, before);
    }

    #[test]
    fn exactly_filling_a_millisecond_stays_in_it() {
        let mut a = leader(NOW, NOW);
        assert_eq!(a.try_grant(NOW, 1), Ok(pack(NOW, 0).unwrap()));
        assert_eq!(a.try_grant(NOW, MAX_BATCH - 1), Ok(pack(NOW, 1).unwrap()));
        assert!(!a.would_grant(NOW, 1));
    }

    #[test]
    fn invalid_counts() {
        let mut a = leader(NOW, NOW + 10);
        for count in [0, MAX_BATCH + 1, u32::MAX] {
            assert_eq!(
                a.try_grant(NOW, count),
                Err(CoreError::InvalidCount { got: i64::from(count), max: 262_144 })
            );
        }
        assert_eq!(a.last_issued(), None);
    }

    #[test]
    fn window_exhausted_then_extended() {
        let mut a = leader(NOW, NOW + 10);
        let before = a;
        assert!(!a.would_grant(NOW + 11, 1));
        assert_eq!(
            a.try_grant(NOW + 11, 1),
            Err(CoreError::WindowExhausted { needed_ms: NOW + 11, high_water_ms: NOW + 10 })
        );
        assert_eq!(a, before);

        let ext = a.prepare_window_extension(NOW + 11, 3000).unwrap();
        assert_eq!(ext, WindowExtension { requested_ms: NOW + 3011, epoch: 7 });
        a.commit_window_extension(ext.requested_ms, ext.epoch).unwrap();
        assert_eq!(a.high_water_ms(), NOW + 3011);
        assert!(a.would_grant(NOW + 11, 1));
        assert_eq!(a.try_grant(NOW + 11, 1), Ok(pack(NOW + 11, 0).unwrap()));
    }

    #[test]
    fn prepare_uses_high_water_when_clock_is_behind() {
        let a = leader(NOW, NOW + 10);
        assert_eq!(a.prepare_window_extension(NOW, 100).unwrap().requested_ms, NOW + 111);
        assert_eq!(
            a.prepare_window_extension(u64::MAX, 100).unwrap().requested_ms,
            MAX_PHYSICAL_MS
        );
    }

    #[test]
    fn commit_never_lowers_and_checks_epoch() {
        let mut a = leader(NOW, NOW + 100);
        a.commit_window_extension(NOW + 50, 7).unwrap();
        assert_eq!(a.high_water_ms(), NOW + 100);
        assert_eq!(
            a.commit_window_extension(NOW + 500, 6),
            Err(CoreError::EpochMismatch { current: Some(7), got: 6 })
        );
        assert_eq!(a.high_water_ms(), NOW + 100);
    }

    #[test]
    fn become_leader_validates_and_resets() {
        let mut a = leader(NOW, NOW + 100);
        a.try_grant(NOW, 5).unwrap();
        assert_eq!(
            a.become_leader(NOW + 2, NOW + 1, 8),
            Err(CoreError::InvalidSeed { floor_ms: NOW + 2, high_water_ms: NOW + 1 })
        );
        assert_eq!(
            a.become_leader(MAX_PHYSICAL_MS + 1, u64::MAX, 8),
            Err(CoreError::PhysicalOutOfRange(MAX_PHYSICAL_MS + 1))
        );
        assert_eq!(a.epoch(), Some(7));
        a.become_leader(NOW + 200, NOW + 1200, 8).unwrap();
        assert_eq!(a.epoch(), Some(8));
        assert_eq!(a.last_issued(), None);
        assert_eq!(a.try_grant(NOW, 1), Ok(pack(NOW + 200, 0).unwrap()));
        a.step_down();
        assert_eq!(a.try_grant(NOW, 1), Err(CoreError::NotLeader));
        assert_eq!(a.last_issued(), None);
    }

    #[test]
    fn needs_extension_at_half_window() {
        let a = leader(NOW, NOW + 3000);
        assert_eq!(a.window_left_ms(NOW), 3000);
        assert!(!a.needs_extension(NOW, 3000));
        assert!(!a.needs_extension(NOW + 1500, 3000));
        assert!(a.needs_extension(NOW + 1501, 3000));
        assert_eq!(a.window_left_ms(NOW + 5000), 0);
        // Below the floor the floor counts, not the (lagging) clock.
        assert_eq!(a.window_left_ms(NOW - 1000), 3000);
    }

    #[test]
    fn never_issues_above_i64_max() {
        let mut a = leader(MAX_SQL_PHYSICAL_MS, MAX_PHYSICAL_MS);
        let first = a.try_grant(0, MAX_BATCH).unwrap();
        assert_eq!(first + u64::from(MAX_BATCH) - 1, i64::MAX as u64);
        assert_eq!(a.try_grant(0, 1), Err(CoreError::PhysicalOutOfRange(MAX_SQL_PHYSICAL_MS + 1)));
        assert_eq!(
            a.try_grant(u64::MAX, 1),
            Err(CoreError::WindowExhausted { needed_ms: u64::MAX, high_water_ms: MAX_PHYSICAL_MS })
        );
    }

    #[test]
    fn is_plain_data() {
        // No heap, no pointers: five words at most.
        assert!(std::mem::size_of::<Allocator>() <= 40);
        const _: Allocator = Allocator::new();
    }
}
