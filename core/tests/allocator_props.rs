//! Property tests of the allocator against a model of the durable store and the fence.
//!
//! Random operation sequences mix grants (tiny, huge and invalid counts), window
//! extensions (committed at once, or held in flight and committed later: stale, out of
//! order, from an older epoch), fences (floor = max(H_durable + 1, now) as the worker
//! computes it), step-downs, and a clock that moves forward, stands still, goes backwards
//! and jumps far ahead. After every step the safety properties are checked.

use proptest::prelude::*;
use proptest::sample::Index;
use tsoracle_core::allocator::{Allocator, MAX_BATCH};
use tsoracle_core::error::CoreError;
use tsoracle_core::timestamp::{logical, pack, physical_ms, LOGICAL_PER_MS, MAX_SQL_PHYSICAL_MS};

const T0: u64 = 1_700_000_000_000;
// Windows of a few milliseconds, so that random sequences keep hitting their edges.
const WINDOW_AHEAD_MS: u64 = 6;

#[derive(Clone, Debug)]
enum Op {
    Grant(u32),
    /// prepare → persist → commit, back to back.
    Extend {
        ahead_ms: u64,
    },
    /// prepare → persist; the commit comes later (or never).
    ExtendInFlight {
        ahead_ms: u64,
    },
    /// Commit one of the in-flight results, in any order.
    CommitInFlight(Index),
    /// A commit for an epoch nobody holds, with a value that was never persisted.
    CommitForeignEpoch {
        extra_ms: u64,
    },
    /// The worker's fence; same_epoch models a worker restart on the same timeline.
    Fence {
        same_epoch: bool,
        advance_ms: u64,
    },
    StepDown,
    ClockForward(u64),
    ClockBack(u64),
    ClockJump(u64),
}

fn count() -> impl Strategy<Value = u32> {
    prop_oneof![
        8 => 1..=16u32,
        3 => 1..=MAX_BATCH,
        2 => (MAX_BATCH - 16)..=MAX_BATCH,
        1 => prop_oneof![Just(0), (MAX_BATCH + 1)..=u32::MAX],
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        30 => count().prop_map(Op::Grant),
        4 => (0..=WINDOW_AHEAD_MS).prop_map(|ahead_ms| Op::Extend { ahead_ms }),
        3 => (0..=WINDOW_AHEAD_MS).prop_map(|ahead_ms| Op::ExtendInFlight { ahead_ms }),
        3 => any::<Index>().prop_map(Op::CommitInFlight),
        1 => (0..10_000u64).prop_map(|extra_ms| Op::CommitForeignEpoch { extra_ms }),
        4 => (any::<bool>(), 0..4u64)
            .prop_map(|(same_epoch, advance_ms)| Op::Fence { same_epoch, advance_ms }),
        1 => Just(Op::StepDown),
        8 => (0..4u64).prop_map(Op::ClockForward),
        2 => prop_oneof![0..10u64, 0..3000u64].prop_map(Op::ClockBack),
        1 => prop_oneof![5..100u64, 10_000..100_000_000u64].prop_map(Op::ClockJump),
    ]
}

struct Model {
    alloc: Allocator,
    now: u64,
    /// The store's high-water: the largest value ever durably persisted.
    durable_ms: u64,
    /// The allocator's expected committed high-water (None when not serving).
    hw_ms: Option<u64>,
    epoch: u64,
    floor_ms: u64,
    /// Last timestamp issued in the current epoch (spec formula input).
    last_in_epoch: Option<u64>,
    /// Last timestamp issued by anyone, ever.
    last_ever: Option<u64>,
    issued: Vec<(u64, u64)>,
    in_flight: Vec<(u64, u64)>,
}

impl Model {
    fn new(now: u64) -> Self {
        Model {
            alloc: Allocator::new(),
            now,
            durable_ms: 0,
            hw_ms: None,
            epoch: 0,
            floor_ms: 0,
            last_in_epoch: None,
            last_ever: None,
            issued: Vec::new(),
            in_flight: Vec::new(),
        }
    }

