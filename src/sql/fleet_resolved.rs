//! The fleet-wide resolved timestamp `R_f` (docs/fleet.md), on the oracle of a fleet:
//! `tso_fleet_resolved()`, `tso_fleet_status()`, `tso_fleet_remove()`, `tso_fleet_admit()`, and
//! `tsoracle.member_report()`, through which each member's worker reports its own `R`.

use crate::caller::fleet::{self, role_name};
use crate::caller::resolved::fleet_current;
use crate::pg::error::{check_superuser, OrReport, TsoError};
use crate::shmem::fleet::{MemberSlot, Slots, FLEET};
use crate::shmem::ORACLE;
use pgrx::prelude::*;
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

/// Admit cluster `system_id` to the fleet, bound to the role it logs in as (superusers only):
/// a hello from any cluster not admitted, or under another role, is refused. Kept in
/// `tsoracle.fleet_admission` when the caller commits; a member bound to another role before
/// is bound to this one from its next hello, and a removed one is re-admitted. `false` when
/// nothing changed.
#[pg_extern(volatile, parallel_unsafe, strict, name = "tso_fleet_admit")]
fn tso_fleet_admit_as(system_id: i64, member_role: &str) -> bool {
    check_superuser("admit a member to the fleet")
        .and_then(|()| refuse_on_a_member())
        .and_then(|()| fleet::role_oid(member_role))
        .and_then(|role| fleet::admit_as(system_id as u64, role))
        .or_report()
}

/// `tso_fleet_admit(system_id, member_role regrole)`: the same, the role given as a `regrole`
/// (`'member_a'::regrole`; a quoted literal alone calls the `text` one).
#[pg_extern(
    volatile,
    parallel_unsafe,
    strict,
    name = "tso_fleet_admit",
    sql = r#"
CREATE  FUNCTION "tso_fleet_admit"(
	"system_id" bigint, /* i64 */
	"member_role" regrole /* pg_sys::Oid */
) RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'tso_fleet_admit_role_wrapper';
"#
)]
fn tso_fleet_admit_role(system_id: i64, member_role: pg_sys::Oid) -> bool {
    check_superuser("admit a member to the fleet")
        .and_then(|()| refuse_on_a_member())
        .and_then(|()| fleet::existing_role(member_role))
        .and_then(|()| fleet::admit_as(system_id as u64, member_role))
        .or_report()
}

fn refuse_on_a_member() -> Result<(), TsoError> {
    if crate::pg::guc::is_member() {
        return Err(TsoError::NotOnAMember("tso_fleet_admit()"));
    }
    Ok(())
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
    Option<i64>,
    Option<i64>,
    Option<i32>,
    bool,
    bool,
    Option<i32>,
    bool,
    Option<TimestampWithTimeZone>,
    Option<TimestampWithTimeZone>,
    Option<TimestampWithTimeZone>,
);

/// The admissions: each cluster's system identifier, role and when it was admitted.
fn admissions() -> Result<Vec<(i64, u32, Option<TimestampWithTimeZone>)>, TsoError> {
    Spi::connect(|client| {
        let rows = client.select(
            "SELECT system_id, role::pg_catalog.int8, admitted_at FROM ONLY tsoracle.fleet_admission",
            None,
            &[],
        )?;
        let mut out = Vec::new();
        for row in rows {
            out.push((
                row.get::<i64>(1)?.unwrap_or(0),
                row.get::<i64>(2)?.unwrap_or(0) as u32,
                row.get::<TimestampWithTimeZone>(3)?,
            ));
        }
        Ok::<_, pgrx::spi::Error>(out)
    })
    .map_err(|e| TsoError::Internal(format!("could not read tsoracle.fleet_admission: {e}")))
}

/// The members as the oracle's shared memory has them (on the primary), and the clusters
/// admitted that never registered.
fn status_rows() -> Result<Vec<StatusRow>, TsoError> {
    let admitted = admissions()?;
    let fleet = FLEET.share().copy();
    // A removed member holds nothing: it is not listed (tsoracle.fleet_member has it).
    let members: Vec<MemberSlot> = fleet.used().filter(|m| m.holds()).copied().collect();
    let entries: Vec<_> = members.iter().map(MemberSlot::entry).collect();
    let signals = crate::shmem::signals().ok();
    let own =
        signals.and_then(|s| crate::shmem::holders::primary_resolved(s).ok()).unwrap_or(u64::MAX);
    let holding = tsoracle_core::fleet::holding(own, &entries);
    let newest = signals.and_then(|s| s.window.last_issued());
    // By identity: up to tsoracle.max_members rows each (10,000), looked up once per row.
    let by_id: std::collections::HashMap<u64, &(i64, u32, Option<TimestampWithTimeZone>)> =
        admitted.iter().map(|a| (a.0 as u64, a)).collect();
    let admission = |id: u64| by_id.get(&id).copied();
    let slotted: std::collections::HashSet<u64> = fleet.used().map(|m| m.system_id).collect();
    let mut rows: Vec<StatusRow> = members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let lag = newest.map(|n| {
                timestamp::physical_ms(n).saturating_sub(timestamp::physical_ms(m.resolved)) as i64
            });
            let a = admission(m.system_id);
            // The session only while its process lives (its exit clears it; this also
            // covers an exit that could not).
            let session =
                (m.session_pid != 0 && fleet::alive(m.session_pid)).then_some(m.session_pid);
            (
                m.system_id as i64,
                role_name(a.map_or(m.role, |a| a.1)),
                Some(m.resolved as i64),
                lag,
                (m.held_by_pid != 0).then_some(m.held_by_pid),
                holding == Some(i),
                m.persisted,
                session,
                session.is_some(),
                a.and_then(|a| a.2),
                at(m.registered_ms),
                at(m.reported_ms),
            )
        })
        .collect();
    // Admitted, never registered (or re-admitted since): listed, holding nothing.
    for (id, role, admitted_at) in &admitted {
        if !slotted.contains(&(*id as u64)) {
            rows.push((
                *id,
                role_name(*role),
                None,
                None,
                None,
                false,
                false,
                None,
                false,
                *admitted_at,
                None,
                None,
            ));
        }
    }
    rows.sort_by_key(|r| r.0);
    Ok(rows)
}

