//! The durable high-water: raised in place (docs/worker.md, "The high-water in place"), with
//! no heavyweight lock a DBA's statement could make it wait for, and letting the allocator
//! serve up to what is durable.
//!
//! The row `id = true` of `tsoracle.high_water` is found by reading the table's pages (it
//! holds one live row; no index is used, so a `REINDEX` holding its index does not matter),
//! written under the page's exclusive buffer lock through `pg::inplace` when no running
//! transaction holds it locked, then flushed and acknowledged by the synchronous standbys
//! before anything is served from it. A rewrite of the table (`VACUUM FULL`, `CLUSTER`, an
//! `ALTER TABLE` that rewrites it) could copy the page before the write and drop it: a write
//! is trusted only if no such rewrite holds the table (`AccessExclusiveLock`, asked of the
//! lock manager without taking any lock) before and after it, and the table's file is the
//! same one afterwards. Otherwise — a rewrite in progress, the row locked (`SELECT … FOR
//! UPDATE`), the trigger `keep_what_was_issued` not `ENABLE ALWAYS`, an index or a generated
//! column on its columns — the MVCC `UPDATE` is used, with the worker's short `lock_timeout`,
//! and a failure leaves the window where it is until the next tick.
//!
//! When the table is in a publication, the in-place write is followed by the MVCC update as
//! well, so that a subscriber (a blue/green switchover) receives every raise.

use super::state::Worker;
use crate::pg::guc;
use crate::pg::inplace::{make_durable, preconditions, row_free, write_logged, Refusal};
use crate::pg::xact::{subtransaction, Caught};
use crate::shmem::ORACLE;
use pgrx::prelude::*;
use std::cell::Cell;
use std::ffi::c_int;
use tsoracle_core::error::CoreError;
use tsoracle_core::row_page::{high_water_tuple, HighWaterTuple, Xmax};

impl Worker {
    /// Let the allocator serve up to a high-water that is now durable (within the lead cap).
    pub(super) fn commit_high_water(&self, actual_ms: u64, epoch: u64) -> Result<(), CoreError> {
        let result = {
            let mut st = ORACLE.exclusive();
            let result = st.allocator.commit_window_extension(actual_ms, epoch);
            if result.is_ok() {
                let reference = st.clock.reference_ms();
                self.signals
                    .window
                    .extend(st.allocator.serving_bound_ms(reference, guc::max_lead_ms()));
                st.worker_commits += 1;
                st.max_committed_ms = st.max_committed_ms.max(actual_ms);
            }
            result
        };
        self.signals.broadcast();
        result
    }
}

/// The durable row as read and as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Raised {
    pub prior_ms: u64,
    pub prior_epoch: u64,
    pub physical_ms: u64,
    pub epoch: u64,
}

/// Why the high-water could not be raised.
#[derive(Debug)]
pub(super) enum RaiseError {
    /// The row is missing or at another epoch: the table was recreated or restored
    /// underneath the worker, which must fence again.
    NotOurs,
    /// The plan refused (the fence's floor at the top of the timestamp range).
    Refused(String),
    /// A lock, a rewrite, or a cancelled wait for the synchronous standbys: nothing is served
    /// from it; the worker tries again later.
    Unavailable(String),
}

/// What to write, given the row as it is (`physical_ms`, `epoch`): the values to raise it to,
/// or why not.
pub(super) type Plan<'a> = &'a dyn Fn(u64, u64) -> Result<(u64, u64), String>;

/// Raise the high-water to at least `to_ms` at `epoch`: the one monotonic path to it, used by
/// window extensions and lease grants. Inside a transaction; returns the durable value.
pub(super) fn raise(to_ms: u64, epoch: u64) -> Result<u64, RaiseError> {
    let plan = move |prior_ms: u64, prior_epoch: u64| {
        if prior_epoch != epoch {
            return Err(String::new());
        }
        Ok((prior_ms.max(to_ms), prior_epoch))
    };
    match write(&plan) {
        Ok(raised) => Ok(raised.physical_ms),
        Err(RaiseError::Refused(_)) => Err(RaiseError::NotOurs),
        Err(e) => Err(e),
    }
}

/// Read the row and write what `plan` says (never lower than it was: `plan` gets the row's
/// values and the write keeps the larger of each), in place if it may, else through MVCC;
/// durable (flushed and acknowledged) when this returns `Ok`. Inside a transaction.
pub(super) fn write(plan: Plan<'_>) -> Result<Raised, RaiseError> {
    match in_place(plan) {
        InPlace::Done(raised, published) => {
            if published {
                // A subscriber learns of the raise only through an MVCC change; the in-place
                // write is what is durable here, so a failure only delays the subscriber.
                if let Err(e) = mvcc(&|_, e| Ok((raised.physical_ms, e.max(raised.epoch)))) {
                    note_unreplicated(&e);
                }
            }
            Ok(raised)
        }
        InPlace::Refused(e) => Err(e),
        InPlace::NotHere => mvcc(plan),
    }
}

