//! The serving loop: keep the window ahead of the clock (within `tsoracle.max_lead_ms`),
//! answer the callers' requests, expire leases, publish the resolved timestamp.

use super::high_water::persist_high_water;
use super::settings::warn_if_window_exceeds_ha_ttl;
use super::state::{log_clock_step, strict_mode_refusal, Worker};
use crate::pg::clock;
use crate::pg::guc;
use crate::shmem::ORACLE;
use pgrx::bgworkers::BackgroundWorker;
use pgrx::prelude::*;
use std::time::Duration;
use tsoracle_core::allocator::WindowExtension;

/// Why the serving loop stopped.
pub(super) enum Stop {
    /// SIGTERM or postmaster death: leave.
    Exit,
    /// The durable row no longer matches our epoch (table recreated, restored): fence again.
    Refence,
}

impl Worker {
    /// Steady state: keep the window ahead of the clock (within `tsoracle.max_lead_ms`),
    /// answer callers' requests.
    pub(super) fn serve(&mut self) -> Stop {
        loop {
            let window_ahead = guc::window_ahead_ms();
            // Wake often enough to extend before half of the window is gone, and to publish
            // the resolved timestamp on time.
            let tick = Duration::from_millis(
                (window_ahead / 8).clamp(1, 200).min(guc::resolved_interval_ms().max(1)),
            );
            if !BackgroundWorker::wait_latch(Some(tick)) {
                return Stop::Exit;
            }
            pg_sys::check_for_interrupts!();
            if BackgroundWorker::sighup_received() {
                // SAFETY: called from the worker's main loop, between transactions, where no
                // LWLock is held.
                unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
                warn_if_window_exceeds_ha_ttl();
            }

            let seed = self.signals.take_seed_request();
            // A caller re-asks while it waits: a seed already applied needs no second fence.
            if seed > 0 && seed > ORACLE.share().seeded_ms {
                if !self.fence(seed) {
                    return Stop::Exit;
                }
                continue;
            }
            if self.signals.take_refence_request() {
                pgrx::log!("tsoracle: durable state was restored underneath the worker; running the fence again");
                return Stop::Refence;
            }

            self.serve_requests();
            self.expire_leases();
            self.publish_resolved();

            let requested = self.signals.take_extension_request();
            let sample = clock::sample();
            let now = sample.wall_ms;
            let max_lead = guc::max_lead_ms();
            // Issuing stops window_ahead_ms after the last confirmed commit began: renew it at
            // half time, with a commit that changes nothing if nothing else is due.
            let heartbeat = self.signals.serve_left_ms(sample) <= window_ahead / 2;
            let (extension, step) = {
                let mut st = ORACLE.exclusive();
                let step = st.clock.observe(sample.wall_ms, sample.mono_ms);
                let reference = st.clock.reference_ms();
                st.allocator.observe_issued(self.signals.window.next_ts());
                // The clock moved: callers may take up to the (higher) lead cap.
                self.signals.window.extend(st.allocator.serving_bound_ms(reference, max_lead));
                let wider = (requested
                    || st.allocator.needs_capped_extension(now, reference, window_ahead, max_lead))
                .then(|| {
                    st.allocator
                        .prepare_capped_extension(now, reference, window_ahead, max_lead)
                        .ok()
                        .flatten()
                })
                .flatten();
                let unchanged = st.allocator.epoch().map(|epoch| WindowExtension {
                    requested_ms: st.allocator.high_water_ms(),
                    epoch,
                });
                (wider.or(unchanged.filter(|_| heartbeat)), step)
            };
            log_clock_step(step);
            if requested {
                self.signals.broadcast();
            }
            if let Some(extension) = extension {
                if !self.extend(extension) {
                    return Stop::Refence;
                }
            }
        }
    }

    /// Persist a wider window (monotonic, epoch-checked) and let the allocator use it.
    /// False when the durable row is not ours any more and the fence must run again.
    fn extend(&mut self, extension: WindowExtension) -> bool {
        let commit_started = clock::sample();
        let outcome = BackgroundWorker::transaction(|| match strict_mode_refusal() {
            Some(why) => Err(why),
            None => Ok(persist_high_water(extension)),
        });
        let actual = match outcome {
            Err(why) => {
                ORACLE.exclusive().set_refusal(&why);
                self.signals.broadcast();
                return true;
            }
            Ok(actual) => actual,
        };
        let Some(actual) = actual else {
            // No row at our epoch: the table was recreated or restored underneath us.
            pgrx::warning!(
                "tsoracle high-water row is missing or at another epoch; running the fence again"
            );
            return false;
        };
        crate::pg::replica::confirm_replicated();
        self.signals.confirm_until(commit_started, guc::window_ahead_ms());
        ORACLE.exclusive().set_refusal("");
        match self.commit_high_water(actual, extension.epoch) {
            Ok(()) => {
                ORACLE.exclusive().window_extensions += 1;
                true
            }
            Err(e) => {
                pgrx::warning!("tsoracle window extension rejected ({e}); running the fence again");
                false
            }
        }
    }
}
