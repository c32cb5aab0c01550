//! Configuration parameters (`tsoracle.*`), all documented in README.md. The statics are
//! private: the rest of the extension reads each setting through its accessor.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::ffi::CString;

static DATABASE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"postgres"));
static ORACLE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static ORACLE_SUCCESSOR: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static WINDOW_AHEAD_MS: GucSetting<i32> = GucSetting::<i32>::new(3000);
static FAILOVER_ADVANCE_MS: GucSetting<i32> = GucSetting::<i32>::new(1000);
static EXTENSION_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(5000);
static MAX_SEQ_COUNT: GucSetting<i32> = GucSetting::<i32>::new(65536);
static MAX_SEQ_KEYS: GucSetting<i32> = GucSetting::<i32>::new(100_000);
static LEASE_TTL_MIN_MS: GucSetting<i32> = GucSetting::<i32>::new(5_000);
static LEASE_TTL_MAX_MS: GucSetting<i32> = GucSetting::<i32>::new(300_000);
static MAX_LEAD_MS: GucSetting<i32> = GucSetting::<i32>::new(10_000);
static REQUIRE_SYNCHRONOUS_STANDBY: GucSetting<bool> = GucSetting::<bool>::new(false);
static HA_TTL_MS: GucSetting<i32> = GucSetting::<i32>::new(0);
static HA_LOOP_WAIT_MS: GucSetting<i32> = GucSetting::<i32>::new(10_000);
static HA_RETRY_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(10_000);
static EXPIRED_LEASE_RETENTION_MS: GucSetting<i32> = GucSetting::<i32>::new(600_000);
static ALLOW_DROP: GucSetting<bool> = GucSetting::<bool>::new(false);
static RESOLVED_INTERVAL_MS: GucSetting<i32> = GucSetting::<i32>::new(100);
static SEQ_IN_PLACE: GucSetting<bool> = GucSetting::<bool>::new(true);
static MEMBER_RESERVATION_MAX: GucSetting<i32> = GucSetting::<i32>::new(65_536);
static MAX_MEMBERS: GucSetting<i32> =
    GucSetting::<i32>::new(tsoracle_core::fleet::MAX_MEMBERS_DEFAULT as i32);
static IN_PLACE_IGNORE_SLOTS: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(None);
static MEMBER_SESSION: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
#[cfg(feature = "clock-fault")]
static TEST_SEQ_PAUSE_MS: GucSetting<i32> = GucSetting::<i32>::new(0);
#[cfg(feature = "clock-fault")]
static TEST_SEQ_CHECK_PAUSE_MS: GucSetting<i32> = GucSetting::<i32>::new(0);
#[cfg(feature = "clock-fault")]
static TEST_SEQ_IN_PLACE_UNDER_SYNC: GucSetting<bool> = GucSetting::<bool>::new(false);
#[cfg(feature = "clock-fault")]
static TEST_CLOCK_OFFSET_MS: GucSetting<i32> = GucSetting::<i32>::new(0);
#[cfg(feature = "clock-fault")]
static TEST_WORKER_HOLD_KEY: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
#[cfg(feature = "clock-fault")]
static TEST_HIGH_WATER_PAUSE_MS: GucSetting<i32> = GucSetting::<i32>::new(0);

