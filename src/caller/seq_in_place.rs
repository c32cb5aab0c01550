//! `tso_seq`'s in-place path: the calling backend advances an existing counter itself, at
//! the cost of one WAL flush, with no hand-off to the worker (docs/seq-in-place.md).
//!
//! Vocabulary. *In place*: `next` (and `updated_at`) are overwritten inside the live tuple
//! of the key's row, under the page's exclusive buffer lock, each with one aligned 8-byte
//! store, and the change is logged as a generic WAL record (`pg::inplace`, replayed by core
//! PostgreSQL on standbys and in point-in-time recovery). *MVCC writers*: everything else that
//! writes `tsoracle.seq` (the worker's group commit, the restore merge, a superuser's
//! statement). Each of them locks a row before it reads the value it writes back — the worker
//! with `FOR UPDATE`, the others through the row's `BEFORE UPDATE` trigger, which also refuses
//! a lowered counter — and an in-place writer leaves alone a row that a running transaction
//! has locked (`core::row_page`). So an MVCC writer never writes back a counter an in-place
//! writer has moved since, and one busy key never holds up another.
//!
//! The order of one call: lock the table `ROW EXCLUSIVE` without waiting (a DBA's lock on it —
//! `CREATE INDEX`, `VACUUM FULL`, `LOCK TABLE` — sends the call to the worker, whose own wait
//! is bounded), check the table's preconditions (`pg::inplace::preconditions`), find the row
//! through the primary key with a fresh snapshot, lock its buffer exclusively, check that the
//! line pointer still holds the live, unlocked version for this key, write, log, unlock the
//! buffer, look again at what can change without a conflicting lock
//! (`pg::inplace::still_allowed`), unlock the table, look for a handover requested
//! meanwhile, then flush
//! the record and wait for synchronous standbys as a commit would. Only then is the block
//! returned. A crash before the flush loses the record, and its block was never
//! returned; a later block's flush covers every earlier record.
//!
//! Anything unusual goes to the worker instead ([`try_advance`] returns `None`): another
//! database, a key that does not exist yet, a role that may not use the key (the worker
//! reports it), configured synchronous standbys (the worker's wait for them is bounded),
//! strict mode, `wal_level` other than `replica` (`minimal`: no WAL to write; `logical`:
//! decoding could miss it, here or on a standby, `pg::inplace::decodable`), a table locked by
//! someone else, a table that is not exactly as the extension installed it (`pg::installed`:
//! any trigger, rule, index, constraint, policy, column or child of someone else's, a trigger
//! not `ENABLE ALWAYS`, a trigger function replaced, a default of `tsoracle.allow_drop`, an
//! unlogged table), made or rewritten by the caller's own transaction, a logical slot or a
//! publication, a row version that is not plainly live, a row another transaction has
//! locked. A function replaced or a default set between the check and the write sends the
//! call to the worker after the write, and a handover requested then fails it: that block is
//! a gap, never returned.

use crate::pg::catalog::{counter_table, in_worker_database};
use crate::pg::error::TsoError;
use crate::pg::guc;
use crate::pg::inplace::{
    make_durable, preconditions, row_free, still_allowed, with_table_locked, write_logged,
};
use crate::pg::installed::SEQ;
use pgrx::pg_sys;
use std::ffi::c_int;
use tsoracle_core::row_page::counter_tuple;
use tsoracle_core::seq::block_end;

/// Whether synchronous standbys are configured, as the server's commits see it
/// (`WalSndCtl->sync_standbys_status`, which the checkpointer sets on every reload; not the
/// backend's own copy of `synchronous_standby_names`, which lags a reload). Unknown (not
/// initialised yet) counts as configured. Such calls go to the worker, whose wait for the
/// standbys is bounded (`tsoracle.extension_timeout_ms`, then 57P03); the in-place path
/// still waits for them itself after its flush, should they be configured in between.
fn synchronous_standbys_configured() -> bool {
    // SAFETY: WalSndCtl lives in shared memory for the server's life (NULL only before it is
    // set up); a one-byte volatile read of a flag the checkpointer writes.
    let status = unsafe {
        let ctl = pg_sys::WalSndCtl;
        if ctl.is_null() {
            return true;
        }
        std::ptr::read_volatile(&raw const (*ctl).sync_standbys_status)
    };
    u32::from(status) & pg_sys::SYNC_STANDBY_INIT == 0
        || u32::from(status) & pg_sys::SYNC_STANDBY_DEFINED != 0
}

