//! Where one statement ends and the next begins, in this backend: a number that changes at
//! every boundary. A member's reservations (docs/fleet.md, "One statement, few round
//! trips") belong to the statement that fetched them.
//!
//! The number changes when the executor starts a query (`ExecutorStart_hook`: every
//! plannable statement, a nested one too), when a utility statement runs
//! (`ProcessUtility_hook`: `COPY`, `CALL`, `DO`, `FETCH`, `COMMIT`, …), when a transaction
//! ends ([`boundary`], from the transaction callback) and when `statement_timestamp()` moves:
//! so two statements of one query string, or two transactions of one procedure, never share
//! a number. A boundary too many only costs a round trip; one too few could hand a later
//! statement a value below one a finished statement returned, so the hooks are installed
//! before the first number is read. They are installed in a backend only when it first asks
//! ([`current`]): backends that never take a member's reservation run PostgreSQL's executor
//! untouched. A library loaded later in the backend that replaces a hook without calling ours
//! would leave only `statement_timestamp()`, which separates the client's messages but not
//! the statements of one query string.

use pgrx::pg_sys;
use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

/// This backend's statement number (process-local: each backend has its own copy).
static STATEMENT: AtomicU64 = AtomicU64::new(0);
static HOOKED: AtomicBool = AtomicBool::new(false);
static mut PREV_EXECUTOR_START: pg_sys::ExecutorStart_hook_type = None;
static mut PREV_PROCESS_UTILITY: pg_sys::ProcessUtility_hook_type = None;

/// The start of the statement last seen by [`current`] (`statement_timestamp()`).
static STARTED: AtomicI64 = AtomicI64::new(i64::MIN);

/// The number of the statement running now; installs the hooks on first use. A new
/// `statement_timestamp()` (each message from the client sets it) is a boundary too, should
/// a hook installed after ours not call it.
pub fn current() -> u64 {
    // SAFETY: reads a timestamp the backend keeps in a process-local variable.
    let started = unsafe { pg_sys::GetCurrentStatementStartTimestamp() };
    if STARTED.swap(started, Ordering::Relaxed) != started {
        boundary();
    }
    if !HOOKED.swap(true, Ordering::Relaxed) {
        // SAFETY: a backend is single-threaded and this runs once per process; the previous
        // hooks are kept and called by ours, so whatever was installed before still runs.
        unsafe {
            PREV_EXECUTOR_START = pg_sys::ExecutorStart_hook;
            pg_sys::ExecutorStart_hook = Some(executor_start);
            PREV_PROCESS_UTILITY = pg_sys::ProcessUtility_hook;
            pg_sys::ProcessUtility_hook = Some(process_utility);
        }
        boundary();
    }
    STATEMENT.load(Ordering::Relaxed)
}

/// Whether a portal runs: a statement of a client, or a statement's own queries. Code that
/// runs outside one — deferred triggers and other work at commit, after the last statement
/// returned its result; a background worker — takes no reservation.
pub fn in_a_portal() -> bool {
    // SAFETY: a plain read of a backend global (NULL between statements).
    unsafe { !pg_sys::ActivePortal.is_null() }
}

/// A statement (or a transaction) ends or begins: what was reserved is no one's any more.
pub fn boundary() {
    STATEMENT.fetch_add(1, Ordering::Relaxed);
}

unsafe extern "C-unwind" {
    // The raw symbols, not pgrx's guarded wrappers: an error they raise passes through the
    // hooks to PostgreSQL untouched (a guard would raise it again with fewer fields: no
    // CONTEXT, no constraint or table name).
    #[link_name = "standard_ExecutorStart"]
    fn raw_standard_executor_start(query_desc: *mut pg_sys::QueryDesc, eflags: c_int);
    #[link_name = "standard_ProcessUtility"]
    #[allow(clippy::too_many_arguments)]
    fn raw_standard_process_utility(
        pstmt: *mut pg_sys::PlannedStmt,
        query_string: *const c_char,
        read_only_tree: bool,
        context: pg_sys::ProcessUtilityContext::Type,
        params: pg_sys::ParamListInfo,
        query_env: *mut pg_sys::QueryEnvironment,
        dest: *mut pg_sys::DestReceiver,
        qc: *mut pg_sys::QueryCompletion,
    );
}

/// No pgrx guard: the frame owns nothing to drop, so an error's longjmp may pass it (as for
/// the transaction callback in `caller::holding`), and nothing in it can panic.
unsafe extern "C-unwind" fn executor_start(query_desc: *mut pg_sys::QueryDesc, eflags: c_int) {
    boundary();
    // SAFETY: the hook chain's contract: the arguments PostgreSQL passed, to the previous
    // hook or the standard function.
    unsafe {
        match PREV_EXECUTOR_START {
            Some(prev) => prev(query_desc, eflags),
            None => raw_standard_executor_start(query_desc, eflags),
        }
    }
}

/// As [`executor_start`].
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn process_utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    boundary();
    // SAFETY: as in `executor_start`.
    unsafe {
        next_process_utility(
            PREV_PROCESS_UTILITY,
            pstmt,
            query_string,
            read_only_tree,
            context,
            params,
            query_env,
            dest,
            qc,
        )
    }
}

/// Run the rest of the `ProcessUtility_hook` chain: `previous`, the hook installed before the
/// caller's, or the standard function (the raw symbol, so an error passes through whole).
///
/// # Safety
/// The arguments are those PostgreSQL passed to the calling hook.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn next_process_utility(
    previous: pg_sys::ProcessUtility_hook_type,
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    // SAFETY: the caller's contract.
    unsafe {
        match previous {
            Some(previous) => {
                previous(pstmt, query_string, read_only_tree, context, params, query_env, dest, qc)
            }
            None => raw_standard_process_utility(
                pstmt,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
        }
    }
}
