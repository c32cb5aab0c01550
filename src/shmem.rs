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
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::WaitingForExtension => "waiting_for_extension",
            Phase::OutdatedSchema => "outdated_schema",
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
}

unsafe impl PGRXSharedMemory for OracleState {}

pub static ORACLE: PgLwLock<OracleState> = unsafe { PgLwLock::new(c"tsoracle_oracle") };

/// Capacity of the request queue (sequence and lease calls waiting for the worker).
pub const QUEUE_SLOTS: usize = 256;
/// Longest key or lease holder name, in bytes.
pub const NAME_BYTES: usize = 128;

/// A request that only the worker can carry out (it writes durable state).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum RequestKind {
    #[default]
    SeqAdvance,
    SeqPeek,
    /// name = holder, arg = holder epoch, count = TTL in ms.
    LeaseAcquire,
    /// arg = lease id.
    LeaseRenew,
    /// arg = lease id.
    LeaseRelease,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum SlotState {
    #[default]
    Free,
    /// Filled by a caller, waiting for the worker.
    Pending,
    /// Taken by the worker into its current transaction.
    Taken,
    /// Answered; the caller reads `reply` and frees the slot.
    Done,
    /// The caller left (cancel, timeout) after the worker took the request: whatever the
    /// worker commits for it is burnt, never given to anyone else.
    Abandoned,
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
    /// The worker restarted while holding the request: it may or may not have committed.
    Unknown,
}

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct Request {
    pub kind: RequestKind,
    /// Requests of one `tso_seq_batch()` call share a batch id and commit or fail together.
    pub batch: u64,
    pub name_len: u8,
    pub name: [u8; NAME_BYTES],
    pub count: u64,
    pub arg: i64,
}

impl Request {
    /// `batch` is assigned when the request is queued.
    pub fn new(kind: RequestKind, name: &str, count: u64) -> Self {
        let mut buf = [0u8; NAME_BYTES];
        let len = name.len().min(NAME_BYTES);
        buf[..len].copy_from_slice(&name.as_bytes()[..len]);
        Request { kind, batch: 0, name_len: len as u8, name: buf, count, arg: 0 }
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

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct Slot {
    pub state: SlotState,
    /// Changes every time the slot is handed out, so a late answer or a late release can
    /// never touch another caller's request.
    pub generation: u64,
    pub request: Request,
    pub reply: Reply,
    /// The caller's process latch (in shared memory): the worker wakes exactly the callers
    /// it answered, not every waiter.
    pub waiter: *mut pg_sys::Latch,
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            state: SlotState::Free,
            generation: 0,
            request: Request::default(),
            reply: Reply::default(),
            waiter: std::ptr::null_mut(),
        }
    }
}

/// Fixed-size queue of requests for the worker, under its own LWLock.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct RequestQueue {
    pub slots: [Slot; QUEUE_SLOTS],
    pub next_generation: u64,
    /// Group commits made for requests, and requests they carried (mean group size).
    pub group_commits: u64,
    pub grouped_requests: u64,
}

impl Default for RequestQueue {
    fn default() -> Self {
        RequestQueue {
            slots: [Slot::default(); QUEUE_SLOTS],
            next_generation: 1,
            group_commits: 0,
            grouped_requests: 0,
        }
    }
}

/// A caller's handle on its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub index: usize,
    pub generation: u64,
}

impl RequestQueue {
    pub fn free_slots(&self) -> usize {
        self.slots.iter().filter(|s| s.state == SlotState::Free).count()
    }

    /// Put all `requests` in at once (a batch is all or nothing), or none if there is no room.
    /// `waiter` is the latch the worker sets when it has answered them.
    pub fn enqueue(&mut self, requests: &[Request], waiter: *mut pg_sys::Latch) -> Option<Vec<Ticket>> {
        if self.free_slots() < requests.len() {
            return None;
        }
        let mut tickets = Vec::with_capacity(requests.len());
        // One call's requests form one batch, named after its first generation.
        let batch = self.next_generation;
        let mut free = self.slots.iter_mut().enumerate().filter(|(_, s)| s.state == SlotState::Free);
        for request in requests {
            let (index, slot) = free.next()?;
            let generation = self.next_generation;
            self.next_generation += 1;
            let request = Request { batch, ..*request };
            *slot = Slot { state: SlotState::Pending, generation, request, reply: Reply::default(), waiter };
            tickets.push(Ticket { index, generation });
        }
        Some(tickets)
    }

