//! The failover fence: nothing is served until a bound above every earlier one is durable.

use super::leases::purge_horizon;
use super::state::{log_clock_step, refuse, strict_mode_refusal, Worker};
use crate::pg::clock::{self, now_ms};
use crate::pg::guc;
use crate::shmem::{Phase, ORACLE};
use pgrx::bgworkers::BackgroundWorker;
use pgrx::prelude::*;
use std::time::Instant;
use tsoracle_core::fence;
use tsoracle_core::lease::{Lease, LeaseTable};

impl Worker {
    /// Strict mode only: wait (not serving, `tso_status().detail` says why) until a
    /// synchronous standby is connected. False on shutdown.
    fn wait_for_synchronous_standby(&self) -> bool {
        loop {
            let Some(why) = BackgroundWorker::transaction(strict_mode_refusal) else {
                ORACLE.exclusive().set_refusal("");
                return true;
            };
            ORACLE.exclusive().set_refusal(&why);
            self.signals.broadcast();
            if !BackgroundWorker::wait_latch(Some(std::time::Duration::from_millis(200))) {
                return false;
            }
            pg_sys::check_for_interrupts!();
        }
    }

    /// The failover fence (docs/worker.md): stop serving, load the durable high-water,
    /// persist a bound above it at this timeline, reload the leases, seed the allocator,
    /// serve. `min_floor_ms` > 0 is a `tso_seed()` request. False when the oracle cannot
    /// serve at all (the high-water is at the top of the range): the worker then refuses
    /// until shutdown instead of failing the fence again and again.
    pub(super) fn fence(&mut self, min_floor_ms: u64) -> bool {
        let started = Instant::now();
        self.signals.window.close();
        let remembered_ms = {
            let mut st = ORACLE.exclusive();
            st.allocator.step_down();
            st.phase = Phase::Fencing;
            st.max_committed_ms
        };
        self.signals.broadcast();
        // Strict mode: not even the fence's window is served before a synchronous standby
        // can confirm it (after a promotion, until the HA manager has named one).
        if !self.wait_for_synchronous_standby() {
            return false;
        }

        // SAFETY: GetWALInsertionTimeLine requires recovery to have ended: the worker starts
        // only once it has (BgWorkerStart_RecoveryFinished) and it never starts again while
        // the server runs, so the insertion timeline no longer changes.
        let timeline = unsafe { pg_sys::GetWALInsertionTimeLine() };
        let commit_started = clock::sample();
        let advance = guc::failover_advance_ms();
        let fenced = BackgroundWorker::transaction(|| {
            // No row only before the very first fence; a failed read is never taken for one.
            let (prior, prior_epoch) = Spi::connect(|client| {
                let rows = client.select(
                    "SELECT physical_ms, epoch FROM tsoracle.high_water WHERE id",
                    None,
                    &[],
                )?;
                if rows.is_empty() {
                    Ok((None, None))
                } else {
                    rows.first().get_two::<i64, i64>()
                }
            })
            .unwrap_or_else(|e| pgrx::error!("tsoracle fence could not read the high-water: {e}"));
            let prior = prior.unwrap_or(0).max(0) as u64;
            // A row written on an older timeline: this server was promoted since.
            let promoted = prior_epoch.is_some_and(|e| e < i64::from(timeline));
            crate::pg::replica::warn_if_unprotected();
            let now = now_ms();
            let Ok(floor_ms) = fence::floor_ms(prior, remembered_ms, now, min_floor_ms) else {
                return Err(format!(
                    "the durable high-water ({prior} ms) is at the top of the timestamp range: no timestamp can be issued above it"
                ));
            };
            let requested = fence::request_ms(floor_ms, advance);
            let (actual, epoch) = Spi::get_two_with_args::<i64, i64>(
                "INSERT INTO tsoracle.high_water AS h (id, physical_ms, epoch) VALUES (true, $1, $2) \
                 ON CONFLICT (id) DO UPDATE SET physical_ms = GREATEST(h.physical_ms, EXCLUDED.physical_ms), \
                     epoch = GREATEST(h.epoch, EXCLUDED.epoch), updated_at = pg_catalog.now() \
                 RETURNING physical_ms, epoch",
                &[(requested as i64).into(), i64::from(timeline).into()],
            )
            .unwrap_or_else(|e| pgrx::error!("tsoracle fence could not persist the high-water: {e}"));
            let leases = load_leases(now);
            Ok((
                floor_ms,
                actual.unwrap_or(0).max(0) as u64,
                epoch.unwrap_or(0).max(0) as u64,
                leases,
                promoted,
            ))
        });
        let (floor_ms, high_water_ms, epoch, leases, promoted) = match fenced {
            Ok(fenced) => fenced,
            Err(why) => {
                refuse(self.signals, &why);
                return false;
            }
        };
        // Committed (and flushed, and replicated where synchronous standbys are required).
        crate::pg::replica::confirm_replicated();
        self.signals.confirm_until(commit_started, guc::window_ahead_ms());
        self.leases = leases;
        self.note_lease_deadlines(None, commit_started);
        self.publish_lease_bounds();

        let step = {
            let mut st = ORACLE.exclusive();
            // The reference clock starts at the floor when the fence had to start above the
            // wall clock, and goes on from there at half pace until the wall clock catches up.
            let now = clock::sample();
            let step = st.clock.observe(now.wall_ms, now.mono_ms);
            st.clock.raise_to(floor_ms);
            let reference = st.clock.reference_ms();
            let seeded =
                st.allocator.become_leader(floor_ms, high_water_ms, epoch).and_then(|()| {
                    let bound = st.allocator.serving_bound_ms(reference, guc::max_lead_ms());
                    self.signals.window.open(floor_ms, bound)
                });
            if let Err(e) = seeded {
                drop(st);
                pgrx::error!("tsoracle fence produced an invalid seed: {e}");
            }
            st.phase = Phase::Serving;
            st.set_refusal("");
            st.timeline = timeline;
            st.max_committed_ms = st.max_committed_ms.max(high_water_ms);
            st.fences += 1;
            st.worker_commits += 1;
            st.last_fence_us = started.elapsed().as_micros() as u64;
            st.seeded_ms = st.seeded_ms.max(min_floor_ms);
            st.last_fence_promoted = promoted;
            self.signals.first_grant_ms.store(0, std::sync::atomic::Ordering::Relaxed);
            step
        };
        log_clock_step(step);
        self.signals.broadcast();
        pgrx::log!(
            "tsoracle fence complete: epoch {epoch} (timeline {timeline}), serving from {floor_ms} ms, high-water {high_water_ms} ms, {} live leases, took {:.1} ms",
            self.leases.iter().filter(|l| l.is_live(now_ms())).count(),
            started.elapsed().as_secs_f64() * 1000.0
        );
        true
    }
}

