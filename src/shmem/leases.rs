//! The bounds of the live leases, published by the worker for `tso_safe_frontier()` and the
//! resolved timestamp in every backend (docs/leases.md).

use crate::pg::clock;
use pgrx::lwlock::PgLwLock;
use pgrx::shmem::PGRXSharedMemory;
use tsoracle_core::lease::{PublishedBound, PublishedBounds};

/// Most live leases (active or superseded) at once.
pub const MAX_LEASES: usize = 1024;

/// The bounds of the live leases, published by the worker after every change so that any
/// backend can compute the safe frontier without asking it. More live leases than fit (a
/// restore can load any number) are summarised conservatively, never dropped
/// ([`PublishedBounds`]).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct LeaseBounds {
    /// How many leases are live (may be more than `entries` holds).
    pub live: usize,
    pub len: usize,
    pub entries: [PublishedBound; MAX_LEASES],
}

impl Default for LeaseBounds {
    fn default() -> Self {
        LeaseBounds { live: 0, len: 0, entries: [PublishedBound::default(); MAX_LEASES] }
    }
}

impl LeaseBounds {
    /// Replace what is published.
    pub fn publish(&mut self, bounds: &PublishedBounds) {
        let entries = bounds.entries();
        let len = entries.len().min(MAX_LEASES);
        self.entries[..len].copy_from_slice(&entries[..len]);
        self.len = len;
        self.live = bounds.live();
    }

    /// What is published now.
    pub fn entries(&self) -> &[PublishedBound] {
        &self.entries[..self.len.min(MAX_LEASES)]
    }

    /// The first millisecond a lease still live at `now` may be stamped in.
    pub fn earliest_live_from(&self, now: clock::Sample) -> Option<u64> {
        tsoracle_core::lease::earliest_live_from(
            &self.entries[..self.len.min(MAX_LEASES)],
            now.wall_ms,
            now.mono_ms,
        )
    }

    /// The safe frontier at `now`: `high_water_ms`, held down by every lease still live.
    pub fn frontier(&self, high_water_ms: u64, now: clock::Sample) -> u64 {
        tsoracle_core::lease::frontier(
            high_water_ms,
            &self.entries[..self.len.min(MAX_LEASES)],
            now.wall_ms,
            now.mono_ms,
        )
    }
}

// SAFETY: plain data (lengths and an array of integer triples): no pointers and nothing on
// the heap.
unsafe impl PGRXSharedMemory for LeaseBounds {}

// SAFETY: a name of its own, as for `ORACLE`.
pub static LEASE_BOUNDS: PgLwLock<LeaseBounds> = unsafe { PgLwLock::new(c"tsoracle_lease_bounds") };
