//! What a DBA's shell on Debian has, for the runbooks' `sh` blocks (tests/src/runbook.rs): root's
//! `PATH`, postgresql-common's `pg_wrapper` for the client programs, `pg_ctlcluster` for a
//! cluster's server. The tests' servers stay the private copy `scripts/test-pg.sh` installs:
//! nothing here writes where Debian's packages (or a user's server) live.
//!
//! * **`PATH`** ([`client_path`]): Debian's root `PATH` ([`DEBIAN_PATH`], as a stock system
//!   has it), where `psql`,
//!   `pg_dump`, `pg_basebackup` … are `pg_wrapper`, which runs the client of the major the
//!   cluster has (or the newest installed) from `/usr/lib/postgresql/<major>/bin`. On a major
//!   whose client Debian's packages installed here, that is the whole `PATH`. On a major they
//!   did not (18, from /opt), a directory comes first that links each name `pg_wrapper`
//!   serves to that major's client in the test's binaries: what `pg_wrapper` runs once
//!   `postgresql-client-18` is installed. No server program (`pg_ctl`, `postgres`, `initdb`)
//!   is on it: a page that types `pg_ctl` fails, as on Debian.
//! * **`pg_ctlcluster`** ([`DebianCluster`]): a test's node registered as `<major> <name>`
//!   in a configuration root of its own (`PG_CLUSTER_CONF_ROOT`, postgresql-common's variable
//!   for clusters outside /etc/postgresql): `<root>/<major>/<name>` is a link to the node's
//!   data directory, a layout postgresql-common reads (the data directory, its
//!   `postgresql.conf` in it). `/usr/bin/pg_ctlcluster` itself runs, as root, and drops to
//!   the cluster's owner as it does on Debian.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use crate::error::HarnessError;
use crate::runbook::Block;
use crate::Node;

/// root's `PATH` on Debian (`ENV_SUPATH` of /etc/login.defs; sudo's `secure_path`) without
/// `/usr/local/sbin:/usr/local/bin`, which no package fills: empty on a stock system, while
/// the test machines link `pg_ctl`, `postgres` and `initdb` there.
pub const DEBIAN_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// Where Debian's packages put a major's binaries (postgresql-common's `$binroot`).
fn debian_bin(major: u32) -> PathBuf {
    PathBuf::from(format!("/usr/lib/postgresql/{major}/bin"))
}

/// The major of the PostgreSQL binaries in `bin` (`pg_config --version`: `PostgreSQL 18.6`).
pub fn major_of(bin: &Path) -> crate::Result<u32> {
    let out = Command::new(bin.join("pg_config"))
        .arg("--version")
        .output()
        .map_err(|e| HarnessError::io(format!("{}/pg_config --version", bin.display()), e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .nth(1)
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse().ok())
        .ok_or_else(|| {
            HarnessError::Other(format!("{}/pg_config --version: {text}", bin.display()))
        })
}

/// The `PATH` a runbook's `sh` block runs with, for a cluster whose binaries are `bin` (see
/// the module documentation).
pub fn client_path(bin: &Path) -> crate::Result<OsString> {
    let major = major_of(bin)?;
    if debian_bin(major).join("psql").exists() {
        return Ok(DEBIAN_PATH.into());
    }
    static MADE: OnceLock<Mutex<Vec<(PathBuf, PathBuf)>>> = OnceLock::new();
    let mut made = MADE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    let dir = match made.iter().find(|(b, _)| b == bin) {
        Some((_, dir)) => dir.clone(),
        None => {
            let dir = wrapped_clients(bin, made.len())?;
            made.push((bin.to_path_buf(), dir.clone()));
            dir
        }
    };
    let mut path = dir.into_os_string();
    path.push(":");
    path.push(DEBIAN_PATH);
    Ok(path)
}

/// A directory (readable by the servers' OS user) with a link, for each program of /usr/bin
/// that is postgresql-common's `pg_wrapper`, to that program in `bin`.
fn wrapped_clients(bin: &Path, n: usize) -> crate::Result<PathBuf> {
    let err = |what: String, e: std::io::Error| HarnessError::io(what, e);
    let dir = std::env::temp_dir().join(format!("tsoracle-pg-wrapper-{}-{n}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir(&dir).map_err(|e| err(format!("create {}", dir.display()), e))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
        .map_err(|e| err(format!("chmod {}", dir.display()), e))?;
    let entries = fs::read_dir("/usr/bin").map_err(|e| err("read /usr/bin".into(), e))?;
    let mut linked = 0;
    for entry in entries.flatten() {
        let wrapped =
            fs::read_link(entry.path()).is_ok_and(|t| t.ends_with("postgresql-common/pg_wrapper"));
        let program = bin.join(entry.file_name());
        if wrapped && program.exists() {
            symlink(&program, dir.join(entry.file_name()))
                .map_err(|e| err(format!("link {}", program.display()), e))?;
            linked += 1;
        }
    }
    if linked == 0 {
        return Err(HarnessError::Other(
            "no pg_wrapper in /usr/bin (install postgresql-common)".into(),
        ));
    }
    Ok(dir)
}

/// A node registered for postgresql-common's `pg_ctlcluster` (see the module documentation);
/// the registration is removed when dropped.
pub struct DebianCluster {
    root: PathBuf,
    major: u32,
    name: String,
}

impl DebianCluster {
    /// `node` as the cluster `<its major> <name>`, in a configuration root of its own.
    pub fn register(node: &Node, name: &str) -> crate::Result<DebianCluster> {
        let err = |what: String, e: std::io::Error| HarnessError::io(what, e);
        let major = major_of(node.bin_dir())?;
        let root = node.basedir().with_extension("pg-cluster-conf");
        let dir = root.join(major.to_string());
        fs::create_dir_all(&dir).map_err(|e| err(format!("create {}", dir.display()), e))?;
        for d in [&root, &dir] {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755))
                .map_err(|e| err(format!("chmod {}", d.display()), e))?;
        }
        symlink(node.datadir(), dir.join(name))
            .map_err(|e| err(format!("link {}/{name}", dir.display()), e))?;
        Ok(DebianCluster { root, major, name: name.to_string() })
    }

    /// The variable that points postgresql-common at this registration.
    pub fn var(&self) -> (&'static str, String) {
        ("PG_CLUSTER_CONF_ROOT", self.root.display().to_string())
    }

    /// `block` with the page's `typed` (`pg_ctlcluster 15 main`) as this machine runs it: the
    /// cluster's major and name; and where Debian's packages did not install this major's
    /// `pg_ctl` (which `pg_ctlcluster` runs from /usr/lib/postgresql/<major>/bin), its
    /// `--bindir` naming the test's. Panics unless the block has `typed`.
    #[track_caller]
    pub fn typed(&self, block: &Block, typed: &str, node: &Node) -> Block {
        let bindir = if debian_bin(self.major).join("pg_ctl").exists() {
            String::new()
        } else {
            format!("--bindir {} ", node.bin_dir().display())
        };
        block.mutated(typed, &format!("pg_ctlcluster {bindir}{} {}", self.major, self.name))
    }
}

impl Drop for DebianCluster {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}
