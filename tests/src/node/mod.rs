//! One PostgreSQL cluster on a loopback port, owned by the test that created it.
//!
//! # Processes and users
//!
//! Everything here runs as root and `initdb`/`postgres` refuse root, so every server binary
//! (`initdb`, `postgres`, `pg_ctl`, `pg_basebackup`) runs as the `postgres` OS user, switched to
//! with `Command::uid/gid` (the same as `runuser -u postgres --`, without a PAM session and an
//! extra process in between). The node's directory is owned by `postgres`.
//!
//! The postmaster is started directly (`postgres -D data`, stdout/stderr appended to
//! `<node dir>/server.log`) as a child process of the test, not through `pg_ctl start`: PID 1 on
//! these machines reaps orphans only every few seconds, and a postmaster orphaned by `pg_ctl`
//! that was SIGKILLed stays a zombie for that long, which makes the next start fail with
//! "lock file already exists" (a zombie still answers `kill(pid, 0)`). As our child, the test
//! reaps it at once. Readiness is detected like `pg_ctl -w` does it: the status line of
//! `postmaster.pid` says `ready` (or `standby` for a hot standby). Stopping uses
//! `pg_ctl stop -m fast|immediate|smart`, then the child is reaped.
//!
//! # kill -9 of the postmaster
//!
//! [`Node::kill9_postmaster`] first SIGSTOPs the postmaster, so it cannot fork any more, then
//! collects all of its descendants by scanning `/proc/*/stat` for parent pids, SIGKILLs the
//! postmaster and every descendant, and waits (bounded) until all are gone (or zombies, which
//! hold no shared memory). Scanning `/proc` was chosen over `pg_stat_activity` because the latter
//! misses processes that are not in it (e.g. a backend still authenticating, the logger, an
//! archiver's shell) and races with new connections; with the postmaster stopped the scan is
//! exact. After this, `start()` succeeds: the stale `postmaster.pid` names a dead pid and no
//! process is attached to the old shared memory.
//!
//! # Ports
//!
//! A free port is chosen by binding `127.0.0.1:0` (never handing out the same port twice in
//! one test process). If the server fails to bind it anyway (a race with another process),
//! `start()` retries, first on the same port (so clients keep their conninfo across restarts),
//! then on a fresh one.
//!
//! # Failure output and cleanup
//!
//! `Drop` stops the server with `-m immediate` (SIGKILL as a fallback) and deletes the node's
//! directory. If the thread is panicking (a failed assertion), it first prints the tail of the
//! server log to stderr; with `TSORACLE_KEEP_FAILED=1` it also keeps the directory.
//!
//! # Environment
//!
//! `TSORACLE_PG_BIN` (server binaries, default `/usr/lib/postgresql/15/bin`),
//! `TSORACLE_PG_USER` (OS user, default `postgres`), `TSORACLE_TEST_DIR` (parent of the node
//! directories, default the system temp dir), `TSORACLE_KEEP_FAILED=1` (see above).
//!
//! # Files
//!
//! * `mod.rs`: the [`Node`] type, its accessors and server log, [`StopMode`], `Drop`;
//! * `config.rs`: [`NodeOpts`], the harness's default settings, `harness.conf` and reloads;
//! * `lifecycle.rs`: `initdb`, start (retrying on a busy port), stop, restart;
//! * `kill.rs`: `kill -9` of the postmaster or of one of its processes;
//! * `replica.rs`: nodes made from another node (base backups, `pg_upgrade`), promotion;
//! * `client.rs`: connections, `psql`, `CREATE EXTENSION` and the wait until it serves;
//! * `os.rs`: the postgres OS user, node directories, ports, commands run with a time bound.

mod client;
mod config;
mod kill;
mod lifecycle;
mod os;
mod replica;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::load::Endpoint;
use crate::process::{kill_tree, wait_gone};

pub use config::NodeOpts;
pub use os::pick_port;
pub(crate) use os::{last_lines, make_base_dir, pg_user, run_cmd, scrub_env, user_ids};
use os::{read_from, wait_child};

