//! Whether one of the extension's tables is exactly as the extension installed it — the first
//! condition of an in-place write (`pg::inplace::preconditions`).
//!
//! An in-place write makes no row version, fires no trigger or rule, updates no index and
//! checks no constraint. Rather than refusing the readers someone thought of (a trigger, an
//! index on the columns written), the table is described as a whole from its relcache entry —
//! its kind, access method and persistence, whether it has rules, row security or a type;
//! every column (name, type, `NOT NULL`, default, generated, identity, inherited from a
//! parent); every `CHECK` constraint as PostgreSQL deparses it; every index as
//! `pg_get_indexdef` prints it; every trigger as `pg_get_triggerdef` prints it, and whether it
//! fires; every policy; whether it has inheritance children — and, since what an MVCC writer
//! may do to a row an in-place writer advanced is decided by the triggers' functions, each of
//! those functions and `tsoracle.note_restore()` that they call (language, volatility,
//! security, `SET` clauses, source, and that a superuser owns it) — and that description must
//! equal the one the extension installs, to the letter (the functions' sources as
//! `sql/finalize.sql` has them). Any DDL that changes one of these, thought of or not, turns
//! the in-place path off until it is undone; the table's other writers are unaffected. (A
//! dropped column is left out: nothing reads or writes it.) An inheritance child made since
//! is seen by its parent's `relhassubclass`, which only a later `ANALYZE` of the table clears
//! once the child is gone.
//!
//! The description is worked out once per backend and table, and again after any relcache
//! invalidation of the table (PostgreSQL sends one for every change to what is described:
//! `CacheRegisterRelcacheCallback`) and any change to a function or a role
//! (`CacheRegisterSyscacheCallback` on `pg_proc` and `pg_authid`: `CREATE OR REPLACE
//! FUNCTION` sends no invalidation of the table), so a call pays for it only after DDL. The
//! callers hold the table `ROW EXCLUSIVE` from before the check until after the write, which
//! every DDL that changes the table's own description conflicts with (the one that does not,
//! `CREATE INDEX CONCURRENTLY`, enters its index in the catalog and then waits for that lock
//! to go); what needs no such lock (a function replaced, a child made) is checked again after
//! the write (`pg::inplace::still_allowed`).
//!
//! Settings change what the trigger does too: `tsoracle.allow_drop` lets a superuser's
//! session lower a counter. It is on in no session that nobody set it in explicitly: it is
//! off in this one and in the server's configuration (this session's reset value), and no
//! database or role has a default for it (`pg_db_role_setting`, which no invalidation
//! covers: read on every check). A superuser's own `SET tsoracle.allow_drop = on` is the
//! acceptance of the loss the setting exists for (docs/operations/in-place.md).

use pgrx::pg_sys;
use std::ffi::{c_char, CStr};
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// One of the tables written in place, with its description as installed.
pub struct Installed {
    /// The description `describe` gives of the table as the extension installs it.
    description: &'static str,
    /// The relation last found as installed by this backend (0: none since the last
    /// invalidation of it).
    verified: AtomicU32,
}

/// `tsoracle.seq`, as `sql/schema.sql` and `sql/finalize.sql` make it (and the upgrade
/// chain from 0.1.0: the same objects).
pub static SEQ: Installed = Installed {
    description: "\
relation kind r, heap, persistence p, rules false, row security false/false, partition false, typed false, children false
column key text not null
column next bigint not null
column updated_at timestamp with time zone not null default now()
column owner regrole
column made bigint not null default 0
check seq_key_check valid inherited ((octet_length(key) >= 1) AND (octet_length(key) <= 128))
check seq_made_check valid inherited (made >= 0)
check seq_next_check valid inherited (next >= 0)
index CREATE UNIQUE INDEX seq_pkey ON tsoracle.seq USING btree (key) primary
trigger CREATE TRIGGER keep_what_was_issued BEFORE UPDATE ON tsoracle.seq FOR EACH ROW WHEN (((new.next < old.next) OR (new.key IS DISTINCT FROM old.key))) EXECUTE FUNCTION tsoracle.keep_what_was_issued() fires A internal false
trigger CREATE TRIGGER keep_what_was_issued_delete BEFORE DELETE ON tsoracle.seq FOR EACH ROW EXECUTE FUNCTION tsoracle.keep_what_was_issued() fires A internal false
trigger CREATE TRIGGER keep_what_was_issued_truncate BEFORE TRUNCATE ON tsoracle.seq FOR EACH STATEMENT EXECUTE FUNCTION tsoracle.keep_what_was_issued() fires A internal false
trigger CREATE TRIGGER merge_replicated_row BEFORE UPDATE ON tsoracle.seq FOR EACH ROW EXECUTE FUNCTION tsoracle.merge_replicated_row() fires R internal false
trigger CREATE TRIGGER merge_restored_row BEFORE INSERT ON tsoracle.seq FOR EACH ROW EXECUTE FUNCTION tsoracle.merge_restored_row() fires A internal false
policies 0
",
    verified: AtomicU32::new(0),
};

