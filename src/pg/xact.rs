//! Transactions that end in a value, never in a jump: the worker runs everything it does in
//! one of these, so that an error (a lock it waited for too long, a table a DBA dropped, a
//! bug) aborts that transaction only, and the worker goes on serving what does not depend on
//! it. PostgreSQL's own pattern (PL/pgSQL's exception blocks, `PG_TRY` around an internal
//! subtransaction), through pgrx's `PgTryBuilder`.

use pgrx::pg_sys;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::{PgSqlErrorCode, PgTryBuilder};
use std::panic::AssertUnwindSafe;

/// An error caught in a transaction or subtransaction that was then rolled back.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct Caught {
    pub sqlstate: PgSqlErrorCode,
    pub message: String,
}

impl Caught {
    fn from_caught(e: CaughtError) -> Caught {
        match e {
            CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) => {
                Caught { sqlstate: r.sql_error_code(), message: r.message().to_string() }
            }
            CaughtError::RustPanic { ereport, .. } => Caught {
                sqlstate: ereport.sql_error_code(),
                message: ereport.message().to_string(),
            },
        }
    }

    /// A lock the statement could not get within `lock_timeout` (or `NOWAIT`).
    pub fn is_lock_not_available(&self) -> bool {
        self.sqlstate == PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE
    }
}

/// Run `f` in a top-level transaction of its own and commit; on any error (in `f` or at
/// commit) abort it and return the error. Call it only outside a transaction.
pub fn transaction<T>(f: impl FnOnce() -> T) -> Result<T, Caught> {
    // SAFETY: outside a transaction (the caller's contract), starting one and its snapshot as
    // BackgroundWorker::transaction does (SPI needs an active snapshot); the matching commit
    // or abort (which pops the snapshot too) follows below on every path.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    // What f captures is left as the error found it, as for any PostgreSQL error: the caller
    // gets the error and must not trust half-done work (hence AssertUnwindSafe).
    let f = AssertUnwindSafe(f);
    PgTryBuilder::new(AssertUnwindSafe(move || {
        let value = f();
        // SAFETY: pops the snapshot pushed above and commits the transaction started there; an
        // error in either is caught below.
        unsafe {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        }
        Ok(value)
    }))
    .catch_others(|e| {
        // SAFETY: aborts whatever state the error left the transaction in, as PostgreSQL's
        // own error recovery does (PostgresMain), so that the next transaction starts clean.
        unsafe { pg_sys::AbortCurrentTransaction() };
        Err(Caught::from_caught(e))
    })
    .execute()
}

/// [`transaction`] of SQL work that may itself fail (an SPI error): either failure as the one
/// message of `what` went wrong, `"{what}: {error}"`.
pub fn sql_transaction<T>(
    what: &str,
    f: impl FnOnce() -> Result<T, pgrx::spi::Error>,
) -> Result<T, String> {
    match transaction(f) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

/// Run `f` in a subtransaction of the current transaction; on an error roll back what it did
/// (its writes, its locks) and return the error, leaving the transaction usable.
pub fn subtransaction<T>(f: impl FnOnce() -> T) -> Result<T, Caught> {
    // SAFETY: plain reads of this process's globals, restored below as PL/pgSQL does around
    // its internal subtransactions (BeginInternalSubTransaction switches both).
    let (context, owner) = unsafe { (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner) };
    // SAFETY: inside a transaction (the caller's contract); released or rolled back below.
    unsafe {
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(context);
    }
    let f = AssertUnwindSafe(f);
    PgTryBuilder::new(AssertUnwindSafe(move || {
        let value = f();
        // SAFETY: the subtransaction begun above is the current one (f leaves it so: every
        // SPI connection it opened is closed when its scope ends).
        unsafe {
            pg_sys::ReleaseCurrentSubTransaction();
            pg_sys::MemoryContextSwitchTo(context);
            pg_sys::CurrentResourceOwner = owner;
        }
        Ok(value)
    }))
    .catch_others(|e| {
        // SAFETY: rolls back the subtransaction begun above (and anything an unwinding SPI
        // scope left), then restores the caller's memory context and resource owner.
        unsafe {
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
            pg_sys::MemoryContextSwitchTo(context);
            pg_sys::CurrentResourceOwner = owner;
        }
        Err(Caught::from_caught(e))
    })
    .execute()
}
