//! What a node needs from the operating system: the postgres OS user, node directories,
//! free ports, a clean environment for server binaries, commands run with a time bound,
//! `postmaster.pid` and log files.

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::Node;
use crate::error::HarnessError;
use crate::Result;

impl Node {
    /// A command for a server binary, run as the postgres OS user in the node directory.
    pub(crate) fn pg_command(&self, program: &str) -> Command {
        let (uid, gid) = pg_user().expect("postgres OS user");
        let mut cmd = Command::new(self.bin.join(program));
        cmd.uid(uid).gid(gid).current_dir(&self.base).env("HOME", &self.base);
        scrub_env(&mut cmd);
        cmd
    }
}

/// uid and gid of the `postgres` OS user (`TSORACLE_PG_USER` overrides the name), from
/// /etc/passwd.
pub(crate) fn pg_user() -> Result<(u32, u32)> {
    static USER: OnceLock<std::result::Result<(u32, u32), String>> = OnceLock::new();
    USER.get_or_init(|| {
        let name = std::env::var("TSORACLE_PG_USER").unwrap_or_else(|_| "postgres".into());
        ids_of(&name).map_err(|e| format!("{e} (install postgresql-15, which creates it)"))
    })
    .clone()
    .map_err(HarnessError::Other)
}

/// uid and gid of the OS user `name`, from /etc/passwd.
pub(crate) fn user_ids(name: &str) -> Result<(u32, u32)> {
    ids_of(name).map_err(HarnessError::Other)
}

fn ids_of(name: &str) -> std::result::Result<(u32, u32), String> {
    let passwd = fs::read_to_string("/etc/passwd").map_err(|e| format!("read /etc/passwd: {e}"))?;
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() >= 4 && f[0] == name {
            let uid = f[2].parse().map_err(|e| format!("uid of {name}: {e}"))?;
            let gid = f[3].parse().map_err(|e| format!("gid of {name}: {e}"))?;
            return Ok((uid, gid));
        }
    }
    Err(format!("no OS user {name:?}"))
}

pub(super) fn sanitize(name: &str) -> String {
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
pub(super) fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
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

pub(super) fn read_from(path: &Path, offset: u64) -> String {
    let mut s = Vec::new();
    if let Ok(mut f) = fs::File::open(path) {
        let _ = f.seek(SeekFrom::Start(offset));
        let _ = f.read_to_end(&mut s);
    }
    String::from_utf8_lossy(&s).into_owned()
}

/// (pid, status) from `postmaster.pid` (line 1 and line 8), if present.
pub(super) fn read_pid_file(datadir: &Path) -> Option<(i32, String)> {
    let text = fs::read_to_string(datadir.join("postmaster.pid")).ok()?;
    let lines: Vec<&str> = text.lines().collect();
    let pid = lines.first()?.trim().parse().ok()?;
    let status = lines.get(7).map(|s| s.trim().to_string()).unwrap_or_default();
    Some((pid, status))
}
