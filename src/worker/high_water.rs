//! The durable high-water: the one monotonic path to it, and letting the allocator serve up
//! to what is durable.

use super::state::Worker;
use crate::pg::guc;
use crate::shmem::ORACLE;
use pgrx::prelude::*;
use tsoracle_core::allocator::WindowExtension;
use tsoracle_core::error::CoreError;

impl Worker {
    /// Let the allocator serve up to a high-water that is now durable (within the lead cap).
    pub(super) fn commit_high_water(&self, actual_ms: u64, epoch: u64) -> Result<(), CoreError> {
        let result = {
            let mut st = ORACLE.exclusive();
            let result = st.allocator.commit_window_extension(actual_ms, epoch);
            if result.is_ok() {
                let reference = st.clock.reference_ms();
                self.signals
                    .window
                    .extend(st.allocator.serving_bound_ms(reference, guc::max_lead_ms()));
                st.worker_commits += 1;
                st.max_committed_ms = st.max_committed_ms.max(actual_ms);
            }
            result
        };
        self.signals.broadcast();
        result
    }
}

/// `UPDATE … GREATEST … WHERE epoch = $2`: the one monotonic path to the high-water.
/// None when the row is not at our epoch.
pub(super) fn persist_high_water(extension: WindowExtension) -> Option<u64> {
    Spi::get_one_with_args::<i64>(
        "UPDATE tsoracle.high_water SET physical_ms = GREATEST(physical_ms, $1), updated_at = pg_catalog.now() \
         WHERE id AND epoch OPERATOR(pg_catalog.=) $2 RETURNING physical_ms",
        &[(extension.requested_ms as i64).into(), (extension.epoch as i64).into()],
    )
    .ok()
    .flatten()
    .and_then(|ms| u64::try_from(ms).ok())
}
