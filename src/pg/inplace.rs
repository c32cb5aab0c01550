//! Writing a row of one of the extension's tables in place: the mechanism under `tso_seq`'s
//! in-place advance (`caller::seq_in_place`) and the worker's raise of the high-water
//! (`worker::high_water`). The rules of when a row may be written so are in
//! `tsoracle_core::row_page`; here is what PostgreSQL needs around them.
//!
//! An in-place write makes no row version: WAL replay, standbys, crash recovery and
//! `pg_rewind` see it (its generic record names the block), but nothing that follows a table
//! through row versions, triggers, `xmin` or logical decoding does (docs/operations/in-place.md).
//! So a value is written in place only under conditions that nothing elsewhere can make false
//! without this server seeing it first, and both paths check them in the same way:
//!
//! - [`decodable`]: `wal_level` is below `logical`, and no logical slot of this database
//!   exists. Logical decoding reads only WAL written at `wal_level = logical`: a slot cannot
//!   be made below it, here or on a standby (PostgreSQL 16's decoding on a standby requires
//!   the level its primary's WAL records, and invalidates the standby's slots when it
//!   replays a record that lowers it), and a server that has a logical slot does not start
//!   below it. `wal_level` is a postmaster setting: it changes only across a restart, whose
//!   record of the new level comes before every record written after it, and a slot made
//!   later decodes only from where it was made. So no decoder anywhere — this server, a
//!   standby at any depth, one promoted after a failover, one that reconnects after a crash —
//!   ever reads a record written in place. At `wal_level = logical` nothing is written in
//!   place: the primary learns that a standby decodes only from feedback that may be
//!   switched off, lost in a crash before a checkpoint, not yet sent to a new primary, or
//!   never sent (a cascaded standby, a standby without a physical slot, one that restores
//!   from the WAL archive), so nothing it can check would cover them all. The slot check
//!   stands guard for a server that could make decoding possible without a restart, before
//!   and after the write, as for a slot made between the two.
//! - [`with_table_locked`]: the table is held `ROW EXCLUSIVE`, taken without waiting, for the
//!   check and the write. That lock conflicts with every rewrite (`VACUUM FULL`, `CLUSTER`,
//!   pg_repack's swap, `ALTER TABLE`), `CREATE TRIGGER` and `CREATE INDEX`; its acquisition
//!   reads the invalidations of everything that committed before it, so the relcache entry
//!   read under it is current, and no file is dropped under the write.
//! - [`preconditions`]: the table is exactly as the extension installed it, compared as a
//!   whole (`pg::installed`: columns, constraints, indexes, triggers — its own `BEFORE
//!   UPDATE` trigger, which locks a row before an MVCC writer computes what it writes, `ENABLE
//!   ALWAYS` —, the triggers' functions and their owners, inheritance children, rules,
//!   policies, persistence, and no default of `tsoracle.allow_drop`), so DDL nobody listed
//!   turns the path off too; the file was not made by the open transaction (its abort would
//!   throw the write away); nothing could decode it ([`decodable`]); no publication
//!   publishes it.
//! - [`still_allowed`] after the write, still under the table lock, and the caller's own
//!   checks that need no lock (a handover): what can change without a lock that conflicts
//!   with ours (a function replaced, a default of `tsoracle.allow_drop` set, a slot made)
//!   between the check and the write makes the write untrusted (the caller then takes the
//!   row-version path too, and what it wrote in place is a gap).
//! - [`row_free`]: under the buffer lock, the row's `xmin` committed and no running
//!   transaction holds a lock on it.
//! - [`write_logged`]: the new values stored, each with one aligned 8-byte store (a reader
//!   holding only a pin never sees half of one), and logged as a generic WAL record that core
//!   PostgreSQL replays on standbys and in recovery — built here, one fragment for the
//!   columns written, rather than through `GenericXLogStart`, which copies and diffs the
//!   whole page under the lock.
//! - [`make_durable`]: flushed, and on the synchronous standbys, as a commit with
//!   `synchronous_commit = on` would be, before anything is served from it.

use super::compat;
use super::installed::Installed;
use pgrx::pg_sys;
use std::ffi::c_int;
use std::sync::atomic::{AtomicI64, Ordering};
use tsoracle_core::row_page::{generic_fragment, Xmax};
use tsoracle_core::seq::may_return_after_sync_wait;

