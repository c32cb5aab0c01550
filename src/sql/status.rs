//! `tso_status()`: one row that says what the oracle on this server is doing. Its columns
//! are part of every released version's SQL (the library serves them all): add a new
//! function rather than a column.

use crate::pg::error::OrReport;
use crate::shmem::{self, Phase, LEASE_BOUNDS, ORACLE, QUEUE};
use pgrx::prelude::*;
use std::sync::atomic::Ordering;
use tsoracle_core::timestamp;

/// The row, field by field (docs/reference/status.md documents each column).
struct Status {
    role: &'static str,
    state: String,
    detail: Option<String>,
    epoch: Option<i64>,
    timeline: Option<i64>,
    high_water_ms: Option<i64>,
    floor_ms: Option<i64>,
    last_issued: Option<i64>,
    window_left_ms: Option<i64>,
    timestamps_issued: i64,
    window_extensions: i64,
    fences: i64,
    last_fence_ms: Option<f64>,
    promotion_to_first_ts_ms: Option<i64>,
    worker_pid: Option<i32>,
    worker_commits: i64,
    group_commits: i64,
    grouped_requests: i64,
    live_leases: i64,
    sync_replication: bool,
}

impl Status {
    fn read() -> Status {
        let signals = shmem::signals().or_report();
        let st = *ORACLE.share();
        let header = QUEUE.share().or_report().header();
        let first_grant_ms = signals.first_grant_ms.load(Ordering::Relaxed);
        let worker_pid = signals.worker_pid();
        // SAFETY: RecoveryInProgress may be called by any backend at any time: it reads the
        // recovery state from XLogCtl in shared memory and caches it in a process-local flag.
        let standby = unsafe { pg_sys::RecoveryInProgress() };
        let mut status = Status {
            role: "primary",
            state: st.phase.as_str().to_string(),
            detail: None,
            epoch: None,
            timeline: (st.timeline > 0).then_some(i64::from(st.timeline)),
            high_water_ms: None,
            floor_ms: None,
            last_issued: signals.window.last_issued().map(timestamp::to_sql),
            window_left_ms: None,
            timestamps_issued: crate::shmem::holders::timestamps_issued() as i64,
            window_extensions: st.window_extensions as i64,
            fences: st.fences as i64,
            last_fence_ms: (st.fences > 0).then_some(st.last_fence_us as f64 / 1000.0),
            promotion_to_first_ts_ms: (st.last_fence_promoted && first_grant_ms > 0)
                .then(|| first_grant_ms.saturating_sub(st.worker_started_ms) as i64),
            worker_pid: (worker_pid != 0).then_some(worker_pid),
            worker_commits: st.worker_commits as i64,
            group_commits: header.group_commits as i64,
            grouped_requests: header.grouped_requests as i64,
            live_leases: LEASE_BOUNDS.share().live as i64,
            sync_replication: crate::pg::replica::sync_replication_configured(),
        };
        if standby {
            // A standby serves nothing; show what it has replayed.
            status.role = "standby";
            status.state = "standby".into();
            status.detail = crate::pg::replica::primary_hint();
            status.timeline = Some(i64::from(crate::pg::replica::replay_timeline()));
            status.high_water_ms = replayed_high_water();
            status.last_issued = None;
            status.last_fence_ms = None;
            status.promotion_to_first_ts_ms = None;
            status.worker_pid = None;
            return status;
        }
        if crate::pg::guc::is_member() {
            // A member issues nothing of its own: its values come from the oracle.
            let (epoch, fetched) = {
                let member = crate::shmem::member::MEMBER.share();
                (member.oracle_epoch, member.values_fetched)
            };
            status.role = "member";
            status.epoch = (epoch > 0).then_some(epoch as i64);
            status.timestamps_issued = fetched as i64;
            status.detail = Some(match st.phase {
                Phase::Serving => super::fleet::member_summary(),
                phase => format!(
                    "{}: {}",
                    super::fleet::member_summary(),
                    shmem::not_serving(signals, phase)
                ),
            });
            return status;
        }
        if st.allocator.is_serving() {
            // The allocator's bookkeeping, brought up to what the lock-free window has issued.
            let mut allocator = st.allocator;
            allocator.observe_issued(signals.window.next_ts());
            status.epoch = allocator.epoch().map(|e| e as i64);
            status.high_water_ms = Some(allocator.high_water_ms() as i64);
            status.floor_ms = Some(allocator.floor_ms() as i64);
            status.window_left_ms =
                Some(allocator.window_left_ms(crate::pg::clock::now_ms()) as i64);
        }
        status.detail = match st.phase {
            Phase::Serving => st.refusal(),
            phase => Some(shmem::not_serving(signals, phase).to_string()),
        };
        status
    }
}

