//! On a member of a fleet (docs/fleet.md): every timestamp comes from the oracle, through
//! this server's worker, which takes the calls waiting at one moment to the oracle in one
//! round trip. Nothing is prefetched: a call's value was issued by the oracle after the call
//! began, so a call that starts after another has returned — on any cluster of the fleet —
//! gets a greater value.

use super::holding;
use super::requests::{reply_error, submit};
use crate::pg::error::TsoError;
use crate::shmem::{self, Reply, ReplyCode, Request, RequestKind};

/// `count` consecutive timestamps from the oracle; the first.
pub fn next(count: u32) -> Result<u64, TsoError> {
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
