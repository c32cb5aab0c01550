//! Property tests of the lease table against a plain model (a Vec of records with the
//! rules written out directly) over random operation sequences.

use proptest::prelude::*;
use proptest::sample::Index;
use std::collections::HashMap;
use tsoracle_core::error::CoreError;
use tsoracle_core::lease::{AcquireOutcome, Lease, LeaseTable, MAX_HOLDS};

const HOLDERS: [&str; 3] = ["a", "b", "c"];

#[derive(Clone, Debug)]
enum Op {
    /// `plan_then_apply` takes the decide → persist → apply path instead of `acquire`.
    Acquire {
        holder: usize,
        epoch: i64,
        ttl: u64,
        plan_then_apply: bool,
        reuse_id: Option<Index>,
    },
    /// `stale_ms` offers a bound below the current high-water (a reordered caller).
    Renew {
        pick: Index,
        unknown: bool,
        ttl: u64,
        plan_then_apply: bool,
        stale_ms: u64,
    },
    Release {
        pick: Index,
        unknown: bool,
    },
    Expire,
    Clock(u64),
    /// The committed high-water moves on (lease bounds come from it).
    HighWater(u64),
    /// The fence: reload from the persisted rows.
    Reload,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..HOLDERS.len(), 0..4i64, 1..40u64, any::<bool>(), prop::option::weighted(0.1, any::<Index>()))
            .prop_map(|(holder, epoch, ttl, plan_then_apply, reuse_id)| Op::Acquire { holder, epoch, ttl, plan_then_apply, reuse_id }),
        4 => (any::<Index>(), prop::bool::weighted(0.1), 1..40u64, any::<bool>(), prop_oneof![3 => Just(0u64), 1 => 0..30u64])
            .prop_map(|(pick, unknown, ttl, plan_then_apply, stale_ms)| Op::Renew { pick, unknown, ttl, plan_then_apply, stale_ms }),
        2 => (any::<Index>(), prop::bool::weighted(0.2)).prop_map(|(pick, unknown)| Op::Release { pick, unknown }),
        1 => Just(Op::Expire),
        4 => (0..15u64).prop_map(Op::Clock),
        3 => (0..20u64).prop_map(Op::HighWater),
        1 => Just(Op::Reload),
    ]
}

struct Model {
    table: LeaseTable,
    records: Vec<Lease>,
    now: u64,
    high_water: u64,
    next_id: i64,
    /// Every id ever handed out, to prove ids are never reused.
    ids_ever: Vec<i64>,
    /// Every earlier grant of each lease, exactly (lowest stamp, expiry): what the table's
    /// bounded holds must never let the resolved timestamp pass.
    grants: HashMap<i64, Vec<(u64, u64)>>,
}

impl Model {
    fn pick_id(&self, pick: Index, unknown: bool) -> i64 {
        if unknown || self.ids_ever.is_empty() {
            -1
        } else {
            self.ids_ever[pick.index(self.ids_ever.len())]
        }
    }

