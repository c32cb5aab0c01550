//! SQL surface of leases and the safe frontier. A lease lets a holder stamp timestamps
//! itself, with physical_ms up to a bound the oracle has already made durable, until the
//! lease expires. Every mutation is a request to the worker (the only durable writer).

use crate::caller::requests::{check_storable, reply_error, submit};
use crate::caller::window::{ensure_primary, wait_for_worker};
use crate::pg::error::{refuse_in_parallel_mode, OrReport, TsoError};
use crate::pg::guc;
use crate::shmem::{
    self, not_serving, Phase, Reply, ReplyCode, Request, RequestKind, LEASE_BOUNDS, MAX_LEASES,
    ORACLE,
};
use pgrx::prelude::*;
use tsoracle_core::lease::{validate_holder, validate_ttl};

fn lease_error(reply: &Reply, lease_id: i64, holder: &str) -> TsoError {
    let what = if holder.is_empty() {
        format!("lease {lease_id}")
    } else {
        format!("lease holder \"{holder}\"")
    };
    if let Some(e) = reply_error(reply, &what) {
        return e;
    }
    match reply.code {
        ReplyCode::StaleHolderEpoch => TsoError::StaleLease(format!(
            "holder \"{holder}\" already holds a lease at a higher holder_epoch"
        )),
        ReplyCode::LeaseNotFound => TsoError::NotFound(format!("lease {lease_id} does not exist")),
        ReplyCode::LeaseNotRenewable => TsoError::StaleLease(format!(
            "lease {lease_id} is expired or superseded and cannot be renewed"
        )),
        ReplyCode::TooManyLeases => TsoError::TooManyLeases(MAX_LEASES),
        other => TsoError::Internal(format!("unexpected reply to a lease request: {other:?}")),
    }
}

fn one_reply(request: Request) -> Result<Reply, TsoError> {
    submit(&[request])?.first().copied().ok_or_else(|| TsoError::Internal("no reply".into()))
}

/// Acquire (or idempotently get back) the lease of `holder` at `holder_epoch`: the function
/// of 0.1.0 to 0.3.0, which tells no lowest stamp (its holder stamps from the server's clock
/// at the grant, `expires_at_ms - ttl_ms`). Kept for their SQL; `tso_lease_acquire_bounds`
/// is the one to use.
// pgrx derives the result columns from the signature: the TableIterator type is spelled inline.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
fn tso_lease_acquire(
    holder: Option<&str>,
    holder_epoch: Option<i64>,
    ttl_ms: Option<i32>,
) -> TableIterator<
    'static,
    (
        name!(lease_id, i64),
        name!(ts_upper_bound, i64),
        name!(expires_at_ms, i64),
        name!(epoch, i32),
    ),
> {
    let g = acquire(holder, holder_epoch, ttl_ms, true, "tso_lease_acquire()").or_report();
    TableIterator::once((g.lease_id, g.upper, g.expires_at_ms, g.epoch))
}

/// Acquire (or idempotently get back) the lease of `holder` at `holder_epoch`, with both
/// bounds: its holder stamps values whose physical part is in `[ts_lower_bound,
/// ts_upper_bound]`, until `expires_at_ms`. `ts_lower_bound` is above every resolved
/// timestamp handed out before the lease was granted, and the resolved timestamp stays below
/// it while this grant lives.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
fn tso_lease_acquire_bounds(
    holder: Option<&str>,
    holder_epoch: Option<i64>,
    ttl_ms: Option<i32>,
) -> TableIterator<
    'static,
    (
        name!(lease_id, i64),
        name!(ts_lower_bound, i64),
        name!(ts_upper_bound, i64),
        name!(expires_at_ms, i64),
        name!(epoch, i32),
    ),
> {
    let g = acquire(holder, holder_epoch, ttl_ms, false, "tso_lease_acquire_bounds()").or_report();
    TableIterator::once((g.lease_id, g.lower, g.upper, g.expires_at_ms, g.epoch))
}

/// What a grant or renewal gives the holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Grant {
    pub(super) lease_id: i64,
    pub(super) lower: i64,
    pub(super) upper: i64,
    pub(super) expires_at_ms: i64,
    pub(super) epoch: i32,
}

