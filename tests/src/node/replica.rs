//! Nodes made from another node: a streaming replica by `pg_basebackup`, a new major by
//! `pg_upgrade`; promotion of a standby and its recovery state.

use std::fs;
use std::path::Path;
use std::time::Duration;

use super::os::{last_lines, run_cmd};
use super::{Node, NodeOpts, CONNECT_TIMEOUT};
use crate::error::HarnessError;
use crate::Result;

impl Node {
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

    /// A replica of `primary` that `make` writes into the data directory it is given (a
    /// runbook page's own `pg_basebackup`, run as the `postgres` OS user): a new node
    /// directory, the primary's settings, its own port. Not started.
    pub fn base_backup_by(
        primary: &Node,
        name: &str,
        make: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<Node> {
        let mut node = Node::empty(name, primary.bin.clone())?;
        node.settings = primary.settings.clone();
        make(&node.datadir)?;
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