/// Why a table may not be written in place right now (its writes then take the MVCC path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The table is not exactly as the extension installed it (`pg::installed`): a trigger,
    /// rule, index, constraint, policy, column, child, persistence, trigger function or
    /// default of `tsoracle.allow_drop` of someone else's.
    NotAsInstalled,
    /// The open transaction created the table or gave it a new file.
    NewFile,
    /// Logical decoding could see the write ([`decodable`]).
    Decodable,
    /// A publication publishes its updates.
    Published,
}

/// Lock table `relid` `ROW EXCLUSIVE` without waiting and run `f` under the lock, then
/// release it; `None` if the lock is not free now (a rewrite, a `CREATE INDEX` or
/// `CREATE TRIGGER`, a `LOCK TABLE`, or someone waiting for one of those: the write then
/// takes the MVCC path, whose own wait is bounded). A lock the transaction held before is
/// kept: the lock manager counts acquisitions.
pub fn with_table_locked<T>(relid: pg_sys::Oid, f: impl FnOnce() -> T) -> Option<T> {
    // SAFETY: inside the caller's transaction; never a wait. If `f` raises an error, the
    // transaction's abort releases the lock.
    if !unsafe { pg_sys::ConditionalLockRelationOid(relid, pg_sys::RowExclusiveLock as c_int) } {
        return None;
    }
    let result = f();
    // SAFETY: releases the acquisition taken above.
    unsafe { pg_sys::UnlockRelationOid(relid, pg_sys::RowExclusiveLock as c_int) };
    Some(result)
}

/// Whether `rel` may be written in place: nothing could decode it, exactly as the extension
/// installed `table` (`pg::installed`, which reads the invalidations of everything committed
/// before), its file not new in this transaction, in no publication.
///
/// # Safety
/// `rel` is an open relation, locked by [`with_table_locked`], inside a transaction.
pub unsafe fn preconditions(rel: pg_sys::Relation, table: &Installed) -> Result<(), Refusal> {
    if decodable() {
        return Err(Refusal::Decodable);
    }
    // SAFETY: the caller's contract.
    if !unsafe { super::installed::as_installed(rel, table) } {
        return Err(Refusal::NotAsInstalled);
    }
    // SAFETY: the caller's contract: an open relation.
    if unsafe { compat::file_new_in_transaction(rel) } {
        return Err(Refusal::NewFile);
    }
    // SAFETY: the open relation's publication descriptor (cached in its relcache entry),
    // built into a local.
    unsafe {
        let mut publications: pg_sys::PublicationDesc = std::mem::zeroed();
        pg_sys::RelationBuildPublicationDesc(rel, &mut publications);
        let actions = publications.pubactions;
        if actions.pubinsert || actions.pubupdate || actions.pubdelete || actions.pubtruncate {
            return Err(Refusal::Published);
        }
    }
    Ok(())
}

/// After the write, still under the table lock: whether what can change without a lock that
/// conflicts with it (a trigger's function replaced, a default of `tsoracle.allow_drop` set, a
/// child made, a slot made) still allows it. If not, the write is untrusted: the caller takes
/// the row-version path too, and returns nothing it wrote in place.
///
/// # Safety
/// As [`preconditions`].
pub unsafe fn still_allowed(rel: pg_sys::Relation, table: &Installed) -> bool {
    // SAFETY: the caller's contract.
    !decodable() && unsafe { super::installed::as_installed(rel, table) }
}

/// `ReplicationSlotControlLock`: `MainLWLockArray[37]` in every supported major (a macro in
/// lwlock.h, so no binding).
const REPLICATION_SLOT_CONTROL_LOCK: usize = 37;

