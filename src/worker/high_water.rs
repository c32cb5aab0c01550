//! The durable high-water: raised in place (docs/high-water.md), with
//! no heavyweight lock a DBA's statement could make it wait for, and letting the allocator
//! serve up to what is durable.
//!
//! The row `id = true` of `tsoracle.high_water` is found by reading the table's pages (it
//! holds one live row; no index is used, so a `REINDEX` holding its index does not matter),
//! written under the page's exclusive buffer lock through `pg::inplace` when no running
//! transaction holds it locked, then flushed and acknowledged by the synchronous standbys
//! before anything is served from it. The check and the write run under the table's `ROW
//! EXCLUSIVE` lock, taken without waiting (`pg::inplace::with_table_locked`, as `tso_seq`'s
//! in-place path does): no rewrite, `CREATE INDEX` or `CREATE TRIGGER` can commit in between.
//! Otherwise — the lock not free, the row locked (`SELECT … FOR UPDATE`), any of
//! `pg::inplace::preconditions` refused (the table not exactly as the extension installed it,
//! logical decoding that could see it: `wal_level = logical`), `tsoracle.seq_in_place` off in
//! the server's configuration, or a function replaced during the write
//! (`pg::inplace::still_allowed`) — the MVCC `UPDATE` is used, with the
//! worker's short `lock_timeout`, and a failure leaves the window where it is until the next
//! tick.
//!
//! When the table is in a publication, the in-place write is followed by the MVCC update as
//! well, so that a subscriber (a blue/green switchover) receives every raise.

use super::state::Worker;
use crate::pg::guc;
use crate::pg::inplace::{
    make_durable, preconditions, row_free, still_allowed, with_table_locked, write_logged, Refusal,
};
use crate::pg::installed::HIGH_WATER;
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
    if unsafe { pg_sys::wal_level } < pg_sys::WalLevel::WAL_LEVEL_REPLICA as c_int
        || !guc::seq_in_place()
    {
        return InPlace::NotHere;
    }
    let Some(relid) = table() else {
        return InPlace::NotHere;
    };
    // The lock's acquisition reads the invalidations of everything committed before it: the
    // relcache entry opened under it is current.
    let written = with_table_locked(relid, || {
        // SAFETY: a relcache entry by OID under the table lock (NULL if the table was dropped
        // since it was looked up: then no write), closed below.
        let rel = unsafe { pg_sys::RelationIdGetRelation(relid) };
        if rel.is_null() {
            return Written::NotHere;
        }
        // SAFETY: rel is a valid, locked relcache entry until RelationClose.
        let outcome = unsafe { write_rel(rel, relid, plan) };
        // SAFETY: releases the reference taken above; the lock stays until
        // with_table_locked ends.
        unsafe { pg_sys::RelationClose(rel) };
        outcome
    });
    match written {
        None => InPlace::NotHere,
        Some(Written::Done(raised, lsn, published)) => {
            if lsn != 0 && make_durable(lsn).is_err() {
                return InPlace::Refused(RaiseError::Unavailable(
                    "the wait for the synchronous standbys was cut short".into(),
                ));
            }
            InPlace::Done(raised, published)
        }
        Some(Written::Refused(why)) => InPlace::Refused(why),
        Some(Written::NotHere) => InPlace::NotHere,
    }
}

/// What `write_rel` did under the table lock.
enum Written {
    /// Written (the row as read and written, the record's end, 0 if nothing needed
    /// writing; whether the table is in a publication), not yet durable.
    Done(Raised, u64, bool),
    Refused(RaiseError),
    NotHere,
}

/// # Safety
/// `rel` is the relcache entry of `tsoracle.high_water` (`relid`), referenced by the caller and
/// locked by `with_table_locked`.
unsafe fn write_rel(rel: pg_sys::Relation, relid: pg_sys::Oid, plan: Plan<'_>) -> Written {
    // SAFETY: as the function's contract; rd_rel is valid for the open relation.
    let (shaped, refusal, relfilenode) = unsafe {
        (expected_shape(rel), preconditions(rel, &HIGH_WATER), (*(*rel).rd_rel).relfilenode)
    };
    let published = match refusal {
        _ if !shaped => return Written::NotHere,
        Ok(()) => false,
        Err(Refusal::Published) => true,
        Err(_) => return Written::NotHere,
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
                // What can change without a lock that conflicts with ours (a trigger's
                // function replaced, a default of tsoracle.allow_drop set, a slot made), looked
                // at again: if it changed, the raise is written again as a row version (its
                // GREATEST keeps it).
                // SAFETY: rel is referenced and locked (the function's contract).
                if !unsafe { still_allowed(rel, &HIGH_WATER) } {
                    return Written::NotHere;
                }
                return Written::Done(raised, lsn, published);
            }
            Block::Refused(why) => return Written::Refused(why),
            Block::Busy => return Written::NotHere,
            Block::NotThere => continue,
        }
    }
    LAST_ROW.set(None);
    // No live row: the fence's first insert, or a table emptied underneath us.
    Written::NotHere
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
/// `rel` is a referenced, locked relcache entry of a permanent heap table; `block` exists in
/// it.
unsafe fn write_block(
    rel: pg_sys::Relation,
    block: u32,
    offset: Option<u16>,
    plan: Plan<'_>,
) -> Block {
    // SAFETY: the block exists; pinned here, locked exclusively below, released at the end.
    let buffer = unsafe { pg_sys::ReadBuffer(rel, block) };
    // Test builds: a pause with the page pinned but not locked, where a rewrite or an index
    // build that took no account of the table lock would read the page and commit before the
    // write.
    #[cfg(feature = "clock-fault")]
    {
        let pause = guc::test_high_water_pause_ms();
        if pause > 0 {
            // SAFETY: a plain sleep in the worker (test builds only).
            unsafe { pg_sys::pg_usleep((pause * 1000) as std::ffi::c_long) };
        }
    }
    // SAFETY: our own pin.
    unsafe { pg_sys::LockBuffer(buffer, pg_sys::BUFFER_LOCK_EXCLUSIVE as c_int) };
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
            "SELECT physical_ms, epoch FROM ONLY tsoracle.high_water WHERE id FOR UPDATE",
        );
        let Ok((Some(ms), Some(epoch))) = row else {
            return Err(RaiseError::NotOurs);
        };
        let (prior_ms, prior_epoch) = (ms.max(0) as u64, epoch.max(0) as u64);
        let (to_ms, to_epoch) = plan(prior_ms, prior_epoch).map_err(RaiseError::Refused)?;
        let written = Spi::get_two_with_args::<i64, i64>(
            "UPDATE ONLY tsoracle.high_water SET physical_ms = GREATEST(physical_ms, $1), \
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
