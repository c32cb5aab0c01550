//! Holding the resolved timestamp (docs/resolved.md): before its first grant of a transaction
//! a backend fills its holder slot with a lower bound of what it will get; the slot is
//! cleared once the transaction has ended (the `XACT_EVENT_COMMIT` / `ABORT` callbacks run
//! after the commit is visible), or when the backend exits. `PREPARE TRANSACTION` of a
//! transaction that took values is refused: a prepared transaction outlives its slot.

use crate::pg::error::TsoError;
use crate::shmem::holders::HOLDERS;
use crate::shmem::Signals;
use pgrx::pg_guard;
use pgrx::pg_sys;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use tsoracle_core::resolved;

/// This backend's open transaction holds values (its slot is set).
static HELD: AtomicBool = AtomicBool::new(false);

/// One past the last value this backend was granted from the window (0: none yet): the
/// lower bound it holds before its next grant (`tsoracle_core::resolved::hold_floor`).
static LAST_GRANT_END: AtomicU64 = AtomicU64::new(0);

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
    // A lower bound of the coming grant (`tsoracle_core::resolved::hold_floor`). On a member,
    // the floor of what the oracle will answer (every value fetched after now).
    let floor = if crate::pg::guc::is_member() {
        signals.member_floor.get()
    } else {
        resolved::hold_floor(LAST_GRANT_END.load(Ordering::Relaxed), || signals.window.next_ts())
    };
    // SAFETY: a plain read of this process's pid.
    slot.publish(floor, unsafe { pg_sys::MyProcPid });
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
        slot.raise_to(first);
    }
}

/// After every grant from the window: `count` values from `first` were this backend's.
pub fn granted(first: u64, count: u32) {
    LAST_GRANT_END.store(first + u64::from(count), Ordering::Relaxed);
    if let Some(slot) = HOLDERS.mine() {
        slot.count_issued(count);
    }
}

/// What this backend's open transaction holds, if anything.
pub fn held_by_me() -> Option<u64> {
    HELD.load(Ordering::Relaxed)
        .then(|| HOLDERS.mine().map(|s| s.min_ts()))
        .flatten()
        .filter(|&v| v != 0)
}

fn release() {
    if HELD.swap(false, Ordering::Relaxed) {
        // A member's reservation is the transaction's only (a procedure's next transaction
        // fetches afresh).
        crate::pg::statement::boundary();
        if let Some(slot) = HOLDERS.mine() {
            slot.clear();
        }
    }
}

fn register_callbacks() {
    // A backend is single-threaded: a load and a store, not a read-modify-write.
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    if !REGISTERED.load(Ordering::Relaxed) {
        REGISTERED.store(true, Ordering::Relaxed);
        // SAFETY: registering static functions that take no argument, once per process.
        unsafe {
            pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
            pg_sys::before_shmem_exit(Some(exit_callback), pg_sys::Datum::from(0usize));
        }
    }
}

/// Registered once per process, it runs on every transaction event of this backend from then
/// on, also in transactions that take no value: so it does no more than test a flag unless
/// this transaction holds values. No pgrx guard here: nothing in it can raise an error or
/// panic (atomics on this backend's slot), but the refusal of `PREPARE`, which has its own
/// guard (its error's longjmp passes this frame, which owns nothing to drop).
unsafe extern "C-unwind" fn xact_callback(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::XactEvent::*;
    if !HELD.load(Ordering::Relaxed) {
        return;
    }
    match event {
        // After ProcArrayEndTransaction: the commit is visible to every new snapshot.
        XACT_EVENT_COMMIT
        | XACT_EVENT_ABORT
        | XACT_EVENT_PARALLEL_COMMIT
        | XACT_EVENT_PARALLEL_ABORT
        | XACT_EVENT_PREPARE => release(),
        // SAFETY: a guarded function that raises the refusal as a PostgreSQL error.
        XACT_EVENT_PRE_PREPARE => unsafe { refuse_prepare() },
        _ => {}
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn refuse_prepare() {
    TsoError::PrepareRefused.report()
}

#[pg_guard]
unsafe extern "C-unwind" fn exit_callback(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    release();
}
