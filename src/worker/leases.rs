//! Leases: their part of a group commit, their expiry, and the bounds published for
//! `tso_safe_frontier()`.

use super::checks::{denied, Checks};
use super::high_water::{self, RaiseError};
use super::state::Worker;
use crate::pg::clock::{self, Sample};
use crate::pg::guc;
use crate::pg::xact::transaction;
use crate::shmem::{Reply, ReplyCode, Request, RequestKind, LEASE_BOUNDS, MAX_LEASES};
use pgrx::prelude::*;
use tsoracle_core::error::CoreError;
use tsoracle_core::lease::{
    acquire_bound_ms, renewal_bound_ms, AcquireOutcome, Hold, Lease, LeaseTable, PublishedBound,
    PublishedBounds,
};
use tsoracle_core::queue::Ticket;

impl Worker {
    /// Purge leases expired longer than the retention from memory and from the table, and
    /// keep the published bounds (and live count) current as leases lapse. A lease is purged
    /// only once its monotonic deadline has passed too: a wall clock stepped forward neither
    /// ends nor forgets a lease early.
    pub(super) fn expire_leases(&mut self) {
        let now = clock::sample();
        let horizon = purge_horizon(now.wall_ms);
        let purged: Vec<i64> = self
            .leases
            .iter()
            .filter(|l| !l.is_live(horizon) && self.lease_deadline(l.id) <= now.mono_ms)
            .map(|l| l.id)
            .collect();
        if !purged.is_empty() {
            // A purge that cannot run now (a row or the table locked) is tried again at the
            // next tick: an expired lease holds nothing meanwhile.
            let deleted = transaction(|| {
                Spi::run_with_args(
                    "DELETE FROM ONLY tsoracle.lease WHERE lease_id OPERATOR(pg_catalog.=) ANY ($1)",
                    &[purged.clone().into()],
                )
            });
            if matches!(deleted, Ok(Ok(()))) {
                for id in &purged {
                    self.leases.release(*id);
                    self.lease_deadlines.remove(id);
                }
            }
        }
        // Republish as leases lapse, and as the earlier grants a lease holds R for expire.
        let current = PublishedBounds::new(self.live_bounds(now), MAX_LEASES);
        let published = {
            let bounds = LEASE_BOUNDS.share();
            bounds.live == current.live() && bounds.entries() == current.entries()
        };
        if !published {
            LEASE_BOUNDS.exclusive().publish(&current);
        }
    }

    /// When a lease stops holding the frontier on the monotonic clock (0: unknown).
    fn lease_deadline(&self, id: i64) -> u64 {
        self.lease_deadlines.get(&id).copied().unwrap_or(0)
    }

    /// The leases that hold the frontier at `now`, as published.
    fn live_bounds(&self, now: Sample) -> impl Iterator<Item = PublishedBound> + '_ {
        self.leases
            .iter()
            .map(move |l| PublishedBound {
                bound_ms: l.ts_upper_bound_ms,
                expires_at_ms: l.expires_at_ms,
                expires_mono_ms: self.lease_deadline(l.id),
                held_from_ms: l.held_from_ms(now.wall_ms, now.mono_ms),
            })
            .filter(move |b| b.is_live(now.wall_ms, now.mono_ms))
    }

    /// Publish the bounds of the live leases for `tso_safe_frontier()` in any backend; more
    /// than fit are summarised, never dropped (`PublishedBounds`).
    pub(super) fn publish_lease_bounds(&self) {
        let bounds = PublishedBounds::new(self.live_bounds(clock::sample()), MAX_LEASES);
        LEASE_BOUNDS.exclusive().publish(&bounds);
    }

    /// After the lease table changed (a group commit that began at `started`, or the fence's
    /// load, `before` = None): every lease whose expiry is new gets a monotonic deadline as
    /// far from `started` as its expiry is on the wall clock; the others keep theirs.
    pub(super) fn note_lease_deadlines(&mut self, before: Option<&LeaseTable>, started: Sample) {
        let mut deadlines = std::collections::HashMap::with_capacity(self.leases.len());
        for lease in self.leases.iter() {
            let unchanged = before
                .and_then(|b| b.get(lease.id))
                .is_some_and(|old| old.expires_at_ms == lease.expires_at_ms);
            let deadline = match self.lease_deadlines.get(&lease.id) {
                Some(&d) if unchanged => d,
                _ => started
                    .mono_ms
                    .saturating_add(lease.expires_at_ms.saturating_sub(started.wall_ms)),
            };
            deadlines.insert(lease.id, deadline);
        }
        self.lease_deadlines = deadlines;
    }
}

/// An expired lease is kept (no longer live; renewing it says "expired", 55000) for
/// `tsoracle.expired_lease_retention_ms`, then purged (renewing it then says "does not exist").
pub(super) fn purge_horizon(now_ms: u64) -> u64 {
    now_ms.saturating_sub(guc::expired_lease_retention_ms())
}

