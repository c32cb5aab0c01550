//! The resolved timestamp `R` (docs/resolved.md): every timestamp at or below it was issued
//! to a transaction that has ended — aborted, or committed and visible to every snapshot taken
//! after `R` was read — and no timestamp at or below it will be issued again. A consumer that
//! reads `R`, then (in a later statement) the rows with `ts <= R`, misses nothing.
//!
//! The bookkeeping (`tsoracle_core::resolved` explains why it is enough): one slot per backend
//! in shared memory ([`HOLDERS`]) holds the lowest value its open top-level transaction may
//! have taken. A backend fills it before its first grant of a transaction ([`hold`]) and
//! clears it when the transaction has ended (the `XACT_EVENT_COMMIT` / `ABORT` callbacks run
//! after the commit is visible), or when it exits. `PREPARE TRANSACTION` of a transaction that
//! took values is refused: a prepared transaction outlives its backend's slot.
//!
//! On a hot standby `R` is what the primary's worker last published in `tsoracle.resolved`
//! (every `tsoracle.resolved_interval_ms` while it advances) as far as this standby has
//! replayed it; the same transaction emits it to logical decoding as a transactional message
//! with prefix `tsoracle.resolved`.

use crate::clock;
use crate::error::{OrReport, TsoError};
use crate::oracle;
use crate::shmem::{self, CacheLine, Signals, LEASE_BOUNDS, ORACLE};
use pgrx::pg_guard;
use pgrx::prelude::*;
use pgrx::shmem::{PGRXSharedMemory, PgSharedMemoryInitialization};
use std::cell::UnsafeCell;
use std::ffi::CStr;
use std::sync::atomic::{fence, AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::time::Instant;
use tsoracle_core::timestamp;

/// One backend's holding.
#[derive(Debug, Default)]
#[repr(C)]
pub struct HolderSlot {
    /// The lowest value the backend's open transaction may have taken; 0 = none.
    min_ts: AtomicU64,
    pid: AtomicI32,
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

    fn slots(&self) -> &[CacheLine<HolderSlot>] {
        // SAFETY: see `unsafe impl Sync`: written only during shmem startup.
        match unsafe { *self.block.get() } {
            // SAFETY: `len` slots initialised in shared memory, alive as long as the process.
            Some((ptr, len)) => unsafe { std::slice::from_raw_parts(ptr, len) },
            None => &[],
        }
    }

    fn mine(&self) -> Option<&HolderSlot> {
        let index = usize::try_from(crate::compat::my_proc_number()).ok()?;
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

/// This backend's open transaction holds values (its slot is set).
static HELD: AtomicBool = AtomicBool::new(false);

/// Before a grant: make sure this backend's slot holds a lower bound of what the grant will
/// return. True when this call published it (the caller then [`raise`]s it to the value). A
/// backend without a slot gets nothing: the resolved timestamp could not account for it.
pub fn hold(signals: &Signals) -> Result<bool, TsoError> {
    if HELD.load(Ordering::Relaxed) {
        return Ok(false);
    }
    let Some(slot) = HOLDERS.mine() else {
        return Err(TsoError::Internal(
            "this backend has no slot for the resolved timestamp".into(),
        ));
    };
    register_callbacks();
    // The window's next only grows, and every grant is at or above it: a lower bound.
    slot.min_ts.store(signals.window.next_ts().max(1), Ordering::Relaxed);
    // SAFETY: a plain read of this process's pid.
    slot.pid.store(unsafe { pg_sys::MyProcPid }, Ordering::Relaxed);
    // The slot is visible to any reader whose fence comes after this one; a reader whose
    // fence came first read a window `next` at or below what this grant will get.
    fence(Ordering::SeqCst);
    HELD.store(true, Ordering::Relaxed);
    Ok(true)
}

/// After the first grant of a transaction: the slot holds the value itself (still at or below
/// everything the transaction takes).
pub fn raise(first: u64) {
    if let Some(slot) = HOLDERS.mine() {
        slot.min_ts.store(first.max(1), Ordering::Release);
    }
}

/// What this backend's open transaction holds, if anything.
fn held_by_me() -> Option<u64> {
    HELD.load(Ordering::Relaxed)
        .then(|| HOLDERS.mine().map(|s| s.min_ts.load(Ordering::Relaxed)))
        .flatten()
        .filter(|&v| v != 0)
}

fn release() {
    if HELD.swap(false, Ordering::Relaxed) {
        if let Some(slot) = HOLDERS.mine() {
            slot.min_ts.store(0, Ordering::Release);
        }
    }
}

fn register_callbacks() {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    if !REGISTERED.swap(true, Ordering::Relaxed) {
        // SAFETY: registering static functions that take no argument, once per process.
        unsafe {
            pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
            pg_sys::before_shmem_exit(Some(exit_callback), pg_sys::Datum::from(0usize));
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::XactEvent::*;
    match event {
        // After ProcArrayEndTransaction: the commit is visible to every new snapshot.
        XACT_EVENT_COMMIT
        | XACT_EVENT_ABORT
        | XACT_EVENT_PARALLEL_COMMIT
        | XACT_EVENT_PARALLEL_ABORT
        | XACT_EVENT_PREPARE => release(),
        XACT_EVENT_PRE_PREPARE if HELD.load(Ordering::Relaxed) => TsoError::PrepareRefused.report(),
        _ => {}
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn exit_callback(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    release();
}

/// `R` on a primary: from the window's next, the slots and the live leases, never below an
/// `R` computed before (in this server's life; after a restart or a promotion the fence
/// starts above every value issued before, so `R` goes on above those too).
pub fn primary_resolved(signals: &Signals) -> Result<u64, TsoError> {
    let next = signals.window.next_ts();
    if next == 0 {
        // Nothing opened since this server (re)started: the fence has not run yet.
        return Err(oracle::not_serving(signals, ORACLE.share().phase));
    }
    fence(Ordering::SeqCst);
    let held = HOLDERS.slots().iter().map(|s| s.min_ts.load(Ordering::Relaxed));
    let lease_from = LEASE_BOUNDS.share().earliest_live_from(clock::sample());
    let r = tsoracle_core::resolved::resolved(next, held, lease_from);
    Ok(signals.raise_resolved(r))
}

/// `R` on a hot standby: what the primary published, as far as this standby has replayed it,
/// in `tsoracle.database` (the database whose table the worker writes).
fn standby_resolved() -> Result<u64, TsoError> {
    let database = crate::guc::database();
    // SAFETY: MyDatabaseId is set for every backend that runs SQL; the name is a syscache
    // lookup (NULL if the database is gone), copied at once.
    let here = unsafe {
        let name = pg_sys::get_database_name(pg_sys::MyDatabaseId);
        (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned())
    };
    if here.as_deref() != Some(database.as_str()) {
        return Err(TsoError::NotServing(format!(
            "on a standby the resolved timestamp is read from table tsoracle.resolved in database \"{database}\" (tsoracle.database); connect there"
        )));
    }
    let found = Spi::connect(|client| {
        let present = client
            .select("SELECT pg_catalog.to_regclass('tsoracle.resolved') IS NOT NULL", None, &[])?
            .first()
            .get_one::<bool>()?;
        if present != Some(true) {
            return Ok(None);
        }
        client
            .select("SELECT ts FROM tsoracle.resolved WHERE id", None, &[])?
            .first()
            .get_one::<i64>()
    })
    .map_err(|e| TsoError::Internal(format!("could not read tsoracle.resolved: {e}")))?;
    match found {
        Some(r) if r > 0 => Ok(r as u64),
        Some(_) => Err(TsoError::NotServing(
            "this standby has not replayed a resolved timestamp from the primary yet".into(),
        )),
        None => Err(TsoError::NotServing(format!(
            "database \"{database}\" (tsoracle.database) has no table tsoracle.resolved on this standby: the extension is not at version 0.3.0 there yet"
        ))),
    }
}

/// `R` here: on a primary from shared memory, on a standby from the replayed table.
pub fn current() -> Result<u64, TsoError> {
    let signals = shmem::signals()?;
    // SAFETY: RecoveryInProgress may be called by any backend at any time.
    if unsafe { pg_sys::RecoveryInProgress() } {
        standby_resolved()
    } else {
        primary_resolved(signals)
    }
}

/// The resolved timestamp: every timestamp at or below it was issued to a transaction that has
/// ended, and none at or below it will be issued again. Read it in a statement of its own,
/// then the rows with `ts <= R` in a later one.
#[pg_extern(volatile, parallel_unsafe)]
fn tso_resolved() -> i64 {
    current().map(timestamp::to_sql).or_report()
}

/// Wait until the resolved timestamp reaches `ts`, at most `timeout_ms`; returns it (below
/// `ts` only when the timeout passed). Cancellable.
#[pg_extern(volatile, parallel_unsafe)]
fn tso_wait_resolved(ts: i64, timeout_ms: i32) -> i64 {
    wait(ts, timeout_ms).map(timestamp::to_sql).or_report()
}

fn wait(ts: i64, timeout_ms: i32) -> Result<u64, TsoError> {
    let target = timestamp::from_sql(ts).map_err(|_| {
        TsoError::InvalidArgument(format!("{ts} is not a tsoracle timestamp (it is negative)"))
    })?;
    let timeout = u64::try_from(timeout_ms).map_err(|_| {
        TsoError::InvalidArgument(format!("timeout_ms must not be negative, got {timeout_ms}"))
    })?;
    if let Some(mine) = held_by_me().filter(|&mine| mine <= target) {
        return Err(TsoError::WaitOnItself(mine));
    }
    let started = Instant::now();
    loop {
        let r = current()?;
        if r >= target || started.elapsed().as_millis() as u64 >= timeout {
            return Ok(r);
        }
        let left = timeout.saturating_sub(started.elapsed().as_millis() as u64).clamp(1, 5);
        // SAFETY: waiting on this backend's own latch; with WL_EXIT_ON_PM_DEATH the process
        // exits if the postmaster dies.
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                left as std::ffi::c_long,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
        pg_sys::check_for_interrupts!();
    }
}

/// One row about the resolved timestamp: `R`, how far it lags the last issued value, what
/// was last published to standbys, and the oldest holder (the transaction holding `R` back).
// pgrx derives the result columns from the signature: the TableIterator type is spelled inline.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
fn tso_resolved_status() -> TableIterator<
    'static,
    (
        name!(resolved, Option<i64>),
        name!(lag_ms, Option<i64>),
        name!(holders, i32),
        name!(oldest_holder_pid, Option<i32>),
        name!(oldest_holder_ts, Option<i64>),
        name!(oldest_holder_since, Option<TimestampWithTimeZone>),
        name!(published, Option<i64>),
        name!(published_at_ms, Option<i64>),
    ),
> {
    let signals = shmem::signals().or_report();
    // SAFETY: as in `current`.
    let standby = unsafe { pg_sys::RecoveryInProgress() };
    let r = current().ok();
    let last = signals.window.last_issued();
    let lag = match (r, last) {
        (Some(r), Some(last)) if !standby => {
            Some(timestamp::physical_ms(last).saturating_sub(timestamp::physical_ms(r)) as i64)
        }
        _ => None,
    };
    let mut holders = 0;
    let mut oldest: Option<(u64, i32)> = None;
    for slot in HOLDERS.slots() {
        let v = slot.min_ts.load(Ordering::Acquire);
        if v == 0 {
            continue;
        }
        holders += 1;
        if oldest.is_none_or(|(o, ..)| v < o) {
            oldest = Some((v, slot.pid.load(Ordering::Relaxed)));
        }
    }
    // When it took it: the millisecond of its value (derived, so no clock read per transaction).
    let since = oldest.map(|(v, _)| timestamp::physical_ms(v)).and_then(|ms| {
        TimestampWithTimeZone::try_from((ms as i64) * 1000 - 946_684_800_000_000).ok()
    });
    let (published, published_at) = signals.published_resolved();
    TableIterator::once((
        r.map(timestamp::to_sql),
        lag,
        holders,
        oldest.map(|(_, pid)| pid),
        oldest.map(|(v, _)| timestamp::to_sql(v)),
        since,
        (published > 0).then(|| timestamp::to_sql(published)),
        (published_at > 0).then_some(published_at as i64),
    ))
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::*;
    use crate::testing::sqlstate_of;
    use pgrx::PgSqlErrorCode::*;

    fn next() -> i64 {
        Spi::get_one::<i64>("SELECT tso_next()").unwrap().unwrap()
    }

    /// The test runs in one transaction, which holds what it takes: R stays below it.
    #[pg_test]
    fn r_stays_below_what_this_transaction_holds() {
        let mine = next();
        let later = next();
        let r = tso_resolved();
        assert!(r < mine, "R {r} passed {mine}, held by this open transaction");
        assert!(tso_resolved() >= r, "R never goes down");
        assert!(later > mine);
        let (holders, pid, oldest) = Spi::get_three::<i32, i32, i64>(
            "SELECT holders, oldest_holder_pid, oldest_holder_ts FROM tso_resolved_status()",
        )
        .unwrap();
        assert!(holders.unwrap() >= 1);
        // SAFETY: a plain read of this process's pid.
        let me = unsafe { pg_sys::MyProcPid };
        let oldest = oldest.unwrap();
        assert!(oldest <= mine, "the oldest holder's value {oldest} is at or below {mine}");
        if oldest == mine || pid == Some(me) {
            assert_eq!(pid, Some(me));
        }
    }

    #[pg_test]
    fn waiting_on_itself_and_bad_arguments_are_refused() {
        let mine = next();
        assert_eq!(
            sqlstate_of(move || tso_wait_resolved(mine, 100)),
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
        );
        assert_eq!(sqlstate_of(|| tso_wait_resolved(-1, 0)), ERRCODE_INVALID_PARAMETER_VALUE);
        assert_eq!(sqlstate_of(|| tso_wait_resolved(0, -1)), ERRCODE_INVALID_PARAMETER_VALUE);
        // Below what this transaction holds: R is already there.
        assert!(tso_wait_resolved(0, 0) >= 0);
    }

    #[pg_test(error = "only the tsoracle worker writes table tsoracle.resolved")]
    fn only_the_worker_writes_the_published_r() {
        Spi::run("UPDATE tsoracle.resolved SET ts = 9223372036854775807").unwrap();
    }
}
