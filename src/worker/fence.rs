//! The failover fence: nothing is served until a bound above every earlier one is durable.

use super::high_water::{self, RaiseError};
use super::leases::{holds_from_sql, purge_horizon};
use super::state::{log_clock_step, refuse, strict_mode_refusal, Worker};
use crate::pg::clock::{self, now_ms};
use crate::pg::guc;
use crate::pg::xact::{subtransaction, transaction};
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

    /// The fence cannot write now: say why (tso_status().detail, and the log once a minute).
    fn fence_blocked(&mut self, why: &str) {
        let text = format!("the fence is waiting: {why}");
        ORACLE.exclusive().set_refusal(&text);
        self.signals.broadcast();
        let now = clock::mono_ms();
        if now.saturating_sub(self.extension_warned_mono_ms) >= 60_000 {
            self.extension_warned_mono_ms = now;
            pgrx::warning!("tsoracle: {text}; retrying");
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
        // A fence that cannot write now (a lock held on the table, a rewrite in progress)
        // tries again until it can; nothing is served meanwhile, and tso_status() says why.
        let (commit_started, fenced) = loop {
            let commit_started = clock::sample();
            let (timeline, seed) = (u64::from(timeline), self.signals.seed_epoch());
            // The epoch base first, in a commit of its own confirmed on the synchronous
            // standbys: the fence's high-water (with its epoch) may be written in place and
            // acknowledged before the fence commits, and a standby promoted then must have
            // the base that makes its epoch higher.
            let attempt = transaction(|| keep_base(timeline, seed)).and_then(|kept| match kept {
                Ok(base) => {
                    crate::pg::replica::confirm_replicated();
                    transaction(|| {
                        fence_transaction(remembered_ms, min_floor_ms, timeline, seed, base)
                    })
                }
                Err(e) => Ok(Err(e)),
            });
            match attempt {
                Ok(Ok(fenced)) => break (commit_started, fenced),
                Ok(Err(FenceError::TopOfRange(why))) => {
                    refuse(self.signals, &why);
                    return false;
                }
                Ok(Err(FenceError::Retry(why))) => self.fence_blocked(&why),
                Err(e) => self.fence_blocked(&e.to_string()),
            }
            if !BackgroundWorker::wait_latch(Some(std::time::Duration::from_millis(200))) {
                return false;
            }
            pg_sys::check_for_interrupts!();
        };
        let Fenced { floor_ms, high_water_ms, epoch, leases, promoted } = fenced;
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

/// What one fence commits.
struct Fenced {
    floor_ms: u64,
    high_water_ms: u64,
    epoch: u64,
    leases: LeaseTable,
    promoted: bool,
}

enum FenceError {
    /// Nothing can ever be issued above the durable high-water.
    TopOfRange(String),
    /// Not now: a lock, a rewrite, a table being restored.
    Retry(String),
}

/// The fence's transaction: read the high-water, write a bound above it at this timeline (in
/// place, or through MVCC; the very first fence inserts the row), load the leases.
/// The epoch is `tsoracle_core::fence::epoch` of the row's, the timeline the fence runs on
/// plus `base` (as [`keep_base`] committed it), and a higher one a restore brought (`seed`).
fn fence_transaction(
    remembered_ms: u64,
    min_floor_ms: u64,
    timeline: u64,
    seed: u64,
    base: u64,
) -> Result<Fenced, FenceError> {
    let advance = guc::failover_advance_ms();
    let now = now_ms();
    let floor = |prior: u64| {
        fence::floor_ms(prior, remembered_ms, now, min_floor_ms).map_err(|_| {
            format!(
                "the durable high-water ({prior} ms) is at the top of the timestamp range: no timestamp can be issued above it"
            )
        })
    };
    let plan = |prior: u64, prior_epoch: u64| {
        floor(prior).map(|f| {
            (fence::request_ms(f, advance), fence::epoch(prior_epoch, base, timeline, seed))
        })
    };
    let raised = match high_water::write(&plan) {
        Ok(raised) => raised,
        Err(RaiseError::Refused(why)) => return Err(FenceError::TopOfRange(why)),
        Err(RaiseError::Unavailable(why)) => return Err(FenceError::Retry(why)),
        // No row: the very first fence after CREATE EXTENSION.
        Err(RaiseError::NotOurs) => first_row(&plan)?,
    };
    let floor_ms = floor(raised.prior_ms).map_err(FenceError::TopOfRange)?;
    // The row's epoch moved since keep_base read it (a restore merged a higher one while
    // nothing was served): its base is not kept yet, so fence again, from keep_base.
    if fence::base_after(raised.epoch, timeline) > base {
        return Err(FenceError::Retry(format!(
            "the high-water's epoch moved to {} while the fence ran",
            raised.epoch
        )));
    }
    // A row written at a lower epoch: this server was promoted since (or a restore raised it).
    let promoted = raised.prior_epoch > 0 && raised.prior_epoch < raised.epoch;
    // Only a warning: a failure to read pg_stat_replication never holds up the fence.
    let _ = subtransaction(crate::pg::replica::warn_if_unprotected);
    let leases = load_leases(now)?;
    Ok(Fenced {
        floor_ms,
        high_water_ms: raised.physical_ms,
        epoch: raised.epoch,
        leases,
        promoted,
    })
}

/// Raise the epoch base to what the fence is about to commit (`fence::base_after` of
/// `fence::epoch` over the row's epoch as it stands), in its own transaction; the base kept.
fn keep_base(timeline: u64, seed: u64) -> Result<u64, FenceError> {
    let read = |sql: &str, what: &str| {
        spi_step(what, || Ok(Spi::get_one::<i64>(sql)?.unwrap_or(0).max(0) as u64))
    };
    let base = read(
        "SELECT COALESCE((SELECT base FROM ONLY tsoracle.epoch_base), 0)",
        "read the epoch base",
    )?;
    let prior = read(
        "SELECT COALESCE((SELECT epoch FROM ONLY tsoracle.high_water), 0)",
        "read the high-water's epoch",
    )?;
    let kept = fence::base_after(fence::epoch(prior, base, timeline, seed), timeline);
    if kept <= base {
        return Ok(base);
    }
    spi_step("keep the epoch base", || {
        Spi::run_with_args(
            "INSERT INTO tsoracle.epoch_base AS b (id, base) VALUES (true, $1) \
             ON CONFLICT (id) DO UPDATE SET base = GREATEST(b.base, EXCLUDED.base), \
                 updated_at = pg_catalog.now()",
            &[(kept as i64).into()],
        )
    })?;
    Ok(kept)
}

/// One step of the fence's, in a subtransaction: an error is "not now" (retried).
fn spi_step<T>(
    what: &str,
    step: impl FnOnce() -> Result<T, pgrx::spi::Error>,
) -> Result<T, FenceError> {
    match subtransaction(step) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(FenceError::Retry(format!("could not {what}: {e}"))),
        Err(e) => Err(FenceError::Retry(format!("could not {what}: {e}"))),
    }
}

/// The first fence's insert of the row (an upsert: a restore may insert it at the same time).
fn first_row(plan: high_water::Plan<'_>) -> Result<high_water::Raised, FenceError> {
    let (requested, timeline) = plan(0, 0).map_err(FenceError::TopOfRange)?;
    let written = subtransaction(|| {
        Spi::get_two_with_args::<i64, i64>(
            "INSERT INTO tsoracle.high_water AS h (id, physical_ms, epoch) VALUES (true, $1, $2) \
             ON CONFLICT (id) DO UPDATE SET physical_ms = GREATEST(h.physical_ms, EXCLUDED.physical_ms), \
                 epoch = GREATEST(h.epoch, EXCLUDED.epoch), updated_at = pg_catalog.now() \
             RETURNING physical_ms, epoch",
            &[(requested as i64).into(), (timeline as i64).into()],
        )
    });
    match written {
        Ok(Ok((Some(ms), Some(epoch)))) => Ok(high_water::Raised {
            prior_ms: 0,
            prior_epoch: 0,
            physical_ms: ms.max(0) as u64,
            epoch: epoch.max(0) as u64,
        }),
        Ok(other) => Err(FenceError::Retry(format!("could not insert the high-water: {other:?}"))),
        Err(e) => Err(FenceError::Retry(format!("could not insert the high-water: {e}"))),
    }
}

/// The durable leases, without those expired longer than the retention (deleted here).
/// Holders are read as UTF-8 bytes, so that no row can make the fence fail.
fn load_leases(now_ms: u64) -> Result<LeaseTable, FenceError> {
    let horizon = purge_horizon(now_ms);
    // A purge that cannot run now (a row locked) waits for the worker's next one.
    let _ = subtransaction(|| {
        Spi::run_with_args(
            "DELETE FROM ONLY tsoracle.lease WHERE expires_at_ms OPERATOR(pg_catalog.<=) $1",
            &[(horizon as i64).into()],
        )
    });
    let rows = subtransaction(|| {
        Spi::connect(|client| {
            client
                .select(
                    "SELECT lease_id, pg_catalog.convert_to(holder, 'UTF8'), holder_epoch, ts_upper_bound_ms, \
                            expires_at_ms, ttl_ms, superseded, owner::pg_catalog.oid::pg_catalog.int8, \
                            ts_lower_bound_ms, holds \
                     FROM ONLY tsoracle.lease ORDER BY lease_id",
                    None,
                    &[],
                )?
                .map(|row| {
                    let expires_at_ms = row.get::<i64>(5)?.unwrap_or(0).max(0) as u64;
                    let ttl_ms = row.get::<i64>(6)?.unwrap_or(0).max(0) as u64;
                    Ok(Lease {
                        id: row.get::<i64>(1)?.unwrap_or(0),
                        holder: String::from_utf8_lossy(&row.get::<Vec<u8>>(2)?.unwrap_or_default())
                            .into_owned(),
                        holder_epoch: row.get::<i64>(3)?.unwrap_or(0),
                        ts_upper_bound_ms: row.get::<i64>(4)?.unwrap_or(0).max(0) as u64,
                        expires_at_ms,
                        ttl_ms,
                        superseded: row.get::<bool>(7)?.unwrap_or(false),
                        owner: u32::try_from(row.get::<i64>(8)?.unwrap_or(0)).unwrap_or(0),
                        // A lease granted before 0.4.0: its holder stamps from its grant's clock.
                        stamp_from_ms: row
                            .get::<i64>(9)?
                            .map_or(expires_at_ms.saturating_sub(ttl_ms), |v| v.max(0) as u64),
                        holds: holds_from_sql(
                            &row.get::<Vec<Option<i64>>>(10)?.unwrap_or_default(),
                        ),
                    })
                })
                .collect::<Result<Vec<Lease>, pgrx::spi::Error>>()
        })
    });
    let rows = match rows {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) => return Err(FenceError::Retry(format!("could not load the leases: {e}"))),
        Err(e) => return Err(FenceError::Retry(format!("could not load the leases: {e}"))),
    };
    LeaseTable::load(rows, horizon)
        .map_err(|e| FenceError::Retry(format!("the lease table is inconsistent: {e}")))
}
