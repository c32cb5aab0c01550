//! Test harness for tsoracle: real PostgreSQL clusters (15 to 18, `TSORACLE_PG_BIN`) on loopback ports.
//!
//! * [`node`]: one cluster ([`Node`]): initdb, start/stop/restart, crash it, connect, configure,
//!   base backups and promotion for replicas. Dropping a node stops it (immediate) and deletes its
//!   directory; if the thread is panicking, the tail of the server log is printed first.
//! * [`history`]: recorders of client-observed calls and checkers for them: timestamps must be
//!   unique and respect real-time order ([`History`]); dense per-key blocks must tile their range
//!   ([`DenseHistory`]).
//! * [`load`]: the client loads, each N threads reconnecting across restarts: a statement in
//!   a loop recording every call in a [`History`] ([`Load`]); a `tso_seq`/`tso_seq_batch` load
//!   recording a [`DenseHistory`] ([`load::SeqLoad`]); a mixed timestamp/sequence load that
//!   follows a movable primary pointer ([`load::MixedLoad`]).
//! * [`cluster`]: multi-node helpers for failover tests: synchronous standbys, replay waits,
//!   promotion (and the primary pointer and mixed load, re-exported from [`load`]).
//! * [`seqlease`]: dense sequences and leases: their calls, the group-commit counters,
//!   `ALTER SYSTEM` + reload (and the sequence load, re-exported from [`load`]).
//! * [`decoding`]: what a `test_decoding` slot decodes of the extension's tables.
//! * [`backup`]: `pg_dump`/`pg_restore`/`psql -f` runners (as the postgres OS user), WAL
//!   archiving and point-in-time recovery, a prober that watches a server during a restore.
//! * [`tso`]: helpers for the extension's SQL surface (`tso_status()`, `wait_serving`, the
//!   timestamp layout, SQLSTATE assertions).
//! * [`pooler`]: PgBouncer in front of a node, with the configuration the repository ships.
//! * [`fleet`]: a fleet's oracle, its members' role and connection strings, the relay binary.
//! * [`link`]: a TCP forwarder with a latency each way that drops, refuses and stalls
//!   connections on demand: a member a network away from its oracle.
//! * [`tls`]: a throw-away certificate authority, and a node that requires TLS of some roles.
//! * [`exporter`]: postgres_exporter with the queries the repository ships, its scrapes
//!   parsed; `promtool` for the alert rules.
//! * [`alerts`]: the alert rules evaluated by promtool on series a real exporter read.
//!
//! Everything is bounded in time: no helper can wait forever.

pub mod alerts;
pub mod backup;
pub mod cluster;
pub mod debian;
pub mod decoding;
pub mod error;
pub mod exporter;
pub mod fleet;
pub mod fleet_load;
pub mod history;
pub mod link;
pub mod load;
pub mod node;
pub mod patroni;
pub mod pooler;
pub mod process;
pub mod rng;
pub mod runbook;
pub mod seqlease;
pub mod tls;
pub mod tso;

pub use error::{pg_error_string, HarnessError};
pub use history::{
    check_calls, check_dense, Call, DenseCall, DenseHistory, DenseReport, DenseViolation, History,
    HistoryReport, Recorder, Violation,
};
pub use load::{ops, Endpoint, Got, Load, LoadOptions, LoadStats, Op, Workers};
pub use node::{Node, NodeOpts, StopMode};
pub use rng::SplitMix64;
pub use tso::{
    expect_sqlstate, logical, now_ms, physical, wait_serving, TsoStatus, LOGICAL_BITS, LOGICAL_MASK,
};

pub type Result<T, E = HarnessError> = std::result::Result<T, E>;

/// A started node with the extension created and serving; panics with the cause otherwise.
#[track_caller]
pub fn serving_node(name: &str, opts: NodeOpts) -> Node {
    let node = Node::start_new(name, opts).unwrap_or_else(|e| panic!("start node {name}: {e}"));
    node.create_extension()
        .unwrap_or_else(|e| panic!("CREATE EXTENSION / wait_serving failed: {e}"));
    node
}

/// Poll `cond` (every 20 ms) until it holds; panic naming `what` once `timeout` has passed.
#[track_caller]
pub fn wait_for(what: &str, timeout: std::time::Duration, mut cond: impl FnMut() -> bool) {
    poll_until(what, timeout, || cond().then_some(()))
}

/// Poll `f` (every 20 ms) until it gives a value; panic naming `what` once `timeout` has
/// passed. Every wait of the harness and the tests goes through here, so none is unbounded.
#[track_caller]
pub fn poll_until<T>(
    what: &str,
    timeout: std::time::Duration,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
