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
#[cfg(feature = "clock-fault")]
use std::sync::atomic::AtomicI64;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering};
use tsoracle_core::allocator::Allocator;
use tsoracle_core::clock::ReferenceClock;
use tsoracle_core::lease::{PublishedBound, PublishedBounds};
use tsoracle_core::queue::{self, EntryState, Queue, QueueHeader, Ticket};
use tsoracle_core::window::AtomicWindow;

/// What the oracle is doing, as shown by `tso_status()` and used to word errors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// The worker has not started (or is restarting).
    #[default]
    Starting,
    /// The worker is connected but `CREATE EXTENSION tsoracle` has not run in `tsoracle.database`.
    WaitingForExtension,
    /// The tables in schema `tsoracle` are not those this library needs (an older version).
    OutdatedSchema,
    /// The fence is running: nothing is served until it commits.
    Fencing,
    /// The allocator holds a committed window.
    Serving,
    /// The worker will not serve until an administrator acts; `OracleState::refusal` says why
    /// (for example a durable high-water at the top of the timestamp range, or settings of
    /// the worker's database that it cannot override).
    Refused,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::WaitingForExtension => "waiting_for_extension",
            Phase::OutdatedSchema => "outdated_schema",
            Phase::Fencing => "fencing",
            Phase::Serving => "serving",
            Phase::Refused => "refused",
        }
    }
}

/// State guarded by the oracle's LWLock. Plain data only: it lives in shared memory.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct OracleState {
    pub allocator: Allocator,
    /// What the lead cap is measured against; sampled by the worker at every tick and fence.
    pub clock: ReferenceClock,
    pub phase: Phase,
    /// Highest high-water ever committed in this server's lifetime: the fence never seeds
    /// below it, even if the table was dropped and recreated under a running server.
    pub max_committed_ms: u64,
    /// WAL timeline the current epoch was taken from.
    pub timeline: u32,
    pub window_extensions: u64,
    pub fences: u64,
    pub last_fence_us: u64,
    pub worker_commits: u64,
    /// Highest `tso_seed()` value made durable, so seeding callers know when they are done.
    pub seeded_ms: u64,
    /// When the worker started (after recovery ended: start, crash restart, promotion).
    pub worker_started_ms: u64,
    /// The last fence found the durable row on an older timeline: a promotion.
    pub last_fence_promoted: bool,
    /// The worker's database is not UTF8: keys and holders must be ASCII to be stored there.
    pub ascii_names_only: bool,
    /// Why the worker refuses to serve (`Phase::Refused`), or why it does not grant blocks and
    /// leases right now (strict mode without a synchronous standby); UTF-8, `refusal_len` bytes.
    pub refusal: [u8; REFUSAL_BYTES],
    pub refusal_len: usize,
}

/// Room for the refusal text in shared memory.
pub const REFUSAL_BYTES: usize = 240;

impl Default for OracleState {
    fn default() -> Self {
        OracleState {
            allocator: Allocator::default(),
            clock: ReferenceClock::new(),
            phase: Phase::default(),
            max_committed_ms: 0,
            timeline: 0,
            window_extensions: 0,
            fences: 0,
            last_fence_us: 0,
            worker_commits: 0,
            seeded_ms: 0,
            worker_started_ms: 0,
            last_fence_promoted: false,
            ascii_names_only: false,
            refusal: [0; REFUSAL_BYTES],
            refusal_len: 0,
        }
    }
}

impl OracleState {
    /// Record why the worker refuses (empty: it does not), cut at a character boundary.
    pub fn set_refusal(&mut self, why: &str) {
        let mut len = why.len().min(REFUSAL_BYTES);
        while !why.is_char_boundary(len) {
            len -= 1;
        }
        self.refusal[..len].copy_from_slice(&why.as_bytes()[..len]);
        self.refusal_len = len;
    }

    pub fn refusal(&self) -> Option<String> {
        let text =
            std::str::from_utf8(&self.refusal[..self.refusal_len.min(REFUSAL_BYTES)]).unwrap_or("");
        (!text.is_empty()).then(|| text.to_string())
    }
}

