//! Counters: their part of a group commit.

use super::checks::{denied, Checks};
use crate::pg::guc;
use crate::shmem::{Reply, ReplyCode, Request, RequestKind};
use pgrx::prelude::*;
use pgrx::spi::OwnedPreparedStatement;
use pgrx::PgOid;
use std::collections::HashMap;
use tsoracle_core::error::CoreError;
use tsoracle_core::queue::Ticket;
use tsoracle_core::seq::{plan_group, SeqRequest};

/// The two statements of a sequence group commit, kept across transactions (SPI_keepplan):
/// parsing and planning them for every group cost as much as the commit's fsync.
pub(super) struct SeqStatements {
    lock_counters: OwnedPreparedStatement,
    store_counters: OwnedPreparedStatement,
}

impl SeqStatements {
    pub(super) fn prepare() -> SeqStatements {
        let text_array = PgOid::BuiltIn(PgBuiltInOids::TEXTARRAYOID);
        let int8_array = PgOid::BuiltIn(PgBuiltInOids::INT8ARRAYOID);
        Spi::connect(|client| {
            let lock_counters = client
                .prepare_mut(
                    "SELECT key, next, owner::pg_catalog.oid::pg_catalog.int8 FROM tsoracle.seq \
                     WHERE key OPERATOR(pg_catalog.=) ANY ($1) ORDER BY key FOR UPDATE",
                    &[text_array],
                )?
                .keep();
            let store_counters = client
                .prepare_mut(
                    "INSERT INTO tsoracle.seq AS s (key, next, owner) \
                     SELECT k, n, o::pg_catalog.oid::pg_catalog.regrole \
                       FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.int8[]), \
                                      pg_catalog.unnest($3::pg_catalog.int8[])) AS u(k, n, o) \
                     ON CONFLICT (key) DO UPDATE SET next = GREATEST(s.next, EXCLUDED.next), updated_at = pg_catalog.now()",
                    &[text_array, int8_array, int8_array],
                )?
                .keep();
            Ok::<_, pgrx::spi::Error>(SeqStatements { lock_counters, store_counters })
        })
        .unwrap_or_else(|e| pgrx::error!("tsoracle could not prepare its sequence statements: {e}"))
    }
}

