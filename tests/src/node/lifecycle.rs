//! Creating, starting and stopping a node: `initdb`, the postmaster started as the test's
//! child (ready when `postmaster.pid` says so, retried on a busy port), `pg_ctl stop`,
//! restart.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::default_settings;
use super::os::{
    make_base_dir, pg_user, pick_port, read_from, read_pid_file, run_cmd, sanitize, wait_child,
};
use super::{pg_bin_dir, Node, NodeOpts, StopMode, START_TIMEOUT};
use crate::error::HarnessError;
use crate::process::{kill_tree, wait_gone};
use crate::Result;

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
        if opts.admit {
            if let Some(oracle) = node.settings.get("tsoracle.oracle").cloned() {
                crate::fleet::admit_cluster(&node, &oracle);
            }
        }
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

    pub(super) fn empty(name: &str, bin: PathBuf) -> Result<Node> {
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

    /// Listen on `port` from the next start (a stopped node's address taken over: the cluster
    /// `pg_upgrade` made of it, where its clients and a fleet's members look for it).
    pub fn take_port(&mut self, port: u16) -> Result<()> {
        if self.is_running() {
            return Err(HarnessError::Other(format!("node {}: running", self.name)));
        }
        self.port.store(port, Ordering::SeqCst);
        self.write_conf()
    }

    /// Run the binaries in `bin` from the next start: a new package of the extension (or of
    /// PostgreSQL's minor release) installed while the server was down.
    pub fn set_bin(&mut self, bin: impl Into<PathBuf>) -> Result<()> {
        if self.is_running() {
            return Err(HarnessError::Other(format!("node {}: running", self.name)));
        }
        self.bin = bin.into();
        Ok(())
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
}
