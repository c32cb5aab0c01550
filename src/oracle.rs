//! The caller's side of the oracle: take timestamps from the shared window, or wait
//! (bounded) for the worker when the window is exhausted or not yet fenced.
//!
//! Callers never write anything durable. In steady state a call is one compare-and-swap on
//! the shared window: no lock, no I/O.

use crate::clock::now_ms;
use crate::error::TsoError;
use crate::guc;
use crate::shmem::{self, Phase, Reply, Request, Signals, Ticket, ORACLE, QUEUE};
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
    let now = now_ms();
    match signals.window.try_grant(now, count) {
        Ok(first) => {
            signals.count_issued(count);
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
    let count = u32::try_from(count)
        .ok()
        .filter(|c| (1..=MAX_BATCH).contains(c))
        .ok_or_else(|| TsoError::InvalidArgument(format!("count must be between 1 and {MAX_BATCH}, got {count}")))?;

    let blocked = match try_grant(signals, count)? {
        Ok(first) => return Ok(first),
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
        Some(first) => Ok(first),
        None => Err(match last_block {
            Blocked::NotServing(phase) => not_serving(signals, phase),
            Blocked::Exhausted => TsoError::WorkerTimeout {
                waited_ms: guc::extension_timeout_ms(),
                what: "extend the timestamp window",
            },
        }),
    }
}

fn poke(signals: &Signals, blocked: &Blocked) {
    match blocked {
        Blocked::Exhausted => signals.request_extension(),
        Blocked::NotServing(_) => signals.wake_worker(),
    }
}

/// The retryable error for a phase in which nothing is served.
pub fn not_serving(signals: &Signals, phase: Phase) -> TsoError {
    let why = match phase {
        Phase::WaitingForExtension => format!(
            "CREATE EXTENSION tsoracle has not been run in database \"{}\" (tsoracle.database)",
            guc::database()
        ),
        Phase::OutdatedSchema => format!(
            "the tables in schema tsoracle of database \"{}\" do not match this version of the library; run ALTER EXTENSION tsoracle UPDATE",
            guc::database()
        ),
        Phase::Fencing => "the fence is running after a start, crash or promotion".to_string(),
        Phase::Starting if signals.worker_pid() == 0 => format!(
            "the tsoracle worker is not running; it starts when recovery ends and connects to database \"{}\" (tsoracle.database), which must exist: see the server log",
            guc::database()
        ),
        Phase::Starting => format!("the tsoracle worker is connecting to database \"{}\"", guc::database()),
        Phase::Serving => "the window is being re-fenced".to_string(),
    };
    TsoError::NotServing(why)
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
        unsafe { pg_sys::ConditionVariableTimedSleep(cv, left.min(50), pg_sys::PG_WAIT_EXTENSION) };
    };
    unsafe { pg_sys::ConditionVariableCancelSleep() };
    result
}

/// Like `wait_on`, but on this backend's own latch, which the worker sets when it has
/// answered our requests (PostgreSQL's synchronous replication waits the same way).
fn wait_on_latch<T>(mut poll: impl FnMut() -> Result<Option<T>, TsoError>) -> Result<Option<T>, TsoError> {
    let timeout_ms = guc::extension_timeout_ms();
    let started = Instant::now();
    loop {
        // Reset before looking, so an answer that lands after the look still wakes us.
        unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
        if let Some(v) = poll()? {
            return Ok(Some(v));
        }
        let left = timeout_ms - started.elapsed().as_millis() as i64;
        if left <= 0 {
            return Ok(None);
        }
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                left.min(50),
                pg_sys::PG_WAIT_EXTENSION,
            )
        };
        pg_sys::check_for_interrupts!();
    }
}

/// Hand `requests` to the worker as one unit (all in the same group commit) and wait for
/// its answers. Waiting is bounded by `tsoracle.extension_timeout_ms`; a caller that leaves
/// (timeout, cancel, disconnect) after the worker took its requests may lose their effect
/// (a gap), which is never given to anyone else.
pub fn submit(requests: &[Request]) -> Result<Vec<Reply>, TsoError> {
    let signals = shmem::signals()?;
    let my_latch = unsafe { pg_sys::MyLatch };
    let tickets = wait_on(signals.answers_condvar(), || {
        let tickets = QUEUE.exclusive().enqueue(requests, my_latch);
        if tickets.is_none() {
            signals.wake_worker();
        }
        Ok(tickets)
    })?
    .ok_or(TsoError::WorkerTimeout { waited_ms: guc::extension_timeout_ms(), what: "free a slot in its request queue" })?;
    signals.wake_worker();

    let mut pending = PendingTickets { tickets, answered: false };
    let replies = wait_on_latch(|| {
        {
            // Look under a shared lock, and poke the worker only for requests it has not
            // taken yet (it may have been between lives when we queued them).
            let queue = QUEUE.share();
            if !pending.tickets.iter().all(|&t| queue.is_answered(t)) {
                let untaken = pending.tickets.iter().any(|&t| queue.is_pending(t));
                drop(queue);
                if untaken {
                    signals.wake_worker();
                }
                return Ok(None);
            }
        }
        let mut queue = QUEUE.exclusive();
        let replies: Vec<Reply> = pending.tickets.iter().filter_map(|&t| queue.take_reply(t)).collect();
        Ok(Some(replies))
    })?;
    match replies {
        Some(replies) if replies.len() == requests.len() => {
            pending.answered = true;
            Ok(replies)
        }
        _ => {
            let maybe_done = pending.abandon();
            let phase = ORACLE.share().phase;
            Err(if maybe_done {
                TsoError::OutcomeUnknown(format!(
                    "timed out after {} ms waiting for the tsoracle worker to commit",
                    guc::extension_timeout_ms()
                ))
            } else if phase != Phase::Serving {
                not_serving(signals, phase)
            } else {
                TsoError::WorkerTimeout { waited_ms: guc::extension_timeout_ms(), what: "take the request" }
            })
        }
    }
}

/// Tickets a caller holds; dropped without an answer (error, cancel) they are abandoned.
struct PendingTickets {
    tickets: Vec<Ticket>,
    answered: bool,
}

impl PendingTickets {
    /// Give up the tickets; true if the worker may already have committed any of them.
    fn abandon(&mut self) -> bool {
        self.answered = true;
        let mut queue = QUEUE.exclusive();
        self.tickets.iter().fold(false, |maybe, &t| queue.abandon(t) | maybe)
    }
}

impl Drop for PendingTickets {
    fn drop(&mut self) {
        if !self.answered {
            self.abandon();
        }
    }
}
