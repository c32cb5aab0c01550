//! The SQL of a fleet (docs/fleet.md): on the oracle, the two functions a member's worker
//! calls (`tsoracle.member_hello`, `tsoracle.member_next`, executable by `tsoracle_member`
//! only); on a member, `tso_member_status()`.

use crate::caller::{fleet, window};
use crate::pg::error::{refuse_in_parallel_mode, TsoError};
use crate::pg::guc;
use crate::shmem::member::MEMBER;
use crate::shmem::ORACLE;
use pgrx::prelude::*;
use tsoracle_core::version::{oracle_speaks, Version};

fn refuse_on_a_member() -> Result<(), TsoError> {
    if guc::is_member() {
        return Err(TsoError::NotServing(
            "this server is itself a member of a fleet (tsoracle.oracle is set): a member must name the oracle, not another member".into(),
        ));
    }
    Ok(())
}

fn hello(
    member_system_id: i64,
    member_version: &str,
    member_resolved: i64,
) -> Result<(i64, String, i64), TsoError> {
    refuse_in_parallel_mode("tsoracle.member_hello()")?;
    window::ensure_primary("serve a member")?;
    refuse_on_a_member()?;
    let own = crate::pg::system_identifier();
    if member_system_id as u64 == own {
        return Err(TsoError::InvalidArgument(format!(
            "the member and the oracle are the same cluster (system identifier {own}): tsoracle.oracle must name another cluster"
        )));
    }
    // The run it speaks for rides after the version (`tsoracle_core::fleet::RunClaim`).
    let (member_version, claim) = tsoracle_core::fleet::RunClaim::parse(member_version);
    let own_version =
        Version::parse(crate::pg::EXTENSION_VERSION).map_err(TsoError::VersionSkew)?;
    let spoken = Version::parse(member_version)
        .and_then(|member| oracle_speaks(own_version, member))
        .map_err(TsoError::VersionSkew)?;
    // Registered (or found again) before it is served anything: R_f waits for it from now on.
    fleet::register(member_system_id as u64, member_resolved.max(0) as u64, claim)?;
    let epoch = ORACLE.share().allocator.epoch().unwrap_or(0);
    if spoken != own_version.protocol() {
        pgrx::log!(
            "tsoracle: member {member_system_id} runs tsoracle {member_version}: served at version {spoken} of the protocol"
        );
    }
    // The version this oracle speaks to the member: the member checks it is its own.
    Ok((own as i64, spoken.to_string(), epoch as i64))
}

fn next(count: i32) -> Result<(u64, u64), TsoError> {
    refuse_in_parallel_mode("tsoracle.member_next()")?;
    refuse_on_a_member()?;
    fleet::check_served()?;
    let first = window::next(i64::from(count))?;
    // The epoch of the window the values came from, or a later one (a fence in between): a
    // member refuses answers from epochs older than one it has seen.
    let epoch = ORACLE.share().allocator.epoch().unwrap_or(0);
    Ok((first, epoch))
}

fn epoch() -> i64 {
    ORACLE.share().allocator.epoch().unwrap_or(0) as i64
}

/// A member's blocks: each one's start, the oracle's epoch, and the key's incarnation.
fn seq(keys: Vec<String>, counts: Vec<i32>) -> Result<Vec<(i64, i64, i64)>, TsoError> {
    refuse_on_a_member()?;
    let blocks = if keys.len() == 1 && counts.len() == 1 {
        vec![super::sequences::advance(Some(&keys[0]), Some(counts[0]))?]
    } else {
        super::sequences::batch(
            Some(keys.into_iter().map(Some).collect()),
            Some(counts.into_iter().map(Some).collect()),
        )?
        .into_iter()
        .map(|(_, block, _)| block)
        .collect()
    };
    let e = epoch();
    Ok(blocks.into_iter().map(|b| (b.start, e, b.made)).collect())
}

type Lease = (i64, i64, i64, i64, i32, i64);

fn lease(g: super::leases::Grant) -> Lease {
    (g.lease_id, g.lower, g.upper, g.expires_at_ms, g.epoch, epoch())
}

/// Functions in schema tsoracle, next to the tables. Each answers with the oracle's epoch.
#[pg_schema]
mod tsoracle {
    use super::{lease, refuse_on_a_member, Lease};
    use crate::pg::error::{OrReport, TsoError};
    use pgrx::prelude::*;