/// `tsoracle.high_water`, as `sql/schema.sql` and `sql/finalize.sql` make it.
pub static HIGH_WATER: Installed = Installed {
    description: "\
relation kind r, heap, persistence p, rules false, row security false/false, partition false, typed false, children false
column id boolean not null default true
column physical_ms bigint not null
column epoch bigint not null
column updated_at timestamp with time zone not null default now()
check high_water_epoch_check valid inherited (epoch >= 0)
check high_water_id_check valid inherited id
check high_water_physical_ms_check valid inherited (physical_ms >= 0)
index CREATE UNIQUE INDEX high_water_pkey ON tsoracle.high_water USING btree (id) primary
trigger CREATE TRIGGER keep_what_was_issued BEFORE UPDATE ON tsoracle.high_water FOR EACH ROW WHEN (((new.physical_ms < old.physical_ms) OR (new.epoch < old.epoch) OR (new.id IS DISTINCT FROM old.id))) EXECUTE FUNCTION tsoracle.keep_what_was_issued() fires A internal false
trigger CREATE TRIGGER keep_what_was_issued_delete BEFORE DELETE ON tsoracle.high_water FOR EACH ROW EXECUTE FUNCTION tsoracle.keep_what_was_issued() fires A internal false
trigger CREATE TRIGGER keep_what_was_issued_truncate BEFORE TRUNCATE ON tsoracle.high_water FOR EACH STATEMENT EXECUTE FUNCTION tsoracle.keep_what_was_issued() fires A internal false
trigger CREATE TRIGGER merge_replicated_row BEFORE UPDATE ON tsoracle.high_water FOR EACH ROW EXECUTE FUNCTION tsoracle.merge_replicated_row() fires R internal false
trigger CREATE TRIGGER merge_restored_row BEFORE INSERT ON tsoracle.high_water FOR EACH ROW EXECUTE FUNCTION tsoracle.merge_restored_row() fires A internal false
policies 0
",
    verified: AtomicU32::new(0),
};

/// Whether this backend has registered its relcache callback.
static REGISTERED: AtomicBool = AtomicBool::new(false);
/// Relcache invalidations this backend has processed (of any table): a description worked
/// out while one arrived is not remembered.
static INVALIDATIONS: AtomicU64 = AtomicU64::new(0);

/// Forget every verdict about `relid` (every verdict, for `InvalidOid`: a reset).
unsafe extern "C-unwind" fn invalidated(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    INVALIDATIONS.fetch_add(1, Ordering::Relaxed);
    for table in [&SEQ, &HIGH_WATER] {
        if relid == pg_sys::InvalidOid || table.verified.load(Ordering::Relaxed) == relid.to_u32() {
            table.verified.store(0, Ordering::Relaxed);
        }
    }
}

/// A function or a role changed (any of them: the hash does not say which): forget every
/// verdict.
unsafe extern "C-unwind" fn function_or_role_changed(
    _arg: pg_sys::Datum,
    _cacheid: std::ffi::c_int,
    _hashvalue: u32,
) {
    // SAFETY: InvalidOid resets every verdict; only process-local atomics are touched.
    unsafe { invalidated(pg_sys::Datum::from(0), pg_sys::InvalidOid) };
}