/// What a group's lease requests are granted against: the clock sampled when the group
/// began, and the lowest stamp of the grants it makes (`WorkerHold`).
pub(super) struct LeaseGrant<'a> {
    pub now: Sample,
    pub stamp_from_ms: u64,
    /// Each lease's monotonic deadline, for the grant a renewal replaces.
    pub deadlines: &'a std::collections::HashMap<i64, u64>,
}

/// The lease part of a group commit, in queue order, on the worker's copy of the table.
/// Every acquire and renewal first moves the high-water to at least
/// `max(high_water + 1, now + ttl)` (a renewal: `max(high_water, now + ttl)`), and its bound is
/// that durable value. Returns the high-water after the group; an error means nothing of the
/// lease part may be answered (the caller's subtransaction is rolled back).
pub(super) fn mutate_leases(
    taken: &[(Ticket, Request)],
    replies: &mut [Reply],
    leases: &mut LeaseTable,
    checks: &Checks,
    grant: &LeaseGrant<'_>,
    high_water: u64,
    epoch: u64,
) -> Result<u64, RaiseError> {
    let now = grant.now.wall_ms;
    let mut high_water = high_water;
    let mut writes: Vec<LeaseWrite> = Vec::new();
    for (i, (_, r)) in taken.iter().enumerate() {
        // The functions of 0.3.0 and before tell the holder no lowest stamp: it stamps from
        // the server's clock at the grant, and the lease holds R below that, as they said.
        let stamp_from = if r.legacy { grant.stamp_from_ms.min(now) } else { grant.stamp_from_ms };
        let reply = match r.kind {
            RequestKind::LeaseAcquire if !checks.storable(r.name()) => {
                Reply::err(ReplyCode::BadEncoding)
            }
            RequestKind::LeaseAcquire => {
                let (holder, holder_epoch, ttl) = (r.name(), r.arg, r.count);
                match leases.active_lease(holder, now) {
                    // A holder name belongs to the role holding its live lease.
                    Some(active) if !checks.may_manage(r.role, active.owner) => {
                        denied(active.owner)
                    }
                    _ => {
                        let bound = acquire_bound_ms(high_water, now, ttl);
                        match leases.plan_acquire(
                            holder,
                            holder_epoch,
                            ttl,
                            now,
                            bound,
                            bound as i64,
                            r.role,
                            stamp_from,
                        ) {
                            Ok(AcquireOutcome::Existing(lease)) => lease_reply(&lease, epoch),
                            Ok(AcquireOutcome::New { .. })
                                if leases.iter().filter(|l| l.is_live(now)).count()
                                    >= MAX_LEASES =>
                            {
                                Reply::err(ReplyCode::TooManyLeases)
                            }
                            Ok(AcquireOutcome::New { lease, superseded }) => {
                                leases.apply_acquire(&AcquireOutcome::New {
                                    lease: lease.clone(),
                                    superseded,
                                });
                                high_water = bound;
                                if let Some(old) = superseded {
                                    writes.push(LeaseWrite::Supersede(old));
                                }
                                let reply = lease_reply(&lease, epoch);
                                writes.push(LeaseWrite::Insert(lease));
                                reply
                            }
                            Err(e) => lease_error_reply(&e),
                        }
                    }
                }
            }
            RequestKind::LeaseRenew => match leases.get(r.arg).map(|l| (l.ttl_ms, l.owner)) {
                Some((_, owner)) if !checks.may_manage(r.role, owner) => denied(owner),
                found => {
                    let ttl = found.map_or(0, |(ttl, _)| ttl);
                    let bound = renewal_bound_ms(high_water, now, ttl, stamp_from);
                    let previous_deadline = grant.deadlines.get(&r.arg).copied().unwrap_or(0);
                    match leases.renew(
                        r.arg,
                        ttl,
                        (now, grant.now.mono_ms),
                        bound,
                        stamp_from,
                        previous_deadline,
                    ) {
                        Ok(lease) => {
                            high_water = high_water.max(bound);
                            let reply = lease_reply(&lease, epoch);
                            writes.push(LeaseWrite::Renew(lease));
                            reply
                        }
                        Err(e) => lease_error_reply(&e),
                    }
                }
            },
            RequestKind::LeaseRelease => match leases.get(r.arg).map(|l| l.owner) {
                Some(owner) if !checks.may_manage(r.role, owner) => denied(owner),
                _ => {
                    if leases.release(r.arg).is_some() {
                        writes.push(LeaseWrite::Delete(r.arg));
                    }
                    Reply::ok(r.arg)
                }
            },
            RequestKind::SeqAdvance | RequestKind::SeqPeek | RequestKind::SeqDrop => continue,
            // A member's requests, which only a member's worker serves (never queued here:
            // tsoracle.oracle is the same in every process of a server).
            RequestKind::Next | RequestKind::SafeFrontier => Reply::err(ReplyCode::Refused),
        };
        replies[i] = reply;
    }
    if writes.is_empty() {
        return Ok(high_water);
    }
    // The bounds must be durable before (in the same commit as) the leases that carry them:
    // raised in place (flushed and acknowledged here) or by MVCC in this transaction.
    if high_water > 0 {
        let actual = high_water::raise(high_water, epoch)?;
        if actual < high_water {
            return Err(RaiseError::NotOurs);
        }
        high_water = actual;
    }
    for write in writes {
        write.execute();
    }
    Ok(high_water)
}

