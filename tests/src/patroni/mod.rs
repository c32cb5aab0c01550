//! High availability under Patroni: one etcd and three PostgreSQL 15 nodes managed by Patroni,
//! on loopback ports, with a load that finds the leader the way applications do.
//!
//! # What runs
//!
//! * **etcd** (Debian's `etcd-server` 3.4), one member, client and peer URLs on free
//!   loopback ports ([`pick_port`]), data under the cluster directory. Patroni uses its v2 API
//!   by default ([`Dcs`]: Patroni 3.0.2's v3 client can steal the leader key back, see there).
//! * **Patroni** (Debian's `patroni` 3.0.2) for each member `pg1`, `pg2`, `pg3`: its REST API
//!   on a loopback port, its PostgreSQL 15 on another, its data directory under the cluster
//!   directory. The configuration (rendered by [`render_config`], the same text the README
//!   shows) puts `synchronous_mode: true`, `use_pg_rewind: true`,
//!   `shared_preload_libraries: tsoracle` and the `tsoracle.*` settings in
//!   `bootstrap.dcs` (cluster-wide, stored in etcd), with a short `ttl`, `loop_wait` and
//!   `retry_timeout` so that a failover takes seconds ([`PatroniOpts`]).
//! * `pg1` is started first and bootstraps the cluster (initdb); `CREATE EXTENSION tsoracle`
//!   runs on it once it leads; then `pg2` and `pg3` are started and cloned by Patroni
//!   (`pg_basebackup`), and the start returns once both stream and one is the synchronous
//!   standby.
//!
//! PostgreSQL refuses to run as root, so etcd, Patroni (and therefore PostgreSQL) and
//! `patronictl` run as the `postgres` OS user (`TSORACLE_PG_USER` overrides), like the rest of
//! the harness, in a directory owned by it.
//!
//! # Faults
//!
//! [`PatroniCluster::kill9_member`] SIGKILLs a member's Patroni and its PostgreSQL (the
//! postmaster and every descendant, found through `/proc`); [`PatroniCluster::freeze_member`]
//! SIGSTOPs them all (Patroni first, so that it cannot react) and [`Frozen::thaw`] SIGCONTs them
//! (PostgreSQL first, Patroni after a chosen delay: the worst case for a woken old primary);
//! [`PatroniCluster::switchover`] runs `patronictl switchover`; [`PatroniCluster::stop_member`]
//! stops a member's Patroni cleanly (it stops its PostgreSQL); [`PatroniCluster::start_member`]
//! starts it again (Patroni then rewinds or clones it as needed).
//!
//! # Clients
//!
//! Applications reach the leader with a libpq multi-host connection string and
//! `target_session_attrs=read-write` ([`PatroniCluster::conninfo`]). The `postgres` crate parses
//! and honours such strings, but its `connect_timeout` bounds only the TCP connection: a
//! SIGSTOPped server still completes TCP handshakes (its kernel runs) and then never answers the
//! startup packet, so a connection attempt that tries the frozen host first would hang until the
//! host wakes. libpq's `connect_timeout` bounds the whole attempt per host; [`connect_read_write`]
//! does the same: it tries the hosts in the string's order, each attempt in a helper thread
//! bounded by the timeout (an abandoned attempt ends when its host wakes or dies).
//!
//! Every call of [`PatroniLoad`] and [`LeaseHolder`] is recorded under a label `pgN/tlT`: the
//! member that answered (from `inet_server_port()`) and the WAL timeline it was primary on (a
//! primary's timeline never changes while a session is connected to it), so each leadership
//! term has its own label and a label identifies which term served a value.
//!
//! # Checks
//!
//! Timestamps go to a [`History`] (unique, real-time order), sequence blocks to a
//! [`DenseHistory`] (tiling), lease grants to a [`LeaseLog`], checked by [`check_leases`]:
//! a granted bound is at or above every timestamp returned before the grant began, every
//! timestamp served by another term after a grant returned is above its bound, and a
//! grant's epoch is the timeline of the term that granted it.
//!
//! # Cleanup
//!
//! Dropping the cluster (also while a test panics) SIGKILLs every process it started: Patroni,
//! every process whose command line names a member's data directory (postmasters, single-user
//! crash recovery, `pg_rewind`, `pg_basebackup`) with all their descendants, and etcd; then it
//! deletes the directory (kept with `TSORACLE_KEEP_FAILED=1` after a panic, whose output first
//! shows the tail of every member's log). Patroni and etcd also get `PR_SET_PDEATHSIG`, so they
//! die if the test process is killed.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::{Client, NoTls};

use crate::error::{pg_error_string, session_broken, HarnessError};
use crate::history::{DenseHistory, History};
use crate::node::run_cmd;
use crate::node::{pg_bin_dir, pick_port};
use crate::process::{
    chown, cmdline, is_gone, make_dir, open_log, read_tail, server_command, signal, wait_gone,
    with_descendants,
};
use crate::rng::SplitMix64;
use crate::tso::{self, physical, TsoStatus};
use crate::Result;

/// How long the bootstrap (initdb, clones, `CREATE EXTENSION`) may take.
pub const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a member may take to rejoin (crash recovery, pg_rewind, catch-up).
pub const REJOIN_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a connection attempt to one host may take (libpq's `connect_timeout`).
pub const HOST_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Lines of each member's log printed when a test panics.
pub const LOG_TAIL_LINES: usize = 80;

mod cluster;
mod config;
mod connect;
mod http;
mod leases;
mod load;
mod options;

pub use cluster::*;
pub use config::*;
pub use connect::*;
pub use http::*;
pub use leases::*;
pub use load::*;
pub use options::*;