    fn model_acquire(
        &self,
        holder: &str,
        epoch: i64,
        ttl: u64,
        id: i64,
    ) -> Result<AcquireOutcome, CoreError> {
        let active = self
            .records
            .iter()
            .find(|r| r.holder == holder && !r.superseded && self.now < r.expires_at_ms);
        match active {
            Some(a) if a.holder_epoch == epoch => return Ok(AcquireOutcome::Existing(a.clone())),
            Some(a) if a.holder_epoch > epoch => {
                return Err(CoreError::StaleHolderEpoch { got: epoch, active: a.holder_epoch })
            }
            _ => {}
        }
        if self.records.iter().any(|r| r.id == id) {
            return Err(CoreError::DuplicateLeaseId(id));
        }
        Ok(AcquireOutcome::New {
            lease: Lease {
                id,
                holder: holder.to_string(),
                holder_epoch: epoch,
                ts_upper_bound_ms: self.high_water,
                expires_at_ms: self.now + ttl,
                ttl_ms: ttl,
                superseded: false,
                owner: 0,
                stamp_from_ms: self.now.min(self.high_water),
                holds: Vec::new(),
            },
            superseded: active.map(|a| a.id),
        })
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let ids_before: Vec<i64> = self.table.iter().map(|l| l.id).collect();
        let mut removed: Vec<i64> = Vec::new();
        match *op {
            Op::Acquire { holder, epoch, ttl, plan_then_apply, reuse_id } => {
                let holder = HOLDERS[holder];
                let id = match reuse_id {
                    Some(pick) if !self.records.is_empty() => {
                        self.records[pick.index(self.records.len())].id
                    }
                    _ => self.next_id,
                };
                let want = self.model_acquire(holder, epoch, ttl, id);
                let got = if plan_then_apply {
                    let before = self.table.clone();
                    let plan = self.table.plan_acquire(
                        holder,
                        epoch,
                        ttl,
                        self.now,
                        self.high_water,
                        id,
                        0,
                        self.now,
                    );
                    prop_assert_eq!(&self.table, &before, "plan must not change the table");
                    plan.inspect(|p| self.table.apply_acquire(p))
                } else {
                    self.table.acquire(
                        holder,
                        epoch,
                        ttl,
                        self.now,
                        self.high_water,
                        id,
                        0,
                        self.now,
                    )
                };
                prop_assert_eq!(&got, &want);
                if let Ok(AcquireOutcome::New { lease, superseded }) = want {
                    if let Some(old) = superseded {
                        if let Some(r) = self.records.iter_mut().find(|r| r.id == old) {
                            r.superseded = true;
                        }
                    }
                    prop_assert!(!self.ids_ever.contains(&lease.id), "id {} reused", lease.id);
                    self.ids_ever.push(lease.id);
                    self.records.push(lease);
                    self.next_id += 1;
                }
            }
            Op::Renew { pick, unknown, ttl, plan_then_apply, stale_ms } => {
                let id = self.pick_id(pick, unknown);
                let bound = self.high_water - stale_ms;
                let want = match self.records.iter().find(|r| r.id == id) {
                    None => Err(CoreError::LeaseNotFound(id)),
                    Some(r) if r.superseded || self.now >= r.expires_at_ms => {
                        Err(CoreError::LeaseNotRenewable(id))
                    }
                    Some(r) => Ok(Lease {
                        expires_at_ms: self.now + ttl,
                        ts_upper_bound_ms: r.ts_upper_bound_ms.max(bound),
                        stamp_from_ms: r
                            .stamp_from_ms
                            .max(self.now)
                            .min(r.ts_upper_bound_ms.max(bound)),
                        ..r.clone()
                    }),
                };
                let previous = self.records.iter().find(|r| r.id == id).cloned();
                let got = if plan_then_apply {
                    let plan = self.table.plan_renew(id, ttl, (self.now, 0), bound, self.now, 0);
                    plan.inspect(|l| self.table.apply_renew(l))
                } else {
                    self.table.renew(id, ttl, (self.now, 0), bound, self.now, 0)
                };
                // The holds are the table's own bookkeeping (checked against every grant below).
                prop_assert_eq!(
                    got.clone().map(|l| Lease { holds: Vec::new(), ..l }),
                    want.clone().map(|l| Lease { holds: Vec::new(), ..l })
                );
                if let (Ok(renewed), Some(previous)) = (got, previous) {
                    self.grants
                        .entry(id)
                        .or_default()
                        .push((previous.stamp_from_ms, previous.expires_at_ms));
                    if let Some(r) = self.records.iter_mut().find(|r| r.id == id) {
                        *r = renewed;
                    }
                }
            }
            Op::Release { pick, unknown } => {
                let id = self.pick_id(pick, unknown);
                let want =
                    self.records.iter().position(|r| r.id == id).map(|i| self.records.remove(i));
                prop_assert_eq!(self.table.release(id), want);
                removed.push(id);
            }
            Op::Expire => {
                let now = self.now;
                let mut want: Vec<i64> =
                    self.records.iter().filter(|r| now >= r.expires_at_ms).map(|r| r.id).collect();
                self.records.retain(|r| now < r.expires_at_ms);
                let mut got = self.table.expire(now);
                got.sort_unstable();
                want.sort_unstable();
                prop_assert_eq!(&got, &want);
                removed = got;
            }
            Op::Clock(ms) => self.now += ms,
            Op::HighWater(ms) => self.high_water += ms,
            Op::Reload => {
                let rows: Vec<Lease> = self.table.iter().cloned().collect();
                self.table = LeaseTable::load(rows, self.now)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let now = self.now;
                removed =
                    self.records.iter().filter(|r| now >= r.expires_at_ms).map(|r| r.id).collect();
                self.records.retain(|r| now < r.expires_at_ms);
            }
        }
        self.check(&ids_before, &removed)
    }