fn lease_error_reply(error: &CoreError) -> Reply {
    Reply::err(match error {
        CoreError::StaleHolderEpoch { .. } => ReplyCode::StaleHolderEpoch,
        CoreError::LeaseNotFound(_) => ReplyCode::LeaseNotFound,
        CoreError::LeaseNotRenewable(_) => ReplyCode::LeaseNotRenewable,
        _ => ReplyCode::Unknown,
    })
}

fn lease_reply(lease: &Lease, epoch: u64) -> Reply {
    Reply {
        code: ReplyCode::Ok,
        value: lease.id,
        bound_ms: lease.ts_upper_bound_ms as i64,
        expires_at_ms: lease.expires_at_ms as i64,
        epoch: epoch as i64,
        from_ms: lease.stamp_from_ms as i64,
        table_locked: false,
        made: 0,
    }
}

/// One change to `tsoracle.lease`, made inside the group's transaction.
enum LeaseWrite {
    Insert(Lease),
    Supersede(i64),
    Renew(Lease),
    Delete(i64),
}

impl LeaseWrite {
    fn execute(self) {
        let result = match self {
            LeaseWrite::Insert(l) => Spi::run_with_args(
                "INSERT INTO tsoracle.lease (lease_id, holder, holder_epoch, ts_upper_bound_ms, expires_at_ms, ttl_ms, owner, \
                                             ts_lower_bound_ms, holds) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7::pg_catalog.oid::pg_catalog.regrole, $8, $9)",
                &[
                    l.id.into(),
                    l.holder.clone().into(),
                    l.holder_epoch.into(),
                    (l.ts_upper_bound_ms as i64).into(),
                    (l.expires_at_ms as i64).into(),
                    (l.ttl_ms as i64).into(),
                    i64::from(l.owner).into(),
                    (l.stamp_from_ms as i64).into(),
                    holds_to_sql(&l.holds).into(),
                ],
            ),
            LeaseWrite::Supersede(id) => Spi::run_with_args(
                "UPDATE ONLY tsoracle.lease SET superseded = true WHERE lease_id OPERATOR(pg_catalog.=) $1",
                &[id.into()],
            ),
            LeaseWrite::Renew(l) => Spi::run_with_args(
                "UPDATE ONLY tsoracle.lease SET ts_upper_bound_ms = $2, expires_at_ms = $3, renewed_at = pg_catalog.now(), \
                        ts_lower_bound_ms = $4, holds = $5 \
                 WHERE lease_id OPERATOR(pg_catalog.=) $1",
                &[
                    l.id.into(),
                    (l.ts_upper_bound_ms as i64).into(),
                    (l.expires_at_ms as i64).into(),
                    (l.stamp_from_ms as i64).into(),
                    holds_to_sql(&l.holds).into(),
                ],
            ),
            LeaseWrite::Delete(id) => Spi::run_with_args(
                "DELETE FROM ONLY tsoracle.lease WHERE lease_id OPERATOR(pg_catalog.=) $1",
                &[id.into()],
            ),
        };
        result.unwrap_or_else(|e| pgrx::error!("tsoracle could not write a lease: {e}"));
    }
}

/// A lease's earlier grants as stored (`holds bigint[]`: lowest stamp, expiry, ...); their
/// monotonic deadlines are not known after a restart.
pub(super) fn holds_from_sql(flat: &[Option<i64>]) -> Vec<Hold> {
    flat.chunks_exact(2)
        .filter_map(|pair| match pair {
            [Some(from), Some(until)] => Some(Hold {
                from_ms: (*from).max(0) as u64,
                until_ms: (*until).max(0) as u64,
                until_mono_ms: 0,
            }),
            _ => None,
        })
        .collect()
}

/// A lease's earlier grants as `holds bigint[]` stores them.
pub(super) fn holds_to_sql(holds: &[Hold]) -> Vec<i64> {
    holds.iter().flat_map(|h| [h.from_ms as i64, h.until_ms as i64]).collect()
}