    fn slot_mut(&mut self, ticket: Ticket) -> Option<&mut Slot> {
        self.slots.get_mut(ticket.index).filter(|s| s.generation == ticket.generation)
    }

    pub fn is_pending(&self, ticket: Ticket) -> bool {
        self.slots
            .get(ticket.index)
            .is_some_and(|s| s.generation == ticket.generation && s.state == SlotState::Pending)
    }

    pub fn is_answered(&self, ticket: Ticket) -> bool {
        self.slots
            .get(ticket.index)
            .is_some_and(|s| s.generation == ticket.generation && s.state == SlotState::Done)
    }

    /// The reply, once the worker answered; frees the slot.
    pub fn take_reply(&mut self, ticket: Ticket) -> Option<Reply> {
        let slot = self.slot_mut(ticket)?;
        if slot.state != SlotState::Done {
            return None;
        }
        slot.state = SlotState::Free;
        Some(slot.reply)
    }

    /// The caller gives up. Returns true if the worker had already taken (or answered) the
    /// request, i.e. its effect may be durable.
    pub fn abandon(&mut self, ticket: Ticket) -> bool {
        let Some(slot) = self.slot_mut(ticket) else { return false };
        match slot.state {
            SlotState::Pending => {
                slot.state = SlotState::Free;
                false
            }
            SlotState::Taken => {
                slot.state = SlotState::Abandoned;
                true
            }
            SlotState::Done => {
                slot.state = SlotState::Free;
                slot.reply.code != ReplyCode::Unknown
            }
            SlotState::Free | SlotState::Abandoned => false,
        }
    }

    /// Worker: take every pending request, in queue (generation) order.
    pub fn take_pending(&mut self) -> Vec<(Ticket, Request)> {
        let mut taken: Vec<(Ticket, Request)> = self
            .slots
            .iter_mut()
            .enumerate()
            .filter(|(_, s)| s.state == SlotState::Pending)
            .map(|(index, s)| {
                s.state = SlotState::Taken;
                (Ticket { index, generation: s.generation }, s.request)
            })
            .collect();
        taken.sort_by_key(|(t, _)| t.generation);
        taken
    }

    /// Worker: answer a request it took; a request whose caller left is freed (a gap).
    /// Returns the latch of the caller to wake.
    pub fn answer(&mut self, ticket: Ticket, reply: Reply) -> Option<*mut pg_sys::Latch> {
        let slot = self.slot_mut(ticket)?;
        match slot.state {
            SlotState::Taken => {
                slot.state = SlotState::Done;
                slot.reply = reply;
                Some(slot.waiter)
            }
            SlotState::Abandoned => {
                slot.state = SlotState::Free;
                None
            }
            _ => None,
        }
    }

    /// Worker start: requests a previous worker took may or may not be committed. Returns
    /// the latches of their callers.
    pub fn fail_taken(&mut self) -> Vec<*mut pg_sys::Latch> {
        let mut waiters = Vec::new();
        for slot in self.slots.iter_mut() {
            match slot.state {
                SlotState::Taken => {
                    slot.state = SlotState::Done;
                    slot.reply = Reply::err(ReplyCode::Unknown);
                    waiters.push(slot.waiter);
                }
                SlotState::Abandoned => slot.state = SlotState::Free,
                _ => {}
            }
        }
        waiters
    }
}

unsafe impl PGRXSharedMemory for RequestQueue {}

pub static QUEUE: PgLwLock<RequestQueue> = unsafe { PgLwLock::new(c"tsoracle_queue") };

/// Most live leases (active or superseded) at once.
pub const MAX_LEASES: usize = 1024;

/// The bounds of the live leases, published by the worker after every change so that any
/// backend can compute the safe frontier without asking it.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct LeaseBounds {
    pub len: usize,
    /// (ts_upper_bound_ms, expires_at_ms)
    pub entries: [(u64, u64); MAX_LEASES],
}

