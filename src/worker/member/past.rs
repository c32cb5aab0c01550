//! What a member issued on its own before it joined its fleet, and what it handed out as a
//! member (docs/fleet.md, "What is checked, and refused"): read from its own tables when its
//! worker starts, and every answer of the oracle checked against it
//! (`tsoracle_core::member::OwnPast`), so that nothing is handed out twice when the oracle was
//! not seeded above it, or when a deposed primary (or an oracle gone back) answers a member
//! that no longer knows the oracle's epoch. As a member, the worker keeps a lagging bound of
//! what it fetched (`tsoracle_core::member::kept_past_ms`) in its own `tsoracle.high_water`,
//! and the last block of each counter it handed out (`tsoracle_core::member::HandedBlock`) in
//! `tsoracle.member_counter`, both written in the transaction that publishes its resolved
//! timestamp ([`due`], [`keep`]).

use super::calls::remote;
use crate::pg::xact::sql_transaction;
use crate::shmem::member::MEMBER;
use crate::shmem::{Reply, ReplyCode, Request, RequestKind};
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use tsoracle_core::member::{kept_past_ms, BelowOwnPast, CountersToKeep, HandedBlock, OwnPast};
use tsoracle_core::queue::Ticket;
use tsoracle_core::seq::block_end;

/// What this cluster issued on its own, from its own tables (`None`: shutting down).
pub(super) fn load() -> Option<OwnPast> {
    let own = crate::worker::state::read_at_start(|| {
        sql_transaction("tsoracle member cannot read its own tables", || {
            Spi::connect(|client| {
                let mut high_water = 0;
                // No row: the cluster never served on its own.
                for row in
                    client.select("SELECT physical_ms FROM ONLY tsoracle.high_water", None, &[])?
                {
                    high_water = row.get::<i64>(1)?.unwrap_or(0).max(high_water);
                }
                let mut counters = Vec::new();
                for row in client.select("SELECT key, next FROM ONLY tsoracle.seq", None, &[])? {
                    if let (Some(key), Some(next)) = (row.get::<String>(1)?, row.get::<i64>(2)?) {
                        counters.push((key, u64::try_from(next).unwrap_or(0)));
                    }
                }
                let mut handed = Vec::new();
                for row in client.select(
                    "SELECT key, made, next FROM ONLY tsoracle.member_counter",
                    None,
                    &[],
                )? {
                    let at =
                        |i| row.get::<i64>(i).map(|v| u64::try_from(v.unwrap_or(0)).unwrap_or(0));
                    if let Some(key) = row.get::<String>(1)? {
                        handed.push((key, HandedBlock { made: at(2)?, end: at(3)? }));
                    }
                }
                Ok(OwnPast::new(u64::try_from(high_water).unwrap_or(0), counters)
                    .with_handed(handed))
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
    /// The blocks handed out that `tsoracle.member_counter` does not hold yet.
    static COUNTERS: RefCell<CountersToKeep> = RefCell::new(CountersToKeep::default());
}

/// What the member's next publication keeps of what it handed out.
pub(crate) struct Due {
    /// The bound to raise its own high-water to (ms).
    ms: Option<u64>,
    /// The counters' last blocks.
    counters: Vec<(String, HandedBlock)>,
}

/// What to keep now, when the member fetched past what it holds or handed out blocks it does
/// not hold yet (`None`: nothing to write).
pub(crate) fn due(signals: &crate::shmem::Signals) -> Option<Due> {
    let ms = kept_past_ms(signals.member_floor.get());
    let due = Due {
        ms: (ms > KEPT_MS.get()).then_some(ms),
        counters: COUNTERS.with_borrow(CountersToKeep::due),
    };
    (due.ms.is_some() || !due.counters.is_empty()).then_some(due)
}

/// Keep `due`, in the caller's transaction: the member's own high-water raised (never
/// lowered; its epoch, the timeline of a fence for a cluster serving alone, kept as it is),
/// and each counter's last block (a newer incarnation replaces an older one; within one, the
/// end only rises).
pub(crate) fn keep(due: &Due) -> Result<(), pgrx::spi::Error> {
    if let Some(ms) = due.ms {
        Spi::run_with_args(
            "INSERT INTO tsoracle.high_water AS h (id, physical_ms, epoch) VALUES (true, $1, 0) \
             ON CONFLICT (id) DO UPDATE SET physical_ms = GREATEST(h.physical_ms, EXCLUDED.physical_ms), \
                 updated_at = pg_catalog.now()",
            &[(ms.min(i64::MAX as u64) as i64).into()],
        )?;
    }
    if due.counters.is_empty() {
        return Ok(());
    }
    let sql = |v: u64| v.min(i64::MAX as u64) as i64;
    let keys: Vec<String> = due.counters.iter().map(|(k, _)| k.clone()).collect();
    let mades: Vec<i64> = due.counters.iter().map(|(_, b)| sql(b.made)).collect();
    let ends: Vec<i64> = due.counters.iter().map(|(_, b)| sql(b.end)).collect();
    Spi::run_with_args(
        "INSERT INTO tsoracle.member_counter AS c (key, made, next) \
         SELECT * FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.int8[]), \
                                  pg_catalog.unnest($3::pg_catalog.int8[])) \
         ON CONFLICT (key) DO UPDATE SET \
             made = GREATEST(c.made, EXCLUDED.made), \
             next = CASE WHEN EXCLUDED.made OPERATOR(pg_catalog.>) c.made THEN EXCLUDED.next \
                         WHEN EXCLUDED.made OPERATOR(pg_catalog.=) c.made THEN GREATEST(c.next, EXCLUDED.next) \
                         ELSE c.next END, \
             updated_at = pg_catalog.now()",
        &[keys.into(), mades.into(), ends.into()],
    )
}

/// The transaction of [`keep`] committed.
pub(crate) fn kept(due: &Due) {
    if let Some(ms) = due.ms {
        KEPT_MS.set(KEPT_MS.get().max(ms));
    }
    COUNTERS.with_borrow_mut(|c| c.kept(&due.counters));
}

/// The blocks of a call, checked by [`check`], are handed out: later answers below them are
/// refused, and they are kept at the next publication.
pub(super) fn handed_out(own: &mut OwnPast, requests: &[Request], replies: &[Reply]) {
    for (r, reply) in requests.iter().zip(replies) {
        if r.kind != RequestKind::SeqAdvance || reply.code != ReplyCode::Ok {
            continue;
        }
        let block = HandedBlock {
            made: u64::try_from(reply.made).unwrap_or(0),
            // The oracle granted it, so it does not overflow; were it to, the top holds.
            end: u64::try_from(block_end(reply.value.max(0), r.count).unwrap_or(i64::MAX))
                .unwrap_or(0),
        };
        own.handed_out(r.name(), block);
        COUNTERS.with_borrow_mut(|c| c.handed_out(r.name(), block));
    }
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
                let start = u64::try_from(reply.value).unwrap_or(0);
                own.check_counter(r.name(), u64::try_from(reply.made).unwrap_or(0), start)?
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
            "If the oracle answering is a deposed primary brought back, stop it: only the oracle's current primary may serve. Otherwise seed the oracle above this cluster's own values: SELECT tso_seed({}) on the oracle (docs/operations/fleet/join.md, \"Joining a fleet\").",
            high_water_ms.saturating_add(1)
        ),
        BelowOwnPast::HandedOut { key, kept, .. } => {
            let (key, end) = (key.replace('\'', "''"), kept.end);
            format!("If the oracle answering is a deposed primary brought back, or a copy restored from a backup, stop it: only the oracle's current primary may serve. If it was restored on purpose, raise its counter above every block the members handed out (this member's ends at {end}; take the highest next of the key in every member's tsoracle.member_counter: UPDATE tsoracle.seq SET next = GREATEST(next, <highest>) WHERE key = '{key}' on the oracle), then delete the key's row here (DELETE FROM tsoracle.member_counter WHERE key = '{key}') and restart this member.")
        }
        BelowOwnPast::Counter { .. } => "Carry this cluster's counters to the oracle: COPY (SELECT key, next FROM tsoracle.seq) here into COPY tsoracle.seq (key, next) on the oracle (docs/operations/fleet/join.md, \"Joining a fleet\").".to_string(),
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
