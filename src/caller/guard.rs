//! The drop guard: nothing that holds the order is dropped by accident.
//!
//! The durable high-water lives in `tsoracle.high_water`, in the database named by
//! `tsoracle.database`. Dropping it — `DROP EXTENSION tsoracle`, a `DROP SCHEMA … CASCADE`
//! or `DROP OWNED … CASCADE` that takes the extension with it, `DROP DATABASE` of that
//! database — and then restarting would let the oracle start again from the clock, below
//! values it already returned (an hour below after a `tso_seed()` an hour ahead). So every
//! such drop is refused (`55006`, with a HINT) unless a superuser has set
//! `tsoracle.allow_drop = on` in the dropping session, which says they accept it.
//!
//! The check sits in PostgreSQL's `object_access_hook`, which every deletion goes through
//! (`deleteOneObject`, `dropdb`), whatever command or cascade caused it, so no spelling of the
//! drop escapes it; in this server's lifetime the worker also remembers the highest
//! high-water it committed, so a permitted drop followed by `CREATE EXTENSION` without a
//! restart still continues above it.

use crate::pg::error::TsoError;
use crate::pg::guc;
use crate::shmem::{Phase, ORACLE};
use pgrx::pg_guard;
use pgrx::pg_sys;
use std::ffi::CStr;

/// The hook that was installed before ours (another extension's), called first.
static mut PREVIOUS_HOOK: pg_sys::object_access_hook_type = None;

/// Install the hook (from `_PG_init`, while preloading).
pub fn init() {
    // SAFETY: called once per process from _PG_init, before any SQL runs (backends are
    // single-threaded); chaining to the previous hook is PostgreSQL's convention.
    unsafe {
        PREVIOUS_HOOK = pg_sys::object_access_hook;
        pg_sys::object_access_hook = Some(object_access);
    }
}

/// Runs for every object access of every backend (each function a query executes included),
/// so it does no more than chain and compare unless an object is dropped. No pgrx guard here:
/// nothing in it can raise an error or panic but the previous hook, which PostgreSQL's
/// convention lets raise (its longjmp passes this frame, which owns nothing to drop), and the
/// drop check, which has its own guard.
unsafe extern "C-unwind" fn object_access(
    access: pg_sys::ObjectAccessType::Type,
    class_id: pg_sys::Oid,
    object_id: pg_sys::Oid,
    sub_id: std::ffi::c_int,
    arg: *mut std::ffi::c_void,
) {
    // SAFETY: PREVIOUS_HOOK is written only in init, before any SQL runs.
    if let Some(previous) = unsafe { PREVIOUS_HOOK } {
        // SAFETY: the previous hook, with the arguments PostgreSQL gave us.
        unsafe { previous(access, class_id, object_id, sub_id, arg) };
    }
    if access == pg_sys::ObjectAccessType::OAT_DROP && sub_id == 0 {
        // SAFETY: a guarded function, called from the hook with PostgreSQL's arguments.
        unsafe { check_drop(class_id, object_id) };
    }
}

/// Refuse (or warn of) the drop of an object that holds the order.
#[pg_guard]
unsafe extern "C-unwind" fn check_drop(class_id: pg_sys::Oid, object_id: pg_sys::Oid) {
    // pg_upgrade (`postgres -b`) rebuilds the new cluster's databases before its files are
    // replaced by the old cluster's: nothing there holds the order yet.
    // SAFETY: a process-local global set at postmaster start.
    if unsafe { pg_sys::IsBinaryUpgrade } {
        return;
    }
    if let Some(what) = guarded(class_id, object_id) {
        if guc::allow_drop() {
            pgrx::warning!(
                "tsoracle: {what} is dropped with tsoracle.allow_drop on: the durable high-water goes with it; after CREATE EXTENSION tsoracle, run SELECT tso_seed({}) before the server restarts, or timestamps may repeat",
                ORACLE.share().max_committed_ms
            );
        } else {
            TsoError::DropRefused { what, resume_ms: ORACLE.share().max_committed_ms }.report();
        }
    }
}

/// What the object is, if it holds the order: the extension or its high-water table in the
/// worker's database, or that database once this server has committed a high-water.
fn guarded(class_id: pg_sys::Oid, object_id: pg_sys::Oid) -> Option<String> {
    let database = guc::database();
    if class_id == pg_sys::DatabaseRelationId {
        // SAFETY: a syscache lookup by OID inside the dropping transaction; NULL if unknown.
        let name = unsafe { pg_sys::get_database_name(object_id) };
        if name.is_null() {
            return None;
        }
        // SAFETY: not NULL, so a palloc'd NUL-terminated string, copied at once.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
        let st = ORACLE.share();
        let holds_order = st.max_committed_ms > 0
            || !matches!(st.phase, Phase::Starting | Phase::WaitingForExtension);
        return (name == database && holds_order)
            .then(|| format!("database \"{name}\" (tsoracle.database)"));
    }
    if class_id != pg_sys::ExtensionRelationId && class_id != pg_sys::RelationRelationId {
        return None;
    }
    if !in_worker_database(&database) {
        return None;
    }
    if class_id == pg_sys::ExtensionRelationId {
        // SAFETY: a catalog lookup inside the dropping transaction; missing_ok.
        let ours = unsafe { pg_sys::get_extension_oid(c"tsoracle".as_ptr(), true) };
        return (ours == object_id).then(|| "extension tsoracle".to_string());
    }
    // SAFETY: catalog lookups inside the dropping transaction; missing_ok / InvalidOid.
    let table = unsafe {
        let schema = pg_sys::get_namespace_oid(c"tsoracle".as_ptr(), true);
        if schema == pg_sys::InvalidOid {
            return None;
        }
        pg_sys::get_relname_relid(c"high_water".as_ptr(), schema)
    };
    (table != pg_sys::InvalidOid && table == object_id)
        .then(|| "table tsoracle.high_water of extension tsoracle".to_string())
}

/// Is this session connected to `tsoracle.database`?
fn in_worker_database(database: &str) -> bool {
    // SAFETY: MyDatabaseId is set for every backend that runs SQL; the name is a syscache
    // lookup (NULL if the database is gone), copied at once.
    unsafe {
        let name = pg_sys::get_database_name(pg_sys::MyDatabaseId);
        !name.is_null() && CStr::from_ptr(name).to_bytes() == database.as_bytes()
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test(
        error = "cannot drop table tsoracle.high_water of extension tsoracle: it holds the durable high-water of tsoracle, below which no timestamp may be issued again"
    )]
    fn drop_extension_is_refused() {
        Spi::run("DROP EXTENSION tsoracle CASCADE").unwrap();
    }

    #[pg_test(error = "permission denied to set parameter \"tsoracle.allow_drop\"")]
    fn only_superusers_may_allow_a_drop() {
        Spi::run("CREATE ROLE tso_not_super NOLOGIN; SET ROLE tso_not_super").unwrap();
        Spi::run("SET tsoracle.allow_drop = on").unwrap();
    }

    /// The setting that offsets the clock exists in the tests' build only.
    #[cfg(not(feature = "clock-fault"))]
    #[pg_test(error = "invalid configuration parameter name \"tsoracle.test_clock_offset_ms\"")]
    fn a_release_build_cannot_offset_its_clock() {
        Spi::run("SET tsoracle.test_clock_offset_ms = 1000").unwrap();
    }
}
