//! The reference clock (docs/allocator.md, "Clock steps"): what the lead cap is measured
//! against, so that no load pushes the oracle ahead of the clock and no step of the wall clock
//! stops it.
//!
//! Two clocks are sampled together: the wall clock (`CLOCK_REALTIME`, which gives timestamps
//! their physical part and can step either way) and a monotonic clock (`CLOCK_MONOTONIC_COARSE`,
//! which never steps and is the one elapsed time is measured on). The reference `R` is
//!
//! ```text
//! R(t) = max(wall(t), R(t0) + rate × (mono(t) − mono(t0)))   while R(t0) > wall(t0)
//! R(t) = max(wall(t), R(t0))                                 otherwise       rate = 1/2
//! ```
//!
//! so it never goes down, it equals the wall clock while the wall clock is at or above it
//! (every ordinary moment), and when the wall clock is behind it (stepped back, or the oracle
//! had to start above the clock: a seed, an inherited high-water) it goes on at half the pace
//! of real time, closing the gap by one millisecond every two, until the wall clock catches
//! up. A step back of `S` is absorbed in `2 × S` of real time; in between, the lead of `R`
//! over the wall clock is `S − elapsed / 2`, never more.
//!
//! A change of the wall clock that differs from the monotonic elapsed time by more than
//! [`STEP_THRESHOLD_MS`] between two samples is reported as a step.

/// `R` advances at `AHEAD_RATE_NUM / AHEAD_RATE_DEN` of real time while ahead of the wall clock.
pub const AHEAD_RATE_NUM: u64 = 1;
pub const AHEAD_RATE_DEN: u64 = 2;

/// A disagreement between the wall clock and elapsed monotonic time larger than this, between
/// two samples, is a step (NTP's slewing moves the clock by 0.5 ms per second at most).
pub const STEP_THRESHOLD_MS: u64 = 100;

/// A step of the wall clock, in milliseconds, as seen between two samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Back(u64),
    Forward(u64),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct ReferenceClock {
    reference_ms: u64,
    last_wall_ms: u64,
    last_mono_ms: u64,
    /// Elapsed monotonic milliseconds not yet turned into reference milliseconds (the
    /// remainder of the slow pace), in units of 1 / AHEAD_RATE_DEN ms.
    carry: u64,
    started: bool,
    steps_back: u64,
    steps_forward: u64,
    /// The last step: positive forward, negative back; 0 = none yet.
    last_step_ms: i64,
}

impl ReferenceClock {
    pub const fn new() -> Self {
        Self {
            reference_ms: 0,
            last_wall_ms: 0,
            last_mono_ms: 0,
            carry: 0,
            started: false,
            steps_back: 0,
            steps_forward: 0,
            last_step_ms: 0,
        }
    }

    /// Take a sample of both clocks; returns the step it shows, if any. The first sample
    /// starts the clock at the wall clock.
    pub fn observe(&mut self, wall_ms: u64, mono_ms: u64) -> Option<Step> {
        if !self.started {
            *self = Self {
                reference_ms: self.reference_ms.max(wall_ms),
                last_wall_ms: wall_ms,
                last_mono_ms: mono_ms,
                started: true,
                ..*self
            };
            return None;
        }
        // A monotonic clock does not go back; if a caller's sample does, count no time.
        let elapsed = mono_ms.saturating_sub(self.last_mono_ms);
        let wall_moved = i128::from(wall_ms) - i128::from(self.last_wall_ms);
        let skew = wall_moved - i128::from(elapsed);
        let step = if skew > i128::from(STEP_THRESHOLD_MS) {
            Some(Step::Forward(u64::try_from(skew).unwrap_or(u64::MAX)))
        } else if -skew > i128::from(STEP_THRESHOLD_MS) {
            Some(Step::Back(u64::try_from(-skew).unwrap_or(u64::MAX)))
        } else {
            None
        };
        match step {
            Some(Step::Forward(ms)) => {
                self.steps_forward += 1;
                self.last_step_ms = i64::try_from(ms).unwrap_or(i64::MAX);
            }
            Some(Step::Back(ms)) => {
                self.steps_back += 1;
                self.last_step_ms = -i64::try_from(ms).unwrap_or(i64::MAX);
            }
            None => {}
        }
        // R goes on at the slow pace only while it was ahead of the wall clock at the last
        // sample; otherwise the wall clock drove it, and it is the wall clock (never ahead of
        // it by what a coarse monotonic clock's resolution makes of a short interval).
        let was_ahead = self.reference_ms > self.last_wall_ms;
        let units = if was_ahead {
            elapsed.saturating_mul(AHEAD_RATE_NUM).saturating_add(self.carry)
        } else {
            0
        };
        let slow = self.reference_ms.saturating_add(units / AHEAD_RATE_DEN);
        if wall_ms >= slow {
            self.reference_ms = wall_ms;
            self.carry = 0;
        } else {
            self.reference_ms = slow;
            self.carry = units % AHEAD_RATE_DEN;
        }
        self.last_wall_ms = wall_ms;
        self.last_mono_ms = mono_ms;
        step
    }

    /// The oracle starts above the clock (the fence's floor): the reference is at least there.
    pub fn raise_to(&mut self, at_least_ms: u64) {
        if at_least_ms > self.reference_ms {
            self.reference_ms = at_least_ms;
            self.carry = 0;
        }
    }

    /// Has it been sampled?
    pub fn is_started(&self) -> bool {
        self.started
    }

    /// `R` at the last sample.
    pub fn reference_ms(&self) -> u64 {
        self.reference_ms
    }