/// The sequence part of a group commit: read the touched counters (locked), check who may
/// use them, plan every block in queue order (pure, `plan_group`), write each moved counter
/// once, then drop the keys asked to be dropped.
pub(super) fn advance_sequences(
    statements: &SeqStatements,
    taken: &[(Ticket, Request)],
    checks: &Checks,
) -> Vec<Reply> {
    let mut replies = vec![Reply::default(); taken.len()];
    let seq: Vec<(usize, &Request)> = taken
        .iter()
        .enumerate()
        .filter(|(_, (_, r))| {
            matches!(r.kind, RequestKind::SeqAdvance | RequestKind::SeqPeek | RequestKind::SeqDrop)
        })
        .map(|(i, (_, r))| (i, r))
        .collect();
    if seq.is_empty() {
        return replies;
    }
    // The lock protocol of the in-place path (`crate::seq_inplace`): wait for the callers
    // writing counters in place, and keep them out until this group commits, before reading
    // any counter. Its statements' trigger takes the same lock again (a no-op then).
    if let Some(relid) = crate::pg::catalog::counter_table() {
        // SAFETY: inside the group's transaction; held until it ends.
        unsafe { pg_sys::LockRelationOid(relid, pg_sys::ShareRowExclusiveLock as i32) };
    }
    let keys: Vec<String> = {
        let mut keys: Vec<String> = seq.iter().map(|(_, r)| r.name().to_string()).collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    };
    // key -> (next, owner)
    let current: HashMap<String, (i64, u32)> = Spi::connect_mut(|client| {
        let rows = client.update(&statements.lock_counters, None, &[keys.clone().into()])?;
        rows.map(|row| {
            Ok((
                row.get::<String>(1)?.unwrap_or_default(),
                (
                    row.get::<i64>(2)?.unwrap_or(0),
                    u32::try_from(row.get::<i64>(3)?.unwrap_or(0)).unwrap_or(0),
                ),
            ))
        })
        .collect::<Result<HashMap<_, _>, pgrx::spi::Error>>()
    })
    .unwrap_or_else(|e| pgrx::error!("tsoracle could not read the sequence counters: {e}"));

    // Owners of keys this group creates: the role of the first call that names them.
    let mut owners: HashMap<&str, u32> =
        current.iter().map(|(k, &(_, owner))| (k.as_str(), owner)).collect();
    // Calls (batches) refused whole: a key they may not use, or cannot store.
    let mut refused: HashMap<u64, ReplyCode> = HashMap::new();
    let mut denied_owner: HashMap<u64, u32> = HashMap::new();
    for &(_, r) in seq.iter().filter(|(_, r)| r.kind == RequestKind::SeqAdvance) {
        if !checks.storable(r.name()) {
            refused.insert(r.batch, ReplyCode::BadEncoding);
            continue;
        }
        let owner = *owners.entry(r.name()).or_insert(r.role);
        if !checks.may_use(r.role, owner) {
            refused.entry(r.batch).or_insert(ReplyCode::PermissionDenied);
            denied_owner.insert(r.batch, owner);
        }
    }

    let advances: Vec<(usize, SeqRequest)> = seq
        .iter()
        .filter(|(_, r)| r.kind == RequestKind::SeqAdvance && !refused.contains_key(&r.batch))
        .map(|&(i, r)| (i, SeqRequest { batch: r.batch, key: r.name(), count: r.count }))
        .collect();
    let creates_keys = advances.iter().any(|(_, r)| !current.contains_key(r.key));
    let existing_keys = if creates_keys {
        Spi::get_one::<i64>("SELECT pg_catalog.count(*) FROM tsoracle.seq")
            .unwrap_or_else(|e| pgrx::error!("tsoracle could not count the sequence keys: {e}"))
            .unwrap_or(0)
            .max(0) as u64
    } else {
        0
    };
    let current_ref: HashMap<&str, i64> =
        current.iter().map(|(k, &(next, _))| (k.as_str(), next)).collect();
    let requests: Vec<SeqRequest> = advances.iter().map(|(_, r)| r.clone()).collect();
    let plan = plan_group(&requests, &current_ref, existing_keys, guc::max_seq_keys());

    if !plan.updates.is_empty() {
        let keys: Vec<String> = plan.updates.iter().map(|(k, _)| k.clone()).collect();
        let values: Vec<i64> = plan.updates.iter().map(|(_, v)| *v).collect();
        let key_owners: Vec<i64> =
            keys.iter().map(|k| i64::from(owners.get(k.as_str()).copied().unwrap_or(0))).collect();
        Spi::connect_mut(|client| {
            client
                .update(
                    &statements.store_counters,
                    None,
                    &[keys.into(), values.into(), key_owners.into()],
                )
                .map(|_| ())
        })
        .unwrap_or_else(|e| pgrx::error!("tsoracle could not advance the sequence counters: {e}"));
    }

    for ((i, _), result) in advances.iter().zip(&plan.results) {
        replies[*i] = match result {
            Ok(start) => Reply::ok(*start),
            Err(CoreError::SeqOverflow { .. }) => Reply::err(ReplyCode::SeqOverflow),
            Err(_) => Reply::err(ReplyCode::TooManyKeys),
        };
    }
    // Peeks see the counters as this group leaves them; drops come last.
    let after: HashMap<&str, i64> = plan.updates.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    for &(i, r) in &seq {
        let known = current.get(r.name()).map(|&(_, owner)| owner);
        replies[i] = match r.kind {
            RequestKind::SeqAdvance => match refused.get(&r.batch) {
                Some(ReplyCode::PermissionDenied) => {
                    denied(denied_owner.get(&r.batch).copied().unwrap_or(0))
                }
                Some(&code) => Reply::err(code),
                None => continue,
            },
            RequestKind::SeqPeek => match known {
                Some(owner) if !checks.may_use(r.role, owner) => denied(owner),
                _ => match after.get(r.name()).or_else(|| current_ref.get(r.name())) {
                    Some(&next) => Reply::ok(next),
                    None => Reply::err(ReplyCode::Null),
                },
            },
            RequestKind::SeqDrop => match known
                .or_else(|| owners.get(r.name()).copied().filter(|_| after.contains_key(r.name())))
            {
                None => Reply::err(ReplyCode::Null),
                Some(owner) if !checks.may_manage(r.role, owner) => denied(owner),
                Some(_) => {
                    Spi::run_with_args(
                        "DELETE FROM tsoracle.seq WHERE key OPERATOR(pg_catalog.=) $1",
                        &[r.name().into()],
                    )
                    .unwrap_or_else(|e| {
                        pgrx::error!("tsoracle could not drop a sequence key: {e}")
                    });
                    Reply::ok(1)
                }
            },
            _ => continue,
        };
    }
    replies
}
