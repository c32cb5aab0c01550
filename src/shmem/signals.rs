//! Lock-free state shared by callers and the worker (`SIGNALS`): the window `tso_next()`
//! takes from with one compare-and-swap, the serve-until gate, the resolved timestamp's high
//! mark, and the latches and condition variables that connect callers with the worker.

use crate::pg::clock;
use crate::pg::error::TsoError;
use pgrx::pg_sys;
use pgrx::shmem::{PGRXSharedMemory, PgSharedMemoryInitialization};
use std::cell::UnsafeCell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering};
use tsoracle_core::window::AtomicWindow;

/// Keeps what it holds on a cache line of its own (no false sharing between the window,
/// which every call writes, and what calls only read or write per backend).
#[derive(Debug)]
#[repr(C, align(64))]
pub struct CacheLine<T>(pub T);

impl<T> std::ops::Deref for CacheLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The serve-until deadlines, on both clocks (see `Signals::serve_left_ms`).
#[derive(Debug, Default)]
#[repr(C)]
pub struct ServeUntil {
    wall_ms: AtomicU64,
    mono_ms: AtomicU64,
}

/// Lock-free state shared by callers and the worker: the window `tso_next()` takes from,
/// and the signals between callers and the worker.
#[repr(C)]
pub struct Signals {
    /// The hot path: timestamps are taken from here with one compare-and-swap.
    pub window: CacheLine<AtomicWindow>,
    /// Clock time of the first timestamp served after the last fence (0: none yet). Written
    /// once per fence, read by every call: on its own cache line.
    pub first_grant_ms: CacheLine<AtomicU64>,
    /// Until when timestamps may be issued: `tsoracle.window_ahead_ms` past the start of the
    /// last commit the synchronous standbys confirmed, on both clocks. A primary that has
    /// lost them stops issuing within `window_ahead_ms`, whatever its window still holds and
    /// however its wall clock steps (see docs/replication.md). Written by the worker after
    /// each confirmed commit.
    serve_until: CacheLine<ServeUntil>,
    /// The highest resolved timestamp computed in this server's life (`crate::resolved`).
    resolved: CacheLine<AtomicU64>,
    /// The last resolved timestamp the worker published to standbys, and when (wall ms).
    published_resolved: AtomicU64,
    published_resolved_at_ms: AtomicU64,
    /// Broadcast by the worker whenever the committed window or the phase changes.
    window_moved: UnsafeCell<pg_sys::ConditionVariable>,
    /// Broadcast by the worker when it has answered requests (or freed queue slots).
    requests_answered: UnsafeCell<pg_sys::ConditionVariable>,
    /// The worker's process latch (in shared memory, so any backend may set it).
    worker_latch: AtomicPtr<pg_sys::Latch>,
    worker_pid: AtomicI32,
    /// Set by callers that found the window exhausted; one extension serves them all.
    extension_requested: AtomicBool,
    /// Highest physical_ms requested by `tso_seed()` (or a restore) and not yet applied.
    seed_requested_ms: AtomicU64,
    /// Highest epoch a restored high-water carried, for the next fence.
    seed_epoch: AtomicU64,
    /// `tso_handover()` was called: stop serving until the server restarts.
    handover_requested: AtomicBool,
    /// Set when a restore wrote the durable tables underneath the worker: fence again.
    refence_requested: AtomicBool,
    /// On a member of a fleet: where the next value from the oracle may start.
    pub member_floor: CacheLine<super::member::MemberFloor>,
    /// Whether this cluster may serve on its own (no `tsoracle.oracle`): `ALONE_UNKNOWN` until
    /// the worker looked since the server started or a restore committed, `ALONE_YES`, or
    /// `ALONE_NO` (it has been a member of a fleet and has not left it by the runbook:
    /// `tsoracle.member_oracle` holds a row). Nothing is granted in place before the worker
    /// found `ALONE_YES`.
    alone: std::sync::atomic::AtomicU8,
}

const ALONE_UNKNOWN: u8 = 0;
const ALONE_YES: u8 = 1;
const ALONE_NO: u8 = 2;

// SAFETY: atomics, PostgreSQL condition variables (made to live in shared memory, used only
// through ConditionVariable* calls, which lock them), and a pointer to a latch that is itself
// in shared memory, mapped at the same address in every process.
unsafe impl PGRXSharedMemory for Signals {}

impl Signals {
    /// A commit that began at `started` is confirmed (flushed and replicated): issuing may
    /// go on for `window_ahead_ms` from then, on the monotonic and on the wall clock.
    /// Only the worker calls this, one commit after the other, so on the wall clock the later
    /// commit's deadline replaces the earlier one: after a step back it steps back with the
    /// clock it is compared with.
    pub fn confirm_until(&self, started: clock::Sample, window_ahead_ms: u64) {
        self.serve_until
            .wall_ms
            .store(started.wall_ms.saturating_add(window_ahead_ms), Ordering::Release);
        self.serve_until
            .mono_ms
            .fetch_max(started.mono_ms.saturating_add(window_ahead_ms), Ordering::AcqRel);
    }

