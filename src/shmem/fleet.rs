//! On the oracle of a fleet (docs/fleet.md): the members registered, the resolved timestamp
//! each last reported, and the fleet-wide resolved timestamp `R_f` the worker published.
//!
//! A member's session registers it (`tsoracle.member_hello`) and reports its `R`
//! (`tsoracle.member_report`) here; the worker makes both durable in `tsoracle.fleet_member`
//! and publishes `R_f` (`tsoracle_core::fleet`). A member is served no timestamp before its
//! registration is durable: after a failover the new primary knows every member that may hold
//! one.

use pgrx::lwlock::PgLwLock;
use pgrx::shmem::PGRXSharedMemory;
use tsoracle_core::fleet::MemberEntry;

/// How many members an oracle serves.
pub const MAX_MEMBERS: usize = 64;

/// One member, by the system identifier of its cluster (its standbys share it).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct MemberSlot {
    pub used: bool,
    pub system_id: u64,
    /// The role it registered as: only that role reports for it.
    pub role: u32,
    /// The highest `R` it reported (its entry in `R_f`).
    pub resolved: u64,
    /// What holds its `R` on the member: the pid of its oldest holder (0: none reported).
    pub held_by_pid: i32,
    /// Wall ms of its registration and of its last report (0: none yet).
    pub registered_ms: u64,
    pub reported_ms: u64,
    /// The oracle's server process of its connection now (0: none), and when that session
    /// was last heard from (hello or report), on the monotonic clock (`clock::mono_ms`).
    pub session_pid: i32,
    pub heard_mono_ms: u64,
    /// Its registration is durable: it may be served timestamps.
    pub persisted: bool,
    /// The `resolved` the table holds (the worker writes it again when it moved).
    pub persisted_resolved: u64,
    /// A superuser removed it: the worker marks its row removed (`removed_at`), then `removed`.
    pub removing: bool,
    /// Removed durably: it holds nothing, and is refused until a superuser re-admits it.
    pub removed: bool,
    /// A superuser re-admits it: the worker deletes its row, then frees the slot.
    pub admitting: bool,
}

impl MemberSlot {
    pub fn entry(&self) -> MemberEntry {
        MemberEntry::new(self.resolved)
    }

    /// What the table does not hold yet: its registration, its removal or re-admission, or a
    /// higher entry.
    pub fn unwritten(&self) -> bool {
        !self.persisted
            || self.removing
            || self.admitting
            || (!self.removed && self.resolved != self.persisted_resolved)
    }

    /// It holds `R_f` (it may hold values): registered, and neither removed nor being removed.
    pub fn holds(&self) -> bool {
        !(self.removing || self.removed || self.admitting)
    }
}

/// State guarded by the fleet's LWLock. Plain data only: it lives in shared memory.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct FleetState {
    /// The worker read `tsoracle.fleet_member` since this server started: registrations wait
    /// for it.
    pub loaded: bool,
    pub members: [MemberSlot; MAX_MEMBERS],
    /// `R_f` as last made durable (0: none yet).
    pub published: u64,
    /// Wall ms of that publication.
    pub published_ms: u64,
}

impl Default for FleetState {
    fn default() -> Self {
        FleetState {
            loaded: false,
            members: [MemberSlot::default(); MAX_MEMBERS],
            published: 0,
            published_ms: 0,
        }
    }
}

impl FleetState {
    pub fn find(&self, system_id: u64) -> Option<usize> {
        self.members.iter().position(|m| m.used && m.system_id == system_id)
    }

    pub fn free(&self) -> Option<usize> {
        self.members.iter().position(|m| !m.used)
    }

    pub fn used(&self) -> impl Iterator<Item = &MemberSlot> {
        self.members.iter().filter(|m| m.used)
    }

    /// Rows read from the table: a member already here keeps the higher entry, another takes
    /// a free slot.
    pub fn merge(&mut self, rows: &[MemberSlot]) {
        for row in rows {
            match self.find(row.system_id) {
                Some(i) => self.members[i].resolved = self.members[i].resolved.max(row.resolved),
                None => {
                    if let Some(i) = self.free() {
                        self.members[i] = *row;
                    }
                }
            }
        }
    }
}

// SAFETY: plain data (integers and flags): no pointers and nothing on the heap, so it means
// the same in every process that maps the segment.
unsafe impl PGRXSharedMemory for FleetState {}

// SAFETY: a name of its own among the extension's shared-memory structs (all start with
// `tsoracle_`).
pub static FLEET: PgLwLock<FleetState> = unsafe { PgLwLock::new(c"tsoracle_fleet") };
