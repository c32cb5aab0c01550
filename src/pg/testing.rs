//! Helpers for the `#[pg_test]`s.

use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// Run `f`, which must raise an error, and return its SQLSTATE.
pub fn sqlstate_of<R>(f: impl FnOnce() -> R + std::panic::UnwindSafe) -> PgSqlErrorCode {
    PgTryBuilder::new(|| {
        f();
        None
    })
    .catch_others(|e| match e {
        CaughtError::ErrorReport(r) | CaughtError::PostgresError(r) => Some(r.sql_error_code()),
        CaughtError::RustPanic { ereport, .. } => {
            panic!("a Rust panic, not an error: {}", ereport.message())
        }
    })
    .execute()
    .expect("the call succeeded but an error was expected")
}

/// Whether `role` may execute function `f` (a `regprocedure` text such as `tso_seq(text, integer)`).
pub fn can_execute(role: &str, f: &str) -> bool {
    Spi::get_one::<bool>(&format!("SELECT has_function_privilege('{role}', '{f}', 'EXECUTE')"))
        .expect("has_function_privilege")
        .expect("a boolean")
}
