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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::{Client, NoTls};

use crate::error::{pg_error_string, HarnessError};
use crate::history::{DenseHistory, History};
use crate::node::{is_gone, run_cmd, wait_gone};
use crate::node::{pg_bin_dir, pick_port};
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

// ================================================================================ options

/// Settings of a Patroni cluster (see [`render_config`] for where each one goes).
#[derive(Clone, Debug)]
pub struct PatroniOpts {
    /// Number of members (2 or more).
    pub members: usize,
    /// Patroni's `ttl` (seconds): the leader key expires this long after the leader's last
    /// update; only then may another member take over.
    pub ttl: u32,
    /// Patroni's `loop_wait` (seconds): the leader updates its key once per loop.
    pub loop_wait: u32,
    /// Patroni's `retry_timeout` (seconds): a leader that cannot update its key for this long
    /// demotes itself. Patroni wants `loop_wait + 2 * retry_timeout <= ttl`.
    pub retry_timeout: u32,
    /// Patroni's `synchronous_mode_strict`.
    pub synchronous_mode_strict: bool,
    /// How Patroni talks to etcd.
    pub dcs: Dcs,
    /// Cluster-wide PostgreSQL parameters (`bootstrap.dcs.postgresql.parameters`), applied
    /// after [`DEFAULT_PARAMETERS`] (same name: replaced).
    pub parameters: Vec<(String, String)>,
}

/// The cluster-wide PostgreSQL parameters of the harness (`bootstrap.dcs.postgresql.parameters`);
/// [`PatroniOpts::all_parameters`] adds `tsoracle.ha_ttl_ms` (Patroni's `ttl` in ms, so that the
/// worker warns if `window_ahead_ms` is too large for it).
///
/// A primary issues timestamps only until `tsoracle.window_ahead_ms` after the start of its last
/// commit its synchronous standby acknowledged; with the default `ttl 16`, `loop_wait 1`,
/// `retry_timeout 5`: `window_ahead_ms = 1 s < ttl - loop_wait - retry_timeout = 10 s`, leaving
/// 9 s for clock error (docs/operations/patroni.md). `tsoracle.extension_timeout_ms` is how long a
/// caller of a primary that can no longer commit waits before it gets 57P03 (and reconnects,
/// which finds the new leader).
pub const DEFAULT_PARAMETERS: &[(&str, &str)] = &[
    ("shared_preload_libraries", "tsoracle"),
    ("tsoracle.window_ahead_ms", "1000"),
    ("tsoracle.extension_timeout_ms", "1000"),
    ("synchronous_commit", "on"),
    ("wal_level", "replica"),
    ("hot_standby", "on"),
    ("wal_log_hints", "on"),
    ("max_connections", "100"),
    ("max_wal_senders", "10"),
    ("max_replication_slots", "10"),
    ("wal_keep_size", "128MB"),
    ("shared_buffers", "32MB"),
];

/// Patroni's etcd client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dcs {
    /// `etcd:` (etcd's v2 API, served by etcd 3.4 with `--enable-v2`). Patroni renews its
    /// leader key with a compare-and-swap on its own name (`prevValue`), so a leader that
    /// wakes after its key expired cannot take the key back from a new leader.
    EtcdV2,
    /// `etcd3:` (the v3 API). In Patroni 3.0.2 (Debian bookworm) a leader that wakes after
    /// its lease expired grants itself a new lease and writes the leader key unconditionally,
    /// taking the key back from the member elected meanwhile, which then demotes itself and
    /// is rewound: its whole term is discarded (fixed in Patroni 3.0.3, patroni/patroni#2689).
    EtcdV3,
}

impl Default for PatroniOpts {
    fn default() -> Self {
        PatroniOpts {
            members: 3,
            ttl: 16,
            loop_wait: 1,
            retry_timeout: 5,
            synchronous_mode_strict: false,
            dcs: Dcs::EtcdV2,
            parameters: Vec::new(),
        }
    }
}

impl PatroniOpts {
    pub fn parameter(mut self, name: &str, value: impl ToString) -> Self {
        self.parameters.push((name.to_string(), value.to_string()));
        self
    }

    /// [`DEFAULT_PARAMETERS`], then `tsoracle.ha_ttl_ms` (`ttl` in ms), then
    /// [`PatroniOpts::parameters`] applied in order.
    pub fn all_parameters(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> =
            DEFAULT_PARAMETERS.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        v.insert(2, ("tsoracle.ha_ttl_ms".to_string(), (u64::from(self.ttl) * 1000).to_string()));
        for (k, val) in &self.parameters {
            match v.iter_mut().find(|(name, _)| name == k) {
                Some(slot) => slot.1 = val.clone(),
                None => v.push((k.clone(), val.clone())),
            }
        }
        v
    }
}

// ================================================================================ configuration

/// Where one member lives: the inputs of [`render_config`].
#[derive(Clone, Debug)]
pub struct MemberConfig {
    pub scope: String,
    pub name: String,
    pub api_port: u16,
    pub pg_port: u16,
    /// `host:port` of the etcd client URL.
    pub etcd: String,
    pub data_dir: String,
    /// Directory of the Unix socket (Patroni's own connections) and of the pgpass file.
    pub run_dir: String,
    /// The PostgreSQL server binaries.
    pub bin_dir: String,
}

fn yaml_scalar(v: &str) -> String {
    if !v.is_empty() && v.chars().all(|c| c.is_ascii_digit()) {
        v.to_string()
    } else {
        format!("'{}'", v.replace('\'', "''"))
    }
}