impl Grant {
    fn of(reply: &Reply, lease_id: i64) -> Grant {
        Grant {
            lease_id,
            lower: reply.from_ms,
            upper: reply.bound_ms,
            expires_at_ms: reply.expires_at_ms,
            epoch: reply.epoch as i32,
        }
    }
}

pub(super) fn acquire(
    holder: Option<&str>,
    holder_epoch: Option<i64>,
    ttl_ms: Option<i32>,
    legacy: bool,
    what: &'static str,
) -> Result<Grant, TsoError> {
    refuse_in_parallel_mode(what)?;
    let holder =
        holder.ok_or_else(|| TsoError::InvalidArgument("holder must not be NULL".into()))?;
    validate_holder(holder)?;
    check_storable(holder, "lease holder")?;
    let holder_epoch = holder_epoch
        .ok_or_else(|| TsoError::InvalidArgument("holder_epoch must not be NULL".into()))?;
    let ttl_ms =
        ttl_ms.ok_or_else(|| TsoError::InvalidArgument("ttl_ms must not be NULL".into()))?;
    let ttl = validate_ttl(i64::from(ttl_ms), guc::lease_ttl_min_ms(), guc::lease_ttl_max_ms())?;
    ensure_primary("grant leases")?;
    let request = Request::new(RequestKind::LeaseAcquire, holder, ttl).with_arg(holder_epoch);
    let reply = one_reply(if legacy { request.legacy() } else { request })?;
    match reply.code {
        ReplyCode::Ok => Ok(Grant::of(&reply, reply.value)),
        _ => Err(lease_error(&reply, 0, holder)),
    }
}

/// Re-arm a lease's TTL and advance its bound: the function of 0.1.0 to 0.3.0 (see
/// `tso_lease_acquire`); `tso_lease_renew_bounds` is the one to use.
// pgrx derives the result columns from the signature: the TableIterator type is spelled inline.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe, strict)]
fn tso_lease_renew(
    lease_id: i64,
) -> TableIterator<
    'static,
    (name!(ts_upper_bound, i64), name!(expires_at_ms, i64), name!(epoch, i32)),
> {
    let g = renew(lease_id, true, "tso_lease_renew()").or_report();
    TableIterator::once((g.upper, g.expires_at_ms, g.epoch))
}

/// Re-arm a lease's TTL and advance its bounds: from now on its holder stamps at or above the
/// new `ts_lower_bound`; what it stamped under the previous grant still holds the resolved
/// timestamp until that grant's own expiry.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe, strict)]
fn tso_lease_renew_bounds(
    lease_id: i64,
) -> TableIterator<
    'static,
    (
        name!(ts_lower_bound, i64),
        name!(ts_upper_bound, i64),
        name!(expires_at_ms, i64),
        name!(epoch, i32),
    ),
> {
    let g = renew(lease_id, false, "tso_lease_renew_bounds()").or_report();
    TableIterator::once((g.lower, g.upper, g.expires_at_ms, g.epoch))
}

pub(super) fn renew(lease_id: i64, legacy: bool, what: &'static str) -> Result<Grant, TsoError> {
    refuse_in_parallel_mode(what)?;
    ensure_primary("renew leases")?;
    let request = Request::new(RequestKind::LeaseRenew, "", 0).with_arg(lease_id);
    let reply = one_reply(if legacy { request.legacy() } else { request })?;
    match reply.code {
        ReplyCode::Ok => Ok(Grant::of(&reply, lease_id)),
        _ => Err(lease_error(&reply, lease_id, "")),
    }
}

/// Remove a lease from the frontier at once; idempotent.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn tso_lease_release(lease_id: i64) {
    release(lease_id).or_report()
}

pub(super) fn release(lease_id: i64) -> Result<(), TsoError> {
    refuse_in_parallel_mode("tso_lease_release()")?;
    ensure_primary("release leases")?;
    let reply = one_reply(Request::new(RequestKind::LeaseRelease, "", 0).with_arg(lease_id))?;
    match reply.code {
        ReplyCode::Ok => Ok(()),
        _ => Err(lease_error(&reply, lease_id, "")),
    }
}

