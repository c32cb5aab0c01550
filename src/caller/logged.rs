//! The extension's tables stay logged: `ALTER TABLE … SET UNLOGGED` of any table that is a
//! member of the extension is refused (`55006`, with a HINT), in every session of a server
//! that preloads tsoracle. An unlogged table is emptied by a crash, and the counters, leases
//! and high-water it held would start again from nothing: the oracle could hand out again
//! what it already returned. (There is no other way to change a table's persistence; the
//! worker also refuses to serve from a table it finds unlogged, should one have been made so
//! while the library was not loaded: `worker::extension`.)
//!
//! The check sits in `ProcessUtility_hook`, installed in `_PG_init` while preloading, so every
//! backend has it; it looks only at `ALTER TABLE` statements and chains to the hook installed
//! before it (or the standard function).

use crate::pg::error::TsoError;
use pgrx::pg_guard;
use pgrx::pg_sys;
use std::ffi::{c_char, CStr};

/// The hook that was installed before ours (another extension's), called after the check.
static mut PREVIOUS_HOOK: pg_sys::ProcessUtility_hook_type = None;

/// Install the hook (from `_PG_init`, while preloading).
pub fn init() {
    // SAFETY: called once per process from _PG_init, before any SQL runs (backends are
    // single-threaded); chaining to the previous hook is PostgreSQL's convention.
    unsafe {
        PREVIOUS_HOOK = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(process_utility);
    }
}

/// No pgrx guard on the hook itself: an error raised by the statement passes through it to
/// PostgreSQL untouched (as in `pg::statement`); the check has its own guard.
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn process_utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    // SAFETY: PostgreSQL passes a valid planned statement; its utilityStmt is a node (or
    // NULL), read for its tag only before the guarded check reads it as an AlterTableStmt.
    unsafe {
        let statement = (*pstmt).utilityStmt;
        if !statement.is_null() && (*statement).type_ == pg_sys::NodeTag::T_AlterTableStmt {
            refuse_unlogged(statement.cast());
        }
    }
    // SAFETY: PREVIOUS_HOOK is written only in init, before any SQL runs; the arguments
    // PostgreSQL passed.
    unsafe {
        crate::pg::statement::next_process_utility(
            PREVIOUS_HOOK,
            pstmt,
            query_string,
            read_only_tree,
            context,
            params,
            query_env,
            dest,
            qc,
        )
    }
}

/// Refuse `SET UNLOGGED` of a table of the extension.
#[pg_guard]
unsafe extern "C-unwind" fn refuse_unlogged(statement: *mut pg_sys::AlterTableStmt) {
    // SAFETY: an AlterTableStmt from the parser: `cmds` is a List of AlterTableCmd nodes.
    let unlogged = unsafe {
        let cmds = (*statement).cmds;
        !cmds.is_null()
            && std::slice::from_raw_parts(
                (*cmds).elements,
                usize::try_from((*cmds).length).unwrap_or(0),
            )
            .iter()
            .any(|cell| {
                let cmd = cell.ptr_value.cast::<pg_sys::AlterTableCmd>();
                !cmd.is_null() && (*cmd).subtype == pg_sys::AlterTableType::AT_SetUnLogged
            })
    };
    if !unlogged {
        return;
    }
    // SAFETY: a name lookup of the statement's relation without a lock (missing_ok: the
    // statement itself reports a missing table), then catalog lookups inside the statement's
    // transaction. The statement locks the table itself afterwards: a table made a member of
    // the extension in between (ALTER EXTENSION ADD) is as unlikely as it is harmless to miss.
    unsafe {
        let relid = pg_sys::RangeVarGetRelidExtended(
            (*statement).relation,
            pg_sys::NoLock as i32,
            pg_sys::RVROption::RVR_MISSING_OK,
            None,
            std::ptr::null_mut(),
        );
        if relid == pg_sys::InvalidOid {
            return;
        }
        let extension = pg_sys::get_extension_oid(c"tsoracle".as_ptr(), true);
        if extension == pg_sys::InvalidOid
            || pg_sys::getExtensionOfObject(pg_sys::RelationRelationId, relid) != extension
        {
            return;
        }
        let schema = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid));
        let name = pg_sys::get_rel_name(relid);
        let text = |s: *mut c_char| {
            if s.is_null() {
                String::new()
            } else {
                CStr::from_ptr(s).to_string_lossy().into_owned()
            }
        };
        TsoError::UnloggedRefused(format!("{}.{}", text(schema), text(name))).report();
    }
}