/// The Patroni configuration file of one member.
///
/// * `bootstrap.dcs` is the cluster-wide configuration, written to etcd by the member that
///   bootstraps: timings, `synchronous_mode`, `use_pg_rewind`, and the PostgreSQL parameters
///   every member runs with (among them `shared_preload_libraries: tsoracle`).
/// * `postgresql` is this member's: addresses, data directory, roles, `pg_hba` (trust on
///   loopback: a test cluster), local parameters (its socket directory, log format).
/// * `watchdog: off`: these machines have no watchdog device (see the README for production).
pub fn render_config(m: &MemberConfig, opts: &PatroniOpts) -> String {
    let mut params = String::new();
    for (k, v) in opts.all_parameters() {
        params.push_str(&format!("        {k}: {}\n", yaml_scalar(&v)));
    }
    format!(
        "\
scope: {scope}
namespace: /tsoracle/
name: {name}

log:
  level: INFO
  format: '%(asctime)s {name} %(levelname)s: %(message)s'

restapi:
  listen: 127.0.0.1:{api}
  connect_address: 127.0.0.1:{api}

{dcs}:
  hosts: {etcd}

bootstrap:
  dcs:
    ttl: {ttl}
    loop_wait: {loop_wait}
    retry_timeout: {retry_timeout}
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    synchronous_mode_strict: {strict}
    synchronous_node_count: 1
    failsafe_mode: false
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
{params}  initdb:
  - encoding: UTF8
  - locale: C
  - auth-local: trust
  - auth-host: trust

postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {data_dir}
  bin_dir: {bin_dir}
  pgpass: {run_dir}/pgpass
  use_unix_socket: true
  authentication:
    superuser:
      username: postgres
      password: postgres
    replication:
      username: replicator
      password: replicator
  parameters:
    unix_socket_directories: '{run_dir}'
    logging_collector: 'off'
    log_line_prefix: '%m [%p] {name} %b: '
    lc_messages: 'C'
  pg_hba:
  - local all all trust
  - local replication all trust
  - host all all 127.0.0.1/32 trust
  - host replication all 127.0.0.1/32 trust

watchdog:
  mode: 'off'

tags:
  nofailover: false
  noloadbalance: false
  clonefrom: false
  nosync: false
",
        scope = m.scope,
        name = m.name,
        api = m.api_port,
        dcs = match opts.dcs {
            Dcs::EtcdV2 => "etcd",
            Dcs::EtcdV3 => "etcd3",
        },
        etcd = m.etcd,
        ttl = opts.ttl,
        loop_wait = opts.loop_wait,
        retry_timeout = opts.retry_timeout,
        strict = opts.synchronous_mode_strict,
        pg = m.pg_port,
        data_dir = m.data_dir,
        bin_dir = m.bin_dir,
        run_dir = m.run_dir,
    )
}

// ================================================================================ processes

/// uid and gid of the OS user that runs the servers (`TSORACLE_PG_USER`, default `postgres`).
fn os_user() -> Result<(u32, u32)> {
    crate::node::pg_user()
}

pub(crate) fn chown(path: &Path) -> Result<()> {
    let (uid, gid) = os_user()?;
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .map_err(|e| HarnessError::io(format!("chown {}", path.display()), e))
}

fn make_dir(path: &Path) -> Result<()> {
    fs::create_dir_all(path)
        .map_err(|e| HarnessError::io(format!("create {}", path.display()), e))?;
    chown(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o700))
        .map_err(|e| HarnessError::io(format!("chmod {}", path.display()), e))
}

/// A command run as the server OS user, with a clean environment, in `dir`; it gets SIGKILL
/// when the thread that spawned it ends (`PR_SET_PDEATHSIG`).
pub(crate) fn server_command(program: &str, dir: &Path, die_with_parent: bool) -> Result<Command> {
    let (uid, gid) = os_user()?;
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", pg_bin_dir().display()))
        .env("HOME", dir)
        .env("LANG", "C.UTF-8")
        .env("LC_ALL", "C.UTF-8")
        .env("PYTHONUNBUFFERED", "1")
        .current_dir(dir)
        .uid(uid)
        .gid(gid)
        .stdin(Stdio::null());
    if die_with_parent {
        // SAFETY: prctl(2) is async-signal-safe; this runs in the child after fork (and after
        // its setuid, which would otherwise clear the setting).
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
                Ok(())
            });
        }
    }
    Ok(cmd)
}

pub(crate) fn open_log(path: &Path) -> Result<(Stdio, Stdio)> {
    let f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| HarnessError::io(format!("open {}", path.display()), e))?;
    chown(path)?;
    let f2 = f.try_clone().map_err(|e| HarnessError::io("dup log fd", e))?;
    Ok((Stdio::from(f), Stdio::from(f2)))
}

/// (pid, ppid, state) of every process, from /proc/*/stat.
fn proc_table() -> Vec<(i32, i32, char)> {
    let mut v = Vec::new();
    let Ok(dir) = fs::read_dir("/proc") else { return v };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(close) = stat.rfind(')') else { continue };
        let mut it = stat[close + 1..].split_whitespace();
        let state = it.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let ppid = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        v.push((pid, ppid, state));
    }
    v
}

fn cmdline(pid: i32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// `roots` and all their descendants (live, non-zombie), roots first.
fn with_descendants(roots: &[i32]) -> Vec<i32> {
    let table = proc_table();
    let mut by_parent: HashMap<i32, Vec<i32>> = HashMap::new();
    for &(p, pp, state) in &table {
        if state != 'Z' && state != 'X' {
            by_parent.entry(pp).or_default().push(p);
        }
    }
    let mut out: Vec<i32> = Vec::new();
    let mut seen = BTreeSet::new();
    let mut stack: Vec<i32> = roots.to_vec();
    while let Some(p) = stack.pop() {
        if p <= 1 || !seen.insert(p) {
            continue;
        }
        out.push(p);
        if let Some(kids) = by_parent.get(&p) {
            stack.extend(kids);
        }
    }
    out
}

fn signal(pids: &[i32], sig: i32) {
    for &p in pids {
        if p > 1 {
            // SAFETY: kill(2) on processes this harness started (checked by the callers).
            unsafe {
                libc::kill(p, sig);
            }
        }
    }
}

pub(crate) fn read_tail(path: &Path, lines: usize) -> String {
    let text = fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    crate::node::last_lines(&text, lines)
}

// ================================================================================ HTTP

/// One HTTP/1.0 request to `127.0.0.1:port` (bounded by `timeout`): (status, body).
pub fn http(port: u16, method: &str, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| HarnessError::io(format!("connect {addr}"), e))?;
    s.set_read_timeout(Some(timeout)).map_err(|e| HarnessError::io("set_read_timeout", e))?;
    s.set_write_timeout(Some(timeout)).map_err(|e| HarnessError::io("set_write_timeout", e))?;
    write!(s, "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\r\n")
        .map_err(|e| HarnessError::io(format!("{method} {addr}{path}"), e))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| HarnessError::io(format!("read {addr}{path}"), e))?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| {
        HarnessError::Other(format!("{method} {addr}{path}: no HTTP status in {text:?}"))
    })?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, body))
}

/// The value of a top-level `"key": value` of a flat JSON object, as text (strings unquoted);
/// enough for Patroni's `GET /patroni` (`role`, `state`, `timeline`).
pub fn json_field(body: &str, key: &str) -> Option<String> {
    let pat = format!("\"{key}\":");
    let rest = body[body.find(&pat)? + pat.len()..].trim_start();
    if let Some(s) = rest.strip_prefix('"') {
        return Some(s[..s.find('"')?].to_string());
    }
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim().to_string())
}

// ================================================================================ connections

/// One host of a multi-host target.
#[derive(Clone, Debug)]
pub struct HostPort {
    pub name: String,
    pub port: u16,
}

/// Connect to the first host (in order) that accepts a read-write session, each attempt
/// bounded by `per_host` like libpq's `connect_timeout` (see the module documentation).
/// `statement_timeout_ms` is set for the session.
pub fn connect_read_write(
    hosts: &[HostPort],
    per_host: Duration,
    statement_timeout_ms: u64,
) -> Result<Client> {
    let mut errors = Vec::new();
    for h in hosts {
        match connect_one(h.port, true, per_host, statement_timeout_ms) {
            Ok(c) => return Ok(c),
            Err(e) => errors.push(format!("{}: {e}", h.name)),
        }
    }
    Err(HarnessError::Other(format!("no read-write host: {}", errors.join("; "))))
}

