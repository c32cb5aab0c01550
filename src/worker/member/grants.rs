//! The leases a member's worker granted through the oracle (docs/fleet.md, "The resolved
//! timestamp of a member"): they hold the member's resolved timestamp below their lowest stamp
//! until they expire, as on the oracle, and while a grant is in flight the worker's own holder
//! slot holds it below what that stamp will be. Each grant is kept in `tsoracle.member_lease`
//! before its holder hears of it, and reloaded when the worker starts: a restart of the member,
//! of its worker, or a promotion of its standby, forgets none.

use crate::pg::xact::{sql_transaction, transaction};
use crate::pg::{clock, guc};
use crate::shmem::holders::HOLDERS;
use crate::shmem::{Reply, ReplyCode, Request, RequestKind, Signals, LEASE_BOUNDS, MAX_LEASES};
use pgrx::prelude::*;
use tsoracle_core::lease::{PublishedBound, PublishedBounds};

/// Grants made through this member, and those in flight.
#[derive(Default)]
pub(super) struct Grants {
    /// Lease id and bound, one entry per grant, published in `LEASE_BOUNDS`.
    live: Vec<(i64, PublishedBound)>,
    /// Lease grants and renewals in flight.
    in_flight: usize,
    /// The value the worker's holder slot holds `R` below while they are in flight.
    held: u64,
}

/// A call that grants or renews a lease.
pub(super) fn grants_lease(requests: &[Request]) -> bool {
    requests.iter().any(|r| matches!(r.kind, RequestKind::LeaseAcquire | RequestKind::LeaseRenew))
}

impl Grants {
    /// A grant or renewal leaves: the worker's holder slot holds `R` below the member's floor,
    /// below every value the oracle had issued when it left, so below its lowest stamp (past a
    /// value the oracle issued at the grant).
    pub(super) fn sent(&mut self, signals: &Signals) {
        self.in_flight += 1;
        if self.in_flight == 1 {
            // At least 1: before the member's first value R is not served (0 would hold
            // nothing once it is).
            self.held = signals.member_floor.get().max(1);
            if let Some(slot) = HOLDERS.mine() {
                // SAFETY: a plain read of this process's pid.
                slot.publish(self.held, unsafe { pg_sys::MyProcPid });
                // As in a caller's hold: a reader whose fence comes after sees the slot.
                std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            }
        }
    }

    /// A grant or renewal is no longer in flight: with none left, the holder slot is cleared.
    pub(super) fn landed(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if self.in_flight == 0 {
            release_hold();
        }
    }

    /// Nothing is in flight any more (the member handed over).
    pub(super) fn none_in_flight(&mut self) {
        self.in_flight = 0;
        release_hold();
    }

    /// Whether the grants a call's `replies` carry may be handed out: each holder's lowest
    /// stamp is above this member's resolved timestamp (the highest computed or published),
    /// above its own past (`own`) and at or above what the holder slot held `R` below while
    /// the grant was in flight (`tsoracle_core::member::lease_above_resolved`). A grant the
    /// oracle made for the call always is; a lost answer's idempotent re-grant may not be.
    pub(super) fn above_resolved(
        &self,
        signals: &Signals,
        own: &tsoracle_core::member::OwnPast,
        requests: &[Request],
        replies: &[Reply],
    ) -> Result<(), tsoracle_core::member::LeaseBelowResolved> {
        let own_ts = tsoracle_core::timestamp::pack(
            own.high_water_ms().min(tsoracle_core::timestamp::MAX_PHYSICAL_MS),
            tsoracle_core::timestamp::MAX_LOGICAL,
        )
        .unwrap_or(u64::MAX);
        let resolved = signals.raise_resolved(0).max(signals.published_resolved().0).max(own_ts);
        let held = if self.in_flight > 0 { self.held } else { signals.member_floor.get() };
        for (r, reply) in requests.iter().zip(replies) {
            if reply.code == ReplyCode::Ok
                && matches!(r.kind, RequestKind::LeaseAcquire | RequestKind::LeaseRenew)
            {
                tsoracle_core::member::lease_above_resolved(
                    u64::try_from(reply.from_ms).unwrap_or(0),
                    held,
                    resolved,
                )?;
            }
        }
        Ok(())
    }

    /// The grants kept in `tsoracle.member_lease` (`None`: it could not be read). A grant's
    /// expiry on the monotonic clock holds across a restart of the server (the clock is the
    /// machine's), and is capped at the longest TTL from now (a reboot restarts the clock).
    pub(super) fn load() -> Option<Grants> {
        let sample = clock::sample();
        let cap = sample.mono_ms.saturating_add(guc::lease_ttl_max_ms().max(0) as u64);
        let read = sql_transaction("tsoracle member cannot read tsoracle.member_lease", || {
            Spi::connect(|client| {
                let mut live = Vec::new();
                for row in client.select(
                    "SELECT lease_id, lower_ms, upper_ms, expires_at_ms, expires_mono_ms FROM ONLY tsoracle.member_lease",
                    None,
                    &[],
                )? {
                    let ms = |i: usize| -> Result<u64, pgrx::spi::Error> {
                        Ok(u64::try_from(row.get::<i64>(i)?.unwrap_or(0)).unwrap_or(0))
                    };
                    live.push((
                        row.get::<i64>(1)?.unwrap_or(0),
                        PublishedBound {
                            bound_ms: ms(3)?,
                            expires_at_ms: ms(4)?,
                            expires_mono_ms: ms(5)?.min(cap),
                            held_from_ms: ms(2)?,
                        },
                    ));
                }
                Ok(live)
            })
        });
        match read {
            Ok(live) => {
                let grants = Grants { live, in_flight: 0, held: 0 };
                grants.publish();
                Some(grants)
            }
            Err(why) => {
                pgrx::warning!("{why}");
                None
            }
        }
    }