/// The functions the tables' triggers run, and the one they call, as `functions` describes
/// them once installed: their sources are those of `sql/finalize.sql`.
fn installed_functions() -> &'static str {
    static DESCRIPTION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DESCRIPTION.get_or_init(|| {
        let finalize = include_str!("../../sql/finalize.sql");
        let mut out = String::new();
        for name in ["keep_what_was_issued", "merge_replicated_row", "merge_restored_row"] {
            let _ = writeln!(
                out,
                "function tsoracle.{name}() language plpgsql volatility v security definer f \
                 strict f config {{\"search_path=pg_catalog, pg_temp\"}} owner superuser"
            );
            out.push_str(&function_source(finalize, name));
            out.push('\n');
        }
        out.push_str(
            "function tsoracle.note_restore() language c volatility v security definer f \
             strict t config  owner superuser\nnote_restore_wrapper\n",
        );
        out
    })
}

/// The source of trigger function `tsoracle.<name>()` in `sql`: what its `AS $$ … $$` holds
/// ("" if it is not there, which no installed function matches).
fn function_source(sql: &str, name: &str) -> String {
    let Some(at) = sql.find(&format!("CREATE FUNCTION tsoracle.{name}() RETURNS trigger")) else {
        return String::new();
    };
    let rest = &sql[at..];
    let Some(start) = rest.find("AS $$").map(|i| i + "AS $$".len()) else {
        return String::new();
    };
    rest[start..].find("$$;").map_or(String::new(), |end| rest[start..start + end].to_string())
}

/// Whether `tsoracle.allow_drop` may be on in a session nobody set it in: on in this one or
/// in the server's configuration (this session's reset value), or a default of some
/// database or role, whatever its value (`pg_db_role_setting`).
///
/// # Safety
/// Inside a transaction.
unsafe fn allow_drop_by_default() -> bool {
    // SAFETY: a setting this library defines, read by name.
    let reset = unsafe {
        let value = pg_sys::GetConfigOptionResetString(c"tsoracle.allow_drop".as_ptr());
        !value.is_null() && CStr::from_ptr(value).to_bytes() != b"off"
    };
    if super::guc::allow_drop() || reset {
        return true;
    }
    // SAFETY: a catalog lookup by fixed names, and a scan of the shared catalog
    // pg_db_role_setting under AccessShareLock inside the caller's transaction; each row's
    // setconfig (text[]) is printed with array_out, which detoasts it, and nothing is kept.
    unsafe {
        let catalog = pg_sys::get_relname_relid(
            c"pg_db_role_setting".as_ptr(),
            pg_sys::PG_CATALOG_NAMESPACE.into(),
        );
        if catalog == pg_sys::InvalidOid {
            return true;
        }
        let column = pg_sys::get_attnum(catalog, c"setconfig".as_ptr());
        let settings = pg_sys::table_open(catalog, pg_sys::AccessShareLock as i32);
        let scan = pg_sys::systable_beginscan(
            settings,
            pg_sys::InvalidOid,
            false,
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        );
        let mut found = false;
        loop {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            let mut isnull = false;
            let config =
                pg_sys::heap_getattr(tuple, column.into(), (*settings).rd_att, &mut isnull);
            if isnull {
                continue;
            }
            let printed =
                text(pg_sys::OidOutputFunctionCall(pg_sys::Oid::from(pg_sys::F_ARRAY_OUT), config));
            if printed.to_ascii_lowercase().contains("tsoracle.allow_drop=") {
                found = true;
                break;
            }
        }
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(settings, pg_sys::AccessShareLock as i32);
        found
    }
}