/// One bounded connection attempt to `127.0.0.1:port` as `postgres` (read-write only if
/// asked); the attempt runs in a helper thread that is abandoned on timeout.
pub fn connect_one(
    port: u16,
    read_write: bool,
    timeout: Duration,
    statement_timeout_ms: u64,
) -> Result<Client> {
    let mut cfg = postgres::Config::new();
    cfg.host("127.0.0.1")
        .port(port)
        .user("postgres")
        .dbname("postgres")
        .application_name("tsoracle-patroni")
        .connect_timeout(timeout)
        .options(&format!("-c statement_timeout={statement_timeout_ms}"));
    if read_write {
        cfg.target_session_attrs(postgres::config::TargetSessionAttrs::ReadWrite);
    }
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("connect-{port}"))
        .spawn(move || {
            let _ = tx.send(cfg.connect(NoTls));
        })
        .map_err(|e| HarnessError::io("spawn connect thread", e))?;
    match rx.recv_timeout(timeout) {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => {
            Err(HarnessError::Timeout(format!("connect to port {port}: no answer in {timeout:?}")))
        }
    }
}

/// `pgN/tlT`: the member behind this session and the timeline it is primary on.
pub fn session_label(
    c: &mut Client,
    hosts: &[HostPort],
) -> std::result::Result<String, postgres::Error> {
    let r = c.query_one(
        "SELECT inet_server_port(), ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int",
        &[],
    )?;
    let port: i32 = r.try_get(0)?;
    let tl: i32 = r.try_get(1)?;
    let name = hosts
        .iter()
        .find(|h| i32::from(h.port) == port)
        .map(|h| h.name.clone())
        .unwrap_or_else(|| format!("port{port}"));
    Ok(format!("{name}/tl{tl}"))
}

/// The timeline of a label `pgN/tlT`.
pub fn label_timeline(label: &str) -> Option<i64> {
    label.rsplit_once("/tl")?.1.parse().ok()
}

/// The member of a label `pgN/tlT`.
pub fn label_member(label: &str) -> &str {
    label.split_once('/').map_or(label, |(m, _)| m)
}

// ================================================================================ the cluster

/// One Patroni member.
pub struct Member {
    pub name: String,
    pub api_port: u16,
    pub pg_port: u16,
    dir: PathBuf,
    data_dir: PathBuf,
    config_path: PathBuf,
    log_path: PathBuf,
    patroni: Option<Child>,
}

impl Member {
    pub fn host(&self) -> HostPort {
        HostPort { name: self.name.clone(), port: self.pg_port }
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The member's log: Patroni's output and its PostgreSQL's (`logging_collector` off).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    pub fn log_contents(&self) -> String {
        fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// libpq connection string of this member alone.
    pub fn conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=2",
            self.pg_port
        )
    }

    /// `GET <path>` on the member's REST API: the status, or None if it does not answer in 1 s.
    pub fn api_status(&self, path: &str) -> Option<u16> {
        http(self.api_port, "GET", path, Duration::from_secs(1)).ok().map(|(s, _)| s)
    }

    /// `GET /patroni` body, if Patroni answers.
    pub fn api_patroni(&self) -> Option<String> {
        http(self.api_port, "GET", "/patroni", Duration::from_secs(1)).ok().map(|(_, b)| b)
    }

    /// Holds the leader key and runs as primary (`GET /primary` is 200).
    pub fn is_leader(&self) -> bool {
        self.api_status("/primary") == Some(200)
    }

    /// A running replica that is the synchronous standby (`GET /sync` is 200).
    pub fn is_sync_standby(&self) -> bool {
        self.api_status("/sync") == Some(200)
    }

    /// A running replica (`GET /replica` is 200).
    pub fn is_replica(&self) -> bool {
        self.api_status("/replica") == Some(200)
    }

    /// Pid of the postmaster of this member's data directory, if one runs.
    pub fn postmaster_pid(&self) -> Option<i32> {
        let text = fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        let pid: i32 = text.lines().next()?.trim().parse().ok()?;
        (!is_gone(pid) && cmdline(pid).contains(&*self.data_dir.to_string_lossy())).then_some(pid)
    }

    pub fn patroni_pid(&self) -> Option<i32> {
        self.patroni.as_ref().map(|c| c.id() as i32)
    }

    /// Every live process of this member: Patroni, processes naming the data directory
    /// (postmaster, single-user postgres, pg_rewind, pg_basebackup...), and their descendants.
    fn processes(&self) -> Vec<i32> {
        let dd = self.data_dir.to_string_lossy().into_owned();
        let mut roots: Vec<i32> = self.patroni_pid().into_iter().collect();
        for (pid, _, state) in proc_table() {
            if state != 'Z' && state != 'X' && cmdline(pid).contains(&dd) {
                roots.push(pid);
            }
        }
        with_descendants(&roots)
    }

    fn start_patroni(&mut self) -> Result<()> {
        if let Some(c) = self.patroni.as_mut() {
            if c.try_wait().map_err(|e| HarnessError::io("wait patroni", e))?.is_none() {
                return Err(HarnessError::Other(format!("{}: Patroni already runs", self.name)));
            }
        }
        let (out, err) = open_log(&self.log_path)?;
        let mut cmd = server_command("patroni", &self.dir, true)?;
        cmd.arg(&self.config_path).stdout(out).stderr(err);
        let child = cmd
            .spawn()
            .map_err(|e| HarnessError::io(format!("{}: spawn patroni", self.name), e))?;
        self.patroni = Some(child);
        Ok(())
    }

    /// SIGKILL Patroni and every PostgreSQL process of this member; returns their pids.
    fn kill_all(&mut self) -> Result<Vec<i32>> {
        // Stop everything first (nothing can fork or restart anything), then kill.
        let mut pids = self.processes();
        signal(&pids, libc::SIGSTOP);
        for p in self.processes() {
            if !pids.contains(&p) {
                signal(&[p], libc::SIGSTOP);
                pids.push(p);
            }
        }
        signal(&pids, libc::SIGKILL);
        if let Some(mut c) = self.patroni.take() {
            let _ = c.wait();
        }
        wait_gone(&pids, Duration::from_secs(30))?;
        Ok(pids)
    }
}

/// The processes of a frozen member (see [`PatroniCluster::freeze_member`]).
#[derive(Debug)]
pub struct Frozen {
    pub member: String,
    pub patroni: Vec<i32>,
    pub postgres: Vec<i32>,
    pub at: Instant,
}