/// Advance `key` by `count` in place, if this call may: the block's start and the key's
/// incarnation (`made`, read with the counter under the buffer lock); `Ok(None)` sends it to
/// the worker.
pub fn try_advance(key: &str, count: u64) -> Result<Option<(i64, i64)>, TsoError> {
    // A handed-over oracle grants nothing more, in place neither.
    if crate::shmem::signals()?.handover_requested() {
        return Err(TsoError::NotServing(crate::shmem::oracle::HANDED_OVER.into()));
    }
    // SAFETY: a process-local global set from the server's configuration.
    let wal_level = unsafe { pg_sys::wal_level };
    if !guc::seq_in_place()
        || guc::is_member()
        || guc::require_synchronous_standby()
        || wal_level < pg_sys::WalLevel::WAL_LEVEL_REPLICA as c_int
        || (synchronous_standbys_configured() && !guc::test_seq_in_place_under_sync())
        || !in_worker_database()
    {
        return Ok(None);
    }
    let Some(relid) = counter_table() else {
        return Ok(None);
    };
    // The table is held ROW EXCLUSIVE, without waiting, for the check and the write: a
    // DBA's lock on it (a rewrite, CREATE INDEX, CREATE TRIGGER, LOCK TABLE) sends the call
    // to the worker, whose own wait is bounded.
    // SAFETY: the table is locked while write_in_place runs; every pointer used there comes
    // from PostgreSQL for it.
    let written = with_table_locked(relid, || unsafe { write_in_place(relid, key, count) });
    let Some(Some((start, made, lsn))) = written else {
        return Ok(None);
    };
    // A handover requested between the check and the write may already have been followed
    // by a dump that read the page before the write: the block is a gap, and the call fails
    // as every later one does.
    if crate::shmem::signals()?.handover_requested() {
        return Err(TsoError::NotServing(crate::shmem::oracle::HANDED_OVER.into()));
    }
    #[cfg(feature = "clock-fault")]
    {
        let pause = guc::test_seq_pause_ms();
        if pause > 0 {
            // SAFETY: a plain sleep in the calling backend (test builds only).
            unsafe { pg_sys::pg_usleep((pause * 1000) as std::ffi::c_long) };
        }
    }
    if make_durable(lsn).is_err() {
        // A terminate ends the backend here (FATAL); a cancel was consumed by the wait.
        pgrx::check_for_interrupts!();
        return Err(TsoError::SyncWaitCancelled(format!(
            "the block of sequence \"{key}\" is not returned"
        )));
    }
    Ok(Some((start, made)))
}

/// Find the live row of `key` and advance it; `None` if it is not plainly there.
///
/// # Safety
/// `relid` is `tsoracle.seq`, locked `ROW EXCLUSIVE` by this transaction.
unsafe fn write_in_place(relid: pg_sys::Oid, key: &str, count: u64) -> Option<(i64, i64, u64)> {
    // SAFETY: the caller holds a lock on the relation.
    let rel = unsafe { pg_sys::table_open(relid, pg_sys::NoLock as c_int) };
    // SAFETY: rel is open until table_close below.
    let written = unsafe { locate_and_write(rel, key, count) };
    // What can change without a lock that conflicts with ours (a trigger's function replaced,
    // a default of tsoracle.allow_drop set, a slot made) is looked at again now that the
    // write is in the page: if it changed, the block is not returned (a gap), and the worker
    // advances the counter past it as a row version.
    // SAFETY: rel is open and locked.
    let result = written.filter(|_| unsafe { still_allowed(rel, &SEQ) });
    // SAFETY: closes what table_open opened; the lock stays with the caller.
    unsafe { pg_sys::table_close(rel, pg_sys::NoLock as c_int) };
    result
}

