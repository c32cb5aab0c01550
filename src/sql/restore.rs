//! `tsoracle.note_restore()`, called by the triggers of the durable tables for every row
//! written outside the worker (`caller::restore`).

use pgrx::prelude::*;

/// The function lives in schema tsoracle, beside the tables and the trigger that call it.
#[pg_schema]
mod tsoracle {
    use crate::pg::error::OrReport;
    use pgrx::prelude::*;

    /// Called by the merge trigger for each row written outside the worker. Returns false in
    /// the worker (its write goes through unchanged), true elsewhere: the row is a restore (or a
    /// superuser's own write), to be merged, and the worker fences again once it commits.
    #[pg_extern(volatile, parallel_unsafe)]
    fn note_restore() -> bool {
        crate::caller::restore::note()
    }

    /// Called by the merge trigger for a restored high-water row: true when the worker has
    /// raised the durable high-water to it (the row is then not written), false when the row
    /// is to be merged as it comes.
    #[pg_extern(volatile, parallel_unsafe, strict)]
    fn raise_restored_high_water(physical_ms: i64, epoch: i64) -> bool {
        crate::caller::restore::raise_high_water(physical_ms, epoch).or_report()
    }
}
