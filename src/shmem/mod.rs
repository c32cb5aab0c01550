//! Shared memory, the layer between the callers and the worker: every structure both sides
//! read and write, each with its subsystem.
//!
//! - `oracle`: the oracle's state under its LWLock (allocator, reference clock, phase, refusal);
//! - `signals`: the lock-free window `tso_next()` takes from, the serve-until gate, and the
//!   latches and condition variables between callers and the worker;
//! - `queue`: the request queue (one entry per backend) and its requests and replies;
//! - `leases`: the bounds of the live leases, for the safe frontier and `R`;
//! - `holders`: the resolved timestamp's holder slots, and `R` on a primary;
//! - `member`: on a member of a fleet, what its worker (the proxy to the oracle) shares with
//!   the callers;
//! - `fleet`: on the oracle of a fleet, its members' registrations and reports, and `R_f`.
//! - `text`: a bounded UTF-8 text (the refusal, a member's errors), kept whole or cut with a
//!   note that says so.
//!
//! Everything here is reinitialised by the postmaster after a crash restart, so the oracle
//! comes back not serving and the worker's fence must run before anything is issued.
//!
//! May use: `pg` (glue). Used by: `sql`, `caller` and `worker`; never the other way round.

pub mod fleet;
pub mod holders;
pub mod leases;
pub mod member;
pub mod oracle;
pub mod queue;
pub mod signals;
pub mod text;

pub use leases::{LEASE_BOUNDS, MAX_LEASES};
pub use oracle::{not_serving, Phase, ORACLE};
pub use queue::{Reply, ReplyCode, Request, RequestKind, QUEUE};
pub use signals::{signals, Signals};

/// Called from `_PG_init` when preloading.
pub fn init() {
    // pg_shmem_init! expands to a #[pg_guard] hook calling into pg_sys.
    use fleet::{FleetInit, FLEET};
    use holders::{HoldersInit, HOLDERS};
    use member::MEMBER;
    use pgrx::{pg_guard, pg_sys};
    use queue::QueueInit;
    use signals::{SignalsInit, SIGNALS};
    pgrx::pg_shmem_init!(ORACLE);
    pgrx::pg_shmem_init!(QUEUE = QueueInit);
    pgrx::pg_shmem_init!(LEASE_BOUNDS);
    pgrx::pg_shmem_init!(SIGNALS = SignalsInit);
    pgrx::pg_shmem_init!(HOLDERS = HoldersInit);
    pgrx::pg_shmem_init!(MEMBER);
    pgrx::pg_shmem_init!(FLEET = FleetInit);
    #[cfg(feature = "clock-fault")]
    crate::pg::clock::fault::init();
}