enum InPlace {
    /// Written and durable; the table is in a publication (also write it through MVCC).
    Done(Raised, bool),
    /// An answer for the caller (not ours, refused, not acknowledged).
    Refused(RaiseError),
    /// Not possible in place now: use MVCC.
    NotHere,
}

thread_local! {
    /// Where the live row was last found (block, line pointer) in the table's file (relid,
    /// relfilenode): a hint, checked again under the buffer lock.
    static LAST_ROW: Cell<Option<(pg_sys::Oid, pg_sys::Oid, u32, u16)>> = const { Cell::new(None) };
    /// The last MVCC update for a subscriber failed (logged once until one succeeds).
    static UNREPLICATED: Cell<bool> = const { Cell::new(false) };
}

fn note_unreplicated(e: &RaiseError) {
    if !UNREPLICATED.replace(true) {
        pgrx::warning!(
            "tsoracle: the high-water was raised in place, but its update for the publications of tsoracle.high_water could not be written ({e:?}); subscribers get it with a later raise"
        );
    }
}

/// `tsoracle.high_water`'s OID, if it exists and is the extension's.
fn table() -> Option<pg_sys::Oid> {
    // SAFETY: syscache lookups by fixed names inside the transaction (missing_ok).
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"tsoracle".as_ptr(), true);
        if schema == pg_sys::InvalidOid {
            return None;
        }
        let relid = pg_sys::get_relname_relid(c"high_water".as_ptr(), schema);
        let extension = pg_sys::get_extension_oid(c"tsoracle".as_ptr(), true);
        (relid != pg_sys::InvalidOid
            && extension != pg_sys::InvalidOid
            && pg_sys::getExtensionOfObject(pg_sys::RelationRelationId, relid) == extension)
            .then_some(relid)
    }
}

/// Whether another transaction holds `relid` in `AccessExclusiveLock` (a rewrite, or a `LOCK
/// TABLE`): asked of the lock manager, taking no lock.
fn rewrite_possible(relid: pg_sys::Oid) -> bool {
    // SAFETY: a LOCKTAG set as SET_LOCKTAG_RELATION does; GetLockConflicts reads the lock
    // table under its partition lock and returns a palloc'd array, with the count in `count`.
    unsafe {
        let tag = pg_sys::LOCKTAG {
            locktag_field1: pg_sys::MyDatabaseId.to_u32(),
            locktag_field2: relid.to_u32(),
            locktag_field3: 0,
            locktag_field4: 0,
            locktag_type: pg_sys::LockTagType::LOCKTAG_RELATION as u8,
            locktag_lockmethodid: pg_sys::DEFAULT_LOCKMETHOD as u8,
        };
        let mut count: c_int = 0;
        pg_sys::GetLockConflicts(&tag, pg_sys::AccessShareLock as c_int, &mut count);
        count > 0
    }
}

/// The shape this code reads: a permanent heap table `(id boolean, physical_ms bigint, epoch
/// bigint, updated_at timestamptz, ...)`.
///
/// # Safety
/// `rel` is a valid relcache entry.
unsafe fn expected_shape(rel: pg_sys::Relation) -> bool {
    // SAFETY: rd_rel and rd_att are valid for a relcache entry.
    let (form, desc, natts) = unsafe { (&*(*rel).rd_rel, (*rel).rd_att, (*(*rel).rd_att).natts) };
    if form.relkind != pg_sys::RELKIND_RELATION as std::ffi::c_char
        || form.relam != pg_sys::HEAP_TABLE_AM_OID
        || form.relpersistence != pg_sys::RELPERSISTENCE_PERMANENT as std::ffi::c_char
        || natts < 4
    {
        return false;
    }
    let expected = [
        (pg_sys::BOOLOID, 1),
        (pg_sys::INT8OID, 8),
        (pg_sys::INT8OID, 8),
        (pg_sys::TIMESTAMPTZOID, 8),
    ];
    (0..4).all(|i| {
        // SAFETY: natts >= 4, so the first four attributes exist.
        let attr = unsafe { &*crate::pg::compat::tuple_desc_attr(desc, i) };
        (attr.atttypid, attr.attlen) == expected[i] && !attr.attisdropped
    })
}

