//! PostgreSQL glue, the bottom layer: what every other layer may use, and what uses nothing
//! of theirs.
//!
//! It owns the settings (`guc`, statics private behind accessors), the two clocks (`clock`,
//! with the tests' clock offset in a shared-memory block of its own), what differs between
//! PostgreSQL 15 and 18 (`compat`), the errors raised to SQL with their SQLSTATE and HINT
//! (`error`), standby and synchronous-replication helpers (`replica`), catalog lookups of the
//! extension's own objects (`catalog`), a client connection to another server (`libpq`, for
//! a member and its oracle) and a wait on the latch and its socket kept between waits
//! (`wait_set`), and the `#[pg_test]` helpers (`testing`).
//!
//! May use: pgrx, `tsoracle-core`, the standard library. Nothing in `sql`, `caller`,
//! `shmem` or `worker`.

pub mod catalog;
pub mod clock;
pub mod compat;
pub mod error;
pub mod guc;
pub mod inplace;
pub mod installed;
pub mod libpq;
pub mod locks;
pub mod replica;
pub mod statement;
pub mod wait_set;
pub mod xact;

#[cfg(any(test, feature = "pg_test"))]
pub mod testing;

use std::sync::atomic::{AtomicBool, Ordering};

/// The extension version (SQL objects) this library serves; the worker waits (57P03,
/// `outdated_schema`) while the extension in `tsoracle.database` is at another one.
pub const EXTENSION_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Set in the worker's process as it starts: its own writes of the durable tables are not
/// restores, and it is the one process that writes them.
static IN_WORKER: AtomicBool = AtomicBool::new(false);

/// Called once by the worker, before it connects to its database.
pub fn mark_worker_process() {
    IN_WORKER.store(true, Ordering::Relaxed);
}

/// Whether this process is the tsoracle worker.
pub fn is_worker_process() -> bool {
    IN_WORKER.load(Ordering::Relaxed)
}

/// This server's system identifier (`pg_control_system()`), by which a member and its
/// oracle tell each other apart.
pub fn system_identifier() -> u64 {
    // SAFETY: a read of the control file's copy in shared memory, valid in any backend.
    unsafe { pgrx::pg_sys::GetSystemIdentifier() }
}