/// Whether logical decoding could see a write made now, on this server or on any standby:
/// `wal_level` is `logical` (the module's comment says why nothing less will do), or a
/// logical slot of this database exists, whatever its plugin, still being created too.
pub fn decodable() -> bool {
    // SAFETY: a process-local global set from the server's configuration: a postmaster
    // setting, the same in every process for the server's life.
    if unsafe { pg_sys::wal_level } >= pg_sys::WalLevel::WAL_LEVEL_LOGICAL as c_int {
        return true;
    }
    // SAFETY: ReplicationSlotCtl is set up in shared memory with max_replication_slots
    // entries (NULL only before that); `in_use` and `data.database` change only under
    // ReplicationSlotControlLock held exclusively, read here under it in shared mode.
    unsafe {
        let ctl = pg_sys::ReplicationSlotCtl;
        let count = usize::try_from(pg_sys::max_replication_slots).unwrap_or(0);
        if ctl.is_null() || count == 0 {
            return false;
        }
        let lock = &raw mut (*pg_sys::MainLWLockArray.add(REPLICATION_SLOT_CONTROL_LOCK)).lock;
        pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_SHARED);
        let slots = std::slice::from_raw_parts((*ctl).replication_slots.as_ptr(), count);
        let database = pg_sys::MyDatabaseId;
        let found = slots.iter().any(|slot| slot.in_use && slot.data.database == database);
        pg_sys::LWLockRelease(lock);
        found
    }
}

/// Whether a row found with `xmin` (`hinted`: the page already says it committed) and `xmax`
/// may be written in place: inserted by a committed transaction other than this one, and not
/// locked by a running one.
pub fn row_free(xmin: u32, hinted: bool, xmax: Xmax) -> bool {
    // SAFETY: commit-log and proc-array lookups of transaction ids, inside a transaction.
    unsafe {
        let committed = hinted
            || (!pg_sys::TransactionIdIsCurrentTransactionId(xmin.into())
                && pg_sys::TransactionIdDidCommit(xmin.into()));
        committed
            && match xmax {
                Xmax::None => true,
                Xmax::LockedBy(xid) => !pg_sys::TransactionIdIsInProgress(xid.into()),
            }
    }
}

/// Store `values` as consecutive 8-byte columns at byte `at` of the buffer's page and log the
/// change; returns the record's end position, to flush.
///
/// # Safety
/// `buffer` is pinned and locked exclusively by this backend, and belongs to a permanent
/// relation at `wal_level >= replica`; `at .. at + 8 * values.len()` lies inside the page, on
/// an 8-byte boundary, over columns of the row `core::row_page` found there.
pub unsafe fn write_logged(buffer: pg_sys::Buffer, at: usize, values: &[i64]) -> u64 {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    // wal_consistency_checking compares a replayed page with the primary's image, hint bits
    // included, which a delta does not carry: log the whole page then (and apply it on redo).
    // SAFETY: the array is allocated for every resource manager once the setting is parsed
    // (NULL before that).
    let full_image = unsafe {
        let checking = pg_sys::wal_consistency_checking;
        !checking.is_null() && *checking.add(pg_sys::RmgrIds::RM_GENERIC_ID as usize)
    };
    let fragment = generic_fragment(at, &bytes, pg_sys::BLCKSZ as usize);
    // SAFETY: the caller's contract: our exclusively locked page, the region inside it and
    // aligned. Inside a critical section (as GenericXLogFinish does it) the stores, the dirty
    // mark, the record and the page LSN go together: an error in between would be a PANIC,
    // never a page changed without its WAL. XLogRegisterBufData keeps a pointer to `fragment`,
    // which lives until after XLogInsert.
    unsafe {
        let page = pg_sys::BufferGetPage(buffer).cast::<u8>();
        pg_sys::XLogBeginInsert();
        pg_sys::CritSectionCount += 1;
        for (i, v) in values.iter().enumerate() {
            AtomicI64::from_ptr(page.add(at + 8 * i).cast::<i64>()).store(*v, Ordering::Relaxed);
        }
        pg_sys::MarkBufferDirty(buffer);
        match (&fragment, full_image) {
            (Some(fragment), false) => {
                pg_sys::XLogRegisterBuffer(0, buffer, pg_sys::REGBUF_STANDARD as u8);
                pg_sys::XLogRegisterBufData(
                    0,
                    fragment.as_ptr().cast_mut().cast(),
                    fragment.len() as _,
                );
            }
            _ => pg_sys::XLogRegisterBuffer(
                0,
                buffer,
                (pg_sys::REGBUF_FORCE_IMAGE | pg_sys::REGBUF_STANDARD) as u8,
            ),
        }
        let lsn = pg_sys::XLogInsert(pg_sys::RmgrIds::RM_GENERIC_ID as pg_sys::RmgrId, 0);
        // PageSetLSN: pd_lsn is the page's first 8 bytes, {xlogid: high 32, xrecoff: low 32}.
        page.cast::<u32>().write((lsn >> 32) as u32);
        page.add(4).cast::<u32>().write(lsn as u32);
        pg_sys::CritSectionCount -= 1;
        lsn
    }
}