    /// The grants, renewals and releases of a call the oracle answered: kept durably and
    /// published before the holder hears of them. `Err` when a grant could not be kept: it
    /// must not be handed out (its lease expires unused).
    pub(super) fn note(&mut self, requests: &[Request], replies: &[Reply]) -> Result<(), String> {
        let sample = clock::sample();
        let mut changed = false;
        let mut kept: Vec<(i64, PublishedBound)> = Vec::new();
        let mut released: Vec<i64> = Vec::new();
        for (r, reply) in requests.iter().zip(replies) {
            if reply.code != ReplyCode::Ok {
                continue;
            }
            match r.kind {
                RequestKind::LeaseAcquire | RequestKind::LeaseRenew => {
                    let ttl_ms = match r.kind {
                        RequestKind::LeaseAcquire => r.count,
                        // The TTL of a renewal is the lease's own, which the member may not
                        // know: the longest any lease may have, which only holds R longer.
                        _ => guc::lease_ttl_max_ms().max(0) as u64,
                    };
                    let expires_at_ms = u64::try_from(reply.expires_at_ms).unwrap_or(u64::MAX);
                    kept.push((
                        reply.value,
                        PublishedBound {
                            bound_ms: u64::try_from(reply.bound_ms).unwrap_or(0),
                            // Live while either clock says so: the oracle's expiry on this
                            // server's wall clock, or the TTL from now on the monotonic one.
                            expires_at_ms,
                            expires_mono_ms: sample.mono_ms.saturating_add(ttl_ms),
                            held_from_ms: u64::try_from(reply.from_ms).unwrap_or(0),
                        },
                    ));
                }
                RequestKind::LeaseRelease => released.push(r.arg),
                _ => {}
            }
        }
        if !kept.is_empty() {
            keep(&kept)?;
            self.live.extend(kept);
            changed = true;
        }
        for id in released {
            let before = self.live.len();
            self.live.retain(|(lease, _)| *lease != id);
            changed |= self.live.len() != before;
            // Left in the table if this fails: it only holds R longer, until it expires.
            let _ = transaction(|| {
                Spi::run_with_args(
                    "DELETE FROM ONLY tsoracle.member_lease WHERE lease_id OPERATOR(pg_catalog.=) $1",
                    &[id.into()],
                )
            });
        }
        if changed {
            self.publish();
        }
        Ok(())
    }

    /// Drop the grants that expired (by both clocks), from memory and from the table, and
    /// publish what is left.
    pub(super) fn prune(&mut self) {
        let now = clock::sample();
        let before = self.live.len();
        self.live.retain(|(_, b)| b.is_live(now.wall_ms, now.mono_ms));
        if self.live.len() != before {
            self.publish();
            // Left in the table if this fails: reloaded after a restart, they expire then.
            let _ = transaction(|| {
                Spi::run_with_args(
                    "DELETE FROM ONLY tsoracle.member_lease WHERE expires_at_ms OPERATOR(pg_catalog.<=) $1 \
                     AND expires_mono_ms OPERATOR(pg_catalog.<=) $2",
                    &[(now.wall_ms as i64).into(), (now.mono_ms as i64).into()],
                )
            });
        }
    }

    fn publish(&self) {
        let bounds = PublishedBounds::new(self.live.iter().map(|(_, b)| *b), MAX_LEASES);
        LEASE_BOUNDS.exclusive().publish(&bounds);
    }
}

fn release_hold() {
    if let Some(slot) = HOLDERS.mine() {
        slot.clear();
    }
}

/// Keep grants in `tsoracle.member_lease`, committed (and on synchronous standbys) before this
/// returns.
fn keep(grants: &[(i64, PublishedBound)]) -> Result<(), String> {
    super::oracle::durable_transaction("cannot keep a lease granted through this member", || {
        for (id, b) in grants {
            Spi::run_with_args(
                "INSERT INTO tsoracle.member_lease AS m (lease_id, lower_ms, upper_ms, expires_at_ms, expires_mono_ms) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (lease_id, lower_ms) DO UPDATE \
                 SET upper_ms = GREATEST(m.upper_ms, EXCLUDED.upper_ms), \
                     expires_at_ms = GREATEST(m.expires_at_ms, EXCLUDED.expires_at_ms), \
                     expires_mono_ms = GREATEST(m.expires_mono_ms, EXCLUDED.expires_mono_ms)",
                &[
                    (*id).into(),
                    (b.held_from_ms.min(i64::MAX as u64) as i64).into(),
                    (b.bound_ms.min(i64::MAX as u64) as i64).into(),
                    (b.expires_at_ms.min(i64::MAX as u64) as i64).into(),
                    (b.expires_mono_ms.min(i64::MAX as u64) as i64).into(),
                ],
            )?;
        }
        Ok(())
    })
}
