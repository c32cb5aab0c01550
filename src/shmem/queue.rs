//! The request queue between SQL callers and the worker: one entry per backend, under one
//! LWLock (docs/queue.md; `tsoracle_core::queue` is its state machine), and the requests and
//! replies it carries.

use crate::pg::error::TsoError;
use pgrx::pg_sys;
use pgrx::shmem::{PGRXSharedMemory, PgSharedMemoryInitialization};
use std::cell::UnsafeCell;
use std::ffi::CStr;
use tsoracle_core::queue::{self, Entry, EntryState, Queue, QueueHeader, Ticket};

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
    /// On a member: `count` consecutive timestamps from the oracle (`tso_next()` and kin).
    Next,
    /// On a member: the oracle's safe frontier.
    SafeFrontier,
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
    /// Another transaction holds the key, the lease or the table locked; `value` names it
    /// (`pg::locks::Blocker::encode`).
    Busy,
    /// The worker's transaction failed and was rolled back (the server log says why).
    Failed,
    /// On a member: the oracle answered with an error, kept in `shmem::member::MEMBER` under
    /// the call's generation (`Reply::epoch`).
    Remote,
    /// On a member: the request was sent to the oracle and its answer lost (the connection
    /// broke): it may or may not have been carried out there.
    Lost,
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
    /// A lease grant or renewal asked through the functions of 0.1.0 to 0.3.0, which do not
    /// return the lowest stamp: its holder stamps from the server's clock at the grant, as
    /// those versions documented.
    pub legacy: bool,
}

impl Request {
    /// `batch` is assigned when the worker takes the call, `role` when it is queued.
    pub fn new(kind: RequestKind, name: &str, count: u64) -> Self {
        let mut buf = [0u8; NAME_BYTES];
        let len = name.len().min(NAME_BYTES);
        buf[..len].copy_from_slice(&name.as_bytes()[..len]);
        Request {
            kind,
            batch: 0,
            role: 0,
            name_len: len as u8,
            name: buf,
            count,
            arg: 0,
            legacy: false,
        }
    }

    pub fn legacy(self) -> Self {
        Request { legacy: true, ..self }
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
    /// Leases: the bound, expiry and epoch granted, and the lowest stamp.
    pub bound_ms: i64,
    pub expires_at_ms: i64,
    pub epoch: i64,
    pub from_ms: i64,
    /// `Busy`: the table is locked (rather than the key's or the lease's row).
    pub table_locked: bool,
    /// A block: the key's incarnation (`tsoracle.seq.made`).
    pub made: i64,
}

impl Reply {
    pub fn ok(value: i64) -> Self {
        Reply { code: ReplyCode::Ok, value, ..Reply::default() }
    }

    pub fn err(code: ReplyCode) -> Self {
        Reply { code, ..Reply::default() }
    }

    /// `Busy`: another transaction (`blocker`) holds the row the request needs locked.
    pub fn busy(blocker: crate::pg::locks::Blocker) -> Self {
        Reply { value: blocker.encode(), ..Reply::err(ReplyCode::Busy) }
    }

    /// `Busy`: `blocker` holds (or waits for) a lock on the whole table.
    pub fn table_busy(blocker: crate::pg::locks::Blocker) -> Self {
        Reply { table_locked: true, ..Reply::busy(blocker) }
    }
}

pub type EntryBody = queue::EntryBody<Request, Reply>;

/// Where the request queue lives: a header and one entry per backend (`MaxBackends`
/// entries, indexed by PGPROC number; their states in one array, their calls in another),
/// sized when the server starts, under one LWLock.
struct QueueBlock {
    header: *mut QueueHeader,
    entries: *mut Entry,
    bodies: *mut EntryBody,
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
            + std::mem::align_of::<EntryBody>()
            + len * std::mem::size_of::<EntryBody>()
    }

    fn block(&self) -> Option<&QueueBlock> {
        // SAFETY: see `unsafe impl Sync`: written only during shmem startup.
        unsafe { (*self.block.get()).as_ref() }
    }

    fn lock(&self, exclusive: bool) -> Result<QueueGuard<'_>, TsoError> {
        let block = self.block().ok_or(TsoError::NotPreloaded)?;
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
    pub fn exclusive(&self) -> Result<QueueGuard<'_>, TsoError> {
        self.lock(true)
    }

    /// The queue under its LWLock in shared mode: reads only.
    pub fn share(&self) -> Result<QueueGuard<'_>, TsoError> {
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
                std::slice::from_raw_parts_mut(self.block.bodies, self.block.len),
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
        // least the size requested above; the entries, then their bodies, are placed at their
        // alignment inside it.
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
            let after = entries.add(len).cast::<u8>();
            let bodies = after
                .add(after.align_offset(std::mem::align_of::<EntryBody>()))
                .cast::<EntryBody>();
            if !found {
                header.write(QueueHeader::new());
                for i in 0..len {
                    entries.add(i).write(Entry::default());
                    bodies.add(i).write(EntryBody::default());
                }
            }
            let lock = &raw mut (*pg_sys::GetNamedLWLockTranche(self.name.as_ptr())).lock;
            *self.block.get() = Some(QueueBlock { header, entries, bodies, len, lock });
            pg_sys::LWLockRelease(init_lock);
        }
    }
}

pub static QUEUE: SharedQueue = SharedQueue::new(c"tsoracle_queue");

/// This backend's entry in the request queue: its PGPROC number.
pub fn my_queue_index() -> usize {
    usize::try_from(crate::pg::compat::my_proc_number()).unwrap_or(usize::MAX)
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
