//! Counters: their part of a group commit (docs/group-commit.md, "A sequence group").
//!
//! The rows of the keys a group touches are locked first, without waiting (`FOR UPDATE SKIP
//! LOCKED`), and read after they are locked: a caller advancing a counter in place leaves a
//! row locked by a running transaction alone, so what is read then is what the row holds
//! until this group commits. A key another transaction holds locked (a superuser's open
//! transaction, a prepared one, a restore in progress) is *busy*: its calls, and every call of
//! a batch that names it, are answered `55P03` naming that transaction, and every other key
//! goes on. A new key is inserted in a subtransaction of its own, so that a concurrent insert
//! of the same key (a restore) holds up that key only, at most the worker's `lock_timeout`.
//! The part as a whole runs in a subtransaction: a lock on the table itself that outlasts the
//! `lock_timeout` (`CREATE INDEX`, `VACUUM FULL`, `LOCK TABLE`) answers this group's sequence
//! calls `55P03`, naming the process, and leaves the rest of the group alone.

use super::checks::{denied, Checks};
use crate::pg::guc;
use crate::pg::inplace::{end_of_wal, make_durable};
use crate::pg::locks::{relation_blocker, row_locker, Blocker};
use crate::pg::xact::{subtransaction, Caught};
use crate::shmem::{Reply, ReplyCode, Request, RequestKind};
use pgrx::prelude::*;
use pgrx::spi::OwnedPreparedStatement;
use pgrx::PgOid;
use std::collections::{HashMap, HashSet};
use tsoracle_core::error::CoreError;
use tsoracle_core::locks::ROW_EXCLUSIVE;
use tsoracle_core::queue::Ticket;
use tsoracle_core::seq::{plan_group, SeqRequest};

/// The statements of a sequence group commit, kept across transactions (SPI_keepplan):
/// parsing and planning them for every group cost as much as the commit's fsync.
pub(super) struct SeqStatements {
    lock_rows: OwnedPreparedStatement,
    read_rows: OwnedPreparedStatement,
    store_counters: OwnedPreparedStatement,
}

impl SeqStatements {
    pub(super) fn prepare() -> Result<SeqStatements, pgrx::spi::Error> {
        let text_array = PgOid::BuiltIn(PgBuiltInOids::TEXTARRAYOID);
        let int8_array = PgOid::BuiltIn(PgBuiltInOids::INT8ARRAYOID);
        Spi::connect(|client| {
            let lock_rows = client
                .prepare_mut(
                    "SELECT key FROM ONLY tsoracle.seq WHERE key OPERATOR(pg_catalog.=) ANY ($1) \
                     ORDER BY key FOR UPDATE SKIP LOCKED",
                    &[text_array],
                )?
                .keep();
            let read_rows = client
                .prepare(
                    "SELECT key, next, owner::pg_catalog.oid::pg_catalog.int8, \
                            xmax::pg_catalog.text::pg_catalog.int8, made \
                     FROM ONLY tsoracle.seq WHERE key OPERATOR(pg_catalog.=) ANY ($1)",
                    &[text_array],
                )?
                .keep();
            let store_counters = client
                .prepare_mut(
                    "UPDATE ONLY tsoracle.seq AS s SET next = GREATEST(s.next, u.n), updated_at = pg_catalog.now() \
                     FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.int8[])) AS u(k, n) \
                     WHERE s.key OPERATOR(pg_catalog.=) u.k",
                    &[text_array, int8_array],
                )?
                .keep();
            Ok(SeqStatements { lock_rows, read_rows, store_counters })
        })
    }
}

/// The sequence part of a group commit. Each call's reply, in the order of `taken` (requests
/// that are not about sequences keep the default reply).
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
    match subtransaction(|| sequence_part(statements, &seq, checks)) {
        Ok(part) => {
            for (i, reply) in part {
                replies[i] = reply;
            }
        }
        Err(e) => {
            let reply = failed(&e);
            for &(i, _) in &seq {
                replies[i] = reply;
            }
        }
    }
    replies
}