    /// The store's "advance to at least": returns the actual durable value.
    fn persist(&mut self, at_least_ms: u64) -> u64 {
        self.durable_ms = self.durable_ms.max(at_least_ms);
        self.durable_ms
    }

    /// The first timestamp of a grant, computed straight from the spec's formula.
    fn expected_first(&self, count: u32) -> Result<u64, CoreError> {
        let Some(hw) = self.hw_ms else {
            return Err(CoreError::NotLeader);
        };
        let mut first =
            [self.last_in_epoch.map_or(0, |t| t + 1), self.now << 18, self.floor_ms << 18]
                .into_iter()
                .max()
                .unwrap();
        if logical(first) + u64::from(count) > LOGICAL_PER_MS {
            first = (physical_ms(first) + 1) << 18;
        }
        let phys = physical_ms(first);
        if phys > hw {
            Err(CoreError::WindowExhausted { needed_ms: phys, high_water_ms: hw })
        } else if phys > MAX_SQL_PHYSICAL_MS {
            Err(CoreError::PhysicalOutOfRange(phys))
        } else {
            Ok(first)
        }
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Grant(count) => self.grant(count)?,
            Op::Extend { ahead_ms } => {
                if let Ok(ext) = self.alloc.prepare_window_extension(self.now, ahead_ms) {
                    prop_assert!(ext.requested_ms > self.alloc.high_water_ms());
                    prop_assert!(ext.requested_ms >= self.now + ahead_ms);
                    let actual = self.persist(ext.requested_ms);
                    self.commit(actual, ext.epoch)?;
                } else {
                    prop_assert!(self.hw_ms.is_none());
                }
            }
            Op::ExtendInFlight { ahead_ms } => {
                if let Ok(ext) = self.alloc.prepare_window_extension(self.now, ahead_ms) {
                    let actual = self.persist(ext.requested_ms);
                    self.in_flight.push((actual, ext.epoch));
                }
            }
            Op::CommitInFlight(idx) => {
                if !self.in_flight.is_empty() {
                    let (actual, epoch) = self.in_flight.remove(idx.index(self.in_flight.len()));
                    self.commit(actual, epoch)?;
                }
            }
            Op::CommitForeignEpoch { extra_ms } => {
                let before = self.alloc;
                let foreign = self.epoch + 1_000_000;
                let r = self.alloc.commit_window_extension(self.durable_ms + 1 + extra_ms, foreign);
                prop_assert_eq!(
                    r,
                    Err(CoreError::EpochMismatch { current: self.alloc.epoch(), got: foreign })
                );
                prop_assert_eq!(self.alloc, before);
            }
            Op::Fence { same_epoch, advance_ms } => {
                // As the worker does: stop serving, load H, floor, persist, seed.
                self.alloc.step_down();
                if !same_epoch {
                    self.epoch += 1;
                }
                let floor = (self.durable_ms + 1).max(self.now);
                let actual = self.persist(floor + advance_ms);
                self.alloc.become_leader(floor, actual, self.epoch).map_err(fail)?;
                self.hw_ms = Some(actual);
                self.floor_ms = floor;
                self.last_in_epoch = None;
            }
            Op::StepDown => {
                self.alloc.step_down();
                self.hw_ms = None;
                prop_assert_eq!(self.alloc.try_grant(self.now, 1), Err(CoreError::NotLeader));
            }
            Op::ClockForward(ms) => self.now += ms,
            Op::ClockBack(ms) => self.now = self.now.saturating_sub(ms),
            Op::ClockJump(ms) => self.now += ms,
        }
        self.check_invariants()
    }

    fn grant(&mut self, count: u32) -> Result<(), TestCaseError> {
        let before = self.alloc;
        let predicted = self.alloc.would_grant(self.now, count);
        let got = self.alloc.try_grant(self.now, count);
        prop_assert_eq!(predicted, got.is_ok());
        if !(1..=MAX_BATCH).contains(&count) {
            let want = CoreError::InvalidCount { got: i64::from(count), max: 262_144 };
            prop_assert_eq!(got, Err(want));
            prop_assert_eq!(self.alloc, before);
            return Ok(());
        }
        prop_assert_eq!(&got, &self.expected_first(count));
        let first = match got {
            Ok(first) => first,
            Err(_) => {
                prop_assert_eq!(self.alloc, before, "a failed grant must not change state");
                return Ok(());
            }
        };
        let last = first + u64::from(count) - 1;
        // Strictly increasing in issue order, across leadership changes too.
        if let Some(prev) = self.last_ever {
            prop_assert!(first > prev, "first {} not above previous {}", first, prev);
        }
        // One millisecond per batch, and the logical counter never wraps.
        prop_assert_eq!(physical_ms(first), physical_ms(last));
        prop_assert!(logical(first) + u64::from(count) <= LOGICAL_PER_MS);
        // Inside [floor, committed high-water], and the committed value is durable.
        let phys = physical_ms(first);
        prop_assert!(phys >= self.floor_ms);
        prop_assert!(phys >= self.now);
        prop_assert!(phys <= self.alloc.high_water_ms());
        prop_assert!(phys <= self.durable_ms);
        // A non-negative bigint.
        prop_assert!(last <= i64::MAX as u64);
        prop_assert_eq!(self.alloc.last_issued(), Some(last));
        self.issued.push((first, last));
        self.last_in_epoch = Some(last);
        self.last_ever = Some(last);
        Ok(())
    }

    fn commit(&mut self, actual: u64, epoch: u64) -> Result<(), TestCaseError> {
        let before = self.alloc;
        let r = self.alloc.commit_window_extension(actual, epoch);
        match self.hw_ms {
            Some(hw) if epoch == self.epoch => {
                prop_assert_eq!(r, Ok(()));
                // Never lowers: a stale smaller value is absorbed.
                self.hw_ms = Some(hw.max(actual));
            }
            _ => {
                let want = CoreError::EpochMismatch { current: before.epoch(), got: epoch };
                prop_assert_eq!(r, Err(want));
                prop_assert_eq!(self.alloc, before);
            }
        }
        Ok(())
    }

    fn check_invariants(&self) -> Result<(), TestCaseError> {
        prop_assert_eq!(self.alloc.is_serving(), self.hw_ms.is_some());
        if let Some(hw) = self.hw_ms {
            prop_assert_eq!(self.alloc.high_water_ms(), hw);
            prop_assert!(hw <= self.durable_ms, "serving above the durable high-water");
            prop_assert_eq!(self.alloc.epoch(), Some(self.epoch));
            prop_assert!(self.alloc.floor_ms() <= hw);
            prop_assert_eq!(self.alloc.last_issued(), self.last_in_epoch);
            let left = self.alloc.window_left_ms(self.now);
            prop_assert!(left <= hw.saturating_sub(self.now));
            prop_assert_eq!(
                self.alloc.needs_extension(self.now, WINDOW_AHEAD_MS),
                left < WINDOW_AHEAD_MS / 2
            );
        } else {
            prop_assert_eq!(self.alloc.epoch(), None);
            prop_assert_eq!(self.alloc.window_left_ms(self.now), 0);
            prop_assert!(!self.alloc.needs_extension(self.now, WINDOW_AHEAD_MS));
        }
        Ok(())
    }
}