/// The minimum of the committed high-water and the bound of every unexpired lease (active
/// or superseded), in physical ms. Errors like `tso_next()` on a standby or before the fence.
#[pg_extern(volatile, parallel_unsafe)]
fn tso_safe_frontier() -> i64 {
    safe_frontier().or_report()
}

pub(super) fn safe_frontier() -> Result<i64, TsoError> {
    let signals = shmem::signals()?;
    ensure_primary("compute the safe frontier")?;
    if crate::pg::guc::is_member() {
        return crate::caller::member::safe_frontier();
    }
    let mut phase = Phase::Starting;
    let high_water = wait_for_worker(signals, || {
        let st = ORACLE.share();
        phase = st.phase;
        Ok((st.phase == Phase::Serving).then(|| st.allocator.high_water_ms()))
    })?
    .ok_or_else(|| not_serving(signals, phase))?;
    Ok(LEASE_BOUNDS.share().frontier(high_water, crate::pg::clock::sample()) as i64)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::*;
    use crate::pg::clock::now_ms;
    use crate::pg::testing::{can_execute, sqlstate_of};
    use pgrx::PgSqlErrorCode::*;

    #[pg_test]
    fn acquire_is_durable_idempotent_and_above_the_high_water() {
        let before = ORACLE.share().allocator.high_water_ms() as i64;
        let now = now_ms() as i64;
        // (tso_next() waits for the worker to serve; R is read once it does.)
        crate::caller::window::next(1).unwrap();
        let r_before = crate::caller::resolved::current().unwrap();
        let g = acquire(Some("idem"), Some(1), Some(10_000), false, "t").unwrap();
        let (id, bound, expires, epoch, from) =
            (g.lease_id, g.upper, g.expires_at_ms, g.epoch, g.lower);
        // The lowest stamp: above every R handed out before, within the bound.
        assert!(
            tsoracle_core::timestamp::pack(from as u64, 0).unwrap() > r_before,
            "lowest stamp {from} ms at or below an R already handed out ({r_before})"
        );
        assert!(from <= bound);
        // max(high_water + 1, now + ttl): above every earlier bound, and a TTL past the clock.
        assert!(bound > before, "bound {bound} moves past the old high-water {before}");
        assert!(bound >= now + 10_000);
        assert_eq!(id, bound, "the id is the acquire-time bound");
        assert!(expires >= now + 10_000 && expires <= now_ms() as i64 + 10_000);
        assert!(epoch >= 1);
        let durable =
            Spi::get_one::<i64>("SELECT physical_ms FROM tsoracle.high_water").unwrap().unwrap();
        assert!(durable >= bound, "the bound is durable");
        let row = Spi::get_one_with_args::<i64>(
            "SELECT ts_upper_bound_ms FROM tsoracle.lease WHERE lease_id = $1",
            &[id.into()],
        )
        .unwrap();
        assert_eq!(row, Some(bound), "the lease record is durable");
        // Same holder and epoch while live: the same lease, no new bound.
        assert_eq!(acquire(Some("idem"), Some(1), Some(10_000), false, "t").unwrap(), g);
        assert!(tso_safe_frontier() <= bound);
        release(id).unwrap();
    }

    #[pg_test]
    fn a_higher_holder_epoch_supersedes_and_a_lower_one_is_55000() {
        let Grant { lease_id: old, upper: old_bound, .. } =
            acquire(Some("sup"), Some(5), Some(10_000), false, "t").unwrap();
        let Grant { lease_id: new, upper: new_bound, .. } =
            acquire(Some("sup"), Some(6), Some(10_000), false, "t").unwrap();
        assert_ne!(old, new);
        assert!(new_bound > old_bound);
        let superseded = Spi::get_one_with_args::<bool>(
            "SELECT superseded FROM tsoracle.lease WHERE lease_id = $1",
            &[old.into()],
        )
        .unwrap();
        assert_eq!(superseded, Some(true));
        assert_eq!(
            sqlstate_of(|| renew(old, false, "t").or_report()),
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "superseded cannot renew"
        );
        assert!(tso_safe_frontier() <= old_bound, "a superseded lease still holds the frontier");
        assert_eq!(
            sqlstate_of(|| acquire(Some("sup"), Some(4), Some(10_000), false, "t").or_report()),
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
        );
        // A renewal re-arms the TTL from now: its bound covers now + ttl and never goes back
        // (it moves the high-water to max(high_water, now + ttl), so renewals do not stack).
        let before_renew = now_ms() as i64;
        let Grant { upper: bound, expires_at_ms: expires, lower: from, .. } =
            renew(new, false, "t").unwrap();
        assert!(from <= bound, "the lowest stamp fits under the bound");
        assert!(bound >= new_bound, "a renewal never lowers the bound");
        assert!(bound >= before_renew + 10_000, "the bound covers the renewed TTL");
        assert!(expires >= before_renew + 10_000, "the TTL is re-armed from now");
        release(old).unwrap();
        release(new).unwrap();
    }

    #[pg_test]
    fn release_is_idempotent_and_unknown_renew_is_p0002() {
        let id = acquire(Some("rel"), Some(1), Some(10_000), false, "t").unwrap().lease_id;
        release(id).unwrap();
        release(id).unwrap();
        release(42).unwrap();
        assert_eq!(sqlstate_of(|| renew(id, false, "t").or_report()), ERRCODE_NO_DATA_FOUND);
        assert_eq!(sqlstate_of(|| renew(-1, false, "t").or_report()), ERRCODE_NO_DATA_FOUND);
        let gone = Spi::get_one_with_args::<i64>(
            "SELECT count(*) FROM tsoracle.lease WHERE lease_id = $1",
            &[id.into()],
        )
        .unwrap();
        assert_eq!(gone, Some(0));
    }

    #[pg_test]
    fn bad_lease_arguments_are_22023() {
        for ttl in [4_999, 300_001, 0, -1] {
            assert_eq!(
                sqlstate_of(
                    move || acquire(Some("bad"), Some(1), Some(ttl), false, "t").or_report()
                ),
                ERRCODE_INVALID_PARAMETER_VALUE,
                "ttl {ttl}"
            );
        }
        assert_eq!(
            sqlstate_of(|| acquire(Some("bad"), Some(1), None, false, "t").or_report()),
            ERRCODE_INVALID_PARAMETER_VALUE
        );
        assert_eq!(
            sqlstate_of(|| acquire(Some(""), Some(1), Some(10_000), false, "t").or_report()),
            ERRCODE_INVALID_PARAMETER_VALUE
        );
        assert_eq!(
            sqlstate_of(|| acquire(None, Some(1), Some(10_000), false, "t").or_report()),
            ERRCODE_INVALID_PARAMETER_VALUE
        );
        assert_eq!(
            sqlstate_of(|| acquire(Some("bad"), None, Some(10_000), false, "t").or_report()),
            ERRCODE_INVALID_PARAMETER_VALUE
        );
        let long = "h".repeat(129);
        assert_eq!(
            sqlstate_of(move || acquire(Some(&long), Some(1), Some(10_000), false, "t").or_report()),
            ERRCODE_INVALID_PARAMETER_VALUE
        );
    }

    #[pg_test]
    fn the_frontier_never_exceeds_the_high_water() {
        let frontier = tso_safe_frontier();
        assert!(frontier <= ORACLE.share().allocator.high_water_ms() as i64);
        assert!(frontier > 0);
    }

    #[pg_test]
    fn leases_are_a_privilege() {
        Spi::run("CREATE ROLE tso_no_lease NOLOGIN; CREATE ROLE tso_lessee NOLOGIN IN ROLE tsoracle_lease_holder").unwrap();
        for f in [
            "tso_lease_acquire(text, bigint, integer)",
            "tso_lease_renew(bigint)",
            "tso_lease_release(bigint)",
        ] {
            assert!(!can_execute("tso_no_lease", f), "PUBLIC must not execute {f}");
            assert!(can_execute("tso_lessee", f), "tsoracle_lease_holder executes {f}");
        }
        assert!(can_execute("tso_no_lease", "tso_safe_frontier()"));
        for privilege in ["SELECT", "INSERT", "UPDATE", "DELETE"] {
            let granted = Spi::get_one::<bool>(&format!(
                "SELECT has_table_privilege('tso_lessee', 'tsoracle.lease', '{privilege}')"
            ))
            .unwrap()
            .unwrap();
            assert!(!granted, "{privilege} on tsoracle.lease");
        }
    }
}