/// The reply for every call of a part that failed as a whole.
fn failed(e: &Caught) -> Reply {
    if e.is_lock_not_available() {
        let blocker = crate::pg::catalog::counter_table()
            .map_or(Blocker::Unknown, |relid| relation_blocker(relid, ROW_EXCLUSIVE));
        Reply::table_busy(blocker)
    } else {
        pgrx::warning!("tsoracle could not advance the sequence counters: {e}");
        Reply::err(ReplyCode::Failed)
    }
}

/// How long a key locked by another transaction is tried again before it is busy: the
/// worker's `lock_timeout`.
const BUSY_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// One key's row as read after locking.
struct Row {
    next: i64,
    owner: u32,
    /// The key's incarnation (`tsoracle.seq.made`).
    made: i64,
}

fn sequence_part(
    statements: &SeqStatements,
    seq: &[(usize, &Request)],
    checks: &Checks,
) -> Vec<(usize, Reply)> {
    let keys: Vec<String> = {
        let mut keys: Vec<String> = seq.iter().map(|(_, r)| r.name().to_string()).collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    };
    // A row locked for a moment (a superuser's one-row UPDATE, a restore's merge) is waited
    // for as long as a table lock would be (the worker's lock_timeout), by trying again;
    // beyond that the key is busy.
    let deadline = std::time::Instant::now() + BUSY_RETRY;
    let (locked, rows, lockers) = loop {
        let read = lock_and_read(statements, &keys)
            .unwrap_or_else(|e| pgrx::error!("tsoracle could not read the sequence counters: {e}"));
        let busy = read.1.keys().any(|k| !read.0.contains(k.as_str()));
        if !busy || std::time::Instant::now() >= deadline {
            break read;
        }
        // SAFETY: a plain sleep in the worker, between statements of its transaction.
        unsafe { pg_sys::pg_usleep(5_000) };
        pg_sys::check_for_interrupts!();
    };
    #[cfg(feature = "clock-fault")]
    test_hold(&keys);
    // Existing keys this group could not lock: busy, with who holds them.
    let mut busy: HashMap<String, Blocker> = rows
        .keys()
        .filter(|k| !locked.contains(k.as_str()))
        .map(|k| (k.clone(), row_locker(lockers.get(k).copied().unwrap_or(0))))
        .collect();
    let mut current: HashMap<String, Row> =
        rows.into_iter().filter(|(k, _)| locked.contains(k.as_str())).collect();

    // Calls (batches) refused whole: a key they may not use, or cannot store.
    let mut owners: HashMap<String, u32> =
        current.iter().map(|(k, row)| (k.clone(), row.owner)).collect();
    let mut refused: HashMap<u64, Reply> = HashMap::new();
    for &(_, r) in seq.iter().filter(|(_, r)| r.kind == RequestKind::SeqAdvance) {
        if busy.contains_key(r.name()) {
            continue;
        }
        if !checks.storable(r.name()) {
            refused.insert(r.batch, Reply::err(ReplyCode::BadEncoding));
            continue;
        }
        let owner = *owners.entry(r.name().to_string()).or_insert(r.role);
        if !checks.may_use(r.role, owner) {
            refused.entry(r.batch).or_insert_with(|| denied(owner));
        }
    }
    let advances: Vec<(usize, SeqRequest)> = seq
        .iter()
        .filter(|(_, r)| r.kind == RequestKind::SeqAdvance && !refused.contains_key(&r.batch))
        .map(|&(i, r)| (i, SeqRequest { batch: r.batch, key: r.name(), count: r.count }))
        .collect();
    let requests: Vec<SeqRequest> = advances.iter().map(|(_, r)| r.clone()).collect();

    // Plan; insert the new keys the plan creates (each in a subtransaction of its own: a key a
    // concurrent transaction is inserting is busy, the others go on); plan again until every
    // key the plan writes exists, locked or inserted by this group.
    let mut existing_keys: Option<u64> = None;
    let plan = loop {
        let values: HashMap<&str, i64> =
            current.iter().map(|(k, row)| (k.as_str(), row.next)).collect();
        let busy_keys: HashSet<&str> = busy.keys().map(String::as_str).collect();
        let needs_count = requests.iter().any(|r| !values.contains_key(r.key));
        let existing = if needs_count { *existing_keys.get_or_insert_with(count_keys) } else { 0 };
        let plan = plan_group(&requests, &values, &busy_keys, existing, guc::max_seq_keys());
        let new: Vec<String> = plan
            .updates
            .iter()
            .filter(|(k, _)| !values.contains_key(k.as_str()))
            .map(|(k, _)| k.clone())
            .collect();
        if new.is_empty() {
            break plan;
        }
        for key in new {
            let owner = owners.get(&key).copied().unwrap_or(0);
            // No incarnation while the window does not serve: busy, asked again.
            let Some(made) = incarnation() else {
                busy.insert(key, Blocker::Unknown);
                continue;
            };
            match subtransaction(|| insert_key(&key, owner, made)) {
                Ok(true) => {
                    existing_keys = existing_keys.map(|n| n + 1);
                    current.insert(key, Row { next: 0, owner, made });
                }
                // Inserted and committed by someone else since it was read: retryable.
                Ok(false) => {
                    busy.insert(key, Blocker::Unknown);
                }
                Err(e) if e.is_lock_not_available() => {
                    busy.insert(key, Blocker::Unknown);
                }
                Err(e) => pgrx::error!("tsoracle could not create sequence key \"{key}\": {e}"),
            }
        }
    };

    if !plan.updates.is_empty() {
        let keys: Vec<String> = plan.updates.iter().map(|(k, _)| k.clone()).collect();
        let values: Vec<i64> = plan.updates.iter().map(|(_, v)| *v).collect();
        Spi::connect_mut(|client| {
            client
                .update(&statements.store_counters, None, &[keys.into(), values.into()])
                .map(|_| ())
        })
        .unwrap_or_else(|e| pgrx::error!("tsoracle could not advance the sequence counters: {e}"));
    }

    let mut out: Vec<(usize, Reply)> = Vec::with_capacity(seq.len());
    for ((i, r), result) in advances.iter().zip(&plan.results) {
        out.push((
            *i,
            match result {
                Ok(start) => Reply {
                    made: current.get(r.key).map_or(0, |row| row.made),
                    ..Reply::ok(*start)
                },
                Err(CoreError::SeqOverflow { .. }) => Reply::err(ReplyCode::SeqOverflow),
                Err(CoreError::SeqKeyBusy(key)) => {
                    Reply::busy(busy.get(key).copied().unwrap_or(Blocker::Unknown))
                }
                Err(_) => Reply::err(ReplyCode::TooManyKeys),
            },
        ));
    }
    // Peeks see the counters as this group leaves them; drops come last.
    let after: HashMap<&str, i64> = plan.updates.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let mut peeked = false;
    for &(i, r) in seq {
        let key = r.name();
        let reply = match r.kind {
            RequestKind::SeqAdvance => match refused.get(&r.batch) {
                Some(reply) => *reply,
                None => continue,
            },
            _ if busy.contains_key(key) => Reply::busy(busy[key]),
            RequestKind::SeqPeek => match current.get(key) {
                Some(row) if !checks.may_use(r.role, row.owner) => denied(row.owner),
                Some(row) => {
                    peeked = true;
                    Reply::ok(after.get(key).copied().unwrap_or(row.next))
                }
                None => Reply::err(ReplyCode::Null),
            },
            RequestKind::SeqDrop => match current.get(key) {
                None => Reply::err(ReplyCode::Null),
                Some(row) if !checks.may_manage(r.role, row.owner) => denied(row.owner),
                Some(_) => {
                    Spi::run_with_args(
                        "DELETE FROM ONLY tsoracle.seq WHERE key OPERATOR(pg_catalog.=) $1",
                        &[key.into()],
                    )
                    .unwrap_or_else(|e| {
                        pgrx::error!("tsoracle could not drop a sequence key: {e}")
                    });
                    Reply::ok(1)
                }
            },
            _ => continue,
        };
        out.push((i, reply));
    }
    // A peek may show a counter a caller advanced in place whose record is not flushed yet:
    // flush it (and wait for the synchronous standbys) before answering, so that no peek shows
    // what a crash could take back.
    if peeked && make_durable(end_of_wal()).is_err() {
        pgrx::error!("the wait for the synchronous standbys was cut short");
    }
    out
}