// SAFETY: plain data (integers, flags, fieldless enums, a byte array): no pointers and nothing
// on the heap, so it means the same in every process that maps the segment.
unsafe impl PGRXSharedMemory for OracleState {}

// SAFETY: the name is that of no other shared-memory struct or LWLock tranche: each of this
// file's statics has its own, and all start with `tsoracle_`.
pub static ORACLE: PgLwLock<OracleState> = unsafe { PgLwLock::new(c"tsoracle_oracle") };

/// Longest key or lease holder name, in bytes.
pub const NAME_BYTES: usize = 128;

/// A request that only the worker can carry out (it writes durable state).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum RequestKind {
    #[default]
    SeqAdvance,
    SeqPeek,
    /// Remove a key (its owner or a superuser).
    SeqDrop,
    /// name = holder, arg = holder epoch, count = TTL in ms.
    LeaseAcquire,
    /// arg = lease id.
    LeaseRenew,
    /// arg = lease id.
    LeaseRelease,
}

/// How the worker answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum ReplyCode {
    #[default]
    Ok,
    /// The value is NULL (tso_seq_peek of an unknown key).
    Null,
    SeqOverflow,
    TooManyKeys,
    StaleHolderEpoch,
    LeaseNotFound,
    LeaseNotRenewable,
    TooManyLeases,
    /// The calling role may not use this key or lease.
    PermissionDenied,
    /// The key or holder cannot be stored in the worker's database (its encoding is not UTF8).
    BadEncoding,
    /// The worker will not grant anything now (see `tso_status().detail`).
    Refused,
    /// The worker restarted while holding the request: it may or may not have committed.
    Unknown,
}

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct Request {
    pub kind: RequestKind,
    /// Requests of one call share a batch (the call's generation) and commit or fail together.
    pub batch: u64,
    /// The calling role (`GetUserId()`), whose privileges the worker checks.
    pub role: u32,
    pub name_len: u8,
    pub name: [u8; NAME_BYTES],
    pub count: u64,
    pub arg: i64,
}

impl Request {
    /// `batch` is assigned when the worker takes the call, `role` when it is queued.
    pub fn new(kind: RequestKind, name: &str, count: u64) -> Self {
        let mut buf = [0u8; NAME_BYTES];
        let len = name.len().min(NAME_BYTES);
        buf[..len].copy_from_slice(&name.as_bytes()[..len]);
        Request { kind, batch: 0, role: 0, name_len: len as u8, name: buf, count, arg: 0 }
    }

    pub fn with_arg(self, arg: i64) -> Self {
        Request { arg, ..self }
    }

    pub fn name(&self) -> &str {
        // Written from a &str, cut only at NAME_BYTES, which validation keeps whole.
        std::str::from_utf8(&self.name[..usize::from(self.name_len)]).unwrap_or("")
    }
}

impl Default for Request {
    fn default() -> Self {
        Request::new(RequestKind::SeqAdvance, "", 0)
    }
}

#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct Reply {
    pub code: ReplyCode,
    /// The block's start, the peeked value, or the lease id.
    pub value: i64,
    /// Leases: the bound, expiry and epoch granted.
    pub bound_ms: i64,
    pub expires_at_ms: i64,
    pub epoch: i64,
}

impl Reply {
    pub fn ok(value: i64) -> Self {
        Reply { code: ReplyCode::Ok, value, ..Reply::default() }
    }

    pub fn err(code: ReplyCode) -> Self {
        Reply { code, ..Reply::default() }
    }
}

pub type Entry = queue::Entry<Request, Reply>;

/// Where the request queue lives: a header and one entry per backend (`MaxBackends`
/// entries, indexed by PGPROC number), sized when the server starts, under one LWLock.
struct QueueBlock {
    header: *mut QueueHeader,
    entries: *mut Entry,
    len: usize,
    lock: *mut pg_sys::LWLock,
}

