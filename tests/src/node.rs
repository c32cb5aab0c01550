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

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::{Client, NoTls};

use crate::error::{pg_error_string, HarnessError};
use crate::load::Endpoint;
use crate::process::{self, descendants, kill_tree, wait_gone};
use crate::tso::{self, TsoStatus};
use crate::Result;

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

/// Options for [`Node::init`].
#[derive(Clone, Debug)]
pub struct NodeOpts {
    /// Put `shared_preload_libraries = 'tsoracle'` in the configuration (default true).
    pub preload: bool,
    /// Extra `postgresql.conf` settings, applied after the harness's defaults (so they win).
    pub settings: Vec<(String, String)>,
    /// The server binaries (default [`pg_bin_dir`]).
    pub bin: Option<PathBuf>,
    /// Extra `initdb` arguments.
    pub initdb_args: Vec<String>,
}

impl Default for NodeOpts {
    fn default() -> Self {
        NodeOpts { preload: true, settings: Vec::new(), bin: None, initdb_args: Vec::new() }
    }
}

impl NodeOpts {
    pub fn new() -> Self {
        Self::default()
    }

    /// A cluster without `shared_preload_libraries`.
    pub fn without_preload(mut self) -> Self {
        self.preload = false;
        self
    }

    pub fn setting(mut self, key: &str, value: impl ToString) -> Self {
        self.settings.push((key.to_string(), value.to_string()));
        self
    }

    /// Pass `arg` to `initdb`.
    pub fn initdb_arg(mut self, arg: &str) -> Self {
        self.initdb_args.push(arg.to_string());
        self
    }

