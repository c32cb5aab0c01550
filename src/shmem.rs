//! Shared memory: the allocator window (behind an LWLock) and the signals that connect
//! callers with the worker (a condition variable and the worker's latch).
//!
//! Everything here is reinitialised by the postmaster after a crash restart, so the oracle
//! comes back not serving and the worker's fence must run before anything is issued.

use pgrx::lwlock::PgLwLock;
use pgrx::pg_guard;
use pgrx::pg_sys;
use pgrx::shmem::{PGRXSharedMemory, PgSharedMemoryInitialization};
use std::cell::UnsafeCell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering};
use tsoracle_core::allocator::Allocator;

/// What the oracle is doing, as shown by `tso_status()` and used to word errors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// The worker has not started (or is restarting).
    #[default]
    Starting,
    /// The worker is connected but `CREATE EXTENSION tsoracle` has not run in `tsoracle.database`.
    WaitingForExtension,
    /// The fence is running: nothing is served until it commits.
    Fencing,
    /// The allocator holds a committed window.
    Serving,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::WaitingForExtension => "waiting_for_extension",
            Phase::Fencing => "fencing",
            Phase::Serving => "serving",
        }
    }
}

/// State guarded by the oracle's LWLock. Plain data only: it lives in shared memory.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct OracleState {
    pub allocator: Allocator,
    pub phase: Phase,
    /// Highest high-water ever committed in this server's lifetime: the fence never seeds
    /// below it, even if the table was dropped and recreated under a running server.
    pub max_committed_ms: u64,
    /// WAL timeline the current epoch was taken from.
    pub timeline: u32,
    pub timestamps_issued: u64,
    pub window_extensions: u64,
    pub fences: u64,
    pub last_fence_us: u64,
    pub worker_commits: u64,
    /// Highest `tso_seed()` value made durable, so seeding callers know when they are done.
    pub seeded_ms: u64,
}

unsafe impl PGRXSharedMemory for OracleState {}

pub static ORACLE: PgLwLock<OracleState> = unsafe { PgLwLock::new(c"tsoracle_oracle") };

/// Lock-free signals between callers and the worker.
#[repr(C)]
pub struct Signals {
    /// Broadcast by the worker whenever the committed window or the phase changes.
    window_moved: UnsafeCell<pg_sys::ConditionVariable>,
    /// The worker's process latch (in shared memory, so any backend may set it).
    worker_latch: AtomicPtr<pg_sys::Latch>,
    worker_pid: AtomicI32,
    /// Set by callers that found the window exhausted; one extension serves them all.
    extension_requested: AtomicBool,
    /// Highest physical_ms requested by `tso_seed()` and not yet applied.
    seed_requested_ms: AtomicU64,
}

unsafe impl PGRXSharedMemory for Signals {}

impl Signals {
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

    pub fn condvar(&self) -> *mut pg_sys::ConditionVariable {
        self.window_moved.get()
    }

    pub fn broadcast(&self) {
        unsafe { pg_sys::ConditionVariableBroadcast(self.condvar()) };
    }
}

/// A `Signals` block in shared memory; like pgrx's `PgAtomic`, but its condition variable is
/// initialised with `ConditionVariableInit` when the segment is created.
pub struct SharedSignals {
    name: &'static CStr,
    inner: UnsafeCell<*mut Signals>,
}

unsafe impl Sync for SharedSignals {}

impl SharedSignals {
    const fn new(name: &'static CStr) -> Self {
        Self { name, inner: UnsafeCell::new(std::ptr::null_mut()) }
    }

    /// `None` when the library was not preloaded (no shared memory was set up).
    pub fn get(&self) -> Option<&Signals> {
        unsafe { (*self.inner.get()).as_ref() }
    }
}

/// Stand-in value for pg_shmem_init!'s `Default` requirement; the real initialisation is in
/// `on_shmem_startup`.
#[derive(Clone, Copy, Default)]
pub struct SignalsInit;
unsafe impl PGRXSharedMemory for SignalsInit {}

impl PgSharedMemoryInitialization for SharedSignals {
    type Value = SignalsInit;

    unsafe fn on_shmem_request(&'static self) {
        unsafe { pg_sys::RequestAddinShmemSpace(std::mem::size_of::<Signals>()) };
    }

    unsafe fn on_shmem_startup(&'static self, _value: SignalsInit) {
        unsafe {
            // AddinShmemInitLock is MainLWLockArray[21] (a macro in lwlock.h, so no binding).
            let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
            pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
            let mut found = false;
            let ptr = pg_sys::ShmemInitStruct(
                self.name.as_ptr(),
                std::mem::size_of::<Signals>(),
                &mut found,
            )
            .cast::<Signals>();
            if !found {
                ptr.write(Signals {
                    window_moved: UnsafeCell::new(std::mem::zeroed()),
                    worker_latch: AtomicPtr::new(std::ptr::null_mut()),
                    worker_pid: AtomicI32::new(0),
                    extension_requested: AtomicBool::new(false),
                    seed_requested_ms: AtomicU64::new(0),
                });
                pg_sys::ConditionVariableInit((*ptr).window_moved.get());
            }
            *self.inner.get() = ptr;
            pg_sys::LWLockRelease(init_lock);
        }
    }
}

pub static SIGNALS: SharedSignals = SharedSignals::new(c"tsoracle_signals");

/// Called from `_PG_init` when preloading.
pub fn init() {
    pgrx::pg_shmem_init!(ORACLE);
    pgrx::pg_shmem_init!(SIGNALS = SignalsInit);
}

/// Shared signals, or `NotPreloaded`.
pub fn signals() -> Result<&'static Signals, crate::error::TsoError> {
    SIGNALS.get().ok_or(crate::error::TsoError::NotPreloaded)
}
