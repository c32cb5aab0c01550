//! The server's two clocks (docs/allocator.md, "Clock steps"):
//!
//! - the **wall clock** (`CLOCK_REALTIME`) in Unix milliseconds: the physical part of every
//!   timestamp and how close it is to real time. It can step either way (NTP, an operator, a
//!   VM resumed), so no guarantee rests on how far it moved;
//! - the **monotonic clock** (`CLOCK_MONOTONIC_COARSE`: it never steps, and it is the same
//!   clock for every process of the machine): every elapsed-time bound a guarantee rests on
//!   (the serve-until gate, lease deadlines in the worker's life, the pace of the reference
//!   clock) is measured on it, together with the wall clock where that is the more
//!   conservative of the two. The coarse variant costs 5 ns to read against 23 for a precise
//!   one (it is read on every `tso_next()`); its resolution is one kernel tick (4 ms here),
//!   which every bound allows for. It does not count time the machine spends suspended: the
//!   wall clock, which does, is checked too.
//!
//! `clock_gettime` directly: both are read on the hot path of `tso_next()`, and `SystemTime`
//! arithmetic costs as much again.
//!
//! Test builds only (cargo feature `clock-fault`): the wall clock every process reads is
//! offset by the setting `tsoracle.test_clock_offset_ms`, kept in shared memory (the
//! postmaster stores it there when it reloads its configuration), so the tests step the clock
//! of the whole cluster at one instant, under load. A release build has neither the setting
//! nor the offset.

/// One reading of both clocks.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub wall_ms: u64,
    pub mono_ms: u64,
}

fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer; CLOCK_REALTIME and CLOCK_MONOTONIC_COARSE exist on every
    // Linux PostgreSQL 15+ runs on (2.6.32+).
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 || ts.tv_sec < 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Milliseconds since the Unix epoch; 0 for a clock set before 1970 (the allocator then
/// keeps issuing above its last value, which is always safe).
pub fn now_ms() -> u64 {
    let wall = read(libc::CLOCK_REALTIME);
    #[cfg(feature = "clock-fault")]
    let wall = fault::offset_ms().map_or(wall, |offset| wall.saturating_add_signed(offset));
    wall
}

/// Milliseconds of the monotonic clock (since boot, suspended time not counted), at the
/// resolution of a kernel tick.
pub fn mono_ms() -> u64 {
    read(libc::CLOCK_MONOTONIC_COARSE)
}

pub fn sample() -> Sample {
    Sample { wall_ms: now_ms(), mono_ms: mono_ms() }
}

/// The wall-clock millisecond of the monotonic instant `mono_ms`, as `now` reads them: `now`'s
/// wall clock less the monotonic time elapsed since (an instant after `now` is `now`).
pub fn wall_ms_at(now: Sample, mono_ms: u64) -> u64 {
    now.wall_ms.saturating_sub(now.mono_ms.saturating_sub(mono_ms))
}

/// Test builds: the offset of the wall clock every process reads, in a shared-memory block of
/// its own (written by the setting's assign hook, which the postmaster runs first on a reload).
#[cfg(feature = "clock-fault")]
pub mod fault {
    use pgrx::pg_sys;
    use pgrx::shmem::{PGRXSharedMemory, PgSharedMemoryInitialization};
    use std::cell::UnsafeCell;
    use std::ffi::CStr;
    use std::sync::atomic::{AtomicI64, Ordering};

    /// This process's copy of the setting (the assign hook runs in every process, the
    /// postmaster first): what the shared atomic starts at, after a crash restart too.
    static LOCAL: AtomicI64 = AtomicI64::new(0);

    /// The offset in shared memory; `inner` is set once per process by the startup hook.
    pub struct SharedOffset {
        name: &'static CStr,
        inner: UnsafeCell<*mut AtomicI64>,
    }

    // SAFETY: `inner` is written once per process, in the shmem startup hook, before any other
    // code of this process runs (backends are single-threaded); afterwards it is only read,
    // and it points to an atomic in shared memory.
    unsafe impl Sync for SharedOffset {}

    /// Stand-in value for pg_shmem_init!'s `Default` requirement.
    #[derive(Clone, Copy, Default)]
    pub struct OffsetInit;
    // SAFETY: a unit struct, holding nothing; it never even reaches shared memory.
    unsafe impl PGRXSharedMemory for OffsetInit {}

    impl PgSharedMemoryInitialization for SharedOffset {
        type Value = OffsetInit;

        unsafe fn on_shmem_request(&'static self) {
            // SAFETY: called from shmem_request_hook, the one place where space may be requested.
            unsafe { pg_sys::RequestAddinShmemSpace(std::mem::size_of::<AtomicI64>()) };
        }

        unsafe fn on_shmem_startup(&'static self, _value: OffsetInit) {
            // SAFETY: called from shmem_startup_hook, under AddinShmemInitLock
            // (MainLWLockArray[21], a macro in lwlock.h, so no binding): the first process
            // (the postmaster, after a crash restart too) initialises the atomic with its own
            // copy of the setting, the others find it. ShmemInitStruct returns MAXALIGNed memory, enough for
            // an AtomicI64.
            unsafe {
                let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
                pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
                let mut found = false;
                let ptr = pg_sys::ShmemInitStruct(
                    self.name.as_ptr(),
                    std::mem::size_of::<AtomicI64>(),
                    &mut found,
                )
                .cast::<AtomicI64>();
                if !found {
                    ptr.write(AtomicI64::new(LOCAL.load(Ordering::Relaxed)));
                }
                *self.inner.get() = ptr;
                pg_sys::LWLockRelease(init_lock);
            }
        }
    }

    pub static OFFSET: SharedOffset = SharedOffset {
        name: c"tsoracle_test_clock_offset",
        inner: UnsafeCell::new(std::ptr::null_mut()),
    };

    /// Called from `_PG_init` while preloading (with the other shared-memory blocks).
    pub fn init() {
        // pg_shmem_init! expands to a #[pg_guard] hook.
        use pgrx::pg_guard;
        pgrx::pg_shmem_init!(OFFSET = OffsetInit);
    }

    fn shared() -> Option<&'static AtomicI64> {
        // SAFETY: see `unsafe impl Sync`: written only during shmem startup; a non-null pointer
        // is the initialised atomic, alive as long as the process.
        unsafe { (*OFFSET.inner.get()).as_ref() }
    }

    pub fn offset_ms() -> Option<i64> {
        shared().map(|o| o.load(Ordering::Acquire))
    }

    /// From the setting's assign hook.
    pub fn set_offset_ms(offset_ms: i64) {
        LOCAL.store(offset_ms, Ordering::Relaxed);
        if let Some(o) = shared() {
            o.store(offset_ms, Ordering::Release);
        }
    }
}