/// The table as this code reads it: a permanent heap table whose first columns are
/// `key text, next bigint, updated_at timestamptz, owner regrole` and, from 0.6.0,
/// `made bigint`, keyed by `key` alone.
///
/// # Safety
/// `rel` is open.
unsafe fn expected_shape(rel: pg_sys::Relation) -> Option<pg_sys::Oid> {
    // SAFETY: rd_rel and rd_att are valid for an open relation.
    let (form, desc, natts) = unsafe { (&*(*rel).rd_rel, (*rel).rd_att, (*(*rel).rd_att).natts) };
    if form.relkind != pg_sys::RELKIND_RELATION as std::ffi::c_char
        || form.relam != pg_sys::HEAP_TABLE_AM_OID
        || form.relpersistence != pg_sys::RELPERSISTENCE_PERMANENT as std::ffi::c_char
        || natts < 4
    {
        return None;
    }
    let expected = [
        (pg_sys::TEXTOID, -1),
        (pg_sys::INT8OID, 8),
        (pg_sys::TIMESTAMPTZOID, 8),
        (pg_sys::REGROLEOID, 4),
    ];
    let attrs: [&pg_sys::FormData_pg_attribute; 4] = std::array::from_fn(|i| {
        // SAFETY: natts >= 4, so the first four attributes exist, as long as rel is open.
        unsafe { &*crate::pg::compat::tuple_desc_attr(desc, i) }
    });
    for (attr, (typid, len)) in attrs.iter().zip(expected) {
        if attr.atttypid != typid || attr.attlen != len || attr.attisdropped {
            return None;
        }
    }
    if attrs[1].attalign != b'd' as std::ffi::c_char
        || attrs[2].attalign != b'd' as std::ffi::c_char
    {
        return None;
    }
    // made (0.6.0): a bigint after owner, read with the row; a schema without it reads 0.
    if natts >= 5 {
        // SAFETY: natts >= 5, so the fifth attribute exists, as long as rel is open.
        let made = unsafe { &*crate::pg::compat::tuple_desc_attr(desc, 4) };
        if made.atttypid != pg_sys::INT8OID
            || made.attlen != 8
            || made.attisdropped
            || made.attalign != b'd' as std::ffi::c_char
        {
            return None;
        }
    }
    // SAFETY: a relcache lookup for an open relation.
    let index = unsafe { crate::pg::compat::primary_key_index(rel) };
    (index != pg_sys::InvalidOid).then_some(index)
}

/// Where the live row of a key was last found by this backend: a hint, checked again under
/// the buffer lock like any other candidate (its line pointer must still hold the live
/// version of this key, with this owner), so that a repeated call skips the index scan.
/// A backend remembers its `LOCATED_KEYS` most recently used keys.
struct Located {
    relid: pg_sys::Oid,
    relfilenode: pg_sys::Oid,
    key: String,
    row: Candidate,
}

/// A line pointer that may hold the live row of a key, and the owner it was found with.
#[derive(Clone, Copy)]
struct Candidate {
    block: pg_sys::BlockNumber,
    offset: u16,
    owner: u32,
}

const LOCATED_KEYS: usize = 16;

