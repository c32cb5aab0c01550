//! Errors raised to SQL callers, each with its SQLSTATE and, where a fix exists, a HINT.

use super::locks::Blocker;
use pgrx::pg_sys;
use pgrx::{PgLogLevel, PgSqlErrorCode};
use tsoracle_core::error::CoreError;

#[derive(Debug, thiserror::Error)]
pub enum TsoError {
    #[error("tsoracle is not loaded through shared_preload_libraries")]
    NotPreloaded,

    /// The oracle cannot serve yet (worker starting, fence running, extension missing).
    /// Retryable, like PostgreSQL's own "the database system is starting up".
    #[error("tsoracle is not serving yet: {0}")]
    NotServing(String),

    #[error("timed out after {waited_ms} ms waiting for the tsoracle worker to {what}")]
    WorkerTimeout { waited_ms: i64, what: &'static str },

    #[error("tsoracle cannot {0} on a hot standby")]
    Standby(&'static str),

    #[error("{0}")]
    InvalidArgument(String),

    #[error("{0}")]
    DatetimeOutOfRange(String),

    #[error("{0}")]
    NumericOutOfRange(String),

    #[error("too many sequence keys: tsoracle.max_seq_keys is {0}")]
    TooManyKeys(u64),

    #[error("{0}")]
    StaleLease(String),

    #[error("{0}")]
    NotFound(String),

    #[error("too many live leases: at most {0}")]
    TooManyLeases(usize),

    /// The worker may or may not have committed the request (its caller's block is then a gap).
    #[error("{0}; the outcome is unknown")]
    OutcomeUnknown(String),

    #[error("permission denied: {0}")]
    InsufficientPrivilege(String),

    /// A cancel cut short the wait for synchronous standbys after a block was written: the
    /// block is a gap, never granted again.
    #[error("canceling the wait for synchronous replication: {0}")]
    SyncWaitCancelled(String),

    /// `PREPARE TRANSACTION` of a transaction that took timestamps (`crate::caller::holding`).
    #[error("cannot PREPARE a transaction that has taken tsoracle timestamps")]
    PrepareRefused,

    /// `tso_wait_resolved` in a transaction that itself holds the resolved timestamp back.
    #[error("this transaction holds tsoracle timestamp {0}: the resolved timestamp cannot pass it before the transaction ends")]
    WaitOnItself(u64),

    /// A drop that would lose the durable high-water (`crate::caller::guard`); `resume_ms` is
    /// the highest high-water committed in this server's life, to seed after a forced drop.
    #[error("cannot drop {what}: it holds the durable high-water of tsoracle, below which no timestamp may be issued again")]
    DropRefused { what: String, resume_ms: u64 },

    /// `ALTER TABLE … SET UNLOGGED` of one of the extension's tables (`crate::caller::logged`).
    #[error("cannot make table {0} unlogged: it holds what tsoracle has handed out, which a crash must not empty")]
    UnloggedRefused(String),

    /// A lock the worker or the caller could not get within its bounded wait: another
    /// transaction (named) holds the key, the lease or the table. Retryable.
    #[error("{what} is locked by {}", .blocker.describe())]
    Busy { what: String, blocker: Blocker },

    /// A call that issues a value, a UUID or a block, made in parallel mode (as `nextval()`).
    #[error("cannot call {0} during a parallel operation")]
    ParallelMode(&'static str),

    /// On a member: the oracle could not be reached, or did not answer, in time. Retryable.
    #[error("tsoracle's oracle did not answer: {0}")]
    OracleUnreachable(String),

    /// On a member: the request reached the oracle and its answer was lost; it may or may not
    /// have been carried out there. Never retried automatically.
    #[error("the answer of tsoracle's oracle to {0} was lost; the outcome is unknown")]
    OracleAnswerLost(String),

    /// On a member: the oracle's own error for the call, raised as it came.
    #[error("{message}")]
    Oracle { sqlstate: [u8; 5], message: String, hint: Option<String> },

    /// A function that acts on this cluster's own oracle, called on a member of a fleet.
    #[error("{0} cannot run on a member of a fleet: its timestamps come from the oracle tsoracle.oracle names")]
    NotOnAMember(&'static str),

    /// On the oracle: no room for another member of the fleet.
    #[error("the oracle serves at most {0} members of a fleet (tsoracle.max_members)")]
    TooManyMembers(usize),

    /// On the oracle: a member of a tsoracle version it does not serve (newer, or more than one
    /// minor version older: `tsoracle_core::version`).
    #[error("{0}")]
    VersionSkew(tsoracle_core::version::VersionRefused),

    /// On the oracle: a member's session that has not registered (`tsoracle.member_hello()`).
    #[error("{0} is called by a member of the fleet after tsoracle.member_hello() on the same connection")]
    MemberNotRegistered(&'static str),

    /// On the oracle: a member still connected cannot be removed.
    #[error("member {system_id} is connected to the oracle (process {pid})")]
    MemberConnected { system_id: i64, pid: i32 },

    /// On the oracle: a hello from a cluster no superuser admitted (`tso_fleet_admit`).
    #[error("cluster {system_id} is not admitted to this oracle's fleet: it registers nothing and is served nothing")]
    MemberNotAdmitted { system_id: i64, role: String },

    /// On the oracle: a hello under a role the member is not admitted for.
    #[error("member {system_id} of the fleet is admitted for role {admitted}, not for this session's role {role}: a role speaks only for the members admitted for it")]
    MemberOfAnotherRole { system_id: i64, admitted: String, role: String },

    /// On the oracle: a member's hello while another live session speaks for the same identity.
    #[error("member {system_id} is connected already (process {pid}) and reporting: another cluster with its identity is not served while it is")]
    MemberInUse { system_id: i64, pid: i32 },

    /// A cluster that has been a member of a fleet, started without `tsoracle.oracle` (a
    /// member's standby promoted where only the primary was configured): its own tables lack
    /// what the fleet handed out, so it serves nothing until it left the fleet by the runbook.
    #[error("tsoracle refuses to serve on its own: {0}")]
    FormerMember(String),

    #[error("tsoracle internal error: {0}")]
    Internal(String),
}

/// The HINT of a member refused for its version: the oracle goes first.
pub const UPGRADE_ORACLE_FIRST: &str = "Upgrade the oracle before its members: an oracle serves members of its own minor version and of the one before it (docs/operations/fleet/member-upgrade.md).";

/// What to do about a member and an oracle of versions that do not work together.
fn version_hint(e: &tsoracle_core::version::VersionRefused) -> &'static str {
    match e {
        tsoracle_core::version::VersionRefused::TooFarApart { .. } => "Upgrade a fleet one minor version at a time: the oracle first, then each member (docs/operations/fleet/member-upgrade.md).",
        _ => UPGRADE_ORACLE_FIRST,
    }
}

/// PostgreSQL's packing of a five-character SQLSTATE (`MAKE_SQLSTATE`).
fn packed_sqlstate(code: &[u8; 5]) -> i32 {
    code.iter()
        .enumerate()
        .map(|(i, &c)| ((i32::from(c) - i32::from(b'0')) & 0x3F) << (6 * i))
        .sum()
}

impl TsoError {
    pub fn sqlstate(&self) -> PgSqlErrorCode {
        use PgSqlErrorCode::*;
        match self {
            TsoError::NotPreloaded => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            TsoError::NotServing(_) | TsoError::WorkerTimeout { .. } => ERRCODE_CANNOT_CONNECT_NOW,
            TsoError::Standby(_) => ERRCODE_READ_ONLY_SQL_TRANSACTION,
            TsoError::InvalidArgument(_) => ERRCODE_INVALID_PARAMETER_VALUE,
            TsoError::DatetimeOutOfRange(_) => ERRCODE_DATETIME_FIELD_OVERFLOW,
            TsoError::NumericOutOfRange(_) => ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            TsoError::TooManyKeys(_) | TsoError::TooManyLeases(_) => ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            TsoError::StaleLease(_) => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            TsoError::NotFound(_) => ERRCODE_NO_DATA_FOUND,
            TsoError::OutcomeUnknown(_) => ERRCODE_T_R_STATEMENT_COMPLETION_UNKNOWN,
            TsoError::InsufficientPrivilege(_) => ERRCODE_INSUFFICIENT_PRIVILEGE,
            TsoError::SyncWaitCancelled(_) => ERRCODE_QUERY_CANCELED,
            TsoError::DropRefused { .. } | TsoError::UnloggedRefused(_) => ERRCODE_OBJECT_IN_USE,
            TsoError::FormerMember(_) => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            TsoError::PrepareRefused => ERRCODE_FEATURE_NOT_SUPPORTED,
            TsoError::WaitOnItself(_) => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            TsoError::Busy { .. } => ERRCODE_LOCK_NOT_AVAILABLE,
            TsoError::ParallelMode(_) => ERRCODE_INVALID_TRANSACTION_STATE,
            TsoError::OracleUnreachable(_) => ERRCODE_CANNOT_CONNECT_NOW,
            TsoError::OracleAnswerLost(_) => ERRCODE_T_R_STATEMENT_COMPLETION_UNKNOWN,
            TsoError::Oracle { sqlstate, .. } => PgSqlErrorCode::from(packed_sqlstate(sqlstate)),
            TsoError::NotOnAMember(_) => ERRCODE_FEATURE_NOT_SUPPORTED,
            TsoError::TooManyMembers(_) => ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            TsoError::VersionSkew(_) => ERRCODE_FEATURE_NOT_SUPPORTED,
            TsoError::MemberNotRegistered(_) => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            TsoError::MemberNotAdmitted { .. } | TsoError::MemberOfAnotherRole { .. } => {
                ERRCODE_INSUFFICIENT_PRIVILEGE
            }
            TsoError::MemberConnected { .. } | TsoError::MemberInUse { .. } => {
                ERRCODE_OBJECT_IN_USE
            }
            TsoError::Internal(_) => ERRCODE_INTERNAL_ERROR,
        }
    }

    pub fn hint(&self) -> Option<String> {
        match self {
            TsoError::NotPreloaded => Some(
                "Add 'tsoracle' to shared_preload_libraries in postgresql.conf and restart the server."
                    .into(),
            ),
            TsoError::NotServing(_) | TsoError::WorkerTimeout { .. } => Some(
                "This is transient: retry the call. If it persists, check SELECT * FROM tso_status() and the server log."
                    .into(),
            ),
            TsoError::Standby(_) => super::replica::primary_hint(),
            TsoError::TooManyKeys(_) => {
                Some("Raise tsoracle.max_seq_keys, or reuse existing keys.".into())
            }
            TsoError::StaleLease(_) => Some("Acquire a new lease with tso_lease_acquire_bounds() at a higher holder_epoch.".into()),
            TsoError::TooManyLeases(_) => Some("Release leases that are no longer used (tso_lease_release).".into()),
            TsoError::OutcomeUnknown(_) => Some(
                "Check with tso_seq_peek(): a block the worker committed for a caller that left is a gap, never granted again."
                    .into(),
            ),
            TsoError::SyncWaitCancelled(_) => Some(
                "The block was written but not yet acknowledged by the synchronous standbys; it is a gap, never granted again. Retry the call once the standbys are back."
                    .into(),
            ),
            TsoError::PrepareRefused => Some(
                "A prepared transaction outlives its session, and the resolved timestamp could not tell when it ends: take timestamps outside two-phase transactions, or commit without PREPARE."
                    .into(),
            ),
            TsoError::WaitOnItself(_) => Some(
                "Wait for the resolved timestamp in another transaction, after this one has committed."
                    .into(),
            ),
            TsoError::UnloggedRefused(_) => Some(
                "An unlogged table is emptied by a crash, and the counters, leases and high-water it held would start again from nothing: tsoracle could hand out again what it already returned. Keep the extension's tables logged."
                    .into(),
            ),
            TsoError::DropRefused { resume_ms, .. } => Some(format!(
                "Dropped, the oracle would start again from the clock after the next restart and could repeat timestamps it already returned. To drop it anyway, a superuser first runs SET tsoracle.allow_drop = on; after CREATE EXTENSION tsoracle, run SELECT tso_seed({resume_ms}) before the server restarts."
            )),
            TsoError::Busy { blocker, .. } => Some(match blocker {
                Blocker::Process(pid) => format!(
                    "Retry the call once process {pid}'s transaction has ended (SELECT state, xact_start, query FROM pg_stat_activity WHERE pid = {pid}; SELECT pg_terminate_backend({pid}) ends it)."
                ),
                Blocker::Prepared(_) => "A prepared transaction holds it: COMMIT PREPARED or ROLLBACK PREPARED it (SELECT gid FROM pg_prepared_xacts), then retry the call.".into(),
                Blocker::Unknown => "Retry the call.".into(),
            }),
            TsoError::ParallelMode(_) => Some(
                "tsoracle's functions that issue values are PARALLEL UNSAFE, as nextval() is: call them outside parallel queries, and do not wrap them in a function marked PARALLEL SAFE."
                    .into(),
            ),
            TsoError::OracleUnreachable(_) => Some(
                "This cluster is a member of a fleet (tsoracle.oracle): retry the call. If it persists, SELECT * FROM tso_member_status() shows what the member's worker last heard from the oracle."
                    .into(),
            ),
            TsoError::OracleAnswerLost(_) => Some(
                "The connection to the oracle broke after the request was sent: it may have been carried out there (a block is then a gap, never granted twice). It is not retried for you: check with tso_seq_peek() before you retry."
                    .into(),
            ),
            TsoError::Oracle { hint, .. } => hint.clone(),
            TsoError::NotOnAMember(what) => Some(format!("Run {what} on the oracle.")),
            TsoError::TooManyMembers(_) => Some(
                "On the oracle: raise tsoracle.max_members (a restart; each member also takes a connection, see max_connections). A removed member keeps its place until it is re-admitted. For each member gone for good (SELECT system_id, reported_at FROM tso_fleet_status()): SELECT tso_fleet_remove(system_id), then SELECT tso_fleet_admit(system_id) to free its place. Members removed earlier still hold theirs: SELECT system_id FROM tsoracle.fleet_member WHERE removed_at IS NOT NULL."
                    .into(),
            ),
            TsoError::VersionSkew(e) => Some(version_hint(e).into()),
            TsoError::MemberNotRegistered(_) => Some(
                "A member's worker says hello first on every connection; these functions are not meant to be called by hand."
                    .into(),
            ),
            TsoError::MemberConnected { pid, .. } => Some(format!(
                "Remove only a member that is gone for good: stop it, or make it leave the fleet by the runbook (docs/operations/fleet/leave.md), then retry. SELECT pg_terminate_backend({pid}) ends its current connection, but it connects again."
            )),
            TsoError::FormerMember(_) => Some(
                "If this cluster is still a member (a member's standby promoted without the setting), set tsoracle.oracle to its fleet's oracle and restart. To serve on its own, leave the fleet by steps 2 to 4 of the runbook (docs/operations/fleet/leave.md, \"Leaving a fleet\"): copy the oracle's high-water and counters into this cluster's tables, then DELETE FROM tsoracle.member_oracle and DELETE FROM tsoracle.member_counter."
                    .into(),
            ),
            TsoError::MemberNotAdmitted { system_id, role } => Some(format!(
                "On the member: ask the oracle's DBA to admit this cluster, bound to the role it logs in as; a superuser runs there SELECT tso_fleet_admit({system_id}, '{}') (docs/operations/fleet/set-up.md). The member serves nothing until then; its worker keeps saying hello.",
                role.replace('\'', "''")
            )),
            TsoError::MemberOfAnotherRole { system_id, admitted, role } => Some(format!(
                "Log the member in as {admitted} (user= in its tsoracle.oracle). If {role} is now its own role, a superuser on the oracle binds it with SELECT tso_fleet_admit({system_id}, '{}') (docs/operations/fleet/set-up.md, \"A role per member\").",
                role.replace('\'', "''")
            )),
            TsoError::MemberInUse { .. } => Some(
                "A copy of that member (pg_basebackup, a restore) promoted beside it takes an identity of its own after twice tsoracle.extension_timeout_ms; the same cluster restarted waits for its old session to end."
                    .into(),
            ),
            _ => None,
        }
    }

    /// Raise this error as a PostgreSQL ERROR (never returns). The server log names the
    /// caller's file and line (`#[track_caller]`, through `or_report` too). On a member, the
    /// message and HINT (which may carry what libpq or the oracle said) show nothing of
    /// `tsoracle.oracle` to a role that may not read it (`guc::shown`).
    #[track_caller]
    pub fn report(self) -> ! {
        let mut report = pgrx::pg_sys::panic::ErrorReport::new(
            self.sqlstate(),
            super::guc::shown(self.to_string()),
            pgrx::function_name!(),
        );
        if let Some(hint) = self.hint() {
            report = report.set_hint(super::guc::shown(hint));
        }
        report.report(PgLogLevel::ERROR);
        // report(ERROR) does not return; this keeps the type checker honest.
        unreachable!("ereport(ERROR) returned")
    }
}

impl From<CoreError> for TsoError {
    fn from(e: CoreError) -> Self {
        match e {
            CoreError::InvalidCount { .. }
            | CoreError::PhysicalOutOfRange(_)
            | CoreError::LogicalOutOfRange(_)
            | CoreError::InvalidSeqKey { .. }
            | CoreError::InvalidHolder { .. }
            | CoreError::InvalidTtl { .. } => TsoError::InvalidArgument(e.to_string()),
            CoreError::SeqOverflow { .. } => TsoError::NumericOutOfRange(e.to_string()),
            CoreError::TooManySeqKeys { max } => TsoError::TooManyKeys(max),
            CoreError::NotLeader => TsoError::NotServing("the fence has not completed".into()),
            other => TsoError::Internal(other.to_string()),
        }
    }
}

/// Unwrap a result for a SQL function: an error becomes a PostgreSQL ERROR.
pub trait OrReport<T> {
    #[track_caller]
    fn or_report(self) -> T;
}

impl<T, E: Into<TsoError>> OrReport<T> for Result<T, E> {
    #[track_caller]
    fn or_report(self) -> T {
        match self {
            Ok(v) => v,
            Err(e) => e.into().report(),
        }
    }
}

pub fn check_superuser(what: &str) -> Result<(), TsoError> {
    // SAFETY: called from SQL functions, so inside a transaction, where superuser()'s
    // catalog lookup of the current user is allowed.
    if unsafe { pg_sys::superuser() } {
        Ok(())
    } else {
        Err(TsoError::InsufficientPrivilege(format!("only superusers may {what}")))
    }
}

unsafe extern "C-unwind" {
    // The raw symbol, not pgrx's guarded wrapper: every `tso_next()` asks, and the guard
    // (a `sigsetjmp` and the save and restore of PostgreSQL's error state) costs more than
    // the question. `IsInParallelMode` only reads `CurrentTransactionState` and cannot raise.
    #[link_name = "IsInParallelMode"]
    fn raw_is_in_parallel_mode() -> bool;
}

/// Refuse `what` (a function that issues a value) in parallel mode: a parallel worker's holder
/// slot ends before its leader commits, and a parallel worker cannot write or wait for one.
pub fn refuse_in_parallel_mode(what: &'static str) -> Result<(), TsoError> {
    // SAFETY: a read of this backend's transaction state, valid inside any SQL call; it cannot
    // raise an error, so it needs no guard (see `raw_is_in_parallel_mode`).
    if unsafe { raw_is_in_parallel_mode() } {
        Err(TsoError::ParallelMode(what))
    } else {
        Ok(())
    }
}
