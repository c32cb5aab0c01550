//! On the oracle of a fleet (docs/fleet.md): the members registered, the resolved timestamp
//! each last reported, and the fleet-wide resolved timestamp `R_f` the worker published.
//!
//! A member's session registers it (`tsoracle.member_hello`) and reports its `R`
//! (`tsoracle.member_report`) here; the worker makes both durable in `tsoracle.fleet_member`
//! and publishes `R_f` (`tsoracle_core::fleet`). A member is served no timestamp before its
//! registration is durable: after a failover the new primary knows every member that may hold
//! one.

use crate::pg::error::{OrReport, TsoError};
use pgrx::pg_sys;
use pgrx::shmem::{PGRXSharedMemory, PgSharedMemoryInitialization};
use std::cell::UnsafeCell;
use std::ffi::CStr;
use tsoracle_core::fleet::MemberEntry;

/// One member, by the system identifier of its cluster (its standbys share it).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct MemberSlot {
    pub system_id: u64,
    /// The highest `R` it reported (its entry in `R_f`).
    pub resolved: u64,
    /// Wall ms of its registration and of its last report (0: none yet).
    pub registered_ms: u64,
    pub reported_ms: u64,
    /// When its session (`session_pid`) was last heard from (hello or report), on the
    /// monotonic clock (`clock::mono_ms`).
    pub heard_mono_ms: u64,
    /// The `resolved` the table holds (the worker writes it again when it moved).
    pub persisted_resolved: u64,
    /// The run of the member's cluster that speaks for it (`tsoracle_core::fleet::RunClaim`;
    /// 0: not known). Kept in `tsoracle.fleet_member.run`: a change is durable before the
    /// member is served again (`persisted` is cleared).
    pub run: u64,
    /// Held here since a run took the entry over without proving the one before had ended
    /// (`tsoracle_core::fleet::hold_after`): no report raises it above, until a superuser
    /// releases it (`tso_fleet_admit`). Kept in `tsoracle.fleet_member.held_at`, like `run`.
    pub held_at: Option<u64>,
    /// The role it registered as (the one it is admitted for, `tsoracle.fleet_admission`):
    /// only that role reports for it.
    pub role: u32,
    /// What holds its `R` on the member: the pid of its oldest holder (0: none reported).
    pub held_by_pid: i32,
    /// The oracle's server process of its connection now (0: none; cleared when that
    /// process exits: `SharedFleet::forget_session`).
    pub session_pid: i32,
    pub used: bool,
    /// Its registration is durable: it may be served timestamps.
    pub persisted: bool,
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

/// The fleet's state besides its slots, guarded by the fleet's LWLock. Plain data only: it
/// lives in shared memory.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct FleetHeader {
    /// The worker read `tsoracle.fleet_member` since this server started: registrations wait
    /// for it.
    pub loaded: bool,
    /// `R_f` as last made durable (0: none yet).
    pub published: u64,
    /// Wall ms of that publication.
    pub published_ms: u64,
    /// Rows of `tsoracle.fleet_member` that found no slot (`tsoracle.max_members` lowered
    /// below them), and the lowest entry of those not removed (0: none): they hold `R_f`
    /// there, and their members are refused until the setting is raised again.
    pub unplaced: u64,
    pub unplaced_floor: u64,
    /// How many slots follow the header (`tsoracle.max_members` when the server started).
    pub slots: u64,
}

impl FleetHeader {
    /// The entry that holds `R_f` for the rows without a slot, if any.
    pub fn unplaced_entry(&self) -> Option<MemberEntry> {
        (self.unplaced_floor > 0).then(|| MemberEntry::new(self.unplaced_floor))
    }
}

/// The members' slots and what to do with them, over a header and slots wherever they are
/// (in shared memory under the lock, or a copy).
pub trait Slots {
    fn header(&self) -> &FleetHeader;
    fn members(&self) -> &[MemberSlot];

    fn find(&self, system_id: u64) -> Option<usize> {
        self.members().iter().position(|m| m.used && m.system_id == system_id)
    }

    fn free(&self) -> Option<usize> {
        self.members().iter().position(|m| !m.used)
    }

    fn used(&self) -> impl Iterator<Item = &MemberSlot> {
        self.members().iter().filter(|m| m.used)
    }

    /// An owned copy, to read at leisure once the lock is released.
    fn copy(&self) -> FleetState {
        FleetState { header: *self.header(), members: self.members().to_vec() }
    }
}