impl Default for LeaseBounds {
    fn default() -> Self {
        LeaseBounds { len: 0, entries: [(0, 0); MAX_LEASES] }
    }
}

impl LeaseBounds {
    /// The lowest bound among leases still live at `now_ms`.
    pub fn lowest_live_bound(&self, now_ms: u64) -> Option<u64> {
        self.entries[..self.len.min(MAX_LEASES)]
            .iter()
            .filter(|&&(_, expires)| now_ms < expires)
            .map(|&(bound, _)| bound)
            .min()
    }
}

unsafe impl PGRXSharedMemory for LeaseBounds {}

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
}

unsafe impl PGRXSharedMemory for Signals {}

impl Signals {
    /// Count `count` timestamps issued by this backend.
    pub fn count_issued(&self, count: u32) {
        let slot = unsafe { (*pg_sys::MyProc).pgprocno }.unsigned_abs() as usize % ISSUED_SLOTS;
        self.issued[slot].fetch_add(u64::from(count), Ordering::Relaxed);
    }

    pub fn timestamps_issued(&self) -> u64 {
        self.issued.iter().map(|c| c.load(Ordering::Relaxed)).sum()
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

    pub fn condvar(&self) -> *mut pg_sys::ConditionVariable {
        self.window_moved.get()
    }

    pub fn broadcast(&self) {
        unsafe { pg_sys::ConditionVariableBroadcast(self.condvar()) };
    }

    pub fn answers_condvar(&self) -> *mut pg_sys::ConditionVariable {
        self.requests_answered.get()
    }

    /// Wake callers waiting for a free queue slot.
    pub fn broadcast_answers(&self) {
        unsafe { pg_sys::ConditionVariableBroadcast(self.answers_condvar()) };
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
    /// Room for `Signals` at its alignment, wherever PostgreSQL places the block.
    const RAW_SIZE: usize = std::mem::size_of::<Signals>() + std::mem::align_of::<Signals>();

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
        unsafe { pg_sys::RequestAddinShmemSpace(Self::RAW_SIZE) };
    }

    unsafe fn on_shmem_startup(&'static self, _value: SignalsInit) {
        unsafe {
            // AddinShmemInitLock is MainLWLockArray[21] (a macro in lwlock.h, so no binding).
            let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
            pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
            let mut found = false;
            let raw = pg_sys::ShmemInitStruct(self.name.as_ptr(), Self::RAW_SIZE, &mut found).cast::<u8>();
            // PostgreSQL only promises MAXALIGN; the cache lines need 64. Every process
            // computes the same aligned address from the same block.
            let ptr = raw.add(raw.align_offset(std::mem::align_of::<Signals>())).cast::<Signals>();
            if !found {
                ptr.write(Signals {
                    window: CacheLine(AtomicWindow::new()),
                    issued: [const { CacheLine(AtomicU64::new(0)) }; ISSUED_SLOTS],
                    first_grant_ms: CacheLine(AtomicU64::new(0)),
                    window_moved: UnsafeCell::new(std::mem::zeroed()),
                    requests_answered: UnsafeCell::new(std::mem::zeroed()),
                    worker_latch: AtomicPtr::new(std::ptr::null_mut()),
                    worker_pid: AtomicI32::new(0),
                    extension_requested: AtomicBool::new(false),
                    seed_requested_ms: AtomicU64::new(0),
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
    pgrx::pg_shmem_init!(QUEUE);
    pgrx::pg_shmem_init!(LEASE_BOUNDS);
    pgrx::pg_shmem_init!(SIGNALS = SignalsInit);
}

/// Shared signals, or `NotPreloaded`.
pub fn signals() -> Result<&'static Signals, crate::error::TsoError> {
    SIGNALS.get().ok_or(crate::error::TsoError::NotPreloaded)
}

/// Set the latches of callers the worker answered (after the queue lock is released).
pub fn wake_waiters(waiters: impl IntoIterator<Item = *mut pg_sys::Latch>) {
    for latch in waiters {
        if !latch.is_null() {
            // SAFETY: a PGPROC latch in shared memory; a caller that has left only sees a
            // spurious wake-up of whatever its backend waits for next.
            unsafe { pg_sys::SetLatch(latch) };
        }
    }
}