/// The members as the replayed tables have them (on a hot standby of the oracle).
fn standby_rows() -> Result<Vec<StatusRow>, TsoError> {
    Spi::connect(|client| {
        let rows = client.select(
            "SELECT COALESCE(m.system_id, a.system_id), \
                    COALESCE(r.rolname::pg_catalog.text, COALESCE(a.role, m.role)::pg_catalog.text), \
                    m.resolved, m.held_by_pid, \
                    COALESCE(m.resolved OPERATOR(pg_catalog.=) (SELECT pg_catalog.min(resolved) FROM ONLY tsoracle.fleet_member WHERE removed_at IS NULL), false), \
                    m.system_id IS NOT NULL, a.admitted_at, m.registered_at, m.reported_at \
             FROM ONLY tsoracle.fleet_admission a \
             FULL JOIN ONLY tsoracle.fleet_member m ON m.system_id OPERATOR(pg_catalog.=) a.system_id \
             LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) COALESCE(a.role, m.role) \
             WHERE m.removed_at IS NULL ORDER BY 1",
            None,
            &[],
        )?;
        let mut out = Vec::new();
        for row in rows {
            out.push((
                row.get::<i64>(1)?.unwrap_or(0),
                row.get::<String>(2)?.unwrap_or_default(),
                row.get::<i64>(3)?,
                None,
                row.get::<i32>(4)?,
                row.get::<bool>(5)?.unwrap_or(false),
                row.get::<bool>(6)?.unwrap_or(false),
                None,
                false,
                row.get::<TimestampWithTimeZone>(7)?,
                row.get::<TimestampWithTimeZone>(8)?,
                row.get::<TimestampWithTimeZone>(9)?,
            ));
        }
        Ok::<_, pgrx::spi::Error>(out)
    })
    .map_err(|e| TsoError::Internal(format!("could not read tsoracle.fleet_member: {e}")))
}

/// The schema of this database is the library's: before `ALTER EXTENSION tsoracle UPDATE` the
/// function is declared with the columns of 0.5.0, which these rows do not fit.
fn check_schema() -> Result<(), TsoError> {
    // Read-only SPI: `Spi::get_one` asks for a transaction id, which a hot standby refuses.
    let installed = Spi::connect(|client| {
        client
            .select(
                "SELECT (SELECT extversion::pg_catalog.text FROM pg_catalog.pg_extension \
                         WHERE extname OPERATOR(pg_catalog.=) 'tsoracle')",
                None,
                &[],
            )?
            .first()
            .get_one::<String>()
    })
    .map_err(|e| TsoError::Internal(format!("could not read pg_extension: {e}")))?
    .unwrap_or_default();
    if installed == crate::pg::EXTENSION_VERSION {
        return Ok(());
    }
    Err(TsoError::NotServing(format!(
        "the extension tsoracle in this database is at version {installed}, not {}, the version of the library; run ALTER EXTENSION tsoracle UPDATE",
        crate::pg::EXTENSION_VERSION
    )))
}

/// One row per member of the fleet: the role it is admitted for, its resolved timestamp as
/// last reported, how far it lags the oracle's newest value, the process on the member
/// holding it back, whether it is the one holding `R_f`, whether a session of it is
/// connected now, and when it was admitted, registered and last reported. A cluster admitted
/// that never registered is listed with no `resolved`. What an operator reads to find the
/// idle transaction on a far cluster that holds the whole fleet up. No row on a member.
// pgrx derives the result columns from the signature: the TableIterator type is spelled inline.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_safe)]
fn tso_fleet_status() -> TableIterator<
    'static,
    (
        name!(system_id, i64),
        name!(role, String),
        name!(resolved, Option<i64>),
        name!(lag_ms, Option<i64>),
        name!(held_by_pid, Option<i32>),
        name!(holds_fleet, bool),
        name!(durable, bool),
        name!(session_pid, Option<i32>),
        name!(connected, bool),
        name!(admitted_at, Option<TimestampWithTimeZone>),
        name!(registered_at, Option<TimestampWithTimeZone>),
        name!(reported_at, Option<TimestampWithTimeZone>),
    ),
> {
    if crate::pg::guc::is_member() {
        return TableIterator::new(Vec::new());
    }
    let rows = check_schema().and_then(|()| {
        // SAFETY: RecoveryInProgress may be called by any backend at any time.
        if unsafe { pg_sys::RecoveryInProgress() } {
            standby_rows()
        } else {
            status_rows()
        }
    });
    TableIterator::new(rows.or_report())
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