/// Rows read from the table: a member already there keeps the higher entry, another takes a
/// free slot; one that finds none is counted, and its entry (unless removed) holds `R_f`.
fn merge(header: &mut FleetHeader, members: &mut [MemberSlot], rows: &[MemberSlot]) {
    for row in rows {
        if let Some(m) = members.iter_mut().find(|m| m.used && m.system_id == row.system_id) {
            m.resolved = m.resolved.max(row.resolved);
            // A hold kept in the table stays, at the lower of the two.
            m.held_at = m.held_at.into_iter().chain(row.held_at).min();
            if m.run == 0 {
                m.run = row.run;
            }
        } else if let Some(m) = members.iter_mut().find(|m| !m.used) {
            *m = *row;
        } else {
            header.unplaced += 1;
            if !row.removed {
                header.unplaced_floor = match header.unplaced_floor {
                    0 => row.resolved.max(1),
                    f => f.min(row.resolved.max(1)),
                };
            }
        }
    }
}

/// A copy of the fleet's state, taken under the lock.
#[derive(Clone, Debug)]
pub struct FleetState {
    pub header: FleetHeader,
    pub members: Vec<MemberSlot>,
}

impl Slots for FleetState {
    fn header(&self) -> &FleetHeader {
        &self.header
    }
    fn members(&self) -> &[MemberSlot] {
        &self.members
    }
}

impl FleetState {
    pub fn merge(&mut self, rows: &[MemberSlot]) {
        merge(&mut self.header, &mut self.members, rows);
    }
}

impl std::ops::Deref for FleetState {
    type Target = FleetHeader;
    fn deref(&self) -> &FleetHeader {
        &self.header
    }
}

impl std::ops::DerefMut for FleetState {
    fn deref_mut(&mut self) -> &mut FleetHeader {
        &mut self.header
    }
}

/// Where the fleet lives: its header, then `len` slots, sized from `tsoracle.max_members`
/// when the server starts, under one LWLock.
struct FleetBlock {
    header: *mut FleetHeader,
    slots: *mut MemberSlot,
    len: usize,
    lock: *mut pg_sys::LWLock,
}

/// The fleet in shared memory.
pub struct SharedFleet {
    name: &'static CStr,
    block: UnsafeCell<Option<FleetBlock>>,
}

// SAFETY: `block` is written once per process, in the shmem startup hook, before any other
// code of this process runs (PostgreSQL backends are single-threaded); afterwards it is only
// read. What it points to is shared memory, guarded by the fleet's LWLock.
unsafe impl Sync for SharedFleet {}

/// The fleet, locked. Dropping it releases the LWLock.
pub struct FleetGuard<'a> {
    block: &'a FleetBlock,
    exclusive: bool,
}

/// The block's layout for `slots` slots: where the slots start, and its size.
fn layout(slots: usize) -> (usize, usize) {
    tsoracle_core::fleet::slots_block(
        std::mem::size_of::<FleetHeader>(),
        std::mem::size_of::<MemberSlot>(),
        std::mem::align_of::<MemberSlot>().max(std::mem::align_of::<FleetHeader>()),
        slots,
    )
    // tsoracle.max_members is at most MAX_MEMBERS_LIMIT: no overflow.
    .unwrap_or((0, 0))
}

// The bytes of shared memory a slot and the header take, as docs/reference/fleet.md gives
// them (96 per member, 48 + 8 for the block): a change of either is a change of those docs.
// The fields of a slot are ordered by size, so that they take no padding but the last.
const _: () = assert!(std::mem::size_of::<MemberSlot>() == 96);
const _: () = assert!(std::mem::size_of::<FleetHeader>() == 48);

impl SharedFleet {
    const fn new(name: &'static CStr) -> Self {
        Self { name, block: UnsafeCell::new(None) }
    }

    fn lock(&self, exclusive: bool) -> Result<FleetGuard<'_>, TsoError> {
        // SAFETY: see `unsafe impl Sync`: written only during shmem startup.
        let block = unsafe { (*self.block.get()).as_ref() }.ok_or(TsoError::NotPreloaded)?;
        let mode = if exclusive {
            pg_sys::LWLockMode::LW_EXCLUSIVE
        } else {
            pg_sys::LWLockMode::LW_SHARED
        };
        // SAFETY: the lock was handed out by GetNamedLWLockTranche for this block; the guard
        // releases it on drop, also when an error unwinds through its holder.
        unsafe { pg_sys::LWLockAcquire(block.lock, mode) };
        Ok(FleetGuard { block, exclusive })
    }

    /// The fleet under its LWLock in exclusive mode (an error if the library was not
    /// preloaded).
    pub fn exclusive(&self) -> FleetGuard<'_> {
        self.lock(true).or_report()
    }

    /// At the exit of a backend that spoke for members: each slot whose session it was says
    /// so no more (`session_pid` 0), so that `tso_fleet_status()` shows the member as not
    /// connected. Raises nothing; skipped when this backend holds the lock already (an error
    /// cut a locked section short: the slot then keeps the pid, and readers check that the
    /// process still lives).
    pub fn forget_session(&self, pid: i32) {
        // SAFETY: see `unsafe impl Sync`: written only during shmem startup.
        let Some(block) = (unsafe { (*self.block.get()).as_ref() }) else { return };
        // SAFETY: the block's lock, from GetNamedLWLockTranche; asking whether this backend
        // holds it takes no lock.
        if unsafe { pg_sys::LWLockHeldByMe(block.lock) } {
            return;
        }
        let Ok(mut guard) = self.lock(true) else { return };
        for m in guard.members_mut().iter_mut().filter(|m| m.used && m.session_pid == pid) {
            m.session_pid = 0;
        }
    }

    /// The fleet under its LWLock in shared mode: reads only.
    pub fn share(&self) -> FleetGuard<'_> {
        self.lock(false).or_report()
    }
}

