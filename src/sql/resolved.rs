//! SQL surface of the resolved timestamp `R` (docs/resolved.md): `tso_resolved`,
//! `tso_wait_resolved`, `tso_resolved_status`. Every timestamp at or below `R` was issued to a
//! transaction that has ended — aborted, or committed and visible to every snapshot taken
//! after `R` was read — and no timestamp at or below it will be issued again. A consumer that
//! reads `R`, then (in a later statement) the rows with `ts <= R`, misses nothing.
//!
//! The holder slots are in shared memory (`shmem::holders`), a backend fills and clears its
//! own (`caller::holding`), and `R` is read by `caller::resolved`.

use crate::caller::holding::held_by_me;
use crate::caller::resolved::current;
use crate::pg::clock;
use crate::pg::error::{OrReport, TsoError};
use crate::shmem;
use pgrx::prelude::*;
use std::time::Instant;
use tsoracle_core::timestamp;

/// The resolved timestamp: every timestamp at or below it was issued to a transaction that has
/// ended, and none at or below it will be issued again. Read it in a statement of its own,
/// then the rows with `ts <= R` in a later one.
#[pg_extern(volatile, parallel_unsafe)]
fn tso_resolved() -> i64 {
    current().map(timestamp::to_sql).or_report()
}

/// Wait until the resolved timestamp reaches `ts`, at most `timeout_ms`; returns it (below
/// `ts` only when the timeout passed). Cancellable.
#[pg_extern(volatile, parallel_unsafe)]
fn tso_wait_resolved(ts: i64, timeout_ms: i32) -> i64 {
    wait(ts, timeout_ms).map(timestamp::to_sql).or_report()
}

fn wait(ts: i64, timeout_ms: i32) -> Result<u64, TsoError> {
    let target = timestamp::from_sql(ts).map_err(|_| {
        TsoError::InvalidArgument(format!("{ts} is not a tsoracle timestamp (it is negative)"))
    })?;
    let timeout = u64::try_from(timeout_ms).map_err(|_| {
        TsoError::InvalidArgument(format!("timeout_ms must not be negative, got {timeout_ms}"))
    })?;
    if let Some(mine) = held_by_me().filter(|&mine| mine <= target) {
        return Err(TsoError::WaitOnItself(mine));
    }
    let started = Instant::now();
    loop {
        let r = current()?;
        if r >= target || started.elapsed().as_millis() as u64 >= timeout {
            return Ok(r);
        }
        let left = timeout.saturating_sub(started.elapsed().as_millis() as u64).clamp(1, 5);
        // SAFETY: waiting on this backend's own latch; with WL_EXIT_ON_PM_DEATH the process
        // exits if the postmaster dies.
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                left as std::ffi::c_long,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
        pg_sys::check_for_interrupts!();
    }
}

/// One row about the resolved timestamp: `R`, how far it lags the last issued value, what
/// was last published to standbys, and the oldest holder (the transaction holding `R` back).
// pgrx derives the result columns from the signature: the TableIterator type is spelled inline.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
fn tso_resolved_status() -> TableIterator<
    'static,
    (
        name!(resolved, Option<i64>),
        name!(lag_ms, Option<i64>),
        name!(holders, i32),
        name!(oldest_holder_pid, Option<i32>),
        name!(oldest_holder_ts, Option<i64>),
        name!(oldest_holder_since, Option<TimestampWithTimeZone>),
        name!(published, Option<i64>),
        name!(published_at_ms, Option<i64>),
    ),
> {
    let signals = shmem::signals().or_report();
    // SAFETY: as in `current`.
    let standby = unsafe { pg_sys::RecoveryInProgress() };
    let r = current().ok();
    let last = signals.window.last_issued();
    let lag = match (r, last) {
        (Some(r), Some(last)) if !standby => {
            Some(timestamp::physical_ms(last).saturating_sub(timestamp::physical_ms(r)) as i64)
        }
        _ => None,
    };
    let (holders, oldest) = crate::shmem::holders::oldest_hold();
    // When it began to hold: its age on the monotonic clock, back from the wall clock now (not
    // the millisecond of its value, which runs ahead of the clock after a seed, a step back or
    // at max_lead_ms, and by the skew on a member).
    let now = clock::sample();
    let since = oldest.map(|o| clock::wall_ms_at(now, o.since_mono_ms)).and_then(|ms| {
        TimestampWithTimeZone::try_from((ms as i64) * 1000 - 946_684_800_000_000).ok()
    });
    let (published, published_at) = signals.published_resolved();
    TableIterator::once((
        r.map(timestamp::to_sql),
        lag,
        holders,
        oldest.map(|o| o.pid),
        oldest.map(|o| timestamp::to_sql(o.ts)),
        since,
        (published > 0).then(|| timestamp::to_sql(published)),
        (published_at > 0).then_some(published_at as i64),
    ))
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::*;
    use crate::pg::testing::sqlstate_of;
    use pgrx::PgSqlErrorCode::*;

    fn next() -> i64 {
        Spi::get_one::<i64>("SELECT tso_next()").unwrap().unwrap()
    }

    /// The test runs in one transaction, which holds what it takes: R stays below it.
    #[pg_test]
    fn r_stays_below_what_this_transaction_holds() {
        let mine = next();
        let later = next();
        let r = tso_resolved();
        assert!(r < mine, "R {r} passed {mine}, held by this open transaction");
        assert!(tso_resolved() >= r, "R never goes down");
        assert!(later > mine);
        let (holders, pid, oldest) = Spi::get_three::<i32, i32, i64>(
            "SELECT holders, oldest_holder_pid, oldest_holder_ts FROM tso_resolved_status()",
        )
        .unwrap();
        assert!(holders.unwrap() >= 1);
        // SAFETY: a plain read of this process's pid.
        let me = unsafe { pg_sys::MyProcPid };
        let oldest = oldest.unwrap();
        assert!(oldest <= mine, "the oldest holder's value {oldest} is at or below {mine}");
        if oldest == mine || pid == Some(me) {
            assert_eq!(pid, Some(me));
        }
    }

    #[pg_test]
    fn waiting_on_itself_and_bad_arguments_are_refused() {
        let mine = next();
        assert_eq!(
            sqlstate_of(move || tso_wait_resolved(mine, 100)),
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
        );
        assert_eq!(sqlstate_of(|| tso_wait_resolved(-1, 0)), ERRCODE_INVALID_PARAMETER_VALUE);
        assert_eq!(sqlstate_of(|| tso_wait_resolved(0, -1)), ERRCODE_INVALID_PARAMETER_VALUE);
        // Below what this transaction holds: R is already there.
        assert!(tso_wait_resolved(0, 0) >= 0);
    }

    #[pg_test(error = "only the tsoracle worker writes table tsoracle.resolved")]
    fn only_the_worker_writes_the_published_r() {
        Spi::run("UPDATE tsoracle.resolved SET ts = 9223372036854775807").unwrap();
    }
}