/// The request queue in shared memory (see `tsoracle_core::queue` for its states).
pub struct SharedQueue {
    name: &'static CStr,
    block: UnsafeCell<Option<QueueBlock>>,
}

// SAFETY: `block` is written once per process, in the shmem startup hook, before any other
// code of this process runs (PostgreSQL backends are single-threaded); afterwards it is only
// read. What it points to is shared memory, guarded by the queue's LWLock.
unsafe impl Sync for SharedQueue {}

/// The queue, locked. Dropping it releases the LWLock.
pub struct QueueGuard<'a> {
    block: &'a QueueBlock,
    exclusive: bool,
}

impl SharedQueue {
    const fn new(name: &'static CStr) -> Self {
        Self { name, block: UnsafeCell::new(None) }
    }

    fn entries_for(max_backends: usize) -> usize {
        max_backends.max(1)
    }

    fn size(len: usize) -> usize {
        std::mem::size_of::<QueueHeader>()
            + std::mem::align_of::<Entry>()
            + len * std::mem::size_of::<Entry>()
    }

    fn block(&self) -> Option<&QueueBlock> {
        // SAFETY: see `unsafe impl Sync`: written only during shmem startup.
        unsafe { (*self.block.get()).as_ref() }
    }

    fn lock(&self, exclusive: bool) -> Result<QueueGuard<'_>, crate::error::TsoError> {
        let block = self.block().ok_or(crate::error::TsoError::NotPreloaded)?;
        let mode = if exclusive {
            pg_sys::LWLockMode::LW_EXCLUSIVE
        } else {
            pg_sys::LWLockMode::LW_SHARED
        };
        // SAFETY: the lock was handed out by GetNamedLWLockTranche for this block; the guard
        // releases it on drop, also when an error unwinds through its holder.
        unsafe { pg_sys::LWLockAcquire(block.lock, mode) };
        Ok(QueueGuard { block, exclusive })
    }

    /// The queue under its LWLock in exclusive mode.
    pub fn exclusive(&self) -> Result<QueueGuard<'_>, crate::error::TsoError> {
        self.lock(true)
    }

    /// The queue under its LWLock in shared mode: reads only.
    pub fn share(&self) -> Result<QueueGuard<'_>, crate::error::TsoError> {
        self.lock(false)
    }
}

impl QueueGuard<'_> {
    /// The queue's state machine; exclusive guards only.
    pub fn queue(&mut self) -> Queue<'_, Request, Reply> {
        assert!(self.exclusive, "the request queue is changed under an exclusive lock only");
        // SAFETY: the pointers come from ShmemInitStruct for `len` entries; the exclusive
        // LWLock makes these the only references for the guard's lifetime.
        unsafe {
            Queue::new(
                &mut *self.block.header,
                std::slice::from_raw_parts_mut(self.block.entries, self.block.len),
            )
        }
    }

    /// The state of a call (readers too).
    pub fn state(&self, ticket: Ticket) -> Option<EntryState> {
        if ticket.index >= self.block.len {
            return None;
        }
        // SAFETY: in bounds; writers hold the lock exclusively, so no one writes while we read.
        let entry = unsafe { &*self.block.entries.add(ticket.index) };
        (entry.generation == ticket.generation).then_some(entry.state)
    }

    pub fn header(&self) -> QueueHeader {
        // SAFETY: as in `state`.
        unsafe { *self.block.header }
    }
}

impl Drop for QueueGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: acquired in `SharedQueue::lock`, released exactly once here.
        unsafe { pg_sys::LWLockRelease(self.block.lock) };
    }
}

/// Stand-in value for pg_shmem_init!'s `Default` requirement.
#[derive(Clone, Copy, Default)]
pub struct QueueInit;
// SAFETY: a unit struct, holding nothing; it never even reaches shared memory.
unsafe impl PGRXSharedMemory for QueueInit {}

impl PgSharedMemoryInitialization for SharedQueue {
    type Value = QueueInit;

