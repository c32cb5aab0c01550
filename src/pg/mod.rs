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

/// Whether this server started from a clean shutdown, as its control file said when the
/// library was preloaded (in the postmaster, before its startup process ran): read once by
/// [`note_start`], inherited by every process the postmaster starts.
static CLEAN_START: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Read, in the postmaster while it preloads the library, whether the cluster was shut down
/// cleanly (`global/pg_control`, in the data directory, the postmaster's working directory).
/// Anything unreadable counts as not clean: a member then proves less, never more
/// (docs/fleet-resolved.md, "One run at a time").
pub fn note_start() {
    let offset = std::mem::offset_of!(pgrx::pg_sys::ControlFileData, state);
    let clean = match std::fs::read("global/pg_control") {
        Ok(bytes) => bytes
            .get(offset..offset + 4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .is_some_and(|b| u32::from_ne_bytes(b) == pgrx::pg_sys::DBState::DB_SHUTDOWNED),
        Err(e) => {
            pgrx::log!("tsoracle cannot read global/pg_control: {e}; not a clean start");
            false
        }
    };
    CLEAN_START.store(clean, std::sync::atomic::Ordering::Relaxed);
}

/// Whether this server started from a clean shutdown ([`note_start`]).
pub fn clean_start() -> bool {
    CLEAN_START.load(std::sync::atomic::Ordering::Relaxed)
}