/// Whether `rel` is exactly as the extension installs `table`.
///
/// # Safety
/// `rel` is an open relation, locked at least `ROW EXCLUSIVE` by this transaction.
pub unsafe fn as_installed(rel: pg_sys::Relation, table: &Installed) -> bool {
    if !REGISTERED.load(Ordering::Relaxed) {
        // SAFETY: once per process (a backend is single-threaded); the callback only touches
        // this module's process-local atomics, so it may run at any invalidation. Marked
        // registered only once it is (PostgreSQL's list of callbacks is bounded, and a full
        // one raises an error here): until then nothing is remembered.
        unsafe {
            pg_sys::CacheRegisterRelcacheCallback(Some(invalidated), pg_sys::Datum::from(0));
            for cache in [pg_sys::SysCacheIdentifier::PROCOID, pg_sys::SysCacheIdentifier::AUTHOID]
            {
                pg_sys::CacheRegisterSyscacheCallback(
                    cache as std::ffi::c_int,
                    Some(function_or_role_changed),
                    pg_sys::Datum::from(0),
                );
            }
        }
        REGISTERED.store(true, Ordering::Relaxed);
    }
    // Invalidations that arrived without a lock acquisition of ours (the caller may have
    // held the lock already, which skips reading them) are read now.
    // SAFETY: inside a transaction; reads the shared invalidation queue.
    unsafe { pg_sys::AcceptInvalidationMessages() };
    // SAFETY: inside the caller's transaction.
    if unsafe { allow_drop_by_default() } {
        pgrx::debug1!("tsoracle: tsoracle.allow_drop has a default, nothing is written in place");
        return false;
    }
    // SAFETY: rd_id is valid for an open relation.
    let relid = unsafe { (*rel).rd_id }.to_u32();
    if table.verified.load(Ordering::Relaxed) == relid {
        return true;
    }
    let before = INVALIDATIONS.load(Ordering::Relaxed);
    // SAFETY: the caller's contract.
    let described = unsafe { describe(rel) };
    let installed = described.0 == table.description && described.1 == installed_functions();
    if installed && INVALIDATIONS.load(Ordering::Relaxed) == before {
        table.verified.store(relid, Ordering::Relaxed);
    }
    if !installed {
        pgrx::debug1!(
            "tsoracle: the table is not as installed, nothing is written in place:\n{}{}",
            described.0,
            described.1
        );
    }
    installed
}

