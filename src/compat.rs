//! What differs between the PostgreSQL majors tsoracle supports (15, 16, 17 and 18), and
//! nothing else: every difference is one function here, chosen by pgrx's `pgNN` feature, so
//! that the rest of the extension is written once for every major.
//!
//! | function           | 15, 16                  | 17                      | 18                         |
//! |--------------------|-------------------------|-------------------------|----------------------------|
//! | `my_proc_number`   | `MyProc->pgprocno`      | `MyProcNumber`          | `MyProcNumber`             |
//! | `set_signal`       | `pqsignal`              | `pqsignal`              | `pqsignal_be` (the macro's target) |

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
