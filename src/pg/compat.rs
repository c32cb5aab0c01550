//! What differs between the PostgreSQL majors tsoracle supports (15, 16, 17 and 18), and
//! nothing else: every difference is one function here, chosen by pgrx's `pgNN` feature, so
//! that the rest of the extension is written once for every major.
//!
//! | function           | 15, 16                  | 17                      | 18                         |
//! |--------------------|-------------------------|-------------------------|----------------------------|
//! | `my_proc_number`   | `MyProc->pgprocno`      | `MyProcNumber`          | `MyProcNumber`             |
//! | `set_signal`       | `pqsignal`              | `pqsignal`              | `pqsignal_be` (the macro's target) |
//! | `primary_key_index`| `RelationGetPrimaryKeyIndex(rel)` | same          | `…(rel, deferrable_ok)`    |
//! | `tuple_desc_attr`  | `desc->attrs[i]`        | `desc->attrs[i]`        | `TupleDescAttr(desc, i)`   |
//! | `create_wait_event_set` | `(TopMemoryContext, n)` | `(NULL resource owner, n)` | same as 17 |
//! | `file_new_in_transaction` | `rd_…RelfilenodeSubid` (15); 16: `rd_…RelfilelocatorSubid` | same as 16 | same as 16 |

use pgrx::pg_sys;

/// This backend's PGPROC number: its index in `ProcGlobal->allProcs`, unique among live
/// processes and below `MaxBackends` plus the auxiliary processes.
#[cfg(any(feature = "pg15", feature = "pg16"))]
pub fn my_proc_number() -> i32 {
    // SAFETY: MyProc is set for every backend that can run SQL, before any of our code runs.
    unsafe { (*pg_sys::MyProc).pgprocno }
}

/// This backend's PGPROC number (PostgreSQL 17 replaced `PGPROC.pgprocno` with the global
/// `MyProcNumber`).
#[cfg(any(feature = "pg17", feature = "pg18"))]
pub fn my_proc_number() -> i32 {
    // SAFETY: MyProcNumber is a plain global, set once when the backend gets its PGPROC.
    unsafe { pg_sys::MyProcNumber }
}

/// Install `handler` for `signo` in this process, the way PostgreSQL's own processes do.
///
/// # Safety
/// `handler` must be safe to run as a signal handler of this process.
#[cfg(any(feature = "pg15", feature = "pg16", feature = "pg17"))]
pub unsafe fn set_signal(signo: i32, handler: pg_sys::pqsigfunc) {
    // SAFETY: the caller vouches for the handler; pqsignal only calls sigaction.
    unsafe { pg_sys::pqsignal(signo, handler) };
}

/// Install `handler` for `signo` (in PostgreSQL 18 `pqsignal` is a macro for the backend's
/// `pqsignal_be`).
///
/// # Safety
/// `handler` must be safe to run as a signal handler of this process.
#[cfg(feature = "pg18")]
pub unsafe fn set_signal(signo: i32, handler: pg_sys::pqsigfunc) {
    // SAFETY: the caller vouches for the handler; pqsignal_be only calls sigaction.
    unsafe { pg_sys::pqsignal_be(signo, handler) };
}

/// The OID of `rel`'s primary-key index (`InvalidOid` if none).
///
/// # Safety
/// `rel` must be an open relation, inside a transaction.
#[cfg(any(feature = "pg15", feature = "pg16", feature = "pg17"))]
pub unsafe fn primary_key_index(rel: pg_sys::Relation) -> pg_sys::Oid {
    // SAFETY: the caller vouches for the open relation; a relcache lookup.
    unsafe { pg_sys::RelationGetPrimaryKeyIndex(rel) }
}

/// The OID of `rel`'s primary-key index (PostgreSQL 18 added `deferrable_ok`; ours is
/// never deferrable, so false asks for exactly what 15 to 17 return).
///
/// # Safety
/// `rel` must be an open relation, inside a transaction.
#[cfg(feature = "pg18")]
pub unsafe fn primary_key_index(rel: pg_sys::Relation) -> pg_sys::Oid {
    // SAFETY: the caller vouches for the open relation; a relcache lookup.
    unsafe { pg_sys::RelationGetPrimaryKeyIndex(rel, false) }
}

