//! Serving leases (docs/leases.md). Every live lease holds the safe frontier at
//! or below its `ts_upper_bound_ms` (a committed high-water) until it expires or is released.
//!
//! The table is pure and lives in the worker's memory (not in shared memory, so it may use
//! the heap). Each mutation is split so the worker can decide (`plan_*`, no change),
//! persist the result in the database, then apply it (`apply_*`). To group-commit several
//! requests, run them on a clone of the table and swap the clone in after the commit.

use std::collections::BTreeMap;

use crate::error::CoreError;

pub const MAX_HOLDER_BYTES: usize = 128;

/// Most earlier grants a lease remembers for the resolved timestamp; more are merged (see
/// [`add_hold`]).
pub const MAX_HOLDS: usize = 8;

/// An earlier grant (acquire or renewal) of a lease that may still hold the resolved
/// timestamp: its holder may still be committing rows it stamped from `from_ms` on, until
/// `until_ms` (the expiry that grant announced), on the server's wall clock and, within the
/// worker's life, on the monotonic clock (`until_mono_ms`; 0: unknown, for a grant loaded at a
/// fence).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold {
    pub from_ms: u64,
    pub until_ms: u64,
    pub until_mono_ms: u64,
}

impl Hold {
    pub fn is_live(&self, wall_ms: u64, mono_ms: u64) -> bool {
        wall_ms < self.until_ms || mono_ms < self.until_mono_ms
    }
}

/// `holds` with `hold` added and those no longer live at (`wall_ms`, `mono_ms`) dropped, in
/// expiry order, at most [`MAX_HOLDS`]: beyond that the two latest are merged into one that
/// starts at the earlier `from_ms` and lasts to the later expiry. A merged hold holds at least
/// as low and as long as the two it replaces, so the resolved timestamp never passes a value a
/// holder may still commit; the oldest holds keep their own expiry and go first.
pub fn add_hold(holds: &[Hold], hold: Hold, wall_ms: u64, mono_ms: u64) -> Vec<Hold> {
    let mut out: Vec<Hold> =
        holds.iter().copied().chain([hold]).filter(|h| h.is_live(wall_ms, mono_ms)).collect();
    out.sort_by_key(|h| (h.until_ms, h.until_mono_ms));
    while out.len() > MAX_HOLDS {
        let (Some(last), Some(before)) = (out.pop(), out.pop()) else { break };
        out.push(Hold {
            from_ms: last.from_ms.min(before.from_ms),
            until_ms: last.until_ms.max(before.until_ms),
            until_mono_ms: last.until_mono_ms.max(before.until_mono_ms),
        });
    }
    out
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub id: i64,
    pub holder: String,
    pub holder_epoch: i64,
    pub ts_upper_bound_ms: u64,
    pub expires_at_ms: u64,
    /// The TTL it was acquired with; a renewal re-arms it.
    pub ttl_ms: u64,
    pub superseded: bool,
    /// The role (OID) that acquired it: only that role or a superuser may renew or release
    /// it, or acquire for its holder. 0 = unknown (a lease from before owners existed).
    pub owner: u32,
    /// The lowest millisecond its holder may stamp under its latest grant (`ts_lower_bound`):
    /// above every resolved timestamp handed out before that grant became visible.
    pub stamp_from_ms: u64,
    /// Earlier grants whose expiry has not passed: their holder may still commit rows
    /// stamped under them.
    pub holds: Vec<Hold>,
}

impl Lease {
    /// A lease is live while `now_ms < expires_at_ms`; only live leases hold the frontier.
    pub fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.expires_at_ms
    }

    /// The holder's current lease: live and not superseded by a higher holder epoch.
    pub fn is_active(&self, now_ms: u64) -> bool {
        self.is_live(now_ms) && !self.superseded
    }

    /// The first millisecond its holder may still be committing rows in, at (`wall_ms`,
    /// `mono_ms`): the lowest `from_ms` of its latest grant and of every earlier grant still
    /// live. The resolved timestamp stays below it while the lease lives.
    pub fn held_from_ms(&self, wall_ms: u64, mono_ms: u64) -> u64 {
        self.holds
            .iter()
            .filter(|h| h.is_live(wall_ms, mono_ms))
            .map(|h| h.from_ms)
            .fold(self.stamp_from_ms, u64::min)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// Same holder, same holder epoch, still active: idempotent, nothing to write.
    Existing(Lease),
    /// Insert `lease`; if `superseded` is set, mark that lease superseded in the same
    /// transaction.
    New { lease: Lease, superseded: Option<i64> },
}