    /// How long issuing may go on from `now`: the sooner of the two deadlines (0: it may not).
    /// The monotonic one makes a step back of the wall clock keep nothing open longer; the
    /// wall one closes the gate when the wall clock jumps ahead of the monotonic clock (a
    /// VM resumed after a pause its monotonic clock did not count).
    pub fn serve_left_ms(&self, now: clock::Sample) -> u64 {
        let wall = self.serve_until.wall_ms.load(Ordering::Acquire).saturating_sub(now.wall_ms);
        let mono = self.serve_until.mono_ms.load(Ordering::Acquire).saturating_sub(now.mono_ms);
        wall.min(mono)
    }

    /// Raise the shared resolved timestamp to at least `r`; returns it (never lower than any
    /// value returned before).
    pub fn raise_resolved(&self, r: u64) -> u64 {
        self.resolved.fetch_max(r, Ordering::AcqRel).max(r)
    }

    pub fn set_published_resolved(&self, r: u64, at_ms: u64) {
        self.published_resolved.store(r, Ordering::Release);
        self.published_resolved_at_ms.store(at_ms, Ordering::Release);
    }

    /// The last resolved timestamp published to standbys and when (0, 0: none yet).
    pub fn published_resolved(&self) -> (u64, u64) {
        (
            self.published_resolved.load(Ordering::Acquire),
            self.published_resolved_at_ms.load(Ordering::Acquire),
        )
    }

    pub fn worker_pid(&self) -> i32 {
        self.worker_pid.load(Ordering::Acquire)
    }

    /// Called by the worker when it starts (with its latch) and when it exits (null).
    pub fn set_worker(&self, latch: *mut pg_sys::Latch, pid: i32) {
        self.worker_latch.store(latch, Ordering::Release);
        self.worker_pid.store(pid, Ordering::Release);
    }

    pub fn wake_worker(&self) {
        let latch = self.worker_latch.load(Ordering::Acquire);
        if !latch.is_null() {
            // SAFETY: the latch is a PGPROC latch in shared memory; setting a latch whose owner
            // has gone only causes a spurious wake-up of its next owner.
            unsafe { pg_sys::SetLatch(latch) };
        }
    }

    pub fn request_extension(&self) {
        self.extension_requested.store(true, Ordering::Release);
        self.wake_worker();
    }

    pub fn take_extension_request(&self) -> bool {
        self.extension_requested.swap(false, Ordering::AcqRel)
    }

    pub fn request_seed(&self, physical_ms: u64) {
        self.seed_requested_ms.fetch_max(physical_ms, Ordering::AcqRel);
        self.wake_worker();
    }

    pub fn take_seed_request(&self) -> u64 {
        self.seed_requested_ms.swap(0, Ordering::AcqRel)
    }

    /// A restored high-water's epoch: the next fence takes the epoch at least that high.
    pub fn request_seed_epoch(&self, epoch: u64) {
        self.seed_epoch.fetch_max(epoch, Ordering::AcqRel);
    }

    pub fn seed_epoch(&self) -> u64 {
        self.seed_epoch.load(Ordering::Acquire)
    }

    /// Stop serving for a switchover (`tso_handover()`): at once, and for the rest of this
    /// server's life.
    pub fn request_handover(&self) {
        self.window.close();
        self.handover_requested.store(true, Ordering::Release);
        self.wake_worker();
    }

    pub fn handover_requested(&self) -> bool {
        self.handover_requested.load(Ordering::Acquire)
    }

    /// The worker found whether this cluster may serve on its own (see `alone`).
    pub fn set_may_serve_alone(&self, may: bool) {
        self.alone.store(if may { ALONE_YES } else { ALONE_NO }, Ordering::Release);
    }

    /// Until the worker looks again (`None`): a restore may have brought the mark of a member
    /// (`tsoracle.member_oracle`), so nothing is granted in place meanwhile.
    pub fn forget_may_serve_alone(&self) {
        self.alone.store(ALONE_UNKNOWN, Ordering::Release);
    }

    /// Whether this cluster may serve on its own: `None` while the worker has not looked.
    pub fn may_serve_alone(&self) -> Option<bool> {
        match self.alone.load(Ordering::Acquire) {
            ALONE_UNKNOWN => None,
            v => Some(v == ALONE_YES),
        }
    }

    /// Stop serving at once and have the worker fence again (its durable state changed).
    pub fn request_refence(&self) {
        self.window.close();
        self.refence_requested.store(true, Ordering::Release);
        self.wake_worker();
    }

    pub fn take_refence_request(&self) -> bool {
        self.refence_requested.swap(false, Ordering::AcqRel)
    }

    pub fn condvar(&self) -> *mut pg_sys::ConditionVariable {
        self.window_moved.get()
    }

    pub fn broadcast(&self) {
        // SAFETY: initialised with ConditionVariableInit when the segment was created (no
        // `Signals` is reachable before); broadcasting takes the variable's own spinlock.
        unsafe { pg_sys::ConditionVariableBroadcast(self.condvar()) };
    }