/// Attribute `i` (0-based) of a tuple descriptor.
///
/// # Safety
/// `desc` must be a valid tuple descriptor with more than `i` attributes.
#[cfg(any(feature = "pg15", feature = "pg16", feature = "pg17"))]
pub unsafe fn tuple_desc_attr(
    desc: pg_sys::TupleDesc,
    i: usize,
) -> *const pg_sys::FormData_pg_attribute {
    // SAFETY: the caller vouches for the descriptor and the index; up to 17 the attributes
    // are the descriptor's trailing array.
    unsafe { (*desc).attrs.as_ptr().add(i) }
}

/// Attribute `i` (0-based) of a tuple descriptor (PostgreSQL 18 put the compact attributes
/// first; `TupleDescAttr` finds the full ones after them).
///
/// # Safety
/// `desc` must be a valid tuple descriptor with more than `i` attributes.
#[cfg(feature = "pg18")]
pub unsafe fn tuple_desc_attr(
    desc: pg_sys::TupleDesc,
    i: usize,
) -> *const pg_sys::FormData_pg_attribute {
    // SAFETY: the caller vouches for the descriptor and the index (which fits in an int).
    unsafe { pg_sys::TupleDescAttr(desc, i as std::ffi::c_int) }
}

/// A new wait event set for `nevents` events, for the process's life (until
/// `FreeWaitEventSet`): allocated in `TopMemoryContext`.
///
/// # Safety
/// Called in a process with a `TopMemoryContext` (any backend or worker); the caller frees
/// the set with `FreeWaitEventSet`.
#[cfg(any(feature = "pg15", feature = "pg16"))]
pub unsafe fn create_wait_event_set(nevents: i32) -> *mut pg_sys::WaitEventSet {
    // SAFETY: TopMemoryContext lives as long as the process; the caller frees the set.
    unsafe { pg_sys::CreateWaitEventSet(pg_sys::TopMemoryContext, nevents) }
}

/// A new wait event set for `nevents` events (PostgreSQL 17 ties a set to a resource owner
/// instead of a memory context; with none, it lives until `FreeWaitEventSet`).
///
/// # Safety
/// As for 15 and 16: the caller frees the set with `FreeWaitEventSet`.
#[cfg(any(feature = "pg17", feature = "pg18"))]
pub unsafe fn create_wait_event_set(nevents: i32) -> *mut pg_sys::WaitEventSet {
    // SAFETY: no resource owner: allocated in TopMemoryContext, freed by the caller.
    unsafe { pg_sys::CreateWaitEventSet(std::ptr::null_mut(), nevents) }
}

/// Whether the open transaction (or one of its subtransactions) created `rel` or gave it a
/// new file (`CLUSTER`, `VACUUM FULL`, `TRUNCATE`, `ALTER TABLE … SET TABLESPACE`, a rewriting
/// `ALTER TABLE`): an abort of that (sub)transaction throws the file away, and with it
/// anything written into it in place.
///
/// # Safety
/// `rel` must be a valid relcache entry.
#[cfg(feature = "pg15")]
pub unsafe fn file_new_in_transaction(rel: pg_sys::Relation) -> bool {
    // SAFETY: the caller vouches for the relcache entry.
    let r = unsafe { &*rel };
    [r.rd_createSubid, r.rd_newRelfilenodeSubid, r.rd_firstRelfilenodeSubid]
        .into_iter()
        .any(|subid| subid != 0) // InvalidSubTransactionId
}

/// Whether the open transaction created `rel` or gave it a new file (16 renamed relfilenode
/// to relfilelocator).
///
/// # Safety
/// `rel` must be a valid relcache entry.
#[cfg(any(feature = "pg16", feature = "pg17", feature = "pg18"))]
pub unsafe fn file_new_in_transaction(rel: pg_sys::Relation) -> bool {
    // SAFETY: the caller vouches for the relcache entry.
    let r = unsafe { &*rel };
    [r.rd_createSubid, r.rd_newRelfilelocatorSubid, r.rd_firstRelfilelocatorSubid]
        .into_iter()
        .any(|subid| subid != 0) // InvalidSubTransactionId
}