fn fail(e: CoreError) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn allocator_is_safe_under_random_operations(
        ops in prop::collection::vec(op(), 1..200),
        start_serving in prop::bool::weighted(0.9),
        // Now and then start a few milliseconds before the last SQL-representable one.
        near_end in prop::bool::weighted(0.1),
    ) {
        let mut m = Model::new(if near_end { MAX_SQL_PHYSICAL_MS - 5 } else { T0 });
        if start_serving {
            m.step(&Op::Fence { same_epoch: false, advance_ms: 3 })?;
        }
        for op in &ops {
            m.step(op)?;
        }
        // No timestamp issued twice: the issued ranges are pairwise disjoint.
        let mut ranges = m.issued.clone();
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            prop_assert!(w[0].1 < w[1].0, "overlapping ranges {:?} and {:?}", w[0], w[1]);
        }
    }

    /// A saturated millisecond spills into the next one, and batches that exactly fill the
    /// logical space tile it with no gap.
    #[test]
    fn batches_tile_milliseconds(counts in prop::collection::vec(1..=MAX_BATCH, 1..50)) {
        let mut a = Allocator::new();
        a.become_leader(T0, T0 + 1_000, 1).map_err(fail)?;
        let mut next = pack(T0, 0).map_err(fail)?;
        for c in counts {
            let first = a.try_grant(T0, c).map_err(fail)?;
            let fits = logical(next) + u64::from(c) <= LOGICAL_PER_MS;
            let want = if fits { next } else { (physical_ms(next) + 1) << 18 };
            prop_assert_eq!(first, want);
            next = first + u64::from(c);
        }
    }
}

