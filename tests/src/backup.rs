//! Backups and restores: logical dumps (`pg_dump`, `pg_restore`, `psql -f`), WAL archiving and
//! point-in-time recovery, and a slow prober that calls `tso_next()` while a restore runs.
//!
//! # Processes and files
//!
//! Every client binary (`pg_dump`, `pg_restore`, `psql`, `createdb`) runs from
//! [`pg_bin_dir`] as the `postgres` OS user ([`run_as_postgres`]), like the server binaries
//! of [`crate::node`]: dumps and the WAL archive live in [`PgDir`]s, directories owned by
//! `postgres` (mode 0700) under the harness's test directory, removed when dropped (kept
//! with `TSORACLE_KEEP_FAILED=1` when the thread is panicking).
//!
//! # Point-in-time recovery
//!
//! A primary archives its WAL into a [`WalArchive`] (`archive_mode = on`, an
//! `archive_command` that copies, never overwriting). A base backup made with
//! [`Node::base_backup_from`] (a hot-standby copy) is turned into an archive recovery by
//! [`prepare_archive_recovery`]: no `standby.signal` and no `primary_conninfo`, a
//! `recovery.signal`, the archive's `restore_command`, and either a
//! `recovery_target_time` with `recovery_target_action = promote` or no target (recovery
//! ends, and the server is promoted, at the end of the archived WAL). Either way the server
//! ends recovery on a new timeline. [`switch_and_archive`] makes sure everything written so
//! far is in the archive.
//!
//! Everything is bounded in time.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{pg_error_string, HarnessError};
use crate::history::History;
use crate::load::{Endpoint, LoadStats};
use crate::node::{make_base_dir, pg_bin_dir, pg_user, run_cmd, scrub_env, Node};
use crate::Result;

/// How long one dump or restore may take.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the waits of this module (archiving, end of recovery) poll.
pub const RECOVERY_WAIT: Duration = Duration::from_secs(120);

// ============================================================================ running tools

/// A command for a binary of [`pg_bin_dir`] (`pg_dump`, `psql`, ...).
pub fn pg_program(program: &str) -> Command {
    Command::new(pg_bin_dir().join(program))
}

/// Run `cmd` as the `postgres` OS user (its environment scrubbed of libpq variables), bounded
/// by `timeout`; Ok(stdout) when it exits 0, otherwise an error with its stdout and stderr.
/// Give it a working directory `postgres` may enter (`current_dir`), e.g. a [`PgDir`].
pub fn run_as_postgres(mut cmd: Command, timeout: Duration) -> Result<String> {
    let (uid, gid) = pg_user()?;
    cmd.uid(uid).gid(gid);
    scrub_env(&mut cmd);
    run_cmd(cmd, timeout)
}

/// A directory owned by the `postgres` OS user (mode 0700), removed when dropped.
#[derive(Debug)]
pub struct PgDir {
    path: PathBuf,
}

impl PgDir {
    pub fn new(name: &str) -> Result<PgDir> {
        let (uid, gid) = pg_user()?;
        Ok(PgDir { path: make_base_dir(name, uid, gid)? })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// [`pg_program`] run in this directory (also its `HOME`).
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = pg_program(program);
        cmd.current_dir(&self.path).env("HOME", &self.path);
        cmd
    }
}