/// A position at or past the end of every WAL record inserted so far (by any backend), that
/// `make_durable` can flush to: the end of a no-op record inserted now. The insert position
/// itself is not one (at a page boundary it points past the next page's header, which no
/// flush can reach until more WAL is written, and `XLogFlush` then fails).
pub fn end_of_wal() -> u64 {
    let mut byte = [0u8; 1];
    // SAFETY: a record of the XLOG resource manager's no-op type with one byte of data, as
    // any backend may insert (replay ignores it); the data lives until after XLogInsert.
    // Marked unimportant, as PostgreSQL marks its own bookkeeping records: an idle server
    // still skips checkpoints and archive_timeout's segment switches.
    unsafe {
        pg_sys::XLogBeginInsert();
        pg_sys::XLogSetRecordFlags(pg_sys::XLOG_MARK_UNIMPORTANT as u8);
        pg_sys::XLogRegisterData(byte.as_mut_ptr() as _, 1 as _);
        pg_sys::XLogInsert(pg_sys::RmgrIds::RM_XLOG_ID as pg_sys::RmgrId, pg_sys::XLOG_NOOP as u8)
    }
}

/// A write made in place was not acknowledged by the synchronous standbys: a cancel cut the
/// wait short. It is never served from.
#[derive(Clone, Copy, Debug)]
pub struct NotAcknowledged;

/// Flush WAL up to `lsn` and wait, as a commit with `synchronous_commit = on` would, for the
/// synchronous standbys to acknowledge it, whatever the caller's own `synchronous_commit` says.
pub fn make_durable(lsn: u64) -> Result<(), NotAcknowledged> {
    // SAFETY: flushing WAL up to a position this backend inserted (or any lower one).
    unsafe { pg_sys::XLogFlush(lsn) };
    // A cancel that came in before the wait ends the call here, before it can be lost.
    pgrx::check_for_interrupts!();
    // The wait's mode comes from the setting's assign hook (syncrep.c's SyncRepWaitMode),
    // so the setting is changed through the GUC machinery, at a nesting level of its own, as
    // for a function's SET clause, and put back right after the wait.
    // SAFETY: set_config_option and AtEOXact_GUC inside the caller's transaction, with
    // static NUL-terminated strings; synchronous_commit is a USERSET setting, so any caller
    // may set it. The wait is for this backend's own WAL position, with interrupts held as
    // for a commit (HOLD_INTERRUPTS): it reads the cancel and terminate flags itself, ends
    // without an error on either (a WARNING), and that is checked right after.
    // At `on` or `remote_apply` (the default is `on`) the wait's mode is already the flush.
    unsafe {
        let weaker = pg_sys::synchronous_commit
            < pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_REMOTE_FLUSH as c_int;
        let nest = weaker.then(|| pg_sys::NewGUCNestLevel());
        if weaker {
            pg_sys::set_config_option(
                c"synchronous_commit".as_ptr(),
                c"on".as_ptr(),
                pg_sys::GucContext::PGC_USERSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            );
        }
        pg_sys::InterruptHoldoffCount += 1;
        pg_sys::SyncRepWaitForLSN(lsn, false);
        pg_sys::InterruptHoldoffCount -= 1;
        if let Some(nest) = nest {
            pg_sys::AtEOXact_GUC(true, nest);
        }
    }
    // SAFETY: volatile reads of flags the signal handlers set, and of the acknowledged
    // flush position in shared memory (WalSndCtl exists whenever a backend runs; an 8-byte
    // aligned load, never torn; a stale value is lower, which only refuses).
    let (interrupted, acknowledged) = unsafe {
        let interrupted = std::ptr::read_volatile(&raw const pg_sys::InterruptPending) != 0
            || std::ptr::read_volatile(&raw const pg_sys::ProcDiePending) != 0;
        let ctl = pg_sys::WalSndCtl;
        let acknowledged = if ctl.is_null() {
            0
        } else {
            std::ptr::read_volatile(&raw const (*ctl).lsn[pg_sys::SYNC_REP_WAIT_FLUSH as usize])
        };
        (interrupted, acknowledged)
    };
    if may_return_after_sync_wait(lsn, acknowledged, interrupted) {
        Ok(())
    } else {
        Err(NotAcknowledged)
    }
}