    /// A member's `tso_seq()` or `tso_seq_batch()`: the blocks' starts, in the keys' order,
    /// each with the key's incarnation (`made`, 0.6.0: a member of 0.5.0 reads the first two
    /// columns only).
    #[allow(clippy::type_complexity)]
    #[pg_extern(volatile, parallel_unsafe, strict)]
    fn member_seq(
        keys: Vec<String>,
        counts: Vec<i32>,
    ) -> TableIterator<'static, (name!(start, i64), name!(epoch, i64), name!(made, i64))> {
        TableIterator::new(super::seq(keys, counts).or_report())
    }

    /// A member's `tso_seq_peek()`.
    #[pg_extern(volatile, parallel_unsafe, strict)]
    fn member_seq_peek(
        key: &str,
    ) -> TableIterator<'static, (name!(next, Option<i64>), name!(epoch, i64))> {
        let next = refuse_on_a_member().and_then(|()| super::super::sequences::peek(Some(key)));
        TableIterator::once((next.or_report(), super::epoch()))
    }

    /// A member's `tso_seq_drop()`.
    #[pg_extern(volatile, parallel_unsafe, strict)]
    fn member_seq_drop(
        key: &str,
    ) -> TableIterator<'static, (name!(dropped, bool), name!(epoch, i64))> {
        let dropped =
            refuse_on_a_member().and_then(|()| super::super::sequences::drop_key(Some(key)));
        TableIterator::once((dropped.or_report(), super::epoch()))
    }

    /// A member's lease grant (`legacy`: through the functions of 0.1.0 to 0.3.0).
    #[allow(clippy::type_complexity)]
    #[pg_extern(volatile, parallel_unsafe, strict)]
    fn member_lease_acquire(
        holder: &str,
        holder_epoch: i64,
        ttl_ms: i32,
        legacy: bool,
    ) -> TableIterator<
        'static,
        (
            name!(lease_id, i64),
            name!(ts_lower_bound, i64),
            name!(ts_upper_bound, i64),
            name!(expires_at_ms, i64),
            name!(lease_epoch, i32),
            name!(epoch, i64),
        ),
    > {
        let g: Result<Lease, TsoError> = refuse_on_a_member().and_then(|()| {
            super::super::leases::acquire(
                Some(holder),
                Some(holder_epoch),
                Some(ttl_ms),
                legacy,
                "tso_lease_acquire_bounds()",
            )
            .map(lease)
        });
        TableIterator::once(g.or_report())
    }

    /// A member's lease renewal.
    #[allow(clippy::type_complexity)]
    #[pg_extern(volatile, parallel_unsafe, strict)]
    fn member_lease_renew(
        id: i64,
        legacy: bool,
    ) -> TableIterator<
        'static,
        (
            name!(lease_id, i64),
            name!(ts_lower_bound, i64),
            name!(ts_upper_bound, i64),
            name!(expires_at_ms, i64),
            name!(lease_epoch, i32),
            name!(epoch, i64),
        ),
    > {
        let g: Result<Lease, TsoError> = refuse_on_a_member().and_then(|()| {
            super::super::leases::renew(id, legacy, "tso_lease_renew_bounds()").map(lease)
        });
        TableIterator::once(g.or_report())
    }

    /// A member's lease release.
    #[pg_extern(volatile, parallel_unsafe, strict)]
    fn member_lease_release(lease_id: i64) -> i64 {
        refuse_on_a_member().and_then(|()| super::super::leases::release(lease_id)).or_report();
        super::epoch()
    }

    /// A member's `tso_safe_frontier()`.
    #[pg_extern(volatile, parallel_unsafe)]
    fn member_safe_frontier() -> TableIterator<'static, (name!(frontier, i64), name!(epoch, i64))> {
        let f = refuse_on_a_member().and_then(|()| super::super::leases::safe_frontier());
        TableIterator::once((f.or_report(), super::epoch()))
    }

    /// A member's first call on a new connection: this oracle's system identifier, version and
    /// epoch, after checking that the member is another cluster of a compatible version and
    /// that this server is an oracle (a primary, not itself a member); registers the member
    /// (`member_resolved`: its own resolved timestamp, 0 if it has none yet).
    #[pg_extern(volatile, parallel_unsafe)]
    fn member_hello(
        member_system_id: i64,
        member_version: &str,
        member_resolved: i64,
    ) -> TableIterator<'static, (name!(system_id, i64), name!(version, String), name!(epoch, i64))>
    {
        TableIterator::once(
            super::hello(member_system_id, member_version, member_resolved).or_report(),
        )
    }

    /// `count` consecutive timestamps for a member's waiting calls, and the oracle's epoch:
    /// `{first, epoch}`. One value rather than a row: this is every round trip of every
    /// member, and a function in `FROM` costs the oracle's backend a function scan each time.
    #[pg_extern(volatile, parallel_unsafe)]
    fn member_next(count: i32) -> Vec<i64> {
        let (first, epoch) = super::next(count).or_report();
        vec![tsoracle_core::timestamp::to_sql(first), epoch as i64]
    }

    /// A member's round trip from 0.6.0 on (`member_next(count)` serves members of 0.5.0):
    /// the same answer as text, `{first,epoch}`, the bytes of that array's output, and only on
    /// the session whose hello named the member's connection `session` (the filter of the
    /// member's other statements, in the function): elsewhere NULL, having done nothing. An
    /// array's construction and output, and the filter's two function calls, were most of what
    /// a round trip cost the oracle beyond a `SELECT 1` (docs/benchmarks-fleet.md).
    #[pg_extern(volatile, parallel_unsafe, name = "member_next")]
    fn member_next_named(count: i32, session: &str) -> Option<String> {
        if !crate::pg::guc::member_session_is(session) {
            return None;
        }
        let (first, epoch) = super::next(count).or_report();
        Some(tsoracle_core::member::next_answer(first, epoch))
    }
}