/// A holder name is 1 to 128 bytes.
pub fn validate_holder(holder: &str) -> Result<(), CoreError> {
    if holder.is_empty() || holder.len() > MAX_HOLDER_BYTES {
        return Err(CoreError::InvalidHolder { got: holder.len(), max: MAX_HOLDER_BYTES });
    }
    Ok(())
}

/// A TTL must be in `min..=max` (and positive: a lease must be born live).
pub fn validate_ttl(ttl_ms: i64, min: i64, max: i64) -> Result<u64, CoreError> {
    match u64::try_from(ttl_ms) {
        Ok(ttl) if ttl_ms >= min && ttl_ms <= max && ttl > 0 => Ok(ttl),
        _ => Err(CoreError::InvalidTtl { got: ttl_ms, min, max }),
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseTable {
    leases: BTreeMap<i64, Lease>,
}

impl LeaseTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Seed from the durable rows at the fence, dropping those already expired.
    pub fn load(rows: impl IntoIterator<Item = Lease>, now_ms: u64) -> Result<Self, CoreError> {
        let mut table = Self::new();
        for lease in rows.into_iter().filter(|l| l.is_live(now_ms)) {
            if table.leases.contains_key(&lease.id) {
                return Err(CoreError::DuplicateLeaseId(lease.id));
            }
            table.leases.insert(lease.id, lease);
        }
        Ok(table)
    }

    pub fn get(&self, id: i64) -> Option<&Lease> {
        self.leases.get(&id)
    }

    /// All leases, live or not yet expired away, in id order.
    pub fn iter(&self) -> impl Iterator<Item = &Lease> {
        self.leases.values()
    }

    pub fn len(&self) -> usize {
        self.leases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// The holder's active lease, if any (there is at most one).
    pub fn active_lease(&self, holder: &str, now_ms: u64) -> Option<&Lease> {
        self.iter().find(|l| l.holder == holder && l.is_active(now_ms))
    }

    /// Decide an acquire without changing the table. `new_bound_ms` is the high-water the
    /// caller has already committed; `new_id` is used only for a new lease; `stamp_from_ms`
    /// is its lowest stamp (see [`Lease::stamp_from_ms`]).
    // The arguments mirror tso_lease_acquire's plus the worker's clock, bound and id; a
    // struct would only wrap them at each of the many call sites (tests included).
    #[allow(clippy::too_many_arguments)]
    pub fn plan_acquire(
        &self,
        holder: &str,
        holder_epoch: i64,
        ttl_ms: u64,
        now_ms: u64,
        new_bound_ms: u64,
        new_id: i64,
        owner: u32,
        stamp_from_ms: u64,
    ) -> Result<AcquireOutcome, CoreError> {
        validate_holder(holder)?;
        let active = self.active_lease(holder, now_ms);
        if let Some(active) = active {
            if holder_epoch == active.holder_epoch {
                return Ok(AcquireOutcome::Existing(active.clone()));
            }
            if holder_epoch < active.holder_epoch {
                return Err(CoreError::StaleHolderEpoch {
                    got: holder_epoch,
                    active: active.holder_epoch,
                });
            }
        }
        if self.leases.contains_key(&new_id) {
            return Err(CoreError::DuplicateLeaseId(new_id));
        }
        Ok(AcquireOutcome::New {
            lease: Lease {
                id: new_id,
                holder: holder.to_owned(),
                holder_epoch,
                ts_upper_bound_ms: new_bound_ms,
                expires_at_ms: now_ms.saturating_add(ttl_ms),
                ttl_ms,
                superseded: false,
                owner,
                stamp_from_ms: stamp_from_ms.min(new_bound_ms),
                holds: Vec::new(),
            },
            superseded: active.map(|l| l.id),
        })
    }

    /// Apply a planned (and persisted) acquire.
    pub fn apply_acquire(&mut self, outcome: &AcquireOutcome) {
        if let AcquireOutcome::New { lease, superseded } = outcome {
            if let Some(old) = superseded.and_then(|id| self.leases.get_mut(&id)) {
                old.superseded = true;
            }
            self.leases.insert(lease.id, lease.clone());
        }
    }

    // Same arguments as `plan_acquire`.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire(
        &mut self,
        holder: &str,
        holder_epoch: i64,
        ttl_ms: u64,
        now_ms: u64,
        new_bound_ms: u64,
        new_id: i64,
        owner: u32,
        stamp_from_ms: u64,
    ) -> Result<AcquireOutcome, CoreError> {
        let outcome = self.plan_acquire(
            holder,
            holder_epoch,
            ttl_ms,
            now_ms,
            new_bound_ms,
            new_id,
            owner,
            stamp_from_ms,
        )?;
        self.apply_acquire(&outcome);
        Ok(outcome)
    }

    /// Decide a renewal without changing the table: the lease as it should be stored.
    /// The bound never goes down (the high-water it comes from never does either), nor does
    /// the lowest stamp; the grant it replaces becomes a [`Hold`] until its own expiry
    /// (`prev_until_mono_ms` on the monotonic clock, 0 if unknown), since its holder may
    /// still commit rows stamped under it.
    pub fn plan_renew(
        &self,
        id: i64,
        ttl_ms: u64,
        now: (u64, u64),
        new_bound_ms: u64,
        stamp_from_ms: u64,
        prev_until_mono_ms: u64,
    ) -> Result<Lease, CoreError> {
        let (now_ms, mono_ms) = now;
        let lease = self.leases.get(&id).ok_or(CoreError::LeaseNotFound(id))?;
        if !lease.is_active(now_ms) {
            return Err(CoreError::LeaseNotRenewable(id));
        }
        let previous = Hold {
            from_ms: lease.stamp_from_ms,
            until_ms: lease.expires_at_ms,
            until_mono_ms: prev_until_mono_ms,
        };
        let bound = lease.ts_upper_bound_ms.max(new_bound_ms);
        Ok(Lease {
            ts_upper_bound_ms: bound,
            expires_at_ms: now_ms.saturating_add(ttl_ms),
            stamp_from_ms: lease.stamp_from_ms.max(stamp_from_ms).min(bound),
            holds: add_hold(&lease.holds, previous, now_ms, mono_ms),
            ..lease.clone()
        })
    }

    /// Apply a planned (and persisted) renewal.
    pub fn apply_renew(&mut self, renewed: &Lease) {
        self.leases.insert(renewed.id, renewed.clone());
    }

    pub fn renew(
        &mut self,
        id: i64,
        ttl_ms: u64,
        now: (u64, u64),
        new_bound_ms: u64,
        stamp_from_ms: u64,
        prev_until_mono_ms: u64,
    ) -> Result<Lease, CoreError> {
        let renewed =
            self.plan_renew(id, ttl_ms, now, new_bound_ms, stamp_from_ms, prev_until_mono_ms)?;
        self.apply_renew(&renewed);
        Ok(renewed)
    }

    /// Remove a lease (active or superseded); idempotent. Returns what was removed.
    pub fn release(&mut self, id: i64) -> Option<Lease> {
        self.leases.remove(&id)
    }

    /// Drop every expired lease; returns their ids.
    pub fn expire(&mut self, now_ms: u64) -> Vec<i64> {
        let expired: Vec<i64> = self.iter().filter(|l| !l.is_live(now_ms)).map(|l| l.id).collect();
        for id in &expired {
            self.leases.remove(id);
        }
        expired
    }

    /// The safe frontier: the high-water, held down by the bound of every live lease
    /// (superseded ones too, until they expire). The model the property tests hold the table
    /// to; production publishes [`PublishedBounds`] and every backend computes [`frontier`].
    pub fn frontier(&self, high_water_ms: u64, now_ms: u64) -> u64 {
        self.iter()
            .filter(|l| l.is_live(now_ms))
            .map(|l| l.ts_upper_bound_ms)
            .fold(high_water_ms, u64::min)
    }
}

/// A new lease's bound, which is also its id: the high-water moved to at least
/// `max(high_water + 1, now + ttl)`, so ids are unique (each is above every earlier bound) and
/// grants do not stack (the high-water moves no further than `now + ttl` unless it is already
/// there). Within the timestamp range.
pub fn acquire_bound_ms(high_water_ms: u64, now_ms: u64, ttl_ms: u64) -> u64 {
    high_water_ms
        .saturating_add(1)
        .max(now_ms.saturating_add(ttl_ms))
        .min(crate::timestamp::MAX_SQL_PHYSICAL_MS)
}

/// A renewal's bound: `max(high_water, now + ttl, stamp_from)` (a renewal makes no id; its
/// lowest stamp `stamp_from` must fit under it). However often a lease is renewed, the
/// high-water ends no further than `now + ttl`, or one past what the oracle has issued.
pub fn renewal_bound_ms(high_water_ms: u64, now_ms: u64, ttl_ms: u64, stamp_from_ms: u64) -> u64 {
    high_water_ms
        .max(now_ms.saturating_add(ttl_ms))
        .max(stamp_from_ms)
        .min(crate::timestamp::MAX_SQL_PHYSICAL_MS)
}

/// A grant's lowest stamp: the millisecond after `issued`, a timestamp the oracle issued once
/// everything the resolved timestamp had handed out was below it (the worker takes it through
/// a holder slot, as any caller does): every `R` handed out before the grant becomes visible
/// is below `issued`, so below the first value of this millisecond.
pub fn stamp_from_ms(issued: u64) -> u64 {
    crate::timestamp::physical_ms(issued).saturating_add(1)
}

/// One live lease as published for the frontier: its bound and when it stops holding the
/// frontier, on the wall clock and on the worker's monotonic clock (0: not known, for a lease
/// loaded before this server's life). It holds the frontier until both have passed, so a
/// step of the server's wall clock in either direction never ends it early.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct PublishedBound {
    pub bound_ms: u64,
    pub expires_at_ms: u64,
    pub expires_mono_ms: u64,
    /// The first millisecond its holder may still be committing rows in
    /// ([`Lease::held_from_ms`] when published). It holds the resolved timestamp below it.
    pub held_from_ms: u64,
}