/// A palloc'd C string as Rust text ("" for NULL).
///
/// # Safety
/// `s` is NULL or a NUL-terminated string.
unsafe fn text(s: *const c_char) -> String {
    if s.is_null() {
        String::new()
    } else {
        // SAFETY: the caller's contract.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}

/// The elements of a `List` of OIDs.
///
/// # Safety
/// `list` is NULL (empty) or a valid `List` of OIDs.
unsafe fn oids(list: *mut pg_sys::List) -> Vec<pg_sys::Oid> {
    if list.is_null() {
        return Vec::new();
    }
    // SAFETY: a valid List holds `length` cells from `elements`.
    unsafe {
        let cells = std::slice::from_raw_parts(
            (*list).elements,
            usize::try_from((*list).length).unwrap_or(0),
        );
        cells.iter().map(|cell| cell.oid_value).collect()
    }
}

/// The table as its relcache entry and catalogs describe it, one line per fact, in a fixed
/// order (columns by number, the rest by name); and the functions its triggers run, with
/// the one they call (`functions`).
///
/// # Safety
/// `rel` is an open relation, locked by this transaction.
unsafe fn describe(rel: pg_sys::Relation) -> (String, String) {
    // Deparsed with only pg_catalog on the search_path, so that the names PostgreSQL
    // qualifies (a function, a type) come out the same in every session, whatever its own
    // search_path; put back when done (an error on the way is undone by the transaction's
    // abort, as for a function's SET clause).
    // SAFETY: inside the caller's transaction; search_path is a USERSET setting; the strings
    // are static and NUL-terminated.
    let nest = unsafe {
        let nest = pg_sys::NewGUCNestLevel();
        pg_sys::set_config_option(
            c"search_path".as_ptr(),
            c"pg_catalog".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            0,
            false,
        );
        nest
    };
    // SAFETY: the caller's contract.
    let out = unsafe { describe_here(rel) };
    // SAFETY: ends the nesting level opened above, restoring the search_path.
    unsafe { pg_sys::AtEOXact_GUC(true, nest) };
    out
}

/// # Safety
/// As [`describe`].
unsafe fn describe_here(rel: pg_sys::Relation) -> (String, String) {
    let mut out = String::new();
    let mut trigger_functions = Vec::new();
    // SAFETY: rd_rel, rd_att, rd_rules and trigdesc belong to the open relation, and each
    // pointer is checked before it is read. A catalog lookup below may read invalidations
    // (a VACUUM or ANALYZE of the table sends one, under a lock that does not conflict with
    // ours) and rebuild the relation's entry, which frees its trigger descriptor and may
    // replace its other parts: so everything is read, or copied, before the first lookup. The
    // lookups and deparsing run inside the caller's transaction and allocate in its memory
    // context.
    unsafe {
        let form = *(*rel).rd_rel;
        let relid = (*rel).rd_id;
        let has_rules = !(*rel).rd_rules.is_null();
        let relname = form.relname;
        let desc = pg_sys::CreateTupleDescCopyConstr((*rel).rd_att);
        let triggers = if (*rel).trigdesc.is_null() {
            std::ptr::null_mut()
        } else {
            pg_sys::CopyTriggerDesc((*rel).trigdesc)
        };
        // The index list (a copy) before rd_pkindex: computing the list is what sets it.
        let indexes = oids(pg_sys::RelationGetIndexList(rel));
        let primary_key = (*rel).rd_pkindex;
        let _ = writeln!(
            out,
            "relation kind {}, {}, persistence {}, rules {}, row security {}/{}, partition {}, typed {}, children {}",
            form.relkind as u8 as char,
            if form.relam == pg_sys::HEAP_TABLE_AM_OID { "heap" } else { "other access method" },
            form.relpersistence as u8 as char,
            // Its rules as the relcache holds them (`relhasrules` stays set once a rule was
            // dropped, until a VACUUM).
            has_rules,
            form.relrowsecurity,
            form.relforcerowsecurity,
            form.relispartition,
            form.reloftype != pg_sys::InvalidOid,
            // Set when a child is made (which sends an invalidation of the parent); cleared
            // by an ANALYZE that finds none.
            form.relhassubclass,
        );
        let constr = (*desc).constr;
        let context = pg_sys::deparse_context_for(relname.data.as_ptr(), relid);
        let deparse = |bin: *const c_char| -> String {
            if bin.is_null() {
                return String::new();
            }
            let node = pg_sys::stringToNode(bin).cast::<pg_sys::Node>();
            text(pg_sys::deparse_expression(node, context, false, false))
        };
        let defaults: &[pg_sys::AttrDefault] = if constr.is_null() || (*constr).defval.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts((*constr).defval, usize::from((*constr).num_defval))
        };
        for i in 0..usize::try_from((*desc).natts).unwrap_or(0) {
            let attr = &*super::compat::tuple_desc_attr(desc, i);
            // A dropped column is invisible to every reader and writer.
            if attr.attisdropped {
                continue;
            }
            let _ = write!(
                out,
                "column {} {}",
                text(attr.attname.data.as_ptr()),
                text(pg_sys::format_type_with_typemod(attr.atttypid, attr.atttypmod)),
            );
            if attr.attnotnull {
                out.push_str(" not null");
            }
            if attr.atthasdef {
                let default = defaults.iter().find(|d| d.adnum == attr.attnum);
                let _ =
                    write!(out, " default {}", default.map_or(String::new(), |d| deparse(d.adbin)));
            }
            if attr.attgenerated != 0 {
                let _ = write!(out, " generated {}", attr.attgenerated as u8 as char);
            }
            // A column inherited from a parent table (ALTER TABLE … INHERIT).
            if attr.attinhcount != 0 {
                let _ = write!(out, " inherited {}", attr.attinhcount);
            }
            if attr.attidentity != 0 {
                let _ = write!(out, " identity {}", attr.attidentity as u8 as char);
            }
            out.push('\n');
        }
        let mut lines = Vec::new();
        if !constr.is_null() && !(*constr).check.is_null() {
            let checks =
                std::slice::from_raw_parts((*constr).check, usize::from((*constr).num_check));
            for check in checks {
                lines.push(format!(
                    "check {} {} {} {}",
                    text(check.ccname),
                    if check.ccvalid { "valid" } else { "not valid" },
                    if check.ccnoinherit { "no inherit" } else { "inherited" },
                    deparse(check.ccbin),
                ));
            }
        }
        for index in indexes {
            let primary = if primary_key != pg_sys::InvalidOid && index == primary_key {
                " primary"
            } else {
                ""
            };
            lines.push(format!("index {}{primary}", text(pg_sys::pg_get_indexdef_string(index))));
        }
        if !triggers.is_null() && !(*triggers).triggers.is_null() {
            let all = std::slice::from_raw_parts(
                (*triggers).triggers,
                usize::try_from((*triggers).numtriggers).unwrap_or(0),
            );
            for t in all {
                trigger_functions.push(t.tgfoid);
                // pg_get_triggerdef: name, timing, events, columns, WHEN, transition tables,
                // constraint trigger, function and arguments; not whether it fires.
                let def = pg_sys::OidFunctionCall1Coll(
                    pg_sys::F_PG_GET_TRIGGERDEF_OID,
                    pg_sys::InvalidOid,
                    pg_sys::Datum::from(t.tgoid),
                );
                lines.push(format!(
                    "trigger {} fires {} internal {}",
                    text(pg_sys::text_to_cstring(def.cast_mut_ptr())),
                    t.tgenabled as u8 as char,
                    t.tgisinternal,
                ));
            }
        }
        lines.sort();
        for line in lines {
            out.push_str(&line);
            out.push('\n');
        }
        let _ = writeln!(out, "policies {}", policies(relid));
    }
    (out, functions(&trigger_functions))
}

/// The functions `oids` and `tsoracle.note_restore()`, each as a line of facts (language,
/// volatility, `SECURITY DEFINER`, `STRICT`, `SET` clauses, whether a superuser owns it)
/// followed by its source, ordered by signature; "" if they cannot be read. Run as the
/// caller, who may be no superuser: only catalogs every role reads (`pg_roles`, not
/// `pg_authid`), and no name lookup that checks the caller's privileges on the schema.
fn functions(oids: &[pg_sys::Oid]) -> String {
    let list: Vec<String> = oids.iter().map(|o| o.to_u32().to_string()).collect();
    let query = format!(
        "SELECT pg_catalog.string_agg(pg_catalog.format('function %s language %s volatility %s \
                security definer %s strict %s config %s owner %s', \
                p.oid::pg_catalog.regprocedure, l.lanname, p.provolatile, p.prosecdef, \
                p.proisstrict, p.proconfig, \
                CASE WHEN r.rolsuper THEN 'superuser' ELSE 'not a superuser' END) \
                OPERATOR(pg_catalog.||) E'\\n' OPERATOR(pg_catalog.||) p.prosrc, E'\\n' \
                ORDER BY p.oid::pg_catalog.regprocedure::pg_catalog.text) \
           FROM pg_catalog.pg_proc p \
           JOIN pg_catalog.pg_language l ON l.oid OPERATOR(pg_catalog.=) p.prolang \
           LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) p.proowner \
          WHERE p.oid OPERATOR(pg_catalog.=) ANY ('{{{}}}'::pg_catalog.oid[]) \
             OR (p.proname OPERATOR(pg_catalog.=) 'note_restore' \
                 AND p.pronargs OPERATOR(pg_catalog.=) 0 \
                 AND p.pronamespace OPERATOR(pg_catalog.=) (SELECT n.oid FROM pg_catalog.pg_namespace n \
                     WHERE n.nspname OPERATOR(pg_catalog.=) 'tsoracle'))",
        list.join(",")
    );
    // The result ends with the last source; a line break closes it as the others are.
    pgrx::Spi::get_one::<String>(&query).ok().flatten().map_or(String::new(), |all| all + "\n")
}

/// How many row security policies table `relid` has (`pg_policy`), enabled or not.
///
/// # Safety
/// Inside a transaction.
unsafe fn policies(relid: pg_sys::Oid) -> usize {
    // SAFETY: catalog lookups by fixed names, and a scan of pg_policy under AccessShareLock
    // with a key on polrelid, inside the caller's transaction; every tuple is counted, none
    // is kept.
    unsafe {
        let catalog =
            pg_sys::get_relname_relid(c"pg_policy".as_ptr(), pg_sys::PG_CATALOG_NAMESPACE.into());
        if catalog == pg_sys::InvalidOid {
            return 0;
        }
        let column = pg_sys::get_attnum(catalog, c"polrelid".as_ptr());
        let policy = pg_sys::table_open(catalog, pg_sys::AccessShareLock as i32);
        let mut key: pg_sys::ScanKeyData = std::mem::zeroed();
        pg_sys::ScanKeyEntryInitialize(
            &mut key,
            0,
            column,
            pg_sys::BTEqualStrategyNumber as u16,
            pg_sys::InvalidOid,
            pg_sys::InvalidOid,
            pg_sys::Oid::from(pg_sys::F_OIDEQ),
            pg_sys::Datum::from(relid),
        );
        let scan = pg_sys::systable_beginscan(
            policy,
            pg_sys::InvalidOid,
            false,
            std::ptr::null_mut(),
            1,
            &mut key,
        );
        let mut count = 0;
        while !pg_sys::systable_getnext(scan).is_null() {
            count += 1;
        }
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(policy, pg_sys::AccessShareLock as i32);
        count
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::{describe, Installed, HIGH_WATER, SEQ};
    use pgrx::prelude::*;

    fn description(table: &str) -> (String, String) {
        let relid =
            Spi::get_one::<pg_sys::Oid>(&format!("SELECT 'tsoracle.{table}'::regclass::oid"))
                .unwrap()
                .unwrap();
        // SAFETY: a table of this database, opened and closed here, inside the test's
        // transaction.
        unsafe {
            let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as i32);
            let described = describe(rel);
            pg_sys::table_close(rel, pg_sys::AccessShareLock as i32);
            described
        }
    }

    fn assert_installed(table: &str, installed: &Installed) {
        let (described, functions) = description(table);
        assert_eq!(described, installed.description, "tsoracle.{table} as installed");
        assert_eq!(functions, super::installed_functions(), "its functions as installed");
    }

    /// Both tables, as CREATE EXTENSION makes them, match their descriptions to the letter,
    /// whatever the session's search_path.
    #[pg_test]
    fn the_tables_are_described_as_installed() {
        assert_installed("seq", &SEQ);
        assert_installed("high_water", &HIGH_WATER);
        Spi::run("SET search_path = tsoracle, public").unwrap();
        assert_installed("seq", &SEQ);
    }

    /// What nobody listed changes the description: a `CHECK` constraint, a default, a policy,
    /// an index on an expression, a column added (and not once it is dropped again).
    #[pg_test]
    fn ddl_of_any_kind_changes_the_description() {
        for (change, undo) in [
            (
                "ALTER TABLE tsoracle.seq ADD CONSTRAINT c CHECK (next < 10)",
                "ALTER TABLE tsoracle.seq DROP CONSTRAINT c",
            ),
            (
                "ALTER TABLE tsoracle.seq ALTER COLUMN updated_at SET DEFAULT 'epoch'",
                "ALTER TABLE tsoracle.seq ALTER COLUMN updated_at SET DEFAULT now()",
            ),
            ("CREATE POLICY p ON tsoracle.seq USING (false)", "DROP POLICY p ON tsoracle.seq"),
            ("CREATE INDEX i ON tsoracle.seq ((next + 1))", "DROP INDEX tsoracle.i"),
            ("ALTER TABLE tsoracle.seq ADD COLUMN n int", "ALTER TABLE tsoracle.seq DROP COLUMN n"),
            (
                "ALTER TABLE tsoracle.seq ENABLE ROW LEVEL SECURITY",
                "ALTER TABLE tsoracle.seq DISABLE ROW LEVEL SECURITY",
            ),
        ] {
            Spi::run(change).unwrap();
            assert_ne!(description("seq").0, SEQ.description, "after {change}");
            Spi::run(undo).unwrap();
            assert_eq!(description("seq").0, SEQ.description, "after {undo}");
        }
    }
}