/// One row describing the oracle on this server.
#[pg_extern]
// pgrx derives the result columns from the signature: the TableIterator type is spelled inline.
#[allow(clippy::type_complexity)]
fn tso_status() -> TableIterator<
    'static,
    (
        name!(role, String),
        name!(state, String),
        name!(detail, Option<String>),
        name!(epoch, Option<i64>),
        name!(timeline, Option<i64>),
        name!(high_water_ms, Option<i64>),
        name!(floor_ms, Option<i64>),
        name!(last_issued, Option<i64>),
        name!(window_left_ms, Option<i64>),
        name!(timestamps_issued, i64),
        name!(window_extensions, i64),
        name!(fences, i64),
        name!(last_fence_ms, Option<f64>),
        name!(promotion_to_first_ts_ms, Option<i64>),
        name!(worker_pid, Option<i32>),
        name!(worker_commits, i64),
        name!(group_commits, i64),
        name!(grouped_requests, i64),
        name!(live_leases, i64),
        name!(sync_replication, bool),
    ),
> {
    let s = Status::read();
    TableIterator::once((
        s.role.to_string(),
        s.state,
        s.detail.map(crate::pg::guc::shown),
        s.epoch,
        s.timeline,
        s.high_water_ms,
        s.floor_ms,
        s.last_issued,
        s.window_left_ms,
        s.timestamps_issued,
        s.window_extensions,
        s.fences,
        s.last_fence_ms,
        s.promotion_to_first_ts_ms,
        s.worker_pid,
        s.worker_commits,
        s.group_commits,
        s.grouped_requests,
        s.live_leases,
        s.sync_replication,
    ))
}

/// One row about the clocks: the server's wall clock, the reference clock the lead cap is
/// measured against (docs/allocator.md, "Clock steps"), the steps the worker has seen, and
/// how long issuing may go on without another confirmed commit. Added in 0.3.0 (a new
/// function rather than new columns of `tso_status()`).
#[pg_extern]
// pgrx derives the result columns from the signature: the TableIterator type is spelled inline.
#[allow(clippy::type_complexity)]
fn tso_clock() -> TableIterator<
    'static,
    (
        name!(wall_ms, i64),
        name!(reference_ms, Option<i64>),
        name!(reference_lead_ms, Option<i64>),
        name!(issued_lead_ms, Option<i64>),
        name!(steps_back, i64),
        name!(steps_forward, i64),
        name!(last_step_ms, Option<i64>),
        name!(serve_left_ms, Option<i64>),
    ),
> {
    let signals = shmem::signals().or_report();
    let now = crate::pg::clock::sample();
    let st = *ORACLE.share();
    // SAFETY: as in Status::read.
    let standby = unsafe { pg_sys::RecoveryInProgress() };
    let started = st.clock.is_started() && !standby;
    let wall = now.wall_ms as i64;
    let issued_lead = signals
        .window
        .last_issued()
        .filter(|_| !standby)
        .map(|ts| timestamp::physical_ms(ts) as i64 - wall);
    TableIterator::once((
        wall,
        started.then(|| st.clock.reference_ms() as i64),
        started.then(|| st.clock.lead_ms() as i64),
        issued_lead,
        st.clock.steps_back() as i64,
        st.clock.steps_forward() as i64,
        (st.clock.last_step_ms() != 0).then(|| st.clock.last_step_ms()),
        (!standby && st.phase == Phase::Serving).then(|| signals.serve_left_ms(now) as i64),
    ))
}

/// On a standby: the high-water replayed from the primary, if this database has the table.
/// (Read-only SPI: `Spi::get_one` would ask for a transaction id, which a standby refuses.)
fn replayed_high_water() -> Option<i64> {
    Spi::connect(|client| {
        let present = client
            .select("SELECT pg_catalog.to_regclass('tsoracle.high_water') IS NOT NULL", None, &[])?
            .first()
            .get_one::<bool>()?;
        if present != Some(true) {
            return Ok(None);
        }
        client
            .select("SELECT physical_ms FROM ONLY tsoracle.high_water WHERE id", None, &[])?
            .first()
            .get_one::<i64>()
    })
    .ok()
    .flatten()
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn tso_clock_shows_both_clocks_and_the_gate() {
        Spi::get_one::<i64>("SELECT tso_next()").unwrap();
        let row = Spi::get_two::<i64, i64>(
            "SELECT wall_ms - (extract(epoch FROM clock_timestamp()) * 1000)::bigint, serve_left_ms FROM tso_clock()",
        )
        .unwrap();
        let (skew, left) = (row.0.unwrap(), row.1.unwrap());
        assert!(skew.abs() < 1_000, "wall_ms is the server's clock ({skew} ms off)");
        let window = crate::pg::guc::window_ahead_ms() as i64;
        assert!(left > 0 && left <= window, "serve_left_ms {left} within (0, {window}]");
        let (reference, lead) = Spi::get_two::<i64, i64>(
            "SELECT reference_ms - wall_ms, reference_lead_ms FROM tso_clock()",
        )
        .unwrap();
        assert!(reference.unwrap() >= -1_000, "the reference is not behind the wall clock");
        assert!(lead.unwrap() >= 0);
        let issued = Spi::get_one::<i64>("SELECT issued_lead_ms FROM tso_clock()").unwrap();
        let max_lead = crate::pg::guc::max_lead_ms() as i64;
        assert!(issued.unwrap() <= lead.unwrap() + max_lead, "within the lead cap");
    }
}