pub fn define() {
    GucRegistry::define_string_guc(
        c"tsoracle.database",
        c"Database that holds the durable tsoracle tables and that the worker connects to.",
        c"CREATE EXTENSION tsoracle must be run in this database. Changing it requires a restart.",
        &DATABASE,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"tsoracle.oracle",
        c"Connection string of the oracle cluster this cluster is a member of (empty: it is its own oracle).",
        c"A libpq connection string; several hosts with target_session_attrs=read-write find the oracle's primary after a failover. Keep the password out of it (a passfile or a certificate): only superusers can read this setting. Changing it requires a restart.",
        &ORACLE,
        GucContext::Postmaster,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_string_guc(
        c"tsoracle.oracle_successor",
        c"On a member: the system identifier of its oracle after pg_upgrade, admitted in place of the one tsoracle.member_oracle has.",
        c"Read at every hello. The highest epoch the member saw is kept: the successor is admitted only at no older an epoch, and every other cluster, the old oracle included, is refused from then on. Empty: only the remembered oracle.",
        &ORACLE_SUCCESSOR,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"tsoracle.window_ahead_ms",
        c"How far ahead of the clock the worker keeps the durable timestamp window.",
        c"The worker extends the window when less than half of it remains. Larger means fewer commits.",
        &WINDOW_AHEAD_MS,
        10,
        600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"tsoracle.failover_advance_ms",
        c"Size of the first window the fence commits after a start or promotion.",
        c"The fence serves from max(high-water + 1, now) and commits this much above it.",
        &FAILOVER_ADVANCE_MS,
        0,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"tsoracle.extension_timeout_ms",
        c"How long a caller waits for the worker (window extension, fence) before a retryable error.",
        c"Callers get SQLSTATE 57P03 when the wait times out.",
        &EXTENSION_TIMEOUT_MS,
        1,
        600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"tsoracle.max_seq_count",
        c"Largest block one tso_seq() call may take.",
        c"Larger counts are rejected with SQLSTATE 22023.",
        &MAX_SEQ_COUNT,
        1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"tsoracle.max_seq_keys",
        c"Most distinct tso_seq() keys the counter table may hold.",
        c"A call that would create a key beyond it fails with SQLSTATE 54000.",
        &MAX_SEQ_KEYS,
        1,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"tsoracle.lease_ttl_min_ms",
        c"Shortest lease TTL tso_lease_acquire() accepts.",
        c"Size TTLs above the failover time.",
        &LEASE_TTL_MIN_MS,
        1,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"tsoracle.lease_ttl_max_ms",
        c"Longest lease TTL tso_lease_acquire() accepts.",
        c"Each grant moves the durable high-water this far ahead at most.",
        &LEASE_TTL_MAX_MS,
        1,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"tsoracle.expired_lease_retention_ms",
        c"How long an expired lease is remembered before it is purged.",
        c"Renewing a remembered expired lease fails with 55000; once purged, with P0002.",
        &EXPIRED_LEASE_RETENTION_MS,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"tsoracle.max_lead_ms",
        c"Most milliseconds a timestamp may be issued ahead of the clock.",
        c"At the cap callers wait for the clock instead of moving the high-water further. Measured from the fence's floor when a fence had to start above the clock (tso_seed, a restored high-water).",
        &MAX_LEAD_MS,
        10,
        86_400_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_bool_guc(
        c"tsoracle.require_synchronous_standby",
        c"Grant windows, sequence blocks and leases only while a synchronous standby is connected.",
        c"Strict mode, like Patroni's synchronous_mode_strict: callers get 57P03 while no standby in pg_stat_replication is 'sync' or 'quorum'.",
        &REQUIRE_SYNCHRONOUS_STANDBY,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"tsoracle.ha_ttl_ms",
        c"The leader TTL of the HA manager (Patroni's ttl), if any; 0 = none.",
        c"With tsoracle.ha_loop_wait_ms and tsoracle.ha_retry_timeout_ms, the worker warns unless window_ahead_ms + 1 s < ttl - loop_wait - retry_timeout: a leader frozen or cut off still issues for up to loop_wait + retry_timeout + window_ahead_ms, and no new leader is elected before ttl.",
        &HA_TTL_MS,
        0,
        86_400_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"tsoracle.ha_loop_wait_ms",
        c"The HA manager's loop interval (Patroni's loop_wait), checked with tsoracle.ha_ttl_ms.",
        c"Patroni's default is 10 s.",
        &HA_LOOP_WAIT_MS,
        0,
        86_400_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"tsoracle.ha_retry_timeout_ms",
        c"How long the HA manager's leader retries before it demotes itself (Patroni's retry_timeout).",
        c"Patroni's default is 10 s.",
        &HA_RETRY_TIMEOUT_MS,
        0,
        86_400_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"tsoracle.resolved_interval_ms",
        c"How often the worker publishes the resolved timestamp to standbys and logical decoding.",
        c"Only when it advanced: an idle primary publishes nothing. Each publication is one worker commit.",
        &RESOLVED_INTERVAL_MS,
        10,
        60_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_bool_guc(
        c"tsoracle.seq_in_place",
        c"Let tso_seq() advance an existing counter of this database itself, at the cost of one WAL flush.",
        c"Off, every call goes through the worker's group commit. Either way a block is durable (and acknowledged by synchronous standbys) before it is returned.",
        &SEQ_IN_PLACE,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"tsoracle.member_reservation_max",
        c"On a member, the most timestamps one fetch from the oracle reserves for the later calls of the same statement.",
        c"A statement's fetches reserve 1, 2, 4, ... values up to this; what it leaves unused is a gap. 1 fetches once per call.",
        &MEMBER_RESERVATION_MAX,
        1,
        tsoracle_core::allocator::MAX_BATCH as i32,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"tsoracle.max_members",
        c"On the oracle of a fleet, how many members it admits (removed ones included until re-admitted).",
        c"Each takes a slot of shared memory, sized when the server starts, and a connection while it is served. Changing it requires a restart.",
        &MAX_MEMBERS,
        1,
        tsoracle_core::fleet::MAX_MEMBERS_LIMIT as i32,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"tsoracle.in_place_ignore_slots",
        c"Deprecated, no effect: kept so that a configuration that sets it still loads.",
        c"Before 0.6.0 it named logical slots whose consumers were promised never to decode tsoracle's tables. Since 0.6.0 nothing is written in place at wal_level = logical, whatever slots exist, so no slot needs naming.",
        &IN_PLACE_IGNORE_SLOTS,
        GucContext::Sighup,
        GucFlags::default(),
    );
    #[cfg(feature = "clock-fault")]
    GucRegistry::define_int_guc(
        c"tsoracle.test_high_water_pause_ms",
        c"Test builds only: how long the worker pauses with tsoracle.high_water's page pinned, before it locks and writes it in place.",
        c"Lets a test run rewrites of the table and index builds inside that window.",
        &TEST_HIGH_WATER_PAUSE_MS,
        0,
        600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    #[cfg(feature = "clock-fault")]
    GucRegistry::define_int_guc(
        c"tsoracle.test_seq_pause_ms",
        c"Test builds only: how long tso_seq() pauses between writing a block's WAL and flushing it.",
        c"Lets a test kill the server inside that window.",
        &TEST_SEQ_PAUSE_MS,
        0,
        600_000,
        GucContext::Suset,
        GucFlags::UNIT_MS,
    );
    #[cfg(feature = "clock-fault")]
    GucRegistry::define_int_guc(
        c"tsoracle.test_seq_check_pause_ms",
        c"Test builds only: how long tso_seq() pauses in place between its checks of the table and its write.",
        c"Lets a test make a slot, a publication or a handover inside that window.",
        &TEST_SEQ_CHECK_PAUSE_MS,
        0,
        600_000,
        GucContext::Suset,
        GucFlags::UNIT_MS,
    );
    #[cfg(feature = "clock-fault")]
    GucRegistry::define_string_guc(
        c"tsoracle.test_worker_hold_key",
        c"Test builds only: the worker holds every group that names this sequence key, mid-transaction, until the setting changes.",
        c"Stands in for a worker stuck in its group commit, for the tests of callers that cancel, time out or leave.",
        &TEST_WORKER_HOLD_KEY,
        GucContext::Sighup,
        GucFlags::default(),
    );
    #[cfg(feature = "clock-fault")]
    GucRegistry::define_bool_guc(
        c"tsoracle.test_seq_in_place_under_sync",
        c"Test builds only: let tso_seq() advance in place while synchronous standbys are configured.",
        c"Production builds send those calls to the worker; this exercises the in-place path's own wait for the standbys.",
        &TEST_SEQ_IN_PLACE_UNDER_SYNC,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"tsoracle.allow_drop",
        c"Let this session drop the extension tsoracle, its high-water table or its database, or lower or delete what its tables hold.",
        c"Off, such drops and writes fail with SQLSTATE 55006: the oracle could repeat timestamps, sequence blocks or pass a lease holder's bound. Superusers only.",
        &ALLOW_DROP,
        GucContext::Suset,
        GucFlags::default(),
    );
    // Defined rather than left a placeholder: a member's every round trip reads it, and
    // PostgreSQL finds a placeholder by name (a binary search of every setting on 15), while a
    // defined setting's value is this static (`member_session_is`).
    GucRegistry::define_string_guc(
        MEMBER_SESSION_NAME,
        c"On an oracle: the name a member's hello gave its connection in this session.",
        c"Set by the member's own statements (docs/fleet.md); a member's later statements run only in the session that holds their name. Not for setting by hand.",
        &MEMBER_SESSION,
        GucContext::Userset,
        GucFlags::NO_SHOW_ALL,
    );
    // SAFETY: the assign hook cannot panic (an atomic store, see below).
    #[cfg(feature = "clock-fault")]
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"tsoracle.test_clock_offset_ms",
            c"Test builds only: offset of the wall clock every process of the server reads.",
            c"Applied in shared memory by the postmaster as soon as it reloads its configuration.",
            &TEST_CLOCK_OFFSET_MS,
            i32::MIN,
            i32::MAX,
            GucContext::Sighup,
            GucFlags::UNIT_MS,
            None,
            Some(assign_test_clock_offset),
            None,
        )
    };
    // SAFETY: a static NUL-terminated prefix; called from _PG_init while preloading, after
    // every tsoracle.* setting is defined, as PostgreSQL expects of MarkGUCPrefixReserved.
    unsafe { pgrx::pg_sys::MarkGUCPrefixReserved(c"tsoracle".as_ptr()) };
}

pub fn database() -> String {
    DATABASE
        .get()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|| "postgres".to_string())
}

/// The oracle's connection string on a member of a fleet (`tsoracle.oracle`); `None` on a
/// cluster that is its own oracle.
pub fn oracle() -> Option<String> {
    ORACLE.get().map(|c| c.to_string_lossy().trim().to_string()).filter(|c| !c.is_empty())
}

/// Whether the current role may read `tsoracle.oracle`: the test `SHOW` and
/// `current_setting()` apply to a setting (PostgreSQL's `GetConfigOption` with
/// `restrict_privileged`, `ConfigOptionIsVisible` since 16): a `GUC_SUPERUSER_ONLY` setting is
/// for roles with the privileges of `pg_read_all_settings` (superusers, `pg_monitor`).
pub fn may_read_oracle() -> bool {
    // SAFETY: called from a backend running SQL (a transaction is open, the role is set);
    // the setting is defined at preload, and missing_ok answers 0 rather than an error.
    unsafe {
        let flags = pgrx::pg_sys::GetConfigOptionFlags(c"tsoracle.oracle".as_ptr(), true);
        flags & pgrx::pg_sys::GUC_SUPERUSER_ONLY as i32 == 0
            || pgrx::pg_sys::has_privs_of_role(
                pgrx::pg_sys::GetUserId(),
                pgrx::pg_sys::Oid::from(pgrx::pg_sys::ROLE_PG_READ_ALL_SETTINGS),
            )
    }
}

/// `text` as the current role may read it: on a member, with every part of `tsoracle.oracle`
/// (hosts, ports, user, file paths, …) hidden from a role that may not read the setting
/// (`may_read_oracle`). Every text a member shows that came from its connection to the oracle
/// goes through here: `tso_member_status()`, `tso_status().detail`, errors and their HINTs.
pub fn shown(text: String) -> String {
    let Some(conninfo) = oracle() else { return text };
    // Outside a transaction no role can be looked up: hidden, as from anyone.
    // SAFETY: a read of the backend's transaction state.
    if unsafe { pgrx::pg_sys::IsTransactionState() } && may_read_oracle() {
        return text;
    }
    tsoracle_core::redact::redact(&text, &crate::pg::libpq::conninfo_parts(&conninfo))
}

/// `tsoracle.oracle_successor`: the system identifier a member admits in place of the one it
/// remembers (after its oracle's `pg_upgrade`). `Ok(None)`: unset; `Err`: not a number.
pub fn oracle_successor() -> Result<Option<u64>, String> {
    let Some(text) = ORACLE_SUCCESSOR.get().map(|c| c.to_string_lossy().trim().to_string()) else {
        return Ok(None);
    };
    if text.is_empty() {
        return Ok(None);
    }
    text.parse::<i64>().map(|id| Some(id as u64)).map_err(|_| {
        format!(
            "tsoracle.oracle_successor = '{text}' is not a system identifier (SELECT system_identifier FROM pg_control_system() on the upgraded oracle)"
        )
    })
}

/// This cluster is a member of a fleet: its timestamps, blocks and leases come from the
/// oracle `tsoracle.oracle` names.
pub fn is_member() -> bool {
    // Read once per process: a postmaster setting cannot change while the server runs, and
    // every call of a member asks (reading a string setting copies it).
    static MEMBER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MEMBER.get_or_init(|| {
        ORACLE.get().is_some_and(|c| !c.to_bytes().iter().all(u8::is_ascii_whitespace))
    })
}

pub fn window_ahead_ms() -> u64 {
    WINDOW_AHEAD_MS.get().max(1) as u64
}

pub fn failover_advance_ms() -> u64 {
    FAILOVER_ADVANCE_MS.get().max(0) as u64
}

pub fn extension_timeout_ms() -> i64 {
    i64::from(EXTENSION_TIMEOUT_MS.get().max(1))
}

pub fn max_seq_count() -> u64 {
    MAX_SEQ_COUNT.get().max(1) as u64
}

pub fn max_seq_keys() -> u64 {
    MAX_SEQ_KEYS.get().max(1) as u64
}

pub fn lease_ttl_min_ms() -> i64 {
    i64::from(LEASE_TTL_MIN_MS.get())
}

pub fn lease_ttl_max_ms() -> i64 {
    i64::from(LEASE_TTL_MAX_MS.get())
}

pub fn expired_lease_retention_ms() -> u64 {
    EXPIRED_LEASE_RETENTION_MS.get().max(0) as u64
}

pub fn max_lead_ms() -> u64 {
    MAX_LEAD_MS.get().max(1) as u64
}

pub fn require_synchronous_standby() -> bool {
    REQUIRE_SYNCHRONOUS_STANDBY.get()
}

pub fn ha_ttl_ms() -> u64 {
    HA_TTL_MS.get().max(0) as u64
}

pub fn ha_loop_wait_ms() -> u64 {
    HA_LOOP_WAIT_MS.get().max(0) as u64
}

pub fn ha_retry_timeout_ms() -> u64 {
    HA_RETRY_TIMEOUT_MS.get().max(0) as u64
}

pub fn allow_drop() -> bool {
    ALLOW_DROP.get()
}

/// The postmaster reloads its configuration first, on SIGHUP, and every process reads the
/// offset from shared memory: the whole server's wall clock steps at one instant (later
/// reloads in other processes store the same value again).
#[cfg(feature = "clock-fault")]
unsafe extern "C-unwind" fn assign_test_clock_offset(
    newval: std::ffi::c_int,
    _extra: *mut std::ffi::c_void,
) {
    super::clock::fault::set_offset_ms(i64::from(newval));
}

pub fn resolved_interval_ms() -> u64 {
    RESOLVED_INTERVAL_MS.get().max(1) as u64
}

pub fn member_reservation_max() -> u32 {
    MEMBER_RESERVATION_MAX.get().max(1) as u32
}

/// `tsoracle.max_members`: the slots of the oracle's fleet (the same all the server's life).
pub fn max_members() -> usize {
    usize::try_from(MAX_MEMBERS.get())
        .unwrap_or(1)
        .clamp(1, tsoracle_core::fleet::MAX_MEMBERS_LIMIT)
}

pub fn seq_in_place() -> bool {
    SEQ_IN_PLACE.get()
}

#[cfg(feature = "clock-fault")]
pub fn test_high_water_pause_ms() -> u64 {
    TEST_HIGH_WATER_PAUSE_MS.get().max(0) as u64
}

#[cfg(feature = "clock-fault")]
pub fn test_seq_pause_ms() -> u64 {
    TEST_SEQ_PAUSE_MS.get().max(0) as u64
}

/// Test builds: how long `tso_seq`'s in-place path pauses between its checks and its write
/// (0 in other builds).
pub fn test_seq_check_pause_ms() -> u64 {
    #[cfg(feature = "clock-fault")]
    return TEST_SEQ_CHECK_PAUSE_MS.get().max(0) as u64;
    #[cfg(not(feature = "clock-fault"))]
    0
}

/// Test builds: whether `tso_seq` may advance in place under synchronous replication.
pub fn test_seq_in_place_under_sync() -> bool {
    #[cfg(feature = "clock-fault")]
    return TEST_SEQ_IN_PLACE_UNDER_SYNC.get();
    #[cfg(not(feature = "clock-fault"))]
    false
}

/// Test builds: the sequence key whose groups the worker holds (see the setting).
#[cfg(feature = "clock-fault")]
pub fn test_worker_hold_key() -> Option<String> {
    TEST_WORKER_HOLD_KEY.get().map(|c| c.to_string_lossy().into_owned()).filter(|k| !k.is_empty())
}

/// The setting of an oracle session in which a member's hello names its connection
/// (docs/fleet.md): the member's later statements carry that name and run only where the
/// setting holds it.
macro_rules! member_session {
    () => {
        "tsoracle_member.session"
    };
}
pub(crate) use member_session;

const MEMBER_SESSION_NAME: &std::ffi::CStr =
    match std::ffi::CStr::from_bytes_with_nul(concat!(member_session!(), "\0").as_bytes()) {
        Ok(s) => s,
        Err(_) => panic!("a setting's name with a NUL inside"),
    };

/// Whether this session's setting `member_session!()` holds `name`: as the SQL
/// `current_setting('tsoracle_member.session', true) = name` for a member's names, never empty
/// (at its boot value, never set or reset, the setting holds none: false). Read from the
/// setting's variable: no look-up by name on a member's every round trip.
pub fn member_session_is(name: &str) -> bool {
    // SAFETY: the variable of a setting defined at load (`define`): PostgreSQL keeps it NULL
    // (the boot value) or pointing at the setting's current value, a NUL-terminated string
    // that stays valid until the setting next changes, which nothing below does (no SQL runs).
    // Read directly rather than through `get()`, which copies it: this is the backend's thread.
    let value = unsafe { *MEMBER_SESSION.as_ptr() };
    // SAFETY: a non-NULL value is that NUL-terminated string (above).
    !value.is_null() && unsafe { std::ffi::CStr::from_ptr(value) }.to_bytes() == name.as_bytes()
}