    unsafe fn on_shmem_request(&'static self) {
        // SAFETY: called from shmem_request_hook, where MaxBackends is already computed.
        unsafe {
            let len = Self::entries_for(usize::try_from(pg_sys::MaxBackends).unwrap_or(0));
            pg_sys::RequestAddinShmemSpace(Self::size(len));
            pg_sys::RequestNamedLWLockTranche(self.name.as_ptr(), 1);
        }
    }

    unsafe fn on_shmem_startup(&'static self, _value: QueueInit) {
        // SAFETY: called from shmem_startup_hook in every process that attaches, under
        // AddinShmemInitLock (MainLWLockArray[21]: a macro in lwlock.h, so no binding); the
        // first one initialises the block, the others find it. ShmemInitStruct returns at
        // least the size requested above; entries are placed at their alignment inside it.
        unsafe {
            let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
            pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
            let len = Self::entries_for(usize::try_from(pg_sys::MaxBackends).unwrap_or(0));
            let mut found = false;
            let raw = pg_sys::ShmemInitStruct(self.name.as_ptr(), Self::size(len), &mut found)
                .cast::<u8>();
            let header = raw.cast::<QueueHeader>();
            let after = raw.add(std::mem::size_of::<QueueHeader>());
            let entries =
                after.add(after.align_offset(std::mem::align_of::<Entry>())).cast::<Entry>();
            if !found {
                header.write(QueueHeader::new());
                for i in 0..len {
                    entries.add(i).write(Entry::default());
                }
            }
            let lock = &raw mut (*pg_sys::GetNamedLWLockTranche(self.name.as_ptr())).lock;
            *self.block.get() = Some(QueueBlock { header, entries, len, lock });
            pg_sys::LWLockRelease(init_lock);
        }
    }
}

pub static QUEUE: SharedQueue = SharedQueue::new(c"tsoracle_queue");

/// This backend's entry in the request queue: its PGPROC number.
pub fn my_queue_index() -> usize {
    usize::try_from(crate::compat::my_proc_number()).unwrap_or(usize::MAX)
}

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

    /// The first millisecond a lease still live at `now` may be stamped in.
    pub fn earliest_live_from(&self, now: crate::clock::Sample) -> Option<u64> {
        tsoracle_core::lease::earliest_live_from(
            &self.entries[..self.len.min(MAX_LEASES)],
            now.wall_ms,
            now.mono_ms,
        )
    }

    /// The safe frontier at `now`: `high_water_ms`, held down by every lease still live.
    pub fn frontier(&self, high_water_ms: u64, now: crate::clock::Sample) -> u64 {
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

/// Slots of the issued-timestamps counter.
const ISSUED_SLOTS: usize = 64;

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
    /// Timestamps issued, summed over slots that backends add to by process number, so
    /// that concurrent callers do not all write one cache line.
    issued: [CacheLine<AtomicU64>; ISSUED_SLOTS],
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
    /// Test builds: the offset of the wall clock every process reads (`crate::clock`).
    #[cfg(feature = "clock-fault")]
    test_clock_offset_ms: CacheLine<AtomicI64>,
    /// Broadcast by the worker whenever the committed window or the phase changes.
    window_moved: UnsafeCell<pg_sys::ConditionVariable>,
    /// Broadcast by the worker when it has answered requests (or freed queue slots).
    requests_answered: UnsafeCell<pg_sys::ConditionVariable>,
    /// The worker's process latch (in shared memory, so any backend may set it).
    worker_latch: AtomicPtr<pg_sys::Latch>,
    worker_pid: AtomicI32,
    /// Set by callers that found the window exhausted; one extension serves them all.
    extension_requested: AtomicBool,
    /// Highest physical_ms requested by `tso_seed()` and not yet applied.
    seed_requested_ms: AtomicU64,
    /// Set when a restore wrote the durable tables underneath the worker: fence again.
    refence_requested: AtomicBool,
}

