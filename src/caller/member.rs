//! On a member of a fleet (docs/fleet.md): every timestamp comes from the oracle, through
//! this server's worker, which takes the calls waiting at one moment to the oracle in one
//! round trip. Nothing is prefetched across statements: a statement's values were issued by
//! the oracle after the statement began, so a statement that starts after another has
//! returned — on any cluster of the fleet — gets greater values.
//!
//! Within one statement, `tso_next()` (and `tso_next_uuid()`) take their values from a
//! reservation (`tsoracle_core::reservation`): a fetch answers 1, then 2, 4, … values up to
//! `tsoracle.member_reservation_max`, handed out in order to the statement's later calls;
//! what the statement leaves is a gap. Outside a portal (work at commit, after the last
//! statement returned) every call fetches. The transaction's hold is taken before the first
//! fetch, below all of them.

use super::holding;
use super::requests::{reply_error, submit};
use crate::pg::error::TsoError;
use crate::pg::{guc, statement};
use crate::shmem::{self, Reply, ReplyCode, Request, RequestKind};
use std::cell::Cell;
use tsoracle_core::reservation::Reservation;

thread_local! {
    /// This backend's reservation: the statement that fetched it, and what is left.
    static RESERVED: Cell<Reservation> = const { Cell::new(Reservation::EMPTY) };
}

/// `count` consecutive timestamps; the first. One value is taken from the statement's
/// reservation when it has one left; anything else is fetched from the oracle.
pub fn next(count: u32) -> Result<u64, TsoError> {
    let cap = guc::member_reservation_max();
    if count > 1 || cap <= 1 || !statement::in_a_portal() {
        // Nothing kept may be handed out after these values: it is below them.
        RESERVED.set(Reservation::EMPTY);
        return fetch(count);
    }
    let now = statement::current();
    let mut kept = RESERVED.get();
    if let Some(v) = kept.take(now) {
        RESERVED.set(kept);
        return Ok(v);
    }
    let size = kept.next_size(now, cap);
    // A fetch that fails leaves nothing kept.
    RESERVED.set(Reservation::EMPTY);
    let first = fetch(size)?;
    RESERVED.set(Reservation::fetched(now, first, size));
    Ok(first)
}

/// `count` consecutive timestamps fetched from the oracle for this call; the first.
fn fetch(count: u32) -> Result<u64, TsoError> {
    let signals = shmem::signals()?;
    // The resolved timestamp: held below what the oracle will answer (`member_floor`).
    let fresh = holding::hold(signals)?;
    let reply = one(Request::new(RequestKind::Next, "", u64::from(count)), "a timestamp")?;
    let first = u64::try_from(reply.value)
        .map_err(|_| TsoError::Internal(format!("the oracle answered {}", reply.value)))?;
    if fresh {
        holding::raise(first);
    }
    Ok(first)
}

/// The oracle's safe frontier.
pub fn safe_frontier() -> Result<i64, TsoError> {
    Ok(one(Request::new(RequestKind::SafeFrontier, "", 0), "the safe frontier")?.value)
}

fn one(request: Request, what: &str) -> Result<Reply, TsoError> {
    let reply = submit(&[request])?
        .first()
        .copied()
        .ok_or_else(|| TsoError::Internal("no reply".into()))?;
    match reply_error(&reply, what) {
        Some(e) => Err(e),
        None if reply.code == ReplyCode::Ok => Ok(reply),
        None => {
            Err(TsoError::Internal(format!("unexpected reply from the oracle: {:?}", reply.code)))
        }
    }
}