/// On a member of a fleet, one row about its connection to the oracle; no row elsewhere.
// pgrx derives the result columns from the signature: the TableIterator type is spelled inline.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_safe)]
fn tso_member_status() -> TableIterator<
    'static,
    (
        name!(oracle, String),
        name!(connected, bool),
        name!(oracle_pid, Option<i32>),
        name!(oracle_epoch, Option<i64>),
        name!(connects, i64),
        name!(round_trips, i64),
        name!(calls_served, i64),
        name!(values_fetched, i64),
        name!(values_per_round_trip, Option<f64>),
        name!(mean_round_trip_ms, Option<f64>),
        name!(last_round_trip_ms, Option<f64>),
        name!(last_error, Option<String>),
        name!(last_error_at, Option<TimestampWithTimeZone>),
    ),
> {
    if !guc::is_member() {
        return TableIterator::new(Vec::new());
    }
    // Who may read tsoracle.oracle (SHOW's test, a catalog lookup) before the lock: the
    // member's worker takes it exclusively at every landing.
    let may_read = guc::may_read_oracle();
    // Read under the lock, not copied: the state holds the errors kept for callers (100 KB).
    let st = MEMBER.share();
    let per = |num: u64, den: u64| (den > 0).then(|| num as f64 / den as f64);
    let at = (st.last_error_ms > 0)
        .then(|| {
            TimestampWithTimeZone::try_from(
                st.last_error_ms as i64 * 1000 - super::timestamps::PG_EPOCH_OFFSET_US,
            )
            .ok()
        })
        .flatten();
    // The connection string, and what libpq and the oracle said through it, only for the
    // roles that may read tsoracle.oracle (SHOW's test): others see it blank.
    let oracle = if may_read { st.oracle.get().unwrap_or_default() } else { String::new() };
    let last_error = st.last_error.get();
    let row = (
        oracle,
        st.connected,
        (st.oracle_pid != 0).then_some(st.oracle_pid),
        (st.oracle_epoch > 0).then_some(st.oracle_epoch as i64),
        st.connects as i64,
        st.round_trips as i64,
        st.calls_served as i64,
        st.values_fetched as i64,
        per(st.values_fetched, st.round_trips),
        per(st.round_trip_us_total, st.round_trips.max(1) * 1000).filter(|_| st.round_trips > 0),
        (st.round_trips > 0).then(|| st.last_round_trip_us as f64 / 1000.0),
        last_error,
        at,
    );
    drop(st);
    // Redacted for the caller (libpq parses the connection string) after the lock.
    TableIterator::once((
        row.0,
        row.1,
        row.2,
        row.3,
        row.4,
        row.5,
        row.6,
        row.7,
        row.8,
        row.9,
        row.10,
        row.11.map(guc::shown),
        row.12,
    ))
}

/// A member's line for `tso_status().detail`: its oracle named only to a role that may read
/// `tsoracle.oracle` (the caller shows the whole line through `guc::shown`).
pub fn member_summary() -> String {
    let may_read = guc::may_read_oracle();
    let st = MEMBER.share();
    let rt = if st.round_trips > 0 {
        format!(
            ", {} round trips, {:.1} values per round trip, {:.2} ms per round trip",
            st.round_trips,
            st.values_fetched as f64 / st.round_trips as f64,
            st.round_trip_us_total as f64 / st.round_trips as f64 / 1000.0
        )
    } else {
        String::new()
    };
    let oracle = if may_read {
        format!("the oracle {}", st.oracle.get().unwrap_or_default())
    } else {
        "its oracle (tsoracle.oracle)".to_string()
    };
    format!("member of {oracle} ({}{rt})", if st.connected { "connected" } else { "not connected" })
}