// SAFETY: atomics, PostgreSQL condition variables (made to live in shared memory, used only
// through ConditionVariable* calls, which lock them), and a pointer to a latch that is itself
// in shared memory, mapped at the same address in every process.
unsafe impl PGRXSharedMemory for Signals {}

impl Signals {
    /// Count `count` timestamps issued by this backend.
    pub fn count_issued(&self, count: u32) {
        let slot = crate::compat::my_proc_number().unsigned_abs() as usize % ISSUED_SLOTS;
        self.issued[slot].fetch_add(u64::from(count), Ordering::Relaxed);
    }

    pub fn timestamps_issued(&self) -> u64 {
        self.issued.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// A commit that began at `started` is confirmed (flushed and replicated): issuing may
    /// go on for `window_ahead_ms` from then, on the monotonic and on the wall clock.
    /// Only the worker calls this, one commit after the other, so on the wall clock the later
    /// commit's deadline replaces the earlier one: after a step back it steps back with the
    /// clock it is compared with.
    pub fn confirm_until(&self, started: crate::clock::Sample, window_ahead_ms: u64) {
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
    pub fn serve_left_ms(&self, now: crate::clock::Sample) -> u64 {
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

    /// Test builds: offset the wall clock of every process by `offset_ms`.
    #[cfg(feature = "clock-fault")]
    pub fn set_test_clock_offset_ms(&self, offset_ms: i64) {
        self.test_clock_offset_ms.store(offset_ms, Ordering::Release);
    }

    #[cfg(feature = "clock-fault")]
    pub fn test_clock_offset_ms(&self) -> i64 {
        self.test_clock_offset_ms.load(Ordering::Acquire)
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
                    issued: [const { CacheLine(AtomicU64::new(0)) }; ISSUED_SLOTS],
                    first_grant_ms: CacheLine(AtomicU64::new(0)),
                    serve_until: CacheLine(ServeUntil::default()),
                    resolved: CacheLine(AtomicU64::new(0)),
                    published_resolved: AtomicU64::new(0),
                    published_resolved_at_ms: AtomicU64::new(0),
                    #[cfg(feature = "clock-fault")]
                    // After a crash restart too: the offset the postmaster has.
                    test_clock_offset_ms: CacheLine(AtomicI64::new(
                        crate::guc::test_clock_offset_ms(),
                    )),
                    window_moved: UnsafeCell::new(std::mem::zeroed()),
                    requests_answered: UnsafeCell::new(std::mem::zeroed()),
                    worker_latch: AtomicPtr::new(std::ptr::null_mut()),
                    worker_pid: AtomicI32::new(0),
                    extension_requested: AtomicBool::new(false),
                    seed_requested_ms: AtomicU64::new(0),
                    refence_requested: AtomicBool::new(false),
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

/// Called from `_PG_init` when preloading.
pub fn init() {
    pgrx::pg_shmem_init!(ORACLE);
    pgrx::pg_shmem_init!(QUEUE = QueueInit);
    pgrx::pg_shmem_init!(LEASE_BOUNDS);
    pgrx::pg_shmem_init!(SIGNALS = SignalsInit);
    use crate::resolved::{HoldersInit, HOLDERS};
    pgrx::pg_shmem_init!(HOLDERS = HoldersInit);
}

/// Shared signals, or `NotPreloaded`.
pub fn signals() -> Result<&'static Signals, crate::error::TsoError> {
    SIGNALS.get().ok_or(crate::error::TsoError::NotPreloaded)
}

/// Set the latches of callers the worker answered (after the queue lock is released).
/// A waiter is the address of the caller's `MyLatch`, as the queue stores it.
pub fn wake_waiters(waiters: impl IntoIterator<Item = usize>) {
    for waiter in waiters {
        let latch = waiter as *mut pg_sys::Latch;
        if !latch.is_null() {
            // SAFETY: a PGPROC latch in shared memory; a caller that has left only sees a
            // spurious wake-up of whatever its backend waits for next.
            unsafe { pg_sys::SetLatch(latch) };
        }
    }
}
