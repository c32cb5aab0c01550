//! The session the worker runs in: the settings it forces, the checks that it runs as a
//! superuser as itself, and what it warns about in its configuration.

use crate::pg::guc;
use crate::shmem::ORACLE;
use pgrx::bgworkers::BackgroundWorker;
use pgrx::prelude::*;
use tsoracle_core::ha;

/// Settings the worker forces at override level, above postgresql.conf, `ALTER SYSTEM`,
/// `ALTER DATABASE … SET` and `ALTER ROLE … SET`: it runs as a superuser in a database that
/// others may own, so nothing they set may change what its SQL means or whether it runs.
const FORCED_SETTINGS: [(&std::ffi::CStr, &std::ffi::CStr); 15] = [
    // Every name the worker uses resolves in pg_catalog first; pg_temp (its own) last.
    (c"search_path", c"pg_catalog, pg_temp"),
    // Run as the session user (the bootstrap superuser), whatever `role` a database sets.
    (c"role", c"none"),
    // Every commit durable (and on synchronous standbys) before it is served from.
    (c"synchronous_commit", c"on"),
    // No timeout aborts a durable write halfway; no setting makes the worker read-only.
    (c"statement_timeout", c"0"),
    // But no lock is waited for long: what a DBA holds (CREATE INDEX, VACUUM FULL, an open
    // transaction's row) fails the part of the work that needs it with 55P03, and the rest of
    // the worker goes on (`pg::xact`). Its own writes of the high-water take no such lock.
    (c"lock_timeout", c"100ms"),
    (c"idle_in_transaction_session_timeout", c"0"),
    (c"idle_session_timeout", c"0"),
    (c"default_transaction_read_only", c"off"),
    (c"default_transaction_isolation", c"read committed"),
    (c"default_transaction_deferrable", c"off"),
    // Triggers and rules fire as designed; an ERROR never becomes FATAL.
    (c"session_replication_role", c"origin"),
    (c"exit_on_error", c"off"),
    (c"transform_null_equals", c"off"),
    (c"standard_conforming_strings", c"on"),
    // The group commit's kept statements run one generic plan. The plan cache otherwise
    // re-plans them for every group (their custom plans look cheaper): 12 % of the worker's
    // CPU under one `tso_seq` client, measured with perf.
    (c"plan_cache_mode", c"force_generic_plan"),
];

/// Apply [`FORCED_SETTINGS`] at override level.
pub(super) fn force_settings() {
    BackgroundWorker::transaction(|| {
        for (name, value) in FORCED_SETTINGS {
            // SAFETY: valid NUL-terminated strings; inside a transaction, as the check hooks
            // of some settings (role, search_path) expect.
            unsafe {
                pg_sys::SetConfigOption(
                    name.as_ptr(),
                    value.as_ptr(),
                    pg_sys::GucContext::PGC_SUSET,
                    pg_sys::GucSource::PGC_S_OVERRIDE,
                )
            };
        }
    });
}

/// Why the session cannot be trusted to do the worker's job, if it cannot: it must run as
/// a superuser, as itself (database or role settings could have changed the session user).
pub(super) fn unsafe_session() -> Option<String> {
    BackgroundWorker::transaction(|| {
        // SAFETY: plain reads of the session state, inside a transaction.
        let (superuser, same_user) =
            unsafe { (pg_sys::superuser(), pg_sys::GetUserId() == pg_sys::GetSessionUserId()) };
        (!(superuser && same_user)).then(|| {
            format!(
                "the tsoracle worker does not run as a superuser in database \"{}\" (database or role settings such as session_authorization change its user); remove them and restart",
                guc::database()
            )
        })
    })
}

/// Keys and holders must be ASCII where the worker's database is not UTF8 (they could not
/// be read back as Rust strings otherwise).
pub(super) fn note_database_encoding() {
    // SAFETY: a plain read of the database encoding, fixed for the life of the connection.
    let utf8 = unsafe { pg_sys::GetDatabaseEncoding() } == pg_sys::pg_enc::PG_UTF8 as i32;
    ORACLE.exclusive().ascii_names_only = !utf8;
}

/// Under an HA manager, a leader frozen or cut off from its synchronous standby just before
/// it would renew its key still issues for up to `loop_wait + retry_timeout + window_ahead_ms`,
/// and the manager elects a new leader no sooner than `ttl`: real-time order across that
/// failover needs `window_ahead_ms + clock error < ttl − loop_wait − retry_timeout`
/// (`tsoracle_core::ha`). Warn unless that leaves at least a second for the clocks' error.
pub(super) fn warn_if_window_exceeds_ha_ttl() {
    let (window, ttl) = (guc::window_ahead_ms(), guc::ha_ttl_ms());
    let (loop_wait, retry) = (guc::ha_loop_wait_ms(), guc::ha_retry_timeout_ms());
    if ha::window_too_long_for_ha(window, ttl, loop_wait, retry) {
        let margin = ha::failover_clock_margin_ms(window, ttl, loop_wait, retry);
        pgrx::warning!(
            "tsoracle.window_ahead_ms ({window} ms) is too long for the HA manager's timing: ttl ({ttl} ms) - loop_wait ({loop_wait} ms) - retry_timeout ({retry} ms) - window_ahead_ms leaves {margin} ms for the error between two leaders' clocks, less than {} ms; a leader frozen or cut off could issue timestamps after a new one began. Lower tsoracle.window_ahead_ms, or check tsoracle.ha_loop_wait_ms and tsoracle.ha_retry_timeout_ms against the manager's configuration",
            ha::CLOCK_ERROR_ALLOWANCE_MS
        );
    }
}