fn in_place(plan: Plan<'_>) -> InPlace {
    // SAFETY: a process-local global set from the server's configuration.
    if unsafe { pg_sys::wal_level } < pg_sys::WalLevel::WAL_LEVEL_REPLICA as c_int {
        return InPlace::NotHere;
    }
    // No lock is taken, so nothing has read the invalidations other sessions sent: do it, so
    // that a trigger disabled or an index created before this moment is seen.
    // SAFETY: processing this backend's invalidation queue, inside a transaction.
    unsafe { pg_sys::AcceptInvalidationMessages() };
    let Some(relid) = table() else {
        return InPlace::NotHere;
    };
    if rewrite_possible(relid) {
        return InPlace::NotHere;
    }
    // SAFETY: a relcache entry by OID (NULL if the table is gone), closed below.
    let rel = unsafe { pg_sys::RelationIdGetRelation(relid) };
    if rel.is_null() {
        return InPlace::NotHere;
    }
    // SAFETY: rel is a valid relcache entry until RelationClose.
    let outcome = unsafe { write_rel(rel, relid, plan) };
    // SAFETY: releases the reference RelationIdGetRelation took.
    unsafe { pg_sys::RelationClose(rel) };
    outcome
}

/// # Safety
/// `rel` is the relcache entry of `tsoracle.high_water` (`relid`), referenced by the caller.
unsafe fn write_rel(rel: pg_sys::Relation, relid: pg_sys::Oid, plan: Plan<'_>) -> InPlace {
    // SAFETY: as the function's contract; rd_rel is valid for the entry.
    let (shaped, refusal, relfilenode) = unsafe {
        (
            expected_shape(rel),
            preconditions(rel, c"keep_what_was_issued", &[2, 3, 4]),
            (*(*rel).rd_rel).relfilenode,
        )
    };
    let published = match refusal {
        _ if !shaped => return InPlace::NotHere,
        Ok(()) => false,
        Err(Refusal::Published) => true,
        Err(_) => return InPlace::NotHere,
    };
    // SAFETY: the relation's current size, from its smgr.
    let blocks =
        unsafe { pg_sys::RelationGetNumberOfBlocksInFork(rel, pg_sys::ForkNumber::MAIN_FORKNUM) };
    let hint =
        LAST_ROW.get().filter(|&(r, f, block, _)| r == relid && f == relfilenode && block < blocks);
    let candidates = hint
        .map(|(_, _, block, offset)| (block, Some(offset)))
        .into_iter()
        .chain((0..blocks).map(|block| (block, None)));
    for (block, offset) in candidates {
        // SAFETY: block < blocks; pinned and locked until released in write_block.
        let outcome = unsafe { write_block(rel, block, offset, plan) };
        match outcome {
            Block::Written(raised, offset, lsn) => {
                LAST_ROW.set(Some((relid, relfilenode, block, offset)));
                // Trusted only if no rewrite may have copied the page before the write: none
                // holds the table now, and the table's file is still the one written.
                // SAFETY: processing this backend's invalidation queue; a syscache lookup.
                let same_file = unsafe {
                    pg_sys::AcceptInvalidationMessages();
                    pg_sys::RelationIdGetRelation(relid)
                };
                // SAFETY: a relcache entry (or NULL), closed at once.
                let unchanged = !same_file.is_null()
                    && unsafe {
                        let f = (*(*same_file).rd_rel).relfilenode;
                        pg_sys::RelationClose(same_file);
                        f == relfilenode
                    };
                if rewrite_possible(relid) || !unchanged {
                    LAST_ROW.set(None);
                    return InPlace::NotHere;
                }
                if lsn != 0 && make_durable(lsn).is_err() {
                    return InPlace::Refused(RaiseError::Unavailable(
                        "the wait for the synchronous standbys was cut short".into(),
                    ));
                }
                return InPlace::Done(raised, published);
            }
            Block::Refused(why) => return InPlace::Refused(why),
            Block::Busy => return InPlace::NotHere,
            Block::NotThere => continue,
        }
    }
    LAST_ROW.set(None);
    // No live row: the fence's first insert, or a table emptied underneath us.
    InPlace::NotHere
}

enum Block {
    /// Written: the row as read and written, its line pointer, the record's end (0: nothing
    /// needed writing).
    Written(Raised, u16, u64),
    Refused(RaiseError),
    /// The live row is here but locked by a running transaction.
    Busy,
    NotThere,
}

