//! The leases a member's worker granted through the oracle (docs/fleet.md, "The resolved
//! timestamp of a member"): they hold the member's resolved timestamp below their lowest stamp
//! until they expire, as on the oracle, and while a grant is in flight the worker's own holder
//! slot holds it below what that stamp will be.

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
            if let Some(slot) = HOLDERS.mine() {
                // SAFETY: a plain read of this process's pid.
                slot.publish(signals.member_floor.get(), unsafe { pg_sys::MyProcPid });
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

    /// The grants, renewals and releases of a call the oracle answered: published before the
    /// holder hears of them.
    pub(super) fn note(&mut self, requests: &[Request], replies: &[Reply]) {
        let sample = clock::sample();
        let mut changed = false;
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
                    self.live.push((
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
                    changed = true;
                }
                RequestKind::LeaseRelease => {
                    let before = self.live.len();
                    self.live.retain(|(id, _)| *id != r.arg);
                    changed |= self.live.len() != before;
                }
                _ => {}
            }
        }
        if changed {
            self.publish();
        }
    }

    /// Drop the grants that expired, and publish what is left.
    pub(super) fn prune(&mut self) {
        let now = clock::sample();
        let before = self.live.len();
        self.live.retain(|(_, b)| b.is_live(now.wall_ms, now.mono_ms));
        if self.live.len() != before {
            self.publish();
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
