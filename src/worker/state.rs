//! The worker's own memory, and the phase and refusals it publishes.

use super::sequences::SeqStatements;
use crate::pg::guc;
use crate::shmem::{oracle::HANDED_OVER, Phase, Signals, ORACLE};
use pgrx::bgworkers::BackgroundWorker;
use pgrx::prelude::*;
use std::time::Duration;
use tsoracle_core::clock::Step;
use tsoracle_core::lease::LeaseTable;

/// The worker's own memory: the lease table (durable copy in `tsoracle.lease`, bounds
/// published to shared memory for `tso_safe_frontier()`).
pub(super) struct Worker {
    pub(super) signals: &'static Signals,
    pub(super) leases: LeaseTable,
    /// When each lease stops holding the frontier on the monotonic clock (`clock::mono_ms`).
    pub(super) lease_deadlines: std::collections::HashMap<i64, u64>,
    /// When the resolved timestamp was last published, or considered (`clock::mono_ms`).
    pub(super) resolved_published_mono_ms: u64,
    /// Plans of the group commit's statements, prepared once per worker life.
    pub(super) seq_statements: Option<SeqStatements>,
    /// When a failed window extension was last logged (`clock::mono_ms`).
    pub(super) extension_warned_mono_ms: u64,
}

impl Worker {
    /// A worker's memory at its start: no lease read yet, the first publication of the
    /// resolved timestamp an interval from now.
    pub(super) fn new(signals: &'static Signals) -> Worker {
        Worker {
            signals,
            leases: LeaseTable::new(),
            lease_deadlines: std::collections::HashMap::new(),
            seq_statements: None,
            extension_warned_mono_ms: 0,
            resolved_published_mono_ms: crate::pg::clock::mono_ms(),
        }
    }
}

/// Read what the worker needs at its start with `read`, again every second while it fails
/// (each failure logged as a warning); `None` when the server shuts down meanwhile.
pub(super) fn read_at_start<T>(mut read: impl FnMut() -> Result<T, String>) -> Option<T> {
    loop {
        match read() {
            Ok(value) => return Some(value),
            Err(why) => pgrx::warning!("{why}"),
        }
        if !BackgroundWorker::wait_latch(Some(Duration::from_secs(1))) {
            return None;
        }
        pg_sys::check_for_interrupts!();
    }
}

pub(super) fn set_phase(signals: &Signals, phase: Phase) {
    ORACLE.exclusive().phase = phase;
    signals.broadcast();
}

/// Publish why the worker does not serve and stay (not serving) until shutdown: restarting
/// would only fail the same way.
pub(super) fn refuse(signals: &Signals, why: &str) {
    pgrx::warning!("tsoracle: {why}");
    {
        let mut st = ORACLE.exclusive();
        st.allocator.step_down();
        st.set_refusal(why);
        st.phase = Phase::Refused;
    }
    signals.window.close();
    signals.broadcast();
    while BackgroundWorker::wait_latch(Some(Duration::from_secs(10))) {
        pg_sys::check_for_interrupts!();
        if BackgroundWorker::sighup_received() {
            // SAFETY: reloading the configuration file from the worker's main loop.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
    }
}

/// `tso_handover()` was called: stop serving (the window is closed already) and stay so until
/// shutdown. Everything issued is at or below the committed high-water, which no longer moves.
pub(super) fn hand_over(signals: &Signals) {
    pgrx::log!(
        "tsoracle: handed over at high-water {} ms; serving nothing more until the server restarts",
        ORACLE.share().max_committed_ms
    );
    refuse(signals, HANDED_OVER);
}

/// Strict mode (`tsoracle.require_synchronous_standby`): why nothing may be granted now,
/// if a synchronous standby is required and none is connected. Call inside a transaction.
pub(super) fn strict_mode_refusal() -> Option<String> {
    if !guc::require_synchronous_standby() {
        return None;
    }
    let synchronous = Spi::connect(|client| {
        client
            .select(
                "SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_replication WHERE sync_state IN ('sync', 'quorum')",
                None,
                &[],
            )?
            .first()
            .get_one::<i64>()
    })
    .ok()
    .flatten()
    .unwrap_or(0);
    (synchronous == 0).then(|| {
        "no synchronous standby is connected and tsoracle.require_synchronous_standby is on: nothing is granted until one is".to_string()
    })
}

/// Say in the server log that the wall clock stepped, and what the oracle does about it.
pub(super) fn log_clock_step(step: Option<Step>) {
    let (direction, ms) = match step {
        None => return,
        Some(Step::Back(ms)) => ("back", ms),
        Some(Step::Forward(ms)) => ("forward", ms),
    };
    let lead = ORACLE.share().clock.lead_ms();
    pgrx::warning!(
        "tsoracle: the wall clock stepped {direction} by {ms} ms; timestamps go on above the last one issued, the lead cap is measured from a reference clock {lead} ms ahead of the wall clock, which closes the gap at half the pace of real time"
    );
}