    pub fn answers_condvar(&self) -> *mut pg_sys::ConditionVariable {
        self.requests_answered.get()
    }

    /// Wake callers waiting for a free queue slot.
    pub fn broadcast_answers(&self) {
        // SAFETY: as in `broadcast`.
        unsafe { pg_sys::ConditionVariableBroadcast(self.answers_condvar()) };
    }
}

/// A `Signals` block in shared memory; like pgrx's `PgAtomic`, but its condition variable is
/// initialised with `ConditionVariableInit` when the segment is created.
pub struct SharedSignals {
    name: &'static CStr,
    inner: UnsafeCell<*mut Signals>,
}

// SAFETY: `inner` is written once per process, in the shmem startup hook, before any other
// code of this process runs (PostgreSQL backends are single-threaded); afterwards it is only
// read. What it points to is shared memory made of atomics and condition variables.
unsafe impl Sync for SharedSignals {}

impl SharedSignals {
    /// Room for `Signals` at its alignment, wherever PostgreSQL places the block.
    const RAW_SIZE: usize = std::mem::size_of::<Signals>() + std::mem::align_of::<Signals>();

    const fn new(name: &'static CStr) -> Self {
        Self { name, inner: UnsafeCell::new(std::ptr::null_mut()) }
    }

    /// `None` when the library was not preloaded (no shared memory was set up).
    pub fn get(&self) -> Option<&Signals> {
        // SAFETY: see `unsafe impl Sync`: written only during shmem startup; a non-null
        // pointer is the initialised block, which lives as long as the process.
        unsafe { (*self.inner.get()).as_ref() }
    }
}

/// Stand-in value for pg_shmem_init!'s `Default` requirement; the real initialisation is in
/// `on_shmem_startup`.
#[derive(Clone, Copy, Default)]
pub struct SignalsInit;
// SAFETY: a unit struct, holding nothing; it never even reaches shared memory.
unsafe impl PGRXSharedMemory for SignalsInit {}

impl PgSharedMemoryInitialization for SharedSignals {
    type Value = SignalsInit;

    unsafe fn on_shmem_request(&'static self) {
        // SAFETY: called from shmem_request_hook, the one place where space may be requested.
        unsafe { pg_sys::RequestAddinShmemSpace(Self::RAW_SIZE) };
    }

    unsafe fn on_shmem_startup(&'static self, _value: SignalsInit) {
        // SAFETY: called from shmem_startup_hook, under AddinShmemInitLock: the first process
        // initialises the block, the others find it. ShmemInitStruct returns at least
        // RAW_SIZE bytes, room for a `Signals` at its alignment; the condition variables are
        // initialised before the pointer is published.
        unsafe {
            // AddinShmemInitLock is MainLWLockArray[21] (a macro in lwlock.h, so no binding).
            let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
            pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
            let mut found = false;
            let raw = pg_sys::ShmemInitStruct(self.name.as_ptr(), Self::RAW_SIZE, &mut found)
                .cast::<u8>();
            // PostgreSQL only promises MAXALIGN; the cache lines need 64. Every process
            // computes the same aligned address from the same block.
            let ptr = raw.add(raw.align_offset(std::mem::align_of::<Signals>())).cast::<Signals>();
            if !found {
                ptr.write(Signals {
                    window: CacheLine(AtomicWindow::new()),
                    first_grant_ms: CacheLine(AtomicU64::new(0)),
                    serve_until: CacheLine(ServeUntil::default()),
                    resolved: CacheLine(AtomicU64::new(0)),
                    published_resolved: AtomicU64::new(0),
                    published_resolved_at_ms: AtomicU64::new(0),
                    window_moved: UnsafeCell::new(std::mem::zeroed()),
                    requests_answered: UnsafeCell::new(std::mem::zeroed()),
                    worker_latch: AtomicPtr::new(std::ptr::null_mut()),
                    worker_pid: AtomicI32::new(0),
                    extension_requested: AtomicBool::new(false),
                    seed_requested_ms: AtomicU64::new(0),
                    seed_epoch: AtomicU64::new(0),
                    handover_requested: AtomicBool::new(false),
                    refence_requested: AtomicBool::new(false),
                    member_floor: CacheLine(super::member::MemberFloor::default()),
                    alone: std::sync::atomic::AtomicU8::new(ALONE_UNKNOWN),
                });
                pg_sys::ConditionVariableInit((*ptr).window_moved.get());
                pg_sys::ConditionVariableInit((*ptr).requests_answered.get());
            }
            *self.inner.get() = ptr;
            pg_sys::LWLockRelease(init_lock);
        }
    }
}

pub static SIGNALS: SharedSignals = SharedSignals::new(c"tsoracle_signals");

/// Shared signals, or `NotPreloaded`.
pub fn signals() -> Result<&'static Signals, TsoError> {
    SIGNALS.get().ok_or(TsoError::NotPreloaded)
}