impl PublishedBound {
    pub fn is_live(&self, wall_ms: u64, mono_ms: u64) -> bool {
        wall_ms < self.expires_at_ms || mono_ms < self.expires_mono_ms
    }
}

/// What the worker publishes: at most `capacity` entries that hold the frontier at least as
/// low as the live leases do, at every later moment. When there are more live leases than
/// entries, the lowest `capacity - 1` bounds are kept as they are and the rest become one
/// entry with the lowest of their bounds and the latest of their expiries: while any of them
/// is live, that entry is live and at or below its bound. Nothing is ever left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishedBounds {
    entries: Vec<PublishedBound>,
    live: usize,
}

impl PublishedBounds {
    pub fn new(live: impl IntoIterator<Item = PublishedBound>, capacity: usize) -> Self {
        let mut entries: Vec<PublishedBound> = live.into_iter().collect();
        let live = entries.len();
        entries.sort_unstable_by_key(|b| b.bound_ms);
        if capacity > 0 && entries.len() > capacity {
            let rest = entries.split_off(capacity - 1);
            entries.push(PublishedBound {
                bound_ms: rest[0].bound_ms,
                expires_at_ms: rest.iter().map(|b| b.expires_at_ms).max().unwrap_or(0),
                expires_mono_ms: rest.iter().map(|b| b.expires_mono_ms).max().unwrap_or(0),
                held_from_ms: rest.iter().map(|b| b.held_from_ms).min().unwrap_or(0),
            });
        } else if capacity == 0 && !entries.is_empty() {
            // Nowhere to publish: never happens with the shared table, refuse to mislead.
            entries.clear();
        }
        PublishedBounds { entries, live }
    }

