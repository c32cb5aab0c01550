//! A node's configuration: [`NodeOpts`] for `initdb`, the harness's default settings, and
//! `harness.conf` (included from `postgresql.conf`), rewritten and reloaded by
//! [`Node::set_conf`] and [`Node::unset_conf`].

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::os::pg_user;
use super::{Node, CONNECT_TIMEOUT};
use crate::error::HarnessError;
use crate::Result;

/// Options for [`Node::init`].
#[derive(Clone, Debug)]
pub struct NodeOpts {
    /// Put `shared_preload_libraries = 'tsoracle'` in the configuration (default true).
    pub preload: bool,
    /// Extra `postgresql.conf` settings, applied after the harness's defaults (so they win).
    pub settings: Vec<(String, String)>,
    /// The server binaries (default [`pg_bin_dir`](super::pg_bin_dir)).
    pub bin: Option<PathBuf>,
    /// Extra `initdb` arguments.
    pub initdb_args: Vec<String>,
    /// With `tsoracle.oracle` among the settings: admit the new cluster on that oracle, bound
    /// to the role of the string, as its superuser would (default true;
    /// [`crate::fleet::admit_cluster`]).
    pub admit: bool,
}

impl Default for NodeOpts {
    fn default() -> Self {
        NodeOpts {
            preload: true,
            settings: Vec::new(),
            bin: None,
            initdb_args: Vec::new(),
            admit: true,
        }
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

    /// A member the test admits itself (or not at all): see [`NodeOpts::admit`].
    pub fn unadmitted(mut self) -> Self {
        self.admit = false;
        self
    }

    /// Pass `arg` to `initdb`.
    pub fn initdb_arg(mut self, arg: &str) -> Self {
        self.initdb_args.push(arg.to_string());
        self
    }

    /// Run the cluster from the binaries in `bin` instead of [`pg_bin_dir`](super::pg_bin_dir)
    /// (another major).
    pub fn bin(mut self, bin: impl Into<PathBuf>) -> Self {
        self.bin = Some(bin.into());
        self
    }
}

impl Node {
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

    pub(super) fn write_conf(&self) -> Result<()> {
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
}

/// What every node's `harness.conf` starts with (a node's own settings win).
pub(super) fn default_settings() -> BTreeMap<String, String> {
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