thread_local! {
    static LOCATED: std::cell::RefCell<Vec<Located>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The hint for `key` in this relation file, if this backend has one.
fn located(relid: pg_sys::Oid, relfilenode: pg_sys::Oid, key: &str) -> Option<Candidate> {
    LOCATED.with_borrow(|all| {
        all.iter()
            .find(|l| l.relid == relid && l.relfilenode == relfilenode && l.key == key)
            .map(|l| l.row)
    })
}

/// Forget the hint for `key`; with `row`, remember that one instead, as the most recent.
fn relocate(key: &str, row: Option<Located>) {
    LOCATED.with_borrow_mut(|all| {
        all.retain(|l| l.key != key);
        if let Some(row) = row {
            if all.len() >= LOCATED_KEYS {
                all.remove(0);
            }
            all.push(row);
        }
    });
}

/// Whether the current role may use a key of `owner` (0: shared), as the worker decides.
fn may_use(owner: u32) -> bool {
    // SAFETY: catalog lookups inside the caller's transaction.
    unsafe {
        let role = pg_sys::GetUserId();
        owner == 0
            || role.to_u32() == owner
            || pg_sys::superuser_arg(role)
            || pg_sys::has_privs_of_role(role, pg_sys::Oid::from(owner))
    }
}

/// # Safety
/// `rel` is `tsoracle.seq`, open and locked `ROW EXCLUSIVE`.
unsafe fn locate_and_write(
    rel: pg_sys::Relation,
    key: &str,
    count: u64,
) -> Option<(i64, i64, u64)> {
    // SAFETY: rel is open.
    let index = unsafe { expected_shape(rel) }?;
    // next (2) and updated_at (3) are written in place.
    // SAFETY: rel is open, inside the caller's transaction.
    unsafe { preconditions(rel, &SEQ) }.ok()?;
    let pause = guc::test_seq_check_pause_ms();
    if pause > 0 {
        // SAFETY: a plain sleep in the calling backend (test builds only: 0 otherwise).
        unsafe { pg_sys::pg_usleep((pause * 1000) as std::ffi::c_long) };
    }
    // SAFETY: rd_rel is valid for an open relation.
    let (relid, relfilenode) = unsafe { ((*rel).rd_id, (*(*rel).rd_rel).relfilenode) };
    if let Some(row) = located(relid, relfilenode, key) {
        // SAFETY: as below; the block is checked against the relation's size first (no
        // truncation can run while the table lock is held).
        let written = unsafe { write_candidate(rel, row, key, count) };
        if written.is_some() {
            return written;
        }
        relocate(key, None);
    }
    // SAFETY: rel is open and locked; see found_row.
    let row = unsafe { found_row(rel, index, key) }?;
    // A role that may not use the key gets None here (write_candidate checks), and the
    // worker's refusal, with the owner's name.
    // SAFETY: row.block is a block of rel that the index pointed into just now.
    let written = unsafe { write_candidate(rel, row, key, count) };
    if written.is_some() {
        relocate(key, Some(Located { relid, relfilenode, key: key.to_string(), row }));
    }
    written
}

/// Write the block into the candidate line pointer, if it still holds the live version of
/// `key` with owner `owner` (whose use the caller has checked).
///
/// # Safety
/// `rel` is `tsoracle.seq`, open and locked `ROW EXCLUSIVE`.
unsafe fn write_candidate(
    rel: pg_sys::Relation,
    row: Candidate,
    key: &str,
    count: u64,
) -> Option<(i64, i64, u64)> {
    if !may_use(row.owner) {
        return None;
    }
    // SAFETY: the relation is open; smgr reports its current size.
    let blocks =
        unsafe { pg_sys::RelationGetNumberOfBlocksInFork(rel, pg_sys::ForkNumber::MAIN_FORKNUM) };
    if row.block >= blocks {
        return None;
    }
    // SAFETY: the block exists in rel; pinned until released below.
    let buffer = unsafe { pg_sys::ReadBuffer(rel, row.block) };
    // SAFETY: our own pin; exclusive, as a write and its WAL record require.
    unsafe { pg_sys::LockBuffer(buffer, pg_sys::BUFFER_LOCK_EXCLUSIVE as c_int) };
    // SAFETY: rel is open and WAL-logged (permanent, wal_level >= replica: checked by the
    // caller and expected_shape); the buffer is pinned and locked exclusively.
    let written = unsafe { advance_buffer(buffer, row, key, count) };
    // SAFETY: our lock and pin, taken above.
    unsafe { pg_sys::UnlockReleaseBuffer(buffer) };
    written
}

/// The row of `key` through the primary key, with a snapshot taken now (after the table
/// lock, so every MVCC writer that finished before it is visible): its block, line pointer
/// and owner (0 for a shared key).
///
/// # Safety
/// `rel` is open and locked; `index` is its primary key.
unsafe fn found_row(rel: pg_sys::Relation, index: pg_sys::Oid, key: &str) -> Option<Candidate> {
    let len = c_int::try_from(key.len()).ok()?;
    // SAFETY: all of the following runs inside the caller's transaction on an open,
    // locked relation; the snapshot is registered for the scan and unregistered after it;
    // the text datum is palloc'd in the current memory context.
    unsafe {
        let text = pg_sys::cstring_to_text_with_len(key.as_ptr().cast(), len);
        let mut scankey: pg_sys::ScanKeyData = std::mem::zeroed();
        let collation = (*crate::pg::compat::tuple_desc_attr((*rel).rd_att, 0)).attcollation;
        pg_sys::ScanKeyEntryInitialize(
            &mut scankey,
            0,
            1,
            pg_sys::BTEqualStrategyNumber as u16,
            pg_sys::InvalidOid,
            collation,
            pg_sys::Oid::from(pg_sys::F_TEXTEQ),
            pg_sys::Datum::from(text),
        );
        let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
        let scan = pg_sys::systable_beginscan(rel, index, true, snapshot, 1, &mut scankey);
        let tuple = pg_sys::systable_getnext(scan);
        let found = if tuple.is_null() {
            None
        } else {
            let tid = (*tuple).t_self;
            let block = (u32::from(tid.ip_blkid.bi_hi) << 16) | u32::from(tid.ip_blkid.bi_lo);
            let mut isnull = false;
            let owner = pg_sys::heap_getattr(tuple, 4, (*rel).rd_att, &mut isnull);
            let owner = if isnull { 0 } else { owner.value() as u32 };
            Some(Candidate { block, offset: tid.ip_posid, owner })
        };
        pg_sys::systable_endscan(scan);
        pg_sys::UnregisterSnapshot(snapshot);
        found
    }
}

/// Under the exclusive buffer lock: check the live version, write the advanced counter into
/// the page and log it; the block's start and the record's end position.
///
/// # Safety
/// `buffer` is a pinned, exclusively locked buffer of `tsoracle.seq`, which is open and
/// WAL-logged.
unsafe fn advance_buffer(
    buffer: pg_sys::Buffer,
    row: Candidate,
    key: &str,
    count: u64,
) -> Option<(i64, i64, u64)> {
    // SAFETY: our exclusively locked buffer: nobody else writes the page (not even hint
    // bits, which need a share lock), so its bytes may be read as a slice until it is dropped
    // below, before the write.
    let found = unsafe {
        let page = std::slice::from_raw_parts(
            pg_sys::BufferGetPage(buffer).cast::<u8>(),
            pg_sys::BLCKSZ as usize,
        );
        counter_tuple(page, row.block, row.offset, key.as_bytes())
    };
    // The hint bit is not always set yet: row_free asks the commit log. A version of this
    // very transaction (a superuser who wrote the table first), or one a running transaction
    // has locked, is never advanced in place.
    let tuple = found
        .ok()
        .filter(|t| t.owner == row.owner && row_free(t.xmin, t.xmin_committed, t.xmax))?;
    let end = block_end(tuple.next, count).ok()?;
    // SAFETY: a clock read.
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    // SAFETY: the buffer is ours, pinned and locked exclusively; the table is permanent and
    // wal_level >= replica (checked by try_advance and expected_shape); next_at is the
    // 8-aligned offset of `next` in this page, `updated_at` the 8 bytes after it.
    let lsn = unsafe { write_logged(buffer, tuple.next_at, &[end, now]) };
    Some((tuple.next, tuple.made, lsn))
}