    /// Run the cluster from the binaries in `bin` instead of [`pg_bin_dir`] (another major).
    pub fn bin(mut self, bin: impl Into<PathBuf>) -> Self {
        self.bin = Some(bin.into());
        self
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
    // ---------------------------------------------------------------- creation

    /// `initdb` a new cluster in a fresh directory and write its configuration. Not started.
    pub fn init(name: &str, opts: NodeOpts) -> Result<Node> {
        let mut node = Node::empty(name, opts.bin.unwrap_or_else(pg_bin_dir))?;
        let mut cmd = node.pg_command("initdb");
        cmd.arg("-D").arg(&node.datadir).args([
            "--auth=trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        ]);
        cmd.args(&opts.initdb_args);
        run_cmd(cmd, Duration::from_secs(180))?;

        let mut settings = default_settings();
        if opts.preload {
            settings.insert("shared_preload_libraries".into(), "tsoracle".into());
        }
        for (k, v) in opts.settings {
            settings.insert(k, v);
        }
        node.settings = settings;
        let conf = node.datadir.join("postgresql.conf");
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(&conf)
            .map_err(|e| HarnessError::io(format!("open {}", conf.display()), e))?;
        writeln!(
            f,
            "\n# tsoracle-tests harness settings (rewritten by set_conf)\ninclude 'harness.conf'"
        )
        .map_err(|e| HarnessError::io("append include", e))?;
        node.write_conf()?;
        Ok(node)
    }

    /// `init` + `start`.
    pub fn start_new(name: &str, opts: NodeOpts) -> Result<Node> {
        let mut node = Node::init(name, opts)?;
        node.start()?;
        Ok(node)
    }

    /// A streaming replica of `primary`: `pg_basebackup -R -X stream` (as postgres) into a new
    /// node directory; `primary_conninfo` carries `application_name=<name>` (usable in
    /// `synchronous_standby_names`). Same settings as the primary, its own port. Not started.
    pub fn base_backup_from(primary: &Node, name: &str) -> Result<Node> {
        let mut node = Node::empty(name, primary.bin.clone())?;
        node.settings = primary.settings.clone();
        let mut cmd = node.pg_command("pg_basebackup");
        cmd.arg("-D")
            .arg(&node.datadir)
            .args(["-R", "-X", "stream", "-c", "fast", "--no-sync", "-d"])
            .arg(format!(
                "host=127.0.0.1 port={} user=postgres application_name={}",
                primary.port(),
                node.name
            ));
        run_cmd(cmd, Duration::from_secs(300))?;
        // The copied harness.conf is the primary's: write our own (our port).
        node.write_conf()?;
        Ok(node)
    }

    /// `pg_upgrade` the stopped cluster `old` into a new cluster `name`, `initdb`ed from the
    /// binaries of `opts` (another major) with `opts`' settings; `--copy` mode, so `old`
    /// stays usable. Not started.
    pub fn upgrade_from(old: &Node, name: &str, opts: NodeOpts) -> Result<Node> {
        let new = Node::init(name, opts)?;
        let mut cmd = new.pg_command("pg_upgrade");
        cmd.arg("--old-bindir")
            .arg(&old.bin)
            .arg("--new-bindir")
            .arg(&new.bin)
            .arg("--old-datadir")
            .arg(&old.datadir)
            .arg("--new-datadir")
            .arg(&new.datadir)
            .args(["--old-port", &old.port().to_string(), "--new-port", &new.port().to_string()])
            .arg("--socketdir")
            .arg(&new.base)
            .args(["--copy", "--no-sync", "-U", "postgres"]);
        match run_cmd(cmd, Duration::from_secs(600)) {
            Ok(_) => Ok(new),
            // pg_upgrade names a log file with the cause: say what it holds, the new node's
            // directory is deleted when `new` is dropped.
            Err(e) => Err(HarnessError::Other(format!(
                "{e}\n{}",
                tail_of_logs(&new.datadir.join("pg_upgrade_output.d"), 10)
            ))),
        }
    }

    fn empty(name: &str, bin: PathBuf) -> Result<Node> {
        let (uid, gid) = pg_user()?;
        let base = make_base_dir(name, uid, gid)?;
        let logfile = base.join("server.log");
        fs::write(&logfile, b"").map_err(|e| HarnessError::io("create server.log", e))?;
        std::os::unix::fs::chown(&logfile, Some(uid), Some(gid))
            .map_err(|e| HarnessError::io("chown server.log", e))?;
        Ok(Node {
            name: sanitize(name),
            datadir: base.join("data"),
            logfile,
            base,
            port: Arc::new(AtomicU16::new(pick_port()?)),
            settings: BTreeMap::new(),
            postmaster: None,
            bin,
        })
    }

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

    // ---------------------------------------------------------------- configuration

    /// Set `key = 'value'` in the node's `harness.conf`; if running, reload and wait until a
    /// backend has re-read the configuration. Postmaster-context settings need a restart.
    pub fn set_conf(&mut self, key: &str, value: impl ToString) -> Result<()> {
        self.settings.insert(key.to_string(), value.to_string());
        self.write_conf()?;
        if self.is_running() {
            self.reload()?;
        }
        Ok(())
    }

    /// Remove a setting previously set by the harness (back to the server default).
    pub fn unset_conf(&mut self, key: &str) -> Result<()> {
        self.settings.remove(key);
        self.write_conf()?;
        if self.is_running() {
            self.reload()?;
        }
        Ok(())
    }

    /// SIGHUP the postmaster, then wait (bounded) until a fresh backend shows a newer
    /// `pg_conf_load_time()` (the postmaster reloads before it signals its children).
    pub fn reload(&mut self) -> Result<()> {
        let pid = self
            .postmaster_pid()
            .ok_or_else(|| HarnessError::Other("reload: not running".into()))?;
        let mut c = self.try_connect(CONNECT_TIMEOUT)?;
        let before: String = c.query_one("SELECT pg_conf_load_time()::text", &[])?.get(0);
        // SAFETY: plain kill(2) on our own child.
        if unsafe { libc::kill(pid, libc::SIGHUP) } != 0 {
            return Err(HarnessError::io("kill -HUP postmaster", std::io::Error::last_os_error()));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // The idle backend processes the SIGHUP before it reads its next query.
            let now: String = c.query_one("SELECT pg_conf_load_time()::text", &[])?.get(0);
            if now != before {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Timeout("configuration reload not observed".into()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn write_conf(&self) -> Result<()> {
        let mut text = String::from("# written by the tsoracle-tests harness; do not edit\n");
        text.push_str(&format!("port = {}\n", self.port()));
        for (k, v) in &self.settings {
            text.push_str(&format!("{} = '{}'\n", k, v.replace('\'', "''")));
        }
        let path = self.datadir.join("harness.conf");
        fs::write(&path, text)
            .map_err(|e| HarnessError::io(format!("write {}", path.display()), e))?;
        let (uid, gid) = pg_user()?;
        std::os::unix::fs::chown(&path, Some(uid), Some(gid))
            .map_err(|e| HarnessError::io("chown harness.conf", e))?;
        Ok(())
    }

    // ---------------------------------------------------------------- lifecycle

    /// True while our postmaster child process is alive.
    pub fn is_running(&mut self) -> bool {
        match self.postmaster.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => true,
            Some(_) => {
                // Exited (reaped now) or cannot tell.
                self.postmaster = None;
                false
            }
            None => false,
        }
    }

    /// The postmaster's pid, if we started it and it has not been stopped.
    pub fn postmaster_pid(&self) -> Option<i32> {
        self.postmaster.as_ref().map(|c| c.id() as i32)
    }

    /// Start the server and wait until it accepts connections (or is a hot standby that does).
    pub fn start(&mut self) -> Result<()> {
        if self.is_running() {
            return Err(HarnessError::Other(format!("node {}: already running", self.name)));
        }
        let mut last = String::new();
        for attempt in 0..8u32 {
            match self.try_start()? {
                None => return Ok(()),
                Some(log) => {
                    last = log;
                    if attempt >= 2 {
                        let p = pick_port()?;
                        eprintln!(
                            "[harness] node {}: port {} busy, moving to {}",
                            self.name,
                            self.port(),
                            p
                        );
                        self.port.store(p, Ordering::SeqCst);
                        self.write_conf()?;
                    } else {
                        std::thread::sleep(Duration::from_millis(300));
                    }
                }
            }
        }
        Err(HarnessError::Other(format!(
            "node {}: could not bind a port after 8 attempts; last log:\n{last}",
            self.name
        )))
    }

    /// One start attempt. `Ok(None)`: started; `Ok(Some(log))`: the port was busy.
    fn try_start(&mut self) -> Result<Option<String>> {
        let offset = fs::metadata(&self.logfile).map(|m| m.len()).unwrap_or(0);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.logfile)
            .map_err(|e| HarnessError::io("open server.log", e))?;
        let log2 = log.try_clone().map_err(|e| HarnessError::io("dup log fd", e))?;
        let mut cmd = self.pg_command("postgres");
        cmd.arg("-D")
            .arg(&self.datadir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2));
        let mut child = cmd.spawn().map_err(|e| HarnessError::io("spawn postgres", e))?;
        let pid = child.id() as i32;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) =
                child.try_wait().map_err(|e| HarnessError::io("wait postgres", e))?
            {
                let newlog = read_from(&self.logfile, offset);
                if newlog.contains("could not bind")
                    || newlog.contains("Address already in use")
                    || newlog.contains("could not create any TCP/IP sockets")
                {
                    return Ok(Some(newlog));
                }
                return Err(HarnessError::Other(format!(
                    "node {}: postmaster exited during start ({status}); log:\n{newlog}",
                    self.name
                )));
            }
            if let Some((p, status)) = read_pid_file(&self.datadir) {
                if p == pid && (status == "ready" || status == "standby") {
                    self.postmaster = Some(child);
                    return Ok(None);
                }
            }
            if Instant::now() > deadline {
                kill_tree(pid);
                let _ = wait_child(&mut child, Duration::from_secs(30));
                return Err(HarnessError::Timeout(format!(
                    "node {}: not ready after {:?}; log:\n{}",
                    self.name,
                    START_TIMEOUT,
                    read_from(&self.logfile, offset)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `pg_ctl stop -m <mode> -w`, then reap the postmaster.
    pub fn stop(&mut self, mode: StopMode) -> Result<()> {
        let Some(mut child) = self.postmaster.take() else {
            return Err(HarnessError::Other(format!("node {}: not running", self.name)));
        };
        if let Ok(Some(status)) = child.try_wait() {
            return Err(HarnessError::Other(format!(
                "node {}: postmaster had already exited ({status})",
                self.name
            )));
        }
        let mut cmd = self.pg_command("pg_ctl");
        cmd.args(["stop", "-D"]).arg(&self.datadir).args(["-m", mode.as_str(), "-w", "-t", "120"]);
        let r = run_cmd(cmd, Duration::from_secs(150));
        if wait_child(&mut child, Duration::from_secs(30)).is_none() {
            let kids = kill_tree(child.id() as i32);
            let _ = wait_child(&mut child, Duration::from_secs(30));
            let _ = wait_gone(&kids, Duration::from_secs(30));
            return Err(HarnessError::Other(format!(
                "node {}: postmaster still running after pg_ctl stop -m {} ({:?}); killed",
                self.name,
                mode.as_str(),
                r.err()
            )));
        }
        r.map(|_| ())
    }

    /// `stop(mode)` then `start()` (same port when possible).
    pub fn restart(&mut self, mode: StopMode) -> Result<()> {
        self.stop(mode)?;
        self.start()
    }

    /// SIGKILL the postmaster and every process it started (see the module documentation);
    /// returns the pids of the killed descendants. Start it again with `start()`.
    pub fn kill9_postmaster(&mut self) -> Result<Vec<i32>> {
        let Some(mut child) = self.postmaster.take() else {
            return Err(HarnessError::Other(format!("node {}: not running", self.name)));
        };
        let pid = child.id() as i32;
        if let Ok(Some(status)) = child.try_wait() {
            return Err(HarnessError::Other(format!(
                "node {}: postmaster had already exited ({status})",
                self.name
            )));
        }
        let kids = kill_tree(pid);
        if wait_child(&mut child, Duration::from_secs(30)).is_none() {
            return Err(HarnessError::Timeout(format!(
                "node {}: postmaster survived SIGKILL",
                self.name
            )));
        }
        wait_gone(&kids, Duration::from_secs(30))?;
        Ok(kids)
    }

    /// SIGKILL one process of this node (a backend, the tsoracle worker...). Refuses pids
    /// that are not descendants of this node's postmaster.
    pub fn kill9_pid(&self, pid: i32) -> Result<()> {
        self.kill9_pid_when(pid, Duration::ZERO, || true).map(|_| ())
    }

    /// SIGKILL one process of this node (checked as [`Node::kill9_pid`] does) at the first
    /// moment `ready()` says so, polling it for at most `timeout` (at least once): the check
    /// is made once, before polling, so nothing stands between the poll that saw the moment
    /// and the kill. False (and no kill) if the moment never came.
    ///
    /// When the victim is a child of the postmaster, this returns only once the postmaster
    /// has logged its death (bounded): from then on it is crash-restarting, so a session
    /// opened later belongs to the restarted server. Without that wait a session opened right
    /// after the kill could still be accepted by the old one and then be reset under its
    /// caller.
    pub fn kill9_pid_when(
        &self,
        pid: i32,
        timeout: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> Result<bool> {
        let pm = self
            .postmaster_pid()
            .ok_or_else(|| HarnessError::Other(format!("node {}: not running", self.name)))?;
        if pid <= 1 || !descendants(pm).contains(&pid) {
            return Err(HarnessError::Other(format!(
                "node {}: pid {pid} is not a process of this server (postmaster {pm})",
                self.name
            )));
        }
        let child = self.child_pids().contains(&pid);
        let deadline = Instant::now() + timeout;
        loop {
            if ready() {
                let offset = fs::metadata(&self.logfile).map(|m| m.len()).unwrap_or(0);
                // SAFETY: kill(2) on a pid checked above (a process of this server).
                if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
                    return Err(HarnessError::io(
                        format!("kill -9 {pid}"),
                        std::io::Error::last_os_error(),
                    ));
                }
                if child {
                    // The postmaster's LogChildExit: "... (PID n) was terminated by signal 9".
                    let line = format!("(PID {pid}) was terminated by signal 9");
                    let noticed_by = Instant::now() + Duration::from_secs(30);
                    while !read_from(&self.logfile, offset).contains(&line) {
                        if Instant::now() > noticed_by {
                            return Err(HarnessError::Timeout(format!(
                                "node {}: the postmaster never logged that {pid} died",
                                self.name
                            )));
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
        }
    }

    /// Pids of the postmaster's direct children (backends, auxiliary processes, workers).
    pub fn child_pids(&self) -> Vec<i32> {
        match self.postmaster_pid() {
            Some(pm) => process::table()
                .into_iter()
                .filter(|&(_, ppid, _)| ppid == pm)
                .map(|(p, _, _)| p)
                .collect(),
            None => Vec::new(),
        }
    }

    /// `SELECT pg_promote(true, 60)`; errors if it did not promote.
    /// Promote this standby and return once it is out of recovery. `pg_promote(false)` plus
    /// polling: `pg_promote(true)` holds a snapshot while it waits, and replaying the
    /// primary's cleanup can then cancel it (40001) before promotion even starts.
    pub fn promote(&self) -> Result<()> {
        crate::cluster::promote(self).map(|_| ())
    }

    pub fn is_in_recovery(&self) -> Result<bool> {
        let mut c = self.try_connect(CONNECT_TIMEOUT)?;
        Ok(c.query_one("SELECT pg_is_in_recovery()", &[])?.get(0))
    }

    // ---------------------------------------------------------------- clients

    fn client_config(&self, user: &str, dbname: &str) -> postgres::Config {
        let mut cfg = postgres::Config::new();
        cfg.host("127.0.0.1")
            .port(self.port())
            .user(user)
            .dbname(dbname)
            .application_name("tsoracle-tests")
            .connect_timeout(Duration::from_secs(5))
            // Bound every statement: a hung call must not hang the test forever.
            .options("-c statement_timeout=60000");
        cfg
    }

    /// One connection attempt as `postgres` to database `postgres`.
    pub fn connect_once(&self) -> std::result::Result<Client, postgres::Error> {
        self.client_config("postgres", "postgres").connect(NoTls)
    }

    /// Connect as `postgres`, retrying until the server accepts connections (bounded).
    pub fn try_connect(&self, timeout: Duration) -> Result<Client> {
        self.try_connect_as("postgres", "postgres", timeout)
    }

    pub fn try_connect_as(&self, user: &str, dbname: &str, timeout: Duration) -> Result<Client> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.client_config(user, dbname).connect(NoTls) {
                Ok(c) => return Ok(c),
                Err(e) => {
                    // Authentication / unknown role or database will not fix themselves.
                    if let Some(code) = e.code() {
                        if *code != SqlState::CANNOT_CONNECT_NOW
                            && *code != SqlState::TOO_MANY_CONNECTIONS
                        {
                            return Err(e.into());
                        }
                    }
                    if Instant::now() > deadline {
                        return Err(HarnessError::Timeout(format!(
                            "node {}: cannot connect on port {}: {}",
                            self.name,
                            self.port(),
                            pg_error_string(&e)
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// Connect as `postgres` (retrying, bounded); panics on failure (the log is printed).
    pub fn connect(&self) -> Client {
        self.try_connect(CONNECT_TIMEOUT)
            .unwrap_or_else(|e| panic!("node {}: connect failed: {e}", self.name))
    }

    /// Connect as another role (retrying, bounded); panics on failure.
    pub fn connect_as(&self, user: &str) -> Client {
        self.try_connect_as(user, "postgres", CONNECT_TIMEOUT)
            .unwrap_or_else(|e| panic!("node {}: connect as {user} failed: {e}", self.name))
    }

    /// Run SQL through `psql -X -A -t -v ON_ERROR_STOP=1`; returns its stdout.
    pub fn psql(&self, sql: &str) -> Result<String> {
        let mut cmd = Command::new(self.bin.join("psql"));
        cmd.args([
            "-X",
            "-A",
            "-t",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-p",
        ])
        .arg(self.port().to_string())
        .arg("-c")
        .arg(sql);
        scrub_env(&mut cmd);
        run_cmd(cmd, Duration::from_secs(120))
    }

    // ---------------------------------------------------------------- tsoracle

    /// `CREATE EXTENSION IF NOT EXISTS tsoracle`, then wait until it serves.
    pub fn create_extension(&self) -> Result<TsoStatus> {
        let mut c = self.try_connect(CONNECT_TIMEOUT)?;
        c.batch_execute("CREATE EXTENSION IF NOT EXISTS tsoracle")?;
        drop(c);
        self.wait_serving()
    }

    /// Poll `tso_status()` until `state = 'serving'` (bounded by [`SERVING_TIMEOUT`]),
    /// reconnecting when the server restarts under us; returns the serving status.
    /// Errors at once on errors that retrying cannot fix (e.g. the function does not exist).
    pub fn wait_serving(&self) -> Result<TsoStatus> {
        let deadline = Instant::now() + SERVING_TIMEOUT;
        let mut client: Option<Client> = None;
        let mut last = String::from("no attempt");
        while Instant::now() < deadline {
            if client.is_none() {
                match self.connect_once() {
                    Ok(c) => client = Some(c),
                    Err(e) => {
                        last = format!("connect: {}", pg_error_string(&e));
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                }
            }
            let c = client.as_mut().expect("client");
            match tso::status(c) {
                Ok(st) if st.state == "serving" => return Ok(st),
                Ok(st) => last = format!("state = {:?} ({:?})", st.state, st.detail),
                Err(e) => {
                    last = pg_error_string(&e);
                    if crate::error::session_broken(c, &e) {
                        client = None; // the server went away: reconnect
                    } else if !tso::is_retryable(&e) {
                        return Err(e.into());
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(HarnessError::Timeout(format!(
            "node {}: not serving after {:?}; last: {last}",
            self.name, SERVING_TIMEOUT
        )))
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

    // ---------------------------------------------------------------- helpers

    /// A command for a server binary, run as the postgres OS user in the node directory.
    fn pg_command(&self, program: &str) -> Command {
        let (uid, gid) = pg_user().expect("postgres OS user");
        let mut cmd = Command::new(self.bin.join(program));
        cmd.uid(uid).gid(gid).current_dir(&self.base).env("HOME", &self.base);
        scrub_env(&mut cmd);
        cmd
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

// -------------------------------------------------------------------- free helpers

fn default_settings() -> BTreeMap<String, String> {
    [
        ("listen_addresses", "127.0.0.1"),
        ("unix_socket_directories", ""),
        ("wal_level", "replica"),
        ("max_wal_senders", "10"),
        ("max_replication_slots", "10"),
        ("wal_keep_size", "128MB"),
        ("hot_standby", "on"),
        ("fsync", "on"),
        ("synchronous_commit", "on"),
        ("logging_collector", "off"),
        ("log_destination", "stderr"),
        ("log_line_prefix", "%m [%p] %b %a: "),
        ("lc_messages", "C"),
        ("max_connections", "64"),
        ("shared_buffers", "32MB"),
        ("restart_after_crash", "on"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// uid and gid of the `postgres` OS user (`TSORACLE_PG_USER` overrides the name), from
/// /etc/passwd.
pub(crate) fn pg_user() -> Result<(u32, u32)> {
    static USER: OnceLock<std::result::Result<(u32, u32), String>> = OnceLock::new();
    USER.get_or_init(|| {
        let name = std::env::var("TSORACLE_PG_USER").unwrap_or_else(|_| "postgres".into());
        let passwd =
            fs::read_to_string("/etc/passwd").map_err(|e| format!("read /etc/passwd: {e}"))?;
        for line in passwd.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() >= 4 && f[0] == name {
                let uid = f[2].parse().map_err(|e| format!("uid of {name}: {e}"))?;
                let gid = f[3].parse().map_err(|e| format!("gid of {name}: {e}"))?;
                return Ok((uid, gid));
            }
        }
        Err(format!("no OS user {name:?} (install postgresql-15, which creates it)"))
    })
    .clone()
    .map_err(HarnessError::Other)
}

fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .take(40)
        .collect();
    if s.is_empty() {
        "node".into()
    } else {
        s
    }
}

pub(crate) fn make_base_dir(name: &str, uid: u32, gid: u32) -> Result<PathBuf> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let root =
        std::env::var_os("TSORACLE_TEST_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    fs::create_dir_all(&root)
        .map_err(|e| HarnessError::io(format!("create {}", root.display()), e))?;
    for _ in 0..1000 {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let path = root.join(format!("tso-{}-{}-{}", sanitize(name), std::process::id(), n));
        match fs::create_dir(&path) {
            Ok(()) => {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                    .map_err(|e| HarnessError::io("chown node dir", e))?;
                fs::set_permissions(&path, fs::Permissions::from_mode(0o700))
                    .map_err(|e| HarnessError::io("chmod node dir", e))?;
                return Ok(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(HarnessError::io(format!("create {}", path.display()), e)),
        }
    }
    Err(HarnessError::Other("could not create a node directory".into()))
}

/// A port that was free a moment ago, never the same twice in this process.
pub fn pick_port() -> Result<u16> {
    static USED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    for _ in 0..200 {
        let l = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(|e| HarnessError::io("bind 127.0.0.1:0", e))?;
        let port = l.local_addr().map_err(|e| HarnessError::io("local_addr", e))?.port();
        drop(l);
        if USED.lock().unwrap_or_else(|p| p.into_inner()).insert(port) {
            return Ok(port);
        }
    }
    Err(HarnessError::Other("no free port".into()))
}

pub(crate) fn scrub_env(cmd: &mut Command) {
    // RUST_BACKTRACE (set by cargo test runs) would make the extension attach backtraces
    // to error details, which a real server does not do.
    for v in [
        "PGDATA",
        "PGHOST",
        "PGHOSTADDR",
        "PGPORT",
        "PGUSER",
        "PGDATABASE",
        "PGOPTIONS",
        "PGPASSWORD",
        "PGSERVICE",
        "RUST_BACKTRACE",
        "RUST_LIB_BACKTRACE",
    ] {
        cmd.env_remove(v);
    }
    cmd.env("LC_ALL", "C");
}

/// The last `n` lines of `text`.
pub(crate) fn last_lines(text: &str, n: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(n)..].join("\n")
}

/// The error lines and the last `lines` lines of every `*.log` file under `dir` (pg_upgrade's
/// logs).
fn tail_of_logs(dir: &Path, lines: usize) -> String {
    let mut out = String::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                let text = fs::read_to_string(&path).unwrap_or_default();
                let errors: Vec<&str> = text
                    .lines()
                    .filter(|l| l.contains("error") || l.contains("ERROR") || l.contains("FATAL"))
                    .collect();
                out.push_str(&format!(
                    "--- {} (errors, then the last {lines} lines):\n{}\n...\n{}\n",
                    path.display(),
                    errors.join("\n"),
                    last_lines(&text, lines)
                ));
            }
        }
    }
    out
}

/// Run a command with a time bound; Ok(stdout) when it exits 0.
pub(crate) fn run_cmd(mut cmd: Command, timeout: Duration) -> Result<String> {
    let desc = format!("{cmd:?}");
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| HarnessError::io(format!("spawn {desc}"), e))?;
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let status = match wait_child(&mut child, timeout) {
        Some(s) => s,
        None => {
            let _ = child.kill();
            let _ = wait_child(&mut child, Duration::from_secs(10));
            return Err(HarnessError::Timeout(format!("{desc} still running after {timeout:?}")));
        }
    };
    let stdout = String::from_utf8_lossy(&t_out.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&t_err.join().unwrap_or_default()).into_owned();
    if status.success() {
        Ok(stdout)
    } else {
        Err(HarnessError::Command {
            cmd: desc,
            status: status.to_string(),
            output: format!("{stdout}{stderr}"),
        })
    }
}

/// Wait for a child to exit, bounded; None if it is still running.
fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) => {}
            Err(_) => return None,
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn read_from(path: &Path, offset: u64) -> String {
    let mut s = Vec::new();
    if let Ok(mut f) = fs::File::open(path) {
        let _ = f.seek(SeekFrom::Start(offset));
        let _ = f.read_to_end(&mut s);
    }
    String::from_utf8_lossy(&s).into_owned()
}

/// (pid, status) from `postmaster.pid` (line 1 and line 8), if present.
fn read_pid_file(datadir: &Path) -> Option<(i32, String)> {
    let text = fs::read_to_string(datadir.join("postmaster.pid")).ok()?;
    let lines: Vec<&str> = text.lines().collect();
    let pid = lines.first()?.trim().parse().ok()?;
    let status = lines.get(7).map(|s| s.trim().to_string()).unwrap_or_default();
    Some((pid, status))
}
