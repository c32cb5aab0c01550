//! What a member issued on its own before it joined its fleet, and what it handed out as a
//! member (docs/fleet.md, "What is checked, and refused"): read from its own tables when its
//! worker starts, and every answer of the oracle checked against it
//! (`tsoracle_core::member::OwnPast`), so that nothing is handed out twice when the oracle was
//! not seeded above it, or when a deposed primary (or an oracle gone back) answers a member
//! that no longer knows the oracle's epoch. As a member, the worker keeps a lagging bound of
//! what it fetched (`tsoracle_core::member::kept_past_ms`) in its own `tsoracle.high_water`,
//! raised in the transaction that publishes its resolved timestamp ([`due`], [`keep`]).

use super::calls::remote;
use crate::pg::xact::sql_transaction;
use crate::shmem::member::MEMBER;
use crate::shmem::{Reply, ReplyCode, Request, RequestKind};
use pgrx::prelude::*;
use std::cell::Cell;
use tsoracle_core::member::{kept_past_ms, BelowOwnPast, OwnPast};
use tsoracle_core::queue::Ticket;

/// What this cluster issued on its own, from its own tables (`None`: shutting down).
pub(super) fn load() -> Option<OwnPast> {
    let own = crate::worker::state::read_at_start(|| {
        sql_transaction("tsoracle member cannot read its own tables", || {
            Spi::connect(|client| {
                let mut high_water = 0;
                // No row: the cluster never served on its own.
                for row in
                    client.select("SELECT physical_ms FROM tsoracle.high_water", None, &[])?
                {
                    high_water = row.get::<i64>(1)?.unwrap_or(0).max(high_water);
                }
                let mut counters = Vec::new();
                for row in client.select("SELECT key, next FROM tsoracle.seq", None, &[])? {
                    if let (Some(key), Some(next)) = (row.get::<String>(1)?, row.get::<i64>(2)?) {
                        counters.push((key, u64::try_from(next).unwrap_or(0)));
                    }
                }
                Ok(OwnPast::new(u64::try_from(high_water).unwrap_or(0), counters))
            })
        })
    })?;
    if own.high_water_ms() > 0 {
        pgrx::log!(
            "tsoracle member: this cluster issued or handed out timestamps up to {} ms; none of the oracle's at or below is handed out",
            own.high_water_ms()
        );
    }
    KEPT_MS.set(own.high_water_ms());
    Some(own)
}

thread_local! {
    /// The member's own high-water as this worker last read or raised it (ms).
    static KEPT_MS: Cell<u64> = const { Cell::new(0) };
}

/// The bound to raise the member's own high-water to, when the member fetched past what it
/// holds (`None`: nothing to write).
pub(crate) fn due(signals: &crate::shmem::Signals) -> Option<u64> {
    let ms = kept_past_ms(signals.member_floor.get());
    (ms > KEPT_MS.get()).then_some(ms)
}

/// Raise the member's own high-water to `ms` (never lowered), in the caller's transaction.
/// Its epoch (the timeline of a fence, for a cluster serving alone) is kept as it is.
pub(crate) fn keep(ms: u64) -> Result<(), pgrx::spi::Error> {
    Spi::run_with_args(
        "INSERT INTO tsoracle.high_water AS h (id, physical_ms, epoch) VALUES (true, $1, 0) \
         ON CONFLICT (id) DO UPDATE SET physical_ms = GREATEST(h.physical_ms, EXCLUDED.physical_ms), \
             updated_at = pg_catalog.now()",
        &[(ms.min(i64::MAX as u64) as i64).into()],
    )
}

/// The transaction of [`keep`] committed.
pub(crate) fn kept(ms: u64) {
    KEPT_MS.set(KEPT_MS.get().max(ms));
}

/// Whether the blocks and leases the oracle granted for one call may be handed out here: none
/// repeats what this cluster granted on its own.
pub(super) fn check(
    own: &OwnPast,
    requests: &[Request],
    replies: &[Reply],
) -> Result<(), BelowOwnPast> {
    for (r, reply) in requests.iter().zip(replies) {
        if reply.code != ReplyCode::Ok {
            continue;
        }
        match r.kind {
            RequestKind::SeqAdvance => {
                own.check_block(r.name(), u64::try_from(reply.value).unwrap_or(0))?
            }
            RequestKind::LeaseAcquire | RequestKind::LeaseRenew => {
                own.check_lease(u64::try_from(reply.from_ms).unwrap_or(0))?
            }
            _ => {}
        }
    }
    Ok(())
}

/// The replies refusing calls whose values the oracle answered below this cluster's own past
/// (`55000`, with what to do on the oracle): handed to no one.
pub(super) fn refusals(
    tickets: &[Ticket],
    below: &BelowOwnPast,
    requests: usize,
) -> Vec<(Ticket, Vec<Reply>)> {
    let hint = match below {
        BelowOwnPast::Timestamps { high_water_ms, .. } => format!(
            "If the oracle answering is a deposed primary brought back, stop it: only the oracle's current primary may serve. Otherwise seed the oracle above this cluster's own values: SELECT tso_seed({}) on the oracle (docs/operations/fleet.md, \"Joining a fleet\").",
            high_water_ms.saturating_add(1)
        ),
        BelowOwnPast::Counter { .. } => "Carry this cluster's counters to the oracle: COPY (SELECT key, next FROM tsoracle.seq) here into COPY tsoracle.seq (key, next) on the oracle (docs/operations/fleet.md, \"Joining a fleet\").".to_string(),
    };
    let message = below.to_string();
    let mut member = MEMBER.exclusive();
    tickets
        .iter()
        .map(|t| {
            member.keep_error(t.generation, "55000", &message, Some(&hint));
            (*t, vec![remote(*t); requests])
        })
        .collect()
}