/// The durable leases, without those expired longer than the retention (deleted here).
/// Holders are read as UTF-8 bytes, so that no row can make the fence fail.
fn load_leases(now_ms: u64) -> LeaseTable {
    let horizon = purge_horizon(now_ms);
    Spi::run_with_args(
        "DELETE FROM tsoracle.lease WHERE expires_at_ms OPERATOR(pg_catalog.<=) $1",
        &[(horizon as i64).into()],
    )
    .unwrap_or_else(|e| pgrx::error!("tsoracle could not delete expired leases: {e}"));
    let rows = Spi::connect(|client| {
        client
            .select(
                "SELECT lease_id, pg_catalog.convert_to(holder, 'UTF8'), holder_epoch, ts_upper_bound_ms, \
                        expires_at_ms, ttl_ms, superseded, owner::pg_catalog.oid::pg_catalog.int8 \
                 FROM tsoracle.lease ORDER BY lease_id",
                None,
                &[],
            )?
            .map(|row| {
                Ok(Lease {
                    id: row.get::<i64>(1)?.unwrap_or(0),
                    holder: String::from_utf8_lossy(&row.get::<Vec<u8>>(2)?.unwrap_or_default()).into_owned(),
                    holder_epoch: row.get::<i64>(3)?.unwrap_or(0),
                    ts_upper_bound_ms: row.get::<i64>(4)?.unwrap_or(0).max(0) as u64,
                    expires_at_ms: row.get::<i64>(5)?.unwrap_or(0).max(0) as u64,
                    ttl_ms: row.get::<i64>(6)?.unwrap_or(0).max(0) as u64,
                    superseded: row.get::<bool>(7)?.unwrap_or(false),
                    owner: u32::try_from(row.get::<i64>(8)?.unwrap_or(0)).unwrap_or(0),
                })
            })
            .collect::<Result<Vec<Lease>, pgrx::spi::Error>>()
    })
    .unwrap_or_else(|e| pgrx::error!("tsoracle could not load the leases: {e}"));
    LeaseTable::load(rows, horizon)
        .unwrap_or_else(|e| pgrx::error!("tsoracle lease table is inconsistent: {e}"))
}
