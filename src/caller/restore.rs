//! Restores write the durable tables underneath a running worker (pg_dump/pg_restore load
//! `tsoracle.high_water`, `tsoracle.seq` and `tsoracle.lease` while the worker may already
//! serve). The trigger `tsoracle.merge_restored_row` merges each restored row into what is
//! there (never lowering anything) and calls `note_restore()`, which, when the restoring
//! transaction commits, has the worker stop serving and fence again above what was restored.
//! Nothing relies on winning a race with the worker: whichever commits first, the fence that
//! follows the restore's commit starts above both.

use crate::shmem;
use std::sync::atomic::{AtomicBool, Ordering};

/// A commit callback is registered for the current transaction.
static REGISTERED: AtomicBool = AtomicBool::new(false);

/// A row written outside the worker: false in the worker (its write goes through unchanged),
/// true elsewhere, after arranging for the worker to fence again once the transaction commits.
pub fn note() -> bool {
    if crate::pg::is_worker_process() {
        return false;
    }
    if !REGISTERED.swap(true, Ordering::Relaxed) {
        pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Commit, || {
            REGISTERED.store(false, Ordering::Relaxed);
            if let Ok(signals) = shmem::signals() {
                signals.request_refence();
            }
        });
        pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Abort, || {
            REGISTERED.store(false, Ordering::Relaxed);
        });
    }
    true
}
