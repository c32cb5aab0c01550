//! Hot standby support: who the primary is, and whether commits are replicated.

use pgrx::pg_sys;
use std::ffi::CStr;

/// Read a GUC's current value as a string (None if unset or unknown).
pub fn config_option(name: &CStr) -> Option<String> {
    // SAFETY: a NUL-terminated name; with missing_ok = true an unknown setting gives NULL,
    // and restrict_privileged = false skips the privilege check.
    let ptr = unsafe { pg_sys::GetConfigOption(name.as_ptr(), true, false) };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: not NULL, so the setting's NUL-terminated value, valid until the next
    // GetConfigOption call or settings change; copied at once.
    let value = unsafe { CStr::from_ptr(ptr) }.to_string_lossy().trim().to_string();
    (!value.is_empty()).then_some(value)
}

/// host and port of the primary, from `primary_conninfo` (keyword/value form).
pub fn primary_address() -> Option<(String, Option<String>)> {
    let conninfo = config_option(c"primary_conninfo")?;
    let mut host = None;
    let mut port = None;
    for (key, value) in conninfo_pairs(&conninfo) {
        match key.as_str() {
            "host" | "hostaddr" if host.is_none() => host = Some(value),
            "port" => port = Some(value),
            _ => {}
        }
    }
    host.map(|h| (h, port))
}

/// Split a libpq keyword/value string, honouring single quotes and backslash escapes.
fn conninfo_pairs(s: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let key: String =
            chars.by_ref().take_while(|&c| c != '=').collect::<String>().trim().to_string();
        if key.is_empty() {
            break;
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '\'' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        pairs.push((key, value));
    }
    pairs
}

/// HINT for calls made on a standby.
pub fn primary_hint() -> Option<String> {
    match primary_address() {
        Some((host, Some(port))) => Some(format!(
            "Connect to the primary at host={host} port={port} (libpq: target_session_attrs=read-write)."
        )),
        Some((host, None)) => Some(format!(
            "Connect to the primary at host={host} (libpq: target_session_attrs=read-write)."
        )),
        None => Some("Connect to the primary (libpq: target_session_attrs=read-write).".into()),
    }
}

/// Whether commits wait for synchronous standbys (`synchronous_standby_names` is set).
pub fn sync_replication_configured() -> bool {
    config_option(c"synchronous_standby_names").is_some()
}

/// Called by the worker after each commit, before anything may be served from it.
///
/// PostgreSQL trap: a synchronous-replication wait ended by a terminate (or postmaster
/// death) returns as if the commit were done, with only a WARNING ("committed locally, but
/// might not have been replicated"). Such a wait leaves `ProcDiePending` set (the worker
/// ignores query cancels, the other way to end the wait). Then the standby may lack this
/// commit, so the worker must leave without applying it: the window stays where the
/// standby has it, and requests it carried are answered "outcome unknown" by the next
/// worker.
pub fn confirm_replicated() {
    // SAFETY: a read of a process-local flag (a sig_atomic_t) that only this process's own
    // signal handlers and interrupt processing write.
    if unsafe { pg_sys::ProcDiePending } != 0 {
        pgrx::error!(
            "tsoracle worker terminated during a commit: not serving from it, since synchronous standbys may not have it"
        );
    }
}

/// After a commit of the worker's, before anything is handed out on it: whether the commit
/// may be trusted to be on the synchronous standbys. A terminate (or a cancel) that ends the
/// wait for them returns from the commit with only a WARNING; then the standbys may lack it,
/// and nothing may be handed out on it (`tsoracle_core::seq::may_return_after_sync_wait`,
/// the rule of `inplace::make_durable`). Without synchronous standbys nothing waits, and the
/// commit is trusted unless such an interrupt is pending (the worker then exits anyway).
pub fn commit_acknowledged() -> bool {
    // SAFETY: volatile reads of this process's own globals (the end of its last commit record,
    // set by its commit; the flags its signal handlers set) and of the acknowledged flush
    // position in shared memory (WalSndCtl exists whenever a backend runs; an 8-byte aligned
    // load, never torn; a stale value is lower, which only refuses).
    let (lsn, acknowledged, interrupted) = unsafe {
        let lsn = std::ptr::read_volatile(&raw const pg_sys::XactLastCommitEnd);
        let interrupted = std::ptr::read_volatile(&raw const pg_sys::ProcDiePending) != 0
            || std::ptr::read_volatile(&raw const pg_sys::QueryCancelPending) != 0;
        let ctl = pg_sys::WalSndCtl;
        let acknowledged = if ctl.is_null() {
            0
        } else {
            std::ptr::read_volatile(&raw const (*ctl).lsn[pg_sys::SYNC_REP_WAIT_FLUSH as usize])
        };
        (lsn, acknowledged, interrupted)
    };
    tsoracle_core::seq::may_return_after_sync_wait(lsn, acknowledged, interrupted)
}

/// The error of a member's durable write whose commit `commit_acknowledged` does not trust.
pub const NOT_ACKNOWLEDGED: &str = "the commit's wait for the synchronous standbys was cut short (a terminate or cancel): they may lack it, so nothing is handed out on it";

/// WARNING when standbys stream from us but none is synchronous: a failover could then
/// lose the last committed windows (the guarantee rests on clocks and failover_advance_ms).
pub fn warn_if_unprotected() {
    let counts = pgrx::Spi::get_two::<i64, i64>(
        "SELECT count(*), count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')) FROM pg_catalog.pg_stat_replication",
    );
    if let Ok((Some(standbys), Some(synchronous))) = counts {
        if standbys > 0 && synchronous == 0 {
            pgrx::warning!(
                "tsoracle: {standbys} standby(s) connected but none is synchronous; after a failover the promoted standby may lack the last committed windows (set synchronous_standby_names)"
            );
        }
    }
}

/// The replay timeline of a standby.
pub fn replay_timeline() -> u32 {
    let mut tli: pg_sys::TimeLineID = 0;
    // SAFETY: a valid out-pointer; GetXLogReplayRecPtr reads the replay position from
    // shared memory under its spinlock and may be called from any backend.
    unsafe { pg_sys::GetXLogReplayRecPtr(&mut tli) };
    tli
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::conninfo_pairs;
    use pgrx::prelude::*;

    #[pg_test]
    fn conninfo_is_parsed() {
        let pairs =
            conninfo_pairs("user=postgres host='127.0.0.1' port=5433 application_name='a b\\'c'");
        assert_eq!(
            pairs,
            vec![
                ("user".into(), "postgres".into()),
                ("host".into(), "127.0.0.1".into()),
                ("port".into(), "5433".into()),
                ("application_name".into(), "a b'c".into()),
            ]
        );
    }
}