/// Look for the live row in `block` (at `offset` only, if given) and write it.
///
/// # Safety
/// `rel` is a valid relcache entry of a permanent heap table; `block` exists in it.
unsafe fn write_block(
    rel: pg_sys::Relation,
    block: u32,
    offset: Option<u16>,
    plan: Plan<'_>,
) -> Block {
    // SAFETY: the block exists; pinned, then locked exclusively, released at the end.
    let buffer = unsafe {
        let buffer = pg_sys::ReadBuffer(rel, block);
        pg_sys::LockBuffer(buffer, pg_sys::BUFFER_LOCK_EXCLUSIVE as c_int);
        buffer
    };
    // SAFETY: our exclusively locked buffer: nobody else writes the page until we unlock it.
    let page = unsafe {
        std::slice::from_raw_parts(
            pg_sys::BufferGetPage(buffer).cast::<u8>(),
            pg_sys::BLCKSZ as usize,
        )
    };
    let items =
        u16::try_from(usize::from(u16::from_ne_bytes([page[12], page[13]])).saturating_sub(24) / 4)
            .unwrap_or(0);
    // The live version: committed (by another transaction), whatever locks it.
    let committed = |t: &HighWaterTuple| row_free(t.xmin, t.xmin_committed, Xmax::None);
    let at = |o: u16| high_water_tuple(page, block, o).ok().filter(committed).map(|t| (o, t));
    let found = match offset {
        Some(o) => at(o),
        None => (1..=items).find_map(at),
    };
    let outcome = match found {
        None => Block::NotThere,
        Some((_, t)) if !row_free(t.xmin, t.xmin_committed, t.xmax) => Block::Busy,
        Some((o, t)) => {
            let (prior_ms, prior_epoch) = (t.physical_ms as u64, t.epoch as u64);
            match plan(prior_ms, prior_epoch) {
                Err(why) => Block::Refused(RaiseError::Refused(why)),
                Ok((ms, epoch)) => {
                    let raised = Raised {
                        prior_ms,
                        prior_epoch,
                        physical_ms: ms.max(prior_ms),
                        epoch: epoch.max(prior_epoch),
                    };
                    // SAFETY: a clock read.
                    let now = unsafe { pg_sys::GetCurrentTimestamp() };
                    // SAFETY: our exclusively locked buffer of a permanent table at wal_level
                    // >= replica (in_place checked); physical_at is 8-aligned, and epoch and
                    // updated_at are the 16 bytes after it.
                    let lsn = unsafe {
                        write_logged(
                            buffer,
                            t.physical_at,
                            &[raised.physical_ms as i64, raised.epoch as i64, now],
                        )
                    };
                    Block::Written(raised, o, lsn)
                }
            }
        }
    };
    // SAFETY: our lock and pin, taken above.
    unsafe { pg_sys::UnlockReleaseBuffer(buffer) };
    outcome
}

/// The MVCC path: `UPDATE … GREATEST …` of the row as `plan` says, in a subtransaction, with
/// the worker's `lock_timeout`. Inside a transaction; durable at its commit.
fn mvcc(plan: Plan<'_>) -> Result<Raised, RaiseError> {
    let read = subtransaction(|| {
        let row = Spi::get_two::<i64, i64>(
            "SELECT physical_ms, epoch FROM tsoracle.high_water WHERE id FOR UPDATE",
        );
        let Ok((Some(ms), Some(epoch))) = row else {
            return Err(RaiseError::NotOurs);
        };
        let (prior_ms, prior_epoch) = (ms.max(0) as u64, epoch.max(0) as u64);
        let (to_ms, to_epoch) = plan(prior_ms, prior_epoch).map_err(RaiseError::Refused)?;
        let written = Spi::get_two_with_args::<i64, i64>(
            "UPDATE tsoracle.high_water SET physical_ms = GREATEST(physical_ms, $1), \
                 epoch = GREATEST(epoch, $2), updated_at = pg_catalog.now() \
             WHERE id RETURNING physical_ms, epoch",
            &[(to_ms as i64).into(), (to_epoch as i64).into()],
        );
        match written {
            Ok((Some(ms), Some(epoch))) => Ok(Raised {
                prior_ms,
                prior_epoch,
                physical_ms: ms.max(0) as u64,
                epoch: epoch.max(0) as u64,
            }),
            _ => Err(RaiseError::NotOurs),
        }
    });
    let raised = match read {
        Ok(result) => result?,
        Err(e) => return Err(unavailable(&e)),
    };
    UNREPLICATED.set(false);
    Ok(raised)
}

fn unavailable(e: &Caught) -> RaiseError {
    RaiseError::Unavailable(format!("tsoracle.high_water: {e}"))
}
