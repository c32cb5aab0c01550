//! Taking timestamps: from the shared window with one compare-and-swap, or, when it is
//! exhausted or not yet fenced, waiting (bounded) for the worker to extend it.
//!
//! Callers never write anything durable. In steady state a call is one compare-and-swap on
//! the shared window: no lock, no I/O.

use super::holding;
use crate::pg::clock;
use crate::pg::error::TsoError;
use crate::pg::guc;
use crate::shmem::{self, not_serving, Phase, Signals, ORACLE};
use pgrx::pg_sys;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use tsoracle_core::allocator::MAX_BATCH;
use tsoracle_core::error::CoreError;

/// Set once this backend has seen recovery end; recovery never starts again in the life of
/// a backend (promotion is one way), so the hot path skips the call from then on.
static SEEN_PRIMARY: AtomicBool = AtomicBool::new(false);

/// Refuse on a hot standby: the primary is the only source of order.
pub fn ensure_primary(what: &'static str) -> Result<(), TsoError> {
    if SEEN_PRIMARY.load(Ordering::Relaxed) {
        return Ok(());
    }
    // SAFETY: RecoveryInProgress may be called by any backend at any time: it reads the
    // recovery state from XLogCtl in shared memory and caches it in a process-local flag.
    if unsafe { pg_sys::RecoveryInProgress() } {
        Err(TsoError::Standby(what))
    } else {
        SEEN_PRIMARY.store(true, Ordering::Relaxed);
        Ok(())
    }
}

/// Why a grant could not be served right now.
enum Blocked {
    Exhausted,
    NotServing(Phase),
}

fn try_grant(signals: &Signals, count: u32) -> Result<Result<u64, Blocked>, TsoError> {
    let now = clock::sample();
    // Only while the last confirmed commit is recent (the worker renews it every half window),
    // on the monotonic clock and on the wall clock.
    if signals.serve_left_ms(now) == 0 {
        return Ok(Err(Blocked::Exhausted));
    }
    let now = now.wall_ms;
    match signals.window.try_grant(now, count) {
        Ok(first) => {
            if signals.first_grant_ms.load(Ordering::Relaxed) == 0 {
                signals.first_grant_ms.store(now.max(1), Ordering::Relaxed);
            }
            Ok(Ok(first))
        }
        Err(CoreError::WindowExhausted { .. }) => Ok(Err(Blocked::Exhausted)),
        Err(CoreError::NotLeader) => Ok(Err(Blocked::NotServing(ORACLE.share().phase))),
        Err(e) => Err(e.into()),
    }
}

/// Grant `count` consecutive timestamps in one millisecond; returns the first.
pub fn next(count: i64) -> Result<u64, TsoError> {
    let signals = shmem::signals()?;
    ensure_primary("issue timestamps")?;
    let count =
        u32::try_from(count).ok().filter(|c| (1..=MAX_BATCH).contains(c)).ok_or_else(|| {
            TsoError::InvalidArgument(format!(
                "count must be between 1 and {MAX_BATCH}, got {count}"
            ))
        })?;
    if guc::is_member() {
        return super::member::next(count);
    }

    // The resolved timestamp: this transaction holds what it takes until it ends.
    let fresh = holding::hold(signals)?;
    let granted = |first: u64| {
        if fresh {
            holding::raise(first);
        }
        holding::granted(first, count);
        first
    };
    let blocked = match try_grant(signals, count)? {
        Ok(first) => return Ok(granted(first)),
        // Waiting cannot help: say why at once.
        Err(Blocked::NotServing(Phase::Refused)) => {
            return Err(not_serving(signals, Phase::Refused))
        }
        // A cluster that has been a member, refusing to serve on its own: at once too.
        Err(Blocked::Exhausted) if signals.may_serve_alone() == Some(false) => {
            return Err(not_serving(signals, refusal_and_phase().1))
        }
        Err(blocked) => blocked,
    };
    let mut last_block = blocked;
    let outcome = wait_for_worker(signals, || {
        poke(signals, &last_block);
        match try_grant(signals, count)? {
            Ok(first) => Ok(Some(first)),
            Err(blocked) => {
                last_block = blocked;
                Ok(None)
            }
        }
    })?;
    match outcome {
        Some(first) => Ok(granted(first)),
        None => Err(match last_block {
            Blocked::NotServing(phase) => not_serving(signals, phase),
            Blocked::Exhausted => match refusal_and_phase() {
                (_, Phase::Refused) => not_serving(signals, Phase::Refused),
                (Some(why), _) => TsoError::NotServing(why),
                (None, phase) if phase != Phase::Serving => not_serving(signals, phase),
                (None, _) => TsoError::WorkerTimeout {
                    waited_ms: guc::extension_timeout_ms(),
                    what: "extend the timestamp window",
                },
            },
        }),
    }
}

