//! Who holds what the worker could not lock: the process behind a `55P03`, for its HINT.
//!
//! The worker never waits long for a lock (its `lock_timeout`, `FOR UPDATE SKIP LOCKED`); when
//! it gives up, its callers are told whom their call waits for: a backend's pid (which a DBA
//! can look up in `pg_stat_activity` or end), or a prepared transaction's xid.

use pgrx::pg_sys;
use tsoracle_core::locks::LockMode;

/// What keeps a lock from the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocker {
    /// A backend holds it, or waits for it ahead of the worker.
    Process(i32),
    /// A prepared transaction holds it (it survives restarts until COMMIT / ROLLBACK PREPARED).
    Prepared(u32),
    /// It could not be told (the holder ended meanwhile).
    Unknown,
}

impl Blocker {
    /// As the worker's reply carries it: a pid, or the xid of a prepared transaction negated,
    /// or 0.
    pub fn encode(self) -> i64 {
        match self {
            Blocker::Process(pid) => i64::from(pid),
            Blocker::Prepared(xid) => -i64::from(xid),
            Blocker::Unknown => 0,
        }
    }

    pub fn decode(v: i64) -> Blocker {
        match v {
            v if v > 0 => i32::try_from(v).map_or(Blocker::Unknown, Blocker::Process),
            v if v < 0 => u32::try_from(-v).map_or(Blocker::Unknown, Blocker::Prepared),
            _ => Blocker::Unknown,
        }
    }

    /// How a HINT names it.
    pub fn describe(self) -> String {
        match self {
            Blocker::Process(pid) => format!("process {pid}"),
            Blocker::Prepared(0) => "a prepared transaction (see pg_prepared_xacts)".to_string(),
            Blocker::Prepared(xid) => {
                format!("prepared transaction with xid {xid} (see pg_prepared_xacts)")
            }
            Blocker::Unknown => "another transaction".to_string(),
        }
    }
}

/// The transaction locking a row, from the row's `xmax`.
pub fn row_locker(xmax: u32) -> Blocker {
    if xmax == 0 {
        return Blocker::Unknown;
    }
    // SAFETY: lookups of a transaction id in the proc array and pg_subtrans, inside a
    // transaction; an xid that is no longer running gives 0 and its own id back.
    let pid = unsafe {
        let top = pg_sys::SubTransGetTopmostTransaction(xmax.into());
        pg_sys::BackendXidGetPid(top)
    };
    if pid > 0 {
        Blocker::Process(pid)
    } else if unsafe {
        // SAFETY: as above.
        pg_sys::TransactionIdIsInProgress(xmax.into())
    } {
        // Running, but in no backend: a prepared transaction.
        Blocker::Prepared(xmax)
    } else {
        Blocker::Unknown
    }
}

/// Who holds, or waits ahead for, a lock on relation `relid` of this database that conflicts
/// with `mode`: a holder first, then a waiter; never this process.
pub fn relation_blocker(relid: pg_sys::Oid, mode: LockMode) -> Blocker {
    // SAFETY: GetLockStatusData copies the lock table (under its partition locks) into memory
    // palloc'd in the current context, `nelements` entries; read here and freed with it.
    let (holders, waiters) = unsafe {
        let data = pg_sys::GetLockStatusData();
        if data.is_null() {
            return Blocker::Unknown;
        }
        let n = usize::try_from((*data).nelements).unwrap_or(0);
        let locks = if n == 0 || (*data).locks.is_null() {
            &[][..]
        } else {
            std::slice::from_raw_parts((*data).locks, n)
        };
        let me = pg_sys::MyProcPid;
        let here = |l: &&pg_sys::LockInstanceData| {
            l.locktag.locktag_type == pg_sys::LockTagType::LOCKTAG_RELATION as u8
                && l.locktag.locktag_field1 == pg_sys::MyDatabaseId.to_u32()
                && l.locktag.locktag_field2 == relid.to_u32()
                && l.pid != me
        };
        let holders: Vec<i32> = locks
            .iter()
            .filter(here)
            .filter(|l| mode.conflicts_with_mask(l.holdMask as u32))
            .map(|l| l.pid)
            .collect();
        let waiters: Vec<i32> = locks
            .iter()
            .filter(here)
            .filter(|l| {
                u8::try_from(l.waitLockMode)
                    .is_ok_and(|w| w > 0 && mode.conflicts_with(LockMode(w)))
            })
            .map(|l| l.pid)
            .collect();
        (holders, waiters)
    };
    if let Some(&pid) = holders.iter().find(|&&pid| pid > 0) {
        return Blocker::Process(pid);
    }
    if !holders.is_empty() {
        // A holder without a backend: a prepared transaction's dummy process.
        return Blocker::Prepared(0);
    }
    waiters.first().map_or(Blocker::Unknown, |&pid| Blocker::Process(pid))
}