/// Lock the rows of `keys` that no one else holds, then read every row of `keys` (after the
/// lock, so a locked row's counter is what it stays until this group commits): the keys
/// locked, each existing row, and the `xmax` of each (who holds those not locked).
#[allow(clippy::type_complexity)]
fn lock_and_read(
    statements: &SeqStatements,
    keys: &[String],
) -> Result<(HashSet<String>, HashMap<String, Row>, HashMap<String, u32>), pgrx::spi::Error> {
    Spi::connect_mut(|client| {
        let locked: HashSet<String> = client
            .update(&statements.lock_rows, None, &[keys.to_vec().into()])?
            .map(|row| row.get::<String>(1).map(Option::unwrap_or_default))
            .collect::<Result<_, _>>()?;
        let mut rows = HashMap::new();
        let mut lockers = HashMap::new();
        for row in client.select(&statements.read_rows, None, &[keys.to_vec().into()])? {
            let key = row.get::<String>(1)?.unwrap_or_default();
            let next = row.get::<i64>(2)?.unwrap_or(0);
            let owner = u32::try_from(row.get::<i64>(3)?.unwrap_or(0)).unwrap_or(0);
            let xmax = u32::try_from(row.get::<i64>(4)?.unwrap_or(0)).unwrap_or(0);
            let made = row.get::<i64>(5)?.unwrap_or(0);
            lockers.insert(key.clone(), xmax);
            rows.insert(key, Row { next, owner, made });
        }
        Ok((locked, rows, lockers))
    })
}

