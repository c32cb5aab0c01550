//! tsoracle: strictly increasing timestamps and durable sequences from SQL.
//!
//! The pure algorithm is the `tsoracle-core` crate; here are the PostgreSQL parts, in five
//! layers whose dependencies point one way (`scripts/check-layers.py`, run by `make test`,
//! fails on any other edge and on an import circle):
//!
//! ```text
//!   sql      the SQL surface: thin functions, argument checks, error mapping
//!    |
//!   caller   what a backend does inside a call: take from the window, queue requests, wait,
//!    |       hold the resolved timestamp, advance a counter in place, the drop guard
//!    v
//!   shmem    shared memory: the window, the oracle's state, the request queue, lease
//!    ^       bounds, holder slots
//!    |
//!   worker   the background worker, the only writer of the durable tables
//!
//!   pg       PostgreSQL glue, under all of them: settings, clocks, compatibility between
//!            majors, errors, catalog lookups, replication helpers
//! ```
//!
//! Each folder's `mod.rs` says what it owns and what it may use.

use pgrx::prelude::*;

mod caller;
mod pg;
mod shmem;
mod sql;
mod worker;

::pgrx::pg_module_magic!(name, version);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // Settings, shared memory and the worker exist only when preloaded (a postmaster-level
    // setting cannot even be defined later); otherwise every function reports how to fix
    // it (TsoError::NotPreloaded).
    // SAFETY: a read of a process-local global that PostgreSQL sets only around loading the
    // preload libraries, on this same (only) thread.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        pg::guc::define();
        pg::note_start();
        shmem::init();
        caller::guard::init();
        caller::logged::init();
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
