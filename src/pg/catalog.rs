//! Catalog lookups of the extension's own objects, by fixed names (no `search_path` is
//! involved): the worker's database, and `tsoracle.seq` as a member of the extension.

use pgrx::pg_sys;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// Whether this backend is connected to the worker's database (fixed for its life).
static IN_WORKER_DATABASE: OnceLock<bool> = OnceLock::new();

pub fn in_worker_database() -> bool {
    *IN_WORKER_DATABASE.get_or_init(|| {
        let Ok(name) = std::ffi::CString::new(super::guc::database()) else {
            return false;
        };
        // SAFETY: a syscache lookup by name inside the caller's transaction; missing_ok.
        let oid = unsafe { pg_sys::get_database_oid(name.as_ptr(), true) };
        // SAFETY: MyDatabaseId is set before any SQL runs in a backend.
        oid != pg_sys::InvalidOid && oid == unsafe { pg_sys::MyDatabaseId }
    })
}

/// `check()` for table `oid`, remembered in `cache` once it held: a table's OID changes only
/// when it is made again (`DROP` / `CREATE EXTENSION`), and a new OID is checked again.
pub fn once_per_table(cache: &AtomicU32, oid: pg_sys::Oid, check: impl FnOnce() -> bool) -> bool {
    if cache.load(Ordering::Relaxed) == oid.to_u32() {
        return true;
    }
    let held = check();
    if held {
        cache.store(oid.to_u32(), Ordering::Relaxed);
    }
    held
}

/// The last table found to be the extension's own `tsoracle.seq`.
static MEMBER_TABLE: AtomicU32 = AtomicU32::new(0);

/// `tsoracle.seq`'s OID in this database, if the extension is installed and the table is a
/// member of it (in `pg_depend`): never a look-alike made by whoever owns the schema's name.
pub fn counter_table() -> Option<pg_sys::Oid> {
    // SAFETY: syscache lookups by name inside the caller's transaction (missing_ok); the
    // names are fixed, so no search_path is involved.
    let oid = unsafe {
        let schema = pg_sys::get_namespace_oid(c"tsoracle".as_ptr(), true);
        if schema == pg_sys::InvalidOid {
            return None;
        }
        pg_sys::get_relname_relid(c"seq".as_ptr(), schema)
    };
    let member = oid != pg_sys::InvalidOid
        && once_per_table(&MEMBER_TABLE, oid, || {
            // SAFETY: catalog lookups inside the caller's transaction.
            unsafe {
                let extension = pg_sys::get_extension_oid(c"tsoracle".as_ptr(), true);
                extension != pg_sys::InvalidOid
                    && pg_sys::getExtensionOfObject(pg_sys::RelationRelationId, oid) == extension
            }
        });
    member.then_some(oid)
}
