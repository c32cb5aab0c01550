//! The resolved timestamp's holder slots (docs/resolved.md): one per possible backend, indexed
//! by PGPROC number, each holding the lowest value its backend's open top-level transaction
//! may have taken (0: none); and `R` on a primary, computed from the window, the slots and the
//! live leases (`tsoracle_core::resolved` explains why that is enough).

use super::leases::LEASE_BOUNDS;
use super::oracle::{not_serving, ORACLE};
use super::signals::{CacheLine, Signals};
use crate::pg::clock;
use crate::pg::error::TsoError;
use pgrx::pg_sys;
use pgrx::shmem::{PGRXSharedMemory, PgSharedMemoryInitialization};
use std::cell::UnsafeCell;
use std::ffi::CStr;
use std::sync::atomic::{fence, AtomicI32, AtomicU64, Ordering};

/// One backend's holding.
#[derive(Debug, Default)]
#[repr(C)]
pub struct HolderSlot {
    /// The lowest value the backend's open transaction may have taken; 0 = none.
    min_ts: AtomicU64,
    pid: AtomicI32,
    /// Timestamps issued by the backends that had this slot, in this server's life (written
    /// by the slot's backend only, beside the holding it writes anyway: no other cache line).
    issued: AtomicU64,
    /// When the holding began, on the monotonic clock (`clock::mono_ms`): its age for
    /// `tso_resolved_status()`, which a clock step, a seed or a lead ahead of the clock does
    /// not change (the value's own millisecond would: it runs ahead of the clock then).
    since_mono_ms: AtomicU64,
}

impl HolderSlot {
    /// Hold `min_ts` for backend `pid` (the caller then fences before its grant).
    pub fn publish(&self, min_ts: u64, pid: i32) {
        self.since_mono_ms.store(clock::mono_ms(), Ordering::Relaxed);
        // Release: a reader that loads this holding (Acquire) reads its start too.
        self.min_ts.store(min_ts.max(1), Ordering::Release);
        self.pid.store(pid, Ordering::Relaxed);
    }

    /// Hold `v` instead (at or below everything the transaction took).
    pub fn raise_to(&self, v: u64) {
        self.min_ts.store(v.max(1), Ordering::Release);
    }

    pub fn clear(&self) {
        self.min_ts.store(0, Ordering::Release);
    }

    /// Count `count` timestamps issued by this slot's backend (the only writer: a load and
    /// a store, not a read-modify-write).
    pub fn count_issued(&self, count: u32) {
        let issued = self.issued.load(Ordering::Relaxed);
        self.issued.store(issued.wrapping_add(u64::from(count)), Ordering::Relaxed);
    }

    /// The value held (0: none).
    pub fn min_ts(&self) -> u64 {
        self.min_ts.load(Ordering::Acquire)
    }

    pub fn pid(&self) -> i32 {
        self.pid.load(Ordering::Relaxed)
    }
}

/// The slots, one per possible backend (indexed by PGPROC number), in shared memory.
pub struct SharedHolders {
    name: &'static CStr,
    block: UnsafeCell<Option<(*mut CacheLine<HolderSlot>, usize)>>,
}

// SAFETY: `block` is written once per process, in the shmem startup hook, before any other
// code of this process runs (backends are single-threaded); afterwards it is only read. What
// it points to is shared memory made of atomics.
unsafe impl Sync for SharedHolders {}

impl SharedHolders {
    const fn new(name: &'static CStr) -> Self {
        Self { name, block: UnsafeCell::new(None) }
    }

    fn size(len: usize) -> usize {
        (len + 1) * std::mem::size_of::<CacheLine<HolderSlot>>()
    }

    pub fn slots(&self) -> &[CacheLine<HolderSlot>] {
        // SAFETY: see `unsafe impl Sync`: written only during shmem startup.
        match unsafe { *self.block.get() } {
            // SAFETY: `len` slots initialised in shared memory, alive as long as the process.
            Some((ptr, len)) => unsafe { std::slice::from_raw_parts(ptr, len) },
            None => &[],
        }
    }

    /// This backend's slot (`None` for a process without one).
    pub fn mine(&self) -> Option<&HolderSlot> {
        let index = usize::try_from(crate::pg::compat::my_proc_number()).ok()?;
        self.slots().get(index).map(|s| &s.0)
    }
}

/// Stand-in value for pg_shmem_init!'s `Default` requirement.
#[derive(Clone, Copy, Default)]
pub struct HoldersInit;
// SAFETY: a unit struct, holding nothing; it never even reaches shared memory.
unsafe impl PGRXSharedMemory for HoldersInit {}

impl PgSharedMemoryInitialization for SharedHolders {
    type Value = HoldersInit;

    unsafe fn on_shmem_request(&'static self) {
        // SAFETY: called from shmem_request_hook, where MaxBackends is already computed.
        unsafe {
            let len = usize::try_from(pg_sys::MaxBackends).unwrap_or(0).max(1);
            pg_sys::RequestAddinShmemSpace(Self::size(len));
        }
    }