/// How long `start()` waits for the server to accept connections (crash recovery included).
pub const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `connect()` keeps retrying.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `wait_serving()` waits for `tso_status().state = 'serving'`.
pub const SERVING_TIMEOUT: Duration = Duration::from_secs(60);
/// Lines of server log printed when a test panics.
pub const LOG_TAIL_LINES: usize = 120;

/// Directory of the PostgreSQL server binaries (`TSORACLE_PG_BIN` overrides).
pub fn pg_bin_dir() -> PathBuf {
    std::env::var_os("TSORACLE_PG_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"))
}

/// `pg_ctl stop` modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopMode {
    Smart,
    Fast,
    Immediate,
}

impl StopMode {
    pub fn as_str(self) -> &'static str {
        match self {
            StopMode::Smart => "smart",
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        }
    }
}

/// One PostgreSQL cluster (see the module documentation).
pub struct Node {
    name: String,
    base: PathBuf,
    datadir: PathBuf,
    logfile: PathBuf,
    port: Arc<AtomicU16>,
    settings: BTreeMap<String, String>,
    postmaster: Option<Child>,
    bin: PathBuf,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.name)
            .field("port", &self.port())
            .field("datadir", &self.datadir)
            .field("running", &self.postmaster.is_some())
            .finish()
    }
}

impl Node {
    // ---------------------------------------------------------------- accessors

    /// The directory of the binaries this cluster runs from.
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn port(&self) -> u16 {
        self.port.load(Ordering::SeqCst)
    }

    pub fn datadir(&self) -> &Path {
        &self.datadir
    }

    /// The node's directory (holds `data/`, `server.log`, command logs).
    pub fn basedir(&self) -> &Path {
        &self.base
    }

    pub fn log_path(&self) -> &Path {
        &self.logfile
    }

    /// libpq connection string for the superuser `postgres` and database `postgres`.
    pub fn conninfo(&self) -> String {
        self.conninfo_for("postgres", "postgres")
    }

    pub fn conninfo_for(&self, user: &str, dbname: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={} dbname={} connect_timeout=5",
            self.port(),
            user,
            dbname
        )
    }

    /// An endpoint for the load helper that follows this node's port if it changes.
    pub fn endpoint(&self) -> Endpoint {
        let port = self.port.clone();
        Endpoint::new(&self.name, move || {
            format!(
                "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=5",
                port.load(Ordering::SeqCst)
            )
        })
    }

    /// The current harness settings (what `harness.conf` holds, port excluded).
    pub fn settings(&self) -> &BTreeMap<String, String> {
        &self.settings
    }

    // ---------------------------------------------------------------- logs

    /// The whole server log (lossy UTF-8).
    pub fn log_contents(&self) -> String {
        read_from(&self.logfile, 0)
    }

    /// The last `lines` lines of the server log.
    pub fn log_tail(&self, lines: usize) -> String {
        last_lines(&self.log_contents(), lines)
    }

    /// Print the tail of the server log to stderr (done automatically when a test panics).
    pub fn dump_log(&self, lines: usize) {
        eprintln!(
            "----- node {} (port {}, {}): last {} lines of server log -----\n{}\n----- end of node {} log -----",
            self.name,
            self.port(),
            self.logfile.display(),
            lines,
            self.log_tail(lines),
            self.name
        );
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        if panicking {
            self.dump_log(LOG_TAIL_LINES);
        }
        if self.is_running() && self.stop(StopMode::Immediate).is_err() {
            if let Some(mut child) = self.postmaster.take() {
                let kids = kill_tree(child.id() as i32);
                let _ = wait_child(&mut child, Duration::from_secs(30));
                let _ = wait_gone(&kids, Duration::from_secs(30));
            }
        }
        let keep = panicking && std::env::var_os("TSORACLE_KEEP_FAILED").is_some_and(|v| v == "1");
        if keep {
            eprintln!("[harness] keeping node {} at {}", self.name, self.base.display());
        } else {
            let _ = fs::remove_dir_all(&self.base);
        }
    }
}
