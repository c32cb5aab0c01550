//! `kill -9` on a node: the postmaster and every process it started (SIGSTOP first, then the
//! whole tree found through `/proc`), or one process of the server at a chosen moment.

use std::fs;
use std::time::{Duration, Instant};

use super::os::{read_from, wait_child};
use super::Node;
use crate::error::HarnessError;
use crate::process::{self, descendants, kill_tree, wait_gone};
use crate::Result;

impl Node {
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

    /// The pid of this node's tsoracle worker, as `pg_stat_activity` shows it.
    pub fn worker_pid(&self) -> i32 {
        self.connect()
            .query_one(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'tsoracle worker'",
                &[],
            )
            .unwrap_or_else(|e| panic!("node {}: the tsoracle worker: {e}", self.name))
            .get(0)
    }

    /// Pause (`SIGSTOP`) or resume (`SIGCONT`) one process of this node.
    pub fn pause_pid(&self, pid: i32, paused: bool) {
        let signal = if paused { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: kill(2) on a pid of this node's server, with a signal that only stops or
        // continues it.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "node {}: kill({pid}, {signal}) failed", self.name);
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
}
