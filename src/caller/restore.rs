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
                // Nothing in place until the worker, before its fence, has looked whether the
                // restore brought the mark of a member (`worker::member::alone`).
                signals.forget_may_serve_alone();
                signals.request_refence();
            }
        });
        pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Abort, || {
            REGISTERED.store(false, Ordering::Relaxed);
        });
    }
    true
}

/// A restored (or replicated) high-water row, while this database's oracle serves: have the
/// worker raise the durable high-water to it (and its epoch) and wait until it has, instead of
/// writing the row. The restoring transaction then holds no lock on the row, however long it
/// lasts (`pg_restore --single-transaction`), so window extensions go on. False when the
/// oracle does not serve here (another database, or the extension made in this same
/// transaction): the row is merged as it comes, and the fence after the commit goes above it.
/// On a member too: its worker raises no window of its own (a member's dump restored into a
/// member, docs/operations/backups.md); its high-water is the bound of its own past it reads
/// at start, which the merge raises.
pub fn raise_high_water(physical_ms: i64, epoch: i64) -> Result<bool, crate::pg::error::TsoError> {
    if crate::pg::is_worker_process()
        || crate::pg::guc::is_member()
        || !crate::pg::catalog::in_worker_database()
    {
        return Ok(false);
    }
    let signals = shmem::signals()?;
    if shmem::ORACLE.share().phase != shmem::Phase::Serving {
        return Ok(false);
    }
    let (Ok(ms), Ok(epoch)) = (u64::try_from(physical_ms), u64::try_from(epoch)) else {
        return Ok(false);
    };
    note();
    signals.request_seed_epoch(epoch);
    // The restored cluster may have issued timestamps in millisecond `ms` itself: serve
    // strictly above it (a seed is "at or above").
    super::window::seed(signals, ms.saturating_add(1))?;
    Ok(true)
}
