//! `tsoracle.note_restore()`, called by the triggers of the durable tables for every row
//! written outside the worker (`caller::restore`).

use pgrx::prelude::*;

/// The function lives in schema tsoracle, beside the tables and the trigger that call it.
#[pg_schema]
mod tsoracle {
    use pgrx::prelude::*;

    /// Called by the merge trigger for each row written outside the worker. Returns false in
    /// the worker (its write goes through unchanged), true elsewhere: the row is a restore (or a
    /// superuser's own write), to be merged, and the worker fences again once it commits.
    #[pg_extern(volatile, parallel_unsafe)]
    fn note_restore() -> bool {
        crate::caller::restore::note()
    }
}