impl Drop for PgDir {
    fn drop(&mut self) {
        if std::thread::panicking()
            && std::env::var_os("TSORACLE_KEEP_FAILED").is_some_and(|v| v == "1")
        {
            eprintln!("[harness] keeping {}", self.path.display());
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// libpq connection options for a node and database, as command-line arguments.
fn conn_args(node: &Node, dbname: &str) -> Vec<String> {
    ["-h", "127.0.0.1", "-p", &node.port().to_string(), "-U", "postgres", "-d", dbname]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

// ============================================================================ logical dumps

/// `pg_dump` output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpFormat {
    /// `-Fp`: an SQL script, restored with `psql -f`.
    Plain,
    /// `-Fc`: one archive file, restored with `pg_restore`.
    Custom,
    /// `-Fd`: a directory, restored with `pg_restore` (also in parallel, `-j`).
    Directory,
}

impl DumpFormat {
    /// `pg_dump`'s arguments for this format. The archive formats are written uncompressed
    /// (`-Z 0`): compressing costs CPU and changes nothing a restore does.
    pub fn args(self) -> &'static [&'static str] {
        match self {
            DumpFormat::Plain => &["-Fp"],
            DumpFormat::Custom => &["-Fc", "-Z", "0"],
            DumpFormat::Directory => &["-Fd", "-Z", "0"],
        }
    }

    fn file_name(self) -> &'static str {
        match self {
            DumpFormat::Plain => "dump.sql",
            DumpFormat::Custom => "dump.custom",
            DumpFormat::Directory => "dump.dir",
        }
    }
}

/// `pg_dump <format> -f <dir>/<file>` of database `dbname` of `node`; returns the path.
pub fn pg_dump(node: &Node, dbname: &str, format: DumpFormat, dir: &PgDir) -> Result<PathBuf> {
    let out = dir.join(format.file_name());
    let mut cmd = dir.command("pg_dump");
    cmd.args(conn_args(node, dbname)).args(format.args()).arg("-f").arg(&out);
    run_as_postgres(cmd, TOOL_TIMEOUT)?;
    Ok(out)
}

/// `psql -X -q -v ON_ERROR_STOP=1 [--single-transaction] -f <file>` into `dbname` of `node`:
/// a plain dump restored the documented way. Returns psql's stdout.
pub fn psql_file(
    node: &Node,
    dbname: &str,
    file: &Path,
    single_transaction: bool,
) -> Result<String> {
    let dir = file.parent().unwrap_or(Path::new("/"));
    let mut cmd = pg_program("psql");
    cmd.current_dir(dir).env("HOME", dir);
    cmd.args(["-X", "-q", "-v", "ON_ERROR_STOP=1"]).args(conn_args(node, dbname));
    if single_transaction {
        cmd.arg("--single-transaction");
    }
    cmd.arg("-f").arg(file);
    run_as_postgres(cmd, TOOL_TIMEOUT)
}

/// `pg_restore --exit-on-error [-j jobs] -d dbname <dump>` (a custom or directory dump).
pub fn pg_restore(node: &Node, dbname: &str, dump: &Path, jobs: u32) -> Result<String> {
    let dir = dump.parent().unwrap_or(Path::new("/"));
    let mut cmd = pg_program("pg_restore");
    cmd.current_dir(dir).env("HOME", dir);
    cmd.arg("--exit-on-error").args(conn_args(node, dbname));
    if jobs > 1 {
        cmd.arg("-j").arg(jobs.to_string());
    }
    cmd.arg(dump);
    run_as_postgres(cmd, TOOL_TIMEOUT)
}

/// `createdb -T template0 <dbname>` (the database a `pg_restore` goes into).
pub fn createdb(node: &Node, dbname: &str) -> Result<()> {
    let mut cmd = pg_program("createdb");
    cmd.current_dir("/");
    cmd.args([
        "-h",
        "127.0.0.1",
        "-p",
        &node.port().to_string(),
        "-U",
        "postgres",
        "-T",
        "template0",
        dbname,
    ]);
    run_as_postgres(cmd, Duration::from_secs(120)).map(|_| ())
}

// ============================================================================ WAL archive

/// A WAL archive directory (see the module documentation).
#[derive(Debug)]
pub struct WalArchive {
    dir: PgDir,
}

impl WalArchive {
    pub fn new(name: &str) -> Result<WalArchive> {
        Ok(WalArchive { dir: PgDir::new(name)? })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Copies a segment into the archive; fails (so the archiver retries) rather than
    /// overwrite a file already there.
    pub fn archive_command(&self) -> String {
        format!("test ! -f '{0}/%f' && cp %p '{0}/%f'", self.path().display())
    }

    pub fn restore_command(&self) -> String {
        format!("cp '{}/%f' %p", self.path().display())
    }

    /// `opts` with `archive_mode = on` and this archive's `archive_command`.
    pub fn archiving(&self, opts: crate::NodeOpts) -> crate::NodeOpts {
        opts.setting("archive_mode", "on").setting("archive_command", self.archive_command())
    }

    /// Names of the files in the archive, sorted.
    pub fn files(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.path())
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }
}

/// `pg_switch_wal()` on `primary`, then wait (bounded) until the archiver reports the segment
/// the switch completed as archived: everything written before the call is then in the
/// archive. Returns that segment's name.
pub fn switch_and_archive(primary: &Node) -> Result<String> {
    let mut c = primary.try_connect(RECOVERY_WAIT)?;
    let segment: String = c.query_one("SELECT pg_walfile_name(pg_switch_wal())", &[])?.get(0);
    let deadline = Instant::now() + RECOVERY_WAIT;
    loop {
        let r = c.query_one(
            "SELECT coalesce(last_archived_wal, ''), coalesce(last_failed_wal, ''), failed_count FROM pg_stat_archiver",
            &[],
        )?;
        let (archived, failed, failures): (String, String, i64) = (r.get(0), r.get(1), r.get(2));
        // Segment names of one timeline sort in WAL order.
        if archived.len() == segment.len() && archived[..8] == segment[..8] && archived >= segment {
            return Ok(segment);
        }
        if Instant::now() > deadline {
            return Err(HarnessError::Timeout(format!(
                "node {}: segment {segment} not archived after {RECOVERY_WAIT:?} (last archived {archived:?}, last failed {failed:?}, {failures} failures)",
                primary.name()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ============================================================================ point-in-time recovery

/// Where an archive recovery stops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryTarget {
    /// `recovery_target_time = <t>` (a `timestamptz` literal of the primary, e.g. its
    /// `clock_timestamp()::text`), `recovery_target_action = promote`.
    Time(String),
    /// No target: replay every archived segment, then end recovery.
    EndOfWal,
}

/// Turn a stopped node made by [`Node::base_backup_from`] into an archive recovery from
/// `archive` to `target` (see the module documentation). Archiving is switched off on it so
/// the restored server does not write into the archive it restores from. Start it with
/// `start()`, then [`wait_recovery_end`].
pub fn prepare_archive_recovery(
    node: &mut Node,
    archive: &WalArchive,
    target: &RecoveryTarget,
) -> Result<()> {
    let data = node.datadir().to_path_buf();
    let standby_signal = data.join("standby.signal");
    if standby_signal.exists() {
        fs::remove_file(&standby_signal)
            .map_err(|e| HarnessError::io("remove standby.signal", e))?;
    }
    crate::cluster::remove_primary_conninfo(node)?;
    let recovery_signal = data.join("recovery.signal");
    fs::write(&recovery_signal, b"").map_err(|e| HarnessError::io("write recovery.signal", e))?;
    let (uid, gid) = pg_user()?;
    std::os::unix::fs::chown(&recovery_signal, Some(uid), Some(gid))
        .map_err(|e| HarnessError::io("chown recovery.signal", e))?;
    fs::set_permissions(&recovery_signal, fs::Permissions::from_mode(0o600))
        .map_err(|e| HarnessError::io("chmod recovery.signal", e))?;

    node.set_conf("archive_mode", "off")?;
    node.unset_conf("archive_command")?;
    node.set_conf("restore_command", archive.restore_command())?;
    match target {
        RecoveryTarget::Time(t) => {
            node.set_conf("recovery_target_time", t)?;
            node.set_conf("recovery_target_action", "promote")?;
        }
        RecoveryTarget::EndOfWal => {
            node.unset_conf("recovery_target_time")?;
            node.unset_conf("recovery_target_action")?;
        }
    }
    Ok(())
}

/// Wait (bounded by [`RECOVERY_WAIT`]) until a started archive recovery has ended
/// (`pg_is_in_recovery()` is false). Returns how long it waited.
pub fn wait_recovery_end(node: &Node) -> Result<Duration> {
    let t0 = Instant::now();
    let deadline = t0 + RECOVERY_WAIT;
    loop {
        let last = match node.connect_once() {
            Ok(mut c) => match c.query_one("SELECT pg_is_in_recovery()", &[]) {
                Ok(r) if !r.get::<_, bool>(0) => return Ok(t0.elapsed()),
                Ok(_) => "in recovery".to_string(),
                Err(e) => pg_error_string(&e),
            },
            Err(e) => pg_error_string(&e),
        };
        if Instant::now() > deadline {
            return Err(HarnessError::Timeout(format!(
                "node {}: recovery not ended after {RECOVERY_WAIT:?}; last: {last}",
                node.name()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ============================================================================ prober

/// One thread calling `SELECT tso_next()` on an endpoint every `interval`, whatever the
/// outcome (no tight loop on errors such as "function does not exist" before a restore has
/// created it), recording every call in a [`History`] (errors as errors) and reconnecting
/// when the connection breaks. For watching a server while a restore runs.
pub struct Prober {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<LoadStats>>,
}

impl Prober {
    pub fn start(ep: Endpoint, history: History, interval: Duration) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("prober".into())
            .spawn(move || probe(ep, history, interval, flag))
            .expect("spawn prober");
        Prober { stop, handle: Some(handle) }
    }

    /// Stop the thread and wait for it; a panic in it is propagated.
    pub fn stop_and_join(mut self) -> LoadStats {
        self.stop.store(true, Ordering::SeqCst);
        match self.handle.take().map(JoinHandle::join) {
            Some(Ok(stats)) => stats,
            Some(Err(p)) => std::panic::resume_unwind(p),
            None => LoadStats::default(),
        }
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn probe(ep: Endpoint, history: History, interval: Duration, stop: Arc<AtomicBool>) -> LoadStats {
    // Bounded like every load.
    let deadline = Instant::now() + crate::load::MAX_LOAD_DURATION;
    let mut stats = LoadStats::default();
    let mut client = None;
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::sleep(interval);
        let Some(c) = client.as_mut() else {
            match ep.connect(10_000) {
                Ok(c) => {
                    stats.connects += 1;
                    client = Some(c);
                }
                Err(_) => stats.connect_failures += 1,
            }
            continue;
        };
        let start = Instant::now();
        let r = c.query_one("SELECT tso_next()", &[]).and_then(|r| r.try_get::<_, i64>(0));
        let end = Instant::now();
        match r {
            Ok(v) => {
                stats.ok_calls += 1;
                history.record_ok(start, end, &ep.name, v, 1);
            }
            Err(e) => {
                stats.err_calls += 1;
                let msg = pg_error_string(&e);
                if stats.sample_errors.len() < 10 && !stats.sample_errors.contains(&msg) {
                    stats.sample_errors.push(msg.clone());
                }
                history.record_err(start, end, &ep.name, msg, 1);
                if crate::error::session_broken(c, &e) {
                    client = None;
                }
            }
        }
    }
    stats
}
