//! The fleet-wide resolved timestamp `R_f` (docs/fleet.md), on the oracle of a fleet:
//! `tso_fleet_resolved()`, `tso_fleet_status()`, `tso_fleet_remove()`, `tso_fleet_admit()`, and
//! `tsoracle.member_report()`, through which each member's worker reports its own `R`.

use crate::caller::{fleet, resolved::fleet_current};
use crate::pg::error::{check_superuser, OrReport, TsoError};
use crate::shmem::fleet::{MemberSlot, Slots, FLEET};
use crate::shmem::ORACLE;
use pgrx::prelude::*;
use std::ffi::CStr;
use tsoracle_core::timestamp;

/// `R_f`: every transaction of any cluster of the fleet that obtained a value at or below it
/// has ended, and no cluster will obtain one again. On the oracle and its hot standbys.
#[pg_extern(volatile, parallel_unsafe)]
fn tso_fleet_resolved() -> i64 {
    fleet_current().map(timestamp::to_sql).or_report()
}

/// Remove member `system_id` from the fleet (superusers only): it then no longer holds
/// `R_f`. Refused while the member is connected; `false` when there was no such member.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn tso_fleet_remove(system_id: i64) -> bool {
    check_superuser("remove a member from the fleet")
        .and_then(|()| fleet::remove(system_id as u64))
        .or_report()
}

/// Re-admit member `system_id`, removed before by `tso_fleet_remove()` (superusers only): its
/// next connection registers it anew. Or release its entry, held after a run took it over
/// without proving the run before it ended (docs/operations/fleet/take-back.md). `false`
/// when it is neither.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn tso_fleet_admit(system_id: i64) -> bool {
    check_superuser("re-admit a member to the fleet")
        .and_then(|()| fleet::admit(system_id as u64))
        .or_report()
}

fn role_name(oid: u32) -> String {
    // SAFETY: a syscache lookup; with noerr = true a dropped role gives NULL, copied at once.
    unsafe {
        let name = pg_sys::GetUserNameFromId(pg_sys::Oid::from(oid), true);
        if name.is_null() {
            format!("role {oid}")
        } else {
            CStr::from_ptr(name).to_string_lossy().into_owned()
        }
    }
}

fn at(ms: u64) -> Option<TimestampWithTimeZone> {
    (ms > 0)
        .then(|| {
            TimestampWithTimeZone::try_from(
                ms as i64 * 1000 - super::timestamps::PG_EPOCH_OFFSET_US,
            )
            .ok()
        })
        .flatten()
}

type StatusRow = (
    i64,
    String,
    i64,
    Option<i64>,
    Option<i32>,
    bool,
    bool,
    Option<i32>,
    Option<TimestampWithTimeZone>,
    Option<TimestampWithTimeZone>,
);

/// The members as the oracle's shared memory has them (on the primary).
fn status_rows() -> Vec<StatusRow> {
    let fleet = FLEET.share().copy();
    // A removed member holds nothing: it is not listed (tsoracle.fleet_member has it).
    let members: Vec<MemberSlot> = fleet.used().filter(|m| m.holds()).copied().collect();
    let entries: Vec<_> = members.iter().map(MemberSlot::entry).collect();
    let signals = crate::shmem::signals().ok();
    let own =
        signals.and_then(|s| crate::shmem::holders::primary_resolved(s).ok()).unwrap_or(u64::MAX);
    let holding = tsoracle_core::fleet::holding(own, &entries);
    let newest = signals.and_then(|s| s.window.last_issued());
    members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let lag = newest.map(|n| {
                timestamp::physical_ms(n).saturating_sub(timestamp::physical_ms(m.resolved)) as i64
            });
            (
                m.system_id as i64,
                role_name(m.role),
                m.resolved as i64,
                lag,
                (m.held_by_pid != 0).then_some(m.held_by_pid),
                holding == Some(i),
                m.persisted,
                (m.session_pid != 0).then_some(m.session_pid),
                at(m.registered_ms),
                at(m.reported_ms),
            )
        })
        .collect()
}

/// The members as the replayed table has them (on a hot standby of the oracle).
fn standby_rows() -> Result<Vec<StatusRow>, TsoError> {
    Spi::connect(|client| {
        let rows = client.select(
            "SELECT m.system_id, COALESCE(r.rolname::pg_catalog.text, m.role::pg_catalog.text), m.resolved, m.held_by_pid, \
                    m.resolved OPERATOR(pg_catalog.=) (SELECT pg_catalog.min(resolved) FROM tsoracle.fleet_member WHERE removed_at IS NULL), \
                    m.registered_at, m.reported_at \
             FROM tsoracle.fleet_member m LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) m.role \
             WHERE m.removed_at IS NULL ORDER BY m.system_id",
            None,
            &[],
        )?;
        let mut out = Vec::new();
        for row in rows {
            out.push((
                row.get::<i64>(1)?.unwrap_or(0),
                row.get::<String>(2)?.unwrap_or_default(),
                row.get::<i64>(3)?.unwrap_or(0),
                None,
                row.get::<i32>(4)?,
                row.get::<bool>(5)?.unwrap_or(false),
                true,
                None,
                row.get::<TimestampWithTimeZone>(6)?,
                row.get::<TimestampWithTimeZone>(7)?,
            ));
        }
        Ok::<_, pgrx::spi::Error>(out)
    })
    .map_err(|e| TsoError::Internal(format!("could not read tsoracle.fleet_member: {e}")))
}

/// One row per member of the fleet: its resolved timestamp as last reported, how far it lags
/// the oracle's newest value, the process on the member holding it back, whether it is the
/// one holding `R_f`, and when it last reported. What an operator reads to find the idle
/// transaction on a far cluster that holds the whole fleet up. No row on a member.
// pgrx derives the result columns from the signature: the TableIterator type is spelled inline.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_safe)]
fn tso_fleet_status() -> TableIterator<
    'static,
    (
        name!(system_id, i64),
        name!(role, String),
        name!(resolved, i64),
        name!(lag_ms, Option<i64>),
        name!(held_by_pid, Option<i32>),
        name!(holds_fleet, bool),
        name!(durable, bool),
        name!(session_pid, Option<i32>),
        name!(registered_at, Option<TimestampWithTimeZone>),
        name!(reported_at, Option<TimestampWithTimeZone>),
    ),
> {
    if crate::pg::guc::is_member() {
        return TableIterator::new(Vec::new());
    }
    // SAFETY: RecoveryInProgress may be called by any backend at any time.
    let rows = if unsafe { pg_sys::RecoveryInProgress() } {
        standby_rows().or_report()
    } else {
        status_rows()
    };
    TableIterator::new(rows)
}

#[pg_schema]
mod tsoracle {
    use crate::caller::fleet;
    use crate::pg::error::{refuse_in_parallel_mode, OrReport};
    use pgrx::prelude::*;

    /// A member's report of its own resolved timestamp and of the process holding it there
    /// (0: none); answers the oracle's epoch.
    #[pg_extern(volatile, parallel_unsafe, strict)]
    fn member_report(resolved: i64, held_by_pid: i32) -> i64 {
        refuse_in_parallel_mode("tsoracle.member_report()")
            .and_then(|()| fleet::report(resolved.max(0) as u64, held_by_pid))
            .or_report();
        super::ORACLE.share().allocator.epoch().unwrap_or(0) as i64
    }
}