    pub fn entries(&self) -> &[PublishedBound] {
        &self.entries
    }

    /// How many live leases were published (possibly more than `entries`).
    pub fn live(&self) -> usize {
        self.live
    }
}

/// The lowest bound among the published entries still live at (`wall_ms`, `mono_ms`): the
/// lease part of the safe frontier, as every backend computes it.
pub fn lowest_live_bound(entries: &[PublishedBound], wall_ms: u64, mono_ms: u64) -> Option<u64> {
    entries.iter().filter(|b| b.is_live(wall_ms, mono_ms)).map(|b| b.bound_ms).min()
}

/// The first millisecond any lease still live at (`wall_ms`, `mono_ms`) may be stamped in:
/// the lease part of the resolved timestamp.
pub fn earliest_live_from(entries: &[PublishedBound], wall_ms: u64, mono_ms: u64) -> Option<u64> {
    entries.iter().filter(|b| b.is_live(wall_ms, mono_ms)).map(|b| b.held_from_ms).min()
}

/// The safe frontier from published bounds: the high-water, held down by every live bound.
pub fn frontier(high_water_ms: u64, entries: &[PublishedBound], wall_ms: u64, mono_ms: u64) -> u64 {
    lowest_live_bound(entries, wall_ms, mono_ms).map_or(high_water_ms, |b| b.min(high_water_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert!(validate_holder("indexer-7").is_ok());
        assert_eq!(validate_holder(""), Err(CoreError::InvalidHolder { got: 0, max: 128 }));
        assert!(validate_holder(&"é".repeat(64)).is_ok());
        assert!(validate_holder(&"é".repeat(65)).is_err());
        assert_eq!(validate_ttl(30_000, 5_000, 300_000), Ok(30_000));
        assert_eq!(validate_ttl(5_000, 5_000, 300_000), Ok(5_000));
        for bad in [4_999, 300_001, -1, 0] {
            assert_eq!(
                validate_ttl(bad, 5_000, 300_000),
                Err(CoreError::InvalidTtl { got: bad, min: 5_000, max: 300_000 })
            );
        }
        assert!(validate_ttl(0, 0, 10).is_err());
    }

    #[test]
    fn acquire_renew_release() {
        let mut t = LeaseTable::new();
        let AcquireOutcome::New { lease, superseded: None } =
            t.acquire("w", 1, 100, 1_000, 5_000, 1, 0, 0).unwrap()
        else {
            panic!("expected a new lease");
        };
        assert_eq!(lease.expires_at_ms, 1_100);
        assert_eq!(t.frontier(9_000, 1_050), 5_000);

        // Idempotent for the same holder epoch.
        assert_eq!(
            t.acquire("w", 1, 500, 1_050, 6_000, 2, 0, 0),
            Ok(AcquireOutcome::Existing(lease.clone()))
        );
        assert_eq!(
            t.acquire("w", 0, 100, 1_050, 6_000, 2, 0, 0),
            Err(CoreError::StaleHolderEpoch { got: 0, active: 1 })
        );

        let renewed = t.renew(1, 200, (1_090, 0), 6_000, 0, 0).unwrap();
        assert_eq!((renewed.expires_at_ms, renewed.ts_upper_bound_ms), (1_290, 6_000));
        // A lower bound never lowers the stored one.
        assert_eq!(t.renew(1, 200, (1_100, 0), 10, 0, 0).unwrap().ts_upper_bound_ms, 6_000);
        assert_eq!(t.renew(9, 200, (1_100, 0), 10, 0, 0), Err(CoreError::LeaseNotFound(9)));
        assert_eq!(t.renew(1, 200, (1_300, 0), 10, 0, 0), Err(CoreError::LeaseNotRenewable(1)));

        assert!(t.release(1).is_some());
        assert!(t.release(1).is_none());
        assert_eq!(t.frontier(9_000, 1_100), 9_000);
    }

    #[test]
    fn higher_epoch_supersedes() {
        let mut t = LeaseTable::new();
        t.acquire("w", 1, 100, 0, 50, 1, 0, 0).unwrap();
        let out = t.acquire("w", 2, 10, 0, 70, 2, 0, 0).unwrap();
        assert!(matches!(out, AcquireOutcome::New { superseded: Some(1), .. }));
        assert!(t.get(1).is_some_and(|l| l.superseded));
        assert_eq!(t.renew(1, 100, (5, 0), 80, 0, 0), Err(CoreError::LeaseNotRenewable(1)));
        // The superseded lease still holds the frontier until it expires...
        assert_eq!(t.frontier(1_000, 5), 50);
        assert_eq!(t.frontier(1_000, 10), 50);
        // ...and outlives the new one here.
        assert_eq!(t.expire(10), vec![2]);
        assert_eq!(t.expire(100), vec![1]);
        assert!(t.is_empty());
    }

    #[test]
    fn expired_active_lease_allows_any_epoch() {
        let mut t = LeaseTable::new();
        t.acquire("w", 5, 10, 0, 1, 1, 0, 0).unwrap();
        let out = t.acquire("w", 3, 10, 10, 2, 2, 0, 0).unwrap();
        assert!(matches!(out, AcquireOutcome::New { superseded: None, .. }));
    }

    #[test]
    fn duplicate_ids_and_plan_has_no_effect() {
        let mut t = LeaseTable::new();
        t.acquire("a", 1, 10, 0, 1, 1, 0, 0).unwrap();
        let before = t.clone();
        assert_eq!(t.plan_acquire("b", 1, 10, 0, 1, 1, 0, 0), Err(CoreError::DuplicateLeaseId(1)));
        let plan = t.plan_acquire("b", 1, 10, 0, 1, 2, 0, 0).unwrap();
        assert_eq!(t, before);
        t.apply_acquire(&plan);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn renewals_remember_earlier_grants_until_they_expire() {
        let mut t = LeaseTable::new();
        t.acquire("w", 1, 100, 1_000, 5_000, 1, 0, 1_001).unwrap();
        assert_eq!(t.get(1).unwrap().held_from_ms(1_000, 0), 1_001);
        // Renewed at 1_030 with a higher lowest stamp: the first grant (stamps from 1_001,
        // expiring at 1_100) still holds until 1_100, on the wall or the monotonic clock.
        let renewed = t.renew(1, 100, (1_030, 30), 5_000, 1_031, 100).unwrap();
        assert_eq!(renewed.stamp_from_ms, 1_031);
        assert_eq!(renewed.held_from_ms(1_099, 99), 1_001);
        assert_eq!(renewed.held_from_ms(1_100, 99), 1_001, "the monotonic clock still holds it");
        assert_eq!(renewed.held_from_ms(1_100, 100), 1_031, "then R may pass it");
        // A lower stamp never lowers the lease's.
        assert_eq!(t.renew(1, 100, (1_040, 40), 5_000, 7, 0).unwrap().stamp_from_ms, 1_031);
        // However often it is renewed, at most MAX_HOLDS are kept, and never less held.
        for i in 0..50u64 {
            let now = 1_050 + i;
            let before = t.get(1).unwrap().clone();
            let after = t.renew(1, 100, (now, 0), 5_000, now + 1, 0).unwrap();
            assert!(after.holds.len() <= MAX_HOLDS);
            // While the grant it replaced lives, the renewal holds R at least as low.
            for later in now..before.expires_at_ms {
                assert!(after.held_from_ms(later, 0) <= before.held_from_ms(later, 0));
            }
        }
    }

    #[test]
    fn load_drops_expired() {
        let mut t = LeaseTable::new();
        t.acquire("a", 1, 10, 0, 1, 1, 0, 0).unwrap();
        t.acquire("b", 1, 20, 0, 1, 2, 0, 0).unwrap();
        let rows: Vec<Lease> = t.iter().cloned().collect();
        let loaded = LeaseTable::load(rows.clone(), 10).unwrap();
        assert_eq!(loaded.iter().map(|l| l.id).collect::<Vec<_>>(), vec![2]);
        let twice = rows.iter().chain(&rows).cloned();
        assert_eq!(LeaseTable::load(twice, 0), Err(CoreError::DuplicateLeaseId(1)));
    }
}