    unsafe fn on_shmem_startup(&'static self, _value: HoldersInit) {
        // SAFETY: called from shmem_startup_hook in every process that attaches, under
        // AddinShmemInitLock (MainLWLockArray[21]); the first initialises the slots, the
        // others find them. The block has room for `len` slots at their alignment.
        unsafe {
            let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
            pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
            let len = usize::try_from(pg_sys::MaxBackends).unwrap_or(0).max(1);
            let mut found = false;
            let raw = pg_sys::ShmemInitStruct(self.name.as_ptr(), Self::size(len), &mut found)
                .cast::<u8>();
            let ptr = raw
                .add(raw.align_offset(std::mem::align_of::<CacheLine<HolderSlot>>()))
                .cast::<CacheLine<HolderSlot>>();
            if !found {
                for i in 0..len {
                    ptr.add(i).write(CacheLine(HolderSlot::default()));
                }
            }
            *self.block.get() = Some((ptr, len));
            pg_sys::LWLockRelease(init_lock);
        }
    }
}

// SAFETY: a name of its own (see shmem.rs).
pub static HOLDERS: SharedHolders = SharedHolders::new(c"tsoracle_holders");

/// `R` on a primary: from the window's next, the slots and the live leases, never below an
/// `R` computed before (in this server's life; after a restart or a promotion the fence
/// starts above every value issued before, so `R` goes on above those too).
pub fn primary_resolved(signals: &Signals) -> Result<u64, TsoError> {
    // On a member: the floor of what the oracle will answer, as the window's next is here.
    let next = if crate::pg::guc::is_member() {
        signals.member_floor.get()
    } else {
        signals.window.next_ts()
    };
    if next == 0 {
        // Nothing opened since this server (re)started: the fence has not run yet.
        return Err(not_serving(signals, ORACLE.share().phase));
    }
    fence(Ordering::SeqCst);
    let held = HOLDERS.slots().iter().map(|s| s.min_ts.load(Ordering::Relaxed));
    let lease_from = LEASE_BOUNDS.share().earliest_live_from(clock::sample());
    let r = tsoracle_core::resolved::resolved(next, held, lease_from);
    Ok(signals.raise_resolved(r))
}

/// Timestamps issued from the window in this server's life, summed over the slots.
pub fn timestamps_issued() -> u64 {
    HOLDERS.slots().iter().map(|s| s.issued.load(Ordering::Relaxed)).fold(0, u64::wrapping_add)
}

/// The holding that holds `R` lowest.
#[derive(Clone, Copy, Debug)]
pub struct OldestHold {
    /// The lowest value held.
    pub ts: u64,
    /// Its process.
    pub pid: i32,
    /// When that holding began, on the monotonic clock (`clock::mono_ms`).
    pub since_mono_ms: u64,
}

/// How many slots hold a value, and the holding of the lowest.
pub fn oldest_hold() -> (i32, Option<OldestHold>) {
    let mut holders = 0;
    let mut oldest: Option<OldestHold> = None;
    for slot in HOLDERS.slots() {
        let v = slot.min_ts();
        if v == 0 {
            continue;
        }
        holders += 1;
        if oldest.is_none_or(|o| v < o.ts) {
            let since_mono_ms = slot.since_mono_ms.load(Ordering::Relaxed);
            oldest = Some(OldestHold { ts: v, pid: slot.pid(), since_mono_ms });
        }
    }
    (holders, oldest)
}

/// The worker's own holding, while it grants or renews leases: it holds `R` below a timestamp
/// it takes through its slot exactly as a caller's transaction does, so every `R` handed out
/// before the grant is visible is below that timestamp, and the grant's lowest stamp (the
/// millisecond after it, `tsoracle_core::lease::stamp_from_ms`) is above them all. Released
/// when dropped, once the grant's bounds are published.
pub struct WorkerHold {
    slot: &'static HolderSlot,
    /// The timestamp taken.
    pub issued: u64,
}

impl WorkerHold {
    /// Take one timestamp under the worker's slot; `None` while the window does not serve.
    pub fn take(signals: &Signals) -> Option<WorkerHold> {
        let slot = HOLDERS.mine()?;
        // SAFETY: a plain read of this process's pid.
        slot.publish(signals.window.next_ts(), unsafe { pg_sys::MyProcPid });
        // As in a caller's hold: a reader whose fence comes after this one sees the slot; one
        // whose fence came first read a window `next` at or below what the grant below gets.
        fence(Ordering::SeqCst);
        match signals.window.try_grant(clock::now_ms(), 1) {
            Ok(issued) => {
                slot.raise_to(issued);
                Some(WorkerHold { slot, issued })
            }
            Err(_) => {
                slot.clear();
                None
            }
        }
    }
}

impl Drop for WorkerHold {
    fn drop(&mut self) {
        self.slot.clear();
    }
}