impl Frozen {
    /// SIGCONT PostgreSQL's processes, wait `patroni_delay`, SIGCONT Patroni's. Returns the
    /// instant PostgreSQL woke.
    pub fn thaw(self, patroni_delay: Duration) -> Instant {
        signal(&self.postgres, libc::SIGCONT);
        let woke = Instant::now();
        std::thread::sleep(patroni_delay);
        signal(&self.patroni, libc::SIGCONT);
        woke
    }
}

/// etcd, and Patroni members (see the module documentation).
pub struct PatroniCluster {
    pub opts: PatroniOpts,
    pub scope: String,
    base: PathBuf,
    etcd: Option<Child>,
    etcd_port: u16,
    etcd_log: PathBuf,
    members: Vec<Member>,
}

impl std::fmt::Debug for PatroniCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PatroniCluster")
            .field("scope", &self.scope)
            .field("base", &self.base)
            .field("etcd_port", &self.etcd_port)
            .field(
                "members",
                &self.members.iter().map(|m| (&m.name, m.pg_port, m.api_port)).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl PatroniCluster {
    /// Start etcd and the members, bootstrap through the first, `CREATE EXTENSION tsoracle` on
    /// it, and return once every member streams and one is the synchronous standby.
    pub fn start(name: &str, opts: PatroniOpts) -> Result<PatroniCluster> {
        assert!(opts.members >= 2, "a Patroni cluster needs at least 2 members");
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let root = std::env::var_os("TSORACLE_TEST_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let safe: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(24)
            .collect();
        let base = root.join(format!("tso-patroni-{safe}-{}-{n}", std::process::id()));
        if base.exists() {
            return Err(HarnessError::Other(format!("{} already exists", base.display())));
        }
        make_dir(&base)?;
        let scope = format!("{safe}-{}-{n}", std::process::id());
        let etcd_port = pick_port()?;
        let mut cluster = PatroniCluster {
            opts,
            scope,
            etcd_log: base.join("etcd.log"),
            base,
            etcd: None,
            etcd_port,
            members: Vec::new(),
        };
        // From here on, Drop cleans up whatever was started; a failed bring-up shows the logs.
        match cluster.bring_up() {
            Ok(()) => Ok(cluster),
            Err(e) => {
                eprintln!(
                    "[patroni] bring-up failed: {e}\n[patroni] state: {}",
                    cluster.describe()
                );
                cluster.dump_logs(LOG_TAIL_LINES);
                Err(e)
            }
        }
    }

    fn bring_up(&mut self) -> Result<()> {
        let opts = self.opts.clone();
        self.start_etcd()?;
        for i in 0..opts.members {
            let name = format!("pg{}", i + 1);
            let dir = self.base.join(&name);
            make_dir(&dir)?;
            let m = Member {
                api_port: pick_port()?,
                pg_port: pick_port()?,
                data_dir: dir.join("data"),
                config_path: dir.join("patroni.yml"),
                log_path: dir.join("patroni.log"),
                dir,
                name,
                patroni: None,
            };
            let text = render_config(&self.member_config(&m), &opts);
            fs::write(&m.config_path, text)
                .map_err(|e| HarnessError::io("write patroni.yml", e))?;
            chown(&m.config_path)?;
            self.members.push(m);
        }

        // pg1 bootstraps and leads.
        let t0 = Instant::now();
        self.members[0].start_patroni()?;
        let leader = self.wait_leader(&[], BOOTSTRAP_TIMEOUT)?;
        if leader != 0 {
            return Err(HarnessError::Other(format!(
                "bootstrap: {} leads, not pg1",
                self.members[leader].name
            )));
        }
        let st = self.create_extension(0)?;
        eprintln!(
            "[patroni] {}: pg1 bootstrapped and serving (epoch {:?}) after {:.1} s",
            self.scope,
            st.epoch,
            t0.elapsed().as_secs_f64()
        );
        for i in 1..self.members.len() {
            self.members[i].start_patroni()?;
        }
        let others: Vec<usize> = (1..self.members.len()).collect();
        self.wait_replicas(0, &others, BOOTSTRAP_TIMEOUT)?;
        let sync = self.wait_sync(0, None, BOOTSTRAP_TIMEOUT)?;
        eprintln!(
            "[patroni] {}: {} members up, synchronous standby {}, after {:.1} s",
            self.scope,
            self.members.len(),
            self.members[sync].name,
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }

    fn member_config(&self, m: &Member) -> MemberConfig {
        MemberConfig {
            scope: self.scope.clone(),
            name: m.name.clone(),
            api_port: m.api_port,
            pg_port: m.pg_port,
            etcd: format!("127.0.0.1:{}", self.etcd_port),
            data_dir: m.data_dir.to_string_lossy().into_owned(),
            run_dir: m.dir.to_string_lossy().into_owned(),
            bin_dir: pg_bin_dir().to_string_lossy().into_owned(),
        }
    }

    fn start_etcd(&mut self) -> Result<()> {
        let peer = pick_port()?;
        let dir = self.base.join("etcd");
        make_dir(&dir)?;
        let (out, err) = open_log(&self.etcd_log)?;
        let client_url = format!("http://127.0.0.1:{}", self.etcd_port);
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut cmd = server_command("etcd", &self.base, true)?;
        cmd.args(["--name", "etcd1", "--data-dir"])
            .arg(&dir)
            .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args([
                "--initial-cluster",
                &format!("etcd1={peer_url}"),
                "--initial-cluster-state",
                "new",
            ])
            .args(["--initial-cluster-token", &self.scope])
            .arg(format!("--enable-v2={}", self.opts.dcs == Dcs::EtcdV2))
            .args(["--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"])
            .stdout(out)
            .stderr(err);
        self.etcd = Some(cmd.spawn().map_err(|e| HarnessError::io("spawn etcd", e))?);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, body)) = http(self.etcd_port, "GET", "/health", Duration::from_secs(1))
            {
                if body.contains("true") {
                    return Ok(());
                }
            }
            if let Some(c) = self.etcd.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    return Err(HarnessError::Other(format!(
                        "etcd exited ({status}):\n{}",
                        read_tail(&self.etcd_log, 40)
                    )));
                }
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Timeout(format!(
                    "etcd not healthy in 30 s:\n{}",
                    read_tail(&self.etcd_log, 40)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    // ---------------------------------------------------------------- accessors

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    pub fn member(&self, i: usize) -> &Member {
        &self.members[i]
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.members.iter().position(|m| m.name == name)
    }

    /// Every member, in order: the hosts of [`PatroniCluster::conninfo`].
    pub fn hosts(&self) -> Vec<HostPort> {
        self.members.iter().map(Member::host).collect()
    }

    /// The libpq multi-host connection string applications use:
    /// `host=127.0.0.1,127.0.0.1,127.0.0.1 port=a,b,c ... target_session_attrs=read-write`.
    pub fn conninfo(&self) -> String {
        let hosts = vec!["127.0.0.1"; self.members.len()].join(",");
        let ports: Vec<String> = self.members.iter().map(|m| m.pg_port.to_string()).collect();
        format!(
            "host={hosts} port={} user=postgres dbname=postgres connect_timeout=2 target_session_attrs=read-write",
            ports.join(",")
        )
    }

    pub fn base_dir(&self) -> &Path {
        &self.base
    }

    /// The configuration file of member `i`, as written.
    pub fn config_text(&self, i: usize) -> Result<String> {
        fs::read_to_string(&self.members[i].config_path)
            .map_err(|e| HarnessError::io("read patroni.yml", e))
    }

    // ---------------------------------------------------------------- state

    /// The member holding the leader key, if any answers so.
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| self.members[i].is_leader())
    }

    /// The synchronous standby, if any answers so.
    pub fn sync_standby(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| self.members[i].is_sync_standby())
    }

    /// Wait until a member not in `exclude` holds the leader key; returns it.
    pub fn wait_leader(&self, exclude: &[usize], timeout: Duration) -> Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            for i in 0..self.members.len() {
                if !exclude.contains(&i) && self.members[i].is_leader() {
                    return Ok(i);
                }
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Timeout(format!(
                    "no leader (other than {exclude:?}) after {timeout:?}: {}",
                    self.describe()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Wait until every member of `replicas` is a running replica (`GET /replica`) streaming
    /// from `leader` (`pg_stat_replication` on the leader, `state = 'streaming'`).
    pub fn wait_replicas(
        &self,
        leader: usize,
        replicas: &[usize],
        timeout: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut last: String;
        loop {
            let not_replica: Vec<&str> = replicas
                .iter()
                .filter(|&&i| !self.members[i].is_replica())
                .map(|&i| self.members[i].name.as_str())
                .collect();
            if not_replica.is_empty() {
                match self.streaming_from(leader) {
                    Ok(streaming) => {
                        let missing: Vec<&str> = replicas
                            .iter()
                            .map(|&i| self.members[i].name.as_str())
                            .filter(|n| !streaming.contains(&n.to_string()))
                            .collect();
                        if missing.is_empty() {
                            return Ok(());
                        }
                        last = format!(
                            "not streaming from {}: {missing:?}",
                            self.members[leader].name
                        );
                    }
                    Err(e) => last = e.to_string(),
                }
            } else {
                last = format!("not running replicas: {not_replica:?}");
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Timeout(format!(
                    "replicas {replicas:?}: {last} after {timeout:?}; {}",
                    self.describe()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// application_name of the standbys streaming from member `i`.
    pub fn streaming_from(&self, i: usize) -> Result<Vec<String>> {
        let mut c = connect_one(self.members[i].pg_port, false, Duration::from_secs(5), 10_000)?;
        Ok(c.query(
            "SELECT application_name FROM pg_stat_replication WHERE state = 'streaming'",
            &[],
        )?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect())
    }

    /// Wait until a member (`want`, or any) is the synchronous standby of `leader`: Patroni
    /// says so (`GET /sync`, i.e. it is in the `/sync` key) and the leader's
    /// `pg_stat_replication` shows it `sync`. Returns it.
    pub fn wait_sync(
        &self,
        leader: usize,
        want: Option<usize>,
        timeout: Duration,
    ) -> Result<usize> {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        loop {
            let candidates: Vec<usize> = match want {
                Some(w) => vec![w],
                None => (0..self.members.len()).filter(|&i| i != leader).collect(),
            };
            for i in candidates {
                if !self.members[i].is_sync_standby() {
                    continue;
                }
                match connect_one(
                    self.members[leader].pg_port,
                    false,
                    Duration::from_secs(5),
                    10_000,
                )
                .and_then(|mut c| {
                    Ok(c.query_opt(
                        "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1",
                        &[&self.members[i].name],
                    )?
                    .map(|r| r.get::<_, String>(0)))
                }) {
                    Ok(Some(s)) if s == "sync" => return Ok(i),
                    Ok(s) => last = format!("{} sync_state {s:?}", self.members[i].name),
                    Err(e) => last = e.to_string(),
                }
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Timeout(format!(
                    "no synchronous standby {want:?} of {} after {timeout:?}; last: {last}; {}",
                    self.members[leader].name,
                    self.describe()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `CREATE EXTENSION IF NOT EXISTS tsoracle` on member `i`, then wait until it serves.
    pub fn create_extension(&self, i: usize) -> Result<TsoStatus> {
        let mut c = connect_one(self.members[i].pg_port, true, Duration::from_secs(10), 60_000)?;
        c.batch_execute("CREATE EXTENSION IF NOT EXISTS tsoracle")?;
        drop(c);
        self.wait_serving(i, Duration::from_secs(60))
    }

    /// Poll `tso_status()` on member `i` until it serves.
    pub fn wait_serving(&self, i: usize, timeout: Duration) -> Result<TsoStatus> {
        let deadline = Instant::now() + timeout;
        let mut last = String::from("no attempt");
        while Instant::now() < deadline {
            match connect_one(self.members[i].pg_port, false, Duration::from_secs(2), 10_000) {
                Ok(mut c) => match tso::status(&mut c) {
                    Ok(st) if st.state == "serving" => return Ok(st),
                    Ok(st) => last = format!("state {:?} ({:?})", st.state, st.detail),
                    Err(e) => last = pg_error_string(&e),
                },
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(HarnessError::Timeout(format!(
            "{} not serving after {timeout:?}; last: {last}",
            self.members[i].name
        )))
    }

    /// One line per member: REST role/state/timeline, postmaster pid.
    pub fn describe(&self) -> String {
        self.members
            .iter()
            .map(|m| match m.api_patroni() {
                Some(b) => format!(
                    "{}: role {} state {} timeline {} sync {}",
                    m.name,
                    json_field(&b, "role").unwrap_or_default(),
                    json_field(&b, "state").unwrap_or_default(),
                    json_field(&b, "timeline").unwrap_or_default(),
                    m.is_sync_standby()
                ),
                None => format!(
                    "{}: REST API not answering (postmaster {:?})",
                    m.name,
                    m.postmaster_pid()
                ),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    // ---------------------------------------------------------------- faults and operations

    /// `patronictl switchover --leader <from> --candidate <to> --force`; returns its output.
    pub fn switchover(&self, from: usize, to: usize) -> Result<String> {
        let m = &self.members[from];
        let mut cmd = server_command("patronictl", &m.dir, false)?;
        cmd.arg("-c").arg(&m.config_path).args([
            "switchover",
            "--leader",
            &m.name,
            "--candidate",
            &self.members[to].name,
            "--force",
        ]);
        let out = run_cmd(cmd, Duration::from_secs(120))?;
        if out.contains("failed") || out.contains("Error") {
            return Err(HarnessError::Other(format!("patronictl switchover: {out}")));
        }
        Ok(out)
    }

    /// `patronictl list` (for diagnostics).
    pub fn patronictl_list(&self) -> String {
        let m = &self.members[0];
        match server_command("patronictl", &m.dir, false).and_then(|mut cmd| {
            cmd.arg("-c").arg(&m.config_path).arg("list");
            run_cmd(cmd, Duration::from_secs(30))
        }) {
            Ok(s) => s,
            Err(e) => format!("patronictl list failed: {e}"),
        }
    }

    /// SIGKILL member `i`'s Patroni and all of its PostgreSQL processes.
    pub fn kill9_member(&mut self, i: usize) -> Result<Vec<i32>> {
        self.members[i].kill_all()
    }

    /// SIGSTOP member `i`'s Patroni (first, with its descendants), then its postmaster and all
    /// the postmaster's children. Thaw with [`Frozen::thaw`].
    pub fn freeze_member(&self, i: usize) -> Result<Frozen> {
        let m = &self.members[i];
        let patroni_root = m
            .patroni_pid()
            .ok_or_else(|| HarnessError::Other(format!("{}: Patroni not running", m.name)))?;
        let pm = m
            .postmaster_pid()
            .ok_or_else(|| HarnessError::Other(format!("{}: no postmaster", m.name)))?;
        signal(&[patroni_root], libc::SIGSTOP);
        let patroni: Vec<i32> =
            with_descendants(&[patroni_root]).into_iter().filter(|&p| p != pm).collect();
        signal(&patroni, libc::SIGSTOP);
        signal(&[pm], libc::SIGSTOP);
        // The postmaster cannot fork any more: its children are all there.
        let postgres = with_descendants(&[pm]);
        signal(&postgres, libc::SIGSTOP);
        Ok(Frozen { member: m.name.clone(), patroni, postgres, at: Instant::now() })
    }

    /// SIGTERM member `i`'s Patroni (it stops its PostgreSQL, fast) and wait for it to exit.
    pub fn stop_member(&mut self, i: usize) -> Result<()> {
        let m = &mut self.members[i];
        let Some(mut child) = m.patroni.take() else {
            return Err(HarnessError::Other(format!("{}: Patroni not running", m.name)));
        };
        signal(&[child.id() as i32], libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if child.try_wait().map_err(|e| HarnessError::io("wait patroni", e))?.is_some() {
                break;
            }
            if Instant::now() > deadline {
                m.patroni = Some(child);
                m.kill_all()?;
                return Err(HarnessError::Timeout(format!(
                    "{}: Patroni did not stop in 90 s; killed",
                    m.name
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Patroni waits for its postmaster; make sure nothing is left.
        let left = m.processes();
        if !left.is_empty() {
            return Err(HarnessError::Other(format!(
                "{}: processes left after Patroni stopped: {left:?}",
                m.name
            )));
        }
        Ok(())
    }

    /// Start member `i`'s Patroni again (after a kill or a stop).
    pub fn start_member(&mut self, i: usize) -> Result<()> {
        self.members[i].start_patroni()
    }

    /// Wait until member `i` is a running replica streaming from `leader` (after a restart,
    /// a demotion, a rewind).
    pub fn wait_rejoined(&self, i: usize, leader: usize) -> Result<()> {
        self.wait_replicas(leader, &[i], REJOIN_TIMEOUT)
    }

    /// Print the tail of every member's log and of etcd's.
    pub fn dump_logs(&self, lines: usize) {
        for m in &self.members {
            eprintln!(
                "----- {} ({}): last {lines} lines -----\n{}\n----- end of {} -----",
                m.name,
                m.log_path.display(),
                read_tail(&m.log_path, lines),
                m.name
            );
        }
        eprintln!(
            "----- etcd: last 20 lines -----\n{}\n----- end of etcd -----",
            read_tail(&self.etcd_log, 20)
        );
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        if panicking {
            eprintln!("[patroni] cluster state at the failure: {}", self.describe());
            self.dump_logs(LOG_TAIL_LINES);
        }
        // Frozen processes are killed like the others (SIGKILL works on stopped processes).
        for m in &mut self.members {
            if let Err(e) = m.kill_all() {
                eprintln!("[patroni] teardown of {}: {e}", m.name);
            }
        }
        if let Some(mut etcd) = self.etcd.take() {
            let _ = etcd.kill();
            let _ = etcd.wait();
        }
        let keep = panicking && std::env::var_os("TSORACLE_KEEP_FAILED").is_some_and(|v| v == "1");
        if keep {
            eprintln!("[patroni] keeping {}", self.base.display());
        } else {
            let _ = fs::remove_dir_all(&self.base);
        }
    }
}

// ================================================================================ the load

/// Options of a [`PatroniLoad`].
#[derive(Clone, Debug)]
pub struct PatroniLoadOptions {
    pub threads: usize,
    /// Keys of `tso_seq`.
    pub seq_keys: Vec<String>,
    /// Share of `tso_seq` calls; of the rest, half `tso_next()`, half `tso_next_batch(k)`.
    pub seq_share: f64,
    pub max_batch: i32,
    pub max_seq: i32,
    pub statement_timeout_ms: u64,
    /// Sleep after a failed connection or a broken session.
    pub backoff: Duration,
}

impl Default for PatroniLoadOptions {
    fn default() -> Self {
        PatroniLoadOptions {
            threads: 16,
            seq_keys: vec!["k0".into(), "k1".into(), "k2".into()],
            seq_share: 0.3,
            max_batch: 64,
            max_seq: 5,
            statement_timeout_ms: 20_000,
            backoff: Duration::from_millis(20),
        }
    }
}

/// Where a load thread connects.
#[derive(Clone, Debug)]
pub enum Target {
    /// The leader, found through the hosts in order (read-write); reconnect after errors.
    Leader(Vec<HostPort>),
    /// One member directly, connected once: the thread ends when that session breaks.
    Direct { hosts: Vec<HostPort>, port: u16 },
}

/// Client threads calling `tso_next()`, `tso_next_batch(k)` and `tso_seq(key, k)`, recording
/// every call (errors too, with the count asked for) under the session's label.
pub struct PatroniLoad {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<PatroniLoadStats>>,
}

/// Totals of a [`PatroniLoad`].
#[derive(Clone, Debug, Default)]
pub struct PatroniLoadStats {
    pub ok_calls: u64,
    pub err_calls: u64,
    pub connects: u64,
    pub connect_failures: u64,
    pub sample_errors: Vec<String>,
}

impl PatroniLoadStats {
    fn note(&mut self, e: String) {
        if self.sample_errors.len() < 8 && !self.sample_errors.contains(&e) {
            self.sample_errors.push(e);
        }
    }
}

impl PatroniLoad {
    pub fn start(
        target: Target,
        opts: PatroniLoadOptions,
        ts: &History,
        dense: &DenseHistory,
    ) -> PatroniLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let handles = (0..opts.threads)
            .map(|i| {
                let (target, opts, ts, dense, stop) =
                    (target.clone(), opts.clone(), ts.clone(), dense.clone(), stop.clone());
                std::thread::Builder::new()
                    .name(format!("patroni-load-{i}"))
                    .spawn(move || load_worker(target, opts, ts, dense, stop))
                    .expect("spawn a load thread")
            })
            .collect();
        PatroniLoad { stop, handles }
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Stop and wait for the threads (a thread blocked on a frozen server waits for it).
    pub fn stop_and_join(mut self) -> PatroniLoadStats {
        self.stop();
        let mut total = PatroniLoadStats::default();
        for h in self.handles.drain(..) {
            match h.join() {
                Ok(s) => {
                    total.ok_calls += s.ok_calls;
                    total.err_calls += s.err_calls;
                    total.connects += s.connects;
                    total.connect_failures += s.connect_failures;
                    for e in s.sample_errors {
                        total.note(e);
                    }
                }
                Err(p) => std::panic::resume_unwind(p),
            }
        }
        total
    }
}

impl Drop for PatroniLoad {
    fn drop(&mut self) {
        // Not joined: a thread may be blocked on a frozen server until the cluster is torn down.
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn connect_target(target: &Target, statement_timeout_ms: u64) -> Result<(Client, String)> {
    let (mut c, hosts) = match target {
        Target::Leader(hosts) => {
            (connect_read_write(hosts, HOST_CONNECT_TIMEOUT, statement_timeout_ms)?, hosts)
        }
        Target::Direct { hosts, port } => {
            (connect_one(*port, true, HOST_CONNECT_TIMEOUT, statement_timeout_ms)?, hosts)
        }
    };
    let label = session_label(&mut c, hosts)?;
    Ok((c, label))
}

/// A session error after which the session is useless.
fn broken(c: &Client, e: &postgres::Error) -> bool {
    c.is_closed()
        || e.as_db_error().is_none()
        || e.code().is_some_and(|s| {
            let s = s.code();
            s.starts_with("08")
                || s == "25006"
                || (s.starts_with("57") && s != "57P03" && s != "57014")
        })
}

fn load_worker(
    target: Target,
    opts: PatroniLoadOptions,
    ts: History,
    dense: DenseHistory,
    stop: Arc<AtomicBool>,
) -> PatroniLoadStats {
    let mut rng = SplitMix64::from_entropy();
    let mut stats = PatroniLoadStats::default();
    let direct = matches!(target, Target::Direct { .. });
    let mut conn: Option<(Client, String)> = None;
    let mut connected_once = false;
    while !stop.load(Ordering::SeqCst) {
        let Some((client, label)) = conn.as_mut() else {
            if direct && connected_once {
                break; // a direct session is never replaced
            }
            match connect_target(&target, opts.statement_timeout_ms) {
                Ok(c) => {
                    stats.connects += 1;
                    connected_once = true;
                    conn = Some(c);
                }
                Err(e) => {
                    stats.connect_failures += 1;
                    stats.note(format!("connect: {e}"));
                    if direct {
                        break;
                    }
                    std::thread::sleep(opts.backoff);
                }
            }
            continue;
        };
        let start = Instant::now();
        if !opts.seq_keys.is_empty() && rng.chance(opts.seq_share) {
            let key =
                &opts.seq_keys[rng.range_inclusive(0, opts.seq_keys.len() as i64 - 1) as usize];
            let k = rng.range_inclusive(1, opts.max_seq as i64) as i32;
            let res = client
                .query_one("SELECT tso_seq($1::text, $2::int)", &[key, &k])
                .and_then(|row| row.try_get::<_, i64>(0));
            let end = Instant::now();
            match res {
                Ok(first) => {
                    stats.ok_calls += 1;
                    dense.record_ok(start, end, label, key, first, k as i64);
                }
                Err(e) => {
                    stats.err_calls += 1;
                    let msg = pg_error_string(&e);
                    stats.note(msg.clone());
                    dense.record_err(start, end, label, key, msg, k as i64);
                    if broken(client, &e) {
                        conn = None;
                        std::thread::sleep(opts.backoff);
                    } else if e.code() == Some(&SqlState::CANNOT_CONNECT_NOW) {
                        std::thread::sleep(opts.backoff);
                    }
                }
            }
        } else {
            let k: i32 = if rng.chance(0.5) {
                1
            } else {
                rng.range_inclusive(1, opts.max_batch as i64) as i32
            };
            let res = if k == 1 {
                client.query_one("SELECT tso_next()", &[])
            } else {
                client.query_one("SELECT tso_next_batch($1)", &[&k])
            }
            .and_then(|row| row.try_get::<_, i64>(0));
            let end = Instant::now();
            match res {
                Ok(first) => {
                    stats.ok_calls += 1;
                    ts.record_ok(start, end, label, first, k as i64);
                }
                Err(e) => {
                    stats.err_calls += 1;
                    let msg = pg_error_string(&e);
                    stats.note(msg.clone());
                    ts.record_err(start, end, label, msg, k as i64);
                    if broken(client, &e) {
                        conn = None;
                        std::thread::sleep(opts.backoff);
                    } else if e.code() == Some(&SqlState::CANNOT_CONNECT_NOW) {
                        std::thread::sleep(opts.backoff);
                    }
                }
            }
        }
    }
    stats
}

// ================================================================================ leases

/// One lease call as the holder saw it.
#[derive(Clone, Debug)]
pub struct Grant {
    pub start: Instant,
    pub end: Instant,
    /// Label of the session (`pgN/tlT`).
    pub node: String,
    /// Acquire (false) or renewal (true).
    pub renewal: bool,
    /// `(lease_id, ts_upper_bound, expires_at_ms, epoch)`, or the error text.
    pub result: std::result::Result<(i64, i64, i64, i32), String>,
}

/// Lease calls, shared by clones.
#[derive(Clone, Debug, Default)]
pub struct LeaseLog {
    grants: Arc<Mutex<Vec<Grant>>>,
}

impl LeaseLog {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn record(&self, g: Grant) {
        self.grants.lock().unwrap_or_else(|p| p.into_inner()).push(g);
    }

    pub fn grants(&self) -> Vec<Grant> {
        self.grants.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn len(&self) -> usize {
        self.grants.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One lease holder: acquires a lease (holder name, epoch 1, `ttl_ms`), renews it every
/// `every`, and when the lease is gone (expired, superseded, unknown) acquires again at the
/// next holder epoch. Every call is recorded in a [`LeaseLog`].
pub struct LeaseHolder {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl LeaseHolder {
    pub fn start(
        target: Target,
        holder: &str,
        ttl_ms: i32,
        every: Duration,
        log: &LeaseLog,
    ) -> LeaseHolder {
        let stop = Arc::new(AtomicBool::new(false));
        let (stop2, log, holder) = (stop.clone(), log.clone(), holder.to_string());
        let handle = std::thread::Builder::new()
            .name("lease-holder".into())
            .spawn(move || lease_worker(target, &holder, ttl_ms, every, log, stop2))
            .expect("spawn the lease holder");
        LeaseHolder { stop, handle: Some(handle) }
    }

    pub fn stop_and_join(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
    }
}

impl Drop for LeaseHolder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn lease_worker(
    target: Target,
    holder: &str,
    ttl_ms: i32,
    every: Duration,
    log: LeaseLog,
    stop: Arc<AtomicBool>,
) {
    let mut conn: Option<(Client, String)> = None;
    let mut lease: Option<i64> = None;
    // Start above any epoch an earlier holder of this name may have used.
    let mut epoch: i64 = 1;
    while !stop.load(Ordering::SeqCst) {
        let Some((c, label)) = conn.as_mut() else {
            match connect_target(&target, 20_000) {
                Ok(x) => conn = Some(x),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
            continue;
        };
        let start = Instant::now();
        let (renewal, res) = match lease {
            Some(id) => (
                true,
                c.query_one("SELECT ts_upper_bound, expires_at_ms, epoch FROM tso_lease_renew($1)", &[&id])
                    .and_then(|r| Ok((id, r.try_get::<_, i64>(0)?, r.try_get::<_, i64>(1)?, r.try_get::<_, i32>(2)?))),
            ),
            None => (
                false,
                c.query_one(
                    "SELECT lease_id, ts_upper_bound, expires_at_ms, epoch FROM tso_lease_acquire($1, $2, $3)",
                    &[&holder, &epoch, &ttl_ms],
                )
                .and_then(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?))),
            ),
        };
        let end = Instant::now();
        match res {
            Ok(g) => {
                lease = Some(g.0);
                log.record(Grant { start, end, node: label.clone(), renewal, result: Ok(g) });
                std::thread::sleep(every);
            }
            Err(e) => {
                log.record(Grant {
                    start,
                    end,
                    node: label.clone(),
                    renewal,
                    result: Err(pg_error_string(&e)),
                });
                let code = e.code().map(|s| s.code().to_string()).unwrap_or_default();
                if code == "55000" || code == "P0002" {
                    // Expired, superseded or purged: a new lease at the next epoch.
                    lease = None;
                    epoch += 1;
                } else if broken(c, &e) {
                    conn = None;
                    std::thread::sleep(Duration::from_millis(20));
                } else {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
}

/// What [`check_leases`] saw.
#[derive(Clone, Debug, Default)]
pub struct LeaseReport {
    pub ok_grants: usize,
    pub err_grants: usize,
    pub acquires: usize,
    pub renewals: usize,
    /// Distinct terms (labels) that granted leases.
    pub terms: BTreeSet<String>,
    /// (grant, timestamp call) pairs compared across terms.
    pub cross_term_pairs: u64,
    pub highest_bound: Option<i64>,
}

/// Check lease grants against the timestamps:
///
/// 1. a grant's `ts_upper_bound` is at or above the physical part of every timestamp returned
///    by a call that ended before the grant began (the bound is the durable high-water,
///    which only rises and bounds everything served);
/// 2. every timestamp served by another term (label) in a call that began after a grant
///    returned is above that grant's bound (README, "Leases": after a failover, every
///    timestamp is above every lease bound ever granted; and a term older than the grant's
///    must not serve any more);
/// 3. a grant's epoch is the timeline of the term that granted it.
pub fn check_leases(ts: &History, log: &LeaseLog) -> std::result::Result<LeaseReport, String> {
    let calls: Vec<_> = ts.calls().into_iter().filter(|c| c.is_ok()).collect();
    let origin = ts.origin();
    let rel = |t: Instant| -> String {
        if t >= origin {
            format!("+{:.1}ms", (t - origin).as_secs_f64() * 1e3)
        } else {
            format!("-{:.1}ms", (origin - t).as_secs_f64() * 1e3)
        }
    };
    // (1): calls by end, with the running maximum of their last value.
    let mut by_end: Vec<(Instant, i64)> =
        calls.iter().map(|c| (c.end, c.last().unwrap_or(0))).collect();
    by_end.sort_by_key(|x| x.0);
    let mut prefix_max = Vec::with_capacity(by_end.len());
    let mut m = i64::MIN;
    for &(_, last) in &by_end {
        m = m.max(last);
        prefix_max.push(m);
    }
    // (2): per label, calls by start, with the suffix minimum of their first value.
    let mut per_label: BTreeMap<String, (Vec<Instant>, Vec<i64>)> = BTreeMap::new();
    {
        let mut tmp: BTreeMap<String, Vec<(Instant, i64)>> = BTreeMap::new();
        for c in &calls {
            tmp.entry(c.node.clone()).or_default().push((c.start, c.first().unwrap_or(i64::MAX)));
        }
        for (label, mut v) in tmp {
            v.sort_by_key(|x| x.0);
            let mut suffix = vec![i64::MAX; v.len()];
            let mut m = i64::MAX;
            for i in (0..v.len()).rev() {
                m = m.min(v[i].1);
                suffix[i] = m;
            }
            per_label.insert(label, (v.iter().map(|x| x.0).collect(), suffix));
        }
    }
    let mut report = LeaseReport::default();
    for g in log.grants() {
        let Ok((id, bound, _expires, epoch)) = g.result else {
            report.err_grants += 1;
            continue;
        };
        report.ok_grants += 1;
        if g.renewal {
            report.renewals += 1;
        } else {
            report.acquires += 1;
        }
        report.terms.insert(g.node.clone());
        report.highest_bound = Some(report.highest_bound.map_or(bound, |b| b.max(bound)));
        if label_timeline(&g.node) != Some(epoch as i64) {
            return Err(format!(
                "lease {id} granted by {} during {}..{} has epoch {epoch}, not the term's timeline",
                g.node,
                rel(g.start),
                rel(g.end)
            ));
        }
        let n = by_end.partition_point(|x| x.0 < g.start);
        if n > 0 && physical(prefix_max[n - 1]) > bound {
            return Err(format!(
                "lease {id} granted by {} during {}..{} has bound {bound}, below physical {} of a timestamp ({}) returned before the grant began",
                g.node,
                rel(g.start),
                rel(g.end),
                physical(prefix_max[n - 1]),
                prefix_max[n - 1]
            ));
        }
        for (label, (starts, suffix)) in &per_label {
            if *label == g.node {
                continue;
            }
            let i = starts.partition_point(|&s| s <= g.end);
            if i < starts.len() {
                report.cross_term_pairs += (starts.len() - i) as u64;
                if physical(suffix[i]) <= bound {
                    return Err(format!(
                        "{label} served {} (physical {}) in a call that began after lease {id} (bound {bound}) was granted by {} during {}..{}",
                        suffix[i],
                        physical(suffix[i]),
                        g.node,
                        rel(g.start),
                        rel(g.end)
                    ));
                }
            }
        }
    }
    Ok(report)
}