impl Slots for FleetGuard<'_> {
    fn header(&self) -> &FleetHeader {
        // SAFETY: initialised at shmem startup; writers hold the lock exclusively, so no one
        // writes while this guard reads.
        unsafe { &*self.block.header }
    }
    fn members(&self) -> &[MemberSlot] {
        // SAFETY: `len` slots initialised at shmem startup; as in `header`.
        unsafe { std::slice::from_raw_parts(self.block.slots, self.block.len) }
    }
}

impl FleetGuard<'_> {
    /// The slots, to change; exclusive guards only.
    pub fn members_mut(&mut self) -> &mut [MemberSlot] {
        assert!(self.exclusive, "the fleet is changed under an exclusive lock only");
        // SAFETY: as in `members`; the exclusive lock makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.block.slots, self.block.len) }
    }

    pub fn merge(&mut self, rows: &[MemberSlot]) {
        assert!(self.exclusive, "the fleet is changed under an exclusive lock only");
        // SAFETY: as in `members_mut`; header and slots do not overlap.
        let (header, members) = unsafe {
            (
                &mut *self.block.header,
                std::slice::from_raw_parts_mut(self.block.slots, self.block.len),
            )
        };
        merge(header, members, rows);
    }
}

impl std::ops::Deref for FleetGuard<'_> {
    type Target = FleetHeader;
    fn deref(&self) -> &FleetHeader {
        self.header()
    }
}

impl std::ops::DerefMut for FleetGuard<'_> {
    fn deref_mut(&mut self) -> &mut FleetHeader {
        assert!(self.exclusive, "the fleet is changed under an exclusive lock only");
        // SAFETY: as in `members_mut`.
        unsafe { &mut *self.block.header }
    }
}

impl Drop for FleetGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: acquired in `SharedFleet::lock`, released exactly once here.
        unsafe { pg_sys::LWLockRelease(self.block.lock) };
    }
}

/// Stand-in value for pg_shmem_init!'s `Default` requirement.
#[derive(Clone, Copy, Default)]
pub struct FleetInit;
// SAFETY: a unit struct, holding nothing; it never even reaches shared memory.
unsafe impl PGRXSharedMemory for FleetInit {}

impl PgSharedMemoryInitialization for SharedFleet {
    type Value = FleetInit;

    unsafe fn on_shmem_request(&'static self) {
        // SAFETY: called from shmem_request_hook, after the configuration was read (the
        // setting is a postmaster one: it is the same in every process).
        unsafe {
            pg_sys::RequestAddinShmemSpace(layout(crate::pg::guc::max_members()).1);
            pg_sys::RequestNamedLWLockTranche(self.name.as_ptr(), 1);
        }
    }

    unsafe fn on_shmem_startup(&'static self, _value: FleetInit) {
        // SAFETY: called from shmem_startup_hook in every process that attaches, under
        // AddinShmemInitLock (MainLWLockArray[21]: a macro in lwlock.h, so no binding); the
        // first one initialises the block, the others find it. ShmemInitStruct returns at
        // least the size requested above: room for the header and `len` slots after the
        // block's start is aligned. Every process reads the length the first one wrote.
        unsafe {
            let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
            pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
            let len = crate::pg::guc::max_members();
            let (offset, size) = layout(len);
            let mut found = false;
            let raw = pg_sys::ShmemInitStruct(self.name.as_ptr(), size, &mut found).cast::<u8>();
            let align = std::mem::align_of::<MemberSlot>().max(std::mem::align_of::<FleetHeader>());
            let base = raw.add(raw.align_offset(align));
            let header = base.cast::<FleetHeader>();
            let slots = base.add(offset).cast::<MemberSlot>();
            if !found {
                header.write(FleetHeader { slots: len as u64, ..FleetHeader::default() });
                for i in 0..len {
                    slots.add(i).write(MemberSlot::default());
                }
            }
            let len = usize::try_from((*header).slots).unwrap_or(0).min(len);
            let lock = &raw mut (*pg_sys::GetNamedLWLockTranche(self.name.as_ptr())).lock;
            *self.block.get() = Some(FleetBlock { header, slots, len, lock });
            pg_sys::LWLockRelease(init_lock);
        }
    }
}

// A name of its own among the extension's shared-memory structs (all start with
// `tsoracle_`).
pub static FLEET: SharedFleet = SharedFleet::new(c"tsoracle_fleet");
