//! The serving loop: keep the window ahead of the clock (within `tsoracle.max_lead_ms`),
//! answer the callers' requests, expire leases, publish the resolved timestamp.

use super::high_water::{self, RaiseError};
use super::settings::warn_if_window_exceeds_ha_ttl;
use super::state::{hand_over, log_clock_step, strict_mode_refusal, Worker};
use crate::pg::clock;
use crate::pg::guc;
use crate::pg::xact::transaction;
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

            if self.signals.handover_requested() {
                hand_over(self.signals);
                return Stop::Exit;
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
        let outcome = transaction(|| match strict_mode_refusal() {
            Some(why) => Err(Extension::Refused(why)),
            None => {
                high_water::raise(extension.requested_ms, extension.epoch).map_err(Extension::Raise)
            }
        });
        let actual = match outcome {
            Ok(Ok(actual)) => actual,
            Ok(Err(Extension::Refused(why))) => {
                ORACLE.exclusive().set_refusal(&why);
                self.signals.broadcast();
                return true;
            }
            Ok(Err(Extension::Raise(RaiseError::NotOurs))) => {
                // No row at our epoch: the table was recreated or restored underneath us.
                pgrx::warning!(
                    "tsoracle high-water row is missing or at another epoch; running the fence again"
                );
                return false;
            }
            Ok(Err(Extension::Raise(RaiseError::Refused(why) | RaiseError::Unavailable(why)))) => {
                self.extension_failed(&why);
                return true;
            }
            Err(e) => {
                self.extension_failed(&e.to_string());
                return true;
            }
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

    /// A window extension could not be made durable now (a lock held too long, a rewrite of
    /// the table in progress): the window serves what it holds and the next tick tries again.
    /// Say why in `tso_status().detail` and, once a minute at most, in the log.
    fn extension_failed(&mut self, why: &str) {
        let text = format!("the window could not be extended: {why}");
        ORACLE.exclusive().set_refusal(&text);
        self.signals.broadcast();
        let now = clock::mono_ms();
        if now.saturating_sub(self.extension_warned_mono_ms) >= 60_000 {
            self.extension_warned_mono_ms = now;
            pgrx::warning!("tsoracle: {text}; retrying every tick");
        }
    }
}

/// Why a window extension did not happen.
enum Extension {
    Refused(String),
    Raise(RaiseError),
}
