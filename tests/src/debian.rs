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
//!   for clusters outside /etc/postgresql): `<root>/<major>/<name>/postgresql.conf` names the
//!   node's data directory, client authentication and an external pid file in the node's
//!   directory, and includes the node's own `postgresql.conf`; `log` links to its server log.
//!   `<name>` is the node's directory's (a name no cluster of the machine has: `pg_ctlcluster
//!   stop` deletes `/var/run/postgresql/<major>-<name>.pid`). `/usr/bin/pg_ctlcluster` itself
//!   runs, as root, and drops to the cluster's owner as it does on Debian. The tests use its
//!   `stop` only: its `start` (and `restart`) checks the server with Debian's `psql` of the
//!   cluster's major (/usr/lib/postgresql/<major>/bin, absent here for 18, which
//!   `make test-upgrade` runs on) and finds a running server by its Unix socket (the harness's
//!   servers have none), and the postmaster it leaves is no child of the test's.

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
    static MADE: OnceLock<Mutex<()>> = OnceLock::new();
    let _one = MADE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    let mut path = wrapped_clients(bin, major)?.into_os_string();
    path.push(":");
    path.push(DEBIAN_PATH);
    Ok(path)
}

/// A directory (readable by the servers' OS user) with a link, for each program of /usr/bin
/// that is postgresql-common's `pg_wrapper`, to that program in `bin`: made once for `bin`
/// (named after its path), then shared by every test process.
fn wrapped_clients(bin: &Path, major: u32) -> crate::Result<PathBuf> {
    let err = |what: String, e: std::io::Error| HarnessError::io(what, e);
    // FNV-1a of the path: one directory per installation.
    let key =
        bin.as_os_str().as_encoded_bytes().iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        });
    let made = std::env::temp_dir().join(format!("tsoracle-pg-wrapper-{major}-{key:016x}"));
    if made.join("psql").exists() && trusted(&made, bin) {
        return Ok(made);
    }
    // Not made by this user as below (a name in a shared directory anyone can take): made
    // again.
    let _ = fs::remove_dir_all(&made);
    // Made apart, then renamed into place: another process may be making it too.
    let dir = made.with_extension(std::process::id().to_string());
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
    if linked == 0 || !dir.join("psql").exists() {
        let _ = fs::remove_dir_all(&dir);
        return Err(HarnessError::Other(format!(
            "no pg_wrapper for psql in /usr/bin, or no psql in {} (install postgresql-common)",
            bin.display()
        )));
    }
    if fs::rename(&dir, &made).is_err() {
        // Made by another process meanwhile.
        let _ = fs::remove_dir_all(&dir);
    }
    if made.join("psql").exists() && trusted(&made, bin) {
        Ok(made)
    } else {
        Err(HarnessError::Other(format!("{}: no psql", made.display())))
    }
}

/// Whether `dir` is this user's, writable by no one else, and holds links into `bin` only.
fn trusted(dir: &Path, bin: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let mine =
        |p: &Path| fs::symlink_metadata(p).is_ok_and(|m| m.uid() == me && m.mode() & 0o022 == 0);
    mine(dir)
        && fs::read_dir(dir).is_ok_and(|entries| {
            entries.flatten().all(|e| {
                fs::symlink_metadata(e.path()).is_ok_and(|m| m.file_type().is_symlink())
                    && fs::read_link(e.path()).is_ok_and(|t| t.starts_with(bin))
            })
        })
}

/// A node registered for postgresql-common's `pg_ctlcluster` (see the module documentation);
/// the registration is removed when dropped.
pub struct DebianCluster {
    root: PathBuf,
    major: u32,
    name: String,
}

impl DebianCluster {
    /// `node` as the cluster `<its major> <its directory's name>`, in a configuration root of
    /// its own.
    pub fn register(node: &Node) -> crate::Result<DebianCluster> {
        let err = |what: String, e: std::io::Error| HarnessError::io(what, e);
        let major = major_of(node.bin_dir())?;
        let name = node
            .basedir()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| HarnessError::Other("a node directory without a name".into()))?;
        let root = node.basedir().with_extension("pg-cluster-conf");
        let dir = root.join(major.to_string()).join(&name);
        // Made afresh by this process (a name beside the node's directory, in a directory
        // anyone may write): whatever was there is removed, and a root made meanwhile by
        // someone else fails the creation.
        let _ = fs::remove_dir_all(&root);
        fs::create_dir(&root).map_err(|e| err(format!("create {}", root.display()), e))?;
        fs::create_dir_all(&dir).map_err(|e| err(format!("create {}", dir.display()), e))?;
        for d in [root.clone(), root.join(major.to_string()), dir.clone()] {
            fs::set_permissions(&d, fs::Permissions::from_mode(0o755))
                .map_err(|e| err(format!("chmod {}", d.display()), e))?;
        }
        let data = node.datadir().display();
        let conf = format!(
            "# /etc/postgresql/{major}/{name}/postgresql.conf, for a test's node\n\
             data_directory = '{data}'\n\
             hba_file = '{data}/pg_hba.conf'\n\
             ident_file = '{data}/pg_ident.conf'\n\
             external_pid_file = '{}/external.pid'\n\
             include '{data}/postgresql.conf'\n",
            node.basedir().display()
        );
        let path = dir.join("postgresql.conf");
        fs::write(&path, conf).map_err(|e| err(format!("write {}", path.display()), e))?;
        symlink(node.log_path(), dir.join("log"))
            .map_err(|e| err(format!("link {}/log", dir.display()), e))?;
        Ok(DebianCluster { root, major, name })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `command -v NAME` in a shell with `path`: where it resolves, if anywhere.
    fn resolve(path: &OsString, name: &str) -> Option<String> {
        let out = Command::new("/bin/bash")
            .arg("-c")
            .arg(format!("command -v {name}"))
            .env_clear()
            .env("PATH", path)
            .output()
            .expect("bash");
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    #[test]
    fn a_page_finds_the_majors_clients_and_no_server_program() {
        if !Path::new("/usr/bin/psql").exists() || !Path::new("/usr/bin/pg_ctlcluster").exists() {
            eprintln!("skipped: no postgresql-common here");
            return;
        }
        // An installation of a major Debian's packages do not install here.
        let bin = std::env::temp_dir().join(format!("tsoracle-fake-bin-{}", std::process::id()));
        fs::create_dir_all(&bin).unwrap();
        fs::write(bin.join("pg_config"), "#!/bin/sh\necho 'PostgreSQL 99.1'\n").unwrap();
        for p in ["psql", "pg_dump", "pg_ctl", "postgres", "initdb"] {
            fs::write(bin.join(p), "").unwrap();
        }
        for p in ["pg_config", "psql", "pg_dump", "pg_ctl", "postgres", "initdb"] {
            fs::set_permissions(bin.join(p), fs::Permissions::from_mode(0o755)).unwrap();
        }
        let path = client_path(&bin).unwrap();
        let psql = resolve(&path, "psql").expect("psql on the PATH");
        assert_eq!(fs::canonicalize(&psql).unwrap(), fs::canonicalize(bin.join("psql")).unwrap());
        assert!(resolve(&path, "pg_dump").is_some());
        for server in ["pg_ctl", "postgres", "initdb"] {
            assert_eq!(resolve(&path, server), None, "{server} is on the PATH {path:?}");
        }
        assert!(resolve(&path, "pg_ctlcluster").is_some(), "postgresql-common's pg_ctlcluster");
        let dir = std::env::split_paths(&path).next().unwrap();
        let _ = fs::remove_dir_all(&dir);
        let _ = fs::remove_dir_all(&bin);
    }
}
