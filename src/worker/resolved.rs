//! Publishing the resolved timestamp to hot standbys and to logical decoding.

use super::state::Worker;
use crate::pg::clock;
use crate::pg::guc;
use crate::pg::xact::transaction;
use pgrx::prelude::*;

impl Worker {
    /// Every `tsoracle.resolved_interval_ms`, if `R` advanced since the last time: write it
    /// to `tsoracle.resolved` (standbys read it as far as they have replayed) and, with
    /// `wal_level = logical`, emit it as a transactional message with prefix
    /// `tsoracle.resolved` — in one transaction, which begins after every transaction holding
    /// a value at or below `R` has ended, so its commit comes after theirs in the WAL and in
    /// the change stream.
    pub(super) fn publish_resolved(&mut self) {
        let now = clock::mono_ms();
        if now.saturating_sub(self.resolved_published_mono_ms) < guc::resolved_interval_ms() {
            return;
        }
        self.resolved_published_mono_ms = now;
        let Ok(r) = crate::shmem::holders::primary_resolved(self.signals) else {
            return;
        };
        if r <= self.signals.published_resolved().0 {
            return;
        }
        let written = transaction(|| {
            Spi::run_with_args(
                "UPDATE tsoracle.resolved SET ts = GREATEST(ts, $1), updated_at = pg_catalog.now() WHERE id",
                &[(r as i64).into()],
            )?;
            Spi::run_with_args(
                "SELECT CASE WHEN pg_catalog.current_setting('wal_level') OPERATOR(pg_catalog.=) 'logical' \
                     THEN pg_catalog.pg_logical_emit_message(true, 'tsoracle.resolved', $1::pg_catalog.text) END",
                &[(r as i64).into()],
            )
        });
        // Not published now (tsoracle.resolved locked past the worker's lock_timeout): the next
        // interval tries again; R on the primary goes on, standbys' R waits.
        let failure = match written {
            Ok(Ok(())) => {
                self.signals.set_published_resolved(r, clock::now_ms());
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        // Once a minute at most: it is tried again every interval.
        thread_local! { static WARNED_MONO_MS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) }; }
        if now.saturating_sub(WARNED_MONO_MS.get()) >= 60_000 || WARNED_MONO_MS.get() == 0 {
            WARNED_MONO_MS.set(now);
            pgrx::warning!("tsoracle could not publish the resolved timestamp {r}: {failure}; retrying every tsoracle.resolved_interval_ms");
        }
    }
}