    /// How far `R` is ahead of the wall clock at the last sample.
    pub fn lead_ms(&self) -> u64 {
        self.reference_ms.saturating_sub(self.last_wall_ms)
    }

    pub fn steps_back(&self) -> u64 {
        self.steps_back
    }

    pub fn steps_forward(&self) -> u64 {
        self.steps_forward
    }

    /// The last step seen: positive forward, negative back, 0 = none.
    pub fn last_step_ms(&self) -> i64 {
        self.last_step_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const W: u64 = 1_700_000_000_000;

    #[test]
    fn follows_a_steady_wall_clock_exactly() {
        let mut c = ReferenceClock::new();
        assert_eq!(c.observe(W, 5_000), None);
        for i in 1..=100 {
            assert_eq!(c.observe(W + i * 7, 5_000 + i * 7), None);
            assert_eq!(c.reference_ms(), W + i * 7);
            assert_eq!(c.lead_ms(), 0);
        }
    }

    #[test]
    fn a_step_back_is_absorbed_at_half_pace() {
        let mut c = ReferenceClock::new();
        c.observe(W, 0);
        assert_eq!(c.observe(W - 60_000 + 10, 10), Some(Step::Back(60_000)));
        assert_eq!(c.last_step_ms(), -60_000);
        assert_eq!(c.steps_back(), 1);
        assert_eq!(c.reference_ms(), W, "it was not ahead before the step: it stays");
        // 2 × 60 s later the wall clock has caught up.
        assert_eq!(c.observe(W - 60_000 + 100_010, 100_010), None);
        assert_eq!(c.reference_ms(), W + 50_000, "half of the 100 s elapsed since");
        assert_eq!(c.lead_ms(), 9_990);
        c.observe(W - 60_000 + 120_010, 120_010);
        assert_eq!(c.lead_ms(), 0);
        c.observe(W - 60_000 + 120_011, 120_011);
        assert_eq!(c.reference_ms(), W + 60_011, "the wall clock again");
    }

    #[test]
    fn a_forward_step_is_followed_and_its_correction_absorbed() {
        let mut c = ReferenceClock::new();
        c.observe(W, 0);
        assert_eq!(c.observe(W + 3_600_000 + 1_000, 1_000), Some(Step::Forward(3_600_000)));
        assert_eq!(c.reference_ms(), W + 3_601_000);
        assert_eq!(c.observe(W + 11_000, 11_000), Some(Step::Back(3_600_000)));
        assert_eq!(c.reference_ms(), W + 3_601_000);
        c.observe(W + 21_000, 21_000);
        assert_eq!(c.reference_ms(), W + 3_601_000 + 5_000, "then at half pace");
        assert_eq!(c.steps_forward(), 1);
        assert_eq!(c.steps_back(), 1);
    }

    /// A coarse monotonic clock jumps by a tick (4 ms) where the wall clock moved 1 ms: while
    /// the wall clock is at or above R, R is the wall clock, never ahead of it.
    #[test]
    fn a_coarse_monotonic_clock_never_puts_r_ahead_of_a_steady_wall_clock() {
        let mut c = ReferenceClock::new();
        c.observe(W, 0);
        for i in 1..=1_000u64 {
            c.observe(W + i, (i / 4) * 4 + 4);
            assert_eq!(c.lead_ms(), 0, "tick {i}");
        }
    }

    #[test]
    fn raise_starts_above_the_clock() {
        let mut c = ReferenceClock::new();
        c.observe(W, 0);
        c.raise_to(W + 3_600_000);
        c.observe(W + 1_000, 1_000);
        assert_eq!(c.reference_ms(), W + 3_600_500);
        c.raise_to(W);
        assert_eq!(c.reference_ms(), W + 3_600_500, "never lowered");
    }

    proptest! {
        /// R never decreases, is never below the wall clock, and its lead over the wall clock
        /// never grows except by a step back (or a raise): between steps it shrinks by half
        /// the elapsed time until it is gone.
        #[test]
        fn reference_is_monotonic_and_its_lead_only_shrinks_between_steps(
            samples in proptest::collection::vec((0u64..500, -200_000i64..200_000, 0u8..10), 1..200),
        ) {
            let mut c = ReferenceClock::new();
            let (mut wall, mut mono) = (W, 1_000u64);
            c.observe(wall, mono);
            for (elapsed, jump, kind) in samples {
                let before = c;
                mono += elapsed;
                // Mostly ordinary ticks (the wall clock moves with real time), sometimes a step.
                let jump = if kind == 0 { jump } else { 0 };
                wall = (wall as i64 + elapsed as i64 + jump).max(0) as u64;
                let step = c.observe(wall, mono);
                prop_assert!(c.reference_ms() >= before.reference_ms());
                prop_assert!(c.reference_ms() >= wall);
                // The lead grows only by what the wall clock fell behind real time.
                let lead_bound = before.lead_ms() + jump.min(0).unsigned_abs();
                prop_assert!(c.lead_ms() <= lead_bound,
                    "lead {} above {} (before {:?}, step {:?})", c.lead_ms(), lead_bound, before, step);
                if jump == 0 && before.lead_ms() > 0 {
                    // Half of the elapsed time (rounding carried to the next sample), down to 0.
                    prop_assert!(c.lead_ms() <= before.lead_ms().saturating_sub(elapsed / 2));
                    prop_assert!(c.lead_ms() + elapsed.div_ceil(2) >= before.lead_ms());
                }
                prop_assert_eq!(step.is_some(), jump.unsigned_abs() > STEP_THRESHOLD_MS, "jump {}", jump);
            }
        }
    }
}
