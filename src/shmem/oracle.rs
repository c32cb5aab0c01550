//! The oracle's state under its LWLock (`ORACLE`): the allocator's bookkeeping, the reference
//! clock, the phase the worker is in and why it refuses, and the counters `tso_status()`
//! shows; and the retryable error for a phase in which nothing is served.

use super::signals::Signals;
use super::text::Text;
use crate::pg::error::TsoError;
use crate::pg::guc;
use pgrx::lwlock::PgLwLock;
use pgrx::shmem::PGRXSharedMemory;
use tsoracle_core::allocator::Allocator;
use tsoracle_core::clock::ReferenceClock;

/// What the oracle is doing, as shown by `tso_status()` and used to word errors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// The worker has not started (or is restarting).
    #[default]
    Starting,
    /// The worker is connected but `CREATE EXTENSION tsoracle` has not run in `tsoracle.database`.
    WaitingForExtension,
    /// The tables in schema `tsoracle` are not those this library needs (an older version).
    OutdatedSchema,
    /// The fence is running: nothing is served until it commits.
    Fencing,
    /// The allocator holds a committed window.
    Serving,
    /// The worker will not serve until an administrator acts; `OracleState::refusal` says why
    /// (for example a durable high-water at the top of the timestamp range, or settings of
    /// the worker's database that it cannot override).
    Refused,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::WaitingForExtension => "waiting_for_extension",
            Phase::OutdatedSchema => "outdated_schema",
            Phase::Fencing => "fencing",
            Phase::Serving => "serving",
            Phase::Refused => "refused",
        }
    }
}

/// State guarded by the oracle's LWLock. Plain data only: it lives in shared memory.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct OracleState {
    pub allocator: Allocator,
    /// What the lead cap is measured against; sampled by the worker at every tick and fence.
    pub clock: ReferenceClock,
    pub phase: Phase,
    /// Highest high-water ever committed in this server's lifetime: the fence never seeds
    /// below it, even if the table was dropped and recreated under a running server.
    pub max_committed_ms: u64,
    /// WAL timeline the current epoch was taken from.
    pub timeline: u32,
    pub window_extensions: u64,
    pub fences: u64,
    pub last_fence_us: u64,
    pub worker_commits: u64,
    /// Highest `tso_seed()` value made durable, so seeding callers know when they are done.
    pub seeded_ms: u64,
    /// When the worker started (after recovery ended: start, crash restart, promotion).
    pub worker_started_ms: u64,
    /// The last fence found the durable row on an older timeline: a promotion.
    pub last_fence_promoted: bool,
    /// The worker's database is not UTF8: keys and holders must be ASCII to be stored there.
    pub ascii_names_only: bool,
    /// Why the worker refuses to serve (`Phase::Refused`), or why it does not grant blocks and
    /// leases right now (strict mode without a synchronous standby).
    refusal: Text<REFUSAL_BYTES>,
}

/// Room for the refusal text in shared memory.
pub const REFUSAL_BYTES: usize = 1024;

impl Default for OracleState {
    fn default() -> Self {
        OracleState {
            allocator: Allocator::default(),
            clock: ReferenceClock::new(),
            phase: Phase::default(),
            max_committed_ms: 0,
            timeline: 0,
            window_extensions: 0,
            fences: 0,
            last_fence_us: 0,
            worker_commits: 0,
            seeded_ms: 0,
            worker_started_ms: 0,
            last_fence_promoted: false,
            ascii_names_only: false,
            refusal: Text::default(),
        }
    }
}

impl OracleState {
    /// Record why the worker refuses (empty: it does not), cut at a character boundary.
    /// Keep `why` whole, or, longer than [`REFUSAL_BYTES`] (a list of tables), cut with a
    /// note that says so (`tsoracle_core::text::fit`), the server log having it whole.
    pub fn set_refusal(&mut self, why: &str) {
        self.refusal = Text::new(why);
    }

    pub fn refusal(&self) -> Option<String> {
        self.refusal.get()
    }
}

// SAFETY: plain data (integers, flags, fieldless enums, a bounded text): no pointers and nothing
// on the heap, so it means the same in every process that maps the segment.
unsafe impl PGRXSharedMemory for OracleState {}

// SAFETY: the name is that of no other shared-memory struct or LWLock tranche: each of this
// file's statics has its own, and all start with `tsoracle_`.
pub static ORACLE: PgLwLock<OracleState> = unsafe { PgLwLock::new(c"tsoracle_oracle") };

/// The refusal after `tso_handover()` (`tso_status().detail`); the function waits for it.
pub const HANDED_OVER: &str =
    "handed over by tso_handover(): this server issues nothing more until it restarts";

/// The refusal of a cluster that has been a member of a fleet and was started without
/// `tsoracle.oracle` (`tso_status().detail`; callers get `TsoError::FormerMember`).
pub const FORMER_MEMBER: &str = "this cluster has been a member of a fleet (tsoracle.member_oracle holds a row) and has not left it by the runbook: it serves nothing on its own";

/// The retryable error for a phase in which nothing is served.
pub fn not_serving(signals: &Signals, phase: Phase) -> TsoError {
    if phase == Phase::Refused && signals.may_serve_alone() == Some(false) && !guc::is_member() {
        return TsoError::FormerMember(FORMER_MEMBER.to_string());
    }
    let why = match phase {
        Phase::WaitingForExtension => format!(
            "CREATE EXTENSION tsoracle has not been run in database \"{}\" (tsoracle.database)",
            guc::database()
        ),
        Phase::OutdatedSchema => format!(
            "the extension tsoracle in database \"{}\" is not at version {}, the version of the library; run ALTER EXTENSION tsoracle UPDATE there",
            guc::database(),
            crate::pg::EXTENSION_VERSION
        ),
        Phase::Refused => ORACLE
            .share()
            .refusal()
            .unwrap_or_else(|| "the tsoracle worker refuses to serve: see the server log".to_string()),
        Phase::Fencing => ORACLE
            .share()
            .refusal()
            .unwrap_or_else(|| "the fence is running after a start, crash or promotion".to_string()),
        Phase::Starting if signals.worker_pid() == 0 => format!(
            "the tsoracle worker is not running; it starts when recovery ends and connects to database \"{}\" (tsoracle.database), which must exist: see the server log",
            guc::database()
        ),
        Phase::Starting => format!("the tsoracle worker is connecting to database \"{}\"", guc::database()),
        Phase::Serving => {
            ORACLE.share().refusal().unwrap_or_else(|| "the window is being re-fenced".to_string())
        }
    };
    TsoError::NotServing(why)
}