/// Why the worker refuses (if it does) and its phase, in one read.
fn refusal_and_phase() -> (Option<String>, Phase) {
    let st = ORACLE.share();
    (st.refusal(), st.phase)
}

fn poke(signals: &Signals, blocked: &Blocked) {
    match blocked {
        Blocked::Exhausted => signals.request_extension(),
        Blocked::NotServing(_) => signals.wake_worker(),
    }
}

/// Sleep on the worker's condition variable until `poll` yields a value or
/// `tsoracle.extension_timeout_ms` passes (`Ok(None)`). Interrupts (cancel,
/// statement_timeout) are honoured while sleeping.
pub fn wait_for_worker<T>(
    signals: &Signals,
    poll: impl FnMut() -> Result<Option<T>, TsoError>,
) -> Result<Option<T>, TsoError> {
    wait_on(signals.condvar(), poll)
}

fn wait_on<T>(
    cv: *mut pg_sys::ConditionVariable,
    mut poll: impl FnMut() -> Result<Option<T>, TsoError>,
) -> Result<Option<T>, TsoError> {
    let timeout_ms = guc::extension_timeout_ms();
    let started = Instant::now();
    // SAFETY: `cv` is a condition variable of the `Signals` block, initialised with
    // ConditionVariableInit when the segment was created; MyProc, which the sleep queues,
    // is set for every backend that can run SQL.
    unsafe { pg_sys::ConditionVariablePrepareToSleep(cv) };
    let result = loop {
        match poll() {
            Ok(Some(v)) => break Ok(Some(v)),
            Ok(None) => {}
            Err(e) => break Err(e),
        }
        let left = timeout_ms - started.elapsed().as_millis() as i64;
        if left <= 0 {
            break Ok(None);
        }
        // Short sleeps: the worker may have been between lives when we poked it.
        // SAFETY: the condition variable prepared above. An interrupt raised while sleeping
        // unwinds through here as an error, and transaction abort cancels the sleep.
        unsafe { pg_sys::ConditionVariableTimedSleep(cv, left.min(50), pg_sys::PG_WAIT_EXTENSION) };
    };
    // SAFETY: no arguments; ends the sleep prepared above (a no-op if it already ended).
    unsafe { pg_sys::ConditionVariableCancelSleep() };
    result
}

/// Have the worker raise the durable high-water to at least `target_ms` (a fence with that
/// floor) and wait (bounded) until it has; the committed high-water afterwards.
pub fn seed(signals: &Signals, target_ms: u64) -> Result<u64, TsoError> {
    let mut last_phase = Phase::Starting;
    let done = wait_for_worker(signals, || {
        let st = ORACLE.share();
        last_phase = st.phase;
        if st.seeded_ms >= target_ms && st.phase == Phase::Serving {
            Ok(Some(st.allocator.high_water_ms()))
        } else {
            drop(st);
            signals.request_seed(target_ms);
            Ok(None)
        }
    })?;
    match done {
        Some(high_water) => Ok(high_water),
        None if last_phase != Phase::Serving => Err(not_serving(signals, last_phase)),
        None => Err(TsoError::WorkerTimeout {
            waited_ms: guc::extension_timeout_ms(),
            what: "persist the seed",
        }),
    }
}