proptest! {
    /// The lead cap: what is served never exceeds the committed high-water, nor
    /// `max(reference, floor) + max_lead`; an extension within the cap only ever raises the
    /// high-water, and never past the cap. The wall clock (`now`) may be anywhere relative
    /// to the reference (behind it after a step back).
    #[test]
    fn the_lead_cap_bounds_what_is_served(
        floor in 1u64..1_000_000,
        above in 0u64..100_000,
        now in 0u64..1_200_000,
        ahead in 0u64..200_000,
        window in 1u64..20_000,
        lead in 1u64..50_000,
    ) {
        let mut a = Allocator::new();
        a.become_leader(floor, floor + above, 1).map_err(fail)?;
        let reference = now + ahead;
        let bound = a.serving_bound_ms(reference, lead);
        prop_assert!(bound <= a.high_water_ms());
        prop_assert!(bound <= reference.max(floor) + lead);
        prop_assert!(bound >= floor.min(a.high_water_ms()), "the floor is always servable");
        match a.prepare_capped_extension(now, reference, window, lead).map_err(fail)? {
            Some(ext) => {
                prop_assert!(ext.requested_ms > a.high_water_ms());
                prop_assert!(ext.requested_ms <= reference.max(floor) + lead);
                prop_assert!(ext.requested_ms <= (a.high_water_ms() + 1).max(now) + window);
            }
            None => prop_assert!(a.high_water_ms() >= reference.max(floor) + lead, "no extension only at the cap"),
        }
    }

    /// No stall after a step back: with the reference clock driving the cap, callers whose
    /// wall clock stepped back by any amount keep being served above the last timestamp
    /// (from the lock-free window the worker keeps at the serving bound), never above the
    /// reference plus the lead.
    #[test]
    fn a_step_back_never_stalls_the_served_window(
        step_back in 0u64..10_000_000,
        ticks in proptest::collection::vec((1u64..400, 1u32..1_000), 1..300),
    ) {
        use tsoracle_core::clock::ReferenceClock;
        use tsoracle_core::window::AtomicWindow;
        const LEAD: u64 = 10_000;
        const WINDOW: u64 = 3_000;
        let (mut wall, mut mono) = (1_700_000_000_000u64, 0u64);
        let mut clock = ReferenceClock::new();
        clock.observe(wall, mono);
        let mut a = Allocator::new();
        a.become_leader(wall, wall + WINDOW, 1).map_err(fail)?;
        let window = AtomicWindow::new();
        window.open(wall, a.serving_bound_ms(clock.reference_ms(), LEAD)).map_err(fail)?;
        let mut last = window.try_grant(wall, 1).map_err(fail)?;
        wall -= step_back;
        for (elapsed, count) in ticks {
            wall += elapsed;
            mono += elapsed;
            clock.observe(wall, mono);
            let reference = clock.reference_ms();
            // The worker's tick: extend within the cap, publish the serving bound.
            a.observe_issued(window.next_ts());
            if a.needs_capped_extension(wall, reference, WINDOW, LEAD) {
                if let Some(ext) = a.prepare_capped_extension(wall, reference, WINDOW, LEAD).map_err(fail)? {
                    a.commit_window_extension(ext.requested_ms, ext.epoch).map_err(fail)?;
                }
            }
            window.extend(a.serving_bound_ms(reference, LEAD));
            let ts = window.try_grant(wall, count).map_err(fail)?;
            prop_assert!(ts > last);
            prop_assert!(physical_ms(ts) <= reference + LEAD);
            last = ts;
        }
    }
}