    fn check(&self, ids_before: &[i64], removed: &[i64]) -> Result<(), TestCaseError> {
        // Table and model agree, record for record.
        let mut want = self.records.clone();
        want.sort_by_key(|r| r.id);
        let got: Vec<Lease> = self.table.iter().cloned().collect();
        prop_assert_eq!(&got, &want);
        // No lease is lost except by release or expiry.
        for id in ids_before {
            prop_assert!(
                self.table.get(*id).is_some() || removed.contains(id),
                "lease {} lost",
                id
            );
        }
        // Ids unique; at most one active lease per holder.
        for w in got.windows(2) {
            prop_assert!(w[0].id < w[1].id);
        }
        for h in HOLDERS {
            let active = got.iter().filter(|l| l.holder == h && l.is_active(self.now)).count();
            prop_assert!(active <= 1);
        }
        // The frontier is the high-water held down by every live bound, superseded or not.
        let f = self.table.frontier(self.high_water, self.now);
        let want_f = self
            .records
            .iter()
            .filter(|r| self.now < r.expires_at_ms)
            .map(|r| r.ts_upper_bound_ms)
            .min()
            .map_or(self.high_water, |b| b.min(self.high_water));
        prop_assert_eq!(f, want_f);
        prop_assert!(f <= self.high_water);
        // The resolved timestamp's part: a lease never lets R pass a grant whose expiry has
        // not passed, at any later moment, however many grants it had; and it remembers at
        // most MAX_HOLDS.
        for lease in &got {
            prop_assert!(lease.holds.len() <= MAX_HOLDS);
            prop_assert!(lease.stamp_from_ms <= lease.ts_upper_bound_ms);
            for later in self.now..self.now + 60 {
                let exact = self
                    .grants
                    .get(&lease.id)
                    .into_iter()
                    .flatten()
                    .filter(|&&(_, until)| later < until)
                    .map(|&(from, _)| from)
                    .fold(lease.stamp_from_ms, u64::min);
                prop_assert!(
                    lease.held_from_ms(later, 0) <= exact,
                    "lease {} held from {} at {}, above a live grant from {}",
                    lease.id,
                    lease.held_from_ms(later, 0),
                    later,
                    exact
                );
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn lease_table_matches_model(ops in prop::collection::vec(op(), 1..120)) {
        let mut m = Model {
            table: LeaseTable::new(),
            records: Vec::new(),
            now: 1_000,
            high_water: 5_000,
            next_id: 1,
            ids_ever: Vec::new(),
            grants: HashMap::new(),
        };
        for op in &ops {
            m.step(op)?;
        }
    }
}

proptest! {
    /// Publishing never ignores a live lease: with any number of leases and any capacity, at
    /// every later moment (on either clock) the published frontier is at or below the true
    /// one, and equal to it when everything fits.
    #[test]
    fn published_bounds_never_ignore_a_live_lease(
        leases in proptest::collection::vec((0u64..10_000, 0u64..2_000, 0u64..2_000, 0u64..2_000), 0..300),
        capacity in 1usize..40,
        later in proptest::collection::vec((0u64..2_500, 0u64..2_500), 1..20),
    ) {
        use tsoracle_core::lease::{earliest_live_from, frontier, PublishedBound, PublishedBounds};
        let all: Vec<PublishedBound> = leases
            .iter()
            .map(|&(bound_ms, expires_at_ms, expires_mono_ms, held_from_ms)| PublishedBound {
                bound_ms,
                expires_at_ms,
                expires_mono_ms,
                held_from_ms,
            })
            .collect();
        let published = PublishedBounds::new(all.clone(), capacity);
        prop_assert!(published.entries().len() <= capacity);
        prop_assert_eq!(published.live(), all.len());
        for (wall, mono) in later {
            let truth = frontier(u64::MAX, &all, wall, mono);
            let seen = frontier(u64::MAX, published.entries(), wall, mono);
            prop_assert!(seen <= truth, "published frontier {} above the true {}", seen, truth);
            // The resolved timestamp's lease part: never later than the true one.
            let from_truth = earliest_live_from(&all, wall, mono);
            let from_seen = earliest_live_from(published.entries(), wall, mono);
            prop_assert!(from_truth.is_none() || from_seen.is_some_and(|s| s <= from_truth.unwrap()));
            if all.len() <= capacity {
                prop_assert_eq!(seen, truth);
                prop_assert_eq!(from_seen, from_truth);
            }
        }
    }
}

proptest! {
    /// Acquire and renewal bounds: a new bound is above the high-water (a unique id) and gives
    /// the holder its TTL from now; renewals never stack (renewing again at the same moment
    /// moves nothing), and neither moves the high-water past max(H + 1, now + ttl).
    #[test]
    fn lease_bounds_are_unique_cover_the_ttl_and_do_not_stack(
        high_water in 0u64..2_000_000_000_000,
        now in 0u64..2_000_000_000_000,
        ttl in 1u64..86_400_000,
        renewals in 1usize..50,
    ) {
        use tsoracle_core::lease::{acquire_bound_ms, renewal_bound_ms};
        let bound = acquire_bound_ms(high_water, now, ttl);
        prop_assert!(bound > high_water);
        prop_assert!(bound >= now + ttl);
        prop_assert_eq!(bound, (high_water + 1).max(now + ttl));
        let mut hw = bound;
        for _ in 0..renewals {
            let renewed = renewal_bound_ms(hw, now, ttl, 0);
            prop_assert!(renewed >= hw && renewed >= now + ttl);
            prop_assert_eq!(renewed, hw, "renewing at the same moment moves nothing");
            hw = renewed;
        }
        prop_assert_eq!(renewal_bound_ms(high_water, now, ttl, 0), high_water.max(now + ttl));
        // A renewal's lowest stamp always fits under its bound.
        prop_assert!(renewal_bound_ms(high_water, now, ttl, high_water + 1) > high_water);
    }
}
