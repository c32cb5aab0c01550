//! tsoracle: strictly increasing timestamps and durable sequences from SQL.
//!
//! Layout: the pure algorithm is the `tsoracle-core` crate; here are the PostgreSQL parts:
//! `shmem` (shared state: allocator bookkeeping, the lock-free window, the request queue),
//! `worker` (the only writer of durable state), `oracle` (the caller's side: take from the
//! window, queue requests, wait), the SQL surface in `timestamps` (timestamps, seed), `status`,
//! `seq` (counters) and `lease` (leases and the safe frontier), `restore` (merging restored
//! rows), `guc`, `error`, `replica` (standbys, synchronous replication) and `clock`.

use pgrx::prelude::*;

mod clock;
mod compat;
mod error;
mod guard;
mod guc;
mod lease;
mod oracle;
mod replica;
mod resolved;
mod restore;
mod seq;
mod seq_inplace;
mod shmem;
mod status;
mod timestamps;
mod uuid;
mod worker;

#[cfg(any(test, feature = "pg_test"))]
mod testing;

::pgrx::pg_module_magic!(name, version);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // Settings, shared memory and the worker exist only when preloaded (a postmaster-level
    // setting cannot even be defined later); otherwise every function reports how to fix
    // it (TsoError::NotPreloaded).
    // SAFETY: a read of a process-local global that PostgreSQL sets only around loading the
    // preload libraries, on this same (only) thread.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        guc::define();
        shmem::init();
        guard::init();
        // No worker while pg_upgrade runs the server (`postgres -b`): the tables it would
        // write are being restored, and their files are replaced by the old cluster's
        // afterwards. The upgraded cluster's first real start fences from those files.
        // SAFETY: as above, a process-local global set at postmaster start.
        if !unsafe { pg_sys::IsBinaryUpgrade } {
            worker::register();
        }
    }
}

// The SQL the extension installs besides its functions lives in sql/: the tables first,
// privileges and the restore merge last.
extension_sql_file!("../sql/schema.sql", name = "tsoracle_schema", bootstrap);
extension_sql_file!("../sql/finalize.sql", name = "tsoracle_finalize", finalize);

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["shared_preload_libraries = 'tsoracle'", "tsoracle.database = 'pgrx_tests'"]
    }
}