fn count_keys() -> u64 {
    Spi::get_one::<i64>("SELECT pg_catalog.count(*) FROM ONLY tsoracle.seq")
        .unwrap_or_else(|e| pgrx::error!("tsoracle could not count the sequence keys: {e}"))
        .unwrap_or(0)
        .max(0) as u64
}

/// A new key's incarnation (`tsoracle.seq.made`): a timestamp taken from the window, above
/// every one issued before, so that a key dropped and made again has a higher one than any
/// member kept (docs/fleet.md, "What is checked, and refused"). `None` while the window does
/// not serve.
fn incarnation() -> Option<i64> {
    crate::shmem::signals()
        .ok()
        .and_then(|signals| signals.window.try_grant(crate::pg::clock::now_ms(), 1).ok())
        .map(tsoracle_core::timestamp::to_sql)
}

/// Insert a new key at 0 (its planned value is written with the others); false if it exists
/// by now.
fn insert_key(key: &str, owner: u32, made: i64) -> bool {
    Spi::get_one_with_args::<String>(
        "INSERT INTO tsoracle.seq (key, next, owner, made) \
         VALUES ($1, 0, $2::pg_catalog.oid::pg_catalog.regrole, $3) \
         ON CONFLICT (key) DO NOTHING RETURNING key",
        &[key.into(), i64::from(owner).into(), made.into()],
    )
    .unwrap_or_else(|e| pgrx::error!("tsoracle could not create sequence key \"{key}\": {e}"))
    .is_some()
}

/// Test builds: while `tsoracle.test_worker_hold_key` names one of `keys`, stay here, in the
/// group's transaction with its rows locked, as a worker stuck in its commit would (a cancel is
/// ignored, a terminate ends it).
#[cfg(feature = "clock-fault")]
fn test_hold(keys: &[String]) {
    use pgrx::bgworkers::BackgroundWorker;
    // SAFETY: a read of the flag the SIGHUP handler sets; reloading in the worker.
    if unsafe { pg_sys::ConfigReloadPending } != 0 {
        // SAFETY: as below.
        unsafe {
            pg_sys::ConfigReloadPending = 0;
            pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP);
        }
    }
    let held = |k: Option<String>| k.is_some_and(|k| keys.contains(&k));
    while held(guc::test_worker_hold_key()) {
        BackgroundWorker::wait_latch(Some(std::time::Duration::from_millis(20)));
        pg_sys::check_for_interrupts!();
        if BackgroundWorker::sighup_received() {
            // SAFETY: reloading the configuration in the worker (the setting is SIGHUP).
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
    }
}
